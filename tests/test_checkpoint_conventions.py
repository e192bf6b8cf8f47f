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


def ct_pack_to_int32(values: np.ndarray, bits: int, packed_dim: int) -> np.ndarray:
  """compressed-tensors' ``pack_to_int32``: unsigned codes, ``32 // bits`` per word along
  ``packed_dim``, code i of a word at bits [i * bits, (i + 1) * bits), padded with zeros."""
  per_word = 32 // bits
  v = np.moveaxis(values.astype(np.uint32), packed_dim, -1)
  pad = -v.shape[-1] % per_word
  v = np.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, pad)])
  words = np.zeros((*v.shape[:-1], v.shape[-1] // per_word), np.uint32)
  for i in range(per_word):
    words |= v[..., i::per_word] << np.uint32(bits * i)
  return np.ascontiguousarray(np.moveaxis(words, -1, packed_dim)).view(np.int32)


@pytest.mark.parametrize("bits", [3, 5, 6, 7])
@pytest.mark.parametrize("symmetric", [True, False])
def test_ct_pack_quantized_at_widths_that_do_not_divide_32(tmp_path, bits, symmetric):
  """(N, K) = (40, 96), groups of 32: the loaded weight dequantizes to (q - zp) * scale
  exactly, q and zp the signed values the producer packed (+ 2**(bits-1))."""
  rng = np.random.default_rng(bits)
  n, k, g = 40, 96, 32
  half = 1 << (bits - 1)
  q = rng.integers(-half, half, (n, k))
  scale = rng.uniform(0.01, 0.1, (n, k // g)).astype(np.float16)
  tensors = {f"{MOD}.weight_packed": ct_pack_to_int32(q + half, bits, 1),
             f"{MOD}.weight_shape": np.array([n, k], np.int64),
             f"{MOD}.weight_scale": scale}
  zp = np.zeros((n, k // g), np.int64)
  if not symmetric:
    zp = rng.integers(-half, half, (n, k // g))
    tensors[f"{MOD}.weight_zero_point"] = ct_pack_to_int32(zp + half, bits, 0)
  assert tensors[f"{MOD}.weight_packed"].shape == (n, -(-k // (32 // bits)))
  cfg = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
      "group_0": {"targets": ["Linear"], "format": "pack-quantized", "weights": {
          "num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": "group",
          "group_size": g}}}}
  w = _weight(_write(tmp_path, cfg, tensors))
  assert w.spec.weight == (f"int{bits}" if symmetric else f"uint{bits}")
  want = (q - np.repeat(zp, g, axis=1)) * np.repeat(scale.astype(np.float32), g, axis=1)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(w)), want.T.astype(np.float32))


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
  """AutoGPTQ's reader (qlinear_cuda_old's torch path): codes and zeros unpacked with a
  shift and mask, then ``zeros + 1`` (no modulo), ``scales * (codes - zeros)``."""
  shifts = np.arange(0, 32, bits, dtype=np.uint32)
  zeros = ((qzeros.view(np.uint32)[:, :, None] >> shifts) & (2**bits - 1)).reshape(
      qzeros.shape[0], -1).astype(np.int64) + 1
  codes = ((qweight.view(np.uint32)[:, None, :] >> shifts[:, None]) & (2**bits - 1)).reshape(
      -1, qweight.shape[1]).astype(np.int64)
  groups = np.arange(codes.shape[0]) // g
  return scales.astype(np.float32)[groups] * (codes - zeros[groups])


def test_gptq_v1_stored_all_ones_zero_reads_as_two_to_the_bits(tmp_path):
  """A 4-bit asymmetric group whose true zero is 0 (all its weights >= 0): AutoGPTQ stores -1
  (15, and 15 in the word's higher nibbles too); its reader dequantizes with zero 16, and so
  does the loaded weight -- the other zero points as stored + 1."""
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
  with pytest.raises(ValueError, match=rf"{MOD}\.qzeros: group 0, column 2 stores 255.*256"):
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
  """Even columns then odd ones, on codes, scales, zero points and bias alike; the inputs
  are left as they were; odd column counts and prepared params are refused."""
  w = hj.quantize(jax.random.normal(jax.random.key(2), (3, 128, 48)), "w4a16-g128-zp")
  w = w.replace(bias=jax.random.normal(jax.random.key(3), (3, 48)))
  before = [np.asarray(a) for a in (w.codes, w.scales, w.zeros, w.bias)]
  d = hj.deinterleave_gate_up(w)
  order = np.r_[0:48:2, 1:48:2]
  np.testing.assert_array_equal(np.asarray(hj.dequantize(d)),
                                np.asarray(hj.dequantize(w))[..., order])
  np.testing.assert_array_equal(np.asarray(d.bias), np.asarray(w.bias)[..., order])
  for a, b in zip(before, (w.codes, w.scales, w.zeros, w.bias)):
    np.testing.assert_array_equal(a, np.asarray(b))
  odd = hj.quantize(jax.random.normal(jax.random.key(4), (128, 39)), "w8a16")
  with pytest.raises(ValueError, match="gate_up: 39 columns"):
    hj.deinterleave_gate_up(odd)
  with pytest.raises(ValueError, match="expected canonical params"):
    hj.deinterleave_gate_up(hj.prepare(w, grouped=True))
