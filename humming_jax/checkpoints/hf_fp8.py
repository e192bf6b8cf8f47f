"""Block-scaled FP8 checkpoints (``quant_method: "fp8"``): DeepSeek-V3 / R1, Qwen3-*-FP8 and
every export of transformers' fine-grained FP8.

``quantization_config``: ``{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
"dynamic", "weight_block_size": [128, 128]}`` (block over (out, in)).  Per linear (torch
(N, K)): ``weight`` float8_e4m3fn (N, K), ``weight_scale_inv`` float32 (ceil(N / bn),
ceil(K / bk)); the weight is ``weight * weight_scale_inv`` per block (the name is the
producer's: it multiplies).  Activations are quantized per token and per group of bk
columns to e4m3 at run time ("dynamic"): the ``w8a8-fp8-block`` preset's semantics.
Layers without a ``weight_scale_inv`` (``modules_to_not_convert``: lm_head, routers, ...)
stay float.  Scales stored in bf16 / fp16 (some Qwen3-FP8 exports) are widened to fp32
(exact).

Per-tensor exports under the same ``quant_method`` with no ``weight_block_size`` (AutoFP8,
neuralmagic's early ``*-FP8`` models; what vLLM's fp8 method reads): ``weight``
float8_e4m3fn (N, K) times one float32 ``weight_scale``; ``activation_scheme`` "static":
the activations divided by the layer's calibrated ``input_scale`` (one value, the
``tensor``-static spec), "dynamic": per token at run time, as vLLM runs it on Hopper
(``use_per_token_if_dynamic``; AutoFP8's own reference forward takes one amax over the
whole call, which ties each token's result to the batch -- a load-time note says so).
Other tensors of such a layer (an older ``kv_scale``) come back as float leaves beside
its weight.

``quant_method: "fbgemm_fp8"`` (transformers' FbgemmFp8; Meta's Llama-3.1-405B-FP8):
``weight`` float8_e4m3fn (N, K), ``weight_scale`` float32 (N, 1) per output channel,
activations quantized per token at run time (fbgemm's ``quantize_fp8_per_row``): the
``w8a8-fp8`` preset's semantics.  fbgemm also caps each row's amax at the config's
``activation_scale_ub`` (1200 in Meta's exports); that cap is not applied here (a load-time
note says so): a token whose amax exceeds it is quantized with its own scale instead of
saturating.

An N that is not a multiple of bn (DeepSeek-V3's ``kv_a_proj_with_mqa``, N = 576) takes
column blocks of gcd(bn, N) with each block scale repeated: the same weight, exactly.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from humming_jax.checkpoints._common import (Unit, bias_of, expect, float_scale_dtype,
                                             spec_or_error, weight_blocks,
                                             weight_from_nk_bytes)

_FP8 = {np.dtype(ml_dtypes.float8_e4m3fn): "fp8_e4m3", np.dtype(ml_dtypes.float8_e5m2): "fp8_e5m2"}
E4M3 = [ml_dtypes.float8_e4m3fn]


def _f32(name: str, scale: np.ndarray) -> np.ndarray:
  """A stored float scale as float32: fp32, or bf16 / fp16 widened exactly; others refused."""
  float_scale_dtype(name, scale)
  return scale.astype(np.float32)


def fp8_linear(module: str, a: dict, scale_name: str, scale: np.ndarray, granularity: str,
               *, block: tuple[int, int] | None = None, act: dict | None = None,
               act_scale=None, formats=E4M3) -> dict:
  """``{"weight": QuantizedWeight}`` of one fp8 linear: ``{module}.weight`` (N, K) in one of
  ``formats`` times ``scale`` (float32, the producer's values, read and checked by the
  caller): one value ("tensor"), N ("channel"), or the (ceil(N / bn), ceil(K / bk)) grid
  of ``block=(bn, bk)`` ("block"; a partial last N block as :func:`weight_blocks` takes
  it).  ``act``: the spec's activation fields; the layer's bias goes inside.  Every fp8
  loader (block, per-tensor and fbgemm FP8 here, ModelOpt's FP8 algorithms) builds on it."""
  wname = f"{module}.weight"
  w = expect(wname, a[wname], formats)
  n, k = w.shape
  gran = {}
  if granularity == "tensor":
    grid = scale.reshape(1, 1)
  elif granularity == "channel":
    grid = scale.reshape(1, n)
  else:
    bn, bk = block
    s = expect(scale_name, scale, np.float32, (-(-n // bn), -(-k // bk)))
    grid, bn = weight_blocks(wname, np.ascontiguousarray(s.T), k, n, bk, bn)
    gran = dict(group_size=bk, block_n=bn)
  spec = spec_or_error(module, weight=_FP8[w.dtype], granularity=granularity,
                       scale_dtype="float32", **gran, **(act or {}))
  return {"weight": weight_from_nk_bytes(spec, w.view(np.uint8), 8, k,
                                         np.ascontiguousarray(grid), bias=bias_of(module, a, n),
                                         act_scale=act_scale)}


def plan_hf_fp8(module: str, suffixes: set[str], qcfg: dict) -> list[Unit] | None:
  block = qcfg.get("weight_block_size")
  if block is None:
    return _plan_per_tensor(module, suffixes, qcfg)
  if not (isinstance(block, (list, tuple)) and len(block) == 2
          and all(isinstance(b, int) and b > 0 for b in block)):
    raise ValueError(f"quantization_config.weight_block_size={block!r}: expected [bn, bk] "
                     "(per-tensor fp8 exports are not this format)")
  scheme = str(qcfg.get("activation_scheme", "dynamic")).lower()
  if scheme != "dynamic":
    raise ValueError(f"quantization_config.activation_scheme={scheme!r}: only 'dynamic' "
                     "(per-token groups quantized at run time) is supported")
  if "weight_scale_inv" not in suffixes:
    per_tensor = sorted(f"{module}.{s}" for s in suffixes & {"weight_scale", "input_scale"})
    if per_tensor:
      raise ValueError(f"module {module!r}: per-tensor fp8 tensors {per_tensor} in a "
                       f"checkpoint whose quantization_config has weight_block_size={block} "
                       "(block-scaled layers hold weight_scale_inv)")
    return None  # a float layer (modules_to_not_convert)
  if suffixes & {"qweight", "weight_packed", "weight_scale", "qzeros"}:
    raise ValueError(f"module {module!r}: mixed formats in one layer: "
                     f"{sorted(f'{module}.{s}' for s in suffixes)}")
  if "weight" not in suffixes:
    raise ValueError(f"module {module!r}: missing tensor {module}.weight")
  bn, bk = block
  keys = tuple(f"{module}.{s}" for s in sorted(suffixes & {"weight", "weight_scale_inv",
                                                          "bias"}))

  def build(a):
    sname = f"{module}.weight_scale_inv"
    return fp8_linear(module, a, sname, _f32(sname, a[sname]), "block", block=(bn, bk),
                      act=dict(act="fp8_e4m3", act_granularity="group", act_group_size=bk),
                      formats=list(_FP8))

  return [Unit(module, keys, build)]


def _fp8_layer(module: str, suffixes: set[str], extra: set[str]) -> tuple[str, ...] | None:
  """The tensor names of one per-tensor / per-channel fp8 linear (``weight`` and
  ``weight_scale`` + ``extra``), or None for a float layer; mixed formats refused."""
  if "weight_scale" not in suffixes:
    stacked = sorted(f"{module}.{s}" for s in suffixes
                     if s.endswith("_scale") and s[:-len("_scale")] in suffixes)
    if stacked:  # e.g. Llama-4's fused experts (gate_up_proj + gate_up_proj_scale)
      raise ValueError(f"module {module!r}: stacked fp8 tensors {stacked} are not supported "
                       "(one weight / weight_scale per linear layer)")
    if "input_scale" in suffixes:
      raise ValueError(f"module {module!r}: {module}.input_scale without "
                       f"{module}.weight_scale")
    return None  # a float layer (modules_to_not_convert / ignored_layers)
  if suffixes & {"qweight", "weight_packed", "weight_scale_inv", "qzeros"}:
    raise ValueError(f"module {module!r}: mixed formats in one layer: "
                     f"{sorted(f'{module}.{s}' for s in suffixes)}")
  if "weight" not in suffixes:
    raise ValueError(f"module {module!r}: missing tensor {module}.weight")
  return tuple(f"{module}.{s}" for s in sorted(suffixes & ({"weight", "weight_scale", "bias"}
                                                           | extra)))


def _plan_per_tensor(module: str, suffixes: set[str], qcfg: dict) -> list[Unit] | None:
  scheme = str(qcfg.get("activation_scheme", "dynamic")).lower()
  if scheme not in ("static", "dynamic"):
    raise ValueError(f"quantization_config.activation_scheme={scheme!r}: expected 'static' "
                     "or 'dynamic'")
  if "weight_scale_inv" in suffixes:
    raise ValueError(f"module {module!r}: block-scaled tensor {module}.weight_scale_inv but "
                     "quantization_config has no weight_block_size=[bn, bk]")
  keys = _fp8_layer(module, suffixes, {"input_scale"} if scheme == "static" else set())
  if keys is None:
    return None
  if scheme == "static" and "input_scale" not in suffixes:
    raise ValueError(f"module {module!r}: activation_scheme 'static' but no tensor "
                     f"{module}.input_scale")
  if scheme == "dynamic" and "input_scale" in suffixes:
    raise ValueError(f"module {module!r}: a calibrated {module}.input_scale but "
                     "activation_scheme 'dynamic' (which would not use it)")

  def build(a):
    sname = f"{module}.weight_scale"
    s = _f32(sname, a[sname])
    if s.size != 1:
      raise ValueError(f"tensor {sname!r}: shape {s.shape}, expected one value (per-tensor "
                       "fp8: quantization_config has no weight_block_size)")
    act = dict(act="fp8_e4m3", act_granularity="token")
    act_scale = None
    if scheme == "static":
      iname = f"{module}.input_scale"
      act_scale = _f32(iname, a[iname])
      if act_scale.size != 1:
        raise ValueError(f"tensor {iname!r}: shape {act_scale.shape}, expected one value")
      act.update(act_granularity="tensor", act_static=True)
    return fp8_linear(module, a, sname, s, "tensor", act=act,
                      act_scale=None if act_scale is None else act_scale.reshape(()))

  return [Unit(module, keys, build)]


def plan_fbgemm_fp8(module: str, suffixes: set[str], qcfg: dict) -> list[Unit] | None:
  keys = _fp8_layer(module, suffixes, set())
  if keys is None:
    return None

  def build(a):
    sname = f"{module}.weight_scale"
    n = a[f"{module}.weight"].shape[0]
    s = expect(sname, _f32(sname, a[sname]), np.float32, (n, 1))
    return fp8_linear(module, a, sname, s, "channel",
                      act=dict(act="fp8_e4m3", act_granularity="token"))

  return [Unit(module, keys, build)]
