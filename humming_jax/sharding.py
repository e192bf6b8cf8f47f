"""Tensor- and expert-parallel quantized layers on ``jax.sharding``.

Quantized params are ordinary pytrees, so JAX's SPMD machinery places them like any other
params; this module supplies what is specific to the quantized layout:

* :func:`partition_specs` -- the ``PartitionSpec`` of every leaf of a quantized params tree,
  derived from the float model's specs.  A float kernel ``(K, N)`` with spec ``P(a, b)``
  becomes codes ``P(a, b)`` (codes are packed along K: 32 codes per ``bits`` uint32 rows),
  group/block scales and zero points ``P(a, b)``, per-channel scales ``P(None, b)`` (one
  scale row covers all of K), per-tensor scales / global scale / activation scale
  replicated, bias ``P(b)``.  Stacked experts ``(E, K, N)`` take ``P(e, a, b)``.
  A K shard must hold whole 32-code packing chunks, whole scale groups and whole
  activation scale groups (``K / shards % lcm(group_size, act_group_size, 32) == 0``); an
  N shard whole 2-D scale blocks (``N / shards % block_n == 0``).  Misalignment is a
  ``ValueError`` naming the sizes.  The spec of a bias that ``hj.quantize_params`` folded
  into its kernel's ``QuantizedWeight`` may stay in the float spec tree (checked, skipped).
* :func:`slice_weight` / :func:`local_weight` -- a shard of a :class:`QuantizedWeight` that is
  itself a valid ``QuantizedWeight`` with the local logical shape, so the per-device
  computation is plain :func:`humming_jax.quant_dense` (and any Pallas kernel) on it.
* :func:`column_parallel_dense` (N sharded, output sharded along N) and
  :func:`row_parallel_dense` (K sharded, fp32 partial outputs summed with ``psum``, bias
  added once).  With ``mesh=`` they wrap themselves in ``shard_map`` (and work under
  ``jax.jit`` with ``NamedSharding``-placed params); with ``mesh=None`` they are the
  per-device body for use inside the caller's own ``shard_map``.
* :func:`expert_parallel_moe` -- experts sharded over a mesh axis on top of
  ``hj.quant_ragged_dot``; tokens reach their experts by ``all_gather`` (small token
  counts: masked local compute, then ``psum``/``psum_scatter``) or ``all_to_all``.

Exactness (sharded == unsharded up to fp32 summation order): column-parallel always (each
device sees all of K).  Row-parallel: weight-only specs, static activation scales and
per-K-group activation scales whose groups lie inside a shard are local; *dynamic*
per-token / per-tensor activation scales (and NVFP4's tensor-level activation scale) depend
on all of K, so the shard's amax is combined with ``pmax`` over the axis first and the
activations quantized with that global scale -- never with a per-shard scale.  With
``batch_axis`` (tokens sharded too), tensor-level scales also take the ``pmax`` over the
batch axis, in both layers.  A NaN / inf reaches every shard its scale spans, as unsharded.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.tree_util import DictKey, SequenceKey, keystr

from humming_jax import ops
from humming_jax.packing import CODES_PER_CHUNK, packed_rows
# Names, not the module: the package re-exports a function called ``quantize``.
from humming_jax.quantize import (QuantizedActivations, QuantizedWeight, act_scale_shape,
                                  activation_group_amax, finite_amax, quantize_activations,
                                  scale_block, stacked_layers)

AxisName = str | tuple[str, ...]

__all__ = [
    "partition_specs", "weight_partition_spec", "named_shardings", "shard_params",
    "slice_weight", "local_weight", "column_parallel_dense", "row_parallel_dense",
    "expert_parallel_moe",
]


# ----------------------------------------------------------------------------------------
# Mesh helpers
# ----------------------------------------------------------------------------------------
def _axis_names(entry) -> tuple[str, ...]:
  """Mesh axis names of one PartitionSpec entry (None, a name, or a tuple of names)."""
  if entry is None:
    return ()
  if isinstance(entry, (tuple, list)):
    return tuple(entry)
  return (entry,)


def _mesh_sizes(mesh) -> dict[str, int] | None:
  """{axis name: size} of ``mesh`` (or the mesh set by ``jax.set_mesh``); None if none."""
  if mesh is None:  # Mesh and AbstractMesh both carry names and sizes
    am = jax.sharding.get_abstract_mesh()
    if am is None or am.empty:
      return None
    mesh = am
  return dict(zip(mesh.axis_names, mesh.axis_sizes))


def _shards(entry, sizes: dict[str, int] | None, what: str) -> int | None:
  names = _axis_names(entry)
  if sizes is None:
    return None
  n = 1
  for a in names:
    if a not in sizes:
      raise ValueError(f"{what}: mesh axis {a!r} is not in the mesh (axes "
                       f"{tuple(sizes)})")
    n *= sizes[a]
  return n


# ----------------------------------------------------------------------------------------
# Alignment rules
# ----------------------------------------------------------------------------------------
def _k_quantum(q: QuantizedWeight) -> tuple[int, str]:
  """Rows of K a K shard must be a multiple of (packing chunks, weight scale groups and
  activation scale groups), and what makes them up, for errors."""
  k, n = q.shape[-2:]
  spec = q.spec
  parts = {}
  if spec.granularity in ("group", "block"):  # channel / tensor scales do not split along K
    parts["group_size"] = scale_block(spec, k, n)[0]
  if spec.act is not None and spec.act_granularity == "group":  # quantized shard by shard
    parts["act_group_size"] = spec.act_group_size
  names = [f"{name}={v}" for name, v in parts.items()] + ["32-code packing chunks"]
  what = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
  return math.lcm(CODES_PER_CHUNK, *parts.values()), what


def _check_k_split(q: QuantizedWeight, shards: int, what: str) -> None:
  k = q.shape[-2]
  if shards <= 1:
    return
  if q.input_perm is not None:
    raise ValueError(f"{what}: act-order weights (input_perm set) cannot be split along K: "
                     "a shard's stored rows are not one block of x's columns; shard them "
                     "along N (column-parallel) or keep K whole")
  quantum, parts = _k_quantum(q)
  if k % shards or (k // shards) % quantum:
    raise ValueError(
        f"{what}: K={k} split over {shards} shards gives K/shards={k / shards:g} rows, "
        f"which must be a multiple of lcm({parts})={quantum}; "
        f"use a K divisible by {shards * quantum} or fewer shards")


def _check_n_split(q: QuantizedWeight, shards: int, what: str) -> None:
  n = q.shape[-1]
  if shards <= 1:
    return
  if n % shards:
    raise ValueError(f"{what}: N={n} is not divisible by {shards} shards")
  if q.spec.granularity == "block" and (n // shards) % q.spec.block_n:
    raise ValueError(f"{what}: N={n} over {shards} shards gives N/shards={n // shards}, "
                     f"not a multiple of block_n={q.spec.block_n} (2-D scale blocks may "
                     "not straddle shards)")


def _check_e_split(q: QuantizedWeight, shards: int, what: str) -> None:
  e = q.num_experts
  if shards > 1 and e % shards:
    raise ValueError(f"{what}: E={e} experts are not divisible by {shards} shards")


def _check_canonical(q: QuantizedWeight, what: str) -> None:
  if q.layout != "canonical":
    raise ValueError(f"{what}: params are in kernel layout {q.layout!r}; shard the "
                     "canonical params (hj.quantize output) and let each device prepare "
                     "its own shard")


# ----------------------------------------------------------------------------------------
# Partition specs
# ----------------------------------------------------------------------------------------
def weight_partition_spec(q: QuantizedWeight, float_spec: P | None, *, mesh=None,
                          what: str = "params") -> QuantizedWeight:
  """PartitionSpecs of one :class:`QuantizedWeight`'s leaves from its float kernel's spec.

  Returns a ``QuantizedWeight`` whose array leaves are ``PartitionSpec`` (None leaves stay
  None), usable wherever JAX takes a pytree of specs.  With a ``mesh`` (or one set by
  ``jax.set_mesh``) the split is validated against the sizes.
  """
  if not isinstance(q, QuantizedWeight):
    raise TypeError(f"{what} must be a QuantizedWeight; got {type(q).__name__}")
  _check_canonical(q, what)
  if layers := stacked_layers(q):
    return _stack_partition_spec(q, layers, float_spec, mesh, what)
  nd = len(q.shape)
  fs = tuple(float_spec) if float_spec is not None else ()
  if len(fs) > nd:
    raise ValueError(f"{what}: float spec {float_spec} has {len(fs)} entries for a weight of "
                     f"logical shape {q.shape}")
  fs = fs + (None,) * (nd - len(fs))
  *lead, a_k, a_n = fs
  sizes = _mesh_sizes(mesh)
  if a_k is not None and q.input_perm is not None:
    raise ValueError(f"{what}: act-order weights (input_perm set) cannot be split along K "
                     f"(float spec {float_spec}); shard them along N or keep K whole")
  s_k = _shards(a_k, sizes, what)
  s_n = _shards(a_n, sizes, what)
  if s_k is not None:
    _check_k_split(q, s_k, what)
    _check_n_split(q, s_n, what)
    if lead:
      _check_e_split(q, _shards(lead[0], sizes, what), what)
  k, n = q.shape[-2:]
  gk, gn = q.scales.shape[-2:]
  scale_spec = P(*lead, a_k if gk > 1 else None, a_n if gn > 1 else None)
  if q.spec.granularity == "tensor":  # one scale: never split even if K or N is
    scale_spec = P(*lead, None, None)
  return q.replace(
      codes=P(*lead, a_k, a_n),
      scales=scale_spec,
      zeros=None if q.zeros is None else scale_spec,
      global_scale=None if q.global_scale is None else P(*lead),
      bias=None if q.bias is None else P(*lead, a_n),
      act_scale=None if q.act_scale is None else P(),
      input_perm=None if q.input_perm is None else P())


def _stack_partition_spec(q: QuantizedWeight, layers: tuple[int, ...], float_spec: P | None,
                          mesh, what: str) -> QuantizedWeight:
  """A layer stack's specs (``quantize_params(scanned=)``): its float kernel's spec reads
  (layers..., K, N) as JAX reads a spec, from the left; the layer axes stay whole (a scan
  walks them) and each leaf takes one layer's spec behind them."""
  nl = len(layers)
  fs = tuple(float_spec) if float_spec is not None else ()
  if any(e is not None for e in fs[:nl]):
    raise ValueError(f"{what}: float spec {float_spec} splits the layer axes {layers} of a "
                     "layer stack; only its (K, N) dims can be sharded")
  one = jax.tree_util.tree_map(  # one layer's shapes (arrays or jax.eval_shape's structs)
      lambda a: jax.ShapeDtypeStruct(a.shape[nl:], a.dtype), q)
  inner = weight_partition_spec(one, P(*fs[nl:]), mesh=mesh, what=what)
  return jax.tree_util.tree_map(lambda spec: P(*(None,) * nl, *spec), inner,
                                is_leaf=lambda x: isinstance(x, P))


