"""Quantize a whole params tree by rules: ``quantize_params(params, recipe)``.

A *recipe* maps patterns to what a matching 2-D kernel becomes::

    recipe = {
        "encoder/layer_0/attention/self/query/kernel": None,  # exact path: keep float
        "re:attention": "w8a8-fp8",                           # regex (re.search on the path)
        "*": "w4a16-g128",                                    # every other 2-D kernel
    }
    qparams = hj.quantize_params(params, recipe)

Precedence: an exact '/'-joined path beats a ``re:`` regex beats ``*``; among several
matching regexes the first in the recipe's order wins.  A value is a preset name
(:data:`humming_jax.spec.PRESETS`), a :class:`QuantSpec`, or ``None`` (keep the float
array).  Exact paths may name the kernel leaf (``.../query/kernel``) or its layer
(``.../query``).  Only leaves named ``kernel`` with two dimensions (Flax Dense / nnx Linear
layout (in, out)) are candidates; everything else (embeddings, norms, biases) is kept.

Bias convention (the same in :mod:`humming_jax.nn` and :mod:`humming_jax.nnx`): the bias of
a quantized layer moves *into* its :class:`QuantizedWeight` (``bias=``, kept in float32 and
added inside ``quant_dense``); the sibling ``bias`` leaf disappears from the tree, so a
quantized Dense's params are ``{"kernel": QuantizedWeight}``.

Named recipes (:data:`RECIPES`) are the field's known-good mixes, with layer-name
patterns for BERT-like (``attention/self/query``, ``intermediate/dense``, ``output/dense``)
and Llama-like (``self_attn/q_proj``, ``mlp/gate_proj``) trees.
"""
from __future__ import annotations

import functools
import re
import warnings
from typing import Any, Mapping, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from humming_jax.quantize import QuantizedWeight, _is_concrete, quantize, stacked_layers
from humming_jax.spec import QuantSpec

RecipeValue = Union[str, QuantSpec, None]
Recipe = Mapping[str, RecipeValue]
Scanned = Union[Sequence[str], Mapping[str, int]]  # module paths of nn.scan stacks

# Attention projections: BERT (attention/self/{query,key,value}, attention/output/dense),
# Llama / HF (self_attn/{q,k,v,o}_proj), generic (attn/{q,k,v,o,qkv,out}).
ATTENTION_PATTERN = (r"re:(attention/(self/(query|key|value)|output/dense)"
                     r"|(self_attn|attn|attention)/(q_proj|k_proj|v_proj|o_proj|qkv_proj"
                     r"|q|k|v|o|qkv|out|query|key|value))(/kernel)?$")
# MLP projections: BERT (intermediate/dense, the layer's output/dense -- not the attention
# one, which the attention pattern takes first), Llama (mlp/{gate,up,down}_proj), generic.
MLP_PATTERN = (r"re:((^|/)intermediate/dense|(^|/)output/dense"
               r"|(mlp|feed_forward|ffn)/(gate_proj|up_proj|down_proj|w1|w2|w3|wi|wo"
               r"|fc1|fc2|gate_up|down))(/kernel)?$")

RECIPES: dict[str, dict[str, RecipeValue]] = {
    # One format everywhere (every 2-D kernel).
    "w4a16-all": {"*": "w4a16-g128"},
    "w8a16-all": {"*": "w8a16"},
    "w8a8-fp8-all": {"*": "w8a8-fp8"},
    "w8a8-int8-all": {"*": "w8a8-int8"},
    "nvfp4-all": {"*": "w4a4-nvfp4"},
    "nvfp4-weights-all": {"*": "w4a16-nvfp4"},
    "mxfp4-all": {"*": "w4a16-mxfp4"},
    # Mixed: attention is the more sensitive part (few, small matrices), the MLP holds
    # two thirds of the weights. Unmatched kernels (heads, poolers) stay float.
    "fp8-attn-nvfp4-mlp": {ATTENTION_PATTERN: "w8a8-fp8", MLP_PATTERN: "w4a4-nvfp4"},
    "fp8-attn-w4a16-mlp": {ATTENTION_PATTERN: "w8a8-fp8", MLP_PATTERN: "w4a16-g128"},
    "w8a16-attn-w4a16-mlp": {ATTENTION_PATTERN: "w8a16", MLP_PATTERN: "w4a16-g128"},
}


def path_str(path) -> str:
  """'/'-joined string of a jax key path (dict keys, attributes, sequence indices)."""
  parts = []
  for p in path:
    for attr in ("key", "name", "idx"):
      if hasattr(p, attr):
        parts.append(str(getattr(p, attr)))
        break
    else:
      parts.append(str(p))
  return "/".join(parts)


