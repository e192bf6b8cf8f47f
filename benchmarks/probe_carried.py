"""Carried formats against the Pallas-Triton kernel: CUPTI kernel time per 8192^2 layer.

Issue 3 asks the lowering per kernel by measurement and ">= 2.2 TB/s effective" for every
A16 format at M <= 16.  For each format: 8 distinct quantized layers, prepared for the
Pallas-Triton ``wna16`` family (packed bits) and for the Mosaic ``wna16_mgpu`` family
(codes in a 4- / 8-bit carrier, ``wna16_mgpu.carried``), each M's 8-layer chain timed by
CUPTI (``common.kernel_times``: device time summed over the layer's kernels, median of 3).
Effective TB/s = canonical bytes (codes + scales + zeros) over kernel time.  Correctness
is the GPU tests' (``test_carried_formats_gpu``); this only times.  Timestamps per point,
so a cut run still says where the time went.

  PYTHONPATH=. python3 benchmarks/probe_carried.py --formats int3:g128,fp6_e3m2:g128 --ms 1,16
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
from benchmarks import common  # noqa: E402

FAMILIES = ("wna16", "wna16_mgpu")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--formats", default="int2:g128,int3:g128,uint3:g128:zp,int5:g128")
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--size", type=int, default=8192)
  ap.add_argument("--families", default=",".join(FAMILIES),
                  help="kernel families to time, of " + ", ".join(FAMILIES))
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  families = args.families.split(",")
  if unknown := set(families) - set(FAMILIES):
    raise SystemExit(f"--families: unknown {sorted(unknown)}; expected some of {FAMILIES}")
  t0 = time.perf_counter()
  print(f"# {common.device_info()}", flush=True)
  k = n = args.size
  ws = jax.jit(lambda key: jax.random.normal(key, (args.layers, k, n)) / k ** 0.5)(
      jax.random.key(0))
  ms = [int(v) for v in args.ms.split(",")]
  xs = {m: common.unshared(jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16))
        for m in ms}
  rows = []
  for name in args.formats.split(","):
    spec = common.spec_arg(name)
    quant = jax.jit(lambda w: hj.quantize(w, spec))
    qs = [quant(ws[i]) for i in range(args.layers)]
    nbytes = qs[0].nbytes()  # canonical: the format's packed bits + scales + zeros
    for family in families:
      row = {"spec": name, "family": family, "bytes": nbytes}
      try:
        prep = jax.jit(lambda q: hj.prepare(q, kernel=family))
        ps = [prep(q) for q in qs]
        row["prepared_bytes"] = ps[0].nbytes()
        for m in ms:
          chained = jax.jit(lambda ps, x: common.chain(
              lambda p, x: hj.quant_dense(p, x, backend="pallas"), ps, x))
          us = sum(common.kernel_times(chained, (ps, xs[m]), iterations=3,
                                       per=len(ps)).values())
          row[f"m{m}_us"] = us
          row[f"m{m}_tbps"] = nbytes / (us * 1e-6) / 1e12
          print(f"+{time.perf_counter() - t0:6.1f}s {name:<18} {family:<11} M={m:<3} "
                f"{us:6.2f} us  {row[f'm{m}_tbps']:.2f} TB/s  (prepared "
                f"{row['prepared_bytes'] / 2**20:.1f} MiB, canonical {nbytes / 2**20:.1f})",
                flush=True)
        del ps
      except Exception as e:  # noqa: BLE001 - report and go on
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"+{time.perf_counter() - t0:6.1f}s {name} {family} ERROR {row['error']}",
              flush=True)
      rows.append(row)
    del qs
  if args.json:
    common.write_json(args.json, {"info": common.device_info(), "rows": rows,
                                  "method": "CUPTI kernel time per layer, chain of "
                                  f"{args.layers} distinct {k}x{n} layers, median of 3"})


if __name__ == "__main__":
  main()
