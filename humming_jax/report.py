"""``report(tree)``: what is actually stored, tensor by tensor (not what a config claims)."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from humming_jax.quantize import QuantizedWeight, array_bytes, stacked_layers


@dataclasses.dataclass(frozen=True)
class TensorReport:
  path: str
  kind: str  # "quantized" or "float"
  spec: str  # preset-like spec name, or the float dtype
  logical_shape: tuple[int, ...]
  stored: tuple[tuple[str, str, tuple[int, ...], int], ...]  # (leaf, dtype, shape, bytes)
  bytes: int
  bits_per_weight: float
  bf16_bytes: int


@dataclasses.dataclass(frozen=True)
class Report:
  tensors: tuple[TensorReport, ...]

  @property
  def total_bytes(self) -> int:
    return sum(t.bytes for t in self.tensors)

  @property
  def bf16_bytes(self) -> int:
    return sum(t.bf16_bytes for t in self.tensors)

  def __str__(self) -> str:
    lines = [f"{'path':<40} {'kind':<9} {'spec / dtype':<34} {'stored':<46} {'bytes':>12} "
             f"{'bits/w':>7}"]
    for t in self.tensors:
      stored = ", ".join(f"{n}:{d}{list(s)}" for n, d, s, _ in t.stored)
      lines.append(f"{t.path:<40} {t.kind:<9} {t.spec:<34} {stored:<46} {t.bytes:>12,} "
                   f"{t.bits_per_weight:>7.3f}")
    ratio = self.total_bytes / max(self.bf16_bytes, 1)
    lines.append(f"total: {self.total_bytes:,} bytes vs {self.bf16_bytes:,} in bf16 "
                 f"({ratio:.3f}x, {16 * ratio:.3f} bits/weight on average)")
    return "\n".join(lines)


def _path_str(path) -> str:
  return "/".join(str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p))))
                  for p in path)


def report(tree) -> Report:
  """Per tensor of ``tree`` (quantized or float): stored dtypes, shapes, bytes, bits/weight.

  Bits per weight count codes + scales + zero points + global scale (+ a prepared layout's
  ``fold_base``, an act-order layer's ``input_perm``; not the bias, which a float layer has
  too); float tensors count their own dtype."""
  out = []
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, QuantizedWeight))[0]
  for path, leaf in leaves:
    p = _path_str(path)
    if isinstance(leaf, QuantizedWeight):
      stored = tuple((name, str(a.dtype), tuple(a.shape), array_bytes(a))
                     for name in QuantizedWeight.STORED
                     if (a := getattr(leaf, name)) is not None)
      nbytes = sum(s[3] for s in stored)
      numel = int(np.prod(stacked_layers(leaf) + tuple(leaf.shape)))  # every layer
      out.append(TensorReport(p, "quantized", leaf.spec.name, tuple(leaf.shape), stored,
                              nbytes, 8 * nbytes / numel, 2 * numel))
    elif hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
      numel = int(np.prod(leaf.shape))
      nbytes = array_bytes(leaf)
      out.append(TensorReport(p, "float", str(leaf.dtype), tuple(leaf.shape),
                              (("value", str(leaf.dtype), tuple(leaf.shape), nbytes),),
                              nbytes, jax.dtypes.itemsize_bits(leaf.dtype), 2 * numel))
  return Report(tuple(out))
