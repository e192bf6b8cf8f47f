"""Make the tiny quantized-checkpoint fixtures in tests/fixtures/checkpoints/ with the REAL
producer libraries (CPU only), plus the producers' own dequantized weights as references.

How to run (torch is NOT a dependency of humming_jax; use a side virtualenv outside the repo):

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/ckpt-venv
    /tmp/ckpt-venv/bin/pip install torch==2.13.0 compressed-tensors transformers accelerate \
        nvidia-modelopt requests
    /tmp/ckpt-venv/bin/pip install --no-deps auto-gptq==0.7.1        # packer only, no CUDA
    /tmp/ckpt-venv/bin/pip download --no-deps -d /tmp/dl autoawq==0.2.9 && \
        mkdir -p /tmp/awqsrc && tar xzf /tmp/dl/autoawq-0.2.9.tar.gz -C /tmp/awqsrc
    /tmp/ckpt-venv/bin/python scripts/make_checkpoint_fixtures.py [--out tests/fixtures/checkpoints]

Producers used (all on the CPU):
  * GPTQ      auto_gptq 0.7.1 ``qlinear_cuda_old.QuantLinear.pack`` (the v1 packer, "zeros - 1")
              and its torch dequantizing forward as the reference; scales/zeros from
              auto_gptq's ``Quantizer.find_params`` (the GPTQ error-compensation loop is not
              run: it changes which codes are chosen, not how they are stored).
  * AWQ       autoawq 0.2.9 ``WQLinear_GEMM.from_linear`` (packing order 0,2,4,6,1,3,5,7) and
              ``awq.utils.packing_utils.dequantize_gemm`` as the reference.  autoawq's package
              ``__init__`` needs a CUDA-era transformers, so its modules are imported directly.
  * compressed-tensors  ``apply_quantization_config`` + ``calculate_qparams`` /
              ``generate_gparam`` + ``ModelCompressor.compress_model`` / ``decompress_model``;
              the fake-quantized forward of the frozen model is the forward reference.
  * ModelOpt  ``NVFP4QTensor.quantize`` / ``dequantize`` (the code its HF export calls).
  * MXFP4     gpt-oss layout: no CPU producer exists (transformers quantizes with triton
              kernels on GPU), so blocks/scales are made here following the OCP MX v1.0 rule
              with ml_dtypes-free torch code, and the reference is transformers'
              ``convert_moe_packed_tensors`` (the dequantizer transformers uses to load them).

Each fixture directory holds config.json, model.safetensors (or shards + index), and
reference.safetensors with ``<module>.weight`` (the producer's dequantized weight, torch
(out, in) layout, in the producer's output dtype) and, where the producer has a fake-quantized
forward, ``<module>.x`` / ``<module>.y``.  reference.json names producer and versions.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import types

import torch
from safetensors.torch import save_file

SP = os.path.dirname(os.path.dirname(torch.__file__))
AWQ_SRC = "/tmp/awqsrc/autoawq-0.2.9"

D, F, V = 128, 64, 32  # hidden, intermediate, vocab: q_proj (D->F with bias), down (F->D)


def _stub_package(name: str, path: str) -> None:
  """Import a package's submodules without running its heavy ``__init__``."""
  m = types.ModuleType(name)
  m.__path__ = [path]
  sys.modules[name] = m


class Tiny(torch.nn.Module):
  """Two quantizable linears plus float tensors (embedding, norm, ignored lm_head)."""

  def __init__(self, dtype=torch.bfloat16, k1=D, n1=F, k2=F, n2=D):
    super().__init__()
    torch.manual_seed(0)
    self.model = torch.nn.Module()
    self.model.embed_tokens = torch.nn.Embedding(V, D)
    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    layer.self_attn.q_proj = torch.nn.Linear(k1, n1, bias=True)
    layer.mlp = torch.nn.Module()
    layer.mlp.down_proj = torch.nn.Linear(k2, n2, bias=False)
    self.model.layers = torch.nn.ModuleList([layer])
    self.model.norm = torch.nn.Module()
    self.model.norm.weight = torch.nn.Parameter(torch.rand(D) + 0.5)
    self.lm_head = torch.nn.Linear(D, V, bias=False)
    with torch.no_grad():
      for p in self.parameters():
        if p.ndim == 2:
          p.copy_(torch.randn_like(p) * 0.05)
        elif p is not self.model.norm.weight:
          p.copy_(torch.randn_like(p) * 0.1)
    self.to(dtype)

  def linears(self):
    layer = self.model.layers[0]
    return {"model.layers.0.self_attn.q_proj": layer.self_attn.q_proj,
            "model.layers.0.mlp.down_proj": layer.mlp.down_proj}

  def float_tensors(self):
    return {"model.embed_tokens.weight": self.model.embed_tokens.weight,
            "model.norm.weight": self.model.norm.weight,
            "lm_head.weight": self.lm_head.weight}


