"""Shared pieces of the checkpoint converters: tensor checks, bit unpacking of the
producers' storage layouts, and building canonical :class:`QuantizedWeight` params."""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from humming_jax import packing
from humming_jax.quantize import QuantizedWeight, with_input_permutation
from humming_jax.spec import QuantSpec

FLOAT_SCALE = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
               np.dtype(ml_dtypes.bfloat16): "bfloat16"}


@dataclasses.dataclass
class Unit:
  """Tensors of one checkpoint module that become one or more tree leaves together.

  ``keys``: full tensor names it needs; ``build(arrays)`` gets ``{full name: np.ndarray}``
  and returns ``{leaf name: value}`` placed under the module's path."""

  module: str
  keys: tuple[str, ...]
  build: Callable[[dict], dict]


def expect(name: str, a: np.ndarray, dtypes, shape=None) -> np.ndarray:
  """Check a checkpoint tensor's dtype (one of ``dtypes``) and shape; name it on failure."""
  dts = [np.dtype(d) for d in (dtypes if isinstance(dtypes, (list, tuple)) else [dtypes])]
  if a.dtype not in dts:
    raise ValueError(f"tensor {name!r}: dtype {a.dtype}, expected "
                     f"{' or '.join(str(d) for d in dts)}")
  if shape is not None and tuple(a.shape) != tuple(shape):
    raise ValueError(f"tensor {name!r}: shape {tuple(a.shape)}, expected {tuple(shape)}")
  return a