def _is_qw(x) -> bool:
  return isinstance(x, QuantizedWeight)


def _normalized_spec(spec: P | None, ndim: int) -> tuple[tuple[str, ...], ...]:
  """A spec's mesh axes per dim (``None``, ``P()`` and ``P(None)`` alike)."""
  entries = tuple(spec) if spec is not None else ()
  return tuple(_axis_names(e) for e in entries + (None,) * (ndim - len(entries)))


def _drop_folded_bias_specs(qtree: Any, stree: Any, path: tuple, folded: dict) -> Any:
  """``stree`` without the spec of each bias folded into its sibling quantized kernel.

  ``hj.quantize_params`` turns ``{"kernel": w, "bias": b}`` into ``{"kernel":
  QuantizedWeight(bias=b)}``; the float model's spec tree still has the ``bias`` entry.
  Its spec is recorded in ``folded`` under the kernel's path, to be checked against the
  spec the folded bias gets from the kernel's.
  """
  if isinstance(qtree, Mapping) and isinstance(stree, Mapping):
    kernel = qtree.get("kernel")
    fold = (_is_qw(kernel) and kernel.bias is not None and "bias" in stree
            and "bias" not in qtree)
    if fold:
      folded[keystr(path + (DictKey("kernel"),))] = stree["bias"]
    return type(stree)({
        k: _drop_folded_bias_specs(qtree[k], v, path + (DictKey(k),), folded)
        if k in qtree else v
        for k, v in stree.items() if not (fold and k == "bias")})
  if type(qtree) in (list, tuple) and type(stree) is type(qtree) and len(stree) == len(qtree):
    return type(stree)(_drop_folded_bias_specs(qv, sv, path + (SequenceKey(i),), folded)
                       for i, (qv, sv) in enumerate(zip(qtree, stree)))
  return stree


