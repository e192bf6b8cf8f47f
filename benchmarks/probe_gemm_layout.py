"""Which layout the large-M WnA16 route's dequantized weights take, and what it costs.

Session 47's H100 run (8192^2, M = 4096) showed cuBLAS running a different GEMM for the
same shape by format: int4 g128 zp's dequantized weights fed
``nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN`` (688 us), MXFP4's
``..._128x256_64x4_2x1_v_bz_coopA_NNN`` (638 us).  The route leaves the weights' layout to
XLA's layout assignment; this probe times the route against the same dequantization with
its (K, N) layout pinned (``jax.experimental.layout.with_layout_constraint``), row-major
and column-major, and XLA's bf16 ``x @ w`` of both stored orders.

  python benchmarks/probe_gemm_layout.py [--specs ...] [--m 4096] [--k 8192] [--n 8192]
  python benchmarks/probe_gemm_layout.py --fused --ms 1024,4096

``--fused``: can XLA fuse the dequantization into its own (Triton) GEMM?  The pinned
row-major form did (a ``gemm_fusion`` of 716 us at M = 4096, H100 session 48) but left a
58.6 us transpose beside it.  Forms: the dequantized (t, Np, bk) tiles contracted with x
as (M, t, bk) by one einsum (no (K, N) transpose), with the ":pk" permutation undone on
the codes, applied to x's columns instead, or on a K-order layout (no permutation).

CUPTI device time per kernel name (``common.kernel_times``), us per layer.
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax.kernels import wna16_mgpu  # noqa: E402


def pinned(params, x, major_to_minor):
  from jax.experimental.layout import Layout, with_layout_constraint  # noqa: PLC0415
  w = wna16_mgpu.dequantize_prepared(params, x.dtype)
  w = with_layout_constraint(w, Layout(major_to_minor=major_to_minor))
  return jnp.dot(x, w, preferred_element_type=x.dtype)


def tiles_einsum(params, x, *, permute_x=False):
  """y = x @ W with W's tiles (t, Np, bk) dequantized in place and contracted over (t, bk):
  int4 codes with zero points and group scales (the int4 g128 zp spec)."""
  from humming_jax.kernels import mgpu_convert  # noqa: PLC0415
  t, np_, bk = params.codes.shape
  c = params.codes if permute_x else wna16_mgpu.logical_codes(params)
  c = c.astype(x.dtype)

  def per_k(r):  # (Kp / g, Np) rows -> (t, Np, bk)
    g = t * bk // r.shape[0]
    r = r.astype(x.dtype).reshape(t, bk // g, np_).transpose(0, 2, 1)
    return jnp.repeat(r, g, axis=-1)

  if params.zeros is not None:
    c = c - per_k(params.zeros)
  w = c * per_k(params.scales)
  xk = mgpu_convert.permute_k(x) if permute_x else x
  y = jnp.einsum("mtb,tnb->mn", xk.reshape(x.shape[0], t, bk), w,
                 preferred_element_type=x.dtype)
  return y[:, :params.shape[1]]


def fused(a, x_full, w):
  for m in [int(v) for v in a.ms.split(",")]:
    x = x_full[:m]
    q = hj.quantize(w, "w4a16-g128-zp")
    p = jax.jit(hj.prepare)(q)
    pk = jax.jit(lambda q: wna16_mgpu.prepare(q, permute=False))(q)
    ref = jax.jit(lambda p, x: hj.quant_dense(p, x, backend="xla"))(p, x)
    print(f"-- M={m} int4 g128 zp", flush=True)
    for name, f, args in (
        ("route (:pk)", lambda p, x: hj.quant_dense(p, x), (p, x)),
        ("route (K order)", lambda p, x: hj.quant_dense(p, x), (pk, x)),
        ("einsum, :pk undone on codes", tiles_einsum, (p, x)),
        ("einsum, :pk on x's columns",
         lambda p, x: tiles_einsum(p, x, permute_x=True), (p, x)),
        ("einsum, K order layout", tiles_einsum, (pk, x))):
      try:
        SHOW(f"M={m} {name}", f, *args, ref=ref)
      except Exception as err:  # noqa: BLE001 - a form XLA refuses is a result too
        print(f"M={m} {name} FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)


SHOW = None


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4")
  ap.add_argument("--m", type=int, default=4096)
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--fused", action="store_true")
  ap.add_argument("--ms", default="1024,4096")
  a = ap.parse_args()
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (a.m, a.k), jnp.bfloat16)
  w = (jax.random.normal(kw, (a.k, a.n), jnp.float32) / np.sqrt(a.k))
  print(f"{common.device_info()}  M={a.m} K={a.k} N={a.n}", flush=True)

  def show(name, f, *args, ref=None):
    out = jax.jit(f)(*args)
    t = common.kernel_times(f, args)
    err = "" if ref is None else f"  err={common.rel_err(out, ref):.1e}"
    kern = "  ".join(f"{k}={v:.1f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))
    print(f"{name:34s} total={sum(t.values()):7.1f}{err}  {kern}", flush=True)
    return out

  global SHOW
  SHOW = show
  if a.fused:
    return fused(a, jax.random.normal(kx, (max(int(v) for v in a.ms.split(",")), a.k),
                                      jnp.bfloat16), w)
  wb = w.astype(jnp.bfloat16)
  show("xla x@w (K,N)", lambda x, w: x @ w, x, wb)
  show("xla x@w.T of (N,K)", lambda x, w: x @ w.T, x, wb.T)
  for name in a.specs.split(","):
    p = jax.jit(hj.prepare)(hj.quantize(w, name))
    ref = jax.jit(lambda p, x: hj.quant_dense(p, x, backend="xla"))(p, x)
    show(f"{name} route", lambda p, x: hj.quant_dense(p, x), p, x, ref=ref)
    for order, label in (((0, 1), "pinned (K,N) row-major"), ((1, 0), "pinned (K,N) col-major")):
      try:
        show(f"{name} {label}", lambda p, x, o=order: pinned(p, x, o), p, x, ref=ref)
      except Exception as err:  # noqa: BLE001 - a layout XLA refuses is a result too
        print(f"{name} {label} FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)


if __name__ == "__main__":
  main()
