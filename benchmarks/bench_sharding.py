"""Tensor- and expert-parallel scaling of the quantized layers (chain method of GPU.md).

TP: a column-parallel up projection (K x N = 8192 x 28672) and a row-parallel down
projection (28672 x 8192) over tp = 1, 2, 4, 8 devices (as many as present); EP: a routed
MoE (E=256, top-8) with experts sharded over ep = 1, 2, 4, 8 devices (all_gather dispatch
for small token counts, all_to_all above ``--a2a-from``).  Specs W4A16 (w4a16-g128) and
W8A8-fp8 (w8a8-fp8), M = 1, 16, 1024, 4096 tokens.  Each point is a jitted chain of
``--layers`` layers with distinct weights, timed over many calls (median of repeats;
compile time separately), and checked against the 1-device result.  Prints a table and
writes JSON to $OUT or benchmarks/results/.

  PYTHONPATH=. python3 benchmarks/bench_sharding.py                  # all GPUs present
  PYTHONPATH=. python3 benchmarks/bench_sharding.py --only tp --ms 1,16
  PYTHONPATH=. python3 benchmarks/bench_sharding.py --smoke          # CPU, 8 host devices
"""
from __future__ import annotations

import argparse
import os
import sys

if "--smoke" in sys.argv and "xla_force_host_platform_device_count" not in os.environ.get(
    "XLA_FLAGS", ""):
  # Must precede the jax import: the host device count is fixed at backend start.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax import moe  # noqa: E402
from humming_jax import ops  # noqa: E402
from humming_jax import sharding as hs  # noqa: E402


def _mesh(d: int, name: str):
  return jax.make_mesh((d,), (name,), devices=jax.devices()[:d])


def _backend_name(spec, grouped=False) -> str:
  try:
    return ops.resolve_backend(None, spec, grouped=grouped)
  except ValueError:
    return "?"


def _quantize_chain(key, layers, shape, spec, bias=False):
  quant = jax.jit(hj.quantize, static_argnums=1)
  out = []
  for kk in jax.random.split(key, layers):
    w = jax.random.normal(kk, shape, jnp.float32) / np.sqrt(shape[-2])
    q = quant(w, spec)
    if bias:
      q = q.replace(bias=jnp.zeros(shape[:-2] + shape[-1:], jnp.float32))
    out.append(q)
  return out


def bench_tp(args, devs, rows):
  key = jax.random.key(0)
  for spec_name in args.specs.split(","):
    spec = hj.QuantSpec.preset(spec_name)
    for kind, (k, n) in (("column", args.up), ("row", args.down)):
      key, kw = jax.random.split(key)
      qs = _quantize_chain(kw, args.layers, (k, n), spec)
      for m in args.ms:
        x = jax.random.normal(jax.random.fold_in(key, m), (m, k), jnp.float32).astype(
            jnp.bfloat16)
        base = None
        for d in devs:
          if d == 1:
            layer = lambda p, xx: hj.quant_dense(p, xx)  # noqa: E731
            params = qs
          else:
            mesh = _mesh(d, "tp")
            fspec = P(None, "tp") if kind == "column" else P("tp", None)
            try:
              params = [hs.shard_params(q, fspec, mesh) for q in qs]
            except ValueError as e:  # misaligned for this device count
              print(f"skip {spec_name} {kind} tp={d}: {e}")
              continue
            if kind == "column":
              layer = (lambda mesh: lambda p, xx: hs.column_parallel_dense(
                  p, xx, axis="tp", mesh=mesh))(mesh)
            else:  # bf16 partials: the kernels' bf16 path (exact fp32 partials: --exact)
              pd = jnp.float32 if args.exact else None
              layer = (lambda mesh: lambda p, xx: hs.row_parallel_dense(
                  p, xx, axis="tp", mesh=mesh, partial_dtype=pd))(mesh)
          y = jax.device_get(jax.jit(layer)(params[0], x))
          err = 0.0 if base is None else common.rel_err(y, base)
          base = y if base is None else base
          # Each layer's x through its own barrier: no work merged across the layers
          # (common.unshared; NOTES.md v19).
          t = common.time_chain(layer, params, common.unshared(x), calls=args.calls,
                                repeats=args.repeats)
          nbytes = qs[0].nbytes()
          rows.append(dict(bench="tp", kind=kind, spec=spec_name, K=k, N=n, M=m, devices=d,
                           backend=_backend_name(spec), us=t["us"], us_min=t["us_min"],
                           us_max=t["us_max"], first_call_s=t["first_call_s"],
                           tbps_total=nbytes / (t["us"] * 1e-6) / 1e12, rel_err_vs_1=err))
          _print_row(rows[-1])


