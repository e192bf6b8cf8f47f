"""Grouped (MoE) WnA16 Pallas kernel: interpret mode on the CPU, the H200 with -m gpu."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import humming_jax as hj
from humming_jax.kernels import grouped_wna16 as gk
from humming_jax.kernels import reference, registry, tuning


def _rel(y, r):
  y, r = np.asarray(y, np.float32), np.asarray(r, np.float32)
  assert np.isfinite(y).all()
  return np.linalg.norm(y - r) / max(np.linalg.norm(r), 1e-30)


def _case(seed, spec, e, k, n, m, bias=True):
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  w = jax.random.normal(k1, (e, k, n))
  b = jax.random.normal(k3, (e, n)) if bias else None
  x = jax.random.normal(k2, (m, k)).astype(jnp.bfloat16)
  return hj.quantize(w, spec, bias=b), x


# ---- schedule: pure jnp, fast --------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=6, max_size=6), st.sampled_from([1, 37, 90]),
       st.sampled_from([1, 16]))
def test_tile_schedule_covers_each_row_once(sizes, m, block_m):
  gs = np.array(sizes, np.int32)
  n_tiles = gk.max_tiles(m, len(sizes), block_m)
  ex, start, end, kind = map(np.asarray, gk.tile_schedule(jnp.asarray(gs), m, block_m,
                                                           n_tiles))
  ends = np.minimum(np.cumsum(gs), m)
  starts = np.concatenate([[0], ends[:-1]])
  covered = np.zeros(m, int)
  for e_, s, t, kd in zip(ex, start, end, kind):
    assert 0 <= s <= t <= m and t - s <= block_m
    if t == s:
      continue
    covered[s:t] += 1
    if kd == 1:  # a compute tile lies inside its expert's segment
      assert starts[e_] <= s and t <= ends[e_]
    else:  # a zero tile lies past sum(group_sizes)
      assert s >= ends[-1]
  assert (covered == 1).all()


def test_prepare_roundtrip_and_registry():
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  p, _ = _case(0, spec, 3, 256, 64, 4)
  pp = jax.jit(hj.prepare, static_argnames="grouped")(p, grouped=True)
  assert pp.layout.startswith("grouped_wna16:") and pp.shape == p.shape
  assert registry.find(spec, grouped=True).name == "grouped_wna16"
  back = jax.jit(registry.to_canonical)(pp)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(p)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="stacked experts"):
    gk.prepare(hj.quantize(jnp.ones((256, 64)) * 0.5, spec))


# ---- the kernel in interpret mode vs the per-expert reference loop ---------------------------
# Uneven and empty experts, M not a multiple of block_m, rows past sum(group_sizes), split-K.
CASES = [
    ("w4a16-g128", (9, 0, 14, 0, 6), 37, tuning.TuningConfig(16, 64, 1)),
    ("w4a16-g128-zp", (0, 21, 3, 1, 0), 30, tuning.TuningConfig(16, 32, 2)),
    ("w4a16-mxfp4", (5, 5, 5, 5, 12), 32, tuning.TuningConfig(16, 64, 2)),
    ("w4a16-nvfp4", (17, 0, 0, 0, 2), 23, tuning.TuningConfig(32, 64, 1)),
    ("w8a16-fp8", (3, 8, 0, 10, 1), 25, tuning.TuningConfig(16, 64, 1)),
]


@pytest.mark.parametrize("preset,sizes,m,config", CASES, ids=[c[0] for c in CASES])
def test_grouped_kernel_interpret(preset, sizes, m, config):
  spec = hj.QuantSpec.preset(preset)
  p, x = _case(hash(preset) % 1000, spec, len(sizes), 256, 128, m)
  gs = jnp.array(sizes, jnp.int32)
  pp = jax.jit(gk.prepare)(p)
  y = jax.jit(functools.partial(gk.run, interpret=True, config=config))(pp, x, gs)
  r = jax.jit(reference.ragged_dot_reference)(p, x, gs)
  assert y.shape == (m, 128) and y.dtype == x.dtype
  assert _rel(y, r) < 1e-2
  total = min(sum(sizes), m)
  np.testing.assert_array_equal(np.asarray(y[total:], np.float32), 0.0)


def test_channel_scale_fp32_activations_interpret():
  spec = hj.QuantSpec.preset("w4a16-ch")
  p, x = _case(7, spec, 3, 128, 64, 12)
  x = x.astype(jnp.float32)
  gs = jnp.array([4, 0, 6], jnp.int32)
  y = hj.quant_ragged_dot(p, x, gs, backend="interpret")
  assert y.dtype == jnp.float32
  assert _rel(y, reference.ragged_dot_reference(p, x, gs)) < 1e-2
  np.testing.assert_array_equal(np.asarray(y[10:]), 0.0)


def test_heuristic_block_m_tracks_rows_per_expert():
  decode = gk.grouped_heuristic(8, 256, 512, 14)
  prefill = gk.grouped_heuristic(32768, 256, 512, 14)
  mixtral = gk.grouped_heuristic(8192, 8, 28672, 8)
  assert decode.block_m == 16 and decode.split_k > 1
  assert prefill.block_m == 128 and prefill.split_k == 1
  assert mixtral.block_m == 128


# ---- GPU (H200): benchmark shapes -----------------------------------------------------------
GPU_SHAPES = [  # (E, top-k, N, K): DeepSeek-V3, Qwen3-30B-A3B, Mixtral (gate_up and down)
    (256, 8, 512, 7168), (256, 8, 7168, 256), (128, 8, 1536, 2048), (128, 8, 2048, 768),
    (8, 2, 28672, 4096), (8, 2, 4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["w4a16-g128-zp", "w4a16-mxfp4"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tokens", [1, 64, 600])
def test_grouped_kernel_gpu(preset, shape, tokens):
  e, topk, n, k = shape
  spec = hj.QuantSpec.preset(preset)
  key = jax.random.PRNGKey(tokens)
  k1, k2, k3 = jax.random.split(key, 3)
  p = hj.quantize(jax.random.normal(k1, (e, k, n), jnp.bfloat16), spec)
  m = tokens * topk
  x = jax.random.normal(k2, (m, k), jnp.bfloat16)
  ids = jax.random.randint(k3, (tokens, topk), 0, e)
  gs = jnp.bincount(ids.reshape(-1), length=e).astype(jnp.int32)
  gs = gs.at[0].add(-jnp.minimum(gs[0], 1))  # one row past sum(group_sizes) when possible
  pp = hj.prepare(p, grouped=True)
  y = jax.jit(hj.quant_ragged_dot)(pp, x, gs)
  r = hj.moe.ragged_dot_xla(p, x, gs)
  assert _rel(y, r) < 1e-2
  total = int(gs.sum())
  np.testing.assert_array_equal(np.asarray(y[total:], np.float32), 0.0)
