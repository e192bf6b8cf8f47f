"""WnA16 Pallas kernel vs kernels/reference.py: interpret mode on CPU, and on the GPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import humming_jax as hj
from humming_jax.kernels import layout as lay
from humming_jax.kernels import reference, registry, tuning, wna16

A16_PRESETS = ["w4a16-g128", "w4a16-g128-zp", "w4a16-ch", "w8a16", "w8a16-fp8", "w4a16-mxfp4",
               "w4a16-mxint4", "w4a16-nvfp4"]
CONSTRUCTOR_SPECS = [
    hj.QuantSpec("int1", "group", 32), hj.QuantSpec("uint1", "group", 64, zero_point=True),
    hj.QuantSpec("int2", "tensor", 0), hj.QuantSpec("uint2", "group", 32, zero_point=True),
    hj.QuantSpec("int3", "group", 64), hj.QuantSpec("uint3", "group", 128, zero_point=True),
    hj.QuantSpec("int5", "channel", 0), hj.QuantSpec("uint5", "group", 32, zero_point=True),
    hj.QuantSpec("int6", "group", 128), hj.QuantSpec("uint6", "channel", 0, zero_point=True),
    hj.QuantSpec("int7", "group", 128), hj.QuantSpec("uint7", "group", 64, zero_point=True),
    hj.QuantSpec("uint8", "group", 64, zero_point=True),
    hj.QuantSpec("fp6_e2m3", "group", 32, scale_dtype="e8m0"),
    hj.QuantSpec("fp6_e3m2", "channel", 0),
    hj.QuantSpec("fp8_e5m2", "block", 128, block_n=64, scale_dtype="float32"),
    hj.QuantSpec("fp8_e4m3", "group", 32, scale_dtype="e8m0"),
    hj.QuantSpec("fp4_e2m1", "group", 64, scale_dtype="float16"),
    hj.QuantSpec("int4", "group", 64, scale_dtype="float32"),
]


def rel_err(y, ref):
  y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
  assert not bool(jnp.isnan(y).any()), "NaN in kernel output"
  return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def _case(spec, m, k, n, seed, dtype=jnp.bfloat16, bias=True):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  w = jax.random.normal(k1, (k, n), jnp.float32)
  x = jax.random.normal(k2, (m, k), jnp.float32).astype(dtype)
  b = jax.random.normal(k3, (n,), jnp.float32) if bias else None
  return hj.quantize(w, spec, bias=b), x


@pytest.mark.parametrize("name", A16_PRESETS)
def test_presets_interpret(name):
  p, x = _case(hj.QuantSpec.preset(name), 7, 256, 192, seed=hash(name) % 1000)
  y = hj.quant_dense(p, x, backend="interpret")
  assert y.dtype == x.dtype and y.shape == (7, 192)
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


@pytest.mark.parametrize("spec", CONSTRUCTOR_SPECS, ids=lambda s: s.name)
def test_constructor_specs_interpret(spec):
  p, x = _case(spec, 5, 256, 128, seed=3)
  y = hj.quant_dense(p, x, backend="interpret")
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


@settings(max_examples=4, deadline=None)
@given(m=st.sampled_from([1, 7, 16, 33]), k_mult=st.integers(1, 3),
       n_mult=st.integers(1, 5), name=st.sampled_from(["w4a16-g128", "w4a16-mxfp4",
                                                       "w8a16", "w4a16-nvfp4"]),
       dtype=st.sampled_from([jnp.bfloat16, jnp.float16]), seed=st.integers(0, 10_000))
def test_shapes_sweep_interpret(m, k_mult, n_mult, name, dtype, seed):
  """Odd multiples of the group / alignment: K = 128*k_mult, N = 32*n_mult (padded to 64)."""
  p, x = _case(hj.QuantSpec.preset(name), m, 128 * k_mult, 32 * n_mult, seed, dtype)
  y = hj.quant_dense(p, x, backend="interpret")
  assert y.dtype == dtype
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


def test_split_k_and_configs_interpret():
  p, x = _case(hj.QuantSpec.preset("w4a16-g128-zp"), 3, 2048, 64, seed=11)
  pp = wna16.prepare(p)
  ref = reference.dense_reference(p, x)
  for cfg in (tuning.TuningConfig(16, 32, 2), tuning.TuningConfig(32, 64, 4)):
    y = wna16.run(pp, x, interpret=True, config=cfg)
    assert rel_err(y, ref) <= 1e-2, cfg


@pytest.mark.parametrize("name", A16_PRESETS + ["w4a16-g128-zp"])
def test_prepare_roundtrip(name):
  p, _ = _case(hj.QuantSpec.preset(name), 1, 384, 96, seed=5)
  pp = wna16.prepare(p)
  assert pp.layout.startswith("wna16:")
  back = registry.to_canonical(pp)
  for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(back)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Prepared storage is exactly bits/weight over the tile-padded (K, N).
  _, lt = lay.parse_layout_name(pp.layout)
  assert pp.codes.size * 32 == lt.padded_k(384) * lt.padded_n(96) * p.spec.weight_bits


@pytest.mark.parametrize("bits", range(1, 9))
def test_slab_layout_roundtrip(bits):
  lt = lay.SlabLayout(bits, lay.choose_slab(bits, 128))
  codes = jax.random.randint(jax.random.key(bits), (lt.block_k * 2, 64), 0, 1 << bits,
                             jnp.int32).astype(jnp.uint8)
  words = lt.pack(codes)
  assert words.shape == (2 * lt.rows_per_tile, 64)
  np.testing.assert_array_equal(np.asarray(lt.unpack(words)), np.asarray(codes))


def test_prepared_params_jit_and_no_retrace():
  p, x = _case(hj.QuantSpec.preset("w4a16-g128"), 4, 256, 64, seed=1)
  pp = hj.prepare(p)
  traces = []

  @jax.jit
  def f(params, x):
    traces.append(1)
    return hj.quant_dense(params, x, backend="interpret")

  y1 = f(pp, x)
  p2, _ = _case(hj.QuantSpec.preset("w4a16-g128"), 4, 256, 64, seed=2)
  y2 = f(hj.prepare(p2), x)
  assert len(traces) == 1
  assert rel_err(y1, reference.dense_reference(p, x)) <= 1e-2
  assert rel_err(y2, reference.dense_reference(p2, x)) <= 1e-2


def test_pallas_backend_refuses_activation_quantized_spec_without_kernel():
  spec = hj.QuantSpec.preset("w4a16-g128")
  assert registry.find(spec) is not None
  bad = hj.QuantSpec("int4", "group", 128, act="int8")
  if registry.find(bad) is None:
    p, x = _case(bad, 2, 128, 64, seed=0)
    with pytest.raises(ValueError, match="no Pallas dense kernel"):
      hj.quant_dense(p, x, backend="interpret")


# ---------------------------------------------------------------------------------------
# GPU (the lent H200): benchmark shapes, every A16 preset, a poisoned-output check.
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", A16_PRESETS)
@pytest.mark.parametrize("m", [1, 16, 128, 1024])
def test_gpu_presets_benchmark_shape(name, m):
  p, x = _case(hj.QuantSpec.preset(name), m, 8192, 8192, seed=m)
  y = jax.jit(lambda p, x: hj.quant_dense(p, x, backend="pallas"))(hj.prepare(p), x)
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("spec", CONSTRUCTOR_SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("m", [1, 33])
def test_gpu_constructor_specs(spec, m):
  p, x = _case(spec, m, 1024, 512, seed=7)
  y = hj.quant_dense(p, x, backend="pallas")
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 6144), (4096, 28672), (14336, 4096)])
def test_gpu_llama_shapes(shape):
  k, n = shape
  p, x = _case(hj.QuantSpec.preset("w4a16-g128"), 16, k, n, seed=9)
  y = hj.quant_dense(p, x, backend="pallas")
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


@pytest.mark.parametrize("name", A16_PRESETS)
def test_dequantize_prepared_is_bit_exact(name):
  p, _ = _case(hj.QuantSpec.preset(name), 1, 640, 96, seed=4)
  np.testing.assert_array_equal(np.asarray(wna16.dequantize_prepared(wna16.prepare(p))),
                                np.asarray(hj.dequantize(p)))


@pytest.mark.parametrize("strategy,block_m", [("fma", 1), ("fma", 4), ("dequant_gemm", 128)])
def test_strategies_interpret(strategy, block_m):
  p, x = _case(hj.QuantSpec.preset("w4a16-g128-zp"), 3, 512, 64, seed=12)
  cfg = tuning.TuningConfig(block_m, 64, 2, strategy=strategy)
  y = wna16.run(wna16.prepare(p), x, interpret=True, config=cfg)
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


def test_tuning_cache_is_consulted(tmp_path, monkeypatch):
  """A config written by the autotune cache is the one the kernel uses."""
  monkeypatch.setenv("HUMMING_JAX_TUNING_CACHE", str(tmp_path / "cache.json"))
  p, x = _case(hj.QuantSpec("int2", "group", 32), 2, 1024, 64, seed=6)
  # a Triton spec by default (int8 moved to Mosaic; int6 too since session 54, int2 stays)
  assert registry.find(p.spec).name == wna16.FAMILY
  key = tuning.cache_key(wna16.FAMILY, p.spec.name, tuning.bucket_m(2), 64, 1024,
                         tuning.device_kind())
  cfg = tuning.TuningConfig(16, 32, 2, num_warps=2, num_stages=1)
  tuning.store_configs({key: cfg})
  assert tuning.cached_config(key) == cfg
  seen = []
  orig = wna16.pl.pallas_call

  def spy(*a, **kw):
    seen.append(kw["grid"])
    return orig(*a, **kw)

  monkeypatch.setattr(wna16.pl, "pallas_call", spy)
  y = hj.quant_dense(p, x, backend="interpret")
  assert seen and seen[0] == (1, 2, 2)  # 64/32 N tiles, split 2 from the cache
  assert rel_err(y, reference.dense_reference(p, x)) <= 1e-2


def test_tuning_config_validation():
  with pytest.raises(ValueError, match="block_m"):
    tuning.TuningConfig(block_m=8)
  with pytest.raises(ValueError, match="strategy"):
    tuning.TuningConfig(strategy="magic")
  assert tuning.TuningConfig(1, 64, strategy="fma").block_m == 1
