"""NVIDIA ModelOpt (NVFP4, FP8) and gpt-oss-style MXFP4 checkpoints.

ModelOpt NVFP4 (``quant_algo="NVFP4"``), per linear (torch (N, K)):
  ``weight`` uint8 (N, K/2) e2m1 codes, low nibble first; ``weight_scale`` float8_e4m3fn
  (N, K/16); ``weight_scale_2`` fp32 scalar, the *direct* global scale:
  value = e2m1 * weight_scale * weight_scale_2 (exactly our ``s2``); ``input_scale`` fp32 scalar,
  the calibrated activation global scale of W4A4 (not used: our NVFP4 activation global scale
  is dynamic; a warning says so).
ModelOpt FP8 (``quant_algo="FP8"``): ``weight`` float8_e4m3fn (N, K), ``weight_scale`` fp32
  scalar (per tensor), ``input_scale`` fp32 scalar (static per-tensor fp8 activations).
ModelOpt MIXED_PRECISION (NVIDIA's recent releases): ``quantized_layers`` names each
  quantized module (or a parent of it, e.g. ``...mlp.experts``) with its own ``quant_algo``:
  ``NVFP4`` / ``FP8`` as above, ``W4A16_NVFP4`` (NVFP4 weights, 16-bit activations),
  ``FP8_PER_CHANNEL_PER_TOKEN`` (``weight_scale`` fp32 (N, 1); fp8 activations per token at
  run time), ``FP8_PB_WO`` (``weight_scale`` fp32 per (bn, bk) block, weight-only; block
  from ``block_size`` / ``group_size``, default 128), ``UNQUANTIZED`` (float).  A module
  holding quantized tensors that no entry names, and any other algorithm (the AWQ
  variants carry a ``pre_quant_scale`` the layer's input must be multiplied by), are
  refused by name.

gpt-oss MXFP4 (``quant_method="mxfp4"``): per projection ``X`` of a (stacked-experts) module,
  ``X_blocks`` uint8 (E, N, K/32, 16) e2m1 codes (low nibble = even k), ``X_scales`` uint8
  (E, N, K/32) e8m0 exponents (value 2**(s - 127)), ``X_bias`` (E, N): stored transposed, the
  float layer computes ``x @ W[e]`` with W[e] (K, N) -- our layout.  Becomes one
  QuantizedWeight (E, K, N) named ``X`` with the bias inside.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from humming_jax.checkpoints._common import (Unit, bias_of, expect, spec_or_error,
                                             weight_from_nk_bytes)
from humming_jax.checkpoints.hf_fp8 import fp8_linear

_SCALAR = ((), (1,))


def _scalar(name: str, a: np.ndarray) -> np.float32:
  expect(name, a, np.float32)
  if a.shape not in _SCALAR:
    raise ValueError(f"tensor {name!r}: shape {a.shape}, expected a scalar")
  return np.float32(a.reshape(()))


# Per-layer algorithms of a MIXED_PRECISION export that this loader reads.
MODELOPT_ALGOS = ("NVFP4", "W4A16_NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")


def _layer_algo(module: str, qcfg: dict) -> tuple[str | None, dict]:
  """(quant_algo, its settings) of one module: the config's own, or for MIXED_PRECISION the
  ``quantized_layers`` entry naming the module or its nearest parent (None: not listed)."""
  algo = str(qcfg.get("quant_algo", "")).upper()
  if algo != "MIXED_PRECISION":
    return algo, qcfg
  layers = qcfg.get("quantized_layers")
  if not isinstance(layers, dict):
    raise ValueError("quantization_config: quant_algo 'MIXED_PRECISION' needs a "
                     f"'quantized_layers' object (module -> settings), got {layers!r}")
  parts = module.split(".")
  for i in range(len(parts), 0, -1):
    entry = layers.get(".".join(parts[:i]))
    if entry is not None:
      if not isinstance(entry, dict):
        raise ValueError(f"quantized_layers[{'.'.join(parts[:i])!r}]: expected an object "
                         f"with quant_algo, got {entry!r}")
      return str(entry.get("quant_algo", "")).upper(), {**qcfg, **entry}
  return None, qcfg


def plan_modelopt(module: str, suffixes: set[str], qcfg: dict,
                  notes: list) -> list[Unit] | None:
  if "pre_quant_scale" in suffixes:  # AWQ's smoothing: x * pre_quant_scale before the layer
    raise ValueError(f"module {module!r}: {module}.pre_quant_scale (ModelOpt AWQ smoothing of "
                     "the layer's input) is not supported")
  algo, qcfg = _layer_algo(module, qcfg)
  if algo == "UNQUANTIZED":
    return None
  if algo is None:  # MIXED_PRECISION and no entry for this module
    if suffixes & {"weight_scale", "weight_scale_2", "input_scale"}:
      raise ValueError(f"module {module!r}: quantized tensors "
                       f"{sorted(suffixes & {'weight_scale', 'weight_scale_2', 'input_scale'})}"
                       " but no quantization_config.quantized_layers entry names it or a "
                       "parent of it")
    return None
  if "weight_scale" not in suffixes:
    if suffixes & {"weight_scale_2"}:
      raise ValueError(f"module {module!r}: has {module}.weight_scale_2 but no "
                       f"{module}.weight_scale")
    return None
  if suffixes & {"qweight", "weight_packed", "qzeros"}:
    raise ValueError(f"module {module!r}: mixed formats in one layer: "
                     f"{sorted(f'{module}.{s}' for s in suffixes)}")
  if "weight" not in suffixes:
    raise ValueError(f"module {module!r}: missing tensor {module}.weight")
  if algo not in MODELOPT_ALGOS:
    raise ValueError(f"module {module!r}: ModelOpt quant_algo {algo!r} is not supported; "
                     f"supported: {MODELOPT_ALGOS} (per layer under MIXED_PRECISION)")
  # input_scale belongs to the W4A4 / static-fp8 algorithms; elsewhere it stays a leaf
  taken = {"weight", "weight_scale", "weight_scale_2", "bias"} | (
      {"input_scale"} if algo in ("NVFP4", "FP8") else set())
  keys = tuple(f"{module}.{s}" for s in sorted(suffixes & taken))

  def build(a):
    w, sname = a[f"{module}.weight"], f"{module}.weight_scale"
    if algo in ("NVFP4", "W4A16_NVFP4"):
      for s in ("weight_scale_2",):
        if f"{module}.{s}" not in a:
          raise ValueError(f"module {module!r}: missing tensor {module}.{s}")
      expect(f"{module}.weight", w, np.uint8)
      n, k = w.shape[0], w.shape[1] * 2
      g = int(qcfg.get("group_size", 16))
      sc = expect(sname, a[sname], ml_dtypes.float8_e4m3fn, (n, k // g))
      s2 = _scalar(f"{module}.weight_scale_2", a[f"{module}.weight_scale_2"])
      act = {}
      if algo == "NVFP4" and f"{module}.input_scale" in a:
        _scalar(f"{module}.input_scale", a[f"{module}.input_scale"])
        act = dict(act="fp4_e2m1", act_granularity="group", act_group_size=g,
                   act_scale_dtype="fp8_e4m3")
        notes.append(f"{module}: calibrated input_scale not used (NVFP4 activation global "
                     "scale is computed per call)")
      spec = spec_or_error(module, weight="fp4_e2m1", granularity="group", group_size=g,
                           scale_dtype="fp8_e4m3", global_scale=True, **act)
      return {"weight": weight_from_nk_bytes(spec, w, 4, k, np.ascontiguousarray(sc.T),
                                global_scale=s2, bias=bias_of(module, a, n))}
    if algo == "FP8":
      act, act_scale = {}, None
      if f"{module}.input_scale" in a:
        act_scale = _scalar(f"{module}.input_scale", a[f"{module}.input_scale"])
        act = dict(act="fp8_e4m3", act_granularity="tensor", act_static=True)
      return fp8_linear(module, a, sname, np.float32(_scalar(sname, a[sname])), "tensor",
                        act=act, act_scale=act_scale)
    s = expect(sname, a[sname], np.float32)
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
      n = w.shape[0]
      if s.size != n:
        raise ValueError(f"tensor {sname!r}: shape {s.shape}, expected ({n}, 1): one scale "
                         "per output channel")
      return fp8_linear(module, a, sname, s, "channel",
                        act=dict(act="fp8_e4m3", act_granularity="token"))
    if algo == "FP8_PB_WO":
      block = qcfg.get("block_size", qcfg.get("group_size", 128))
      bn, bk = (block, block) if isinstance(block, int) else (int(b) for b in block)
      return fp8_linear(module, a, sname, s, "block", block=(bn, bk))
    raise AssertionError(algo)  # refused above

  return [Unit(module, keys, build)]


def plan_mxfp4(module: str, suffixes: set[str], qcfg: dict) -> list[Unit] | None:
  projs = sorted(s[:-len("_blocks")] for s in suffixes if s.endswith("_blocks"))
  stray = [s for s in suffixes if s.endswith("_scales") and s[:-7] not in projs]
  if stray:
    raise ValueError(f"module {module!r}: {module}.{stray[0]} has no matching "
                     f"{module}.{stray[0][:-7]}_blocks")
  units = []
  for p in projs:
    if f"{p}_scales" not in suffixes:
      raise ValueError(f"module {module!r}: missing tensor {module}.{p}_scales")
    if p in suffixes or f"{p}.weight" in suffixes:
      raise ValueError(f"module {module!r}: mixed formats in one layer: {module}.{p} and "
                       f"{module}.{p}_blocks")
    keys = tuple(f"{module}.{p}{s}" for s in ("_blocks", "_scales", "_bias")
                 if f"{p}{s}" in suffixes)

    def build(a, p=p):
      bn, sn = f"{module}.{p}_blocks", f"{module}.{p}_scales"
      blocks = expect(bn, a[bn], np.uint8)
      if blocks.ndim < 3 or blocks.shape[-1] != 16:
        raise ValueError(f"tensor {bn!r}: shape {blocks.shape}, expected (..., N, K/32, 16)")
      *lead, n, g, _ = blocks.shape
      sc = a[sn]
      if sc.dtype == ml_dtypes.float8_e8m0fnu:
        sc = sc.view(np.uint8)
      sc = expect(sn, sc, np.uint8, (*lead, n, g))
      packed_nk = blocks.reshape(*lead, n, g * 16)
      spec = spec_or_error(module, weight="fp4_e2m1", granularity="group", group_size=32,
                           scale_dtype="e8m0")
      bias = None
      if f"{module}.{p}_bias" in a:
        bias = bias_of(f"{module}.{p}", {f"{module}.{p}.bias": a[f"{module}.{p}_bias"]}, n,
                       tuple(lead))
      return {p: weight_from_nk_bytes(spec, packed_nk, 4, g * 32, np.swapaxes(sc, -1, -2),
                                      bias=bias)}

    units.append(Unit(module, keys, build))
  return units or None
