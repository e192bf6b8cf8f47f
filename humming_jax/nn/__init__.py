"""Flax linen modules over quantized weights, and swapping them into existing models.

Two ways in:

* Write the model with :class:`QuantDense` (same attributes as ``flax.linen.Dense``, plus
  ``spec`` and ``backend``) and :class:`QuantMoE`.
* Keep an existing model that uses ``nn.Dense`` unchanged: quantize its params with
  :func:`humming_jax.quantize_params` (or :func:`quantize_linen_params`) and run it inside
  :func:`quantized_dense` (an ``nn.intercept_methods`` interceptor): every ``nn.Dense``
  whose ``kernel`` param is a :class:`QuantizedWeight` runs ``hj.quant_dense``; Dense layers
  the recipe kept float run unchanged.  :func:`apply_quantized` wraps ``model.apply``.

Params layout (the same for both): a quantized Dense holds ``{"kernel": QuantizedWeight}``
with its bias inside the QuantizedWeight (float32, added in the kernel's fp32 epilogue).
Outputs are exactly ``hj.quant_dense(kernel, x.astype(compute_dtype))`` where the compute
dtype follows Flax: ``dtype`` if set, else ``result_type(x, param_dtype)``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from humming_jax.nn import _common
from humming_jax.ops import Backend
from humming_jax.quantize import QuantizedWeight, quantize
from humming_jax.spec import QuantSpec

default_kernel_init = nn.initializers.lecun_normal()


class QuantDense(nn.Module):
  """Drop-in for ``flax.linen.Dense`` holding a quantized kernel.

  Attributes: as ``nn.Dense`` (``features``, ``use_bias``, ``dtype``, ``param_dtype``,
  ``precision`` -- accepted for signature compatibility, the quantized kernels fix their
  own fp32 accumulation --, ``kernel_init``, ``bias_init``) plus ``spec`` (QuantSpec or
  preset name) and ``backend`` (None: Pallas on GPU when a kernel exists, else XLA).

  ``init`` draws a float kernel with ``kernel_init`` and quantizes it; to quantize trained
  weights use :meth:`from_dense_params` (or :func:`humming_jax.quantize_params`).
  """

  features: int
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Callable = default_kernel_init
  bias_init: Callable = nn.initializers.zeros_init()
  spec: QuantSpec | str = "w4a16-g128"
  backend: Backend = None

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    spec = _common.as_spec(self.spec)
    in_features = jnp.shape(inputs)[-1]

    def init(rng):
      rk, rb = jax.random.split(rng)
      w = self.kernel_init(rk, (in_features, self.features), self.param_dtype)
      b = (self.bias_init(rb, (self.features,), self.param_dtype) if self.use_bias
           else None)
      return quantize(w, spec, bias=b)

    # Read an existing kernel directly: self.param would eval_shape the quantizing init
    # on every trace just to compare shapes.
    if self.has_variable("params", "kernel"):
      qw = self.get_variable("params", "kernel")
    else:
      qw = self.param("kernel", init)
    return _common.dense_call(qw, inputs, dtype=self.dtype, param_dtype=self.param_dtype,
                              features=self.features, backend=self.backend,
                              where=f"QuantDense {_module_path(self)!r}",
                              use_bias=self.use_bias, spec=spec)

  @staticmethod
  def from_dense_params(params: Any, spec: QuantSpec | str) -> dict[str, QuantizedWeight]:
    """``{"kernel": (in, out)[, "bias": (out,)]}`` of a trained Dense -> QuantDense params."""
    if not hasattr(params, "keys"):
      raise TypeError(f"params must be a Dense's params dict; got {type(params).__name__}")
    if "kernel" not in params:
      raise ValueError(f"params must hold 'kernel'; got keys {sorted(params.keys())}")
    return {"kernel": _common.quantize_dense(params["kernel"], params.get("bias"), spec)}

  @classmethod
  def from_dense(cls, dense: nn.Dense, spec: QuantSpec | str, *,
                 backend: Backend = None) -> "QuantDense":
    """A QuantDense with ``dense``'s configuration (an unbound ``nn.Dense``)."""
    if not isinstance(dense, nn.Dense):
      raise TypeError(f"dense must be a flax.linen.Dense; got {type(dense).__name__}")
    if dense.dot_general is not None or dense.dot_general_cls is not None:
      raise ValueError("dense has a custom dot_general / dot_general_cls, which a QuantDense "
                       "would not call (it computes with hj.quant_dense)")
    return cls(features=dense.features, use_bias=dense.use_bias, dtype=dense.dtype,
               param_dtype=dense.param_dtype, precision=dense.precision,
               kernel_init=dense.kernel_init, bias_init=dense.bias_init,
               spec=_common.as_spec(spec), backend=backend)


