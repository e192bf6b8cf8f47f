"""WnA16: weight-only quantized GEMM as a Pallas-Triton kernel (dequantize inside the GEMM).

``y = x @ W_deq + bias`` for every weight format of formats.py (int1..8 sym, uint1..8 with
zero point, fp4 e2m1, fp6 e2m3/e3m2, fp8 e4m3/e5m2) with tensor / channel / group / 2-D
block scales (bf16, fp16, fp32, e8m0 or e4m3 x fp32 global), bf16/fp16/fp32 activations.

How (see layout.py for the weight layout):
  grid = (M tiles, N tiles, K splits); each program walks its K tiles; per tile and slab
  it unpacks a (slab, block_n) code tile from uint32 words (shift + mask), decodes it with
  the format's own decode (formats.py), casts the exact values to the activation dtype and
  feeds ``jnp.dot`` (tensor cores).  Scales multiply the (block_m, block_n) partial product
  of each slab, not the weights: block_m*block_n instead of slab*block_n multiplies, and the
  dequantized codes stay exact in bf16.  Zero points are subtracted from the codes before
  the dot (exact in bf16).  Split-K partials are summed by XLA.

Why Pallas-Triton and not Mosaic GPU here: see benchmarks/NOTES.md (measured).
The XLA reference beside it is kernels/reference.py::dense_reference.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from humming_jax.quantize import (QuantizedWeight, scale_block, unpacked_codes)
from humming_jax.formats import get_format, uint_to_f32
from humming_jax.kernels import layout as lay
from humming_jax.kernels import launch, registry, tuning
from humming_jax.spec import QuantSpec

FAMILY = "wna16"


def supports(spec: QuantSpec) -> bool:
  return spec.act is None


def _group_rows(spec: QuantSpec, k: int) -> int:
  """K rows per scale row (K for channel/tensor)."""
  return spec.group_size if spec.granularity in ("group", "block") else k


def slab_layout(spec: QuantSpec, k: int, *, fit_k: bool = False) -> lay.SlabLayout:
  """The slab layout for ``spec``; ``fit_k`` also sizes the K tile to K (see
  layout.choose_slab; the default keeps the K-independent layout)."""
  group = spec.group_size if spec.granularity in ("group", "block") else None
  return lay.SlabLayout(spec.weight_bits, lay.choose_slab(spec.weight_bits, group,
                                                          k if fit_k else None))


# ----------------------------------------------------------------------------------------
# Transform: canonical -> kernel layout (once)
# ----------------------------------------------------------------------------------------
def prepare(params: QuantizedWeight, layout: lay.SlabLayout | None = None
            ) -> QuantizedWeight:
  """Canonical params -> kernel layout (padded, slab-interleaved, offset-binary ints).

  ``layout``: the slab layout to use (default: :func:`slab_layout` of the spec)."""
  spec = params.spec
  if params.num_experts is not None:
    return jax.vmap(lambda p: prepare(p, layout))(params)  # pragma: no cover - grouped
  k, n = params.shape
  lt = slab_layout(spec, k) if layout is None else layout
  kp, np_ = lt.padded_k(k), lt.padded_n(n)
  codes = unpacked_codes(params)
  fmt = spec.weight_format
  if fmt.kind == "int":  # offset binary: the kernel decodes unsigned and subtracts 2**(b-1)
    codes = codes ^ (1 << (fmt.bits - 1))
  codes = jnp.pad(codes, ((0, kp - k), (0, np_ - n)))
  words = lt.pack(codes)
  scales = _kernel_scales(params, kp, np_)
  zeros = None
  if params.zeros is not None:
    rows = kp // spec.group_size if spec.granularity in ("group", "block") else 1
    z = _expand_n(params.zeros, n)
    zeros = jnp.pad(z, ((0, rows - z.shape[0]), (0, np_ - n)))
  return params.replace(codes=words, scales=scales, zeros=zeros,
                        layout=lay.layout_name(FAMILY, lt))


def _expand_n(a: jax.Array, n: int) -> jax.Array:
  """Per-block-of-N values -> per column (2-D block scales, tensor scales)."""
  return jnp.repeat(a, n // a.shape[-1], axis=-1) if a.shape[-1] != n else a


def _kernel_scales(params: QuantizedWeight, kp: int, np_: int) -> jax.Array:
  spec = params.spec
  k, n = params.shape
  s = params.scales
  if s.dtype == jnp.float8_e4m3fn:  # kernels read the bits and decode them (formats.py)
    s = jax.lax.bitcast_convert_type(s, jnp.uint8)
  s = _expand_n(s, n)
  rows = kp // spec.group_size if spec.granularity in ("group", "block") else 1
  if s.dtype == jnp.uint8:
    return jnp.pad(s, ((0, rows - s.shape[0]), (0, np_ - n)), constant_values=0x38
                   if spec.scale_dtype == "fp8_e4m3" else 127)
  return jnp.pad(s, ((0, rows - s.shape[0]), (0, np_ - n)), constant_values=1)


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare`."""
  from humming_jax import packing
  spec = prepared.spec
  k, n = prepared.shape
  _, lt = lay.parse_layout_name(prepared.layout)
  codes = lt.unpack(prepared.codes)[:k, :n]
  fmt = spec.weight_format
  if fmt.kind == "int":
    codes = codes ^ (1 << (fmt.bits - 1))
  bk, bn = scale_block(spec, k, n)
  gk = k // bk
  s = prepared.scales[:gk, :n:bn]
  if spec.scale_dtype == "fp8_e4m3":
    s = jax.lax.bitcast_convert_type(s, jnp.float8_e4m3fn)
  z = None if prepared.zeros is None else prepared.zeros[:gk, :n:bn]
  return prepared.replace(codes=packing.pack_codes(codes, fmt.bits), scales=s, zeros=z,
                          layout="canonical")


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------
def _decode_scale_row(s: jax.Array, spec: QuantSpec) -> jax.Array:
  """Stored scale codes -> float32, NaN codes (e8m0 0xFF, e4m3 S.1111.111) as NaN like
  the reference: a corrupt scale must not become a finite wrong answer (one compare per
  scale, not per weight)."""
  if spec.scale_dtype == "e8m0":
    return get_format("e8m0").decode(s)
  if spec.scale_dtype == "fp8_e4m3":
    return get_format("fp8_e4m3").decode(s)
  return s.astype(jnp.float32)


