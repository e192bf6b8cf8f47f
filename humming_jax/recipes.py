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

import re
from typing import Any, Mapping, Union

import jax
import jax.numpy as jnp

from humming_jax.quantize import QuantizedWeight, quantize
from humming_jax.spec import QuantSpec

RecipeValue = Union[str, QuantSpec, None]
Recipe = Mapping[str, RecipeValue]

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


def is_kernel(path: str, leaf: Any) -> bool:
  """Whether ``leaf`` at ``path`` is a candidate: a 2-D float array named ``kernel``."""
  return (path.rsplit("/", 1)[-1] == "kernel" and getattr(leaf, "ndim", None) == 2
          and jnp.issubdtype(leaf.dtype, jnp.floating))

def resolve(recipe: Mapping[str, RecipeValue], path: str) -> tuple[bool, QuantSpec | None]:
  """(matched, spec) for a kernel at ``path``: exact > ``re:`` > ``*``; no match -> float.

  ``path`` is the kernel leaf's path (``.../kernel``); exact keys may also name the layer.
  """
  layer = path[:-len("/kernel")] if path.endswith("/kernel") else path
  for key in (path, layer):
    if key in recipe:
      return True, _as_spec(recipe[key])
  for pat, val in recipe.items():
    if pat.startswith("re:") and re.search(pat[3:], path):
      return True, _as_spec(val)
  if "*" in recipe:
    return True, _as_spec(recipe["*"])
  return False, None


def plan(params: Any, recipe: Recipe | str) -> dict[str, QuantSpec | None]:
  """The spec (or None = float) each 2-D kernel of ``params`` gets, by path. No work done."""
  recipe = get_recipe(recipe)
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, QuantizedWeight))[0]:
    p = path_str(path)
    if isinstance(leaf, QuantizedWeight) or not is_kernel(p, leaf):
      continue
    out[p] = resolve(recipe, p)[1]
  return out


# One compile per (shape, spec), bit-identical to eager hj.quantize, much faster than
# op-by-op dispatch on a tree with many layers of the same shape.
_quantize_jit = jax.jit(quantize, static_argnums=1)


def _is_mapping(x) -> bool:
  return isinstance(x, Mapping)


def quantize_params(params: Any, recipe: Recipe | str, *, progress: bool = True) -> Any:
  """Quantize every 2-D ``kernel`` of a (nested dict) params tree as ``recipe`` says.

  Args:
    params: a Flax params tree (nested dicts / FrozenDicts, e.g. ``variables["params"]``);
      leaves named ``kernel`` with shape (in, out) are candidates.
    recipe: a mapping pattern -> preset name | QuantSpec | None, or a :data:`RECIPES` name.
    progress: show a tqdm progress bar when the tree has 8 or more kernels to quantize.

  Returns:
    A new tree of plain dicts: a quantized layer's ``{"kernel": w, "bias": b}`` becomes
    ``{"kernel": QuantizedWeight(bias=b)}``; every other leaf is the input's (not copied).
    The input is not modified.

  Raises:
    ValueError naming the path when a spec cannot quantize a kernel (e.g. its group size
    does not divide the input features): map that path to ``None`` to keep it float.
  """
  todo = {p: s for p, s in plan(params, recipe).items() if s is not None}
  bar = None
  if progress and len(todo) >= 8:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(todo), desc="quantize_params", unit="layer", leave=False)

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
        bias = node.get("bias")
        if bias is not None and (getattr(bias, "ndim", None) != 1
                                 or bias.shape[0] != v.shape[1]):
          raise ValueError(f"{prefix}/bias has shape {getattr(bias, 'shape', None)}; expected "
                           f"({v.shape[1]},) to fold into the quantized kernel {p}")
        try:
          if not bool(jnp.all(jnp.isfinite(v))):  # the jitted quantize cannot check this
            raise ValueError("the kernel contains NaN or inf")
          out[k] = _quantize_jit(v, todo[p], bias=bias)
        except ValueError as e:
          raise ValueError(f"cannot quantize {p} (shape {tuple(v.shape)}) with "
                           f"{todo[p].name}: {e}; map {p!r} to None in the recipe to keep "
                           "it float") from None
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
    return ops.prepare(q, grouped=grouped, kernel=kernel)

  return jax.tree_util.tree_map_with_path(prep, tree, is_leaf=is_q)


def _named(path: tuple) -> tuple[tuple, Any]:
  """(parent path, name) of a leaf: its last key, looking through a trailing ``value``
  (the field of a Flax nnx ``Param``)."""
  key = lambda entry: getattr(entry, "key", getattr(entry, "name", None))
  if len(path) > 1 and key(path[-1]) == "value":
    path = path[:-1]
  return path[:-1], key(path[-1])



__all__ = ["RECIPES", "prepare_params", "ATTENTION_PATTERN", "MLP_PATTERN", "quantize_params", "plan",
           "get_recipe", "resolve", "path_str"]
