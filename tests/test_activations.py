"""Activation quantization: dynamic per token (int8, fp8), per token-group fp8 (128),
NVFP4 / MXFP4 per block, static per tensor; scales shapes and the error of each format."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.quantize import kernel_activations
from humming_jax.spec import QuantSpec


def x_act(m=16, k=256, seed=0):
  rng = np.random.default_rng(seed)
  # Rows with different magnitudes (per-token scales matter) and a few outliers.
  x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-2, 2, (m, 1)))
  x[:, 7] *= 20
  return jnp.asarray(x, jnp.bfloat16)


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# spec, scales shape for (16, 256), error bound, value carrier dtype.  The bounds allow for
# the 20x outlier column of x_act (per-token int8 and MXFP4 blocks lose the small values).
CASES = [
    (QuantSpec("int8", "channel", act="int8"), (16, 1), 0.03, jnp.int8),
    (QuantSpec("fp8_e4m3", "channel", scale_dtype="float32", act="fp8_e4m3"), (16, 1), 0.04,
     jnp.float8_e4m3fn),
    (QuantSpec("fp8_e4m3", "channel", scale_dtype="float32", act="fp8_e5m2"), (16, 1), 0.08,
     jnp.float8_e5m2),
    (hj.PRESETS["w8a8-fp8-block"], (16, 2), 0.04, jnp.float8_e4m3fn),
    (hj.PRESETS["w4a4-nvfp4"], (16, 16), 0.12, jnp.float8_e4m3fn),
    (hj.PRESETS["w4a4-mxfp4"], (16, 8), 0.17, jnp.float8_e4m3fn),
    (hj.PRESETS["w8a8-mxfp8"], (16, 8), 0.04, jnp.float8_e4m3fn),
]


@pytest.mark.parametrize("spec,sshape,tol,carrier", CASES, ids=[c[0].name for c in CASES])
def test_dynamic_activation_quantization(spec, sshape, tol, carrier):
  x = x_act()
  qa = hj.quantize_activations(x, spec)
  assert qa.values.shape == x.shape and qa.values.dtype == carrier
  assert qa.scales.shape == sshape and qa.scales.dtype == jnp.float32
  fmt = spec.act_format
  v = np.asarray(qa.values, np.float32)
  # Values are on the format's grid and within range.
  np.testing.assert_array_equal(np.asarray(fmt.quantize_dequantize(jnp.asarray(v))), v)
  assert np.abs(v).max() <= fmt.max_value
  d = qa.dequantize()
  assert d.dtype == jnp.float32 and d.shape == x.shape
  np.testing.assert_array_equal(np.asarray(d), np.asarray(hj.fake_quantize_activations(x, spec)))
  # Dequantize = values * broadcast scales, by hand.
  s = np.asarray(qa.scales)
  full = np.repeat(np.repeat(s, 16 // s.shape[0], 0), 256 // s.shape[1], 1)
  np.testing.assert_array_equal(np.asarray(d), v * full)
  assert rel_err(d, x) < tol, rel_err(d, x)
  # jit gives the same.
  qj = jax.jit(hj.quantize_activations, static_argnums=1)(x, spec)
  np.testing.assert_array_equal(np.asarray(qj.dequantize()), np.asarray(d))


def test_per_token_scale_semantics():
  x = x_act(8, 128, 1)
  xa = np.abs(np.asarray(x, np.float32))
  qa = hj.quantize_activations(x, QuantSpec("int8", "channel", act="int8"))
  np.testing.assert_allclose(np.asarray(qa.scales)[:, 0], xa.max(1) / 127, rtol=1e-6)
  codes = np.clip(np.rint(np.asarray(x, np.float32) / np.asarray(qa.scales)), -128, 127)
  np.testing.assert_array_equal(np.asarray(qa.values), codes)
  # The row maximum reaches +-127 exactly.
  assert np.all(np.abs(np.asarray(qa.values)).max(1) == 127)
  # Token-group fp8 (128): s = amax(row, group) / 448, values = e4m3 cast of x / s.
  spec = hj.PRESETS["w8a8-fp8-block"]
  x = x_act(4, 256, 2)
  qa = hj.quantize_activations(x, spec)
  g = np.asarray(x, np.float32).reshape(4, 2, 128)
  s = np.abs(g).max(2) / 448
  np.testing.assert_allclose(np.asarray(qa.scales), s, rtol=3e-7)
  want = (g / np.asarray(qa.scales)[:, :, None]).astype(ml_dtypes.float8_e4m3fn)
  np.testing.assert_array_equal(np.asarray(qa.values).reshape(4, 2, 128).view(np.uint8),
                                want.view(np.uint8))


def test_mx_and_nvfp4_scales():
  x = x_act(4, 128, 3)
  a = np.abs(np.asarray(x, np.float64))
  qa = hj.quantize_activations(x, hj.PRESETS["w4a4-mxfp4"])
  amax = a.reshape(4, 4, 32).max(2)
  np.testing.assert_array_equal(np.asarray(qa.scales), 2.0 ** (np.floor(np.log2(amax)) - 2))
  qa = hj.quantize_activations(x, hj.PRESETS["w4a4-nvfp4"])
  amax = a.reshape(4, 8, 16).max(2)
  s2 = amax.max() / (6 * 448)
  rel = (np.asarray(qa.scales) / s2)  # e4m3 grid values of amax_block / 6 / s2
  want = (amax / 6 / s2).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
  np.testing.assert_allclose(rel, want, rtol=1e-5)


@pytest.mark.parametrize("act", ["fp4_e2m1", "fp8_e4m3"])
def test_mx_scales_rounded_up(act):
  """act_mx_rounding="up" (compressed-tensors / vLLM's MX reference): each group's amax is
  rounded to a power of two -- up where its significand is >= 1.75 -- before the exponent
  is taken, emax subtracted.  Groups are placed on both sides of 1.75 exactly."""
  spec = (hj.PRESETS["w4a4-mxfp4"] if act == "fp4_e2m1" else hj.PRESETS["w8a8-mxfp8"]
          ).replace(act_mx_rounding="up")
  assert spec.name.endswith("-mxup") and hj.PRESETS["w4a4-mxfp4"].act_mx_rounding == "floor"
  x = np.asarray(x_act(4, 128, 5), np.float32)
  x = x * (0.25 / np.abs(x).max())  # every value at most 0.25 ...
  g = x.reshape(4, 4, 32)
  for j, v in enumerate((1.75, 1.7421875, 3.0, 0.4375)):  # 1.7421875: the bf16 below 1.75
    g[j, j, 5] = v  # ... so each planted value is its group's amax
  x = jnp.asarray(g.reshape(4, 128), jnp.bfloat16)
  amax = np.abs(np.asarray(x, np.float64)).reshape(4, 4, 32).max(2)
  e = np.floor(np.log2(amax))
  e = e + (amax >= 1.75 * 2.0 ** e)
  emax = spec.act_format.emax
  qa = hj.quantize_activations(x, spec)
  np.testing.assert_array_equal(np.asarray(qa.scales), 2.0 ** (e - emax))
  floor = hj.quantize_activations(x, spec.replace(act_mx_rounding="floor"))
  ratio = np.asarray(qa.scales) / np.asarray(floor.scales)
  assert set(np.unique(ratio)) == {1.0, 2.0}  # the rounded-up groups, and only those
  assert ratio[0, 0] == 2.0 and ratio[1, 1] == 1.0 and ratio[3, 3] == 2.0


def test_static_per_tensor_scale():
  spec = QuantSpec("int8", "channel", act="int8", act_granularity="tensor", act_static=True)
  x = x_act(8, 128, 4).astype(jnp.float32)
  scale = 0.05  # deliberately small: values beyond 127 * 0.05 saturate to -128 / 127
  qa = hj.quantize_activations(x, spec, act_scale=scale)
  assert qa.scales.shape == (1, 1) and float(qa.scales[0, 0]) == np.float32(scale)
  want = np.clip(np.rint(np.asarray(x) / np.float32(scale)), -128, 127)
  np.testing.assert_array_equal(np.asarray(qa.values), want)
  assert np.asarray(qa.values).min() == -128 and np.asarray(qa.values).max() == 127
  # Through the params: quantize(..., act_scale=) and quant_dense use it.
  w = np.random.default_rng(5).standard_normal((128, 32)).astype(np.float32)
  amax = float(np.abs(np.asarray(x)).max())
  p = hj.quantize(w, spec, act_scale=amax / 127)
  y = hj.quant_dense(p, x)
  xq = hj.fake_quantize_activations(x, spec, jnp.float32(amax / 127))
  np.testing.assert_allclose(np.asarray(y), np.asarray(xq) @ np.asarray(hj.dequantize(p)),
                             rtol=1e-5, atol=1e-4)
  assert rel_err(y, np.asarray(x) @ w) < 0.05
  with pytest.raises(ValueError, match="act_static=True but the params carry no act_scale"):
    hj.quantize_activations(x, spec)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_activations_propagate(bad):
  """A token holding NaN / inf comes out NaN; the other tokens keep the values they get
  without it (NVFP4's per-tensor global scale is taken over the finite groups: one bad
  token in a batch does not poison the rest)."""
  x = np.asarray(x_act(4, 256, 6), np.float32)
  x[1, 3] = bad
  clean = x.copy()
  clean[1, :16] = 0  # the bad value's NVFP4 block zeroed: it moves no scale
  for spec in [QuantSpec("int8", "channel", act="int8"), hj.PRESETS["w8a8-fp8"],
               hj.PRESETS["w4a4-nvfp4"], hj.PRESETS["w8a8-fp8-block"]]:
    fq = jax.jit(hj.fake_quantize_activations, static_argnums=1)
    d = np.asarray(fq(x, spec))
    assert np.isnan(d[1, 3]), spec.name
    assert np.all(np.isfinite(d[[0, 2, 3]])), spec.name  # other rows unharmed
    np.testing.assert_array_equal(d[[0, 2, 3]], np.asarray(fq(clean, spec))[[0, 2, 3]])


def test_activation_errors():
  x = x_act(4, 96)
  with pytest.raises(ValueError, match="act_group_size=128 does not divide K=96"):
    hj.quantize_activations(x, hj.PRESETS["w8a8-fp8-block"])
  with pytest.raises(ValueError, match="has no activation format"):
    hj.quantize_activations(x, hj.PRESETS["w4a16-g128"])
  with pytest.raises(ValueError, match=r"x must be a float \(M, K\) array; got shape \(2, 4, 96\)"):
    hj.quantize_activations(jnp.stack([x, x]), hj.PRESETS["w8a8-int8"])


def _operand_cases(spec, seed):
  """(spec, x, act_scale, the reference's quantization) for the kernel-operand tests: x
  with a row past the format's range after a small static scale (saturates), tiny
  negatives (round to -0, fp8 code 0x80) and a NaN; the spec's dynamic scales, then a
  static per-tensor one (group specs: dynamic only)."""
  x = np.asarray(x_act(8, 256, seed), np.float32)
  x[2] *= 1e4
  x[4, :5] = -1e-30
  x[5, 9] = np.nan
  for act_scale in (None, jnp.float32(0.02)):
    if act_scale is not None and spec.act_granularity == "group":
      continue  # static scales are per tensor
    s = spec if act_scale is None else spec.replace(act_granularity="tensor",
                                                    act_static=True)
    yield s, x, act_scale, jax.jit(lambda x, a: hj.quantize_activations(x, s, a))(x, act_scale)


@pytest.mark.parametrize("spec,sshape,tol,carrier", CASES, ids=[c[0].name for c in CASES])
def test_kernel_operand_values_are_the_reference(spec, sshape, tol, carrier):
  """``kernel_activations`` (the W8A8-family pre-pass: fp8 through one convert, the pad,
  then an optimization barrier) gives the reference's values bit for bit -- saturation,
  NaN rows, tiny negatives (-0) and a static scale included -- zero-padded to the
  kernel's operand; for fp8 it skips the reference's integer decode."""
  del sshape, tol
  for s, x, act_scale, ref in _operand_cases(spec, seed=7):
    got = jax.jit(lambda x, a: kernel_activations(x, s, a, rows=16, kp=384))(x, act_scale)
    assert got.values.shape == (16, 384) and got.values.dtype == ref.values.dtype == carrier
    view = np.int8 if carrier == jnp.int8 else np.uint8
    a, b = np.asarray(got.values).view(view), np.asarray(ref.values).view(view)
    assert not a[8:].any() and not a[:, 256:].any()  # the padding: zero codes
    nan = np.isnan(np.asarray(ref.values, np.float32))
    np.testing.assert_array_equal(np.isnan(np.asarray(got.values, np.float32))[:8, :256], nan)
    np.testing.assert_array_equal(a[:8, :256][~nan], b[~nan])
    np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(ref.scales))
  text = jax.jit(lambda x: kernel_activations(x, spec, rows=16, kp=384)).lower(x).as_text()
  assert ("optimization_barrier" in text) == (spec.act_format.name.startswith("fp8"))
  with pytest.raises(ValueError, match=r"rows=4, kp=384: expected at least x.shape=\(8, 256\)"):
    kernel_activations(x, spec, rows=4, kp=384)


@pytest.mark.parametrize("spec,sshape,tol,carrier", CASES, ids=[c[0].name for c in CASES])
def test_kernel_operand_16bit_values_are_the_reference(spec, sshape, tol, carrier):
  """``kernel_activations(values_dtype=...)`` (the operand of ``w8a8.run_decode_mgpu``):
  the reference's values, written once in bf16 / fp16 (every carrier value is exact in
  both) -- saturation, -0, NaN rows and a static scale included -- zero-padded."""
  del sshape, tol, carrier
  for s, x, act_scale, ref in _operand_cases(spec, seed=9):
    want = np.asarray(ref.values, np.float32)
    for dtype in (jnp.bfloat16, jnp.float16):
      got = jax.jit(lambda x, a: kernel_activations(x, s, a, rows=16, kp=384,
                                                    values_dtype=dtype))(x, act_scale)
      assert got.values.shape == (16, 384) and got.values.dtype == dtype
      v = np.asarray(got.values, np.float32)
      assert not v[8:].any() and not v[:, 256:].any()  # the padding: zeros
      nan = np.isnan(want)
      if s.act_format.is_integer:  # int8 codes of a NaN row are arbitrary; its scale is NaN
        nan = np.isnan(np.asarray(ref.scales)).any(axis=1)[:, None] & np.ones_like(nan)
        assert np.isnan(v[:8, :256][nan]).all()
      else:
        np.testing.assert_array_equal(np.isnan(v[:8, :256]), nan)
      np.testing.assert_array_equal(v[:8, :256][~nan], want[~nan])
      assert (np.signbit(v[:8, :256][~nan]) == np.signbit(want[~nan])).all() or \
          s.act_format.is_integer  # -0 kept by the float formats (int8 has no -0)
      np.testing.assert_array_equal(np.asarray(got.scales), np.asarray(ref.scales))
  with pytest.raises(ValueError, match="values_dtype=float32: expected bfloat16 or float16"):
    kernel_activations(x, spec, rows=8, kp=256, values_dtype=jnp.float32)
