"""Quantized-activation specs (W4A8, W4A4, W8A8) of stacked experts on the Mosaic grouped
WnA16 kernel: the grouped form of ``wnam_mgpu``'s decode path.

fp4 weights in scale groups of 32 or more with e4m3 activations per token or per tensor
(W4A8 MXFP4; :func:`fp8_mma`) take the fp8-MMA layout (``wna16_mgpu.prepare(mma="fp8")``): the
activations as e4m3 codes and row scales (``quantize.kernel_activations``), the e2m1
codes as e4m3 WGMMA operands, each scale group's float32 partial scaled apart, the row
scales in the epilogue (error 1.7e-4-2.9e-4 against the reference on the H200, session
20; DeepSeek-V3 gate_up at 64 tokens 212.9 -> 159.8 us, NOTES_moe.md).  Every other spec:
the spec's own activation quantization (``quantize.fake_quantize_activations``, what the
reference runs; row-wise for per-token specs, so the rows' order by expert does not
matter; on the GPU the one-launch form, ``wnam_mgpu.decode_activations``) is rounded once
to x's 16-bit dtype, then ``grouped_wna16_mgpu.run`` computes the
weight half of the spec in that kernel's stacked layout.  The error against the reference
is that rounding of ``code x scale``: the class of the dense family (H200: 2.0e-3-2.7e-3;
here 2.5e-3-2.6e-3 in session 16, against the Triton W8A8 family's 8e-4, which keeps
``code x scale`` in float32; the fp8 route above keeps it in float32 too).

Why this family and not the 8-bit GEMMs: at MoE decode a grouped GEMM streams the active
experts' weights, so what counts is the per-weight work in registers (the fp8 route: ~0.9
integer ops per weight, on fp8 tensor cores).  H200 session 16 (NOTES_moe.md), W4A8 MXFP4 x fp8, walls of a resident
chain of 8 layers at 1 / 16 / 64 tokens: DeepSeek-V3 gate_up 23.1 / 117.5 / 221.6 us here
against 124.4 / 293.3 / 527.8 on the Pallas-Triton grouped W8A8 family, down 21.5 / 80.0 /
170.0 against 23.7 / 139.5 / 286.0 (Humming's W4A8: 16.7 / 57.7 / 115.8 and 18.3 / 74.5 /
139.2).  So for 4-bit weights (W4A8, W4A4) this family outranks ``grouped_w8a8``; 8-bit
weights (W8A8) stay there or on XLA (:func:`priority_for`), untimed here.  It is also the
default for the 4-bit specs no other grouped family takes (static activation scales,
zero-point weights, e5m2 activations: XLA before).  bf16 / fp16 tokens only: a float32
model's experts re-lay out per call to the Triton W8A8 family -- prepare those with
``kernel="grouped_w8a8"``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from humming_jax.kernels import grouped_wna16_mgpu, registry, tuning, wna16_mgpu
from humming_jax.kernels.wnam_mgpu import (decode_activations, family_view, fp8_mma_applies,
                                           fp8_operands, renamed, weight_spec, weight_view)
from humming_jax.quantize import QuantizedWeight
from humming_jax.spec import QuantSpec

FAMILY = "grouped_wnam_mgpu"


def supports(spec: QuantSpec) -> bool:
  """The spec quantizes activations and the Mosaic grouped kernel takes its weights."""
  return spec.act is not None and grouped_wna16_mgpu.supports(weight_spec(spec))


def fp8_mma(spec: QuantSpec) -> bool:
  """Whether :func:`prepare` lays ``spec`` out for fp8 WGMMA (``wna16_mgpu``'s ":p8"
  layout): e4m3 activations with one scale per row or per tensor, and fp4 weights in
  scale groups of 32 or more (``wna16_mgpu.fp8_mma_reason``) -- e.g. W4A8 MXFP4 --,
  unless HUMMING_JAX_FP8_MMA=0 (the 16-bit route: activations rounded to x's dtype)."""
  return fp8_mma_applies(spec) and tuning.env_flag("HUMMING_JAX_FP8_MMA", True)


def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical stacked (E, K, N) params -> the Mosaic grouped layout of their weights (the
  spec and a static spec's activation scale kept): the fp8-MMA layout where
  :func:`fp8_mma` says so, else 4-bit codes in the permuted K order
  (``wna16_mgpu.permutes``), as dense ``wnam_mgpu``'s.  Eagerly (concrete weights), e8m0
  scales that span at most 11 binades per column also mark the layout ":cf"
  (``wna16_mgpu.mark_column_fold``): tiles of 24
  rows and more then run with one accumulator (``Config.fp8_single_acc``; 15-28 % faster
  at the benchmark shapes, ``grouped_wna16_mgpu.SINGLE_ACC_MIN_ROWS``); under ``jax.jit``
  the check cannot run and the per-group route is taken."""
  if not supports(params.spec):
    raise ValueError(f"spec {params.spec.name}: not supported by the {FAMILY} kernel "
                     f"(activation-quantized specs whose weights the "
                     f"{grouped_wna16_mgpu.FAMILY} kernel takes)")
  out = grouped_wna16_mgpu.prepare(weight_view(params, "canonical"),
                                   mma="fp8" if fp8_mma(params.spec) else "bf16")
  out = wna16_mgpu.mark_column_fold(out)  # ":cf": the one-accumulator tiles may run
  return out.replace(spec=params.spec, act_scale=params.act_scale,
                     layout=renamed(out.layout, FAMILY))


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare` (bit-exact)."""
  view = family_view(prepared, grouped_wna16_mgpu.FAMILY)
  out = grouped_wna16_mgpu.to_canonical(view)
  return out.replace(spec=prepared.spec, act_scale=prepared.act_scale)


def run(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
        interpret: bool = False, config=None, block_m: int | None = None) -> jax.Array:
  """(M, K) bf16 / fp16 rows sorted by expert x prepared stacked params -> (M, N): the
  activations quantized as the spec says, then the grouped WnA16 kernel (``config`` /
  ``block_m`` as in ``grouped_wna16_mgpu.run``) -- on the fp8-MMA layout with the e4m3
  codes and their row scales, else rounded to x.dtype."""
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params; call "
                     f"hj.prepare(params, grouped=True, kernel={FAMILY!r}) first")
  if x.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"x.dtype={x.dtype}: the {FAMILY} kernel takes bfloat16 / float16 "
                     f"tokens")
  e, k, n = params.shape
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (M, K={k}); got shape {x.shape}")
  if x.shape[0] == 0:
    return jnp.zeros((0, n), x.dtype)
  if wna16_mgpu.fp8_mma(params.layout):
    codes, x_scale = fp8_operands(x, params, interpret=interpret)
    return run_quantized(params, codes, x_scale, group_sizes, out_dtype=x.dtype,
                         interpret=interpret, config=config, block_m=block_m)
  view = family_view(params, grouped_wna16_mgpu.FAMILY)
  return grouped_wna16_mgpu.run(view, decode_activations(x, params, interpret=interpret),
                                group_sizes, interpret=interpret, config=config,
                                block_m=block_m)


