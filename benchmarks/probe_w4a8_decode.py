"""Where a dense W4A8 decode layer's kernel time goes (session 42): CUPTI time per kernel
name of ``hj.quant_dense`` on prepared params, 8192^2, 8 distinct layers per call (their
sum / 8), for each spec and M, beside the same weights as W4A16.  Environment variables
(HUMMING_JAX_DECODE_PREPASS, HUMMING_JAX_PERMUTE_K) pick the form; run it once per form.
``--variants s1w4,s4w8``: the one-launch pre-pass split over S programs per row with W
warps each (act_prepass.decode_splits; without w<W> the default warps: DECODE_WARPS at
M <= 16 since session 53), one process.  ``--variants qx1,qx0``: the activations
quantized inside the WnA16 kernel (HUMMING_JAX_DECODE_QUANTIZE_X=1, session 58) or by the
pre-pass (=0), one process.  ``--variants qx1+rx1,qx1+rx0,qx0``: at one token the in-kernel
quantization converts the row once per warpgroup (HUMMING_JAX_RESIDENT_X=1, session 59)
or every x tile in the K loop (=0); W8A8 presets in ``--specs`` take it by default, W4A8
with HUMMING_JAX_DECODE_QUANTIZE_X=1.  A16 presets in ``--specs`` time the same way (no pre-pass).

  PYTHONPATH=. python3 benchmarks/probe_w4a8_decode.py --specs w4a8-fp8,w4a8-mxfp4 --ms 1,16
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

import humming_jax as hj  # noqa: E402
from humming_jax.kernels import act_prepass  # noqa: E402

LAYERS = 8


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--specs", default="w4a8-fp8,w4a8-mxfp4")
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--variants", default="",
                  help="s<S>[w<W>],... (pre-pass splits / warps), qx1,qx0 (in-kernel "
                       "activation quantization on / off), rx1,rx0 (its row converted "
                       "once / per x tile); '+' joins several in one variant")
  args = ap.parse_args()
  switches = ("HUMMING_JAX_DECODE_QUANTIZE_X", "HUMMING_JAX_RESIDENT_X",
              act_prepass.SPLITS_ENV, act_prepass.WARPS_ENV)
  given = {v: os.environ.get(v) for v in switches}  # each variant starts from these
  env = {v: os.environ.get(v, "") for v in ("HUMMING_JAX_DECODE_PREPASS", "HUMMING_JAX_PERMUTE_K",
                                             "HUMMING_JAX_DECODE_QUANTIZE_X",
                                             "HUMMING_JAX_RESIDENT_X",
                                             "HUMMING_JAX_PREPASS_SPLITS",
                                             "HUMMING_JAX_PREPASS_WARPS")}
  print("#", common.device_info(), env, flush=True)
  for name in args.specs.split(","):
    spec = hj.QuantSpec.preset(name)
    keys = jax.random.split(jax.random.key(0), LAYERS)
    ps = [hj.prepare(jax.jit(hj.quantize, static_argnums=1)(
        jax.random.normal(kk, (args.k, args.n), jnp.float32) / 90, spec)) for kk in keys]
    print(f"{name}: layout {ps[0].layout}", flush=True)
    for m in map(int, args.ms.split(",")):
      xs = [jax.random.normal(jax.random.key(m + i), (m, args.k), jnp.bfloat16)
            for i in range(LAYERS)]
      for variant in args.variants.split(",") if args.variants else [""]:
        if variant:  # (no --variants: the environment as given)
          env = {}
          for part in variant.split("+"):  # e.g. qx1+rx0
            one = ({"HUMMING_JAX_DECODE_QUANTIZE_X": part[2:]} if part in ("qx1", "qx0")
                   else {"HUMMING_JAX_RESIDENT_X": part[2:]} if part in ("rx1", "rx0")
                   else common.prepass_variant_env(part))
            if one is None:
              raise SystemExit(f"--variants: {part!r} is not s<S>[w<W>], qx1, qx0, rx1 "
                               f"or rx0")
            env.update(one)
          for v, value in {**given, **env}.items():
            if value is None:
              os.environ.pop(v, None)
            else:
              os.environ[v] = value
        # a fresh function per variant: the switches are read while tracing
        fn = jax.jit(lambda ps, xs: [hj.quant_dense(p, x) for p, x in zip(ps, xs)])
        jax.block_until_ready(fn(ps, xs))
        times = common.kernel_times(fn, (ps, xs), per=LAYERS)
        total = sum(times.values())
        parts = ", ".join(f"{k} {v:.2f}"
                          for k, v in sorted(times.items(), key=lambda t: -t[1]))
        print(f"{name} M={m} {variant}: kernels {total:.2f} us per layer: {parts}",
              flush=True)


if __name__ == "__main__":
  main()
