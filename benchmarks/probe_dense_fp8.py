"""Device probe (session 21): launch shapes of the dense kernel on the fp8-MMA layout
(W4A8 MXFP4, ``wna16_mgpu.prepare(mma="fp8")``) at decode.  Session 21's first call
measured the heuristic's 64-row launch at 8192^2, M = 1: ~18 us of kernel, against the
~11 predicted (NOTES.md v23): each 32-deep WGMMA of a 64-row x tile does 64 / M times
the work M needs, and the float32 group partials of 64 columns cost registers.
CUPTI time of the main kernel per layer over ``--sets`` weight sets (plus the other
kernels: the activation quantization), each config's output compared with the
heuristic's.  ``--interpret``: a CPU check of the configs at a small shape.
Usage: probe_dense_fp8.py [--shape 8192,8192] [--ms 1,16] [--fold]"""
import argparse
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

import common
import humming_jax as hj
from humming_jax.kernels import wna16_mgpu as mg, wnam_mgpu as wm


def variants(fold: bool = False):
  """(name, config changes from the heuristic, env) to time.  ``fold`` (session 22): the
  heuristic and a few launches, each also with ``fp8_fold`` (the e8m0 group scales folded
  into the e4m3 operands, one partial per K tile)."""
  if fold:
    out = []
    for name, change in (("heuristic", {}), ("bm64-wg4", dict(block_m=64, warpgroups=4)),
                         ("bm128-wg2", dict(block_m=128, warpgroups=2)),
                         ("bm64-wg2", dict(block_m=64, warpgroups=2))):
      # both explicit ({}: the heuristic's config as given), so each pair is one launch
      out += [(name, dict(change), {}), (name + "+fold", dict(change, fp8_fold=True), {})]
    return out
  out = [("heuristic", None, {})]
  for bm, wg, sub, st, sk in ((16, 4, 2, 4, 1), (16, 4, 1, 4, 1), (16, 2, 2, 4, 1),
                              (16, 4, 2, 6, 1), (16, 4, 2, 4, 2), (16, 2, 2, 6, 2),
                              (32, 4, 2, 4, 1), (64, 4, 1, 4, 1), (64, 4, 2, 4, 2),
                              (16, 1, 2, 8, 1)):
    out.append((f"bm{bm}-wg{wg}-sub{sub}-st{st}-sk{sk}",
                dict(block_m=bm, warpgroups=wg, substeps=sub, stages=st, split_k=sk), {}))
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--shape", default="8192,8192")  # K, N
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--sets", type=int, default=4)
  ap.add_argument("--interpret", action="store_true")
  ap.add_argument("--fold", action="store_true", help="time fp8_fold against the partials")
  a = ap.parse_args()
  k, n = map(int, a.shape.split(","))
  spec = hj.QuantSpec.preset("w4a8-mxfp4")
  ps = [jax.jit(lambda w: mg.prepare(wm.weight_view(hj.quantize(w, spec), "canonical"),
                                    permute=False, mma="fp8"))(
      jax.random.normal(jax.random.key(i), (k, n), jnp.float32) / np.sqrt(k))
      for i in range(a.sets)]
  assert "p8" in ps[0].layout.split(":"), ps[0].layout
  for m in map(int, a.ms.split(",")):
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    xq, xs = wm.fp8_operands(x, ps[0].replace(spec=spec), interpret=a.interpret)
    ref, line = None, []
    for name, change, env in variants(a.fold):
      cfg = None if change is None else dataclasses.replace(mg.default_config(ps[0], m),
                                                            **change)
      os.environ.update(env)
      try:
        f = jax.jit(lambda ps, xq, xs, cfg=cfg: [
            mg.run(p, xq, x_scale=xs, config=cfg, interpret=a.interpret) for p in ps])
        entry, ref = common.time_variant(name, f, (ps, xq, xs), per=a.sets,
                                         interpret=a.interpret, ref=ref)
      finally:
        for key in env:
          os.environ.pop(key)
      line.append(entry)
    print(f"K{k} N{n} M={m}:\n  " + "\n  ".join(line), flush=True)


if __name__ == "__main__":
  main()
