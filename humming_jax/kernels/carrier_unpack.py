"""4-bit weight codes in the WnA16 Mosaic layout -> the 8-bit GEMM's K-major e4m3 operand,
in one Pallas-Triton pass (prefill of ``wnam_mgpu``: W4A8 fp8 and the MXFP4 fold).

``wnam_mgpu`` keeps one prepared copy of 4-bit weights, (Kp / bk, Np, bk) int4 codes, for
decode (the WnA16 Mosaic kernel) and prefill (the Mosaic 8-bit GEMM on an (Np, Kp) e4m3
operand unpacked once per call).  Each code maps to its e4m3 code in integer ops read off
the two formats' fields (:func:`int_e4m3_codes`, :func:`e2m1_e4m3_codes`), two codes per
byte into one uint16 store.

H200 session 16, 8192^2, CUPTI: 81.8 us (int4) and 113.9 us (the fold) here against XLA's
fusions of the reference 80.8 / 116.9, and 33 us for XLA's int4 -> int8 with the same
transposition.  Predicted ~40 (96 MB at ~3 TB/s); the equal times of two unrelated code
generators say the unpack is ALU-bound at ~25 integer ops per element, not layout-bound.
The next step is fewer ops per element: packed-word (4 codes per 32-bit op) arithmetic or
a ``prmt`` table lookup.  It stays the default (``wnam_mgpu.PALLAS_UNPACK``) as that base.

The XLA reference is beside it: ``wnam_mgpu.mx_fold_codes`` / ``_carrier_codes`` through
the formats' own ``decode`` / ``encode_exact``; the element maps are checked bit-equal to
them on every input they take (tests/test_carrier_unpack.py) and the kernel on random
layouts (interpreter and H200).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax import formats

_E4M3 = formats.get_format("fp8_e4m3")
_E2M1 = formats.get_format("fp4_e2m1")
# Shifts E - B the fold passes (wnam_mgpu._MX_FOLD_MIN_SHIFT .. 6): every e2m1 value times
# 2**shift is then an e4m3 normal, subnormal or zero (6 x 2**6 = 384 <= 448).
SHIFT_RANGE = (-20, 6)


def _e4m3_of(unbiased: jax.Array, mant: jax.Array, sign: jax.Array,
             nonzero: jax.Array) -> jax.Array:
  """int32 e4m3 code of sign x (1 + mant / 2**m) x 2**unbiased (``mant``: the top m bits,
  exact), rounded to the nearest subnormal (ties to even) below the least normal, as
  ``encode_exact(..., round_subnormals=True)`` does; zero (either sign) is code 0."""
  m, bias = _E4M3.mantissa_bits, _E4M3.bias
  field = unbiased + bias
  normal = (field << m) | mant
  # Below the least normal: the significand (1 << m | mant) x 2**(field - 1) subnormal steps.
  sig = (1 << m) | mant
  sh = jnp.clip(1 - field, 1, m + 2)  # m + 2: sig < 2**(m + 1) rounds to zero past it
  q, r, half = sig >> sh, sig & ((1 << sh) - 1), 1 << (sh - 1)
  sub = q + ((r > half) | ((r == half) & ((q & 1) == 1))).astype(jnp.int32)
  code = jnp.where(field >= 1, normal, sub)
  return jnp.where(nonzero & (code != 0), code | (sign << 7), 0)


def int_e4m3_codes(nibble: jax.Array) -> jax.Array:
  """int32 two's-complement int4 nibbles (0..15) -> int32 e4m3 codes of the integers
  -8 .. 7 (all exact in e4m3)."""
  v = jnp.where(nibble >= 8, nibble - 16, nibble)
  a = jnp.abs(v)
  lg = (a >= 2).astype(jnp.int32) + (a >= 4) + (a >= 8)  # floor(log2 |v|)
  mant = ((a << _E4M3.mantissa_bits) >> lg) & ((1 << _E4M3.mantissa_bits) - 1)
  return _e4m3_of(lg, mant, (v < 0).astype(jnp.int32), a != 0)


def e2m1_e4m3_codes(nibble: jax.Array, shift: jax.Array | int = 0) -> jax.Array:
  """int32 e2m1 bit patterns (0..15) and int32 shifts in SHIFT_RANGE -> int32 e4m3 codes of
  e2m1 x 2**shift (exact down to the least e4m3 normal, rounded to a subnormal below)."""
  ms, bs = _E2M1.mantissa_bits, _E2M1.bias
  if ms != 1:
    raise AssertionError("e2m1_e4m3_codes reads a 1-bit mantissa")
  mag = nibble & ((1 << (_E2M1.bits - 1)) - 1)
  ee, mm = mag >> ms, mag & ((1 << ms) - 1)
  # e2m1's one subnormal (ee 0, mm 1) is 2**-bs with no mantissa; normals 2**(ee-bs) (1+mm/2)
  unbiased = jnp.where(ee == 0, -bs, ee - bs) + shift
  mant = jnp.where(ee == 0, 0, mm << (_E4M3.mantissa_bits - ms))
  return _e4m3_of(unbiased, mant, nibble >> (_E2M1.bits - 1), mag != 0)


def _kernel(*refs, kind: str):
  codes_ref, *shift_ref, out_ref = refs
  b = codes_ref[...].astype(jnp.int32)  # (bn, G, h) bytes: element 2j low, 2j + 1 high
  lo, hi = b & 15, (b >> 4) & 15
  if kind == "int":
    lo, hi = int_e4m3_codes(lo), int_e4m3_codes(hi)
  else:
    s = shift_ref[0][...].astype(jnp.int32)[:, :, None] if shift_ref else 0
    lo, hi = e2m1_e4m3_codes(lo, s), e2m1_e4m3_codes(hi, s)
  out_ref[...] = (lo | (hi << 8)).astype(jnp.uint16)  # little-endian: lo first


@functools.partial(jax.jit, static_argnames=("kind", "block_n", "interpret"))
def unpack(codes: jax.Array, shifts: jax.Array | None = None, *, kind: str,
           block_n: int = 64, interpret: bool = False) -> jax.Array:
  """(Kp / bk, Np, bk) int4 codes -> (Np, Kp) float8_e4m3fn, K-major.

  ``kind="int"``: the codes are integers (-8 .. 7).  ``kind="e2m1"``: e2m1 bit patterns,
  times 2**shift with ``shifts`` (Kp / bk, Np, G) int32 in SHIFT_RANGE, one per group of
  bk / G codes along K (None: no shift)."""
  if codes.ndim != 3 or codes.dtype != jnp.int4:
    raise ValueError(f"codes: expected (Kp / bk, Np, bk) int4; got {codes.shape} "
                     f"{codes.dtype}")
  if kind not in ("int", "e2m1"):
    raise ValueError(f"kind={kind!r}: expected 'int' or 'e2m1'")
  if shifts is not None and kind != "e2m1":
    raise ValueError("shifts: only for kind='e2m1'")
  t, np_, bk = codes.shape
  g = 1 if shifts is None else shifts.shape[-1]
  if shifts is not None and (shifts.shape[:2] != (t, np_) or bk % (2 * g)):
    raise ValueError(f"shifts: expected ({t}, {np_}, G) with G dividing {bk // 2}; got "
                     f"{shifts.shape}")
  if np_ % block_n:
    raise ValueError(f"codes: Np={np_} must be a multiple of block_n={block_n}")
  h = bk // 2 // g
  b = jax.lax.bitcast_convert_type(codes.reshape(t, np_, bk // 2, 2), jnp.uint8)
  operands = [b.reshape(t, np_, g, h)]
  in_specs = [pl.BlockSpec((None, block_n, g, h), lambda kb, i: (kb, i, 0, 0))]
  if shifts is not None:
    operands.append(shifts.astype(jnp.int32))
    in_specs.append(pl.BlockSpec((None, block_n, g), lambda kb, i: (kb, i, 0)))
  out = pl.pallas_call(
      functools.partial(_kernel, kind=kind),
      out_shape=jax.ShapeDtypeStruct((np_, t, g, h), jnp.uint16),
      grid=(t, np_ // block_n),
      in_specs=in_specs,
      out_specs=pl.BlockSpec((block_n, None, g, h), lambda kb, i: (i, kb, 0, 0)),
      compiler_params=plt.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name=f"carrier_unpack_{kind}",
  )(*operands)
  out = jax.lax.bitcast_convert_type(out.reshape(np_, t * bk // 2), jnp.uint8)
  return jax.lax.bitcast_convert_type(out.reshape(np_, t * bk), jnp.float8_e4m3fn)
