"""Bit packing of codes: the canonical (checkpoint) layout.

Canonical layout: codes of ``bits`` bits are packed *along K* as a dense little-endian
bitstream, 32 codes per ``bits`` uint32 words, so every width 1..8 costs exactly
``bits/8`` bytes per weight (3-, 5-, 6-, 7-bit codes straddle word boundaries, like GPTQ's
3-bit packing).  A (K, N) code matrix becomes a (ceil(K/32) * bits, N) uint32 array; K is
padded to a multiple of 32 with zero codes, the logical K is kept by the params.

Kernel layouts (interleaved for a dequantizer) are made from this one by the kernels'
``prepare`` functions, once, not per call.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

CODES_PER_CHUNK = 32


def packed_rows(k: int, bits: int) -> int:
  """Rows of the packed uint32 array for K logical rows."""
  return -(-k // CODES_PER_CHUNK) * bits


def pack_codes(codes: jax.Array, bits: int) -> jax.Array:
  """Pack (..., K, N) integer codes (low ``bits`` bits used) along K into uint32 words."""
  if not 1 <= bits <= 8:
    raise ValueError(f"bits={bits}; expected 1..8")
  *lead, k, n = codes.shape
  kp = -(-k // CODES_PER_CHUNK) * CODES_PER_CHUNK
  c = codes.astype(jnp.uint32) & jnp.uint32((1 << bits) - 1)
  if kp != k:
    c = jnp.pad(c, [(0, 0)] * len(lead) + [(0, kp - k), (0, 0)])
  c = c.reshape(*lead, kp // CODES_PER_CHUNK, CODES_PER_CHUNK, n)
  words = [jnp.zeros((*lead, kp // CODES_PER_CHUNK, n), jnp.uint32) for _ in range(bits)]
  for i in range(CODES_PER_CHUNK):
    pos = i * bits
    j, off = divmod(pos, 32)
    ci = c[..., i, :]
    words[j] = words[j] | (ci << off)
    if off + bits > 32:  # straddles into the next word
      words[j + 1] = words[j + 1] | (ci >> (32 - off))
  packed = jnp.stack(words, axis=-2)  # (..., K/32, bits, N)
  return packed.reshape(*lead, kp // CODES_PER_CHUNK * bits, n)


def unpack_codes(packed: jax.Array, bits: int, k: int) -> jax.Array:
  """Inverse of :func:`pack_codes`: (..., ceil(K/32)*bits, N) uint32 -> (..., K, N) uint8."""
  *lead, rows, n = packed.shape
  if rows % bits:
    raise ValueError(f"packed rows {rows} is not a multiple of bits={bits}")
  chunks = rows // bits
  w = packed.astype(jnp.uint32).reshape(*lead, chunks, bits, n)
  mask = jnp.uint32((1 << bits) - 1)
  out = []
  for i in range(CODES_PER_CHUNK):
    pos = i * bits
    j, off = divmod(pos, 32)
    v = w[..., j, :] >> off
    if off + bits > 32:
      v = v | (w[..., j + 1, :] << (32 - off))
    out.append((v & mask).astype(jnp.uint8))
  codes = jnp.stack(out, axis=-2).reshape(*lead, chunks * CODES_PER_CHUNK, n)
  return codes[..., :k, :]
