"""Number formats: the one place where a code's bits get a value.

Every weight, activation and scale format of the library is a :class:`NumberFormat`.
A format is defined by its *decode* (raw bit pattern -> float32); *encode* is the
round-to-nearest-even, saturating inverse of that decode.  Kernels call
:meth:`NumberFormat.decode` on codes they unpack; they do not re-derive bit tricks.

Conventions
-----------
* Codes are raw bit patterns held in an unsigned integer array (``uint8``/``uint32``),
  the low ``bits`` bits significant.
* ``intN`` codes are two's complement; ``uintN`` codes are plain unsigned integers
  (used with a zero point).
* Float formats (``fp4_e2m1``, ``fp6_e2m3``, ``fp6_e3m2``, ``fp8_e4m3``, ``fp8_e5m2``) follow
  the OCP / ml_dtypes definitions (``float4_e2m1fn``, ``float6_e2m3fn``, ``float6_e3m2fn``,
  ``float8_e4m3fn``, ``float8_e5m2``).  Encode rounds to nearest even and saturates to the
  largest finite value (also for e5m2, where an overflow would otherwise give inf).
  NaN encodes to the format's NaN where it has one (e4m3: 0x7F, e5m2: 0x7E, e8m0: 0xFF);
  formats without NaN (fp4, fp6, ints) cannot represent it and the code they give for NaN
  is unspecified: callers refuse non-finite input before encoding (see quantize.py).
  +-inf saturates to +-max like any overflow.  A negative value that rounds to zero
  encodes as +0 (ml_dtypes keeps the sign: -0); the decoded values are equal.
* ``e8m0`` is the unsigned power-of-two scale of OCP MX: value ``2**(code - 127)``, 0xFF NaN.
  Encode is exact for powers of two, rounds other values to the nearest power (ties up, as
  ml_dtypes does), saturates to [2**-127, 2**127] (zero -> 2**-127) and maps negative
  values and NaN to 0xFF.
* ``int1`` (two's complement, 1 bit) holds {-1, 0}: symmetric int1 quantization can only
  keep the sign of negative weights (positives become 0).  Use ``uint1`` with a zero point
  for a useful 1-bit weight.

Decoding floats goes through float16: the exponent/mantissa bits are placed into a
float16 bit pattern (float16 has 5 exponent and 10 mantissa bits, so every format here with
at most 5 exponent bits fits, subnormals included, which float16 keeps in hardware) and
multiplied by ``2**(15 - bias)``.  That needs only integer ops and one same-width bitcast,
so the same function runs in XLA, in the Pallas interpreter and inside Pallas GPU kernels.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

Kind = Literal["int", "uint", "float", "e8m0"]


@dataclasses.dataclass(frozen=True)
class NumberFormat:
  """A number format of at most 8 bits (or a 32-bit float scale carrier)."""

  name: str
  kind: Kind
  bits: int
  exponent_bits: int = 0
  mantissa_bits: int = 0
  has_nan: bool = False  # fp8_e4m3 (S.1111.111), fp8_e5m2 (IEEE), e8m0 (0xFF)
  has_inf: bool = False  # fp8_e5m2 only
  ml_dtype: object | None = None  # the ml_dtypes / jnp dtype with these semantics, if any

  # ---- derived properties -------------------------------------------------------------
  @property
  def is_float(self) -> bool:
    return self.kind == "float"

  @property
  def is_integer(self) -> bool:
    return self.kind in ("int", "uint")

  @property
  def signed(self) -> bool:
    return self.kind in ("int", "float")

  @property
  def bias(self) -> int:
    return (1 << (self.exponent_bits - 1)) - 1 if self.kind == "float" else 0

  @property
  def num_codes(self) -> int:
    return 1 << self.bits

  @property
  def significant_bits(self) -> int:
    """Bits of precision of a value: mantissa + implicit one for floats (e8m0: 1, a power
    of two), magnitude bits for integers.  Two values' product is exact in a float of p
    significant bits when their counts add up to at most p."""
    if self.kind == "e8m0":
      return 1
    if self.kind == "float":
      return self.mantissa_bits + 1
    return self.bits - 1 if self.kind == "int" else self.bits

  @property
  def max_value(self) -> float:
    """Largest finite value."""
    if self.kind == "int":
      return float((1 << (self.bits - 1)) - 1)
    if self.kind == "uint":
      return float((1 << self.bits) - 1)
    if self.kind == "e8m0":
      return float(2.0**127)
    vals = self.all_values()
    return float(np.nanmax(vals[np.isfinite(vals)]))

  @property
  def min_value(self) -> float:
    """Most negative finite value."""
    if self.kind == "int":
      return float(-(1 << (self.bits - 1)))
    if self.kind in ("uint", "e8m0"):
      return 0.0
    return -self.max_value

  @property
  def emax(self) -> int:
    """Exponent of the largest power of two <= max_value (OCP MX ``emax_elem``).

    ``int1`` (values {-1, 0}, largest finite value 0) uses its largest magnitude, 1: emax 0."""
    return int(np.floor(np.log2(self.max_value if self.max_value > 0 else 1.0)))

  # ---- decode -------------------------------------------------------------------------
  def decode(self, codes: jax.Array, *, check_nan: bool = True) -> jax.Array:
    """Raw bit patterns (any unsigned/signed int dtype, low ``bits`` bits) -> float32.

    ``check_nan=False`` skips the NaN-code test (kernels: weight codes are produced by
    :meth:`encode` from finite inputs and never hold NaN)."""
    mask = (1 << self.bits) - 1
    c = codes.astype(jnp.int32) & mask
    if self.kind == "int":  # two's complement -> offset binary, minus the offset
      sign = 1 << (self.bits - 1)
      return uint_to_f32(c ^ sign, sign)
    if self.kind == "uint":
      return uint_to_f32(c)
    if self.kind == "e8m0":
      # 2**(c-127) built directly as float32 bits; c == 0 is 2**-127, a float32 subnormal.
      val = jax.lax.bitcast_convert_type(jnp.maximum(c, 1) << 23, jnp.float32)
      val = jnp.where(c == 0, jnp.float32(2.0**-127), val)
      return jnp.where(c == 0xFF, jnp.float32(jnp.nan), val) if check_nan else val
    # Small floats: sign | exponent | mantissa  ->  float16 bits, then rescale the bias.
    e, m = self.exponent_bits, self.mantissa_bits
    magnitude = c & ((1 << (e + m)) - 1)
    if self.name == "fp8_e5m2":
      # e5m2 *is* the upper byte of float16 (same bias, inf and NaN included).
      h = (c << 8).astype(jnp.uint16)
      return jax.lax.bitcast_convert_type(h, jnp.float16).astype(jnp.float32)
    sign16 = (c >> (e + m)) << 15
    h = (sign16 | (magnitude << (10 - m))).astype(jnp.uint16)
    val = jax.lax.bitcast_convert_type(h, jnp.float16).astype(jnp.float32)
    val = val * jnp.float32(2.0 ** (15 - self.bias))
    if self.has_nan and check_nan:  # e4m3fn: S.1111.111 is NaN, there is no inf
      val = jnp.where(magnitude == (1 << (e + m)) - 1, jnp.float32(jnp.nan), val)
    return val

  # ---- encode -------------------------------------------------------------------------
  def encode(self, x: jax.Array) -> jax.Array:
    """float -> raw codes (uint8), round to nearest even, saturating.

    For integer formats ``x`` is rounded half-to-even and clipped to [min, max].
    For float formats the result is the nearest representable value (ties to the even
    code, i.e. even mantissa LSB), with |x| beyond max saturating to +-max.
    """
    x = jnp.asarray(x, jnp.float32)
    if self.is_integer:
      q = jnp.clip(jnp.round(x), self.min_value, self.max_value).astype(jnp.int32)
      return (q & ((1 << self.bits) - 1)).astype(jnp.uint8)
    if self.kind == "e8m0":
      return _encode_e8m0(x)
    # Float: round |x| on the grid of its binade, elementwise (no table search).  With
    # ex = max(floor(log2|x|), emin) the grid step is 2**(ex - m) and q = round(|x| / step)
    # (half to even) is an integer in [0, 2**(m+1)]; the magnitude code is then
    # ((ex + bias - 1) << m) + q for normals and subnormals alike, a carry (q = 2**(m+1))
    # moving into the next binade by itself, and q's parity is the mantissa LSB's: ties go
    # to the even code.  Saturation first: |x| <= max, a grid point, never rounds past it.
    m, emin = self.mantissa_bits, 1 - self.bias
    ax = jnp.minimum(jnp.abs(x), jnp.float32(self.max_value))
    ex = jnp.maximum(floor_log2(ax), emin)  # ax == 0: floor_log2 gives -149
    inv_step = exp2_int(m - ex)  # exact powers of two: the product is exact
    q = jnp.round(ax * inv_step).astype(jnp.int32)
    code = ((ex + self.bias - 1) << m) + q
    sign = (jnp.signbit(x) & (code != 0)).astype(jnp.int32) << (self.bits - 1)
    code = code | sign
    if self.has_nan:
      nan_code = 0x7F if self.name == "fp8_e4m3" else 0x7E
      code = jnp.where(jnp.isnan(x), nan_code, code)
    return code.astype(jnp.uint8)

  def encode_exact(self, x: jax.Array, *, round_subnormals: bool = False) -> jax.Array:
    """float -> raw codes (uint8) for ``x`` that holds values of this float format already:
    zero, or normal values (no subnormals, no NaN).  The code is read off the float32
    bits -- sign, exponent rebiased, the top mantissa bits -- in a handful of integer ops,
    no rounding (:meth:`encode` spends ~40 per element on the general case).  ±0 give
    code 0, as :meth:`encode` does.  The caller guarantees the values (e.g. int4 codes or
    e2m1 values into e4m3: all normal or zero); anything else gives a wrong code.

    ``round_subnormals``: values below the least normal (2**(1 - bias)) may be anything
    finite; they round to the nearest subnormal (ties to even), as :meth:`encode` rounds
    them -- the least normal itself where they round up to it, code 0 where to zero."""
    if not self.is_float:
      raise ValueError(f"encode_exact: format {self.name} is not a float format")
    m = self.mantissa_bits
    x = jnp.asarray(x, jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    mag = bits & jnp.uint32(0x7FFFFFFF)
    sign = (bits >> 31).astype(jnp.int32) << (self.bits - 1)
    # (exponent field << m | mantissa top m bits) - (float32 bias - bias) << m
    code = (mag >> (23 - m)).astype(jnp.int32) - ((127 - self.bias) << m)
    code = jnp.where(mag == 0, 0, code | sign)
    if round_subnormals:  # below 2**(1 - bias): the integer multiple of the subnormal step
      least_normal = jnp.float32(2.0 ** (1 - self.bias))
      sub = jnp.round(jnp.abs(x) * jnp.float32(2.0 ** (self.bias - 1 + m))).astype(jnp.int32)
      code = jnp.where(jnp.abs(x) < least_normal, jnp.where(sub == 0, 0, sub | sign), code)
    return code.astype(jnp.uint8)

  def quantize_dequantize(self, x: jax.Array) -> jax.Array:
    """Round ``x`` onto this format's grid (encode then decode)."""
    return self.decode(self.encode(x))

  def all_values(self) -> np.ndarray:
    """Decoded value of every code 0 .. 2**bits - 1 (NaN where the code is NaN)."""
    return _all_values(self).copy()

  def __str__(self) -> str:
    return self.name


