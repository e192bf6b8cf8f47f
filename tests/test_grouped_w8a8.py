"""Grouped (MoE) W8A8 / W4A8 / W4A4 kernel (kernels/grouped_w8a8.py) vs the XLA reference.

Interpret mode (CPU, CI): every dynamic activation-quantized preset with uneven expert
sizes, an empty expert, a zero tail past sum(group_sizes), and M = 1.  The reference quantizes
the activations the same way (per row / per group), so the bound is tight (1e-2 relative,
what the dense W8A8 tests use); a GPU test repeats it at a DeepSeek-V3 down shape.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.kernels import grouped_w8a8 as g8
from humming_jax.kernels import reference, registry, tuning

DYNAMIC = sorted(n for n, s in hj.PRESETS.items() if s.act is not None and not s.act_static)


def rel(y, r):
  y, r = np.asarray(y, np.float32), np.asarray(r, np.float32)
  assert np.isfinite(y).all()
  return float(np.linalg.norm(y - r) / max(np.linalg.norm(r), 1e-30))


def case(name, e, k, n, m, seed=0, bias=True):
  kw, kx, kb = jax.random.split(jax.random.key(seed), 3)
  w = jax.random.normal(kw, (e, k, n)) / np.sqrt(k)
  b = jax.random.normal(kb, (e, n)) if bias else None
  q = jax.jit(lambda w, b: hj.quantize(w, name, bias=b))(w, b)
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
  return q, x


@pytest.mark.parametrize("name", DYNAMIC)
def test_presets_interpret(name):
  # The default for 8-bit weights; 4-bit weights default to grouped_wnam_mgpu (session 16).
  spec = hj.QuantSpec.preset(name)
  want = g8.FAMILY if spec.weight_bits == 8 else "grouped_wnam_mgpu"
  assert registry.find(spec, grouped=True).name == want
  q, x = case(name, 4, 512, 128, 23, seed=1)
  gs = jnp.array([7, 0, 11, 3], jnp.int32)  # an empty expert; rows 21, 22 are the tail
  p = jax.jit(hj.prepare, static_argnames=("grouped", "kernel"))(q, grouped=True,
                                                                 kernel=g8.FAMILY)
  assert p.layout.startswith(g8.FAMILY + ":")
  y = jax.jit(lambda p, x, gs: hj.quant_ragged_dot(p, x, gs, backend="interpret"))(p, x, gs)
  ref = reference.ragged_dot_reference(q, x, gs)
  assert y.shape == (23, 128) and y.dtype == x.dtype
  assert not np.asarray(y[21:], np.float32).any()  # the tail is zeros
  assert rel(y, ref) <= 1e-2, rel(y, ref)


@pytest.mark.parametrize("name", ["w8a8-fp8", "w4a8-int8"])
def test_single_token_and_config(name):
  q, x = case(name, 3, 256, 64, 1, seed=2, bias=False)
  gs = jnp.array([0, 1, 0], jnp.int32)
  p = g8.prepare(q)
  for cfg in (None, tuning.TuningConfig(16, 32, 1, num_warps=4, num_stages=2)):
    y = g8.run(p, x, gs, interpret=True, config=cfg)
    assert rel(y, reference.ragged_dot_reference(q, x, gs)) <= 1e-2


def test_prepare_round_trip_and_refusals():
  q, _ = case("w4a8-mxfp4", 2, 256, 64, 1)
  c = registry.to_canonical(g8.prepare(q))
  np.testing.assert_array_equal(np.asarray(c.codes), np.asarray(q.codes))
  np.testing.assert_array_equal(np.asarray(c.scales, np.float32),
                                np.asarray(q.scales, np.float32))
  static = hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                        act_granularity="tensor", act_static=True)
  assert not g8.supports(static)
  with pytest.raises(ValueError, match="stacked experts"):
    g8.prepare(hj.quantize(jax.random.normal(jax.random.key(0), (256, 64)), "w8a8-fp8"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w8a8-fp8", "w8a8-int8", "w4a8-fp8", "w4a8-mxfp4"])
@pytest.mark.parametrize("tokens", [1, 256])
def test_deepseek_down_gpu(name, tokens):
  e, k, n, top = 256, 256, 7168, 8
  q, _ = case(name, e, k, n, 1, seed=3, bias=False)
  m = tokens * top
  x = jax.random.normal(jax.random.key(4), (m, k), jnp.bfloat16)
  ids = jax.random.randint(jax.random.key(5), (m,), 0, e)
  gs = jnp.bincount(ids, length=e).astype(jnp.int32)
  p = jax.jit(hj.prepare, static_argnames="grouped")(q, grouped=True)
  y = jax.jit(lambda p, x, gs: hj.quant_ragged_dot(p, x, gs, backend="pallas"))(p, x, gs)
  r = jax.jit(reference.ragged_dot_reference)(q, x, gs)
  assert rel(y, r) <= 1e-2, rel(y, r)
