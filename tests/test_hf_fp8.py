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
  """Per-tensor fp8 tensors (weight_scale / input_scale) in a checkpoint whose config names a
  block size are refused by name, not loaded as raw fp8 arrays (without a block size they
  are an AutoFP8 export: test_per_tensor_fp8_loads)."""
  mod = "model.layers.0.mlp.down_proj"
  save_file({f"{mod}.weight": np.ones((128, 128), ml_dtypes.float8_e4m3fn),
             f"{mod}.weight_scale": np.ones((1,), np.float32),
             f"{mod}.input_scale": np.ones((1,), np.float32)}, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
      "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}))
  with pytest.raises(ValueError, match=rf"module '{mod}': per-tensor fp8 tensors"):
    load_checkpoint(str(tmp_path), progress=False)


@pytest.mark.parametrize("change,match", [
    ({"weight_block_size": None}, r"weight_scale_inv but quantization_config has no "
                                  r"weight_block_size"),
    ({"weight_block_size": [128]}, r"weight_block_size=\[128\]: expected \[bn, bk\]"),
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


def _fp8_linear(rng, n, k, per_channel: bool):
  """Producer-style e4m3 weights: amax / 448 per tensor (AutoFP8) or per row (fbgemm)."""
  w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
  amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max().reshape(1)
  s = (amax / 448.0).astype(np.float32)
  return (w / s).astype(ml_dtypes.float8_e4m3fn), s


def _fake_fp8(x, s):
  """x / s saturated to e4m3 and back, times s (what AutoFP8 / fbgemm feed the GEMM)."""
  return np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s


# The CPU runs the XLA path and the kernels in the interpreter; a GPU the kernels themselves.
BACKENDS = ["xla", "interpret", pytest.param("pallas", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", ["static", "dynamic"])
def test_per_tensor_fp8_loads(tmp_path, scheme, backend):
  """AutoFP8 exports (quant_method fp8 without weight_block_size; neuralmagic's early
  *-FP8 models): one weight scale per layer; activations divided by the calibrated
  input_scale ('static') or quantized per token ('dynamic': as vLLM runs them on Hopper;
  a load-time note says AutoFP8's own forward is per tensor).  They were refused; now they
  load as exactly weight * weight_scale with those activation semantics, an older kv_scale
  kept beside the weight, lm_head (ignored_layers) float."""
  rng = np.random.default_rng(3)
  mods = {"model.layers.0.self_attn.k_proj": (64, 128), "model.layers.0.mlp.down_proj": (128, 96)}
  tensors, want = {}, {}
  for mod, (n, k) in mods.items():
    q, s = _fp8_linear(rng, n, k, per_channel=False)
    tensors[f"{mod}.weight"], tensors[f"{mod}.weight_scale"] = q, s
    if scheme == "static":
      tensors[f"{mod}.input_scale"] = np.array([2.5 / 448], np.float32)
    want[mod] = q.astype(np.float32) * s
  tensors["model.layers.0.self_attn.k_proj.kv_scale"] = np.array([0.02], np.float32)
  tensors["lm_head.weight"] = rng.standard_normal((32, 128)).astype(ml_dtypes.bfloat16)
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
      "quant_method": "fp8", "activation_scheme": scheme, "ignored_layers": ["lm_head"]}}))
  save_file(tensors, str(tmp_path / "model.safetensors"))
  if scheme == "dynamic":
    with pytest.warns(UserWarning, match=r"quantized per token \(as vLLM runs it"):
      tree = load_checkpoint(str(tmp_path), progress=False)
  else:
    tree = load_checkpoint(str(tmp_path), progress=False)
  for mod, (n, k) in mods.items():
    q = _get(tree, mod)["weight"]
    assert (q.spec.weight, q.spec.granularity, q.spec.act, q.spec.act_granularity,
            q.spec.act_static) == ("fp8_e4m3", "tensor", "fp8_e4m3",
                                   "tensor" if scheme == "static" else "token",
                                   scheme == "static")
    np.testing.assert_array_equal(np.asarray(hj.dequantize(q)).T, want[mod])
    x = np.asarray(jax.random.normal(jax.random.key(4), (5, k), jnp.float32))
    sx = (np.float32(2.5 / 448) if scheme == "static"
          else np.abs(x).max(1, keepdims=True) / 448)
    ref = _fake_fp8(x, sx) @ want[mod].T
    y = np.asarray(hj.quant_dense(q, jnp.asarray(x), backend=backend), np.float32)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-3, mod
  assert np.asarray(tree["model"]["layers"]["0"]["self_attn"]["k_proj"]["kv_scale"]) == \
      np.float32(0.02)
  assert tree["lm_head"]["weight"].dtype == jnp.bfloat16


@pytest.mark.parametrize("backend", BACKENDS)
def test_fbgemm_fp8_loads(tmp_path, backend):
  """transformers' fbgemm_fp8 (Meta's Llama-3.1-405B-FP8): e4m3 weights with one float32
  scale per output row, activations per token at run time -- the w8a8-fp8 semantics.
  fbgemm's activation_scale_ub is not applied: a load-time note says so."""
  rng = np.random.default_rng(5)
  mod, (n, k) = "model.layers.0.mlp.up_proj", (96, 128)
  q8, s = _fp8_linear(rng, n, k, per_channel=True)
  bias = rng.standard_normal(n).astype(np.float32)
  save_file({f"{mod}.weight": q8, f"{mod}.weight_scale": s, f"{mod}.bias": bias,
             "model.layers.0.mlp.gate.weight": np.ones((4, 128), np.float32)},
            str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
      "quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
      "modules_to_not_convert": ["model.layers.0.mlp.gate"]}}))
  assert detect_format(str(tmp_path)) == "fbgemm_fp8"
  with pytest.warns(UserWarning, match=r"activation_scale_ub=1200.0 .* is not applied"):
    tree = load_checkpoint(str(tmp_path), progress=False)
  q = _get(tree, mod)["weight"]
  assert q.spec == hj.QuantSpec.preset("w8a8-fp8")
  w = q8.astype(np.float32) * s
  np.testing.assert_array_equal(np.asarray(hj.dequantize(q)).T, w)
  x = np.asarray(jax.random.normal(jax.random.key(6), (6, k), jnp.float32))
  ref = _fake_fp8(x, np.abs(x).max(1, keepdims=True) / 448) @ w.T + bias
  y = np.asarray(hj.quant_dense(q, jnp.asarray(x), backend=backend), np.float32)
  assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-3
  assert tree["model"]["layers"]["0"]["mlp"]["gate"]["weight"].dtype == jnp.float32


@pytest.mark.parametrize("edit,match", [
    (lambda t, m: t.update({f"{m}.weight_scale": np.ones((2, 1), np.float32)}),
     r"weight_scale': shape \(2, 1\), expected one value"),
    (lambda t, m: t.pop(f"{m}.input_scale"), r"activation_scheme 'static' but no tensor"),
    (lambda t, m: t.pop(f"{m}.weight_scale"), r"input_scale without .*weight_scale"),
    ("dynamic", r"a calibrated .*input_scale but activation_scheme 'dynamic'"),
])
def test_per_tensor_fp8_refusals(tmp_path, edit, match):
  mod = "model.layers.0.mlp.down_proj"
  t = {f"{mod}.weight": np.ones((64, 64), ml_dtypes.float8_e4m3fn),
       f"{mod}.weight_scale": np.ones((1,), np.float32),
       f"{mod}.input_scale": np.ones((1,), np.float32)}
  scheme = "static"
  if edit == "dynamic":
    scheme = "dynamic"
  else:
    edit(t, mod)
  save_file(t, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
      "quant_method": "fp8", "activation_scheme": scheme}}))
  with pytest.raises(ValueError, match=match):
    load_checkpoint(str(tmp_path), progress=False)