def quantizes_rows_alone(params: QuantizedWeight) -> bool:
  """Whether ``params`` take :func:`run_quantized`'s operands (the fp8-MMA layout) from
  activations whose codes and scale of a row depend on that row alone (per-token or
  static scales): then quantizing the tokens before a row gather gives the gathered rows'
  own operands (``moe.quant_moe`` does so; bit for bit where both take the same pre-pass,
  ``wnam_mgpu.fp8_operands``)."""
  spec = params.spec
  return (registry.layout_family(params.layout) == FAMILY
          and wna16_mgpu.fp8_mma(params.layout)
          and (spec.act_granularity == "token" or spec.act_static))


def run_quantized(params: QuantizedWeight, codes: jax.Array, x_scale: jax.Array,
                  group_sizes: jax.Array, *, out_dtype=jnp.bfloat16,
                  interpret: bool = False, config=None, block_m: int | None = None
                  ) -> jax.Array:
  """:func:`run` on activations already quantized for the fp8-MMA layout: (M, K)
  float8_e4m3fn ``codes`` and (M,) float32 row scales ``x_scale`` (``fp8_operands``'
  outputs, e.g. computed per token and then gathered into expert order), rows sorted by
  expert -> (M, N) in ``out_dtype`` (bfloat16 / float16)."""
  if registry.layout_family(params.layout) != FAMILY or not wna16_mgpu.fp8_mma(params.layout):
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:...:p8 params "
                     f"(the fp8-MMA layout; grouped_wnam_mgpu.fp8_mma says which specs)")
  e, k, n = params.shape
  if codes.ndim != 2 or codes.shape[1] != k or codes.dtype != jnp.float8_e4m3fn:
    raise ValueError(f"codes must be (M, K={k}) float8_e4m3fn; got {codes.shape} "
                     f"{codes.dtype}")
  if x_scale.shape != codes.shape[:1] or x_scale.dtype != jnp.float32:
    raise ValueError(f"x_scale must be (M={codes.shape[0]},) float32; got {x_scale.shape} "
                     f"{x_scale.dtype}")
  view = family_view(params, grouped_wna16_mgpu.FAMILY)
  return grouped_wna16_mgpu.run(view, codes, group_sizes, interpret=interpret,
                                config=config, block_m=block_m, x_scale=x_scale,
                                out_dtype=out_dtype)


def priority_for(spec: QuantSpec, shape: tuple[int, ...]) -> int | None:
  """Above ``grouped_w8a8`` (0) for weights of 4 bits or fewer (the session-16 H200 times,
  module docstring); never the default for 8-bit weights (untimed here; the specs
  ``grouped_w8a8`` refuses -- static scales, int8 x fp8, zero points -- keep XLA), which
  ``kernel=FAMILY`` still prepares."""
  del shape
  return 1 if spec.weight_format.bits <= 4 else None


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=4, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, grouped=True, priority=-2, priority_for=priority_for,
    x_dtypes=("bfloat16", "float16"),
    dequantize=lambda params, dtype: grouped_wna16_mgpu.KERNEL.dequantize(
        family_view(params, grouped_wna16_mgpu.FAMILY), dtype)))