def _write(out: str, name: str, tensors: dict, config: dict, reference: dict, meta: dict,
           shards: int = 1) -> None:
  d = os.path.join(out, name)
  shutil.rmtree(d, ignore_errors=True)
  os.makedirs(d)
  tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
  if shards == 1:
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
  else:  # split so that q_proj's tensors straddle two shards (qweight in the second)
    keys = sorted(tensors)
    cut = next(i for i, k in enumerate(keys) if k.endswith("q_proj.qweight"))
    bounds = [0, cut, len(keys)]
    assert shards == 2
    weight_map = {}
    for i in range(shards):
      fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
      part = {k: tensors[k] for k in keys[bounds[i]:bounds[i + 1]]}
      save_file(part, os.path.join(d, fn), metadata={"format": "pt"})
      weight_map.update({k: fn for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(config, f, indent=1, sort_keys=True)
  save_file({k: v.detach().contiguous().cpu() for k, v in reference.items()},
            os.path.join(d, "reference.safetensors"))
  with open(os.path.join(d, "reference.json"), "w") as f:
    json.dump(meta, f, indent=1, sort_keys=True)
  print(f"wrote {d}: {sorted(os.listdir(d))}")


def _base_config():
  return {"architectures": ["TinyForCausalLM"], "hidden_size": D, "intermediate_size": F,
          "vocab_size": V, "num_hidden_layers": 1, "torch_dtype": "bfloat16"}


def _float_entries(model):
  return {k: v for k, v in model.float_tensors().items()}


# ----------------------------------------------------------------------------------------
# GPTQ (auto_gptq, v1 checkpoint format)
# ----------------------------------------------------------------------------------------
def make_gptq(out, name, bits, group_size, sym, shards=1):
  _stub_package("auto_gptq", os.path.join(SP, "auto_gptq"))
  from auto_gptq.nn_modules.qlinear.qlinear_cuda_old import QuantLinear
  from auto_gptq.quantization.quantizer import Quantizer
  import auto_gptq
  model = Tiny(torch.float16)
  tensors, ref = _float_entries(model), {}
  for path, lin in model.linears().items():
    w = lin.weight.data.float()
    n, k = w.shape
    g = k if group_size == -1 else group_size
    scales, zeros = [], []
    for gi in range(k // g):
      qz = Quantizer()
      qz.configure(bits, perchannel=True, sym=sym, mse=False)
      qz.find_params(w[:, gi * g:(gi + 1) * g], weight=True)
      scales.append(qz.scale)
      zeros.append(qz.zero)
    scales = torch.cat(scales, 1)  # (N, G): pack() transposes
    zeros = torch.cat(zeros, 1)
    ql = QuantLinear(bits, group_size, k, n, lin.bias is not None, weight_dtype=torch.float16)
    g_idx = torch.tensor([i // g for i in range(k)], dtype=torch.int32)
    ql.pack(lin.cpu(), scales, zeros, g_idx)
    ql.g_idx = g_idx
    for t in ("qweight", "qzeros", "scales", "g_idx"):
      tensors[f"{path}.{t}"] = getattr(ql, t)
    if lin.bias is not None:
      tensors[f"{path}.bias"] = ql.bias
    with torch.no_grad():
      eye = torch.eye(k, dtype=torch.float16)
      bias = ql.bias
      ql.bias = None
      ref[f"{path}.weight"] = ql(eye).t().contiguous()  # the producer's own dequant, fp16
      ql.bias = bias
      x = torch.randn(4, k, dtype=torch.float16)
      ref[f"{path}.x"], ref[f"{path}.y"] = x, ql(x)
  cfg = _base_config() | {"torch_dtype": "float16", "quantization_config": {
      "quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym,
      "desc_act": False, "static_groups": False, "true_sequential": True,
      "checkpoint_format": "gptq", "damp_percent": 0.01}}
  _write(out, name, tensors, cfg, ref,
         {"producer": f"auto_gptq {auto_gptq.__path__[0].split('/')[-1]} "
                      "qlinear_cuda_old.QuantLinear.pack (wheel 0.7.1)", "dtype": "float16"},
         shards)


# ----------------------------------------------------------------------------------------
# AWQ (autoawq GEMM)
# ----------------------------------------------------------------------------------------
def make_awq(out, name, group_size):
  sys.path.insert(0, AWQ_SRC)
  _stub_package("awq", os.path.join(AWQ_SRC, "awq"))
  from awq.modules.linear.gemm import WQLinear_GEMM
  from awq.utils.packing_utils import dequantize_gemm
  model = Tiny(torch.float16)
  tensors, ref = _float_entries(model), {}
  for path, lin in model.linears().items():
    w = lin.weight.data.float()
    n, k = w.shape
    wg = w.reshape(n, k // group_size, group_size)
    mx, mn = wg.amax(-1), wg.amin(-1)  # the AWQ pseudo-quantizer's asymmetric rule
    scales = ((mx - mn).clamp(min=1e-5) / 15).t().contiguous()  # (G, N)
    zeros = (-torch.round(mn / (mx - mn).clamp(min=1e-5) * 15)).clamp(0, 15).t().contiguous()
    ql = WQLinear_GEMM.from_linear(lin.float(), 4, group_size, scales=scales.half().float(),
                                   zeros=zeros)
    for t in ("qweight", "qzeros", "scales"):
      tensors[f"{path}.{t}"] = getattr(ql, t)
    if lin.bias is not None:
      tensors[f"{path}.bias"] = ql.bias.half()
    ref[f"{path}.weight"] = dequantize_gemm(ql.qweight, ql.qzeros, ql.scales, 4,
                                            group_size).t().contiguous()
  cfg = _base_config() | {"torch_dtype": "float16", "quantization_config": {
      "quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
      "version": "gemm", "modules_to_not_convert": None}}
  _write(out, name, tensors, cfg, ref,
         {"producer": "autoawq 0.2.9 WQLinear_GEMM.from_linear + dequantize_gemm",
          "dtype": "float16"})


# ----------------------------------------------------------------------------------------
# compressed-tensors
# ----------------------------------------------------------------------------------------
def make_ct(out, name, weights: dict, input_activations: dict | None = None,
            fmt: str | None = None, dims=None):
  import compressed_tensors as ct
  from compressed_tensors.compressors import ModelCompressor
  from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                               QuantizationScheme, QuantizationStatus,
                                               apply_quantization_config)
  from compressed_tensors.quantization.lifecycle.forward import fake_quantize
  from compressed_tensors.quantization.utils.helpers import (calculate_qparams,
                                                             compute_dynamic_scales_and_zp,
                                                             generate_gparam)
  model = Tiny(torch.bfloat16, *(dims or ()))
  wargs = QuantizationArgs(**weights)
  iargs = QuantizationArgs(**input_activations) if input_activations else None
  scheme = QuantizationScheme(targets=["Linear"], weights=wargs, input_activations=iargs)
  qcfg = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
  apply_quantization_config(model, qcfg)
  for path, lin in model.linears().items():
    w = lin.weight.data.float()
    n, k = w.shape
    s = wargs.strategy
    if s in ("group", "tensor_group"):
      wr = w.reshape(n, k // wargs.group_size, wargs.group_size)
      mn, mx = wr.amin(-1), wr.amax(-1)
    elif s == "channel":
      mn, mx = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    elif s == "block":
      bk, bn = wargs.block_structure
      wr = w.reshape(n // bk, bk, k // bn, bn)
      mn, mx = wr.amin((1, 3)), wr.amax((1, 3))
    else:
      mn, mx = w.amin().reshape(1), w.amax().reshape(1)
    gs = None
    if s == "tensor_group":
      gs = generate_gparam(w.amin(), w.amax())
      lin.weight_global_scale.data.copy_(gs)
    scale, zp = calculate_qparams(mn, mx, wargs, global_scale=gs)
    lin.weight_scale.data.copy_(scale.reshape(lin.weight_scale.shape))
    if hasattr(lin, "weight_zero_point"):
      lin.weight_zero_point.data.copy_(zp.reshape(lin.weight_zero_point.shape))
    if iargs is not None and iargs.dynamic is False:  # static per-tensor activation scale
      lin.input_scale.data.fill_(3.0 / 448.0)
    lin.quantization_status = QuantizationStatus.FROZEN
  ref = {}
  comp = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
  comp.compress_model(model)
  tensors = {k: v for k, v in model.state_dict().items()}
  os.makedirs(os.path.join(out, name), exist_ok=True)
  tmp = os.path.join(out, name, "config.json")
  with open(tmp, "w") as f:
    json.dump(_base_config(), f)
  comp.update_config(os.path.join(out, name))
  with open(tmp) as f:
    cfg = json.load(f)
  comp.decompress_model(model)
  with torch.no_grad():
    for path, lin in model.linears().items():
      ref[f"{path}.weight"] = lin.weight.data
      # Forward with the checkpoint's weights and the producer's own activation
      # fake-quantization (compute_dynamic_scales_and_zp + fake_quantize, what its
      # quantized forward calls).  x is (batch, seq, K): CT's "token" strategy reduces over
      # the dims after the first two.  (The FROZEN model's forward would re-quantize the
      # float weight with the calibration scales before their storage rounding.)
      x = torch.randn(1, 4, lin.in_features, dtype=torch.bfloat16)
      xq = x
      if iargs is not None:
        if iargs.dynamic is False:
          s, zp = lin.input_scale.data, getattr(lin, "input_zero_point", None)
        else:
          s, zp = compute_dynamic_scales_and_zp(x, iargs, module=lin)
        xq = fake_quantize(x, s, zp, iargs)
      ref[f"{path}.x"] = x
      ref[f"{path}.y"] = torch.nn.functional.linear(xq, lin.weight.data, lin.bias)
  _write(out, name, tensors, cfg, ref,
         {"producer": f"compressed-tensors {ct.__version__}", "dtype": "bfloat16"})


# ----------------------------------------------------------------------------------------
# ModelOpt NVFP4
# ----------------------------------------------------------------------------------------
def make_modelopt_nvfp4(out, name):
  import modelopt
  from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
  model = Tiny(torch.bfloat16)
  tensors, ref = _float_entries(model), {}
  for path, lin in model.linears().items():
    w = lin.weight.data
    q, s, s2 = NVFP4QTensor.quantize(w, 16)
    tensors[f"{path}.weight"] = q._quantized_data
    tensors[f"{path}.weight_scale"] = s
    tensors[f"{path}.weight_scale_2"] = s2.float().reshape(())
    tensors[f"{path}.input_scale"] = torch.tensor(0.05 / (6 * 448), dtype=torch.float32)
    if lin.bias is not None:
      tensors[f"{path}.bias"] = lin.bias.data
    ref[f"{path}.weight"] = q.dequantize(dtype=torch.float32, scale=s, double_scale=s2,
                                         block_sizes={-1: 16})
  cfg = _base_config() | {"quantization_config": {
      "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
      "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"],
      "producer": {"name": "modelopt", "version": modelopt.__version__}}}
  _write(out, name, tensors, cfg, ref,
         {"producer": f"nvidia-modelopt {modelopt.__version__} NVFP4QTensor",
          "dtype": "float32"})


# ----------------------------------------------------------------------------------------
# gpt-oss MXFP4 (stacked experts)
# ----------------------------------------------------------------------------------------
FP4_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _mxfp4_quantize(w: torch.Tensor):
  """(..., R, C) float -> blocks uint8 (..., R, C/32, 16), scales uint8 (..., R, C/32).

  OCP MX v1.0: shared scale 2**(floor(log2 amax) - 2), elements RNE onto e2m1, saturating."""
  *lead, r, c = w.shape
  wb = w.float().reshape(*lead, r, c // 32, 32)
  amax = wb.abs().amax(-1)
  e = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - 2
  scaled = wb / torch.exp2(e)[..., None]
  grid = torch.tensor(FP4_GRID)
  mag = scaled.abs().clamp(max=6.0)
  dist = (mag[..., None] - grid).abs()
  best = dist.min(-1, keepdim=True).values
  cand = (dist == best)  # ties: the even code (even mantissa bit)
  idx = torch.where(cand & (torch.arange(8) % 2 == 0), torch.arange(8), 99).amin(-1)
  idx = torch.where(cand.sum(-1) > 1, idx, dist.argmin(-1))
  codes = (idx | ((scaled < 0) & (idx > 0)).to(torch.int64) << 3).to(torch.uint8)
  blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
  return blocks.contiguous(), (e + 127).to(torch.uint8)


def make_mxfp4(out, name, experts=2):
  import transformers
  from transformers.integrations.mxfp4 import convert_moe_packed_tensors
  torch.manual_seed(1)
  model = Tiny(torch.bfloat16)
  tensors, ref = _float_entries(model), {}
  p = "model.layers.0.mlp.experts"
  for proj, (k, n) in {"gate_up_proj": (D, 2 * F), "down_proj": (F, D)}.items():
    w = torch.randn(experts, n, k) * 0.05  # stored transposed: (E, N, K)
    blocks, scales = _mxfp4_quantize(w)
    tensors[f"{p}.{proj}_blocks"] = blocks
    tensors[f"{p}.{proj}_scales"] = scales
    tensors[f"{p}.{proj}_bias"] = (torch.randn(experts, n) * 0.1).to(torch.bfloat16)
    # transformers: (E, N, K/32, 16) -> (E, K, N) dequantized, as GptOssExperts uses it
    ref[f"{p}.{proj}"] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
  tensors["model.layers.0.mlp.router.weight"] = torch.randn(experts, D).to(torch.bfloat16)
  cfg = _base_config() | {"num_local_experts": experts, "quantization_config": {
      "quant_method": "mxfp4",
      "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                 "model.embed_tokens", "lm_head"]}}
  _write(out, name, tensors, cfg, ref,
         {"producer": "constructed here (OCP MX v1.0 rule); reference dequant: transformers "
                      f"{transformers.__version__} convert_moe_packed_tensors",
          "dtype": "float32"})


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default="tests/fixtures/checkpoints")
  ap.add_argument("--only", default="", help="comma-separated fixture-name prefixes to "
                  "(re)make, e.g. 'ct-mx' for the MX fixtures alone (default: all)")
  args = ap.parse_args()
  out = args.out
  os.makedirs(out, exist_ok=True)
  wanted = [w for w in args.only.split(",") if w]
  if wanted:  # each maker below runs only for the fixture names asked for
    for maker in ("make_gptq", "make_awq", "make_ct", "make_modelopt_nvfp4", "make_mxfp4"):
      fn = globals()[maker]
      globals()[maker] = (lambda fn: lambda out, name, *a, **k: (
          fn(out, name, *a, **k) if any(name.startswith(w) for w in wanted) else None))(fn)
  make_gptq(out, "gptq-w4-g32-sym", 4, 32, True, shards=2)
  make_gptq(out, "gptq-w3-g32-asym", 3, 32, False)
  make_gptq(out, "gptq-w8-ch-sym", 8, -1, True)
  make_gptq(out, "gptq-w2-g64-asym", 2, 64, False)
  make_awq(out, "awq-w4-g32", 32)
  make_ct(out, "ct-w4a16-g32-sym", {"num_bits": 4, "type": "int", "symmetric": True,
                                    "strategy": "group", "group_size": 32},
          fmt="pack-quantized")
  make_ct(out, "ct-w4a16-g32-asym", {"num_bits": 4, "type": "int", "symmetric": False,
                                     "strategy": "group", "group_size": 32},
          fmt="pack-quantized")
  make_ct(out, "ct-w8a16-ch-sym", {"num_bits": 8, "type": "int", "symmetric": True,
                                   "strategy": "channel"}, fmt="pack-quantized")
  make_ct(out, "ct-fp8-ch-dynamic", {"num_bits": 8, "type": "float", "symmetric": True,
                                     "strategy": "channel"},
          {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
           "dynamic": True}, fmt="float-quantized")
  make_ct(out, "ct-fp8-block", {"num_bits": 8, "type": "float", "symmetric": True,
                                "strategy": "block", "block_structure": [64, 64]},
          {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
           "group_size": 64, "dynamic": True}, fmt="float-quantized")
  make_ct(out, "ct-w8a8-int8", {"num_bits": 8, "type": "int", "symmetric": True,
                                "strategy": "channel"},
          {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
           "dynamic": True}, fmt="int-quantized")
  make_ct(out, "ct-fp8-tensor-static", {"num_bits": 8, "type": "float", "symmetric": True,
                                        "strategy": "tensor"},
          {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor",
           "dynamic": False}, fmt="float-quantized")
  make_ct(out, "ct-nvfp4", {"num_bits": 4, "type": "float", "symmetric": True,
                            "strategy": "tensor_group", "group_size": 16},
          fmt="nvfp4-pack-quantized")
  # OCP MX through compressed-tensors (>= 0.20: e8m0 scales stored as uint8 exponents,
  # groups of 32; its MXFP4A16 / MXFP6A16 / MXFP8A16 / MXFP4 presets)
  mx = {"type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
        "scale_dtype": torch.uint8, "zp_dtype": torch.uint8}
  make_ct(out, "ct-mxfp4", {"num_bits": 4, **mx}, fmt="mxfp4-pack-quantized")
  make_ct(out, "ct-mxfp6", {"num_bits": 6, **mx}, fmt="mxfp6-pack-quantized")
  make_ct(out, "ct-mxfp8", {"num_bits": 8, **mx}, fmt="mxfp8-quantized")
  make_ct(out, "ct-mxfp4-a4", {"num_bits": 4, **mx}, {"num_bits": 4, "dynamic": True, **mx},
          fmt="mxfp4-pack-quantized")
  make_modelopt_nvfp4(out, "modelopt-nvfp4")
  make_mxfp4(out, "gptoss-mxfp4")


if __name__ == "__main__":
  main()
