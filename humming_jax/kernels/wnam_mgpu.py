"""Quantized-activation specs (W8A8, W4A8, W4A4) on the Mosaic WnA16 kernel at decode, and
on the W8A8 family's large-M routes at prefill, from one prepared copy of the weights.  The
default family for sub-8-bit weights with quantized activations (:func:`priority_for`).

At small M a GEMM streams its weights: the time is the weight bytes over the bandwidth,
whatever the activations' format, so the 8-bit tensor cores buy nothing there.  The
Pallas-Triton W8A8 kernel, which unpacks 4-bit weights to 8 bits per tile, took 30.1 us of
kernel time for W4A8 int4 g128 at 8192^2, M = 1, where this family takes 15.7 (W4A16 of the
same weights: 15.4; H200 session 11, benchmarks/NOTES_w8a8.md).

Decode: the spec's own activation quantization (``quantize.fake_quantize_activations``,
what the reference runs; on the GPU per-token specs below 512 rows take its one-launch
Pallas form, :func:`decode_activations`), rounded once to x's 16-bit dtype, then
``wna16_mgpu.run`` on the weight half of the spec in that kernel's layout (4-bit codes in
its permuted K order, which the prefill's Pallas unpack reads too).  The error against the reference (exact
integer / fp8 products) is that one rounding of ``code * scale``: ~2**-9 relative per
activation for bf16 (at most 2**-8), the error class of WnA16 itself (H200: 2.0e-3-2.7e-3).

Prefill (no explicit config):
- M >= 512 with an exact 8-bit carrier, K groups of 128 or none, N padded to 128 and
  16-bit x: the W8A8 family's 8-bit Mosaic GEMM on the weights unpacked from this layout
  per call (:func:`run_prefill_8bit`; the unpack takes 33 us at 8192^2 for int8, against
  89 us from the W8A8 family's own layout; W4A8 int8 at M = 4096: 567.4 us of kernels,
  H200 session 14).
- MXFP4 x fp8 at M >= 512: folded onto the per-channel fp8 GEMM (:func:`run_prefill_mx_fold`;
  exact where a column's scales span at most 14 octaves, groups further below rounded to
  e4m3 subnormals).  8192^2, M = 4096: 406.7 us of kernels (H200 session 16) against 759
  on the route below (session 14).
- Else M >= 512 where the W8A8 family's large-M route has exact bfloat16 operands (MXFP4 /
  NVFP4 weights): that route (``w8a8.dequant_gemm``) on weights dequantized from this
  layout, activation scales in the float32 epilogue.
- Else the decode path (``wna16_mgpu.run``'s XLA dequantize + GEMM at large M).

Specs the W8A8 family refuses (no 8-bit carrier: zero-point weights with quantized
activations, e5m2 activations, int8 weights with fp8 activations, activation groups that do
not nest in the weight groups) have only this kernel.  Their H200 decode tests passed for
uint4 zp x int8 and int8 x fp8 e4m3 (session 11) and int4 g128 x fp8 e5m2 (session 12,
M = 1 / 16).  Activations: bf16 / fp16 (the WnA16
kernel's); float32 x takes the W8A8 family, or XLA for the no-carrier specs.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from humming_jax import formats
from humming_jax.kernels import act_prepass, carrier_unpack, registry, tuning, w8a8, w8a8_mgpu
from humming_jax.kernels import wna16_mgpu
from humming_jax.quantize import QuantizedWeight, fake_quantize_activations, kernel_activations
from humming_jax.spec import QuantSpec

FAMILY = "wnam_mgpu"


def weight_spec(spec: QuantSpec) -> QuantSpec:
  """The weight half of ``spec``: the same weights with 16-bit activations (WnA16)."""
  return spec.weight_only()


def unsupported_reason(spec: QuantSpec) -> str | None:
  if spec.act is None:
    return "act=None: weight-only specs run on wna16_mgpu itself"
  why = wna16_mgpu.unsupported_reason(weight_spec(spec))
  return None if why is None else f"its weights: {why}"


def supports(spec: QuantSpec) -> bool:
  """The spec quantizes activations and the WnA16 Mosaic kernel takes its weights here
  (a Hopper GPU, or the interpreter)."""
  return spec.act is not None and wna16_mgpu.supports(weight_spec(spec))


def gpu_known_bad(spec: QuantSpec) -> str | None:
  """The WnA16 kernel's fences on the weight half (every activation format this family
  takes has passed its H200 decode test: tests/test_wnam_mgpu.py::test_decode_gpu)."""
  return wna16_mgpu.KERNEL.gpu_known_bad(weight_spec(spec))


def weight_view(params: QuantizedWeight, layout: str) -> QuantizedWeight:
  """The same arrays as WnA16 params of ``layout`` (no activation scale); also the
  grouped family's (``grouped_wnam_mgpu``)."""
  return params.replace(spec=weight_spec(params.spec), act_scale=None, layout=layout)


