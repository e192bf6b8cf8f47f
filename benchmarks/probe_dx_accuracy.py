"""Which side of the dx kernel's GPU test is off at M = 1: the kernel and the XLA route it
replaces (kernels/wna16_mgpu_dx.py run / reference), each against the float32 product of
the same bf16 dy and the same dequantized weights, rounded to bf16 once.

    PYTHONPATH=. python3 benchmarks/probe_dx_accuracy.py [--ms 1,16] [--specs a,b]
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import humming_jax as hj
from humming_jax.kernels import wna16_mgpu_dx as dxk


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-mxfp4")
  ap.add_argument("--size", type=int, default=8192)
  a = ap.parse_args()
  n = a.size
  for spec in a.specs.split(","):
    p = hj.prepare(hj.quantize(jax.random.normal(jax.random.key(7), (n, n)) / 90, spec))
    w = hj.dequantize(p).astype(jnp.bfloat16).astype(jnp.float32)  # the bf16 operand
    for m in [int(v) for v in a.ms.split(",")]:
      dy = jax.random.normal(jax.random.key(8), (m, n), jnp.bfloat16)
      truth = jax.jit(lambda d, w: jnp.dot(d.astype(jnp.float32), w.T,
                                           precision="highest"))(dy, w)
      t16 = np.asarray(truth.astype(jnp.bfloat16), np.float32)
      scale = float(np.max(np.abs(t16)))
      for name, f in (("kernel", dxk.run), ("xla", dxk.reference)):
        got = np.asarray(jax.jit(f)(p, dy), np.float32)
        print(f"{spec} M={m} {name}: max|err|/max {np.max(np.abs(got - t16)) / scale:.2e}"
              f"  mean|err| vs f32 {np.mean(np.abs(got - np.asarray(truth))):.3e}"
              f"  bf16 mismatches {np.mean(got != t16):.3f}", flush=True)


if __name__ == "__main__":
  main()
