"""The grouped quantized-activation family on the Mosaic grouped WnA16 kernel
(kernels/grouped_wnam_mgpu.py): interpreter vs the per-expert reference with the same
activation quantization, the layout round trip, the ranking (default for 4-bit weights), bad input; H200 tests
under @pytest.mark.gpu."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.kernels import grouped_wnam_mgpu as gw, reference, registry

from conftest import interpret_clusters
from test_grouped_wna16_mgpu import TOL, make, rel, routed_error, routed_rows
from test_wna16_mgpu import normal  # jax.random.normal, bit for bit, one compile per size class

CASES = [  # (preset, E, K, N, group_sizes, M): uneven, empty experts, a zero tail
    ("w4a8-int8", 4, 256, 128, [3, 0, 5, 2], 12),
    ("w4a8-fp8", 3, 512, 64, [1, 1, 1], 3),  # decode: one row per expert
    ("w4a8-mxfp4", 5, 256, 192, [0, 7, 2, 0, 9], 20),
    ("w4a4-nvfp4", 3, 256, 64, [4, 0, 3], 9),
    ("w8a8-int8", 3, 256, 128, [2, 5, 0], 8),
    # fp8 MMA (":p8"): 2 experts x 75 rows (tiles of 64+: one partial in flight)
    ("w4a8-mxfp4", 2, 256, 64, [75, 75], 150),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-e{c[1]}-m{c[5]}")
def test_matches_the_reference_interpret(case):
  """hj.quant_ragged_dot on params prepared for this family: the spec's activation
  quantization, rounded to bf16, on the grouped WnA16 kernel, against the reference (the
  same quantization, exact products); rows past sum(group_sizes) are zeros."""
  name, e, k, n, gs, m = case
  q, x = make(name, e, k, n, m, True, seed=21)
  g = jnp.asarray(gs, jnp.int32)
  p = hj.prepare(q, grouped=True, kernel=gw.FAMILY)
  assert registry.layout_family(p.layout) == gw.FAMILY and p.spec == q.spec
  y = jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g, backend="interpret"))(p, x, g)
  total = sum(gs)
  want = reference.ragged_dot_reference(q, x, g)
  assert y.shape == (m, n) and y.dtype == x.dtype
  assert rel(y[:total], want[:total]) <= TOL, rel(y[:total], want[:total])
  assert not bool(jnp.any(y[total:] != 0))
  # Not the weight-only product: the activation quantization is applied.
  unq = reference.ragged_dot_reference(q.replace(spec=q.spec.weight_only()), x, g)
  assert rel(y[:total], unq[:total]) > rel(y[:total], want[:total])


FP8_SPECS = {  # fp4 weights in groups of 32+ x e4m3 activations per row / per tensor
    "g64-bf16-token": hj.QuantSpec("fp4_e2m1", "group", 64, act="fp8_e4m3"),
    "g128-e8m0-static": hj.QuantSpec("fp4_e2m1", "group", 128, scale_dtype="e8m0",
                                     act="fp8_e4m3", act_granularity="tensor",
                                     act_static=True),
}


@pytest.mark.parametrize("key", sorted(FP8_SPECS))
def test_fp8_mma_layout_interpret(key, monkeypatch):
  """The fp8-MMA layout (":p8") for scale groups of 64 / 128 (one partial per group: two or
  one per K tile) and a static per-tensor activation scale: against the reference, the
  same as the 16-bit route (HUMMING_JAX_FP8_MMA=0) within rounding, a NaN row NaN."""
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  spec = FP8_SPECS[key]
  e, k, n, gs = 3, 256, 64, [4, 0, 5]
  kw, kx = jax.random.split(jax.random.key(31))
  w = normal(kw, (e, k, n)) / np.sqrt(k)
  q = hj.quantize(w, spec, act_scale=jnp.float32(0.02) if spec.act_static else None)
  x = normal(kx, (9, k), jnp.float32).astype(jnp.bfloat16)
  x = x.at[3, 5].set(jnp.nan) if not spec.act_static else x
  g = jnp.asarray(gs, jnp.int32)
  assert gw.fp8_mma(spec)
  p = gw.prepare(q)
  assert "p8" in p.layout.split(":"), p.layout
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x, g)
  want = reference.ragged_dot_reference(q, x, g)
  ok = jnp.isfinite(want).all(axis=1)
  assert rel(y[ok], want[ok]) <= 1e-4, rel(y[ok], want[ok])
  if not spec.act_static:  # row 3 holds a NaN: its output row is NaN
    assert int((~ok).sum()) == 1 and bool(jnp.all(jnp.isnan(y[~ok])))
  monkeypatch.setenv("HUMMING_JAX_FP8_MMA", "0")
  p16 = gw.prepare(q)
  assert ":p8" not in p16.layout
  y16 = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p16, x, g)
  assert rel(y16[ok], y[ok]) <= 1e-2
  np.testing.assert_array_equal(np.asarray(gw.to_canonical(p).codes),
                                np.asarray(q.codes))


def test_fp8_mma_split_k_and_dense_interpret(monkeypatch):
  """The fp8 route with grid split-K (x scales on each float32 partial, XLA sums them) on
  the grouped kernel, and the dense (one expert's) kernel on the ":p8" layout with its
  own row scales, against XLA on the same e4m3 codes."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  q, x = make("w4a8-mxfp4", 2, 512, 128, 6, False, seed=33)
  g = jnp.asarray([2, 4], jnp.int32)
  p = gw.prepare(q)
  cfg = dataclasses.replace(wna16_mgpu.heuristic(1, 128), split_k=2, warpgroups=1)
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True, config=cfg))(p, x, g)
  want = reference.ragged_dot_reference(q, x, g)
  assert rel(y, want) <= 1e-4, rel(y, want)
  x16 = x.astype(jnp.float16)  # fp16 tokens: fp16 out, the e8m0 scales kept in bf16
  y16 = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x16, g)
  assert y16.dtype == jnp.float16
  assert rel(y16, reference.ragged_dot_reference(q, x16, g)) <= 1e-3
  # dense: expert 1's weights, x as e4m3 codes with row scales
  view = gw.weight_view(p, gw.renamed(p.layout, g16.FAMILY))
  dense = view.replace(codes=view.codes[1], scales=view.scales[1], shape=view.shape[1:],
                       fold_base=view.fold_base[1],
                       layout=view.layout.replace(g16.FAMILY, wna16_mgpu.FAMILY, 1))
  assert wna16_mgpu.fp8_mma(dense.layout)
  s = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=1) / 448
  codes = (x.astype(jnp.float32) / s[:, None]).astype(jnp.float8_e4m3fn)
  yd = wna16_mgpu.run(dense, codes, interpret=True, x_scale=s, out_dtype=jnp.float16)
  w = wna16_mgpu.dequantize_prepared(dense, jnp.float32)
  ref = (codes.astype(jnp.float32) * s[:, None]) @ w
  assert yd.dtype == jnp.float16 and rel(yd, ref) <= 1e-3, rel(yd, ref)
  assert wna16_mgpu.run(dense, codes[:0], interpret=True, x_scale=s[:0]).dtype == jnp.bfloat16