def renamed(layout: str, family: str) -> str:
  """A prepared layout's name under another family (the details after ``family:`` kept)."""
  return family + layout[layout.index(":"):]


def family_view(params: QuantizedWeight, family: str) -> QuantizedWeight:
  """Prepared params of this family (or the grouped one) as the WnA16 ``family``'s params
  of the same layout: :func:`weight_view` under the :func:`renamed` layout."""
  return weight_view(params, renamed(params.layout, family))


def fp8_mma_applies(spec: QuantSpec) -> bool:
  """fp4 weights in scale groups of 32 or more with e4m3 activations scaled per token or
  per tensor (W4A8 MXFP4): the specs ``wna16_mgpu``'s fp8-MMA layout (":p8") computes on
  fp8 WGMMA (dense here, grouped in ``grouped_wnam_mgpu``)."""
  return (spec.act == "fp8_e4m3" and spec.act_granularity in ("token", "tensor")
          and wna16_mgpu.fp8_mma_reason(weight_spec(spec)) is None)


def fp8_operands(x: jax.Array, params: QuantizedWeight, *, interpret: bool = False
                 ) -> tuple[jax.Array, jax.Array]:
  """(M, K) 16-bit x -> the fp8-MMA layout's operands: x quantized as the spec says
  (``quantize.kernel_activations``: e4m3 codes) and each row's float32 scale, (M,).  On
  the GPU, per-token specs from ``w8a8.FUSED_PREPASS_MIN_M`` rows with K a multiple of
  128 take the one-pass Pallas pre-pass (``w8a8.fused_prepass_applies``; the same codes,
  <= 1e-4 of them one step apart on the H200), not XLA's amax reduction and convert (two
  passes over x): at Mixtral down, 1024 tokens (2048 x 14336 rows), those two took 31.0 +
  38.7 us of the W4A8 layer (H200 session 27)."""
  m, k = x.shape
  if w8a8.fused_prepass_applies(x, params.spec, k, interpret=interpret):
    codes, scales = act_prepass.quantize_rows(x, params.spec, rows=m, kp=k)
    return codes, scales.reshape(m)
  qa = kernel_activations(x, params.spec, params.act_scale, rows=m, kp=k)
  return qa.values, jnp.broadcast_to(qa.scales.reshape(-1, 1), (m, 1)).reshape(m)


def dense_fp8_mma(spec: QuantSpec) -> bool:
  """Whether :func:`prepare` takes the fp8-MMA layout: :func:`fp8_mma_applies` and
  HUMMING_JAX_DENSE_FP8_MMA=1 -- off by default.  H200 session 21 (NOTES.md v23), 8192^2,
  CUPTI kernels per layer, K order -> ":p8": M = 1 21.9 -> 20.8 us, M = 16 23.1 -> 20.8,
  M = 1024 131.7 -> 129.8 (decode error 2.6e-3 -> 3.4e-4); session 22: M = 128 41.3 ->
  47.6, M = 4096 413.1 -> 410.6 (NOTES.md v24), so off."""
  return fp8_mma_applies(spec) and tuning.env_flag("HUMMING_JAX_DENSE_FP8_MMA", False)


def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical params -> the WnA16 Mosaic layout of their weights (the activation scale of
  a static spec kept as it is): the decode kernel's own layout (4-bit codes in the
  permuted K order where ``wna16_mgpu.permutes`` says so, which the prefill's Pallas
  unpack reads with ``order="pk"``), or, where :func:`dense_fp8_mma` says so, the fp8-MMA
  layout (``order="p8"``), marked ":cf" where :func:`e2m1_mma_enabled` and the scales
  allow (:func:`run_prefill_e2m1_mma`)."""
  if (why := unsupported_reason(params.spec)) is not None:
    raise ValueError(f"spec {params.spec.name}: not supported by the {FAMILY} kernel ({why})")
  out = wna16_mgpu.prepare(weight_view(params, "canonical"),
                           mma="fp8" if dense_fp8_mma(params.spec) else "bf16")
  if e2m1_mma_enabled():  # ":cf" where the e8m0 scales allow it (concrete scales only):
    # the prefill's in-GEMM conversion (run_prefill_e2m1_mma) folds each group against its
    # column's largest.  Only with the route on: the mark syncs with the device and changes
    # the layout string (a mixed layer stack stays canonical in recipes).
    out = wna16_mgpu.mark_column_fold(out)
  return out.replace(spec=params.spec, act_scale=params.act_scale,
                     layout=renamed(out.layout, FAMILY))


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare` (bit-exact)."""
  out = wna16_mgpu.to_canonical(family_view(prepared, wna16_mgpu.FAMILY))
  return out.replace(spec=prepared.spec, act_scale=prepared.act_scale)


