"""Dense quantized GEMM benchmark on the GPU (chain method of shared/GPU.md).

For each (shape, spec, M): humming_jax (Pallas kernel, prepared params), and in the same run
the baselines XLA bf16 dot, XLA dequant (to bf16) + dot, and humming-kernels (CUDA graph)
when importable.  Prints a table, writes JSON (and a PNG roofline plot with --plot) to
$OUT or benchmarks/results/.

  PYTHONPATH=. python3 benchmarks/bench_dense.py                       # default sweep
  PYTHONPATH=. python3 benchmarks/bench_dense.py --specs w4a16-g128 --ms 1,16 --shapes 8192x8192
"""
from __future__ import annotations

import argparse
import json
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax.kernels import registry, tuning  # noqa: E402

HBM_TBPS = 4.3  # bf16 GEMV read rate measured on the H200 (GPU.md)
# Other cards' roofs (spec sheet, not measured here): the plot's line follows the device.
HBM_TBPS_BY_DEVICE = {"H100": (3.35, "H100 spec 3.35 TB/s")}
PEAK_TFLOPS = 800.0

SHAPES = {  # name: (K, N)
    "8192x8192": (8192, 8192),
    "llama3-8b-qkv": (4096, 6144),
    "llama3-8b-o": (4096, 4096),
    "llama3-8b-gate_up": (4096, 28672),
    "llama3-8b-down": (14336, 4096),
}

# Our preset -> humming-kernels weight/input config (GPU.md).
CHAIN = "outputs"  # --chain: common.CHAINS key

HUMMING_CONFIGS = {
    "w4a16-g128-zp": (dict(dtype="uint4", scale_dtype="bfloat16", group_size=128,
                           has_zero_point=True), None),
    "w4a16-mxfp4": (dict(dtype="float4e2m1", scale_dtype="float8e8m0", group_size=32), None),
    "w4a16-nvfp4": (dict(dtype="float4e2m1", scale_dtype="float8e4m3", group_size=16,
                         scale_2_type="tensor"), None),
    "w8a16": (dict(dtype="uint8", scale_dtype="bfloat16", group_size=0), None),
    "w4a8-mxfp4": (dict(dtype="float4e2m1", scale_dtype="float8e8m0", group_size=32),
                   dict(dtype="float8e4m3", quant_mode="dynamic_token")),
}


def weight_bytes(p) -> int:
  return p.nbytes()  # codes + scales + zeros + global scale, as stored


def make_weights(key, layers: int, k: int, n: int):
  keys = jax.random.split(key, layers)
  return [jax.random.normal(kk, (k, n), jnp.float32) / np.sqrt(k) for kk in keys]


_QUANT_CACHE: dict = {}


def quantized_layers(spec_name, ws):
  """Quantize + prepare the chain's weights once per (spec, weight set)."""
  key = (spec_name, id(ws))
  if key not in _QUANT_CACHE:
    _QUANT_CACHE.clear()  # one weight set at a time: keep device memory bounded
    name, _, family = spec_name.partition("@")  # <preset>@<kernel family>: hj.prepare's
    spec = common.spec_arg(name)  # (family: hj.prepare's kernel= choice)
    quant = jax.jit(hj.quantize, static_argnums=1)
    qs = [quant(w, spec) for w in ws]
    prep = jax.jit(lambda q: hj.prepare(q, kernel=family or None))
    _QUANT_CACHE[key] = (qs, [prep(q) for q in qs])
  return _QUANT_CACHE[key]


KERNEL_TIMES = False  # --kernel-times: also CUPTI device time per layer
SPAN = False  # --span: also the device time per layer of the resident chain


def bench_point(spec_name, k, n, m, ws, x, *, calls, repeats, check=True, config=None):
  qs, prepared = quantized_layers(spec_name, ws)
  kernel = registry.by_layout(prepared[0].layout)
  layer = (lambda p, x: kernel.run(p, x, config=config)) if config else \
      (lambda p, x: hj.quant_dense(p, x, backend="pallas"))
  res = {}
  x0 = common.first_input(x)
  res["compile_s"] = common.compile_time(layer, prepared[0], x0)  # before any run of it
  if check:
    y = jax.jit(layer)(prepared[0], x0)
    ref = hj.quant_dense(qs[0], x0, backend="xla")
    res["rel_err"] = common.rel_err(y, ref)
    res["nan"] = bool(jnp.isnan(y).any())
  span = {"span": True} if SPAN and CHAIN == "resident" else {}
  t = common.CHAINS[CHAIN](layer, prepared, x, calls=calls, repeats=repeats, **span)
  res.update(t)
  if KERNEL_TIMES:  # the launch-free number: chain walls move with the host (NOTES.md v11)
    chained = jax.jit(lambda ps, x: common.chain(layer, ps, x))
    kt = common.kernel_times(chained, (prepared, x), iterations=3, per=len(prepared))
    res["kernel_us"] = sum(kt.values())
    res["kernels"] = kt
  nbytes = weight_bytes(qs[0])
  res["weight_bytes"] = nbytes
  res["tbps"] = nbytes / (t["us"] * 1e-6) / 1e12
  if res.get("kernel_us"):  # the effective rate by device time (issue 3's A16 formats)
    res["kernel_tbps"] = nbytes / (res["kernel_us"] * 1e-6) / 1e12
  res["tflops"] = 2 * m * n * k / (t["us"] * 1e-6) / 1e12
  return res, qs


