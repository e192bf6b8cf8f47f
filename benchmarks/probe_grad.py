"""What a training step pays for quant_dense: CUPTI kernel time of the forward and of
value_and_grad with respect to x, against a bf16 layer, on the GPU.

    PYTHONPATH=. python3 benchmarks/probe_grad.py [--ms 16,1024,4096] [--size 8192]

Rows per M (µs, the sum of the kernels one call launches, median of 5):
  fwd        hj.quant_dense (the Pallas kernel)
  grad       jax.value_and_grad of sum(quant_dense(p, x) * dy) w.r.t. x: the kernel forward
             and quant_dense's backward (reference.dense_gradient_reference: W in bf16,
             default precision)
  grad_f32   the same with the backward on the exact float32 reference at HIGHEST (the
             session 40 first form)
  bf16_fwd / bf16_grad   x @ W with a bf16 W (XLA): what a float layer pays
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax.kernels import reference  # noqa: E402


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ms", default="16,1024,4096")
  ap.add_argument("--size", type=int, default=8192)
  ap.add_argument("--spec", default="w4a16-g128-zp")
  args = ap.parse_args()
  k = n = args.size
  w = jax.random.normal(jax.random.key(0), (k, n)) / k ** 0.5
  p = hj.prepare(hj.quantize(w, args.spec))
  wb = w.astype(jnp.bfloat16)
  exact = reference.dense_gradient_reference
  for m in (int(v) for v in args.ms.split(",")):
    x = jax.random.normal(jax.random.key(1), (m, k), jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(2), (m, n), jnp.bfloat16)
    loss = lambda x: jnp.sum((hj.quant_dense(p, x) * dy).astype(jnp.float32))
    bf16_loss = lambda x: jnp.sum(((x @ wb) * dy).astype(jnp.float32))
    rows = {"fwd": (lambda x: hj.quant_dense(p, x)),
            "grad": jax.value_and_grad(loss),
            "bf16_fwd": (lambda x: x @ wb),
            "bf16_grad": jax.value_and_grad(bf16_loss)}
    out = {name: sum(common.kernel_times(jax.jit(f), (x,)).values())
           for name, f in rows.items()}
    reference.dense_gradient_reference = reference.dense_reference  # the first form
    try:
      out["grad_f32"] = sum(common.kernel_times(jax.jit(jax.value_and_grad(
          lambda x: jnp.sum((hj.quant_dense(p, x) * dy).astype(jnp.float32)))), (x,)).values())
    finally:
      reference.dense_gradient_reference = exact
    print(f"M={m} {args.spec} {k}x{n} us: " + "  ".join(f"{name} {us:.1f}"
                                                          for name, us in out.items()))


if __name__ == "__main__":
  main()