def run(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
        config: wna16_mgpu.Config | None = None) -> jax.Array:
  """(M, K) float activations x prepared params -> (M, N) in x.dtype: the activations
  quantized as the spec says and rounded to x.dtype, times the weights on the WnA16 kernel;
  without an explicit ``config``, M >= 512 with an exact 8-bit carrier
  (:func:`prefill_8bit_runs`) takes :func:`run_prefill_8bit`, MXFP4 x fp8 at M >= 512
  up to E2M1_MMA_MAX_M rows on ":p8:cf" params :func:`run_prefill_e2m1_mma` where
  :func:`e2m1_mma_enabled`, else
  :func:`run_prefill_mx_fold` (exact where a column's scales span at most MX_FOLD_SPAN
  octaves; groups further below round to e4m3 subnormals, at most 2**-16 of the column's
  largest group scale)."""
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params; call "
                     f"hj.prepare(params, kernel={FAMILY!r}) first")
  k, n = params.shape
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (M, K={k}); got shape {x.shape}")
  if x.shape[0] == 0:
    return jax.numpy.zeros((0, n), x.dtype)
  if config is None and x.shape[0] >= w8a8_mgpu.MIN_M and prefill_8bit_runs(params, x.dtype):
    return run_prefill_8bit(params, x, interpret=interpret)
  if (config is None and w8a8_mgpu.MIN_M <= x.shape[0] <= E2M1_MMA_MAX_M
      and e2m1_mma_enabled() and e2m1_mma_runs(params)
      and x.dtype in map(jnp.dtype, w8a8_mgpu.OUT_DTYPES)):
    return run_prefill_e2m1_mma(params, x, interpret=interpret)
  if (config is None and MX_FOLD_PREFILL and x.shape[0] >= w8a8_mgpu.MIN_M
      and mx_fold_runs(params) and x.dtype in map(jnp.dtype, w8a8_mgpu.OUT_DTYPES)):
    return run_prefill_mx_fold(params, x, interpret=interpret)
  view = family_view(params, wna16_mgpu.FAMILY)
  if config is None and x.shape[0] >= w8a8.DEQUANT_GEMM_MIN_M and _exact_dequant(params.spec):
    # The W8A8 family's large-M route on weights from this layout: bf16 operands that are
    # exact (MXFP4 / NVFP4), the activation scales in the float32 epilogue -- not the
    # decode path's bf16 rounding of code * scale (H200, W4A8 MXFP4 at M = 4096: 8.1e-5 vs
    # 2.6e-3 against the reference, same time).
    w = wna16_mgpu.dequantize_prepared(view.replace(global_scale=None), jax.numpy.float32)
    return w8a8.dequant_gemm(params, x, weights=w)
  m = x.shape[0]
  if wna16_mgpu.fp8_mma(params.layout):  # e4m3 codes and row scales on fp8 WGMMA
    if (m >= (config or wna16_mgpu.default_config(view, m)).dequant_gemm_min_m
        or x.dtype not in (jnp.bfloat16, jnp.float16)):
      # Where the K-order layout's decode path takes XLA's dequantize + GEMM (large M, no
      # 8-bit route above; float32 x), so does this layout (code_values undoes its order).
      xq = fake_quantize_activations(x, params.spec, params.act_scale).astype(x.dtype)
      return wna16_mgpu.dequant_gemm(view, xq)
    codes, x_scale = fp8_operands(x, params, interpret=interpret)
    return wna16_mgpu.run(view, codes, interpret=interpret, config=config,
                          x_scale=x_scale, out_dtype=x.dtype)
  if quantizes_x_in_kernel(params, view, x, interpret=interpret, config=config):
    return wna16_mgpu.run(view, x, interpret=interpret, config=config,
                          fake_quantize_x=params.spec.act_format.name)
  return wna16_mgpu.run(view, decode_activations(x, params, interpret=interpret),
                        interpret=interpret, config=config)


