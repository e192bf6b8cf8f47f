"""Quantized-activation specs (W8A8, W4A8, W4A4) on the Mosaic WnA16 kernel, for decode.

At small M a GEMM streams its weights: the time is the weight bytes over the bandwidth,
whatever the activations' format, so the 8-bit tensor cores buy nothing there.  The
Pallas-Triton W8A8 kernel, which unpacks 4-bit weights to 8 bits per tile, took 50.8-52.9 us
for W4A8 MXFP4 at 8192^2, M = 16 (benchmarks/NOTES_w8a8.md, session 2). The Mosaic WnA16
kernel reads the same weights in 22-23 us (benchmarks/NOTES.md v10). That breaks issue 4's
"W4A8 never slower than W4A16 of the same weights".

How: the spec's own activation quantization (``quantize.fake_quantize_activations``, what
the reference runs), rounded once to x's 16-bit dtype, then ``wna16_mgpu.run`` on the
weight half of the spec in that kernel's layout.  The error against the reference (exact
integer / fp8 products) is that one rounding of ``code * scale``: ~2**-9 relative per
activation for bf16 (at most 2**-8), the error class of WnA16 itself.  M >= ``dequant_gemm_min_m``:
``wna16_mgpu.run`` takes XLA's dequantize + GEMM in the activation dtype, slower than the
W8A8 family's 8-bit Mosaic GEMM at prefill (NOTES_w8a8.md).

Status (session 10): interpreter-tested against the reference and the W8A8 family; lowers
for the H200.  Not timed on a GPU, so opt-in: ``hj.prepare(p, kernel="wnam_mgpu")``.  The
default for these specs stays the W8A8 family until ``gpu_session_next.sh`` times it.
Specs the W8A8 family refuses (no 8-bit carrier: zero-point weights with quantized
activations, e5m2 activations, int8 weights with fp8 activations, activation groups that do
not nest in the weight groups) have only this kernel; until its GPU tests pass it is
fenced for them on the GPU (``gpu_known_bad``: ``backend=None`` computes them with XLA as
before) and runs them in the interpreter.  Making it the default below M = 512 for the
presets needs a dispatch by M inside one family and one layout for both paths (the W8A8
family keeps 4-bit weights in the Triton slab layout): not designed yet.
"""
from __future__ import annotations

import jax

from humming_jax.kernels import registry, wna16_mgpu
from humming_jax.quantize import QuantizedWeight, fake_quantize_activations
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
  """The WnA16 kernel's own fences, and (until their GPU test passes) the specs only this
  family runs."""
  from humming_jax.kernels import w8a8  # noqa: PLC0415 - registration order
  if (why := wna16_mgpu.KERNEL.gpu_known_bad(weight_spec(spec))) is not None:
    return why
  if not w8a8.supports(spec):
    return (f"spec {spec.name}: no 8-bit carrier, so only the {FAMILY} kernel runs it, and "
            f"that path has not run on a GPU yet (tests/test_wnam_mgpu.py::test_decode_gpu)")
  return None


def _view(params: QuantizedWeight, layout: str) -> QuantizedWeight:
  """The same arrays as WnA16 params of ``layout`` (no activation scale)."""
  return params.replace(spec=weight_spec(params.spec), act_scale=None, layout=layout)


def _renamed(layout: str, family: str) -> str:
  return family + layout[layout.index(":"):]


def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical params -> the WnA16 Mosaic layout of their weights (the activation scale of
  a static spec kept as it is)."""
  if (why := unsupported_reason(params.spec)) is not None:
    raise ValueError(f"spec {params.spec.name}: not supported by the {FAMILY} kernel ({why})")
  out = wna16_mgpu.prepare(_view(params, "canonical"))
  return out.replace(spec=params.spec, act_scale=params.act_scale,
                     layout=_renamed(out.layout, FAMILY))


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare` (bit-exact)."""
  out = wna16_mgpu.to_canonical(_view(prepared, _renamed(prepared.layout, wna16_mgpu.FAMILY)))
  return out.replace(spec=prepared.spec, act_scale=prepared.act_scale)


def run(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
        config: wna16_mgpu.Config | None = None) -> jax.Array:
  """(M, K) float activations x prepared params -> (M, N) in x.dtype: the activations
  quantized as the spec says and rounded to x.dtype, times the weights on the WnA16 kernel."""
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params; call "
                     f"hj.prepare(params, kernel={FAMILY!r}) first")
  k, n = params.shape
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (M, K={k}); got shape {x.shape}")
  if x.shape[0] == 0:
    return jax.numpy.zeros((0, n), x.dtype)
  xq = fake_quantize_activations(x, params.spec, params.act_scale).astype(x.dtype)
  return wna16_mgpu.run(_view(params, _renamed(params.layout, wna16_mgpu.FAMILY)), xq,
                        interpret=interpret, config=config)


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, priority=-1, gpu_known_bad=gpu_known_bad))
