"""Load the quantized checkpoints people already have, without re-quantizing.

    tree = hj.load_checkpoint("path/to/hf-dir")         # format from quantization_config
    hj.report(tree)                                      # what is stored, per tensor
    y = hj.quant_dense(tree["model"]["layers"]["0"]["mlp"]["down_proj"]["weight"], x)

The result is a nested dict keyed by the checkpoint's module path (``"a.b.c"`` ->
``tree["a"]["b"]["c"]``).  A quantized linear ``m`` becomes ``tree[...]["m"]["weight"]``: a
canonical :class:`~humming_jax.QuantizedWeight` in our (K, N) = (in, out) layout with its
bias inside (float32), its codes/scales/zero points taken over bit for bit from the producer
(never re-quantized).  Every other tensor (embeddings, norms, ignored / excluded modules)
comes back as a float array *exactly as stored*, torch layout and dtype included.
Per-expert MoE layers (``...experts.{i}.gate_proj`` ...) become the stacked weights of
``hj.quant_moe`` with :func:`stack_experts`.

Supported ``format=`` values (detected from ``config.json``'s ``quantization_config`` --
or its ``compression_config``, where older llm-compressor / SparseML exports keep it --, or
ModelOpt's ``hf_quant_config.json``, AutoGPTQ's ``quantize_config.json``, AutoAWQ's
``quant_config.json``): ``"gptq"``, ``"awq"``, ``"compressed-tensors"``,
``"modelopt"``, ``"mxfp4"``, ``"fp8"`` (block-scaled FP8: DeepSeek-V3, Qwen3-FP8; per-tensor
AutoFP8 exports), ``"fbgemm_fp8"`` (per-channel FP8: Meta's Llama-3.1-405B-FP8), and
``"float"`` (no quantization).  See docs/checkpoints.md.
"""
from __future__ import annotations

import os
import warnings

import jax.numpy as jnp

from humming_jax.checkpoints import compressed_tensors as _ct
from humming_jax.checkpoints import gptq as _gptq
from humming_jax.checkpoints import hf_fp8 as _hf_fp8
from humming_jax.checkpoints import nvidia as _nv
from humming_jax.checkpoints._common import Unit
from humming_jax.checkpoints._io import CheckpointDir, SafetensorsFile
from humming_jax.checkpoints.experts import deinterleave_gate_up, stack_experts
from humming_jax.quantize import QuantizedWeight, check_params

FORMATS = ("gptq", "awq", "compressed-tensors", "modelopt", "mxfp4", "fp8", "fbgemm_fp8",
           "float")
_ALIASES = {"gptq": "gptq", "awq": "awq", "compressed-tensors": "compressed-tensors",
            "compressed_tensors": "compressed-tensors", "modelopt": "modelopt",
            "mxfp4": "mxfp4", "fp8": "fp8", "fbgemm_fp8": "fbgemm_fp8", "float": "float",
            "none": "float"}

__all__ = ["load_checkpoint", "detect_format", "stack_experts", "deinterleave_gate_up",
           "FORMATS", "SafetensorsFile"]


def _quant_config(ckpt: CheckpointDir) -> tuple[dict | None, str]:
  """(the quantization settings or None, the file they came from)."""
  qc, source = ckpt.config.get("quantization_config"), "config.json"
  cc = ckpt.config.get("compression_config")
  if cc is not None and qc is None:  # older llm-compressor / SparseML exports
    qc = _ct.from_compression_config(cc, f"{ckpt.path}/config.json")
    source = "config.json (compression_config)"
  elif (isinstance(cc, dict) and isinstance(qc, dict) and not qc.get("sparsity_config")
        and cc.get("sparsity_config")):  # both written: the older one's sparsity still holds
    qc = {**qc, "sparsity_config": cc["sparsity_config"]}
  if qc is None:
    hf = ckpt.extra_json("hf_quant_config.json")  # older ModelOpt exports
    if isinstance(hf, dict) and isinstance(hf.get("quantization"), dict):
      qc, source = {"quant_method": "modelopt", **hf["quantization"]}, "hf_quant_config.json"
  for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
    if qc is None:  # older AutoGPTQ / AutoAWQ exports keep their settings beside config.json
      extra = ckpt.extra_json(name)
      if isinstance(extra, dict):
        qc, source = {"quant_method": method, **extra}, name
  if qc is not None and not isinstance(qc, dict):
    raise ValueError(f"{ckpt.path}/config.json: quantization_config is not a JSON object")
  return qc, source


