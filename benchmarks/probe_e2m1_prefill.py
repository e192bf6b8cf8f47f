"""W4A8 MXFP4 x fp8 prefill: the 8-bit GEMM converting the codes itself against the per-call
unpack (session 60).  CUPTI kernel time per 8192^2 layer (8 distinct layers per jitted
call, their sum / 8) of ``hj.quant_dense`` for three forms of the same weights, one
process:

  pk:        the default layout (":pk"), the MXFP4 fold's Pallas unpack + 8-bit GEMM;
  p8:        the fp8-MMA layout (":p8:cf", HUMMING_JAX_DENSE_FP8_MMA=1 and
             HUMMING_JAX_E2M1_MMA=1 at prepare), the
             same unpack (HUMMING_JAX_E2M1_MMA=0);
  p8-e2m1:   the same params, the codes converted inside the GEMM (HUMMING_JAX_E2M1_MMA=1,
             wnam_mgpu.run_prefill_e2m1_mma), each step's conversion beside the previous
             step's WGMMA (w8a8_mgpu.Config.e2m1_overlap, session 62), 256 x 128 CTA tiles
             whose warpgroups share one converted B tile (w8a8_mgpu.e2m1_heuristic), three
             pipeline stages (HUMMING_JAX_E2M1_STAGES4=0: session 62's calls 3-5);
  p8-e2m1-st4: the shared form with one output staging tile per warpgroup and four
             pipeline stages (HUMMING_JAX_E2M1_STAGES4=1, session 62 call 10), with
             Pallas' automatic barriers (session 63's default);
  p8-e2m1-own: the overlap, 128 x 256 CTA tiles, each warpgroup converting its own
             (HUMMING_JAX_E2M1_SHARED=0);
  p8-e2m1-serial: neither (HUMMING_JAX_E2M1_OVERLAP=0: sessions 60-61);
  p8-e2m1-f12 / -nab / -f12-nab (session 64): the four-stage shared form with
             E2M1Weights' fold_shift 12 (HUMMING_JAX_E2M1_FOLD12=1: no select per table
             word), without Pallas' automatic warpgroup barriers
             (HUMMING_JAX_E2M1_AUTO_BARRIERS=0: the default since session 64), or both
             (every in-GEMM form reads the bfloat16 scale exponents as stored since
             session 64, and all but -own / -serial (which keep the barriers) with
             AUTO_BARRIERS=1 have them);
  p8-e2m1-cv (session 66): the converter warpgroup (HUMMING_JAX_E2M1_CONVERTER=1: a
             third warpgroup converts, the two MMA warpgroups only issue WGMMAs; four
             stages, no automatic barriers; HUMMING_JAX_E2M1_REGS, _BTILES and
             _CONVERTERS for its register counts, B tiles and converter warpgroups);

each output against the reference (relative error) and p8-e2m1 against p8 (max |diff|);
``--humming``: humming-kernels' W4A8 MXFP4 x fp8 of the same float weights, CUDA graph
wall per layer, same process.

  PYTHONPATH=. python3 benchmarks/probe_e2m1_prefill.py --ms 1024,4096 --humming
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
from humming_jax.kernels import reference  # noqa: E402

LAYERS = 8
# (fp8 layout, in-GEMM conversion, its overlap, the shared B tile, four stages,
#  fold_shift 12, Pallas' automatic barriers, the converter warpgroup)
ENV = ("DENSE_FP8_MMA", "E2M1_MMA", "E2M1_OVERLAP", "E2M1_SHARED", "E2M1_STAGES4",
       "E2M1_FOLD12", "E2M1_AUTO_BARRIERS", "E2M1_CONVERTER")
FORMS = {"pk": "00110010", "p8": "10110010", "p8-e2m1": "11110010",
         "p8-e2m1-st4": "11111010", "p8-e2m1-own": "11100010", "p8-e2m1-serial": "11000010",
         "p8-e2m1-f12": "11111110", "p8-e2m1-nab": "11111000", "p8-e2m1-f12-nab": "11111100",
         "p8-e2m1-cv": "11111001"}
IN_GEMM = [f for f in FORMS if FORMS[f][1] == "1"]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ms", default="1024,4096")
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--forms", default=",".join(FORMS))
  ap.add_argument("--humming", action="store_true")
  args = ap.parse_args()
  print("#", common.device_info(), flush=True)
  spec = hj.QuantSpec.preset("w4a8-mxfp4")
  keys = jax.random.split(jax.random.key(0), LAYERS)
  ws = [jax.random.normal(kk, (args.k, args.n), jnp.float32) / 90 for kk in keys]
  qs = [jax.jit(hj.quantize, static_argnums=1)(w, spec) for w in ws]
  params = {}
  os.environ["HUMMING_JAX_E2M1_MMA"] = "1"  # prepare marks ":cf" only with the route on
  for form in args.forms.split(","):
    os.environ["HUMMING_JAX_DENSE_FP8_MMA"] = FORMS[form][0]
    params[form] = [hj.prepare(q) for q in qs]  # eager: ":cf" needs concrete scales
    print(f"{form}: layout {params[form][0].layout}", flush=True)
  ref = jax.jit(reference.dense_reference)
  for m in map(int, args.ms.split(",")):
    xs = [jax.random.normal(jax.random.key(m + i), (m, args.k), jnp.bfloat16)
          for i in range(LAYERS)]
    want = ref(qs[0], xs[0])
    outs = {}
    for form in args.forms.split(","):
      for name, flag in zip(ENV[1:], FORMS[form][1:]):
        os.environ[f"HUMMING_JAX_{name}"] = flag
      ps = params[form]
      fn = jax.jit(lambda ps, xs: [hj.quant_dense(p, x) for p, x in zip(ps, xs)])
      outs[form] = jax.block_until_ready(fn(ps, xs))[0]
      times = common.kernel_times(fn, (ps, xs), per=LAYERS)
      total = sum(times.values())
      parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(times.items(), key=lambda t: -t[1]))
      print(f"M={m} {form}: kernels {total:.2f} us per layer, rel err "
            f"{common.rel_err(outs[form], want):.2e}: {parts}", flush=True)
    for form in IN_GEMM:
      if "p8" in outs and form in outs:
        d = jnp.max(jnp.abs(outs["p8"].astype(jnp.float32) - outs[form].astype(jnp.float32)))
        print(f"M={m} {form} vs p8: max |diff| {float(d):.3e}", flush=True)
    if args.humming and common.humming_available():
      from bench_w8a8 import HUMMING_CONFIGS  # noqa: PLC0415
      wcfg, icfg = HUMMING_CONFIGS["w4a8-mxfp4"]
      h = common.time_humming_dense(wcfg, icfg, ws, m, calls=20, repeats=2)
      print(f"M={m} humming W4A8 MXFP4: {h['us']:.1f} us per layer (CUDA graph wall)",
            flush=True)


if __name__ == "__main__":
  main()
