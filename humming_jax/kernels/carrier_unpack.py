"""4-bit weight codes in the WnA16 Mosaic layout -> the 8-bit GEMM's K-major e4m3 operand,
in one Pallas-Triton pass (prefill of ``wnam_mgpu``: W4A8 fp8 and the MXFP4 fold).

``wnam_mgpu`` keeps one prepared copy of 4-bit weights, (Kp / bk, Np, bk) int4 codes, for
decode (the WnA16 Mosaic kernel) and prefill (the Mosaic 8-bit GEMM on an (Np, Kp) e4m3
operand unpacked once per call).

H200 session 16, 8192^2, CUPTI: a first version of this kernel, one code per 32-bit lane in
~25 integer ops, ran 81.8 us (int4) and 113.9 us (the fold), XLA's fusions of the
reference 80.8 / 116.9, XLA's int4 -> int8 with the same transposition 33.  Equal times
from two code generators, and 64M codes x ~25 ops at the H200's ~17 T int32 ops/s
(~95 us), say the unpack is ALU-bound.  So this version works on packed words: each
16-bit run of four codes is spread to the four byte lanes of a 32-bit word
(:func:`spread_nibbles`) and mapped to four e4m3 codes at once, with per-lane compares
``(x + 128 - t) >> 7`` that never carry across lanes (:func:`int_e4m3_lanes`,
:func:`e2m1_e4m3_lanes`: ~6 ops per code; e4m3 subnormals, which the MXFP4 fold meets only
for groups more than 5 octaves under their column's largest, take a longer branch per
block).  The word is the four output bytes in order: no interleave.

The XLA reference is beside it: ``wnam_mgpu.mx_fold_codes`` / ``_carrier_codes`` through
the formats' own ``decode`` / ``encode_exact``; the lane maps are checked bit-equal to them
on every 4-code word and shift (tests/test_carrier_unpack.py), the kernel on random
layouts (interpreter and H200).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax import formats

_E4M3 = formats.get_format("fp8_e4m3")
_E2M1 = formats.get_format("fp4_e2m1")
# Shifts E - B the fold passes (wnam_mgpu.mx_fold_shifts clips to them): every e2m1 value
# times 2**shift is then an e4m3 normal, subnormal or zero (6 x 2**6 = 384 <= 448); below
# -20 every value rounds to zero (6 x 2**-20 < 2**-10, half the least e4m3 subnormal), and
# the clip keeps the reference's float32 products normal.
SHIFT_RANGE = (-20, 6)
_LANES = 0x01010101  # a one in each byte lane
BLOCK_N = 64  # columns per program of the unpack, and so of the fold's normal flags
# The least e2m1 value (2**-1, code 1) times 2**shift is an e4m3 normal from this shift up.
_NORMAL_SHIFT = 1 - (_E4M3.bias - 1)
if (_E4M3.bias, _E4M3.mantissa_bits, _E2M1.bias, _E2M1.mantissa_bits) != (7, 3, 1, 1):
  raise AssertionError("the lane maps below read e4m3 (bias 7, 3 mantissa bits) and e2m1")


def _u32(v: int) -> jax.Array:
  return jnp.uint32(v)


def spread_nibbles(n: jax.Array) -> jax.Array:
  """uint32 holding four 4-bit codes in bits 0..15 -> the codes in byte lanes 0..3."""
  return ((n & _u32(0xF)) | ((n & _u32(0xF0)) << 4) | ((n & _u32(0xF00)) << 8)
          | ((n & _u32(0xF000)) << 12))


def _ge(x: jax.Array, t: int) -> jax.Array:
  """Byte lanes x <= 127 -> 1 in the lanes where x >= t (1 <= t <= 128), else 0."""
  return ((x + _u32((0x80 - t) * _LANES)) >> 7) & _u32(_LANES)


def _mask(bit: jax.Array) -> jax.Array:
  """Byte lanes 0 / 1 -> 0x00 / 0xFF."""
  return bit * _u32(0xFF)


def int_e4m3_lanes(x: jax.Array) -> jax.Array:
  """uint32 of four two's-complement int4 codes (byte lanes, 0..15) -> their four e4m3
  codes: |v| = 1..8 is 0x30 + 8|v| - 4 max(|v| - 2, 0) - 2 max(|v| - 4, 0) (the e4m3
  exponent steps at 2 and 4 halve the slope), the sign in bit 7; zero is 0."""
  s = (x >> 3) & _u32(_LANES)
  a = (x ^ (s * _u32(0xF))) + s  # |v|: 16 - c for negative codes
  nz, ge2, ge4 = _ge(a, 1), _ge(a, 2), _ge(a, 4)
  top = a | _u32(0x80808080)  # lane-wise a - t below, borrow-free, masked where a < t
  p2 = (top - _u32(2 * _LANES)) & _u32(0x7F7F7F7F) & _mask(ge2)
  p4 = (top - _u32(4 * _LANES)) & _u32(0x7F7F7F7F) & _mask(ge4)
  v = _u32(0x30 * _LANES) + (a << 3) - (p2 << 2) - (p4 << 1)
  return (v & _mask(nz)) | (s << 7)


def e2m1_e4m3_lanes(x: jax.Array, shift: jax.Array | int = 0, *,
                    subnormals: bool = True) -> jax.Array:
  """uint32 of four e2m1 codes (byte lanes, 0..15) and an int32 shift in SHIFT_RANGE
  (broadcast per word) -> the e4m3 codes of e2m1 x 2**shift, rounded to the nearest
  e4m3 subnormal (ties to even) below the least normal, as ``encode_exact(...,
  round_subnormals=True)`` does.  ``subnormals=False``: only for shift >= -5 (all
  normal), fewer ops.

  The e2m1 magnitude c = 1..7 is the e4m3 code 8 F + m = 44 + 4c + 4 [c >= 2]; the shift
  adds 8 shift.  In a lane offset by 128, W = 8 F + m + 128 + 8 shift: W >= 136 is normal
  (code W - 128); below, W = 104 .. 132 in steps of 4 are the subnormal codes 0, 1, 1, 2,
  2, 3, 4, 6 (e.g. W 104 = 2**-10 = half the least subnormal: ties to 0)."""
  mag = x & _u32(0x07070707)
  sg = (x >> 3) & _u32(_LANES)
  nz = _ge(mag, 1)
  t2 = _u32(0x2C * _LANES) + (mag << 2) + (_ge(mag, 2) << 2)
  if isinstance(shift, int):  # constants (Triton cannot lower the negation of a literal)
    pos, neg = (_u32(max(v, 0) * 8 * _LANES) for v in (shift, -shift))
  else:
    shift = jnp.asarray(shift, jnp.int32)
    pos = (jnp.maximum(shift, 0) * 8).astype(jnp.uint32) * _u32(_LANES)
    neg = (jnp.maximum(-shift, 0) * 8).astype(jnp.uint32) * _u32(_LANES)
  if not subnormals:  # lanes 4 .. 124: no borrow, no carry
    return ((t2 + pos - neg) & _mask(nz)) | ((sg & nz) << 7)  # -0 is code 0
  w = t2 + _u32(0x80 * _LANES) + pos - neg  # lanes 12 .. 252
  b7 = (w >> 7) & _u32(_LANES)
  low = w & _u32(0x7F7F7F7F)
  normal = b7 & _ge(low, 8)
  sub_hi = b7 ^ normal  # W 128 .. 135: codes 4, 6
  sub_lo = b7 ^ _u32(_LANES)  # W < 128: codes 0 .. 3
  code = ((low & _mask(normal))
          | ((_u32(4 * _LANES) + (_ge(low, 4) << 1)) & _mask(sub_hi))
          | ((_ge(low, 108) + _ge(low, 116) + _ge(low, 124)) & _mask(sub_lo)))
  code = code & _mask(nz)
  return code | ((sg & _ge(code, 1)) << 7)  # a code rounded to zero drops its sign


_NAN_EXPONENT = 128  # scale_exponents of NaN (the field 255)


def scale_exponents(scales: jax.Array) -> jax.Array:
  """bfloat16 powers of two (the layout's e8m0 group scales) -> their int32 exponents,
  off the bits: the exponent field - 127; the one bf16 subnormal an e8m0 scale can be
  (2**-127) -> -127, as is a zero (2**-127 flushed); NaN (e8m0 code 255) -> 128
  (_NAN_EXPONENT).  The fold's XLA reference and these kernels read the exponents
  through here."""
  if scales.dtype != jnp.bfloat16:
    raise ValueError(f"scales: expected the layout's bfloat16 powers of two; got "
                     f"{scales.dtype}")
  field = (jax.lax.bitcast_convert_type(scales, jnp.uint16).astype(jnp.int32) >> 7) & 0xFF
  return jnp.where(field == 0, -127, field - 127)


def fold_shifts(exponents: jax.Array, base: jax.Array) -> jax.Array:
  """Group exponents E and their column's base B -> the fold's shifts E - B, clipped to
  SHIFT_RANGE (the reference's and this kernel's one formula)."""
  return jnp.clip(exponents - base, *SHIFT_RANGE)


def fold_base(emax: jax.Array) -> jax.Array:
  """A column's largest group exponent -> its base B: the largest shift is then
  SHIFT_RANGE's top (6 x 2**6 = 384 <= 448), and B >= -126 keeps 2**B a float32 normal."""
  return jnp.maximum(emax - SHIFT_RANGE[1], -126)


class FoldMetadata(NamedTuple):
  """What the MXFP4 fold reads per call besides the codes, from the scale rows alone."""
  base: jax.Array  # (Np,) int32 column bases B (fold_base over the K rows that exist)
  col_scale: jax.Array  # (Np,) float32 2**B; NaN for a column with a NaN group scale
  normal: jax.Array  # (Np / block_n, Kp / bk) int32: 1 where the block's shifts are all
  #                    >= _NORMAL_SHIFT (no e4m3 subnormal result: the short lane map)


def fold_metadata(scales: jax.Array, *, tiles: int, real_groups: int,
                  block_n: int = BLOCK_N, pallas: bool = False,
                  interpret: bool = False) -> FoldMetadata:
  """:class:`FoldMetadata` of (tiles * G, Np) bfloat16 power-of-two group scales (the
  layout's MXFP4 scale rows, G per K tile; rows from ``real_groups`` pad K).  ``pallas``:
  one Pallas-Triton pass over the rows (H200 session 18: XLA's four fusions of this
  reference took ~11 us per call at 8192^2, its column reduction 6.4 of them)."""
  tg, np_ = scales.shape
  if tiles <= 0 or tg % tiles or np_ % block_n or not 0 < real_groups <= tg:
    raise ValueError(f"scales {scales.shape}: expected (tiles={tiles} * G, Np) with Np a "
                     f"multiple of block_n={block_n}, and 0 < real_groups={real_groups} "
                     f"<= {tg}")
  if pallas:
    return _fold_metadata_pallas(scales, tiles=tiles, real_groups=real_groups,
                                 block_n=block_n, interpret=interpret)
  e = scale_exponents(scales)
  real = e[:real_groups]
  base = fold_base(real.max(axis=0))
  nan = jnp.any(real == _NAN_EXPONENT, axis=0)
  low = (e.reshape(tiles, tg // tiles, np_ // block_n, block_n)
         - base.reshape(np_ // block_n, block_n)).min(axis=(1, 3))
  return FoldMetadata(base, jnp.where(nan, jnp.nan, formats.exp2_int(base)),
                      (low >= _NORMAL_SHIFT).astype(jnp.int32).T)


# fold_metadata's kernel: tiles per load (a power of two dividing the tile count, at most
# this), warps, and whether the first pass's exponents are held for the second.  H200,
# session 19 (probe_fold_metadata.py, CUPTI, 8192^2): 64 / 4 / held 3.20 us, the
# session-18 form (16 / 4 / re-read) 5.79, XLA's fusions 11.7; K = 14336 (112 tiles: 16
# per load) 7.42 held vs 9.12 re-read, XLA 15.7.
METADATA_CHUNK = 64
METADATA_WARPS = 4
METADATA_HOLD = True


def _metadata_kernel(s_ref, base_ref, scale_ref, normal_ref, *, chunk: int,
                     real_groups: int, hold: bool):
  tiles, g, _ = s_ref.shape
  starts = range(0, tiles, chunk)

  def exponents(t0):  # (chunk, G, bn) int32, and which rows are real K groups
    e = scale_exponents(s_ref[pl.ds(t0, chunk), :, :])
    row = ((jax.lax.broadcasted_iota(jnp.int32, e.shape, 0) + t0) * g
           + jax.lax.broadcasted_iota(jnp.int32, e.shape, 1))
    return e, row < real_groups

  def col_max(v):  # over the chunk's tiles and groups -> (bn,)
    return jnp.max(jnp.max(v, axis=0), axis=0)

  emax = nan = None
  held = {}
  for t0 in starts:
    e, real = exponents(t0)
    if hold:
      held[t0] = e
    m = col_max(jnp.where(real, e, -1024))
    n = col_max(jnp.where(real & (e == _NAN_EXPONENT), 1, 0))
    emax, nan = (m, n) if emax is None else (jnp.maximum(emax, m), jnp.maximum(nan, n))
  base = fold_base(emax)
  base_ref[...] = base
  scale_ref[...] = jnp.where(nan > 0, jnp.nan, formats.exp2_int(base))
  for t0 in starts:  # the rows again (held, or from L2) for each tile's least shift
    e = held[t0] if hold else exponents(t0)[0]
    # min as -max(-x): one reduction kind throughout
    low = -jnp.max(jnp.max(base[None, None, :] - e, axis=2), axis=1)  # (chunk,)
    normal_ref[pl.ds(t0, chunk)] = (low >= _NORMAL_SHIFT).astype(jnp.int32)


def _fold_metadata_pallas(scales, *, tiles, real_groups, block_n, interpret):
  tg, np_ = scales.shape
  g = tg // tiles
  if g & (g - 1):
    raise ValueError(f"scales: G={g} group rows per K tile must be a power of two")
  chunk = 1
  while chunk < METADATA_CHUNK and tiles % (2 * chunk) == 0:
    chunk *= 2
  base, col_scale, normal = pl.pallas_call(
      functools.partial(_metadata_kernel, chunk=chunk, real_groups=real_groups,
                        hold=METADATA_HOLD),
      out_shape=(jax.ShapeDtypeStruct((np_,), jnp.int32),
                 jax.ShapeDtypeStruct((np_,), jnp.float32),
                 jax.ShapeDtypeStruct((np_ // block_n, tiles), jnp.int32)),
      grid=(np_ // block_n,),
      in_specs=[pl.BlockSpec((tiles, g, block_n), lambda i: (0, 0, i))],
      out_specs=(pl.BlockSpec((block_n,), lambda i: (i,)),
                 pl.BlockSpec((block_n,), lambda i: (i,)),
                 pl.BlockSpec((None, tiles), lambda i: (i, 0))),
      compiler_params=plt.CompilerParams(num_warps=METADATA_WARPS, num_stages=1),
      interpret=interpret,
      name="carrier_unpack_fold_metadata",
  )(scales.reshape(tiles, g, np_))
  return FoldMetadata(base, col_scale, normal)


def _pk_runs(codes_ref) -> tuple[jax.Array, ...]:
  """The ":pk" words (``mgpu_convert.permute_k``) -> the eight K-order words of four codes
  (byte lanes) of each stored run of 32.  Stored word q of a run holds in byte c the
  K-order codes 8c + 2q and 8c + 2q + 1, so the K-order codes 4r .. 4r + 3 are byte
  r >> 1 of words 2 (r & 1) and 2 (r & 1) + 1: a 4 x 4 byte transpose on the loaded
  words (a few integer ops per word, then :func:`spread_nibbles` as in K order).  The
  run's four words are one vector load, split in registers."""
  w = [q.reshape(q.shape[:-1]) for q in jnp.split(codes_ref[...], 4, axis=-1)]

  def run(r):  # the two bytes as one 16-bit run of four codes, spread to byte lanes
    a, b = (x >> _u32(8 * (r >> 1)) for x in (w[2 * (r & 1)], w[2 * (r & 1) + 1]))
    return spread_nibbles((a & _u32(0xFF)) | ((b & _u32(0xFF)) << 8))
  return tuple(run(r) for r in range(8))


def _pk_store(out_ref, outs) -> None:
  """Eight K-order words of each run -> out_ref's (..., 2, 2, 2) block in K order (word
  r = 4a + 2b + h at [a, b, h]): Triton stacks two arrays at a time along a new last axis,
  so the tree stacks the highest index bit first and the run's words land contiguous in
  one thread's registers (one vector store, no transpose)."""
  pair = lambda x, y: jnp.stack([x, y], axis=-1)
  by_a = [pair(outs[2 * b + h], outs[4 + 2 * b + h]) for b in (0, 1) for h in (0, 1)]
  by_b = [pair(by_a[h], by_a[2 + h]) for h in (0, 1)]  # by_a[2 b + h]
  out_ref[...] = pair(*by_b)


def _kernel(*refs, kind: str, order: str):
  codes_ref, *fold_refs, out_ref = refs
  if order == "p8":
    # The ":p8" words (``mgpu_convert.p8_store``): a 32-bit word of 8 stored codes is two
    # words of 4 K-order codes (K-order codes 0..15 of a run of 32, then 16..31) whose
    # signs already sit in byte lanes (bits 8b + 7 and 8b + 3) and whose magnitudes are
    # nibbles 0..3 and 4..7.  Output (..., 2, 4): each run's K-order words 0..3, then 4..7.
    w = codes_ref[...]  # (bn, G, runs per group, 4) uint32 words of 8 stored codes
    mags = lambda n: spread_nibbles(n) & _u32(0x07070707)
    words = (((w >> _u32(4)) & _u32(0x08080808)) | mags(w),
             (w & _u32(0x08080808)) | mags(w >> _u32(16)))

    def store(hi, lo):
      out_ref[...] = jnp.swapaxes(jnp.stack([hi, lo], axis=-1), -1, -2)
  elif order == "pk":  # output (..., 2, 2, 2): each run's K-order words 0..7
    words = _pk_runs(codes_ref)
    store = lambda *outs: _pk_store(out_ref, outs)
  else:
    words = (spread_nibbles(codes_ref[...].astype(jnp.uint32)),)  # (bn, G, h) of 4 codes

    def store(x):
      out_ref[...] = x
  e2m1 = lambda ws, s, subnormals: tuple(e2m1_e4m3_lanes(x, s, subnormals=subnormals)
                                         for x in ws)
  if kind == "int":
    store(*(int_e4m3_lanes(x) for x in words))
  elif not fold_refs:
    store(*e2m1(words, 0, False))
  else:
    scales_ref, base_ref, normal_ref = fold_refs
    # (G, bn) group scales of this K tile -> (bn, G, 1[, 1]) shifts: one per group of codes
    s = fold_shifts(scale_exponents(scales_ref[...]), base_ref[...][None, :]).T[:, :, None]
    s = s.reshape(s.shape + (1,) * (words[0].ndim - s.ndim))
    store(*jax.lax.cond(
        normal_ref[0] != 0,  # every shift of the block >= _NORMAL_SHIFT (fold_metadata)
        lambda ws, s: e2m1(ws, s, False), lambda ws, s: e2m1(ws, s, True), words, s))


@functools.partial(jax.jit, static_argnames=("kind", "block_n", "interpret", "order"))
def unpack(codes: jax.Array, scales: jax.Array | None = None,
           meta: FoldMetadata | None = None, *, kind: str, block_n: int = BLOCK_N,
           interpret: bool = False, order: str = "k") -> jax.Array:
  """(Kp / bk, Np, bk) int4 codes -> (Np, Kp) float8_e4m3fn, K-major.

  ``kind="int"``: the codes are integers (-8 .. 7).  ``kind="e2m1"``: e2m1 bit patterns;
  with ``scales`` ((Kp / bk) * G, Np) bfloat16 powers of two, one per group of bk / G
  codes along K (the layout's MXFP4 scale rows), and their ``meta``
  (:func:`fold_metadata` at this ``block_n``), each value times 2**(E - B)
  (``fold_shifts``: the MXFP4 fold; None: no shift).  The kernel reads the shifts off the
  scale rows itself.  ``order="p8"``: e2m1 codes as ``mgpu_convert.p8_store`` stores
  them (the fp8-MMA layout); ``order="pk"``: codes of either kind in the permuted K order
  of ":pk" layouts (``mgpu_convert.permute_k``).  Both need groups of 32 codes or more;
  the output is in K order."""
  if codes.ndim != 3 or codes.dtype != jnp.int4:
    raise ValueError(f"codes: expected (Kp / bk, Np, bk) int4; got {codes.shape} "
                     f"{codes.dtype}")
  if kind not in ("int", "e2m1"):
    raise ValueError(f"kind={kind!r}: expected 'int' or 'e2m1'")
  if (scales is None) != (meta is None):
    raise ValueError("scales and meta: pass both (the fold) or neither")
  if scales is not None and kind != "e2m1":
    raise ValueError("scales: only for kind='e2m1'")
  if order not in ("k", "p8", "pk") or (order == "p8" and kind != "e2m1"):
    raise ValueError(f"order={order!r}, kind={kind!r}: expected order 'k' or 'pk', or 'p8' "
                     f"with kind 'e2m1'")
  t, np_, bk = codes.shape
  if np_ % block_n:
    raise ValueError(f"codes: Np={np_} must be a multiple of block_n={block_n}")
  g = 1 if scales is None else scales.shape[0] // t
  if scales is not None and (g == 0 or scales.shape != (t * g, np_) or bk % (4 * g)
                             or meta.base.shape != (np_,)
                             or meta.normal.shape != (np_ // block_n, t)):
    raise ValueError(f"scales, meta: expected ({t} * G, {np_}) scales with G dividing "
                     f"{bk // 4}, and fold_metadata at block_n={block_n} (base ({np_},), "
                     f"normal ({np_ // block_n}, {t})); got {scales.shape}, "
                     f"{meta.base.shape}, {meta.normal.shape}")
  if order != "k" and bk % (32 * g):
    raise ValueError(f"scales: groups of {bk // g} codes (G={g} rows per K tile of {bk}); "
                     f"order={order!r} needs groups of a multiple of 32 codes")
  h = bk // 4 // g  # 16-bit runs of four codes per group
  if order != "k":  # 32-bit words of 8 codes, 4 per stored run of 32
    rg = bk // 32 // g  # runs per group
    words = jax.lax.bitcast_convert_type(codes.reshape(t, np_, bk // 8, 8), jnp.uint32)
    operands = [words.reshape(t, np_, g, rg, 4)]
    in_specs = [pl.BlockSpec((None, block_n, g, rg, 4), lambda kb, i: (kb, i, 0, 0, 0))]
  else:
    runs = jax.lax.bitcast_convert_type(codes.reshape(t, np_, bk // 4, 4), jnp.uint16)
    operands = [runs.reshape(t, np_, g, h)]
    in_specs = [pl.BlockSpec((None, block_n, g, h), lambda kb, i: (kb, i, 0, 0))]
  if scales is not None:
    operands += [scales.reshape(t, g, np_), meta.base.astype(jnp.int32), meta.normal]
    in_specs += [pl.BlockSpec((None, g, block_n), lambda kb, i: (kb, 0, i)),
                 pl.BlockSpec((block_n,), lambda kb, i: (i,)),
                 pl.BlockSpec((None, 1), lambda kb, i: (i, kb))]
  out_block = ((g, h) if order == "k" else (g, rg, 2, 4) if order == "p8" else (g, rg, 2, 2, 2))
  zeros = (0,) * len(out_block)
  out = pl.pallas_call(
      functools.partial(_kernel, kind=kind, order=order),
      out_shape=jax.ShapeDtypeStruct((np_, t, *out_block), jnp.uint32),
      grid=(t, np_ // block_n),
      in_specs=in_specs,
      out_specs=pl.BlockSpec((block_n, None, *out_block), lambda kb, i: (i, kb, *zeros)),
      compiler_params=plt.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name=f"carrier_unpack_{kind}" + ("" if order == "k" else f"_{order}"),
  )(*operands)
  out = jax.lax.bitcast_convert_type(out.reshape(np_, t * bk // 4), jnp.uint8)
  return jax.lax.bitcast_convert_type(out.reshape(np_, t * bk), jnp.float8_e4m3fn)
