"""load_checkpoint against the producers' own dequantization (fixtures made by the real
producer libraries: scripts/make_checkpoint_fixtures.py; torch is not needed here)."""
import json
import os
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.checkpoints import detect_format, load_checkpoint
from humming_jax.checkpoints._io import SafetensorsFile

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "checkpoints")
ALL = sorted(d for d in os.listdir(FIX) if os.path.isdir(os.path.join(FIX, d)))

# fixture -> (detected format, expected spec name of q_proj)
EXPECTED = {
    "awq-w4-g32": ("awq", "w4a16-uint4-g32-float16-zp"),
    "ct-fp8-block": ("compressed-tensors", "w8a8-fp8_e4m3-b64x64-bfloat16-fp8_e4m3-group64"),
    "ct-fp8-ch-dynamic": ("compressed-tensors", "w8a8-fp8_e4m3-ch-bfloat16-fp8_e4m3-token"),
    "ct-fp8-tensor-static": ("compressed-tensors",
                             "w8a8-fp8_e4m3-t-bfloat16-fp8_e4m3-tensor-static"),
    "ct-nvfp4": ("compressed-tensors", "w4a16-fp4_e2m1-g16-fp8_e4m3-s2"),
    "ct-mxfp4": ("compressed-tensors", "w4a16-fp4_e2m1-g32-e8m0"),
    "ct-mxfp6": ("compressed-tensors", "w6a16-fp6_e2m3-g32-e8m0"),
    "ct-mxfp8": ("compressed-tensors", "w8a16-fp8_e4m3-g32-e8m0"),
    "ct-mxfp4-a4": ("compressed-tensors", "w4a4-fp4_e2m1-g32-e8m0-fp4_e2m1-group32-mxup"),
    "ct-w8a8-int8": ("compressed-tensors", "w8a8-int8-ch-bfloat16-int8-token"),
    "ct-w4a16-g32-asym": ("compressed-tensors", "w4a16-uint4-g32-bfloat16-zp"),
    "ct-w4a16-g32-sym": ("compressed-tensors", "w4a16-int4-g32-bfloat16"),
    "ct-w8a16-ch-sym": ("compressed-tensors", "w8a16-int8-ch-bfloat16"),
    "gptoss-mxfp4": ("mxfp4", None),
    "gptq-w2-g64-asym": ("gptq", "w2a16-uint2-g64-float16-zp"),
    "gptq-w3-g32-asym": ("gptq", "w3a16-uint3-g32-float16-zp"),
    "gptq-w4-g32-sym": ("gptq", "w4a16-int4-g32-float16"),
    "gptq-w8-ch-sym": ("gptq", "w8a16-int8-ch-float16"),
    "modelopt-nvfp4": ("modelopt", "w4a4-fp4_e2m1-g16-fp8_e4m3-s2-fp4_e2m1-group16"),
}
FLOATS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def _get(tree, dotted):
  for p in dotted.split("."):
    tree = tree[p]
  return tree


def _load(name):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # NVFP4 W4A4: the calibrated input scale note
    return load_checkpoint(os.path.join(FIX, name), progress=False)


@pytest.fixture(scope="module")
def loaded():
  return {name: _load(name) for name in ALL}


def test_all_fixtures_are_covered():
  assert set(ALL) == set(EXPECTED)


@pytest.mark.parametrize("name", ALL)
def test_dequantized_weights_equal_the_producers(name, loaded):
  """Our float32 dequantization, cast to the producer's output dtype, is bit-identical to
  the producer's own dequantized weights (stored in reference.safetensors)."""
  tree, ref = loaded[name], SafetensorsFile(os.path.join(FIX, name, "reference.safetensors"))
  fmt, spec_name = EXPECTED[name]
  assert detect_format(os.path.join(FIX, name)) == fmt
  checked = 0
  for key in ref.keys():
    mod, leaf = key.rsplit(".", 1)
    want = ref.get(key)
    if leaf == "weight":
      q = _get(tree, mod)["weight"]
      got = np.asarray(hj.dequantize(q)).T  # ours (K, N); torch (N, K)
      if mod.endswith("q_proj"):
        assert q.spec.name == spec_name
    elif leaf in ("gate_up_proj", "down_proj"):  # gpt-oss experts, already (E, K, N)
      q = _get(tree, key)
      assert q.shape == want.shape and q.num_experts == 2
      got = np.asarray(hj.dequantize(q))
    else:
      continue
    assert isinstance(q, hj.QuantizedWeight) and q.layout == "canonical"
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got.astype(want.dtype), want, err_msg=key)
    # ... and the float32 values agree to the producer dtype's rounding.
    tol = {np.dtype(np.float32): 0.0, np.dtype(np.float16): 2**-11,
           np.dtype(ml_dtypes.bfloat16): 2**-8}[want.dtype]
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=tol, atol=0)
    checked += 1
  assert checked == 2