# The W4A8 decode keeps its pre-pass launch by default.  H200 session 58 (probe_w4a8_decode
# --variants qx1,qx0: CUPTI kernels per layer, one process, M = 1), activations quantized
# in the kernel against the pre-pass + GEMM: 8192^2 int4 x int8 17.22 against 15.78 (13.98
# + 1.80), int4 x e4m3 21.39 against 15.74, MXFP4 x e4m3 24.67 against 18.97; 14336 -> 4096
# int4 x int8 16.43 against 16.55.  The issue-bound decode loop converted each step's whole
# 8-row x tile (one real row at one token): +3.2 us of kernel (int8) to +7.4 (e4m3's
# integer rounding) at 8192^2, where the pre-pass costs 1.8.  Session 59 converts the row
# once per warpgroup (wna16_mgpu.RESIDENT_X); on an H100 at 8192^2 that is level with the
# pre-pass + GEMM (int4 x int8 17.03 / 17.15, x e4m3 17.34 / 17.08, MXFP4 19.55 / 20.22),
# H200 untimed: still off by default.  (W8A8's quantize_x converts
# to 8-bit codes for its 8-bit WGMMA, with no per-weight conversion beside it: a win there,
# session 55.)  HUMMING_JAX_DECODE_QUANTIZE_X=1 turns it on (W8A8's too).
FAKE_QUANTIZE_X_BY_DEFAULT = False


def quantizes_x_in_kernel(params: QuantizedWeight, view: QuantizedWeight, x: jax.Array, *,
                          interpret: bool = False,
                          config: wna16_mgpu.Config | None = None) -> bool:
  """Whether the decode route quantizes its activations inside the WnA16 kernel
  (``wna16_mgpu.run``'s ``fake_quantize_x``: the values of the reference's
  ``fake_quantize_activations`` rounded to x.dtype, which :func:`decode_activations` gives
  too -- its Pallas pre-pass divides by the scale where XLA and the kernel multiply by its
  reciprocal, a code step apart in rare ties -- without a pre-pass launch): dynamic
  per-token int8 / fp8 e4m3 specs with float32 scales (``wna16_mgpu.in_kernel_act_format``),
  bfloat16 / float16 x, the decode kernel with pipeline steps of whole 256-column x tiles
  (``wna16_mgpu.fake_quantize_x_fits``); off unless HUMMING_JAX_DECODE_QUANTIZE_X=1
  (:data:`FAKE_QUANTIZE_X_BY_DEFAULT`: slower at 8192^2 on the H200; with it True, W8A8's
  default; both through ``w8a8.decode_quantizes_x``)."""
  m = x.shape[0]
  fits = (wna16_mgpu.in_kernel_act_format(params.spec) is not None
          and x.dtype in (jnp.bfloat16, jnp.float16)
          and wna16_mgpu.fake_quantize_x_fits(view, config, rows=m))
  if not fits:
    return False
  k_tiles, _, bk = view.codes.shape  # (the padded K)
  return w8a8.decode_quantizes_x(m, k_tiles * bk, interpret,
                                 by_default=FAKE_QUANTIZE_X_BY_DEFAULT)


def decode_activations(x: jax.Array, params: QuantizedWeight, *,
                       interpret: bool = False) -> jax.Array:
  """The decode route's activations: quantized as the spec says and rounded to x.dtype
  (``fake_quantize_activations``).  On the GPU, per-token specs with 16-bit x, K a
  multiple of 128 and fewer than ``w8a8.FUSED_PREPASS_MIN_M`` rows (decode: GPU-tested at
  M = 1 / 16) take the one-launch Pallas pre-pass (``act_prepass.fake_quantize_rows``,
  bit-equal in the interpreter; on the H200 <= 1e-3 of values a code step apart) unless
  HUMMING_JAX_DECODE_PREPASS=0: XLA runs a row reduction and then the
  quantize-dequantize, two launches.  H200 session 42: the one launch costs about what
  the two did (2.6-2.9 us at 8192, against session 21's ~2.9; no same-run A/B); since
  session 53 rows split over four programs at M <= 16 (``act_prepass.decode_splits``):
  1.85-2.1 us on H100s, 0.6-0.8 below the one-program form in the same process.  The
  CPU interpreter keeps XLA's (as ``w8a8.act_operands`` does)."""
  if (x.shape[0] < w8a8.FUSED_PREPASS_MIN_M
      and act_prepass.decode_launch_applies(x, params.spec, interpret=interpret)):
    return act_prepass.fake_quantize_rows(x, params.spec)
  return fake_quantize_activations(x, params.spec, params.act_scale).astype(x.dtype)


