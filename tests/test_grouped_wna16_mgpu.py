"""Grouped (MoE) WnA16 on the Mosaic GPU kernel (kernels/grouped_wna16_mgpu.py) against the
per-expert XLA reference (kernels/reference.py::ragged_dot_reference).

Interpret mode (CPU, CI) runs the same kernel body as the dense Mosaic kernel tests; the
CPU lowering test builds the GPU program for an abstract H200 at the MoE benchmark shapes;
the @pytest.mark.gpu tests run on the H200 (they pass since session 6).  hj.prepare picks
this family for experts with K >= 256 and bf16 / fp16 tokens (session 34, NOTES_moe.md).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.kernels import grouped_wna16_mgpu as gm, reference, registry, tuning, wna16_mgpu
# jax.random.normal bit for bit (one compile per size class); one jitted quantize per spec
from test_wna16_mgpu import _quantizer, normal

TOL = 1e-2


def rel(y, ref):
  y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
  return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def routed_rows(e, k, tokens, seed, topk=8):
  """(group_sizes (E,), x (tokens * topk, K) bf16): random expert ids, rows sorted."""
  ids = jax.random.randint(jax.random.key(seed), (tokens * topk,), 0, e)
  g = jnp.bincount(ids, length=e).astype(jnp.int32)
  return g, jax.random.normal(jax.random.key(seed + 1), (tokens * topk, k), jnp.bfloat16)


def routed_error(name, e, k, n, tokens, seed, prepare, run):
  """(rel err, prepared params) of ``run(prepare(q), x, g)`` against the reference for
  ``name`` experts (E, K, N) quantized from seed ``seed`` and top-8 routed rows of
  ``tokens`` tokens from seed ``seed + 1``."""
  q, _ = make(name, e, k, n, 1, False, seed=seed)
  g, x = routed_rows(e, k, tokens, seed=seed + 1)
  p = jax.jit(prepare)(q)
  return rel(jax.jit(run)(p, x, g), jax.jit(reference.ragged_dot_reference)(q, x, g)), p


def abstract_stack(name, e, k, n):
  """Prepared (E, K, N) ``name`` experts as shapes only (the launch rules' input)."""
  return jax.eval_shape(lambda w: gm.prepare(hj.quantize(w, hj.QuantSpec.preset(name))),
                        jax.ShapeDtypeStruct((e, k, n), jnp.float32))


def make(name, e, k, n, m, bias, seed=0, dtype=jnp.bfloat16):
  kw, kb, kx = jax.random.split(jax.random.key(seed), 3)
  w = normal(kw, (e, k, n)) / np.sqrt(k)
  b = normal(kb, (e, n)) if bias else None
  q = _quantizer(hj.QuantSpec.preset(name))(w, b)
  x = normal(kx, (m, k), jnp.float32).astype(dtype)
  return q, x


CASES = [  # (preset, E, K, N, group_sizes, M, bias): uneven, empty experts, a zero tail
    ("w4a16-g128-zp", 4, 256, 128, [3, 0, 5, 2], 12, True),
    ("w4a16-g128", 6, 512, 64, [0, 0, 20, 1, 0, 3], 24, False),  # 20 rows: 2 tiles of 16
    ("w4a16-mxfp4", 3, 256, 64, [1, 1, 1], 3, False),  # decode: one row per expert
    ("w4a16-nvfp4", 5, 512, 192, [0, 7, 2, 0, 9], 20, True),  # per-expert global scale
    ("w4a16-mxint4", 8, 384, 64, [2, 2, 2, 2, 2, 2, 2, 2], 16, True),
    ("w8a16", 3, 256, 64, [4, 0, 3], 9, True),  # 8-bit codes
    ("w8a16-fp8", 3, 256, 128, [2, 5, 0], 8, False),  # e4m3 codes
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-e{c[1]}-m{c[5]}")
def test_kernel_interpret(case):
  name, e, k, n, gs, m, bias = case
  q, x = make(name, e, k, n, m, bias)
  g = jnp.asarray(gs, jnp.int32)
  p = gm.prepare(q)
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(p, x, g)
  ref = reference.ragged_dot_reference(q, x, g)
  total = sum(gs)
  assert y.shape == (m, n) and y.dtype == x.dtype
  assert rel(y[:total], ref[:total]) <= TOL, rel(y[:total], ref[:total])
  assert not bool(jnp.any(y[total:] != 0))  # rows past sum(group_sizes): zeros


def test_float16_and_many_rows_per_expert():
  q, x = make("w4a16-g128-zp", 2, 256, 64, 80, True, seed=3, dtype=jnp.float16)
  g = jnp.asarray([50, 30], jnp.int32)  # 40 +- 13 rows per expert: 56-row tiles
  y = gm.run(gm.prepare(q), x, g, interpret=True)
  assert y.dtype == jnp.float16
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL


def test_prepared_params_run_through_quant_ragged_dot(monkeypatch):
  """Params prepared for this family run on it: quant_ragged_dot does not re-lay them out
  for the shape's default (Triton at K 128) grouped family."""
  from humming_jax import ops
  q, x = make("w4a16-mxfp4", 4, 128, 64, 8, False, seed=4)
  g = jnp.asarray([2, 0, 5, 1], jnp.int32)
  p = gm.prepare(q)
  assert registry.by_layout(p.layout).name == gm.FAMILY

  def no_prepare(*a, **kw):
    raise AssertionError("re-prepared")
  monkeypatch.setattr(ops, "prepare", no_prepare)
  y = hj.quant_ragged_dot(p, x, g, backend="interpret")
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL


def test_default_grouped_family_without_a_shape_is_triton():
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  assert registry.find(spec, grouped=True).name == "grouped_wna16"
  assert gm.priority_for(spec, (8, 255, 64)) < 0 < gm.priority_for(spec, (8, 256, 64))
  assert gm.MIN_DEFAULT_K == 256  # Qwen3-30B-A3B (K 2048 / 768), DeepSeek-V3 down (K 256)


def test_prepare_round_trip_is_exact():
  for name, e, k, n, gs, m, bias in CASES:
    q, _ = make(name, e, k, n, m, bias)
    c = gm.to_canonical(gm.prepare(q))
    for f in ("codes", "scales", "zeros", "global_scale", "bias"):
      a, b = getattr(c, f), getattr(q, f)
      assert (a is None) == (b is None), f
      if a is not None:
        assert a.shape == b.shape and a.dtype == b.dtype, (name, f)
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_bad_inputs_are_named():
  q, x = make("w4a16-g128", 2, 256, 64, 4, False)
  p = gm.prepare(q)
  with pytest.raises(ValueError, match=r"x must be \(M, K=256\)"):
    gm.run(p, x[:, :128], jnp.asarray([2, 2]), interpret=True)
  with pytest.raises(ValueError, match=r"group_sizes must be \(2,\)"):
    gm.run(p, x, jnp.asarray([4]), interpret=True)
  with pytest.raises(ValueError, match="params.layout='canonical'"):
    gm.run(q, x, jnp.asarray([2, 2]), interpret=True)
  dense = hj.quantize(jax.random.normal(jax.random.key(0), (256, 64)), "w4a16-g128")
  with pytest.raises(ValueError, match="stacked experts"):
    gm.prepare(dense)


@pytest.mark.parametrize("tokens", [1, 16])
@pytest.mark.parametrize("shape", [(128, 2048, 1536), (128, 768, 2048), (256, 7168, 512),
                                   (256, 256, 7168)])
def test_lowers_for_h200(shape, tokens):
  """Qwen3-30B-A3B and DeepSeek-V3 expert shapes, top-8 decode rows."""
  from test_cuda_lowering import lower_for_h200
  e, k, n = shape
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  q = jax.eval_shape(lambda w: hj.quantize(w, spec), jax.ShapeDtypeStruct((e, k, n), jnp.float32))
  p = jax.eval_shape(gm.prepare, q)
  x = jax.ShapeDtypeStruct((tokens * 8, k), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((e,), jnp.int32)
  text = lower_for_h200(lambda p, x, g: gm.run(p, x, g), p, x, g)
  assert "custom_call" in text


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 16, 64])
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_qwen3_decode_gpu(name, tokens):
  """Qwen3-30B-A3B gate_up (E=128, K=2048, N=1536), top-8 rows sorted by expert."""
  err, _ = routed_error(name, 128, 2048, 1536, tokens, 5, gm.prepare, gm.run)
  assert err <= TOL


@pytest.mark.parametrize("name,gs,bias", [("w4a16-mxfp4", [3, 0, 9, 1], False),
                                          ("w4a16-mxfp4", [0, 7, 2, 5], True),
                                          ("w4a16-nvfp4", [0, 7, 2, 5], True)])
def test_scale_fold_interpret(name, gs, bias, monkeypatch):
  """":sf" fp4 experts (wna16_mgpu.scale_fold_base per expert, (E, 1, Np); NVFP4: per-expert
  global scales): bit for bit the unfolded kernel's rows."""
  q, x = make(name, 4, 512, 192, sum(gs) + 3, bias, seed=41)
  g = jnp.asarray(gs, jnp.int32)
  p = gm.prepare(q)
  assert gm.wna16_mgpu.scale_folds(p.layout) and p.fold_base.shape == (4, 1, 192)
  monkeypatch.setenv("HUMMING_JAX_SCALE_FOLD", "0")
  plain = gm.prepare(q)
  assert not gm.wna16_mgpu.scale_folds(plain.layout)
  # one K split (the default launch here splits K in two, where the fold is off)
  cfg = gm.wna16_mgpu.Config(64, 2, 2, warpgroups=2)
  run = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True, config=cfg, block_m=16))
  y = run(p, x, g)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(run(plain, x, g),
                                                                      np.float32))
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL
  # the fold ran: a NaN base turns every computed row NaN (rows past the total stay 0)
  nan = np.asarray(run(p.replace(fold_base=jnp.full_like(p.fold_base, jnp.nan)), x, g))
  assert np.isnan(nan[:sum(gs)]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64])
@pytest.mark.parametrize("name", ["w4a16-mxfp4", "w4a16-nvfp4"])
def test_scale_fold_gpu(name, tokens, monkeypatch):
  """Qwen3-30B-A3B gate_up fp4 experts on the H200: the folded conversion bit for bit the
  unfolded one, and within the tolerance of the reference."""
  q, _ = make(name, 128, 2048, 1536, 1, False, seed=42)
  g, x = routed_rows(128, 2048, tokens, seed=43)
  run = jax.jit(gm.run)
  p = jax.block_until_ready(gm.prepare(q))
  assert gm.wna16_mgpu.scale_folds(p.layout)
  y = run(p, x, g)
  monkeypatch.setenv("HUMMING_JAX_SCALE_FOLD", "0")
  plain = gm.prepare(q)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(run(plain, x, g),
                                                                      np.float32))
  assert rel(y, jax.jit(reference.ragged_dot_reference)(q, x, g)) <= TOL


def test_tile_schedule_covers_every_row_once():
  """Random splits (empty experts, long and short segments, sum < M and sum > M): tiles
  start at a multiple of 8, own rows of one expert, cover each row below sum(group_sizes)
  exactly once and fit the static bound; output_rows maps each row to its tile's slot."""
  rng = np.random.default_rng(0)
  decode = [np.asarray([1] * 8 + [0] * 8), np.asarray([0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1])]
  cases = []
  for i in range(62):
    if i < 60:
      e = int(rng.integers(1, 12))
      gs = rng.integers(0, 20, e) * (rng.random(e) < 0.7)
      # sum(group_sizes) <= M, and (i >= 40) > M: lax.ragged_dot leaves those rows undefined;
      # the segments are clipped to M.
      m = int(gs.sum() + rng.integers(0, 9)) if i < 40 else int(gs.sum() - rng.integers(0, 9))
    else:  # decode, one row per active expert: the bound is M tiles
      gs = decode[i - 60]
      e, m = len(gs), int(gs.sum())
    if m <= 0:
      continue
    bm = gm.block_rows(m, e)
    nt = gm.max_tiles(m, e, bm)
    assert i < 60 or nt == m
    cases.append((gs, m, bm, nt))
  # Every split in one compiled call (op-by-op dispatch compiles every small op per shape;
  # one program per split compiled ~60 times).
  outs = jax.jit(lambda gss: [(gm.tile_schedule(g, m, bm, nt), gm.output_rows(g, m, bm, nt))
                              for g, (_, m, bm, nt) in zip(gss, cases)])(
                                  [jnp.asarray(c[0]) for c in cases])
  for (gs, m, bm, nt), (sched, got) in zip(cases, outs):
    expert, row0, own, end, kind = map(np.asarray, sched)
    seg_end = np.cumsum(gs)
    seg_start = seg_end - gs
    hits = np.zeros(m, int)
    for t in np.flatnonzero(kind):
      assert row0[t] % 8 == 0 and row0[t] <= own[t] < end[t] <= row0[t] + bm
      assert seg_start[expert[t]] <= own[t] and end[t] <= seg_end[expert[t]]
      hits[own[t]:end[t]] += 1
    total = int(gs.sum())
    assert (hits[:total] == 1).all() and (hits[total:] == 0).all(), (gs, m)
    # The output gather's source rows: row r from the slot of the tile that owns it.
    want = np.full(m, nt * bm)
    for t in np.flatnonzero(kind):
      want[own[t]:end[t]] = t * bm + np.arange(own[t], end[t]) - row0[t]
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=str((gs, m)))


