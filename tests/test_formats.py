"""Number formats: every code decoded against ml_dtypes (or a numpy two's-complement oracle),
encode (RNE, saturation, NaN) against ml_dtypes casts, and the fast activation rounding."""
import ml_dtypes
import jax.numpy as jnp
import numpy as np
import pytest

from humming_jax.quantize import _FAST_ROUND
from humming_jax.formats import FORMATS, floor_log2, get_format

FLOATS = ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2"]
INTS = [f"int{b}" for b in range(1, 9)] + [f"uint{b}" for b in range(1, 9)]
ML = {"int2": ml_dtypes.int2, "int4": ml_dtypes.int4, "int8": np.int8,
      "uint2": ml_dtypes.uint2, "uint4": ml_dtypes.uint4, "uint8": np.uint8,
      "fp4_e2m1": ml_dtypes.float4_e2m1fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
      "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
      "fp8_e5m2": ml_dtypes.float8_e5m2, "e8m0": ml_dtypes.float8_e8m0fnu}


def _ml_decode(name: str) -> np.ndarray:
  """Value of every code per ml_dtypes: sub-byte dtypes hold one code per byte, the low
  bits significant, so an int8/uint8 view of the code (sign-extended for signed ints) is it."""
  f = get_format(name)
  dt = np.dtype(ML[name])
  codes = np.arange(f.num_codes, dtype=np.int64)
  if f.is_integer:
    # ml_dtypes int2/int4 take values; two's complement (the oracle below) gives them.
    vals = (codes ^ (1 << (f.bits - 1))) - (1 << (f.bits - 1)) if f.kind == "int" else codes
    back = vals.astype(dt)
    assert np.array_equal(back.astype(np.int64), vals)  # representable in the ml dtype
    return back.astype(np.float32)
  # Float sub-byte dtypes: a uint8 view of the code byte is the encoding.
  return codes.astype(np.uint8).view(dt).astype(np.float32)


@pytest.mark.parametrize("name", sorted(ML))
def test_decode_every_code_vs_ml_dtypes(name):
  f = get_format(name)
  assert f.ml_dtype is not None and np.dtype(f.ml_dtype) == np.dtype(ML[name])
  got = f.all_values()
  want = _ml_decode(name)
  np.testing.assert_array_equal(got, want)
  assert f.max_value == float(np.nanmax(want[np.isfinite(want)]))


@pytest.mark.parametrize("name", INTS)
def test_decode_ints_vs_twos_complement(name):
  f = get_format(name)
  codes = np.arange(f.num_codes, dtype=np.int64)
  if f.kind == "int":
    want = np.where(codes >= (1 << (f.bits - 1)), codes - (1 << f.bits), codes)
    assert (f.min_value, f.max_value) == (-(2 ** (f.bits - 1)), 2 ** (f.bits - 1) - 1)
  else:
    want = codes
    assert (f.min_value, f.max_value) == (0, 2 ** f.bits - 1)
  np.testing.assert_array_equal(f.all_values(), want.astype(np.float32))
  # Only the low `bits` bits count: garbage in the high bits of a uint8 code is ignored.
  noisy = codes | (np.random.default_rng(0).integers(0, 256, codes.shape) << f.bits)
  np.testing.assert_array_equal(np.asarray(f.decode(jnp.asarray(noisy & 0xFF, jnp.uint8))),
                                want.astype(np.float32))


def test_int1_holds_minus_one_and_zero():
  f = get_format("int1")
  np.testing.assert_array_equal(f.all_values(), [0.0, -1.0])
  assert f.emax == 0  # largest magnitude 1, used by an MX int1 scale
  np.testing.assert_array_equal(np.asarray(f.decode(f.encode(jnp.array([0.7, -0.7, 3.0])))),
                                [0.0, -1.0, 0.0])


def _midpoints(vals: np.ndarray) -> np.ndarray:
  v = np.unique(vals[np.isfinite(vals)].astype(np.float64))
  mid = ((v[1:] + v[:-1]) / 2).astype(np.float32)
  assert np.array_equal(mid.astype(np.float64), (v[1:] + v[:-1]) / 2)  # exact in fp32
  return np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf),
                         v.astype(np.float32)])


def _inputs(f, rng) -> np.ndarray:
  m = f.max_value
  mid = _midpoints(f.all_values())
  rand = np.concatenate([rng.uniform(-1.3 * m, 1.3 * m, 4000),
                         rng.standard_normal(2000) * m / 8,
                         rng.standard_normal(2000) * 1e-3 * m]).astype(np.float32)
  edge = np.float32([m, -m, 2 * m, -2 * m, 1e30, -1e30, np.inf, -np.inf, 0.0, -0.0])
  return np.concatenate([mid, -mid, rand, edge])