def decode_codes(code: jax.Array, zero_row, fmt) -> jax.Array:
  """Unsigned slab-layout codes -> float32 values (zero point subtracted)."""
  if fmt.kind == "int":  # offset binary (see prepare): unsigned decode minus 2**(b-1)
    return uint_to_f32(code, float(1 << (fmt.bits - 1)))
  if fmt.kind == "uint":  # always with a zero point (QuantSpec enforces it)
    return uint_to_f32(code, zero_row)
  return fmt.decode(code, check_nan=False)


def unpack_slab(load_words, lt: lay.SlabLayout, t, s: int, words: dict,
                transpose: bool = False) -> jax.Array:
  """Unsigned codes (slab, block_n) of slab ``s`` of K tile ``t`` (shift + mask per plane).

  ``load_words(row, n)`` -> (n, block_n) uint32 words; ``words`` caches the word rows
  already loaded for tile ``t`` (slabs share word rows: pass the same dict per tile).
  ``transpose``: return (block_n, slab); the *packed words* are transposed (one word per
  32/bits codes), which is far cheaper than transposing decoded values."""
  code = None
  for p, pb in enumerate(lt.planes):
    r, shift = lt.locate(p, s)
    if r not in words:
      w = load_words(t * lt.rows_per_tile + r, lt.slab)
      words[r] = w.T if transpose else w
    part = (words[r] >> shift) & ((1 << pb) - 1)
    off = lt.plane_bit_offset(p)
    part = part << off if off else part
    code = part if code is None else code | part
  return code


