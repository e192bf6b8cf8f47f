"""Device time (CUPTI) of the Mosaic GPU W8A8 kernel (kernels/w8a8_mgpu.py) per config at
large M, beside the XLA bf16 GEMM of the same shape, and the activation pre-pass.

  PYTHONPATH=. python3 benchmarks/profile_w8a8_mgpu.py --ms 1024,4096 \
      --configs default,n64,st3,w4,w16,minor_m

Config tokens on top of the heuristic: ``n64`` (tile_n 64), ``m64`` (tile_m 64), ``stN``
(stages), ``wN`` (snake tile width), ``minor_m`` (snake walks M fastest), ``pairs`` /
``nopairs`` (K-group specs: two groups per step or one, Config.group_pairs), ``rowe`` /
``rowk`` (K-group specs: the per-token scale in the epilogue, the default, or on each
group's promotion), ``sm`` / ``sn`` (warpgroups side by side along M or N,
Config.split_m), ``nowaves`` (64-row warpgroup tiles with pairs: int8's default before
session 16), ``waves`` (K-group specs: 128-row warpgroup tiles in two 64-row waves,
Config.group_waves), ``wfirst``
(4-bit weights: the per-call unpack transposes packed words first).  Each line: per
kernel name, the median of ``--iterations`` profiled calls of a chain of ``--layers``
distinct layers, per layer (the 8192^2 int8 weights are 64 MB: no L2 reuse across layers).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax.kernels import reference, w8a8, w8a8_mgpu  # noqa: E402


def parse_config(name: str, m: int, n: int, grouped: bool, k: int,
                 int8: bool = False) -> w8a8_mgpu.Config:
  toks = name.split("-")
  # nowaves: the heuristic's tiles for fp8 operands (64-row warpgroup tiles, pairs)
  cfg = w8a8_mgpu.heuristic(m, n, grouped, k, int8=int8 and "nowaves" not in toks)
  if name == "default":
    return cfg
  fields = {}
  for tok in toks:
    if tok == "n64":
      fields["tile_n"] = 64
    elif tok == "m64":
      fields["tile_m"] = 64
    elif tok.startswith("st"):
      fields["stages"] = int(tok[2:])
    elif tok == "wfirst":
      fields["unpack_words_first"] = True
    elif tok == "waves":  # K-group specs: 128 rows per warpgroup in two 64-row waves
      fields.update(tile_m=128, group_waves=True, group_pairs=False)
    elif tok == "nowaves":  # K-group specs: int8's tiles before session 16 (see above)
      pass
    elif tok.startswith("w"):
      fields["grid_tile_width"] = int(tok[1:])
    elif tok == "minor_m":
      fields["grid_minor_n"] = False
    elif tok == "pairs":
      fields["group_pairs"] = True
    elif tok == "nopairs":
      fields["group_pairs"] = False
    elif tok == "rowe":  # K-group specs: the per-token scale in the epilogue (default)
      fields["epilogue_row_scale"] = True
    elif tok == "rowk":  # ... or on every K group's promotion (before session 13)
      fields["epilogue_row_scale"] = False
    elif tok == "sm":  # the two warpgroups side by side along M (Config.split_m)
      fields["split_m"] = True
    elif tok == "sn":  # ... along N (CTA tile_m x 2 * tile_n: 64-wide halves if N needs)
      fields["split_m"] = False
      if n % 256:
        fields["tile_n"] = 64
    else:
      raise ValueError(f"config token {tok!r}")
  return dataclasses.replace(cfg, **fields)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--specs", default="w8a8-int8,w8a8-fp8,w8a8-fp8-block,w4a8-int8,w4a8-fp8")
  ap.add_argument("--ms", default="4096")
  ap.add_argument("--configs", default="default")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--iterations", type=int, default=5)
  args = ap.parse_args()
  print("#", common.device_info())
  ws = [jax.random.normal(jax.random.key(i), (args.k, args.n), jnp.float32) / args.k ** 0.5
        for i in range(args.layers)]
  for m in map(int, args.ms.split(",")):
    x = jax.random.normal(jax.random.key(99), (m, args.k), jnp.bfloat16)
    wb = [w.astype(jnp.bfloat16) for w in ws]
    bf16 = common.kernel_times(lambda ws, x: [x @ w for w in ws], (wb, x),
                               iterations=args.iterations, per=args.layers)
    print(f"M={m} xla_bf16: kernels {sum(bf16.values()):.1f} us/layer")
    del wb
    for name in args.specs.split(","):
      spec = hj.QuantSpec.preset(name)
      ps = [jax.jit(lambda w: hj.prepare(hj.quantize(w, spec), kernel="w8a8"))(w) for w in ws]
      for cname in args.configs.split(","):
        plan = w8a8.plan_for(spec)
        dims = w8a8.kernel_dims(ps[0], plan)
        cfg = parse_config(cname, m, dims[3], bool(plan.pg), dims[2],
                           int8=w8a8._carrier(spec) == jnp.int8)
        fn = jax.jit(lambda ps, x, cfg=cfg: [w8a8.run_mgpu(p, x, config=cfg) for p in ps])
        try:
          kt = common.kernel_times(fn, (ps, x), iterations=args.iterations, per=args.layers)
        except Exception as e:  # a config Mosaic refuses: say so, go on
          print(f"M={m} {name} {cname}: ERROR {type(e).__name__}: {str(e)[:200]}")
          continue
        y = fn(ps, x)[0]
        err = common.rel_err(y, reference.dense_reference(
            jax.jit(lambda w: hj.quantize(w, spec))(ws[0]), x))
        flops = 2 * m * args.n * args.k
        main_us = max(kt.values())
        parts = ", ".join(f"{k}={v:.1f}" for k, v in sorted(kt.items(), key=lambda i: -i[1]))
        print(f"M={m} {name} {cname}: kernels {sum(kt.values()):.1f} us/layer "
              f"({parts}) gemm {flops / main_us / 1e6:.0f} TF/s err={err:.1e}")


if __name__ == "__main__":
  main()