def _check_schedule_kernel(interpret: bool) -> None:
  """The one-launch Pallas-Triton schedule against tile_schedule and output_rows (its XLA
  reference) on run's tile rows: random routings over E = 3 / 8 / 60 (padded to 8 / 64) /
  256 experts, M from 1 to 1000 rows (several programs), sum(group_sizes) below and above
  M, all experts empty, a negative size."""
  rng = np.random.default_rng(3)
  cases = [(8, 1, 0), (60, 37, 0), (256, 1000, 0), (8, 64, 5), (60, 8, 5), (256, 64, -1),
           (3, 5, -2)]
  for e, m, extra in cases:
    gs = rng.multinomial(max(m + int(rng.integers(-3, 1)), 0), np.ones(e) / e)
    gs[rng.integers(0, e)] += max(extra, 0)  # sum > M: clipped
    gs = gs * (extra != -1)  # -1: every expert empty
    gs[0] -= 3 * (extra == -2)  # -2: a negative size (counts as empty)
    bm = gm.tile_rows(m, e)  # run's tile rows (16 where block_rows says 8)
    nt = gm.max_tiles(m, e, bm)

    def both(g, m=m, bm=bm, nt=nt):
      return (*gm.reference_schedule(g, m, bm, nt),
              *gm.schedule(g, m, bm, nt, interpret=interpret))

    want_sched, want_src, sched, src = jax.jit(both)(jnp.asarray(gs, jnp.int32))
    assert sched.shape[0] >= 4 * nt and src.shape[0] >= m
    np.testing.assert_array_equal(np.asarray(sched).reshape(-1, 4)[:nt],
                                  np.asarray(want_sched).reshape(-1, 4),
                                  err_msg=str((e, m, gs)))
    np.testing.assert_array_equal(np.asarray(src)[:m], np.asarray(want_src),
                                  err_msg=str((e, m, gs)))


def test_schedule_kernel_equals_the_xla_schedule():
  """What run uses on a GPU, in the interpreter (_check_schedule_kernel)."""
  _check_schedule_kernel(interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [1, 2, 4])
def test_schedule_kernel_gpu(warps, monkeypatch):
  """The schedule kernel on the H200 at each warp count probe_timeline.py can time
  (SCHEDULE_WARPS), against the XLA reference."""
  monkeypatch.setattr(gm, "SCHEDULE_WARPS", warps)
  _check_schedule_kernel(interpret=False)


def test_schedule_is_one_launch_beside_the_kernel():
  """run's jaxpr at 1 token: the schedule kernel, the Mosaic kernel, and no XLA
  cumsum / searchsorted ops beside them (they were six fusions on the H200)."""
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  q = jax.eval_shape(lambda w: hj.quantize(w, spec),
                     jax.ShapeDtypeStruct((16, 256, 128), jnp.float32))
  p = jax.eval_shape(gm.prepare, q)
  x = jax.ShapeDtypeStruct((8, 256), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((16,), jnp.int32)
  jaxpr = jax.make_jaxpr(lambda p, x, g: gm.run(p, x, g))(p, x, g)

  from jax.extend.core import Jaxpr  # noqa: PLC0415

  def primitives(jx):  # every equation's primitive, sub-jaxprs (pjit, custom_vmap) included
    for eqn in jx.eqns:
      yield eqn.primitive.name
      if eqn.primitive.name in ("pallas_call", "mpmd_map"):
        continue  # a kernel (Pallas-Triton, Mosaic GPU): its body's ops are not XLA's
      for v in eqn.params.values():
        for sub in v if isinstance(v, (tuple, list)) else (v,):
          sub = getattr(sub, "jaxpr", sub)
          if isinstance(sub, Jaxpr):
            yield from primitives(sub)

  names = list(primitives(jaxpr.jaxpr))
  assert names.count("pallas_call") == 1 and names.count("mpmd_map") == 1, names
  assert not {"cumsum", "cumlogsumexp", "reduce_window_sum", "sort"} & set(names), names


def test_tile_rows():
  """Decode tiles: 16 rows above 8 (run's default, tile_rows) so a segment crossing an
  8-row boundary stays in one tile -- fewer tiles than 8-row ones on a random routing --
  and 8 rows explicitly: the same rows; a bad block_m is named."""
  assert gm.tile_rows(8, 256) == 8 and gm.tile_rows(512, 256) == 16
  assert gm.tile_rows(8192, 256) == gm.block_rows(8192, 256) == 48
  # The launch: 16-row decode tiles keep the 8-row one (measured), wider tiles their own.
  assert gm.launch_rows(512, 256, 16) == 8 and gm.launch_rows(512, 256, 32) == 32
  ids = np.argsort(np.random.default_rng(1).random((64, 256)), axis=1)[:, :8]
  gs64 = jnp.asarray(np.bincount(ids.ravel(), minlength=256), jnp.int32)
  used = lambda bm: int(gm.tile_schedule(gs64, 512, bm, gm.max_tiles(512, 256, bm))[4].sum())
  assert used(16) < used(8)
  gs = [3, 0, 6, 1, 7, 2, 0, 5]
  m = sum(gs) + 2
  q, x = make("w4a16-g128-zp", 8, 256, 64, m, False, seed=8)
  g = jnp.asarray(gs, jnp.int32)
  p = gm.prepare(q)
  assert gm.block_rows(m, 8) == 8 and gm.tile_rows(m, 8) == 16
  ref = reference.ragged_dot_reference(q, x, g)
  for bm in (None, 8):
    y = jax.jit(lambda p, x, g, bm=bm: gm.run(p, x, g, interpret=True, block_m=bm))(p, x, g)
    assert rel(y, ref) <= TOL and not bool(jnp.any(y[sum(gs):] != 0))
  with pytest.raises(ValueError, match="block_m=12"):
    gm.run(p, x, g, block_m=12)


def test_block_rows_covers_a_random_routing():
  assert gm.block_rows(8, 8) == 8  # decode: one row per active expert
  assert gm.block_rows(8192, 256) == 48  # DeepSeek-V3, 1024 tokens: 32 +- 6 rows
  assert gm.block_rows(8192, 128) == 80  # Qwen3-30B-A3B, 1024 tokens: 64 +- 8
  assert gm.block_rows(2048, 8) == gm.MAX_BLOCK_M  # Mixtral, 1024 tokens: capped


def test_many_rows_per_expert_two_warpgroup_tiles():
  """Tiles above 64 rows (block_rows of ~90 rows per expert) run the two-warpgroup
  configuration; an expert larger than one tile and a zero tail included."""
  gs = [150, 0, 31]
  m = 190
  q, x = make("w4a16-g128-zp", 3, 512, 128, m, True, seed=5)
  bm = gm.block_rows(m, 3)
  assert 64 < bm <= gm.MAX_BLOCK_M
  g = jnp.asarray(gs, jnp.int32)
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(gm.prepare(q), x, g)
  ref = reference.ragged_dot_reference(q, x, g)
  assert rel(y[:181], ref[:181]) <= TOL, rel(y[:181], ref[:181])
  assert not bool(jnp.any(y[181:] != 0))


@pytest.mark.parametrize("name,bm", [("w4a16-g128-zp", 8), ("w4a16-nvfp4", 16),
                                     ("w4a16-mxfp4", 72)])
def test_run_aligned_rows_in_place(name, bm):
  """Tile-aligned segments (empty experts, several tiles per expert, unused tiles at the
  end): every routed row equals the per-expert reference; rows past the segments are
  unspecified and not compared."""
  from humming_jax import moe
  e, k, n, t, topk = 5, 256, 128, 7, 2
  q, _ = make(name, e, k, n, 1, True, seed=21)
  ids = jnp.asarray([[0, 3], [3, 0], [4, 3], [0, 3], [3, 4], [0, 4], [3, 0]], jnp.int32)
  r = moe.align_tokens(ids, e, bm)
  x = jax.random.normal(jax.random.key(22), (t, k), jnp.bfloat16)
  xs = jnp.take(x, r.token_of_row, axis=0)
  y = jax.jit(lambda p, a, g: gm.run_aligned(p, a, g, block_m=bm, interpret=True))(
      gm.prepare(q), xs, r.group_sizes)
  assert y.shape == (xs.shape[0], n)
  want = reference.ragged_dot_reference(q, xs, r.group_sizes)  # same segments, per expert
  valid = np.asarray(r.valid)
  assert valid.sum() == t * topk
  assert rel(np.asarray(y, np.float32)[valid], np.asarray(want, np.float32)[valid]) <= TOL


@pytest.mark.parametrize("bm", [8, 16])
def test_aligned_schedules_agree(bm, monkeypatch):
  """run_aligned's two schedules agree on tile-aligned segments (empty experts, several
  tiles per expert, unused tiles at the end, ids past E): the Pallas-Triton schedule
  kernel (the default on a GPU; interpreted alone here: its tiles are quant_ragged_dot's,
  equal to these where segments start at tile multiples) and the XLA ops (the
  interpreter's); align_tokens gives the same rows with and without its barrier."""
  from humming_jax import moe
  e = 6
  ids = jax.random.randint(jax.random.key(bm), (29, 3), 0, e + 1)  # e: out of range
  ids = jnp.where((ids == 0) | (ids == 2), 4, ids)  # experts 0 and 2 empty
  monkeypatch.setenv("HUMMING_JAX_ALIGNED_SCHEDULE", "xla")
  r = moe.align_tokens(ids, e, bm)
  assert int(r.group_sizes[0]) == int(r.group_sizes[2]) == 0
  rows, tiles = r.token_of_row.shape[0], r.token_of_row.shape[0] // bm
  xla = gm.aligned_schedule(r.group_sizes, rows, bm, tiles)
  monkeypatch.setenv("HUMMING_JAX_ALIGNED_SCHEDULE", "kernel")
  rb = jax.jit(lambda i: moe.align_tokens(i, e, bm))(ids)
  for got, want in zip(rb, r):
    np.testing.assert_array_equal(got, want)
  got = jax.jit(lambda g: gm.aligned_schedule(g, rows, bm, tiles, interpret=True))(
      r.group_sizes)
  np.testing.assert_array_equal(got, xla)  # the interpreter: the XLA ops
  sched, _ = gm.schedule(r.group_sizes, rows, bm, tiles, interpret=True)
  sched, xla = np.asarray(sched)[:4 * tiles].reshape(tiles, 4), np.asarray(xla).reshape(tiles, 4)
  used = xla[:, 3] == 1
  assert used.sum() == int(r.group_sizes.sum()) // bm > 1 and not used.all()
  np.testing.assert_array_equal(sched[:, 3], xla[:, 3])
  np.testing.assert_array_equal(sched[used], xla[used])  # unused tiles: kind 0, not read
  monkeypatch.setenv("HUMMING_JAX_ALIGNED_SCHEDULE", "barrier")
  with pytest.raises(ValueError, match="HUMMING_JAX_ALIGNED_SCHEDULE='barrier'"):
    gm.aligned_schedule(r.group_sizes, rows, bm, tiles)


@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-nvfp4"])
def test_run_pairs_tiles_interpret(name):
  """A tile per pair: pair p's rows [8p, 8p + 8) are x rows [first_p, first_p + 8) (rows
  past x's: zero input) against expert ids[p]; an out-of-range id's tile computes
  nothing (its rows are not compared)."""
  e, k, n = 5, 256, 128
  q, _ = make(name, e, k, n, 1, True, seed=31)
  x = jax.random.normal(jax.random.key(32), (11, k), jnp.bfloat16)
  ids = jnp.asarray([4, 0, 7, 4, 2], jnp.int32)  # a repeated expert, an invalid id
  first = [8, 0, 0, 0, 8]
  y = jax.jit(lambda p, a, i: gm.run_pairs(p, a, i, first, interpret=True))(
      gm.prepare(q), x, ids)
  assert y.shape == (5 * 8, n) and y.dtype == x.dtype
  xp = jnp.pad(x, ((0, 16 - 11), (0, 0)))
  for p, (eid, f) in enumerate(zip(ids.tolist(), first)):
    if not 0 <= eid < e:
      continue
    g = jnp.zeros((e,), jnp.int32).at[eid].set(8)
    want = reference.ragged_dot_reference(q, xp[f:f + 8], g)
    assert rel(y[8 * p:8 * p + 8], want) <= TOL, (p, rel(y[8 * p:8 * p + 8], want))


def test_run_pairs_bad_inputs_are_named():
  q, _ = make("w4a16-g128-zp", 2, 256, 64, 1, False)
  p = gm.prepare(q)
  ids = jnp.asarray([0, 1], jnp.int32)
  x = jnp.zeros((8, 256), jnp.bfloat16)
  with pytest.raises(ValueError, match="first_rows"):
    gm.run_pairs(p, x, ids, [0, 4])
  with pytest.raises(ValueError, match="first_rows"):
    gm.run_pairs(p, x, ids, [0])
  with pytest.raises(ValueError, match="first_rows"):
    gm.run_pairs(p, x, ids, [0, 8])  # past x's rows
  with pytest.raises(ValueError, match="first_rows"):
    gm.run_pairs(p, x, ids, [0, 0.0])  # static ints only
  assert gm.run_pairs(p, x, ids[:0], []).shape == (0, 64)  # no pairs: no launch
  with pytest.raises(ValueError, match="expert_ids"):
    gm.run_pairs(p, x, ids.astype(jnp.float32), [0, 0])
  with pytest.raises(ValueError, match=r"x must be \(R, K=256\)"):
    gm.run_pairs(p, x[:, :128], ids, [0, 0])
  with pytest.raises(ValueError, match="layout"):
    gm.run_pairs(q, x, ids, [0, 0])


def test_pair_tiles_rule(monkeypatch):
  """Pair tiles while T * k * expert bytes <= 1.75 MiB * E, always at one token (H200
  sessions 38-39: where each model's measured crossing lies); the environment override
  wins."""
  from humming_jax import moe
  monkeypatch.delenv("HUMMING_JAX_MOE_PAIR_TOKENS", raising=False)
  mib = 1 << 20
  mixtral, qwen3, ds = 88 * mib, int(2.36 * mib), int(2.75 * mib)  # int4 g128 zp experts
  assert moe.pair_tiles(1, 2, 8, mixtral) and not moe.pair_tiles(2, 2, 8, mixtral)
  assert moe.pair_tiles(1, 8, 8, 1 << 40)  # one token: always (distinct experts)
  assert moe.pair_tiles(11, 8, 128, qwen3) and not moe.pair_tiles(12, 8, 128, qwen3)
  assert moe.pair_tiles(20, 8, 256, ds) and not moe.pair_tiles(21, 8, 256, ds)
  assert moe.pair_tiles(10, 8, 256, 2 * ds) and not moe.pair_tiles(11, 8, 256, 2 * ds)
  assert moe.pair_tiles(7, 2, 8, mib) and not moe.pair_tiles(8, 2, 8, mib)  # 7 * 2 <= 14
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "0")
  assert not moe.pair_tiles(1, 8, 256, ds)
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "3")
  assert moe.pair_tiles(3, 2, 8, mixtral) and not moe.pair_tiles(4, 8, 256, ds)
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "")  # empty: unset, the rule
  assert moe.pair_tiles(20, 8, 256, ds) and not moe.pair_tiles(21, 8, 256, ds)
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "one")
  with pytest.raises(ValueError, match="HUMMING_JAX_MOE_PAIR_TOKENS='one'"):
    moe.pair_tiles(1, 8, 256, ds)