def detect_format(path: str | os.PathLike) -> str:
  """The checkpoint format of a directory, one of :data:`FORMATS` (from its config)."""
  return _detect(CheckpointDir(path))[0]


def _detect(ckpt: CheckpointDir, fmt: str | None = None) -> tuple[str, dict, str]:
  """(format, quantization settings, where they came from: a path for error messages)."""
  qc, source = _quant_config(ckpt)
  where = f"{ckpt.path}/{source}"
  if fmt is not None:
    key = _ALIASES.get(str(fmt).lower())
    if key is None:
      raise ValueError(f"format={fmt!r}; expected one of {FORMATS}")
    return key, qc or {}, where
  if qc is None:
    return "float", {}, where
  method = str(qc.get("quant_method", "")).lower()
  if method not in _ALIASES or method in ("float", "none"):
    raise ValueError(f"{ckpt.path}/{source}: unknown quant_method {method!r}; "
                     f"supported: gptq, awq, compressed-tensors, modelopt, mxfp4, fp8, "
                     f"fbgemm_fp8 (or pass format=...)")
  return _ALIASES[method], qc, where


def _planner(fmt: str, qc: dict, notes: list, *, forced: bool = False,
             where: str = "quantization_config"):
  """The per-module planner of a format (``forced``: ``format=`` was passed, so a "float"
  checkpoint gives every tensor as stored, quantized-looking ones included; ``where``: the
  settings' file, named in errors)."""
  if fmt == "gptq":
    if qc.get("is_marlin_format"):  # its modules hold B / s, not qweight: refused up front
      raise ValueError("quantization settings: is_marlin_format=true (AutoGPTQ's Marlin "
                       "repack) is not supported; re-export the GPTQ checkpoint unpacked")
    return lambda m, s: _gptq.plan_gptq(m, s, qc, notes)
  if fmt == "awq":
    return lambda m, s: _gptq.plan_awq(m, s, qc)
  if fmt == "compressed-tensors":
    _ct.check_transforms(qc, where)
    _ct.check_sparsity(qc, where)
    return lambda m, s: _ct.plan_compressed_tensors(m, s, qc, notes)
  if fmt == "modelopt":
    return lambda m, s: _nv.plan_modelopt(m, s, qc, notes)
  if fmt == "mxfp4":
    return lambda m, s: _nv.plan_mxfp4(m, s, qc)
  if fmt == "fp8":
    if qc.get("weight_block_size") is None and str(qc.get("activation_scheme", "dynamic")
                                                   ).lower() == "dynamic":
      notes.append("per-tensor fp8 with activation_scheme 'dynamic': activations are "
                   "quantized per token (as vLLM runs it on Hopper); AutoFP8's reference "
                   "forward takes one scale over the whole call")
    return lambda m, s: _hf_fp8.plan_hf_fp8(m, s, qc)
  if fmt == "fbgemm_fp8":
    if qc.get("activation_scale_ub") is not None:
      notes.append(f"activation_scale_ub={qc['activation_scale_ub']} (fbgemm's cap on each "
                   "token's amax) is not applied: tokens above it get their own scale")
    return lambda m, s: _hf_fp8.plan_fbgemm_fp8(m, s, qc)
  return (lambda m, s: None) if forced else _float_module


# Tensor names only quantized layers hold (GPTQ / AWQ, compressed-tensors, ModelOpt, FP8).
QUANTIZED_SUFFIXES = frozenset({"qweight", "qzeros", "weight_packed", "weight_scale",
                                "weight_scale_inv", "weight_zero_point", "weight_global_scale"})


