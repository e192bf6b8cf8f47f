"""WnA16 on Hopper tensor cores through Mosaic GPU: 4/8-bit weights dequantized in registers.

``y = x @ W_deq + bias`` for int4 / int8 weights (symmetric, or unsigned with a zero point),
fp4 e2m1 weights (MXFP4, NVFP4: e8m0 / e4m3 group scales, fp32 global scale) and fp8 e4m3
weights (converted e4m3 -> f16 [-> bf16] in registers; routed here since session 8), with
group (16 ... 256) or per-channel scales and bf16 / fp16 activations.  Since session 54 the
layout also carries the other integer widths, fp6 and fp8 e5m2 on those conversions
(:func:`code_bits`, :func:`carried`: 1-3 bits as int4, 5-7 as int8, fp6 as e4m3 bytes,
e5m2 by its own cvt), the default route for the formats in :data:`CARRIED_BY_DEFAULT`.

Why a second WnA16 kernel (benchmarks/NOTES.md, "v4"): in Pallas-Triton the dequantized
tile has to be written to shared memory to become an MMA operand, and int4 -> bf16 is a
per-element shift / mask / convert.  Here the GEMM is computed transposed ("swap AB"),
``y^T (N, M) = W^T (N, K) @ x^T (K, M)``, so the *weights* are the WGMMA A operand, which
Hopper reads from registers:

  layout: codes stored K-tile-major, (Kp / block_k, Np, block_k), so the (block_n,
       block_k) tile of one K step is one contiguous 4 KB (int4) run in HBM, not block_n
       strided 64-byte pieces; 4-bit codes by default in the permuted K order of
       ``mgpu_convert.permute_k`` within each run of 32 (":pk" layouts, :func:`permutes`);
  TMA: per pipeline step, ``substeps`` W^T tiles, the x tile (block_m, substeps *
       block_k) and the scale (and zero) rows -> shared memory; each of the CTA's
       ``warpgroups`` streams its own contiguous K range through its own buffers, up to
       ``stages`` steps in flight (a pipeline written out, not plgpu.emit_pipeline);
  registers: the int tile is loaded in the WGMMA upcast layout, converted to the
       activation dtype (bf16 / fp16) by inline PTX per pair of codes (int4: the magic
       number with the zero point folded in; fp4: kernels/mgpu_convert.py's bit
       construction; ":pk" codes straight from the loaded 32-bit registers, no relayout;
       8-bit codes: Mosaic's conversion), ``(c - z) * s`` per row (one scale
       row per K tile when block_k == group size; groups of 16 / 32 have block_k / group
       scale rows per tile, broadcast side by side), i.e. the dequantized weight rounded
       once to the activation dtype (exact for fp4 x e8m0 / e4m3 scales);
  WGMMA: acc (block_n, block_m) f32 += W_deq (registers) @ x^T (shared memory);
  reduction: warpgroups 1.. add their accumulators through shared memory into
       warpgroup 0's;
  epilogue (warpgroup 0): x global scale, + bias (per acc row), cast, transposed store of the
       (block_m, 64) tile; with ``split_k`` > 1 each CTA stores float32 partials and XLA
       sums them.

fp8 activations (session 20): fp4 codes in the ":p8" layout (``prepare(mma="fp8")``,
``mgpu_convert.p8_store``) become e4m3 WGMMA A operands (e2m1 values times 2**-6, a
``prmt`` table lookup in place), x is float8_e4m3fn in SMEM, each scale group's fp8 WGMMAs go into
their own float32 partial which is then scaled, and the epilogue multiplies each row by its
activation scale times 2**6 (``run(..., x_scale=...)``).

Decode (M <= 64) has a single M tile, and N / 64 CTAs of 4 warpgroups (fewer when they
do not divide the K steps or fit shared memory; configs allow up to 8) stream the weights
once: one warpgroup's load -> convert -> WGMMA chain per K step is latency bound, four of
them per SM hide it (benchmarks/NOTES.md v5: 31.8 -> 18.6 us per 8192^2 layer; eight were
slower in session 13, v15).
From M = ``dequant_gemm_min_m`` (compute bound) the weights are dequantized by one XLA
fusion from this layout and XLA's GEMM runs (measured faster there; NOTES.md v4).
The XLA reference beside it is kernels/reference.py::dense_reference; the Pallas-Triton
kernel (wna16.py) runs every format this one does not, and by default the carried ones
not in CARRIED_BY_DEFAULT.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from humming_jax import packing
from humming_jax.formats import get_format
from humming_jax.quantize import (E8M0, QuantizedWeight, carrier_dtype, expand_scales,
                                  scale_block, store_scale, unpacked_codes)
from humming_jax.kernels import act_prepass, launch, mgpu_convert, mgpu_mma, registry, tuning
from humming_jax.spec import QuantSpec

FAMILY = "wna16_mgpu"
BLOCK_N = 64  # rows of W^T per warpgroup (the WGMMA M dimension)
_WGMMA = plgpu.Layout.WGMMA
_ROW = plgpu.Layout.WGMMA.reduce(1)
_COL = plgpu.Layout.WGMMA.reduce(0)
_TRANSPOSED = plgpu.Layout.WGMMA_TRANSPOSED
_UPCAST = {4: plgpu.Layout.WGMMA_UPCAST_4X, 8: plgpu.Layout.WGMMA_UPCAST_2X}
_CODE_DTYPE = {4: jnp.int4, 8: jnp.int8}
# The format each direct-layout code dtype carries (run_direct's weight spec; quantize_x:
# the activation format, its range from formats.py, its scale amax / max_value as
# quantize_activations computes it)
ACT_FORMATS = {jnp.dtype(jnp.int8): "int8", jnp.dtype(jnp.float8_e4m3fn): "fp8_e4m3"}


# A (rows, 256 k) x tile (k >= 1) in registers: warp w holds rows w, w + 4, ..., lane l the
# 8 contiguous values 8l .. 8l + 7 of each 256 columns (16-byte loads).  A row's reduction
# stays inside one warp, and the reduced (rows,) layout broadcasts back (quantize_x).
_X_ROWS = plgpu.Layout.TILED(plgpu.Tiling(((4, 256), (8,))), warp_dims=(-3,),
                             lane_dims=(-2,), vector_dim=-1)


Config = tuning.MgpuConfig  # frozen; lives with the other configs in tuning.py


FP4 = "fp4_e2m1"
FP8 = "fp8_e4m3"  # stored as jnp.float8_e4m3fn codes; converted in registers (cvt)
# fp6 codes are stored re-encoded as e4m3 (every fp6 e2m3 / e3m2 value is an e4m3 number:
# 2 or 3 exponent bits, at most 3 mantissa bits, |x| <= 28 < 448) and take FP8's route.
FP6 = ("fp6_e2m3", "fp6_e3m2")


def fp8_code_dtype(fmt):
  """The fp8 dtype this layout stores a 6- or 8-bit float format's codes in
  (``quantize.carrier_dtype``: e4m3 / e5m2 as themselves, fp6 as e4m3), converted in
  registers by Hopper's cvt to f16; None for integers and fp4 (``_CODE_DTYPE``)."""
  return carrier_dtype(fmt) if fmt.is_float and fmt.bits > 4 else None


def code_bits(spec: QuantSpec) -> int:
  """Bits per stored code of this layout: 4 for fp4 and for integers of 1-4 bits, 8 for
  integers of 5-8 bits and the fp6 / fp8 formats.  Integers narrower than their carrier
  are sign-extended (uint: minus 2**(b-1), as the 4- and 8-bit ones), so the carrier's
  conversion gives each code's exact value; :func:`carried` says which specs those are."""
  w = spec.weight_format
  if w.kind in ("int", "uint"):
    return 4 if w.bits <= 4 else 8
  return 4 if w.name == FP4 else 8


def carried(spec: QuantSpec) -> bool:
  """Whether the layout stores ``spec``'s codes in a wider carrier than the format
  (int1-3 / uint1-3 as 4-bit, int5-7 / uint5-7 as 8-bit, fp6 as e4m3 bytes).  The GPU
  then reads carrier bytes, not the format's packed bits: prepared params take
  ``code_bits / weight_bits`` times the canonical codes' memory (int3: 4/3, int2: 2x,
  fp6: 4/3) -- the price of running on this kernel's conversions (NOTES.md, session 54)."""
  return code_bits(spec) != spec.weight_bits


def block_k_for(spec: QuantSpec) -> int:
  """K per tile: the scale group from 64 up (one scale row per tile); 128 for smaller
  groups (several rows per tile) and per channel."""
  if spec.granularity == "group" and spec.group_size >= 64:
    return spec.group_size
  return 128


def scale_k(spec: QuantSpec) -> int:
  """K covered by one prepared scale row (per channel: the row repeats per tile)."""
  return spec.group_size if spec.granularity == "group" else block_k_for(spec)


def hopper_or_interpreter() -> bool:
  """WGMMA needs sm_90; on other GPUs the Pallas-Triton kernel runs these specs."""
  if jax.devices()[0].platform != "gpu":
    return True  # backend="interpret" (the GPU interpreter runs on the CPU)
  return tuning.is_hopper()


# The formats this layout takes since session 54 (unsupported_reason's ``carriers``: the
# carried integers and fp6, fp8 e5m2) are ``hj.quant_dense``'s default here when timed
# faster than the Pallas-Triton kernel on the GPU (issue 3: the lowering per kernel by
# measurement) and their carrier costs under twice the codes' memory.  H100 session 54
# (probe_carried.py, 8192^2, CUPTI us per layer at M = 1, Triton -> here): int3 g128 54.6 ->
# 16.5, uint3 g128 zp 55.4 -> 17.0, int5 59.4 -> 26.1, int6 50.2 -> 26.2, uint6 g32 zp
# 54.4 -> 29.0, int7 80.1 -> 26.1, MXFP6 e2m3 60.7 -> 27.0, fp6 e3m2 g128 68.4 -> 25.7,
# e5m2 per channel 32.3 -> 25.1 (M = 16 alike).  Each format was timed in one configuration;
# not timed, assumed alike: uint5 / uint7 (uint6's route), other group sizes / zero points /
# scale dtypes, M >= 128 (128-row tiles; XLA's dequantization from M = 512) and the dx
# kernel on these layouts.  fp8 e5m2 is not carried (its own 8 bits) but new here too.
# int2 31.9 -> 16.4 and uint1 43.5 -> 17.2 are faster here too, but their carrier holds
# 2x / 4x the codes' bytes (int4's memory): a 1- or 2-bit format chosen to save memory
# keeps its packed bits by default, and runs here when prepared by name,
# ``hj.prepare(q, kernel="wna16_mgpu")``; ``kernel="wna16"`` keeps any format's bits.
CARRIED_BY_DEFAULT: frozenset[str] = frozenset({
    "int3", "uint3", "int5", "uint5", "int6", "uint6", "int7", "uint7", "fp6_e2m3",
    "fp6_e3m2", "fp8_e5m2"})


_PRIORITY = 1  # over the Pallas-Triton kernel's 0


def _priority(spec: QuantSpec, shape) -> int | None:
  """The registry's rank of ``spec`` here: 1 (over the Pallas-Triton kernel's 0); None
  (never the default) for the formats of :func:`supports_carried` beyond :func:`supports`
  (the carried ones and fp8 e5m2, which is not carried) not in :data:`CARRIED_BY_DEFAULT`."""
  default = (unsupported_reason(spec) is None
             or spec.weight_format.name in CARRIED_BY_DEFAULT)
  return _PRIORITY if default else None


def supports(spec: QuantSpec) -> bool:
  """The 4- and 8-bit formats of this kernel (int4 / int8, uint4 / uint8 with zero point,
  fp4, fp8 e4m3: ``unsupported_reason(spec) is None``), on a Hopper GPU or in the
  interpreter: what the grouped (MoE) and W4A8 / W4A4 views of the layout build on.  The
  dense registry entry takes :func:`supports_carried` (these and the carried formats) and
  ranks these first (:func:`_priority`).  W8A16 moved here
  from the Triton kernel when measured (NOTES.md v9, 8192^2 int8 per channel, CUPTI: 19.8 / 20.6 us
  at M = 1 / 16 here vs 24-28 us for the Triton kernel), and fp8 e4m3 weights when
  measured (session 8, 8192^2 per channel, chain of 8: 26.5 / 28.1 us per layer at
  M = 1 / 16 here vs 33.0 on the Triton kernel)."""
  return unsupported_reason(spec) is None and hopper_or_interpreter()


def supports_carried(spec: QuantSpec) -> bool:
  """What the dense family runs (its registry entry): every spec of :func:`runs`, the
  carried formats and fp8 e5m2 too, on a Hopper GPU or in the interpreter; those are its
  default route only when in :data:`CARRIED_BY_DEFAULT` (:func:`_priority`)."""
  return runs(spec) and hopper_or_interpreter()


# Groups of 64 / 128 / 256: the int4 tile rows are 32 / 64 / 128 bytes (tested swizzles);
# 16 / 32: 128-deep tiles with 8 / 4 scale rows each.
GROUP_SIZES = (16, 32, 64, 128, 256)
SCALE_DTYPES = ("bfloat16", "float16", "float32", "e8m0", "fp8_e4m3")


def unsupported_reason(spec: QuantSpec, *, carriers: bool = False) -> str | None:
  """Why this kernel cannot compute ``spec`` (None: it can).  ``carriers``: also the
  formats the dense layout stores in a wider carrier or converts as fp8 (:func:`carried`:
  int1-8 / uint1-8, fp6, fp8 e5m2); the grouped and W4A8 / W4A4 views of the layout
  take the 4- and 8-bit formats only."""
  w = spec.weight_format
  if spec.act is not None:
    return f"act={spec.act!r}: weight-only kernel, expected act=None"
  if carriers and not (w.is_integer or w.is_float):  # (formats.py: every int, fp4 / 6 / 8)
    return (f"weight={spec.weight!r}: expected int1-int8, uint1-uint8, fp4_e2m1, fp6_e2m3, "
            f"fp6_e3m2, fp8_e4m3 or fp8_e5m2")
  if not carriers and not ((w.kind in ("int", "uint") and w.bits in (4, 8))
                           or w.name in (FP4, FP8)):
    return f"weight={spec.weight!r}: expected int4, uint4, int8, uint8, fp4_e2m1 or fp8_e4m3"
  if spec.scale_dtype not in SCALE_DTYPES:
    return f"scale_dtype={spec.scale_dtype!r}: expected one of {SCALE_DTYPES}"
  if spec.granularity == "group" and spec.group_size not in GROUP_SIZES:
    return f"group_size={spec.group_size}: expected one of {GROUP_SIZES}"
  if spec.granularity not in ("group", "channel"):
    return f"granularity={spec.granularity!r}: expected 'group' or 'channel'"
  return None


def runs(spec: QuantSpec) -> bool:
  """Whether this kernel computes ``spec`` (any GPU check aside): int1-8 (signed) or
  uint1-8 with zero point (1-3 / 5-7 bits in a 4- / 8-bit carrier: :func:`carried`), fp4
  e2m1, fp6 (as e4m3), fp8 e4m3 / e5m2; group 16 ... 256 or per channel; 16-bit, fp32,
  e8m0 or e4m3 (with a global scale) scales; weight-only."""
  return unsupported_reason(spec, carriers=True) is None


# ----------------------------------------------------------------------------------------
# Transform: canonical -> kernel layout (once)
# ----------------------------------------------------------------------------------------
def permutes(spec: QuantSpec) -> bool:
  """Whether :func:`prepare` stores ``spec``'s codes in the permuted K order
  (``mgpu_convert.permute_k``, layout suffix ":pk"): 4-bit codes that the kernel converts
  with inline PTX straight from the loaded registers -- fp4, and int4 with one zero row per
  K tile or none (smaller groups with zero points take Mosaic's conversion) -- unless
  HUMMING_JAX_PERMUTE_K=0 (every spec: the K order, e.g. for a jax whose Mosaic GPU lays
  the int4 registers out otherwise) or HUMMING_JAX_INT4_PTX=0 (int4) turns it off."""
  if (code_bits(spec) != 4 or not runs(spec)
      or not tuning.env_flag("HUMMING_JAX_PERMUTE_K", True)):
    return False
  return (spec.weight_format.name == FP4 or Config().int4_ptx) and _converts_in_place(spec)


