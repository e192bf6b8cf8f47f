"""fp4 e2m1 (and fp8 e4m3) codes -> bf16 / fp16 in registers, for the Mosaic GPU WnA16
kernel.

Hopper has no e2m1 conversion instruction (Mosaic's f4e2m1fn casts need Blackwell), so
the kernel loads fp4 weights as int4 registers holding the raw e2m1 bit pattern
``s e1 e0 m`` and rebuilds each value with bit operations:

  the magnitude bits ``e1 e0 m`` are placed at the low end of the 16-bit float's exponent
  field (exponent field = e, mantissa MSB = m) and the sign at bit 15.  That 16-bit float
  is exactly ``value * 2**-(bias - 1)`` -- the e2m1 subnormal (e = 0: 0 or 0.5) lands on
  the 16-bit float's subnormals with the same ratio -- so one multiply by
  ``2**(bias - 1)`` (2**126 for bf16, 2**14 for fp16; exact) gives the value.

Two implementations of the same function: :func:`to_float_interpret` (the format's
decode, for the interpreter) and :func:`to_float_ptx` (inline PTX per register pair
through ``plgpu.inline_mgpu``: ``prmt`` gathers the two nibbles of a pair into the top of
each 16-bit half, then shift / and / lop3 build both halves at once and an
``fma.bf16x2`` applies the power of two -- five instructions per two weights when the PTX
can read the 32-bit register of 8 nibbles, ~8 when each pair arrives on its own; see
``to_float_ptx``'s ``relayout``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

from humming_jax.formats import exp2_int, get_format
from humming_jax.kernels import act_prepass

E2M1 = get_format("fp4_e2m1")

def bias_factor(dtype) -> float:
  """2**(bias - 1) of the 16-bit ``dtype`` (bf16 2**126, fp16 2**14): what the PTX
  conversion multiplies its bit-built value by (:func:`_target`)."""
  return 2.0 ** (jnp.finfo(dtype).maxexp - 2)


def _target(dtype) -> tuple[int, int]:
  """The bit layout of the 16-bit target: where e2m1's three magnitude bits go (the
  mantissa MSB sits at bit nmant - 1: bf16 6, fp16 9) and the bits of 2**(bias - 1), the
  power of two that undoes the exponent-bias difference (bf16 2**126 = 0x7E80, fp16
  2**14 = 0x7400)."""
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f"dtype={dtype}: fp4 weights convert to bfloat16 or float16")
  return (jnp.finfo(dtype).nmant - 1,
          int(np.array(bias_factor(dtype), dtype).view(np.uint16)))


def to_float_interpret(codes: jax.Array, dtype) -> jax.Array:
  """int4 array of e2m1 bit patterns (the pattern ``s e1 e0 m`` read as a two's-complement
  nibble) -> the e2m1 values in ``dtype``, through the format's own decode (the
  interpreter: its CPU flushes the bf16 subnormal the bit trick passes through; also the
  XLA dequantization of the prepared layout, in any float dtype)."""
  return E2M1.decode(codes.astype(jnp.int32) & 15).astype(dtype)


# The prepared 4-bit layout's K order (wna16_mgpu.prepare, ":pk" layouts): within each run of
# 32 codes, the code of column 8c + 2q + e (c, q < 4; e < 2) is stored at 8q + 2c + e.
# Loaded in the WGMMA_UPCAST_4X layout, lane q then holds in one 32-bit register exactly
# the four pairs that the WGMMA layout gives it (pair c in byte c), so the conversion reads
# them without Mosaic's relayout (two shuffles and two permutes per register: 0.5 of the
# decode kernel's 3.85 instructions per weight, H200 session 19's SASS profile).
PERMUTE_RUN = 32


def permute_k(codes: jax.Array) -> jax.Array:
  """Codes in K order <-> the permuted K order of ":pk" layouts (an involution) along the
  last axis, whose length must be a multiple of :data:`PERMUTE_RUN`."""
  *lead, k = codes.shape
  if k % PERMUTE_RUN:
    raise ValueError(f"codes.shape={codes.shape}: the last axis must be a multiple of "
                     f"{PERMUTE_RUN}")
  return codes.reshape(*lead, k // PERMUTE_RUN, 4, 4, 2).swapaxes(-3, -2).reshape(codes.shape)


def _code_words(arr, what: str, remedy: str):
  """(index, i32 word) of each register of a WGMMA_UPCAST_4X array of int4 codes (8 codes
  per 32-bit register, as jax 0.11.2's Mosaic GPU lays them out); another register shape
  is refused by name (``what``), with the ``remedy`` a user can take."""
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  i32 = ir.IntegerType.get_signless(32)
  for idx, reg in np.ndenumerate(arr.registers):
    if ir.VectorType(reg.type).shape != [8]:
      raise NotImplementedError(f"{what}: expected registers of 8 int4 codes, got "
                                f"{reg.type}; {remedy}")
    yield idx, mgpu_utils.bitcast(reg, i32)


def _direct_pairs(arr, convert_word):
  """WGMMA-layout registers from a WGMMA_UPCAST_4X array of permuted codes: 4X register
  (i, C, *rest) (32 bits: 8 codes) gives WGMMA registers (i, 4C + c, *rest), c < 4, each
  ``convert_word(word, c, idx)`` of the register's i32 word and the new register's index."""
  from jax.experimental.mosaic import gpu as mgpu

  assert arr.layout == mgpu.WGMMA_LAYOUT_UPCAST_4X, arr.layout  # inline_mgpu's arg_types
  shape = mgpu.WGMMA_LAYOUT.registers_shape(arr.shape)
  if arr.registers.ndim != len(shape) or shape[1] != 4 * arr.registers.shape[1]:
    raise NotImplementedError(f"permuted codes: this jax's Mosaic GPU gives WGMMA_UPCAST_4X "
                              f"registers {arr.registers.shape} for WGMMA registers {shape} "
                              f"(jax 0.11.2: (., K/32, ...) and (., K/8, ...)); prepare the "
                              f"weights with HUMMING_JAX_PERMUTE_K=0 (the K order)")
  out = np.empty(shape, dtype=object)
  for idx, word in _code_words(arr, "permuted codes",
                               "prepare the weights with HUMMING_JAX_PERMUTE_K=0 (the K order)"):
    for c in range(4):
      new = (idx[0], 4 * idx[1] + c, *idx[2:])
      out[new] = convert_word(word, c, new)
  assert all(r is not None for r in out.flat)
  return out


def e2m1_from_int4_float(codes: jax.Array, dtype) -> jax.Array:
  """Same values as :func:`to_float_interpret`, decoded in float arithmetic on the int4 ->
  float convert (v = the pattern as a two's-complement nibble; magnitude bits u = v + 8
  for v < 0; |value| = u/2 + max(u - 4, 0)/2 + max(u - 6, 0): 0, .5, 1, 1.5, 2, 3, 4, 6),
  every step exact.  For XLA dequantization fusions that also permute the codes."""
  v = codes.astype(jnp.float32)
  neg = v < 0
  u = jnp.where(neg, v + 8, v)
  mag = u * 0.5 + jnp.maximum(u - 4, 0) * 0.5 + jnp.maximum(u - 6, 0)
  return jnp.where(neg, -mag, mag).astype(dtype)


def _pair_ptx(part: int, shift: int, scale_bits: int, float_type: str,
              scaled: bool = False) -> str:
  """PTX: $1 = 32-bit register of 8 nibbles shifted left by 4, $2 = the register
  [, $3 = the pair's factors, two 16-bit floats]; $0 = values of nibbles (2 part,
  2 part + 1) as a packed pair of 16-bit floats.

  ``prmt`` puts the byte holding each nibble in its *high* half into the top byte of a
  16-bit half (nibble at bits 15..12: the sign already at bit 15), one shift moves the
  magnitude to bits shift+2..shift, and one ``lop3`` keeps the sign | magnitude.  The
  ``fma`` multiplies by 2**(bias - 1), or with ``scaled`` by $3 (:func:`to_float_ptx`'s
  ``factors``: the group scale folded into that power of two)."""
  mag = (7 << shift) * 0x10001  # magnitude bits of both halves
  sel = f"0x{4 + part:x}0{part:x}0"  # top bytes: byte part of $1 (even), of $2 (odd)
  factor = "$3" if scaled else "k"
  return f"""
  {{
  .reg .b32 t, u, sg, k, z;
  prmt.b32 t, $1, $2, {sel};
  shr.b32 u, t, {12 - shift};
  and.b32 u, u, {mag:#x};
  mov.b32 sg, 0x80008000;
  lop3.b32 t, t, sg, u, 0xEA;
  mov.b32 k, {scale_bits * 0x10001:#x};
  mov.b32 z, 0x80008000;
  fma.rn.{float_type}x2 $0, t, {factor}, z;
  }}
  """


def _sliced_word(reg):
  """(the i32 register, first nibble) when Mosaic cut the fragment register ``reg`` from a
  32-bit register of 8 nibbles by a unit-stride slice, else None (then the PTX cannot read
  the whole word)."""
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import vector

  op = getattr(reg.owner, "opview", None)
  if not (isinstance(op, vector.ExtractStridedSliceOp)
          and mgpu_utils.bitwidth(op.source.type) == 32 and op.strides[0].value == 1):
    return None
  return (mgpu_utils.bitcast(op.source, ir.IntegerType.get_signless(32)),
          op.offsets[0].value)


def to_float_ptx(codes: jax.Array, dtype, *, relayout: bool = False,
                 permuted: bool = False, factors: jax.Array | None = None) -> jax.Array:
  """Same as :func:`to_float_interpret`, as inline PTX on the registers (GPU only).

  ``codes``: the int4 tile in the WGMMA layout, or with ``relayout`` as loaded (the
  WGMMA_UPCAST_4X layout) and relaid out in here.  Only then is each pair's register
  visibly a slice of a 32-bit register of 8 nibbles, which the PTX reads directly; behind
  the ``inline_mgpu`` boundary a slice is an opaque value, so each pair is shifted down to
  the low bits first (~3 instructions more per pair).  ``permuted``: the codes as loaded
  (WGMMA_UPCAST_4X) in the permuted K order of :func:`permute_k`; no relayout at all.

  ``factors`` (``permuted`` only): a WGMMA-layout ``dtype`` array of the codes' shape that
  replaces the constant 2**(bias - 1) of the conversion's ``fma``: each code's group
  scale times that power of two (:func:`bias_factor`; a broadcast row per scale group), so
  the result is code x scale in one multiply instead of two."""
  shift, scale_bits = _target(dtype)
  float_type = "bf16" if jnp.dtype(dtype) == jnp.bfloat16 else "f16"
  if factors is not None and not permuted:
    raise ValueError("to_float_ptx: factors only with permuted codes")
  arg_types = ((plgpu.Layout.WGMMA_UPCAST_4X if relayout or permuted
                else plgpu.Layout.WGMMA,)
               + ((plgpu.Layout.WGMMA,) if factors is not None else ()))

  @plgpu.inline_mgpu(
      arg_types=arg_types,
      return_type=plgpu.ShapeDtypeStruct(codes.shape, jnp.dtype(dtype),
                                         layout=plgpu.Layout.WGMMA))
  def convert(ctx, arr, *fac):
    del ctx
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm

    i32 = ir.IntegerType.get_signless(32)
    out_el = ir.BF16Type.get() if float_type == "bf16" else ir.F16Type.get()
    if permuted:
      if fac and fac[0].registers.shape != mgpu.WGMMA_LAYOUT.registers_shape(arr.shape):
        raise NotImplementedError(f"fp4 PTX conversion: this jax's Mosaic GPU gives the "
                                  f"scale factors registers {fac[0].registers.shape}, not "
                                  f"the WGMMA layout's; prepare the weights with "
                                  f"HUMMING_JAX_SCALE_FOLD=0")

      def pair(word, c, idx):
        args, cons = [arith.shli(word, mgpu_utils.c(4, i32)), word], "=r,r,r"
        if fac:
          args.append(mgpu_utils.bitcast(fac[0].registers[idx], i32))
          cons += ",r"
        out = llvm.inline_asm(i32, args, _pair_ptx(c, shift, scale_bits, float_type,
                                                   scaled=bool(fac)), cons)
        return mgpu_utils.bitcast(out, ir.VectorType.get((2,), out_el))
      return mgpu.FragmentedArray(_registers=_direct_pairs(arr, pair),
                                  _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)
    if relayout:
      arr = arr.to_layout(mgpu.WGMMA_LAYOUT)
    new_regs = np.empty_like(arr.registers)
    for idx, reg in np.ndenumerate(arr.registers):
      [vlen] = ir.VectorType(reg.type).shape
      if vlen % 2:
        raise NotImplementedError(f"fp4 weights: this jax's Mosaic GPU holds WGMMA int4 "
                                  f"registers of {vlen} values (expected pairs); use the "
                                  f"Pallas-Triton kernel (wna16) for fp4 on it")
      if (word := _sliced_word(reg)) is not None:
        src, first = word  # the 8-nibble register it was cut from
        if first % 2:
          raise NotImplementedError(f"fp4 weights: this jax's Mosaic GPU slices WGMMA int4 "
                                    f"registers at odd nibble {first}; use the "
                                    f"Pallas-Triton kernel (wna16) for fp4 on it")
      else:
        if vlen * 4 > 32:
          raise NotImplementedError(f"fp4 weights: this jax's Mosaic GPU holds WGMMA int4 "
                                    f"registers of {vlen} values (over 32 bits); use the "
                                    f"Pallas-Triton kernel (wna16) for fp4 on it")
        src = mgpu_utils.bitcast(reg, ir.IntegerType.get_signless(vlen * 4))
        if vlen * 4 != 32:
          src = arith.extui(i32, src)
        first = 0
      shifted = arith.shli(src, mgpu_utils.c(4, i32))
      pairs = []
      for q in range(vlen // 2):
        part = first // 2 + q
        out = llvm.inline_asm(i32, [shifted, src],
                              _pair_ptx(part, shift, scale_bits, float_type), "=r,r,r")
        pairs.append(mgpu_utils.bitcast(out, ir.VectorType.get((2,), out_el)))
      new_regs[idx] = mgpu_utils.vector_concat(pairs) if len(pairs) > 1 else pairs[0]
    return mgpu.FragmentedArray(_registers=new_regs, _layout=arr.layout, _is_signed=None)

  return convert(codes, *(() if factors is None else (factors,)))


def _magic(dtype) -> int:
  """Bits of 2**nmant in the 16-bit float ``dtype`` (bf16 0x4300 = 128, fp16 0x6400 =
  1024): the float whose last mantissa place is 1, so OR-ing a nibble u into its low bits
  gives exactly 2**nmant + u."""
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f"dtype={dtype}: int4 weights convert to bfloat16 or float16")
  return int(np.array(2.0 ** jnp.finfo(dtype).nmant, dtype).view(np.uint16))


def int4_offset(dtype) -> float:
  """What :func:`int4_to_float_ptx` subtracts from each ``2**nmant + (v + 8)`` besides the
  zero point: ``2**nmant + 8`` (136 for bf16, 1032 for fp16)."""
  _magic(dtype)
  return 2.0 ** jnp.finfo(dtype).nmant + 8


def _int4_pair_ptx(part: int, magic: int, float_type: str, const_offset: int | None) -> str:
  """PTX: $1 = 32-bit register of 8 signed int4 codes, $2 = it shifted right by 4,
  [$3 = the pair's offset, two 16-bit floats]; $0 = codes (2 part, 2 part + 1) minus the
  offset as a packed pair.

  ``prmt`` puts byte ``part`` of $1 (its low nibble: the even code) in the low half and
  byte ``part`` of $2 (the odd code) in the high half; one ``lop3`` keeps each half's low
  nibble with its sign bit flipped (two's complement v -> v + 8 in [0, 16)) under the
  magic float's bits; one ``sub`` removes 2**nmant + 8 + z.  Every step is exact."""
  sel = part | part << 4 | (4 + part) << 8 | (4 + part) << 12
  const = (magic | 0x8) * 0x10001  # the magic exponent; bit 3 flips the nibble's sign
  off = "$3" if const_offset is None else "o"
  mov_off = "" if const_offset is None else f"mov.b32 o, {const_offset * 0x10001:#x};"
  return f"""
  {{
  .reg .b32 t, m, c, o;
  prmt.b32 t, $1, $2, {sel:#x};
  mov.b32 m, 0x000f000f;
  mov.b32 c, {const:#x};
  lop3.b32 t, t, m, c, 0x6A;
  {mov_off}
  sub.rn.{float_type}x2 $0, t, {off};
  }}
  """


def int4_to_float_ptx(codes: jax.Array, dtype, offsets: jax.Array | None = None, *,
                      permuted: bool = False) -> jax.Array:
  """Signed int4 codes (as loaded: the WGMMA_UPCAST_4X layout) -> ``codes - zero`` in the
  16-bit ``dtype``, WGMMA layout, as inline PTX: three instructions per pair of codes and
  one shift per 8 (Mosaic's own conversion plus a zero-point subtraction is ~4.5 per pair:
  benchmarks/NOTES.md v5 / v12).

  ``offsets``: None for symmetric codes, else a WGMMA-layout ``dtype`` array of the same
  shape holding ``int4_offset(dtype) + zero`` for each code (the zero point is constant
  along a K tile, so this is a broadcast row; its add happens once per row).  GPU only:
  the interpreter path is ``codes.astype(dtype) - zero``.  ``permuted``: the codes in the
  permuted K order of :func:`permute_k`, converted without Mosaic's relayout."""
  magic = _magic(dtype)
  float_type = "bf16" if jnp.dtype(dtype) == jnp.bfloat16 else "f16"
  const_offset = (None if offsets is not None else
                  int(np.array(int4_offset(dtype), dtype).view(np.uint16)))
  arg_types = (plgpu.Layout.WGMMA_UPCAST_4X,) + ((plgpu.Layout.WGMMA,) if offsets is not
                                                   None else ())

  @plgpu.inline_mgpu(
      arg_types=arg_types,
      return_type=plgpu.ShapeDtypeStruct(codes.shape, jnp.dtype(dtype),
                                         layout=plgpu.Layout.WGMMA))
  def convert(ctx, arr, *off):
    del ctx
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm

    i32 = ir.IntegerType.get_signless(32)
    out_el = ir.BF16Type.get() if float_type == "bf16" else ir.F16Type.get()
    if permuted:
      if off and off[0].registers.shape != mgpu.WGMMA_LAYOUT.registers_shape(arr.shape):
        raise NotImplementedError(f"int4 PTX conversion: this jax's Mosaic GPU gives the "
                                  f"zero-point offsets registers {off[0].registers.shape}, "
                                  f"not the WGMMA layout's; prepare the weights with "
                                  f"HUMMING_JAX_PERMUTE_K=0 (the K order)")

      def pair(word, c, idx):
        args, cons = [word, arith.shrui(word, mgpu_utils.c(4, i32))], "=r,r,r"
        if off:
          args.append(mgpu_utils.bitcast(off[0].registers[idx], i32))
          cons += ",r"
        out = llvm.inline_asm(i32, args, _int4_pair_ptx(c, magic, float_type, const_offset),
                              cons)
        return mgpu_utils.bitcast(out, ir.VectorType.get((2,), out_el))
      return mgpu.FragmentedArray(_registers=_direct_pairs(arr, pair),
                                  _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)
    arr = arr.to_layout(mgpu.WGMMA_LAYOUT)
    if off and off[0].registers.shape != arr.registers.shape:
      raise NotImplementedError(f"int4 PTX conversion: this jax's Mosaic GPU gives the "
                                f"zero-point offsets registers {off[0].registers.shape} "
                                f"beside code registers {arr.registers.shape} (jax 0.11.2: "
                                f"the same); set HUMMING_JAX_INT4_PTX=0 (Mosaic's own "
                                f"conversion, same values)")
    new_regs = np.empty_like(arr.registers)
    for idx, reg in np.ndenumerate(arr.registers):
      [vlen] = ir.VectorType(reg.type).shape
      word = _sliced_word(reg)
      if vlen != 2 or word is None or word[1] % 2:
        raise NotImplementedError("int4 PTX conversion: this jax's Mosaic GPU does not hold "
                                  "WGMMA int4 pairs as slices of 32-bit registers (jax "
                                  "0.11.2 does); set HUMMING_JAX_INT4_PTX=0 (Mosaic's own "
                                  "conversion, same values) or pass a config with "
                                  "int4_ptx=False")
      src, first = word
      shifted = arith.shrui(src, mgpu_utils.c(4, i32))
      args, cons = [src, shifted], "=r,r,r"
      if off:
        args.append(mgpu_utils.bitcast(off[0].registers[idx], i32))
        cons += ",r"
      out = llvm.inline_asm(i32, args, _int4_pair_ptx(first // 2, magic, float_type,
                                                       const_offset), cons)
      new_regs[idx] = mgpu_utils.bitcast(out, ir.VectorType.get((2,), out_el))
    return mgpu.FragmentedArray(_registers=new_regs, _layout=arr.layout, _is_signed=None)

  return convert(codes, *(() if offsets is None else (offsets,)))


def int4_to_float_reference(codes: jax.Array, dtype, zeros: jax.Array | None = None
                            ) -> jax.Array:
  """What :func:`int4_to_float_ptx` computes, in plain jnp on the bit patterns (the check
  of its arithmetic on the CPU): ``2**nmant + (v ^ 8 as unsigned)`` built by the same
  bit operations, minus ``2**nmant + 8 + zero``."""
  magic = _magic(dtype)
  u = (codes.astype(jnp.int32) & 15) ^ 8  # two's complement nibble -> v + 8
  bits = (u | magic).astype(jnp.uint16)
  f = jax.lax.bitcast_convert_type(bits, jnp.dtype(dtype))
  off = int4_offset(dtype) + (0.0 if zeros is None else zeros.astype(jnp.float32))
  return f - jnp.asarray(off, jnp.float32).astype(dtype)


# The fp8-MMA 4-bit layout's K order (wna16_mgpu.prepare(mma="fp8"), ":p8" layouts): within
# each run of 32 codes, the code of column 16 (1 - h) + 4 q + b (q, b < 4; h < 2) is stored
# at 8 q + 2 b + h.  Loaded in the WGMMA_UPCAST_4X layout, lane q's 32-bit register of 8
# nibbles then holds in its high nibbles the four e4m3 values of its WGMMA_8BIT register
# for columns 4 q + b and in its low nibbles those for 16 + 4 q + b, no relayout.  The
# layout stores these words with their magnitudes regrouped (:func:`p8_store`).
def permute_k8(codes: jax.Array, *, inverse: bool = False) -> jax.Array:
  """Codes in K order -> the ":p8" order along the last axis (``inverse``: back), whose
  length must be a multiple of :data:`PERMUTE_RUN`."""
  *lead, k = codes.shape
  if k % PERMUTE_RUN:
    raise ValueError(f"codes.shape={codes.shape}: the last axis must be a multiple of "
                     f"{PERMUTE_RUN}")
  if inverse:  # stored (q, b, h) -> K order (1 - h, q, b)
    c = jnp.moveaxis(codes.reshape(*lead, k // PERMUTE_RUN, 4, 4, 2), -1, -3)
    return c[..., ::-1, :, :].reshape(codes.shape)
  c = codes.reshape(*lead, k // PERMUTE_RUN, 2, 4, 4)[..., ::-1, :, :]  # (h, q, b)
  return jnp.moveaxis(c, -3, -1).reshape(codes.shape)


E4M3_FROM_E2M1 = 2.0 ** -6  # e2m1 bits s e1 e0 m placed as e4m3 s 0 0 e1 e0 m 0 0

# The ":p8" words.  Each 32-bit word of 8 stored codes (permute_k8's order: nibble 2b + 1
# holds code A_b of the WGMMA register of the run's first 16 columns, nibble 2b code B_b of
# the second's) keeps every sign bit where that order put it (A_b's at bit 8b + 7, B_b's at
# 8b + 3: already the sign bits of the two e4m3 registers, B_b's after a shift by 4), and
# regroups the magnitude bits: A_0..A_3's in nibbles 0..3, B_0..B_3's in nibbles 4..7.  So
# each register's four magnitudes are one ``prmt``'s four 4-bit selectors into an 8-byte
# table of e4m3 bytes (:func:`e4m3_tables`), and the fold's per-group raise is a different
# table, not per-byte arithmetic: 7 integer ops per 8 weights with or without the fold,
# against 5 without and ~27 with it for the per-byte form (H200 session 26's Nsight Compute
# profile of the one-accumulator tile: the ALU pipe the busiest, at 56 %).
P8_MAG_SOURCE = (1, 3, 5, 7, 0, 2, 4, 6)  # stored nibble n's magnitude: permute_k8 code's
P8_MAG_HOME = (4, 0, 5, 1, 6, 2, 7, 3)  # the inverse: code n's magnitude is in nibble ...


def _regroup_magnitudes(codes: jax.Array, source) -> jax.Array:
  *lead, k = codes.shape
  if k % 8:
    raise ValueError(f"codes.shape={codes.shape}: the last axis must be a multiple of 8 "
                     f"(32-bit words of 8 codes)")
  u = codes.astype(jnp.int32) & 0xF
  w = u.reshape(*lead, k // 8, 8)
  # (slices, not a gather by an index array: the Mosaic GPU interpreter's kernel body
  # takes no array constants)
  out = jnp.stack([(w[..., n] & 8) | (w[..., src] & 7) for n, src in enumerate(source)],
                  axis=-1)
  out = out - 16 * (out >= 8)  # the two's-complement nibble, as the layout stores codes
  return out.reshape(codes.shape).astype(codes.dtype)


def p8_store(codes: jax.Array) -> jax.Array:
  """Codes in K order (e2m1 bit patterns as two's-complement int values, last axis a
  multiple of :data:`PERMUTE_RUN`) -> the ":p8" layout's stored nibbles: permute_k8's
  order, then each word's magnitudes regrouped (:data:`P8_MAG_SOURCE`)."""
  return _regroup_magnitudes(permute_k8(codes), P8_MAG_SOURCE)


def p8_load(stored: jax.Array) -> jax.Array:
  """Inverse of :func:`p8_store` (the K-order codes, exact)."""
  return permute_k8(_regroup_magnitudes(stored, P8_MAG_HOME), inverse=True)


def e2m1_to_e4m3_interpret(codes: jax.Array) -> jax.Array:
  """e2m1 bit patterns (int4, K order) -> float8_e4m3fn ``value * 2**-6``: what
  :func:`e2m1_to_e4m3_ptx` computes (exact: e2m1 values times 2**-6 are e4m3 values,
  0.5 * 2**-6 an e4m3 subnormal)."""
  return (to_float_interpret(codes, jnp.float32) * E4M3_FROM_E2M1).astype(jnp.float8_e4m3fn)


FOLD_MAX_SHIFT = 11  # binades an e2m1 * 2**-6 e4m3 operand is raised by at most: the exponent
# field goes 0..3 -> r..3 + r <= 14 (max 192).  12 would be exact too (field 15 holds 384 =
# 0x7C; e4m3fn's only NaN is 0x7F and e2m1 mantissas never reach it): FOLD_SHIFT_LIMIT,
# which E2M1Weights' fold_shift may take (GPU-tested in session 64).
FOLD_SHIFT_LIMIT = 12  # the largest exact raise (6 * 2**-6 * 2**12 = 384 <= 448)
# e4m3 bytes of the e2m1 magnitudes 0..7 times 2**-6, raised r binades: bytes 4 i + 8 r
# (the exponent field + r), except 0 (stays 0) and the subnormal 0.5 * 2**-6 = 0x04, which
# becomes the normal 8 r from r = 1 (its mantissa bit dropped).  Table words (bytes 0..3,
# 4..7) at r = 0 and what one binade adds to each.
_TABLE = (0x0C080400, 0x1C181410)
_TABLE_STEP = (0x08080800, 0x08080808)
_HALF_FIX = 0x400  # byte 1 from r = 1: 4 + 8 r - 4


def e4m3_tables(r: int) -> tuple[int, int]:
  """The two table words of a raise of ``r`` binades (:data:`_TABLE`), in Python ints (the
  numpy check and the constant of the unfolded conversion); zeros for r < 0 (a group more
  than FOLD_MAX_SHIFT binades below its top: its codes become zero)."""
  if r < 0:
    return 0, 0
  return (_TABLE[0] + r * _TABLE_STEP[0] - (_HALF_FIX if r >= 1 else 0),
          _TABLE[1] + r * _TABLE_STEP[1])


def prmt_reference(a, b, c):
  """PTX ``prmt.b32`` (default mode) on uint32 numpy arrays: byte i of the result is byte
  ``c[4i + 2 : 4i]`` of the 8 bytes {b, a} (a: bytes 0..3), sign-replicated where
  ``c[4i + 3]`` is set."""
  a, b, c = (np.asarray(v, np.uint64) for v in (a, b, c))
  both = (b << np.uint64(32)) | a
  out = np.zeros(np.broadcast(a, b, c).shape, np.uint64)
  for i in range(4):
    sel = (c >> np.uint64(4 * i)) & np.uint64(0xF)
    byte = (both >> (np.uint64(8) * (sel & np.uint64(7)))) & np.uint64(0xFF)
    byte = np.where(sel & np.uint64(8), np.where(byte & np.uint64(0x80), np.uint64(0xFF),
                                                 np.uint64(0)), byte)
    out |= byte << np.uint64(8 * i)
  return out.astype(np.uint32)


def e2m1_to_e4m3_reference(words: np.ndarray, r: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """The integer ops of :func:`e2m1_to_e4m3_ptx` on uint32 ":p8" words of 8 stored codes
  (numpy, for the CPU check of the bit arithmetic), with every group raised ``r``
  binades: (first K half's register, second's), four e4m3 bytes each."""
  w = np.asarray(words, np.uint32)
  t0, t1 = e4m3_tables(r)
  mag = w & np.uint32(0x77777777)
  hi = prmt_reference(t0, t1, mag) | (w & np.uint32(0x80808080))
  lo = (prmt_reference(t0, t1, mag >> np.uint32(16))
        | ((w << np.uint32(4)) & np.uint32(0x80808080)))
  return hi, lo


def scale_exponent(v: jax.Array) -> jax.Array:
  """Biased exponent field of float32 values (int32): ``log2(v) + 127`` for the e8m0
  scales' powers of two from 2**-126 up, 0 for 2**-127 (so differences stay exact), 255
  for NaN / inf -- the bits the fold's PTX reads (no float log2, which can miss a power of
  two by an ulp)."""
  return lax.shift_right_logical(lax.bitcast_convert_type(v, jnp.int32), 23)


def fold_shifts(scales, top=None, shift: int = FOLD_MAX_SHIFT):
  """The fold of power-of-two group scales (e8m0 scales as float32 rows, one per group)
  against ``top`` (default: their elementwise max, the K tile's largest; the one-
  accumulator route passes its column's largest over all of K): ``(multiplier,
  raises)``.  Group g's operands are raised by ``raises[g] = shift - log2(top /
  scales[g])`` binades (int32; negative: more than ``shift`` binades below ``top``, and
  its codes become zero), so the one float32 sum times ``multiplier = top * 2**-shift``
  is the sum of every group's partial times its scale.  ``shift``: FOLD_MAX_SHIFT, or up
  to FOLD_SHIFT_LIMIT where the caller knows every group within FOLD_MAX_SHIFT binades
  of ``top`` (the ":cf" column fold: raises 1 .. FOLD_SHIFT_LIMIT).  A NaN scale makes
  the max, so the column's output, NaN."""
  if top is None:
    top = scales[0]
    for s_ in scales[1:]:
      top = jnp.maximum(top, s_)
  return (top * (2.0 ** -shift),
          [shift - (scale_exponent(top) - scale_exponent(s_)) for s_ in scales])


def e2m1_to_e4m3_ptx(codes: jax.Array, blocks: int, *, group_blocks: int = 0,
                     scales: list | None = None, top: jax.Array | None = None,
                     raises_in_range: bool = False, whole: bool = False,
                     fold_shift: int = FOLD_MAX_SHIFT) -> tuple[jax.Array, ...]:
  """":p8"-stored e2m1 codes (a (64, 32 * blocks) int4 tile as loaded: WGMMA_UPCAST_4X)
  -> ``blocks`` (64, 32) float8_e4m3fn WGMMA_8BIT A operands holding ``value * 2**-6``, one
  per K run of 32 (GPU only).  Lane q's 32-bit register of 8 stored codes holds the
  e4m3 values of its WGMMA_8BIT registers for columns 4 q + b (magnitudes in nibbles
  0..3, signs at bits 8 b + 7) and 16 + 4 q + b (nibbles 4..7, signs at 8 b + 3):
  ``prmt(t0, t1, w & 0x77777777) | (w & 0x80808080)`` and the same of the magnitudes
  shifted down 16, with the signs of ``w << 4`` -- 7 integer ops per 8 weights
  (:func:`e2m1_to_e4m3_reference` in numpy).

  With ``scales`` (the fold: ``Config.fp8_fold`` / ``fp8_single_acc``): one (64,) float32
  row of e8m0 values per group of ``group_blocks`` 32-code runs (WGMMA row layout) and
  ``top``, their elementwise max (fp8_fold) or the column's largest over all of K
  (fp8_single_acc).  Each group's operands are raised as :func:`fold_shifts` says, by
  table words built per (row, group) from the exponent fields (:func:`e4m3_tables`), so
  one float32 partial per K tile, times :func:`fold_shifts`' multiplier, replaces a
  partial per group; a negative raise zeroes the group's codes.  ``raises_in_range``:
  the caller guarantees 0 <= raise <= fold_shift for every group of real codes (the
  ":cf" column fold; a column whose scales do not fold comes out NaN from a base computed
  per call, ``wna16_mgpu.column_fold_row``, but not from a stale stored one), so the
  zeroing select is left out.  ``fold_shift`` (with ``raises_in_range``): the raise is
  ``fold_shift - log2(top / scale)``; above FOLD_MAX_SHIFT every raise is at least 1, so
  the table words need no select for the subnormal 0.5 * 2**-6 either (two integer ops
  fewer per row and group; :class:`w8a8_mgpu.E2M1Weights`' ``fold_shift``).  Scale rows
  (and ``top``) are float32 or bfloat16 (the exponent read off its 16 bits: no widening
  first; the two share the exponent bias).
  ``whole``: one (64, 32 * blocks) WGMMA_8BIT array (a 1-tuple) rather than a block per
  run, for a store into a 128-byte swizzle tile, whose 32-column blocks cannot be
  addressed alone."""
  if not FOLD_MAX_SHIFT <= fold_shift <= FOLD_SHIFT_LIMIT or (
      fold_shift != FOLD_MAX_SHIFT and not raises_in_range):
    raise ValueError(f"fold_shift={fold_shift}: expected {FOLD_MAX_SHIFT}, or up to "
                     f"{FOLD_SHIFT_LIMIT} with raises_in_range (every group within "
                     f"{FOLD_MAX_SHIFT} binades of top)")
  fold = scales is not None
  for name, row in ([("top", top)] + [(f"scales[{g}]", s_) for g, s_ in
                                      enumerate(scales)] if fold else []):
    if jnp.dtype(row.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
      raise ValueError(f"{name}: expected float32 or bfloat16 e8m0 values (their exponent "
                       f"fields are read), got {row.dtype}")
  shape = (codes.shape[0], 32)
  out_t = plgpu.ShapeDtypeStruct(shape, jnp.dtype(jnp.float8_e4m3fn),
                                 layout=plgpu.Layout.WGMMA_8BIT)
  whole_t = plgpu.ShapeDtypeStruct((shape[0], 32 * blocks), out_t.dtype,
                                   layout=plgpu.Layout.WGMMA_8BIT)
  rows = (plgpu.Layout.WGMMA.reduce(1),) * (len(scales) + 1) if fold else ()
  remedy = ("run without HUMMING_JAX_FP8_FOLD, with HUMMING_JAX_FP8_SINGLE_ACC=0, and no "
            "fp8_fold / fp8_single_acc in an explicit config" if fold else
            "prepare the weights again with HUMMING_JAX_FP8_MMA=0 (grouped) / "
            "HUMMING_JAX_DENSE_FP8_MMA=0 (dense): the 16-bit route")

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA_UPCAST_4X,) + rows,
                     return_type=(whole_t,) if whole else tuple([out_t] * blocks))
  def convert(ctx, arr, *row_args):
    del ctx
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm

    i32 = ir.IntegerType.get_signless(32)
    f8 = ir.VectorType.get((4,), ir.Float8E4M3FNType.get())
    c = lambda v: mgpu_utils.c(v, i32)
    src_shape = mgpu.WGMMA_LAYOUT_UPCAST_4X.registers_shape((shape[0], 32 * blocks))
    out_shape = mgpu.WGMMA_LAYOUT_8BIT.registers_shape(shape)
    row_shape = mgpu.WGMMA_ROW_LAYOUT.registers_shape((shape[0],))
    if (arr.registers.shape != src_shape or len(out_shape) != len(src_shape)
        or out_shape[1] != 2 or src_shape[1] != blocks
        or fold and (src_shape[4] != 2 or row_shape[2] != 2
                     or any(r.registers.shape != row_shape for r in row_args))):
      raise NotImplementedError(f"fp8-MMA e2m1 codes: this jax's Mosaic GPU gives "
                                f"WGMMA_UPCAST_4X registers {arr.registers.shape}, "
                                f"WGMMA_8BIT {out_shape} and WGMMA rows {row_shape} (jax "
                                f"0.11.2: (1, K/32, 1, 1, 2, ...), (1, 2, ...), (1, 1, 2, "
                                f"...)); {remedy}")
    tables = {}  # fold: per (row half, group) the table words of its raise
    if fold:
      def exp(r, h):  # the biased exponent field (float32 and bfloat16 share the bias)
        reg = r.registers[(0, 0, h) + (0,) * (len(row_shape) - 3)]
        if mgpu_utils.bitwidth(reg.type) == 16:  # bfloat16 (float16 refused above)
          bits = arith.extui(i32, mgpu_utils.bitcast(reg, ir.IntegerType.get_signless(16)))
          return arith.shrui(bits, c(7))
        return arith.shrui(mgpu_utils.bitcast(reg, i32), c(23))

      top_row, *scale_rows = row_args
      # every raise >= 1: the subnormal 0.5 * 2**-6 is normal in every group
      all_normal = raises_in_range and fold_shift > FOLD_MAX_SHIFT
      for h in range(2):
        base = arith.subi(c(fold_shift), exp(top_row, h))
        for g, r in enumerate(scale_rows):
          d = arith.addi(base, exp(r, h))  # the raise, e4m3_tables' r
          half = (c(_TABLE[0] - _HALF_FIX) if all_normal else
                  arith.select(arith.cmpi(arith.CmpIPredicate.sge, d, c(1)),
                               c(_TABLE[0] - _HALF_FIX), c(_TABLE[0])))
          t0 = arith.addi(arith.muli(d, c(_TABLE_STEP[0])), half)
          t1 = arith.addi(arith.muli(d, c(_TABLE_STEP[1])), c(_TABLE[1]))
          if not raises_in_range:
            keep = arith.cmpi(arith.CmpIPredicate.sge, d, c(0))
            t0, t1 = arith.select(keep, t0, c(0)), arith.select(keep, t1, c(0))
          tables[h, g] = (t0, t1)

    def prmt(t, sel):
      return llvm.inline_asm(i32, [t[0], t[1], sel], "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r")

    outs = [np.empty(out_shape, dtype=object) for _ in range(blocks)]
    for idx, w in _code_words(arr, "fp8-MMA e2m1 codes", remedy):
      run = idx[1]
      t = tables[idx[4], run // group_blocks] if fold else tuple(map(c, e4m3_tables(0)))
      sign = c(0x80808080)
      mag = arith.andi(w, c(0x77777777))
      hi = arith.ori(prmt(t, mag), arith.andi(w, sign))
      lo = arith.ori(prmt(t, arith.shrui(mag, c(16))),
                     arith.andi(arith.shli(w, c(4)), sign))
      for half_k, val in ((0, hi), (1, lo)):
        outs[run][(idx[0], half_k, *idx[2:])] = mgpu_utils.bitcast(val, f8)
    if whole:  # run r's two 16-column register tiles at 2 r, 2 r + 1
      outs = [np.concatenate(outs, axis=1)]
    return tuple(mgpu.FragmentedArray(_registers=o, _layout=mgpu.WGMMA_LAYOUT_8BIT,
                                      _is_signed=None) for o in outs)

  return convert(codes, *((top, *scales) if fold else ()))


def e2m1_to_e4m3_folded_interpret(codes: jax.Array, raises: jax.Array, group: int
                                  ) -> jax.Array:
  """What :func:`e2m1_to_e4m3_ptx` computes with the fold, on values: (64, K) e2m1 codes (K
  order) and (64, K / group) int32 raises -> float8_e4m3fn ``value * 2**(raise - 6)``,
  zero where the raise is negative (exact: 2**-7 .. 384, e4m3 values)."""
  r = jnp.repeat(raises, group, axis=1)
  vals = to_float_interpret(codes, jnp.float32) * E4M3_FROM_E2M1
  # (raises over FOLD_SHIFT_LIMIT meet only the zero codes of K-padding groups)
  vals = vals * exp2_int(jnp.clip(r, 0, FOLD_SHIFT_LIMIT))  # (exact; jnp.exp2 is not)
  return jnp.where(r >= 0, vals, 0.0).astype(jnp.float8_e4m3fn)


def p8_e2m1_to_e4m3_interpret(stored: jax.Array, raises: jax.Array | None = None,
                              group: int = 32) -> jax.Array:
  """The interpreter's :func:`e2m1_to_e4m3_ptx`: (64, K) ":p8"-stored codes as loaded
  (any int dtype) -> (64, K) float8_e4m3fn, unfolded or, with ``raises`` ((64, K / group)
  int32, :func:`fold_shifts`' per group), folded."""
  vals = p8_load(stored.astype(jnp.int8))
  return (e2m1_to_e4m3_interpret(vals) if raises is None
          else e2m1_to_e4m3_folded_interpret(vals, raises, group))


# e4m3's normal range starts at 2**-6; below it the grid is 2**-9 apart (subnormals)
_E4M3_MIN_NORMAL = 2.0 ** -6
_E4M3_SUBNORMAL_STEP = 2.0 ** -9


def round_to_e4m3(t: jax.Array) -> jax.Array:
  """float32 ``t`` within e4m3's range (|t| <= 448, saturated by the caller) rounded to
  the nearest e4m3 value, ties to even, as float32: ``t.astype(float8_e4m3fn)`` and back,
  in integer and float32 arithmetic alone (elementwise: any register layout; no fp8 type
  in the kernel).  Normals keep 3 mantissa bits (the float's bits rounded at bit 20),
  subnormals are whole multiples of 2**-9 (round_half_even of t * 2**9), zeros keep t's
  sign, NaN stays NaN."""
  bits = jax.lax.bitcast_convert_type(t, jnp.int32)
  normal = jax.lax.bitcast_convert_type(
      (bits + 0x7FFFF + ((bits >> 20) & 1)) & jnp.int32(-(1 << 20)), jnp.float32)
  sub = (act_prepass.round_half_even(t * (1 / _E4M3_SUBNORMAL_STEP)).astype(jnp.float32)
         * _E4M3_SUBNORMAL_STEP)
  sub = jax.lax.bitcast_convert_type(  # t's sign on a zero too (-0, as the convert gives)
      jax.lax.bitcast_convert_type(sub, jnp.int32) | (bits & jnp.int32(-(1 << 31))),
      jnp.float32)
  out = jnp.where(jnp.abs(t) < _E4M3_MIN_NORMAL, sub, normal)
  return jnp.where(t != t, t, out)  # (rounding a NaN's bits can carry it to +-0 or inf)


def fp8_to_float(codes, dtype):
  """float8_e4m3fn / float8_e5m2 registers (a Mosaic fragmented array, or a jnp array in
  the interpreter) -> ``dtype``.  Hopper's ``cvt`` converts e4m3 / e5m2 pairs to f16 only
  (this ptxas has no e4m3 -> bf16: tests/test_cuda_lowering.py), so bf16 goes through
  f16; exact either way (e4m3 values, 3 mantissa bits, 2**-9 .. 448; e5m2 values, 2
  mantissa bits, 2**-16 .. 57344, inf and NaN: fit both)."""
  if jnp.dtype(dtype) == jnp.dtype(jnp.float16):
    return codes.astype(jnp.float16)
  return codes.astype(jnp.float16).astype(dtype)
