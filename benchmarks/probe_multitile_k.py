"""Session 63 diagnostic: the 8-bit GEMM (w8a8_mgpu.gemm) at few K steps with several
output tiles per CTA (tuning.num_sms patched) against one tile per CTA, for the plain fp8
operands and the in-GEMM MXFP4 default form (four-stage shared tile), each against the
tests' float32 product (``float_product``, bf16-rounded).  Prints, per (form, K, sms),
the elements differing from the one-tile-per-CTA run (the signal: zero when the tiles
are independent) and from the float product (comparative only: the float32 epilogue
and the fp8 WGMMA's accumulation round, so it is not zero for a correct kernel).

  PYTHONPATH=.:tests python3 benchmarks/probe_multitile_k.py --ks 128,256,1152
"""
from __future__ import annotations

import argparse
import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import test_w8a8_mgpu as t  # noqa: E402

from humming_jax.kernels import w8a8_mgpu as wm  # noqa: E402

FORMS = ("fp8", "e2m1")


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ks", default="128,256,1152")
  ap.add_argument("--sms", default="0,5,3")  # 0: the device's
  ap.add_argument("--m", type=int, default=1024)
  ap.add_argument("--n", type=int, default=384)
  args = ap.parse_args()
  real_sms = wm.tuning.num_sms
  for k in map(int, args.ks.split(",")):
    a, w, wf = t.e2m1_operands(args.m, args.n, k, seed=5)
    _, _, rows, cols, bias = t.operands(jnp.float8_e4m3fn, args.m, args.n, k, seed=6)
    mult = w.column_multiplier()
    folded = t.folded_e4m3(w, wf)
    ref = np.asarray(t.float_product(a, folded, rows, cols * mult, bias))
    ref_bf16 = np.asarray(jnp.asarray(ref).astype(jnp.bfloat16), np.float32)
    for form in FORMS:
      base = None
      for sms in map(int, args.sms.split(",")):
        wm.tuning.num_sms = real_sms if sms == 0 else (lambda s=sms: s)
        y = (wm.gemm(a, folded, rows, cols * mult, bias, out_dtype=jnp.bfloat16)
             if form == "fp8" else wm.gemm(a, w, rows, cols, bias, out_dtype=jnp.bfloat16))
        y = np.asarray(y.astype(jnp.float32))
        base = y if base is None else base
        d_base = int(np.sum(y != base))
        d_ref = int(np.sum(y != ref_bf16))
        err = float(np.max(np.abs(y - ref)))
        print(f"K={k} {form} sms={sms or real_sms()}: {d_base} differ from sms=first, "
              f"{d_ref} from the float product rounded (max |y - ref| {err:.3e})",
              flush=True)
      wm.tuning.num_sms = real_sms


if __name__ == "__main__":
  main()