def get_recipe(recipe: Recipe | str) -> dict[str, RecipeValue]:
  """A recipe dict from a dict or a :data:`RECIPES` name; validates every entry."""
  if isinstance(recipe, str):
    if recipe not in RECIPES:
      raise ValueError(f"unknown recipe {recipe!r}; expected a dict or one of "
                       f"{sorted(RECIPES)}")
    recipe = RECIPES[recipe]
  if not isinstance(recipe, Mapping):
    raise TypeError(f"recipe must be a mapping pattern -> spec or a recipe name; got "
                    f"{type(recipe).__name__}")
  out: dict[str, RecipeValue] = {}
  for pat, val in recipe.items():
    if not isinstance(pat, str) or not pat:
      raise TypeError(f"recipe keys must be non-empty strings; got {pat!r}")
    if pat.startswith("re:"):
      try:
        re.compile(pat[3:])
      except re.error as e:
        raise ValueError(f"recipe pattern {pat!r} is not a valid regex: {e}") from None
    if isinstance(val, str):
      QuantSpec.preset(val)  # raises with the list of presets
    elif val is not None and not isinstance(val, QuantSpec):
      raise TypeError(f"recipe[{pat!r}] must be a preset name, a QuantSpec or None; got "
                      f"{type(val).__name__}")
    out[pat] = val
  return out


def _as_spec(val: RecipeValue) -> QuantSpec | None:
  return QuantSpec.preset(val) if isinstance(val, str) else val


def resolve(recipe: Mapping[str, RecipeValue], path: str
            ) -> tuple[str | None, QuantSpec | None]:
  """(deciding key, spec) for a kernel at ``path``: exact > ``re:`` > ``*``; (None, None)
  when no key matches (float).  ``path`` is the kernel leaf's path (``.../kernel``); exact
  keys may also name the layer.  The key is truthy exactly when one matched."""
  layer = path[:-len("/kernel")] if path.endswith("/kernel") else path
  key = next((k for k in (path, layer) if k in recipe), None)
  if key is None:
    key = next((pat for pat in recipe if pat.startswith("re:") and re.search(pat[3:], path)),
               "*" if "*" in recipe else None)
  return (None, None) if key is None else (key, _as_spec(recipe[key]))


def check_unused(recipe: Mapping[str, RecipeValue], used: set[str], *, strict: bool,
                 where: str) -> None:
  """Warn (``strict``: raise) about recipe keys that decided no kernel: a misspelt path or
  a pattern that matches nothing would otherwise leave layers float without a word."""
  unused = [k for k in recipe if k != "*" and k not in used]
  if not unused:
    return
  msg = (f"{where}: recipe keys decided no kernel: {unused}. Exact keys name a kernel "
         "leaf or its layer ('.../q_proj/kernel' or '.../q_proj'), 're:' patterns are "
         "searched in those paths, and only float 'kernel' leaves of Dense / Linear layers "
         "are candidates (list them with hj.recipes.plan(params, {'*': None}))")
  if strict:
    raise ValueError(msg)
  warnings.warn(msg, stacklevel=3)


def _under(path: str, prefixes: tuple[str, ...]) -> str | None:
  """The prefix of ``prefixes`` that ``path`` lies under, if any."""
  return next((pre for pre in prefixes if path == pre or path.startswith(pre + "/")), None)


def _check_plain_tree(params: Any) -> None:
  """nnx variables flatten to ``.../kernel/value`` paths: quantize_params would find no
  kernel and return the model float; say where nnx models go instead."""
  from flax import nnx
  leaves = jax.tree_util.tree_leaves(
      params, is_leaf=lambda x: isinstance(x, (nnx.Variable, QuantizedWeight)))
  if isinstance(params, nnx.State) or any(isinstance(x, nnx.Variable) for x in leaves):
    raise TypeError("quantize_params takes a linen-style params tree (nested dicts of "
                    "arrays); params holds nnx variables (an nnx.State): quantize the model "
                    "with hj.nnx.quantize_nnx_model(model, recipe), or pass "
                    "nnx.to_pure_dict(state)")


def _moe_routers(paths: list[str]) -> set[str]:
  """``<p>/router/kernel`` of every ``<p>`` that also holds ``gate_up`` and ``down`` (a
  QuantMoE): its router is float by design (tiny, routing-sensitive), never a candidate."""
  join = lambda parent, name: f"{parent}/{name}" if parent else name
  parents = {p.rpartition("/")[0] for p in paths if p.rpartition("/")[2] == "gate_up"}
  return {join(q, "router/kernel") for q in parents if join(q, "down") in paths}