@pytest.mark.parametrize("wgs,split,sub,k,tiny", [
    (1, "k", 1, 512, False), (2, "k", 1, 512, False), (2, "n", 1, 512, False),
    (1, "k", 2, 512, False),  # two K tiles per pipeline step
    # K 320: the last K tile is padded, its padding scale rows hold 1.0; weights ~1e-4,
    # so scales ~2**-18: a column maximum taken over the padding (1.0) would zero them all
    (1, "k", 1, 320, True)])
def test_fp8_single_acc_interpret(wgs, split, sub, k, tiny, monkeypatch):
  """config.fp8_single_acc: the e8m0 group scales folded against each column's largest
  one over all of K (the real groups', not the padding's), every K tile into one
  accumulator, the column max in the epilogue.  Random weights (groups within 11 binades
  of their column's largest): the reference within 1e-4, on warpgroups splitting K
  (summed in SMEM) or N, one or two K tiles per step, and a padded K."""
  from humming_jax.kernels import wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  kw, kx = jax.random.split(jax.random.key(37))
  w = normal(kw, (2, k, 128)) / np.sqrt(k) * (1e-4 if tiny else 1.0)
  q = hj.quantize(w, hj.QuantSpec.preset("w4a8-mxfp4"))
  x = normal(kx, (6, k), jnp.float32).astype(jnp.bfloat16)
  g = jnp.asarray([2, 4], jnp.int32)
  p = gw.prepare(q)
  assert wna16_mgpu.column_folds(p.layout), p.layout
  cfg = dataclasses.replace(wna16_mgpu.heuristic(1, 128), substeps=sub, stages=2,
                            warpgroups=wgs, split_warpgroups=split, fp8_single_acc=True,
                            split_k=1, scale_after_mma=False, overlap_mma=False)
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True, config=cfg))(p, x, g)
  want = reference.ragged_dot_reference(q, x, g)
  assert float(jnp.max(jnp.abs(want))) > 0
  assert rel(y, want) <= 1e-4, rel(y, want)
  if k == 512:  # 4 K tiles split in two: the column fold needs the kernel's epilogue
    with pytest.raises(ValueError, match="split_k=2 gives 2 K splits"):
      gw.run(p, x, g, interpret=True, config=dataclasses.replace(cfg, split_k=2, substeps=1))


def test_fp8_single_acc_route(monkeypatch, grouped_launches):
  """The one-accumulator route (Config.fp8_single_acc) is taken only where it is exact:
  an eager prepare marks the layout ":cf" when every column's e8m0 scales span at most
  11 binades; the grouped heuristic then runs fp8 tiles of 24+ rows (here 24-128, one
  wave) on four shared-x warpgroups with one accumulator each
  (HUMMING_JAX_FP8_SINGLE_ACC=0: two warpgroups in pairs, per-group partials), and the
  default path through gw.run matches the reference (128-row tiles).  A prepare under jit
  (scales not concrete), a column whose scales span 12 binades and a NaN scale are not marked; the wide one takes the
  per-group route, and an explicit fp8_single_acc config is refused on it by name.
  Marked by hand (a stale mark), the column that does not fold comes out NaN.
  HUMMING_JAX_FP8_FOLD=1 leaves the one-accumulator launch as it is."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  q, x = make("w4a8-mxfp4", 2, 256, 128, 200, False, seed=39)
  g = jnp.asarray([100, 100], jnp.int32)
  p = gw.prepare(q)
  assert p.layout.split(":")[-2:] == ["p8", "cf"], p.layout
  assert jax.jit(gw.prepare)(q).layout == p.layout[:-3]  # traced: unchecked, unmarked
  launch = lambda p: g16.heuristic(2, 128, p.codes.shape[-3], 128, params=p, tile_rows=128)
  on = launch(p)
  assert (on.warpgroups, on.split_warpgroups, on.fp8_single_acc) == (4, "n", True)
  # from SINGLE_ACC_MIN_ROWS (24) rows per tile; 16-row tiles keep one warpgroup over K
  small = lambda p, rows: g16.heuristic(2, 128, p.codes.shape[-3], rows, params=p,
                                        tile_rows=rows)
  assert g16.SINGLE_ACC_MIN_ROWS == 24
  assert all(small(p, r).fp8_single_acc and small(p, r).warpgroups == 4 for r in (24, 48, 80))
  assert not small(p, 16).fp8_single_acc and small(p, 16).split_warpgroups == "k"
  monkeypatch.setenv("HUMMING_JAX_FP8_SINGLE_ACC", "0")
  off = launch(p)
  assert (off.warpgroups, off.cluster_n, off.fp8_single_acc) == (2, 2, False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC")
  seen = grouped_launches
  seen.clear()  # (the launches asked for above)
  monkeypatch.setenv("HUMMING_JAX_FP8_FOLD", "1")  # (the per-tile fold: not with single)
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x, g)
  monkeypatch.delenv("HUMMING_JAX_FP8_FOLD")
  assert seen and all(c.fp8_single_acc and not c.fp8_fold for c in seen), seen
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= 1e-4
  # expert 1, column 5: group 0's scale set 12 binades over the column's largest
  wide = q.replace(scales=q.scales.at[1, 0, 5].set(q.scales[1, :, 5].max() + 12))  # e8m0
  pw = gw.prepare(wide)
  assert not wna16_mgpu.column_folds(pw.layout), pw.layout
  assert not launch(pw).fp8_single_acc and not small(pw, 24).fp8_single_acc
  seen.clear()
  yw = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(pw, x, g)
  assert seen and not any(c.fp8_single_acc for c in seen)
  assert rel(yw, reference.ragged_dot_reference(wide, x, g)) <= 1e-4
  with pytest.raises(ValueError, match="fp8_single_acc=True needs.*':cf'"):
    gw.run(pw, x, g, interpret=True, config=on)
  nan = q.replace(scales=q.scales.at[0, 1, 2].set(jnp.uint8(0xFF)))  # e8m0 NaN
  assert not wna16_mgpu.column_folds(gw.prepare(nan).layout)
  # a stale mark (the wide scales under the ":cf" of other weights): the column that does
  # not fold is NaN, never silently wrong; the others match the reference
  stale = pw.replace(layout=pw.layout + ":cf")
  ys = np.asarray(jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True, config=on))(
      stale, x, g), np.float32)
  want_w = np.asarray(reference.ragged_dot_reference(wide, x, g), np.float32)
  rows1 = slice(100, 200)  # expert 1's rows
  assert np.isnan(ys[rows1, 5]).all() and not np.isnan(np.delete(ys, 5, axis=1)).any()
  assert not np.isnan(ys[:100, 5]).any()  # expert 0's column 5 folds
  keep = np.ones(ys.shape, bool)
  keep[rows1, 5] = False
  assert rel(ys[keep], want_w[keep]) <= 1e-4


def test_fold_base_stored_at_prepare(monkeypatch):
  """An eager prepare that marks ":cf" stores each column's fold base (``fold_base``,
  ``wna16_mgpu.column_fold_row`` of the scale rows), and a call then takes it instead of
  reducing every scale row again (no top-level reduction over the scales in the traced
  call; with ``fold_base=None`` -- checkpoints before version 3 -- there is one).  Both
  give the same bits.  A traced prepare stores none (unmarked); to_canonical drops it; a
  base of the wrong shape or dtype is refused by name."""
  from humming_jax.kernels import wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  q, x = make("w4a8-mxfp4", 2, 256, 128, 200, False, seed=41)
  g = jnp.asarray([90, 110], jnp.int32)
  p = gw.prepare(q)
  assert wna16_mgpu.column_folds(p.layout) and p.fold_base is not None
  e, rows, np_ = p.scales.shape
  assert p.fold_base.shape == (e, 1, np_) and p.fold_base.dtype == jnp.float32
  np.testing.assert_array_equal(
      np.asarray(p.fold_base), np.asarray(wna16_mgpu.column_fold_row(
          *wna16_mgpu.column_fold_base(p.scales, 256, q.spec))))
  assert not np.isnan(np.asarray(p.fold_base)[..., :128]).any()
  assert jax.jit(gw.prepare)(q).fold_base is None
  assert gw.to_canonical(p).fold_base is None
  call = lambda p, x, g: gw.run(p, x, g, interpret=True)

  def scale_reductions(params):  # top-level reductions of (E, rows, Np) operands (K != Np)
    eqns = jax.make_jaxpr(call)(params, x, g).jaxpr.eqns
    return [q for q in eqns if q.primitive.name in ("reduce_max", "reduce_min")
            and q.invars[0].aval.ndim == 3 and q.invars[0].aval.shape[-1] == np_]

  unstored = p.replace(fold_base=None)
  assert not scale_reductions(p) and scale_reductions(unstored)
  y = jax.jit(call)(p, x, g)
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                np.asarray(jax.jit(call)(unstored, x, g), np.float32))
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= 1e-4
  # new scales through replace drop the stored base (a stale one is never kept that way)
  assert p.replace(scales=p.scales).fold_base is None
  assert p.replace(layout=p.layout).fold_base is p.fold_base
  for bad in (p.fold_base[:, :, :64], p.fold_base.astype(jnp.bfloat16)):
    with pytest.raises(ValueError, match=r"params.fold_base: expected float32\[2, 1, "):
      call(p.replace(fold_base=bad), x, g)


def test_single_acc_default_small_tiles_interpret(monkeypatch, grouped_launches):
  """~15 rows per expert: the default takes one-accumulator tiles (from 24 rows, session
  28) of the rows single_acc_tile_rows picks (32: one tile per expert, session 29) on four
  shared-x warpgroups (one wave of CTAs) and matches the reference."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  q, x = make("w4a8-mxfp4", 4, 256, 256, 60, False, seed=42)
  g = jnp.asarray([14, 17, 15, 14], jnp.int32)
  p = gw.prepare(q)
  assert g16.block_rows(60, 4) == 24 and g16.tile_rows(60, 4, p) == 32
  seen = grouped_launches
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x, g)
  assert seen and all(c.fp8_single_acc and c.warpgroups == 4 for c in seen), seen
  assert rel(y, reference.ragged_dot_reference(q, x, g)) <= 1e-4


