"""quantize / dequantize weights and activations (pure jnp, CPU friendly).

Reference semantics (DESIGN.md)::

    W_deq[k, n] = (code[k, n] - zp[g(k), n]) * s[g(k), n] * s2

with ``g(k) = k // group_size`` (2-D blocks: ``(k // block_k, n // block_n)``), ``s2`` the
second-level fp32 scale (NVFP4) or 1.  Activations likewise per token row (and per K group
where the spec says so).

Scale rules
-----------
* float scales (fp32/bf16/fp16): ``s = amax / max_code`` rounded to the scale dtype; the
  codes are computed against the *stored* (rounded) scale.
* zero point (uintN): ``s = (max(w, 0) - min(w, 0)) / (2**bits - 1)``,
  ``zp = round(-min / s)``; zero points are stored as uint8.
* MX (e8m0): ``s = 2**(floor(log2 amax) - emax_elem)`` (OCP MX v1.0), elements rounded to
  nearest even and saturated.  Dynamic activation scales with ``act_mx_rounding="up"``
  first round amax to a power of two, upwards from 1.75 times one (compressed-tensors /
  vLLM's MX reference: :func:`mx_rounded_amax`).  MXINT4 uses int4 codes with ``emax_elem = 2``: the stored
  e8m0 scale already includes the 2**-2 of the spec's 1.2 fixed-point element, so
  ``value = code * s`` like every other format.
* NVFP4: ``s2 = amax_tensor / (6 * 448)`` (fp32), block scale ``amax_block / 6 / s2``
  rounded to e4m3.  (Activations: amax over the finite blocks; a block holding NaN / inf
  gets a NaN scale.)
* An all-zero group gets scale 1 (MX: ``2**-emax_elem``); its codes are 0.  So does a group
  whose scale rounds to 0 in the scale dtype (float16 below ~3e-8): its values are below
  the smallest step.  A scale past the dtype's range (float16 over 65504) is refused.
* Non-finite weights are refused with a ValueError when the weights are concrete; under
  ``jit`` (no error can be raised) every scale block holding a NaN/inf gets a NaN scale
  (e8m0: the NaN code 0xFF; NVFP4: the global scale of the tensor is NaN too), so those
  weights dequantize to NaN and the outputs that use them are NaN.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from humming_jax import packing
from humming_jax.formats import NumberFormat, exp2_int, floor_log2, get_format
from humming_jax.spec import QuantSpec

_FLOAT_SCALE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
                       "float16": jnp.float16}
E8M0 = get_format("e8m0")
E4M3 = get_format("fp8_e4m3")


# ----------------------------------------------------------------------------------------
# The quantized-params pytree
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class QuantizedWeight:
  """Quantized weight of a dense layer ((K, N)) or of stacked experts ((E, K, N)).

  Array leaves: ``codes`` (packed uint32), ``scales``, ``zeros`` (uint8, or None),
  ``global_scale`` (fp32 scalar per tensor/expert, or None), ``bias`` ((N,) or (E, N), or
  None), ``act_scale`` (static activation scale, or None), ``fold_base`` (kernel layouts
  only: per-column metadata a kernel's ``prepare`` derives from ``scales`` so that calls
  need not recompute it -- the fp8-MMA layout's column-fold base,
  ``wna16_mgpu.mark_column_fold`` -- or None), ``input_perm`` (int32 (K,), or None: the
  stored rows are W's rows ``input_perm[0], input_perm[1], ...`` -- GPTQ act-order
  checkpoints, whose K groups are contiguous only in that order; ``quant_dense`` gathers
  x's columns the same way, ``dequantize`` returns W in its own order).
  Static aux data: ``spec``, ``shape`` (the logical float shape) and ``layout``
  (``"canonical"`` or the name of a kernel layout made by a kernel's ``prepare``).
  """

  codes: jax.Array
  scales: jax.Array
  zeros: jax.Array | None
  global_scale: jax.Array | None
  bias: jax.Array | None
  act_scale: jax.Array | None
  spec: QuantSpec
  shape: tuple[int, ...]
  layout: str = "canonical"
  fold_base: jax.Array | None = None
  input_perm: jax.Array | None = None

  _LEAVES = ("codes", "scales", "zeros", "global_scale", "bias", "act_scale", "fold_base",
             "input_perm")
  # The leaves that store the weight (what nbytes and hj.report count; not the bias or the
  # activation scale, which a float layer has as well).
  STORED = ("codes", "scales", "zeros", "global_scale", "fold_base", "input_perm")

  def tree_flatten(self):
    return tuple(getattr(self, f) for f in self._LEAVES), (self.spec, self.shape, self.layout)

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    spec, shape, layout = aux
    return cls(**dict(zip(cls._LEAVES, leaves)), spec=spec, shape=shape, layout=layout)

  def tree_flatten_with_keys(self):
    leaves = tuple((jax.tree_util.GetAttrKey(f), getattr(self, f)) for f in self._LEAVES)
    return leaves, (self.spec, self.shape, self.layout)

  # Convenience views.
  @property
  def in_features(self) -> int:
    return self.shape[-2]

  @property
  def out_features(self) -> int:
    return self.shape[-1]

  @property
  def num_experts(self) -> int | None:
    return self.shape[0] if len(self.shape) == 3 else None

  def replace(self, **changes) -> "QuantizedWeight":
    """A copy with ``changes``.  New ``scales`` without a new ``fold_base`` drop the old
    base (it is derived from the scales; a kernel recomputes it where it needs one)."""
    if "scales" in changes and "fold_base" not in changes:
      changes["fold_base"] = None
    return dataclasses.replace(self, **changes)

  def nbytes(self) -> int:
    """Bytes of codes + scales + zero points + global scale (+ a kernel layout's
    ``fold_base``, an act-order ``input_perm``) as stored (a kernel layout's ``jnp.int4``
    codes count half a byte each)."""
    return sum(array_bytes(a) for f in self.STORED if (a := getattr(self, f)) is not None)

  def __repr__(self) -> str:
    layers = stacked_layers(self)
    return (f"QuantizedWeight(spec={self.spec.name}, shape={self.shape}, "
            + (f"layers={layers}, " if layers else "")
            + f"layout={self.layout!r}, bytes={self.nbytes()})")


jax.tree_util.register_pytree_with_keys(
    QuantizedWeight, QuantizedWeight.tree_flatten_with_keys,
    QuantizedWeight.tree_unflatten, QuantizedWeight.tree_flatten)


def stacked_layers(q: QuantizedWeight) -> tuple[int, ...]:
  """The leading layer axes of a weight quantized layer by layer
  (``quantize_params(..., scanned=...)``, or ``nn.scan`` over a QuantDense): its codes'
  leading dims beyond one layer's (canonical: the rank of ``shape``, which is one layer's;
  a kernel layout: its family's ``codes_ndim``).  () for one layer, or where no rank is
  known (trees of partition specs, grouped layouts)."""
  ndim = getattr(q.codes, "ndim", None)
  if ndim is None:
    return ()
  if q.layout == "canonical":
    base = len(q.shape)
  else:
    from humming_jax.kernels import registry  # noqa: PLC0415 - the kernels import this module
    base = registry.layout_codes_ndim(q.layout)
    if base is None:
      return ()
  return tuple(q.codes.shape[:max(ndim - base, 0)])  # fewer dims: check_params names them


def check_params(q: QuantizedWeight, name: str = "params") -> None:
  """Raise a ValueError naming ``name`` and the field where ``q``'s arrays do not match
  its static aux data: its spec, logical shape and layout.  Nothing else catches such a
  mismatch (a checkpoint whose metadata was edited, leaves restored into a template of
  another spec, e8m0 scale codes cast to floats): the XLA reference reads the
  group size off the scales' shape while the kernels read the spec, so each would compute
  its own wrong answer.

  Canonical params: every leaf's shape and kind of dtype (the codes' packed rows, the
  scale grid -- e8m0 codes, or float values in any float dtype: a float32 copy is what
  gradients take --, zero points exactly when ``spec.zero_point``,
  the global scale exactly when ``spec.global_scale``, the bias); leading axes beyond the
  logical shape (layer stacks) must agree across leaves.  Kernel layouts: which optional
  leaves are present (each family's ``prepare`` fixes the rest).  Trace-time only: shapes
  and dtypes, no values.  Trees whose leaves are not arrays (partition specs) pass."""
  if not (hasattr(q.codes, "shape") and hasattr(q.codes, "dtype")):
    return
  spec = q.spec

  def fail(what: str) -> None:
    raise ValueError(f"{name}: {what} (spec {spec.name}, shape {tuple(q.shape)}, layout "
                     f"{q.layout!r}): the arrays do not match the params' spec")

  # (act_scale is the activations' business: kernels name a missing one when they need it)
  for leaf, field in (("zeros", "zero_point"), ("global_scale", "global_scale")):
    wanted = getattr(spec, field)
    if (getattr(q, leaf) is not None) != wanted:
      fail(f"{leaf} is {'missing' if wanted else 'present'}; spec.{field}={wanted}")
  if q.layout != "canonical":
    from humming_jax.kernels import registry  # noqa: PLC0415 - the kernels import this module
    base = registry.layout_codes_ndim(q.layout)
    if base is not None and q.codes.ndim < base:
      fail(f"codes.shape={tuple(q.codes.shape)}: this layout stores {base}-D codes per "
           f"layer (leaves indexed without a new shape? one expert of a stack is not a "
           f"leaf-wise slice)")
    return
  if len(q.shape) not in (2, 3):
    fail(f"shape={tuple(q.shape)}: expected (K, N) or (E, K, N)")
  *experts, k, n = q.shape
  bits = spec.weight_bits
  rows = packing.packed_rows(k, bits)
  if q.codes.ndim < len(q.shape) or q.codes.dtype != jnp.uint32:
    fail(f"codes {q.codes.dtype}{list(q.codes.shape)}: expected uint32 (..., "
         f"{'E=%d, ' % experts[0] if experts else ''}{rows}, {n})")
  lead = tuple(q.codes.shape[:-2])  # layer axes, then E
  if lead[len(lead) - len(experts):] != tuple(experts) or q.codes.shape[-2:] != (rows, n):
    fail(f"codes.shape={tuple(q.codes.shape)}: expected (..., "
         f"{'E=%d, ' % experts[0] if experts else ''}{rows}, {n}) ({bits}-bit codes of "
         f"K={k} packed in 32-bit words)")
  bk, bn = scale_block(spec, k, n)
  if k % bk or n % bn:  # quantize refuses these; a checkpoint's floor-sized scales did not
    fail(f"shape (K={k}, N={n}): the scale blocks ({bk} x {bn}: group_size="
         f"{spec.group_size}, block_n={spec.block_n}) do not divide it")
  grid = (*lead, k // bk, n // bn)
  # e8m0 scales are codes (uint8); other scales are values, in their storage dtype or a
  # float copy (docs/training.md: a float32 copy of NVFP4's e4m3 scales is what can be
  # differentiated)
  e8m0 = spec.scale_dtype == "e8m0"
  for leaf, want in (("scales", "uint8" if e8m0 else "floating"), ("zeros", "uint8")):
    a = getattr(q, leaf)
    if a is not None and (tuple(a.shape) != grid or not _dtype_is(a.dtype, want)):
      fail(f"{leaf} {a.dtype}{list(a.shape)}: expected shape {list(grid)} of "
           f"{'a float dtype' if want == 'floating' else want} (one per {bk} x {bn} "
           f"block; scale_dtype={spec.scale_dtype!r})")
  checks = (("global_scale", lead, "floating"), ("bias", (*lead, n), None),
            ("input_perm", (*lead[:len(lead) - len(experts)], k), None))  # per layer
  for leaf, want_shape, want in checks:
    a = getattr(q, leaf)
    if a is not None and (tuple(a.shape) != want_shape
                          or (want is not None and not _dtype_is(a.dtype, want))):
      fail(f"{leaf} {a.dtype}{list(a.shape)}: expected shape {list(want_shape)}"
           + (" of a float dtype" if want == "floating" else ""))


def _dtype_is(dtype, want: str) -> bool:
  """``dtype`` is ``want``: a dtype name, or "floating" (any float dtype)."""
  return (jnp.issubdtype(dtype, jnp.floating) if want == "floating"
          else jnp.dtype(dtype) == jnp.dtype(want))


# ----------------------------------------------------------------------------------------
# Scale geometry
# ----------------------------------------------------------------------------------------
def array_bytes(a) -> int:
  """Bytes an array of ``a``'s shape and dtype occupies: sub-byte dtypes (``jnp.int4``)
  count their bits, where numpy's ``itemsize`` says 1 byte."""
  return -(-int(np.prod(a.shape)) * jax.dtypes.itemsize_bits(a.dtype) // 8)


def scale_block(spec: QuantSpec, k: int, n: int) -> tuple[int, int]:
  """(rows of K, columns of N) covered by one weight scale."""
  if spec.granularity == "tensor":
    return k, n
  if spec.granularity == "channel":
    return k, 1
  if spec.granularity == "group":
    return spec.group_size, 1
  return spec.group_size, spec.block_n


def check_weight_shape(spec: QuantSpec, shape: tuple[int, ...], name: str = "w") -> None:
  if len(shape) not in (2, 3):
    raise ValueError(f"{name} must be (K, N) or stacked experts (E, K, N); got shape {shape}")
  k, n = shape[-2:]
  bk, bn = scale_block(spec, k, n)
  if k % bk:
    raise ValueError(f"group_size={spec.group_size} does not divide K={k} ({name}.shape="
                     f"{shape}); pick a group size that divides the input features")
  if n % bn:
    raise ValueError(f"block_n={spec.block_n} does not divide N={n} ({name}.shape={shape})")


def expand_scales(s: jax.Array, k: int, n: int) -> jax.Array:
  """(..., Gk, Gn) per-block values -> (..., K, N)."""
  gk, gn = s.shape[-2:]
  s = jnp.repeat(s, k // gk, axis=-2) if gk != k else s
  return jnp.repeat(s, n // gn, axis=-1) if gn != n else s


def _block_reduce(x: jax.Array, bk: int, bn: int, fn) -> jax.Array:
  *lead, k, n = x.shape
  x = x.reshape(*lead, k // bk, bk, n // bn, bn)
  return fn(x, axis=(-3, -1))


def round_to_float_dtype(x: jax.Array, dtype_name: str) -> jax.Array:
  """float32 ``x`` rounded (RNE) onto the grid of float32 / bfloat16 / float16, as float32.

  Written so that no f32 -> narrow -> f32 convert chain remains for XLA's GPU
  simplify-fp-conversions pass to fold away (see _round_fp8): the narrow value is widened
  from its bits with integer ops (bfloat16: a 16-bit shift; float16: sign / exponent /
  mantissa fields, subnormals, inf and NaN included)."""
  x = x.astype(jnp.float32)
  if dtype_name == "float32":
    return x
  if dtype_name == "bfloat16":
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return jax.lax.bitcast_convert_type(bits.astype(jnp.uint32) << 16, jnp.float32)
  if dtype_name == "float16":
    b = jax.lax.bitcast_convert_type(x.astype(jnp.float16), jnp.uint16).astype(jnp.int32)
    sign, e, m = b >> 15, (b >> 10) & 0x1F, b & 0x3FF
    normal = jax.lax.bitcast_convert_type((sign << 31) | ((e + 112) << 23) | (m << 13),
                                          jnp.float32)
    signed_one = (1 - 2 * sign).astype(jnp.float32)
    sub = m.astype(jnp.float32) * jnp.float32(2.0**-24) * signed_one
    special = jnp.where(m == 0, signed_one * jnp.inf, jnp.nan)
    return jnp.where(e == 0, sub, jnp.where(e == 31, special, normal))
  raise ValueError(f"dtype_name={dtype_name!r}; expected float32, bfloat16 or float16")


def _round_scale(s: jax.Array, scale_dtype: str, emax_elem: int) -> jax.Array:
  """Round float32 scales onto their storage grid; returns float32 values."""
  if scale_dtype in _FLOAT_SCALE_DTYPES:
    return round_to_float_dtype(s, scale_dtype)
  if scale_dtype == "e8m0":  # s is amax here
    # Exact floor(log2): XLA's float log2 misses exact powers of two by an ulp, which would
    # halve the scale and saturate the largest element.  The lower clip keeps the scale a
    # normal float32 (2**-127 is subnormal and CPUs may flush it, making w / s infinite).
    e = floor_log2(jnp.where(s > 0, s, 1.0)) - emax_elem
    return E8M0.decode(jnp.clip(e, -126, 127) + 127)
  raise AssertionError(scale_dtype)


def mx_rounded_amax(amax: jax.Array, spec: QuantSpec) -> jax.Array:
  """The group amax an e8m0 activation scale is taken from (``spec.act_mx_rounding``):
  as it is ("floor", OCP MX), or ("up") rounded to a power of two first, upwards where its
  significand is at least 1.75 (compressed-tensors' ``round_to_power_2`` with e2m1's one
  mantissa bit, which it uses for fp4 and fp8 elements alike; from vLLM's MX reference)."""
  if spec.act_mx_rounding == "floor":
    return amax
  safe = jnp.where(amax > 0, amax, 1.0)
  # Integer work only (no float pow / log2, which miss exact powers of two by an ulp on
  # XLA): a normal float32's significand is >= 1.75 when its top two mantissa bits are
  # set.  (Subnormal amaxes sit below every e8m0 scale's reach: clipped either way.)
  up = ((jax.lax.bitcast_convert_type(safe, jnp.int32) >> 21) & 3) == 3
  e = jnp.clip(floor_log2(safe) + up.astype(jnp.int32), -126, 127)
  return jnp.where(amax > 0, exp2_int(e), amax)


def store_scale(s: jax.Array, scale_dtype: str) -> jax.Array:
  """Scale values (already on grid) -> the storage array of ``scale_dtype``."""
  if scale_dtype in _FLOAT_SCALE_DTYPES:
    return s.astype(_FLOAT_SCALE_DTYPES[scale_dtype])
  if scale_dtype == "e8m0":
    return E8M0.encode(s)
  if scale_dtype == "fp8_e4m3":
    return s.astype(jnp.float8_e4m3fn)
  raise AssertionError(scale_dtype)


def decode_scales(q: QuantizedWeight) -> jax.Array:
  """Stored scales -> float32 (..., Gk, Gn), the global scale folded in."""
  sd = q.spec.scale_dtype
  if sd == "e8m0":
    s = E8M0.decode(q.scales)
  else:
    s = q.scales.astype(jnp.float32)
  if q.global_scale is not None:
    s = s * q.global_scale.astype(jnp.float32)[..., None, None]
  return s


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


# ----------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------
def quantize(w: Any, spec: QuantSpec | str, *, bias: Any = None,
             act_scale: float | jax.Array | None = None) -> QuantizedWeight:
  """Quantize a (K, N) float weight (Flax Dense kernel layout) or stacked (E, K, N) experts.

  Args:
    w: float weights, (K, N) or (E, K, N).
    spec: a :class:`QuantSpec` or a preset name.
    bias: optional (N,) / (E, N) bias, kept in float32 and added by ``quant_dense``.
    act_scale: the calibrated activation scale of a static-activation spec
      (``act_static=True``): ``x_q = round(x / act_scale)``.
  """
  spec = QuantSpec.preset(spec) if isinstance(spec, str) else spec
  if not isinstance(spec, QuantSpec):
    raise TypeError(f"spec must be a QuantSpec or preset name; got {type(spec).__name__}")
  w = jnp.asarray(w)
  if not jnp.issubdtype(w.dtype, jnp.floating):
    raise ValueError(f"w must be a float array; got dtype {w.dtype}")
  check_weight_shape(spec, w.shape)
  if _is_concrete(w) and not bool(jnp.all(jnp.isfinite(w))):
    raise ValueError("w contains NaN or inf; quantization scales would be garbage")
  *lead, k, n = w.shape
  if bias is not None:
    bias = jnp.asarray(bias, jnp.float32)
    if bias.shape != (*lead, n):
      raise ValueError(f"bias must have shape {(*lead, n)}; got {bias.shape}")
  if spec.act_static:
    if act_scale is None:
      raise ValueError("spec.act_static=True: pass act_scale=<calibrated scale>")
    act_scale = jnp.asarray(act_scale, jnp.float32).reshape(())
    if _is_concrete(act_scale) and not (np.isfinite(float(act_scale)) and act_scale > 0):
      # (0 -- e.g. calibrated on all-zero activations -- would zero every output)
      raise ValueError(f"act_scale={float(act_scale)!r}: expected a finite scale > 0 "
                       f"(x_q = round(x / act_scale))")
  elif act_scale is not None:
    raise ValueError("act_scale is only for specs with act_static=True")
  codes, scales, zeros, global_scale = _quantize_arrays(w, spec)
  q = QuantizedWeight(codes=codes, scales=scales, zeros=zeros, global_scale=global_scale,
                      bias=bias, act_scale=act_scale, spec=spec, shape=tuple(w.shape))
  if _is_concrete(w) and not bool(jnp.all(jnp.isfinite(decode_scales(q)))):
    # finite weights whose scale overflows the scale dtype (float16 past 65504) would
    # dequantize to inf / NaN
    amax = float(jnp.max(jnp.abs(w.astype(jnp.float32))))
    raise ValueError(f"spec {spec.name}: the weights' scales (|w| up to {amax:.3g}) do not "
                     f"fit scale_dtype={spec.scale_dtype!r}: some overflow to inf; rescale "
                     f"the weights or pick a wider scale dtype")
  return q


def _nonzero(s: jax.Array) -> jax.Array:
  """A scale that rounded to 0 in its dtype (a group far below the dtype's smallest value:
  float16 under ~3e-8) becomes 1, like an all-zero group's: its values code to 0 (they are
  below the format's smallest step) instead of 0 / 0 (fp8's NaN code)."""
  return jnp.where(s == 0, jnp.ones_like(s), s)


@functools.partial(jax.jit, static_argnums=1)
def _quantize_arrays(w: jax.Array, spec: QuantSpec):
  """The array part of :func:`quantize` (inputs already validated): packed codes, stored
  scales, zero points, global scale.  Jitted per (spec, shape): one compile instead of
  hundreds of op-by-op dispatches makes eager quantization ~5x faster; under an outer
  ``jit`` it simply inlines."""
  *_, k, n = w.shape
  fmt = spec.weight_format
  w32 = w.astype(jnp.float32)
  bk, bn = scale_block(spec, k, n)
  amax = _block_reduce(jnp.abs(w32), bk, bn, jnp.max)
  global_scale = zeros = None
  if spec.zero_point:
    wmax = jnp.maximum(_block_reduce(w32, bk, bn, jnp.max), 0.0)
    wmin = jnp.minimum(_block_reduce(w32, bk, bn, jnp.min), 0.0)
    s = (wmax - wmin) / fmt.max_value
    s = _nonzero(_round_scale(jnp.where(s > 0, s, 1.0), spec.scale_dtype, 0))
    zp = jnp.clip(jnp.round(-wmin / s), 0, fmt.max_value)
    zeros = zp.astype(jnp.uint8)
    scaled = w32 / expand_scales(s, k, n) + expand_scales(zp, k, n)
  else:
    qmax = fmt.max_value if fmt.max_value > 0 else 1.0  # int1 holds {-1, 0}
    if spec.global_scale:  # NVFP4-style: fp32 tensor scale, e4m3 block scales
      amax_t = jnp.max(jnp.abs(w32), axis=(-2, -1))
      global_scale = amax_t / (qmax * E4M3.max_value)
      global_scale = jnp.where(global_scale > 0, global_scale, 1.0).astype(jnp.float32)
      s_rel = amax / qmax / global_scale[..., None, None]
      s_rel = E4M3.quantize_dequantize(s_rel)
      s_rel = jnp.where(s_rel > 0, s_rel, 1.0)
      s = s_rel * global_scale[..., None, None]
    elif spec.scale_dtype == "e8m0":
      s = _round_scale(amax, "e8m0", fmt.emax)
    else:
      s = _nonzero(_round_scale(jnp.where(amax > 0, amax / qmax, 1.0), spec.scale_dtype, 0))
    scaled = w32 / expand_scales(s, k, n)
    if spec.global_scale:
      s = s_rel
      global_scale = jnp.where(jnp.all(jnp.isfinite(w32), axis=(-2, -1)), global_scale,
                               jnp.nan)
  # A block holding NaN/inf (only reachable under jit, where quantize cannot refuse it) gets
  # a NaN scale: its outputs are NaN, never the plausible garbage of a fallback scale 1
  # (the `> 0` guards above map NaN to 1).
  # (XLA's CPU max-reduction drops NaN, so amax cannot be trusted to carry it: count them.)
  finite = ~_block_reduce(~jnp.isfinite(w32), bk, bn, jnp.any)
  s = jnp.where(finite, s, jnp.nan)
  codes = fmt.encode(scaled)
  return (packing.pack_codes(codes, fmt.bits), store_scale(s, spec.scale_dtype), zeros,
          global_scale)


def with_input_permutation(q: QuantizedWeight, perm: Any) -> QuantizedWeight:
  """``q`` whose stored rows are the rows ``perm`` of the weight it stands for: an
  act-order (GPTQ ``desc_act``) layer, its rows sorted by group so that groups are
  contiguous.  ``quant_dense`` gathers x's columns by ``perm`` before the kernel
  (``x[:, perm] @ W[perm] = x @ W``); ``dequantize`` returns W in its own row order.

  Dense weight-only canonical params only: experts would need a permutation per expert,
  and activation scales over K groups would see the permuted order."""
  if q.layout != "canonical" or q.num_experts is not None or q.spec.act is not None:
    raise ValueError(f"with_input_permutation: expected canonical dense weight-only params; "
                     f"got {q!r} (act={q.spec.act})")
  if q.input_perm is not None:
    raise ValueError("with_input_permutation: params already carry an input_perm")
  perm = np.asarray(perm)
  k = q.in_features
  if perm.shape != (k,) or not np.issubdtype(perm.dtype, np.integer):
    raise ValueError(f"perm must be an integer array of shape (K,)=({k},); got "
                     f"{perm.dtype}{list(perm.shape)}")
  if not np.array_equal(np.sort(perm), np.arange(k)):
    raise ValueError(f"perm must be a permutation of range(K={k})")
  return q.replace(input_perm=jnp.asarray(perm, jnp.int32))


def check_no_input_perm(q: QuantizedWeight, name: str) -> None:
  """Stacked experts take no ``input_perm`` (each expert would need its own)."""
  if q.input_perm is not None:
    raise ValueError(f"{name}.input_perm is set (act-order rows): stacked experts take no "
                     "input permutation (each expert would need its own)")


def unpacked_codes(q: QuantizedWeight) -> jax.Array:
  """The (..., K, N) uint8 codes of canonical params, rows as stored (with an
  ``input_perm``: row i is the weight's row ``input_perm[i]``)."""
  if q.layout != "canonical":
    raise ValueError(f"params are in kernel layout {q.layout!r}; their codes as stored "
                     "need the canonical layout (humming_jax.kernels.registry.to_canonical "
                     "converts them; hj.dequantize reads either)")
  return packing.unpack_codes(q.codes, q.spec.weight_bits, q.in_features)


def dequantize(q: QuantizedWeight) -> jax.Array:
  """Exactly the float32 weights the kernels compute with: (code - zp) * s * s2.

  (K, N) -> (K, N), stacked (E, K, N) -> (E, K, N), a layer stack (layers..., K, N).
  Jitted per (spec, shape) like
  :func:`quantize`; inside an outer ``jit`` it inlines.  Params prepared for a kernel
  (``hj.prepare``) are read in their own layout where their family can, else converted
  to canonical first: the same values, bit for bit."""
  if not isinstance(q, QuantizedWeight):
    raise TypeError(f"q must be a QuantizedWeight (from quantize); got {type(q).__name__}")
  check_params(q, "q")
  if layers := stacked_layers(q):  # a layer stack: (layers..., K, N), one layer per step
    flat = jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[len(layers):]), q)
    return jax.lax.map(dequantize, flat).reshape(layers + tuple(q.shape))
  if q.layout != "canonical":
    return _dequantize_prepared_jit(q)  # (an unknown layout raises, naming it)
  return _dequantize_jit(q)


@jax.jit
def _dequantize_prepared_jit(q: QuantizedWeight) -> jax.Array:
  from humming_jax.kernels import registry  # noqa: PLC0415 - the kernels import this module
  return registry.dequantize(q)


@jax.jit
def _dequantize_jit(q: QuantizedWeight) -> jax.Array:
  k, n = q.shape[-2:]
  vals = q.spec.weight_format.decode(unpacked_codes(q))
  if q.zeros is not None:
    vals = vals - expand_scales(q.zeros.astype(jnp.float32), k, n)
  return unpermute_rows(vals * expand_scales(decode_scales(q), k, n), q.input_perm)


def unpermute_rows(w: jax.Array, input_perm: jax.Array | None) -> jax.Array:
  """(..., K, N) weights with rows as stored -> rows in W's order (stored row i is W's row
  ``input_perm[i]``: act-order checkpoints); as they are without a permutation."""
  if input_perm is None:
    return w
  return jnp.take(w, jnp.argsort(input_perm), axis=-2)


# ----------------------------------------------------------------------------------------
# Activations
# ----------------------------------------------------------------------------------------
class QuantizedActivations(NamedTuple):
  """``values``: activations on the format's grid in a carrier dtype the tensor cores take
  (int8 for integer formats, float8_e4m3fn for fp8 e4m3 and fp4 e2m1 -- e2m1 values are
  exact in e4m3 --, float8_e5m2 for e5m2), shape (M, K).
  ``scales``: float32 (M or 1, K // group or 1)."""

  values: jax.Array
  scales: jax.Array

  def dequantize(self) -> jax.Array:
    """float32 (M, K): values times their (broadcast) scales."""
    m, k = self.values.shape
    s = jnp.repeat(jnp.repeat(self.scales, m // self.scales.shape[0], 0),
                   k // self.scales.shape[1], 1)
    return self.values.astype(jnp.float32) * s


def carrier_dtype(fmt: NumberFormat):
  """The tensor-core dtype that holds an activation format's values exactly (int8; the
  fp8 formats themselves; e4m3 for fp4 e2m1)."""
  if fmt.is_integer:
    return jnp.int8
  return FP8_CARRIERS[fmt.name][0] if fmt.name in FP8_CARRIERS else jnp.float8_e4m3fn


def act_scale_shape(spec: QuantSpec, m: int, k: int) -> tuple[int, int]:
  g = spec.act_granularity
  if g == "tensor":
    return (1, 1)
  if g == "token":
    return (m, 1)
  return (m, k // spec.act_group_size)


def activation_group_amax(x32: jax.Array, spec: QuantSpec) -> tuple[jax.Array, jax.Array]:
  """Per activation-scale group of (M, K) ``x32`` (:func:`act_scale_shape`): the amax of
  |x|, and whether the group holds NaN / inf (XLA's CPU max drops NaN: counted apart)."""
  m, k = x32.shape
  gm, gk = act_scale_shape(spec, m, k)
  grouped = lambda a: a.reshape(gm, m // gm, gk, k // gk)
  return (jnp.max(grouped(jnp.abs(x32)), axis=(1, 3)),
          jnp.any(grouped(~jnp.isfinite(x32)), axis=(1, 3)))


def finite_amax(amax: jax.Array, bad: jax.Array) -> jax.Array:
  """The tensor amax over the finite groups (:func:`activation_group_amax`): what NVFP4
  activations' global scale is taken from, so one token holding inf / NaN neither moves
  nor (on a GPU, whose max propagates NaN) poisons every other token's scale."""
  return jnp.max(jnp.where(bad, 0.0, amax))


def quantize_activations(x: jax.Array, spec: QuantSpec,
                         act_scale: jax.Array | None = None) -> QuantizedActivations:
  """Quantize (M, K) activations as ``spec`` says (dynamic scales unless act_static)."""
  x, act_scale = _check_activations(x, spec, act_scale)
  return _quantize_activations_jit(x, spec, act_scale, None)


def kernel_activations(x: jax.Array, spec: QuantSpec, act_scale: jax.Array | None = None,
                       *, rows: int, kp: int, values_dtype=None) -> QuantizedActivations:
  """The W8A8-family pre-pass: :func:`quantize_activations`'s values, zero-padded to
  (rows, kp), for a kernel operand only -- never read back as floats in XLA.  fp8 formats
  take one convert, then the pad, then an optimization barrier, instead of the
  reference's convert, integer decode and convert back (``_round_fp8``: XLA's GPU
  pipeline folds an f32 -> fp8 -> f32 chain away; the barrier keeps any later widening
  from folding into this convert).  Same values, a fraction of the ALU work (H200 session
  17, M = 4096 x 8192: the convert fusion took 60.7 us per layer).

  ``values_dtype`` (bfloat16 / float16): the same values in that dtype instead of the
  carrier (int8 and 8-bit float codes are exact in both), rounded by the reference's
  rules (fp8 through its integer decode, which no convert folding can skip) and written
  once: for kernels that take 16-bit operands (``w8a8.run_decode_mgpu``), no carrier
  array and no second convert pass."""
  x, act_scale = _check_activations(x, spec, act_scale)
  if rows < x.shape[0] or kp < x.shape[1]:
    raise ValueError(f"rows={rows}, kp={kp}: expected at least x.shape={x.shape}")
  if values_dtype is not None:
    values_dtype = jnp.dtype(values_dtype)
    if values_dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
      raise ValueError(f"values_dtype={values_dtype}: expected bfloat16 or float16")
  return _quantize_activations_jit(x, spec, act_scale, (rows, kp), values_dtype)


def _check_activations(x, spec: QuantSpec, act_scale):
  fmt = spec.act_format
  if fmt is None:
    raise ValueError(f"spec {spec.name} has no activation format (act=None)")
  x = jnp.asarray(x)
  if x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x must be a float (M, K) array; got shape {x.shape} dtype {x.dtype}")
  m, k = x.shape
  if spec.act_granularity == "group" and k % spec.act_group_size:
    raise ValueError(f"act_group_size={spec.act_group_size} does not divide K={k}")
  if spec.act_static and act_scale is None:
    raise ValueError("spec.act_static=True but the params carry no act_scale")
  if act_scale is not None:
    act_scale = jnp.asarray(act_scale, jnp.float32)
  return x, act_scale


@functools.partial(jax.jit, static_argnums=(1, 3, 4))
def _quantize_activations_jit(x: jax.Array, spec: QuantSpec, act_scale: jax.Array | None,
                              pad_to: tuple[int, int] | None, values_dtype=None
                              ) -> QuantizedActivations:
  # Jitted per (spec, shape) for the same reason as _quantize_arrays; inlines under jit.
  # pad_to: kernel_activations' padded operand (fp8 through one convert); values_dtype:
  # its 16-bit values instead of the carrier (every activation format is exact in both).
  fmt = spec.act_format
  m, k = x.shape
  x32 = x.astype(jnp.float32)
  qmax = fmt.max_value
  if spec.act_static:
    s = jnp.broadcast_to(act_scale, (1, 1))
  else:
    amax, bad = activation_group_amax(x32, spec)  # bad groups: a NaN scale below
    sd = spec.act_scale_dtype
    if sd == "e8m0":
      s = _round_scale(mx_rounded_amax(amax, spec), "e8m0", fmt.emax)
    elif sd == "fp8_e4m3":  # NVFP4 activations: dynamic fp32 tensor scale x e4m3 blocks
      s2 = finite_amax(amax, bad) / (qmax * E4M3.max_value)
      s2 = jnp.where(s2 > 0, s2, 1.0)
      s_rel = E4M3.quantize_dequantize(amax / qmax / s2)
      s = jnp.where(s_rel > 0, s_rel, 1.0) * s2
    else:
      s = _nonzero(_round_scale(jnp.where(amax > 0, amax / qmax, 1.0), sd, 0))
  if not spec.act_static:
    # A row/group holding NaN/inf gets a NaN scale (XLA's CPU max drops NaN, and an int8
    # cast of NaN is an arbitrary integer): NaN in, NaN out, never a silent finite value.
    s = jnp.where(bad, jnp.nan, s)
  elif fmt.is_integer:
    # A calibrated per-tensor scale with integer codes: a NaN anywhere makes it NaN (as a
    # dynamic per-tensor scale's), where the int8 code of a NaN was 0 on the CPU, a
    # finite output (inf saturates: the static scale's clipping).  fp8 codes carry NaN
    # themselves: their rows alone come out NaN.
    s = jnp.where(jnp.any(jnp.isnan(x32)), jnp.nan, s)
  xs = x32 / jnp.repeat(jnp.repeat(s, m // s.shape[0], 0), k // s.shape[1], 1)
  if pad_to is not None and fmt.name in FP8_CARRIERS and values_dtype is None:
    # the carrier: one RNE convert, saturated first
    dtype, maxv = FP8_CARRIERS[fmt.name]
    vals = _pad(jnp.clip(xs, -maxv, maxv).astype(dtype), pad_to)
    return QuantizedActivations(jax.lax.optimization_barrier(vals), s)
  vals = fmt.decode(fmt.encode(xs)) if fmt.name not in _FAST_ROUND else _FAST_ROUND[fmt.name](xs)
  vals = vals.astype(values_dtype or carrier_dtype(fmt))
  return QuantizedActivations(vals if pad_to is None else _pad(vals, pad_to), s)


def _pad(a: jax.Array, shape: tuple[int, int]) -> jax.Array:
  return jnp.pad(a, ((0, shape[0] - a.shape[0]), (0, shape[1] - a.shape[1])))


def _round_fp8(dtype, fmt_name: str, maxv: float):
  """XLA's convert to fp8 (RNE, like formats.encode: asserted in the tests), read back
  through the format's integer decode.  Not ``.astype(dtype).astype(float32)``: with
  xla_allow_excess_precision (the default) XLA's GPU pipeline runs
  simplify-fp-conversions, which folds an f32 -> fp8 -> f32 convert chain into nothing,
  silently skipping the quantization (seen on the H200: the XLA reference of every
  fp8-activation spec computed with unquantized activations)."""
  fmt = get_format(fmt_name)

  def round_fp8(x):
    q = jnp.clip(x, -maxv, maxv).astype(dtype)
    return fmt.decode(jax.lax.bitcast_convert_type(q, jnp.uint8))
  return round_fp8


def round_e2m1(x: jax.Array) -> jax.Array:
  """float32 ``x`` with |x| <= 6 rounded (RNE) onto the fp4 e2m1 grid, float32 out.

  e2m1's grid has step 0.5 below 2, 1 below 4 and 2 up to 6, so ``round_half_even(x /
  step) * step`` is its RNE rounding (even multiples of the step are exactly the even
  mantissas).  Arithmetic, not XLA's ``float4_e2m1fn`` convert: on the H200 an
  f32 -> f4 -> f8 convert chain lost the fp4 step (2026-11-29); and the generic
  ``encode`` is a table search."""
  ax = jnp.abs(x)
  step = jnp.where(ax < 2.0, 0.5, jnp.where(ax < 4.0, 1.0, 2.0))
  return jnp.round(x / step) * step  # jnp.round: half to even; x / step is exact


# fp8 activation formats: their carrier dtype (the format itself) and largest finite value.
FP8_CARRIERS = {name: (dtype, get_format(name).max_value) for name, dtype in
                (("fp8_e4m3", jnp.float8_e4m3fn), ("fp8_e5m2", jnp.float8_e5m2))}

_FAST_ROUND = {
    "fp4_e2m1": lambda x: round_e2m1(jnp.clip(x, -6.0, 6.0)),
    **{name: _round_fp8(dtype, name, maxv) for name, (dtype, maxv) in FP8_CARRIERS.items()},
    # [-128, 127] like formats.encode: a dynamic scale never reaches -128, a static one can.
    "int8": lambda x: jnp.clip(jnp.round(x), -128, 127),
}


def fake_quantize_activations(x: jax.Array, spec: QuantSpec,
                              act_scale: jax.Array | None = None) -> jax.Array:
  """quantize-dequantize (M, K) activations: what the kernels effectively multiply.

  Differentiable with the straight-through estimator: the derivative with respect to x
  is the identity (the rounding's own derivative is zero almost everywhere and would stop
  every gradient, e.g. through a W8A8 layer); ``act_scale`` gets none."""
  return _fake_quantize_straight_through(x, spec, act_scale)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _fake_quantize_straight_through(x: jax.Array, spec: QuantSpec,
                                    act_scale: jax.Array | None) -> jax.Array:
  return quantize_activations(x, spec, act_scale).dequantize()


@_fake_quantize_straight_through.defjvp
def _fake_quantize_jvp(spec, primals, tangents):
  x, act_scale = primals
  y = _fake_quantize_straight_through(x, spec, act_scale)
  return y, tangents[0].astype(y.dtype)
