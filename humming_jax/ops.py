"""Public compute entry points: validate, pick the backend and the kernel, run.

Backends
  ``"pallas"``    the Pallas GPU kernels (error if none exists for the spec: never a silent
                  fallback).
  ``"interpret"`` the same Pallas kernels run by the Pallas interpreter (CPU; what CI tests).
  ``"xla"``       kernels/reference.py: dequantize + dot; the oracle and the CPU fallback.
  ``None``        ``"pallas"`` on a GPU when a kernel exists for the spec, else ``"xla"``.
"""
from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp

from humming_jax import autodiff
from humming_jax.quantize import QuantizedWeight, check_params, stacked_layers
from humming_jax.kernels import reference, registry

Backend = Literal["pallas", "interpret", "xla"] | None
BACKENDS = ("pallas", "interpret", "xla")


def on_gpu() -> bool:
  try:
    return jax.default_backend() == "gpu"
  except RuntimeError:
    return False


def resolve_backend(backend: Backend, spec, *, grouped: bool = False, x_dtype=None,
                    kernel: registry.DenseKernel | None = None) -> str:
  """The concrete backend for ``spec`` (and activations of ``x_dtype`` when given: with
  ``backend=None``, XLA when no kernel takes that dtype); raises for a kernel backend
  without a kernel.  ``kernel``: the family that would run (params prepared for a family
  other than the default: its GPU fences apply); default: the registry's choice."""
  if backend is not None and backend not in BACKENDS:
    raise ValueError(f"backend={backend!r}; expected one of {BACKENDS} or None")
  if kernel is None:
    kernel = registry.find(spec, grouped=grouped, x_dtype=x_dtype)
  if backend is None:
    if on_gpu() and kernel is not None and kernel.gpu_known_bad(spec) is None:
      return "pallas"
    return "xla"
  if backend in ("pallas", "interpret") and kernel is None:
    kind = "grouped (MoE)" if grouped else "dense"
    dt = "" if x_dtype is None else f" and x.dtype={jnp.dtype(x_dtype).name}"
    raise ValueError(f"backend={backend!r}: no Pallas {kind} kernel for spec {spec.name}{dt}; "
                     "use backend='xla' (the reference path) for this spec")
  if backend == "pallas" and (reason := kernel.gpu_known_bad(spec)) is not None:
    raise ValueError(f"backend='pallas': the {kernel.name} kernel is known to disagree with "
                     f"the reference on the GPU for spec {spec.name} ({reason}); use "
                     "backend='xla' for this spec")
  if backend == "pallas" and not on_gpu():
    raise ValueError("backend='pallas' needs a GPU (jax.default_backend() is "
                     f"{jax.default_backend()!r}); use backend='interpret' to run the Pallas "
                     "kernels on the CPU, or 'xla'")
  return backend