def test_single_acc_tile_rows(monkeypatch):
  """Tiles on the one-accumulator route take the rows per tile of least expected cost:
  Mixtral at 1024 / 4096 tokens (256 / 1024 rows per expert) 144 / 152, as the H200
  measured best (session 26); very large experts the widest; uncapped tiles too since
  session 29 (test_single_acc_small_expert_launch).  Unmarked layouts and
  HUMMING_JAX_FP8_SINGLE_ACC=0 keep block_rows'.
  Through gw.run: 2 experts x 150 rows in 160-row one-accumulator tiles (the
  interpreter), the reference within 1e-4, rows past the routed ones zero; an explicit
  block_m is taken up to 160 (256 with an explicit one-accumulator config) and refused
  beyond, and over 128 off the one-accumulator route."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  assert g16.single_acc_tile_rows(2048, 8) == 144
  assert g16.single_acc_tile_rows(8192, 8) == 152
  assert g16.single_acc_tile_rows(65536, 8) == max(g16.SINGLE_ACC_BLOCK_MS)
  # the model: an expert of 256 +- 16 rows fits two 144-row tiles almost always, and
  # takes three 128-row tiles about half the time
  assert 2.0 <= g16.expected_tiles(256, 144) < 2.1
  assert 2.4 < g16.expected_tiles(256, 128) < 2.8
  q, x = make("w4a8-mxfp4", 2, 256, 128, 310, False, seed=41)
  g = jnp.asarray([150, 150], jnp.int32)
  p = gw.prepare(q)
  assert p.layout.endswith(":cf"), p.layout
  assert g16.tile_rows(300, 2, p) == 160 and g16.tile_rows(300, 2) == 128
  assert g16.tile_rows(300, 2, jax.jit(gw.prepare)(q)) == 128  # unmarked
  assert g16.tile_rows(40, 2, p) == g16.single_acc_tile_rows(40, 2) == 32  # not capped
  assert g16.single_acc_tile_rows(140, 1) == 144  # one expert: no wider than its rows
  seen, heuristic = [], g16.heuristic
  monkeypatch.setattr(g16, "heuristic", lambda *a, **k: seen.append(
      (k["tile_rows"], heuristic(*a, **k))) or seen[-1][1])
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x, g)
  assert seen and all(rows == 160 and (c.fp8_single_acc, c.warpgroups) == (True, 4)
                      for rows, c in seen), seen
  want = reference.ragged_dot_reference(q, x, g)
  assert rel(y[:300], want[:300]) <= 1e-4, rel(y[:300], want[:300])
  assert not bool(jnp.any(y[300:] != 0))
  # explicit rows over 128 on the route: up to 160 on the default launch, 256 with an
  # explicit one-accumulator config
  assert jax.eval_shape(lambda: gw.run(p, x, g, interpret=True, block_m=152)).shape == y.shape
  with pytest.raises(ValueError, match=r"block_m=168 .*\[8, 160\]"):
    gw.run(p, x, g, interpret=True, block_m=168)
  with pytest.raises(ValueError, match=r"block_m=264 .*\[8, 256\]"):
    gw.run(p, x, g, interpret=True, block_m=264, config=seen[0][1])
  monkeypatch.setenv("HUMMING_JAX_FP8_SINGLE_ACC", "0")
  assert g16.tile_rows(300, 2, p) == 128
  # over 128 rows only on the one-accumulator route (the per-group launch's registers)
  with pytest.raises(ValueError, match=r"block_m=144 .*\[8, 128\]"):
    gw.run(p, x, g, interpret=True, block_m=144)


def test_single_acc_small_expert_launch(monkeypatch):
  """Below capped experts (session 29): the one-accumulator tiles take the rows of least
  expected cost (H200-best at Qwen3-30B-A3B 1024 / 256 tokens: 88 / 32; DeepSeek-V3 1024:
  48), where block_rows' mean + 2 standard deviations split experts; experts of under
  ~24 rows keep the per-group 16-row tiles.  The launch: two-warpgroup CTAs where four
  make more than two waves and two CTAs of the tile's rows fit an SM, with the most
  stages that do; four otherwise (one wave, or tiles over 96 rows)."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16, tuning, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  monkeypatch.setattr(tuning, "num_sms", lambda: 132)
  q, _ = make("w4a8-mxfp4", 2, 256, 128, 16, False, seed=43)
  p = gw.prepare(q)
  assert wna16_mgpu.single_acc_layout(p)
  assert (g16.block_rows(8192, 128), g16.tile_rows(8192, 128, p)) == (80, 88)
  assert (g16.block_rows(2048, 128), g16.tile_rows(2048, 128, p)) == (24, 32)
  assert g16.tile_rows(8192, 256, p) == 48
  assert g16.tile_rows(2048, 256, p) == 16  # 8 rows per expert: per-group 16-row tiles
  assert g16.tile_rows(8192, 128, jax.jit(gw.prepare)(q)) == 80  # unmarked: block_rows'
  launch = lambda tiles, n, rows: g16.heuristic(tiles, n, 16, rows, params=p,
                                                tile_rows=rows)
  two = launch(128, 1536, 88)  # Qwen3 gate_up, 1024 tokens: 768 four-warpgroup CTAs
  assert (two.warpgroups, two.split_warpgroups, two.fp8_single_acc, two.stages) == (
      2, "n", True, 4)
  assert launch(8, 4096, 32).warpgroups == 4  # Mixtral down, 64 tokens: one wave
  assert launch(128, 1536, 104).warpgroups == 4  # over TWO_WG_MAX_ROWS
  # the stages fall to what lets two CTAs share an SM
  monkeypatch.setattr(tuning, "SM_SMEM_BYTES", 2 * (wna16_mgpu.smem_bytes(
      88, 3, 1, 128, 4, False, warpgroups=2, scale_rows=4, share_x=True, x_bytes=1,
      scale_bytes=p.scales.dtype.itemsize, x_scales=True) + 1024))
  assert launch(128, 1536, 88).stages == 3
  monkeypatch.setattr(tuning, "SM_SMEM_BYTES", 1000)  # none fits: four warpgroups
  assert launch(128, 1536, 88).warpgroups == 4


