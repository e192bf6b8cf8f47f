"""Where a decode layer's time goes: per-kernel device time (CUPTI, through
``jax.experimental.mosaic.gpu.profiler.measure``) of a chain of distinct layers, beside the
chain's wall-clock time per layer (shared/GPU.md).  The difference between the two is launch
gaps; the kernels other than the Mosaic one are the XLA glue (pad, slice, split-K sum).

  PYTHONPATH=. python3 benchmarks/profile_mgpu.py --ms 1,16 --configs default,wg1,split4
  PYTHONPATH=. python3 benchmarks/profile_mgpu.py --overhead   # per-launch cost, tiny layers

``--overhead``: the same two numbers for a chain of 32 tiny (512 x 512, M = 1) layers on the
Mosaic kernel, the Pallas-Triton kernel and an XLA bf16 dot: there the kernels take ~2 us,
so wall - kernels per layer is what a launch costs (NOTES.md v5: Mosaic GPU encodes its
TMA descriptors on the host at every launch).
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_dense import make_weights  # noqa: E402
from humming_jax.kernels import reference, tuning, wna16_mgpu  # noqa: E402


def parse_config(name: str, m: int, base: tuning.MgpuConfig | None = None
                 ) -> tuning.MgpuConfig | None:
  """'default' (None: run() picks and adapts the heuristic, as quant_dense does) or
  comma-free tokens like 'wg4-split2-st6-sub2-opt' on top of ``base`` (default: the dense
  heuristic for M = ``m``; explicit: run checks it as given)."""
  cfg = base or wna16_mgpu.heuristic(m)
  if name == "default":
    return None
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
    elif tok.startswith("cb"):  # column blocks per CTA, streamed through one pipeline
      fields["column_blocks"] = int(tok[2:])
    elif tok.startswith("bm"):
      fields["block_m"] = int(tok[2:])
    elif tok == "opt":
      fields["optimized_load"] = True
    elif tok == "after":
      fields["scale_after_mma"] = True
    elif tok == "acc":  # every K tile straight into the WGMMA accumulator
      fields["scale_after_mma"] = False
    elif tok == "xn":  # warpgroups split N over one shared x tile
      fields["split_warpgroups"] = "n"
    elif tok == "xk":  # warpgroups split K (each its own x tile)
      fields["split_warpgroups"] = "k"
    elif tok == "zmma":
      fields["zero_point_mma"] = True
    elif tok == "unpad":
      fields["unpadded_rows"] = True
    elif tok == "ptx":  # int4 codes and zero point through one PTX block per pair
      fields["int4_ptx"] = True
    elif tok == "noptx":  # Mosaic's int4 conversion (the default before session 11)
      fields["int4_ptx"] = False
    elif tok == "ovl":  # each K tile's WGMMA waited for after the next tile's dequant
      fields["overlap_mma"] = True
    elif tok == "noovl":  # (with acc: the decode default's overlap needs scale_after_mma)
      fields["overlap_mma"] = False
    elif tok == "ms":  # the decode product on mma.sync (kernels/mgpu_mma.py)
      fields["mma_sync"] = True
    elif tok == "noms":  # ... on the register-A WGMMA (a default's launch of before)
      fields["mma_sync"] = False
    elif tok.startswith("ch"):  # mma.sync accumulator chains per 8 rows
      fields["mma_chains"] = int(tok[2:])
    elif tok == "whole":
      fields["fp4_whole_registers"] = True
    else:
      raise ValueError(f"config token {tok!r}")
  return tuning.MgpuConfig(**{**cfg.__dict__, **fields})


def spec_from_arg(name: str) -> hj.QuantSpec:
  """A preset name, or ``<weight format>-g<group>[-zp]`` (e.g. ``uint4-g256-zp``: the
  Mosaic kernel's K tile is the group from 64 up, so g256 int4 tiles are 128-byte rows)."""
  if name in hj.PRESETS:
    return hj.QuantSpec.preset(name)
  fmt, group, *rest = name.split("-")
  if not group.startswith("g") or rest not in ([], ["zp"]):
    raise ValueError(f"--spec {name!r}: a preset or <format>-g<group>[-zp]")
  return hj.QuantSpec(fmt, "group", int(group[1:]), zero_point=rest == ["zp"])


def overhead(layers: int = 32, size: int = 512, iterations: int = 5,
             only: tuple[str, ...] = ("mosaic", "triton", "xla")) -> None:
  from humming_jax.kernels import wna16  # noqa: PLC0415 - only this mode needs it
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  ws = make_weights(jax.random.key(1), layers, size, size)
  qs = [jax.jit(hj.quantize, static_argnums=1)(w, spec) for w in ws]
  x = jax.random.normal(jax.random.key(2), (1, size), jnp.bfloat16)
  cases = {
      "mosaic wna16_mgpu": (wna16_mgpu.run, [jax.jit(wna16_mgpu.prepare)(q) for q in qs]),
      "triton wna16": (wna16.run, [jax.jit(wna16.prepare)(q) for q in qs]),
      "xla bf16 dot": (lambda w, x: x @ w, [w.astype(jnp.bfloat16) for w in ws]),
  }
  for name, (layer, params) in cases.items():
    if name.split()[0] not in only:
      continue
    fn = jax.jit(lambda ps, x, layer=layer: common.chain(layer, ps, x))
    kt = common.kernel_times(fn, (params, x), iterations=iterations, per=layers)
    wall = common.time_chain(layer, params, x, calls=30, repeats=3)["us"]
    print(f"overhead {name}: wall {wall:.1f} us/layer, kernels {sum(kt.values()):.1f} "
          f"({', '.join(f'{k}={v:.1f}' for k, v in kt.items())})", flush=True)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--overhead", action="store_true", help="per-launch cost (tiny layers)")
  ap.add_argument("--overhead-cases", default="mosaic,triton,xla")
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--ms", default="1,16")
  ap.add_argument("--configs", default="default,split2,split4")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--shapes", default=None,
                  help="KxN list, e.g. 14336x4096,4096x6144 (overrides --k / --n)")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--iterations", type=int, default=5)
  args = ap.parse_args()
  print("#", common.device_info(), flush=True)
  if args.overhead:
    overhead(only=tuple(args.overhead_cases.split(",")))
    return
  shapes = ([tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes
            else [(args.k, args.n)])
  for k, n in shapes:
    print(f"# K={k} N={n} {args.spec}", flush=True)
    profile_shape(args, k, n)


def profile_shape(args, k: int, n: int) -> None:
  ws = make_weights(jax.random.key(0), args.layers, k, n)
  spec = spec_from_arg(args.spec)
  qs = [jax.jit(hj.quantize, static_argnums=1)(w, spec) for w in ws]
  pm = [jax.jit(wna16_mgpu.prepare)(q) for q in qs]
  for m in map(int, args.ms.split(",")):
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    ref = jax.jit(reference.dense_reference)(qs[0], x)
    for name in args.configs.split(","):
      try:
        cfg = parse_config(name, m)
        layer = lambda p, x, cfg=cfg: wna16_mgpu.run(p, x, config=cfg)
        err = common.rel_err(jax.jit(layer)(pm[0], x), ref)
        fn = jax.jit(lambda ps, x, layer=layer: common.chain(layer, ps, x))
        kt = common.kernel_times(fn, (pm, x), iterations=args.iterations, per=args.layers)
        wall = common.time_chain(layer, pm, x, calls=20, repeats=2)["us"]
        total = sum(kt.values())
        parts = ", ".join(f"{k}={v:.1f}" for k, v in sorted(kt.items(), key=lambda i: -i[1]))
        print(f"M={m} {name}: wall {wall:.1f} us/layer, kernels {total:.1f} ({parts}) "
              f"err={err:.1e}", flush=True)
      except Exception as e:  # noqa: BLE001 - report and go on
        print(f"M={m} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
  main()
