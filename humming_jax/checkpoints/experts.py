"""Per-expert checkpoint layers -> the stacked expert weights ``hj.quant_moe`` takes.

HF MoE checkpoints (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, their GPTQ / AWQ /
compressed-tensors / FP8 exports) store each expert as separate linears:
``...mlp.experts.{i}.gate_proj / up_proj / down_proj`` (Mixtral: ``w1`` / ``w3`` / ``w2``).
:func:`load_checkpoint` reads them as separate (K, N) QuantizedWeights;
:func:`stack_experts` turns each such group into ``{"gate_up": (E, H, 2I), "down": (E, I,
H)}``: the parameters of :func:`humming_jax.quant_moe` and ``hj.nn.QuantMoE`` (gate columns
first, then up).  Codes, scales and zero points are concatenated and stacked as stored,
never re-quantized.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp

from humming_jax.quantize import QuantizedWeight, check_no_input_perm

# (gate, up, down) module names per naming convention
EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def _check(q: Any, name: str) -> QuantizedWeight:
  if not isinstance(q, QuantizedWeight):
    raise TypeError(f"{name} must be a QuantizedWeight; got {type(q).__name__}")
  if q.layout != "canonical" or q.num_experts is not None:
    raise ValueError(f"{name}: expected canonical (K, N) params; got {q!r}")
  check_no_input_perm(q, name)
  return q


def _same(values: Sequence[Any], what: str) -> Any:
  """The one value every entry shares (None if all are None); else a ValueError."""
  first = values[0]
  if all(v is None for v in values):
    return None
  if any(v is None for v in values) or any(
      not bool(jnp.array_equal(v, first)) for v in values[1:]):
    raise ValueError(f"{what} differ; they cannot share one stacked weight")
  return first


def concat_columns(parts: Sequence[QuantizedWeight], name: str = "parts") -> QuantizedWeight:
  """One (K, N1 + N2 + ...) weight from (K, Ni) weights of one spec, columns in order (the
  gate then the up projection): codes, per-column-block scales and zero points and biases
  side by side.  Per-tensor scales, global scales and static activation scales must be
  equal across the parts (one value has to serve all the columns)."""
  parts = [_check(q, f"{name}[{i}]") for i, q in enumerate(parts)]
  spec, k = parts[0].spec, parts[0].in_features
  for i, q in enumerate(parts):
    if q.spec != spec or q.in_features != k:
      raise ValueError(f"{name}[{i}]: spec {q.spec.name} and K={q.in_features}; expected "
                       f"{spec.name} and K={k} like {name}[0]")
  n = sum(q.out_features for q in parts)
  if spec.granularity == "tensor":
    scales = _same([q.scales for q in parts], f"{name}: per-tensor scales")
    zeros = _same([q.zeros for q in parts], f"{name}: per-tensor zero points")
  else:
    scales = jnp.concatenate([q.scales for q in parts], axis=-1)
    zeros = (None if parts[0].zeros is None
             else jnp.concatenate([q.zeros for q in parts], axis=-1))
  bias = None
  if any(q.bias is not None for q in parts):
    bias = jnp.concatenate([q.bias if q.bias is not None
                            else jnp.zeros((q.out_features,), jnp.float32) for q in parts])
  return QuantizedWeight(
      codes=jnp.concatenate([q.codes for q in parts], axis=-1), scales=scales, zeros=zeros,
      global_scale=_same([q.global_scale for q in parts], f"{name}: global scales"),
      bias=bias, act_scale=_same([q.act_scale for q in parts], f"{name}: static activation "
                                 "scales"), spec=spec, shape=(k, n))


def deinterleave_gate_up(w: QuantizedWeight, name: str = "gate_up") -> QuantizedWeight:
  """gpt-oss's fused gate/up weight, (K, 2I) or stacked (E, K, 2I) with the gate in the even
  columns and the up projection in the odd ones (its ``gate_up[..., ::2]`` /
  ``gate_up[..., 1::2]``), as ``hj.quant_moe`` reads it: gate columns first, then up.
  Columns are moved as stored (codes, per-column scales and zero points, bias), nothing is
  re-quantized.  Run the layer with ``activation="swigluoai"`` (gpt-oss's clamped SwiGLU)."""
  if not isinstance(w, QuantizedWeight):
    raise TypeError(f"{name} must be a QuantizedWeight; got {type(w).__name__}")
  if w.layout != "canonical":
    raise ValueError(f"{name}: expected canonical params (before hj.prepare); got layout "
                     f"{w.layout!r}")
  n = w.out_features
  if n % 2:
    raise ValueError(f"{name}: {n} columns; an interleaved gate/up weight has an even count")
  if w.spec.granularity == "block" and w.spec.block_n > 1:
    raise ValueError(f"{name}: 2-D block scales ({w.spec.block_n} columns per scale) cannot "
                     f"be split between the even and the odd columns")
  order = jnp.concatenate([jnp.arange(0, n, 2), jnp.arange(1, n, 2)])
  columns = lambda a: None if a is None else jnp.take(a, order, axis=-1)
  per_column = w.spec.granularity != "tensor"
  return w.replace(codes=columns(w.codes),
                   scales=columns(w.scales) if per_column else w.scales,
                   zeros=columns(w.zeros) if per_column else w.zeros,
                   bias=columns(w.bias))


def stack(experts: Sequence[QuantizedWeight], name: str = "experts") -> QuantizedWeight:
  """(E, K, N) from E (K, N) weights of one spec and shape: every leaf stacked (a global
  scale becomes one per expert); a static activation scale must be the same for all."""
  experts = [_check(q, f"{name}[{i}]") for i, q in enumerate(experts)]
  if not experts:
    raise ValueError(f"{name}: no experts to stack")
  first = experts[0]
  for i, q in enumerate(experts):
    if q.spec != first.spec or q.shape != first.shape:
      raise ValueError(f"{name}[{i}]: spec {q.spec.name}, shape {q.shape}; expected "
                       f"{first.spec.name}, {first.shape} like {name}[0]")
    if (q.zeros is None) != (first.zeros is None) or (q.bias is None) != (first.bias is None):
      raise ValueError(f"{name}[{i}]: zero points / bias present unlike {name}[0]")
  stacked = lambda f: (None if getattr(first, f) is None
                       else jnp.stack([getattr(q, f) for q in experts]))
  return QuantizedWeight(
      codes=stacked("codes"), scales=stacked("scales"), zeros=stacked("zeros"),
      global_scale=stacked("global_scale"), bias=stacked("bias"),
      act_scale=_same([q.act_scale for q in experts], f"{name}: static activation scales"),
      spec=first.spec, shape=(len(experts), *first.shape))


def _expert_layers(node: Any) -> tuple[list[dict], tuple[str, str, str]] | None:
  """The experts of a ``{"0": {...}, "1": {...}, ...}`` node and their naming, or None."""
  if not isinstance(node, dict) or not node or not all(
      isinstance(key, str) and key.isdigit() for key in node):
    return None
  if sorted(int(key) for key in node) != list(range(len(node))):
    return None
  experts = [node[str(i)] for i in range(len(node))]
  for names in EXPERT_NAMES:
    if all(isinstance(e, dict) and all(isinstance(e.get(m), dict)
                                       and isinstance(e[m].get("weight"), QuantizedWeight)
                                       for m in names) for e in experts):
      return experts, names
  return None


def stack_experts(tree: Any, *, key: str = "experts", _path: str = "") -> Any:
  """``tree`` with every per-expert group under a ``key`` node replaced by stacked weights.

  A node ``tree[...]["experts"] = {"0": {"gate_proj": {"weight": q}, "up_proj": ...,
  "down_proj": ...}, "1": ...}`` (or ``w1`` / ``w3`` / ``w2``) becomes ``{"gate_up":
  QuantizedWeight (E, H, 2I), "down": QuantizedWeight (E, I, H)}``; anything else an
  expert holds besides those three layers is an error (it would be lost).  Other leaves are
  kept as they are (not copied; the dicts holding them are new): the input tree is not
  modified.  Returns the new tree."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for name, node in tree.items():
    found = _expert_layers(node) if name == key else None
    where = f"{_path}.{name}" if _path else str(name)  # the module path, for errors
    if found is None:
      out[name] = stack_experts(node, key=key, _path=where)
      continue
    experts, (gate, up, down) = found
    for i, e in enumerate(experts):
      extra = sorted(set(e) - {gate, up, down}) + sorted(
          f"{m}.{leaf}" for m in (gate, up, down) for leaf in e[m] if leaf != "weight")
      if extra:
        raise ValueError(f"{where}.{i}: holds {extra} besides the {gate} / {up} / {down} "
                         "weights; stacking would drop them")
    out[name] = {
        "gate_up": stack([concat_columns([e[gate]["weight"], e[up]["weight"]],
                                         f"{where}.{i}.{gate}+{up}")
                          for i, e in enumerate(experts)], f"{where} gate_up"),
        "down": stack([e[down]["weight"] for e in experts], f"{where} {down}")}
  return out
