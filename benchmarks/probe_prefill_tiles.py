"""Device probe (session 20): launch shapes of the Mosaic WnA16 kernel at M = 64-256 on the
Llama-3-8B projections where session 20's call 1 found it behind Humming (14336 -> 4096 at
M = 128: 51.9 us kernel vs 31.6; 4096 -> 28672: 66.2 vs 55.2).  The heuristic's launch
(128-token tiles, two warpgroups splitting K, no split-K) against grid split-K 2 / 4 and
one / four warpgroups, CUPTI kernel time per layer over ``--sets`` weight sets, outputs
compared with the heuristic's.
Usage: probe_prefill_tiles.py [--shapes 14336x4096,4096x28672] [--ms 128]"""
import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import common
import humming_jax as hj
from humming_jax.kernels import wna16_mgpu as mg

VARIANTS = {  # name -> Config changes over the heuristic's
    "heuristic": {},
    "split2": dict(split_k=2),
    "split4": dict(split_k=4),
    "wg1-split2": dict(warpgroups=1, split_k=2),
    "bm64-wg4": dict(block_m=64, warpgroups=4),
    "bm64-wg4-split2": dict(block_m=64, warpgroups=4, split_k=2),
}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--shapes", default="14336x4096,4096x28672,4096x4096")
  ap.add_argument("--ms", default="128")
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--sets", type=int, default=4)
  a = ap.parse_args()
  spec = hj.QuantSpec.preset(a.spec)
  rng = np.random.default_rng(0)
  for shape in a.shapes.split(","):
    k, n = map(int, shape.split("x"))
    ps = [jax.jit(lambda w: mg.prepare(hj.quantize(w, spec)))(
        jax.random.normal(jax.random.key(i), (k, n), jnp.float32) / np.sqrt(k))
        for i in range(a.sets)]
    for m in map(int, a.ms.split(",")):
      x = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
      base = mg.heuristic(m, n)
      ref, line = None, []
      for name, change in VARIANTS.items():
        cfg = dataclasses.replace(base, **change)
        f = jax.jit(lambda ps, x, cfg=cfg: [mg.run(p, x, config=cfg) for p in ps])
        try:
          out = f(ps, x)
          t = common.kernel_times(f, (ps, x), per=a.sets)
        except Exception as e:  # noqa: BLE001 - a launch shape that does not build
          line.append(f"{name} FAILED {type(e).__name__}: {str(e)[:80]}")
          continue
        diff = 0.0
        if ref is None:
          ref = out
        else:
          diff = common.max_rel_diff(out, ref)
        line.append(f"{name} {sum(t.values()):6.2f}" + (f" (diff {diff:.0e})" if diff else ""))
      print(f"{shape} M={m}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
  main()
