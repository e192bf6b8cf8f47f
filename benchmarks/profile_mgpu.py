"""Where a decode layer's time goes: per-kernel device time (CUPTI, through
``jax.experimental.mosaic.gpu.profiler.measure``) of a chain of distinct layers, beside the
chain's wall-clock time per layer (shared/GPU.md).  The difference between the two is launch
gaps; the kernels other than the Mosaic one are the XLA glue (pad, slice, split-K sum).

  PYTHONPATH=. python3 benchmarks/profile_mgpu.py --ms 1,16 --configs default,split2,split4
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_dense import make_weights  # noqa: E402
from humming_jax.kernels import reference, tuning, wna16_mgpu  # noqa: E402


def parse_config(name: str, m: int) -> tuning.MgpuConfig:
  """'default' or comma-free tokens like 'wg4-split2-st6-sub2-opt' on top of the heuristic."""
  cfg = wna16_mgpu.heuristic(m)
  if name == "default":
    return cfg
  fields = {}
  for tok in name.split("-"):
    if tok.startswith("split"):
      fields["split_k"] = int(tok[5:])
    elif tok.startswith("st"):
      fields["stages"] = int(tok[2:])
    elif tok.startswith("wg"):
      fields["warpgroups"] = int(tok[2:])
    elif tok.startswith("sub"):
      fields["substeps"] = int(tok[3:])
    elif tok.startswith("bm"):
      fields["block_m"] = int(tok[2:])
    elif tok == "opt":
      fields["optimized_load"] = True
    else:
      raise ValueError(f"config token {tok!r}")
  return tuning.MgpuConfig(**{**cfg.__dict__, **fields})


def kernel_times(fn, args, iterations: int, layers: int) -> dict[str, float]:
  """Median over iterations of each kernel name's summed time, in us per layer."""
  _, per_iter = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
  if iterations == 1:
    per_iter = [per_iter]
  sums = collections.defaultdict(list)
  for timings in per_iter:
    acc = collections.Counter()
    for name, ms in timings:
      acc[name[:60]] += ms * 1e3 / layers
    for name, us in acc.items():
      sums[name].append(us)
  return {name: statistics.median(v) for name, v in sums.items()}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--configs", default="default,split2,split4")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--iterations", type=int, default=5)
  args = ap.parse_args()
  print("#", common.device_info(), flush=True)
  ws = make_weights(jax.random.key(0), args.layers, args.k, args.n)
  spec = hj.QuantSpec.preset(args.spec)
  qs = [jax.jit(hj.quantize, static_argnums=1)(w, spec) for w in ws]
  pm = [jax.jit(wna16_mgpu.prepare)(q) for q in qs]
  for m in map(int, args.ms.split(",")):
    x = jax.random.normal(jax.random.key(m), (m, args.k), jnp.bfloat16)
    ref = jax.jit(reference.dense_reference)(qs[0], x)
    for name in args.configs.split(","):
      try:
        cfg = parse_config(name, m)
        layer = lambda p, x, cfg=cfg: wna16_mgpu.run(p, x, config=cfg)
        err = common.rel_err(jax.jit(layer)(pm[0], x), ref)
        fn = jax.jit(lambda ps, x, layer=layer: common.chain(layer, ps, x))
        kt = kernel_times(fn, (pm, x), args.iterations, args.layers)
        wall = common.time_chain(layer, pm, x, calls=30, repeats=3)["us"]
        total = sum(kt.values())
        parts = ", ".join(f"{k}={v:.1f}" for k, v in sorted(kt.items(), key=lambda i: -i[1]))
        print(f"M={m} {name}: wall {wall:.1f} us/layer, kernels {total:.1f} ({parts}) "
              f"err={err:.1e}", flush=True)
      except Exception as e:  # noqa: BLE001 - report and go on
        print(f"M={m} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
  main()
