"""The one-pass activation pre-pass (kernels/act_prepass.py) against XLA's pre-pass
(``w8a8.act_operands``'s two fusions), in the interpreter and on the H200."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from humming_jax.kernels import act_prepass, w8a8
from humming_jax.quantize import carrier_dtype, fake_quantize_activations, kernel_activations
from humming_jax.spec import QuantSpec

SPECS = ["w8a8-fp8", "w8a8-int8", "w4a8-mxfp4"]


def _x(m, k, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1)))
  x[:, 5] *= 30  # an outlier column: most codes far below the row's amax
  x[1] = 0.0  # an all-zero row: scale 1, zero codes
  x[2, 7] = np.nan  # a NaN row: NaN scale
  if m > 3:
    x[3, 9] = np.inf  # an inf row: NaN scale
  return jnp.asarray(x, jnp.bfloat16)


def _both(x, spec, rows, kp, interpret):
  """(XLA's pre-pass, the kernel's).  FUSED_PREPASS is off while act_operands traces: at
  M >= FUSED_PREPASS_MIN_M it would take the kernel itself."""
  plan = w8a8.plan_for(spec)
  fused, w8a8.FUSED_PREPASS = w8a8.FUSED_PREPASS, False
  try:
    want = w8a8.act_operands(x, spec, plan, None, rows=rows, kp=kp)
  finally:
    w8a8.FUSED_PREPASS = fused
  got = act_prepass.quantize_rows(x, spec, rows=rows, kp=kp, interpret=interpret)
  return want, got


def _assert_same(want, got):
  (wa, ws), (ga, gs) = want, got
  assert ga.shape == wa.shape and ga.dtype == wa.dtype and gs.shape == ws.shape
  np.testing.assert_array_equal(np.asarray(gs), np.asarray(ws))  # NaN where NaN
  bad = np.isnan(np.asarray(ws))[:, 0]  # NaN rows: codes are not meaningful
  view = np.int8 if wa.dtype == jnp.int8 else np.uint8
  np.testing.assert_array_equal(np.asarray(ga).view(view)[~bad],
                                np.asarray(wa).view(view)[~bad])


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("m,k,rows,kp", [(12, 384, 16, 384), (8, 7168, 8, 7168),
                                         (5, 256, 128, 384)])
def test_one_pass_is_the_xla_prepass(name, m, k, rows, kp):
  """Bit-equal codes and scales: chunks of 128 / 1024 columns, padding rows and columns,
  zero / NaN / inf rows, saturation (int8: -128 never from a dynamic scale)."""
  spec = QuantSpec.preset(name)
  x = _x(m, k, seed=m + k)
  _assert_same(*_both(x, spec, rows, kp, interpret=True))


@pytest.mark.parametrize("name", ["w8a8-fp8", "w8a8-int8"])
def test_reread_rows_are_the_same(name, monkeypatch):
  """Rows wider than MAX_HELD_K are read twice instead of held: the same codes.  A fresh
  jit of the unjitted body (the flag is read at trace time; quantize_rows' cache would
  return the held trace)."""
  spec = QuantSpec.preset(name)
  x = _x(8, 7168, seed=3)
  monkeypatch.setattr(act_prepass, "MAX_HELD_K", 0)
  got = jax.jit(lambda x: act_prepass.quantize_rows.__wrapped__(
      x, spec, rows=8, kp=7168, interpret=True))(x)
  _assert_same(_both(x, spec, 8, 7168, interpret=True)[0], got)


def test_supports_and_refusals():
  assert act_prepass.supports(QuantSpec.preset("w8a8-fp8"))
  assert not act_prepass.supports(QuantSpec.preset("w8a8-fp8-block"))  # group scales
  assert not act_prepass.supports(QuantSpec.preset("w4a16-g128"))  # no activations
  static = QuantSpec("int8", "channel", act="int8", act_granularity="tensor",
                     act_static=True)
  assert not act_prepass.supports(static)
  x = _x(4, 256, 0)
  with pytest.raises(ValueError, match="one-pass pre-pass takes dynamic per-token"):
    act_prepass.quantize_rows(x, static, rows=4, kp=256, interpret=True)
  with pytest.raises(ValueError, match="rows=2, kp=256: expected rows >= M=4"):
    act_prepass.quantize_rows(x, QuantSpec.preset("w8a8-fp8"), rows=2, kp=256,
                              interpret=True)


def test_act_operands_takes_it_when_on(monkeypatch):
  """FUSED_PREPASS routes per-token specs from FUSED_PREPASS_MIN_M rows to the kernel (its
  name in the jaxpr) and leaves the others on XLA."""
  monkeypatch.setattr(w8a8, "FUSED_PREPASS", True)
  monkeypatch.setattr(w8a8, "FUSED_PREPASS_MIN_M", 8)
  spec = QuantSpec.preset("w8a8-fp8")
  plan = w8a8.plan_for(spec)
  x = _x(8, 256, 1)
  # Traced only (no lowering): the GPU route's jaxpr, and the interpreter's.
  text = str(jax.make_jaxpr(lambda x: w8a8.act_operands(
      x, spec, plan, None, rows=8, kp=256))(x))
  assert "act_prepass_fp8_e4m3" in text
  interp = str(jax.make_jaxpr(lambda x: w8a8.act_operands(
      x, spec, plan, None, rows=8, kp=256, interpret=True))(x))
  assert "act_prepass" not in interp  # the interpreter keeps XLA's pre-pass
  small = str(jax.make_jaxpr(lambda x: w8a8.act_operands(
      x[:4], spec, plan, None, rows=4, kp=256))(x))
  assert "act_prepass" not in small
  monkeypatch.setattr(w8a8, "FUSED_PREPASS", False)
  off = str(jax.make_jaxpr(lambda x: w8a8.act_operands(
      x, spec, plan, None, rows=8, kp=256))(x))
  assert "act_prepass" not in off


@pytest.mark.gpu
@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("k", [8192, 14336])  # rows held in registers / read twice
def test_one_pass_gpu(name, k):
  """On the H200 at the benchmark's prefill shape.  Triton's float32 division may round
  differently from XLA's in the last place, so a value on a rounding boundary may move to
  the neighbouring code: at most 1e-4 of the codes may differ, each by one code step."""
  spec = QuantSpec.preset(name)
  x = _x(4096, k, seed=3)
  (wa, ws), (ga, gs) = jax.jit(lambda x: _both(x, spec, 4096, k, interpret=False))(x)
  np.testing.assert_array_equal(np.asarray(gs), np.asarray(ws))
  bad = np.isnan(np.asarray(ws))[:, 0]
  if wa.dtype == jnp.int8:  # integer codes: a step is 1
    w, g = (np.asarray(a)[~bad].astype(np.int32) for a in (wa, ga))
    step = np.abs(w - g)
  else:  # fp8 codes: sign bit and a magnitude that orders the values
    w, g = (np.asarray(a).view(np.uint8)[~bad].astype(np.int32) for a in (wa, ga))
    signed = lambda c: np.where(c & 0x80, -(c & 0x7F), c & 0x7F)
    step = np.abs(signed(w) - signed(g))
  assert (step != 0).mean() <= 1e-4, (step != 0).mean()
  assert step.max() <= 1, step.max()


FAKE_SPECS = ["w8a8-fp8", "w8a8-int8", "w4a8-mxfp4", "w4a8-e5m2act"]


def _spec(name):
  if name == "w4a8-e5m2act":
    return QuantSpec("int4", "group", 128, act="fp8_e5m2")
  return QuantSpec.preset(name)


def _fake_xla(x, spec):
  return fake_quantize_activations(x, spec).astype(x.dtype)


@pytest.mark.parametrize("name", FAKE_SPECS)
@pytest.mark.parametrize("m,k,dtype", [(1, 8192, jnp.bfloat16), (4, 384, jnp.float16),
                                       (12, 7168, jnp.bfloat16)])
def test_fake_quant_is_xla_fake_quant(name, m, k, dtype):
  """``fake_quantize_rows`` (the W4A8 decode's one-launch pre-pass) gives XLA's
  ``fake_quantize_activations`` rounded to x's dtype bit for bit: one and several rows,
  chunks of 128 / 1024 / 2048 columns, zero / NaN / inf rows, float16 x."""
  spec = _spec(name)
  x = _x(max(m, 4), k, seed=m + k).astype(dtype)[:m]  # m = 1: a row of the usual kinds
  want = _fake_xla(x, spec)
  got = act_prepass.fake_quantize_rows(x, spec, interpret=True)
  assert got.shape == x.shape and got.dtype == x.dtype
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  finite = np.isfinite(np.asarray(x, np.float32)).all(1)
  assert not np.array_equal(np.asarray(got)[finite], np.asarray(x)[finite])  # it rounded


def test_fake_quant_refusals():
  x = _x(4, 256, 0)
  static = QuantSpec("int8", "channel", act="int8", act_granularity="tensor",
                     act_static=True)
  for spec, arr in ((static, x), (QuantSpec.preset("w8a8-fp8-block"), x),
                    (QuantSpec.preset("w8a8-fp8"), x.astype(jnp.float32)),
                    (QuantSpec.preset("w8a8-fp8"), x[:, :200])):
    assert not act_prepass.fake_quantize_applies(arr, spec)
    with pytest.raises(ValueError, match="one-pass fake quantization takes dynamic"):
      act_prepass.fake_quantize_rows(arr, spec, interpret=True)


def test_wnam_decode_takes_it_on_the_gpu_route(monkeypatch):
  """``wnam_mgpu.decode_activations``: the kernel (its name in the jaxpr) on the GPU route
  of a per-token spec at decode rows; XLA's fake quantization in the interpreter, from
  FUSED_PREPASS_MIN_M rows, with HUMMING_JAX_DECODE_PREPASS=0, and for a static
  per-tensor spec."""
  import humming_jax as hj
  from humming_jax.kernels import wnam_mgpu
  w = jax.random.normal(jax.random.key(0), (256, 128), jnp.float32) / 16
  x = _x(4, 256, 2)
  p = wnam_mgpu.prepare(hj.quantize(w, "w4a8-int8"))
  route = lambda **kw: str(jax.make_jaxpr(
      lambda x: wnam_mgpu.decode_activations(x, p, **kw))(x))
  assert "act_fake_quant_int8" in route()
  assert "act_fake_quant" not in route(interpret=True)
  big = _x(w8a8.FUSED_PREPASS_MIN_M, 256, 3)  # prefill rows: the decode kernel is not for them
  assert "act_fake_quant" not in str(jax.make_jaxpr(
      lambda x: wnam_mgpu.decode_activations(x, p))(big))
  monkeypatch.setenv("HUMMING_JAX_DECODE_PREPASS", "0")
  assert "act_fake_quant" not in route()
  monkeypatch.delenv("HUMMING_JAX_DECODE_PREPASS")
  static = QuantSpec("int4", "group", 128, act="int8", act_granularity="tensor",
                     act_static=True)
  ps = wnam_mgpu.prepare(hj.quantize(w, static, act_scale=jnp.float32(0.05)))
  assert "act_fake_quant" not in str(jax.make_jaxpr(
      lambda x: wnam_mgpu.decode_activations(x, ps))(x))


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAKE_SPECS)
@pytest.mark.parametrize("m,k", [(1, 8192), (16, 8192), (16, 14336)])
def test_fake_quant_gpu(name, m, k):
  """On the H200 at decode shapes against XLA's fake quantization: Triton's float32
  division may move a value on a rounding boundary to the neighbouring code (as in
  ``test_one_pass_gpu``), so at most 1e-3 of the values may differ, each by at most one
  code step (int8: the scale; fp8: a quarter of the value, or the subnormal step)."""
  spec = _spec(name)
  x = _x(max(m, 4), k, seed=7)[:m]
  want, got = jax.jit(lambda x: (_fake_xla(x, spec),
                                 act_prepass.fake_quantize_rows(x, spec)))(x)
  w, g = (np.asarray(a, np.float32) for a in (want, got))
  ok = np.isfinite(w).all(1)
  w, g = w[ok], g[ok]
  assert np.isnan(np.asarray(got, np.float32)[~ok]).all()
  diff = np.abs(g - w)
  assert (diff != 0).mean() <= 1e-3, (diff != 0).mean()
  amax = np.abs(np.asarray(x, np.float32)[ok]).max(1, keepdims=True)
  if spec.act == "int8":
    bound = amax / 127 * 1.02
  else:
    bound = np.abs(w) * 0.26 + amax / spec.act_format.max_value * 2.0 ** -6
  assert (diff <= bound).all()


# ---------------------------------------------------------------------------------------
# decode_codes_rows: W8A8's decode codes, as x.dtype values or in the 8-bit carrier
# (w8a8.run_decode_mgpu)
# ---------------------------------------------------------------------------------------
CODE_SPECS = ["w8a8-int8", "w8a8-fp8", "w4a8-e5m2act"]


def _codes_xla(x, spec, carrier=False):
  """XLA's pre-pass of the decode route: the codes as x.dtype values (or ``carrier``: in
  the spec's 8-bit carrier), (M, 1) scales."""
  m, k = x.shape
  qa = kernel_activations(x, spec, None, rows=m, kp=k,
                          values_dtype=None if carrier else x.dtype)
  return qa.values, qa.scales


@pytest.mark.parametrize("carrier", [False, True])
@pytest.mark.parametrize("name", CODE_SPECS)
@pytest.mark.parametrize("m,k,dtype", [(1, 8192, jnp.bfloat16), (4, 384, jnp.float16),
                                       (12, 7168, jnp.bfloat16)])
def test_decode_codes_are_the_xla_prepass(name, m, k, dtype, carrier):
  """``decode_codes_rows``: XLA's codes (as x.dtype values, or in the carrier) and scales
  bit for bit in the interpreter -- one and several rows, zero / NaN / inf rows, float16
  x."""
  spec = _spec(name)
  x = _x(max(m, 4), k, seed=m + k + 1).astype(dtype)[:m]
  wa, ws = _codes_xla(x, spec, carrier)
  codes_dtype = carrier_dtype(spec.act_format) if carrier else None
  ga, gs = act_prepass.decode_codes_rows(x, spec, codes_dtype=codes_dtype, interpret=True)
  assert ga.shape == x.shape and gs.shape == (m, 1)
  assert ga.dtype == (jnp.dtype(codes_dtype) if carrier else x.dtype) == wa.dtype
  np.testing.assert_array_equal(np.asarray(gs), np.asarray(ws))  # NaN where NaN
  ok = ~np.isnan(np.asarray(ws))[:, 0]  # NaN rows: the codes are not meaningful
  g, w = np.asarray(ga, np.float32)[ok], np.asarray(wa, np.float32)[ok]
  np.testing.assert_array_equal(g, w)
  assert np.abs(g).max() > 1  # codes, not values times a scale
  if spec.act == "int8":
    assert (g == np.round(g)).all()


@pytest.mark.parametrize("splits", [2, 8])
@pytest.mark.parametrize("m,k", [(1, 8192), (3, 7168), (2, 9216)])
def test_split_rows_are_the_same(splits, m, k):
  """Rows split over ``splits`` programs (each reads the whole row for the amax and
  converts 1/splits of it): XLA's codes and scales (int8 in the carrier, fp8 as 16-bit
  values) and fake quantization bit for bit, as with one program per row; the 7168-column
  rows split into 896-column parts (chunks of 128); 9216 columns are past MAX_HELD_K (the
  amax re-reads its chunks)."""
  x = _x(max(m, 4), k, seed=splits + k)[:m]
  for name, carrier in (("w8a8-int8", True), ("w8a8-fp8", False)):
    spec = _spec(name)
    wa, ws = _codes_xla(x, spec, carrier)
    codes_dtype = carrier_dtype(spec.act_format) if carrier else None
    ga, gs = act_prepass.decode_codes_rows(x, spec, codes_dtype=codes_dtype,
                                           interpret=True, splits=splits)
    np.testing.assert_array_equal(np.asarray(gs), np.asarray(ws))
    ok = ~np.isnan(np.asarray(ws))[:, 0]
    g, w = np.asarray(ga, np.float32)[ok], np.asarray(wa, np.float32)[ok]
    np.testing.assert_array_equal(g, w)
    assert np.abs(g).max() > 1
  spec = _spec("w4a8-e5m2act")
  got = act_prepass.fake_quantize_rows(x, spec, interpret=True, splits=splits)
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(_fake_xla(x, spec), np.float32))


