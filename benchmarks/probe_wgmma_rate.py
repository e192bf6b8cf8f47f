"""Device probe (session 25): how fast can the W4A8 fp8 tile's inner loop run, with no
memory traffic at all?

Every launch of the 128-row fp8-MMA expert tile measured so far lands near 0.4 PFLOP/s
(Mixtral gate_up at 1024 tokens: 1.15 ms for 481 GFLOP), whatever changed around it:
the group-scale fold (NOTES.md v24), clusters sharing x (v25), 64-row tiles on four
warpgroups.  Neither L2 bytes nor instruction counts moved the time.  This probe times
the loop body alone, on operands that sit in shared memory from the start: one CTA per SM,
``--wgs`` warpgroups, each running ``--iters`` K tiles of 128 (64 weight rows x
``--block-m`` tokens) in one of these forms:

  mma       four (64, 32) e4m3 register A operands converted once; per K tile four fp8
            WGMMAs (m64 n<block_m> k32) into one accumulator, then a wait -- the MMA rate of
            the register-A, swap-AB design with a wait per tile;
  mma_deep  the same without the per-tile wait (one wait after the loop): the MMA rate;
  convert   per K tile: load the int4 codes from SMEM, convert them (e2m1_to_e4m3_ptx),
            four WGMMAs into one accumulator, wait -- a single-accumulator fold's loop;
  tile      convert, four WGMMAs into a fresh partial, wait, total += partial * scale row
            (the shipped fold, Config.fp8_fold);
  groups    convert, then per 32-deep group: one WGMMA into a fresh partial, wait,
            total += partial * its scale row (the shipped default loop at 128 rows);
  bf16, bf16_deep  as mma / mma_deep with a (64, 128) bf16 register A operand and bf16 x
            (the 16-bit route's WGMMAs, m64 n<block_m> k16): the rate fp8 should double.

The fp8 forms compute iters x (W @ x^T) with unit scales, so their outputs must agree
(printed as the largest relative difference from the first form's); the bf16 forms
multiply the int4 codes as integers (not e2m1 values), so they differ from them.  TFLOP/s counts 2 x 64 x block_m x 128
per K tile and warpgroup.  H200 dense fp8 peak: ~1979 TFLOP/s; bf16 ~989.

  PYTHONPATH=. python3 benchmarks/probe_wgmma_rate.py --block-m 128 --wgs 2
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks import common  # noqa: E402
from humming_jax.kernels import mgpu_convert, tuning, wna16_mgpu  # noqa: E402

FORMS = ("mma", "mma_deep", "convert", "tile", "groups", "bf16", "bf16_deep")
BK = 128  # K per tile: four 32-deep fp8 WGMMA steps
ROWS = wna16_mgpu.BLOCK_N  # weight rows per warpgroup (the WGMMA M dimension)


def build(form: str, block_m: int, wgs: int, iters: int, ctas: int):
  """The probe kernel: (x (block_m, 128) e4m3, the same x in bf16, codes (wgs, 64, 128) int4, scales (wgs, 4,
  64) bf16) -> (ctas, wgs, 64, block_m) float32 accumulators."""
  if form not in FORMS:
    raise ValueError(f"form={form!r}: expected one of {FORMS}")
  x_tf = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(32))  # as run()'s fp8 x
  w_tf = wna16_mgpu._swizzled(BK, 4, "w")
  row_layout = plgpu.Layout.WGMMA.reduce(1)
  acc_t = plgpu.ACC((ROWS, block_m), jnp.float32)

  def kernel(x_gmem, x16_gmem, w_gmem, s_gmem, o_gmem, x_smem, x16_smem, w_smem, s_smem,
             o_smem, bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
      plgpu.copy_gmem_to_smem(x16_gmem, x16_smem, bar)
      plgpu.copy_gmem_to_smem(w_gmem, w_smem, bar)
      plgpu.copy_gmem_to_smem(s_gmem, s_smem, bar)
    plgpu.barrier_wait(bar)
    x_t = lambda b: x_smem.at[:, pl.ds(b * 32, 32)].T
    scale = lambda g: plgpu.load(s_smem.at[wg, g], layout=row_layout).astype(jnp.float32)
    bcast = lambda v: lax.broadcast_in_dim(v, (ROWS, block_m), [0])

    def operands():
      w = plgpu.load(w_smem.at[wg], layout=plgpu.Layout.WGMMA_UPCAST_4X)
      return mgpu_convert.e2m1_to_e4m3_ptx(w, BK // 32)

    def scoped(acc_ref):
      if form.startswith("bf16"):
        w = plgpu.load(w_smem.at[wg], layout=plgpu.Layout.WGMMA_UPCAST_4X)
        a16 = plgpu.layout_cast(w, plgpu.Layout.WGMMA).astype(jnp.bfloat16)

        def body16(_, carry):
          plgpu.wgmma(acc_ref, a16, x16_smem.T)
          if form == "bf16":
            plgpu.wgmma_wait(0)
          return carry
        lax.fori_loop(0, iters, body16, None)
        plgpu.wgmma_wait(0)
        return acc_ref[...]
      if form in ("mma", "mma_deep", "convert"):
        fixed = operands() if form != "convert" else None

        def body(_, carry):
          a = operands() if fixed is None else fixed
          for b in range(BK // 32):
            plgpu.wgmma(acc_ref, a[b], x_t(b))
          if form != "mma_deep":
            plgpu.wgmma_wait(0)
          return carry
        lax.fori_loop(0, iters, body, None)
        plgpu.wgmma_wait(0)
        return acc_ref[...]

      def body(_, total):
        a = operands()
        groups = [[0, 1, 2, 3]] if form == "tile" else [[b] for b in range(BK // 32)]
        for g, blocks in enumerate(groups):
          def product(part_ref, blocks=blocks):
            for b in blocks:
              plgpu.wgmma(part_ref, a[b], x_t(b))
            plgpu.wgmma_wait(0)
            return part_ref[...]
          total = total + pl.run_scoped(product, acc_t) * bcast(scale(g))
        return total
      zero = plgpu.layout_cast(jnp.zeros((ROWS, block_m), jnp.float32), plgpu.Layout.WGMMA)
      return lax.fori_loop(0, iters, body, zero)

    acc = pl.run_scoped(scoped, acc_t)
    o_smem.at[wg][...] = acc
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem.at[wg], o_gmem.at[lax.axis_index("c"), wg])
    plgpu.wait_smem_to_gmem(0)

  scratch = dict(
      x_smem=plgpu.SMEM((block_m, BK), jnp.float8_e4m3fn, transforms=x_tf),
      x16_smem=plgpu.SMEM((block_m, BK), jnp.bfloat16,
                          transforms=wna16_mgpu._swizzled(BK, 16, "x")),
      w_smem=plgpu.SMEM((wgs, ROWS, BK), jnp.int4, transforms=w_tf),
      s_smem=plgpu.SMEM((wgs, BK // 32, ROWS), jnp.bfloat16),
      o_smem=plgpu.SMEM((wgs, ROWS, block_m), jnp.float32),
      bar=plgpu.Barrier(num_arrivals=4))
  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((ctas, wgs, ROWS, block_m),
                                                            jnp.float32),
                      grid=(ctas,), grid_names=("c",), num_threads=wgs, thread_name="wg",
                      scratch_types=scratch)


def inputs(block_m: int, wgs: int, seed: int = 0):
  """Random e4m3 x (and its bf16 copy), random e2m1 codes (as int4), unit bf16 scales."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((block_m, BK)), jnp.float32).astype(jnp.float8_e4m3fn)
  codes = jnp.asarray(rng.integers(-8, 8, (wgs, ROWS, BK)), jnp.int4)
  scales = jnp.ones((wgs, BK // 32, ROWS), jnp.bfloat16)
  return x, x.astype(jnp.bfloat16), codes, scales


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--forms", default=",".join(FORMS))
  ap.add_argument("--block-m", default="128")
  ap.add_argument("--wgs", type=int, default=2)
  ap.add_argument("--iters", type=int, default=512)
  ap.add_argument("--ctas-per-sm", type=int, default=1)
  a = ap.parse_args()
  ctas = a.ctas_per_sm * tuning.num_sms()
  for block_m in (int(v) for v in a.block_m.split(",")):
    args = inputs(block_m, a.wgs)
    flop = 2 * ROWS * block_m * BK * a.iters * a.wgs * ctas
    refs = {}  # the first output of each operand type (fp8 / bf16)
    for form in a.forms.split(","):
      f = jax.jit(build(form, block_m, a.wgs, a.iters, ctas))
      try:
        out = f(*args)
        t = max(common.kernel_times(f, args).values())
      except Exception as err:  # noqa: BLE001 - a form that does not build
        print(f"{form} bm{block_m} wg{a.wgs}: FAILED {type(err).__name__}: "
              f"{str(err)[:300]}", flush=True)
        continue
      ref = refs.setdefault(form.startswith("bf16"), out)
      diff = common.max_rel_diff(out, ref)
      print(f"{form} bm{block_m} wg{a.wgs}: {t:.1f} us, {flop / t / 1e6:.0f} TFLOP/s, "
            f"max rel diff vs the first form of its type {diff:.1e}", flush=True)

if __name__ == "__main__":
  main()