def partition_specs(qparams_tree: Any, float_specs_tree: Any, *,
                    mesh: Mesh | None = None) -> Any:
  """PartitionSpecs for every leaf of a quantized params tree, from the float model's specs.

  Args:
    qparams_tree: params tree where some float kernels were replaced by
      :class:`QuantizedWeight` (e.g. by ``hj.quantize`` or ``hj.quantize_params``); other
      leaves are kept.
    float_specs_tree: the float model's spec tree (same structure as the float params):
      a ``PartitionSpec`` (or None = replicated) where each kernel / array was.  The spec
      of a ``bias`` that ``hj.quantize_params`` folded into its sibling quantized
      ``kernel`` may stay: it is skipped, after checking it equals the spec the folded bias
      takes from the kernel's (its N entry; ValueError if not).
    mesh: optional; when given (or set with ``jax.set_mesh``), every split is checked for
      divisibility and quantized-layout alignment (ValueError naming the sizes).

  Returns:
    A tree shaped like ``qparams_tree``: each ``QuantizedWeight`` becomes one whose leaves
    are PartitionSpecs (see :func:`weight_partition_spec`); other leaves keep their spec.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(qparams_tree, is_leaf=_is_qw)
  folded = {}
  float_specs_tree = _drop_folded_bias_specs(qparams_tree, float_specs_tree, (), folded)
  try:
    specs = treedef.flatten_up_to(float_specs_tree)
  except (ValueError, TypeError) as e:
    raise ValueError("float_specs_tree must have the structure of the float params tree "
                     f"(a PartitionSpec where each quantized kernel is): {e}") from None
  out = []
  for (path, leaf), spec in zip(leaves, specs):
    where = keystr(path)
    if spec is not None and not isinstance(spec, P):
      raise TypeError(f"float spec at {where} must be a PartitionSpec "
                      f"or None; got {type(spec).__name__}")
    if not _is_qw(leaf):
      out.append(P() if spec is None else spec)
      continue
    wspec = weight_partition_spec(leaf, spec, mesh=mesh, what=f"params{where}")
    if where in folded:
      bias_spec = folded[where]
      if bias_spec is not None and not isinstance(bias_spec, P):
        raise TypeError(f"float spec of the bias folded into params{where} must be a "
                        f"PartitionSpec or None; got {type(bias_spec).__name__}")
      if _normalized_spec(bias_spec, leaf.bias.ndim) != _normalized_spec(wspec.bias,
                                                                         leaf.bias.ndim):
        raise ValueError(f"float spec {bias_spec} of the bias folded into params{where} "
                         f"contradicts the kernel's {spec}: the folded bias is placed with "
                         f"the kernel's N entry, {wspec.bias}; give the bias that spec (or "
                         "leave it out of float_specs_tree)")
    out.append(wspec)
  return jax.tree_util.tree_unflatten(treedef, out)


def named_shardings(qparams_tree: Any, float_specs_tree: Any, mesh: Mesh) -> Any:
  """:func:`partition_specs` as ``NamedSharding``\\ s on ``mesh`` (validated)."""
  specs = partition_specs(qparams_tree, float_specs_tree, mesh=mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                      is_leaf=lambda x: isinstance(x, P))


def shard_params(qparams_tree: Any, float_specs_tree: Any, mesh: Mesh) -> Any:
  """``jax.device_put`` a quantized params tree with the shardings of the float model."""
  return jax.device_put(qparams_tree, named_shardings(qparams_tree, float_specs_tree, mesh))


# ----------------------------------------------------------------------------------------
# Local shards
# ----------------------------------------------------------------------------------------
def _dslice(a: jax.Array, axis: int, index, size: int) -> jax.Array:
  if isinstance(index, int):
    return lax.slice_in_dim(a, index * size, (index + 1) * size, axis=axis)
  return lax.dynamic_slice_in_dim(a, index * size, size, axis=axis)


def slice_weight(q: QuantizedWeight, dim: Literal["k", "n", "e"], index: int | jax.Array,
                 num_shards: int) -> QuantizedWeight:
  """Shard ``index`` of ``num_shards`` of ``q`` along K, N or the expert dim E.

  The result is a valid ``QuantizedWeight`` of the local logical shape: a K shard takes
  whole packed 32-code chunks (``bits`` uint32 rows each) and whole scale groups; per-channel
  / per-tensor scales, the global scale and the bias are kept (row-parallel code adds the
  bias once, after the sum).  ``index`` may be traced (e.g. ``lax.axis_index``).
  """
  _check_canonical(q, "slice_weight")
  if dim not in ("k", "n", "e"):
    raise ValueError(f"dim={dim!r}; expected 'k', 'n' or 'e'")
  if not isinstance(num_shards, int) or num_shards < 1:
    raise ValueError(f"num_shards={num_shards!r} must be a positive int")
  if isinstance(index, int) and not 0 <= index < num_shards:
    raise ValueError(f"index={index} is out of range for num_shards={num_shards}")
  shape = list(q.shape)
  k, n = q.shape[-2:]
  gk, gn = q.scales.shape[-2:]
  kw = {}
  if dim == "k":
    _check_k_split(q, num_shards, "slice_weight")
    kl = k // num_shards
    kw["codes"] = _dslice(q.codes, -2, index, packed_rows(kl, q.spec.weight_bits))
    if gk > 1:
      kw["scales"] = _dslice(q.scales, -2, index, gk // num_shards)
      if q.zeros is not None:
        kw["zeros"] = _dslice(q.zeros, -2, index, gk // num_shards)
    shape[-2] = kl
  elif dim == "n":
    _check_n_split(q, num_shards, "slice_weight")
    nl = n // num_shards
    kw["codes"] = _dslice(q.codes, -1, index, nl)
    if gn > 1:
      kw["scales"] = _dslice(q.scales, -1, index, gn // num_shards)
      if q.zeros is not None:
        kw["zeros"] = _dslice(q.zeros, -1, index, gn // num_shards)
    if q.bias is not None:
      kw["bias"] = _dslice(q.bias, -1, index, nl)
    shape[-1] = nl
  else:
    if q.num_experts is None:
      raise ValueError(f"dim='e' needs stacked experts (E, K, N); got shape {q.shape}")
    _check_e_split(q, num_shards, "slice_weight")
    el = q.num_experts // num_shards
    for f in ("codes", "scales", "zeros", "global_scale", "bias"):
      v = getattr(q, f)
      if v is not None:
        kw[f] = _dslice(v, 0, index, el)
    shape[0] = el
  return q.replace(shape=tuple(shape), **kw)


def local_weight(q: QuantizedWeight) -> QuantizedWeight:
  """Inside ``shard_map``: the local shard as a valid ``QuantizedWeight``.

  ``shard_map`` hands each device its block of every leaf but leaves the static aux data
  (the *global* logical shape) untouched; this recomputes the logical shape from the
  local leaves (codes rows -> K, columns -> N, leading dim -> E) and checks the other leaves
  agree with it.
  """
  _check_canonical(q, "local_weight")
  bits = q.spec.weight_bits
  *lead_g, k_g, n_g = q.shape
  *lead, rows, n = q.codes.shape
  if rows == packed_rows(k_g, bits):
    k = k_g
  elif rows % bits == 0:
    k = rows // bits * CODES_PER_CHUNK
  else:
    raise ValueError(f"local codes have {rows} rows: not whole {bits}-row packing chunks")
  if q.input_perm is not None and q.input_perm.shape != (k,):
    raise ValueError(f"local_weight: act-order weights (input_perm of {q.input_perm.shape[0]}"
                     f" rows) split along K to {k} rows; shard them along N")
  out = q.replace(shape=(*lead, k, n))
  gk, gn = out.scales.shape[-2:]
  bk, bn = scale_block(q.spec, k, n)
  if q.spec.granularity != "tensor" and (gk, gn) != (k // bk, n // bn):
    raise ValueError(f"local scales {tuple(out.scales.shape)} do not match the local weight "
                     f"(K={k}, N={n}) of spec {q.spec.name}: the params were not sharded "
                     "with hj.partition_specs")
  if out.bias is not None and out.bias.shape[-1] != n:
    raise ValueError(f"local bias {tuple(out.bias.shape)} does not match local N={n}")
  return out


# ----------------------------------------------------------------------------------------
# Tensor parallel dense
# ----------------------------------------------------------------------------------------
def _weight_only(q: QuantizedWeight) -> QuantizedWeight:
  """The same weight with activations left unquantized (the spec's act fields cleared)."""
  return q.replace(spec=q.spec.weight_only(), act_scale=None)


def _has_tensor_act_scale(spec) -> bool:
  """A dynamic activation scale over all tokens and all of K: a per-tensor scale, or the
  fp32 tensor factor of two-level (NVFP4-style, e4m3) scales."""
  return spec.act_granularity == "tensor" or spec.act_scale_dtype == "fp8_e4m3"


def _activation_plan(spec, k_split: bool, m_split: bool) -> str:
  """How a shard keeps activation quantization equal to the unsharded one, with K split
  over devices (row-parallel) and / or the tokens (``batch_axis``)."""
  if spec.act is None or spec.act_static:
    return "local"  # nothing dynamic, or one calibrated scale every shard has
  if _has_tensor_act_scale(spec):
    if not (k_split or m_split):
      return "local"
    if spec.act_granularity == "tensor" and spec.act_scale_dtype != "fp8_e4m3":
      return "static"  # global amax -> one scale -> the static-scale kernel path
    return "global_fake_quant"  # two-level (e4m3) scales: the fp32 factor needs all shards
  if spec.act_granularity == "token" and k_split:
    return "global_fake_quant"  # a token's scale needs its whole row
  return "local"  # whole rows, or K groups inside a shard (K alignment is checked)


def _global_amax(amax: jax.Array, bad: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """``pmax`` over ``axes`` of scale-group amaxes (:func:`activation_group_amax`), +inf
  where any shard's part of the group holds NaN / inf.  +inf, not NaN, marks the bad
  groups: XLA's CPU max drops NaN; the quantizer turns an inf amax into a NaN scale, as
  unsharded.  One collective carries both."""
  amax = jnp.where(bad, jnp.inf, amax)
  return lax.pmax(amax, axes) if axes else amax


def _shard_product(q: QuantizedWeight, x2: jax.Array, k_axes: tuple[str, ...],
                   m_axes: tuple[str, ...], backend, partial_dtype) -> jax.Array:
  """``x2 @ q`` on this shard (a partial sum when K is split over ``k_axes``; tokens split
  over ``m_axes``), the activations quantized exactly as the unsharded layer would."""
  spec = q.spec
  plan = _activation_plan(spec, bool(k_axes), bool(m_axes))
  cdt = partial_dtype or x2.dtype  # what the kernel takes and returns
  if spec.act is not None and spec.act_granularity == "group" and \
      q.in_features % spec.act_group_size:
    raise ValueError(f"row-parallel: local K={q.in_features} is not a multiple of "
                     f"act_group_size={spec.act_group_size}")
  if plan == "local":
    return ops.quant_dense(q, x2.astype(cdt), backend=backend)
  x32 = x2.astype(jnp.float32)
  m, kl = x32.shape
  amax, bad = activation_group_amax(x32, spec)
  # The shards a scale group spans: a token's all of K, the tensor's every shard.
  spans = {"token": k_axes, "tensor": k_axes + m_axes}.get(spec.act_granularity, ())
  amax = _global_amax(amax, bad, spans)
  if plan == "static":
    # Scale of the global amax, computed by the library's own activation quantizer.
    s = quantize_activations(amax, spec).scales.reshape(())
    # (s is already the spec's dynamic scale, act_mx_rounding applied: the static spec
    # takes it as it is)
    static = q.replace(spec=spec.replace(act_static=True, act_mx_rounding="floor"),
                       act_scale=s)
    return ops.quant_dense(static, x2.astype(cdt), backend=backend)
  # Sentinels holding the global amaxes make the local quantizer derive exactly the
  # unsharded scales: a column with each token's (token scales), a row with the tensor's
  # (NVFP4's fp32 factor: the amax over the finite groups of all shards).  They are dropped
  # and the dequantized activations fed to the weight-only path (equal numbers; on GPU
  # this path uses the WnA16 kernel).
  xe = x32
  if spec.act_granularity == "token":
    xe = jnp.concatenate([xe, amax], axis=1)
  if _has_tensor_act_scale(spec):
    tensor = amax if spec.act_granularity == "tensor" else lax.pmax(
        finite_amax(amax, ~jnp.isfinite(amax)), k_axes + m_axes)
    xe = jnp.concatenate([xe, jnp.broadcast_to(tensor, (1, xe.shape[1]))], axis=0)
  qa = quantize_activations(xe, spec)
  gm, gk = act_scale_shape(spec, m, kl)
  a_deq = QuantizedActivations(qa.values[:m, :kl], qa.scales[:gm, :gk]).dequantize()
  return ops.quant_dense(_weight_only(q), a_deq.astype(cdt), backend=backend)


def _place(tree: Any, specs: Any, mesh: Mesh) -> Any:
  """Reshard ``tree`` to ``specs`` on ``mesh`` (no-op when already placed so)."""
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                           is_leaf=lambda x: isinstance(x, P))
  explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
  if explicit:  # shard_map on an Explicit mesh insists on matching input shardings
    return jax.reshard(tree, shardings)
  return lax.with_sharding_constraint(tree, shardings)


@functools.lru_cache(maxsize=256)
def _sharded_fn(body: Callable, static: tuple, mesh: Mesh, spec_leaves: tuple, spec_tree,
                out_specs) -> Callable:
  """``jax.jit(shard_map(body))``, built once per static configuration."""
  in_specs = jax.tree.unflatten(spec_tree, spec_leaves)
  f = jax.shard_map(functools.partial(body, **dict(static)), mesh=mesh, in_specs=in_specs,
                    out_specs=out_specs, check_vma=False)  # Pallas kernels do not track vma
  return jax.jit(lambda *a: f(*_place(a, in_specs, mesh)))


def _call_sharded(body: Callable, static: dict, mesh: Mesh, in_specs: tuple, out_specs,
                  *args) -> Any:
  """Run ``body(*args, **static)`` under ``shard_map`` on ``args`` moved to ``in_specs``
  (inside jit when traced).  The jitted function is cached on everything static (a fresh
  one per call would retrace and recompile on every eager call)."""
  leaves, tree = jax.tree.flatten(in_specs, is_leaf=lambda s: isinstance(s, P))
  static = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)  # hashable axis names
                        for k, v in static.items()))
  return _sharded_fn(body, static, mesh, tuple(leaves), tree, out_specs)(*args)