def _converts_in_place(spec: QuantSpec) -> bool:
  """Whether the GPU kernel has an in-place conversion for permuted 4-bit codes of
  ``spec``: fp4, and int4 unless several zero-point rows fall in one K tile (groups under
  64 with zero points take Mosaic's conversion, which needs the K order)."""
  return (spec.weight_format.name == FP4 or block_k_for(spec) == scale_k(spec)
          or not spec.zero_point)


def k_permuted(layout: str) -> bool:
  """Whether a layout string of this family (or its grouped / W4A8 views) has the permuted
  K order of :func:`permutes`."""
  return "pk" in layout.split(":")[1:]


def fp8_mma(layout: str) -> bool:
  """Whether a layout string of this family (or its grouped / W4A8 views) is the fp8-MMA
  layout (":p8", ``prepare(mma="fp8")``): e2m1 codes in ``mgpu_convert.p8_store``'s
  order, for float8_e4m3fn activations on fp8 WGMMA."""
  return "p8" in layout.split(":")[1:]


def code_order(layout: str) -> str:
  """How a layout string of this family (or its grouped / W4A8 views) stores each tile
  row's codes: "pk" (:func:`k_permuted`: ``mgpu_convert.permute_k``), "p8"
  (:func:`fp8_mma`: ``mgpu_convert.p8_store``) or "k" (K order).  The Pallas readers of
  the layout (carrier_unpack's ``order``, wna16_mgpu_dx) take it from here."""
  return "pk" if k_permuted(layout) else "p8" if fp8_mma(layout) else "k"


def column_folds(layout: str) -> bool:
  """Whether a layout string of this family (or its grouped / W4A8 views) carries the
  ":cf" check of :func:`mark_column_fold`: every column's e8m0 group scales lie within
  ``mgpu_convert.FOLD_MAX_SHIFT`` binades of its largest, so ``Config.fp8_single_acc``
  computes it exactly (up to the fp8 MMA's accumulation)."""
  return "cf" in layout.split(":")[1:]


