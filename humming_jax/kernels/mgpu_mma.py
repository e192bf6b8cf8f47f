"""Warp-level MMA (``mma.sync.m16n8k16``) on register operands, for the Mosaic WnA16 decode
kernel: the dequantized weight tile (already in registers, WGMMA layout) times the x tile,
without WGMMA's shared-memory descriptors, fences and warpgroup-wide waits.

Why: the decode kernel's dequantized weights are the A operand of a register-A WGMMA
(``m64n8k16``), whose B operand (x) is addressed by a shared-memory descriptor built per
instruction.  H200 session 19's SASS count put those descriptors at 0.73 of ~3.85 thread
instructions per weight (uniform-datapath ``UIADD3`` / ``R2UR`` / ``UMOV``), and the
kernel's stalls at fixed-latency waits and barriers (NOTES.md v12-v21).  ``mma.sync`` takes
both operands from registers and is per warp: each warp multiplies its own 16 weight rows.

The fragments line up without any data movement: per warp, the WGMMA layout's registers of
a (64, 16) 16-bit tile are ``mma.m16n8k16``'s A fragment (rows ``lane / 4`` [+ 8], columns
``2 (lane % 4)`` [+ 8]), and the WGMMA layout of a (64, 8) float32 accumulator is its
C / D fragment.  The B fragment (K 16 x N 8, ``.col``) holds x[n = lane / 4][k = 2 (lane %
4) .. + 1] and the same 8 columns further on: :data:`MMA_X`, a layout of the (rows, K) x
tile loaded straight from its shared-memory slot, the same registers in every warp.

Measured (benchmarks/NOTES.md sessions 56-57): on the same dense launch the product moves
the decode kernel by 0-0.5 us on an H100 and +-0.1 on the H200, so the WGMMA was not what
bound it; with one K tile per step it is the int4 / MXFP4 dense decode default at M <= 8
on an H100 only (``wna16_mgpu.MMA_SYNC_MAX_M``, ``MMA_SYNC_DEVICES``).  Expert tiles of 8
rows whose warpgroups stream few K tiles gain more (H200: 10-16 % of the grouped GEMM at
one token where each warpgroup runs one or two pipeline steps): the grouped default there
(``grouped_wna16_mgpu.MMA_SYNC_MAX_K_TILES``).

GPU only (inline PTX); the interpreter runs the kernel's WGMMA form of the same product.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

# The (rows, K) x tile (rows a multiple of 8, K of 16) as mma.sync B fragments: per (8, 16)
# tile, lane l holds row l // 4, columns 2 (l % 4) + {0, 1} (one 32-bit register) and the
# two columns 8 further on (a second); every warp holds all of it (Replicated).  Registers
# indexed (row block, 16-column chunk, 0, half, 0, 0, 0).
MMA_X = plgpu.Layout.TILED(plgpu.Tiling(((8, 16), (8, 8), (2,))),
                           warp_dims=(plgpu.Replicated(4),), lane_dims=(-3, -2),
                           vector_dim=-1)
MMA_K = 16  # K of one mma.sync.m16n8k16


def _mma_ptx(float_type: str) -> str:
  return (f"mma.sync.aligned.m16n8k16.row.col.f32.{float_type}.{float_type}.f32 "
          "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")


def mma_sync(acc: jax.Array, w: jax.Array, x: jax.Array, *, chains: int = 2) -> jax.Array:
  """``acc + w @ x.T`` on mma.sync: acc (64, R) float32 in the WGMMA layout, w (64, K)
  bf16 / fp16 in the WGMMA layout (the dequantized weight tile), x (R, K) of w's dtype in
  :data:`MMA_X` (R a multiple of 8, K of 16).  ``chains`` independent accumulators per
  8-row block take alternate 16-deep K steps (an MMA waits for the previous one on its
  accumulator), added together at the end."""
  n_rows, k = x.shape
  if w.shape != (64, k) or acc.shape != (64, n_rows) or n_rows % 8 or k % MMA_K:
    raise ValueError(f"mma_sync: acc {acc.shape}, w {w.shape}, x {x.shape}: expected "
                     f"(64, R), (64, K), (R, K) with R a multiple of 8, K of {MMA_K}")
  if w.dtype != x.dtype or jnp.dtype(w.dtype) not in (jnp.dtype(jnp.bfloat16),
                                                     jnp.dtype(jnp.float16)):
    raise ValueError(f"mma_sync: w {w.dtype}, x {x.dtype}: both bfloat16 or both float16")
  float_type = "bf16" if jnp.dtype(w.dtype) == jnp.bfloat16 else "f16"
  chains = max(1, min(chains, k // MMA_K))

  @plgpu.inline_mgpu(
      arg_types=(plgpu.Layout.WGMMA, plgpu.Layout.WGMMA, MMA_X),
      return_type=plgpu.ShapeDtypeStruct(acc.shape, jnp.float32, layout=plgpu.Layout.WGMMA))
  def product(ctx, acc_a, w_a, x_a):
    del ctx
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm, vector

    f32 = ir.F32Type.get()
    i32 = ir.IntegerType.get_signless(32)
    pair_ty = ir.VectorType.get((2,), f32)
    cons = ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4)
    # WGMMA layout registers: (0, 8-column block, 0, 0, row half, 0, 0, 0, 0)
    wg = lambda arr, cb, h: arr.registers[(0, cb, 0, 0, h) + (0,) * 4]
    word = lambda r: mgpu_utils.bitcast(r, i32)
    if (acc_a.registers.shape != (1, n_rows // 8, 1, 1, 2, 1, 1, 1, 1)
        or w_a.registers.shape != (1, k // 8, 1, 1, 2, 1, 1, 1, 1)
        or x_a.registers.shape != (n_rows // 8, k // MMA_K, 1, 2, 1, 1, 1)):
      raise NotImplementedError(
          f"mma_sync: this jax's Mosaic GPU gives registers {acc_a.registers.shape} / "
          f"{w_a.registers.shape} / {x_a.registers.shape} (jax 0.11.2: the WGMMA and "
          f"MMA_X shapes this function indexes); set HUMMING_JAX_MMA_SYNC=0 (the decode "
          f"defaults that take it: dense on an H100, 8-row expert tiles) or pass a config "
          f"with mma_sync=False")

    def floats(reg):  # vector<2xf32> -> its two floats
      return [vector.extract(reg, dynamic_position=[],
                             static_position=ir.DenseI64ArrayAttr.get([i])) for i in (0, 1)]

    def pair(lo, hi):
      v = llvm.insertelement(llvm.mlir_undef(pair_ty), lo, position=mgpu_utils.c(0, i32))
      return llvm.insertelement(v, hi, position=mgpu_utils.c(1, i32))

    zero = arith.constant(f32, ir.FloatAttr.get(f32, 0.0))
    out = np.empty_like(acc_a.registers)
    for b in range(n_rows // 8):  # each 8-row block of x: 8 accumulator columns
      sums = [floats(wg(acc_a, b, 0)) + floats(wg(acc_a, b, 1))]
      sums += [[zero] * 4 for _ in range(chains - 1)]
      for i in range(k // MMA_K):
        a = [word(wg(w_a, 2 * i + c, h)) for c in (0, 1) for h in (0, 1)]  # a0a1 .. a6a7
        bw = [word(x_a.registers[(b, i, 0, h) + (0,) * 3]) for h in (0, 1)]  # b0b1, b2b3
        res = llvm.inline_asm(llvm.StructType.get_literal([f32] * 4),
                              [*a, *bw, *sums[i % chains]], _mma_ptx(float_type), cons,
                              has_side_effects=False)
        sums[i % chains] = [llvm.extractvalue(f32, res, [j]) for j in range(4)]
      d = sums[0]
      for extra in sums[1:]:
        d = [arith.addf(p, q) for p, q in zip(d, extra)]
      out[(0, b, 0, 0, 0) + (0,) * 4] = pair(d[0], d[1])  # rows r: c0, c1
      out[(0, b, 0, 0, 1) + (0,) * 4] = pair(d[2], d[3])  # rows r + 8: c2, c3
    return mgpu.FragmentedArray(_registers=out, _layout=acc_a.layout, _is_signed=None)

  return product(acc, w, x)