def _float_module(module: str, suffixes: set[str]) -> None:
  """A float checkpoint's module: refuse one holding quantized tensors (their settings lost
  or elsewhere), which would otherwise load as raw integer leaves without a word."""
  quantized = sorted(s for s in suffixes
                     if s in QUANTIZED_SUFFIXES or s.endswith("_blocks"))  # gpt-oss MXFP4
  if quantized:
    raise ValueError(f"module {module!r} holds quantized tensors {quantized} but the "
                     f"checkpoint has no quantization settings (config.json, "
                     f"quantize_config.json, quant_config.json, hf_quant_config.json); pass "
                     f"format=... for its format, or format='float' for the tensors as "
                     f"stored")
  return None


def _place(tree: dict, path: list[str], value, full: str) -> None:
  node = tree
  for p in path[:-1]:
    node = node.setdefault(p, {})
    if not isinstance(node, dict):
      raise ValueError(f"tensor {full!r}: its path clashes with a tensor named "
                       f"{'.'.join(path[:path.index(p) + 1])!r}")
  if path[-1] in node:
    raise ValueError(f"tensor {full!r}: two tensors map to the same tree path {path}")
  node[path[-1]] = value


def load_checkpoint(path: str | os.PathLike, *, format: str | None = None,  # noqa: A002
                    progress: bool = True) -> dict:
  """Read a HF-style checkpoint directory into a params tree, without re-quantizing.

  Args:
    path: directory with ``config.json`` and ``model.safetensors`` or a sharded
      ``model.safetensors.index.json``.
    format: one of :data:`FORMATS` to override detection from ``quantization_config``.
    progress: show a tqdm progress bar over the layers.

  Returns:
    nested dict keyed by module path; quantized linears -> ``{"weight": QuantizedWeight}``,
    everything else -> float arrays as stored.

  Shards are read one at a time (memory stays near one shard: a layer whose tensors straddle
  two shards waits for the second).  Files are only ever opened for reading.  Missing
  tensors, wrong shapes or dtypes, unknown formats and mixed formats in one layer raise a
  ``ValueError`` naming the tensor or module.
  """
  ckpt = CheckpointDir(path)
  fmt, qc, where = _detect(ckpt, format)
  notes: list[str] = []
  plan = _planner(fmt, qc, notes, forced=format is not None, where=where)
  by_module: dict[str, set[str]] = {}
  for key in ckpt.weight_map:
    mod, _, leaf = key.rpartition(".")
    by_module.setdefault(mod, set()).add(leaf)
  units: list[Unit] = []
  for mod in sorted(by_module):
    suffixes = by_module[mod]
    quant = plan(mod, suffixes) or []
    taken = {k for u in quant for k in u.keys}
    units.extend(quant)
    for leaf in sorted(suffixes):
      key = f"{mod}.{leaf}" if mod else leaf
      if key not in taken:
        units.append(Unit(mod, (key,),
                          lambda a, key=key, leaf=leaf: {leaf: jnp.asarray(a[key])}))
  owner = {k: u for u in units for k in u.keys}
  waiting = {id(u): len(u.keys) for u in units}
  tree: dict = {}
  held: dict = {}
  from tqdm.auto import tqdm
  bar = tqdm(total=len(units), desc=f"loading {fmt} checkpoint", unit="tensor",
             disable=not progress)
  try:
    for shard, f in ckpt.iter_shards():
      for key in f.keys():
        if ckpt.weight_map.get(key) != shard or key not in owner:
          continue
        held[key] = f.get(key)
        u = owner[key]
        waiting[id(u)] -= 1
        if waiting[id(u)]:
          continue  # wait for the rest of this layer (maybe in a later shard)
        out = u.build({k: held.pop(k) for k in u.keys})
        prefix = u.module.split(".") if u.module else []
        for leaf, value in out.items():
          if isinstance(value, QuantizedWeight):  # e.g. a group or block that does not
            # divide K / N: refused here, naming the layer, not at its first use
            check_params(value, f"{os.fspath(path)}: "
                         + (f"{u.module}.{leaf}" if u.module else leaf))
          _place(tree, prefix + [leaf], value, f"{u.module}.{leaf}")
        bar.update(1)
  finally:
    bar.close()
  if held:
    raise ValueError(f"tensor {sorted(held)[0]!r}: its layer is incomplete")
  if notes:
    warnings.warn(f"load_checkpoint({os.fspath(path)!r}): " + "; ".join(notes), stacklevel=2)
  return tree