def _x_spec(ndim: int, last, batch_axis) -> P:
  return P(batch_axis, *([None] * (ndim - 2)), last) if ndim >= 2 else P(last)


def _check_dense(params, x, what):
  if not isinstance(params, QuantizedWeight):
    raise TypeError(f"params must be a QuantizedWeight (from hj.quantize); got "
                    f"{type(params).__name__}")
  if params.num_experts is not None:
    raise ValueError(f"{what}: params hold stacked experts {params.shape}; use "
                     "expert_parallel_moe")
  _check_canonical(params, what)
  x = jnp.asarray(x)
  if x.ndim < 1:
    raise ValueError(f"{what}: x must be (..., K); got a scalar")
  return x


def _column_body(p, xl, *, axis, batch_axis, backend, gather_output):
  p = local_weight(p)
  m_axes = _axis_names(batch_axis)
  if _activation_plan(p.spec, k_split=False, m_split=bool(m_axes)) == "local":
    y = ops.quant_dense(p, xl, backend=backend)
  else:  # a tensor-level activation scale spans the tokens of every batch shard; fp32
    # keeps the dequantized activations exact (one cast at the end, as unsharded)
    y = _shard_product(p, xl.reshape(-1, xl.shape[-1]), (), m_axes, backend, jnp.float32)
    y = y.astype(xl.dtype).reshape(*xl.shape[:-1], p.out_features)
  if gather_output:
    y = lax.all_gather(y, axis, axis=y.ndim - 1, tiled=True)
  return y