def accumulate_k(acc: jax.Array, *, load_words, load_x, load_scale_row, load_zero_row,
                 spec: QuantSpec, lt: lay.SlabLayout, first_tile, num_tiles: int,
                 group_rows: int, compute_dtype, swap_ab: bool = False,
                 use_mma: bool = True) -> jax.Array:
  """The K loop shared by the dense and the grouped (MoE) kernels.

  Adds ``x[:, K tiles first_tile .. first_tile + num_tiles) @ W_deq`` to the float32
  ``acc`` (block_m, block_n); group/block scales are applied per slab.  The loaders hide
  where the operands live (a dense block, or one expert of a stacked ref):
  ``load_words(row, n)`` -> (n, block_n) uint32 slab-layout words, ``load_x(k0, n)`` ->
  (block_m, n) activations, ``load_scale_row(g)`` / ``load_zero_row(g)`` -> (1, block_n).

  ``swap_ab`` (small M): computes ``acc^T (block_n, block_m) += W_deq^T @ x^T`` instead, so
  the dequantized weights are the MMA's A operand and can stay in registers (the B
  operand must pass through shared memory); ``load_x`` then returns (n, block_m) rows of
  x^T and ``acc`` is (block_n, block_m).

  ``use_mma=False`` (tiny M): multiply-add and a reduction over the slab instead of a
  tensor-core dot, one activation row at a time; the dequantized weights never leave
  registers.
  """
  fmt = spec.weight_format
  slab = lt.slab
  per_slab_scale = spec.granularity in ("group", "block")
  has_zeros = load_zero_row is not None

  def tile(t_local, acc):
    t = first_tile + t_local
    words = {}
    for s in range(lt.num_slabs):
      code = unpack_slab(load_words, lt, t, s, words, transpose=swap_ab)
      k0 = t * lt.block_k + s * slab
      zero_row = None
      if has_zeros:
        g = k0 // group_rows if per_slab_scale else 0
        zero_row = load_zero_row(g).astype(jnp.float32)
        zero_row = zero_row.T if swap_ab else zero_row
      w = decode_codes(code, zero_row, fmt).astype(compute_dtype)
      xs = load_x(k0, slab).astype(compute_dtype)
      if not use_mma:
        wf = w.astype(jnp.float32)
        xf = xs.astype(jnp.float32)
        part = jnp.concatenate(
            [jnp.sum(xf[i:i + 1, :].T * wf, axis=0, keepdims=True)
             for i in range(xf.shape[0])], axis=0) if xf.shape[0] > 1 else \
            jnp.sum(xf.T * wf, axis=0, keepdims=True)
      elif swap_ab:
        part = jnp.dot(w, xs, preferred_element_type=jnp.float32)
      else:
        part = jnp.dot(xs, w, preferred_element_type=jnp.float32)
      if per_slab_scale:
        srow = _decode_scale_row(load_scale_row(k0 // group_rows), spec)
        part = part * (srow.T if swap_ab else srow)
      acc = acc + part
    return acc

  return jax.lax.fori_loop(0, num_tiles, tile, acc)


def _kernel(*refs, spec: QuantSpec, lt: lay.SlabLayout, tiles_per_split: int,
            group_rows: int, has_zeros: bool, has_s2: bool, has_bias: bool,
            split_k: int, compute_dtype, swap_ab: bool, use_mma: bool):
  x_ref, codes_ref, scales_ref, *rest = refs
  zeros_ref = rest.pop(0) if has_zeros else None
  s2_ref = rest.pop(0) if has_s2 else None
  bias_ref = rest.pop(0) if has_bias else None
  (o_ref,) = rest
  block_m = x_ref.shape[1] if swap_ab else x_ref.shape[0]
  block_n = codes_ref.shape[1]
  per_slab_scale = spec.granularity in ("group", "block")
  split = pl.program_id(2)

  if swap_ab:  # x arrives transposed: (K, block_m)
    acc = jnp.zeros((block_n, block_m), jnp.float32)
    load_x = lambda k0, n: x_ref[pl.ds(k0, n), :]
  else:
    acc = jnp.zeros((block_m, block_n), jnp.float32)
    load_x = lambda k0, n: x_ref[:, pl.ds(k0, n)]
  acc = accumulate_k(
      acc, load_words=lambda r, n: codes_ref[pl.ds(r, n), :],
      load_x=load_x, swap_ab=swap_ab,
      load_scale_row=lambda g: scales_ref[pl.ds(g, 1), :],
      load_zero_row=(lambda g: zeros_ref[pl.ds(g, 1), :]) if has_zeros else None,
      spec=spec, lt=lt, first_tile=split * tiles_per_split, num_tiles=tiles_per_split,
      group_rows=group_rows, compute_dtype=compute_dtype, use_mma=use_mma)
  if swap_ab:
    acc = acc.T
  if not per_slab_scale:
    acc = acc * _decode_scale_row(scales_ref[...], spec)
  launch.store_output(acc, o_ref, s2_ref=s2_ref, bias_ref=bias_ref, split_k=split_k)


def run(params: QuantizedWeight, x: jax.Array, *, interpret: bool = False,
        config: tuning.TuningConfig | None = None) -> jax.Array:
  """(M, K) activations x prepared params -> (M, N) in x.dtype."""
  spec = params.spec
  k, n = params.shape
  _, lt = lay.parse_layout_name(params.layout)
  m = x.shape[0]
  kp = lt.k_of_rows(params.codes.shape[0])
  np_ = params.codes.shape[1]
  k_tiles = kp // lt.block_k
  if config is None:
    key = tuning.cache_key(FAMILY, spec.name, tuning.bucket_m(m), n, k, tuning.device_kind())
    config = tuning.cached_config(key) or tuning.wna16_heuristic(
        m, np_, k_tiles, sms=tuning.num_sms())
  if config.strategy == "dequant_gemm":
    return _dequant_gemm(params, x)
  block_m = config.block_m
  mp = -(-m // block_m) * block_m
  block_n = min(config.block_n, np_)
  split_k = config.split_k if k_tiles % config.split_k == 0 else 1
  compute_dtype = x.dtype if x.dtype in (jnp.bfloat16, jnp.float16) else jnp.float32
  xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
  group_rows = _group_rows(spec, k)
  has_zeros = params.zeros is not None
  has_s2 = params.global_scale is not None
  has_bias = params.bias is not None and split_k == 1

  n_spec = lambda rows: pl.BlockSpec((rows, block_n), lambda i, j, s: (0, j))
  if config.swap_ab:  # x^T: the kernel's MMA B operand (see accumulate_k)
    operands = [xp.T, params.codes, params.scales]
    x_spec = pl.BlockSpec((kp, block_m), lambda i, j, s: (0, i))
  else:
    operands = [xp, params.codes, params.scales]
    x_spec = pl.BlockSpec((block_m, kp), lambda i, j, s: (i, 0))
  in_specs = [x_spec, n_spec(params.codes.shape[0]), n_spec(params.scales.shape[0])]
  if has_zeros:
    operands.append(params.zeros)
    in_specs.append(n_spec(params.zeros.shape[0]))
  extra, extra_specs = launch.epilogue_operands(params, n, np_, n_spec, with_bias=has_bias)
  operands += extra
  in_specs += extra_specs
  kernel = functools.partial(
      _kernel, spec=spec, lt=lt, tiles_per_split=k_tiles // split_k, group_rows=group_rows,
      has_zeros=has_zeros, has_s2=has_s2, has_bias=has_bias, split_k=split_k,
      compute_dtype=compute_dtype, swap_ab=config.swap_ab and config.strategy == "mma",
      use_mma=config.strategy == "mma")
  return launch.launch_dense(
      kernel, operands, in_specs, mp=mp, np_=np_, m=m, n=n, block_m=block_m,
      block_n=block_n, split_k=split_k, out_dtype=x.dtype, bias=params.bias, config=config,
      interpret=interpret, name=f"wna16_{spec.weight}_{lt.name}")


def dequantize_prepared(params: QuantizedWeight) -> jax.Array:
  """float32 (K, N) weights straight from the kernel layout (no re-packing): one XLA
  fusion of unpack, decode, zero point and scales."""
  spec = params.spec
  k, n = params.shape
  _, lt = lay.parse_layout_name(params.layout)
  codes = lt.unpack(params.codes)  # (Kp, Np), offset-binary for signed ints
  kp, np_ = codes.shape
  zeros = None
  if params.zeros is not None:
    zeros = jnp.repeat(params.zeros.astype(jnp.float32), kp // params.zeros.shape[0], 0)
  vals = decode_codes(codes, zeros, spec.weight_format)
  s = _decode_scale_row(params.scales, spec)
  if params.global_scale is not None:  # same rounding order as quantize.decode_scales
    s = s * params.global_scale.astype(jnp.float32)
  return (vals * jnp.repeat(s, kp // s.shape[0], axis=0))[:k, :n]


def _dequant_gemm(params: QuantizedWeight, x: jax.Array) -> jax.Array:
  """Large M: dequantize the prepared weights to x's dtype in one XLA fusion, then the
  vendor GEMM.  The reference semantics are unchanged (same decode, same scales)."""
  return launch.gemm_dequantized(x, lambda dt: dequantize_prepared(params).astype(dt),
                                 params.bias)


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=2, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run,
    dequantize=lambda params, dtype: dequantize_prepared(params).astype(dtype)))
