"""Producer conventions that the fixtures (tests/fixtures/checkpoints) do not reach, each
checked against a numpy transcription of the producer's own code:

* compressed-tensors ``pack_to_int32`` at 3 / 5 / 6 / 7 bits: ``32 // bits`` codes per
  int32, the word's top bits unused (not a dense bitstream);
* GPTQ v1 zero points: AutoGPTQ's reader (and vLLM's kernels) add 1 to the stored value with
  no modulo, so a stored 2**bits - 1 is a zero point of 2**bits;
* gpt-oss experts: gate / up interleaved along the columns and a clamped SwiGLU.
"""
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import humming_jax as hj

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "checkpoints")
MOD = "model.layers.0.mlp.down_proj"


def _write(tmp_path, quantization_config, tensors):
  d = tmp_path / "ckpt"
  d.mkdir()
  (d / "config.json").write_text(json.dumps({"architectures": ["TinyForCausalLM"],
                                             "quantization_config": quantization_config}))
  save_file(tensors, str(d / "model.safetensors"))
  return str(d)


def _weight(path):
  tree = hj.load_checkpoint(path, progress=False)
  node = tree
  for part in MOD.split("."):
    node = node[part]
  return node["weight"]


def ct_pack_to_int32(values: np.ndarray, bits: int, packed_dim: int, dense: bool
                     ) -> np.ndarray:
  """compressed-tensors' ``pack_to_int32`` on unsigned codes along ``packed_dim``: since
  0.18 a dense bitstream (code i at stream bits [i * bits, (i + 1) * bits), ceil(count *
  bits / 32) words); before, ``32 // bits`` codes per word (code i of a word at bits
  [i * bits, ...), the word's top bits zero)."""
  v = np.moveaxis(values.astype(np.uint64), packed_dim, -1)
  count = v.shape[-1]
  per_word = 32 if dense else 32 // bits  # codes per 32 bits of the stream
  words = np.zeros((*v.shape[:-1], -(-count * bits // 32) if dense else -(-count // per_word)),
                   np.uint64)
  for i in range(count):
    bit = i * bits if dense else (i // per_word) * 32 + (i % per_word) * bits
    words[..., bit // 32] |= (v[..., i] << np.uint64(bit % 32)) & np.uint64(0xFFFFFFFF)
    if bit % 32 + bits > 32:  # the code's high bits continue in the next word
      words[..., bit // 32 + 1] |= v[..., i] >> np.uint64(32 - bit % 32)
  words = words.astype(np.uint32)
  return np.ascontiguousarray(np.moveaxis(words, -1, packed_dim)).view(np.int32)


def _ct_config(bits, symmetric, g, version=None):
  cfg = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
      "group_0": {"targets": ["Linear"], "format": "pack-quantized", "weights": {
          "num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": "group",
          "group_size": g}}}}
  if version is not None:
    cfg["version"] = version
  return cfg


@pytest.mark.parametrize("dense", [True, False], ids=["ct>=0.18", "ct<0.18"])
@pytest.mark.parametrize("bits", [3, 5, 6, 7])
@pytest.mark.parametrize("symmetric", [True, False])
def test_ct_pack_quantized_at_widths_that_do_not_divide_32(tmp_path, bits, symmetric, dense):
  """(N, K) = (40, 96), groups of 32, both producers' packings: the loaded weight
  dequantizes to (q - zp) * scale exactly, q and zp the signed values packed
  (+ 2**(bits-1))."""
  rng = np.random.default_rng(bits)
  n, k, g = 40, 96, 32
  half = 1 << (bits - 1)
  q = rng.integers(-half, half, (n, k))
  scale = rng.uniform(0.01, 0.1, (n, k // g)).astype(np.float16)
  tensors = {f"{MOD}.weight_packed": ct_pack_to_int32(q + half, bits, 1, dense),
             f"{MOD}.weight_shape": np.array([n, k], np.int64),
             f"{MOD}.weight_scale": scale}
  zp = np.zeros((n, k // g), np.int64)
  if not symmetric:
    zp = rng.integers(-half, half, (n, k // g))
    tensors[f"{MOD}.weight_zero_point"] = ct_pack_to_int32(zp + half, bits, 0, dense)
  words = -(-k * bits // 32) if dense else -(-k // (32 // bits))
  assert tensors[f"{MOD}.weight_packed"].shape == (n, words)
  w = _weight(_write(tmp_path, _ct_config(bits, symmetric, g), tensors))
  assert w.spec.weight == (f"int{bits}" if symmetric else f"uint{bits}")
  want = (q - np.repeat(zp, g, axis=1)) * np.repeat(scale.astype(np.float32), g, axis=1)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(w)), want.T.astype(np.float32))


@pytest.mark.parametrize("version,dense", [("0.20.1", True), ("0.17.1", False), (None, None),
                                           ("0.17.2.dev3", None)])
def test_ct_packing_that_fits_both_layouts_goes_by_the_version(tmp_path, version, dense):
  """K = 20 at 3 bits is 2 words either way: the config's compressed-tensors version
  decides (>= 0.18: dense); without one, or with a 0.17.2 dev build (either packing), the
  layer is refused by name."""
  rng = np.random.default_rng(0)
  n, k = 8, 20
  q = rng.integers(-4, 4, (n, k))
  tensors = {f"{MOD}.weight_packed": ct_pack_to_int32(q + 4, 3, 1, bool(dense)),
             f"{MOD}.weight_shape": np.array([n, k], np.int64),
             f"{MOD}.weight_scale": np.ones((n, 1), np.float16)}
  cfg = _ct_config(3, True, k, version)
  cfg["config_groups"]["group_0"]["weights"].update(strategy="channel", group_size=None)
  d = _write(tmp_path, cfg, tensors)
  if dense is None:
    with pytest.raises(ValueError, match=rf"{MOD}\.weight_packed'?: its 3-bit codes fit both "
                                         r"compressed-tensors packings.*names no version"):
      _weight(d)
    return
  np.testing.assert_array_equal(np.asarray(hj.dequantize(_weight(d))), q.T.astype(np.float32))


def autogptq_pack_qzeros(zeros: np.ndarray, bits: int) -> np.ndarray:
  """AutoGPTQ's (v1) qzeros packing for 4 bits: ``zeros - 1`` OR-ed into the words as
  uint32 -- a true zero 0 stores -1, whose bits also fill the word's higher nibbles."""
  assert bits == 4
  z = (zeros.astype(np.int64) - 1).astype(np.uint32)  # -1 -> 0xFFFFFFFF
  words = np.zeros((z.shape[0], z.shape[1] // 8), np.uint32)
  for j in range(8):
    words |= z[:, j::8] << np.uint32(4 * j)
  return words.view(np.int32)


def autogptq_dequantize(qweight, qzeros, scales, bits, g):
  """vLLM's / exllama's reading of a v1 file: codes and zeros unpacked with a shift and
  mask, then ``zeros + 1`` (no modulo), ``scales * (codes - zeros)``."""
  shifts = np.arange(0, 32, bits, dtype=np.uint32)
  zeros = ((qzeros.view(np.uint32)[:, :, None] >> shifts) & (2**bits - 1)).reshape(
      qzeros.shape[0], -1).astype(np.int64) + 1
  codes = ((qweight.view(np.uint32)[:, None, :] >> shifts[:, None]) & (2**bits - 1)).reshape(
      -1, qweight.shape[1]).astype(np.int64)
  groups = np.arange(codes.shape[0]) // g
  return scales.astype(np.float32)[groups] * (codes - zeros[groups])


def test_gptq_v1_stored_all_ones_zero_reads_as_two_to_the_bits(tmp_path):
  """A 4-bit asymmetric group whose true zero is 0 (all its weights >= 0): AutoGPTQ stores -1
  (15, and 15 in the word's higher nibbles too); vLLM dequantizes with zero 16, and so does
  the loaded weight, with a warning -- the other zero points as stored + 1."""
  rng = np.random.default_rng(0)
  k, n, g, bits = 64, 16, 32, 4
  codes = rng.integers(0, 16, (k, n)).astype(np.uint32)
  qweight = np.zeros((k // 8, n), np.uint32)
  for j in range(8):
    qweight |= codes[j::8] << np.uint32(4 * j)
  true_zeros = rng.integers(1, 15, (k // g, n))
  true_zeros[1, 3] = 0  # column 3 of word 0: columns 4-7 then read zero 16 as well
  qzeros = autogptq_pack_qzeros(true_zeros, bits)
  scales = rng.uniform(0.01, 0.1, (k // g, n)).astype(np.float16)
  d = _write(tmp_path, {"quant_method": "gptq", "bits": bits, "group_size": g, "sym": False,
                        "desc_act": False, "checkpoint_format": "gptq"},
             {f"{MOD}.qweight": qweight.view(np.int32), f"{MOD}.qzeros": qzeros,
              f"{MOD}.scales": scales})
  with pytest.warns(UserWarning, match=rf"{MOD}\.qzeros: group 1, column 3 \(and 4 more\) "
                                       r"stores 15.*read as vLLM does: a zero point of 16"):
    w = _weight(d)
  want = autogptq_dequantize(qweight.view(np.int32), qzeros, scales, bits, g)
  assert int(np.asarray(w.zeros)[1, 3]) == 16 and np.asarray(w.zeros)[1, 3:8].tolist() == [16] * 5
  np.testing.assert_array_equal(np.asarray(hj.dequantize(w)), want.astype(np.float32))


def test_gptq_v1_zero_of_256_is_refused_by_name(tmp_path):
  """8 bits: a stored 255 is a zero point of 256, which uint8 zero points cannot hold."""
  k, n = 32, 8
  rng = np.random.default_rng(1)
  qweight = rng.integers(0, 2**31, (k // 4, n)).astype(np.int32)
  z = np.full((1, n), 127, np.uint32)
  z[0, 2] = 255
  qzeros = np.zeros((1, n // 4), np.uint32)
  for j in range(4):
    qzeros |= z[:, j::4] << np.uint32(8 * j)
  d = _write(tmp_path, {"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": False,
                        "desc_act": False, "checkpoint_format": "gptq"},
             {f"{MOD}.qweight": qweight, f"{MOD}.qzeros": qzeros.view(np.int32),
              f"{MOD}.scales": np.ones((1, n), np.float16)})
  with pytest.raises(ValueError, match=rf"{MOD}\.qzeros: group 0, column 2 \(and 0 more\) "
                                       r"stores 255.*zero point of 256"):
    _weight(d)


def gpt_oss_experts_reference(x, ids, weights, gate_up, gate_up_bias, down, down_bias):
  """transformers' GptOssExperts (per expert, float32): interleaved gate / up columns,
  gate clamped above at 7, up to [-7, 7], ``(up + 1) * gate * sigmoid(1.702 gate)``."""
  out = np.zeros((x.shape[0], down.shape[-1]), np.float32)
  for t in range(x.shape[0]):
    for e, wt in zip(ids[t], weights[t]):
      h = x[t] @ gate_up[e] + gate_up_bias[e]
      gate, up = np.minimum(h[::2], 7.0), np.clip(h[1::2], -7.0, 7.0)
      glu = gate / (1 + np.exp(-1.702 * gate))
      out[t] += wt * (((up + 1) * glu) @ down[e] + down_bias[e])
  return out


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_gpt_oss_layer_runs_as_its_model_does(backend):
  """The gpt-oss fixture's experts (E 2, H 128, I 64, MXFP4, biases) through
  deinterleave_gate_up and quant_moe(activation="swigluoai") against transformers' expert
  loop on the same dequantized weights; the interleaved weight with silu is far from it."""
  tree = hj.load_checkpoint(os.path.join(FIX, "gptoss-mxfp4"), progress=False)
  experts = tree["model"]["layers"]["0"]["mlp"]["experts"]
  gu, dn = experts["gate_up_proj"], experts["down_proj"]
  # scaled so that some gate / up values pass the clamp at 7
  x = jax.random.normal(jax.random.key(0), (5, 128), jnp.float32) * 4
  ids = jnp.array([[0, 1], [1, 0], [0, 0], [1, 1], [1, 0]], jnp.int32)
  weights = jax.nn.softmax(jax.random.normal(jax.random.key(1), (5, 2)), axis=-1)
  want = gpt_oss_experts_reference(
      np.asarray(x), np.asarray(ids), np.asarray(weights), np.asarray(hj.dequantize(gu)),
      np.asarray(gu.bias), np.asarray(hj.dequantize(dn)), np.asarray(dn.bias))
  h = np.asarray(x) @ np.asarray(hj.dequantize(gu))[0] + np.asarray(gu.bias)[0]
  assert (np.abs(h) > 7).any()  # the clamp is exercised
  xb = x.astype(jnp.bfloat16)
  got = hj.quant_moe(hj.deinterleave_gate_up(gu), dn, xb, weights, ids,
                     activation="swigluoai", backend=backend)
  rel = lambda a: float(np.linalg.norm(np.asarray(a, np.float32) - want) / np.linalg.norm(want))
  assert rel(got) <= 2e-2
  assert rel(hj.quant_moe(gu, dn, xb, weights, ids, backend="xla")) > 0.2


def test_deinterleave_gate_up_moves_columns_as_stored():
  """Even columns then odd ones, on codes, scales, zero points and bias alike; odd column
  counts and prepared params are refused."""
  w = hj.quantize(jax.random.normal(jax.random.key(2), (3, 128, 48)), "w4a16-g128-zp")
  w = w.replace(bias=jax.random.normal(jax.random.key(3), (3, 48)))
  d = hj.deinterleave_gate_up(w)
  order = np.r_[0:48:2, 1:48:2]
  np.testing.assert_array_equal(np.asarray(hj.dequantize(d)),
                                np.asarray(hj.dequantize(w))[..., order])
  np.testing.assert_array_equal(np.asarray(d.bias), np.asarray(w.bias)[..., order])
  odd = hj.quantize(jax.random.normal(jax.random.key(4), (128, 39)), "w8a16")
  with pytest.raises(ValueError, match="gate_up: 39 columns"):
    hj.deinterleave_gate_up(odd)
  with pytest.raises(ValueError, match="expected canonical params"):
    hj.deinterleave_gate_up(hj.prepare(w, grouped=True))
