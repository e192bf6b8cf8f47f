"""Flax nnx modules over quantized weights, and in-place swapping into nnx models.

* :class:`QuantDense`: drop-in for ``nnx.Linear`` (kernel layout (in, out), ``dtype``,
  ``param_dtype``, bias) holding a :class:`QuantizedWeight`; :meth:`QuantDense.from_linear`
  converts a trained ``nnx.Linear``.
* :func:`quantize_nnx_model`: graph surgery, replacing every ``nnx.Linear`` of a model by a
  QuantDense as a recipe says (see :mod:`humming_jax.recipes`), in place.
* :class:`QuantMoE`: float router, top-k, ``hj.quant_moe`` over quantized experts.

The quantized weight lives in a :class:`QuantizedParam` variable (not an ``nnx.Param``:
packed codes are not trainable, so optimizers built on ``nnx.Param`` leave them alone);
``nnx.state(model)`` / ``nnx.split`` carry it like any other variable.  As in the linen
modules the bias is inside the QuantizedWeight, and outputs are exactly
``hj.quant_dense(w, x.astype(compute_dtype))`` with Flax's compute dtype rule.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from humming_jax.nn import _common
from humming_jax.ops import Backend
from humming_jax.quantize import QuantizedWeight, quantize
from humming_jax.spec import QuantSpec

default_kernel_init = nnx.initializers.lecun_normal()


class QuantizedParam(nnx.Variable):
  """An nnx variable holding a :class:`QuantizedWeight` (frozen, not an ``nnx.Param``)."""


class QuantDense(nnx.Module):
  """Drop-in for ``nnx.Linear`` with a quantized kernel.

  Args: as ``nnx.Linear`` (``in_features``, ``out_features``, ``use_bias``, ``dtype``,
  ``param_dtype``, ``precision`` -- accepted for compatibility; the kernels accumulate in
  fp32 --, ``kernel_init``, ``bias_init``, ``rngs``) plus ``spec`` and ``backend``.
  ``weight=`` builds the layer around an existing QuantizedWeight (then ``rngs`` is not
  needed); otherwise a float kernel is drawn with ``kernel_init`` and quantized.
  """

  def __init__(self, in_features: int, out_features: int, *, spec: QuantSpec | str =
               "w4a16-g128", use_bias: bool = True, dtype: Any = None,
               param_dtype: Any = jnp.float32, precision: Any = None,
               kernel_init: Callable = default_kernel_init,
               bias_init: Callable = nnx.initializers.zeros_init(),
               backend: Backend = None, rngs: nnx.Rngs | None = None,
               weight: QuantizedWeight | None = None):
    spec = _common.as_spec(spec)
    if weight is None:
      if rngs is None:
        raise ValueError("QuantDense needs rngs= to initialise (or weight= to wrap an "
                         "existing QuantizedWeight)")
      w = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
      b = bias_init(rngs.params(), (out_features,), param_dtype) if use_bias else None
      weight = quantize(w, spec, bias=b)
    else:
      if not isinstance(weight, QuantizedWeight):
        raise TypeError(f"weight must be a QuantizedWeight; got {type(weight).__name__}")
      if weight.shape != (in_features, out_features):
        raise ValueError(f"weight has shape {weight.shape}; expected "
                         f"({in_features}, {out_features})")
      _common.check_held_weight(weight, spec=spec, use_bias=use_bias,
                                where="nnx QuantDense(weight=...)")
    self.kernel = QuantizedParam(weight)
    self.in_features = in_features
    self.out_features = out_features
    self.use_bias = use_bias
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.precision = precision
    self.spec = spec
    self.backend = backend

  def __call__(self, inputs: jax.Array) -> jax.Array:
    return _common.dense_call(self.kernel.get_value(), inputs, dtype=self.dtype,
                              param_dtype=self.param_dtype, features=self.out_features,
                              backend=self.backend, where="nnx QuantDense",
                              use_bias=self.use_bias, spec=self.spec)

  @classmethod
  def from_linear(cls, linear: nnx.Linear, spec: QuantSpec | str, *,
                  backend: Backend = None) -> "QuantDense":
    """Quantize a trained ``nnx.Linear`` (kernel (in, out), bias folded in)."""
    if not isinstance(linear, nnx.Linear):
      raise TypeError(f"linear must be an nnx.Linear; got {type(linear).__name__}")
    bias = linear.bias[...] if linear.bias is not None else None
    weight = _common.quantize_dense(linear.kernel[...], bias, spec)
    return cls(linear.in_features, linear.out_features, spec=weight.spec,
               use_bias=bias is not None, dtype=linear.dtype,
               param_dtype=linear.param_dtype, precision=linear.precision,
               backend=backend, weight=weight)


def _child(node: Any, key: Any) -> Any:
  if isinstance(key, int) or isinstance(node, (list, tuple, dict, nnx.List, nnx.Dict)):
    return node[key]
  return getattr(node, key)


def quantize_nnx_model(model: nnx.Module, recipe: Any, *, backend: Backend = None,
                       progress: bool = True, strict: bool = False) -> nnx.Module:
  """Replace, in place, every ``nnx.Linear`` the recipe quantizes by a :class:`QuantDense`.

  Paths are the nnx graph paths '/'-joined plus ``/kernel`` (e.g.
  ``layers/0/attn/q_proj/kernel``), matched like :func:`humming_jax.quantize_params`
  (exact > ``re:`` > ``*``; ``None`` or no match keeps the Linear; a recipe key that
  decides no Linear is a warning, with ``strict=True`` an error).  A :class:`QuantMoE`'s
  router stays float.  Returns ``model``.  A Linear shared by several parents is replaced
  where the graph first reaches it.
  """
  from humming_jax.recipes import check_unused, get_recipe, resolve
  if not isinstance(model, nnx.Module):
    raise TypeError(f"model must be an nnx.Module; got {type(model).__name__}")
  recipe = get_recipe(recipe)
  routers = {id(node.router) for _, node in nnx.iter_graph(model)
             if isinstance(node, QuantMoE)}
  todo, used = [], set()
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Linear) and path and id(node) not in routers:
      p = "/".join(str(k) for k in path) + "/kernel"
      key, spec = resolve(recipe, p)
      if key is None:
        continue
      used.add(key)
      if spec is not None:
        todo.append((path, p, node, spec))
  check_unused(recipe, used, strict=strict, where="quantize_nnx_model")
  it = todo
  if progress and len(todo) >= 8:
    from tqdm.auto import tqdm
    it = tqdm(todo, desc="quantize_nnx_model", unit="layer", leave=False)
  for path, p, linear, spec in it:
    parent = model
    for key in path[:-1]:
      parent = _child(parent, key)
    try:
      new = QuantDense.from_linear(linear, spec, backend=backend)
    except ValueError as e:
      raise ValueError(f"cannot quantize {p} (shape {(linear.in_features, linear.out_features)})"
                       f" with {spec.name}: {e}; map {p!r} to None in the recipe to keep it "
                       "float") from None
    key = path[-1]
    if isinstance(key, int) or isinstance(parent, (list, dict, nnx.List, nnx.Dict)):
      parent[key] = new
    else:
      setattr(parent, key, new)
  return model


class RoutingBias(nnx.Variable):
  """A router's expert-selection bias (DeepSeek-V3's ``e_score_correction_bias``): state,
  not an ``nnx.Param`` -- no gradient reaches it, and an optimizer over ``nnx.Param``
  (weight decay included) leaves it alone."""


class QuantMoE(nnx.Module):
  """Mixture of experts: float ``router`` (nnx.Linear), top-k routing, ``hj.quant_moe``
  over quantized ``gate_up`` (E, K, 2*I; gate columns first) and ``down`` (E, I, K)
  experts.  (..., K) -> (..., K).

  ``routing``: a :class:`humming_jax.moe.Routing` (DeepSeek-V3's sigmoid, grouped,
  bias-corrected routing: the module then holds ``correction_bias``, a float32 (E,)
  :class:`RoutingBias` of zeros; gpt-oss's top-k then softmax with a biased router);
  default: softmax then top-k, ``renormalize`` as given, a router bias as the ``router``
  given has one (none when the module makes its router)."""

  def __init__(self, in_features: int, num_experts: int, topk: int, intermediate: int, *,
               spec: QuantSpec | str = "w4a16-g128", activation: str = "silu",
               renormalize: bool = True, dtype: Any = None, param_dtype: Any = jnp.float32,
               kernel_init: Callable = default_kernel_init, backend: Backend = None,
               rngs: nnx.Rngs | None = None, router: nnx.Linear | None = None,
               gate_up: QuantizedWeight | None = None, down: QuantizedWeight | None = None,
               routing: Any = None):
    spec = _common.as_spec(spec)
    if routing is None and router is not None and router.bias is not None:
      from humming_jax.moe import Routing  # noqa: PLC0415
      routing = Routing(renormalize=renormalize, router_bias=True)  # (the router's own)
    routing = _common.routing_of(routing, renormalize)
    if not 0 < topk <= num_experts:
      raise ValueError(f"topk={topk} must be in [1, num_experts={num_experts}]")
    k, e, i = in_features, num_experts, intermediate
    if router is None or gate_up is None or down is None:
      if rngs is None:
        raise ValueError("QuantMoE needs rngs= to initialise (or router=, gate_up=, down=)")
    if router is None:
      router = nnx.Linear(k, e, use_bias=routing.router_bias, param_dtype=param_dtype,
                          kernel_init=kernel_init, rngs=rngs)
    elif (router.bias is not None) != routing.router_bias:
      raise ValueError(f"router has {'a' if router.bias is not None else 'no'} bias; "
                       f"routing.router_bias={routing.router_bias}")
    _common.check_expert_shapes(spec, k, i, e, tuple(
        n for n, w in (("gate_up", gate_up), ("down", down)) if w is None))
    if gate_up is None:
      gate_up = quantize(jnp.stack([kernel_init(rngs.params(), (k, 2 * i), param_dtype)
                                    for _ in range(e)]), spec)
    if down is None:
      down = quantize(jnp.stack([kernel_init(rngs.params(), (i, k), param_dtype)
                                 for _ in range(e)]), spec)
    for name, w, shape in (("gate_up", gate_up, (e, k, 2 * i)), ("down", down, (e, i, k))):
      if not isinstance(w, QuantizedWeight) or tuple(w.shape) != shape:
        raise ValueError(f"{name} must be a QuantizedWeight of shape {shape}; got "
                         f"{getattr(w, 'shape', type(w).__name__)}")
    self.router = router
    self.gate_up = QuantizedParam(gate_up)
    self.down = QuantizedParam(down)
    self.topk = topk
    self.activation = activation
    self.routing = routing
    self.correction_bias = (RoutingBias(jnp.zeros((e,), jnp.float32))
                            if routing.correction_bias else None)
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.backend = backend

  def __call__(self, inputs: jax.Array) -> jax.Array:
    x = jnp.asarray(inputs)
    x = x.astype(_common.compute_dtype(x, self.dtype, self.param_dtype))
    x2 = x.reshape(-1, x.shape[-1])
    logits = self.router(x2.astype(jnp.float32))
    correction = None if self.correction_bias is None else self.correction_bias[...]
    weights, ids = self.routing.route(logits, self.topk, correction)
    y = _common.moe_call(self.gate_up.get_value(), self.down.get_value(), x2, weights, ids,
                         activation=self.activation, backend=self.backend)
    return y.reshape(x.shape)

  @classmethod
  def from_float(cls, router_kernel: Any, gate_up: Any, down: Any, spec: QuantSpec | str,
                 topk: int, *, router_bias: Any = None, **kwargs) -> "QuantMoE":
    """Quantize float experts: ``router_kernel`` (K, E), ``gate_up`` (E, K, 2I), ``down``
    (E, I, K); ``router_bias`` (E,) with ``routing=Routing(router_bias=True, ...)``.
    Other keyword arguments as the constructor."""
    spec = _common.as_spec(spec)
    router_kernel = jnp.asarray(router_kernel)
    if router_kernel.ndim != 2:
      raise ValueError(f"router_kernel must be (K, E); got shape {router_kernel.shape}")
    k, e = router_kernel.shape
    gate_up, down = jnp.asarray(gate_up), jnp.asarray(down)
    if gate_up.ndim != 3 or gate_up.shape[:2] != (e, k) or gate_up.shape[2] % 2:
      raise ValueError(f"gate_up must be (E={e}, K={k}, 2*I); got {gate_up.shape}")
    i = gate_up.shape[2] // 2
    routing = kwargs.get("routing")
    biased = bool(routing is not None and routing.router_bias)
    if (router_bias is not None) != biased:
      raise ValueError(f"router_bias is {'given' if router_bias is not None else 'missing'}"
                       f"; routing.router_bias={biased}")
    router = nnx.Linear(k, e, use_bias=biased, rngs=nnx.Rngs(0))
    router.kernel[...] = router_kernel.astype(router.kernel[...].dtype)
    if biased:
      router_bias = jnp.asarray(router_bias)
      if router_bias.shape != (e,):
        raise ValueError(f"router_bias must be (E={e},); got shape {router_bias.shape}")
      router.bias[...] = router_bias.astype(router.bias[...].dtype)
    return cls(k, e, topk, i, spec=spec, router=router, gate_up=quantize(gate_up, spec),
               down=quantize(down, spec), **kwargs)


__all__ = ["QuantDense", "QuantMoE", "QuantizedParam", "RoutingBias", "quantize_nnx_model"]