def weight_blocks(wname: str, scales_gk_gn: np.ndarray, k: int, n: int, bk: int, bn: int
                  ) -> tuple[np.ndarray, int]:
  """Block scales (ceil(K / bk), ceil(N / bn)) as the canonical layout holds them: (scales,
  block_n).  An N that is not a multiple of bn (DeepSeek-V3's ``kv_a_proj_with_mqa``,
  N = 576 with 128-column blocks; exporters pad the last block) takes column blocks of
  gcd(bn, N) with each block scale repeated: the same weight, exactly.  A K that is not a
  multiple of bk is refused, naming ``wname`` (the activation groups are bk wide)."""
  if k % bk:
    raise ValueError(f"tensor {wname!r}: K={k} is not a multiple of the block's {bk} input "
                     f"columns (the activation groups)")
  bn_ = math.gcd(bn, n)
  return scales_gk_gn[:, np.arange(n // bn_) * bn_ // bn], bn_


def float_scale_dtype(name: str, a: np.ndarray) -> str:
  if a.dtype not in FLOAT_SCALE:
    raise ValueError(f"tensor {name!r}: dtype {a.dtype}, expected a float scale "
                     "(float32, float16 or bfloat16)")
  return FLOAT_SCALE[a.dtype]


def unpack_stream(words: np.ndarray, bits: int, count: int, axis: int) -> np.ndarray:
  """Dense little-endian bitstream of ``bits``-bit codes held in 32-bit words along ``axis``
  (value ``i`` at stream bit ``i * bits``; GPTQ's and compressed-tensors' packing) ->
  uint8 codes, ``count`` of them along ``axis``."""
  w = np.moveaxis(words.view(np.uint32), axis, -1)
  nbits = w.shape[-1] * 32
  if count * bits > nbits:
    raise ValueError(f"{count} codes of {bits} bits need {count * bits} bits; the packed "
                     f"tensor has {nbits}")
  as_bytes = np.ascontiguousarray(w, dtype="<u4").view(np.uint8)  # little-endian bytes
  return np.moveaxis(unpack_byte_stream(as_bytes, bits, count), -1, axis)


def unpack_words(words: np.ndarray, bits: int, count: int, axis: int) -> np.ndarray:
  """``32 // bits`` codes per 32-bit word along ``axis``, low bits first, the word's top
  ``32 % bits`` bits unused (compressed-tensors' ``pack_to_int32``: a 3-bit code never
  straddles two words, 10 per word) -> uint8 codes, ``count`` of them along ``axis``.  For
  1 / 2 / 4 / 8 bits this is the dense bitstream of :func:`unpack_stream` (which reads it)."""
  if 32 % bits == 0:
    return unpack_stream(words, bits, count, axis)
  per_word = 32 // bits
  w = np.moveaxis(words.view(np.uint32), axis, -1)
  if count > w.shape[-1] * per_word:
    raise ValueError(f"{count} codes of {bits} bits need {-(-count // per_word)} words of "
                     f"{per_word} codes; the packed tensor has {w.shape[-1]}")
  shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
  codes = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)
  codes = codes.reshape(*w.shape[:-1], -1)[..., :count].astype(np.uint8)
  return np.moveaxis(codes, -1, axis)


def stream_as_canonical(words_kn: np.ndarray, bits: int, k: int, flip_sign: bool = False):
  """(K*bits/32, N) words of a dense K bitstream, as canonical packed codes, or None.

  When K is a multiple of 32 the producer's bitstream words *are* our canonical layout
  (32 codes per ``bits`` words, little-endian; see packing.py), so they are taken over
  without unpacking.  ``flip_sign`` XORs every code with 2**(bits-1) (offset-binary ->
  two's complement), done on the words with a repeating mask."""
  if k % packing.CODES_PER_CHUNK or words_kn.shape[0] != packing.packed_rows(k, bits):
    return None
  w = np.ascontiguousarray(words_kn).view(np.uint32)
  if flip_sign:
    half = np.full((packing.CODES_PER_CHUNK, 1), 1 << (bits - 1), np.uint8)
    mask = np.asarray(packing.pack_codes(jnp.asarray(half), bits))  # (bits, 1)
    w = w ^ np.tile(mask, (k // packing.CODES_PER_CHUNK, 1))
  return jnp.asarray(w)


def bytes_as_canonical(b_nk: np.ndarray, bits: int, k: int):
  """(..., N, K*bits/8) uint8 bytes holding K codes as a little-endian bitstream (8-bit
  codes; two 4-bit codes per byte, low nibble first; four 6-bit codes per three bytes, as
  compressed-tensors packs fp6) -> canonical packed words (..., K*bits/32, N), or None.

  With K a multiple of 32, canonical word j of a column is just 4 consecutive bytes of that
  column read little-endian (see packing.py), so this is a transpose, no bit work."""
  if bits not in (4, 6, 8) or k % packing.CODES_PER_CHUNK:
    return None
  *lead, n, nb = b_nk.shape
  if nb * 8 != k * bits:
    return None
  t = np.swapaxes(b_nk.view(np.uint8), -1, -2).reshape(*lead, nb // 4, 4, n)
  t = np.ascontiguousarray(np.moveaxis(t, -2, -1))  # (..., rows, N, 4 bytes)
  return jnp.asarray(t.view("<u4")[..., 0].astype(np.uint32))


def unpack_byte_stream(b: np.ndarray, bits: int, k: int) -> np.ndarray:
  """(..., K*bits/8) uint8 bytes of a little-endian bitstream (value ``i`` at bit
  ``i * bits``: e2m1 pairs low nibble first, compressed-tensors' fp6 triples) -> (..., K)
  uint8 codes."""
  stream = np.unpackbits(b, axis=-1, bitorder="little")[..., :k * bits]
  stream = stream.reshape(*stream.shape[:-1], k, bits)
  return (stream << np.arange(bits, dtype=np.uint8)).sum(-1, dtype=np.uint8)


def codes_from_nk_bytes(b_nk: np.ndarray, bits: int, k: int):
  """(packed canonical words, None) from torch-layout (..., N, K*bits/8) code bytes when K is
  a multiple of 32 (:func:`bytes_as_canonical`), else (None, (..., N, K) uint8 codes)."""
  packed = bytes_as_canonical(b_nk, bits, k)
  if packed is not None:
    return packed, None
  return None, (b_nk.view(np.uint8) if bits == 8 else unpack_byte_stream(b_nk, bits, k))


def make_weight(spec: QuantSpec, codes_kn: np.ndarray | None, scales, zeros=None,
                global_scale=None, bias=None, act_scale=None, *, packed=None,
                shape=None) -> QuantizedWeight:
  """Canonical params from (..., K, N) uint8 codes (or already ``packed`` canonical words
  with their logical ``shape``) and (..., Gk, Gn) stored scales."""
  if packed is None:
    codes_kn = np.ascontiguousarray(codes_kn)
    packed, shape = packing.pack_codes(jnp.asarray(codes_kn), spec.weight_bits), codes_kn.shape
  return QuantizedWeight(
      codes=packed,
      scales=jnp.asarray(scales),
      zeros=None if zeros is None else jnp.asarray(zeros, jnp.uint8),
      global_scale=None if global_scale is None else jnp.asarray(global_scale, jnp.float32),
      bias=None if bias is None else jnp.asarray(bias.astype(np.float32)),
      act_scale=None if act_scale is None else jnp.asarray(act_scale, jnp.float32).reshape(()),
      spec=spec, shape=tuple(shape))


def weight_from_nk_bytes(spec: QuantSpec, b_nk: np.ndarray, bits: int, k: int, scales,
                         **kw) -> QuantizedWeight:
  """Params from torch-layout (..., N, K*bits/8) code bytes (fp8 bytes, e2m1 nibble pairs
  low nibble first, or any little-endian bitstream) and (..., Gk, Gn) stored scales."""
  *lead, n, _ = b_nk.shape
  packed, codes = codes_from_nk_bytes(b_nk, bits, k)
  if packed is not None:  # K % 32 == 0: a transpose of the bytes
    return make_weight(spec, None, scales, packed=packed, shape=(*lead, k, n), **kw)
  return make_weight(spec, np.swapaxes(codes, -1, -2), scales, **kw)


def act_order(module: str, gname: str, g_idx: np.ndarray, w: QuantizedWeight
              ) -> QuantizedWeight:
  """An act-order layer (GPTQ ``desc_act``, compressed-tensors ``actorder: group``):
  ``g_idx`` (K,) gives each input row's group, and ``w`` was built with the checkpoint's
  rows and scales as they are.  Its rows are sorted by group (stably), so that group g is
  rows [g * gs, (g + 1) * gs) as the canonical layout wants, and the order is kept as
  ``input_perm`` (``quantize.with_input_permutation``: quant_dense gathers x's columns the
  same way).  ``w`` unchanged when ``g_idx`` is already ``k // group_size``."""
  k = w.in_features
  gs = w.spec.group_size if w.spec.granularity == "group" else k
  g_idx = expect(gname, g_idx, (np.int32, np.int64, np.uint32), (k,)).astype(np.int64)
  contiguous = np.arange(k) // gs
  if np.array_equal(g_idx, contiguous):
    return w
  perm = np.argsort(g_idx, kind="stable")
  if not np.array_equal(g_idx[perm], contiguous):
    sizes = np.bincount(g_idx).tolist()
    raise ValueError(f"tensor {gname!r}: act-order groups must each hold group_size={gs} "
                     f"rows (group sizes {sizes[:8]}{'...' if len(sizes) > 8 else ''})")
  if w.spec.act is not None:
    raise ValueError(f"module {module!r}: act-order rows ({gname}) with activation "
                     f"quantization ({w.spec.name}) are not supported")
  return with_input_permutation(
      w.replace(codes=_permute_packed_rows(w.codes, jnp.asarray(perm, jnp.int32),
                                           w.spec.weight_bits, k)), perm.astype(np.int32))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _permute_packed_rows(codes: jax.Array, perm: jax.Array, bits: int, k: int) -> jax.Array:
  """Packed canonical codes with their K rows taken in ``perm``'s order, as one compiled
  program (8192 x 8192 int4 on a 2-core host: 0.035 s after its compile, against 2.2 s
  for the unpack, gather and pack op by op)."""
  return packing.pack_codes(jnp.take(packing.unpack_codes(codes, bits, k), perm, axis=0), bits)


def spec_or_error(module: str, **fields) -> QuantSpec:
  """A QuantSpec; a refusal names the checkpoint module it was for."""
  try:
    return QuantSpec(**fields)
  except ValueError as e:
    raise ValueError(f"module {module!r}: its quantization has no exact QuantSpec: {e}") \
        from None


def bias_of(module: str, arrays: dict, n: int, lead=()):
  key = f"{module}.bias"
  if key not in arrays:
    return None
  b = arrays[key]
  if b.dtype not in FLOAT_SCALE:
    raise ValueError(f"tensor {key!r}: dtype {b.dtype}, expected a float bias")
  return expect(key, b, b.dtype, (*lead, n))