# ----------------------------------------------------------------------------------------
# MXFP4 x fp8 prefill folded onto the per-channel fp8 GEMM
# ----------------------------------------------------------------------------------------
# An MXFP4 weight is e2m1 x 2**E (E: its 32-row group's e8m0 exponent).  With one base B
# per column (its largest E - 6), e2m1 x 2**(E - B) is an e4m3 number for every E - B in
# [-8, 6]: 6 x 2**6 = 384 <= 448, and e2m1 values are multiples of 0.5 with at most two
# significant bits, so down to E - B = -8 they are e4m3 normals or land on its subnormal
# grid (2**-9).  Where a column's exponents span at most MX_FOLD_SPAN octaves the fold is
# exact.  Groups further below round to the nearest subnormal (ties to even): an absolute
# error of at most 2**-16 x the column's largest group scale, against the fp8
# activations' 2**-4 relative per product -- so the route needs no check on the values.
# (A ``lax.cond`` to the bf16 route where it was not exact cost ~40 / ~85 us of wall per
# call at M = 1024 / 4096 on the H200, session 15 call 4: likely a host round trip and
# the branch's output copy.)
# The prefill then runs the 8-bit GEMM without K groups (per-token x per-column scales in
# the epilogue) instead of bf16 operands and XLA's GEMM.  The fp8 products are summed over
# all of K in the WGMMA accumulator: the w8a8-fp8 error class (2.1e-3 at K = 8192 on the
# H200), not the bf16 route's 8e-5.  H200 session 16, 8192^2, M = 1024 / 4096 (calls
# 5-6, the packed-word unpack): kernels 138.2 / 406.7 us, wall 150.6 / 425.8; Humming
# 116.0 / 474.8; the bf16 route (session 14) 259.9 / 758.6 of kernels.
MX_FOLD_PREFILL = True
MX_FOLD_SPAN = 14
# The prefill's per-call unpack of 4-bit codes to e4m3 (int4 -> e4m3, the MXFP4 fold) on the
# Pallas-Triton kernel (kernels/carrier_unpack.py); False: the XLA fusions it is checked
# against.  H200 session 16, 8192^2: 30.2 / 31.0 us (packed-word arithmetic), XLA 80.7 /
# 116.1 (ALU-bound: ~25 integer ops per code).  It also picks the fold's metadata kernel
# (carrier_unpack.fold_metadata: 7.9 us, session 18; XLA's fusions ~11).
PALLAS_UNPACK = True


def mx_fold_applies(spec: QuantSpec) -> bool:
  """MXFP4 weights (e2m1, e8m0 group scales) x fp8 e4m3 activations with one scale per
  token or tensor: the specs the fold computes (params: :func:`mx_fold_runs`)."""
  return (spec.weight_format.name == wna16_mgpu.FP4 and spec.scale_dtype == "e8m0"
          and spec.granularity == "group" and spec.act_format is not None
          and spec.act_format.name == "fp8_e4m3" and spec.act_granularity != "group")


def mx_fold_runs(params: QuantizedWeight) -> bool:
  """The fold's spec, in this family's layout, with N and K padded to the 8-bit GEMM's
  128 (groups of 32 / 64 keep 128-deep K tiles only when the tile count allows)."""
  if not mx_fold_applies(params.spec) or registry.layout_family(params.layout) != FAMILY:
    return False
  t, np_, bk = params.codes.shape
  return np_ % 128 == 0 and (t * bk) % w8a8_mgpu.Config.tile_k == 0