@pytest.mark.parametrize("name", FLOATS)
def test_float_encode_rne_saturate_vs_ml_dtypes(name):
  f = get_format(name)
  x = _inputs(f, np.random.default_rng(1))
  codes = np.asarray(f.encode(jnp.asarray(x)))
  assert codes.dtype == np.uint8 and codes.max() < f.num_codes
  got = np.asarray(f.decode(jnp.asarray(codes)))
  want = np.clip(x, -f.max_value, f.max_value).astype(ML[name]).astype(np.float32)
  np.testing.assert_array_equal(got, want)
  # The codes too, except the sign of a zero (encode gives +0 for tiny negatives).
  want_codes = np.clip(x, -f.max_value, f.max_value).astype(ML[name]).view(np.uint8)
  nz = want != 0
  np.testing.assert_array_equal(codes[nz], want_codes[nz])
  assert np.all(codes[~nz] == 0)


@pytest.mark.parametrize("name", FLOATS)
def test_encode_exact_equals_encode_on_the_formats_values(name):
  """encode_exact (the carrier unpack's e4m3 path) gives encode's code for every normal
  value and both zeros of the format (the values it is for), and int4's -8 .. 7 in e4m3."""
  f = get_format(name)
  codes = np.arange(f.num_codes)
  vals = f.all_values()
  normal = ((codes >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1)) != 0
  keep = np.isfinite(vals) & (normal | (vals == 0))
  assert keep.sum() >= 14
  x = jnp.asarray(vals[keep], jnp.float32)
  np.testing.assert_array_equal(np.asarray(f.encode_exact(x)), np.asarray(f.encode(x)))
  e4m3 = get_format("fp8_e4m3")
  ints = jnp.arange(-8, 8, dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(e4m3.encode_exact(ints)),
                                np.asarray(e4m3.encode(ints)))
  with pytest.raises(ValueError, match="not a float format"):
    get_format("int4").encode_exact(ints)


@pytest.mark.parametrize("name", FLOATS)
def test_encode_exact_round_subnormals(name):
  """encode_exact(round_subnormals=True) gives encode's code for the format's normal
  values and for anything finite below its least normal: every subnormal, the midpoints
  between them (ties to even), random values, values that round up to the least normal,
  and the e2m1 values times 2**-20 .. 2**0 in e4m3 (the MXFP4 fold's)."""
  f = get_format(name)
  codes = np.arange(f.num_codes)
  vals = f.all_values()
  normal = ((codes >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1)) != 0
  step = 2.0 ** (1 - f.bias - f.mantissa_bits)
  least = 2.0 ** (1 - f.bias)
  rng = np.random.default_rng(3)
  grid = np.arange(0, 2 ** f.mantissa_bits + 1) * step
  tiny = np.concatenate([grid, grid[:-1] + step / 2, rng.uniform(0, least, 500),
                         np.nextafter(np.float32(least), 0) * np.ones(1)])
  x = np.concatenate([vals[np.isfinite(vals) & normal], tiny, -tiny]).astype(np.float32)
  got = np.asarray(f.encode_exact(jnp.asarray(x), round_subnormals=True))
  np.testing.assert_array_equal(got, np.asarray(f.encode(jnp.asarray(x))))
  e2m1 = get_format("fp4_e2m1").all_values()
  mx = np.array([v * 2.0 ** s for v in e2m1 for s in range(-20, 1)], np.float32)
  e4m3 = get_format("fp8_e4m3")
  np.testing.assert_array_equal(
      np.asarray(e4m3.encode_exact(jnp.asarray(mx), round_subnormals=True)),
      np.asarray(e4m3.encode(jnp.asarray(mx))))


def test_float_ties_go_to_even_mantissa():
  f = get_format("fp4_e2m1")  # grid 0 .5 1 1.5 2 3 4 6
  x = jnp.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0])
  np.testing.assert_array_equal(np.asarray(f.quantize_dequantize(x)),
                                [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0])


@pytest.mark.parametrize("name", INTS)
def test_int_encode_rne_saturate(name):
  f = get_format(name)
  rng = np.random.default_rng(2)
  lo, hi = f.min_value, f.max_value
  half = np.arange(lo - 3, hi + 3) + 0.5
  x = np.concatenate([half, np.nextafter(half, np.inf), np.nextafter(half, -np.inf),
                      rng.uniform(lo - 4, hi + 4, 3000), [1e9, -1e9]]).astype(np.float32)
  codes = np.asarray(f.encode(jnp.asarray(x)))
  want = np.clip(np.rint(x.astype(np.float64)), lo, hi)  # numpy rint: half to even
  np.testing.assert_array_equal(np.asarray(f.decode(jnp.asarray(codes))), want)
  if name in ML:  # also the bit patterns, via the ml dtype
    np.testing.assert_array_equal(codes & (f.num_codes - 1),
                                  want.astype(ML[name]).view(np.uint8) & (f.num_codes - 1))