@pytest.mark.parametrize("name", [n for n in ALL if not n.startswith(("awq", "modelopt",
                                                                       "gptoss"))])
def test_forward_matches_the_producers(name, loaded):
  """quant_dense on the loaded layer vs the producer's forward of the same checkpoint (with
  its activation fake-quantization where the scheme has one)."""
  tree, ref = loaded[name], SafetensorsFile(os.path.join(FIX, name, "reference.safetensors"))
  for mod in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
    q = _get(tree, mod)["weight"]
    x, want = ref.get(f"{mod}.x"), ref.get(f"{mod}.y").astype(np.float32)
    got = np.asarray(hj.quant_dense(q, jnp.asarray(x), backend="xla").astype(jnp.float32))
    assert got.shape == want.shape
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    # WnA16: only the producer's fp16/bf16 GEMM rounding differs.  fp8 activations: the
    # producer divides and scales in bf16 arithmetic (double rounding onto the e4m3 grid),
    # we in fp32, so a few activations land one e4m3 step apart.
    # MX activations (e8m0 group scales): the loaded spec takes the producer's rule (amax
    # rounded up to a power of two from 1.75 x one: act_mx_rounding="up"), so the same
    # activations reach the GEMM -- also checked against both rules emulated in numpy.
    mx_act = q.spec.act_scale_dtype == "e8m0"
    assert mx_act == (name == "ct-mxfp4-a4")  # MX activations, and only there
    tol = 1e-6 if mx_act else 3e-2 if q.spec.act else 5e-3  # MX: the producer's numbers
    assert rel < tol, (mod, rel)
    if mx_act:
      assert q.spec.act_mx_rounding == "up"
      x2, w = x.reshape(-1, x.shape[-1]), np.asarray(hj.dequantize(q))
      b = 0.0 if q.bias is None else np.asarray(q.bias)
      mine = _mx_activations(x2, q, producer=True) @ w + b
      assert np.linalg.norm(mine - want.reshape(mine.shape)) / np.linalg.norm(want) < 5e-3
      got2 = got.reshape(mine.shape)
      assert np.linalg.norm(got2 - mine) / np.linalg.norm(mine) < 5e-3, mod
      # ... and OCP's floor rule would have missed it by more than the tolerance above
      ocp = _mx_activations(x2, q, producer=False) @ w + b
      assert np.linalg.norm(got2 - ocp) / np.linalg.norm(ocp) > 1e-2, mod
    if q.spec.act and q.spec.act.startswith("fp8"):
      # With the producer's bf16 activation arithmetic emulated, our dequantized weights and
      # bias reproduce its output to its bf16 output rounding.
      xp = _producer_fp8_activations(x.reshape(-1, x.shape[-1]), q)
      mine = xp @ np.asarray(hj.dequantize(q)) + np.asarray(q.bias if q.bias is not None
                                                            else 0.0)
      want2 = want.reshape(mine.shape)
      assert np.linalg.norm(mine - want2) / np.linalg.norm(want2) < 5e-3, mod


def _mx_activations(x, q, producer: bool):
  """MX fake-quantized activations (e2m1 in groups of 32, e8m0 scales).  ``producer``:
  compressed-tensors' rule (its ``round_to_power_2`` on the bf16 group amax: +0.25 in the
  mantissa, masked to the exponent; then ``- emax``); else OCP MX v1.0's floor rule."""
  x32 = x.astype(np.float32)
  m, k = x32.shape
  g = q.spec.act_group_size
  amax = np.abs(x32).reshape(m, k // g, g).max(-1)
  if producer:
    bits = amax.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int32)
    amax = ((bits + 32) & 0xFF80).astype(np.uint16).view(ml_dtypes.bfloat16)
  s = np.repeat(2.0 ** (np.floor(np.log2(amax.astype(np.float32))) - 2), g, axis=1)
  return np.clip(x32 / s, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32) * s