def _real_groups(params: QuantizedWeight) -> int:
  """Group-scale rows that cover real K rows (the rest pad K to the layout's tiles)."""
  return -(-params.shape[0] // params.spec.group_size)


def _mx_fold_exponents(params: QuantizedWeight) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(E, B, exact): the (Kp / group, Np) int32 exponents of the power-of-two group scales
  (the layout's bf16 rows of e8m0 values, read off the bits: ``carrier_unpack.
  scale_exponents``; padded rows are 1, NaN is 128), each column's base B = its largest
  exponent over the K rows that exist - 6 (the largest folded value is 6 x 2**6 = 384),
  kept >= -126 (2**B a float32 normal), and whether every E - B is at least
  6 - MX_FOLD_SPAN: no value rounds (a scalar bool array)."""
  e = carrier_unpack.scale_exponents(params.scales)
  base = mx_fold_metadata(params).base
  return e, base, jnp.all(e[:_real_groups(params)] - base[None] >= 6 - MX_FOLD_SPAN)


def _check_fold_x(params: QuantizedWeight, x: jax.Array) -> None:
  """The MXFP4 fold routes' activation checks (the 8-bit GEMM's output dtypes)."""
  w8a8._check_x(x, params.shape[0])
  if x.dtype not in map(jnp.dtype, w8a8_mgpu.OUT_DTYPES):
    raise ValueError(f"x.dtype={x.dtype}: the 8-bit GEMM takes bfloat16 / float16")


def _per_channel_fp8(params: QuantizedWeight) -> QuantizedWeight:
  """``params`` as the 8-bit GEMM's caller sees the folded weights: e4m3 codes with one
  float32 scale per column (the activation side of the spec unchanged)."""
  return params.replace(spec=dataclasses.replace(params.spec, weight="fp8_e4m3",
                                                 granularity="channel",
                                                 scale_dtype="float32"))


def run_prefill_mx_fold(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
                        config: w8a8_mgpu.Config | None = None) -> jax.Array:
  """MXFP4 x fp8 at large M: the weights folded per call into (N, K) e4m3 codes and one
  power-of-two scale per column (:func:`mx_fold_codes`), then the W8A8 family's
  activation pre-pass and Mosaic 8-bit GEMM without K groups."""
  spec = params.spec
  if not mx_fold_runs(params):
    raise ValueError(f"spec {spec.name}, params.layout={params.layout!r}, codes "
                     f"{params.codes.shape}: the MXFP4 fold takes MXFP4 x fp8 (per token / "
                     f"tensor) params prepared for {FAMILY}, N and K padded to 128")
  _check_fold_x(params, x)
  t, np_, bk = params.codes.shape
  meta = mx_fold_metadata(params, pallas=PALLAS_UNPACK, interpret=interpret)
  folded = _per_channel_fp8(params)
  return w8a8.gemm_8bit(x, folded, lambda _: mx_fold_codes(params, pallas=PALLAS_UNPACK,
                                                          interpret=interpret, meta=meta),
                        meta.col_scale.reshape(1, np_), kp=t * bk, np_=np_, config=config,
                        interpret=interpret)


# MXFP4 x fp8 at M >= 512 on the fp8-MMA layout with the column fold (":p8:cf",
# prepare(mma="fp8")): the 8-bit GEMM converts each K step's codes to e4m3 in shared memory
# (w8a8_mgpu.E2M1Weights) instead of the per-call unpack to an (Np, Kp) e4m3 array (H200
# session 18, 8192^2, M = 1024: unpack 30.5 + metadata 7.9 us beside the 88.5 us GEMM).
# Off: its first form took the H100's GEMM from 92.0 to 163.4 us there (session 61).  The
# current one (session 62: the conversion beside the previous WGMMA, one B tile shared by
# both warpgroups) beats the unpack route on an H100 at M = 512 (74.4 against 98.2 us of
# kernels per 8192^2 layer, three pipeline stages) and at 1024 (135.8 / 146.3 with the
# four stages since call 10), and loses at 4096 (565.1 / 436.1 with three), hence
# E2M1_MMA_MAX_M; it needs ":p8:cf" params, which only the opt-in fp8-MMA layout has.
# HUMMING_JAX_E2M1_MMA=1 turns it on (read at trace time).
E2M1_MMA_PREFILL = False
E2M1_MMA_MAX_M = 1024  # above it the per-call unpack is faster (4096 measured; not between)


def e2m1_mma_enabled() -> bool:
  """:data:`E2M1_MMA_PREFILL`, or HUMMING_JAX_E2M1_MMA=0|1 where set."""
  return tuning.env_flag("HUMMING_JAX_E2M1_MMA", E2M1_MMA_PREFILL)


def e2m1_mma_runs(params: QuantizedWeight) -> bool:
  """The fold's params (:func:`mx_fold_runs`) on the fp8-MMA layout checked by the column
  fold (``wna16_mgpu.single_acc_layout``: ":p8:cf"), in MXFP4's groups of 32, whose codes
  the 8-bit GEMM reads."""
  return (mx_fold_runs(params) and wna16_mgpu.single_acc_layout(params)
          and params.spec.group_size == w8a8_mgpu.E2M1_GROUP
          and params.codes.shape[2] == w8a8_mgpu.Config.tile_k)


def run_prefill_e2m1_mma(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
                         config: w8a8_mgpu.Config | None = None) -> jax.Array:
  """MXFP4 x fp8 at large M, the codes converted inside the 8-bit GEMM: the W8A8 family's
  activation pre-pass, then ``w8a8_mgpu.gemm`` on ``w8a8_mgpu.E2M1Weights`` (each group
  folded against its column's largest scale, exact on ":cf" params).  The same values as
  :func:`run_prefill_mx_fold` (both exact), one kernel fewer per call."""
  spec = params.spec
  if not e2m1_mma_runs(params):
    raise ValueError(f"spec {spec.name}, params.layout={params.layout!r}, codes "
                     f"{params.codes.shape}: the in-GEMM conversion takes MXFP4 x fp8 (per "
                     f"token / tensor) params prepared for {FAMILY} with mma='fp8' and "
                     f"checked by the column fold (':p8:cf'), N and K padded to 128")
  _check_fold_x(params, x)
  t, np_, bk = params.codes.shape
  top = params.fold_base
  if top is None:  # (":cf" params from before fold_base was stored)
    top = wna16_mgpu.column_fold_row(*wna16_mgpu.column_fold_base(
        params.scales, params.shape[0], spec))
  weights = w8a8_mgpu.E2M1Weights(params.codes, params.scales, top,
                                  fold_shift=w8a8_mgpu.e2m1_fold_shift())
  folded = _per_channel_fp8(params)
  config = config or w8a8_mgpu.e2m1_heuristic(x.shape[0], np_)
  return w8a8.gemm_8bit(x, folded, lambda _: weights, jnp.ones((1, np_), jnp.float32),
                        kp=t * bk, np_=np_, config=config, interpret=interpret)


def mx_fold_metadata(params: QuantizedWeight, *, pallas: bool = False,
                     interpret: bool = False) -> carrier_unpack.FoldMetadata:
  """The fold's per-call metadata off the layout's scale rows (column bases and scales,
  per-block normal flags): ``carrier_unpack.fold_metadata``, ``pallas``: its kernel."""
  return carrier_unpack.fold_metadata(params.scales, tiles=params.codes.shape[0],
                                      real_groups=_real_groups(params), pallas=pallas,
                                      interpret=interpret)


def mx_fold_column_scales(params: QuantizedWeight) -> tuple[jax.Array, jax.Array]:
  """(Np,) float32 column scales 2**B and whether the fold is exact (a scalar: every
  column's exponents within MX_FOLD_SPAN octaves).  A column with a NaN group scale (e8m0
  code 255) gets a NaN scale: its outputs are NaN, as the reference's are (its folded
  codes are not meaningful)."""
  return mx_fold_metadata(params).col_scale, _mx_fold_exponents(params)[2]


def mx_fold_shifts(params: QuantizedWeight) -> jax.Array:
  """(Kp / bk, Np, bk / group) int32 shifts E - B of each group under its column's base,
  clipped to ``carrier_unpack.SHIFT_RANGE`` (padded K rows, scale 1, meet zero codes)."""
  t, np_, bk = params.codes.shape
  e, base, _ = _mx_fold_exponents(params)
  shift = carrier_unpack.fold_shifts(e, base[None])
  return shift.reshape(t, bk // params.spec.group_size, np_).transpose(0, 2, 1)


def mx_fold_codes(params: QuantizedWeight, *, pallas: bool = False,
                  interpret: bool = False,
                  meta: carrier_unpack.FoldMetadata | None = None) -> jax.Array:
  """(Np, Kp) e4m3 codes of e2m1 x 2**(E - B): the weight over its column scale, exact
  for groups up to MX_FOLD_SPAN octaves under the column's largest, rounded to the
  nearest e4m3 subnormal further below.  ``pallas``: the Pallas-Triton unpack
  (``carrier_unpack``, which reads the shifts off the scale rows); else this XLA
  reference through the formats' decode / encode.  ``meta``: the Pallas unpack's
  :func:`mx_fold_metadata`, when the caller has it (default: from its kernel)."""
  if pallas:
    order = wna16_mgpu.code_order(params.layout)
    if meta is None:
      meta = mx_fold_metadata(params, pallas=True, interpret=interpret)
    return carrier_unpack.unpack(params.codes, params.scales, meta, kind="e2m1",
                                 interpret=interpret, order=order)
  shift = mx_fold_shifts(params)
  t, np_, bk = params.codes.shape
  g = params.spec.group_size
  vals = wna16_mgpu.code_values(params, jnp.float32).reshape(t, np_, bk // g, g)
  vals = (vals * formats.exp2_int(shift)[..., None]).reshape(t, np_, bk)  # exact
  codes = formats.get_format("fp8_e4m3").encode_exact(vals, round_subnormals=True)
  return k_major(jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn))


def _exact_dequant(spec: QuantSpec) -> bool:
  plan = w8a8.plan_for(spec)
  return plan is not None and w8a8.dequant_gemm_exact(spec, plan)


def prefill_8bit_runs(params: QuantizedWeight, x_dtype) -> bool:
  """Whether the W8A8 family's Mosaic 8-bit GEMM computes these params from this layout:
  an exact 8-bit carrier for weights and activations (``w8a8.plan_for``), K-group scales
  of one WGMMA step (128) or none, N padded to 128, 16-bit activations."""
  plan = w8a8.plan_for(params.spec)
  if (plan is None or plan.fold or params.num_experts is not None or params.codes.ndim != 3
      or registry.layout_family(params.layout) != FAMILY):
    return False
  if any(g not in (0, w8a8_mgpu.Config.tile_k) for g in (plan.w_group, plan.a_group)):
    return False
  return (params.codes.shape[-2] % 128 == 0  # N: two 64 / 128-column WGMMA tiles per CTA
          and params.codes.shape[-1] % w8a8_mgpu.Config.tile_k == 0  # K tiles of 128
          and jax.numpy.dtype(x_dtype) in map(jax.numpy.dtype, w8a8_mgpu.OUT_DTYPES))


def k_major(codes: jax.Array) -> jax.Array:
  """(Kp / bk, Np, bk) codes in this layout's K-tile order -> (Np, Kp): the 8-bit GEMM's
  K-major weight operand."""
  t, np_, bk = codes.shape
  return codes.transpose(1, 0, 2).reshape(np_, t * bk)


def _carrier_codes(params: QuantizedWeight, *, pallas: bool = False,
                   interpret: bool = False) -> jax.Array:
  """(Kp / bk, Np, bk) WnA16-layout codes -> (Np, Kp) values in the 8-bit carrier of the
  spec (``w8a8._carrier``: int8, or e4m3), exact for every spec of
  :func:`prefill_8bit_runs` (int4 / int8 in int8; int4, fp4 e2m1 and fp8 e4m3 in e4m3).
  ``pallas``: 4-bit codes to e4m3 on the Pallas-Triton unpack (``carrier_unpack``)."""
  carrier = w8a8._carrier(params.spec)
  if params.codes.dtype == carrier:  # fp8 e4m3 codes: already the carrier
    vals = params.codes
  elif carrier == jax.numpy.int8:  # integer codes (prefill_8bit_runs: exact carriers only)
    vals = wna16_mgpu.code_values(params, carrier)
  elif pallas and params.codes.dtype == jnp.int4:
    order = wna16_mgpu.code_order(params.layout)
    kind = "e2m1" if params.spec.weight_format.name == wna16_mgpu.FP4 else "int"
    return carrier_unpack.unpack(params.codes, kind=kind, interpret=interpret, order=order)
  else:  # int4 / fp4 values (all zero or normal in e4m3) -> e4m3 codes off their float32
    # bits.  H200 8192^2 unpack: XLA's float32 -> e4m3 convert 196 us, the format's general
    # encode 121 us (session 14), this form 81 (session 15); int8's 33.
    vals = wna16_mgpu.code_values(params, jax.numpy.float32)
    vals = formats.get_format("fp8_e4m3").encode_exact(vals)
    vals = jax.lax.bitcast_convert_type(vals, carrier)
  return k_major(vals)


def run_prefill_8bit(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
                     config: w8a8_mgpu.Config | None = None) -> jax.Array:
  """Prefill: the W8A8 family's activation pre-pass and Mosaic 8-bit GEMM
  (``w8a8.gemm_8bit``) on the weights unpacked from this layout to the 8-bit carrier once
  per call -- the same GEMM, carrier values and scales as ``w8a8.run_mgpu`` on the W8A8
  family's own layout, so one prepared copy serves decode and prefill."""
  if not prefill_8bit_runs(params, x.dtype):
    raise ValueError(f"spec {params.spec.name}: the 8-bit GEMM needs an exact 8-bit carrier, "
                     f"K-group scales of 128 (or none), N padded to 128 and 16-bit x; got "
                     f"x.dtype={x.dtype}, padded N={params.codes.shape[-2]}")
  w8a8._check_x(x, params.shape[0])
  if x.shape[0] == 0:
    return jax.numpy.zeros((0, params.shape[1]), x.dtype)
  t, np_, bk = params.codes.shape
  scales = params.scales.astype(jax.numpy.float32)  # (Kp / group, Np) or the (1, Np) row
  codes = lambda config: _carrier_codes(params, pallas=PALLAS_UNPACK, interpret=interpret)
  return w8a8.gemm_8bit(x, params, codes, scales,
                        kp=t * bk, np_=np_, config=config, interpret=interpret)