@functools.lru_cache(maxsize=None)
def _all_values(fmt: NumberFormat) -> np.ndarray:
  # Cached: kernels consult it while tracing; computing it is an eager JAX call.
  codes = np.arange(fmt.num_codes, dtype=np.uint32)
  with jax.ensure_compile_time_eval():  # concrete even when called while tracing (jit)
    return np.asarray(fmt.decode(jnp.asarray(codes)))


def _log2_parts(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(floor(log2|x|), bit below the leading one) of float32 ``x`` from its bits.

  Pure integer ops on the bit pattern: exact for every finite nonzero float32, subnormals
  included (XLA's float ``log2`` is off by an ulp at many exact powers of two, and
  ``frexp`` loses subnormals on CPUs that flush them)."""
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
  bits = (bits & jnp.uint32(0x7FFFFFFF)).astype(jnp.int32)
  exp_field = bits >> 23
  mant = bits & 0x7FFFFF
  lead = 31 - jax.lax.clz(jnp.maximum(mant, 1))  # leading-one position of a subnormal
  sub = exp_field == 0
  fl = jnp.where(sub, lead - 149, exp_field - 127)
  below = jnp.where(sub, (mant >> jnp.maximum(lead - 1, 0)) & (lead >= 1), (mant >> 22) & 1)
  return fl, below


def exp2_int(e: jax.Array) -> jax.Array:
  """2.0**e (float32) for int32 -126 <= e <= 127, built from the exponent bits."""
  return jax.lax.bitcast_convert_type((e + 127) << 23, jnp.float32)


def floor_log2(x: jax.Array) -> jax.Array:
  """Exact ``floor(log2(|x|))`` (int32) of finite nonzero float32 ``x``.

  Use it for MX scales: ``jnp.floor(jnp.log2(x))`` is wrong for many exact powers of two
  on XLA (log2(2**k) comes out a hair below k), which halves the scale and saturates the
  block's largest element."""
  return _log2_parts(x)[0]


def _encode_e8m0(x: jax.Array) -> jax.Array:
  """float32 -> e8m0 codes, exact for powers of two.

  Other values go to the nearest power of two in linear distance, ties up (a mantissa in
  [1.5, 2) rounds up: what ml_dtypes' ``float8_e8m0fnu`` cast does).  Out of range: below
  2**-127 (zero included) saturates to code 0 (2**-127), above 2**127 (inf included) to code
  254 (2**127); NaN and negative inputs give the NaN code 0xFF (e8m0 is unsigned).
  """
  x = jnp.asarray(x, jnp.float32)
  fl, below = _log2_parts(x)
  code = jnp.clip(fl + below + 127, 0, 254)  # zero: fl = -149, clipped to code 0
  code = jnp.where(jnp.isposinf(x), 254, code)
  # Sign from the bits (a negative subnormal may compare == 0 where the CPU flushes them).
  negative = jnp.signbit(x) & (jax.lax.bitcast_convert_type(x, jnp.uint32)
                               != jnp.uint32(0x80000000))
  code = jnp.where(jnp.isnan(x) | negative, 0xFF, code)
  return code.astype(jnp.uint8)


_MAGIC = 0x4B000000  # float32 bits of 2**23


def uint_to_f32(u: jax.Array, minus=0.0) -> jax.Array:
  """``float32(u) - minus`` for integers 0 <= u < 2**22, exactly.

  ``u | 0x4B000000`` read as float32 is ``2**23 + u``; one OR and one subtraction replace
  an int->float convert (a slow, quarter-rate instruction on GPUs).  ``minus`` may be an
  array (zero points) -- fold ``2**23 + minus`` once per scale group in kernels."""
  f = jax.lax.bitcast_convert_type(u.astype(jnp.int32) | _MAGIC, jnp.float32)
  return f - (jnp.float32(2.0**23) + minus)


@functools.lru_cache(maxsize=None)
def _magnitude_table(fmt: NumberFormat) -> tuple[np.ndarray, np.ndarray]:
  """Sorted non-negative finite magnitudes of a float format and their codes."""
  sign_bit = 1 << (fmt.bits - 1)
  codes = np.arange(sign_bit, dtype=np.uint32)
  with jax.ensure_compile_time_eval():  # may be first called while tracing (see all_values)
    vals = np.asarray(fmt.decode(jnp.asarray(codes)))
  keep = np.isfinite(vals)
  codes, vals = codes[keep], vals[keep]
  order = np.argsort(vals, kind="stable")
  return vals[order].astype(np.float32), codes[order].astype(np.int32)


def _int(bits: int) -> NumberFormat:
  dt = {4: ml_dtypes.int4, 8: np.int8, 2: getattr(ml_dtypes, "int2", None)}.get(bits)
  return NumberFormat(f"int{bits}", "int", bits, ml_dtype=dt)


def _uint(bits: int) -> NumberFormat:
  dt = {4: ml_dtypes.uint4, 8: np.uint8, 2: getattr(ml_dtypes, "uint2", None)}.get(bits)
  return NumberFormat(f"uint{bits}", "uint", bits, ml_dtype=dt)


FORMATS: dict[str, NumberFormat] = {}
for _b in range(1, 9):
  FORMATS[f"int{_b}"] = _int(_b)
  FORMATS[f"uint{_b}"] = _uint(_b)
FORMATS.update({
    "fp4_e2m1": NumberFormat("fp4_e2m1", "float", 4, 2, 1, ml_dtype=ml_dtypes.float4_e2m1fn),
    "fp6_e2m3": NumberFormat("fp6_e2m3", "float", 6, 2, 3, ml_dtype=ml_dtypes.float6_e2m3fn),
    "fp6_e3m2": NumberFormat("fp6_e3m2", "float", 6, 3, 2, ml_dtype=ml_dtypes.float6_e3m2fn),
    "fp8_e4m3": NumberFormat("fp8_e4m3", "float", 8, 4, 3, has_nan=True,
                             ml_dtype=ml_dtypes.float8_e4m3fn),
    "fp8_e5m2": NumberFormat("fp8_e5m2", "float", 8, 5, 2, has_nan=True, has_inf=True,
                             ml_dtype=ml_dtypes.float8_e5m2),
    "e8m0": NumberFormat("e8m0", "e8m0", 8, 8, 0, has_nan=True,
                         ml_dtype=ml_dtypes.float8_e8m0fnu),
})

# Names people use for the same formats (Humming / compressed-tensors spellings).
ALIASES = {
    "int1": "int1", "e2m1": "fp4_e2m1", "fp4": "fp4_e2m1", "float4e2m1": "fp4_e2m1",
    "fp6": "fp6_e2m3", "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2", "float6e2m3": "fp6_e2m3",
    "float6e3m2": "fp6_e3m2", "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8e4m3": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3", "e5m2": "fp8_e5m2", "float8e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2", "float8e8m0": "e8m0", "float8_e8m0fnu": "e8m0", "ue8m0": "e8m0",
}


def get_format(name: str | NumberFormat) -> NumberFormat:
  """Look up a format by name (``"int4"``, ``"uint4"``, ``"fp4_e2m1"``, ``"fp8_e4m3"``, ...)."""
  if isinstance(name, NumberFormat):
    return name
  key = ALIASES.get(str(name).lower(), str(name).lower())
  if key not in FORMATS:
    raise ValueError(f"unknown number format {name!r}; expected one of {sorted(FORMATS)}")
  return FORMATS[key]