@pytest.mark.gpu
@pytest.mark.parametrize("wgs,block_m", [(2, 128), (4, 128), (4, 144), (4, 160), (4, 24),
                                         (4, 48), (4, 80), (2, 32), (2, 88)])
def test_fp8_single_acc_gpu(wgs, block_m, monkeypatch):
  """config.fp8_single_acc on the H200 (256 / 300 rows per expert, K = 4096) on two / four
  shared-x warpgroups in clusters of two (where the tile's 8-row groups split in two: not
  at 88 rows), tiles of 128 rows and wider (the default for
  Mixtral-sized experts since session 26) and of 24-88 rows (the default there since
  session 28, where the heuristic is checked to pick it; on two warpgroups since session
  29 where four would make more than two waves): the reference within 5e-3 (the
  fp8 MMA sums all of K in its reduced-precision accumulator; the error is printed)."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  q, x = make("w4a8-mxfp4", 2, 4096, 512, 556, False, seed=38)
  g = jnp.asarray([256, 300], jnp.int32)
  p = gw.prepare(q)
  cfg = dataclasses.replace(wna16_mgpu.shared_x_config(block_m, warpgroups=wgs),
                            cluster_n=2, fp8_single_acc=True)
  y = jax.jit(lambda p, x, g: gw.run(p, x, g, config=cfg, block_m=block_m))(p, x, g)
  want = reference.ragged_dot_reference(q, x, g)
  err = rel(y, want)
  print(f"fp8_single_acc wgs={wgs} block_m={block_m}: rel err {err:.2e}")
  assert err <= 5e-3, err  # (H200 session 26: 1.61e-3 at 128, 144 and 160 rows)
  if block_m < 128:  # the tiles the default takes from session 28 (24-80 rows)
    assert g16.heuristic(2, 512, p.codes.shape[-3], block_m, params=p,
                         tile_rows=block_m).fp8_single_acc


@pytest.mark.gpu
def test_fp8_single_acc_default_gpu(monkeypatch, grouped_launches):
  """The default path on the H200 for eagerly prepared W4A8 MXFP4 experts (":cf") of
  ~256 rows (K = 14336, as Mixtral down): hj.quant_ragged_dot runs the one-accumulator
  launch on four warpgroups (144-row tiles since session 26), within 5e-3 of the
  reference and of the per-group route (HUMMING_JAX_FP8_SINGLE_ACC=0, 128-row tiles;
  both printed)."""
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_CLUSTER_N", raising=False)
  q, x = make("w4a8-mxfp4", 4, 14336, 1024, 1024, False, seed=40)
  g = jnp.asarray([256, 300, 212, 256], jnp.int32)
  p = hj.prepare(q, grouped=True)
  assert p.layout.split(":")[-2:] == ["p8", "cf"], p.layout
  want = reference.ragged_dot_reference(q, x, g)
  out, seen = {}, grouped_launches
  for flag in ("1", "0"):
    monkeypatch.setenv("HUMMING_JAX_FP8_SINGLE_ACC", flag)
    seen.clear()
    out[flag] = jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g))(p, x, g)
    assert seen and all((c.fp8_single_acc, c.warpgroups) == ((True, 4) if flag == "1"
                                                             else (False, 2)) for c in seen)
  errs = {f: rel(y, want) for f, y in out.items()}
  print(f"one accumulator: rel err {errs['1']:.2e}; per group {errs['0']:.2e}; between "
        f"{rel(out['1'], out['0']):.2e}")
  assert errs["1"] <= 5e-3 and rel(out["1"], out["0"]) <= 5e-3  # (session 25: 2.56e-3)


@pytest.mark.gpu
def test_single_acc_small_experts_default_gpu(monkeypatch, grouped_launches):
  """The default path on the H200 for small experts (session 29): 64 experts of ~64 rows,
  N = 1536 (Qwen3-30B-A3B gate_up at 1024 tokens, K cut to 1024) -- hj.quant_ragged_dot
  takes single_acc_tile_rows' 88-row tiles on two-warpgroup CTAs (384 four-warpgroup
  CTAs would be ~3 waves), within 5e-3 of the reference (printed)."""
  from humming_jax.kernels import grouped_wna16_mgpu as g16
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  monkeypatch.delenv("HUMMING_JAX_CLUSTER_N", raising=False)
  sizes = np.random.default_rng(44).binomial(64 * 64 * 2, 1 / 128, size=64)
  m = int(sizes.sum())
  q, x = make("w4a8-mxfp4", 64, 1024, 1536, m, False, seed=44)
  g = jnp.asarray(sizes, jnp.int32)
  p = hj.prepare(q, grouped=True)
  assert p.layout.split(":")[-2:] == ["p8", "cf"], p.layout
  assert g16.tile_rows(m, 64, p) == 88, (m, g16.tile_rows(m, 64, p))
  y = jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g))(p, x, g)
  seen = grouped_launches
  assert seen and all((c.fp8_single_acc, c.warpgroups, c.block_m) == (True, 2, 88)
                      for c in seen), seen
  err = rel(y, reference.ragged_dot_reference(q, x, g))
  print(f"small experts, two warpgroups: rel err {err:.2e}")
  assert err <= 5e-3, err


@pytest.mark.parametrize("group", [32, 64, 128])
def test_fp8_fold_interpret(group, monkeypatch):
  """config.fp8_fold: each K tile's e8m0 group scales folded into the e4m3 operands (one
  partial per tile).  Groups of 32 fold four per 128-deep K tile; groups of 64 / 128 are
  one per tile (raise 11 throughout).  Against the per-group partials and the reference,
  with a NaN scale (its column NaN), groups 0 / 3 / 6 / 9 binades apart, and column 7 of
  expert 0 whose first group is 14 binades up: with groups of 32 the fold zeroes the
  codes of that tile's three other groups (more than 11 binades below), which the test
  makes visible by zeroing x over the top group -- the output is then the reference of
  weights with those groups zeroed."""
  from humming_jax.kernels import mgpu_convert, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_FOLD", raising=False)
  spec = hj.QuantSpec("fp4_e2m1", "group", group, scale_dtype="e8m0", act="fp8_e4m3")
  bk = wna16_mgpu.block_k_for(spec)
  e, k, n, gs = 2, 256, 64, [5, 70]
  kw, kx = jax.random.split(jax.random.key(41))
  w = np.array(normal(kw, (e, k, n)) / np.sqrt(k))
  spread = (np.arange(k // group) % 4) * 3  # 0, 3, 6, 9 binades down
  w *= np.repeat(2.0 ** -spread, group)[None, :, None]
  w[0, :group, 7] *= 2.0 ** 14  # column 7 of expert 0: its first group 14 binades up
  q = hj.quantize(jnp.asarray(w), spec)
  q = q.replace(scales=q.scales.at[1, 1, 9].set(255))  # e8m0 NaN: expert 1, column 9
  x = normal(kx, (sum(gs), k), jnp.float32).astype(jnp.bfloat16)
  x = x.at[:gs[0], :group].set(0)  # expert 0's rows: nothing from column 7's top group
  g = jnp.asarray(gs, jnp.int32)
  p = gw.prepare(q)
  assert "p8" in p.layout.split(":"), p.layout
  runs, folded = {}, []
  real = mgpu_convert.e2m1_to_e4m3_folded_interpret
  monkeypatch.setattr(mgpu_convert, "e2m1_to_e4m3_folded_interpret",
                      lambda *a: folded.append(a[1].shape) or real(*a))
  for fold in (False, True):
    cfg = dataclasses.replace(wna16_mgpu.shared_x_config(80, warpgroups=2), fp8_fold=fold)
    runs[fold] = np.asarray(jax.jit(lambda p, x, g, cfg=cfg: gw.run(
        p, x, g, interpret=True, config=cfg, block_m=80))(p, x, g), np.float64)
  assert folded and all(sh == (64, bk // group) for sh in folded), (folded, bk)  # fold only
  want = np.asarray(reference.ragged_dot_reference(q, x, g), np.float64)
  nan = np.isnan(want)
  assert nan[gs[0]:, 9].all() and nan.sum() == gs[1]  # the NaN scale's column, expert 1
  for y in runs.values():
    np.testing.assert_array_equal(np.isnan(y), nan)
  cols = np.ones(n, bool)
  cols[[7, 9]] = False  # the other columns: both routes match the reference
  for y in runs.values():
    assert rel(y[:, cols], want[:, cols]) <= 1e-4, rel(y[:, cols], want[:, cols])
  assert rel(runs[False][:gs[0], 7], want[:gs[0], 7]) <= 1e-3
  if bk // group > 1:  # groups 1-3 of column 7's first tile zeroed by the fold
    w_flushed = w.copy()
    w_flushed[0, group:bk, 7] = 0
    qf = hj.quantize(jnp.asarray(w_flushed), spec)
    want_f = np.asarray(reference.ragged_dot_reference(qf, x, g), np.float64)[:gs[0], 7]
    assert rel(runs[True][:gs[0], 7], want_f) <= 1e-3
    assert rel(want_f, want[:gs[0], 7]) > 0.05  # the zeroed groups mattered
  else:  # nothing to flush: the fold is the partials' sum in another order
    assert rel(runs[True][:gs[0], 7], want[:gs[0], 7]) <= 1e-3
  codes = jax.random.randint(kx, (64, 128), -8, 8).astype(jnp.int8)
  raises = jnp.tile(jnp.array([11, 0, -1, 5]), (64, 1))
  out = np.asarray(real(codes, raises, 32).astype(jnp.float32))
  vals = np.asarray(mgpu_convert.to_float_interpret(codes, jnp.float32))
  np.testing.assert_array_equal(out, vals * 2.0 ** np.repeat(np.array([5, -6, 0, -1]), 32)
                                * (np.repeat(np.array([11, 0, -1, 5]), 32) >= 0))


@interpret_clusters
def test_fp8_cluster_interpret(monkeypatch, launched_clusters):
  """Config.cluster_n on the grouped fp8-MMA kernel (W4A8 MXFP4): two column CTAs per
  cluster sharing each expert tile's x rows, an empty expert and two row tiles of one
  expert; the output equals the unclustered launch's exactly and matches the reference.
  One warpgroup per CTA (the interpreter's thread limit: test_wna16_mgpu.CLUSTER_CASES)."""
  from humming_jax.kernels import wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  e, k, n, gs = 3, 384, 256, [5, 0, 90]
  q, x = make("w4a8-mxfp4", e, k, n, sum(gs), False, seed=31)
  g = jnp.asarray(gs, jnp.int32)
  p = gw.prepare(q)
  assert "p8" in p.layout.split(":"), p.layout
  base = dataclasses.replace(wna16_mgpu.shared_x_config(80, warpgroups=1), stages=2)
  clusters = launched_clusters
  out = {c: np.asarray(jax.jit(lambda p, x, g, c=c: gw.run(
      p, x, g, interpret=True, config=dataclasses.replace(base, cluster_n=c),
      block_m=80))(p, x, g), np.float32) for c in (1, 2)}
  assert clusters == [None, (2, 1, 1)], clusters
  np.testing.assert_array_equal(out[2], out[1])
  want = reference.ragged_dot_reference(q, x, g)
  assert rel(out[2], want) <= 1e-3, rel(out[2], want)


def test_fp8_operands_take_the_one_pass_prepass_on_the_gpu_only(monkeypatch):
  """wnam_mgpu.fp8_operands asks w8a8.fused_prepass_applies: per-token e4m3 activations
  of 16-bit x, from FUSED_PREPASS_MIN_M rows, K a multiple of 128, not in the interpreter
  (which keeps XLA's pre-pass, the operands every interpreter test compares); else XLA."""
  from humming_jax.kernels import w8a8
  spec = hj.QuantSpec.preset("w4a8-mxfp4")
  rows = w8a8.FUSED_PREPASS_MIN_M
  x = jnp.zeros((rows, 256), jnp.bfloat16)
  assert w8a8.fused_prepass_applies(x, spec, 256)
  assert not w8a8.fused_prepass_applies(x, spec, 256, interpret=True)
  assert not w8a8.fused_prepass_applies(x[:rows - 1], spec, 256)
  assert not w8a8.fused_prepass_applies(x, spec, 320)  # K not a multiple of 128
  assert not w8a8.fused_prepass_applies(x.astype(jnp.float32), spec, 256)
  static = hj.QuantSpec("fp4_e2m1", "group", 32, scale_dtype="e8m0", act="fp8_e4m3",
                        act_granularity="tensor", act_static=True)
  assert not w8a8.fused_prepass_applies(x, static, 256)
  # fp8_operands takes the one-pass kernel where the predicate holds (recorded here; the
  # kernel itself runs only on the GPU), XLA's pre-pass in the interpreter.
  from humming_jax.kernels import act_prepass
  from humming_jax.quantize import kernel_activations
  q, xr = make("w4a8-mxfp4", 2, 256, 64, rows, False)
  p = hj.prepare(q, grouped=True, kernel=gw.FAMILY)
  calls = []

  def recorded(x, spec, *, rows, kp):
    calls.append((x.shape, rows, kp))
    qa = kernel_activations(x, spec, None, rows=rows, kp=kp)
    return qa.values, qa.scales.reshape(rows, 1)
  monkeypatch.setattr(act_prepass, "quantize_rows", recorded)
  codes, scales = gw.fp8_operands(xr, p)
  assert calls == [((rows, 256), rows, 256)] and scales.shape == (rows,), calls
  codes_i, scales_i = gw.fp8_operands(xr, p, interpret=True)
  assert len(calls) == 1
  np.testing.assert_array_equal(np.asarray(codes, np.float32), np.asarray(codes_i, np.float32))
  np.testing.assert_array_equal(np.asarray(scales), np.asarray(scales_i))


@pytest.mark.gpu
def test_fp8_operands_one_pass_gpu(monkeypatch):
  """On the H200, the grouped fp8-MMA route's operands of 2048 rows x K 14336 (Mixtral
  down at 1024 tokens) come from the one-pass pre-pass: the same codes and scales as
  XLA's pre-pass but for float32 division's last place (<= 1e-4 of codes one e4m3 step
  apart), and the grouped GEMM on them matches the reference."""
  from humming_jax.kernels import w8a8
  from humming_jax.quantize import kernel_activations
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  q, x = make("w4a8-mxfp4", 4, 14336, 256, 2048, False)
  p = hj.prepare(q, grouped=True, kernel=gw.FAMILY)
  assert "p8" in p.layout.split(":"), p.layout
  assert w8a8.fused_prepass_applies(x, p.spec, x.shape[1])
  codes, scales = jax.jit(gw.fp8_operands)(x, p)
  qa = jax.jit(lambda x: kernel_activations(x, p.spec, None, rows=x.shape[0],
                                            kp=x.shape[1]))(x)
  a, b = np.asarray(codes, np.float32), np.asarray(qa.values, np.float32)
  code_diff = int(np.sum(a != b))
  scale_rel = float(np.max(np.abs(np.asarray(scales) - np.asarray(qa.scales).reshape(-1))
                           / np.asarray(qa.scales).reshape(-1)))
  g = jnp.asarray(np.random.default_rng(3).multinomial(x.shape[0], [0.25] * 4), jnp.int32)
  y = jax.jit(lambda p, x, g: gw.run(p, x, g))(p, x, g)
  err = rel(y, reference.ragged_dot_reference(q, x, g))
  print(f"one-pass pre-pass: codes differing {code_diff} of {a.size}, scale rel "
        f"{scale_rel:.1e}; grouped GEMM rel err {err:.2e}")
  assert code_diff <= 1e-4 * a.size and scale_rel <= 1e-6, (code_diff, scale_rel)
  assert err <= 1e-2, err


def test_fp8_fold_refuses_a_padded_k(monkeypatch):
  """The tile fold takes each K tile's largest group scale as its base, and K-padding scale
  rows hold 1.0; with small scales (here ~2**-16) in a padded last tile every real group
  would be zeroed.  An explicit fp8_fold config is refused by name where K is padded, and
  HUMMING_JAX_FP8_FOLD=1 leaves such weights on the per-group route, matching the
  reference."""
  from humming_jax.kernels import mgpu_convert, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  spec = hj.QuantSpec("fp4_e2m1", "group", 32, scale_dtype="e8m0", act="fp8_e4m3")
  e, k, n, gs = 2, 320, 64, [6, 10]  # K 320: the last 128-deep K tile half padding
  kw, kx = jax.random.split(jax.random.key(43))
  q = hj.quantize(normal(kw, (e, k, n)) * 2.0 ** -16, spec)
  x = normal(kx, (sum(gs), k), jnp.float32).astype(jnp.bfloat16)
  g = jnp.asarray(gs, jnp.int32)
  p = gw.prepare(q)
  assert "p8" in p.layout.split(":") and p.codes.shape[-3] * p.codes.shape[-1] > k
  cfg = dataclasses.replace(wna16_mgpu.shared_x_config(16, warpgroups=1), fp8_fold=True)
  with pytest.raises(ValueError, match="K a multiple of the K tile.*K=320, padded to 384"):
    gw.run(p, x, g, interpret=True, config=cfg, block_m=16)
  folded = []
  real = mgpu_convert.e2m1_to_e4m3_folded_interpret
  monkeypatch.setattr(mgpu_convert, "e2m1_to_e4m3_folded_interpret",
                      lambda *a: folded.append(a[1].shape) or real(*a))
  monkeypatch.setenv("HUMMING_JAX_FP8_FOLD", "1")
  y = np.asarray(jax.jit(lambda p, x, g: gw.run(p, x, g, interpret=True))(p, x, g),
                 np.float64)
  assert not folded, folded  # the per-group route
  want = np.asarray(reference.ragged_dot_reference(q, x, g), np.float64)
  assert rel(y, want) <= 1e-3, rel(y, want)


def test_fp8_mma_refusals():
  """Bad input to the fp8-MMA layout is refused by name: specs it cannot hold, bad
  prepare arguments, 16-bit x on it, fp8 x without row scales, fp8 x on a 16-bit layout,
  row scales or an output dtype with 16-bit x."""
  from humming_jax.kernels import wna16_mgpu
  q, x = make("w4a16-nvfp4", 2, 256, 64, 4, False)
  with pytest.raises(ValueError, match="groups of a multiple of 32"):
    wna16_mgpu.prepare(q.replace(shape=q.shape[1:], codes=q.codes[0], scales=q.scales[0],
                                 global_scale=q.global_scale[0]), mma="fp8")
  q, x = make("w4a8-mxfp4", 2, 256, 64, 4, False)
  one = q.replace(shape=q.shape[1:], codes=q.codes[0], scales=q.scales[0])
  with pytest.raises(ValueError, match="mma='fp16'"):
    wna16_mgpu.prepare(gw.weight_view(one, "canonical"), mma="fp16")
  with pytest.raises(ValueError, match="own K order"):
    wna16_mgpu.prepare(gw.weight_view(one, "canonical"), mma="fp8", permute=True)
  p = gw.prepare(q)
  view = gw.weight_view(p, gw.renamed(p.layout, "grouped_wna16_mgpu"))
  from humming_jax.kernels import grouped_wna16_mgpu as g16
  g = jnp.asarray([2, 2], jnp.int32)
  with pytest.raises(ValueError, match="takes float8_e4m3fn activations"):
    g16.run(view, x, g, interpret=True)
  with pytest.raises(ValueError, match="x_scale: expected the"):
    g16.run(view, x.astype(jnp.float8_e4m3fn), g, interpret=True)
  q16, _ = make("w4a16-mxfp4", 2, 256, 64, 4, False)
  with pytest.raises(ValueError, match="takes float8_e4m3fn activations"):
    g16.run(g16.prepare(q16), x.astype(jnp.float8_e4m3fn), g, interpret=True,
            x_scale=jnp.ones((4,), jnp.float32))
  with pytest.raises(ValueError, match="x_scale: only for float8_e4m3fn x on the fp8-MMA"):
    g16.run(g16.prepare(q16), x, g, interpret=True, x_scale=jnp.ones((4,), jnp.float32))
  with pytest.raises(ValueError, match="x_scale: expected the"):
    g16.run(view, x.astype(jnp.float8_e4m3fn), g, interpret=True,
            x_scale=jnp.ones((3,), jnp.float32))


def test_round_trip_and_ranking():
  """prepare / to_canonical are exact inverses; the family is the default for 4-bit weights
  with quantized activations (above the Pallas-Triton grouped W8A8 family, session 16's
  H200 times) and for the 4-bit specs no other grouped family takes, not for 8-bit weights
  that grouped_w8a8 takes; weight-only specs and 32-bit tokens are refused by name."""
  q, x = make("w4a8-mxfp4", 3, 256, 128, 6, True, seed=22)
  c = gw.to_canonical(gw.prepare(q))
  for f in ("codes", "scales", "zeros", "global_scale", "bias", "act_scale"):
    a, b = getattr(c, f), getattr(q, f)
    assert (a is None) == (b is None), f
    if a is not None:
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert c.spec == q.spec and c.layout == "canonical"
  find = lambda spec: registry.find(spec, grouped=True, shape=q.shape)
  for name in ("w4a8-mxfp4", "w4a8-int8", "w4a8-fp8", "w4a4-mxfp4", "w4a4-nvfp4"):
    assert find(hj.QuantSpec.preset(name)).name == gw.FAMILY, name
  zp = hj.QuantSpec.preset("w4a16-g128-zp").replace(act="int8")  # no other grouped family
  assert gw.supports(zp) and find(zp).name == gw.FAMILY
  w8 = hj.QuantSpec.preset("w8a8-int8")
  assert gw.supports(w8) and find(w8).name == "grouped_w8a8"
  # 8-bit weights never default here, also where grouped_w8a8 refuses (static scales,
  # int8 weights x fp8 activations): XLA, as before.
  for spec in (w8.replace(act_static=True, act_granularity="tensor"),
               w8.replace(act="fp8_e4m3")):
    assert gw.supports(spec) and gw.priority_for(spec, q.shape) is None
    assert find(spec) is None or find(spec).name != gw.FAMILY
  assert registry.by_name(gw.FAMILY, grouped=True) is gw.KERNEL
  assert registry.by_layout(gw.prepare(q).layout) is gw.KERNEL
  w16, _ = make("w4a16-g128-zp", 3, 256, 128, 6, False)
  assert not gw.supports(w16.spec)
  with pytest.raises(ValueError, match="not supported by the grouped_wnam_mgpu kernel"):
    gw.prepare(w16)
  p = gw.prepare(q)
  g = jnp.asarray([2, 2, 2], jnp.int32)
  with pytest.raises(ValueError, match="bfloat16 / float16 tokens"):
    gw.run(p, x.astype(jnp.float32), g, interpret=True)
  with pytest.raises(ValueError, match="expected grouped_wnam_mgpu"):
    gw.run(q, x, g, interpret=True)
  with pytest.raises(ValueError, match=r"x must be \(M, K=256\)"):
    gw.run(p, x[:, :128], g, interpret=True)
  y0 = gw.run(p, x[:0], g, interpret=True)  # no tokens: (0, N), no quantization of nothing
  assert y0.shape == (0, 128) and y0.dtype == x.dtype


def test_fp8_wide_tile_launch(monkeypatch):
  """The grouped heuristic's launch for fp8-MMA tiles of more than 80 rows: two shared-x
  warpgroups (H200 session 21: four spilled at 128 rows, Mixtral gate_up 1024 tokens 7.1
  ms -> 1.2) in clusters of two CTAs (session 24: 1191.6 -> 1146.6 us); 80-row tiles keep
  four, the 16-bit route's 128-row tiles keep four, neither clustered."""
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  from humming_jax.kernels import grouped_wna16_mgpu as gm  # noqa: PLC0415
  shape = jax.ShapeDtypeStruct((8, 4096, 28672), jnp.float32)

  def launch(name, rows):
    q = jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset(name)), shape)
    p = jax.eval_shape(lambda q: hj.prepare(q, grouped=True, kernel=gw.FAMILY), q)
    view = gw.weight_view(p, gw.renamed(p.layout, gm.FAMILY))  # as gw.run passes it
    cfg = gm.heuristic(8, 28672, 32, rows, params=view, tile_rows=rows)
    return cfg.split_warpgroups, cfg.warpgroups, cfg.cluster_n

  assert launch("w4a8-mxfp4", 128) == ("n", 2, 2)  # in clusters of two (session 24)
  assert launch("w4a8-mxfp4", 80) == ("n", 4, 1)
  assert launch("w4a8-int8", 128) == ("n", 4, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 16, 64])
