"""The Pallas-Triton unpack of 4-bit codes to e4m3 (kernels/carrier_unpack.py): its packed-
word lane maps bit-equal to the formats' decode / encode_exact on every 4-code word and
shift, the kernel bit-equal to wnam_mgpu's XLA reference (interpreter; @gpu: the H200),
refusals by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax import formats
from humming_jax.kernels import carrier_unpack as cu, mgpu_convert as mc, wnam_mgpu as wm

E4M3, E2M1 = formats.get_format("fp8_e4m3"), formats.get_format("fp4_e2m1")
RUNS = jnp.arange(1 << 16, dtype=jnp.uint32)  # every 16-bit run of four codes


def lanes_of(words):
  """uint32 words -> (..., 4) bytes, lane 0 first."""
  return np.asarray(words, np.uint32)[..., None] >> np.array([0, 8, 16, 24], np.uint32) & 255


def codes_of(runs):
  """16-bit runs -> (..., 4) codes, lowest nibble first."""
  return np.asarray(runs, np.uint32)[..., None] >> np.array([0, 4, 8, 12], np.uint32) & 15


def test_spread_nibbles():
  np.testing.assert_array_equal(lanes_of(cu.spread_nibbles(RUNS)), codes_of(RUNS))


def test_e2m1_lanes_are_the_formats_on_every_word_and_shift():
  x = cu.spread_nibbles(RUNS)
  c = jnp.asarray(codes_of(RUNS), jnp.int32)
  lo, hi = cu.SHIFT_RANGE
  subnormal_seen = False
  for shift in range(lo, hi + 1):
    vals = E2M1.decode(c).astype(jnp.float32) * 2.0 ** shift
    want = np.asarray(E4M3.encode_exact(vals, round_subnormals=True))
    np.testing.assert_array_equal(np.asarray(E4M3.encode(vals)), want)  # the general encode
    got = lanes_of(cu.e2m1_e4m3_lanes(x, jnp.int32(shift)))
    np.testing.assert_array_equal(got, want, err_msg=f"shift {shift}")
    if shift >= 1 - (E4M3.bias - 1):  # all normal: the short form agrees
      np.testing.assert_array_equal(
          lanes_of(cu.e2m1_e4m3_lanes(x, jnp.int32(shift), subnormals=False)), want)
    else:
      subnormal_seen |= bool((((want & 0x78) == 0) & ((want & 7) != 0)).any())
  assert subnormal_seen


def test_int4_lanes_are_the_formats_on_every_word():
  c = codes_of(RUNS).astype(np.int32)
  v = jnp.asarray(np.where(c >= 8, c - 16, c), jnp.float32)
  want = np.asarray(E4M3.encode_exact(v))
  np.testing.assert_array_equal(lanes_of(cu.int_e4m3_lanes(cu.spread_nibbles(RUNS))), want)
  np.testing.assert_array_equal(np.asarray(E4M3.decode(want)), np.asarray(v))


def params(name, k, n, seed, wide=False):
  w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / 40
  q = jax.jit(lambda w: hj.quantize(w, name))(w)
  if wide:  # group rows 0..19 octaves down (past the fold's exact 14: subnormal rounding)
    # in every other 64-column block, so the kernel's per-block "all normal" flag differs
    # between neighbouring N blocks (a flag on the wrong block takes the short path there)
    s = q.scales.astype(jnp.int32)
    far = (jnp.arange(s.shape[0], dtype=jnp.int32) * 3 % 20)[:, None]
    s = s - jnp.where((jnp.arange(s.shape[1]) // 64) % 2 == 0, far, 0)
    q = q.replace(scales=jnp.clip(s, 1, 254).astype(q.scales.dtype))
  return jax.jit(wm.prepare)(q)


def bits(a):
  return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("wide", [False, True])
def test_fold_kernel_is_the_reference(wide):
  # 3 K tiles x 4 N blocks: a transposed normal-flag layout would misplace the flags
  p = params("w4a8-mxfp4", 384, 256, seed=1, wide=wide)
  want = bits(wm.mx_fold_codes(p))
  got = bits(wm.mx_fold_codes(p, pallas=True, interpret=True))
  assert got.shape == want.shape == (256, 384)
  np.testing.assert_array_equal(got, want)
  if wide:  # nonzero subnormal codes in the far blocks, both kinds of block present
    sub = ((want & 0x78) == 0) & ((want & 0x07) != 0)
    assert sub[:64].any() and sub[128:192].any()
    normal = np.asarray(wm.mx_fold_shifts(p)).reshape(-1, 4, 64 * 4).min(-1) >= -5
    assert normal.any() and not normal.all()
  assert len(np.unique(want)) > 15  # many exponents, both signs


@pytest.mark.parametrize("name", ["w4a8-fp8", "w4a8-mxfp4"])
def test_carrier_kernel_is_the_reference(name):
  """int4 integers (w4a8-fp8) and e2m1 codes with no shift (the carrier route) -> e4m3."""
  p = params(name, 384, 128, seed=2)
  want = bits(wm._carrier_codes(p))
  got = bits(wm._carrier_codes(p, pallas=True, interpret=True))
  np.testing.assert_array_equal(got, want)
  assert len(np.unique(want)) >= 15


def test_scale_exponents_read_every_e8m0_scale():
  """The layout's bf16 rows of e8m0 scales -> exponents off the bits: every code, the
  bf16 subnormal 2**-127 and NaN included."""
  codes = jnp.arange(256, dtype=jnp.int32)
  scales = formats.get_format("e8m0").decode(codes).astype(jnp.bfloat16)
  got = np.asarray(cu.scale_exponents(scales))
  np.testing.assert_array_equal(got[:255], np.arange(255) - 127)
  assert got[255] == 128
  with pytest.raises(ValueError, match="scales: expected the layout's bfloat16"):
    cu.scale_exponents(scales.astype(jnp.float32))


def test_refusals():
  p = params("w4a8-mxfp4", 256, 128, seed=3)
  meta = wm.mx_fold_metadata(p)
  with pytest.raises(ValueError, match=r"codes: expected \(Kp / bk, Np, bk\) int4"):
    cu.unpack(p.codes.astype(jnp.int8), kind="int")
  with pytest.raises(ValueError, match="kind='x'"):
    cu.unpack(p.codes, kind="x")
  with pytest.raises(ValueError, match="scales and meta: pass both"):
    cu.unpack(p.codes, p.scales, kind="e2m1")
  with pytest.raises(ValueError, match="scales: only for kind='e2m1'"):
    cu.unpack(p.codes, p.scales, meta, kind="int")
  with pytest.raises(ValueError, match="scales, meta: expected"):
    cu.unpack(p.codes, p.scales[:, :64], meta, kind="e2m1")
  with pytest.raises(ValueError, match="G dividing 32"):
    cu.unpack(p.codes, jnp.ones((p.codes.shape[0] * 64, 128), jnp.bfloat16), meta,
              kind="e2m1")
  with pytest.raises(ValueError, match=r"fold_metadata at block_n=32 \(base \(128,\), "
                                       r"normal \(4, 2\)\)"):
    cu.unpack(p.codes, p.scales, meta, kind="e2m1", block_n=32)
  with pytest.raises(ValueError, match="Np=128 must be a multiple of block_n=256"):
    cu.unpack(p.codes, kind="int", block_n=256)
  with pytest.raises(ValueError, match=r"expected \(tiles=3 \* G, Np\)"):
    cu.fold_metadata(p.scales, tiles=3, real_groups=8)
  with pytest.raises(ValueError, match="G=3 group rows per K tile must be a power of two"):
    cu.fold_metadata(jnp.ones((6, 128), jnp.bfloat16), tiles=2, real_groups=6, pallas=True,
                     interpret=True)


def _scale_rows(tiles, g, np_, seed):
  """Random e8m0 powers of two as the layout's bf16 rows, within 4 octaves per column (the
  short lane map's blocks) except: the first block's high-base columns 7 / 8 spanning
  26 octaves (alternating rows), its column 9 at the least e8m0 scale (base -126), a NaN
  in column 3, and every third tile 25 octaves down in the second block's column 70; in the last row a
  high exponent (column 11) and a NaN (column 12)."""
  rng = np.random.default_rng(seed)
  e = rng.integers(0, 4, (tiles * g, np_))
  even = np.arange(tiles * g) % 2 == 0
  e[:, 7], e[:, 8] = np.where(even, 126, 100), np.where(even, 100, 126)  # low in every row
  e[:, 9] = -127  # a bf16 subnormal
  if np_ > 70:
    e[::3 * g, 70] = -25
  e[-1, 11] = 127  # the last row: K padding where real < tiles * G (ignored by the base)
  s = np.exp2(e.astype(np.float64)).astype(np.float32)
  s[5, 3] = np.nan
  s[-1, 12] = np.nan  # likewise ignored there
  return jnp.asarray(s, jnp.bfloat16)


@pytest.mark.parametrize("tiles,g,np_,real", [(64, 4, 128, 256), (7, 4, 192, 25),
                                              (12, 1, 64, 10), (16, 2, 128, 31)])
@pytest.mark.parametrize("hold", [False, True])
def test_fold_metadata_kernel_is_the_reference(tiles, g, np_, real, hold, monkeypatch):
  """Column bases and scales over the real K rows only (padding rows ignored, NaN ->
  NaN scale), per-block normal flags over every row: the kernel in the interpreter
  equals the XLA reference (chunks of 16 / 1 / 4 / 16 tiles)."""
  monkeypatch.setattr(cu, "METADATA_HOLD", hold)
  scales = _scale_rows(tiles, g, np_, seed=tiles + np_)
  want = cu.fold_metadata(scales, tiles=tiles, real_groups=real)
  got = cu.fold_metadata(scales, tiles=tiles, real_groups=real, pallas=True, interpret=True)
  for w, h in zip(want, got):
    assert w.shape == h.shape and w.dtype == h.dtype
    np.testing.assert_array_equal(np.asarray(h), np.asarray(w))
  normal = np.asarray(want.normal)
  col_scale, base = np.asarray(want.col_scale), np.asarray(want.base)
  assert np.isnan(col_scale[3])
  padded = real < tiles * g  # the last row is padding: its NaN and 2**127 do not count
  assert np.isnan(col_scale[12]) != padded and (base[11] == 121) != padded
  assert int(np.asarray(want.base)[9]) == -126 and not normal[0].any()
  if np_ > 70:  # the second block: short map except in every third tile
    assert normal[1].any() and not normal[1].all() and normal[2:].all()
  e = np.array(cu.scale_exponents(scales))[:real]
  finite = ~np.isnan(np.asarray(col_scale))  # a NaN column's base is not meaningful
  np.testing.assert_array_equal(base[finite], np.maximum(e.max(0) - 6, -126)[finite])


@pytest.mark.gpu
@pytest.mark.parametrize("wide", [False, True])
def test_unpack_gpu(wide):
  """The kernels on the H200 (the fold's metadata, its unpack, the int4 unpack), equal to
  the XLA reference at 8192 x 4096."""
  p = params("w4a8-mxfp4", 8192, 4096, seed=4, wide=wide)
  for w, h in zip(jax.jit(wm.mx_fold_metadata)(p),
                  jax.jit(lambda p: wm.mx_fold_metadata(p, pallas=True))(p)):
    np.testing.assert_array_equal(np.asarray(h), np.asarray(w))
  want = bits(jax.jit(wm.mx_fold_codes)(p))
  got = bits(jax.jit(lambda p: wm.mx_fold_codes(p, pallas=True))(p))
  np.testing.assert_array_equal(got, want)
  p = params("w4a8-fp8", 8192, 4096, seed=5)
  np.testing.assert_array_equal(bits(jax.jit(lambda p: wm._carrier_codes(p, pallas=True))(p)),
                                bits(jax.jit(wm._carrier_codes)(p)))


def k_order_codes(p):
  """The K-order codes of prepared params (``wm.prepare`` stores 4-bit codes in the
  permuted order of ":pk" layouts; ``permute_k`` is an involution)."""
  assert wm.wna16_mgpu.code_order(p.layout) == "pk"
  return mc.permute_k(p.codes.astype(jnp.int8)).astype(jnp.int4)


def group_params(group):
  """MXFP4-like params (e8m0 scales) in groups of ``group``: (params, K-order codes,
  fold metadata) -- several stored runs of 32 per scale group (the shift broadcast)."""
  spec = hj.QuantSpec("fp4_e2m1", "group", group, scale_dtype="e8m0", act="fp8_e4m3")
  w = jax.random.normal(jax.random.key(group), (384, 256), jnp.float32) / 40
  pg = wm.prepare(hj.quantize(w, spec))
  return pg, k_order_codes(pg), wm.mx_fold_metadata(pg)


@pytest.mark.parametrize("wide", [False, True])
def test_pk_order_is_the_k_order(wide):
  """The unpack of codes in the permuted K order of ":pk" layouts (``order="pk"``, what
  wnam_mgpu.prepare stores for 4-bit codes) is bit-equal to the unpack of the same codes
  in K order: int codes, e2m1 with and without the fold, groups of 32 / 64 / 128 (one
  or several runs of 32 per scale group); groups under 32 are refused."""
  p = params("w4a8-mxfp4", 384, 256, seed=1, wide=wide)
  k_order = k_order_codes(p)
  meta = wm.mx_fold_metadata(p)
  for sc, mt in ((p.scales, meta), (None, None)):
    want = bits(cu.unpack(k_order, sc, mt, kind="e2m1", interpret=True))
    got = bits(cu.unpack(p.codes, sc, mt, kind="e2m1", interpret=True, order="pk"))
    np.testing.assert_array_equal(got, want)
  for group in (64, 128):
    pg, kg, mg = group_params(group)
    np.testing.assert_array_equal(
        bits(cu.unpack(pg.codes, pg.scales, mg, kind="e2m1", interpret=True, order="pk")),
        bits(cu.unpack(kg, pg.scales, mg, kind="e2m1", interpret=True)))
  pi = params("w4a8-fp8", 384, 256, seed=6)
  ki = k_order_codes(pi)
  want = bits(cu.unpack(ki, kind="int", interpret=True))
  assert len(np.unique(want)) >= 15
  np.testing.assert_array_equal(bits(cu.unpack(pi.codes, kind="int", interpret=True,
                                               order="pk")), want)
  with pytest.raises(ValueError, match=r"scales: groups of 16 codes .*order='pk' needs"):
    cu.unpack(p.codes, jnp.ones((3 * 8, 256), jnp.bfloat16), meta._replace(
        normal=jnp.ones((4, 3), jnp.int32)), kind="e2m1", order="pk")


@pytest.mark.parametrize("wide", [False, True])
def test_p8_order_is_the_k_order(wide):
  """The unpack of codes stored in the fp8-MMA order (``order="p8"``) is bit-equal to the
  unpack of the same codes in K order: the fold (normal and far-group blocks) and the
  plain e2m1 carrier; int codes and groups under 32 are refused."""
  p = params("w4a8-mxfp4", 384, 256, seed=1, wide=wide)
  k_order = k_order_codes(p)
  stored = mc.p8_store(k_order.astype(jnp.int8)).astype(jnp.int4)
  meta = wm.mx_fold_metadata(p)
  for sc, mt in ((p.scales, meta), (None, None)):
    want = bits(cu.unpack(k_order, sc, mt, kind="e2m1", interpret=True))
    got = bits(cu.unpack(stored, sc, mt, kind="e2m1", interpret=True, order="p8"))
    np.testing.assert_array_equal(got, want)
  for group in (64, 128):
    pg, kg, mg = group_params(group)
    sg = mc.p8_store(kg.astype(jnp.int8)).astype(jnp.int4)
    np.testing.assert_array_equal(
        bits(cu.unpack(sg, pg.scales, mg, kind="e2m1", interpret=True, order="p8")),
        bits(cu.unpack(kg, pg.scales, mg, kind="e2m1", interpret=True)))
  with pytest.raises(ValueError, match="order='p8', kind='int'"):
    cu.unpack(stored, kind="int", order="p8")
  with pytest.raises(ValueError, match=r"scales: groups of 16 codes .*order='p8' needs"):
    cu.unpack(stored, jnp.ones((3 * 8, 256), jnp.bfloat16), meta._replace(
        normal=jnp.ones((4, 3), jnp.int32)), kind="e2m1", order="p8")
