"""Device probe: the one-pass activation pre-pass (kernels/act_prepass.py) by variant --
rows held in registers or re-read, rows per program, warps -- against XLA's two fusions,
CUPTI kernel time per call, bit-equality with XLA's codes checked for each variant.

Usage: probe_act_prepass.py [--ms 1024,4096] [--ks 8192,14336]"""
import argparse
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import common
from humming_jax.kernels import act_prepass, w8a8
from humming_jax.spec import QuantSpec


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--ms", default="1024,4096")
  ap.add_argument("--ks", default="8192,14336")
  ap.add_argument("--spec", default="w8a8-fp8")
  a = ap.parse_args()
  spec = QuantSpec.preset(a.spec)
  plan = w8a8.plan_for(spec)
  variants = list(itertools.product((True, False), (2, 4, 8), (4, 8)))
  defaults = {name: getattr(act_prepass, name)
              for name in ("MAX_HELD_K", "BLOCK_ROWS", "NUM_WARPS")}
  for m, k in itertools.product(map(int, a.ms.split(",")), map(int, a.ks.split(","))):
    x = jax.random.normal(jax.random.key(m + k), (m, k), jnp.float32).astype(jnp.bfloat16)
    # XLA's pre-pass: the flag off while it traces (at M >= 512 it would take the kernel).
    w8a8.FUSED_PREPASS = False
    xla = jax.jit(lambda x: w8a8.act_operands(x, spec, plan, None, rows=m, kp=k))
    want = xla(x)
    w8a8.FUSED_PREPASS = True
    t = common.kernel_times(xla, (x,))
    print(f"M={m} K={k} XLA: {sum(t.values()):7.1f} us  {({n: round(v, 1) for n, v in t.items()})}")
    for held, rows, warps in variants:  # each variant from the defaults
      for name, value in defaults.items():
        setattr(act_prepass, name, value)
      if held and rows * k // (warps * 32) > 256:  # bf16 values held per thread
        continue
      act_prepass.MAX_HELD_K = k if held else 0
      act_prepass.BLOCK_ROWS, act_prepass.NUM_WARPS = rows, {held: warps}
      # equal: the codes and scales of XLA's pre-pass (non-NaN rows; NaN scales as NaN)
      f = jax.jit(lambda x: act_prepass.quantize_rows.__wrapped__(x, spec, rows=m, kp=k))
      try:
        got = f(x)
        same = bool(np.array_equal(np.asarray(got[0]).view(np.uint8),
                                   np.asarray(want[0]).view(np.uint8))
                    and np.array_equal(np.asarray(got[1]), np.asarray(want[1]),
                                       equal_nan=True))
        t = common.kernel_times(f, (x,))
        us = sum(t.values())
        print(f"M={m} K={k} held={held!s:5} rows={rows} warps={warps}: {us:7.1f} us "
              f"({3 * m * k / us / 1e6:.2f} TB/s of x + codes) bit-equal to XLA's {same}")
      except Exception as e:  # noqa: BLE001 - a variant that does not compile is a result
        print(f"M={m} K={k} held={held} rows={rows} warps={warps}: {type(e).__name__} "
              f"{str(e)[:200]}")


if __name__ == "__main__":
  main()