def scan_depths(scanned: Scanned) -> dict[str, int]:
  """``scanned`` as {module path: layer axes}: a sequence of paths (one ``nn.scan`` each)
  or a mapping path -> number of nested scans."""
  if isinstance(scanned, Mapping):
    depths = dict(scanned)
  elif isinstance(scanned, (list, tuple)):
    depths = {p: 1 for p in scanned}
  else:
    raise TypeError(f"scanned must be a sequence of module paths (e.g. ('layers',)) or a "
                    f"mapping path -> nested scans; got {scanned!r}")
  for p, d in depths.items():
    if not (isinstance(p, str) and p) or not (isinstance(d, int) and d >= 1):
      raise TypeError(f"scanned: expected a non-empty module path -> layer axes >= 1; got "
                      f"{p!r}: {d!r}")
  return depths


def _plan(params: Any, recipe: dict[str, RecipeValue], scanned: dict[str, int]
          ) -> tuple[dict[str, tuple[QuantSpec | None, int]], set[str], list[str]]:
  """({kernel path: (spec or None, leading layer axes)}, recipe keys that decided a kernel,
  kernels of more than 2 dims a pattern asked for but that stay float)."""
  _check_plain_tree(params)
  flat = [(path_str(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, QuantizedWeight))[0]]
  routers = _moe_routers([p for p, _ in flat])
  out: dict[str, tuple[QuantSpec | None, int]] = {}
  used: set[str] = set()
  wide: list[str] = []
  for p, leaf in flat:
    if (isinstance(leaf, QuantizedWeight) or p in routers
        or p.rsplit("/", 1)[-1] != "kernel" or getattr(leaf, "ndim", 0) < 2
        or not jnp.issubdtype(leaf.dtype, jnp.floating)):
      continue
    stack = _under(p, tuple(scanned))
    lead = scanned[stack] if stack is not None else 0  # the layer axes in front
    if leaf.ndim < lead + 2:
      raise ValueError(f"{p} (shape {tuple(leaf.shape)}) lies under scanned={stack!r} but "
                       f"has no {lead} leading layer axes: expected (layers, in, out)")
    key, spec = resolve(recipe, p)
    if key is None:
      if leaf.ndim == lead + 2:
        out[p] = (None, lead)
      continue
    used.add(key)
    if leaf.ndim != lead + 2:  # a DenseGeneral / Einsum kernel (heads), or an unnamed stack
      if spec is not None and key not in ("*",) and not key.startswith("re:"):
        raise ValueError(
            f"recipe[{key!r}] asks for {spec.name} but {p} has shape {tuple(leaf.shape)}: "
            "quantize_params quantizes 2-D (in, out) kernels. A layer stack made by nn.scan "
            f"takes scanned= its module's path (e.g. {p.rsplit('/', 2)[0]!r}); other "
            "kernels of more dimensions (DenseGeneral, Einsum, Conv) are not supported: map it "
            "to None")
      if spec is not None:
        wide.append(f"{p} {tuple(leaf.shape)}")
      continue
    out[p] = (spec, lead)
  missing = [s for s in scanned if not any(_under(p, (s,)) for p in out)]
  if missing:
    raise ValueError(f"scanned={missing} holds no float kernel of this params tree (module "
                     "paths, '/'-joined, e.g. 'model/layers')")
  return out, used, wide


def plan(params: Any, recipe: Recipe | str, *, scanned: Scanned = ()
         ) -> dict[str, QuantSpec | None]:
  """The spec (or None = float) each candidate kernel of ``params`` gets, by path. No work
  done.  ``scanned`` as in :func:`quantize_params`."""
  return {p: spec for p, (spec, _) in _plan(params, get_recipe(recipe),
                                            scan_depths(scanned))[0].items()}


# One compile per (shape, spec), bit-identical to eager hj.quantize, much faster than
# op-by-op dispatch on a tree with many layers of the same shape.
_quantize_jit = jax.jit(quantize, static_argnums=1)


@functools.partial(jax.jit, static_argnums=(1, 3))
def _quantize_layers(w: jax.Array, spec: QuantSpec, bias: Any, lead: int) -> QuantizedWeight:
  """A (layers..., K, N) stack quantized layer by layer: what ``nn.scan`` over a
  QuantDense initialises -- leaves with the leading layer axes, static metadata (spec,
  shape (K, N)) of one layer, so the scanned body sees one layer's weight."""
  f = lambda w, b: quantize(w, spec, bias=b)
  for _ in range(lead):
    f = jax.vmap(f)
  return f(w, bias)


