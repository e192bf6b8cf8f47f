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
(exact).  Per-tensor fp8 exports under the same ``quant_method`` (a ``weight_scale`` /
``input_scale`` per layer, no block size) are refused.

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


def plan_hf_fp8(module: str, suffixes: set[str], qcfg: dict) -> list[Unit] | None:
  block = qcfg.get("weight_block_size")
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
      raise ValueError(f"module {module!r}: per-tensor fp8 tensors {per_tensor} under "
                       "quant_method 'fp8' are not supported (block-scaled exports have "
                       "weight_scale_inv)")
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
    wname, sname = f"{module}.weight", f"{module}.weight_scale_inv"
    w = expect(wname, a[wname], list(_FP8))
    n, k = w.shape
    s = a[sname]
    float_scale_dtype(sname, s)  # fp32, or bf16 / fp16 widened exactly
    s = expect(sname, s.astype(np.float32), np.float32, (-(-n // bn), -(-k // bk)))
    s, bn_ = weight_blocks(wname, np.ascontiguousarray(s.T), k, n, bk, bn)
    spec = spec_or_error(module, weight=_FP8[w.dtype], granularity="block", group_size=bk,
                         block_n=bn_, scale_dtype="float32", act="fp8_e4m3",
                         act_granularity="group", act_group_size=bk)
    return {"weight": weight_from_nk_bytes(spec, w.view(np.uint8), 8, k,
                                           np.ascontiguousarray(s),
                                           bias=bias_of(module, a, n))}

  return [Unit(module, keys, build)]
