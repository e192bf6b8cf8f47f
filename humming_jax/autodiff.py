"""Reverse-mode gradients of the kernel-backed ops (``jax.grad``, ``jax.vjp``).

Pallas GPU kernels carry no differentiation rules: ``jax.grad`` through one fails with
"Differentiation rule for 'mpmd_map' not implemented".  So :func:`humming_jax.quant_dense`,
:func:`humming_jax.quant_ragged_dot` and :func:`humming_jax.quant_moe` run their kernels
forward and take the VJP of their XLA reference (:func:`with_reference_vjp`): the
gradient of the function the kernel computes, at XLA's speed, not the kernel's -- but
for the cotangent of x at decode-sized M on the Mosaic layouts, which a kernel computes
(kernels/wna16_mgpu_dx.py; HUMMING_JAX_DX_KERNEL=1 takes it further, and runs
quant_moe's backward on kernels throughout).  That is
what fine-tuning around frozen quantized weights (LoRA adapters, a trained router,
earlier layers) needs: the cotangent of x.

- Activation quantization (W8A8 / W4A8 / W4A4 specs) passes gradients straight through
  (:func:`humming_jax.fake_quantize_activations`); the rounding's derivative is zero
  almost everywhere and would stop every gradient.
- Cotangents are computed only for what is differentiated (``CustomVJPPrimal.perturbed``):
  the cotangent of x costs a dequantization of the weight and one GEMM; the float leaves
  of canonical params (scales, bias, global scale) get theirs only when asked for.
  Integer leaves (codes, e8m0 scales, integer zero points) are never differentiable.
  Scales stored in 8-bit floats (NVFP4's e4m3) are refused too: a cotangent takes its
  primal's dtype, and e4m3 would round it to 3 mantissa bits and turn anything past 448
  into NaN.
- Params prepared for a kernel (``hj.prepare``) are constants here: differentiating their
  leaves raises (their layouts hold transformed scales); differentiate the canonical
  params and prepare after the update.
- Forward mode straight through these functions (``jax.jvp``, ``jax.jacfwd``) is not
  defined, on every backend (the same program must differentiate the same way on the CPU
  and the GPU); JAX raises a TypeError.  Forward over reverse (``jax.hessian``,
  Hessian-vector products) works on every backend: inside it the kernel forward takes its
  reference's tangent, and so does the dy . W^T kernel of the backward
  (kernels/wna16_mgpu_dx.py), which also lets reverse over reverse transpose it -- except
  with quant_moe's backward on kernels throughout
  (HUMMING_JAX_DX_KERNEL=1 with stacked experts), whose recomputing forward is itself a
  custom VJP: leave the switch unset for second derivatives of quant_moe.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from humming_jax.quantize import QuantizedWeight


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Perturbed:
  """Which flattened argument leaves are differentiated (static: shapes the backward)."""
  flags: tuple[bool, ...]


def with_reference_vjp(forward: Callable[..., jax.Array], reference: Callable[..., jax.Array],
                       names: Sequence[str], *,
                       x_cotangent: Callable[..., jax.Array | None] | None = None
                       ) -> Callable[..., jax.Array]:
  """``forward(*args)`` with the VJP of ``reference(*args)``.

  ``forward`` and ``reference`` take the same positional pytree arguments (``names``,
  for errors) and compute the same function -- the kernel and its XLA reference (or a
  form of it made to be differentiated, e.g. at a training precision).  The backward
  differentiates ``reference`` with respect to the differentiated leaves only; the others
  get no cotangent.

  ``x_cotangent(*args, dy)``: where the argument named "x" (one array) is the only one
  differentiated, its cotangent from a kernel (dy . W^T on the quantized layout), or None
  where the kernel does not take these arguments (the reference's VJP then).  It must
  compute what the reference's VJP computes."""

  forward = _with_reference_jvp(forward, reference)

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
    if x_cotangent is not None and which == [_leaf_index(values, names, "x")]:
      dx = x_cotangent(*values, dy)
      if dx is not None:
        return tuple(jax.tree.unflatten(treedef, [dx if i == which[0] else None
                                                  for i in range(len(leaves))]))
    _, vjp = jax.vjp(_of_leaves(reference, leaves, treedef, which),
                     *(leaves[i] for i in which))
    cotangents = dict(zip(which, vjp(dy)))
    return tuple(jax.tree.unflatten(treedef, [cotangents.get(i) for i in range(len(leaves))]))

  f.defvjp(fwd, bwd, symbolic_zeros=True)
  return f


def _with_reference_jvp(forward: Callable[..., jax.Array],
                        reference: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """``forward`` whose tangent is ``reference``'s: a Pallas kernel has no derivative rule,
  and forward over reverse (``jax.hessian``, Hessian-vector products) pushes tangents
  through the forward that ``jax.grad`` runs inside the backward pass."""

  @jax.custom_jvp
  def g(*args):
    return forward(*args)

  def g_jvp(primals, tangents):
    out = forward(*primals)
    return out, tangent_of(reference, primals, tangents, out)

  g.defjvp(g_jvp, symbolic_zeros=True)
  return g


def tangent_of(reference: Callable[..., jax.Array], primals: tuple[Any, ...],
               tangents: tuple[Any, ...], out: jax.Array) -> jax.Array:
  """The tangent of ``reference(*primals)`` in ``out``'s dtype, for a ``custom_jvp`` rule
  defined with ``symbolic_zeros=True``: only the leaves given a tangent are pushed
  through ``reference``; the others (codes, prepared layouts, routing, undifferentiated
  scales) stay its constants, as in the backward, and cost no zero-tangent GEMM."""
  leaves, treedef = jax.tree.flatten(primals)
  dots = jax.tree.leaves(tangents, is_leaf=lambda t: isinstance(t, SymbolicZero))
  live = [i for i, t in enumerate(dots) if not isinstance(t, SymbolicZero)]
  if not live:
    return jnp.zeros_like(out)
  return jax.jvp(_of_leaves(reference, leaves, treedef, live), [leaves[i] for i in live],
                 [dots[i] for i in live])[1].astype(out.dtype)


def _of_leaves(reference: Callable[..., jax.Array], leaves: list, treedef,
               which: Sequence[int]) -> Callable[..., jax.Array]:
  """``reference`` as a function of the flat leaves ``which`` alone (the others fixed)."""
  def of(*moved):
    args = list(leaves)
    for i, v in zip(which, moved):
      args[i] = v
    return reference(*jax.tree.unflatten(treedef, args))
  return of


def _leaf_index(values: tuple[Any, ...], names: Sequence[str], name: str) -> int | None:
  """The flat leaf index of argument ``name`` when it is one array leaf (else None)."""
  start = 0
  for n, v in zip(names, values):
    count = len(jax.tree.leaves(v))
    if n == name:
      return start if count == 1 else None
    start += count
  return None


def kernel_or_reference(backend: str, kernel: Callable[..., jax.Array],
                        reference: Callable[..., jax.Array], names: Sequence[str], *,
                        gradient: Callable[..., jax.Array] | None = None,
                        x_cotangent: Callable[..., jax.Array | None] | None = None
                        ) -> Callable[..., jax.Array]:
  """The op on ``backend`` ("xla": the reference itself, else the kernel) with the VJP of
  ``gradient`` (default: the reference) on every backend; ``x_cotangent`` as in
  :func:`with_reference_vjp` (kernel backends only)."""
  return with_reference_vjp(reference if backend == "xla" else kernel,
                            gradient or reference, names,
                            x_cotangent=None if backend == "xla" else x_cotangent)


def _check_differentiable(values: tuple[Any, ...], flags: tuple[bool, ...],
                          names: Sequence[str]) -> None:
  """Prepared params' leaves are kernel layouts of the scales, and 8-bit float leaves
  cannot hold a cotangent: neither is differentiated."""
  start = 0
  for name, value in zip(names, values):
    leaves = jax.tree_util.tree_leaves_with_path(value)
    perturbed = flags[start:start + len(leaves)]
    start += len(leaves)
    if not any(perturbed):
      continue
    if isinstance(value, QuantizedWeight) and value.layout != "canonical":
      raise ValueError(
          f"{name}: gradients with respect to params prepared for a kernel (layout "
          f"{value.layout!r}) are not supported; differentiate the canonical params "
          "(hj.quantize's output) and prepare them after the update")
    for (path, leaf), p in zip(leaves, perturbed):
      if p and jnp.issubdtype(leaf.dtype, jnp.floating) and jnp.finfo(leaf.dtype).bits <= 8:
        raise ValueError(
            f"{name}{jax.tree_util.keystr(path)}: gradients with respect to a "
            f"{jnp.dtype(leaf.dtype).name} leaf are not supported (a cotangent takes the "
            "leaf's dtype: 8-bit floats would round it to a few bits and overflow to NaN); "
            "differentiate a float32 copy, e.g. params.replace(scales="
            "params.scales.astype(jnp.float32))")