def test_decode_splits_rule(monkeypatch):
  """The default programs per row (``DECODE_SPLITS``, or HUMMING_JAX_PREPASS_SPLITS)
  halve until the parts are multiples of 128 columns; the override reaches a fresh trace
  of the jitted launch (it is resolved outside it); bad values are refused by name."""
  monkeypatch.delenv(act_prepass.SPLITS_ENV, raising=False)
  monkeypatch.delenv(act_prepass.WARPS_ENV, raising=False)
  assert act_prepass.decode_splits(8192) == act_prepass.DECODE_SPLITS
  top = act_prepass.SPLIT_MAX_M  # the split form's timed rows; past them one 4-warp program
  assert act_prepass.decode_splits(8192, top) == act_prepass.DECODE_SPLITS
  assert act_prepass.decode_warps(top) == act_prepass.DECODE_WARPS
  assert act_prepass.decode_splits(8192, top + 1) == 1
  assert act_prepass.decode_warps(top + 1) == 0  # NUM_WARPS' rule
  assert act_prepass.decode_warps(top + 1, splits=4) == act_prepass.DECODE_WARPS
  big = _x(top + 1, 1024, 5)
  assert re.findall(r"grid=\(([0-9, ]+)\)", str(jax.make_jaxpr(
      lambda x: act_prepass.decode_codes_rows(x, QuantSpec.preset("w8a8-int8"),
                                              interpret=True))(big))) == [f"{top + 1}, 1"]
  monkeypatch.setenv(act_prepass.SPLITS_ENV, "8")
  assert act_prepass.decode_splits(8192) == 8
  assert act_prepass.decode_splits(384) == 1  # 384 = 3 x 128
  assert act_prepass.decode_splits(768) == 2
  x = _x(4, 1024, 3)[:2]
  spec = QuantSpec.preset("w8a8-int8")
  launch = lambda: re.findall(r"grid=\(([0-9, ]+)\)|num_warps=([0-9]+)", str(
      jax.make_jaxpr(lambda x: act_prepass.decode_codes_rows(x, spec, interpret=True))(x)))
  assert sorted(launch()) == [("", str(act_prepass.DECODE_WARPS)), ("2, 8", "")]
  monkeypatch.setenv(act_prepass.SPLITS_ENV, "1")
  monkeypatch.setenv(act_prepass.WARPS_ENV, "16")
  assert sorted(launch()) == [("", "16"), ("2, 1", "")]  # both reach a fresh trace
  monkeypatch.setenv(act_prepass.WARPS_ENV, "6")
  with pytest.raises(ValueError, match="HUMMING_JAX_PREPASS_WARPS=6: expected 0 .the "
                                       "default rule. or a power of two up to 32"):
    act_prepass.decode_warps(1)
  monkeypatch.delenv(act_prepass.WARPS_ENV)
  monkeypatch.setenv(act_prepass.SPLITS_ENV, "3")
  with pytest.raises(ValueError, match="HUMMING_JAX_PREPASS_SPLITS=3: expected a power of "
                                       "two"):
    act_prepass.decode_splits(8192)
  monkeypatch.delenv(act_prepass.SPLITS_ENV)
  with pytest.raises(ValueError, match=r"splits=4: expected a power of two dividing "
                                       r"K=384 into parts of a multiple of 128"):
    act_prepass.decode_codes_rows(_x(4, 384, 1), spec, interpret=True, splits=4)


