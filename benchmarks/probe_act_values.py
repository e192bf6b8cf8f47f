"""Device probe: the W8A8-family pre-pass (quantize.kernel_activations) against the
reference's values (quantize_activations) bit for bit, and the MXFP4 fold route's error
with each, at one shape.  Usage: probe_act_values.py [--m 1024] [--k 8192]."""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import humming_jax as hj
import importlib
qz = importlib.import_module("humming_jax.quantize")
from humming_jax.kernels import reference, w8a8, wnam_mgpu as wm


def rel(y, ref):
  y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
  return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--m", type=int, default=1024)
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  a = ap.parse_args()
  for name in ("w4a8-mxfp4", "w4a8-fp8", "w8a8-fp8"):
    spec = hj.QuantSpec.preset(name)
    x = jax.random.normal(jax.random.key(1), (a.m, a.k), jnp.float32).astype(jnp.bfloat16)
    ref = jax.jit(lambda x: qz.quantize_activations(x, spec))(x)
    ker = jax.jit(lambda x: qz.kernel_activations(x, spec, rows=a.m, kp=a.k))(x)
    rv = np.asarray(ref.values.astype(jnp.float32))
    kv = np.asarray(ker.values.astype(jnp.float32))
    print(f"{name}: values dtype ref {ref.values.dtype} kernel {ker.values.dtype}; "
          f"mismatched values {int(np.sum(rv != kv))} of {rv.size}; scales equal "
          f"{bool(np.array_equal(np.asarray(ref.scales), np.asarray(ker.scales)))}; "
          f"max |ref| {np.abs(rv).max():.1f} max |kernel| {np.abs(kv).max():.1f}")
  spec = hj.QuantSpec.preset("w4a8-mxfp4")
  kw, kx = jax.random.split(jax.random.key(8))
  w = jax.random.normal(kw, (a.k, a.n)) / np.sqrt(a.k)
  x = jax.random.normal(kx, (a.m, a.k), jnp.float32).astype(jnp.bfloat16)
  q = hj.quantize(w, spec)
  p = jax.jit(wm.prepare)(q)
  yr = jax.jit(reference.dense_reference)(q, x)
  y = jax.jit(wm.run_prefill_mx_fold)(p, x)
  print(f"fold route, default pre-pass: rel err {rel(y, yr):.3e}")
  # XLA's pre-pass for both runs below (the one-pass kernel would bypass the patch).
  w8a8.FUSED_PREPASS = False
  orig = qz.kernel_activations

  def old(x, spec, act_scale=None, *, rows, kp):
    qa = qz.quantize_activations(x, spec, act_scale)
    return qa.replace(values=qz._pad(qa.values, (rows, kp))) if hasattr(qa, "replace") else \
        type(qa)(qz._pad(qa.values, (rows, kp)), qa.scales)
  from humming_jax.kernels import act_quant
  y1 = jax.jit(lambda p, x: wm.run_prefill_mx_fold(p, x))(p, x)
  act_quant.kernel_activations = old
  y2 = jax.jit(lambda p, x: wm.run_prefill_mx_fold(p, x))(p, x)
  act_quant.kernel_activations = orig
  w8a8.FUSED_PREPASS = True
  print(f"fold route, kernel_activations: rel err {rel(y1, yr):.3e}")
  print(f"fold route, reference pre-pass: rel err {rel(y2, yr):.3e}; "
        f"between the two {rel(y1, y2):.3e}")
  codes = jax.jit(lambda p: wm.mx_fold_codes(p, pallas=True))(p)
  codes_x = jax.jit(lambda p: wm.mx_fold_codes(p))(p)
  print(f"fold codes Pallas vs XLA: mismatched "
        f"{int(jnp.sum(codes.view(jnp.uint8) != codes_x.view(jnp.uint8)))} of {codes.size}")


if __name__ == "__main__":
  main()
