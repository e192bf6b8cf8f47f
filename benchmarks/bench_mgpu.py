"""Mosaic GPU WnA16 kernel (kernels/wna16_mgpu.py) vs the Pallas-Triton kernel (wna16.py),
XLA bf16 and humming-kernels, chain method of shared/GPU.md, one run.  Config sweep over
(block_m, stages); every point is checked against the XLA reference.

  PYTHONPATH=. python3 benchmarks/bench_mgpu.py --specs w4a16-g128-zp --ms 1,16,4096
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_dense import HUMMING_CONFIGS, make_weights  # noqa: E402
from humming_jax.kernels import reference, tuning, wna16, wna16_mgpu  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-g128,w8a16")  # w8a16: runs()
  ap.add_argument("--ms", default="1,16,128,1024,4096")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--calls", type=int, default=30)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--humming", action="store_true")
  args = ap.parse_args()
  print("#", common.device_info(), flush=True)
  k, n = args.k, args.n
  ws = make_weights(jax.random.key(0), args.layers, k, n)
  rows = []
  for name in args.specs.split(","):
    qs = [jax.jit(hj.quantize, static_argnums=1)(w, hj.QuantSpec.preset(name)) for w in ws]
    pm = [jax.jit(wna16_mgpu.prepare)(q) for q in qs]
    pt = [jax.jit(wna16.prepare)(q) for q in qs]
    for m in map(int, args.ms.split(",")):
      x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
      ref = jax.jit(reference.dense_reference)(qs[0], x)
      row = {"spec": name, "m": m}
      try:
        row["triton_us"] = common.time_chain(wna16.run, pt, x, calls=args.calls,
                                             repeats=args.repeats)["us"]
      except Exception as e:  # noqa: BLE001 - report and go on
        row["triton_error"] = str(e)[:200]
      row["bf16_us"] = common.time_chain(lambda w, x: x @ w, [w.astype(jnp.bfloat16) for w in ws],
                                         x, calls=args.calls, repeats=args.repeats)["us"]
      best = None
      for cfg in tuning.mgpu_candidates(m):
        try:
          fn = lambda p, x, cfg=cfg: wna16_mgpu.run(p, x, config=cfg)
          y = jax.jit(fn)(pm[0], x)
          err = common.rel_err(y, ref)
          t = common.time_chain(fn, pm, x, calls=args.calls, repeats=args.repeats)
          print(f"  {name} M={m} {cfg}: {t['us']:.1f} us err={err:.1e} "
                f"first={t['first_call_s']:.2f}s", flush=True)
          if best is None or t["us"] < best[0]:
            best = (t["us"], str(cfg), err)
        except Exception as e:  # noqa: BLE001
          print(f"  {name} M={m} {cfg}: FAILED {type(e).__name__}: "
                f"{str(e).splitlines()[0][:300] if str(e) else ''}", flush=True)
          if best is None:
            traceback.print_exc(limit=3)
      if best:
        row.update(mgpu_us=best[0], mgpu_cfg=best[1], mgpu_err=best[2])
      if args.humming and name in HUMMING_CONFIGS and m <= 16 and common.humming_available():
        try:
          wc, ic = HUMMING_CONFIGS[name]
          row["humming_us"] = common.time_humming_dense(wc, ic, ws, m, calls=args.calls,
                                                        repeats=args.repeats)["us"]
        except Exception as e:  # noqa: BLE001
          row["humming_error"] = str(e)[:200]
      print(json.dumps(row), flush=True)
      rows.append(row)
  out = os.environ.get("OUT", "benchmarks/results")
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "bench_mgpu.json"), "w") as f:
    json.dump({"device": common.device_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
