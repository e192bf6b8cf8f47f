"""Act-order checkpoints (GPTQ desc_act, compressed-tensors actorder 'group'): input rows
assigned to groups out of order load with their rows sorted by group and the order kept as
``input_perm``; every op computes with the checkpoint's own weight, checked against the
formula W[k] = (code[k] - zero[g_idx[k]]) * scale[g_idx[k]] on the producer's codes."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import humming_jax as hj
from humming_jax import sharding
from humming_jax.checkpoints import load_checkpoint
from humming_jax.checkpoints._io import SafetensorsFile
from humming_jax.quantize import unpacked_codes, with_input_permutation

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "checkpoints")
MOD = "model.layers.0.self_attn.q_proj"  # K = 128, N = 64, 4 groups of 32, with a bias


def _checkpoint(tmp_path, name, g_key, config=None):
  """The fixture ``name`` with ``MOD``'s rows dealt to its groups in a random order (each
  group keeps 32 rows); returns (directory, g_idx)."""
  src = os.path.join(FIX, name)
  tensors = {}
  for fn in sorted(os.listdir(src)):
    if fn.endswith(".safetensors") and fn != "reference.safetensors":
      f = SafetensorsFile(os.path.join(src, fn))
      tensors.update({k: f.get(k) for k in f.keys()})
  g_idx = np.random.default_rng(0).permutation(np.arange(128) // 32).astype(np.int32)
  if g_key == "weight_g_idx":  # actorder 'group' says every layer has one: contiguous here
    for key in [k for k in tensors if k.endswith(".weight_shape")]:
      k = int(tensors[key][1])
      tensors[key.replace("weight_shape", g_key)] = (np.arange(k) // 32).astype(np.int32)
  tensors[f"{MOD}.{g_key}"] = g_idx
  d = tmp_path / name
  d.mkdir()
  cfg = json.load(open(os.path.join(src, "config.json")))
  if config:
    config(cfg["quantization_config"])
  (d / "config.json").write_text(json.dumps(cfg))
  save_file(tensors, str(d / "model.safetensors"))
  return str(d), g_idx


def _layer(path):
  tree = load_checkpoint(path, progress=False)
  for p in MOD.split("."):
    tree = tree[p]
  return tree["weight"]


def _expected(contiguous: hj.QuantizedWeight, g_idx: np.ndarray) -> np.ndarray:
  """(K, N) float32 from the codes / zero points / scales of the same layer loaded with
  contiguous groups (checked against the producer's dequantization in test_checkpoints)."""
  codes = np.asarray(unpacked_codes(contiguous), np.float32)
  vals = np.asarray(contiguous.spec.weight_format.decode(jnp.asarray(codes)), np.float32)
  zeros = (np.zeros_like(np.asarray(contiguous.scales, np.float32)) if contiguous.zeros is None
           else np.asarray(contiguous.zeros, np.float32))
  return (vals - zeros[g_idx]) * np.asarray(contiguous.scales, np.float32)[g_idx]


def _set_group_actorder(q):
  q["config_groups"]["group_0"]["weights"]["actorder"] = "group"


@pytest.mark.parametrize("name,g_key,config", [
    ("gptq-w3-g32-asym", "g_idx", None),            # 3-bit codes straddling words, zeros
    ("gptq-w4-g32-sym", "g_idx", None),             # signed int4 (the packed fast path)
    ("ct-w4a16-g32-asym", "weight_g_idx", _set_group_actorder),
])
def test_act_order_loads_and_computes_the_checkpoint_weight(tmp_path, name, g_key, config):
  path, g_idx = _checkpoint(tmp_path, name, g_key, config)
  q = _layer(path)
  contiguous = _layer(os.path.join(FIX, name))
  want = _expected(contiguous, g_idx)
  assert q.input_perm is not None and q.spec == contiguous.spec
  np.testing.assert_array_equal(np.asarray(q.input_perm), np.argsort(g_idx, kind="stable"))
  np.testing.assert_array_equal(np.asarray(hj.dequantize(q)), want)
  assert not np.array_equal(want, np.asarray(hj.dequantize(contiguous)))  # the order matters
  x = jax.random.normal(jax.random.key(1), (3, 128), jnp.float32)
  y_want = x @ want + np.asarray(q.bias)
  for backend in ("xla", "interpret"):
    y = jax.jit(lambda q, x: hj.quant_dense(q, x, backend=backend))(q, x)
    np.testing.assert_allclose(y, y_want, rtol=2e-5, atol=2e-5 * float(jnp.abs(y_want).max()))
  # prepared for the default kernel (bf16 tokens): the permutation rides along
  p = hj.prepare(q)
  assert p.layout != "canonical" and p.input_perm is q.input_perm
  xb = x.astype(jnp.bfloat16)
  y = hj.quant_dense(p, xb, backend="interpret").astype(jnp.float32)
  y_want = xb.astype(jnp.float32) @ want + np.asarray(q.bias)
  assert float(jnp.max(jnp.abs(y - y_want)) / jnp.max(jnp.abs(y_want))) <= 1e-2
  # the gradient of x: dy W^T in the checkpoint's own row order
  dy = jax.random.normal(jax.random.key(2), (3, 64))
  dx = jax.grad(lambda x: jnp.sum(hj.quant_dense(q, x, backend="interpret") * dy))(x)
  np.testing.assert_allclose(dx, dy @ want.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("actorder", ["group", "dynamic", True])
def test_ct_actorder_without_g_idx_is_refused(tmp_path, actorder):
  """compressed-tensors actorder 'group' (and its aliases) without weight_g_idx: the rows'
  groups are unknown, refused by name."""
  def config(q):
    q["config_groups"]["group_0"]["weights"]["actorder"] = actorder
  src = os.path.join(FIX, "ct-w4a16-g32-asym")
  d = tmp_path / "ct"
  d.mkdir()
  cfg = json.load(open(os.path.join(src, "config.json")))
  config(cfg["quantization_config"])
  (d / "config.json").write_text(json.dumps(cfg))
  f = SafetensorsFile(os.path.join(src, "model.safetensors"))
  save_file({k: f.get(k) for k in f.keys()}, str(d / "model.safetensors"))
  with pytest.raises(ValueError, match=r"actorder .* but no tensor .*\.weight_g_idx"):
    load_checkpoint(str(d), progress=False)


def test_act_order_save_load_shard_and_refusals(tmp_path):
  """hj.save / hj.load keep input_perm (checkpoint version 4); a column (N) shard keeps
  it, a K split, experts and activation-quantized specs refuse it by name."""
  path, g_idx = _checkpoint(tmp_path, "gptq-w4-g32-sym", "g_idx")
  q = _layer(path)
  hj.save(str(tmp_path / "q.safetensors"), {"q": q})
  meta = json.loads(SafetensorsFile(str(tmp_path / "q.safetensors")).metadata["humming_jax"])
  assert meta["version"] == 4
  back = hj.load(str(tmp_path / "q.safetensors"))["q"]
  np.testing.assert_array_equal(np.asarray(back.input_perm), np.asarray(q.input_perm))
  np.testing.assert_array_equal(np.asarray(hj.dequantize(back)), np.asarray(hj.dequantize(q)))
  half = sharding.slice_weight(q, "n", 1, 2)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(half)),
                                np.asarray(hj.dequantize(q))[:, 32:])
  with pytest.raises(ValueError, match="act-order weights .* cannot be split along K"):
    sharding.slice_weight(q, "k", 0, 2)
  experts = hj.quantize(jax.random.normal(jax.random.key(3), (2, 128, 64)), "w4a16-g128")
  experts = experts.replace(input_perm=q.input_perm)
  with pytest.raises(ValueError, match=r"params\.input_perm is set .*stacked experts"):
    hj.quant_ragged_dot(experts, jnp.ones((4, 128)), jnp.array([2, 2]), backend="xla")
  down = hj.quantize(jax.random.normal(jax.random.key(8), (2, 32, 128)), "w8a16")
  with pytest.raises(ValueError, match=r"gate_up_params\.input_perm is set"):
    hj.quant_moe(experts, down, jnp.ones((3, 128)), jnp.ones((3, 1)),
                 jnp.zeros((3, 1), jnp.int32), backend="xla")
  with pytest.raises(ValueError, match="cannot be split along K"):
    sharding.weight_partition_spec(q, jax.sharding.PartitionSpec("tp", None))
  # a tree without input_perm / fold_base leaves them out: releases before them read it
  hj.save(str(tmp_path / "plain.safetensors"), {"q": _layer(os.path.join(FIX,
                                                                         "gptq-w4-g32-sym"))})
  meta = json.loads(SafetensorsFile(str(tmp_path / "plain.safetensors")).metadata[
      "humming_jax"])
  leaves = meta["tree"]["dict"]["q"]["quantized"]["leaves"]
  assert meta["version"] == 2 and "input_perm" not in leaves and "fold_base" not in leaves
  w8 = hj.quantize(jax.random.normal(jax.random.key(4), (128, 64)), "w8a8-int8")
  with pytest.raises(ValueError, match="expected canonical dense weight-only params"):
    with_input_permutation(w8, np.arange(128))
  with pytest.raises(ValueError, match=r"perm must be a permutation of range\(K=128\)"):
    with_input_permutation(_layer(os.path.join(FIX, "gptq-w4-g32-sym")),
                                    np.zeros(128, np.int32))
  with pytest.raises(ValueError, match="input_perm .*activation quantization"):
    hj.quant_dense(w8.replace(input_perm=q.input_perm), jnp.ones((1, 128)), backend="xla")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 1024])
def test_act_order_gpu(m):
  """On the H200: a permuted-row int4 g128 zp layer (8192 x 4096) through the Pallas path,
  prepared once, against x @ W in the weight's own row order."""
  k, n = 8192, 4096
  q = hj.quantize(jax.random.normal(jax.random.key(5), (k, n)), "w4a16-g128-zp")
  q = with_input_permutation(q, np.random.default_rng(6).permutation(k))
  p = hj.prepare(q)
  x = jax.random.normal(jax.random.key(7), (m, k), jnp.bfloat16)
  y = jax.jit(hj.quant_dense)(p, x).astype(jnp.float32)
  want = jnp.dot(x.astype(jnp.float32), hj.dequantize(q), precision="highest")
  assert float(jnp.max(jnp.abs(y - want)) / jnp.max(jnp.abs(want))) <= 1e-2