@pytest.mark.parametrize("tokens,pair_tokens,topk", [(1, None, 2), (3, "3", 2), (9, "9", 1),
                                                     (10, "16", 2)])
def test_quant_moe_pair_tiles_interpret(tokens, pair_tokens, topk, monkeypatch):
  """quant_moe at one token (and, with HUMMING_JAX_MOE_PAIR_TOKENS, at 3 / 9 / 10 tokens of
  6 experts: tokens in slots t % 8 of one or two x tiles; top-1 at 9) runs a tile per pair
  -- not the aligned path -- and matches the XLA path, ids past E and negative ones
  included; with the override at 0 the aligned path runs and gives the same rows."""
  from humming_jax import moe
  monkeypatch.delenv("HUMMING_JAX_MOE_PAIR_TOKENS", raising=False)
  if pair_tokens:
    monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", pair_tokens)
  e, h, inter = 6, 256, 128
  ks = jax.random.split(jax.random.key(33 + tokens), 4)
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  gu = hj.quantize(jax.random.normal(ks[0], (e, h, 2 * inter)) / 16, spec)
  dn = hj.quantize(jax.random.normal(ks[1], (e, inter, h)) / 11, spec)
  x = jax.random.normal(ks[2], (tokens, h), jnp.bfloat16)
  w, ids = moe.topk_routing(jax.random.normal(ks[3], (tokens, e)), topk)
  ids = ids.at[0, topk - 1].set(e + 3)  # contributes nothing
  if tokens > 1:
    ids = ids.at[-1, 0].set(-2)  # nor does a negative id
  calls = []
  for fn in ("run_pairs", "run_aligned"):
    real = getattr(gm, fn)
    monkeypatch.setattr(gm, fn, lambda *a, real=real, fn=fn, **kw: calls.append(fn)
                        or real(*a, **kw))
  layer = lambda *a: hj.quant_moe(*a, backend="interpret")
  y = jax.jit(layer)(gm.prepare(gu), gm.prepare(dn), x, w, ids)
  assert calls == ["run_pairs"] * 2
  want = jax.jit(lambda *a: hj.quant_moe(*a, backend="xla"))(gu, dn, x, w, ids)
  assert y.shape == (tokens, h) and y.dtype == x.dtype
  assert float(jnp.abs(y.astype(jnp.float32)).mean()) > 0
  assert rel(y, want) <= TOL
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "0")
  calls.clear()
  ya = jax.jit(lambda *a: layer(*a))(gm.prepare(gu), gm.prepare(dn), x, w, ids)  # retraced
  assert calls == ["run_aligned"] * 2
  assert rel(y, ya) <= TOL


def test_run_aligned_bad_inputs_are_named():
  q, _ = make("w4a16-g128-zp", 2, 256, 64, 1, False)
  p = gm.prepare(q)
  g = jnp.asarray([8, 8], jnp.int32)
  with pytest.raises(ValueError, match="block_m=12"):
    gm.run_aligned(p, jnp.zeros((24, 256), jnp.bfloat16), g, block_m=12)
  with pytest.raises(ValueError, match="multiple of block_m=8"):
    gm.run_aligned(p, jnp.zeros((20, 256), jnp.bfloat16), g, block_m=8)
  with pytest.raises(ValueError, match="layout"):
    gm.run_aligned(q, jnp.zeros((16, 256), jnp.bfloat16), g, block_m=8)


def test_quant_moe_on_mosaic_params_interpret(monkeypatch):
  """hj.quant_moe with both stacks prepared for this family runs the aligned path (no row
  gather; pair tiles off: these small experts would take them) and matches the same
  layer on the Triton grouped kernel."""
  from humming_jax import moe
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "0")
  calls = []
  real = gm.run_aligned
  monkeypatch.setattr(gm, "run_aligned", lambda *a, **kw: calls.append(1) or real(*a, **kw))
  e, h, inter, t, topk = 4, 256, 128, 5, 2
  ks = jax.random.split(jax.random.key(23), 4)
  spec = hj.QuantSpec.preset("w4a16-mxfp4")
  gu = hj.quantize(jax.random.normal(ks[0], (e, h, 2 * inter)) / 16, spec)
  dn = hj.quantize(jax.random.normal(ks[1], (e, inter, h)) / 11, spec)
  x = jax.random.normal(ks[2], (t, h), jnp.bfloat16)
  w, ids = moe.topk_routing(jax.random.normal(ks[3], (t, e)), topk)
  ids = ids.at[0, 1].set(e + 3)  # an out-of-range id contributes nothing
  # (a fresh function: jax.jit(hj.quant_moe) would reuse another test's trace)
  f = jax.jit(lambda *a, **kw: hj.quant_moe(*a, **kw), static_argnames=("activation", "backend"))
  assert moe._aligned_mosaic(gm.prepare(gu), gm.prepare(dn), x, "interpret")
  y = f(gm.prepare(gu), gm.prepare(dn), x, w, ids, backend="interpret")
  assert calls == [1, 1]
  triton = moe.prepare_experts(gu, dn, kernel="grouped_wna16")
  assert not moe._aligned_mosaic(*triton, x, "interpret")
  want = f(*triton, x, w, ids, backend="interpret")  # the Triton grouped kernel path
  assert y.shape == (t, h) and y.dtype == x.dtype
  assert rel(y, want) <= TOL


@pytest.mark.parametrize("tokens", [1, 64])
def test_quant_moe_aligned_lowers_for_h200(tokens, monkeypatch):
  """Qwen3-30B-A3B (E 128, H 2048, I 768, top-8) through the aligned path (``run`` and its
  row gather are not called): both GEMMs lower for the H200."""
  from test_cuda_lowering import lower_for_h200
  from humming_jax import ops
  monkeypatch.setattr(ops, "on_gpu", lambda: True)  # backend="pallas" as on the H200
  e, h, inter = 128, 2048, 768
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  prep = lambda shape: jax.eval_shape(
      lambda w: gm.prepare(hj.quantize(w, spec)), jax.ShapeDtypeStruct(shape, jnp.float32))
  gu, dn = prep((e, h, 2 * inter)), prep((e, inter, h))
  x = jax.ShapeDtypeStruct((tokens, h), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((tokens, 8), jnp.float32)
  ids = jax.ShapeDtypeStruct((tokens, 8), jnp.int32)
  f = lambda gu, dn, x, w, ids: hj.quant_moe(gu, dn, x, w, ids, backend="pallas")
  def boom(*a, **kw):
    raise AssertionError("quant_moe took the gather path (gm.run)")
  monkeypatch.setattr(gm, "run", boom)
  calls = []
  for fn in ("run_pairs", "run_aligned"):  # one token: a tile per pair
    real = getattr(gm, fn)
    monkeypatch.setattr(gm, fn, lambda *a, real=real, fn=fn, **kw: calls.append(fn)
                        or real(*a, **kw))
  text = lower_for_h200(f, gu, dn, x, w, ids)
  assert text.count("custom_call") >= 2
  assert len(calls) >= 2 and set(calls) == {"run_pairs" if tokens == 1 else "run_aligned"}
  # the aligned tiles' schedule: the Pallas-Triton kernel (pair tiles need none)
  assert ("grouped_tile_schedule" in text) == (tokens > 1)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["kernel", "xla"])  # (session 39: also "barrier")