def _producer_fp8_activations(x, q):
  """compressed-tensors' fp8 activation fake-quant: bf16 scale, bf16 quotient, e4m3."""
  bf16, x32 = ml_dtypes.bfloat16, x.astype(np.float32)
  m, k = x32.shape
  spec = q.spec
  if spec.act_static:
    s = np.full((m, k), np.float32(q.act_scale))
  else:
    g = {"token": k, "tensor": k, "group": spec.act_group_size}[spec.act_granularity]
    amax = np.abs(x32).reshape(m, k // g, g).max(-1)
    s = np.repeat((amax / 448.0).astype(bf16).astype(np.float32), g, axis=1)
  quot = (x32 / s).astype(bf16).astype(np.float32)
  return np.clip(quot, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s


@pytest.mark.parametrize("name", ALL)
def test_float_tensors_come_back_as_stored(name, loaded):
  tree = loaded[name]
  raw = {}
  for fn in os.listdir(os.path.join(FIX, name)):
    if fn.startswith("model") and fn.endswith(".safetensors"):
      f = SafetensorsFile(os.path.join(FIX, name, fn))
      raw.update({k: f.get(k) for k in f.keys() if k in FLOATS})
  assert set(raw) == set(FLOATS)
  for key, want in raw.items():
    got = _get(tree, key)
    assert got.dtype == want.dtype and got.shape == want.shape  # torch layout, as stored
    np.testing.assert_array_equal(np.asarray(got), want)
  # report lists the ignored lm_head as a float tensor, the linears as quantized.
  rep = {t.path: t for t in hj.report(tree).tensors}
  assert rep["lm_head/weight"].kind == "float"
  quantized = [t for t in rep.values() if t.kind == "quantized"]
  assert len(quantized) == 2
  assert all(t.bits_per_weight < 9 for t in quantized)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in ALL if not n.startswith("gptoss")])
def test_loaded_layers_run_on_the_gpu_kernels(name, loaded):
  """Every loaded linear through quant_dense's GPU kernels (jitted, as a model runs them) at
  1 and 33 tokens equals the XLA reference on the same params."""
  tree = loaded[name]
  for mod in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
    q = _get(tree, mod)["weight"]
    for m in (1, 33):
      x = jax.random.normal(jax.random.key(m), (m, q.shape[0]), jnp.bfloat16)
      y = jax.jit(lambda q, x: hj.quant_dense(q, x, backend="pallas"))(q, x)
      ref = hj.quant_dense(q, x, backend="xla")
      y, ref = np.asarray(y, np.float32), np.asarray(ref, np.float32)
      assert np.all(np.isfinite(y)), (mod, m)
      assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-2, (mod, m, q.spec.name)


def test_bias_is_inside_the_quantized_weight(loaded):
  tree = loaded["gptq-w4-g32-sym"]
  q = _get(tree, "model.layers.0.self_attn.q_proj")["weight"]
  assert q.bias is not None and q.bias.shape == (64,) and q.bias.dtype == jnp.float32
  assert "bias" not in _get(tree, "model.layers.0.self_attn.q_proj")
  assert _get(tree, "model.layers.0.mlp.down_proj")["weight"].bias is None
  experts = _get(loaded["gptoss-mxfp4"], "model.layers.0.mlp.experts")
  assert experts["gate_up_proj"].bias.shape == (2, 128)
  assert experts["gate_up_proj"].shape == (2, 128, 128)  # (E, K, N)


def test_gptq_sym_codes_are_signed_and_v1_zero_convention(loaded):
  """Symmetric v1 GPTQ stores zero 7 (= 8 - 1); we map to int4 codes (u - 8) with no zeros,
  and the asymmetric 3-bit fixture keeps uint3 codes + (stored + 1) zero points."""
  q = _get(loaded["gptq-w4-g32-sym"], "model.layers.0.self_attn.q_proj")["weight"]
  assert q.spec.weight == "int4" and q.zeros is None
  q3 = _get(loaded["gptq-w3-g32-asym"], "model.layers.0.self_attn.q_proj")["weight"]
  assert q3.spec.weight == "uint3" and q3.zeros.dtype == jnp.uint8
  assert int(q3.zeros.max()) <= 7 and q3.zeros.shape == (4, 64)


