"""Quantized-activation specs (W4A8, W4A4, W8A8) of stacked experts on the Mosaic grouped
WnA16 kernel: the grouped form of ``wnam_mgpu``'s decode path.

The spec's own activation quantization (``quantize.fake_quantize_activations``, what the
reference runs; row-wise for per-token specs, so the rows' order by expert does not
matter) is rounded once to x's 16-bit dtype, then ``grouped_wna16_mgpu.run`` computes the
weight half of the spec in that kernel's stacked layout.  The error against the reference
is that rounding of ``code x scale``: the class of the dense family (H200: 2.0e-3-2.7e-3).

Why: at MoE decode a grouped GEMM streams the active experts' weights, so 8-bit tensor
cores buy nothing.  The Pallas-Triton grouped W8A8 family (``grouped_w8a8``, the default
for the specs it takes) ran W4A8 MXFP4 at 0.42x / 0.58x Humming's W4A8 at DeepSeek-V3
down, 1 / 16 tokens (NOTES_moe.md session 3).  The Mosaic grouped WnA16 kernel runs int4
/ MXFP4 weights at DeepSeek-V3 gate_up (K 7168) in 10.6 / 13.2 us of kernels at 1 token
(session 15); with short K (DeepSeek-V3 down, K 256) it lost to the Triton WnA16 kernel at
decode in session 8 (23.5 vs 16.6 us), so the down projections are the open question.

Opt-in (``registry.DenseKernel.opt_in``): never the default choice, also for the specs no
other grouped family takes (static activation scales, zero-point weights, e5m2
activations: XLA there); ``hj.prepare(q, grouped=True, kernel="grouped_wnam_mgpu")`` asks
for it.  Built in session 15 after its device time: interpreter tests check it against
the reference and it lowers for the H200, but it is not GPU-run yet; the queued H200 step
times it beside the Triton family and Humming.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from humming_jax.kernels import grouped_wna16_mgpu, registry
from humming_jax.kernels.wnam_mgpu import renamed, weight_spec, weight_view
from humming_jax.quantize import QuantizedWeight, fake_quantize_activations
from humming_jax.spec import QuantSpec

FAMILY = "grouped_wnam_mgpu"


def supports(spec: QuantSpec) -> bool:
  """The spec quantizes activations and the Mosaic grouped kernel takes its weights."""
  return spec.act is not None and grouped_wna16_mgpu.supports(weight_spec(spec))


def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical stacked (E, K, N) params -> the Mosaic grouped layout of their weights (the
  spec and a static spec's activation scale kept)."""
  if not supports(params.spec):
    raise ValueError(f"spec {params.spec.name}: not supported by the {FAMILY} kernel "
                     f"(activation-quantized specs whose weights the "
                     f"{grouped_wna16_mgpu.FAMILY} kernel takes)")
  out = grouped_wna16_mgpu.prepare(weight_view(params, "canonical"))
  return out.replace(spec=params.spec, act_scale=params.act_scale,
                     layout=renamed(out.layout, FAMILY))


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare` (bit-exact)."""
  view = weight_view(prepared, renamed(prepared.layout, grouped_wna16_mgpu.FAMILY))
  out = grouped_wna16_mgpu.to_canonical(view)
  return out.replace(spec=prepared.spec, act_scale=prepared.act_scale)


def run(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
        interpret: bool = False, config=None, block_m: int | None = None) -> jax.Array:
  """(M, K) bf16 / fp16 rows sorted by expert x prepared stacked params -> (M, N): the
  activations quantized as the spec says and rounded to x.dtype, then the grouped WnA16
  kernel (``config`` / ``block_m`` as in ``grouped_wna16_mgpu.run``)."""
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
  xq = fake_quantize_activations(x, params.spec, params.act_scale).astype(x.dtype)
  view = weight_view(params, renamed(params.layout, grouped_wna16_mgpu.FAMILY))
  return grouped_wna16_mgpu.run(view, xq, group_sizes, interpret=interpret, config=config,
                                block_m=block_m)


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, grouped=True, priority=-2,
    x_dtypes=("bfloat16", "float16"), opt_in=True))
