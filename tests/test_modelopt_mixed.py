"""ModelOpt MIXED_PRECISION checkpoints (NVIDIA's recent NVFP4 / FP8 releases): each module's
algorithm comes from ``quantized_layers`` (its own entry or its nearest parent's).  Built
from the ModelOpt NVFP4 fixture (made by nvidia-modelopt) plus fp8 layers written the way
ModelOpt stores them."""
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.checkpoints import load_checkpoint
from humming_jax.checkpoints._io import SafetensorsFile
from test_checkpoints_errors import _save_raw  # bf16 / fp8 safetensors writer

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "checkpoints", "modelopt-nvfp4")
L = "model.layers.0"
LAYERS = {f"{L}.self_attn.q_proj": {"quant_algo": "NVFP4", "group_size": 16},
          f"{L}.mlp": {"quant_algo": "W4A16_NVFP4", "group_size": 16},  # covers down_proj
          f"{L}.mlp.up_proj": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"},
          f"{L}.self_attn.o_proj": {"quant_algo": "FP8_PB_WO", "group_size": 64},
          f"{L}.self_attn.k_proj": {"quant_algo": "FP8"},
          f"{L}.self_attn.v_proj": {"quant_algo": "UNQUANTIZED"}}


def _write(d, tensors, layers=LAYERS):
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"quantization_config": {"quant_method": "modelopt",
                                       "quant_algo": "MIXED_PRECISION",
                                       "kv_cache_quant_algo": None,
                                       "quantized_layers": layers}}, f)
  _save_raw(tensors, os.path.join(d, "model.safetensors"))
  return d


def _tensors():
  f = SafetensorsFile(os.path.join(FIX, "model.safetensors"))
  t = {k: np.asarray(f.get(k)) for k in f.keys()}
  rng = np.random.default_rng(0)
  want = {}
  # up_proj: e4m3 rows, one float32 scale per output row
  w = rng.standard_normal((96, 128)).astype(np.float32) * 0.05
  s = (np.abs(w).max(1, keepdims=True) / 448).astype(np.float32)
  t[f"{L}.mlp.up_proj.weight"] = (w / s).astype(ml_dtypes.float8_e4m3fn)
  t[f"{L}.mlp.up_proj.weight_scale"] = s
  want["up"] = t[f"{L}.mlp.up_proj.weight"].astype(np.float32) * s
  # o_proj: 64 x 64 blocks over N = 96 (a partial last block), weight-only
  w = rng.standard_normal((96, 128)).astype(np.float32) * 0.05
  sb = np.zeros((2, 2), np.float32)
  for i in range(2):
    for j in range(2):
      sb[i, j] = np.abs(w[64 * i:64 * i + 64, 64 * j:64 * j + 64]).max() / 448
  full = np.repeat(np.repeat(sb, 64, 0)[:96], 64, 1)
  t[f"{L}.self_attn.o_proj.weight"] = (w / full).astype(ml_dtypes.float8_e4m3fn)
  t[f"{L}.self_attn.o_proj.weight_scale"] = sb
  want["o"] = t[f"{L}.self_attn.o_proj.weight"].astype(np.float32) * full
  # k_proj: per tensor, static input scale
  t[f"{L}.self_attn.k_proj.weight"] = (w / 0.001).astype(ml_dtypes.float8_e4m3fn)
  t[f"{L}.self_attn.k_proj.weight_scale"] = np.array(0.001, np.float32)
  t[f"{L}.self_attn.k_proj.input_scale"] = np.array(3.0 / 448, np.float32)
  want["k"] = t[f"{L}.self_attn.k_proj.weight"].astype(np.float32) * np.float32(0.001)
  t[f"{L}.self_attn.v_proj.weight"] = w.astype(ml_dtypes.bfloat16)
  return t, want


def _get(tree, dotted):
  for p in dotted.split("."):
    tree = tree[p]
  return tree


