"""The autotune command's grouped (MoE) mode: its search space, and that what it stores is
what the grouped kernel looks up (interpret mode: the timings mean nothing on a CPU, the
keys and the correctness check do)."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

import humming_jax as hj
from humming_jax import autotune
from humming_jax.kernels import grouped_wna16, layout, tuning


def test_grouped_candidates_fit_and_cover_wide_n_tiles():
  lt = layout.SlabLayout(4, 64)
  # DeepSeek-V3 gate_up at 1024 tokens: 32 rows per expert, N 512, K 7168.
  k_tiles = 7168 // lt.block_k
  cands = grouped_wna16.grouped_candidates(8192, 256, 512, k_tiles, lt=lt)
  heur = grouped_wna16.grouped_heuristic(8192, 256, 512, k_tiles, sms=tuning.num_sms(), lt=lt)
  assert cands[0] == heur
  # The H200 grouped autotune's winner here (session 8: 685 us vs 1950 with 32-wide tiles
  # that re-read the activations 16 times), now the heuristic's own choice.
  assert (heur.block_m, heur.block_n, heur.split_k) == (32, 64, 1)
  assert any(c.block_n >= 128 for c in cands)
  assert len(set(cands)) == len(cands)
  for c in cands:
    assert grouped_wna16.smem_estimate(c, lt, k_tiles // c.split_k) <= grouped_wna16.SMEM_BYTES
    assert 512 % c.block_n == 0 and k_tiles % c.split_k == 0
  # Decode (8 rows over 256 experts): split K is searched; prefill (64 rows each) is not.
  assert {c.split_k for c in grouped_wna16.grouped_candidates(8, 256, 512, k_tiles, lt=lt)} \
      >= {1, 2}
  assert {c.split_k for c in grouped_wna16.grouped_candidates(8192, 128, 1536, 4, lt=lt)} == {1}


def test_autotune_grouped_stores_what_choose_config_reads(tmp_path, monkeypatch):
  monkeypatch.setenv("HUMMING_JAX_TUNING_CACHE", str(tmp_path / "tuning.json"))
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  tried = [tuning.TuningConfig(16, 64, 1, num_warps=4, num_stages=2),
           tuning.TuningConfig(16, 32, 2, num_warps=4, num_stages=2)]
  seen = []

  def cands(m, e, n, k_tiles):
    seen.append((m, e, n, k_tiles))
    return tried

  best = autotune.autotune_grouped(spec, 4, 2, 256, 128, [5], layers=1, calls=1,
                                   interpret=True, candidates=cands)
  assert seen == [(10, 4, 128, seen[0][3])]  # 5 tokens x top-2 rows over 4 experts
  [(key, cfg)] = best.items()
  assert cfg in tried
  tuning.store_configs(best)
  q = hj.quantize(jax.random.normal(jax.random.key(0), (4, 256, 128)), spec)
  p = grouped_wna16.prepare(q)
  _, lt = layout.parse_layout_name(p.layout)
  k_tiles = lt.k_of_rows(p.codes.shape[1]) // lt.block_k
  assert k_tiles == seen[0][3]
  got = grouped_wna16.choose_config(10, 4, p.codes.shape[2], k_tiles, spec.name, 256, lt)
  assert got == cfg
  # Another token bucket is not covered by the entry: the heuristic answers there.
  assert grouped_wna16.choose_config(4096, 4, p.codes.shape[2], k_tiles, spec.name, 256, lt) \
      == grouped_wna16.grouped_heuristic(4096, 4, p.codes.shape[2], k_tiles,
                                         sms=tuning.num_sms(), lt=lt)


def test_autotune_grouped_rejects_bad_arguments():
  with pytest.raises(ValueError, match="topk=9"):
    autotune.autotune_grouped("w4a16-g128-zp", 8, 9, 256, 128, [1], layers=1, interpret=True)
  with pytest.raises(ValueError, match="w8a8-int8"):
    autotune.autotune_grouped("w8a8-int8", 8, 2, 256, 128, [1], layers=1, interpret=True)
  assert autotune._parse_grouped("256:8:7168x512") == (256, 8, 7168, 512)
  with pytest.raises(SystemExit, match="E:TOPK:KxN"):
    autotune._parse_grouped("256x8")


def _w4a8_experts(e, k, n, seed=0):
  """Eagerly prepared W4A8 MXFP4 experts (":cf": the one-accumulator route) and the view
  grouped_wna16_mgpu.run receives from grouped_wnam_mgpu.run."""
  from humming_jax.kernels import grouped_wnam_mgpu as gw, wnam_mgpu
  from humming_jax.kernels import grouped_wna16_mgpu as g16
  spec = hj.QuantSpec.preset("w4a8-mxfp4")
  q = jax.jit(hj.quantize, static_argnums=1)(
      jax.random.normal(jax.random.key(seed), (e, k, n)) / k**0.5, spec)
  p = gw.prepare(q)
  return q, p, wnam_mgpu.weight_view(p, wnam_mgpu.renamed(p.layout, g16.FAMILY))


def test_mgpu_launch_candidates(monkeypatch):
  """The Mosaic grouped kernel's search space: the default launch first, each pair once,
  rows around the default (and block_rows'), one-accumulator launches of two and four
  warpgroups with 2-4 stages on ":cf" experts, none on unmarked ones."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16, grouped_wnam_mgpu as gw
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  monkeypatch.setattr(tuning, "num_sms", lambda: 132)
  q, p, view = _w4a8_experts(8, 256, 512)
  m = 8 * 64  # 64 rows per expert: default 88-row tiles (session 29)
  cands = g16.launch_candidates(m, view)
  rows = g16.tile_rows(m, 8, view)
  assert rows == 88 and cands[0] == (88, g16.heuristic(8, 512, view.codes.shape[-3], 88,
                                                       params=view, tile_rows=88))
  assert len(set(cands)) == len(cands)
  assert {r for r, _ in cands} == {80, 88, 96}
  assert all(c.fp8_single_acc and c.split_warpgroups == "n" for _, c in cands)
  assert {(c.warpgroups, c.stages) for r, c in cands if r == 88} >= {
      (w, s) for w in (2, 4) for s in (2, 3, 4)}
  unmarked = jax.jit(gw.prepare)(q)
  from humming_jax.kernels import wnam_mgpu
  uview = wnam_mgpu.weight_view(unmarked, wnam_mgpu.renamed(unmarked.layout, g16.FAMILY))
  ucands = g16.launch_candidates(m, uview)
  assert ucands and not any(c.fp8_single_acc for _, c in ucands)
  assert all(r <= g16.MAX_BLOCK_M for r, _ in ucands)
  # the cache keys of the two routes differ (the ":cf" launch is not served to the other)
  assert g16.launch_cache_key(view, m) != g16.launch_cache_key(uview, m)
  assert g16.launch_cache_key(view, m) == g16.launch_cache_key(view, m - 8)  # one bucket


def test_mgpu_launch_candidates_small_ctas(monkeypatch):
  """On the 16-bit route, tiles of 16-32 rows are also tried on the decode tiles' small
  CTAs (two K-split warpgroups of two stages, one of four), which lower for the H200 at
  DeepSeek-V3 gate_up's 256-token tiles (16 rows: since session 37 the default is one
  of them, four shared-x warpgroups before, still a candidate); wider tiles, and the
  fp8-MMA layout, are not."""
  from test_cuda_lowering import abstract_params, lower_for_h200
  from humming_jax.kernels import grouped_wna16_mgpu as g16, wna16_mgpu
  monkeypatch.setattr(tuning, "num_sms", lambda: 132)
  e, k, n = 256, 7168, 512
  p = abstract_params("w4a16-g128-zp", (e, k, n), grouped=True, kernel=g16.FAMILY)
  small = lambda cands: {(r, c.warpgroups, c.stages) for r, c in cands
                         if c.split_warpgroups == "k" and r >= 16}
  m = 256 * 8
  cands = g16.launch_candidates(m, p)
  first = cands[0][1]
  assert cands[0][0] == 16 and (first.split_warpgroups, first.warpgroups) == ("k", 1)
  assert (16, wna16_mgpu.shared_x_config(16)) in cands  # the default before session 37
  assert small(cands) >= {(16, 2, 2), (16, 1, 4), (24, 2, 2), (24, 1, 4)}
  assert len(set(cands)) == len(cands)
  assert not small(g16.launch_candidates(1024 * 8, p))  # 48-row tiles: shared-x only
  x, g = jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((e,), jnp.int32)
  for rows, cfg in cands:
    if (rows, cfg.warpgroups, cfg.stages) in {(16, 2, 2), (16, 1, 4)} and \
        cfg.split_warpgroups == "k":
      text = lower_for_h200(lambda p, x, g, c=cfg, r=rows: g16.run(p, x, g, config=c,
                                                                  block_m=r), p, x, g)
      assert "custom_call" in text


def test_autotune_grouped_mgpu_stores_what_run_reads(tmp_path, monkeypatch):
  """What the Mosaic grouped tuning stores (rows per tile in the Config's block_m) is
  what grouped_wna16_mgpu.run then takes by default, through grouped_wnam_mgpu.run: the
  stored rows and launch, not the heuristic's, within 1e-4 of the reference; another
  token bucket keeps the heuristic; an entry past the route's rows, or of the
  one-accumulator route where it is off, is ignored with a warning; token counts that
  share a key are refused."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16, grouped_wnam_mgpu as gw
  from humming_jax.kernels import reference, wna16_mgpu
  monkeypatch.setenv("HUMMING_JAX_TUNING_CACHE", str(tmp_path / "tuning.json"))
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  tried = (32, dataclasses.replace(wna16_mgpu.shared_x_config(32, warpgroups=2),
                                   fp8_single_acc=True, stages=3))
  seen = []

  def cands(m, params):
    seen.append((m, params.shape[0], params.layout))
    return [tried]

  best = autotune.autotune_grouped_mgpu("w4a8-mxfp4", 4, 2, 256, 128, [20], layers=1,
                                        calls=1, interpret=True, candidates=cands)
  assert len(seen) == 1 and seen[0][:2] == (40, 4)
  assert seen[0][2].startswith(g16.FAMILY) and seen[0][2].endswith(":p8:cf")
  [(key, cfg)] = best.items()
  assert cfg == dataclasses.replace(tried[1], block_m=32) and ":p8:cf|" in key
  tuning.store_configs(best)
  q, p, view = _w4a8_experts(4, 256, 128, seed=3)
  assert g16.cached_launch(view, 40) == (32, cfg)
  assert g16.tile_rows(40, 4, view) != 32  # (the default would take other rows)
  launches, heur = [], []
  real_run, real_heuristic = wna16_mgpu.run, g16.heuristic
  monkeypatch.setattr(wna16_mgpu, "run", lambda *a, **kw: launches.append(
      (kw["tiles"].block_m, kw["config"])) or real_run(*a, **kw))
  monkeypatch.setattr(g16, "heuristic", lambda *a, **kw: heur.append(1) or
                      real_heuristic(*a, **kw))
  g = jnp.asarray([9, 11, 12, 8], jnp.int32)
  x = jax.random.normal(jax.random.key(4), (40, 256), jnp.bfloat16)
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x, g)
  assert launches == [(32, cfg)] and not heur, (launches, heur)
  ref = reference.ragged_dot_reference(q, x, g)
  err = float(jnp.linalg.norm((y - ref).astype(jnp.float32))
              / jnp.linalg.norm(ref.astype(jnp.float32)))
  assert err <= 1e-4, err
  assert g16.cached_launch(view, 4096) is None  # another bucket: the heuristic's
  # an entry this version would refuse (rows past the route's widest) is ignored
  tuning.store_configs({key: dataclasses.replace(cfg, block_m=200)})
  with pytest.warns(UserWarning, match="200 rows per tile"):
    assert g16.cached_launch(view, 40) is None
  # a two-accumulator launch past 128 rows (the one-accumulator route's 160 is not its)
  tuning.store_configs({key: dataclasses.replace(cfg, block_m=144, fp8_single_acc=False)})
  with pytest.warns(UserWarning, match=r"144 rows per tile \(at most 128"):
    assert g16.cached_launch(view, 40) is None
  # a one-accumulator launch where that route is off (the env switch: another key)
  monkeypatch.setenv("HUMMING_JAX_FP8_SINGLE_ACC", "0")
  off_key = g16.launch_cache_key(view, 40)
  assert off_key != key and ":cf|" not in off_key
  tuning.store_configs({off_key: cfg})
  with pytest.warns(UserWarning, match="one-accumulator launch, and that route is off"):
    assert g16.cached_launch(view, 40) is None
  # two token counts under one key are refused before anything is timed
  with pytest.raises(ValueError, match=r"tokens \[\[20, 21\]\]"):
    autotune.autotune_grouped_mgpu("w4a8-mxfp4", 4, 2, 256, 128, [20, 21], layers=1,
                                   interpret=True, candidates=cands)