@pytest.mark.parametrize("tokens", [1, 16, 64])
def test_quant_moe_aligned_gpu(tokens, schedule, monkeypatch):
  """Qwen3-30B-A3B MoE MLP (E 128, H 2048, I 768, top-8) with Mosaic-prepared experts (the
  aligned path, also at one token: pair tiles off; both of run_aligned's schedules)
  against the same layer on the Triton grouped kernel (asked for by name: the default at
  these K is this family since session 16)."""
  from humming_jax import moe
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "0")
  monkeypatch.setenv("HUMMING_JAX_ALIGNED_SCHEDULE", schedule)
  calls = []
  real = gm.schedule
  monkeypatch.setattr(gm, "schedule", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
  e, h, inter = 128, 2048, 768
  ks = jax.random.split(jax.random.key(tokens), 4)
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  gu = jax.jit(lambda w: hj.quantize(w, spec))(jax.random.normal(ks[0], (e, h, 2 * inter)) / 45)
  dn = jax.jit(lambda w: hj.quantize(w, spec))(jax.random.normal(ks[1], (e, inter, h)) / 28)
  x = jax.random.normal(ks[2], (tokens, h), jnp.bfloat16)
  w, ids = moe.topk_routing(jax.random.normal(ks[3], (tokens, e)), 8)
  f = jax.jit(lambda *a: hj.quant_moe(*a))  # a fresh trace: the override is read there
  y = f(jax.jit(gm.prepare)(gu), jax.jit(gm.prepare)(dn), x, w, ids)
  # the schedule kernel for each stack, or none at all with "xla"
  assert len(calls) == (2 if schedule == "kernel" else 0)
  prep = jax.jit(lambda p: hj.prepare(p, grouped=True, kernel="grouped_wna16"))
  want = f(prep(gu), prep(dn), x, w, ids)
  assert rel(y, want) <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
@pytest.mark.parametrize("model,tokens", [("qwen3-30b-a3b", 1), ("deepseek-v3", 1),
                                          ("qwen3-30b-a3b", 8), ("deepseek-v3", 16)])
def test_quant_moe_pair_tiles_gpu(model, tokens, name, monkeypatch):
  """quant_moe's pair tiles on the H200 (Qwen3-30B-A3B and DeepSeek-V3 shapes, top-8, one
  id out of range) against the XLA path: one token, and 8 / 16 tokens (one or two x tiles
  of 8 tokens, experts shared between pairs) where the default rule takes them."""
  from humming_jax import moe
  monkeypatch.delenv("HUMMING_JAX_MOE_PAIR_TOKENS", raising=False)
  e, h, inter = {"qwen3-30b-a3b": (128, 2048, 768), "deepseek-v3": (256, 7168, 256)}[model]
  ks = jax.random.split(jax.random.key(e + tokens), 4)
  spec = hj.QuantSpec.preset(name)
  quant = jax.jit(lambda w: hj.quantize(w, spec))
  gu = quant(jax.random.normal(ks[0], (e, h, 2 * inter)) / np.sqrt(h))
  dn = quant(jax.random.normal(ks[1], (e, inter, h)) / np.sqrt(inter))
  x = jax.random.normal(ks[2], (tokens, h), jnp.bfloat16)
  w, ids = moe.topk_routing(jax.random.normal(ks[3], (tokens, e)), 8)
  ids = ids.at[0, 3].set(-1)
  calls = []
  real = gm.run_pairs
  monkeypatch.setattr(gm, "run_pairs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
  # (a fresh function: jax.jit(hj.quant_moe) would reuse an earlier test's trace)
  y = jax.jit(lambda *a: hj.quant_moe(*a))(jax.jit(gm.prepare)(gu), jax.jit(gm.prepare)(dn),
                                           x, w, ids)
  assert calls == [1, 1]
  want = jax.jit(lambda *a: hj.quant_moe(*a, backend="xla"))(gu, dn, x, w, ids)
  assert bool(jnp.isfinite(y.astype(jnp.float32)).all())
  assert rel(y, want) <= TOL


def abstract_q(name, shape):
  return jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset(name)),
                        jax.ShapeDtypeStruct(shape, jnp.float32))


@pytest.mark.parametrize("shape,family", [
    ((256, 7168, 512), gm.FAMILY),  # DeepSeek-V3 gate_up: K >= 2048
    ((8, 14336, 4096), gm.FAMILY),  # Mixtral down
    ((128, 2048, 1536), gm.FAMILY),  # Qwen3 gate_up (session 15)
    ((128, 768, 2048), gm.FAMILY),  # Qwen3 down: K 768 (session 16, side by side)
    ((256, 256, 7168), gm.FAMILY),  # DeepSeek-V3 down: K 256 (session 34, side by side)
    ((128, 128, 2048), "grouped_wna16"),  # shorter K: one 128-deep K tile
])
def test_default_grouped_family_depends_on_k(shape, family):
  q = abstract_q("w4a16-g128-zp", shape)
  assert registry.find(q.spec, grouped=True, shape=shape).name == family
  assert registry.layout_family(jax.eval_shape(
      lambda q: hj.prepare(q, grouped=True), q).layout) == family
  # Without a shape the spec-level priority stands (the Triton grouped kernel).
  assert registry.find(q.spec, grouped=True).name == "grouped_wna16"
  # A spec the Mosaic kernel cannot run stays on Triton whatever K.
  q3 = abstract_q("w4a16-g128-zp", shape).replace(spec=hj.QuantSpec("int3", "group", 128))
  assert registry.find(q3.spec, grouped=True, shape=shape).name == "grouped_wna16"


def test_prepare_kernel_choice_runs_there():
  """hj.prepare(..., kernel=FAMILY) prepares for that family below the default; the
  ragged dot then runs on it (no re-layout per call) and matches the reference."""
  q, x = make("w4a16-g128-zp", 3, 128, 64, 9, True, seed=31)  # K 128: Triton's by default
  p = hj.prepare(q, grouped=True, kernel=gm.FAMILY)
  assert registry.layout_family(p.layout) == gm.FAMILY
  assert registry.layout_family(hj.prepare(q, grouped=True).layout) == "grouped_wna16"
  g = jnp.asarray([4, 0, 5], jnp.int32)
  y = jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g, backend="interpret"))(p, x, g)
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL
  from humming_jax import ops
  assert ops.kernel_for(p, grouped=True).name == gm.FAMILY


def test_prepare_kernel_choice_errors_name_the_argument():
  q, _ = make("w4a16-g128-zp", 2, 256, 64, 1, False)
  with pytest.raises(ValueError, match=r"kernel='nope'.*grouped_wna16_mgpu"):
    hj.prepare(q, grouped=True, kernel="nope")
  with pytest.raises(ValueError, match="kernel='wna16'.*no grouped"):
    hj.prepare(q, grouped=True, kernel="wna16")  # a dense family for stacked experts
  q3 = hj.quantize(jax.random.normal(jax.random.key(1), (2, 256, 64)),
                   hj.QuantSpec("int3", "group", 128))
  with pytest.raises(ValueError, match="does not run spec"):
    hj.prepare(q3, grouped=True, kernel=gm.FAMILY)


def test_float32_tokens_on_k4096_experts_run_the_triton_kernel():
  """The Mosaic grouped kernel (the default for K >= 256) takes 16-bit tokens only:
  float32 tokens run the Pallas-Triton grouped kernel, whether the params are canonical or
  prepared for the Mosaic kernel (re-laid out inside the call), and match the reference;
  bf16 tokens on the same params stay on the Mosaic kernel."""
  from humming_jax import ops
  q, x = make("w4a16-g128-zp", 2, 4096, 64, 5, True, seed=51, dtype=jnp.float32)
  g = jnp.asarray([3, 1], jnp.int32)
  p = hj.prepare(q, grouped=True)
  assert registry.layout_family(p.layout) == gm.FAMILY
  assert ops.kernel_for(p, grouped=True, x_dtype=jnp.float32).name == "grouped_wna16"
  assert ops.kernel_for(q, grouped=True, x_dtype=jnp.float32).name == "grouped_wna16"
  assert ops.kernel_for(p, grouped=True, x_dtype=jnp.bfloat16).name == gm.FAMILY
  ref = reference.ragged_dot_reference(q, x, g)
  for params in (q, p):
    y = hj.quant_ragged_dot(params, x, g, backend="interpret")
    assert y.dtype == jnp.float32
    assert rel(y[:4], ref[:4]) <= TOL, rel(y[:4], ref[:4])


@pytest.mark.parametrize("h,inter", [
    (7168, 128),  # a K-128 down stack (Triton on its own) joins gate_up on Mosaic
    (4096, 14336),  # Mixtral: both K >= 4096 anyway
    (2048, 768),  # Qwen3-30B-A3B: each on Mosaic on its own too (K >= 256)
])
def test_layer_kernel_puts_both_stacks_on_mosaic(h, inter):
  """moe.prepare_experts: both stacks on the Mosaic grouped kernel (the session-9 layer
  measurements), so quant_moe takes the aligned path; recipes.prepare_params pairs a
  tree's gate_up / down the same way; a lone stack keeps its per-stack default."""
  from humming_jax import moe
  e = 4
  gu, dn = abstract_q("w4a16-g128-zp", (e, h, 2 * inter)), abstract_q("w4a16-g128-zp",
                                                                      (e, inter, h))
  assert moe.layer_kernel(gu, dn) == gm.FAMILY
  pgu, pdn = jax.eval_shape(moe.prepare_experts, gu, dn)
  want = gm.FAMILY
  assert registry.layout_family(pgu.layout) == want
  assert registry.layout_family(pdn.layout) == want
  alone = {"down": dn, "up": gu}  # not a gate_up / down pair: per-stack defaults
  out = jax.eval_shape(lambda t: hj.recipes.prepare_params(t, backend="interpret"), alone)
  for name, q in alone.items():
    assert out[name].layout == jax.eval_shape(lambda q: hj.prepare(q, grouped=True), q).layout
  # The other grouped family on request.
  tgu, tdn = jax.eval_shape(lambda a, b: moe.prepare_experts(a, b, kernel="grouped_wna16"),
                            gu, dn)
  assert {registry.layout_family(p.layout) for p in (tgu, tdn)} == {"grouped_wna16"}
  tree = {"layers_0": {"moe": {"gate_up": gu, "down": dn}, "other": 3}}
  out = jax.eval_shape(lambda t: hj.recipes.prepare_params(t, backend="interpret"), tree)
  assert registry.layout_family(out["layers_0"]["moe"]["down"].layout) == want
  assert registry.layout_family(out["layers_0"]["moe"]["gate_up"].layout) == want
  # An int3 down stack (no Mosaic kernel) leaves each stack on its own default.
  dn3 = dn.replace(spec=hj.QuantSpec("int3", "group", 128))
  assert moe.layer_kernel(gu, dn3) is None
  with pytest.raises(TypeError, match="down_params must be a stacked-expert"):
    moe.prepare_experts(gu, abstract_q("w4a16-g128-zp", (inter, h)))  # not stacked


def test_quant_moe_canonical_stacks_take_the_aligned_path(monkeypatch):
  """Canonical stacks: quant_moe prepares both for the Mosaic kernel inside the call and
  runs the aligned path (traced only, not run; pair tiles off: 3 tokens of these small
  experts would take them)."""
  from humming_jax import moe
  monkeypatch.setenv("HUMMING_JAX_MOE_PAIR_TOKENS", "0")
  e, h, inter, t = 4, 4096, 128, 3
  gu, dn = abstract_q("w4a16-g128-zp", (e, h, 2 * inter)), abstract_q("w4a16-g128-zp",
                                                                      (e, inter, h))
  calls = []
  real = gm.run_aligned
  monkeypatch.setattr(gm, "run_aligned", lambda *a, **kw: calls.append(1) or real(*a, **kw))
  x = jax.ShapeDtypeStruct((t, h), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((t, 2), jnp.float32)
  ids = jax.ShapeDtypeStruct((t, 2), jnp.int32)
  y = jax.eval_shape(lambda *a: hj.quant_moe(*a, backend="interpret"), gu, dn, x, w, ids)
  assert y.shape == (t, h) and calls == [1, 1]


def test_prepare_params_pairs_nnx_stacks_and_honours_float32():
  """An nnx QuantMoE's state (``gate_up`` / ``down`` Params: a trailing ``value`` in the
  tree path) is paired like a linen tree; ``x_dtype=float32`` keeps each stack's own
  default (the Mosaic kernel takes 16-bit tokens)."""
  from flax import nnx
  from humming_jax import nnx as hnnx
  model = hnnx.QuantMoE(256, 4, 2, 128, spec="w4a16-g128-zp", rngs=nnx.Rngs(0))
  state = nnx.state(model)
  is_q = lambda x: isinstance(x, hj.QuantizedWeight)

  def families(tree):
    return {str(path[0].key): registry.layout_family(q.layout)
            for path, q in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_q)[0]
            if is_q(q)}
  assert families(hj.recipes.prepare_params(state, backend="interpret")) == {
      "gate_up": gm.FAMILY, "down": gm.FAMILY}
  assert families(hj.recipes.prepare_params(state, backend="interpret",
                                            x_dtype=jnp.float32)) == {
      "gate_up": "grouped_wna16", "down": "grouped_wna16"}