def test_nvfp4_global_scale_conventions(loaded):
  """compressed-tensors stores the divisor (448*6/amax), ModelOpt the multiplier."""
  ct = SafetensorsFile(os.path.join(FIX, "ct-nvfp4", "model.safetensors"))
  g = ct.get("model.layers.0.self_attn.q_proj.weight_global_scale")
  q = _get(loaded["ct-nvfp4"], "model.layers.0.self_attn.q_proj")["weight"]
  np.testing.assert_allclose(float(q.global_scale) * float(g[0]), 1.0, rtol=1e-7)
  mo = SafetensorsFile(os.path.join(FIX, "modelopt-nvfp4", "model.safetensors"))
  q = _get(loaded["modelopt-nvfp4"], "model.layers.0.self_attn.q_proj")["weight"]
  assert float(q.global_scale) == float(mo.get("model.layers.0.self_attn.q_proj.weight_scale_2"))


def test_sharded_checkpoint_streams_across_shards():
  """The GPTQ fixture is split in two shards with a layer straddling them."""
  d = os.path.join(FIX, "gptq-w4-g32-sym")
  idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
  mod = "model.layers.0.self_attn.q_proj"
  assert len({idx[f"{mod}.{s}"] for s in ("qweight", "scales", "qzeros", "g_idx")}) == 2
  tree = _load("gptq-w4-g32-sym")
  assert isinstance(_get(tree, mod)["weight"], hj.QuantizedWeight)


def test_loaded_layer_runs_under_jit(loaded):
  import jax
  q = _get(loaded["ct-w4a16-g32-asym"], "model.layers.0.mlp.down_proj")["weight"]
  x = jax.random.normal(jax.random.key(3), (3, q.in_features), jnp.bfloat16)
  want = x.astype(jnp.float32) @ hj.dequantize(q)
  got = jax.jit(lambda q, x: hj.quant_dense(q, x, backend="xla"))(q, x)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2,
                             atol=2e-2)


@pytest.mark.parametrize("bits", range(1, 9))
def test_dense_bitstream_unpack_inverts_canonical_packing(bits):
  """GPTQ packs K as the same little-endian bitstream as our canonical layout (and so does
  compressed-tensors at 1 / 2 / 4 / 8 bits): unpack_stream(pack_codes(c)) == c, for every
  width (3/5/6/7 straddle words)."""
  from humming_jax import packing
  from humming_jax.checkpoints._common import unpack_stream
  rng = np.random.default_rng(bits)
  k, n = 96, 5
  codes = rng.integers(0, 2**bits, (k, n), dtype=np.uint8)
  words = np.asarray(packing.pack_codes(jnp.asarray(codes), bits))
  np.testing.assert_array_equal(unpack_stream(words, bits, k, axis=0), codes)
  np.testing.assert_array_equal(unpack_stream(np.ascontiguousarray(words.T), bits, k, axis=1),
                                codes.T)


@pytest.mark.parametrize("name", [n for n in ALL if not n.startswith("awq")])
def test_word_reuse_fast_path_equals_unpack_repack(name, loaded, monkeypatch):
  """K % 32 == 0 takes the producer's words / bytes over as canonical codes (XOR for
  signed); the general path (unpack, convert, pack_codes) must give the same params."""
  from humming_jax.checkpoints import compressed_tensors as ct_mod
  from humming_jax.checkpoints import gptq as gptq_mod
  from humming_jax.checkpoints import nvidia as nv_mod
  for mod in (gptq_mod, ct_mod, nv_mod):
    for fn in ("stream_as_canonical", "bytes_as_canonical"):
      if hasattr(mod, fn):
        monkeypatch.setattr(mod, fn, lambda *a, **k: None)
  slow = _load(name)
  fast = jax.tree_util.tree_leaves(loaded[name], is_leaf=lambda x: isinstance(
      x, hj.QuantizedWeight))
  slow = jax.tree_util.tree_leaves(slow, is_leaf=lambda x: isinstance(x, hj.QuantizedWeight))
  pairs = [(a, b) for a, b in zip(fast, slow) if isinstance(a, hj.QuantizedWeight)]
  assert len(pairs) == 2
  for a, b in pairs:
    assert a.spec == b.spec and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes))