class QuantMoE(nn.Module):
  """Mixture of experts with quantized experts: float router, top-k, ``hj.quant_moe``.

  Params: ``router/kernel`` (K, E) float (kept float: tiny and routing-sensitive; with
  ``routing.router_bias`` also ``router/bias``), ``gate_up`` QuantizedWeight (E, K,
  2*intermediate) -- gate columns first, then up -- and ``down`` QuantizedWeight (E,
  intermediate, K).  With ``routing.correction_bias``, a float32 ``correction_bias`` (E,)
  in the ``"routing"`` collection (not ``"params"``: no gradient reaches it, and weight
  decay must not shrink it; pass ``{"params": ..., "routing": ...}`` to ``apply``).
  Input (..., K) -> (..., K) in the compute dtype.

  ``routing``: a :class:`humming_jax.moe.Routing` (DeepSeek-V3's sigmoid, grouped,
  bias-corrected routing; gpt-oss's top-k then softmax with a biased router); default:
  softmax then top-k, ``renormalize`` as given.
  """

  num_experts: int
  topk: int
  intermediate: int
  spec: QuantSpec | str = "w4a16-g128"
  activation: str = "silu"
  renormalize: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init
  backend: Backend = None
  routing: Any = None  # humming_jax.moe.Routing

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    spec = _common.as_spec(self.spec)
    routing = _common.routing_of(self.routing, self.renormalize)
    if not 0 < self.topk <= self.num_experts:
      raise ValueError(f"topk={self.topk} must be in [1, num_experts={self.num_experts}]")
    k = inputs.shape[-1]
    e, i = self.num_experts, self.intermediate
    _common.check_expert_shapes(spec, k, i, e, tuple(
        n for n in ("gate_up", "down") if not self.has_variable("params", n)))
    x = jnp.asarray(inputs)
    x = x.astype(_common.compute_dtype(x, self.dtype, self.param_dtype))
    x2 = x.reshape(-1, k)
    logits = nn.Dense(e, use_bias=routing.router_bias, dtype=jnp.float32,
                      param_dtype=self.param_dtype, kernel_init=self.kernel_init,
                      name="router")(x2.astype(jnp.float32))
    # (not a param: it chooses experts but has no gradient, and weight decay must not
    # shrink it -- DeepSeek keeps it as a float32 buffer)
    correction = (self.variable("routing", "correction_bias", jnp.zeros, (e,),
                                jnp.float32).value if routing.correction_bias else None)
    weights, ids = routing.route(logits, self.topk, correction)

    def expert_init(shape):
      def init(rng):
        keys = jax.random.split(rng, shape[0])
        w = jnp.stack([self.kernel_init(r, shape[1:], self.param_dtype) for r in keys])
        return quantize(w, spec)
      return init

    gate_up, down = (self.get_variable("params", n) if self.has_variable("params", n)
                     else self.param(n, expert_init(shape))
                     for n, shape in (("gate_up", (e, k, 2 * i)), ("down", (e, i, k))))
    y = _common.moe_call(gate_up, down, x2, weights, ids, activation=self.activation,
                         backend=self.backend)
    return y.reshape(x.shape)


# ----------------------------------------------------------------------------------------
# Swapping every nn.Dense of an existing model
# ----------------------------------------------------------------------------------------
def _module_path(mod: nn.Module) -> str:
  """A bound module's '/'-joined scope path (its class name at the top level)."""
  return "/".join(mod.scope.path) or type(mod).__name__


def _one_output_axis(mod: nn.DenseGeneral, x: jax.Array) -> bool:
  """A DenseGeneral that is a Dense: contracts x's last axis only, one output axis, no
  batch dims -- its kernel is (in, out), what quantize_params quantizes."""
  axis = mod.axis if isinstance(mod.axis, tuple) else (mod.axis,)
  features = mod.features if isinstance(mod.features, tuple) else (mod.features,)
  return (len(axis) == 1 and axis[0] % x.ndim == x.ndim - 1 and len(features) == 1
          and not mod.batch_dims)