@pytest.mark.parametrize("m,sizes", [(30, [7, 0, 20, 3]), (300, [90, 0, 200, 10])])
def test_shared_x_tiles_interpret(m, sizes):
  """Two warpgroups splitting N over one shared x tile per slot (split_warpgroups="n"):
  16-row tiles (30 rows) and 96-row tiles (300 rows; block_rows), against the reference."""
  from humming_jax.kernels import wna16_mgpu
  q, x = make("w4a16-g128-zp", 4, 256, 256, m, True, seed=61)
  g = jnp.asarray(sizes, jnp.int32)
  assert gm.block_rows(m, 4) == {30: 16, 300: 96}[m]
  cfg = wna16_mgpu.Config(64, 2, 1, warpgroups=2, scale_after_mma=True, split_warpgroups="n")
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True, config=cfg))(gm.prepare(q), x, g)
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("shape,tokens,topk", [((256, 7168, 512), 1024, 8),
                                               ((8, 4096, 28672), 256, 2)])
def test_shared_x_tiles_gpu(shape, tokens, topk):
  """Four warpgroups sharing each x tile at the MoE benchmark's prefill shapes."""
  from humming_jax import moe
  from humming_jax.kernels import wna16_mgpu
  e, k, n = shape
  q, x = make("w4a16-g128-zp", e, k, n, tokens * topk, False, seed=62)
  _, ids = moe.topk_routing(jax.random.normal(jax.random.key(3), (tokens, e)), topk)
  g = jnp.bincount(ids.reshape(-1), length=e).astype(jnp.int32)
  cfg = wna16_mgpu.shared_x_config(gm.block_rows(tokens * topk, e))
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, config=cfg))(jax.jit(gm.prepare)(q), x, g)
  ref = jax.jit(reference.ragged_dot_reference)(q, x, g)
  e_ = rel(y, ref)
  print(f"shared x {shape} tokens={tokens}: rel err {e_:.2e}")
  assert e_ <= TOL


@pytest.mark.parametrize("name", ["w4a16-nvfp4", "w8a16", "w4a16-g128-zp"])
def test_grid_split_k_interpret(name, mosaic_launches):
  """Narrow experts at decode take grid split-K 2 (grouped_wna16_mgpu.heuristic): float32
  partials per tile, summed by XLA with each row's expert's global scale (NVFP4), column
  scale (per-channel int8) and bias; through run (row gather) and run_aligned."""
  from humming_jax import moe
  e, k, n = 5, 512, 128
  q, x = make(name, e, k, n, 9, True, seed=71)
  g = jnp.asarray([2, 0, 4, 3, 0], jnp.int32)
  assert gm.heuristic(min(e, 9), n, k // 128, gm.block_rows(9, e)).split_k == 2  # 5 x 2 CTAs
  p = gm.prepare(q)
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(p, x, g)
  launches = [kw["out_type"] for kw in mosaic_launches]
  assert launches and launches[-1].shape[0] == 2 and launches[-1].dtype == jnp.float32
  ref = reference.ragged_dot_reference(q, x, g)
  assert rel(y, ref) <= TOL, rel(y, ref)
  ids = jnp.asarray([[0, 2], [3, 2], [2, 0], [3, 2], [3, 0]], jnp.int32)
  r = moe.align_tokens(ids, e, 8)
  xs = jnp.take(x[:5], r.token_of_row, axis=0)
  ya = jax.jit(lambda p, a, g: gm.run_aligned(p, a, g, block_m=8, interpret=True))(
      p, xs, r.group_sizes)
  want = reference.ragged_dot_reference(q, xs, r.group_sizes)
  valid = np.asarray(r.valid)
  assert rel(np.asarray(ya, np.float32)[valid], np.asarray(want, np.float32)[valid]) <= TOL


def test_heuristic_follows_the_session_10_sweep():
  """The launch shapes the H200 sweep chose (NOTES_moe.md session 10), by (tiles, N, K
  tiles, rows per tile): split-K 2 for DeepSeek-V3 gate_up at 1 token, shared x tiles for
  24+-row tiles and for Qwen3's short-K experts at 64 tokens, the K split elsewhere; two
  warpgroups per CTA where four make one to two waves (session 14), small CTAs beyond
  two waves (session 15), and for 16-row launches one warpgroup of four stages (session
  37)."""
  shape = lambda *a: (gm.heuristic(*a).split_warpgroups, gm.heuristic(*a).split_k)
  assert shape(8, 512, 56, 8) == ("k", 2)  # DeepSeek-V3 gate_up, 1 token
  assert shape(8, 1536, 16, 8) == ("k", 1)  # Qwen3 gate_up, 1 token ...
  assert gm.heuristic(8, 1536, 16, 8).warpgroups == 2  # ... 192 CTAs of 4: 2 per CTA
  for name, tile_rows, wgs in (("w4a16-g128-zp", 8, 2), ("w4a16-mxfp4", 8, 2),
                               ("w8a16", 8, 4), ("w4a16-g128-zp", 16, 4)):
    spec = hj.QuantSpec.preset(name)  # two such CTAs must fit one SM's shared memory
    q = jax.eval_shape(lambda w: hj.quantize(w, spec),
                       jax.ShapeDtypeStruct((128, 2048, 1536), jnp.float32))
    p = jax.eval_shape(lambda q: hj.prepare(q, grouped=True, kernel=gm.FAMILY), q)
    cfg = gm.heuristic(8, 1536, 16, 8, params=p, tile_rows=tile_rows)
    assert cfg.warpgroups == wgs, (name, tile_rows)
  assert gm.heuristic(8, 512, 56, 8).warpgroups == 4  # 64 CTAs (DeepSeek-V3 gate_up)
  # More than two waves (session 15): three or more small CTAs per SM -- two warpgroups of
  # two stages on an even K-step count (of 16+ for run()'s 16-row tiles, session 33), else
  # one of four; a launch where three do not fit keeps the rules above.
  small = lambda c: (c.split_warpgroups, c.split_k, c.warpgroups, c.stages)
  assert small(gm.heuristic(219, 512, 56, 8)) == ("k", 1, 2, 2)  # DeepSeek-V3 gate_up, 64
  assert small(gm.heuristic(101, 512, 56, 8)) == ("k", 1, 2, 2)  # ... 16 tokens
  assert small(gm.heuristic(219, 7168, 2, 8)) == ("k", 1, 1, 4)  # DeepSeek-V3 down: 1 step
  sixteen = lambda k_tiles: small(gm.heuristic(128, 1536, k_tiles, 8, tile_rows=16))
  assert sixteen(16) == ("k", 1, 1, 4)  # Qwen3 gate_up, 64 tokens: 8 steps
  assert sixteen(28) == ("k", 1, 1, 4)  # (K 3584: 14 steps)
  assert sixteen(32) == ("k", 1, 2, 2)  # (K 4096: 16 steps)
  assert small(gm.heuristic(128, 1536, 16, 8)) == ("k", 1, 2, 2)  # 8-row tiles (aligned)
  # Qwen3 down: 3 K steps (run_aligned's tiles, not streamed: K 768 is, session 37)
  assert small(gm.heuristic(128, 2048, 6, 8, streamed=False)) == ("k", 1, 1, 4)
  # (K 4096: 16 steps, where two warpgroups may run; w8a16 at Qwen3's K 2048)
  for name, tile_rows, k, want in (("w4a16-g128-zp", 16, 4096, (2, 2)),
                                   ("w4a16-mxfp4", 8, 4096, (2, 2)),
                                   ("w4a16-mxfp4", 8, 2048, (2, 2)),
                                   ("w4a16-mxfp4", 16, 4096, (1, 4)),
                                   ("w4a16-g128-zp", 16, 2048, (1, 4)),
                                   ("w8a16", 8, 2048, (4, 4))):
    spec = hj.QuantSpec.preset(name)
    q = jax.eval_shape(lambda w: hj.quantize(w, spec),
                       jax.ShapeDtypeStruct((128, k, 1536), jnp.float32))
    p = jax.eval_shape(lambda q: hj.prepare(q, grouped=True, kernel=gm.FAMILY), q)
    cfg = gm.heuristic(128, 1536, k // 128, 8, params=p, tile_rows=tile_rows)
    assert (cfg.warpgroups, cfg.stages) == want, (name, tile_rows)
    if name == "w8a16":  # three do not fit: the shared-x rule
      assert cfg.split_warpgroups == "n"
  # 16-row launches (~5-8 rows per expert) on the small CTA of one warpgroup, not four
  # shared-x warpgroups (session 37)
  sixteen_rows = lambda *a: small(gm.heuristic(*a, 16, tile_rows=16))
  assert sixteen_rows(256, 512, 56) == ("k", 1, 1, 4)  # DeepSeek-V3 gate_up, 192-256 tokens
  assert sixteen_rows(128, 1536, 16) == ("k", 1, 1, 4)  # Qwen3 gate_up, 128 tokens
  assert sixteen_rows(8, 28672, 32) == ("k", 1, 1, 4)  # Mixtral gate_up, 32 tokens
  assert sixteen_rows(8, 4096, 112) == ("k", 1, 1, 4)  # Mixtral down, 32 tokens
  # ... else the shared-x launch as before: two waves or fewer (8 experts x 8 column
  # blocks), or three small CTAs not fitting an SM (W8A16's 16-row tiles)
  assert gm.heuristic(8, 512, 56, 16) == wna16_mgpu.shared_x_config(16)
  from test_cuda_lowering import abstract_params
  w8 = abstract_params("w8a16", (256, 7168, 512), grouped=True, kernel=gm.FAMILY)
  assert gm.heuristic(256, 512, 56, 16, params=w8, tile_rows=16) == \
      wna16_mgpu.shared_x_config(16)
  assert shape(256, 512, 56, 24) == ("n", 1)  # DeepSeek-V3 gate_up, 512 tokens
  assert shape(256, 512, 56, 48) == ("n", 1)  # DeepSeek-V3 gate_up, 1024 tokens
  cfg = gm.heuristic(8, 28672, 32, 128)  # Mixtral gate_up, 1024 tokens
  assert (cfg.split_warpgroups, cfg.warpgroups, cfg.scale_after_mma) == ("n", 4, False)


def test_cost_sized_tiles_launch(monkeypatch):
  """4-bit weights on the 16-bit MMA (session 32): tiles of 24+ rows take the rows of least
  expected cost (Qwen3-30B-A3B gate_up, 1024 tokens: 88 where block_rows says 80; 256
  tokens: 32 for 24; DeepSeek-V3 1024 tokens: 48 either way) and run on two-warpgroup
  shared-x CTAs with the most stages for which two fit an SM, where four-warpgroup CTAs
  would make more than two waves; W8A16, decode tiles and one-wave launches (rows and
  launch) keep theirs."""
  monkeypatch.setattr(gm.tuning, "num_sms", lambda: 132)
  shapes = abstract_stack
  for name in ("w4a16-g128-zp", "w4a16-mxfp4", "w4a16-nvfp4"):
    p = shapes(name, 128, 2048, 1536)
    assert gm.cost_sized_tiles(p)
    assert (gm.block_rows(8192, 128), gm.tile_rows(8192, 128, p)) == (80, 88)
    assert (gm.block_rows(2048, 128), gm.tile_rows(2048, 128, p)) == (24, 32)
    assert gm.tile_rows(512, 128, p) == 16  # decode tiles unchanged
    assert gm.tile_rows(8192, 256, shapes(name, 256, 7168, 512)) == 48
    cfg = gm.default_launch(8192, p, 88)  # 128 experts x 6 CTAs of four: ~6 waves
    assert (cfg.warpgroups, cfg.stages, cfg.split_warpgroups, cfg.scale_after_mma,
            cfg.block_m) == (2, 2, "n", False, 88), name  # (3 stages: one CTA per SM)
    assert gm.default_launch(2048, p, 32).warpgroups == 2
  # block_rows' rows where the model's would run on four (its fallback: Qwen3 gate_up at
  # ~1227 tokens, 96 rows against 104) keep the launch of before; other explicit rows of
  # 24+ take the two- or four-warpgroup choice
  assert (gm.block_rows(9816, 128), gm.cheapest_tile_rows(9816, 128, gm.BF16_BLOCK_MS),
          gm.cost_sized_rows(9816, p), gm.tile_rows(9816, 128, p)) == (96, 104, None, 96)
  assert gm.default_launch(9816, p, 96) == gm.heuristic(128, 1536, 16, 96, params=p,
                                                        tile_rows=96)
  assert gm.default_launch(9816, p, 96).warpgroups == 4
  assert gm.default_launch(8192, p, 80).warpgroups == 2
  # only run()'s default launch: run_aligned's (no cost_sized) and 16-row tiles keep theirs
  assert gm.heuristic(128, 1536, 16, 80, params=p, tile_rows=80).warpgroups == 4
  assert gm.default_launch(8192, p, 16).warpgroups == 4
  # Mixtral down: 8 x 16 CTAs, one wave of four warpgroups, so the rows of before too
  # (32 / 88 rows on four lost, session 33); gate_up (8 x 112 CTAs) takes the rule
  mixtral_down = shapes("w4a16-g128-zp", 8, 14336, 4096)
  assert gm.default_launch(512, mixtral_down, 88).warpgroups == 4
  assert gm.cost_sized_rows(512, mixtral_down) is None
  assert [gm.tile_rows(m, 8, mixtral_down) for m in (128, 512)] == [24, 80]
  assert gm.default_launch(512, mixtral_down, 80) == gm.heuristic(8, 4096, 112, 80,
                                                                   params=mixtral_down)
  mixtral_gate_up = shapes("w4a16-g128-zp", 8, 4096, 28672)
  assert [gm.tile_rows(m, 8, mixtral_gate_up) for m in (128, 512)] == [32, 88]
  assert gm.default_launch(512, mixtral_gate_up, 88).warpgroups == 2
  w8 = shapes("w8a16", 128, 2048, 1536)
  assert not gm.cost_sized_tiles(w8) and gm.tile_rows(8192, 128, w8) == 80
  assert gm.default_launch(8192, w8, 80).warpgroups == 4
  # the stages two CTAs of 88 rows can share an SM with; none: four warpgroups
  p = shapes("w4a16-g128-zp", 128, 2048, 1536)
  monkeypatch.setattr(gm.tuning, "SM_SMEM_BYTES", 2 * (gm.wna16_mgpu.smem_bytes(
      88, 3, 1, 128, 4, True, warpgroups=2, scale_rows=1, share_x=True) + 1024))
  assert gm.default_launch(8192, p, 88).stages == 3
  monkeypatch.setattr(gm.tuning, "SM_SMEM_BYTES", 1000)
  assert gm.default_launch(8192, p, 88).warpgroups == 4


def test_cost_sized_tiles_interpret(monkeypatch, grouped_launches):
  """The default path on such tiles against the reference (one SM, so the two-warpgroup
  launch is taken; uneven and empty experts, a zero tail): run() launches the cost
  model's rows (32 here, where block_rows says 24) with or without an explicit config,
  block_rows' with HUMMING_JAX_COST_TILES=0."""
  monkeypatch.setattr(gm.tuning, "num_sms", lambda: 1)
  gs = [20, 0, 17]
  q, x = make("w4a16-g128-zp", 3, 256, 128, 44, True, seed=92)
  g = jnp.asarray(gs, jnp.int32)
  p = gm.prepare(q)
  assert (gm.block_rows(44, 3), gm.tile_rows(44, 3, p)) == (24, 32)
  launched, real_run = [], gm.wna16_mgpu.run
  monkeypatch.setattr(gm.wna16_mgpu, "run", lambda *a, **kw: launched.append(
      kw["tiles"].block_m) or real_run(*a, **kw))
  ref = reference.ragged_dot_reference(q, x, g)
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(p, x, g)
  assert launched == [32] and [(c.warpgroups, c.split_warpgroups, c.block_m)
                               for c in grouped_launches] == [(2, "n", 64)]
  assert rel(y, ref) <= TOL and not bool(jnp.any(y[sum(gs):] != 0))
  cfg = gm.wna16_mgpu.shared_x_config(32, warpgroups=2)
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True, config=cfg))(p, x, g)
  assert launched[1:] == [32] and rel(y, ref) <= TOL
  monkeypatch.setenv("HUMMING_JAX_COST_TILES", "0")
  grouped_launches.clear()
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(p, x, g)
  assert launched[2:] == [24] and [c.warpgroups for c in grouped_launches] == [4]
  assert rel(y, ref) <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("name,e,k,n", [("w4a16-g128-zp", 128, 2048, 1536),
                                        ("w4a16-mxfp4", 128, 2048, 1536),
                                        ("w4a16-mxfp4", 256, 7168, 512)])