def test_mixed_precision_layers_take_their_own_algorithm(tmp_path):
  t, want = _tensors()
  with pytest.warns(UserWarning, match="calibrated input_scale not used"):
    tree = load_checkpoint(_write(str(tmp_path / "c"), t), progress=False)
  with pytest.warns(UserWarning):
    plain = load_checkpoint(FIX, progress=False)  # the same NVFP4 layers as quant_algo NVFP4
  q = _get(tree, f"{L}.self_attn.q_proj")["weight"]
  ref = _get(plain, f"{L}.self_attn.q_proj")["weight"]
  assert q.spec == ref.spec and q.spec.act == "fp4_e2m1"  # W4A4 (an input_scale)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(q)), np.asarray(hj.dequantize(ref)))
  down = _get(tree, f"{L}.mlp.down_proj")["weight"]  # the parent's W4A16_NVFP4
  ref = _get(plain, f"{L}.mlp.down_proj")["weight"]
  assert down.spec == ref.spec.weight_only() and down.spec.act is None
  np.testing.assert_array_equal(np.asarray(hj.dequantize(down)), np.asarray(hj.dequantize(ref)))
  # its input_scale is not part of a weight-only layer: kept as a leaf, as stored
  assert _get(tree, f"{L}.mlp.down_proj.input_scale").shape == ()
  up = _get(tree, f"{L}.mlp.up_proj")["weight"]  # its own entry beats the parent's
  assert up.spec == hj.QuantSpec.preset("w8a8-fp8")
  np.testing.assert_array_equal(np.asarray(hj.dequantize(up)).T, want["up"])
  o = _get(tree, f"{L}.self_attn.o_proj")["weight"]
  assert (o.spec.granularity, o.spec.group_size, o.spec.block_n, o.spec.act) == (
      "block", 64, 32, None)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(o)).T, want["o"])
  k = _get(tree, f"{L}.self_attn.k_proj")["weight"]
  assert (k.spec.granularity, k.spec.act_granularity, k.spec.act_static) == (
      "tensor", "tensor", True)
  assert float(k.act_scale) == np.float32(3.0 / 448)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(k)).T, want["k"])
  assert _get(tree, f"{L}.self_attn.v_proj.weight").dtype == jnp.bfloat16
  # the per-channel / block fp8 layers compute what their weights say
  x = jax.random.normal(jax.random.key(0), (4, 128), jnp.float32)
  y = np.asarray(hj.quant_dense(o, x, backend="xla"))
  np.testing.assert_allclose(y, np.asarray(x) @ want["o"].T, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("change,match", [
    (lambda t, ly: ly.pop(f"{L}.self_attn.k_proj"),
     rf"module '{L}\.self_attn\.k_proj': quantized tensors \['input_scale', 'weight_scale'\] "
     r"but no quantization_config\.quantized_layers entry"),
    (lambda t, ly: ly.update({f"{L}.self_attn.k_proj": {"quant_algo": "W4A8_AWQ"}}),
     r"ModelOpt quant_algo 'W4A8_AWQ' is not supported"),
    (lambda t, ly: t.update({f"{L}.mlp.up_proj.pre_quant_scale": np.ones(128, np.float32)}),
     r"up_proj\.pre_quant_scale \(ModelOpt AWQ smoothing"),
    (lambda t, ly: t.update({f"{L}.mlp.up_proj.weight_scale": np.ones((4, 1), np.float32)}),
     r"weight_scale': shape \(4, 1\), expected \(96, 1\)"),
])
def test_mixed_precision_refusals(tmp_path, change, match):
  t, _ = _tensors()
  layers = dict(LAYERS)
  change(t, layers)
  with pytest.raises(ValueError, match=match):
    load_checkpoint(_write(str(tmp_path / "c"), t, layers), progress=False)


@pytest.mark.gpu
def test_mixed_precision_layers_run_on_the_gpu_kernels(tmp_path):
  """Each loaded layer (W4A4 / W4A16 NVFP4, per-channel / block / per-tensor fp8) through
  quant_dense's GPU kernels equals the XLA path on the same params."""
  t, _ = _tensors()
  with pytest.warns(UserWarning):
    tree = load_checkpoint(_write(str(tmp_path / "c"), t), progress=False)
  for mod in ("self_attn.q_proj", "mlp.down_proj", "mlp.up_proj", "self_attn.o_proj",
              "self_attn.k_proj"):
    q = _get(tree, f"{L}.{mod}")["weight"]
    for m in (1, 33):
      x = jax.random.normal(jax.random.key(m), (m, q.shape[0]), jnp.bfloat16)
      y = np.asarray(jax.jit(lambda q, x: hj.quant_dense(q, x, backend="pallas"))(q, x),
                     np.float32)
      ref = np.asarray(hj.quant_dense(q, x, backend="xla"), np.float32)
      assert np.all(np.isfinite(y)), (mod, m)
      assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-2, (mod, m, q.spec.name)
