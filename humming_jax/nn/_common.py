"""Pieces shared by the linen (:mod:`humming_jax.nn`) and nnx (:mod:`humming_jax.nnx`) modules."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from humming_jax.ops import quant_dense
from humming_jax.quantize import QuantizedWeight, check_weight_shape, quantize
from humming_jax.spec import QuantSpec


def as_spec(spec: QuantSpec | str, name: str = "spec") -> QuantSpec:
  if isinstance(spec, str):
    return QuantSpec.preset(spec)
  if not isinstance(spec, QuantSpec):
    raise TypeError(f"{name} must be a QuantSpec or a preset name; got {type(spec).__name__}")
  return spec


def compute_dtype(x: jax.Array, dtype: Any, param_dtype: Any) -> Any:
  """The dtype a Flax Dense / nnx Linear computes in: ``dtype``, else promote(x, params)."""
  if dtype is not None:
    return jnp.dtype(dtype)
  return jnp.result_type(x.dtype, param_dtype)


def check_held_weight(qw: QuantizedWeight, *, spec: QuantSpec | None, use_bias: bool,
                      where: str) -> None:
  """A layer's settings agree with the QuantizedWeight it holds: the weight carries its own
  spec and bias, so a mismatch would silently compute something the layer does not say."""
  if spec is not None and qw.spec != spec:
    raise ValueError(f"{where}: the kernel was quantized with {qw.spec.name}, not spec="
                     f"{spec.name}: set spec to the weight's (weight.spec)")
  if use_bias != (qw.bias is not None):
    raise ValueError(f"{where}: use_bias={use_bias} but the quantized kernel's bias is "
                     f"{'set' if qw.bias is not None else 'None'} (quantize folds a Dense's "
                     "bias into its QuantizedWeight)")


def dense_call(qw: Any, x: jax.Array, *, dtype: Any, param_dtype: Any, features: int | None,
               backend: Any, where: str, use_bias: bool, spec: QuantSpec | None = None
               ) -> jax.Array:
  """``hj.quant_dense(qw, x.astype(compute dtype))`` after checking what the layer holds."""
  if not isinstance(qw, QuantizedWeight):
    raise TypeError(f"{where}: the 'kernel' param must be a QuantizedWeight (from "
                    f"hj.quantize / hj.quantize_params); got {type(qw).__name__}")
  if features is not None and qw.out_features != features:
    raise ValueError(f"{where}: features={features} but the quantized kernel has "
                     f"out_features={qw.out_features} (shape {qw.shape})")
  check_held_weight(qw, spec=spec, use_bias=use_bias, where=where)
  x = jnp.asarray(x)
  return quant_dense(qw, x.astype(compute_dtype(x, dtype, param_dtype)), backend=backend)


def quantize_dense(kernel: Any, bias: Any, spec: QuantSpec | str) -> QuantizedWeight:
  """A trained Dense's (kernel (in, out), bias (out,) or None) -> QuantizedWeight."""
  kernel = jnp.asarray(kernel)
  if kernel.ndim != 2:
    raise ValueError(f"kernel must be 2-D (in_features, out_features); got shape "
                     f"{kernel.shape}")
  return quantize(kernel, as_spec(spec), bias=bias)


def check_expert_shapes(spec: QuantSpec, hidden: int, intermediate: int, num_experts: int,
                        stacks: tuple[str, ...] = ("gate_up", "down")) -> None:
  """The expert stacks QuantMoE is about to quantize (of gate_up (E, K, 2I), down (E, I, K))
  fit ``spec``; else the error names the stack and the module setting behind its K."""
  for name, shape, setting in (("gate_up", (num_experts, hidden, 2 * intermediate),
                                f"the input features {hidden}"),
                               ("down", (num_experts, intermediate, hidden),
                                f"intermediate={intermediate}")):
    if name not in stacks:
      continue
    try:
      check_weight_shape(spec, shape, name)
    except ValueError as err:
      raise ValueError(f"QuantMoE's {name} experts {shape} (K is {setting}): {err}") from None


def routing_of(routing: Any, renormalize: bool) -> Any:
  """A QuantMoE's :class:`humming_jax.moe.Routing`: ``routing`` (then ``renormalize``
  must be left at its default, True: the Routing says it), else softmax top-k with
  ``renormalize``."""
  from humming_jax import moe
  if routing is None:
    return moe.Routing(renormalize=renormalize)
  if not isinstance(routing, moe.Routing):
    raise TypeError(f"routing must be a humming_jax.moe.Routing; got {type(routing).__name__}")
  if renormalize is not True:
    raise ValueError(f"renormalize={renormalize!r} with routing=...: set "
                     f"Routing(renormalize=...) instead")
  return routing


def moe_call(gate_up: Any, down: Any, x: jax.Array, weights: jax.Array, ids: jax.Array, *,
             activation: str, backend: Any = None) -> jax.Array:
  """``hj.quant_moe`` (humming_jax/moe.py) on (T, K) tokens."""
  from humming_jax.moe import quant_moe
  for name, w in (("gate_up", gate_up), ("down", down)):
    if not isinstance(w, QuantizedWeight) or w.num_experts is None:
      raise TypeError(f"QuantMoE: '{name}' must be a stacked-expert QuantizedWeight "
                      f"(E, K, N); got {getattr(w, 'shape', type(w).__name__)}")
  return quant_moe(gate_up, down, x, weights, ids, activation=activation, backend=backend)