@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4"])
def test_deepseek_gate_up_gpu(name, tokens):
  """DeepSeek-V3 gate_up (E=256, K=7168, N=512), top-8 rows sorted by expert, on the H200."""
  e_, _ = routed_error(name, 256, 7168, 512, tokens, 23,
                       lambda q: hj.prepare(q, grouped=True, kernel=gw.FAMILY),
                       hj.quant_ragged_dot)
  print(f"grouped_wnam_mgpu {name} {tokens} tokens: rel err {e_:.2e}")
  assert e_ <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("shape,tokens", [((128, 2048, 1536), 64), ((128, 768, 2048), 16),
                                          ((256, 256, 7168), 1), ((256, 7168, 512), 1),
                                          ((256, 7168, 512), 256), ((8, 4096, 2048), 512)])
def test_fp8_mma_gpu(shape, tokens, monkeypatch):
  """W4A8 MXFP4 experts on the fp8-MMA layout on the H200 (Qwen3-30B-A3B gate_up / down,
  DeepSeek-V3 down and gate_up (grid split-K) at 1 token, gate_up at 256 tokens, a
  Mixtral-like prefill tile of 128 rows): within 1e-3 of the reference (the 16-bit
  route's bf16 rounding gave 2.5e-3; session 20: 1.7e-4-2.9e-4)."""
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  e, k, n = shape
  e_, p = routed_error("w4a8-mxfp4", e, k, n, tokens, 27,
                       lambda q: hj.prepare(q, grouped=True, kernel=gw.FAMILY),
                       hj.quant_ragged_dot)
  assert "p8" in p.layout.split(":"), p.layout
  print(f"fp8 MMA {shape} {tokens} tokens: rel err {e_:.2e}")
  assert e_ <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("shape,tokens", [((8, 4096, 2048), 512), ((256, 7168, 512), 16),
                                          ((128, 2048, 1536), 128)])