def bench_ep(args, devs, rows):
  key = jax.random.key(1)
  e, h, i, topk = args.experts, args.hidden, args.inter, args.topk
  for spec_name in args.specs.split(","):
    spec = hj.QuantSpec.preset(spec_name)
    key, k1, k2 = jax.random.split(key, 3)
    layers = max(1, args.moe_layers)
    gus = _quantize_chain(k1, layers, (e, h, 2 * i), spec)
    dns = _quantize_chain(k2, layers, (e, i, h), spec)
    pairs = list(zip(gus, dns))
    for m in args.ms:
      kx, kl = jax.random.split(jax.random.fold_in(key, m))
      x = jax.random.normal(kx, (m, h), jnp.float32).astype(jnp.bfloat16)
      w, ids = moe.topk_routing(jax.random.normal(kl, (m, e)), topk)
      base = None
      for d in devs:
        if d == 1:
          layer = lambda p, a: moe.quant_moe(p[0], p[1], *a)  # noqa: E731
          params = pairs
          disp = "-"
        else:
          mesh = _mesh(d, "ep")
          disp = "all_to_all" if (m >= args.a2a_from and m % d == 0) else "all_gather"
          espec = P("ep", None, None)
          params = [(hs.shard_params(g, espec, mesh), hs.shard_params(dn, espec, mesh))
                    for g, dn in pairs]
          layer = (lambda mesh, disp: lambda p, a: hs.expert_parallel_moe(
              p[0], p[1], *a, axis="ep", mesh=mesh, dispatch=disp))(mesh, disp)
        y = jax.device_get(jax.jit(layer)(params[0], (x, w, ids)))
        err = 0.0 if base is None else common.rel_err(y, base)
        base = y if base is None else base
        # The tokens and their routing through each layer's own barrier (common.unshared):
        # no routing or quantization merged across the layers.
        t = common.time_chain(layer, params, common.unshared((x, w, ids)), calls=args.calls,
                              repeats=args.repeats)
        rows.append(dict(bench="ep", kind=disp, spec=spec_name, E=e, H=h, I=i, topk=topk,
                         M=m, devices=d, backend=_backend_name(spec, grouped=True),
                         us=t["us"], us_min=t["us_min"], us_max=t["us_max"],
                         first_call_s=t["first_call_s"], rel_err_vs_1=err))
        _print_row(rows[-1])


HEADER = (f"{'bench':<5} {'kind':<10} {'spec':<10} {'shape':<22} {'M':>5} {'dev':>3} "
          f"{'backend':<9} {'us/layer':>10} {'speedup':>8} {'TB/s tot':>9} {'rel_err':>9} "
          f"{'compile s':>9}")
_BASE: dict = {}


def _print_row(r):
  shape = (f"{r['K']}x{r['N']}" if r["bench"] == "tp"
           else f"E{r['E']} H{r['H']} I{r['I']} k{r['topk']}")
  key = (r["bench"], r["spec"], shape, r["M"], r["kind"] if r["bench"] == "tp" else "")
  if r["devices"] == 1:
    _BASE[key] = r["us"]
  speed = _BASE.get(key, float("nan")) / r["us"]
  r["speedup_vs_1"] = speed
  tb = f"{r['tbps_total']:9.2f}" if "tbps_total" in r else f"{'':>9}"
  print(f"{r['bench']:<5} {r['kind']:<10} {r['spec']:<10} {shape:<22} {r['M']:>5} "
        f"{r['devices']:>3} {r['backend']:<9} {r['us']:>10.1f} {speed:>8.2f} {tb} "
        f"{r['rel_err_vs_1']:>9.2e} {r['first_call_s']:>9.1f}", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--specs", default="w4a16-g128,w8a8-fp8")
  ap.add_argument("--ms", default="1,16,1024,4096")
  ap.add_argument("--devices", default="1,2,4,8", help="device counts to try (<= present)")
  ap.add_argument("--only", choices=("tp", "ep"), default=None)
  ap.add_argument("--up", default="8192x28672", help="column-parallel K x N")
  ap.add_argument("--down", default="28672x8192", help="row-parallel K x N")
  ap.add_argument("--experts", type=int, default=256)
  ap.add_argument("--topk", type=int, default=8)
  ap.add_argument("--hidden", type=int, default=2048)
  ap.add_argument("--inter", type=int, default=1024)
  ap.add_argument("--a2a-from", type=int, default=1024,
                  help="EP uses all_to_all dispatch from this many tokens on")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--moe-layers", type=int, default=4)
  ap.add_argument("--calls", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--exact", action="store_true",
                  help="row-parallel with fp32 partials (exact, kernels compute in fp32)")
  ap.add_argument("--json", default="bench_sharding.json")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny shapes, 8 host CPU devices: checks the script runs")
  args = ap.parse_args(argv)
  if args.smoke:
    args.ms, args.up, args.down = "1,16", "256x512", "1024x256"
    args.experts, args.topk, args.hidden, args.inter = 16, 2, 256, 128
    args.layers, args.moe_layers, args.calls, args.repeats = 2, 1, 2, 1
    args.a2a_from = 16
    if "OUT" not in os.environ:  # keep smoke output out of benchmarks/results
      import tempfile
      os.environ["OUT"] = tempfile.gettempdir()
  args.ms = [int(v) for v in str(args.ms).split(",")]
  args.up = tuple(int(v) for v in args.up.split("x"))
  args.down = tuple(int(v) for v in args.down.split("x"))
  present = len(jax.devices())
  devs = [d for d in (int(v) for v in args.devices.split(",")) if d <= present]
  info = common.device_info()
  info["num_devices"] = present
  print(f"# {info}", flush=True)
  print(HEADER)
  rows: list[dict] = []
  if args.only in (None, "tp"):
    bench_tp(args, devs, rows)
  if args.only in (None, "ep"):
    bench_ep(args, devs, rows)
  bad = [r for r in rows if not r["rel_err_vs_1"] <= 1e-2]
  path = common.write_json(args.json, {"info": info, "args": {k: str(v) for k, v in
                                                               vars(args).items()},
                                       "rows": rows})
  print(f"# wrote {path}")
  if bad:
    print(f"# {len(bad)} points differ from the 1-device result by > 1e-2 (rel)")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