def column_parallel_dense(params: QuantizedWeight, x: jax.Array, *, axis: AxisName,
                          mesh: Mesh | None = None, backend: ops.Backend = None,
                          gather_output: bool = False, batch_axis: AxisName | None = None
                          ) -> jax.Array:
  """``x @ W + b`` with W's output features (N) sharded over mesh ``axis``.

  Each device computes ``x @ W[:, n_shard] + b[n_shard]`` with all of K, so the result
  equals the unsharded one exactly.  The output stays sharded along N (feed it to a
  row-parallel layer) unless ``gather_output``.

  Args:
    params: the full params (with ``mesh``; placed or not -- jit reshards to
      ``partition_specs(params, P(None, axis))``), or, with ``mesh=None``, the local shard
      inside the caller's ``shard_map``.
    x: (..., K) activations, replicated over ``axis``.
    axis: mesh axis name (or tuple of names) that shards N.
    mesh: wrap in ``shard_map`` over this mesh; None = already inside ``shard_map``.
    backend: as for ``hj.quant_dense``.
    gather_output: all-gather the output along N (replicated result).
    batch_axis: mesh axis that shards x's leading dim (data parallel), or None.  A
      dynamic tensor-level activation scale (per-tensor, NVFP4's fp32 factor) spans all
      tokens: its amax is combined with ``pmax`` over ``batch_axis`` (with ``mesh=None``
      too: name the axis your ``shard_map`` splits the tokens over).
  """
  x = _check_dense(params, x, "column_parallel_dense")
  static = dict(axis=axis, batch_axis=batch_axis, backend=backend,
                gather_output=gather_output)
  if mesh is None:
    return _column_body(params, x, **static)
  pspec = weight_partition_spec(params, P(None, axis), mesh=mesh,
                                what="column_parallel_dense params")
  xspec = _x_spec(x.ndim, None, batch_axis)
  ospec = _x_spec(x.ndim, None if gather_output else axis, batch_axis)
  return _call_sharded(_column_body, static, mesh, (pspec, xspec), ospec, params, x)


