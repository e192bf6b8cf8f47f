"""Per-token dynamic activation quantization in one pass over x (Pallas-Triton), for the
W8A8 family's 8-bit GEMMs at prefill on the GPU (:func:`quantize_rows`: codes and scales;
``w8a8.act_operands`` when ``FUSED_PREPASS``; the CPU interpreter keeps XLA's pre-pass
there), for the W4A8 decode on the WnA16 kernel (:func:`fake_quantize_rows`: the
quantize-dequantize in x's dtype, ``wnam_mgpu.decode_activations``) and for the W8A8
decode on it (:func:`decode_codes_rows`: the codes in the 8-bit carrier, or as x.dtype
values).

XLA makes the pre-pass a row reduction (amax) that reads x, a small select, then the
scale-divide-convert that reads x again and writes the carrier codes.  H200 session 18,
M = 4096, K = 8192 (64 MB of bf16 x): 17.2 + 1.5 + 41.8 us per layer with one fp8 convert
(``quantize.kernel_activations``).  Here one program owns ``BLOCK_ROWS`` rows.  Up to
``MAX_HELD_K`` columns it loads them once, in K chunks held in registers, for the amax and
then the codes: HBM sees x once and the codes once (32.8 us, 3.07 TB/s).  Wider rows are
read a second time, from L2 (K = 14336: 64.0 us).  Variants: ``benchmarks/
probe_act_prepass.py``, NOTES.md v20.  The decode form folds its chunks elementwise and
reduces across threads once per row, NaN counted as inf: H200 session 46, K = 8192,
M = 1 / 16, fp8: 2.58 / 2.70 us against 2.93 / 2.98 with a reduction per chunk and a
second one for NaN / inf (the same call, ``benchmarks/probe_w4a8_decode.py``); since
session 53 each row of up to ``SPLIT_MAX_M`` rows is split over ``DECODE_SPLITS``
programs of ``DECODE_WARPS`` warps (each reads the row whole for its amax and converts its
part): 0.40-0.79 us less on H100s.

The semantics are ``quantize_activations``'s for per-token float32 scales: scale =
amax / qmax (1 where the row is all zero), NaN where the row holds NaN / inf, values
``x / scale`` saturated to the format's range and rounded to nearest even in the carrier
(fp8 e4m3 / e5m2 codes, or int8): bit-equal to XLA's pre-pass in the interpreter.  On the
H200 Triton's float32 division could round a value on a carrier boundary differently;
``test_one_pass_gpu`` allows 1e-4 of the codes one step apart (it passed in session 18 with
the 4-row form; the 2-row form ran the prefill routes' GPU tests).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax.kernels import tuning
from humming_jax.quantize import FP8_CARRIERS, carrier_dtype
from humming_jax.spec import QuantSpec

# H200 session 18 (probe_act_prepass.py, fp8, us for M = 1024 / 4096): K = 8192 held in
# registers with 2 rows x 4 warps 8.5 / 32.8 (re-read 9.3 / 34.6); K = 14336 re-read with
# 2 rows x 8 warps 16.3 / 64.0 (held 18.8 / 73.4); 4 rows mostly slower, 8 rows worse.
BLOCK_ROWS = 2  # rows per program
MAX_CHUNK = 2048  # columns loaded per step (a power of two dividing the padded K)
# Rows up to this many columns stay in registers between the amax and the codes (2 rows x
# 8192 bf16 over 128 threads: 64 packed registers per thread); wider rows are re-read.
MAX_HELD_K = 8192
NUM_WARPS = {True: 4, False: 8}  # by whether the rows are held
# 1.5 * 2**23: t + magic, for |t| <= 2**22, is rounded to an integer (to even) that sits
# in the float's low mantissa bits, so bits(t + magic) - bits(magic) is round(t).  Read
# through the bits, which XLA (the interpreter) cannot fold as it folds (t + c) - c.
RNE_MAGIC = 12582912.0
MAGIC_BITS = int(np.float32(RNE_MAGIC).view(np.int32))


def round_half_even(t: jax.Array) -> jax.Array:
  """float32 ``t`` (|t| <= 2**22) rounded to the nearest integer, ties to even, as int32
  (the magic-number form above; elementwise, so any kernel's register layout takes it)."""
  return jax.lax.bitcast_convert_type(t + RNE_MAGIC, jnp.int32) - MAGIC_BITS


def supports(spec: QuantSpec) -> bool:
  """Dynamic per-token activations with float32 scales, to fp8 (e4m3 / e5m2) or int8."""
  return (spec.act_format is not None and spec.act_granularity == "token"
          and not spec.act_static and spec.act_scale_dtype == "float32"
          and (spec.act_format.name in FP8_CARRIERS or spec.act_format.name == "int8"))


def _chunk(kp: int) -> int:
  c = MAX_CHUNK
  while kp % c:
    c //= 2
  return c


def _kernel(x_ref, *refs, kp: int, chunk: int, fmt: str, qmax: float, held: bool,
            dequantize: bool = False, decode: bool = False, part: int = 0):
  # part: the columns of x this program converts (its split of the row: xp_ref), or 0
  # (the whole row, x_ref); the amax always reads the whole row
  xp_ref, a_ref, s_ref = refs if part else (x_ref, *refs)
  cols = [pl.ds(j * chunk, chunk) for j in range(kp // chunk)]
  chunks = [x_ref[:, c] for c in cols] if held else None  # one HBM read, kept
  load = (lambda j: chunks[j]) if held else (lambda j: x_ref[:, cols[j]])
  amax = None
  for j in range(len(cols)):  # the row's amax, NaN counted as inf (either: a NaN scale)
    x = load(j).astype(jnp.float32)
    ax = jnp.where(x != x, jnp.inf, jnp.abs(x))
    if decode:  # elementwise over the chunks, one reduction across threads
      amax = ax if amax is None else jnp.maximum(amax, ax)
    else:  # prefill (2 held rows): a reduction per chunk, no accumulator registers
      m = jnp.max(ax, axis=1, keepdims=True)
      amax = m if amax is None else jnp.maximum(amax, m)
  amax = jnp.max(amax, axis=1, keepdims=True)
  bad = amax == jnp.inf
  s = jnp.where(amax > 0, amax / qmax, 1.0)
  s = jnp.where(bad, jnp.nan, s)
  s_ref[...] = s  # (every split of a row writes the same scale)
  if part:  # this program's columns, read again (from L1 / L2)
    pc = _chunk(part)
    pcols = [pl.ds(j * pc, pc) for j in range(part // pc)]
    cols, load = pcols, lambda j: xp_ref[:, pcols[j]]
  for j, c in enumerate(cols):  # scale, saturate, round, store
    xs = load(j).astype(jnp.float32) / s
    if fmt == "int8":
      r = round_half_even(jnp.clip(xs, -128.0, 127.0))
      q, value = r.astype(jnp.int8), r.astype(jnp.float32)
    else:
      dtype, maxv = FP8_CARRIERS[fmt]
      q = jnp.clip(xs, -maxv, maxv).astype(dtype)
      value = q.astype(jnp.float32)
    # dequantize: the code times its scale (float32), rounded once to x's dtype; a 16-bit
    # a_ref without it: the code's own value (int8 / fp8 codes are exact in bf16 / fp16)
    a_ref[:, c] = ((value * s).astype(a_ref.dtype) if dequantize
                   else q if a_ref.dtype == q.dtype else value.astype(a_ref.dtype))


def _launch(x: jax.Array, spec: QuantSpec, block_rows: int, out_dtype, *,
            dequantize: bool, interpret: bool, decode: bool | None = None,
            splits: int = 1, warps: int | None = None) -> tuple[jax.Array, jax.Array]:
  """The kernel over (M, K) x, ``block_rows`` rows per program: ((M, K) codes in
  ``out_dtype`` (the carrier, or a 16-bit float holding their values), or with
  ``dequantize`` the dequantized values; (M, 1) float32 scales).  ``decode`` (default:
  ``dequantize``): the amax folded over the chunks first, one reduction per row.
  ``splits``: programs per row (decode; :func:`decode_splits`), each converting 1/splits
  of the row's columns; ``warps``: per program (None or 0: ``NUM_WARPS``' rule; the
  decode entry points pass :func:`decode_warps`)."""
  decode = dequantize if decode is None else decode
  m, k = x.shape
  fmt = spec.act_format.name
  held = k <= MAX_HELD_K
  if splits > 1 and not decode:
    raise ValueError(f"splits={splits}: expected 1 for the prefill form (only the decode "
                     f"form splits rows)")
  _check_splits(splits, k)
  part = k // splits if splits > 1 else 0
  row = lambda i, j: (i, 0)
  in_specs = [pl.BlockSpec((block_rows, k), row)]
  operands = [x]
  if part:  # the program's split of the row, beside the whole row (its amax)
    in_specs.append(pl.BlockSpec((block_rows, part), lambda i, j: (i, j)))
    operands.append(x)
  warps = warps or NUM_WARPS[held]
  return pl.pallas_call(
      functools.partial(_kernel, kp=k, chunk=_chunk(k), fmt=fmt,
                        qmax=float(spec.act_format.max_value), held=held,
                        dequantize=dequantize, decode=decode, part=part),
      out_shape=(jax.ShapeDtypeStruct((m, k), out_dtype),
                 jax.ShapeDtypeStruct((m, 1), jnp.float32)),
      grid=(pl.cdiv(m, block_rows), splits),
      in_specs=in_specs,
      out_specs=(pl.BlockSpec((block_rows, part or k), lambda i, j: (i, j)),
                 pl.BlockSpec((block_rows, 1), row)),
      compiler_params=plt.CompilerParams(num_warps=warps, num_stages=1),
      interpret=interpret,
      name=(f"act_fake_quant_{fmt}" if dequantize else f"act_decode_codes_{fmt}" if decode
            else f"act_prepass_{fmt}"),
  )(*operands)


# The decode form's programs per row (a power of two; fewer where K does not split into
# 128-column parts) and warps per program.  One program of 4 warps per row was latency
# bound: 64 values per thread through the amax, then through the divide and the store.
# With S programs per row each still reads the whole row for the amax (from L2 after the
# first) and converts 1/S of it.  H100 session 53, K = 8192, CUPTI us of the pre-pass
# (W8A8 int8 codes / fp8 codes / W4A8 fp8 fake quantization, M = 1; M = 16 int8 / fp8):
# 1 x 4 warps 2.49 / 2.38 / 2.62; 2.62 / 2.48 -> 4 x 8 warps 1.95 / 1.96 / 1.93;
# 2.07 / 2.08 (4 x 16: within 0.05 of it; 8 x 8 and 16 x 8 lose at M = 16: 2.2-2.6).
# Timed at M = 1 / 16 only: more rows (W4A8's decode route takes up to 511, MoE tiles)
# keep one program per row with NUM_WARPS' warps (4, or 8 where K > MAX_HELD_K), where S
# programs would read the rows S times.
DECODE_SPLITS = 4
DECODE_WARPS = 8
SPLIT_MAX_M = 16
# Overrides for device A/Bs, at every M (split programs default to DECODE_WARPS warps)
SPLITS_ENV = "HUMMING_JAX_PREPASS_SPLITS"
WARPS_ENV = "HUMMING_JAX_PREPASS_WARPS"


def decode_splits(k: int, m: int = 1) -> int:
  """Programs per row of the decode form for (M, K) x: ``DECODE_SPLITS`` up to
  ``SPLIT_MAX_M`` rows, else 1 (or HUMMING_JAX_PREPASS_SPLITS), halved until each part is
  a multiple of 128 columns."""
  s = tuning.env_int(SPLITS_ENV, DECODE_SPLITS if m <= SPLIT_MAX_M else 1)
  if s < 1 or s & (s - 1):
    raise ValueError(f"{SPLITS_ENV}={s}: expected a power of two >= 1")
  while s > 1 and k % (128 * s):
    s //= 2
  return s


def decode_warps(m: int, splits: int = 1) -> int:
  """Warps per program of the decode form for M rows split over ``splits`` programs:
  ``DECODE_WARPS`` up to ``SPLIT_MAX_M`` rows or wherever rows are split, else 0
  (``NUM_WARPS``' rule); HUMMING_JAX_PREPASS_WARPS (a power of two) overrides."""
  w = tuning.env_int(WARPS_ENV, DECODE_WARPS if m <= SPLIT_MAX_M or splits > 1 else 0)
  if w & (w - 1) or w > 32:
    raise ValueError(f"{WARPS_ENV}={w}: expected 0 (the default rule) or a power of two "
                     f"up to 32")
  return w


@functools.partial(jax.jit, static_argnames=("spec", "rows", "kp", "interpret"))
def quantize_rows(x: jax.Array, spec: QuantSpec, *, rows: int, kp: int,
                  interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """(M, K) float activations -> ((rows, kp) carrier codes, (rows, 1) float32 scales):
  ``w8a8.act_operands``'s outputs for a per-token spec (padding rows: zero codes, scale
  1), in one Pallas-Triton pass."""
  if not supports(spec):
    raise ValueError(f"spec {spec.name}: the one-pass pre-pass takes dynamic per-token "
                     f"activations with float32 scales to fp8 or int8")
  m, k = x.shape
  if rows < m or kp < k or kp % 128:
    raise ValueError(f"rows={rows}, kp={kp}: expected rows >= M={m} and kp >= K={k}, a "
                     f"multiple of 128")
  rp = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
  if (rp, kp) != (m, k):  # zero rows quantize to zero codes with scale 1
    x = jnp.pad(x, ((0, rp - m), (0, kp - k)))
  a, s = _launch(x, spec, BLOCK_ROWS, carrier_dtype(spec.act_format), dequantize=False,
                 interpret=interpret)
  return a[:rows], s[:rows]


# Rows per program of the decode form (fake_quantize_rows, decode_codes_rows: one token
# row, split over decode_splits programs; no padding).
FAKE_BLOCK_ROWS = 1


def fake_quantize_applies(x: jax.Array, spec: QuantSpec) -> bool:
  """Whether :func:`fake_quantize_rows` takes ``x``: a spec :func:`supports`, 16-bit x,
  K a multiple of 128."""
  return (supports(spec) and x.ndim == 2 and x.shape[1] % 128 == 0
          and x.dtype in (jnp.bfloat16, jnp.float16))


def decode_launch_applies(x: jax.Array, spec: QuantSpec, *, interpret: bool) -> bool:
  """Whether a decode route takes its per-token activations from one launch of this
  module (:func:`fake_quantize_rows`, :func:`decode_codes_rows`) rather than XLA's
  pre-pass: on the GPU (the CPU interpreter keeps XLA's, as ``w8a8.act_operands`` says),
  unless HUMMING_JAX_DECODE_PREPASS=0, for what :func:`fake_quantize_applies` takes.  The
  callers bound the rows (decode shapes)."""
  return (not interpret and tuning.env_flag("HUMMING_JAX_DECODE_PREPASS", True)
          and fake_quantize_applies(x, spec))


def fake_quantize_rows(x: jax.Array, spec: QuantSpec, *, interpret: bool = False,
                       splits: int | None = None) -> jax.Array:
  """(M, K) 16-bit activations -> what the W4A8 decode multiplies: each row quantized as
  a per-token ``spec`` says (the same scale and codes as :func:`quantize_rows`) and
  dequantized, code x scale in float32 rounded once to x.dtype -- the values of
  ``quantize.fake_quantize_activations(x, spec).astype(x.dtype)`` in one launch, where
  XLA runs a row reduction and then the quantize-dequantize (two launches per layer at
  decode).  ``splits`` programs per row (default :func:`decode_splits`), no padding."""
  if not fake_quantize_applies(x, spec):
    raise ValueError(f"spec {spec.name}, x {x.shape} {x.dtype}: the one-pass fake "
                     f"quantization takes dynamic per-token fp8 / int8 specs with float32 "
                     f"scales and bfloat16 / float16 (M, K) x with K a multiple of 128")
  splits = _resolve_splits(splits, *x.shape)
  return _fake_quantize_rows(x, spec, interpret=interpret, splits=splits,
                             warps=decode_warps(x.shape[0], splits))


@functools.partial(jax.jit, static_argnames=("spec", "interpret", "splits", "warps"))
def _fake_quantize_rows(x, spec, *, interpret, splits, warps):
  a, _ = _launch(x, spec, FAKE_BLOCK_ROWS, x.dtype, dequantize=True, interpret=interpret,
                 splits=splits, warps=warps)
  return a


def decode_codes_rows(x: jax.Array, spec: QuantSpec, *, codes_dtype=None,
                      interpret: bool = False, splits: int | None = None
                      ) -> tuple[jax.Array, jax.Array]:
  """(M, K) 16-bit activations -> ((M, K) codes, (M, 1) float32 scales): :func:`quantize_
  rows`' codes and scales for a per-token spec, ``splits`` programs per row as
  :func:`fake_quantize_rows`, for the Mosaic WnA16 kernel's W8A8 decode
  (``w8a8.run_decode_mgpu``), where XLA's pre-pass takes three launches (row amax, scale,
  quantize: ~1.4 + 1.2 + 1.5 us at 8192^2 on an H100, session 51).  ``codes_dtype``: the
  spec's 8-bit carrier (its 8-bit WGMMA operand) or x.dtype (default: the codes' values
  as 16-bit operands)."""
  if not fake_quantize_applies(x, spec):
    raise ValueError(f"spec {spec.name}, x {x.shape} {x.dtype}: the decode codes take "
                     f"dynamic per-token fp8 / int8 specs with float32 scales and bfloat16 "
                     f"/ float16 (M, K) x with K a multiple of 128")
  carrier = jnp.dtype(carrier_dtype(spec.act_format))
  codes_dtype = x.dtype if codes_dtype is None else jnp.dtype(codes_dtype)
  if codes_dtype not in (carrier, x.dtype):
    raise ValueError(f"codes_dtype={codes_dtype}: expected the spec's carrier {carrier} or "
                     f"x.dtype {x.dtype}")
  splits = _resolve_splits(splits, *x.shape)
  return _decode_codes_rows(x, spec, codes_dtype=codes_dtype, interpret=interpret,
                            splits=splits, warps=decode_warps(x.shape[0], splits))


@functools.partial(jax.jit, static_argnames=("spec", "codes_dtype", "interpret", "splits",
                                             "warps"))
def _decode_codes_rows(x, spec, *, codes_dtype, interpret, splits, warps):
  return _launch(x, spec, FAKE_BLOCK_ROWS, codes_dtype, dequantize=False, decode=True,
                 interpret=interpret, splits=splits, warps=warps)


def _resolve_splits(splits: int | None, m: int, k: int) -> int:
  """``splits`` checked (a power of two whose parts of K are multiples of 128), or
  :func:`decode_splits`' for (M, K); resolved outside the jitted launch, so an environment
  override reaches the next trace."""
  if splits is None:
    return decode_splits(k, m)
  _check_splits(splits, k)
  return splits


def _check_splits(splits: int, k: int) -> None:
  """The decode form's rule for programs per row: a power of two dividing K into parts
  of a multiple of 128 columns."""
  if splits < 1 or splits & (splits - 1) or k % (128 * splits):
    raise ValueError(f"splits={splits}: expected a power of two dividing K={k} into "
                     f"parts of a multiple of 128 columns")
