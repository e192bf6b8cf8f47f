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
import numpy as np

CODES_PER_CHUNK = 32


def packed_rows(k: int, bits: int) -> int:
  """Rows of the packed uint32 array for K logical rows."""
  return -(-k // CODES_PER_CHUNK) * bits


def _bit_positions(bits: int):
  """Static per-code geometry of a 32-code chunk: word index, bit offset, straddle flag."""
  pos = np.arange(CODES_PER_CHUNK) * bits
  word, off = pos // 32, pos % 32
  return word, off, off + bits > 32


def pack_codes(codes: jax.Array, bits: int) -> jax.Array:
  """Pack (..., K, N) integer codes (low ``bits`` bits used) along K into uint32 words."""
  if not (isinstance(bits, int) and 1 <= bits <= 8):
    raise ValueError(f"bits={bits!r}; expected 1..8")
  *lead, k, n = codes.shape
  kp = -(-k // CODES_PER_CHUNK) * CODES_PER_CHUNK
  c = codes.astype(jnp.uint32) & jnp.uint32((1 << bits) - 1)
  if kp != k:
    c = jnp.pad(c, [(0, 0)] * len(lead) + [(0, kp - k), (0, 0)])
  c = c.reshape(*lead, kp // CODES_PER_CHUNK, CODES_PER_CHUNK, n)
  word, off, straddle = _bit_positions(bits)
  # Each code's low part lands in word[i] at off[i]; a straddling code's high part in
  # word[i] + 1 at bit 0.  Bits never overlap, so a sum of the shifted codes is their OR.
  # One loop over the `bits` output words (not the 32 codes) keeps the traced graph small.
  lo = c << jnp.asarray(off, jnp.uint32)[:, None]
  hi = c >> jnp.asarray(np.where(straddle, 32 - off, 0), jnp.uint32)[:, None]
  words = []
  for j in range(bits):
    w = jnp.sum(lo[..., np.flatnonzero(word == j), :], axis=-2, dtype=jnp.uint32)
    spill = np.flatnonzero(straddle & (word + 1 == j))
    if spill.size:
      w = w + jnp.sum(hi[..., spill, :], axis=-2, dtype=jnp.uint32)
    words.append(w)
  packed = jnp.stack(words, axis=-2)  # (..., K/32, bits, N)
  return packed.reshape(*lead, kp // CODES_PER_CHUNK * bits, n)


def unpack_codes(packed: jax.Array, bits: int, k: int) -> jax.Array:
  """Inverse of :func:`pack_codes`: (..., ceil(K/32)*bits, N) uint32 -> (..., K, N) uint8."""
  *lead, rows, n = packed.shape
  if rows % bits:
    raise ValueError(f"packed rows {rows} is not a multiple of bits={bits}")
  chunks = rows // bits
  w = packed.astype(jnp.uint32).reshape(*lead, chunks, bits, n)
  word, off, straddle = _bit_positions(bits)
  # Gather every code's word (and the next word for straddlers) at once: a handful of ops
  # instead of a 32-step loop, so eager calls and jit compiles stay fast.
  v = w[..., word, :] >> jnp.asarray(off, jnp.uint32)[:, None]
  if straddle.any():
    nxt = w[..., np.minimum(word + 1, bits - 1), :]
    up = nxt << jnp.asarray(np.where(straddle, 32 - off, 0), jnp.uint32)[:, None]
    v = v | jnp.where(jnp.asarray(straddle)[:, None], up, jnp.uint32(0))
  codes = (v & jnp.uint32((1 << bits) - 1)).astype(jnp.uint8)
  return codes.reshape(*lead, chunks * CODES_PER_CHUNK, n)[..., :k, :]