def test_cost_sized_tiles_default_gpu(name, e, k, n, grouped_launches):
  """The default launch of 1024 tokens top-8 on the H200 (session 32's rule): Qwen3-30B-A3B
  gate_up in 88-row tiles on two warpgroups of two stages (the fp4 scale fold on), and
  DeepSeek-V3 gate_up in 48-row tiles on two warpgroups; within the tolerance of the
  reference (printed)."""
  err, p = routed_error(name, e, k, n, 1024, 91, gm.prepare, gm.run)
  rows = 88 if e == 128 else 48
  assert grouped_launches and all((c.warpgroups, c.block_m) == (2, max(64, rows))
                                  for c in grouped_launches), grouped_launches
  print(f"cost-sized tiles {name} E={e}: rel err {err:.2e}")
  assert err <= TOL


def test_wide_tiles_rule(monkeypatch):
  """Capped experts (block_rows 128: ~105+ rows each) of cost-sized params past 128 rows
  where HUMMING_JAX_WIDE_TILES is on (session 67, the default): Mixtral at 512 / 1024 /
  4096 tokens take 160 / 144 / 152 rows on four shared-x warpgroups with the scales before
  the MMA (one accumulator); uncapped experts and W8A16 keep theirs; off, 128."""
  monkeypatch.setattr(gm.tuning, "num_sms", lambda: 132)
  shapes = abstract_stack
  for name in ("w4a16-g128-zp", "w4a16-mxfp4", "w4a16-nvfp4"):
    p = shapes(name, 8, 4096, 28672)
    monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
    assert gm.wide_tiles(p) and gm.widest_rows(p) == 160
    assert [gm.tile_rows(m, 8, p) for m in (1024, 2048, 8192)] == [160, 144, 152], name
    assert gm.tile_rows(512, 8, p) == 88  # 256 tokens, 64 rows per expert: not capped
    cfg = gm.default_launch(2048, p, 144)
    assert (cfg.warpgroups, cfg.split_warpgroups, cfg.scale_after_mma, cfg.block_m) == (
        4, "n", False, 144), cfg
    assert gm.tile_rows(8192, 256, shapes(name, 256, 7168, 512)) == 48
    monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "0")
    assert not gm.wide_tiles(p) and gm.widest_rows(p) == gm.MAX_BLOCK_M
    assert [gm.tile_rows(m, 8, p) for m in (1024, 2048, 8192)] == [128] * 3
    monkeypatch.delenv("HUMMING_JAX_WIDE_TILES")  # unset: WIDE_TILES, on since session 67
    assert gm.wide_tiles(p) and gm.WIDE_TILES is True and gm.tile_rows(2048, 8, p) == 144
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
  w8 = shapes("w8a16", 8, 4096, 28672)
  assert not gm.wide_tiles(w8) and gm.tile_rows(2048, 8, w8) == gm.MAX_BLOCK_M
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "2")
  with pytest.raises(ValueError, match="HUMMING_JAX_WIDE_TILES='2'"):
    gm.wide_tiles(shapes("w4a16-g128-zp", 8, 4096, 28672))


def test_wide_tiles_interpret(monkeypatch):
  """Tiles past 128 rows on the 16-bit route with the scales on the weights before the MMA
  (one accumulator): an explicit 144-row config on two warpgroups and the default path of
  wide_tiles (160 rows on four), against the reference; a two-accumulator config (scales
  after the MMA) is refused past 128 rows, and an explicit such config takes at most
  128-row tiles by default."""
  gs = [290, 0, 150]  # an expert over two tiles; a zero tail
  m = sum(gs) + 5
  g = jnp.asarray(gs, jnp.int32)
  two_acc = wna16_mgpu.shared_x_config(144, warpgroups=2)
  assert two_acc.scale_after_mma
  launched, real_run = [], gm.wna16_mgpu.run
  monkeypatch.setattr(gm.wna16_mgpu, "run", lambda *a, **kw: launched.append(
      (kw["tiles"].block_m, kw["config"])) or real_run(*a, **kw))
  for name in ("w4a16-mxfp4", "w4a16-g128-zp"):
    q, x = make(name, 3, 256, 256, m, True, seed=67)
    p = gm.prepare(q)
    ref = reference.ragged_dot_reference(q, x, g)
    cfg = dataclasses.replace(two_acc, scale_after_mma=False)
    monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "0")
    y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True, config=cfg,
                                       block_m=144))(p, x, g)
    assert rel(y[:440], ref[:440]) <= TOL, (name, rel(y[:440], ref[:440]))
    assert not bool(jnp.any(y[440:] != 0))
    with pytest.raises(ValueError, match=r"block_m=144 must be .* \[8, 128\]"):
      gm.run(p, x, g, config=two_acc, block_m=144)
    monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
    assert gm.tile_rows(m, 3, p) == 160  # 147 rows per active expert: capped
    launched.clear()
    y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(p, x, g)
    assert [(bm, c.warpgroups, c.scale_after_mma) for bm, c in launched] == [
        (160, 4, False)], name
    assert rel(y[:440], ref[:440]) <= TOL and not bool(jnp.any(y[440:] != 0)), name
  jax.eval_shape(lambda p, x, g: gm.run(p, x, g, config=two_acc), p, x, g)
  assert launched[-1][0] == gm.MAX_BLOCK_M  # the explicit two-accumulator launch: 128
  with pytest.raises(ValueError, match=r"block_m=168 must be .* \[8, 160\]"):
    gm.run(p, x, g, block_m=168)


def test_wide_tiles_aligned_interpret(monkeypatch):
  """hj.quant_moe's aligned segments take the wide rows too (aligned_tile_rows: 160 for
  two experts of ~150 rows; 128 with the switch off or where one stack is 8-bit), and
  run_aligned's default launch on them (four shared-x warpgroups, one accumulator)
  matches the reference on the routed rows."""
  from humming_jax import moe
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
  e, k, n, t = 2, 256, 256, 300
  q, _ = make("w4a16-g128-zp", e, k, n, 1, True, seed=70)
  p = gm.prepare(q)
  w8 = gm.prepare(make("w8a16", e, k, n, 1, False, seed=71)[0])
  assert gm.block_rows(t, e) == gm.MAX_BLOCK_M
  assert gm.aligned_tile_rows(t, e, p, p) == 160
  assert gm.aligned_tile_rows(t, e, p, w8) == gm.aligned_tile_rows(t, e) == gm.MAX_BLOCK_M
  ids = jax.random.randint(jax.random.key(72), (t, 1), 0, e)
  r = moe.align_tokens(ids, e, 160)
  x = jax.random.normal(jax.random.key(73), (t, k), jnp.bfloat16)
  xs = jnp.take(x, r.token_of_row, axis=0)
  launched, real_run = [], gm.wna16_mgpu.run
  monkeypatch.setattr(gm.wna16_mgpu, "run", lambda *a, **kw: launched.append(
      (kw["tiles"].block_m, kw["config"])) or real_run(*a, **kw))
  y = jax.jit(lambda p, a, g: gm.run_aligned(p, a, g, block_m=160, interpret=True))(
      p, xs, r.group_sizes)
  assert [(bm, c.warpgroups, c.scale_after_mma) for bm, c in launched] == [(160, 4, False)]
  valid = np.asarray(r.valid)
  want = reference.ragged_dot_reference(q, xs, r.group_sizes)
  assert rel(np.asarray(y, np.float32)[valid], np.asarray(want, np.float32)[valid]) <= TOL
  # quant_moe's forward asks aligned_tile_rows for both stacks' rows
  asked = []
  real_rows = gm.aligned_tile_rows
  monkeypatch.setattr(gm, "aligned_tile_rows", lambda *a: asked.append(
      [(s.shape, s.layout) for s in a[2:]]) or real_rows(*a))
  gu = hj.quantize(normal(jax.random.key(74), (e, k, 2 * n)) / 16,
                   hj.QuantSpec.preset("w4a16-g128-zp"))
  dn = hj.quantize(normal(jax.random.key(75), (e, n, k)) / 16,
                   hj.QuantSpec.preset("w4a16-g128-zp"))
  pgu, pdn = moe.prepare_experts(gu, dn)
  w, top = moe.topk_routing(normal(jax.random.key(76), (t, e)), 1)
  launched.clear()
  jax.eval_shape(lambda *a: hj.quant_moe(*a, backend="interpret"), pgu, pdn, x, w, top)
  assert asked == [[(s.shape, s.layout) for s in (pgu, pdn)]]
  assert [bm for bm, _ in launched] == [160, 160]  # gate_up and down


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4", "w4a16-nvfp4"])
@pytest.mark.parametrize("tokens,rows", [(1024, 144), (512, 160), (4096, 152)])
def test_wide_tiles_gpu(name, tokens, rows, monkeypatch, grouped_launches):
  """Mixtral-like experts (E=8, K=4096, top-2; N cut to 2048) on wide_tiles' default launch
  (four shared-x warpgroups, one accumulator, 144 / 160 / 152-row tiles) against the
  reference (printed), and the same tiles on two warpgroups (another program, the same
  sums per column: within 1e-3 of it)."""
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
  e, k, n = 8, 4096, 2048
  q, _ = make(name, e, k, n, 1, True, seed=68)
  g, x = routed_rows(e, k, tokens, seed=69, topk=2)
  p = jax.jit(gm.prepare)(q)
  y = jax.jit(gm.run)(p, x, g)
  assert [(c.warpgroups, c.scale_after_mma) for c in grouped_launches] == [(4, False)]
  assert gm.tile_rows(tokens * 2, e, p) == rows
  cfg = dataclasses.replace(wna16_mgpu.shared_x_config(rows, warpgroups=2),
                            scale_after_mma=False)
  two = jax.jit(lambda p, x, g: gm.run(p, x, g, config=cfg, block_m=rows))(p, x, g)
  err = rel(y, jax.jit(reference.ragged_dot_reference)(q, x, g))
  print(f"wide tiles {name} {tokens} tokens ({rows} rows): rel err {err:.2e}, "
        f"against two warpgroups {rel(y, two):.1e}")
  assert err <= TOL and rel(y, two) <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-nvfp4", "w8a16"])