def real_scale_rows(scales: jax.Array, k: int, spec: QuantSpec) -> jax.Array:
  """Prepared scale rows ((..., rows, Np)) of the real groups of K only, as float32: the
  K-padding rows past them hold 1.0, which no fold base may count."""
  return scales[..., :-(-k // scale_k(spec)), :].astype(jnp.float32)


def column_fold_base(scales: jax.Array, k: int, spec: QuantSpec):
  """``(top, folds)`` of prepared scale rows ((..., rows, Np), the real groups of K
  only: the padding rows past K hold 1.0): each column's largest group scale and whether
  its scales span at most ``mgpu_convert.FOLD_MAX_SHIFT`` binades, both (..., 1, Np)."""
  real = real_scale_rows(scales, k, spec)
  e = mgpu_convert.scale_exponent(real)
  folds = (jnp.max(e, axis=-2, keepdims=True) - jnp.min(e, axis=-2, keepdims=True)
           <= mgpu_convert.FOLD_MAX_SHIFT)
  return jnp.max(real, axis=-2, keepdims=True), folds


def column_fold_row(top: jax.Array, folds: jax.Array) -> jax.Array:
  """(..., 1, Np) float32 from :func:`column_fold_base`'s ``(top, folds)``: each column's
  largest real group scale, NaN where the column's scales span more than the fold's
  range -- the one-accumulator route's last epilogue row.  Computed from the scales in
  hand (per call where params carry no stored ``fold_base``), a column that cannot fold
  (a ":cf" mark gone stale) comes out NaN, never silently short of the zeroed groups.  A
  stored base is trusted: ``QuantizedWeight.replace(scales=...)`` drops it, but scales
  swapped into a prepared tree by other means (tree_map over the leaves) keep a stale
  one."""
  return jnp.where(folds, top, jnp.nan)


def mark_column_fold(prepared: QuantizedWeight) -> QuantizedWeight:
  """``prepared`` (the fp8-MMA layout, e8m0 scales, dense or stacked) with ":cf" added to
  its layout where its scales allow ``Config.fp8_single_acc``: in every column the groups'
  scales span at most ``mgpu_convert.FOLD_MAX_SHIFT`` binades (a NaN scale among finite
  ones fails; where it passes, the column's maximum is NaN and so is its output), so
  folding each group against the column's largest is exact.  A value check, so it needs
  concrete scales: traced ones (``prepare`` under ``jax.jit``) are returned unmarked and
  run the per-group route.  Padding rows and columns are left out of the check.

  The marked params also carry the fold's base (:func:`column_fold_row` over every
  prepared column) as ``fold_base``: :func:`run` computed it from the scale rows on every
  call, XLA reductions over all of them (H200 session 28, the Mixtral W4A8 layer at 1024
  tokens: four fusions, 76.5 us; the layer 1107.3 -> 1038.5 us without them).
  ``fold_base`` is derived from ``scales``; replacing one without the other gives wrong
  columns (as codes without their scales would).  Params marked ":cf" without it
  (checkpoints before version 3) have it computed per call."""
  if (not fp8_mma(prepared.layout) or column_folds(prepared.layout)
      or prepared.spec.scale_dtype != "e8m0" or isinstance(prepared.scales, jax.core.Tracer)):
    return prepared
  k, n = prepared.shape[-2:]
  top, folds = column_fold_base(prepared.scales, k, prepared.spec)  # (per column)
  if not bool(jnp.all(folds[..., :n])):  # (a NaN scale's exponent field: 255 or 511)
    return prepared
  return prepared.replace(layout=prepared.layout + ":cf",
                          fold_base=column_fold_row(top, folds))


def single_acc_layout(params: QuantizedWeight) -> bool:
  """Whether ``params``' layout can run ``Config.fp8_single_acc`` (one accumulator, the
  group scales folded against each column's largest): the fp8-MMA layout, e8m0 scales,
  checked by :func:`mark_column_fold` (":cf").  :func:`run` refuses the config elsewhere;
  ``grouped_wna16_mgpu.single_acc_tiles`` picks the route by it."""
  return (fp8_mma(params.layout) and params.spec.scale_dtype == "e8m0"
          and column_folds(params.layout))


def scale_folds(layout: str) -> bool:
  """Whether a layout string of this family (or its grouped view) carries
  :func:`scale_fold_base`'s per-column base (":sf"): fp4 codes whose group scales the
  bf16 conversion folds into its ``fma`` (``mgpu_convert.to_float_ptx``'s ``factors``)."""
  return "sf" in layout.split(":")[1:]


# Binades below a column's base (:func:`scale_fold_base`) that a group scale may lie: an
# e2m1 code (smallest magnitude 0.5) times scale / base stays at or above bf16's smallest
# subnormal, 2**-133, so every folded weight is exact.
SCALE_FOLD_MAX_SPAN = 132


def scale_fold_base(scales: jax.Array, k: int, spec: QuantSpec) -> jax.Array:
  """(..., 1, Np) float32 from prepared scale rows ((..., rows, Np); only the real groups
  of K count): per column the least power of two D >= its largest |group scale| (and >=
  2**-1), NaN where a nonzero scale lies more than :data:`SCALE_FOLD_MAX_SPAN` binades
  below D or a scale is not finite (that column's output comes out NaN, never silently
  wrong).

  Why: the fp4 conversion multiplies each bit-built pair by 2**126 (bf16) and then by its
  group scale: 1.0 HMUL2 per weight of MXFP4's 5.1 instructions (NOTES.md v21), in a
  kernel close to issue-bound.  With ``scale * (2**126 / D)`` (at most 2**126: no
  overflow; D a power of two: exact) as the ``fma``'s factor, one multiply does both, and
  the epilogue multiplies each column by D."""
  # On the float32 bits (exponent fields, as mgpu_convert.scale_exponent): no float op
  # that a CPU's flush-to-zero could bend on the subnormals here (2**-127, 2**-132 ...).
  real = real_scale_rows(scales, k, spec)
  bits = lax.bitcast_convert_type(real, jnp.int32) & 0x7FFFFFFF  # |scale|: as ints, ordered
  top = jnp.max(bits, axis=-2, keepdims=True)
  # log2 D: the top's exponent, + 1 unless it is a power of two; at least -1, so the
  # kernel's 2**126 / D is a finite bf16
  log2_d = jnp.maximum((top >> 23) - 127 + ((top & 0x7FFFFF) != 0), -1)
  low = jnp.min(jnp.where(bits != 0, bits >> 23, 255), axis=-2, keepdims=True)
  ok = (top < 0x7F800000) & (log2_d <= 127) & (low - 127 >= log2_d - SCALE_FOLD_MAX_SPAN)
  base = lax.bitcast_convert_type((jnp.minimum(log2_d, 127) + 127) << 23, jnp.float32)
  return jnp.where(ok, base, jnp.nan)


def settle_scale_fold(prepared: QuantizedWeight) -> QuantizedWeight:
  """``prepared`` (dense or stacked) without its ":sf" fold where its concrete scales show
  a column the fold cannot hold exactly (finite scales more than
  :data:`SCALE_FOLD_MAX_SPAN` binades apart): those weights keep the two-multiply
  conversion.  Traced scales (``prepare`` under ``jax.jit`` or ``vmap``) keep the fold; a
  column that cannot fold then comes out NaN (:func:`scale_fold_base`)."""
  if not scale_folds(prepared.layout) or isinstance(prepared.fold_base, jax.core.Tracer):
    return prepared
  real = real_scale_rows(prepared.scales, prepared.shape[-2], prepared.spec)
  finite = jnp.all(jnp.isfinite(real), axis=-2, keepdims=True)
  if not bool(jnp.any(jnp.isnan(prepared.fold_base) & finite)):
    return prepared
  return prepared.replace(layout=prepared.layout.replace(":sf", ""), fold_base=None)


def _folds_scales(spec: QuantSpec, mma: str, permute: bool) -> bool:
  """Whether :func:`prepare` gives ``spec``'s weights the ":sf" layout: fp4 codes with e8m0
  (MXFP4) or e4m3 (NVFP4) group scales, 16-bit MMA, the permuted K order (the PTX that
  takes the factors reads it), unless HUMMING_JAX_SCALE_FOLD=0.

  Both scale types are exact in bf16 and so is each folded weight, so the folded kernel
  gives the unfolded one's output bit for bit when the epilogue multiplies by the base
  first (:func:`run`).  Session 31 (H200) had the base after NVFP4's global scale: MXFP4
  (no global scale) was bit-equal, NVFP4 one bf16 ulp off in ~3e-5 of the outputs."""
  return (spec.weight_format.name == FP4 and spec.scale_dtype in ("e8m0", "fp8_e4m3")
          and not column_scaled(spec) and mma == "bf16" and permute
          and tuning.env_flag("HUMMING_JAX_SCALE_FOLD", True))


def fp8_mma_reason(spec: QuantSpec) -> str | None:
  """Why ``spec``'s weights have no fp8-MMA layout (None: they have): fp4 e2m1 codes
  (exact in e4m3 times 2**-6) whose scale groups cover whole 32-deep WGMMA K steps (each
  group's float32 partial product is scaled apart: groups of 32 and up)."""
  if (why := unsupported_reason(spec)) is not None:
    return why
  if spec.weight_format.name != FP4:
    return f"weight={spec.weight!r}: the fp8-MMA layout holds fp4_e2m1 codes"
  if spec.granularity != "group" or spec.group_size % 32:
    return (f"granularity={spec.granularity!r}, group_size={spec.group_size}: the fp8-MMA "
            f"layout needs groups of a multiple of 32 (one fp8 WGMMA K step)")
  return None


def prepare(params: QuantizedWeight, *, permute: bool | None = None,
            mma: str = "bf16") -> QuantizedWeight:
  """Canonical params -> (Kp / block_k, Np, block_k) signed codes (uint codes minus
  2**(b-1); fp4: the e2m1 bit pattern as a two's-complement nibble) in jnp.int4 / int8
  (:func:`code_bits`: 1-4-bit integers and fp4 as int4, 5-8-bit as int8), fp8 codes as
  jnp.float8_e4m3fn / float8_e5m2 (fp6 as the e4m3 bytes of its values), scales (their
  own dtype; e8m0 and e4m3 as bf16, exact) and zero points (minus the same offset, bf16:
  small integers, exact) as (Kp / group, Np) rows, the global scale as a float32 (1, Np)
  row for the epilogue.  Lossless (:func:`to_canonical`).

  ``permute`` (default :func:`permutes`): 4-bit codes in the permuted K order within each
  run of 32 (``mgpu_convert.permute_k``), which the GPU kernel converts without a register
  relayout; every XLA reader of the layout (:func:`code_values`, :func:`to_canonical`)
  undoes it.

  ``mma="fp8"``: the layout of float8_e4m3fn activations (layout suffix ":p8",
  :func:`fp8_mma_reason` says which specs): the codes in ``mgpu_convert.p8_store``'s order,
  which the kernel turns into e4m3 WGMMA operands in place; scales and the rest as above.

  fp4 codes with e8m0 / e4m3 group scales in the permuted order also carry :func:`scale_fold_base`'s
  per-column base as ``fold_base`` (layout suffix ":sf", :func:`_folds_scales`): the bf16
  kernel folds each group scale into the conversion's multiply.  Scales stay as above."""
  spec = params.spec
  if (why := unsupported_reason(spec, carriers=True)) is not None:
    raise ValueError(f"spec {spec.name}: not supported by the {FAMILY} kernel ({why})")
  if params.num_experts is not None:
    raise ValueError("stacked experts: use the grouped (MoE) kernels")
  k, n = params.shape
  bits = code_bits(spec)  # the carrier's (carried) or the format's
  bk = block_k_for(spec)
  kp, np_ = -(-k // bk) * bk, -(-n // BLOCK_N) * BLOCK_N
  codes = unpacked_codes(params).astype(jnp.int32)  # raw b-bit patterns
  fmt = spec.weight_format
  if fmt.name in FP6:  # the e4m3 byte of each value (exact), -0 kept
    codes = _fp6_as_e4m3(codes, fmt)
  pattern_bits = 8 if fmt.name in FP6 else fmt.bits  # of the patterns in `codes` now
  offset = (1 << (pattern_bits - 1)) if fmt.kind == "uint" else 0
  half = 1 << (pattern_bits - 1)
  # Signed value in [-2**(b-1), 2**(b-1)): uint minus the offset, or the int's sign
  # extension -- explicit, not left to a narrowing cast's wrap-around.
  codes = codes - offset if offset else ((codes + half) & ((1 << pattern_bits) - 1)) - half
  codes = jnp.pad(codes.T, ((0, np_ - n), (0, kp - k)))
  codes = codes.reshape(np_, kp // bk, bk).transpose(1, 0, 2)
  s = params.scales
  if spec.scale_dtype == "e8m0":
    s = E8M0.decode(s).astype(jnp.bfloat16)  # 2**-127 .. 2**127: all exact in bf16
  elif spec.scale_dtype == "fp8_e4m3":
    s = s.astype(jnp.bfloat16)
  rows = kp // scale_k(spec)
  if column_scaled(spec):  # a float32 (1, Np) row for the epilogue: exact, no per-call cast
    s = jnp.pad(s.reshape(1, n).astype(jnp.float32), ((0, 0), (0, np_ - n)),
                constant_values=1)
  else:
    s = jnp.pad(s, ((0, rows - s.shape[0]), (0, np_ - n)), constant_values=1)
  zeros = None
  if params.zeros is not None:
    z = params.zeros.astype(jnp.float32) - offset
    if spec.granularity == "channel":
      z = jnp.broadcast_to(z.reshape(1, n), (rows, n))
    zeros = jnp.pad(z, ((0, rows - z.shape[0]), (0, np_ - n))).astype(jnp.bfloat16)
  g = params.global_scale
  if g is not None:
    g = jnp.broadcast_to(g.astype(jnp.float32).reshape(1, 1), (1, np_))
  if mma not in ("bf16", "fp8"):
    raise ValueError(f"mma={mma!r}: expected 'bf16' (16-bit activations) or 'fp8'")
  if mma == "fp8" and (why := fp8_mma_reason(spec)) is not None:
    raise ValueError(f"mma='fp8': spec {spec.name} has no fp8-MMA layout ({why})")
  if mma == "fp8" and permute:
    raise ValueError("mma='fp8' has its own K order (mgpu_convert.p8_store); leave permute "
                     "unset")
  permute = (permutes(spec) if permute is None else permute) and mma == "bf16"
  if permute and (bits != 4 or not _converts_in_place(spec)):
    raise ValueError(f"permute=True: spec {spec.name} has no permuted layout (only 4-bit "
                     f"codes, and int4 with zero points needs groups of 64 or more)")
  if permute:
    codes = mgpu_convert.permute_k(codes)
  if mma == "fp8":
    codes = mgpu_convert.p8_store(codes)
  codes = codes.astype(_CODE_DTYPE[bits])
  if fp8_code_dtype(fmt) is not None:  # the same byte, typed for the in-register cvt
    codes = jax.lax.bitcast_convert_type(codes, fp8_code_dtype(fmt))
  fold = _folds_scales(spec, mma, permute)
  layout = (f"{FAMILY}:b{bits}:bk{bk}" + (":cs" if column_scaled(spec) else "")
            + (":pk" if permute else "") + (":p8" if mma == "fp8" else "")
            + (":sf" if fold else ""))
  return settle_scale_fold(params.replace(
      codes=codes, scales=s, zeros=zeros, global_scale=g, layout=layout,
      fold_base=scale_fold_base(s, k, spec) if fold else None))


def column_scaled(spec: QuantSpec) -> bool:
  """Per-channel scales are one float32 (1, Np) row multiplied in the epilogue, on the
  float32 sum (not a scale row per K tile): no per-tile multiply, no scale loads in the K
  loop, no per-call cast of float32 scales to the activation dtype (2.2 us per 8192^2
  fp8 layer, NOTES.md v10), and the kernel never rounds the scale to bf16 (the large-M
  route with bf16 activations folds it into the bf16 weights: :func:`dequant_gemm`)."""
  return spec.granularity == "channel"


def _fp6_as_e4m3(codes: jax.Array, fmt) -> jax.Array:
  """fp6 bit patterns -> the e4m3 bytes (:func:`fp8_code_dtype`) of the same values
  (int32): exact, as every fp6 value is an e4m3 number; -0 (0x20) becomes e4m3's -0 (0x80)."""
  vals = fmt.decode(codes, check_nan=False).astype(fp8_code_dtype(fmt))
  return jax.lax.bitcast_convert_type(vals, jnp.uint8).astype(jnp.int32)


def _e4m3_as_fp6(codes: jax.Array, fmt) -> jax.Array:
  """Inverse of :func:`_fp6_as_e4m3` (int8 e4m3 bytes -> int32 fp6 patterns), the sign
  of -0 kept (``encode`` gives +0 for it)."""
  vals = jax.lax.bitcast_convert_type(codes.astype(jnp.int8),
                                      fp8_code_dtype(fmt)).astype(jnp.float32)
  sign = jnp.signbit(vals).astype(jnp.int32) << (fmt.bits - 1)
  return fmt.encode(vals).astype(jnp.int32) | sign


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare` (bit-exact)."""
  spec = prepared.spec
  k, n = prepared.shape
  bits = spec.weight_bits
  fmt = spec.weight_format
  offset = (1 << (bits - 1)) if fmt.kind == "uint" else 0
  t, np_, bk = prepared.codes.shape
  codes = logical_codes(prepared)
  if jnp.issubdtype(codes.dtype, jnp.floating):  # fp8 codes: their bytes
    codes = jax.lax.bitcast_convert_type(codes, jnp.int8)
  codes = codes.transpose(1, 0, 2).reshape(np_, t * bk)
  codes = codes[:n, :k].astype(jnp.int32).T
  if fmt.name in FP6:
    codes = _e4m3_as_fp6(codes, fmt)
  codes = ((codes + offset) & ((1 << bits) - 1)).astype(jnp.uint8)
  gk, _ = scale_block(spec, k, n)
  s = prepared.scales[:k // gk if spec.granularity == "group" else 1, :n]
  s = store_scale(s.astype(jnp.float32), spec.scale_dtype)  # exact: values came from it
  g = prepared.global_scale
  if g is not None:
    g = g[0, 0]
  z = None
  if prepared.zeros is not None:
    z = (prepared.zeros[:s.shape[0], :s.shape[1]].astype(jnp.int32) + offset).astype(jnp.uint8)
  return prepared.replace(codes=packing.pack_codes(codes, bits), scales=s, zeros=z,
                          global_scale=g, fold_base=None, layout="canonical")


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------
def _swizzled(cols: int, bits: int, what: str):
  swizzle = plgpu.find_swizzle(cols * bits, what)
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


class Tiles(NamedTuple):
  """Grouped (MoE) launch: row tiles of one expert each (grouped_wna16_mgpu.tile_schedule,
  or one tile per routed pair: grouped_wna16_mgpu.pair_schedule).

  ``sched``: (T * 4,) int32, T >= num_tiles (entries past num_tiles are not read):
  (expert, first x row, -, kind) per tile; tile ``i``
  computes x rows [first, first + block_m) -- ``first`` a multiple of 8 (Mosaic's TMA
  into the swizzled x buffer needs that proven), rows past M read as zeros -- against its
  expert's weights and writes output rows [i * block_m, (i + 1) * block_m); the caller
  picks each row from its tile.  kind 0 tiles do nothing."""
  sched: jax.Array
  num_tiles: int
  block_m: int


def default_config(params: QuantizedWeight, m: int) -> Config:
  """The launch :func:`run` takes for M rows without an explicit config: the autotune
  cache's entry for (layout kind, M bucket, N, K, device), else :func:`heuristic` (NVFP4
  with one K tile per step: :func:`one_k_tile_per_step`).  The direct (W8A8) and fp8-MMA
  views tune apart (same spec, other layout)."""
  k, n = params.shape[-2:]
  name = (params.spec.name + (":direct" if params.codes.ndim == 2 else "")
          + (":p8" if fp8_mma(params.layout) else ""))
  key = tuning.cache_key(FAMILY, name, tuning.bucket_m(m), n, k, tuning.device_kind())
  cached = tuning.cached_config(key, Config)
  if cached:
    return cached
  config = heuristic(m, n)
  if m <= MMA_SYNC_MAX_M and mma_sync_applies(params) and mma_sync_device():
    return dataclasses.replace(config, block_m=8, substeps=1, mma_sync=True)
  if config.substeps > 1 and one_k_tile_per_step(params):
    config = dataclasses.replace(config, substeps=1)
  return config


# Decode launches of up to this many rows take mma.sync (mgpu_mma) on 8-row tiles with one K
# tile per step, for the weights of :func:`mma_sync_applies`, on the devices of
# :data:`MMA_SYNC_DEVICES`.  H100 session 56 (profile_mgpu.py, CUPTI us per 8192^2 layer,
# same process; four processes for int4): int4 g128 zp M = 1, the heuristic's WGMMA
# launch (two K tiles per step; run() caps its rows at 8) 16.4-16.5 -> 15.5-15.6; MXFP4
# 19.0 -> 18.2-18.4.  About half of each gain is the one tile per step (WGMMA with it:
# int4 16.0 twice, MXFP4 18.7).  Not taken: NVFP4 (its one-tile rule 19.5, one tile on
# mma.sync 19.4), M = 16 on 16-row tiles (16.4 -> 17.4-18.0).  HUMMING_JAX_MMA_SYNC=0
# keeps the heuristic's launch; an autotune cache entry wins over this rule.
MMA_SYNC_MAX_M = 8
# The H200 (session 57, same method, three processes) keeps the heuristic's launch: there
# the one tile per step loses and the instruction is neutral.  int4 g128 zp 8192^2: the
# heuristic's 14.6-14.7, mma.sync on it 14.7, WGMMA one tile 15.6, the H100 rule 15.0-15.2;
# MXFP4 17.2-17.3 / 17.1 / 18.4 / 18.1-18.4; narrow shapes with grid split-K 2, heuristic /
# mma.sync / the H100 rule: 4096^2 5.8 / 5.7 / 5.5, 14336 -> 4096 13.0 / 13.1 / 13.4.
MMA_SYNC_DEVICES = ("H100",)


def mma_sync_device() -> bool:
  """Whether the device kernels are built for is one the dense decode rule was timed to
  win on (:data:`MMA_SYNC_DEVICES`, a substring of ``tuning.device_kind()``)."""
  kind = tuning.device_kind()
  return any(name in kind for name in MMA_SYNC_DEVICES)


def mma_sync_applies(params: QuantizedWeight) -> bool:
  """4-bit integer (int4 / uint4) or MXFP4 (e8m0 group scales) weights in the 16-bit
  route's layouts -- not the direct 8-bit or fp8-MMA ones -- unless HUMMING_JAX_MMA_SYNC=0:
  the weights :func:`default_config` puts on mma.sync at decode on an H100 (timed: int4
  g128 with and without zero points, MXINT4 and MXFP4 at 8192^2, M = 1; uint4, other group
  sizes, shapes and M = 2-8 follow untimed), and grouped_wna16_mgpu.heuristic on 8-row
  expert tiles (session 57, H200: int4 g128 zp timed)."""
  spec = params.spec
  fmt = spec.weight_format
  return (params.codes.ndim != 2 and not fp8_mma(params.layout)
          and ((fmt.kind in ("int", "uint") and fmt.bits == 4)
               or (fmt.name == FP4 and spec.scale_dtype == "e8m0"))
          and tuning.env_flag("HUMMING_JAX_MMA_SYNC", True))


def one_k_tile_per_step(params: QuantizedWeight) -> bool:
  """NVFP4 weights (fp4 with e4m3 scales in groups of 16) on the 16-bit MMA: one K tile
  per pipeline step at decode too (:func:`heuristic` unrolls two at M <= 16), for compile
  time.  With one tile per step there is no next tile to overlap a WGMMA with, so
  ``overlap_mma`` has no effect (``run`` computes ``overlap`` only for ``sub > 1``).

  Issue 3 asks <= 2 s to compile a new (spec, shape); NVFP4 at M <= 16 took 2.32-2.34 s on
  the H200 (session 48), the most of any format: its eight scale groups per K tile double
  MXFP4's scale work per unrolled tile.  H100 session 50 (``probe_compile.py``,
  ``profile_mgpu.py``; 8192^2; trace + lower + XLA compile s / CUPTI us): two tiles -> one,
  M = 1 1.51 -> 1.06 s, kernel 19.0-19.1 -> 19.3-19.4; M = 16 1.66 -> 1.32 s, kernel
  19.2 -> 19.8 (+3 %).  The other formats keep two (MXFP4 M = 16 18.7-18.9 against 19.2
  with one; int4 g128 zp 16.4 / 16.6).  W4A4 NVFP4's decode runs this kernel on its
  fake-quantized activations (``wnam_mgpu.run``) and takes the rule with it."""
  spec = params.spec  # (16-deep groups have no fp8-MMA layout: fp8_mma_reason)
  return (spec.weight_format.name == FP4 and spec.scale_dtype == "fp8_e4m3"
          and spec.granularity == "group" and spec.group_size == 16)


def output_dtype(x: jax.Array, out_dtype=None):
  """The output dtype of :func:`run` for ``x``: x's own, or for 8-bit x (float8_e4m3fn on
  the fp8-MMA layout; int8 / e4m3 codes on the direct layout) ``out_dtype`` (default
  bfloat16)."""
  eight_bit = x.dtype in (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.int8))
  return jnp.dtype(out_dtype or jnp.bfloat16) if eight_bit else x.dtype


def run(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
        config: Config | None = None, tiles: Tiles | None = None,
        x_scale: jax.Array | None = None, out_dtype=None,
        quantize_x: bool = False, fake_quantize_x: str | None = None) -> jax.Array:
  """(M, K) bf16/fp16 activations x prepared params -> (M, N) in x.dtype.

  The weights are dequantized in the activation dtype: with fp16 activations, weights
  (scale x code) below fp16's normal range (6e-5) lose precision, as in any fp16 GEMM,
  and so do scales (cast to fp16: an e8m0 scale below 2**-24 becomes 0, one above 65504
  inf -- use bf16 activations for such weights).

  M >= ``config.dequant_gemm_min_m`` (compute bound) and float32 activations (the WGMMA
  kernel takes 16-bit operands and would round x and y to bf16) run
  :func:`dequant_gemm` instead: the weights dequantized by one XLA fusion from this
  layout, then XLA's GEMM in the activation dtype.

  ``tiles`` (grouped_wna16_mgpu): stacked-expert params, one expert per row tile; returns
  the (num_tiles * block_m, N) tile rows (the caller gathers).

  float8_e4m3fn ``x`` (the fp8-MMA layout, ``prepare(mma="fp8")``, M below
  ``dequant_gemm_min_m`` when dense): activation codes with their per-row float32
  ``x_scale`` ((M,) or (M, 1)); the e2m1 codes become e4m3 WGMMA operands in registers,
  each scale group's float32 partial product is scaled on its own (Hopper's fp8 MMA sums
  one group at most, 32-128 K deep, in its reduced-precision accumulator), and the
  epilogue multiplies each row by its x_scale; output in ``out_dtype`` (bf16 / fp16,
  default bf16).  The direct 8-bit layout (:func:`run_direct`) takes an optional
  ``x_scale`` too: x rows (activation codes) each multiplied by its float32 scale in the
  same epilogue, before the column scale and the bias; x there is 16-bit (the codes'
  values, converted weights in registers) or 8-bit codes of the weights' dtype (an 8-bit
  WGMMA on both operands in shared memory, output ``out_dtype``).

  ``quantize_x`` (the direct int8 / e4m3 layout, 16-bit x, one CTA's warpgroups
  splitting K): x quantized per token to the codes' dtype inside the kernel, as
  ``quantize_activations`` does for a dynamic per-token int8 / fp8 e4m3 spec (scale
  amax / 127 or / 448 in float32, 1 for an all-zero row, NaN for a row holding NaN /
  inf; codes x / scale saturated and rounded to nearest even), then the 8-bit WGMMA of
  the codes: W8A8 at decode without a pre-pass launch.  Each CTA first reads the whole
  rows for their amax (its warpgroups a share each; one token: one TMA each, in flight
  beside the first stages; more rows: streamed through the x slots), then converts each
  x tile as it arrives (one token with :data:`RESIDENT_X`: its share of the row once,
  each step's 256 columns copied into the code tile).

  ``fake_quantize_x`` ("int8" or "fp8_e4m3"; the 16-bit route's layouts, bfloat16 / float16
  x, dense launches whose warpgroups split K): each x row quantized per token to that
  format and dequantized inside the kernel -- the same scale and codes as ``quantize_x``,
  then code x scale in float32 rounded once to x's dtype, written over the x tile in
  shared memory before its product: the values of the reference's
  ``fake_quantize_activations`` rounded to x's dtype (what W4A8 specs multiply on this
  route, ``wnam_mgpu``; its Pallas pre-pass divides by the scale and may land a code step
  apart in rare ties) without a pre-pass launch.  No row scale in the epilogue (the
  values carry it)."""
  spec = params.spec
  grouped = tiles is not None
  if not grouped and registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params; call "
                     f"wna16_mgpu.prepare (or hj.prepare) first")
  k, n = params.shape[-2:]
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (M, K={k}); got shape {x.shape}")
  direct = params.codes.ndim == 2  # (Np, Kp) 8-bit codes: W8A8's layout (run_direct)
  if direct:
    np_, kp = params.codes.shape
    bk = DIRECT_BLOCK_K
    k_tiles = kp // bk
  else:
    k_tiles, np_, bk = params.codes.shape[-3:]
    kp = k_tiles * bk
  bits = code_bits(spec)  # (carried formats: the carrier's)
  m = x.shape[0]
  if m == 0:
    return jnp.zeros((0, n), output_dtype(x, out_dtype))
  # 8-bit x codes of the direct layout's own dtype: both WGMMA operands straight from
  # shared memory, no conversion in the K loop (run_direct)
  if quantize_x and not (direct and params.codes.dtype in ACT_FORMATS and x_scale is None
                         and x.dtype in (jnp.bfloat16, jnp.float16)):
    raise ValueError(f"quantize_x=True: needs the direct int8 / e4m3 layout (codes "
                     f"{params.codes.dtype}, {params.codes.ndim}-D), bfloat16 / float16 x "
                     f"(got {x.dtype}) and no x_scale (the kernel computes it)")
  fake_x = fake_quantize_x is not None
  if fake_x:
    what = f"fake_quantize_x={fake_quantize_x!r}"
    if fake_quantize_x not in ACT_FORMATS.values():
      raise ValueError(f"{what}: expected one of {sorted(ACT_FORMATS.values())}")
    if quantize_x or x_scale is not None:
      raise ValueError(f"{what}: the kernel computes the row scales; expected quantize_x="
                       f"False and no x_scale")
    if direct or grouped or fp8_mma(params.layout):
      raise ValueError(f"{what}: expected dense params of the 16-bit route; got layout "
                       f"{params.layout!r}{' (grouped tiles)' if grouped else ''}")
    if x.dtype not in (jnp.bfloat16, jnp.float16):
      raise ValueError(f"{what}: expected bfloat16 / float16 x; got {x.dtype}")
  in_kernel_x = quantize_x or fake_x  # the amax pass and the conversion of x
  act_fmt = (get_format(fake_quantize_x) if fake_x
             else get_format(ACT_FORMATS[jnp.dtype(params.codes.dtype)]) if quantize_x
             else None)
  mma8 = direct and (x.dtype == params.codes.dtype or quantize_x)
  mma8_int = mma8 and params.codes.dtype == jnp.int8  # (e4m3: per-tile float32 promotion)
  if direct and not mma8 and x.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"x.dtype={x.dtype}: the direct layout takes bfloat16 / float16 x or "
                     f"8-bit codes of the weights' dtype ({params.codes.dtype})")
  fp8 = x.dtype == jnp.float8_e4m3fn and not direct  # fp8 activations, fp8-MMA layout
  if fp8 != fp8_mma(params.layout):
    raise ValueError(f"x.dtype={x.dtype} with params.layout={params.layout!r}: the fp8-MMA "
                     f"layout (':p8', prepare(mma='fp8')) takes float8_e4m3fn activations "
                     f"(with x_scale), every other layout bfloat16 / float16")
  if not (fp8 or mma8) and out_dtype is not None:
    raise ValueError(f"out_dtype: only for 8-bit x (the fp8-MMA layout, or the direct "
                     f"layout's codes); x.dtype={x.dtype} (its output takes x's dtype)")
  if not fp8 and not direct and x_scale is not None:
    raise ValueError(f"x_scale: only for float8_e4m3fn x on the fp8-MMA layout or the "
                     f"direct 8-bit layout (run_direct); x.dtype={x.dtype}, "
                     f"params.layout={params.layout!r}")
  xs_in = x_scale is not None  # each x row's float32 scale (given), in the epilogue
  if (fp8 or xs_in) and (x_scale is None or x_scale.shape not in ((m,), (m, 1))):
    raise ValueError(f"x_scale: expected the ({m},) float32 row scales of "
                     f"{'the float8_e4m3fn' if fp8 else 'this'} x; got "
                     f"{None if x_scale is None else x_scale.shape}")
  row_scaled = xs_in or quantize_x  # (quantize_x: the scales computed in the kernel)
  if (fp8 or mma8) and jnp.dtype(out_dtype or jnp.bfloat16) not in (
      jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f"out_dtype={jnp.dtype(out_dtype)}: expected bfloat16 or float16")
  want_base = params.scales.shape[:-2] + (1, params.scales.shape[-1])
  if params.fold_base is not None and (params.fold_base.shape != want_base
                                       or params.fold_base.dtype != jnp.float32):
    raise ValueError(f"params.fold_base: expected float32{list(want_base)} (one base per "
                     f"prepared column, mark_column_fold / scale_fold_base); got "
                     f"{params.fold_base.dtype}{list(params.fold_base.shape)}")
  explicit = config is not None  # checked as given; cached / heuristic ones adapt
  config = config or default_config(params, m)
  if in_kernel_x:  # its x tiles: 256 columns
    config = dataclasses.replace(
        config, substeps=in_kernel_x_substeps(config.substeps, bk, explicit))
  permuted = k_permuted(params.layout)
  if fp8:  # its own route (fp8_tiles below); none of the 16-bit conversion flags
    config = dataclasses.replace(config, scale_after_mma=False, zero_point_mma=False,
                                 overlap_mma=False)
  # The tile fold takes each K tile's largest group scale as its base, and K-padding scale
  # rows hold 1.0: in a padded last tile, real groups more than FOLD_MAX_SHIFT binades
  # below 1.0 would be zeroed, so no tile fold where K is padded.
  if (fp8 and spec.scale_dtype == "e8m0" and scale_k(spec) < bk and kp == k
      and not config.fp8_single_acc  # (the column fold is a fold already)
      and tuning.env_flag("HUMMING_JAX_FP8_FOLD", False)):  # opt-in: no gain (Config)
    config = dataclasses.replace(config, fp8_fold=True)  # (one group per tile: nothing to fold)
  cluster_env = tuning.env_choice("HUMMING_JAX_CLUSTER_N", ("1", "2", "4"))
  if (cluster_env and config.split_warpgroups == "n"  # every shared-x launch (a device A/B)
      and not config.mma_sync):  # (the mma.sync product is not taken with clusters)
    config = dataclasses.replace(config, cluster_n=int(cluster_env))
  single = config.fp8_single_acc
  if single and not (fp8 and single_acc_layout(params) and not config.fp8_fold):
    raise ValueError(f"config.fp8_single_acc=True needs the fp8-MMA layout checked by "
                     f"mark_column_fold (':cf': e8m0 scales within "
                     f"{mgpu_convert.FOLD_MAX_SHIFT} binades per column; prepare eagerly) "
                     f"and fp8_fold=False; got params.layout={params.layout!r}, "
                     f"scale_dtype={spec.scale_dtype!r}, x.dtype={x.dtype}, "
                     f"fp8_fold={config.fp8_fold}")
  if config.fp8_fold and not (fp8 and spec.scale_dtype == "e8m0" and kp == k):
    raise ValueError(f"config.fp8_fold=True needs the fp8-MMA layout with e8m0 (power-of-"
                     f"two) group scales and K a multiple of the K tile bk={bk} (its "
                     f"padding scale rows would enter a tile's base); got x.dtype={x.dtype}, "
                     f"spec {spec.name} (scale_dtype={spec.scale_dtype!r}), K={k}, padded "
                     f"to {kp}")
  if permuted and not interpret:
    # The GPU converts permuted codes only with the PTX that reads them in place, so the
    # conversion route of any config is that one (the same values as Mosaic's conversion,
    # bit for bit on the H200; zero_point_mma's route is replaced by the subtraction).
    # The interpreter undoes the permutation on the values and runs every route.
    route = (dict(fp4_whole_registers=True) if spec.weight_format.name == FP4
             else dict(int4_ptx=True, zero_point_mma=False))
    config = dataclasses.replace(config, **route)
  if not grouped and fp8 and m >= config.dequant_gemm_min_m:
    raise ValueError(f"float8_e4m3fn x: M={m} >= dequant_gemm_min_m="
                     f"{config.dequant_gemm_min_m}; the fp8-MMA layout's dense path is the "
                     f"decode kernel")
  if direct and m >= config.dequant_gemm_min_m:
    raise ValueError(f"run_direct: M={m} >= dequant_gemm_min_m={config.dequant_gemm_min_m}: "
                     f"the direct layout is for the decode kernel")
  if not grouped and not fp8 and not direct and (
      m >= config.dequant_gemm_min_m or x.dtype not in (jnp.bfloat16, jnp.float16)):
    if fake_x:  # (XLA's GEMM would multiply x as given: refuse rather than skip)
      raise ValueError(f"fake_quantize_x={fake_quantize_x!r}: M={m} >= dequant_gemm_min_m="
                       f"{config.dequant_gemm_min_m} takes XLA's dequantize + GEMM; the "
                       f"in-kernel activation quantization is the decode kernel's")
    return dequant_gemm(params, x)
  if not (fp8 or mma8) and x.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"x.dtype={x.dtype}: the grouped Mosaic kernel takes bfloat16 / float16")
  cdt = output_dtype(x, out_dtype)
  sub = divisor(config.substeps, k_tiles)
  if grouped:  # x rows read from each tile's first row; output: block_m rows per tile
    block_m = tiles.block_m
    mp = tiles.num_tiles * block_m
    rows = -(-m // 8) * 8  # TMA: rows past M read as zeros (a multiple of 8 for Mosaic)
  else:
    block_m = min(config.block_m, max(8, -(-m // 8) * 8))
    if mma8_int and block_m > 32:  # s8 WGMMA widths past 32 are multiples of 16 (PTX)
      block_m = -(-block_m // 16) * 16
    mp = -(-m // block_m) * block_m
    # unpadded_rows: token rows past M are not padded; TMA reads them as zeros and clips
    # them on the store, so decode runs no pad / slice op beside the kernel.  (K is
    # padded: rare, and the zero columns must meet zero codes.)
    # Mosaic's TMA needs the row count below its 8-row tiling or a multiple of it.
    rows = m if config.unpadded_rows and (m < 8 or m % 8 == 0) else mp
  xp = x if fp8 or mma8 else x.astype(cdt)
  if (rows, kp) != (m, k):
    xp = jnp.pad(xp, ((0, rows - m), (0, kp - k)))
  # The epilogue's row scales: x_scale as float32 (fp8: times 2**6, as the e4m3 operands
  # hold e2m1 values * 2**-6; the column fold: times its 2**-11), padded to the rows read.
  xs = None
  if xs_in:
    xs = x_scale.reshape(m).astype(jnp.float32)
    if fp8:
      xs = xs * (1 / mgpu_convert.E4M3_FROM_E2M1)
    if single:  # the column fold's 2**-11 (its max row is an epilogue row below)
      xs = xs * (2.0 ** -mgpu_convert.FOLD_MAX_SHIFT)
    if rows != m:
      xs = jnp.pad(xs, (0, rows - m))
  has_zeros = params.zeros is not None
  gpt = bk // scale_k(spec)  # scale (and zero) rows per K tile
  fp4 = spec.weight_format.name == FP4
  fp8_codes = fp8_code_dtype(spec.weight_format) is not None  # e4m3 / e5m2 (fp6 as e4m3)
  col = column_scaled(spec)  # the scale is an epilogue row, not a row per K tile
  if col and params.scales.shape[-2:] != (1, np_):
    raise ValueError(f"params.scales.shape={params.scales.shape}: expected a (1, {np_}) "
                     f"column-scale row for per-channel {FAMILY} params (layout "
                     f"{params.layout!r}); prepare them again with this version")
  zero_mma = _ones_tile(config, has_zeros) and gpt == 1
  # int4 codes through mgpu_convert.int4_to_float_ptx (the GPU only; one zero row per K
  # tile, as the offset is a broadcast row).
  int4_ptx = (config.int4_ptx and bits == 4 and not fp4 and not interpret and not zero_mma
              and (gpt == 1 or not has_zeros))
  # v6 experiments (tuning.MgpuConfig); one scale row per tile only.  Column scales keep
  # the per-tile float32 partials too (no multiply; NOTES.md v11: accumulating every tile
  # straight into the WGMMA accumulator, config scale_after_mma=False, took 1-6 % less
  # kernel time but timed 4-6 us per layer slower in the chain, so the default stays).
  after = config.scale_after_mma and gpt == 1
  overlap = after and config.overlap_mma and not zero_mma and sub > 1
  # the 16-bit product on mma.sync (mgpu_mma; the GPU only: the interpreter runs the WGMMA
  # form of the same float32 sums, in another order)
  msync = config.mma_sync and not interpret
  if config.mma_sync and (mma8 or fp8 or zero_mma or block_m > 32 or config.cluster_n > 1):
    # (clusters of CTAs are the fp8 route's and not GPU-tested with it)
    raise ValueError(f"config.mma_sync=True: the 16-bit product of tiles of at most 32 rows "
                     f"only (block_m <= 32, no cluster, not the 8-bit or fp8-MMA layouts, not "
                     f"zero_point_mma); got block_m={block_m}, {config}, layout "
                     f"{params.layout!r}, x {x.dtype}, grouped={grouped}")
  # quantize_x / fake_quantize_x at one token: the row also as (Kp / 256, 256) (a free
  # reshape), so each warpgroup's share of it is one TMA into its own buffer, in flight
  # beside the first stages (rather than chunk by chunk through its x slots before they
  # are filled)
  row_view = in_kernel_x and rows == 1 and sub * bk == 256 and kp <= ROW_VIEW_MAX_K
  # In-kernel x on the row view with RESIDENT_X (resident_x_enabled): each warpgroup
  # converts its share of the row once, in place (fake_quantize_x: code x scale;
  # quantize_x: the codes, exact in x's dtype), and each pipeline step writes its 256
  # converted columns into every row of the step's x tile (quantize_x: code tile; the rows
  # past the token are output rows no one reads) over what its TMA brought (kept: dropping
  # it hung the interpreter's pipeline barrier), rather than converting all block_m rows
  # of every tile in the K loop
  resident_x = row_view and resident_x_enabled()
  operands = (([tiles.sched] if grouped else []) + [xp]
              + ([xp.reshape(kp // 256, 256)] if row_view else []) + ([xs] if xs_in else [])
              + [params.codes])
  # The fp8 route multiplies float32 partials: scale rows stay in their stored 16-bit
  # dtype (e8m0 / e4m3 as bf16, exact) or float32, not rounded to the output dtype.
  s_dtype = (cdt if not fp8 else params.scales.dtype
             if params.scales.dtype in (jnp.bfloat16, jnp.float16) else jnp.float32)
  if not col:
    operands.append(params.scales.astype(s_dtype))
  if has_zeros:
    operands.append(params.zeros.astype(cdt))
  k_steps = k_tiles // sub
  split = divisor(config.split_k, k_steps)
  steps = k_steps // split  # pipeline steps per CTA
  fused_epilogue = split == 1  # else f32 partials (split, Np, Mp), summed by XLA
  # ":sf": each group scale rides in the fp4 conversion's fma as scale * (2**126 / D), the
  # epilogue multiplies each column by D (scale_fold_base).  Where the bf16 weights take
  # their scale rows in the K loop (not after the MMA) and the epilogue is the kernel's.
  sf = (scale_folds(params.layout) and fp4 and not fp8 and not col and not after
        and permuted and fused_epilogue and cdt == jnp.bfloat16)
  if single and not fused_epilogue:
    raise ValueError(f"config.fp8_single_acc=True: split_k={config.split_k} gives "
                     f"{split} K splits; the column fold needs the kernel's epilogue (1)")
  out_bytes = 2 if fused_epilogue else 4
  # Warpgroups split K (each streams steps_w of the steps into its own buffers) or, with
  # share_x, N (each its own 64 columns over every step, one x tile shared in SMEM).
  share_x = config.split_warpgroups == "n"
  in_kernel_what = (f"fake_quantize_x={fake_quantize_x!r}" if fake_x else "quantize_x=True")
  if in_kernel_x and (sub * bk) % QUANTIZE_X_COLS:
    raise ValueError(f"{in_kernel_what}: the x tile of a pipeline step (substeps {sub} x "
                     f"{bk} columns) must be a multiple of {QUANTIZE_X_COLS} columns; got "
                     f"{sub * bk}")
  if in_kernel_x and (grouped or share_x):
    raise ValueError(f"{in_kernel_what}: dense launches whose warpgroups split K only (each "
                     f"converts its own x tiles); got split_warpgroups="
                     f"{config.split_warpgroups!r}{', grouped tiles' if grouped else ''}")
  splits = np_ // BLOCK_N if share_x else steps  # what the warpgroups divide
  wgs = divisor(config.warpgroups, splits)
  if interpret and share_x:  # the CPU interpreter can leave a third warpgroup thread
    wgs = divisor(min(wgs, 2), splits)  # unscheduled on a 2-core machine (NOTES.md v11)
  x_side_bytes = (dict(x_bytes=1, scale_bytes=jnp.dtype(s_dtype).itemsize, x_scales=True)
                  if fp8 else dict(x_scales=True, x_codes=True, x_row_view_k=kp * row_view)
                  if quantize_x
                  else dict(x_codes=True, code_tiles=False, x_row_view_k=kp * row_view)
                  if fake_x
                  else dict(x_bytes=1, x_scales=row_scaled) if mma8
                  else dict(x_scales=True) if row_scaled else {})
  if fp8 and config.column_blocks > 1:
    raise ValueError(f"config.column_blocks={config.column_blocks}: the fp8-MMA layout "
                     f"runs one column block per CTA (expected 1)")
  while not explicit and wgs > 1 and smem_bytes(
      block_m, min(2, steps if share_x else steps // wgs), sub, bk, bits, has_zeros,
      out_bytes, wgs, zero_mma, gpt, col, share_x, column_blocks=config.column_blocks,
      **x_side_bytes) > SMEM_BYTES:
    wgs = divisor(wgs - 1, splits)  # e.g. group 256 x 64 tokens: 4 warpgroups do not fit
  steps_w = steps if share_x else steps // wgs
  eg = wgs if share_x else 1  # warpgroups with their own epilogue (output columns)
  # Config.column_blocks: column blocks per CTA, streamed one after another (a divisor of
  # the CTA column blocks; one where clusters share x tiles, as Config checks)
  blocks = divisor(config.column_blocks, np_ // (BLOCK_N * eg))
  stages = min(config.stages, blocks * steps_w, MAX_BARRIERS // (1 if share_x else wgs))
  stages = fit_stages(dataclasses.replace(config, stages=stages, substeps=sub, warpgroups=wgs,
                                          column_blocks=blocks),
                      block_m, bk, bits, has_zeros, out_bytes=out_bytes, scale_rows=gpt,
                      column_scale=col, **x_side_bytes)
  # CTAs of adjacent column blocks sharing each x tile by TMA multicast (Config.cluster_n);
  # the interpreter copies x into each CTA whole (same values, no multicast).  As with
  # warpgroups above, the interpreter keeps at most two threads per cluster: its threads
  # run on the CPU client, at most one per core at once, and a third one blocked on the
  # cluster barrier hung a 2-core machine (session 24).  Each CTA's arithmetic does not
  # depend on the cluster: test_cluster_gpu compares the outputs exactly on the H200.
  cl = config.cluster_n if share_x else 1
  if interpret:
    cl = min(cl, max(1, 2 // wgs))
  # a power of two dividing the column blocks and the x tile's 8-row groups (each CTA
  # multicasts whole groups: Mosaic splits the tile's leading dimension)
  while (np_ // (BLOCK_N * eg)) % cl or (block_m // 8) % cl:
    cl //= 2
  # fp8: one float32 partial per scale group of a K tile (its 32-deep WGMMAs, one per
  # 32-code block, into it); `in_flight` groups issued before one wait (partials of <= 64
  # registers per thread in all).
  fp8_blocks = bk // 32  # (64, 32) e4m3 A operands per K tile
  fp8_group_blocks = max(1, min(scale_k(spec), bk) // 32)  # (fp8 specs: groups >= 32)
  fp8_groups = fp8_blocks // fp8_group_blocks
  in_flight = max(1, min(fp8_groups, 128 // block_m))
  has_bias = params.bias is not None and fused_epilogue  # added in the kernel
  # Epilogue rows multiplied in the kernel: [the scale fold's base (sf)], the global scale,
  # the column scale, [the column fold's largest group scales (fp8_single_acc)].
  scale_rows = [r for r in (params.global_scale, params.scales if col else None)
                if r is not None] if fused_epilogue else []
  if single:  # each column's largest group scale: the fold's base, last epilogue row,
    # stored at prepare time (mark_column_fold) or, for params without it, computed here
    scale_rows.append(params.fold_base if params.fold_base is not None
                      else column_fold_row(*column_fold_base(params.scales, k, spec)))
  if sf:  # each column's base D (computed here for params without it), the FIRST epilogue
    # row: y = acc * D is exact (D a power of two), so the global scale and bias then meet
    # the unfolded kernel's accumulator and ptxas contracts (acc * g) + bias into the same
    # fma as there.  D after g rounded acc * g / D apart from the fma (NVFP4, session 31:
    # ~3e-5 of outputs one bf16 ulp off).
    scale_rows.insert(0, params.fold_base if params.fold_base is not None
                      else scale_fold_base(params.scales, k, spec))
  base_i = 0 if sf else len(scale_rows) - 1  # the fold's row (single / sf), read early
  n_ep = len(scale_rows) + has_bias  # epilogue vectors, fetched during the K loop
  # fp8 x: 32-byte swizzle, so each 32-deep K step of a tile is a whole swizzle tile (the
  # B operand of one fp8 WGMMA beside its (64, 32) register A operand).
  x_tf = ((plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(32)) if fp8
          else _swizzled(sub * bk, 8 if mma8 and not quantize_x else 16, "x"))
  xq_tf = _swizzled(sub * bk, 8, "x codes")  # quantize_x: the 8-bit B operand tile
  w_tf = _swizzled(bk, bits, "w")
  a_tf = _swizzled(bk, 16, "a")
  r_tf = _swizzled(block_m, 32, "r")
  o_tf = _swizzled(BLOCK_N, 16, "o") if fused_epilogue else _swizzled(block_m, 32, "o")

  def kernel(*refs, x_buf, w_buf, bars, o_smem, s_buf=None, z_buf=None, red_smem=None,
             red_bar=None, ep_smem=None, ep_barrier=None, a_smem=None, ones_smem=None,
             free=None, out_bar=None, xs_smem=None, xs_bar=None, o_free=None, red_free=None,
             xq_smem=None, amax_smem=None, amax_bar=None, xa_bars=None, xa_smem=None,
             xa_red=None):
    rest = list(refs)
    sched_gmem = rest.pop(0) if grouped else None
    x_gmem = rest.pop(0)
    xv_gmem = rest.pop(0) if row_view else None
    xs_gmem = rest.pop(0) if xs_in else None
    w_gmem = rest.pop(0)
    s_gmem = None if col else rest.pop(0)
    z_gmem = rest.pop(0) if has_zeros else None
    ep_gmem = [rest.pop(0) for _ in range(n_ep)]  # [D], [global], [col scale], [max], [bias]
    (o_gmem,) = rest
    ni, mi, ki = lax.axis_index("n"), lax.axis_index("m"), lax.axis_index("k")
    if cl > 1:  # the cluster's column block, then this CTA's within it
      ni = ni * cl + lax.axis_index("cn")
    ms = pl.ds(mi * block_m, block_m)  # output rows (and x rows when dense)
    wg = lax.axis_index("wg")
    # warpgroup g's columns in the CTA's column block r
    cols = lambda g, r=0: pl.ds(((ni * blocks + r) * eg + g) * BLOCK_N, BLOCK_N)
    first_tile = (ki * steps + (0 if share_x else wg * steps_w)) * sub  # this K range
    e = wg if share_x else 0  # this warpgroup's epilogue slot
    # share_x: one output tile and epilogue barrier per warpgroup (else the single ones)
    own = (lambda ref, i: ref.at[i]) if share_x else (lambda ref, i: ref)
    # ep_smem row of epilogue vector i for warpgroup g's columns of column block r
    ep_row = lambda r, g, i: (r * eg + g) * n_ep + i

    def tile(xs, pick):  # xs: the x rows; pick: the tile's expert's arrays (dense: same)
      if xs_in:  # the tile's row scales, for the epilogue
        pl.when(wg == 0)(lambda: plgpu.copy_gmem_to_smem(xs_gmem.at[xs], xs_smem, xs_bar))
      if n_ep:  # in flight during the K loop; warpgroup 0 (share_x: each) runs the epilogue
        @pl.when(wg == 0)  # (share_x: for every warpgroup; one issuer of all copies)
        def _():
          for r in range(blocks):  # (every column block's rows: one barrier phase)
            for g in range(eg):
              for i, v_gmem in enumerate(ep_gmem):
                plgpu.copy_gmem_to_smem(pick(v_gmem).at[:, cols(g, r)],
                                        ep_smem.at[pl.ds(ep_row(r, g, i), 1)],
                                        own(ep_barrier, g))

      # The TMA pipeline by hand: plgpu.emit_pipeline allocates per-thread scratch, which a
      # kernel of several warpgroups cannot have; each warpgroup owns buffers [wg, slot]
      # (share_x: warpgroup 0 fills every warpgroup's slot and the one shared x tile).
      def fetch_one(t, slot, g, ng, bar):  # warpgroup g's weight, scale and zero rows
        if direct:  # (Np, Kp): one (BLOCK_N, bk) box per K tile, same SMEM tile
          for j in range(sub):
            plgpu.copy_gmem_to_smem(w_gmem.at[ng, pl.ds((t + j) * bk, bk)],
                                    w_buf.at[g, slot, j], bar)
        else:
          plgpu.copy_gmem_to_smem(pick(w_gmem).at[pl.ds(t, sub), ng], w_buf.at[g, slot], bar)
        rows = pl.ds(t * gpt, sub * gpt)
        if not col:
          plgpu.copy_gmem_to_smem(pick(s_gmem).at[rows, ng], s_buf.at[g, slot], bar)
        if has_zeros:
          plgpu.copy_gmem_to_smem(pick(z_gmem).at[rows, ng], z_buf.at[g, slot], bar)

      def fetch(step, slot, part="all"):  # step: counted over the CTA's column blocks
        # part: "w" the weight side only, "x" the x tile only (quantize_x's first stages:
        # their weights in flight during the amax pass, which has the x slots meanwhile)
        r, step = divmod(step, steps_w) if blocks > 1 else (0, step)
        t = first_tile + step * sub
        x_src = x_gmem.at[xs, pl.ds(t * bk, sub * bk)]
        if not share_x:
          bar = bars.at[wg * stages + slot]
          if part != "w":
            plgpu.copy_gmem_to_smem(x_src, x_buf.at[wg, slot], bar)
          if part != "x":
            fetch_one(t, slot, wg, cols(0, r), bar)
          return

        @pl.when(wg == 0)
        def _():  # (cluster: this CTA's 1/cl of the tile, multicast to every CTA of it)
          plgpu.copy_gmem_to_smem(x_src, x_buf.at[0, slot], bars.at[slot],
                                  collective_axes="cn" if cl > 1 else None)
          for g in range(wgs):
            fetch_one(t, slot, g, cols(g, r), bars.at[slot])

      top_row = None  # this warpgroup's (64,) column maxima (fp8_single_acc) or D (sf)
      fold_row = None  # sf: its (64,) 2**126 / D (the interpreter: 1 / D) (scoped)

      def compute(step, slot, acc_ref, total):  # step: this K range's (not the blocks')
        x_smem = x_buf.at[0 if share_x else wg, slot]
        if resident_x:  # the step's converted columns of the token, into every row
          x_smem = resident_x_tile(step, x_smem)
        elif fake_x:  # the tile's values replaced by their quantized ones before any product
          fake_quantized_x(x_smem)
        bcast = lambda v, shape: lax.broadcast_in_dim(v, shape, [0])
        row = lambda r, j, i=0: plgpu.load(r.at[wg, slot, j * gpt + i], layout=_ROW)

        def per_k_rows(rows):  # rows(i): the tile's i-th (64,) row, over its group's K
          if gpt == 1:
            return bcast(rows(0), (BLOCK_N, bk))
          return jnp.concatenate([bcast(rows(i), (BLOCK_N, bk // gpt)) for i in range(gpt)],
                                 axis=1)

        def tile_operands(j):  # K tile j of the slot: the dequantized W^T tile and x^T
          w = plgpu.load(w_buf.at[wg, slot, j], layout=_UPCAST[bits],
                         optimized=config.optimized_load)
          if permuted and interpret:  # the permuted K order undone on the values
            w = mgpu_convert.permute_k(w.astype(jnp.int8))
          # sf: scale * (2**126 / D) per code, the conversion's factor (each exact in bf16)
          factors = per_k_rows(lambda i: row(s_buf, j, i) * fold_row) if sf else None
          if fp4 and not interpret and config.fp4_whole_registers:  # relayout inside
            w = mgpu_convert.to_float_ptx(w, cdt, relayout=not permuted, permuted=permuted,
                                          factors=factors)
          elif fp4 and not interpret:
            w = mgpu_convert.to_float_ptx(plgpu.layout_cast(w, _WGMMA), cdt)
          elif fp4 and sf:  # what the PTX computes: code * scale / D, rounded once
            w = (mgpu_convert.to_float_interpret(plgpu.layout_cast(w, _WGMMA), jnp.float32)
                 * factors).astype(cdt)
          elif fp4:
            w = mgpu_convert.to_float_interpret(plgpu.layout_cast(w, _WGMMA), cdt)
          elif fp8_codes:
            w = mgpu_convert.fp8_to_float(plgpu.layout_cast(w, _WGMMA), cdt)
          elif int4_ptx:  # c - z in one PTX block per pair: z folded into the magic offset
            off = None
            if has_zeros:
              off = bcast((row(z_buf, j).astype(jnp.float32) + mgpu_convert.int4_offset(cdt)
                           ).astype(cdt), (BLOCK_N, bk))
            w = mgpu_convert.int4_to_float_ptx(w, cdt, off, permuted=permuted)
          else:
            w = plgpu.layout_cast(w, _WGMMA).astype(cdt)

          per_k = lambda r: per_k_rows(lambda i: row(r, j, i))
          if has_zeros and not zero_mma and not int4_ptx:
            w = w - per_k(z_buf)  # small integers: exact
          if not after and not col and not sf:
            w = w * per_k(s_buf)  # the bf16-rounded dequantized weight
          if a_smem is not None:  # the GPU interpreter takes WGMMA operands from SMEM only
            plgpu.wgmma_wait(0)
            a_smem.at[wg][...] = w
            plgpu.commit_smem()
            w = a_smem.at[wg]
          return w, x_smem.at[:, pl.ds(j * bk, bk)].T

        def scaled(part, j):  # a K tile's float32 partial product times its scale row
          return part if col else part * bcast(row(s_buf, j).astype(jnp.float32), part.shape)

        acc_t = plgpu.ACC((BLOCK_N, block_m), jnp.float32)
        if mma8:
          return mma8_tiles(slot, x_smem, acc_t, total, acc_ref)
        if fp8:
          return fp8_tiles(slot, x_smem, lambda j, i: row(s_buf, j, i), bcast, acc_t, total,
                           acc_ref, top_row)
        if msync:  # each warp: its 16 weight rows x the x fragments, in registers
          chains = config.mma_chains
          for j in range(sub):
            w, _ = tile_operands(j)
            xb = plgpu.load(x_smem.at[:, pl.ds(j * bk, bk)], layout=mgpu_mma.MMA_X)
            if after:
              zero = plgpu.layout_cast(jnp.zeros(total.shape, jnp.float32), _WGMMA)
              total = total + scaled(mgpu_mma.mma_sync(zero, w, xb, chains=chains), j)
            else:
              total = mgpu_mma.mma_sync(total, w, xb, chains=chains)
          plgpu.commit_smem()  # every warp has read the slot before it is refilled
          return total
        # overlap: tile j + 1 is dequantized while tile j's WGMMA runs.  (Reading an
        # accumulator waits for every WGMMA in flight, so the wgmma_wait(1) below adds no
        # overlap of its own; the form GPU-tested in session 13.)
        if overlap:
          def tiles_product(*part_refs):
            parts = []
            for j in range(sub):
              w, x_t = tile_operands(j)
              plgpu.wgmma(part_refs[j], w, x_t)
              if j:
                plgpu.wgmma_wait(1)
                parts.append(part_refs[j - 1][...])
            plgpu.wgmma_wait(0)  # the slot may be refilled next
            return parts + [part_refs[-1][...]]
          for j, part in enumerate(pl.run_scoped(tiles_product, *[acc_t] * sub)):
            total = total + scaled(part, j)
          return total

        for j in range(sub):  # MMA j runs while tile j + 1 is dequantized
          w, x_t = tile_operands(j)
          if not after:
            plgpu.wgmma(acc_ref, w, x_t)
            continue

          def tile_product(part_ref, sum_ref=None, w=w, x_t=x_t):
            plgpu.wgmma(part_ref, w, x_t)  # this K tile's (c [- z]) @ x^T: exact in f32
            if sum_ref is not None:  # every row: sum over the tile's K of x, per token
              plgpu.wgmma(sum_ref, ones_smem.at[wg], x_t)
            plgpu.wgmma_wait(0)
            return part_ref[...], None if sum_ref is None else sum_ref[...]
          part, xsum = pl.run_scoped(tile_product, *([acc_t] * (2 if zero_mma else 1)))
          if zero_mma:  # sum_k (c - z) x = sum_k c x - z sum_k x
            part = part - bcast(row(z_buf, j).astype(jnp.float32), part.shape) * xsum
          total = total + scaled(part, j)
        plgpu.wgmma_wait(0)  # the slot may be refilled next
        return total

      x_rows_inv = None  # in-kernel x: 1 / the (block_m,) row scales, _X_ROWS-reduced
      x_rows_s = None  # fake_quantize_x: the row scales themselves (same layout)

      per_wg = k_steps // wgs  # quantize_x: each warpgroup's chunks of 256 columns

      def issue_row_view():  # one token: this warpgroup's 1/wgs of the row, one TMA
        plgpu.copy_gmem_to_smem(xv_gmem.at[pl.ds(wg * per_wg, per_wg)],
                                xa_smem.at[wg, pl.ds(0, per_wg)], xa_bars.at[wg])

      def row_view_amax():  # every value of the view's rows is the token's
        # Each view row's max inside its warp (_X_ROWS), the rows' maxima through SMEM
        # (a reduction across warps: a full-array jnp.max gave each warp its own on the
        # H100), every warpgroup's read back as scalars by every thread.
        plgpu.barrier_wait(xa_bars.at[wg])
        v = plgpu.load(xa_smem.at[wg], layout=_X_ROWS).astype(jnp.float32)
        xa_red.at[wg][...] = jnp.max(jnp.where(v != v, jnp.inf, jnp.abs(v)), axis=1)
        plgpu.commit_smem()
        if wgs > 1:
          plgpu.barrier_arrive(amax_bar)
          plgpu.barrier_wait(amax_bar)
        a = None  # (rows past per_wg are the buffer's padding: not read)
        for g in range(wgs) if wgs > 1 else [wg]:
          for i in range(per_wg):
            a = xa_red[g, i] if a is None else jnp.maximum(a, xa_red[g, i])
        return a  # the token's amax, a scalar

      def quantize_scales():
        # Each warpgroup reads 1/wgs of the whole rows (every grid K split's too: the scale
        # is the row's): one token from the row view in flight since start(), else through
        # its x slots (the weight stages in flight meanwhile, the x tiles after), keeping
        # |x| elementwise (NaN as inf), then one reduction per row; the warpgroups' maxima
        # meet in SMEM.
        nonlocal x_rows_inv, x_rows_s
        amax = row_view_amax() if row_view else streamed_amax()
        if wgs > 1 and not row_view:  # (the row view's maxima met already)
          amax_smem.at[wg][...] = amax
          plgpu.barrier_arrive(amax_bar)
          plgpu.barrier_wait(amax_bar)
          for g in range(wgs):
            amax = jnp.maximum(amax, plgpu.load(amax_smem.at[g], layout=_X_ROWS.reduce(1)))
        # quantize_activations' scale amax / qmax in the form XLA gives it: its simplifier
        # multiplies by the float32 reciprocal (a GPU division is 1 ulp off in ~4 % of
        # rows: benchmarks/probe_inkernel_quant.py)
        s = jnp.where(amax > 0, amax * float(np.float32(1 / act_fmt.max_value)), 1.0)
        s = jnp.where(amax == jnp.inf, jnp.nan, s)
        # XLA computes the reference's x / s as x * (1 / s) (a division by a broadcast),
        # which rounds ties (x / s = k + 1/2 exactly: common in bf16) differently
        inv = 1.0 / s
        if resident_x:
          convert_row_view(inv, s)
        if fake_x and resident_x:  # (the values carry their scale: none in the epilogue)
          return
        if row_view:  # the token's scalars as the (block_m,) row scales
          rows_of = lambda v: plgpu.layout_cast(jnp.full((block_m,), v, jnp.float32),
                                                _X_ROWS.reduce(1))
          inv, s = rows_of(inv), rows_of(s)
        x_rows_inv = inv
        if fake_x:  # (the values carry their scale: none in the epilogue)
          x_rows_s = s
          return

        @pl.when(wg == 0)
        def _():  # the epilogue's row scales (read after this warpgroup's next commit)
          xs_smem[...] = s

      def streamed_amax():
        chunk_bar = lambda c: xa_bars.at[wg * stages + lax.rem(c, stages)]

        def issue(c):
          t = (wg * per_wg + c) * sub
          plgpu.copy_gmem_to_smem(x_gmem.at[xs, pl.ds(t * bk, sub * bk)],
                                  x_buf.at[wg, lax.rem(c, stages)], chunk_bar(c))
        for c in range(min(stages, per_wg)):
          issue(c)

        def body(c, amax):
          plgpu.barrier_wait(chunk_bar(c))
          v = plgpu.load(x_buf.at[wg, lax.rem(c, stages)], layout=_X_ROWS).astype(jnp.float32)
          plgpu.commit_smem()  # every thread has read the slot before it is refilled
          pl.when(c + stages < per_wg)(lambda: issue(c + stages))
          return jnp.maximum(amax, jnp.where(v != v, jnp.inf, jnp.abs(v)))
        amax = lax.fori_loop(0, per_wg, body, plgpu.layout_cast(
            jnp.zeros((block_m, sub * bk), jnp.float32), _X_ROWS))
        return jnp.max(amax, axis=1)

      def saturate(v, inv):  # x / s (as x * (1 / s), XLA's form), saturated
        return jnp.clip(v * inv, act_fmt.min_value, act_fmt.max_value)

      def saturated_x(x_smem):  # this slot's x tile over its row scales, saturated
        v = plgpu.load(x_smem, layout=_X_ROWS).astype(jnp.float32)
        return saturate(v, lax.broadcast_in_dim(x_rows_inv, v.shape, [0]))

      def code_values(t):  # saturated x / s -> its code (float32, as XLA's reference)
        return (act_prepass.round_half_even(t).astype(jnp.float32) if act_fmt.name == "int8"
                else mgpu_convert.round_to_e4m3(t))

      def convert_row_view(inv, s):  # resident_x: this warpgroup's share of the row, in place
        # (inv, s: the token's scalars; the view's padding rows are converted too, unread)
        slab = xa_smem.at[wg]
        v = plgpu.load(slab, layout=_X_ROWS).astype(jnp.float32)
        full = lambda c: plgpu.layout_cast(jnp.full(v.shape, c, jnp.float32), _X_ROWS)
        code = code_values(saturate(v, full(inv)))
        slab[...] = (code * full(s) if fake_x else code).astype(slab.dtype)
        plgpu.commit_smem()  # every warp reads every row of the slab
        if split > 1 and wgs > 1:  # a K split's steps read other warpgroups' slabs
          plgpu.barrier_arrive(amax_bar)
          plgpu.barrier_wait(amax_bar)

      def resident_x_tile(step, x_smem):  # the step's 256 converted columns, every row
        if split == 1:  # this warpgroup's K range is its own slab
          slab, i = wg, step
        else:  # 256-column chunk ki * steps + wg * steps_w + step of the row
          chunk = ki * steps + wg * steps_w + step
          slab, i = lax.div(chunk, per_wg), lax.rem(chunk, per_wg)
        r = plgpu.load(xa_smem.at[slab, i], layout=_X_ROWS.reduce(0))
        if quantize_x:  # the codes (exact in x's dtype) into this warpgroup's code tile
          x_smem, r = xq_smem.at[wg], r.astype(jnp.float32).astype(params.codes.dtype)
        x_smem[...] = plgpu.layout_cast(lax.broadcast_in_dim(r, x_smem.shape, [1]), _X_ROWS)
        plgpu.commit_smem()  # generic-proxy stores -> the product's reads
        return x_smem

      def quantized_x(x_smem):  # this slot's x tile -> 8-bit codes in this warpgroup's tile
        t = saturated_x(x_smem)
        if mma8_int:  # round half to even by the float's bits (act_prepass's form)
          q = act_prepass.round_half_even(t).astype(jnp.int8)
        else:  # e4m3: one round-to-nearest-even convert (Hopper's cvt)
          q = t.astype(jnp.float8_e4m3fn)
        xq_smem.at[wg][...] = q
        plgpu.commit_smem()  # generic-proxy stores -> the WGMMA's reads
        return xq_smem.at[wg]

      def fake_quantized_x(x_smem):  # this slot's x tile -> code x scale, in place
        # (each thread stores exactly the values it loaded: no hazard between threads)
        t = saturated_x(x_smem)
        x_smem[...] = (code_values(t) * lax.broadcast_in_dim(x_rows_s, t.shape, [0])
                       ).astype(x_smem.dtype)
        plgpu.commit_smem()  # generic-proxy stores -> the WGMMA's (and every warp's) reads

      def mma8_tiles(slot, x_smem, acc_t, total, acc_ref):
        if quantize_x and not resident_x:
          x_smem = quantized_x(x_smem)
        # The direct layout's (64, bk) 8-bit K-major code tiles are the WGMMA A operand as
        # stored, the 8-bit x tile (read transposed: K-major) the B operand: nothing is
        # converted per weight.  int8: every K tile into the int32 accumulator (exact over
        # the warpgroup's K range; warpgroups and grid K splits then add in float32);
        # e4m3: each K tile's product (128 deep) promoted to the float32 running sum, as
        # Hopper's fp8 WGMMA accumulates in fewer bits than float32.
        operands = [(w_buf.at[wg, slot, j], x_smem.at[:, pl.ds(j * bk, bk)].T)
                    for j in range(sub)]
        if mma8_int:
          for w, x_t in operands:
            plgpu.wgmma(acc_ref, w, x_t)
          plgpu.wgmma_wait(0)  # the slot may be refilled next
          return total

        def tiles_product(*part_refs):
          for part_ref, (w, x_t) in zip(part_refs, operands):
            plgpu.wgmma(part_ref, w, x_t)
          plgpu.wgmma_wait(0)
          return [part_ref[...] for part_ref in part_refs]
        for part in pl.run_scoped(tiles_product, *[acc_t] * sub):
          total = total + part
        return total

      def fp8_tiles(slot, x_smem, scale_row, bcast, acc_t, total, acc_ref, top_row):
        # Per K tile: the (64, 32) e4m3 A operands of its 32-code blocks (in registers on
        # the GPU; SMEM for the interpreter), then rounds of `in_flight` scale groups: each
        # group's WGMMAs into its own fresh accumulator, one wait, each partial times its
        # scale row (group g of the tile is scale row g: groups >= 64 are one per tile).
        # fp8_fold: the tile's groups folded, one partial per tile; fp8_single_acc: folded
        # against top_row, every tile's WGMMAs into acc_ref, a wait before the slot's refill.
        def operands(j):  # (fold multiplier or None, (A blocks, B blocks)) of K tile j
          mult = None
          if config.fp8_fold or single:  # the group scales folded into the operands
            scales = [scale_row(j, g).astype(jnp.float32) for g in range(fp8_groups)]
            # single: against the column's largest group (top_row), not the tile's
            mult, raises = mgpu_convert.fold_shifts(scales, top=top_row if single else None)
          w = plgpu.load(w_buf.at[wg, slot, j], layout=_UPCAST[4],
                         optimized=config.optimized_load)
          if interpret:
            buf = a_smem.at[wg]
            plgpu.wgmma_wait(0)
            buf[...] = mgpu_convert.p8_e2m1_to_e4m3_interpret(
                w, None if mult is None else jnp.stack(raises, axis=1), 32 * fp8_group_blocks)
            plgpu.commit_smem()
            a_blocks = [buf.at[:, pl.ds(b * 32, 32)] for b in range(fp8_blocks)]
          elif mult is None:
            a_blocks = mgpu_convert.e2m1_to_e4m3_ptx(w, fp8_blocks)
          else:
            top = top_row if single else functools.reduce(jnp.maximum, scales)
            # single: ":cf" holds every real group within FOLD_MAX_SHIFT binades of top
            a_blocks = mgpu_convert.e2m1_to_e4m3_ptx(w, fp8_blocks, scales=scales, top=top,
                                                     group_blocks=fp8_group_blocks,
                                                     raises_in_range=single)
          return mult, (a_blocks, [x_smem.at[:, pl.ds(j * bk + b * 32, 32)].T
                                   for b in range(fp8_blocks)])

        def issue(part_refs, blocks, group):  # group None: every block of the tile
          for ref, g in zip(part_refs, group):
            runs = (range(fp8_blocks) if g is None
                    else range(g * fp8_group_blocks, (g + 1) * fp8_group_blocks))
            for b in runs:
              plgpu.wgmma(ref, blocks[0][b], blocks[1][b])

        def scaled_sum(total, parts, j, group):
          for part, g in zip(parts, group):
            total = total + part * bcast(scale_row(j, g).astype(jnp.float32), part.shape)
          return total

        for j in range(sub):
          mult, blocks = operands(j)
          if single:  # every K tile into the one accumulator; its max row in the epilogue
            issue([acc_ref], blocks, [None])
            if j == sub - 1:
              plgpu.wgmma_wait(0)  # the slot may be refilled next
            continue
          if mult is not None:  # folded: one partial per K tile, one wait

            def tile_product(part_ref, blocks=blocks):
              issue([part_ref], blocks, [None])
              plgpu.wgmma_wait(0)
              return part_ref[...]
            part = pl.run_scoped(tile_product, acc_t)
            total = total + part * bcast(mult, part.shape)
            continue
          for r0 in range(0, fp8_groups, in_flight):
            group = range(r0, min(fp8_groups, r0 + in_flight))

            def round_products(*part_refs, group=group, blocks=blocks):
              issue(part_refs, blocks, group)
              plgpu.wgmma_wait(0)
              return [ref[...] for ref in part_refs]
            total = scaled_sum(total, pl.run_scoped(round_products, *[acc_t] * len(group)),
                               j, group)
        return total

      def start():  # before the first column block
        if zero_mma:  # the constant all-ones WGMMA A operand of the x sums
          ones_smem.at[wg][...] = jnp.ones((BLOCK_N, bk), cdt)
          plgpu.commit_smem()
        if in_kernel_x and row_view:  # the row in flight beside the first stages
          issue_row_view()
          for st in range(stages):
            fetch(st, st)
          quantize_scales()
        elif in_kernel_x:  # the first stages' weights stream in while the rows' amax is read
          for st in range(stages):
            fetch(st, st, part="w")
          quantize_scales()
          for st in range(stages):
            fetch(st, st, part="x")
        else:
          for st in range(stages):  # (single: in flight while the column maxima arrive)
            fetch(st, st)
        if single or sf:  # the columns' largest group scales / fold bases, before the
          plgpu.barrier_wait(own(ep_barrier, e))  # first K tile

      def scoped(acc_ref, r):  # column block r's K loop
        nonlocal top_row, fold_row
        if single or sf:
          top_row = plgpu.load(ep_smem.at[ep_row(r, e, base_i)], layout=_ROW)
        if sf:  # D >= 2**-1: 2**126 / D is finite (the padding rows' scale 1.0 too)
          fold_row = ((1.0 / top_row) if interpret else
                      (mgpu_convert.bias_factor(cdt) / top_row).astype(cdt))

        def body(step, total):
          step = r * steps_w + step  # the pipeline's step, over the column blocks
          slot = lax.rem(step, stages)
          plgpu.barrier_wait(bars.at[slot if share_x else wg * stages + slot])
          total = compute(lax.rem(step, steps_w) if blocks > 1 else step, slot, acc_ref,
                          total)

          @pl.when(step + stages < blocks * steps_w)
          def _():
            if share_x:  # this warpgroup is done with the shared slot; warpgroup 0
              plgpu.barrier_arrive(free.at[slot])  # refills it once every one is
              # (cluster: every one of every CTA, as the refill multicasts into them all)
              pl.when(wg == 0)(lambda: plgpu.barrier_wait(free.at[slot]))
            fetch(step + stages, slot)
          return total

        total = None  # the running sum lives in acc_ref, or (after, per-group fp8) in registers:
        in_registers = (not mma8_int if mma8 else after or msync or (fp8 and not single))
        if in_registers:
          total = plgpu.layout_cast(jnp.zeros((BLOCK_N, block_m), jnp.float32), _WGMMA)
        total = lax.fori_loop(0, steps_w, body, total)
        return total if in_registers else acc_ref[...].astype(jnp.float32)

      def column_block(r):  # K loop, warpgroup reduction, epilogue and store of block r
        acc = pl.run_scoped(lambda acc_ref: scoped(acc_ref, r),
                            plgpu.ACC((BLOCK_N, block_m),
                                      jnp.int32 if mma8_int else jnp.float32))
        if wgs > 1 and not share_x:  # partial sums of warpgroups 1.. -> SMEM -> warpgroup 0
          @pl.when(wg > 0)
          def _():
            if blocks > 1:  # warpgroup 0 has read the last block's partials
              pl.when(r > 0)(lambda: plgpu.barrier_wait(red_free))
            red_smem.at[wg - 1][...] = acc
            plgpu.barrier_arrive(red_bar)

        @pl.when((wg == 0) | share_x)
        def _epilogue():
          y = acc
          if wgs > 1 and not share_x:
            plgpu.barrier_wait(red_bar)
            for i in range(wgs - 1):
              y = y + plgpu.load(red_smem.at[i], layout=_WGMMA)
            if blocks > 1:  # (the next block's warpgroups wait for it)
              pl.when(r + 1 < blocks)(lambda: plgpu.barrier_arrive(red_free))
          if row_scaled:  # each x row (a column here) times its scale (split-K: each partial)
            # one arrival per tile: with several column blocks only the first waits (a
            # second wait would be for a phase that never completes)
            wait_xs = lambda: plgpu.barrier_wait(xs_bar) if xs_in else None
            if blocks > 1:
              pl.when(r == 0)(wait_xs)
            else:
              wait_xs()
            y = y * lax.broadcast_in_dim(plgpu.load(xs_smem, layout=_COL), y.shape, [1])
          if blocks > 1:  # the last block's store has read the output tile
            if share_x and wgs > 1:  # (warpgroup 0 issued it)
              @pl.when(r > 0)
              def _():
                @pl.when(wg == 0)
                def _():
                  plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                  plgpu.barrier_arrive(o_free)
                pl.when(wg > 0)(lambda: plgpu.barrier_wait(o_free))
            else:
              plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          out_smem = own(o_smem, e)
          if not fused_epilogue:
            out_smem[...] = y
          else:
            if n_ep:
              if not (single or sf):  # (single, sf: waited for before the K loop; every
                # block's rows arrive in the first phase)
                wait = lambda: plgpu.barrier_wait(own(ep_barrier, e))
                if blocks > 1:
                  pl.when(r == 0)(wait)
                else:
                  wait()
              ep = lambda i: lax.broadcast_in_dim(
                  plgpu.load(ep_smem.at[ep_row(r, e, i)], layout=_ROW), y.shape, [0])
              for i in range(len(scale_rows)):
                y = y * ep(i)
              if has_bias:
                y = y + ep(n_ep - 1)
            out_smem.T[...] = plgpu.layout_cast(y.astype(cdt), _TRANSPOSED)
          plgpu.commit_smem()

          def store():
            for g in range(eg):
              dst = (o_gmem.at[ms, cols(g, r)] if fused_epilogue
                     else o_gmem.at[ki, cols(g, r), ms])
              plgpu.copy_smem_to_gmem(own(o_smem, g), dst)
            if blocks == 1:  # (else: the next block waits for the reads, the CTA's end
              plgpu.wait_smem_to_gmem(0)  # for the writes)
          if not (share_x and wgs > 1):
            store()  # warpgroup 0 (or the only one)
            return
          # share_x: warpgroup 0 stores every warpgroup's tile (one issuer, as for the loads)
          pl.when(wg > 0)(lambda: plgpu.barrier_arrive(out_bar))

          @pl.when(wg == 0)
          def _():
            plgpu.barrier_wait(out_bar)
            store()

      start()
      if blocks == 1:
        column_block(0)
      else:
        lax.fori_loop(0, blocks, lambda r, carry: (column_block(r), carry)[1], None)
        pl.when(wg == 0)(lambda: plgpu.wait_smem_to_gmem(0))

    if not grouped:
      tile(ms, lambda ref: ref)
    else:  # one expert per row tile; kind-0 tiles (past the rows, idle) do nothing
      expert, first, kind = (sched_gmem[mi * 4 + f] for f in (0, 1, 3))
      xs = pl.ds(pl.multiple_of(first, 8), block_m)
      pl.when(kind == 1)(lambda: tile(xs, lambda ref: ref.at[expert]))

  row_buf = lambda dtype=cdt: plgpu.SMEM((wgs, stages, sub * gpt, BLOCK_N), dtype)
  copies = (sub if direct else 1) + (not col) + has_zeros  # per warpgroup and slot, + x
  scratch = dict(
      x_buf=plgpu.SMEM((1 if share_x else wgs, stages, block_m, sub * bk), xp.dtype,
                       transforms=x_tf),
      w_buf=plgpu.SMEM((wgs, stages, sub, BLOCK_N, bk), params.codes.dtype, transforms=w_tf),
      bars=(plgpu.Barrier(num_arrivals=1 + wgs * copies, num_barriers=stages) if share_x
            else plgpu.Barrier(num_arrivals=1 + copies, num_barriers=wgs * stages)))
  if share_x:  # slot released: one arrival per warpgroup (of the cluster); output written
    scratch["free"] = (plgpu.ClusterBarrier(collective_axes=("cn",), num_arrivals=wgs,
                                            num_barriers=stages) if cl > 1
                       else plgpu.Barrier(num_arrivals=wgs, num_barriers=stages))
    if wgs > 1:
      scratch["out_bar"] = plgpu.Barrier(num_arrivals=wgs - 1)
    if wgs > 1 and blocks > 1:  # the output tiles' last store has read them
      scratch["o_free"] = plgpu.Barrier(num_arrivals=1)
  if not col:
    scratch["s_buf"] = row_buf(s_dtype)
  if has_zeros:
    scratch["z_buf"] = row_buf()
  if wgs > 1 and not share_x:
    scratch["red_smem"] = plgpu.SMEM((wgs - 1, BLOCK_N, block_m), jnp.float32, transforms=r_tf)
    scratch["red_bar"] = plgpu.Barrier(num_arrivals=wgs - 1)  # counted in warpgroups
    if blocks > 1:  # warpgroup 0 has read the partials
      scratch["red_free"] = plgpu.Barrier(num_arrivals=1)
  if fused_epilogue:
    scratch["o_smem"] = plgpu.SMEM((eg,) * share_x + (block_m, BLOCK_N), cdt, transforms=o_tf)
    out_type = jax.ShapeDtypeStruct((mp if grouped else rows, np_), cdt)
  else:
    scratch["o_smem"] = plgpu.SMEM((eg,) * share_x + (BLOCK_N, block_m), jnp.float32,
                                   transforms=o_tf)
    out_type = jax.ShapeDtypeStruct((split, np_, mp), jnp.float32)
  if n_ep:
    scratch.update(ep_smem=plgpu.SMEM((blocks * eg * n_ep, BLOCK_N), jnp.float32),
                   ep_barrier=(plgpu.Barrier(num_arrivals=n_ep * blocks, num_barriers=eg)
                               if share_x else plgpu.Barrier(num_arrivals=n_ep * blocks)))
  operands.extend(scale_rows)  # (1, Np) float32 rows (per expert when grouped)
  if has_bias:  # (1, Np) float32 row (per expert when grouped)
    bias = params.bias.astype(jnp.float32)
    if np_ != n:
      bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(0, np_ - n)])
    operands.append(bias.reshape(*bias.shape[:-1], 1, np_))
  if interpret and not mma8:  # (mma8: both operands are in SMEM already)
    scratch["a_smem"] = (plgpu.SMEM((wgs, BLOCK_N, bk), jnp.float8_e4m3fn, transforms=x_tf)
                         if fp8 else plgpu.SMEM((wgs, BLOCK_N, bk), cdt, transforms=a_tf))
  if row_scaled:
    scratch["xs_smem"] = plgpu.SMEM((block_m,), jnp.float32)
  if xs_in:
    scratch["xs_bar"] = plgpu.Barrier(num_arrivals=1)
  if in_kernel_x:  # [the codes tile], the amax pass's barriers, the warpgroups' maxima
    if quantize_x:  # (fake_quantize_x writes its values over the x tile instead)
      scratch["xq_smem"] = plgpu.SMEM((wgs, block_m, sub * bk), params.codes.dtype,
                                      transforms=xq_tf)
    scratch["xa_bars"] = plgpu.Barrier(num_arrivals=1, num_barriers=wgs * stages)
    view_rows = -(-(k_steps // wgs) // 8) * 8  # (whole 8-row groups: smem_bytes counts them)
    if row_view:  # each warpgroup's share of the row and its rows' maxima
      scratch.update(xa_smem=plgpu.SMEM((wgs, view_rows, sub * bk), xp.dtype),
                     xa_red=plgpu.SMEM((wgs, view_rows), jnp.float32))
    if wgs > 1:
      scratch["amax_bar"] = plgpu.Barrier(num_arrivals=wgs)
    if wgs > 1 and not row_view:
      scratch["amax_smem"] = plgpu.SMEM((wgs, block_m), jnp.float32)
  if zero_mma:
    scratch["ones_smem"] = plgpu.SMEM((wgs, BLOCK_N, bk), cdt, transforms=a_tf)
  out = plgpu.kernel(
      kernel, out_type=out_type,
      grid=(np_ // (BLOCK_N * eg * cl * blocks), mp // block_m, split), grid_names=("n", "m", "k"),
      # (a 3-D cluster lines up with the grid: (cl, 1, 1) groups column blocks)
      **(dict(cluster=(cl, 1, 1), cluster_names=("cn", "cm", "ck")) if cl > 1 else {}),
      num_threads=wgs, thread_name="wg", scratch_types=scratch,
      interpret=plgpu.InterpretGPUParams() if interpret else False,
  )(*operands)
  if fused_epilogue:
    if grouped:
      return out[:, :n]  # (num_tiles * block_m, N)
    return out if (rows, np_) == (m, n) else out[:m, :n]
  # One XLA fusion: split sum, transpose, scales, bias, cast.  Grouped: every row takes its
  # tile's expert's rows (kind-0 tiles' rows are garbage; the callers never read them).
  if grouped:
    y = out.sum(axis=0).T[:, :n]
    row_expert = jnp.repeat(tiles.sched.reshape(-1, 4)[:tiles.num_tiles, 0], block_m)
    row = lambda v: v.reshape(v.shape[0], -1)[row_expert, :n]  # (E, [1,] Np) -> per row
  else:
    y = out.sum(axis=0).T[:m, :n]
    row = lambda v: v.reshape(-1)[:n]
  if params.global_scale is not None:
    y = y * row(params.global_scale)
  if col:
    y = y * row(params.scales)
  if params.bias is not None:
    y = y + row(params.bias)
  return y.astype(cdt)


DIRECT_BLOCK_K = 128  # K per tile of the direct (Np, Kp) int8 layout (128-byte rows)
# run(quantize_x=True / fake_quantize_x): each pipeline step's x tile is a whole number of
# these columns (the row layout _X_ROWS that quantizes it); run takes 256 // bk K tiles per
# step for a config it resolves itself.
QUANTIZE_X_COLS = 256


def quantize_x_fits(kp: int, config: Config | None = None) -> bool:
  """Whether ``run(quantize_x=True)`` takes a direct layout of padded K ``kp`` with
  ``config`` (None: the one run resolves): pipeline steps of whole 256-column x tiles,
  warpgroups splitting K."""
  want = QUANTIZE_X_COLS // DIRECT_BLOCK_K if config is None else config.substeps
  sub = divisor(want, kp // DIRECT_BLOCK_K)
  return ((sub * DIRECT_BLOCK_K) % QUANTIZE_X_COLS == 0
          and (config is None or config.split_warpgroups != "n"))


def in_kernel_x_substeps(substeps: int, bk: int, explicit: bool) -> int:
  """K tiles per pipeline step of a launch quantizing x in the kernel: an ``explicit``
  config's as given (run checks them), else at least the 256-column x tiles' 256 // bk."""
  if explicit or substeps * bk >= QUANTIZE_X_COLS:
    return substeps
  return max(1, QUANTIZE_X_COLS // bk)


def in_kernel_act_format(spec) -> str | None:
  """The activation format :func:`run` can quantize inside the kernel for ``spec``
  (``quantize_x`` / ``fake_quantize_x``: dynamic per-token int8 or fp8 e4m3 with float32
  scales), else None."""
  if act_prepass.supports(spec) and spec.act_format.name in ACT_FORMATS.values():
    return spec.act_format.name
  return None


def fake_quantize_x_fits(params: QuantizedWeight, config: Config | None = None,
                         rows: int = 1) -> bool:
  """Whether ``run(params, x, fake_quantize_x=...)`` takes these dense params of the
  16-bit route with ``config`` (None: the one run resolves for ``rows`` rows of x):
  pipeline steps of whole 256-column x tiles, warpgroups splitting K, the decode kernel
  (not XLA's dequantize + GEMM)."""
  if params.codes.ndim != 3 or fp8_mma(params.layout):
    return False
  k_tiles, _, bk = params.codes.shape
  resolved = config or default_config(params, rows)
  want = in_kernel_x_substeps(resolved.substeps, bk, config is not None)
  return ((divisor(want, k_tiles) * bk) % QUANTIZE_X_COLS == 0
          and resolved.split_warpgroups != "n" and rows < resolved.dequant_gemm_min_m)


# run(quantize_x=True / fake_quantize_x) at one token reads the row as (Kp / 256, 256) into
# shared memory (2 Kp bytes) up to this K (timed to 14336, session 55); wider rows are
# streamed.
ROW_VIEW_MAX_K = 16384
# ... and, with RESIDENT_X, converts each warpgroup's share of it once (session 59) rather
# than every x tile in the K loop: GPU-tested on an H100 (sm_90a, as the H200), where at
# 8192^2, M = 1 it took W8A8 int8 25.43 -> 25.26 us and W4A8's opt-in in-kernel form
# 18.99 -> 17.03 (int8) / 23.36 -> 17.34 (e4m3) / 25.91 -> 19.55 (MXFP4); H200 untimed.
RESIDENT_X = True


def resident_x_enabled() -> bool:
  """:data:`RESIDENT_X`, or HUMMING_JAX_RESIDENT_X ("0" / "1") where set (read at trace
  time: one process can time both forms, ``probe_w4a8_decode --variants
  qx1+rx1,qx1+rx0``)."""
  return tuning.env_flag("HUMMING_JAX_RESIDENT_X", RESIDENT_X)


def run_direct(codes: jax.Array, x: jax.Array, col_scale: jax.Array, *, n: int,
               row_scale: jax.Array | None = None, bias: jax.Array | None = None,
               interpret: bool = False, config: Config | None = None,
               out_dtype=None, quantize_x: bool = False) -> jax.Array:
  """(M, K <= Kp) x times int8 or float8_e4m3fn codes stored (Np, Kp) -- W8A8's carrier
  layout (``w8a8.prepare``), no copy -- with a float32 (1, Np) column scale, an optional
  (M,) float32 row scale and an optional (N,) bias in the float32 epilogue:
  ``(x @ codes[:n, :K].T) * row_scale[:, None] * col_scale[:n] + bias``.

  The decode path of W8A8 int8 and fp8 (``w8a8.run_decode_mgpu``).  x is either
  - activation codes of the weights' own dtype (int8 or e4m3): an 8-bit WGMMA on both
    operands as they sit in shared memory, no conversion per weight (int8: int32 sums
    over each warpgroup's K range, added in float32; e4m3: each 128-deep K tile promoted
    to float32); output ``out_dtype`` (bf16 / fp16, default bf16); or
  - 16-bit x (bf16 / fp16; e.g. activation codes held as 16-bit values, which int8 and
    e4m3 codes are exactly): the codes converted to x.dtype in registers, products exact
    in the float32 accumulator; output in x.dtype.
  - 16-bit x with ``quantize_x`` (no ``row_scale``): x quantized per token to the codes'
    dtype inside the kernel (``run(quantize_x=True)``), then the 8-bit WGMMA as above.
  Either way the product is the W8A8 GEMM up to float32 summation, and the per-token and
  weight scales stay float32 until the one rounding to the output dtype."""
  if (codes.ndim != 2 or codes.dtype not in ACT_FORMATS or codes.shape[1] % DIRECT_BLOCK_K
      or codes.shape[0] % BLOCK_N):
    raise ValueError(f"codes: expected int8 or float8_e4m3fn (Np, Kp) with Kp a multiple "
                     f"of {DIRECT_BLOCK_K} and Np of {BLOCK_N}; got {codes.dtype} "
                     f"{codes.shape}")
  np_, kp = codes.shape
  k = x.shape[-1]
  if x.ndim != 2 or not (k <= kp and n <= np_) or col_scale.shape != (1, np_):
    raise ValueError(f"x {x.shape}, n={n}, col_scale {col_scale.shape}: expected x (M, K <= "
                     f"{kp}), n <= {np_}, col_scale (1, {np_})")
  if bias is not None and bias.shape != (n,):
    raise ValueError(f"bias.shape={bias.shape}: expected ({n},)")
  m = x.shape[0]
  if row_scale is not None and row_scale.shape not in ((m,), (m, 1)):
    raise ValueError(f"row_scale.shape={row_scale.shape}: expected ({m},) or ({m}, 1), "
                     f"one float32 scale per x row")
  view = QuantizedWeight(  # per channel: the column scale is the epilogue row
      codes=codes, scales=col_scale.astype(jnp.float32), zeros=None, global_scale=None,
      bias=bias, act_scale=None, spec=QuantSpec(ACT_FORMATS[codes.dtype], "channel", 0),
      shape=(k, n),
      layout=f"{FAMILY}:direct:b8:cs")
  return run(view, x, interpret=interpret, config=config, x_scale=row_scale,
             out_dtype=out_dtype, quantize_x=quantize_x)


def divisor(want: int, total: int) -> int:
  """The largest d <= want dividing total (configs are upper bounds, shapes decide)."""
  return max(d for d in range(1, min(want, total) + 1) if total % d == 0)


SMEM_BYTES = tuning.MOSAIC_SMEM_BUDGET
MAX_BARRIERS = 32  # mbarriers in one Mosaic GPU barrier group: warpgroups x stages


def smem_bytes(block_m: int, stages: int, substeps: int, block_k: int, bits: int,
               has_zeros: bool, out_bytes: int = 2, warpgroups: int = 1,
               ones_tile: bool = False, scale_rows: int = 1,
               column_scale: bool = False, share_x: bool = False, *, x_bytes: int = 2,
               scale_bytes: int = 2, x_scales: bool = False, column_blocks: int = 1,
               x_codes: bool = False, code_tiles: bool = True,
               x_row_view_k: int = 0) -> int:
  """Shared memory the kernel allocates: each scratch buffer rounded up to Mosaic's 1 KB
  alignment (checked against Mosaic's count in tests/test_wna16_mgpu.py).
  ``scale_rows``: scale (and zero) rows per K tile; ``column_scale``: no scale rows (the
  scale is an epilogue row); ``share_x``: warpgroups split N and share one x tile per
  slot (``MgpuConfig.split_warpgroups="n"``: no reduction buffer, an epilogue each).
  The fp8 route: ``x_bytes`` 1, ``scale_bytes`` of its scale rows, ``x_scales`` (the
  tile's row scales and their barrier).  ``column_blocks``: the epilogue rows of that many
  column blocks (MgpuConfig.column_blocks) and the barrier that releases the output tile or
  the warpgroups' partials between blocks (counted whether or not warpgroups need it).
  ``x_codes`` (``run(quantize_x=True)``): each warpgroup's 8-bit x code tile, the amax
  pass's barriers, the warpgroups' row maxima and their barrier (``code_tiles`` False:
  ``fake_quantize_x``, whose values go over the x tile: no code tile); ``x_row_view_k``: the
  padded K of its one-token row view (each warpgroup's share of the row in 8-row groups
  of 256 bf16 / fp16 values, and a float32 maximum per row), 0 without it."""
  kb = tuning.smem_round
  slots = warpgroups * stages * substeps
  view_rows = -(-(x_row_view_k // 256 // warpgroups) // 8) * 8  # (per warpgroup)
  rows = (kb(slots * scale_rows * BLOCK_N * scale_bytes) * (not column_scale)
          + kb(slots * scale_rows * BLOCK_N * 2) * has_zeros)
  x_slots = stages * substeps if share_x else slots
  eg = warpgroups if share_x else 1  # epilogues (output tiles, epilogue rows)
  return (kb(x_slots * block_m * block_k * x_bytes) + kb(slots * BLOCK_N * block_k * bits // 8)
          + (kb(block_m * 4) + 8 if x_scales else 0)
          + rows + (0 if share_x else kb((warpgroups - 1) * BLOCK_N * block_m * 4))
          + kb(eg * block_m * BLOCK_N * out_bytes)
          + kb(column_blocks * eg * 3 * BLOCK_N * 4) + 8 * (column_blocks > 1)
          + (kb(warpgroups * BLOCK_N * block_k * 2) if ones_tile else 0)
          # quantize_x: code tiles, amax-pass barriers, [maxima + barrier], and 2 KB that
          # Mosaic allocates for the row reduction (its count on the CPU lowering)
          + (kb(warpgroups * block_m * block_k * substeps) * code_tiles
             + 8 * warpgroups * stages
             + 8 * (warpgroups > 1) + 2048
             + (kb(warpgroups * view_rows * 256 * 2) + kb(warpgroups * view_rows * 4)
                if x_row_view_k else kb(warpgroups * block_m * 4) * (warpgroups > 1))
             if x_codes else 0)
          # mbarriers: pipeline (+ slot release), reduction, epilogue
          + 8 * (2 * stages + eg + 1 if share_x else warpgroups * stages + 2))


def _ones_tile(config: Config, has_zeros: bool) -> bool:
  return config.scale_after_mma and config.zero_point_mma and has_zeros


def fit_stages(config: Config, block_m: int, block_k: int, bits: int, has_zeros: bool,
               out_bytes: int = 2, scale_rows: int = 1, column_scale: bool = False,
               **x_side_bytes) -> int:
  """``config.stages``, lowered (not below 2) until the pipeline fits in shared memory
  (``x_side_bytes``: :func:`smem_bytes`' keywords of the fp8 route or of row scales)."""
  stages = config.stages
  size = lambda st: smem_bytes(block_m, st, config.substeps, block_k, bits, has_zeros,
                               out_bytes, config.warpgroups,
                               _ones_tile(config, has_zeros) and scale_rows == 1, scale_rows,
                               column_scale, config.split_warpgroups == "n", **x_side_bytes,
                               column_blocks=config.column_blocks)
  while stages > 2 and size(stages) > SMEM_BYTES:
    stages -= 1
  need = size(stages)
  if need > SMEM_BYTES:
    raise ValueError(f"config={config}: needs {need} bytes of shared memory even with 2 "
                     f"stages (limit {SMEM_BYTES}); lower block_m, substeps or warpgroups")
  return stages


def heuristic(m: int, n: int | None = None) -> Config:
  """Decode: one M tile, up to four warpgroups per CTA splitting K (``run`` lowers the
  count to what divides the K steps and fits), group scales on each K tile's float32
  partial product, no pad / slice around the launch; M <= 16 two K tiles per pipeline
  step; prefill: 128 tokens per CTA; large M: dequantize + GEMM.  (H200 sweeps
  2026-11-29, benchmarks/NOTES.md v3-v6: CUPTI kernel time at M = 1, 8192^2 int4 g128 zp
  31.8 us (v4) -> 18.6 (v5) -> 16.9 (v6: substeps 2 + scale_after_mma).)

  Narrow N (``n`` given, at most half as many 64-column CTAs as SMs): grid split-K 2, so
  the SMs the N tiles leave idle stream the other half of K (float32 partials summed by
  XLA).  NOTES.md v8, Llama-3-8B down (K 14336, N 4096) at M = 1 / 16: 25.4 / 26.9 us
  kernel -> 15.2 + 1.1 sum / 15.8 + 1.3; o_proj (4096^2) 9.6 -> 6.0 + 1.1.

  Two K tiles per step: the first tile's WGMMA is waited for after the second is
  dequantized (``overlap_mma``).  H200 session 13, CUPTI kernel µs: 8192^2 M = 16 17.1 ->
  16.4, M = 1 15.8 -> 15.8; grouped DeepSeek-V3 gate_up 1 / 64 tokens 10.32 -> 9.36 /
  196.2 -> 194.6, Qwen3-30B-A3B gate_up 1 token 11.8 -> 11.55.

  M > 64: 128-token tiles, two warpgroups splitting K (four do not fit shared memory with
  128-token tiles), scales on the float32 partials.  NOTES.md v9, 8192^2 int4 g128 zp at
  M = 128: 55.0 us kernel with one warpgroup -> 37.5 (relative error 2.3e-3 -> 4.2e-5).
  The same narrow rule on the CTAs of all M tiles: H200 session 20 (NOTES.md v22), M = 128,
  CUPTI kernel us, Llama-3-8B down (14336 -> 4096) 51.2 -> 30.8, o_proj (4096^2) 17.1 ->
  13.0; N = 28672 (448 CTAs) keeps one: 65.7 against 78.9 split."""
  narrow = lambda rows: (n is not None and 2 * -(-n // BLOCK_N) * -(-m // rows)
                         <= tuning.num_sms())
  if m <= 64:
    return Config(block_m=64, stages=4, substeps=2 if m <= 16 else 1, warpgroups=4,
                  scale_after_mma=True, overlap_mma=True, unpadded_rows=True,
                  split_k=2 if narrow(64) else 1)
  return Config(block_m=128, stages=4, warpgroups=2, scale_after_mma=True,
                split_k=2 if narrow(128) else 1)


def shared_x_config(block_m: int, warpgroups: int = 4) -> Config:
  """The launch shape to time ``split_warpgroups="n"`` with (NOTES.md v11; not a default):
  ``warpgroups`` warpgroups of 64 columns sharing each x tile.  Scales after the MMA only
  up to 64 rows: four warpgroups leave 128 registers per thread, and a 128-row tile's
  accumulator, running sum and K-tile partial would take 3 x 64 of them."""
  return Config(block_m=min(256, max(64, -(-block_m // 8) * 8)), stages=4,
                warpgroups=warpgroups, scale_after_mma=block_m <= 64 or warpgroups <= 2,
                split_warpgroups="n")


def logical_codes(params: QuantizedWeight) -> jax.Array:
  """The (Kp / bk, Np, bk) codes of this layout in K order (a ":pk" layout's permutation
  undone)."""
  if k_permuted(params.layout):
    return mgpu_convert.permute_k(params.codes)
  if fp8_mma(params.layout):
    return mgpu_convert.p8_load(params.codes)
  return params.codes


def materialized_k_order(params: QuantizedWeight) -> QuantizedWeight:
  """A ":pk" layout as the same family's K-order layout: the codes un-permuted and
  materialized (an optimization barrier), so that XLA cannot fuse the permutation into a
  later transpose of the decoded values (NOTES.md v21: 1276 us for 8192^2 that way).
  Other layouts as they are."""
  if not k_permuted(params.layout):
    return params
  codes = jax.lax.optimization_barrier(mgpu_convert.permute_k(params.codes))
  layout = ":".join(part for part in params.layout.split(":") if part != "pk")
  return params.replace(codes=codes, layout=layout)


def code_values(params: QuantizedWeight, dtype) -> jax.Array:
  """The (Kp / bk, Np, bk) codes of this layout, in K order, as values in ``dtype`` (zero
  points and scales not applied): integers as they are, fp4 e2m1 through the format's
  decode, fp8 as its values.  Exact in any float dtype that holds them (and int8 for
  integer codes).

  A ":pk" layout's permutation is undone on the codes, before the decode: that is the
  form XLA fuses into the large-M dequantization at the K order's speed (H200 session 19,
  8192^2: int4 42.9 us vs 42.3).  Undone on the values inside the dequantization's
  transpose it took 1276 us; materialized first, or as a permutation of x's columns
  instead, 40-160 us more (NOTES.md v21).  Permuted fp4 codes take the float-arithmetic
  decode: the integer one after the permutation made XLA's fusion 1263 us, this one 65.5
  (the K order's decode: 85)."""
  if k_permuted(params.layout) or fp8_mma(params.layout):
    codes = logical_codes(params)
    if params.spec.weight_format.name == FP4:
      return mgpu_convert.e2m1_from_int4_float(codes, dtype)
    return codes.astype(dtype)
  if params.spec.weight_format.name == FP4:
    # The format's decode.  XLA's native float4_e2m1fn convert of the same bits is slower
    # on the H200: the 8192^2 dequantization fusion took 122 us against this one's 82
    # (session 12, NOTES.md v14).
    return mgpu_convert.to_float_interpret(params.codes, dtype)
  return params.codes.astype(dtype)


def dequantize_prepared(params: QuantizedWeight, dtype=jnp.float32, *,
                        with_global_scale: bool = True) -> jax.Array:
  """(K, N) weights straight from the kernel layout: one XLA fusion (int4 -> float is a
  native convert), same rounding as the kernel when ``dtype`` is 16-bit and the global
  scale is left out (the kernel applies it to the float32 sum: ``with_global_scale=False``
  and multiply the product, as :func:`dequant_gemm` does for fp16 activations; for bf16 /
  float32 it folds them in: the default).  ``with_global_scale=False`` leaves column scales
  (per-channel params, :func:`column_scaled`) out too."""
  k, n = params.shape
  t, np_, bk = params.codes.shape
  c = code_values(params, dtype).transpose(0, 2, 1).reshape(t * bk, np_)  # (Kp, Np)
  rep_k = lambda r: expand_scales(r.astype(dtype), t * bk, np_)  # rows over their K
  if params.zeros is not None:
    c = c - rep_k(params.zeros)
  if column_scaled(params.spec):  # the float32 row, once on the float32 weight
    if not with_global_scale:
      return c[:k, :n]
    w = c.astype(jnp.float32) * params.scales
    if params.global_scale is not None:
      w = w * params.global_scale
    return w.astype(dtype)[:k, :n]
  if params.global_scale is not None and with_global_scale:
    # code * (s * g) in float32, rounded once: quantize.dequantize's order (NVFP4)
    s = expand_scales(params.scales.astype(jnp.float32) * params.global_scale, t * bk, np_)
    return (c.astype(jnp.float32) * s).astype(dtype)[:k, :n]
  return (c * rep_k(params.scales))[:k, :n]


def dequant_gemm(params: QuantizedWeight, x: jax.Array) -> jax.Array:
  """Large M (compute bound): dequantize to the activation dtype, then XLA's GEMM.

  bf16 / float32 activations: every scale is folded into the weights (code x scale x
  global scale in float32, rounded once to x's dtype: quantize.dequantize's order), so
  without a bias the GEMM writes x's dtype itself.  The cost is the bf16 rounding of the
  scaled weight (2**-9 relative), the error class the group-scaled formats' route already
  has.
  Applying a global scale (NVFP4) or column scales to a float32 product instead made
  cuBLAS write float32 and added an elementwise pass: NVFP4 8192^2 at M = 4096 ran 105 us
  of kernels above MXFP4 on the H100 (session 47; NOTES.md session 48).
  fp16 activations keep those scales on the float32 product, as in the kernel's epilogue:
  fp16's range cannot hold every scaled weight (below 6e-5 it loses bits)."""
  if x.dtype != jnp.float16:
    return launch.gemm_dequantized(x, functools.partial(dequantize_prepared, params),
                                   params.bias, highest_f32=True)
  g = None if params.global_scale is None else params.global_scale[0, 0]
  if column_scaled(params.spec):
    n = params.shape[1]
    g = params.scales[0, :n] if g is None else g * params.scales[0, :n]
  return launch.gemm_dequantized(
      x, functools.partial(dequantize_prepared, params, with_global_scale=False),
      params.bias, highest_f32=True, out_scale=g)


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=3, supports=supports_carried, prepare=prepare,
    to_canonical=to_canonical, run=run, priority=_PRIORITY, priority_for=_priority,
    # float32, then one rounding (registry.dequantize's contract): the 16-bit form above
    # rounds the scales to dtype first, as the kernel does, not as the canonical values
    dequantize=lambda params, dtype: dequantize_prepared(params, jnp.float32).astype(dtype)))