def test_fp8_fold_gpu(shape, tokens, monkeypatch):
  """HUMMING_JAX_FP8_FOLD=1 on the H200: the e8m0 group scales folded into the e4m3
  operands (mgpu_convert.e2m1_to_e4m3_ptx's fold, one partial per K tile) at a
  Mixtral-like 128-row tile, DeepSeek-V3 gate_up at 16 tokens and Qwen3 gate_up at 128
  tokens (80-row tiles): within 1e-3 of the reference, and within 1e-3 of the
  per-group partials (HUMMING_JAX_FP8_FOLD unset) on the same inputs."""
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  e, k, n = shape
  out = {}
  for flag in ("0", "1"):
    monkeypatch.setenv("HUMMING_JAX_FP8_FOLD", flag)
    # a fresh function per flag: the flag is read at trace time
    err, p = routed_error("w4a8-mxfp4", e, k, n, tokens, 27,
                          lambda q: hj.prepare(q, grouped=True, kernel=gw.FAMILY),
                          lambda p, x, g: hj.quant_ragged_dot(p, x, g))
    g, x = routed_rows(e, k, tokens, seed=28)  # routed_error's rows
    out[flag] = (err, jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g))(p, x, g))
  assert "p8" in p.layout.split(":"), p.layout
  diff = rel(out["1"][1], out["0"][1])
  print(f"fp8 fold {shape} {tokens} tokens: rel err {out['1'][0]:.2e} (partials "
        f"{out['0'][0]:.2e}), fold vs partials {diff:.1e}")
  assert out["1"][0] <= 1e-3 and diff <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape,tokens,most", [
    ("w4a8-mxfp4", (8, 4096, 2048), 512, 4),  # 128-row tiles, two warpgroups (fp8 MMA)
    ("w4a8-mxfp4", (128, 2048, 1536), 1024, 2),  # 80-row tiles, four warpgroups: 6 CTAs
    ("w4a16-mxfp4", (8, 4096, 2048), 512, 4),  # the 16-bit route's 128-row tiles
    ("w4a16-g128-zp", (8, 14336, 4096), 128, 4)])