def _is_mapping(x) -> bool:
  return isinstance(x, Mapping)


def quantize_params(params: Any, recipe: Recipe | str, *, progress: bool = True,
                    scanned: Scanned = (), strict: bool = False) -> Any:
  """Quantize every Dense ``kernel`` of a (nested dict) params tree as ``recipe`` says.

  Args:
    params: a Flax linen params tree (nested dicts / FrozenDicts, e.g.
      ``variables["params"]``); float leaves named ``kernel`` with shape (in, out) are
      candidates.  Not an nnx ``State``: nnx models go through
      :func:`humming_jax.nnx.quantize_nnx_model`.  A QuantMoE's float ``router`` is never
      quantized.
    recipe: a mapping pattern -> preset name | QuantSpec | None, or a :data:`RECIPES` name.
    progress: show a tqdm progress bar when the tree has 8 or more kernels to quantize.
    scanned: module paths made by ``nn.scan`` (``variable_axes={"params": 0}``), or a
      mapping path -> nested scans: their kernels (layers, in, out) are quantized layer by
      layer into one QuantizedWeight whose leaves keep the leading layer axes and whose
      metadata (``shape``) is one layer's, so the scanned body runs one layer (what
      ``nn.scan`` over :class:`QuantDense` makes).  Without it such stacks are not
      candidates (a warning names them when a pattern asks for them; an exact key naming
      one raises); under it, kernels with more dims than (layers, in, out) (attention
      heads) stay float the same way.
    strict: raise instead of warning when a recipe key decides no kernel (a misspelt
      path, a pattern that matches nothing).

  Returns:
    A new tree of plain dicts: a quantized layer's ``{"kernel": w, "bias": b}`` becomes
    ``{"kernel": QuantizedWeight(bias=b)}``; every other leaf is the input's (not copied).
    The input is not modified.

  Raises:
    ValueError naming the path when a spec cannot quantize a kernel (e.g. its group size
    does not divide the input features): map that path to ``None`` to keep it float.
    The finiteness check (NaN / inf kernels are refused) needs concrete arrays: under
    ``jax.jit`` it is skipped.
  """
  recipe = get_recipe(recipe)
  planned, used, wide = _plan(params, recipe, scan_depths(scanned))
  check_unused(recipe, used, strict=strict, where="quantize_params")
  if wide:
    warnings.warn(f"quantize_params: {len(wide)} kernels with more than 2 dims stay float "
                  f"(layer stacks of nn.scan: pass scanned=; DenseGeneral / Einsum / Conv "
                  f"kernels are not supported): {wide[:4]}{' ...' if len(wide) > 4 else ''}",
                  stacklevel=2)
  todo = {p: sl for p, sl in planned.items() if sl[0] is not None}
  bar = None
  if progress and len(todo) >= 8:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(todo), desc="quantize_params", unit="layer", leave=False)

  def quantize_kernel(p: str, prefix: str, v: Any, bias: Any) -> QuantizedWeight:
    spec, lead = todo[p]
    want = tuple(v.shape[:lead]) + (v.shape[-1],)
    if bias is not None and tuple(getattr(bias, "shape", ())) != want:
      raise ValueError(f"{prefix}/bias has shape {getattr(bias, 'shape', None)}; expected "
                       f"{want} to fold into the quantized kernel {p}")
    try:
      if _is_concrete(v) and not bool(jnp.all(jnp.isfinite(v))):
        raise ValueError("the kernel contains NaN or inf")  # the jitted quantize cannot
      if lead:
        return _quantize_layers(v, spec, bias, lead)
      return _quantize_jit(v, spec, bias=bias)
    except ValueError as e:
      raise ValueError(f"cannot quantize {p} (shape {tuple(v.shape)}) with {spec.name}: "
                       f"{e}; map {p!r} to None in the recipe to keep it float") from None

  def walk(node, prefix: str):
    if not _is_mapping(node):
      if isinstance(node, (list, tuple)):
        return type(node)(walk(v, f"{prefix}/{i}" if prefix else str(i))
                          for i, v in enumerate(node))
      return node
    out = {}
    kpath = f"{prefix}/kernel" if prefix else "kernel"
    fold_bias = kpath in todo
    for k, v in node.items():
      p = f"{prefix}/{k}" if prefix else str(k)
      if k == "kernel" and fold_bias:
        out[k] = quantize_kernel(p, prefix, v, node.get("bias"))
        if bar is not None:
          bar.update(1)
      elif k == "bias" and fold_bias:
        continue  # lives inside the QuantizedWeight now
      else:
        out[k] = walk(v, p)
    return out

  try:
    return walk(params, "")
  finally:
    if bar is not None:
      bar.close()


