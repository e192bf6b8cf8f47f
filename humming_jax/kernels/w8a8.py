"""W8A8 / W4A8 / W4A4: GEMMs on 8-bit tensor cores (Pallas-Triton), activations quantized.

``y = A_deq @ W_deq + bias`` where the activations are quantized per token / per tensor
(static or dynamic) / per (token, K group) and the weights per channel / per group /
per 2-D block.  Both operands reach the tensor cores as 8-bit values:

  int act  (int8, int4):        int8 x int8 -> int32   (weights int1..8, exact in int8)
  fp act   (fp8 e4m3, fp4 e2m1): e4m3 x e4m3 -> float32 (weights whose values are exact
                                  in e4m3: fp8 e4m3, fp4 e2m1, fp6, int2..4)

Weight layouts (``prepare``, once):
  8-bit weights: "direct" -- the codes as the carrier dtype, transposed to (N, K) so the
    tensor-core B operand is K-major (what Hopper's 8-bit MMA wants; a (K, N) fp8 operand
    costs a shuffle through registers).  No unpacking at all.
  < 8-bit weights: the slab layout of layout.py, prepared by wna16.prepare (shared code):
    each slab is unpacked with shift + mask and decoded with the format's own decode
    (formats.py), then cast to int8 / e4m3 (exact) and fed to the dot.

Scales:
  * per channel / per tensor weight scale and per token / per tensor act scale: one
    low-precision accumulation over the whole K (int32 for int8: |sum| < 127*127*K fits for
    K < 133k), all scales in the epilogue.
  * K-group scales (weight groups, 2-D blocks, activation groups): the partial product of
    each group ``pg`` (the smaller of the two group sizes) is scaled before it is added:
    ``acc += dot(a_g, w_g) * (sa[:, g] * sw[g, :])`` (DeepSeek-style).
  * groups smaller than 32 with float compute (NVFP4, group 16): an 8-bit MMA needs K >= 32,
    so both scales are folded into the operands instead ("fold": a*sa and w*sw rounded to
    bf16, bf16 MMA).  Exact for power-of-two (e8m0) scales; for NVFP4 the folded operand is
    rounded to bf16 (relative 2**-9, far below the format's own error).
Activation quantization: by default a pre-pass (kernels/act_quant.py; XLA fusion);
``fuse_act_quant=True`` quantizes inside the kernel prologue instead (per-token dynamic or
static per-tensor scales), kept for the measurement in benchmarks/NOTES_w8a8.md.

The XLA reference beside it is kernels/reference.py::dense_reference.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl

from humming_jax import packing
from humming_jax.kernels import act_prepass, act_quant, launch, registry, tuning, w8a8_mgpu, wna16
from humming_jax.kernels import wna16_mgpu
from humming_jax.kernels import layout as lay
from humming_jax.formats import get_format
from humming_jax.quantize import (QuantizedWeight, carrier_dtype, expand_scales, scale_block,
                                  unpacked_codes)
from humming_jax.spec import QuantSpec

FAMILY = "w8a8"
K_ALIGN = 256  # direct layout: K padded to a multiple of this (and of the scale group)
N_ALIGN = 64
MIN_MMA_K = 32  # smallest K of an 8-bit MMA (Hopper wgmma / mma.sync k32)


# ----------------------------------------------------------------------------------------
# What runs how
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Plan:
  """Static facts about a spec that shape the kernel."""

  int_compute: bool  # int8 x int8 -> int32, else e4m3 x e4m3 -> f32
  direct: bool  # 8-bit weights in the (N, K) carrier layout, else slab layout
  w_group: int  # K rows per weight scale row (0: one scale row, applied in the epilogue)
  a_group: int  # K columns per act scale column (0: per token / tensor, epilogue)
  fold: bool  # scales folded into bf16 operands (groups < MIN_MMA_K)

  @property
  def pg(self) -> int:
    """K rows per scaled partial product (0: no per-group scaling)."""
    gs = [g for g in (self.w_group, self.a_group) if g]
    return min(gs) if gs else 0


def _exact_in_e4m3(fmt) -> bool:
  vals = fmt.all_values()
  vals = vals[np.isfinite(vals)]
  return bool(np.all(vals.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) == vals))


def plan_for(spec: QuantSpec) -> Plan | None:
  """How ``spec`` maps onto the kernel, or None if no 8-bit tensor-core path computes it
  exactly."""
  if spec.act is None or spec.zero_point:
    return None
  w, a = spec.weight_format, spec.act_format
  if a.is_integer:
    if w.kind != "int" or w.bits > 8:
      return None
    int_compute = True
  else:
    if a.name not in ("fp8_e4m3", "fp4_e2m1") or not _exact_in_e4m3(w):
      return None
    int_compute = False
  direct = w.bits == 8
  w_group = spec.group_size if spec.granularity in ("group", "block") else 0
  a_group = spec.act_group_size if spec.act_granularity == "group" else 0
  gs = [g for g in (w_group, a_group) if g]
  if gs and max(gs) % min(gs):
    return None  # the two groupings must nest
  pg = min(gs) if gs else 0
  fold = bool(pg) and pg < MIN_MMA_K
  if fold and (int_compute or direct):
    return None  # no exact bf16 fold for int8 values; 8-bit small groups: not a preset
  if not direct and pg:
    slab = wna16.slab_layout(spec, 0).slab
    if pg % slab or wna16.slab_layout(spec, 0).block_k % pg:
      return None
  return Plan(int_compute, direct, w_group, a_group, fold)


def supports(spec: QuantSpec) -> bool:
  return plan_for(spec) is not None


def _carrier(spec: QuantSpec):
  return jnp.int8 if spec.act_format.is_integer else jnp.float8_e4m3fn


def _direct(layout: str) -> bool:
  """Whether a layout of this family is the direct (N, K) carrier layout of 8-bit codes
  (else the slab layout)."""
  return layout.split(":")[1] == "direct"


def dequantize_prepared(params: QuantizedWeight, dtype=jnp.float32) -> jax.Array:
  """(K, N) weights in ``dtype`` straight from either layout of this family: the slab
  layout through ``wna16``'s reader, the direct (N, K) carrier codes as their values times
  the decoded scale rows (``quantize.decode_scales``' order: s * global, one rounding)."""
  if not _direct(params.layout):
    return wna16.dequantize_prepared(params).astype(dtype)
  spec = params.spec
  k, n = params.shape
  s = wna16._decode_scale_row(params.scales, spec)  # (rows, Np): 1 or Kp / group
  if params.global_scale is not None:
    s = s * params.global_scale.astype(jnp.float32)
  vals = params.codes[:n, :k].T.astype(jnp.float32)  # int8 / fp8 carriers hold the values
  np_, kp = params.codes.shape
  return (vals * expand_scales(s, kp, np_)[:k, :n]).astype(dtype)


# ----------------------------------------------------------------------------------------
# Transform: canonical -> kernel layout (once)
# ----------------------------------------------------------------------------------------
def _direct_k(spec: QuantSpec, k: int) -> int:
  align = K_ALIGN
  if spec.granularity in ("group", "block"):
    align = math.lcm(align, spec.group_size)
  return -(-k // align) * align


def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical params -> kernel layout: 8-bit codes as (N, K) carrier values, narrower
  codes in the slab layout (wna16.prepare)."""
  spec = params.spec
  plan = plan_for(spec)
  if plan is None:
    raise ValueError(f"spec {spec.name}: no W8A8 kernel path")
  if params.num_experts is not None:
    raise ValueError("stacked experts: use the grouped (MoE) kernels")
  if not plan.direct:
    p = wna16.prepare(params)
    return p.replace(layout=FAMILY + p.layout[p.layout.index(":"):])
  k, n = params.shape
  kp, np_ = _direct_k(spec, k), -(-n // N_ALIGN) * N_ALIGN
  codes = jax.lax.bitcast_convert_type(unpacked_codes(params), _carrier(spec))
  codes = jnp.pad(codes.T, ((0, np_ - n), (0, kp - k)))
  scales = wna16._kernel_scales(params, kp, np_)  # shared: same scale layout as WnA16
  return params.replace(codes=codes, scales=scales, layout=f"{FAMILY}:direct:b8:n{N_ALIGN}")


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare`."""
  if not _direct(prepared.layout):
    return wna16.to_canonical(prepared)
  spec = prepared.spec
  k, n = prepared.shape
  codes = jax.lax.bitcast_convert_type(prepared.codes[:n, :k].T, jnp.uint8)
  bk, bn = scale_block(spec, k, n)
  s = prepared.scales[:k // bk, :n:bn]
  if spec.scale_dtype == "fp8_e4m3":
    s = jax.lax.bitcast_convert_type(s, jnp.float8_e4m3fn)
  return prepared.replace(codes=packing.pack_codes(codes, 8), scales=s, layout="canonical")


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------
def _round_to_carrier(v: jax.Array, spec: QuantSpec) -> jax.Array:
  """Scaled activations -> carrier values (the _FAST_ROUND rules of quantize.py)."""
  fmt = spec.act_format
  if fmt.is_integer:
    # Pallas-Triton has no lowering for lax.round: round half to even from floor (the
    # adder trick (v + 1.5*2**23) - 1.5*2**23 is folded away by XLA's simplifier).
    # Clipping first is fine: the bounds are integers.
    v = jnp.clip(v, fmt.min_value, fmt.max_value)
    f = jnp.floor(v)
    d = v - f
    odd = (f - 2.0 * jnp.floor(f * 0.5)) != 0
    return jnp.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f).astype(jnp.int8)
  return jnp.clip(v, -fmt.max_value, fmt.max_value).astype(jnp.float8_e4m3fn)


def accumulate(acc: jax.Array, *, spec: QuantSpec, plan: Plan, lt: lay.SlabLayout | None,
               block_k: int, first_tile, num_tiles: int, load_a, load_sa_col, load_w,
               load_words, load_sw_row) -> jax.Array:
  """The K loop shared by the dense and the grouped (MoE) kernels: ``num_tiles`` K tiles
  from ``first_tile``, each as one or more 8-bit MMAs with the K-group scales applied to
  the partial products (or folded into bf16 operands for groups < 32).  Returns the
  (block_m, block_n) float32 accumulator before the epilogue scales.

  Loaders (the kernels' only difference): ``load_a(k0, size)`` activation carrier values;
  ``load_sa_col(c)`` the (block_m, 1) activation scales of K group c; ``load_w(k0, size)``
  an (N, K) chunk of direct 8-bit codes; ``load_words(row, n)`` slab words;
  ``load_sw_row(r)`` the (1, block_n) raw weight-scale row r."""
  fmt = spec.weight_format
  pg = plan.pg
  dot_t = jnp.int32 if plan.int_compute else jnp.float32
  carrier = jnp.int8 if plan.int_compute else jnp.float8_e4m3fn

  def decode_w(code):
    """Unpacked slab codes -> exact values in the compute dtype."""
    if plan.int_compute:  # offset binary (wna16.prepare): unsigned minus 2**(b-1)
      return (code.astype(jnp.int32) - (1 << (fmt.bits - 1))).astype(jnp.int8)
    return wna16.decode_codes(code, None, fmt)

  def group_scale(k0):
    """(block_m, block_n)-broadcastable scale of the K group starting at k0."""
    sc = None
    if plan.a_group:
      sc = load_sa_col(k0 // plan.a_group)
    if plan.w_group:
      sw = wna16._decode_scale_row(load_sw_row(k0 // plan.w_group), spec)
      sc = sw if sc is None else sc * sw
    return sc

  def chunks(t):
    """(static offset in the tile, size, weight-chunk thunk) for each MMA of K tile t;
    direct weight chunks are (N, K), slab chunks (K, N)."""
    base = t * block_k
    out = []
    if plan.direct:
      size = pg if pg else block_k
      for off in range(0, block_k, size):
        out.append((off, size, lambda off=off, size=size: load_w(base + off, size)))
    else:
      words = {}
      for s in range(lt.num_slabs):
        out.append((s * lt.slab, lt.slab,
                    lambda s=s, words=words: decode_w(
                        wna16.unpack_slab(load_words, lt, t, s, words))))
    return out

  def mma(a, w):
    if plan.direct:  # w is (N, K): contract K with K (K-major B operand)
      return jax.lax.dot_general(a, w, (((1,), (1,)), ((), ())), preferred_element_type=dot_t)
    return jnp.dot(a, w.astype(a.dtype), preferred_element_type=dot_t)

  def tile(t_local, acc):
    t = first_tile + t_local
    gacc = None
    base = t * block_k
    for off, size, w_fn in chunks(t):
      k0 = base + off
      a = load_a(k0, size)
      if plan.fold:  # scales into the operands, bf16 MMA (groups < 32)
        sc_a = load_sa_col(k0 // plan.a_group) if plan.a_group else 1.0
        af = (a.astype(jnp.float32) * sc_a).astype(jnp.bfloat16)
        wf = w_fn().astype(jnp.float32)
        if plan.w_group:
          wf = wf * wna16._decode_scale_row(load_sw_row(k0 // plan.w_group), spec)
        acc = acc + jnp.dot(af, wf.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
        continue
      w = w_fn()
      part = mma(a, w if plan.direct else w.astype(carrier))
      if not pg:
        acc = acc + part
        continue
      gacc = part if gacc is None else gacc + part
      if (off + size) % pg == 0:  # end of a scale group (tiles start on a group boundary)
        acc = acc + gacc.astype(jnp.float32) * group_scale(base + off + size - pg)
        gacc = None
    return acc

  return jax.lax.fori_loop(0, num_tiles, tile, acc).astype(jnp.float32)


def acc_dtype(plan: Plan):
  """int32 for one int8 accumulation over the whole K (no K-group scales), else float32."""
  return jnp.int32 if (plan.int_compute and not plan.pg) else jnp.float32


def _kernel(*refs, spec: QuantSpec, plan: Plan, lt: lay.SlabLayout | None, block_k: int,
            tiles_per_split: int, has_s2: bool, has_bias: bool, split_k: int,
            fuse: str | None):
  a_ref, sa_ref, w_ref, sw_ref, *rest = refs
  s2_ref = rest.pop(0) if has_s2 else None
  bias_ref = rest.pop(0) if has_bias else None
  (o_ref,) = rest
  block_m = a_ref.shape[0]
  block_n = w_ref.shape[0] if plan.direct else w_ref.shape[1]
  split = pl.program_id(2)

  # Fused activation quantization: the row scale needs the whole row's amax first.
  fused_scale = None
  if fuse == "token":
    def amax_step(t, am):
      xs = a_ref[:, pl.ds(t * block_k, block_k)].astype(jnp.float32)
      return jnp.maximum(am, jnp.max(jnp.abs(xs), axis=1, keepdims=True))
    amax = jax.lax.fori_loop(0, a_ref.shape[1] // block_k, amax_step,
                             jnp.zeros((block_m, 1), jnp.float32))
    fused_scale = jnp.where(amax > 0, amax / spec.act_format.max_value, 1.0)
  elif fuse == "tensor":
    fused_scale = sa_ref[...]

  def load_a(k0, size):
    if fuse is None:
      return a_ref[:, pl.ds(k0, size)]
    return _round_to_carrier(a_ref[:, pl.ds(k0, size)].astype(jnp.float32) / fused_scale,
                             spec)

  acc = accumulate(
      jnp.zeros((block_m, block_n), acc_dtype(plan)), spec=spec, plan=plan, lt=lt,
      block_k=block_k, first_tile=split * tiles_per_split, num_tiles=tiles_per_split,
      load_a=load_a, load_sa_col=lambda c: sa_ref[:, pl.ds(c, 1)],
      load_w=lambda k0, size: w_ref[:, pl.ds(k0, size)],
      load_words=lambda r, n: w_ref[pl.ds(r, n), :],
      load_sw_row=lambda r: sw_ref[pl.ds(r, 1), :])
  # Epilogue: the scales that do not vary along K.
  if not plan.a_group:
    acc = acc * (fused_scale if fuse == "token" else sa_ref[...])
  if not plan.w_group:
    acc = acc * wna16._decode_scale_row(sw_ref[...], spec)
  launch.store_output(acc, o_ref, s2_ref=s2_ref, bias_ref=bias_ref, split_k=split_k)


def heuristic(m: int, np_: int, k_tiles: int, plan: Plan) -> tuning.TuningConfig:
  """Small M: bound by weight bytes, same spreading as WnA16.  Large M: MMA bound, big
  square tiles, 8 warps, deep pipeline."""
  if m <= 64:
    return tuning.wna16_heuristic(m, np_, k_tiles, sms=tuning.num_sms())
  if m <= 256:
    return tuning.TuningConfig(64, 128 if np_ % 128 == 0 else 64, 1, num_warps=4,
                               num_stages=4)
  # int8 x slab weights with 3 stages asked Triton for 270336 bytes of shared memory on the
  # H200 (limit 232448; w4a8-int8, M = 4096): two stages there (not re-measured yet).
  stages = 4 if plan.direct else (2 if plan.int_compute else 3)
  return tuning.TuningConfig(128, 128 if np_ % 128 == 0 else 64, 1, num_warps=8,
                             num_stages=stages)


# ----------------------------------------------------------------------------------------
# Large M on 4-bit weights with K-group scales: dequantize both operands + XLA's GEMM
# ----------------------------------------------------------------------------------------
# The kernel scales each K group's fp8 partial product before adding it; at M = 4096 with
# MXFP4 weights (group 32) that measured 40 ms per 8192^2 layer on the H200 (2026-11-29,
# benchmarks/NOTES_w8a8.md), 50x the bf16 GEMM.  When every dequantized operand value
# (code x its K-group scale) is a bfloat16 number -- or is the bf16 operand the kernel
# itself forms (NVFP4's fold) -- XLA's bf16 GEMM with float32 accumulation computes the
# same products; per-token / per-tensor scales, the global scale and the bias stay in
# float32 after the GEMM, as in the kernel's epilogue.
DEQUANT_GEMM_MIN_M = 512

def _scale_bits(scale_dtype: str) -> int:
  """Significant bits of a scale dtype: a JAX float's mantissa + 1, or the format's."""
  if scale_dtype in ("bfloat16", "float16", "float32"):
    return jnp.finfo(scale_dtype).nmant + 1
  return get_format(scale_dtype).significant_bits  # e8m0, fp8_e4m3


def dequant_gemm_exact(spec: QuantSpec, plan: Plan) -> bool:
  """Whether the large-M route computes the kernel's numbers: slab (< 8-bit) weights with
  K-group scales and float compute, where either both operands are exact in bfloat16 once
  their K-group scales are applied (significant bits of value + scale <= 8: MXFP4 weights,
  fp8 / MX activations), or the kernel itself folds the scales into bfloat16 operands
  (groups < 32: NVFP4), which the route forms the same way.  Int4 codes x bf16 scales
  (11 bits) are neither."""
  if plan.direct or plan.int_compute or not plan.pg:
    return False
  if plan.fold:
    return True
  w_bits = spec.weight_format.significant_bits + _scale_bits(spec.scale_dtype)
  a_bits = spec.act_format.significant_bits
  if plan.a_group:
    a_bits += _scale_bits(spec.act_scale_dtype)
  return w_bits <= 8 and a_bits <= 8


def _global_scale(params: QuantizedWeight) -> jax.Array | None:
  """The per-tensor global scale (NVFP4) as a float32 scalar: this family stores a scalar,
  the WnA16 Mosaic layout (``wnam_mgpu`` params) a (1, Np) row of that value."""
  g = params.global_scale
  return None if g is None else g.astype(jnp.float32).reshape(-1)[0]


def dequant_gemm(params: QuantizedWeight, x: jax.Array, weights=None) -> jax.Array:
  """The large-M route (see :func:`dequant_gemm_exact`): activations quantized exactly as
  for the kernel, both operands dequantized to bfloat16, XLA's GEMM, float32 epilogue --
  none for group-scaled activations (W4A4) with bf16 x and no bias: there the global scale
  goes into the weights and the GEMM writes bf16.

  ``weights``: the (K, N) float32 dequantized weights without the global scale, when the
  params are in another family's layout (``wnam_mgpu``); default: from this family's slab."""
  spec = params.spec
  plan = plan_for(spec)
  if plan is None or not dequant_gemm_exact(spec, plan):
    raise ValueError(f"spec {spec.name}: dequantized operands are not exact in bfloat16 "
                     f"(weight={spec.weight!r}, scale_dtype={spec.scale_dtype!r}); the "
                     f"kernel computes it")
  # Straight from the slab layout (no re-packing); the global scale comes after the GEMM
  # (or, below, into the weights).
  w = wna16.dequantize_prepared(params.replace(global_scale=None)) if weights is None \
      else weights
  qa = act_quant.quantize(x, spec, params.act_scale)
  a = qa.values.astype(jnp.float32)
  if plan.a_group:  # group scales into the operand (exact, or the kernel's fold)
    a = qa.dequantize()
  s2 = _global_scale(params)
  # Nothing per row to apply (W4A4, bf16 x, no bias): the global scale (NVFP4) folds into
  # the weights in float32, rounded once to bf16 (2**-9 on a weight, far below the fp4
  # activations' own error), and the GEMM writes bf16 itself -- no float32 product and
  # elementwise pass (the WnA16 route's same fold: NVFP4 8192^2, M = 4096, -64 us of
  # kernels on an H100, NOTES.md session 48).  Without a global scale (MXFP4) the numbers
  # are unchanged.
  bf16_out = plan.a_group and params.bias is None and x.dtype == jnp.bfloat16
  if bf16_out and s2 is not None:
    w, s2 = w * s2, None
  y = jnp.dot(a.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
              preferred_element_type=jnp.bfloat16 if bf16_out else jnp.float32)
  if not plan.a_group:  # per token (M, 1) or per tensor (1, 1)
    y = y * qa.scales
  if s2 is not None:
    y = y * s2
  if params.bias is not None:
    y = y + params.bias
  return y.astype(x.dtype)


def kernel_dims(params: QuantizedWeight, plan: Plan, block_k: int | None = None
                ) -> tuple[lay.SlabLayout | None, int, int, int]:
  """(slab layout or None, K per loop step, padded K, padded N) of prepared params (dense
  or stacked experts: the last two code axes)."""
  if plan.direct:  # (..., Np, Kp) carrier codes
    np_, kp = params.codes.shape[-2:]
    bk = block_k or max(128, plan.pg)
    if bk % max(plan.pg, 1) or kp % bk:
      raise ValueError(f"block_k={bk} must divide the padded K={kp} and be a multiple of "
                       f"the scale group {plan.pg}")
    return None, bk, kp, np_
  _, lt = lay.parse_layout_name(params.layout)
  if block_k not in (None, lt.block_k):
    raise ValueError(f"block_k={block_k}: the slab layout fixes it to {lt.block_k}")
  rows, np_ = params.codes.shape[-2:]
  return lt, lt.block_k, lt.k_of_rows(rows), np_


# The one-pass Pallas-Triton pre-pass (kernels/act_prepass.py) for per-token specs at
# prefill, instead of XLA's fusions (amax, a select, then scale and convert).  H200 session 18
# (call 6), 8192^2 per layer, same run: W8A8 fp8 437.5 -> 426.4 us at M = 4096, int8
# 414.1 -> 395.0; W4A8 MXFP4 467.7 -> 441.5 and 166.1 -> 151.1 at M = 1024 (the pre-pass
# 60.6 -> 32.5 us, 16.7 -> 9.3).
FUSED_PREPASS = True
FUSED_PREPASS_MIN_M = 512


def fused_prepass_applies(x: jax.Array, spec: QuantSpec, kp: int, *,
                          interpret: bool = False) -> bool:
  """Whether the pre-pass of ``x`` into a (rows, ``kp``) operand takes the one-pass kernel
  (``act_prepass.quantize_rows``): FUSED_PREPASS, a per-token spec it supports, 16-bit x
  of at least FUSED_PREPASS_MIN_M rows, ``kp`` a multiple of 128, on the GPU (not the
  interpreter: see :func:`act_operands`).  The W8A8 family's dense pre-pass and the
  fp8-MMA layout's (``wnam_mgpu.fp8_operands``: the grouped route, and the dense one where
  a config, explicit or cached, runs it at 512+ rows) ask here."""
  return (FUSED_PREPASS and not interpret and x.shape[0] >= FUSED_PREPASS_MIN_M
          and kp % 128 == 0 and act_prepass.supports(spec)
          and x.dtype in (jnp.bfloat16, jnp.float16))


def act_operands(x: jax.Array, spec: QuantSpec, plan: Plan, act_scale, *, rows: int,
                 kp: int, per_row: bool | None = None, interpret: bool = False,
                 values_dtype=None) -> tuple[jax.Array, jax.Array]:
  """The pre-pass: activations quantized to the carrier dtype, padded to (rows, kp), and
  their float32 scales, padded to ``rows`` (when ``per_row``; default: more than one scale
  row) by (K groups or 1) columns with 1.0.  The values feed kernel operands only
  (``act_quant.kernel_operand``: fp8 through one convert).  With FUSED_PREPASS, per-token
  specs from M = FUSED_PREPASS_MIN_M take the one-pass kernel on the GPU.  ``interpret``
  (the CPU interpreter) keeps XLA's pre-pass -- the kernel's values in the interpreter
  (on the H200 <= 1e-4 of codes may be one step apart): with the interpreted kernel ahead
  of the interpreted Mosaic GEMM, a route test hung in CI (session 18, cause not found;
  NOTES.md v20).  The kernel's own interpreter tests call it directly.  ``values_dtype``
  (bf16 / fp16): the codes' values in that dtype, for a 16-bit-operand kernel (XLA's
  pre-pass)."""
  m, k = x.shape
  if (per_row is not False and values_dtype is None
      and fused_prepass_applies(x, spec, kp, interpret=interpret)):
    return act_prepass.quantize_rows(x, spec, rows=rows, kp=kp)
  qa = act_quant.kernel_operand(x, spec, act_scale, rows=rows, kp=kp,
                                values_dtype=values_dtype)
  a, sa = qa.values, qa.scales
  per_row = sa.shape[0] > 1 if per_row is None else per_row
  cols = kp // plan.a_group if plan.a_group else 1
  sa = jnp.pad(sa, ((0, (rows if per_row else 1) - sa.shape[0]), (0, cols - sa.shape[1])),
               constant_values=1.0)
  return a, sa


def _check_x(x: jax.Array, k: int) -> None:
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x.shape={x.shape}: expected (M, {k}) activations for these params")


def mgpu_runs(params: QuantizedWeight) -> bool:
  """Whether the Mosaic GPU kernel (kernels/w8a8_mgpu.py) computes these prepared params:
  no zero point, K-group scales (weight groups / blocks, activation groups) absent or of
  exactly one pipeline step (128), padded N a multiple of 128.  8-bit weights are read as
  they are; narrower weights (W4A8 int4 g128) are unpacked to 8-bit once per call."""
  plan = plan_for(params.spec)
  if plan is None or plan.fold or params.num_experts is not None:
    return False
  if any(g not in (0, w8a8_mgpu.Config.tile_k) for g in (plan.w_group, plan.a_group)):
    return False
  _, _, _, np_ = kernel_dims(params, plan)
  return np_ % 128 == 0


def _mgpu_weights(params: QuantizedWeight, plan: Plan, words_first: bool = False
                  ) -> jax.Array:
  """(Np, Kp) 8-bit carrier codes: the direct layout as stored, or slab codes unpacked and
  decoded (exact: int4 values in int8 / e4m3, fp4 / fp6 values in e4m3) -- XLA work per
  call beside the compute-bound GEMM it feeds (87-89 us at 8192^2 on the H200).

  ``words_first``: transpose the packed words, then unpack along K
  (``SlabLayout.unpack(transposed=True)``) -- fewer bytes through the transpose, the same
  codes (w8a8_mgpu.Config.unpack_words_first)."""
  if plan.direct:
    return params.codes
  _, lt = lay.parse_layout_name(params.layout)
  fmt = params.spec.weight_format
  if words_first:
    return _carrier_values(lt.unpack(params.codes, transposed=True), plan, fmt)
  return _carrier_values(lt.unpack(params.codes), plan, fmt).T  # (Kp, Np) -> (Np, Kp)


def _carrier_values(codes: jax.Array, plan: Plan, fmt) -> jax.Array:
  """Unsigned slab codes -> exact 8-bit carrier values (int8, or e4m3 for float formats)."""
  if plan.int_compute:  # offset binary (wna16.prepare): unsigned minus 2**(b-1)
    return (codes.astype(jnp.int32) - (1 << (fmt.bits - 1))).astype(jnp.int8)
  return wna16.decode_codes(codes, None, fmt).astype(jnp.float8_e4m3fn)


def run_mgpu(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
             config: w8a8_mgpu.Config | None = None) -> jax.Array:
  """Large M on Hopper: the activation pre-pass, then the Mosaic GPU 8-bit WGMMA GEMM:
  K-group scales on each 128-deep K step's partial product, per-token / per-channel /
  global scales and the bias in the epilogue."""
  spec = params.spec
  if not mgpu_runs(params):
    raise ValueError(f"spec {spec.name} / layout {params.layout!r}: the Mosaic W8A8 kernel "
                     f"needs no zero point, K-group scales of 128 (or none) and N padded "
                     f"to 128")
  plan = plan_for(spec)
  _check_x(x, params.shape[0])
  if x.dtype not in w8a8_mgpu.OUT_DTYPES:
    raise ValueError(f"x.dtype={x.dtype}: the Mosaic W8A8 kernel writes bfloat16 or float16 "
                     f"(float32 activations: w8a8.run, which takes the Triton kernel)")
  _, _, kp, np_ = kernel_dims(params, plan)
  return gemm_8bit(
      x, params, lambda config: _mgpu_weights(params, plan, config.unpack_words_first),
      wna16._decode_scale_row(params.scales, spec), kp=kp, np_=np_, config=config,
      interpret=interpret)


def gemm_8bit(x: jax.Array, params: QuantizedWeight, weights, w_scales: jax.Array, *,
              kp: int, np_: int, config: w8a8_mgpu.Config | None = None,
              interpret: bool = False) -> jax.Array:
  """The activation pre-pass and the Mosaic 8-bit GEMM, whatever layout the weights come
  from (:func:`run_mgpu`: this family's; ``wnam_mgpu``: the WnA16 Mosaic layout).

  ``weights(config)``: the (Np, Kp) 8-bit carrier codes; ``w_scales``: float32 weight
  scales, (K groups, Np) or one (1, Np) row; ``params``: spec, shape, act_scale, bias and
  the global scale (a scalar or a (1, Np) row)."""
  spec = params.spec
  plan = plan_for(spec)
  n = params.shape[1]
  m = x.shape[0]
  grouped = bool(plan.pg)
  config = config or w8a8_mgpu.heuristic(m, np_, grouped, kp,
                                         int8=_carrier(spec) == jnp.int8)
  if grouped and config.tile_k != plan.pg:
    raise ValueError(f"config.tile_k={config.tile_k}: must equal the K-group size {plan.pg} "
                     f"of spec {spec.name} (one group per WGMMA step)")
  mp = -(-m // config.cta_m) * config.cta_m
  a, sa = act_operands(x, spec, plan, params.act_scale, rows=mp, kp=kp, interpret=interpret)
  row_scale = row_groups = col_scale = col_groups = None
  if plan.a_group:  # (mp, K groups) -> one row per K step
    row_groups = jnp.broadcast_to(sa, (mp, sa.shape[1])).T
  else:  # per token, or the tensor's
    row_scale = jnp.broadcast_to(sa, (mp, 1)).reshape(mp)
  if plan.w_group:
    col_groups = w_scales[:kp // plan.w_group]
  else:
    col_scale = w_scales.reshape(np_)
  if (s2 := _global_scale(params)) is not None:
    col_scale = jnp.full((np_,), s2) if col_scale is None else col_scale * s2
  bias = None
  if params.bias is not None:
    bias = jnp.pad(params.bias.astype(jnp.float32), (0, np_ - n))
  y = w8a8_mgpu.gemm(a, weights(config), row_scale, col_scale, bias,
                     out_dtype=x.dtype, row_group_scale=row_groups,
                     col_group_scale=col_groups, config=config, interpret=interpret)
  return y if (mp, np_) == (m, n) else y[:m, :n]


# M up to which `run` takes `run_decode_mgpu` (W8A8 int8 / fp8, per channel x per token or
# tensor).  Session 8 kept it off on H200 walls (host-bound: 25.3 / 25.0 against 23.1 /
# 25.8 us).  Session 51 (NOTES.md), by CUPTI device time on two H100s, 8192^2, after the
# per-token scale moved into the kernel's epilogue: 4.7-9.6 % less than the Triton W8A8
# kernel at every point (int8 per token M = 1: 29.8 against 32.3 us; fp8 30.5 against
# 33.6 at M = 16), and one output rounding; the one-launch per-token codes then took ~1.6
# us more off (M = 1).  Not timed on an H200.  (Its product since session 52: DECODE_MMA8.)
DECODE_MGPU_MAX_M = 16
# run_decode_mgpu's product: an 8-bit WGMMA on the activation codes and the stored codes
# straight from shared memory (True), or the codes as 16-bit operands, each weight
# converted in registers (False; HUMMING_JAX_DECODE_MMA8=0 at trace time).  Session 52
# (NOTES.md), CUPTI device time per 8192^2 layer on two H100s, one process each: the
# GEMM kernel 23.8-24.8 us against 25.2-26.8 (int8 / fp8, M = 1 / 16, per token and
# static), the layer 26.3-27.4 against 27.6-29.6 (Triton W8A8: 32.5-33.7).  Error against
# the reference: int8 unchanged; fp8 6.7e-4-7.3e-4 where the 16-bit product had
# <= 8.6e-5 (Hopper's fp8 accumulator within each 128-deep K tile; the prefill
# fp8 kernel sums all of K in it: 3e-3).  H200 (one process): GEMM 17.9-18.4 us against
# 19.3-20.4, layer 20.2-21.0 against 21.8-23.2 (Triton 25.5-26.5).
DECODE_MMA8 = True
# int8 / e4m3 per-token activations quantized inside the decode kernel (wna16_mgpu.run's
# quantize_x: each CTA reads the rows for their amax, then converts each x tile to codes)
# instead of the pre-pass launch (act_prepass), on the GPU up to this many rows.
# Session 55 (NOTES.md), CUPTI kernel time per layer on H100s, both forms in one process:
# one token (each warpgroup's share of the row in one TMA, in flight beside the first
# stages) int8 24.5 / 25.4 us against 25.7-26.6 with the pre-pass at 8192^2 and 23.8-24.5
# against 26.3-27.0 at 14336 -> 4096, fp8 25.3 against 26.9 and 24.4 against 26.9; 16
# rows (the rows streamed through the x slots before the pipeline's x tiles) int8
# 31.4-31.5 against 26.7 and 34.9-35.1 against 27.2-27.3: off there.
# HUMMING_JAX_DECODE_QUANTIZE_X=1 / 0 at trace time (or run_decode_mgpu's quantize_x)
# forces it on (any M the route takes) or off; the interpreter keeps XLA's pre-pass by
# default, as for the pre-pass launch.
DECODE_QUANTIZE_X_MAX_M = 1


def quantizes_x_in_kernel(spec: QuantSpec, kp: int,
                          config: wna16_mgpu.Config | None = None) -> bool:
  """Whether the decode kernel can quantize this spec's activations itself: dynamic
  per-token int8 or fp8 e4m3 with float32 scales, x tiles of 256 columns (the padded K a
  multiple of 256, pipeline steps of a multiple of 256 columns), the warpgroups
  splitting K."""
  return (wna16_mgpu.in_kernel_act_format(spec) is not None
          and wna16_mgpu.quantize_x_fits(kp, config))


def decode_quantizes_x(m: int, kp: int, interpret: bool, *, by_default: bool = True) -> bool:
  """The decode routes' choice of quantizing activations inside the kernel (W8A8's
  ``quantize_x``, W4A8's ``fake_quantize_x`` on ``wnam_mgpu``), where the spec and launch
  allow it: HUMMING_JAX_DECODE_QUANTIZE_X if set, else (``by_default``: the route's own
  default) on the GPU up to :data:`DECODE_QUANTIZE_X_MAX_M` rows and padded K up to
  ``wna16_mgpu.ROW_VIEW_MAX_K`` (the one-token form reads the row whole)."""
  return tuning.env_flag("HUMMING_JAX_DECODE_QUANTIZE_X",
                         by_default and not interpret and m <= DECODE_QUANTIZE_X_MAX_M
                         and kp <= wna16_mgpu.ROW_VIEW_MAX_K)


def _decode_carrier(spec: QuantSpec):
  """The 8-bit dtype of the decode route's activation codes (int8 or e4m3), else None."""
  carrier = jnp.dtype(carrier_dtype(spec.act_format))
  return carrier if carrier in (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn)) else None


def decode_mgpu_runs(params: QuantizedWeight) -> bool:
  """Whether :func:`run_decode_mgpu` computes these prepared params: int8 x int8 or e4m3
  x e4m3 with per-channel (or tensor) weight scales and per-token (or tensor) activation
  scales, the direct (N, K) layout, one weight matrix."""
  plan = plan_for(params.spec)
  # the stored codes are the activations' own carrier (int8 x int8, e4m3 x e4m3): the
  # kernel's 8-bit WGMMA, or 16-bit operands exact for both
  eight_bit = plan is not None and params.codes.dtype == _decode_carrier(params.spec)
  return (eight_bit and plan.direct and not plan.w_group
          and not plan.a_group and params.num_experts is None
          and registry.layout_family(params.layout) == FAMILY)


def run_decode_mgpu(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
                    config: wna16_mgpu.Config | None = None,
                    quantize_x: bool | None = None) -> jax.Array:
  """W8A8 int8 / fp8 at decode on the Mosaic WnA16 kernel (Hopper, or the interpreter).

  The activations are quantized by the pre-pass as in :func:`run`, and
  ``wna16_mgpu.run_direct`` multiplies their codes with the stored (N, K) codes: by
  default (:data:`DECODE_MMA8`) as an 8-bit WGMMA on both operands as they sit in shared
  memory (int8: int32 sums; e4m3: each 128-deep K tile promoted to float32), or
  with ``HUMMING_JAX_DECODE_MMA8=0`` as 16-bit operands (the codes are exact in bf16 /
  fp16, the products exact in float32), each weight converted in registers.  Either way
  it is the 8-bit GEMM up to float32 summation.  The activation scale (per token or
  tensor), the weight scale and the bias are applied in the kernel's float32 epilogue,
  and the output is rounded once, to x.dtype.

  ``quantize_x``: int8 / e4m3 per-token activations quantized inside the GEMM kernel (no
  pre-pass launch) where :func:`quantizes_x_in_kernel` allows, the codes and scales of
  ``quantize_activations`` (bit for bit in the interpreter); elsewhere the pre-pass as
  above.  Default: HUMMING_JAX_DECODE_QUANTIZE_X if set, else on the GPU up to
  :data:`DECODE_QUANTIZE_X_MAX_M` rows and K up to ``wna16_mgpu.ROW_VIEW_MAX_K``."""
  if not decode_mgpu_runs(params):
    raise ValueError(f"spec {params.spec.name} / layout {params.layout!r}: run_decode_mgpu "
                     f"takes int8 x int8 or e4m3 x e4m3 specs with per-channel or tensor "
                     f"weight scales and per-token or tensor activation scales, prepared "
                     f"by w8a8.prepare")
  spec = params.spec
  k, n = params.shape
  _check_x(x, k)
  if x.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"x.dtype={x.dtype}: expected bfloat16 or float16")
  np_, kp = params.codes.shape
  m = x.shape[0]
  mma8 = tuning.env_flag("HUMMING_JAX_DECODE_MMA8", DECODE_MMA8)
  # The codes written once, as the 8-bit carrier (mma8) or as x.dtype values (no convert
  # pass): per token on the GPU by one launch, else XLA's pre-pass (row amax, scale,
  # quantize: three launches).  K padded: XLA's (its pad is in the same pass).
  codes_dtype = _decode_carrier(spec) if mma8 else x.dtype  # (= params.codes.dtype)
  if quantize_x is None:
    quantize_x = decode_quantizes_x(m, kp, interpret)
  col = wna16._decode_scale_row(params.scales, spec)  # (1, Np) float32
  if (s2 := _global_scale(params)) is not None:
    col = col * s2
  if quantize_x and mma8 and quantizes_x_in_kernel(spec, kp, config):
    return wna16_mgpu.run_direct(params.codes, x, col, n=n, bias=params.bias,
                                 interpret=interpret, config=config, out_dtype=x.dtype,
                                 quantize_x=True)
  if kp == k and act_prepass.decode_launch_applies(x, spec, interpret=interpret):
    a, sa = act_prepass.decode_codes_rows(x, spec, codes_dtype=codes_dtype)
  else:
    a, sa = act_operands(x, spec, plan_for(spec), params.act_scale, rows=m, kp=kp,
                         interpret=interpret, values_dtype=None if mma8 else x.dtype)
  row_scale = None
  if spec.act_granularity == "token":
    row_scale = sa.reshape(m)  # (M, 1): the pre-pass ran on the M rows, unpadded
  else:  # one activation scale: a factor of the column row
    col = col * sa.reshape(())
  # Before the scales the sums reach ~127 * 127 * K; they stay in the int32 / float32
  # accumulators until the epilogue has scaled them (so 16-bit codes cannot overflow fp16).
  return wna16_mgpu.run_direct(params.codes, a, col, n=n,
                               row_scale=row_scale, bias=params.bias, interpret=interpret,
                               config=config, out_dtype=x.dtype if mma8 else None)


def run(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
        config: tuning.TuningConfig | None = None, block_k: int | None = None,
        fuse_act_quant: bool = False) -> jax.Array:
  """(M, K) float activations x prepared params -> (M, N) in x.dtype.

  ``block_k`` (8-bit weights only): K rows per pipelined loop iteration (default 128, or
  the scale group if larger).  ``fuse_act_quant``: quantize the activations inside the
  kernel (per-token dynamic or static per-tensor specs) instead of in a pre-pass.
  Without an explicit ``config`` / ``block_k``, M >= ``DEQUANT_GEMM_MIN_M`` on weights
  whose dequantized values are bfloat16 numbers (MXFP4, NVFP4) runs :func:`dequant_gemm`
  instead, and M >= ``w8a8_mgpu.MIN_M`` with bf16 / fp16 activations on the specs of
  :func:`mgpu_runs` (w8a8-int8, w8a8-fp8 and their static variants, w8a8-fp8-block,
  w4a8-int8, w4a8-fp8) the Mosaic GPU kernel (:func:`run_mgpu`; Hopper or the
  interpreter), and M <= ``DECODE_MGPU_MAX_M`` with 16-bit activations on the specs of
  :func:`decode_mgpu_runs` (int8 / fp8 e4m3 with per-channel weight scales) the Mosaic
  WnA16 decode kernel (:func:`run_decode_mgpu`; Hopper or the interpreter).  Everything
  else runs this module's Pallas-Triton kernel."""
  spec = params.spec
  plan = plan_for(spec)
  if plan is None:
    raise ValueError(f"spec {spec.name}: no W8A8 kernel path")
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params; call "
                     f"w8a8.prepare (or hj.prepare(params, kernel={FAMILY!r})) first")
  k, n = params.shape
  _check_x(x, k)
  m = x.shape[0]
  if (config is None and block_k is None and m >= DEQUANT_GEMM_MIN_M and not fuse_act_quant
      and dequant_gemm_exact(spec, plan)):
    return dequant_gemm(params, x)
  if (config is None and block_k is None and not fuse_act_quant and m >= w8a8_mgpu.MIN_M
      and x.dtype in w8a8_mgpu.OUT_DTYPES and mgpu_runs(params)
      and (interpret or tuning.is_hopper())):
    return run_mgpu(params, x, interpret=interpret)
  if (config is None and block_k is None and not fuse_act_quant and m <= DECODE_MGPU_MAX_M
      and x.dtype in (jnp.bfloat16, jnp.float16) and decode_mgpu_runs(params)
      and (interpret or tuning.is_hopper())):
    return run_decode_mgpu(params, x, interpret=interpret)
  lt, bk, kp, np_ = kernel_dims(params, plan, block_k)
  k_tiles = kp // bk
  if config is None:
    key = tuning.cache_key(FAMILY, spec.name, tuning.bucket_m(m), n, k, tuning.device_kind())
    config = tuning.cached_config(key) or heuristic(m, np_, k_tiles, plan)
  block_m = config.block_m
  mp = -(-m // block_m) * block_m
  block_n = min(config.block_n, np_)
  while np_ % block_n:
    block_n //= 2
  split_k = config.split_k if k_tiles % config.split_k == 0 else 1

  fuse = None
  if fuse_act_quant:
    if spec.act_granularity == "token" and spec.act_scale_dtype == "float32":
      fuse = "token"
    elif spec.act_static:
      fuse = "tensor"
    else:
      raise ValueError(f"fuse_act_quant=True needs per-token (float32 scale) or static "
                       f"activation scales; spec {spec.name} has "
                       f"act_granularity={spec.act_granularity!r}")
  if fuse is None:
    a, sa = act_operands(x, spec, plan, params.act_scale, rows=mp, kp=kp,
                         interpret=interpret)
  else:
    a = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    sa = (jnp.asarray(params.act_scale, jnp.float32).reshape(1, 1) if fuse == "tensor"
          else jnp.ones((1, 1), jnp.float32))  # unused placeholder for "token"
  has_s2 = params.global_scale is not None
  has_bias = params.bias is not None and split_k == 1

  n_spec = lambda rows: pl.BlockSpec((rows, block_n), lambda i, j, s: (0, j))
  sa_spec = (pl.BlockSpec((block_m, sa.shape[1]), lambda i, j, s: (i, 0)) if sa.shape[0] > 1
             else pl.BlockSpec(sa.shape, lambda i, j, s: (0, 0)))
  w_spec = (pl.BlockSpec((block_n, kp), lambda i, j, s: (j, 0)) if plan.direct
            else n_spec(params.codes.shape[0]))
  operands = [a, sa, params.codes, params.scales]
  in_specs = [pl.BlockSpec((block_m, kp), lambda i, j, s: (i, 0)), sa_spec, w_spec,
              n_spec(params.scales.shape[0])]
  extra, extra_specs = launch.epilogue_operands(params, n, np_, n_spec, with_bias=has_bias)
  operands += extra
  in_specs += extra_specs
  kernel = functools.partial(
      _kernel, spec=spec, plan=plan, lt=lt, block_k=bk, tiles_per_split=k_tiles // split_k,
      has_s2=has_s2, has_bias=has_bias, split_k=split_k, fuse=fuse)
  return launch.launch_dense(
      kernel, operands, in_specs, mp=mp, np_=np_, m=m, n=n, block_m=block_m,
      block_n=block_n, split_k=split_k, out_dtype=x.dtype, bias=params.bias, config=config,
      interpret=interpret, name=f"w8a8_{spec.weight}_{spec.act}")


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=2, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, dequantize=dequantize_prepared))
