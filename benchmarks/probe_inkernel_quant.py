"""Can Mosaic GPU (plgpu) quantize a decode GEMM's activations per token inside the kernel?

A feasibility probe on the CPU (no GPU needed) for an int8-activation path of
``wna16_mgpu.run``'s mma8 route that takes bf16 x and quantizes it in the kernel:

  stage 1: x (M, K) bf16 (rows padded to block_m = 8 / 16 with zeros) TMA-copied in
           (block_m, 256) chunks into SMEM, loaded into registers, each row's amax =
           max |x| (float32) over all of K;
  stage 2: s = amax * float32(1/127) (1 where amax == 0), codes = round-half-even(x / s)
           clipped to [-128, 127] (act_prepass's magic-number rounding), stored as int8 into the
           swizzled SMEM tile an 8-bit WGMMA takes as its B operand (the mma8 path's
           x_tf), then commit_smem;
  stage 3: one int8 WGMMA chain: A = the (64, K) int8 weight rows (K-major, 128-deep
           swizzled tiles as the direct layout stores them), B = the codes tile
           transposed, int32 accumulator (64, block_m); y^T = acc * s (float32) to GMEM.

Each stage is checked (a) by lowering for an H200 (tests/test_cuda_lowering.py's
abstract-device trick: runs Mosaic GPU's lowering, so layout problems show here) and (b)
in the Mosaic GPU interpreter (plgpu.InterpretGPUParams) against numpy: amax exact, codes
bit-equal, s exact, y == (codes @ w^T) * s exactly.  Stage 1 also tries other reduction
forms to record which lower.  Prints PASS / FAIL per check; exits 0 either way.

What it shows and what not: the pieces at K = 1024, with the whole row resident (every
chunk in SMEM and in registers, a (block_m, K) code tile); the streamed form a K = 8192
kernel needs (an amax pass, then per-step quantization) is not built here.  Lowering stops
before ptxas (register pressure untested), the interpreter ignores layouts, and the
``threads=2`` variants run the same work in both warpgroups (they show it lowers, not
that warpgroups synchronise).

  python benchmarks/probe_inkernel_quant.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import mesh as mesh_lib
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import fragmented_array as mfa
from jax.experimental.pallas import mosaic_gpu as plgpu

from humming_jax.kernels import act_prepass, wna16_mgpu

K, CH, BK, N = 1024, 256, 128, 64  # K, x chunk per TMA, WGMMA K tile, weight rows (A M)
# the pre-pass's round-to-nearest-even by the float's bits (one definition of it)
RNE_MAGIC, MAGIC_BITS = act_prepass.RNE_MAGIC, act_prepass.MAGIC_BITS
# XLA (hence the interpreter and quantize_activations under jit) rewrites amax / 127 as
# amax * float32(1 / 127), 1 ulp off the true quotient in ~4 % of rows; a GPU divf would
# not.  The kernel multiplies by the reciprocal explicitly, so every backend agrees.
INV127 = float(np.float32(1 / 127))
COL = plgpu.Layout.WGMMA.reduce(0)  # (block_m,): one value per accumulator column

H200 = jax.sharding.AbstractMesh((1,), ("d",), abstract_device=mesh_lib.AbstractDevice(
    device_kind="NVIDIA H200", num_cores=132, platform="gpu"))


def lower_for_h200(fn, *args):
  f = jax.jit(fn)
  f.trace(*args)
  with jax.sharding.use_abstract_mesh(H200):
    return f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def rows_layout(cols):
  """(block_m, cols) with warp w holding rows w, w + 4, ..., lane l 8 contiguous elements
  8l .. 8l + 7 of each 256-wide piece: a row reduction stays inside one warp (shuffles, no
  SMEM scratch), and the reduced (block_m,) layout broadcasts back along K."""
  return plgpu.Layout.TILED(mfa.Tiling(((4, cols), (8,))), warp_dims=(-3,), lane_dims=(-2,),
                            vector_dim=-1)


def swizzled(cols, bits):  # the kernel's own transforms for a tile of that width
  return wna16_mgpu._swizzled(cols, bits, "probe tile")  # noqa: SLF001


def build(stage, bm, form="rows", threads=1, interpret=False, x_swizzled=False):
  """The probe kernel up to ``stage``; returns f(x (bm, K) bf16, w (N, K) int8) -> outputs:
  stage 1 (amax,), 2 (s, codes), 3 (s, codes, y^T (N, bm) f32)."""
  rows = rows_layout(CH)

  def kernel(x_gmem, w_gmem, *refs, x_smem, bar, s_smem, x8_smem=None, w_smem=None,
             w_bar=None, o_smem=None):
    outs = refs
    multi = threads > 1
    leader = (lambda f: pl.when(lax.axis_index("wg") == 0)(f)) if multi else (lambda f: f())

    def issue():
      for c in range(K // CH):  # one buffer per chunk (no refill: no release protocol)
        plgpu.copy_gmem_to_smem(x_gmem.at[:, pl.ds(c * CH, CH)], x_smem.at[c], bar.at[c])
      if stage >= 3:
        for j in range(K // BK):
          plgpu.copy_gmem_to_smem(w_gmem.at[:, pl.ds(j * BK, BK)], w_smem.at[j], w_bar)
    leader(issue)

    # stage 1: per-row amax over K
    chunks, amax = [], None
    for c in range(K // CH):
      plgpu.barrier_wait(bar.at[c])
      if form == "rowslices":  # 1-D row slices (WG_STRIDED), each fully reduced
        ms = [jnp.max(jnp.abs(plgpu.load(x_smem.at[c, r]).astype(jnp.float32)))
              for r in range(bm)]
        amax = ms if amax is None else [jnp.maximum(a, m) for a, m in zip(amax, ms)]
        continue
      v = plgpu.load(x_smem.at[c], layout=None if form == "strided2d" else rows)
      v = v.astype(jnp.float32)
      chunks.append(v)
      m = jnp.max(jnp.abs(v), axis=1)
      amax = m if amax is None else jnp.maximum(amax, m)
    if form == "rowslices":
      for r in range(bm):
        s_smem[r] = amax[r]
    elif stage == 1:
      s_smem[...] = amax
    if stage >= 2:  # s, codes -> the 8-bit WGMMA B tile
      s = jnp.where(amax > 0, amax * INV127, 1.0)  # (not amax / 127: see INV127)
      s_smem[...] = s
      sb = lax.broadcast_in_dim(s, (bm, CH), [0])
      for c, v in enumerate(chunks):
        t = jnp.clip(v / sb, -128.0, 127.0) + RNE_MAGIC
        q = (lax.bitcast_convert_type(t, jnp.int32) - MAGIC_BITS).astype(jnp.int8)
        x8_smem.at[:, pl.ds(c * CH, CH)][...] = q
    plgpu.commit_smem()  # generic-proxy SMEM writes -> TMA / WGMMA (within the warpgroup)
    if stage >= 3:
      plgpu.barrier_wait(w_bar)

      def mma(acc_ref):
        for j in range(K // BK):
          plgpu.wgmma(acc_ref, w_smem.at[j], x8_smem.at[:, pl.ds(j * BK, BK)].T)
        plgpu.wgmma_wait(0)
        return acc_ref[...]
      acc = pl.run_scoped(mma, plgpu.ACC((N, bm), jnp.int32))
      s_col = plgpu.load(s_smem, layout=COL)  # the scales again, now one per column
      o_smem[...] = acc.astype(jnp.float32) * lax.broadcast_in_dim(s_col, (N, bm), [1])
      plgpu.commit_smem()

    def store():
      plgpu.copy_smem_to_gmem(s_smem, outs[0])
      if stage >= 2:
        plgpu.copy_smem_to_gmem(x8_smem, outs[1])
      if stage >= 3:
        plgpu.copy_smem_to_gmem(o_smem, outs[2])
      plgpu.wait_smem_to_gmem(0)
    leader(store)

  x_tf = swizzled(CH, 16) if x_swizzled else ()
  scratch = dict(x_smem=plgpu.SMEM((K // CH, bm, CH), jnp.bfloat16, transforms=x_tf),
                 bar=plgpu.Barrier(num_arrivals=1, num_barriers=K // CH),
                 s_smem=plgpu.SMEM((bm,), jnp.float32))
  out = [jax.ShapeDtypeStruct((bm,), jnp.float32)]
  if stage >= 2:  # as wna16_mgpu.run's mma8 x tile: _swizzled(sub * bk, 8, "x")
    scratch["x8_smem"] = plgpu.SMEM((bm, K), jnp.int8, transforms=swizzled(K, 8))
    out.append(jax.ShapeDtypeStruct((bm, K), jnp.int8))
  if stage >= 3:  # the direct layout's (64, 128) int8 K-major tiles; the (64, bm) output
    scratch.update(w_smem=plgpu.SMEM((K // BK, N, BK), jnp.int8, transforms=swizzled(BK, 8)),
                   w_bar=plgpu.Barrier(num_arrivals=K // BK),
                   o_smem=plgpu.SMEM((N, bm), jnp.float32, transforms=swizzled(bm, 32)))
    out.append(jax.ShapeDtypeStruct((N, bm), jnp.float32))
  threading = dict(num_threads=threads, thread_name="wg") if threads > 1 else {}
  return plgpu.kernel(kernel, out_type=tuple(out), scratch_types=scratch, **threading,
                      interpret=plgpu.InterpretGPUParams() if interpret else False)


def padded_call(stage, m, **kw):
  bm = 8 if m <= 8 else 16
  f = build(stage, bm, **kw)
  return lambda x, w: f(jnp.pad(x, ((0, bm - m), (0, 0))), w)


def reference(x, w):
  """numpy: amax, s, codes (round half to even), y = (codes @ w^T) * s, float32."""
  xf = np.asarray(x, np.float32)
  amax = np.abs(xf).max(axis=1)
  s = np.where(amax > 0, amax * np.float32(INV127), np.float32(1)).astype(np.float32)
  codes = np.clip(np.rint(xf / s[:, None]), -128, 127).astype(np.int8)
  acc = codes.astype(np.int64) @ np.asarray(w, np.int64).T
  return amax, s, codes, acc.astype(np.float32) * s[:, None]


def inputs(m, seed=0):
  kx, kw, ks = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (m, K), jnp.float32) * jnp.exp(jax.random.normal(ks, (m, 1)) * 2)
  # row 0: amax 127 -> s = 1 exactly, so x / s hits the round-half-even ties
  x = x.at[0].set(jnp.clip(x[0] * 0 + jax.random.normal(ks, (K,)) * 30, -100, 100))
  x = x.at[0, :7].set(jnp.array([127.0, 0.5, 1.5, 2.5, -2.5, -0.5, 126.5]))
  if m > 1:
    x = x.at[m // 2].set(0.0)  # an all-zero token: s = 1, codes 0
  w = jax.random.randint(kw, (N, K), -128, 128, jnp.int32).astype(jnp.int8)
  return x.astype(jnp.bfloat16), w


def check(label, fn):
  try:
    msg = fn()
    print(f"PASS  {label}" + (f"  ({msg})" if msg else ""), flush=True)
    return True
  except Exception as e:  # noqa: BLE001  (a probe: record the error, go on)
    first = (str(e).strip().splitlines() or [""])[0]
    print(f"FAIL  {label}: {type(e).__name__}: {first[:300]}", flush=True)
    return False


def lowers(stage, m, **kw):
  x = jax.ShapeDtypeStruct((m, K), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((N, K), jnp.int8)
  text = lower_for_h200(padded_call(stage, m, **kw), x, w)
  return f"{len(text)} chars"


def values(stage, m, **kw):
  x, w = inputs(m)
  outs = jax.jit(padded_call(stage, m, interpret=True, **kw))(x, w)
  amax, s, codes, y = reference(x, w)
  got = [np.asarray(o) for o in outs]
  if stage == 1:
    np.testing.assert_array_equal(got[0][:m], amax, "amax")
    return "amax exact"
  np.testing.assert_array_equal(got[0][:m], s, "s")
  np.testing.assert_array_equal(got[1][:m], codes, "codes")
  assert not got[1][m:].any(), "padding rows' codes not 0"
  if stage == 3:
    np.testing.assert_array_equal(got[2].T[:m], y, "y")
    return "s, codes, y bit-equal"
  return "s, codes bit-equal"


def main():
  print(f"jax {jax.__version__}, K={K}, chunk {CH}, WGMMA K tile {BK}, N {N}", flush=True)
  print("-- stage 1: per-row amax; reduction forms (lowering for H200, block_m 16)")
  forms = [("rows: TILED ((4,256),(8,)) layout, jnp.max(axis=1)", dict(form="rows")),
           ("rows on a swizzled x tile (8,64)/128B", dict(form="rows", x_swizzled=True)),
           ("rows, 2 warpgroup threads", dict(form="rows", threads=2)),
           ("default (WG_STRIDED) 2-D load, jnp.max(axis=1)", dict(form="strided2d")),
           ("1-D row slices (WG_STRIDED), full reduce", dict(form="rowslices")),
           ("1-D row slices, 2 warpgroup threads", dict(form="rowslices", threads=2))]
  for label, kw in forms:
    if check(f"lower  stage 1 [{label}]", lambda kw=kw: lowers(1, 16, **kw)) and (
        kw.get("threads", 1) == 1):
      check(f"interp stage 1 [{label}] M=16", lambda kw=kw: values(1, 16, **kw))
  for stage, what in ((1, "amax"), (2, "s + int8 codes -> swizzled WGMMA B tile"),
                      (3, "int8 WGMMA, acc * s -> GMEM")):
    print(f"-- stage {stage}: {what} (rows layout)")
    for m in (1, 8, 16):
      if check(f"lower  stage {stage} M={m}", lambda: lowers(stage, m)):
        check(f"interp stage {stage} M={m}", lambda: values(stage, m))
  print("-- stage 3 in a 2-warpgroup kernel (lowering only)")
  check("lower  stage 3 M=16 threads=2", lambda: lowers(3, 16, threads=2))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