def test_deepseek_decode_split_k_gpu(name):
  """DeepSeek-V3 gate_up (E=256, K=7168, N=512), one token's 8 rows: the split-K default."""
  e, k, n = 256, 7168, 512
  q, _ = make(name, e, k, n, 1, True, seed=72)
  ids = jax.random.choice(jax.random.key(73), e, (8,), replace=False)
  g = jnp.bincount(ids, length=e).astype(jnp.int32)
  x = jax.random.normal(jax.random.key(74), (8, k), jnp.bfloat16)
  assert gm.heuristic(8, n, k // 128, gm.block_rows(8, e)).split_k == 2  # 56 K tiles
  y = jax.jit(gm.run)(jax.jit(gm.prepare)(q), x, g)
  e_ = rel(y, jax.jit(reference.ragged_dot_reference)(q, x, g))
  print(f"split-K decode {name}: rel err {e_:.2e}")
  assert e_ <= TOL


COLUMN_BLOCK_CASES = [  # (preset, launch fields, E, K, N, group sizes, bias, column blocks)
    # the decode launch at DeepSeek-V3 down's K (one pipeline step per column block)
    ("w4a16-g128-zp", dict(block_m=64, substeps=2, scale_after_mma=True, overlap_mma=True),
     4, 256, 512, [3, 0, 9, 1], True, 4),
    # ":sf" MXFP4: each block's fold bases, read before its K loop
    ("w4a16-mxfp4", dict(block_m=64, substeps=2, scale_after_mma=True), 3, 256, 384,
     [1, 5, 0], False, 3),
    # two shared-x warpgroups: global scale and bias rows per block, the output tiles'
    # release between blocks (o_free)
    ("w4a16-nvfp4", dict(block_m=64, warpgroups=2, split_warpgroups="n",
                         scale_after_mma=True), 3, 256, 512, [7, 0, 20], True, 2),
    # two warpgroups splitting K: the partials' release between blocks (red_free); the
    # column scale an epilogue row
    ("w8a16", dict(block_m=64, warpgroups=2, scale_after_mma=True), 2, 512, 256, [5, 4],
     True, 4),
]


@pytest.mark.parametrize("case", COLUMN_BLOCK_CASES, ids=lambda c: c[0])
def test_column_blocks_interpret(case, mosaic_launches):
  """MgpuConfig.column_blocks: each CTA streams R column blocks through one pipeline.  The
  outputs equal the one-block launch's bit for bit (the same products per block) and the
  grid has R times fewer column CTAs."""
  name, fields, e, k, n, sizes, bias, blocks = case
  g = jnp.asarray(sizes, jnp.int32)
  q, x = make(name, e, k, n, int(g.sum()) + 3, bias, seed=81)  # + 3 rows past the groups
  p = gm.prepare(q)
  one = wna16_mgpu.Config(**fields)
  ys = [np.asarray(jax.jit(lambda p, x, g, c=c: gm.run(p, x, g, interpret=True, config=c))(
      p, x, g), np.float32) for c in (one, dataclasses.replace(one, column_blocks=blocks))]
  grids = [kw["grid"] for kw in mosaic_launches]
  assert grids[-2][0] == blocks * grids[-1][0], grids  # (the last two: one, then R blocks)
  np.testing.assert_array_equal(ys[1], ys[0])
  assert rel(ys[1], reference.ragged_dot_reference(q, x, g)) <= TOL
  assert not ys[1][int(g.sum()):].any()  # rows past sum(group_sizes): zeros


def test_column_blocks_errors_name_the_field():
  with pytest.raises(ValueError, match="column_blocks=0"):
    wna16_mgpu.Config(column_blocks=0)
  with pytest.raises(ValueError, match="column_blocks=2 with cluster_n=2"):
    wna16_mgpu.Config(column_blocks=2, cluster_n=2, split_warpgroups="n")


# Launches with several warpgroups and column blocks (by name): four shared-x warpgroups
# (the output tiles released between blocks through o_free) and two warpgroups splitting
# K's two steps (their partials released through red_free).
WARPGROUP_LAUNCHES = {
    "xn4": dict(warpgroups=4, split_warpgroups="n", substeps=1, scale_after_mma=True),
    "k2": dict(warpgroups=2, substeps=1, scale_after_mma=True),
}


def warpgroup_launch(name: str) -> wna16_mgpu.Config:
  return wna16_mgpu.Config(block_m=64, stages=4, **WARPGROUP_LAUNCHES[name])


@pytest.mark.parametrize("tokens,launch", [(1, "default"), (256, "default"), (256, "xn4"),
                                           (64, "k2")])
def test_column_blocks_lower_for_h200(tokens, launch):
  """DeepSeek-V3 down (E 256, K 256, N 7168) with four column blocks per CTA: on the
  default launch's shape (the decode launch at 1 token, one shared-x warpgroup at 256)
  and on the two multi-warpgroup launches."""
  from test_cuda_lowering import abstract_params, lower_for_h200
  e, k, n = 256, 256, 7168
  p = abstract_params("w4a16-g128-zp", (e, k, n), grouped=True, kernel=gm.FAMILY)
  m = tokens * 8
  block_m = gm.tile_rows(m, e, p)
  base = (gm.default_launch(m, p, block_m) if launch == "default"
          else warpgroup_launch(launch))
  cfg = dataclasses.replace(base, column_blocks=4)
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((e,), jnp.int32)
  text = lower_for_h200(lambda p, x, g: gm.run(p, x, g, config=cfg, block_m=block_m), p, x, g)
  assert "custom_call" in text


def _column_blocks_equal_one_block(name, tokens, base, blocks):
  """DeepSeek-V3 down on the H200: ``base`` (a launch; ``column_blocks`` replaced) with
  ``blocks`` column blocks per CTA equals it with one, bit for bit, within TOL of the
  reference."""
  e, k, n = 256, 256, 7168
  q, _ = make(name, e, k, n, 1, False, seed=83)
  g, x = routed_rows(e, k, tokens, seed=84)
  p = jax.jit(gm.prepare)(q)
  block_m = gm.tile_rows(x.shape[0], e, p)
  base = base(x.shape[0], p, block_m)
  run = jax.jit(lambda p, x, g, c: gm.run(p, x, g, config=c, block_m=block_m),
                static_argnums=3)
  y1 = np.asarray(run(p, x, g, dataclasses.replace(base, column_blocks=1)), np.float32)
  yr = np.asarray(run(p, x, g, dataclasses.replace(base, column_blocks=blocks)), np.float32)
  np.testing.assert_array_equal(yr, y1)
  assert rel(yr, jax.jit(reference.ragged_dot_reference)(q, x, g)) <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [2, 4, 7])
@pytest.mark.parametrize("tokens", [1, 64, 256, 1024])
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_column_blocks_gpu(name, tokens, blocks):
  """The default launch's shape (now streamed) with 2 / 4 / 7 column blocks against one."""
  _column_blocks_equal_one_block(name, tokens, gm.default_launch, blocks)


@pytest.mark.gpu
@pytest.mark.parametrize("launch,tokens", [("xn4", 256), ("k2", 64)])
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_column_blocks_warpgroups_gpu(name, launch, tokens):
  """Four column blocks on four shared-x warpgroups (o_free) and on two warpgroups
  splitting K (red_free), against one block."""
  _column_blocks_equal_one_block(name, tokens, lambda *_: warpgroup_launch(launch), 4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,tokens,launch", [
    ((256, 7168, 512), 256, (1, 4, 1)),  # DeepSeek-V3 gate_up: the 16-row launch
    ((128, 2048, 1536), 128, (1, 4, 1)),  # Qwen3-30B-A3B gate_up: the 16-row launch
    ((128, 768, 2048), 128, (1, 4, 2)),  # Qwen3-30B-A3B down: K 768 streamed, 16 rows
    ((128, 768, 2048), 256, (1, 4, 2))])  # ... 32-row tiles
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_session37_launches_gpu(name, shape, tokens, launch):
  """The launches session 37 made the defaults (heuristic: 16-row launches on one
  warpgroup of four stages; K <= 768 streamed), on the H200 against the reference: the
  launch default_launch gives for the shape (what run() takes without a config)."""
  e, k, n = shape
  err, p = routed_error(name, e, k, n, tokens, 87, gm.prepare, gm.run)
  m = tokens * 8
  cfg = gm.default_launch(m, p, gm.tile_rows(m, e, p))
  assert (cfg.warpgroups, cfg.stages, cfg.column_blocks) == launch
  assert err <= TOL


def test_streamed_launch_is_run_s_not_run_aligned_s(monkeypatch, mosaic_launches):
  """The short-expert rule streams column blocks in run()'s tiles; run_aligned
  (``hj.quant_moe``, untimed with it) keeps one block per CTA.  (With one SM, 4 experts'
  8 column blocks make the 8 CTAs per SM the rule wants at 4 blocks.)"""
  from humming_jax import moe
  monkeypatch.setattr(tuning, "num_sms", lambda: 1)
  assert gm.streamed_blocks(4, 512) == 4
  q, x = make("w4a16-g128-zp", 4, 256, 512, 40, False, seed=85)
  g = jnp.asarray([10, 0, 25, 5], jnp.int32)
  p = gm.prepare(q)
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, interpret=True))(p, x, g)
  assert mosaic_launches[-1]["grid"][0] == 512 // 64 // 4  # 8 column blocks, 4 per CTA
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL
  ids = jax.random.randint(jax.random.key(86), (20, 2), 0, 4)
  r = moe.align_tokens(ids, 4, 8)
  xs = jnp.take(x[:20], r.token_of_row, axis=0)
  ya = jax.jit(lambda p, a, g: gm.run_aligned(p, a, g, block_m=8, interpret=True))(
      p, xs, r.group_sizes)
  assert mosaic_launches[-1]["grid"][0] == 512 // 64  # one block per CTA
  valid = np.asarray(r.valid)
  want = reference.ragged_dot_reference(q, xs, r.group_sizes)
  assert rel(np.asarray(ya, np.float32)[valid], np.asarray(want, np.float32)[valid]) <= TOL