def prepare(params: QuantizedWeight, *, grouped: bool = False,
            kernel: str | None = None) -> QuantizedWeight:
  """Transform canonical params into the kernel layout once (pad, permute, interleave).

  ``quant_dense`` accepts canonical params too and prepares them inside the call, which
  costs a re-layout of the codes (about one extra read+write of the weight bytes) per
  call; prepare once and keep the result to avoid it.

  ``kernel``: a registered family name (``"wna16"``, ``"wna16_mgpu"``, ``"w8a8"``,
  ``"wnam_mgpu"`` -- quantized-activation specs on the WnA16 kernel, for decode; grouped:
  ``"grouped_wna16"``, ``"grouped_wna16_mgpu"``, ``"grouped_w8a8"``,
  ``"grouped_wnam_mgpu"`` -- quantized-activation experts on the Mosaic grouped WnA16
  kernel, the default for 4-bit weights) to prepare for instead of the default choice for
  this spec and shape; the params then run on that family.  E.g. the Triton grouped
  kernel (``"grouped_wna16"``) for float32 models (below), or the Mosaic one
  (``"grouped_wna16_mgpu"``) for stacks of K below 256, which take Triton by default (the
  two untimed side by side there; docs/moe.md).  The default for stacked experts with
  K >= 256 is the Mosaic kernel, and for W4A8 / W4A4 experts ``grouped_wnam_mgpu``; both
  take bf16 / fp16 tokens: float32 tokens then run a Pallas-Triton grouped kernel after a
  re-layout inside every call -- prepare with ``kernel="grouped_wna16"`` (or
  ``"grouped_w8a8"``) for float32 models.

  Call it eagerly (not under ``jax.jit``) for W4A8 MXFP4 experts: a check of the concrete
  e8m0 scales (every column's within 11 binades) marks the layout ``:cf``, which lets
  prefill-sized expert tiles run with one accumulator (~20 % faster at Mixtral sizes,
  docs/moe.md); traced scales cannot be checked and keep the per-group route."""
  if not isinstance(params, QuantizedWeight):
    raise TypeError(f"prepare: params must be a QuantizedWeight (from hj.quantize); got "
                    f"{type(params).__name__}")
  check_params(params, "prepare: params")
  if kernel is not None:
    chosen = registry.by_name(kernel, grouped=grouped)
    if not chosen.supports(params.spec):
      raise ValueError(f"kernel={kernel!r} does not run spec {params.spec.name} on this "
                       f"device (its formats, group sizes and GPU: docs/wna16.md)")
  else:
    chosen = registry.find(params.spec, grouped=grouped, shape=params.shape)
    if chosen is None:
      raise ValueError(f"no Pallas kernel for spec {params.spec.name}: nothing to prepare")
  return in_layout_of(chosen, params)


def in_layout_of(kernel: registry.DenseKernel, params: QuantizedWeight) -> QuantizedWeight:
  """``params`` in ``kernel``'s layout: as they are when already there, else re-laid out
  from the canonical layout (a full pass over the codes: prepare time, or per call for
  params that were not prepared for this kernel).  An ``input_perm`` rides along: the
  kernels never see it (``quant_dense`` gathers x instead)."""
  if registry.layout_family(params.layout) == kernel.layout:
    return params
  return registry.carrying_input_perm(
      lambda p: kernel.prepare(registry.to_canonical(p)), params)


def kernel_for(params: QuantizedWeight, *, grouped: bool = False,
               x_dtype=None) -> registry.DenseKernel:
  """The family that runs ``params`` on activations of ``x_dtype``: the one they were
  prepared for (``hj.prepare``, also with ``kernel=``) when it takes that dtype, else the
  default for their spec, shape and dtype (e.g. float32 tokens on experts prepared for the
  Mosaic grouped kernel, which takes bf16 / fp16 only: the Pallas-Triton grouped kernel,
  after a re-layout inside the call)."""
  kernel = _chosen_kernel(params, grouped, x_dtype)
  if kernel is None:
    raise ValueError(f"no Pallas kernel for spec {params.spec.name}"
                     + (f" and x.dtype={x_dtype}" if x_dtype is not None else ""))
  return kernel


def _chosen_kernel(params: QuantizedWeight, grouped: bool, x_dtype
                   ) -> registry.DenseKernel | None:
  """:func:`kernel_for`, None when no family runs them (an unknown layout still raises)."""
  if params.layout != "canonical":
    chosen = registry.by_layout(params.layout)
    if chosen.grouped == grouped and chosen.supports(params.spec) and chosen.accepts(x_dtype):
      return chosen
  return registry.find(params.spec, grouped=grouped, shape=params.shape, x_dtype=x_dtype)


def backend_and_kernel(params: QuantizedWeight, x_dtype, backend: Backend, *,
                       grouped: bool = False) -> tuple[str, registry.DenseKernel | None]:
  """The backend that computes ``params`` on activations of ``x_dtype`` and, unless it is
  "xla", the family that runs them -- the one whose GPU fences decide (params prepared for
  a family other than the default run there, so its fences apply, not the default's)."""
  kernel = None if backend == "xla" else _chosen_kernel(params, grouped, x_dtype)
  b = resolve_backend(backend, params.spec, grouped=grouped, x_dtype=x_dtype, kernel=kernel)
  if b != "xla" and kernel is None:  # (resolve_backend raised already if nothing runs it)
    kernel = kernel_for(params, grouped=grouped, x_dtype=x_dtype)
  return b, kernel