def _row_body(p, xl, *, axis, batch_axis, backend, partial_dtype):
  p = local_weight(p)
  if xl.shape[-1] != p.in_features:
    raise ValueError(f"row_parallel_dense: local x has {xl.shape[-1]} features, the "
                     f"local weight K={p.in_features}")
  lead = xl.shape[:-1]
  y = _shard_product(p.replace(bias=None), xl.reshape(-1, xl.shape[-1]), _axis_names(axis),
                     _axis_names(batch_axis), backend, partial_dtype)
  y = lax.psum(y.astype(jnp.float32), axis)
  if p.bias is not None:
    y = y + p.bias
  return y.astype(xl.dtype).reshape(*lead, p.out_features)


def row_parallel_dense(params: QuantizedWeight, x: jax.Array, *, axis: AxisName,
                       mesh: Mesh | None = None, backend: ops.Backend = None,
                       batch_axis: AxisName | None = None,
                       partial_dtype: Any = jnp.float32) -> jax.Array:
  """``x @ W + b`` with W's input features (K) sharded over mesh ``axis``.

  Each device multiplies its K shard of ``x`` by its K shard of W into an fp32 partial,
  the partials are summed with ``psum`` (fp32, like the unsharded accumulator) and the bias
  is added once, after the sum.  Dynamic activation scales that depend on all of K
  (per-token, per-tensor, NVFP4's tensor scale) are computed from the ``pmax`` of the
  shards' amax, so the activations are quantized exactly as unsharded (see module doc).

  Args:
    params: full params with ``mesh`` (K shards must align with scale groups and 32-code
      packing chunks), or the local K shard inside the caller's ``shard_map``.
    x: (..., K) activations; with ``mesh`` sharded (or resharded by jit) along K over
      ``axis``; inside ``shard_map`` the local (..., K/shards) block.
    axis: mesh axis name (or tuple) that shards K.
    mesh: wrap in ``shard_map`` over this mesh; None = already inside ``shard_map``.
    backend: as for ``hj.quant_dense``.
    batch_axis: mesh axis that shards x's leading dim (data parallel), or None.  Tensor-
      level activation scales (per-tensor, NVFP4's fp32 factor) take the ``pmax`` over
      ``axis`` and ``batch_axis`` (with ``mesh=None`` too: name the axis your
      ``shard_map`` splits the tokens over).
    partial_dtype: dtype the per-shard GEMM takes and returns.  float32 (default): the
      partials are exactly the unsharded fp32 accumulator's pieces, but a GPU kernel then
      computes in fp32.  None: x's own dtype (bf16 tensor cores); each partial is rounded
      to it before the fp32 psum (a few bf16 ulps from unsharded).

  Returns:
    (..., N) in x's dtype, replicated over ``axis``.
  """
  x = _check_dense(params, x, "row_parallel_dense")
  static = dict(axis=axis, batch_axis=batch_axis, backend=backend,
                partial_dtype=partial_dtype)
  if mesh is None:
    return _row_body(params, x, **static)
  pspec = weight_partition_spec(params, P(axis, None), mesh=mesh,
                                what="row_parallel_dense params")
  if x.shape[-1] != params.in_features:
    raise ValueError(f"row_parallel_dense: x.shape[-1] must equal K={params.in_features}; "
                     f"got x.shape={x.shape}")
  xspec = _x_spec(x.ndim, axis, batch_axis)
  return _call_sharded(_row_body, static, mesh, (pspec, xspec),
                       _x_spec(x.ndim, None, batch_axis), params, x)