def prepare_params(tree: Any, *, backend: Any = None, x_dtype: Any = None) -> Any:
  """Every QuantizedWeight of ``tree`` that ``backend`` runs with a Pallas kernel, moved
  into that kernel's layout once (``hj.prepare``), so jitted calls skip the per-call
  re-layout.  Others (the XLA path, e.g. on the CPU) are returned as they are.  Keep the
  canonical tree for ``hj.dequantize`` / ``hj.error_report``.

  Expert stacks named ``gate_up`` and ``down`` under one parent (``QuantMoE``) are
  prepared as a layer (``moe.prepare_experts``: both on the Mosaic grouped kernel where it
  runs them, so ``quant_moe`` takes its tile-aligned path, or at decode a tile per routed
  pair).  That kernel takes bf16 / fp16
  tokens: pass ``x_dtype=jnp.float32`` for a float32 model, and its pairs keep each
  stack's own default instead of a re-layout inside every call.  Flax linen (``{"gate_up":
  q}``) and nnx (``{"gate_up": Param(value=q)}``) trees are paired alike."""
  from humming_jax import moe, ops

  is_q = lambda x: isinstance(x, QuantizedWeight)
  pairs = x_dtype is None or jnp.dtype(x_dtype) in (jnp.bfloat16, jnp.float16)
  stacks = {_named(path): q  # (parent path, name) -> stacked experts
            for path, q in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_q)[0]
            if path and is_q(q) and q.num_experts is not None}
  layer_kernel = {  # parent path -> the family for its gate_up / down pair
      parent: moe.layer_kernel(q, stacks[parent, "down"])
      for (parent, name), q in stacks.items()
      if pairs and name == "gate_up" and (parent, "down") in stacks}

  def prep(path, q):
    if not is_q(q):
      return q
    grouped = q.num_experts is not None
    if ops.resolve_backend(backend, q.spec, grouped=grouped, x_dtype=x_dtype) == "xla":
      return q
    parent, name = _named(path) if path else (None, None)
    kernel = layer_kernel.get(parent) if grouped and name in ("gate_up", "down") else None
    if kernel is None and x_dtype is not None:  # the family that takes these tokens
      kernel = ops.kernel_for(q, grouped=grouped, x_dtype=x_dtype).name
    if layers := stacked_layers(q):  # quantize_params(scanned=): layer by layer
      return _prepare_layers(q, layers, lambda one: ops.prepare(one, grouped=grouped,
                                                                kernel=kernel),
                             path_str(path))
    return ops.prepare(q, grouped=grouped, kernel=kernel)

  return jax.tree_util.tree_map_with_path(prep, tree, is_leaf=is_q)


def _prepare_layers(q: QuantizedWeight, layers: tuple[int, ...], prepare_one, where: str
                    ) -> QuantizedWeight:
  """A layer stack prepared layer by layer, the layouts stacked again: the scan body then
  slices one prepared layer (stacks of expert stacks too: grouped families declare their
  codes' rank).  Where that stack would not be known as one afterwards -- layers whose
  layouts differ (a per-layer mark such as ``:cf``), a layout without a declared codes
  rank -- the canonical stack stays (prepared in each call), with a warning."""
  done = [prepare_one(jax.tree_util.tree_map(lambda a: a[i], q))
          for i in np.ndindex(*layers)]
  treedef = jax.tree_util.tree_structure(done[0])
  if any(jax.tree_util.tree_structure(d) != treedef for d in done):
    why = "its layers take different kernel layouts"
  else:
    out = jax.tree_util.tree_map(lambda *a: jnp.stack(a).reshape(layers + a[0].shape), *done)
    if stacked_layers(out) == layers:
      return out
    why = f"layout {out.layout!r} does not say its codes' rank"
  warnings.warn(f"prepare_params: {where} stays a canonical layer stack (re-laid out in "
                f"every call): {why}", stacklevel=3)
  return q


def _named(path: tuple) -> tuple[tuple, Any]:
  """(parent path, name) of a leaf: its last key, looking through a trailing ``value``
  (the field of a Flax nnx ``Param``)."""
  key = lambda entry: getattr(entry, "key", getattr(entry, "name", None))
  if len(path) > 1 and key(path[-1]) == "value":
    path = path[:-1]
  return path[:-1], key(path[-1])



__all__ = ["RECIPES", "prepare_params", "ATTENTION_PATTERN", "MLP_PATTERN", "quantize_params", "plan",
           "get_recipe", "resolve", "check_unused", "path_str"]
