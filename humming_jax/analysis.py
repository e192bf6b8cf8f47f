"""``error_report(float_params, qparams, inputs=None)``: what quantization cost, per layer.

For every QuantizedWeight in ``qparams`` whose float original is at the same path of
``float_params``: the weight SQNR ``10 log10(sum w^2 / sum (w - w_hat)^2)`` in dB (w_hat
= ``hj.dequantize``, exactly what the kernels multiply) and, when inputs for that layer
are given, the output SQNR of ``hj.quant_dense(q, x)`` against ``x @ w + b`` computed in
float32.  Rows are sorted worst (lowest SQNR) first; ``str(report)`` is a table.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from humming_jax.quantize import QuantizedWeight, dequantize, stacked_layers


def sqnr_db(ref: Any, approx: Any) -> float:
  """Signal-to-quantization-noise ratio in dB (inf when equal, -inf for a zero signal)."""
  ref = np.asarray(ref, np.float64)
  err = ref - np.asarray(approx, np.float64)
  noise = float(np.sum(err * err))
  signal = float(np.sum(ref * ref))
  if not math.isfinite(noise):
    return -math.inf
  if noise == 0.0:
    return math.inf
  if signal == 0.0:
    return -math.inf
  return 10.0 * math.log10(signal / noise)


@dataclasses.dataclass(frozen=True)
class LayerError:
  path: str  # the quantized kernel's path, e.g. "encoder/layer_0/query/kernel"
  spec: str
  shape: tuple[int, ...]
  weight_sqnr_db: float
  output_sqnr_db: float | None  # None when no inputs were given for the layer

  @property
  def worst_db(self) -> float:
    return self.weight_sqnr_db if self.output_sqnr_db is None else min(
        self.weight_sqnr_db, self.output_sqnr_db)


@dataclasses.dataclass(frozen=True)
class ErrorReport:
  layers: tuple[LayerError, ...]  # worst first

  def __str__(self) -> str:
    w = max([len("path")] + [len(l.path) for l in self.layers])
    sw = max([len("spec")] + [len(l.spec) for l in self.layers])
    lines = [f"{'path':<{w}}  {'spec':<{sw}}  {'shape':<12} {'weight dB':>9} {'output dB':>9}"]
    for l in self.layers:
      out = "-" if l.output_sqnr_db is None else f"{l.output_sqnr_db:9.2f}"
      lines.append(f"{l.path:<{w}}  {l.spec:<{sw}}  {str(list(l.shape)):<12} "
                   f"{l.weight_sqnr_db:9.2f} {out:>9}")
    if self.layers:
      lines.append(f"{len(self.layers)} quantized layers; worst weight SQNR "
                   f"{min(l.weight_sqnr_db for l in self.layers):.2f} dB")
    return "\n".join(lines)

  def __getitem__(self, path: str) -> LayerError:
    for l in self.layers:
      if path in (l.path, l.path.removesuffix("/kernel")):
        return l
    raise KeyError(path)


def _path_str(path) -> str:
  from humming_jax.recipes import path_str
  return path_str(path)


def _lookup(tree: Any, path: str) -> Any:
  node = tree
  for k in path.split("/"):
    if isinstance(node, Mapping):
      if k not in node:
        return None
      node = node[k]
    elif isinstance(node, (list, tuple)) and k.isdigit() and int(k) < len(node):
      node = node[int(k)]
    else:
      return None
  return node


def error_report(float_params: Any, qparams: Any,
                 inputs: Mapping[str, Any] | None = None) -> ErrorReport:
  """Per quantized layer: weight SQNR and (with ``inputs``) output SQNR, worst first.

  Args:
    float_params: the float params tree the quantized tree was made from.
    qparams: the same tree with some kernels as QuantizedWeight (``hj.quantize_params``).
    inputs: optional ``{path: x}`` with x (..., K) activations entering a layer; ``path``
      is the kernel path (``.../kernel``) or the layer path (without ``/kernel``).  The
      float reference is ``x @ w + b`` in float32 (``b`` from the QuantizedWeight, since
      quantize_params moves the bias there); the quantized output is ``hj.quant_dense``.
  """
  from humming_jax.ops import quant_dense
  inputs = dict(inputs or {})
  rows, used = [], set()
  for path, leaf in jax.tree_util.tree_flatten_with_path(
      qparams, is_leaf=lambda x: isinstance(x, QuantizedWeight))[0]:
    if not isinstance(leaf, QuantizedWeight):
      continue
    p = _path_str(path)
    w = _lookup(float_params, p)
    if w is None or not hasattr(w, "shape"):
      raise ValueError(f"float_params has no array at {p!r} to compare the quantized "
                       "layer with (pass the tree qparams was made from)")
    shape = stacked_layers(leaf) + tuple(leaf.shape)  # a layer stack: every layer
    if tuple(w.shape) != shape:
      raise ValueError(f"float_params[{p!r}] has shape {tuple(w.shape)}; the quantized "
                       f"layer has {shape}")
    w32 = jnp.asarray(w, jnp.float32)
    wsq = sqnr_db(w32, dequantize(leaf))
    osq = None
    layer = p.removesuffix("/kernel")
    key = p if p in inputs else layer if layer in inputs else None
    if key is not None:
      used.add(key)
      if leaf.num_experts is not None:
        raise ValueError(f"inputs[{key!r}]: output SQNR of stacked experts is not supported")
      x = jnp.asarray(inputs[key])
      ref = jnp.dot(x.astype(jnp.float32), w32, precision=jax.lax.Precision.HIGHEST)
      if leaf.bias is not None:
        ref = ref + leaf.bias
      osq = sqnr_db(ref, quant_dense(leaf, x).astype(jnp.float32))
    rows.append(LayerError(p, leaf.spec.name, tuple(leaf.shape), wsq, osq))
  unknown = set(inputs) - used
  if unknown:
    raise ValueError(f"inputs name layers that are not quantized in qparams: "
                     f"{sorted(unknown)}")
  rows.sort(key=lambda r: r.worst_db)
  return ErrorReport(tuple(rows))


__all__ = ["error_report", "ErrorReport", "LayerError", "sqnr_db"]