def test_decode_codes_refusals():
  x = _x(4, 256, 0)
  static = QuantSpec("int8", "channel", act="int8", act_granularity="tensor",
                     act_static=True)
  for spec, arr in ((static, x), (QuantSpec.preset("w8a8-fp8"), x[:, :200])):
    with pytest.raises(ValueError, match="the decode codes take dynamic per-token"):
      act_prepass.decode_codes_rows(arr, spec, interpret=True)
  with pytest.raises(ValueError, match="codes_dtype=float16: expected the spec's carrier "
                                       "int8 or x.dtype bfloat16"):
    act_prepass.decode_codes_rows(x, QuantSpec.preset("w8a8-int8"), codes_dtype=jnp.float16,
                                  interpret=True)


def test_w8a8_decode_takes_it_on_the_gpu_route(monkeypatch):
  """``w8a8.run_decode_mgpu``: the one-launch codes (its kernel name in the jaxpr) on the
  GPU route of a per-token spec; XLA's pre-pass in the interpreter, with
  HUMMING_JAX_DECODE_PREPASS=0, for a static spec and where K is padded."""
  import humming_jax as hj
  w = jax.random.normal(jax.random.key(0), (256, 128), jnp.float32) / 16
  x = _x(4, 256, 2)
  p = w8a8.prepare(hj.quantize(w, "w8a8-fp8"))
  route = lambda p, x, **kw: str(jax.make_jaxpr(
      lambda x: w8a8.run_decode_mgpu(p, x, **kw))(x))
  assert "act_decode_codes_fp8_e4m3" in route(p, x)
  assert "act_decode_codes" not in route(p, x, interpret=True)
  monkeypatch.setenv("HUMMING_JAX_DECODE_PREPASS", "0")
  assert "act_decode_codes" not in route(p, x)
  monkeypatch.delenv("HUMMING_JAX_DECODE_PREPASS")
  static = QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                     act_granularity="tensor", act_static=True)
  ps = w8a8.prepare(hj.quantize(w, static, act_scale=jnp.float32(0.05)))
  assert "act_decode_codes" not in route(ps, x)
  w200 = jax.random.normal(jax.random.key(1), (200, 128), jnp.float32) / 16  # K padded
  assert "act_decode_codes" not in route(w8a8.prepare(hj.quantize(w200, "w8a8-int8")),
                                         x[:, :200])