def check_activations(x: Any, what: str) -> None:
  """x is an array of floats of 16 bits or more (bf16 / fp16 / fp32: what the kernels
  take); 8-bit floats are refused: the spec, not the caller, quantizes activations."""
  if not (hasattr(x, "shape") and hasattr(x, "dtype")):
    raise TypeError(f"{what}: x must be a jax or numpy array; got {type(x).__name__}")
  if not jnp.issubdtype(x.dtype, jnp.floating) or jnp.dtype(x.dtype).itemsize < 2:
    raise ValueError(f"{what}: x must be a float array (bf16/fp16/fp32); got dtype {x.dtype}")


def _check_x(params: QuantizedWeight, x: jax.Array, what: str) -> None:
  if not isinstance(params, QuantizedWeight):
    raise TypeError(f"params must be a QuantizedWeight (from hj.quantize); got "
                    f"{type(params).__name__}")
  check_params(params, f"{what}: params")
  check_activations(x, what)
  if x.ndim < 1 or x.shape[-1] != params.in_features:
    raise ValueError(f"x.shape[-1] must equal the weight's in_features K="
                     f"{params.in_features} for {what}; got x.shape={x.shape}")
  if params.input_perm is not None and params.spec.act is not None:
    raise ValueError(f"params.input_perm (act-order rows) with activation quantization "
                     f"({params.spec.name}) is not supported: activation groups along K "
                     "would see the permuted order")


def _dx_kernel():
  """kernels.wna16_mgpu_dx (imported when a backward is traced: importing the library
  stays cheap)."""
  from humming_jax.kernels import wna16_mgpu_dx  # noqa: PLC0415
  return wna16_mgpu_dx


def quant_dense(params: QuantizedWeight, x: jax.Array, *,
                backend: Backend = None) -> jax.Array:
  """``x @ W + bias`` with quantized ``W``: x (..., K) -> (..., N) in x's dtype.

  Works under ``jax.jit``: the spec is static aux data of ``params``, so a new params value
  of the same spec and shape does not retrace.  Differentiable in reverse mode
  (``jax.grad``): the kernel runs forward, the backward is the XLA reference's VJP -- for
  x, one dequantization of W and one GEMM (humming_jax/autodiff.py) -- but for 16-bit x
  on params prepared for the Mosaic kernels at M <= 64, where a kernel reads dy . W^T off
  the codes (kernels/wna16_mgpu_dx.py; HUMMING_JAX_DX_KERNEL=1: up to M = 128, "0":
  never).
  """
  _check_x(params, x, "quant_dense")
  if params.num_experts is not None:
    raise ValueError(f"params hold stacked experts {params.shape}; use quant_ragged_dot")
  if layers := stacked_layers(params):
    raise ValueError(f"params hold a stack of {layers} layers of shape {params.shape} "
                     "(quantize_params(..., scanned=...)): a scanned module runs one layer "
                     "at a time; outside it, take one: jax.tree.map(lambda a: a[i], params)")
  lead = x.shape[:-1]
  x2 = x.reshape(-1, x.shape[-1])
  b, kernel = backend_and_kernel(params, x.dtype, backend)
  if x2.shape[0] == 0:  # no tokens: no kernel launch (a zero-size grid)
    y = jnp.zeros((0, params.out_features), x.dtype)
  else:
    def run(p, a):
      if p.input_perm is not None:  # act-order: x's columns in the stored rows' order
        a = jnp.take(a, p.input_perm, axis=1)
        p = p.replace(input_perm=None)
      return kernel.run(in_layout_of(kernel, p), a, interpret=(b == "interpret"))
    y = autodiff.kernel_or_reference(
        b, run, reference.dense_reference, ("params", "x"),
        gradient=reference.dense_gradient_reference,
        x_cotangent=lambda p, a, dy: _dx_kernel().cotangent(p, a, dy,
                                                            interpret=b == "interpret"),
    )(params, x2)
  return y.reshape(*lead, params.out_features)
