"""Device probe (session 19): the permuted K order of the 4-bit Mosaic layout
(``wna16_mgpu.prepare(permute=True)``, the default) against the K-order layout -- the
decode kernel converts the permuted codes in place instead of through Mosaic's relayout
(two shuffles and two permutes per 8 codes in session 19's SASS profile).  CUPTI kernel
time per layer over a chain of ``--sets`` weight sets (more than L2 holds), each launch
shape as the heuristic picks it, outputs compared.  At large M the XLA dequantization
reads the layout (``wna16_mgpu.code_values`` undoes the permutation).  Session 19's calls
5-7 timed four ways of undoing it at large M through a ``--modes`` switch that is gone
with the slower three (NOTES.md v21).
Usage: probe_permuted.py [--specs w4a16-g128-zp,w4a16-mxfp4] [--ms 1,16,128,4096]"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import common
import humming_jax as hj
from humming_jax.kernels import wna16_mgpu as mg


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-mxfp4")
  ap.add_argument("--ms", default="1,16,128,4096")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--sets", type=int, default=4)
  a = ap.parse_args()
  rng = np.random.default_rng(0)
  for name in a.specs.split(","):
    spec = hj.QuantSpec.preset(name)
    qs = [jax.jit(hj.quantize, static_argnums=1)(
        jax.random.normal(jax.random.key(i), (a.k, a.n), jnp.float32) / np.sqrt(a.k), spec)
        for i in range(a.sets)]
    layouts = {perm: [jax.jit(lambda q, perm=perm: mg.prepare(q, permute=perm))(q)
                      for q in qs] for perm in (False, True)}
    for m in map(int, a.ms.split(",")):
      x = jnp.asarray(rng.standard_normal((m, a.k), np.float32), jnp.bfloat16)
      outs, line = {}, []
      for perm in (False, True):
        f = jax.jit(lambda ps, x: [mg.run(p, x) for p in ps])
        outs[perm] = f(layouts[perm], x)
        t = common.kernel_times(f, (layouts[perm], x), per=a.sets)
        main_k = {k: round(v, 2) for k, v in t.items() if v > 0.5}
        line.append(f"{'permuted' if perm else 'k-order'} {sum(t.values()):7.2f} us {main_k}")
      diff = common.max_rel_diff(outs[True], outs[False])
      print(f"{name} M={m}: " + " | ".join(line) + f" | max rel diff {diff:.1e}", flush=True)


if __name__ == "__main__":
  main()
