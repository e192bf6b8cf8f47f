"""Where a new (spec, shape)'s compile time goes: trace, lower (Python: Pallas -> Mosaic
GPU, layout inference, dialect lowering) and compile (XLA, and Mosaic's MLIR -> LLVM ->
PTX -> SASS), each timed on a fresh function (no jit cache hit), per spec and M on the
8192^2 layer of issue 3.  Issue 3 asks <= 2 s per new (spec, shape).

  python benchmarks/probe_compile.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --ms 1,16
  python benchmarks/probe_compile.py --specs w4a16-nvfp4 --configs default,sub1  # launches

``--configs``: profile_mgpu.py's tokens on the dense heuristic for M (``default``: what
quant_dense picks).  The Mosaic kernel's unrolled K tiles per pipeline step (``substeps``)
set how much code each launch lowers and compiles.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks.profile_mgpu import parse_config  # noqa: E402
from humming_jax.kernels import wna16_mgpu  # noqa: E402


def split_times(fn, *args) -> dict[str, float]:
  f = jax.jit(lambda *a: fn(*a))  # a fresh function: nothing cached for it
  t0 = time.perf_counter()
  traced = f.trace(*args)
  t1 = time.perf_counter()
  lowered = traced.lower()
  t2 = time.perf_counter()
  lowered.compile()
  t3 = time.perf_counter()
  return {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2, "total_s": t3 - t0}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4")
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--kn", default="8192x8192")
  ap.add_argument("--configs", default="default")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--json", default=None)
  args = ap.parse_args()
  k, n = map(int, args.kn.split("x"))
  w = jax.random.normal(jax.random.key(0), (k, n), jnp.float32) / k ** 0.5
  rows = []
  for name in args.specs.split(","):
    params = jax.jit(lambda q: hj.prepare(q))(hj.quantize(w, hj.QuantSpec.preset(name)))
    for m in map(int, args.ms.split(",")):
      x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
      for cname in args.configs.split(","):
        cfg = parse_config(cname, m)
        layer = ((lambda p, x: hj.quant_dense(p, x, backend="pallas")) if cfg is None else
                 (lambda p, x, cfg=cfg: wna16_mgpu.run(p, x, config=cfg)))
        jax.block_until_ready(jax.jit(layer)(params, x))  # one real run first, as bench_dense
        samples = [split_times(layer, params, x) for _ in range(args.repeats)]
        med = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
        rows.append({"spec": name, "m": m, "config": cname, "layout": params.layout, **med})
        print(f"{name:16s} M={m:<5d} {cname:10s} trace {med['trace_s']:.3f}  lower "
              f"{med['lower_s']:.3f}  compile {med['compile_s']:.3f}  total "
              f"{med['total_s']:.3f} s", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