def test_short_experts_stream_column_blocks():
  """K <= 768 experts (DeepSeek-V3 down: 2 K tiles, Qwen3 down: 6) on the 16-bit route take one
  warpgroup streaming up to eight column blocks per CTA (H200 session 35), while that
  leaves eight CTAs per SM; longer K, few tiles and the fp8-MMA layout keep one block."""
  sms = tuning.num_sms()
  launch = lambda tiles, k_tiles, rows, **kw: gm.heuristic(tiles, 7168, k_tiles, rows, **kw)
  for tiles, rows, split in ((219, 8, "k"), (256, 16, "n"), (256, 48, "n")):  # 64/256/1024
    cfg = launch(tiles, 2, rows)
    assert (cfg.column_blocks, cfg.warpgroups, cfg.stages, cfg.split_warpgroups) == (
        8, 1, 4, split), (tiles, rows)
  assert launch(219, 2, 8).substeps == 2  # the decode launch: both K tiles in one step
  assert launch(8, 2, 8).column_blocks == 1  # 1 token: 896 column blocks, < 8 per SM
  qwen3_down = lambda k_tiles: gm.heuristic(128, 2048, k_tiles, 8).column_blocks
  assert qwen3_down(6) == 2  # K 768 (Qwen3-30B-A3B down, 16-64 tokens; session 37)
  assert qwen3_down(8) == 1  # K 1024: untimed
  assert launch(256, 2, 128).column_blocks == 1  # 4096 tokens, 128-row tiles: lost 3 %
  assert gm.streamed_blocks(8, 7168) == 1
  # one tile per SM has 112 column blocks per SM: 8 blocks leave 14 CTAs per SM, 4 at
  # half the tiles 14, at an eighth of them even 2 blocks leave ~7 (< 8): none
  assert gm.streamed_blocks(sms, 7168) == 8 and gm.streamed_blocks(sms // 2, 7168) == 4
  assert gm.streamed_blocks(sms // 8, 7168) == 1
  spec = hj.QuantSpec.preset("w4a16-mxfp4")  # on the fp8-MMA layout: its own launches
  q = jax.eval_shape(lambda w: hj.quantize(w, spec),
                     jax.ShapeDtypeStruct((256, 256, 7168), jnp.float32))
  p = jax.eval_shape(lambda q: gm.prepare(q, mma="fp8"), q)
  assert launch(219, 2, 8, params=p).column_blocks == 1


def test_decode_tiles_take_mma_sync(monkeypatch):
  """Session 57's rule (``heuristic``, ``MMA_SYNC_TILE_ROWS`` / ``MMA_SYNC_MAX_K_TILES``):
  8-row tiles of int4 / MXFP4 experts whose warpgroups stream at most 16 K tiles take the
  product on mma.sync on whichever launch the shape gives (streamed column blocks, the
  small CTAs, two warpgroups, pairs); longer K per warpgroup, 16-row tiles, NVFP4, 8-bit
  experts and HUMMING_JAX_MMA_SYNC=0 keep the WGMMA.  The interpreter accepts the
  flag (it runs the WGMMA form of the same sums): the default launch against the
  reference."""
  from test_cuda_lowering import abstract_params
  monkeypatch.delenv("HUMMING_JAX_MMA_SYNC", raising=False)
  monkeypatch.setattr(gm.tuning, "num_sms", lambda: 132)
  # the six benchmark shapes (E, K, N) at one token (8-row tiles): K tiles per warpgroup of
  # the default launch, and whether it takes mma.sync (Mixtral down's 28: not)
  shapes = {(256, 256, 7168): (2, True), (256, 7168, 512): (14, True),
            (128, 768, 2048): (2, True), (128, 2048, 1536): (8, True),
            (8, 4096, 28672): (16, True), (8, 14336, 4096): (28, False)}
  pairs = {(256, 256, 7168): ((2, True), (2, True)), (256, 7168, 512): ((14, True), (28, False)),
           (128, 768, 2048): ((2, True), (6, True)), (128, 2048, 1536): ((8, True), (8, True)),
           (8, 4096, 28672): ((16, True), (16, True)),
           (8, 14336, 4096): ((28, False), (56, False))}
  for name in ("w4a16-g128-zp", "w4a16-mxfp4", "w4a16-g128"):
    for (e, k, n), (wg_tiles, taken) in shapes.items():
      p = abstract_params(name, (e, k, n), grouped=True, kernel=gm.FAMILY)
      topk = 2 if e == 8 else 8
      for tokens in (1, 16):
        m = tokens * topk
        rows = gm.tile_rows(m, e, p)
        cfg = gm.default_launch(m, p, rows)
        monkeypatch.setenv("HUMMING_JAX_MMA_SYNC", "0")
        old = gm.default_launch(m, p, rows)  # the launch of before
        monkeypatch.delenv("HUMMING_JAX_MMA_SYNC")
        assert not old.mma_sync
        if tokens == 1:
          assert rows == 8 and gm.warpgroup_k_tiles(old, k // 128) == wg_tiles
          assert cfg.mma_sync == taken, (name, e, k, n)
        assert cfg == (dataclasses.replace(old, block_m=8, mma_sync=True) if cfg.mma_sync
                       else old), (name, e, k, n, tokens)
        assert not cfg.mma_sync or rows == 8
        if tokens == 16:  # 16-row tiles: the WGMMA
          assert rows == 16 and not cfg.mma_sync
      # pair tiles (quant_moe at decode: run_pairs' launch, nothing streamed) at 1 and 16
      # tokens: K tiles per warpgroup and the choice (DeepSeek-V3 gate_up's 128 pairs run
      # small two-warpgroup CTAs of 28: not taken)
      for tokens, (want_tiles, want) in zip((1, 16), pairs[(e, k, n)]):
        pair = gm.heuristic(min(e, tokens * topk), n, k // 128, 8, params=p, tile_rows=8,
                            streamed=False)
        assert (gm.warpgroup_k_tiles(pair, k // 128), pair.mma_sync) == (want_tiles, want), (
            name, e, k, n, tokens)
  for name in ("w4a16-nvfp4", "w8a16"):
    p = abstract_params(name, (128, 2048, 1536), grouped=True, kernel=gm.FAMILY)
    assert not gm.default_launch(8, p, 8).mma_sync
  p = abstract_params("w4a16-g128-zp", (128, 2048, 1536), grouped=True, kernel=gm.FAMILY)
  assert not gm.default_launch(1024, p, 16).mma_sync  # 16-row tiles
  assert not gm.heuristic(8, 1536, 16, 8, params=p, tile_rows=16).mma_sync
  # the autotune grid holds both forms of the 8-row launch (one token)
  cands = gm.launch_candidates(8, p)
  assert cands[0][0] == 8 and cands[0][1].mma_sync
  assert (8, dataclasses.replace(cands[0][1], mma_sync=False)) in cands
  # the default launch in the interpreter (8-row tiles: mma_sync set)
  q, _ = make("w4a16-g128-zp", 4, 256, 128, 1, True, seed=91)
  g = jnp.asarray([3, 0, 5, 2], jnp.int32)
  x = jax.random.normal(jax.random.key(92), (10, 256), jnp.bfloat16)
  pq = gm.prepare(q)
  assert gm.default_launch(10, pq, 8).mma_sync
  y = jax.jit(lambda p, x, g: gm.run(p, x, g, block_m=8, interpret=True))(pq, x, g)
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= TOL


MMA_SYNC_LAUNCHES = [  # (shape (E, K, N), tokens, launch change or None: the default)
    ((256, 256, 7168), 16, None),  # DeepSeek-V3 down: streamed column blocks
    ((128, 768, 2048), 16, None),  # Qwen3-30B-A3B down: streamed column blocks
    ((256, 7168, 512), 16, None),  # DeepSeek-V3 gate_up: the small CTA / split-K
    ((256, 7168, 512), 64, None),
    ((128, 2048, 1536), 1, None),  # Qwen3-30B-A3B gate_up at one token: two warpgroups
    ((128, 2048, 1536), 16, "xn4"),  # four shared-x warpgroups (explicit)
    ((128, 2048, 1536), 16, "sub1"),  # one K tile per step
]


@pytest.mark.parametrize("shape,tokens,change", MMA_SYNC_LAUNCHES[:3] + MMA_SYNC_LAUNCHES[5:6])
def test_mma_sync_launches_lower_for_h200(shape, tokens, change, monkeypatch,
                                          mma_sync_calls):
  """The grouped launches mma.sync now runs on lower for an H200 with the PTX emitted
  (the interpreter runs the WGMMA form: this is where the CPU sees the product)."""
  from test_cuda_lowering import abstract_params, lower_for_h200
  emitted = mma_sync_calls
  monkeypatch.delenv("HUMMING_JAX_MMA_SYNC", raising=False)
  e, k, n = shape
  p = abstract_params("w4a16-g128-zp", shape, grouped=True, kernel=gm.FAMILY)
  m = tokens * 8
  cfg = _mma_sync_launch(m, p, change)
  assert cfg.mma_sync
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((e,), jnp.int32)
  text = lower_for_h200(lambda p, x, g: gm.run(p, x, g, config=cfg, block_m=8), p, x, g)
  assert "custom_call" in text and emitted


def _mma_sync_launch(m, p, change):
  """8-row tiles' default launch on mma.sync (the rule's, or forced where the warpgroups'
  K is longer), or it with ``change``: "xn4" (four shared-x warpgroups), "sub1" (one K
  tile per pipeline step)."""
  base = dataclasses.replace(gm.default_launch(m, p, 8), block_m=8, mma_sync=True)
  if change == "xn4":
    return dataclasses.replace(warpgroup_launch("xn4"), block_m=8, mma_sync=True)
  if change == "sub1":
    return dataclasses.replace(base, substeps=1)
  return base


@pytest.mark.gpu
@pytest.mark.parametrize("shape,tokens,change", MMA_SYNC_LAUNCHES)
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_mma_sync_launches_gpu(name, shape, tokens, change, monkeypatch, mma_sync_calls):
  """The grouped launches on mma.sync (session 57) on the GPU: the PTX is emitted, the
  output is within float32 summation order of the same launch on the WGMMA and within
  TOL of the reference (8-row tiles, top-8 routed rows)."""
  calls = mma_sync_calls
  monkeypatch.delenv("HUMMING_JAX_MMA_SYNC", raising=False)
  e, k, n = shape
  q, _ = make(name, e, k, n, 1, False, seed=93)
  g, x = routed_rows(e, k, tokens, seed=94)
  p = jax.jit(gm.prepare)(q)
  on = _mma_sync_launch(x.shape[0], p, change)
  assert on.mma_sync
  run = jax.jit(lambda p, x, g, c: gm.run(p, x, g, config=c, block_m=8), static_argnums=3)
  y0 = run(p, x, g, dataclasses.replace(on, mma_sync=False))
  assert not calls
  y1 = run(p, x, g, on)
  assert calls, "the mma.sync product was not used"
  e_ref = rel(y1, jax.jit(reference.ragged_dot_reference)(q, x, g))
  d = rel(y1, y0)
  print(f"grouped mma_sync {name} {shape} T={tokens} {change}: rel err {e_ref:.2e}, "
        f"vs WGMMA {d:.2e}")
  assert e_ref <= TOL
  assert d <= 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_wide_tiles_aligned_gpu(name, monkeypatch):
  """hj.quant_moe's aligned segments at Mixtral-like experts (E=8, K=4096, N cut to 2048),
  1024 tokens top-2, in aligned_tile_rows' 144-row tiles on run_aligned's default launch,
  against the reference on the routed rows (printed)."""
  from humming_jax import moe
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
  e, k, n, t = 8, 4096, 2048, 1024
  q, _ = make(name, e, k, n, 1, True, seed=77)
  p = jax.jit(gm.prepare)(q)
  bm = gm.aligned_tile_rows(2 * t, e, p, p)
  assert bm == 144
  ids = jnp.argsort(jax.random.uniform(jax.random.key(78), (t, e)), axis=1)[:, :2]
  r = moe.align_tokens(ids.astype(jnp.int32), e, bm)
  xs = jnp.take(jax.random.normal(jax.random.key(79), (t, k), jnp.bfloat16),
                r.token_of_row, axis=0)
  y = jax.jit(lambda p, a, g: gm.run_aligned(p, a, g, block_m=bm))(p, xs, r.group_sizes)
  valid = np.asarray(r.valid)
  want = jax.jit(reference.ragged_dot_reference)(q, xs, r.group_sizes)
  err = rel(np.asarray(y, np.float32)[valid], np.asarray(want, np.float32)[valid])
  print(f"wide aligned tiles {name}: rel err {err:.2e}")
  assert err <= TOL