def test_nan_handling():
  nan = jnp.array([np.nan, -np.nan], jnp.float32)
  assert np.all(np.asarray(get_format("fp8_e4m3").encode(nan)) == 0x7F)
  c = np.asarray(get_format("fp8_e5m2").encode(nan))
  assert np.all(c == 0x7E) and np.all(np.isnan(np.asarray(get_format("fp8_e5m2").decode(c))))
  assert np.all(np.asarray(get_format("e8m0").encode(nan)) == 0xFF)
  assert np.isnan(np.float32(np.nan).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
  # Decoding the NaN codes gives NaN; check_nan=False gives the raw magnitude instead.
  e4 = get_format("fp8_e4m3")
  assert np.all(np.isnan(np.asarray(e4.decode(jnp.array([0x7F, 0xFF], jnp.uint8)))))
  np.testing.assert_array_equal(
      np.asarray(e4.decode(jnp.array([0x7F, 0xFF], jnp.uint8), check_nan=False)),
      [480.0, -480.0])
  # Formats without NaN have no NaN flag: quantize() refuses non-finite weights instead.
  for name in ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "int4", "uint4"]:
    assert not get_format(name).has_nan
  # Infinities saturate (e5m2 too, although it has inf).
  inf = jnp.array([np.inf, -np.inf], jnp.float32)
  for name in FLOATS:
    f = get_format(name)
    np.testing.assert_array_equal(np.asarray(f.quantize_dequantize(inf)),
                                  [f.max_value, -f.max_value])


def test_e8m0_encode_powers_of_two_exact_and_vs_ml_dtypes():
  e = get_format("e8m0")
  p = np.float32(2.0) ** np.arange(-127, 128, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(e.encode(jnp.asarray(p))), np.arange(0, 255))
  np.testing.assert_array_equal(np.asarray(e.decode(jnp.arange(255))), p)
  rng = np.random.default_rng(3)
  q = p[1:-1]  # normal float32 range (ml_dtypes rounds subnormal inputs differently)
  x = np.concatenate([np.exp2(rng.uniform(-126, 126.9, 20000)), q * 1.5,
                      np.nextafter(q * np.float32(1.5), 0), np.nextafter(q, np.inf),
                      np.nextafter(q, 0)]).astype(np.float32)
  x = x[x >= 2.0 ** -126]
  np.testing.assert_array_equal(np.asarray(e.encode(jnp.asarray(x))),
                                x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
  # Out of range: saturate; zero -> smallest; negative / NaN -> NaN code.
  np.testing.assert_array_equal(
      np.asarray(e.encode(jnp.array([0.0, 1e-45, np.inf, 3e38, -1.0, -0.0, np.nan]))),
      [0, 0, 254, 254, 255, 0, 255])


def test_floor_log2_exact():
  p = np.float32(2.0) ** np.arange(-149, 128, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(floor_log2(jnp.asarray(p))), np.arange(-149, 128))
  x = np.abs(np.random.default_rng(4).standard_normal(5000)).astype(np.float32) * 1e-30
  x = np.concatenate([x, x * 1e-9, x * 1e30]).astype(np.float32)  # subnormals included
  np.testing.assert_array_equal(np.asarray(floor_log2(jnp.asarray(x))),
                                np.floor(np.log2(x.astype(np.float64))).astype(np.int64))


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_fast_activation_rounding_equals_format(name):
  f = get_format(name)
  x = jnp.asarray(_inputs(f, np.random.default_rng(5)))
  x = x[jnp.isfinite(x)]
  np.testing.assert_array_equal(np.asarray(_FAST_ROUND[name](x)),
                                np.asarray(f.decode(f.encode(x))))


def test_emax_and_properties():
  assert [get_format(n).emax for n in ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3",
                                       "fp8_e5m2", "int4", "int8"]] == [2, 2, 4, 8, 15, 2, 6]
  assert get_format("e4m3") is FORMATS["fp8_e4m3"]
  assert get_format("float8_e5m2") is FORMATS["fp8_e5m2"]
  with pytest.raises(ValueError, match="unknown number format 'int9'"):
    get_format("int9")