def test_cluster_gpu(name, shape, tokens, most, monkeypatch, launched_clusters):
  """HUMMING_JAX_CLUSTER_N=2 / 4 (x tiles TMA-multicast to clusters of column CTAs) on
  the H200: the launch has the cluster (at most ``most``: the size that divides the
  column CTAs), the output is within 1e-3 (fp8 MMA) / the 16-bit tolerance of the
  reference and the same as the unclustered launch's (each CTA's arithmetic is
  unchanged).  (The launch check was added after session 24's GPU run of the rest.)"""
  from humming_jax.kernels import grouped_wna16_mgpu as gm
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  family = gw if hj.QuantSpec.preset(name).act is not None else gm
  clusters = launched_clusters
  e, k, n = shape
  out = {}
  for flag in ("1", "2", "4"):
    monkeypatch.setenv("HUMMING_JAX_CLUSTER_N", flag)  # read at trace time: fresh lambdas
    clusters.clear()
    err, p = routed_error(name, e, k, n, tokens, 27,
                          lambda q: hj.prepare(q, grouped=True, kernel=family.FAMILY),
                          lambda p, x, g: hj.quant_ragged_dot(p, x, g))
    g, x = routed_rows(e, k, tokens, seed=28)  # routed_error's rows
    out[flag] = (err, np.asarray(jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g))(
        p, x, g), np.float32))
    size = min(int(flag), most)
    assert set(clusters) == {None if size == 1 else (size, 1, 1)}, (flag, clusters)
  print(f"cluster {name} {shape} {tokens} tokens: rel err "
        + ", ".join(f"cl{f} {e_:.2e}" for f, (e_, _) in out.items()))
  for flag in ("2", "4"):
    assert out[flag][0] <= (1e-3 if family is gw else TOL), (flag, out[flag][0])
    np.testing.assert_array_equal(out[flag][1], out["1"][1])