def dense_interceptor(*, backend: Backend = None) -> Callable:
  """An ``nn.intercept_methods`` interceptor: ``nn.Dense`` (and ``nn.DenseGeneral`` over the
  last axis with one output axis) whose ``kernel`` param is a QuantizedWeight runs
  ``hj.quant_dense``; another Flax layer holding a quantized ``kernel`` (``nn.Einsum``,
  ``nn.Conv``) is an error naming it; every other call runs unchanged (your own modules
  compute with their quantized kernels themselves)."""

  def interceptor(next_fun, args, kwargs, context):
    mod = context.module
    if (context.method_name == "__call__" and not isinstance(mod, QuantDense)
        and mod.has_variable("params", "kernel")):
      qw = mod.get_variable("params", "kernel")
      if isinstance(qw, QuantizedWeight):
        x = jnp.asarray(args[0] if args else kwargs["inputs"])
        where = f"{type(mod).__name__} {_module_path(mod)!r}"
        if isinstance(mod, nn.Dense):
          features = mod.features
        elif isinstance(mod, nn.DenseGeneral) and _one_output_axis(mod, x):
          features = (mod.features if isinstance(mod.features, int) else mod.features[0])
        elif type(mod).__module__.startswith("flax."):  # Einsum, Conv, ...: would fail
          raise TypeError(f"{where} holds a quantized kernel, but only nn.Dense and "
                          "nn.DenseGeneral over the last axis with one output axis run "
                          "quantized: map its path to None in the recipe")
        else:  # a user's module that computes with its quantized kernel itself
          return next_fun(*args, **kwargs)
        return _common.dense_call(qw, x, dtype=mod.dtype, param_dtype=mod.param_dtype,
                                  features=features, backend=backend, where=where,
                                  use_bias=mod.use_bias)
    return next_fun(*args, **kwargs)

  return interceptor


@contextlib.contextmanager
def quantized_dense(*, backend: Backend = None):
  """Context manager: run linen models with quantized Dense params (see module doc).

  Put it around the *tracing* of ``model.apply`` (inside the jitted function, or use
  :func:`apply_quantized`), since interceptors act at trace time."""
  with nn.intercept_methods(dense_interceptor(backend=backend)):
    yield


def apply_quantized(model: nn.Module, variables: Any, *args, backend: Backend = None,
                    **kwargs) -> Any:
  """``model.apply(variables, *args, **kwargs)`` with :func:`quantized_dense` active."""
  with quantized_dense(backend=backend):
    return model.apply(variables, *args, **kwargs)


def capture_dense_inputs(model: nn.Module, variables: Any, *args, **kwargs
                         ) -> dict[str, jax.Array]:
  """``{layer path: input}`` of every ``nn.Dense`` / ``nn.DenseGeneral`` / QuantDense call
  in ``model.apply``.

  Run eagerly on a calibration batch; feed the result to ``hj.error_report(...,
  inputs=...)`` for per-layer output SQNR.  A layer called twice keeps its last input."""
  seen: dict[str, jax.Array] = {}

  def interceptor(next_fun, a, kw, context):
    mod = context.module
    if context.method_name == "__call__" and isinstance(mod, (nn.Dense, nn.DenseGeneral,
                                                              QuantDense)):
      x = a[0] if a else kw["inputs"]
      if isinstance(x, jax.core.Tracer):
        raise ValueError("capture_dense_inputs runs eagerly: call it outside jax.jit")
      seen["/".join(mod.scope.path)] = x
    return next_fun(*a, **kw)

  with nn.intercept_methods(interceptor), quantized_dense():
    model.apply(variables, *args, **kwargs)
  return seen


def _is_variables(tree: Any) -> bool:
  """Whether ``tree`` is a ``variables`` dict (collections at the top) rather than a params
  tree: it holds a ``params`` collection, and its other collections (batch_stats, cache,
  ...) hold no ``kernel`` -- a params tree with a submodule named ``params`` has kernels
  outside it."""
  from humming_jax.recipes import path_str
  if not (hasattr(tree, "keys") and "params" in tree
          and all(hasattr(v, "keys") for v in tree.values())):
    return False
  others = {k: v for k, v in tree.items() if k != "params"}
  return not any(path_str(p).rpartition("/")[2] == "kernel"
                 for p, _ in jax.tree_util.tree_flatten_with_path(
                     others, is_leaf=lambda x: isinstance(x, QuantizedWeight))[0])


def quantize_linen_params(params: Any, recipe: Any, *, progress: bool = True,
                          **kwargs: Any) -> Any:
  """:func:`humming_jax.quantize_params` for a linen params tree (``variables["params"]``).

  A ``variables`` dict (with a top-level ``"params"`` collection) is accepted too: only its
  ``"params"`` collection is quantized, other collections are returned as they are.
  ``kwargs`` (``scanned``, ``strict``) as :func:`humming_jax.quantize_params`."""
  from humming_jax.recipes import quantize_params
  if _is_variables(params):
    out = dict(params)
    out["params"] = quantize_params(params["params"], recipe, progress=progress, **kwargs)
    return out
  return quantize_params(params, recipe, progress=progress, **kwargs)


__all__ = ["QuantDense", "QuantMoE", "dense_interceptor", "quantized_dense",
           "apply_quantized", "quantize_linen_params", "capture_dense_inputs"]