def bench_xla_baselines(ws, qs, x, *, calls, repeats):
  wb = [w.astype(jnp.bfloat16) for w in ws]
  bf16 = common.CHAINS[CHAIN](lambda w, x: jnp.dot(x, w, preferred_element_type=jnp.float32
                                                   ).astype(x.dtype), wb, x,
                              calls=calls, repeats=repeats)
  deq = common.CHAINS[CHAIN](
      lambda q, x: jnp.dot(x, hj.dequantize(q).astype(jnp.bfloat16),
                           preferred_element_type=jnp.float32).astype(x.dtype),
      qs, x, calls=calls, repeats=repeats)
  # What `x @ w` gives a JAX user: the GEMM writes bf16 itself (no float32 product and
  # convert; at M = 4096 cuBLAS leaves that convert as a separate kernel, NOTES.md v13).
  direct = common.CHAINS[CHAIN](lambda w, x: x @ w, wb, x, calls=calls, repeats=repeats)
  return bf16, deq, direct


def bench_humming(spec_name, ws, m, *, calls, repeats):
  wcfg, icfg = HUMMING_CONFIGS[spec_name]
  return common.time_humming_dense(wcfg, icfg, ws, m, calls=calls, repeats=repeats)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--specs", default="w4a16-g128,w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4")
  ap.add_argument("--ms", default="1,16,128,1024,4096")
  ap.add_argument("--shapes", default="8192x8192")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--chain", choices=sorted(common.CHAINS), default="outputs",
                  help="outputs: every layer on the same x, all outputs returned (GPU.md); "
                       "sequential: x -> layer_1 -> ... with a donated state, as in a model "
                       "(square shapes only; Humming stays a CUDA graph of the same layers)")
  ap.add_argument("--xla-prepass", action="store_true",
                  help="also time each per-token W8A8 / W4A8 spec at prefill with "
                       "w8a8.FUSED_PREPASS off: XLA's two pre-pass fusions instead of the "
                       "one-pass kernel (rows '<spec>+xla-prepass')")
  common.add_chain_flags(ap, "x buffer")
  ap.add_argument("--calls", type=int, default=50)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--humming", action="store_true", help="also time humming-kernels")
  ap.add_argument("--no-baselines", action="store_true")
  ap.add_argument("--sweep", action="store_true",
                  help="try a small grid of TuningConfigs per point and report the best")
  ap.add_argument("--kernel-times", action="store_true",
                  help="also the CUPTI device time per layer of every kernel it launches")
  ap.add_argument("--no-mx-fold", action="store_true",
                  help="MXFP4 x fp8 prefill on the bf16 route, not folded onto the "
                       "per-channel fp8 GEMM (wnam_mgpu.MX_FOLD_PREFILL, on by default)")
  ap.add_argument("--json", default=None)
  ap.add_argument("--plot", action="store_true")
  ap.add_argument("--plot-from", default=None, metavar="JSON[,JSON...]",
                  help="no benchmark: plot saved runs (e.g. on a CPU machine with matplotlib)")
  args = ap.parse_args(argv)
  if args.no_mx_fold:
    from humming_jax.kernels import wnam_mgpu  # noqa: PLC0415
    wnam_mgpu.MX_FOLD_PREFILL = False
  if args.plot_from:
    paths = args.plot_from.split(",")
    payloads = [json.load(open(p_)) for p_ in paths]
    device = payloads[0].get("info", {}).get("device", "?")
    for shape in sorted({r["shape"] for d in payloads for r in d["rows"]}):
      plot([r for d in payloads for r in d["rows"]], paths[0].replace(".json", f"_{shape}.png"),
           shape=shape, device=device)
    return

  global CHAIN, KERNEL_TIMES, SPAN
  CHAIN = args.chain
  SPAN = args.span
  KERNEL_TIMES = args.kernel_times
  info = common.device_info()
  print(f"# {info}", flush=True)
  ms = [int(v) for v in args.ms.split(",")]
  rows = []
  key = jax.random.key(0)
  for shape_name in args.shapes.split(","):
    k, n = SHAPES.get(shape_name) or tuple(int(v) for v in shape_name.split("x"))
    key, kw, kx = jax.random.split(key, 3)
    ws = make_weights(kw, args.layers, k, n)
    for m in ms:
      x = jax.random.normal(kx, (m, k), jnp.bfloat16)
      if not args.shared_x:
        x = common.unshared(x)
      base = {}
      for spec_name in args.specs.split(","):
        row = {"shape": shape_name, "K": k, "N": n, "M": m, "spec": spec_name}
        try:
          res, qs = bench_point(spec_name, k, n, m, ws, x, calls=args.calls,
                                repeats=args.repeats)
          row.update(res)
          if args.sweep:
            row["sweep"] = sweep(spec_name, k, n, m, ws, x, args)
        except Exception as e:  # noqa: BLE001 - report and go on with the sweep
          row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
          qs = None
        if not args.no_baselines and qs is not None and not base:
          bf16, deq, direct = bench_xla_baselines(ws, qs, x, calls=args.calls,
                                                  repeats=args.repeats)
          base = {"xla_bf16_us": bf16["us"], "xla_deq_us": deq["us"],
                  "xla_bf16_direct_us": direct["us"], "xla_deq_spec": spec_name}
        row.update({kk: v for kk, v in base.items() if kk != "xla_deq_spec"})
        if args.humming and spec_name in HUMMING_CONFIGS and common.humming_available():
          try:
            h = bench_humming(spec_name, ws, m, calls=args.calls, repeats=args.repeats)
            row["humming_us"] = h["us"]
            row["humming_first_s"] = h["first_call_s"]
          except Exception as e:  # noqa: BLE001
            row["humming_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print_row(row, flush=True)
        if args.xla_prepass and prepass_kernel_applies(spec_name, m):
          rows.append(xla_prepass_row(spec_name, k, n, m, ws, x, args, shape_name))
          print_row(rows[-1], flush=True)
  payload = {"info": info, "method": "%s chain of %d distinct layers per jitted call (%s), "
             "%d calls, median of %d repeats, wall clock / (calls*layers)" % (
                 args.chain, args.layers, "one shared x" if args.shared_x else
                 "each layer's x through its own barrier", args.calls, args.repeats),
             "rows": rows}
  path = common.write_json(args.json or f"bench_dense_{int(time.time())}.json", payload)
  print(f"# wrote {path}")
  print_table(rows)
  if args.plot:
    for shape_name in args.shapes.split(","):
      plot(rows, str(path).replace(".json", f"_{shape_name}.png"), shape=shape_name,
           device=info["device"])


def prepass_kernel_applies(spec_name: str, m: int) -> bool:
  """The spec's prefill pre-pass can take the one-pass kernel at this M (so an
  ``+xla-prepass`` row differs from the default)."""
  from humming_jax.kernels import act_prepass, w8a8  # noqa: PLC0415
  spec = common.spec_arg(spec_name.partition("@")[0])
  return act_prepass.supports(spec) and m >= w8a8.FUSED_PREPASS_MIN_M


def xla_prepass_row(spec_name, k, n, m, ws, x, args, shape_name) -> dict:
  """The same point with w8a8.FUSED_PREPASS off (XLA's amax and convert fusions in place
  of the one-pass Pallas-Triton pre-pass), as the row ``<spec>+xla-prepass``."""
  from humming_jax.kernels import w8a8  # noqa: PLC0415
  row = {"shape": shape_name, "K": k, "N": n, "M": m, "spec": spec_name + "+xla-prepass"}
  fused, w8a8.FUSED_PREPASS = w8a8.FUSED_PREPASS, False
  try:
    res, _ = bench_point(spec_name, k, n, m, ws, x, calls=args.calls, repeats=args.repeats)
    row.update(res)
  except Exception as e:  # noqa: BLE001 - reported in the row
    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
  finally:
    w8a8.FUSED_PREPASS = fused
  return row


def sweep(spec_name, k, n, m, ws, x, args):
  """Time a few TuningConfigs around the heuristic; returns [(config, us)] sorted."""
  cands = tuning.wna16_candidates(m)
  out = []
  for cfg in cands:
    try:
      res, _ = bench_point(spec_name, k, n, m, ws, x, calls=max(args.calls // 2, 10),
                           repeats=1, check=False, config=cfg)
      out.append((dataclasses.asdict(cfg), round(res["us"], 2)))
    except Exception as e:  # noqa: BLE001
      out.append((dataclasses.asdict(cfg), f"{type(e).__name__}"))
  out.sort(key=lambda t: t[1] if isinstance(t[1], float) else 1e9)
  print(f"   sweep best: {out[:3]}", flush=True)
  return out


def print_row(r, flush=False):
  if "error" in r:
    print(f"{r['shape']:<18} M={r['M']:<5} {r['spec']:<16} ERROR {r['error']}", flush=flush)
    return
  h = r.get("humming_us")
  kern = f"kernels={r['kernel_us']:.1f}  " if "kernel_us" in r else ""
  kern += f"({r['kernel_tbps']:.2f} TB/s)  " if "kernel_tbps" in r else ""
  kern += f"span={r['span_us']:.1f}  " if "span_us" in r else ""
  print(f"{r['shape']:<18} M={r['M']:<5} {r['spec']:<16} {r['us']:8.1f} us  {kern}"
        f"{r['tbps']:5.2f} TB/s {r['tflops']:6.1f} TF/s  err={r.get('rel_err', 0):.1e}  "
        f"compile={r['compile_s']:.2f}s  bf16={r.get('xla_bf16_us', float('nan')):.1f}  "
        f"deq={r.get('xla_deq_us', float('nan')):.1f}  "
        f"x@w={r.get('xla_bf16_direct_us', float('nan')):.1f}  humming="
        f"{h if h is None else round(h, 1)}", flush=flush)


def print_table(rows):
  print("\n| shape | M | spec | humming_jax µs | TB/s | XLA bf16 µs | XLA x@w µs | "
        "XLA deq+dot µs | Humming µs | vs bf16 | vs Humming | compile s | rel err |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['shape']} | {r['M']} | {r['spec']} | error: {r['error'][:60]} |")
      continue
    bf = r.get("xla_bf16_us")
    h = r.get("humming_us")
    vs_bf = f"{bf / r['us']:.2f}x" if bf else "-"
    vs_h = f"{h / r['us']:.2f}x" if h else "-"
    print(f"| {r['shape']} | {r['M']} | {r['spec']} | {r['us']:.1f} | {r['tbps']:.2f} | "
          f"{bf or float('nan'):.1f} | {r.get('xla_bf16_direct_us', float('nan')):.1f} | "
          f"{r.get('xla_deq_us', float('nan')):.1f} | "
          f"{'-' if h is None else f'{h:.1f}'} | {vs_bf} | {vs_h} | {r['compile_s']:.2f} | "
          f"{r.get('rel_err', float('nan')):.1e} |")


def plot(rows, path, *, shape: str = "8192x8192", device: str | None = None):
  """µs per layer, effective weight TB/s and TFLOP/s against M for one shape: every spec,
  with the same run's XLA bf16 and Humming times (dashed) and the HBM / bf16 roofs."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("# matplotlib missing: no plot (plot later with --plot-from the JSON)")
    return
  rows = [r for r in rows if r["shape"] == shape and "error" not in r]
  if not rows:
    return
  fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(16, 4.5))
  for spec in sorted({r["spec"] for r in rows}):
    rs = sorted((r for r in rows if r["spec"] == spec), key=lambda r: r["M"])
    line, = a0.plot([r["M"] for r in rs], [r["us"] for r in rs], "o-", label=spec)
    hs = [r for r in rs if r.get("humming_us")]
    if hs:
      a0.plot([r["M"] for r in hs], [r["humming_us"] for r in hs], "x--",
              color=line.get_color(), label=f"Humming {spec}")
    a1.plot([r["M"] for r in rs], [r["tbps"] for r in rs], "o-", label=spec)
    a2.plot([r["M"] for r in rs], [r["tflops"] for r in rs], "o-", label=spec)
  bf = {r["M"]: r["xla_bf16_us"] for r in rows if r.get("xla_bf16_us")}
  if bf:
    a0.plot(sorted(bf), [bf[m] for m in sorted(bf)], "k:", label="XLA bf16")
  roof, label = next((v for k, v in HBM_TBPS_BY_DEVICE.items() if k in (device or "")),
                     (HBM_TBPS, f"HBM {HBM_TBPS} TB/s (H200, measured)"))
  a1.axhline(roof, color="k", ls="--", label=label)
  a2.axhline(PEAK_TFLOPS, color="k", ls="--", label="bf16 peak ~800 TF/s")
  for a, t in ((a0, "µs per layer"), (a1, "effective weight TB/s"), (a2, "TFLOP/s")):
    a.set_xscale("log", base=2)
    a.set_xlabel("M (tokens)")
    a.set_ylabel(t)
    a.grid(alpha=.3)
    a.legend(fontsize=7)
  a0.set_yscale("log")
  device = device or common.device_info()["device"]
  fig.suptitle(f"humming_jax dense {shape} on {device}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  print(f"# wrote {path}")

if __name__ == "__main__":
  main()