@pytest.mark.gpu
@pytest.mark.parametrize("key", sorted(FP8_SPECS))
def test_fp8_mma_groups_gpu(key, monkeypatch):
  """fp4 groups of 64 / 128 on the fp8-MMA layout on the H200 (several 32-deep WGMMAs per
  scale group's partial; not in session 20's GPU runs): Qwen3-30B-A3B gate_up, 16
  tokens, against the reference."""
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  spec = FP8_SPECS[key]
  kw, kx = jax.random.split(jax.random.key(35))
  w = normal(kw, (128, 2048, 1536)) / np.sqrt(2048)
  q = jax.jit(lambda w: hj.quantize(w, spec, act_scale=jnp.float32(0.02)
                                    if spec.act_static else None))(w)
  g, x = routed_rows(128, 2048, 16, seed=36)
  p = jax.jit(gw.prepare)(q)
  assert "p8" in p.layout.split(":"), p.layout
  e_ = rel(jax.jit(hj.quant_ragged_dot)(p, x, g),
           jax.jit(reference.ragged_dot_reference)(q, x, g))
  print(f"fp8 MMA {key}: rel err {e_:.2e}")
  assert e_ <= 1e-3


@pytest.mark.gpu
def test_default_choice_gpu():
  """hj.prepare's own choice for W4A8 MXFP4 experts is this family (session 16), and runs
  DeepSeek-V3 down (E=256, K=256, N=7168) at 16 tokens on the H200 within the tolerance."""
  e_, p = routed_error("w4a8-mxfp4", 256, 256, 7168, 16, 25,
                       lambda q: hj.prepare(q, grouped=True), hj.quant_ragged_dot)
  assert registry.layout_family(p.layout) == gw.FAMILY
  print(f"grouped_wnam_mgpu default, DeepSeek-V3 down 16 tokens: rel err {e_:.2e}")
  assert e_ <= TOL
