"""What a new (spec, shape) costs before its first result: trace, lower (Python: Pallas ->
Mosaic GPU, layout inference, dialect lowering), XLA compile (which with jax 0.11.2 also
compiles the Mosaic kernels: MLIR -> LLVM -> PTX -> SASS) and the first run.  Issue 3 asks
<= 2 s per new (spec, shape) on the 8192^2 layer.

Each point is measured cold (no kernel with the same module ran before in this process;
an unrelated small layer warms JAX, CUDA and Mosaic up first) and then warm (a fresh jit
of the same layer), in case the kernel compile were deferred to the first run and cached
there by module hash (jaxlib's custom call has such a cache).  H100 session 50: first run
1 ms cold and warm, cold within 0.09 s of warm -- not the case with jax 0.11.2.

  python benchmarks/probe_compile.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --ms 1,16
  python benchmarks/probe_compile.py --specs w4a16-nvfp4 --configs default,sub2  # launches

``--configs``: profile_mgpu.py's tokens on the dense heuristic for M (``default``: what
quant_dense picks).  The Mosaic kernel's unrolled K tiles per pipeline step (``substeps``)
set how much code each launch lowers and compiles.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks.profile_mgpu import parse_config  # noqa: E402
from humming_jax.kernels import wna16_mgpu  # noqa: E402


def stage_times(fn, *args) -> dict[str, float]:
  """Seconds per stage of a fresh jit's first result (nothing cached for the function)."""
  f = jax.jit(lambda *a: fn(*a))
  t0 = time.perf_counter()
  traced = f.trace(*args)
  t1 = time.perf_counter()
  lowered = traced.lower()
  t2 = time.perf_counter()
  compiled = lowered.compile()
  t3 = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  t4 = time.perf_counter()
  return {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2,
          "first_run_s": t4 - t3, "total_s": t4 - t0}


def layer_for(cname: str, m: int):
  cfg = parse_config(cname, m)
  if cfg is None:
    return lambda p, x: hj.quant_dense(p, x, backend="pallas")
  return lambda p, x: wna16_mgpu.run(p, x, config=cfg)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4")
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--kn", default="8192x8192")
  ap.add_argument("--configs", default="default")
  ap.add_argument("--json", default=None)
  args = ap.parse_args()
  k, n = map(int, args.kn.split("x"))
  # Warm-up on an unrelated module: the process's first GPU / Mosaic work is not a
  # (spec, shape)'s own cost.
  small = jax.random.normal(jax.random.key(1), (256, 256), jnp.float32)
  q = hj.quantize(small, hj.QuantSpec.preset("w8a16"))
  stage_times(lambda p, x: hj.quant_dense(p, x, backend="pallas"), jax.jit(hj.prepare)(q),
              jnp.ones((1, 256), jnp.bfloat16))
  w = jax.random.normal(jax.random.key(0), (k, n), jnp.float32) / k ** 0.5
  rows = []
  for name in args.specs.split(","):
    params = jax.jit(lambda q: hj.prepare(q))(hj.quantize(w, hj.QuantSpec.preset(name)))
    for m in map(int, args.ms.split(",")):
      x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
      for cname in args.configs.split(","):
        cold = stage_times(layer_for(cname, m), params, x)
        warm = stage_times(layer_for(cname, m), params, x)
        rows.append({"spec": name, "m": m, "config": cname, "layout": params.layout,
                     "cold": cold, "warm": warm})
        print(f"{name:16s} M={m:<5d} {cname:8s} cold {cold['total_s']:.3f} s (trace "
              f"{cold['trace_s']:.3f} lower {cold['lower_s']:.3f} compile "
              f"{cold['compile_s']:.3f} first run {cold['first_run_s']:.3f})  warm "
              f"{warm['total_s']:.3f} (first run {warm['first_run_s']:.3f})", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