# ----------------------------------------------------------------------------------------
# Expert parallel MoE
# ----------------------------------------------------------------------------------------
def _check_ep_spec(q: QuantizedWeight, name: str) -> None:
  spec = q.spec
  if spec.act is not None and not spec.act_static and _has_tensor_act_scale(spec):
    # The grouped GEMM's dynamic per-tensor scale spans all rows it is given; a device
    # only holds its experts' rows, so the scale would differ from the unsharded one.
    raise ValueError(f"expert_parallel_moe: {name} spec {spec.name} has a dynamic "
                     "tensor-level activation scale, which depends on rows held by other "
                     "devices; use per-token/per-group activation scales or a static scale")


def _local_moe(gu: QuantizedWeight, dn: QuantizedWeight, x: jax.Array, w: jax.Array,
               local_ids: jax.Array, activation: str, backend) -> jax.Array:
  """(T, H) fp32 contribution of this device's experts; ids outside [0, E_local) add 0."""
  from humming_jax import moe  # a sibling module; imported late to keep import order free
  r = moe.sort_tokens(local_ids, gu.num_experts)
  xs = jnp.take(x, r.token_of_row, axis=0)
  hid = moe.quant_ragged_dot(gu, xs, r.group_sizes, backend=backend)
  ys = moe.quant_ragged_dot(dn, moe.glu(hid, activation), r.group_sizes, backend=backend)
  # Combine in fp32 and keep fp32: partials are summed over devices before the one cast.
  return moe.combine(ys.astype(jnp.float32), w, r)


def _ep_all_gather(gu, dn, x, w, ids, axis, tokens_sharded, activation, backend):
  if tokens_sharded:  # gather every device's tokens; scatter the sums back afterwards
    x, w, ids = (lax.all_gather(v, axis, axis=0, tiled=True) for v in (x, w, ids))
  first = lax.axis_index(axis) * gu.num_experts
  y = _local_moe(gu, dn, x, w, ids.astype(jnp.int32) - first, activation, backend)
  if tokens_sharded:
    return lax.psum_scatter(y, axis, scatter_dimension=0, tiled=True)
  return lax.psum(y, axis)