@pytest.mark.gpu
@pytest.mark.parametrize("carrier", [False, True])
@pytest.mark.parametrize("name", CODE_SPECS)
@pytest.mark.parametrize("m,k", [(1, 8192), (16, 8192), (16, 14336)])
def test_decode_codes_gpu(name, m, k, carrier):
  """On the GPU at decode shapes against XLA's pre-pass (16-bit values or the 8-bit
  carrier): scales bit for bit; Triton's float32 division may move a value on a rounding
  boundary to the neighbouring code (as in ``test_fake_quant_gpu``): at most 1e-3 of the
  codes, each one step (int8: 1; fp8: a quarter of the value, or the subnormal step)."""
  spec = _spec(name)
  x = _x(max(m, 4), k, seed=8)[:m]
  codes_dtype = carrier_dtype(spec.act_format) if carrier else None
  (wa, ws), (ga, gs) = jax.jit(lambda x: (
      _codes_xla(x, spec, carrier),
      act_prepass.decode_codes_rows(x, spec, codes_dtype=codes_dtype)))(x)
  assert ga.dtype == wa.dtype
  np.testing.assert_array_equal(np.asarray(gs), np.asarray(ws))
  ok = ~np.isnan(np.asarray(ws))[:, 0]
  w, g = np.asarray(wa, np.float32)[ok], np.asarray(ga, np.float32)[ok]
  diff = np.abs(g - w)
  assert (diff != 0).mean() <= 1e-3, (diff != 0).mean()
  bound = (1.0 if spec.act == "int8"
           else np.abs(w) * 0.26 + 2.0 ** (1 - spec.act_format.bias
                                           - spec.act_format.mantissa_bits))
  assert (diff <= bound).all()


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 4, 8])
@pytest.mark.parametrize("m,k", [(1, 8192), (16, 8192), (16, 14336)])
def test_split_rows_gpu(splits, m, k):
  """On the GPU, rows split over ``splits`` programs give the one-program launch's codes,
  scales and fake-quantized values bit for bit (the same float32 arithmetic per value and
  the same amax), for int8 in the carrier, fp8 as 16-bit values and W4A8's fake
  quantization; and XLA's scales."""
  x = _x(max(m, 4), k, seed=9)[:m]
  for name, carrier in (("w8a8-int8", True), ("w8a8-fp8", False)):
    spec = _spec(name)
    codes_dtype = carrier_dtype(spec.act_format) if carrier else None
    (ws_xla, (a1, s1), (a2, s2)) = jax.jit(lambda x: (
        _codes_xla(x, spec, carrier)[1],
        act_prepass.decode_codes_rows(x, spec, codes_dtype=codes_dtype, splits=1),
        act_prepass.decode_codes_rows(x, spec, codes_dtype=codes_dtype, splits=splits)))(x)
    np.testing.assert_array_equal(np.asarray(s2), np.asarray(ws_xla))
    np.testing.assert_array_equal(np.asarray(s2), np.asarray(s1))
    np.testing.assert_array_equal(np.asarray(a2, np.float32), np.asarray(a1, np.float32))
    assert np.abs(np.asarray(a2, np.float32)[np.isfinite(np.asarray(s2))[:, 0]]).max() > 1
  spec = _spec("w4a8-mxfp4")  # fp8 activations
  f1, f2 = jax.jit(lambda x: (act_prepass.fake_quantize_rows(x, spec, splits=1),
                              act_prepass.fake_quantize_rows(x, spec, splits=splits)))(x)
  np.testing.assert_array_equal(np.asarray(f2, np.float32), np.asarray(f1, np.float32))
