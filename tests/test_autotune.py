"""The autotune command's grouped (MoE) mode: its search space, and that what it stores is
what the grouped kernel looks up (interpret mode: the timings mean nothing on a CPU, the
keys and the correctness check do)."""
import jax
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