def priority_for(spec: QuantSpec, shape: tuple[int, ...]) -> int:
  """Above the W8A8 family for weights of fewer than 8 bits (W4A8, W4A4), below it for
  8-bit weights.  H200 session 11, 8192^2, CUPTI kernel time per layer, this family vs the
  W8A8 family (benchmarks/NOTES_w8a8.md): W4A8 int4 g128 -> int8 at M = 1 / 16 / 1024
  15.7 / 16.3 / 207.2 vs 30.1 / 30.9 / 242.2 us (W4A16 of the same weights 15.4 / 15.9 /
  225.7); W4A8 MXFP4 at M = 16 / 4096 20.6 / 770.5 vs 51.2 / 774.9.  8-bit weights: W8A8
  int8 at M = 16 20.5 vs 22.6, but at prefill the W8A8 family reads its own (N, K) int8
  layout where this one unpacks the codes per call, so 8-bit weights stay there."""
  del shape
  return 1 if spec.weight_bits < 8 else -1


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=3, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, priority=-1, priority_for=priority_for,
    gpu_known_bad=gpu_known_bad, x_dtypes=("bfloat16", "float16"),
    dequantize=lambda params, dtype: wna16_mgpu.KERNEL.dequantize(
        family_view(params, wna16_mgpu.FAMILY), dtype)))
