"""Block-scaled FP8 checkpoints (quant_method "fp8": DeepSeek-V3, Qwen3-FP8): a checkpoint
written here the way the producers quantize (per 128 x 128 block, amax / 448, e4m3) loads
as exactly weight * weight_scale_inv, with the w8a8-fp8-block semantics."""
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import humming_jax as hj
from humming_jax.checkpoints import detect_format, load_checkpoint

CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128]}
# (N, K): a multiple of the block, and DeepSeek-V3's kv_a_proj_with_mqa-like N = 576
SHAPES = {"model.layers.0.self_attn.o_proj": (256, 384),
          "model.layers.0.self_attn.kv_a_proj_with_mqa": (576, 256)}


def _quantize_blocks(w: np.ndarray, b: int = 128):
  """The producers' weight quantization: per (b, b) block s = amax / 448, e4m3(w / s)."""
  n, k = w.shape
  gn, gk = -(-n // b), k // b
  s = np.zeros((gn, gk), np.float32)
  q = np.zeros_like(w)
  for i in range(gn):
    for j in range(gk):
      blk = w[i * b:(i + 1) * b, j * b:(j + 1) * b]
      s[i, j] = np.abs(blk).max() / 448.0
      q[i * b:(i + 1) * b, j * b:(j + 1) * b] = blk / s[i, j]
  return q.astype(ml_dtypes.float8_e4m3fn), s


def _checkpoint(tmp_path, config=CONFIG, scale_dtype=np.float32):
  rng = np.random.default_rng(0)
  tensors, want = {}, {}
  for mod, (n, k) in SHAPES.items():
    q, s = _quantize_blocks(rng.standard_normal((n, k)).astype(np.float32))
    s = s.astype(scale_dtype).astype(np.float32)  # the scale the file holds
    tensors[f"{mod}.weight"], tensors[f"{mod}.weight_scale_inv"] = q, s.astype(scale_dtype)
    want[mod] = q.astype(np.float32) * np.repeat(np.repeat(s, 128, 0)[:n], 128, 1)
  tensors["lm_head.weight"] = rng.standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
  save_file(tensors, str(tmp_path / "model.safetensors"))
  return str(tmp_path), tensors, want


def _get(tree, dotted):
  for p in dotted.split("."):
    tree = tree[p]
  return tree


@pytest.mark.parametrize("scale_dtype", [np.float32, ml_dtypes.bfloat16])
def test_block_fp8_loads_exactly(tmp_path, scale_dtype):
  """fp32 scales (DeepSeek-V3) and bf16 ones (some Qwen3-FP8 exports, widened exactly)."""
  path, tensors, want = _checkpoint(tmp_path, scale_dtype=scale_dtype)
  assert detect_format(path) == "fp8"
  tree = load_checkpoint(path, progress=False)
  for mod, (n, k) in SHAPES.items():
    q = _get(tree, mod)["weight"]
    assert (q.spec.weight, q.spec.granularity, q.spec.group_size, q.spec.act,
            q.spec.act_granularity, q.spec.act_group_size) == (
                "fp8_e4m3", "block", 128, "fp8_e4m3", "group", 128)
    assert q.spec.block_n == (128 if n % 128 == 0 else 64)  # 576 = 9 blocks of 64
    np.testing.assert_array_equal(np.asarray(hj.dequantize(q)).T, want[mod])
    x = jax.random.normal(jax.random.key(1), (4, k), jnp.float32)
    y = hj.quant_dense(q, x, backend="xla")
    ref = x @ want[mod].T
    assert float(jnp.max(jnp.abs(y - ref)) / jnp.max(jnp.abs(ref))) < 0.1  # fp8 activations
  lm = tree["lm_head"]["weight"]  # not quantized: as stored
  assert lm.dtype == jnp.bfloat16 and lm.shape == (64, 256)


@pytest.mark.parametrize("mod", list(SHAPES))
def test_block_fp8_interpret_matches_reference(tmp_path, mod):
  """The loaded layers (128- and 64-column blocks) through the Pallas kernels
  (interpreter) equal the XLA reference."""
  path, _, _ = _checkpoint(tmp_path)
  q = _get(load_checkpoint(path, progress=False), mod)["weight"]
  x = jax.random.normal(jax.random.key(2), (8, q.in_features), jnp.bfloat16)
  y = hj.quant_dense(q, x, backend="interpret").astype(jnp.float32)
  ref = hj.quant_dense(q, x, backend="xla").astype(jnp.float32)
  assert float(jnp.max(jnp.abs(y - ref)) / jnp.max(jnp.abs(ref))) <= 1e-2


def test_per_tensor_fp8_under_the_same_method_is_refused(tmp_path):
  """An AutoFP8-style export (quant_method fp8, weight_scale / input_scale per layer) is
  refused by name, not loaded as raw fp8 arrays."""
  mod = "model.layers.0.mlp.down_proj"
  save_file({f"{mod}.weight": np.ones((128, 128), ml_dtypes.float8_e4m3fn),
             f"{mod}.weight_scale": np.ones((1,), np.float32),
             f"{mod}.input_scale": np.ones((1,), np.float32)}, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
      "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}))
  with pytest.raises(ValueError, match=rf"module '{mod}': per-tensor fp8 tensors"):
    load_checkpoint(str(tmp_path), progress=False)


@pytest.mark.parametrize("change,match", [
    ({"weight_block_size": None}, r"weight_block_size=None: expected \[bn, bk\]"),
    ({"activation_scheme": "static"}, "activation_scheme='static'"),
])
def test_block_fp8_refusals(tmp_path, change, match):
  path, _, _ = _checkpoint(tmp_path, {**CONFIG, **change})
  with pytest.raises(ValueError, match=match):
    load_checkpoint(path, progress=False)


def test_block_fp8_k_not_a_multiple_of_the_block_is_refused(tmp_path):
  """A K that is not a multiple of the block (the activation groups are bk wide) is refused
  naming the weight tensor, with the exporters' rounded-up scale count."""
  mod = "model.layers.0.mlp.down_proj"
  rng = np.random.default_rng(1)
  save_file({f"{mod}.weight": rng.standard_normal((128, 192)).astype(ml_dtypes.float8_e4m3fn),
             f"{mod}.weight_scale_inv": np.ones((1, 2), np.float32)},
            str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": CONFIG}))
  with pytest.raises(ValueError, match=rf"tensor '{mod}\.weight': K=192 is not a multiple of "
                                       r"the block's 128 input columns"):
    load_checkpoint(str(tmp_path), progress=False)