def _ep_all_to_all(gu, dn, x, w, ids, axis, activation, backend):
  from humming_jax import moe
  t, k = ids.shape
  e_l = gu.num_experts
  d = lax.axis_size(axis)
  cap = t * k  # worst case: every local assignment goes to one device (no drops)
  ids = ids.astype(jnp.int32)
  valid = (ids >= 0) & (ids < d * e_l)
  dest = jnp.where(valid, ids // e_l, d)  # d = nowhere
  by_dest = moe.sort_tokens(dest, d)  # assignments sorted by destination device
  start = jnp.cumsum(by_dest.group_sizes) - by_dest.group_sizes
  flat_dest = dest.reshape(-1)[by_dest.slot_of_row]
  pos = jnp.arange(t * k, dtype=jnp.int32) - start[jnp.minimum(flat_dest, d - 1)]
  slot = jnp.where(flat_dest < d, flat_dest * cap + pos, d * cap)  # send-buffer slot
  eid = (ids % e_l).reshape(-1)[by_dest.slot_of_row]
  send_x = jnp.zeros((d * cap, x.shape[1]), x.dtype).at[slot].set(
      jnp.take(x, by_dest.token_of_row, axis=0), mode="drop")
  send_e = jnp.full((d * cap,), e_l, jnp.int32).at[slot].set(eid, mode="drop")
  recv_x = lax.all_to_all(send_x.reshape(d, cap, -1), axis, 0, 0).reshape(d * cap, -1)
  recv_e = lax.all_to_all(send_e.reshape(d, cap), axis, 0, 0).reshape(d * cap, 1)
  # Every received row is its own "token" with top-1 weight 1; empty slots hold id e_l.
  r = moe.sort_tokens(recv_e, e_l)
  hid = moe.quant_ragged_dot(gu, jnp.take(recv_x, r.token_of_row, axis=0), r.group_sizes,
                             backend=backend)
  ys = moe.quant_ragged_dot(dn, moe.glu(hid, activation), r.group_sizes, backend=backend)
  out_rows = jnp.take(ys, r.row_of_slot, axis=0)  # back to receive order (zeros if empty)
  back = lax.all_to_all(out_rows.reshape(d, cap, -1), axis, 0, 0).reshape(d * cap, -1)
  # Assignment (t, j) was sent to slot[row_of_slot(t, j)].
  my_slot = slot[by_dest.row_of_slot].reshape(t, k)
  g = jnp.take(back, my_slot, axis=0, mode="fill", fill_value=0).astype(jnp.float32)
  return jnp.einsum("tkn,tk->tn", g, w.astype(jnp.float32))


def _moe_body(gu, dn, xl, wl, il, *, axis, dispatch, tokens_sharded, activation, backend):
  gu, dn = local_weight(gu), local_weight(dn)
  if gu.num_experts != dn.num_experts or dn.shape[1:] != (gu.out_features // 2,
                                                          gu.in_features):
    raise ValueError(f"expert_parallel_moe: local gate_up {gu.shape} and down "
                     f"{dn.shape} do not match (E, H, 2I) / (E, I, H)")
  if dispatch == "all_gather":
    y = _ep_all_gather(gu, dn, xl, wl, il, axis, tokens_sharded, activation, backend)
  else:
    y = _ep_all_to_all(gu, dn, xl, wl, il, axis, activation, backend)
  return y.astype(xl.dtype)


def expert_parallel_moe(gate_up: QuantizedWeight, down: QuantizedWeight, x: jax.Array,
                        topk_weights: jax.Array, topk_ids: jax.Array, *, axis: AxisName,
                        mesh: Mesh | None = None,
                        dispatch: Literal["all_gather", "all_to_all"] = "all_gather",
                        tokens_sharded: bool | None = None, activation: str = "silu",
                        backend: ops.Backend = None) -> jax.Array:
  """``hj.quant_moe`` with the experts sharded over mesh ``axis`` (expert parallelism).

  Device ``i`` of ``D`` holds experts ``[i*E/D, (i+1)*E/D)`` of ``gate_up`` (E, H, 2I) and
  ``down`` (E, I, H).  Tokens meet their experts by

  * ``dispatch="all_gather"`` (small token counts, decode): every device runs its experts
    on all tokens' assignments that route to it (``hj.quant_ragged_dot`` skips the rows of
    other devices' experts: they sort past ``sum(group_sizes)``), the fp32 partial outputs
    are summed with ``psum`` -- or, when tokens are sharded, all-gathered first and
    ``psum_scatter``-ed back.
  * ``dispatch="all_to_all"`` (tokens sharded along T): each device sends every (token,
    slot) assignment to the device owning its expert, computes, and sends the rows back;
    the top-k combine happens on the token's home device.  The buffers are sized for the
    worst case (T_local * k rows per destination), so no token is ever dropped.

  Results equal the unsharded ``hj.quant_moe`` up to fp32 summation order, for any
  routing (uneven loads, empty experts, invalid ids contribute nothing).

  Args:
    gate_up, down: stacked-expert params (full with ``mesh``; the local expert shard
      inside the caller's ``shard_map`` with ``mesh=None``).  E must divide by D.
    x: (T, H) tokens; replicated over ``axis`` or, with ``tokens_sharded``, sharded along T
      (T divisible by D).
    topk_weights, topk_ids: (T, k), laid out like ``x``.
    axis: mesh axis name (or tuple) the experts are sharded over.
    mesh: wrap in ``shard_map``; None = already inside one.
    dispatch: "all_gather" or "all_to_all" (see above).
    tokens_sharded: whether x is sharded along T; default False for all_gather and True
      for all_to_all (which requires it).
    activation: "silu", "gelu" or "swigluoai", as ``hj.quant_moe``.
    backend: as ``hj.quant_ragged_dot``.

  Returns:
    (T, H) in x's dtype, laid out like ``x``.
  """
  from humming_jax import moe
  for name, p in (("gate_up", gate_up), ("down", down)):
    if not isinstance(p, QuantizedWeight) or p.num_experts is None:
      raise TypeError(f"{name} must be a stacked-expert QuantizedWeight (E, K, N); got "
                      f"{getattr(p, 'shape', type(p).__name__)}")
    _check_canonical(p, f"expert_parallel_moe {name}")
    _check_ep_spec(p, name)
  if dispatch not in ("all_gather", "all_to_all"):
    raise ValueError(f"dispatch={dispatch!r}; expected 'all_gather' or 'all_to_all'")
  if tokens_sharded is None:
    tokens_sharded = dispatch == "all_to_all"
  if dispatch == "all_to_all" and not tokens_sharded:
    raise ValueError("dispatch='all_to_all' needs tokens sharded along T over the axis "
                     "(tokens_sharded=True); replicated tokens use dispatch='all_gather'")
  moe.check_activation(activation)
  # quant_moe's own checks of the tokens and ids, on the (global or local) arrays here.
  ops.check_activations(x, "expert_parallel_moe")
  x = jnp.asarray(x)
  h = gate_up.in_features
  if x.ndim != 2 or x.shape[1] != h:
    raise ValueError(f"expert_parallel_moe: x must be (tokens, H={h}); got shape {x.shape}")
  if topk_weights.shape != topk_ids.shape or topk_ids.shape[:1] != x.shape[:1]:
    raise ValueError(f"expert_parallel_moe: topk_weights {topk_weights.shape} and topk_ids "
                     f"{topk_ids.shape} must both be (tokens={x.shape[0]}, k)")
  moe._check_ids(topk_ids, gate_up.num_experts)
  if x.shape[0] == 0 or topk_ids.shape[1] == 0:  # nothing routed, as quant_moe
    return jnp.zeros((x.shape[0], h), x.dtype)
  static = dict(axis=axis, dispatch=dispatch, tokens_sharded=tokens_sharded,
                activation=activation, backend=backend)
  if mesh is None:
    return _moe_body(gate_up, down, x, topk_weights, topk_ids, **static)
  sizes = _mesh_sizes(mesh)
  d = _shards(axis, sizes, "expert_parallel_moe axis")
  if tokens_sharded and x.shape[0] % d:
    raise ValueError(f"expert_parallel_moe: T={x.shape[0]} tokens are not divisible by "
                     f"the {d} devices of axis {axis!r} (tokens_sharded=True)")
  gspec = weight_partition_spec(gate_up, P(axis, None, None), mesh=mesh, what="gate_up")
  dspec = weight_partition_spec(down, P(axis, None, None), mesh=mesh, what="down")
  tspec = P(axis, None) if tokens_sharded else P(None, None)
  return _call_sharded(_moe_body, static, mesh, (gspec, dspec, tspec, tspec, tspec), tspec,
                       gate_up, down, x, topk_weights, topk_ids)
