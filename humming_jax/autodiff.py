"""Reverse-mode gradients of the kernel-backed ops (``jax.grad``, ``jax.vjp``).

Pallas GPU kernels carry no differentiation rules: ``jax.grad`` through one fails with
"Differentiation rule for 'mpmd_map' not implemented".  So :func:`humming_jax.quant_dense`,
:func:`humming_jax.quant_ragged_dot` and :func:`humming_jax.quant_moe` run their kernels
forward and take the VJP of their XLA reference (:func:`with_reference_vjp`): the
gradient of the function the kernel computes, at XLA's speed, not the kernel's.  That is
what fine-tuning around frozen quantized weights (LoRA adapters, a trained router,
earlier layers) needs: the cotangent of x.

- Activation quantization (W8A8 / W4A8 / W4A4 specs) passes gradients straight through
  (:func:`humming_jax.fake_quantize_activations`); the rounding's derivative is zero
  almost everywhere and would stop every gradient.
- Cotangents are computed only for what is differentiated (``CustomVJPPrimal.perturbed``):
  the cotangent of x costs a dequantization of the weight and one GEMM; the float leaves
  of canonical params (scales, bias, global scale) get theirs only when asked for.
  Integer leaves (codes, e8m0 scales, integer zero points) are never differentiable.
- Params prepared for a kernel (``hj.prepare``) are constants here: differentiating their
  leaves raises (their layouts hold transformed scales); differentiate the canonical
  params and prepare after the update.
- Forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``) is not defined: JAX refuses
  it on these functions.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from humming_jax.quantize import QuantizedWeight


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Perturbed:
  """Which flattened argument leaves are differentiated (static: shapes the backward)."""
  flags: tuple[bool, ...]


def with_reference_vjp(forward: Callable[..., jax.Array], reference: Callable[..., jax.Array],
                       names: Sequence[str]) -> Callable[..., jax.Array]:
  """``forward(*args)`` with the VJP of ``reference(*args)``.

  ``forward`` and ``reference`` take the same positional pytree arguments (``names``,
  for errors) and compute the same function -- the kernel and its XLA reference.  The
  backward differentiates ``reference`` with respect to the differentiated leaves only;
  the others get no cotangent."""

  @jax.custom_vjp
  def f(*args):
    return forward(*args)

  def fwd(*args):
    is_primal = lambda a: isinstance(a, CustomVJPPrimal)
    values = jax.tree.map(lambda a: a.value, args, is_leaf=is_primal)
    flags = tuple(a.perturbed for a in jax.tree.leaves(args, is_leaf=is_primal))
    _check_differentiable(values, flags, names)
    return forward(*values), (values, _Perturbed(flags))

  def bwd(res, dy):
    values, perturbed = res
    leaves, treedef = jax.tree.flatten(values)
    if isinstance(dy, SymbolicZero):  # the output's cotangent is zero: so are the inputs'
      return tuple(jax.tree.unflatten(treedef, [None] * len(leaves)))
    which = [i for i, p in enumerate(perturbed.flags) if p]

    def reference_of(*differentiated):
      args = list(leaves)
      for i, v in zip(which, differentiated):
        args[i] = v
      return reference(*jax.tree.unflatten(treedef, args))

    _, vjp = jax.vjp(reference_of, *(leaves[i] for i in which))
    cotangents = dict(zip(which, vjp(dy)))
    return tuple(jax.tree.unflatten(treedef, [cotangents.get(i) for i in range(len(leaves))]))

  f.defvjp(fwd, bwd, symbolic_zeros=True)
  return f


def _check_differentiable(values: tuple[Any, ...], flags: tuple[bool, ...],
                          names: Sequence[str]) -> None:
  """Prepared params' leaves are kernel layouts of the scales: not differentiated."""
  start = 0
  for name, value in zip(names, values):
    n = len(jax.tree.leaves(value))
    if (isinstance(value, QuantizedWeight) and value.layout != "canonical"
        and any(flags[start:start + n])):
      raise ValueError(
          f"{name}: gradients with respect to params prepared for a kernel (layout "
          f"{value.layout!r}) are not supported; differentiate the canonical params "
          "(hj.quantize's output) and prepare them after the update")
    start += n
