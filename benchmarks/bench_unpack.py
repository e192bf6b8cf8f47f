"""The per-call weight unpack of the W4A8 prefill routes (``wnam_mgpu``): the XLA
reference against the Pallas-Triton kernel (kernels/carrier_unpack.py).

At 8192^2 the 8-bit GEMM of W4A8 reads (N, K) 8-bit codes made per call from the 4-bit
prepared layout.  H200, CUPTI: int4 -> int8 33 us (session 15); XLA int4 -> e4m3 81 us and
the MXFP4 fold 117 us (session 16, with subnormal rounding; 81 before it).  Session 16 also
timed integer-only XLA forms (130 / 163 us) and a 16-entry table for int4 (81 us): no
gain, removed -- the float32 route was not the cost XLA's fusion pays.  Each variant is
checked bit-equal to the XLA reference first.

  PYTHONPATH=. python3 benchmarks/bench_unpack.py            # H200: 8192^2, CUPTI us
  PYTHONPATH=. python3 benchmarks/bench_unpack.py --check    # any machine: small shape,
                                                             # bit-equality only
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import humming_jax as hj  # noqa: E402
from humming_jax.kernels import wnam_mgpu as wm  # noqa: E402

INTERPRET = jax.default_backend() != "gpu"  # --check off the GPU: the Pallas interpreter


# The XLA references (the formats' decode / encode_exact) and the Pallas-Triton unpack.
VARIANTS = {
    "w4a8-fp8": {"xla": lambda p: wm._carrier_codes(p),
                 "pallas": lambda p: wm._carrier_codes(p, pallas=True, interpret=INTERPRET)},
    "w4a8-mxfp4": {"xla": lambda p: wm.mx_fold_codes(p),
                   "pallas": lambda p: wm.mx_fold_codes(p, pallas=True, interpret=INTERPRET)},
}


def params_for(spec_name: str, k: int, n: int, seed: int, *, wide: bool = False):
  spec = hj.QuantSpec.preset(spec_name)
  w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / 40
  q = jax.jit(lambda w: hj.quantize(w, spec))(w)
  if wide and spec_name == "w4a8-mxfp4":  # group rows 0..19 octaves down: past the exact 14
    s = q.scales.astype(jnp.int32)
    s = s - (jnp.arange(s.shape[0], dtype=jnp.int32) * 3 % 20)[:, None]
    q = q.replace(scales=jnp.clip(s, 1, 254).astype(q.scales.dtype))
  return jax.jit(wm.prepare)(q)


def check(k: int, n: int) -> None:
  for spec_name, variants in VARIANTS.items():
    for wide in (False, True):
      p = params_for(spec_name, k, n, seed=1, wide=wide)
      want = np.asarray(jax.jit(variants["xla"])(p)).view(np.uint8)
      for name, fn in variants.items():
        got = np.asarray(jax.jit(fn)(p)).view(np.uint8)
        bad = int((got != want).sum())
        print(f"{spec_name:11s} {'wide' if wide else 'real':4s} {name:8s} "
              f"{'bit-equal' if bad == 0 else f'{bad} codes differ'}")
        if bad:
          raise SystemExit(f"{spec_name} {name}: {bad} codes differ from the XLA reference")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--check", action="store_true", help="small shape, bit-equality only")
  ap.add_argument("--shape", default="8192x8192", help="KxN of the timed weights")
  ap.add_argument("--sets", type=int, default=4, help="weight sets per timed call (L2)")
  args = ap.parse_args(argv)
  if args.check:
    check(512, 384)
    return
  k, n = map(int, args.shape.split("x"))
  print(common.device_info())
  check(k, n)
  for spec_name, variants in VARIANTS.items():
    ps = [params_for(spec_name, k, n, seed=i) for i in range(args.sets)]
    for name, fn in variants.items():
      times = common.kernel_times(lambda ps, fn=fn: tuple(fn(p) for p in ps), (ps,),
                                  per=len(ps))
      detail = ", ".join(f"{kn}={us:.1f}" for kn, us in times.items())
      print(f"{args.shape} {spec_name:11s} {name:8s} {sum(times.values()):7.1f} us  ({detail})")


if __name__ == "__main__":
  main()
