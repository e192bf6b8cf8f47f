"""Could a fused-dequantization prefill GEMM beat XLA's dequantize + cuBLAS at M = 4096?

The large-M WnA16 route dequantizes the weights to bf16 in one XLA fusion (57-72 us at
8192^2 on an H100) and runs cuBLAS (~650-690 us at M = 4096).  A kernel that converts the
weights in registers saves the fusion only if its mainloop runs near cuBLAS.  JAX ships a
Mosaic GPU mixed-type GEMM (``hopper_mixed_type_matmul_mgpu``: int8 LHS converted in
registers, bf16 RHS from shared memory, two consumer warpgroups, warp-specialized
pipeline); this probe times a few of its configs at the route's shape (LHS = the weights,
N_out x K; RHS = x^T, K x M) against cuBLAS on bf16 operands of the same shape.  If the
best int8 config is not well under cuBLAS + the fusion, an int4 + group-scale variant
(more work per weight) will not be either.

Also: whether XLA fuses a bias into cuBLAS's epilogue when the GEMM writes bf16 (the
route keeps a float32 product and a pass when params have a bias).

  python benchmarks/probe_mixed_matmul.py [--m 4096] [--k 8192] [--n 8192]
"""
from __future__ import annotations

import argparse
import itertools
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from benchmarks import common  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--m", type=int, default=4096, help="tokens")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192, help="output features")
  ap.add_argument("--configs", type=int, default=24)
  a = ap.parse_args()
  from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mm  # noqa: PLC0415
  print(common.device_info(), f"tokens={a.m} K={a.k} N={a.n}", flush=True)
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  w8 = jax.random.randint(k1, (a.n, a.k), -127, 128, jnp.int32).astype(jnp.int8)
  xt = (jax.random.normal(k2, (a.k, a.m), jnp.float32) * 0.05).astype(jnp.bfloat16)
  flops = 2 * a.m * a.n * a.k

  def show(name, f, *args):
    t = common.kernel_times(f, args)
    tot = sum(t.values())
    kern = "  ".join(f"{k}={v:.1f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))
    print(f"{name:60s} {tot:8.1f} us  {flops / tot / 1e6:6.0f} TF/s  {kern}", flush=True)
    return tot

  wb = w8.astype(jnp.bfloat16)
  show("cuBLAS bf16 W @ x^T (bf16 out)", lambda w, x: w @ x, wb, xt)
  show("XLA int8 -> bf16 convert + GEMM", lambda w, x: w.astype(jnp.bfloat16) @ x, w8, xt)
  x = xt.T
  wkn = wb.T
  bias = jax.random.normal(k3, (a.n,), jnp.float32)
  show("x @ w + bias, float32 product (the route today)",
       lambda x, w, b: (jnp.dot(x, w, preferred_element_type=jnp.float32) + b
                        ).astype(x.dtype), x, wkn, bias)
  show("x @ w (bf16 out) + bf16 bias",
       lambda x, w, b: x @ w + b.astype(x.dtype), x, wkn, bias)
  ref = jnp.dot(wb, xt, preferred_element_type=jnp.float32)
  grid = list(itertools.product((128, 64), (128, 256), (64, 128), (mm.MatmulDimension.N,
                                mm.MatmulDimension.M), (mm.MatmulDimension.N,
                                                         mm.MatmulDimension.M)))
  best = None
  for tile_m, tile_n, tile_k, wg_dim, minor in grid[:a.configs]:
    cfg = mm.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, max_concurrent_steps=4,
                          grid_minor_dim=minor, grid_tile_width=8, wg_dimension=wg_dim)
    name = f"mixed int8 {tile_m}x{tile_n}x{tile_k} wg={wg_dim} minor={minor}"
    try:
      f = jax.jit(lambda w, x, cfg=cfg: mm.mixed_matmul_kernel(w, x, out_dtype=jnp.bfloat16,
                                                               config=cfg))
      out = f(w8, xt)
      err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
      tot = show(name + f" err={err:.0e}", f, w8, xt)
      best = tot if best is None else min(best, tot)
    except Exception as e:  # noqa: BLE001 - a config that does not build is a result
      print(f"{name:60s} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
  print(f"best mixed int8: {best}", flush=True)


if __name__ == "__main__":
  main()
