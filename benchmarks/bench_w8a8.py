"""W8A8 / W4A8 / W4A4 benchmark on the GPU (chain method of shared/GPU.md).

Per (spec, M) at 8192 x 8192 (default): humming_jax's w8a8 kernel (prepared params, the
activation quantization included in the timed call), and in the same run the baselines
XLA bf16 dot, XLA ``dot_general`` fp8 x fp8 and int8 x int8 on pre-quantized operands (the
GEMM alone, no quantization), the WnA16 kernel on the same 4-bit weights (the issue asks
W4A8 never to be slower than W4A16), and humming-kernels (CUDA graph) when importable.
Compile (first-call) time is reported separately.  Prints rows as it goes and a markdown
table at the end, writes JSON to $OUT (or benchmarks/results/).

  PYTHONPATH=. python3 benchmarks/bench_w8a8.py                        # full ladder
  PYTHONPATH=. python3 benchmarks/bench_w8a8.py --specs w8a8-fp8 --ms 16,4096 --sweep
  PYTHONPATH=. python3 benchmarks/bench_w8a8.py --act-quant-study      # fused vs pre-pass
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax.kernels import act_quant, tuning, w8a8, wna16_mgpu  # noqa: E402

SPECS = ("w8a8-int8,w8a8-fp8,w8a8-int8-static,w8a8-fp8-block,w8a8-mxfp8,w4a8-int8,"
         "w4a8-fp8,w4a8-mxfp4,w4a4-nvfp4,w4a4-mxfp4,w4a16-g128,w4a16-mxfp4")
STATIC = {
    "w8a8-int8-static": hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                                     act_granularity="tensor", act_static=True),
    "w8a8-fp8-static": hj.QuantSpec("fp8_e4m3", "channel", 0, scale_dtype="float32",
                                    act="fp8_e4m3", act_granularity="tensor",
                                    act_static=True),
}
_TOKEN_FP8 = dict(dtype="float8e4m3", quant_mode="dynamic_token")
_TOKEN_INT8 = dict(dtype="int8", quant_mode="dynamic_token")
HUMMING_CONFIGS = {  # our preset -> humming-kernels (weight_config, input_config)
    "w8a8-int8": (dict(dtype="int8", scale_dtype="bfloat16", group_size=0), _TOKEN_INT8),
    "w8a8-fp8": (dict(dtype="float8e4m3", scale_dtype="bfloat16", group_size=0), _TOKEN_FP8),
    "w4a8-int8": (dict(dtype="int4", scale_dtype="bfloat16", group_size=128), _TOKEN_INT8),
    "w4a8-fp8": (dict(dtype="int4", scale_dtype="bfloat16", group_size=128), _TOKEN_FP8),
    "w4a8-mxfp4": (dict(dtype="float4e2m1", scale_dtype="float8e8m0", group_size=32),
                   _TOKEN_FP8),
    "w4a16-g128": (dict(dtype="int4", scale_dtype="bfloat16", group_size=128), None),
    "w4a16-mxfp4": (dict(dtype="float4e2m1", scale_dtype="float8e8m0", group_size=32), None),
}


def spec_of(name):
  return STATIC[name] if name in STATIC else hj.QuantSpec.preset(name)


def make_weights(key, layers, k, n):
  keys = jax.random.split(key, layers)
  return [jax.random.normal(kk, (k, n), jnp.float32) / np.sqrt(k) for kk in keys]


def quantize_chain(name, ws, x):
  """Canonical + prepared params of every layer (static specs calibrate on x)."""
  spec = spec_of(name)
  s = (jnp.max(jnp.abs(x.astype(jnp.float32))) / spec.act_format.max_value
       if spec.act_static else None)
  quant = jax.jit(lambda w, s: hj.quantize(w, spec, act_scale=s))
  qs = [quant(w, s) for w in ws]
  return qs, [jax.jit(lambda q: hj.prepare(q, kernel="w8a8"))(q) for q in qs]  # this family


INTERPRET = False  # --interpret: a CPU smoke run of this script (tiny shapes)
KERNEL_TIMES = False  # --kernel-times: also CUPTI device time per layer, by kernel name


def layer_fn(spec, *, config=None, block_k=None, fuse=False, decode_mgpu=False,
             triton=False):
  if decode_mgpu:  # W8A8 int8 / fp8 on the Mosaic WnA16 kernel (w8a8.run_decode_mgpu)
    return lambda p, x: w8a8.run_decode_mgpu(p, x, interpret=INTERPRET, config=config)
  if triton:  # the Triton W8A8 kernel at decode: run's Mosaic decode route off
    def layer(p, x):
      saved, w8a8.DECODE_MGPU_MAX_M = w8a8.DECODE_MGPU_MAX_M, 0
      try:  # (read while tracing)
        return w8a8.run(p, x, interpret=INTERPRET)
      finally:
        w8a8.DECODE_MGPU_MAX_M = saved
    return layer
  if spec.act is None:
    return lambda p, x: hj.quant_dense(p, x, backend="interpret" if INTERPRET else "pallas")
  return lambda p, x: w8a8.run(p, x, config=config, block_k=block_k, fuse_act_quant=fuse,
                               interpret=INTERPRET)


def bench_point(qs, prepared, x, *, calls, repeats, check=True, **kw):
  spec = qs[0].spec
  m, k = x.shape
  n = qs[0].shape[1]
  layer = layer_fn(spec, **kw)
  res = {}
  res["compile_s"] = common.compile_time(layer, prepared[0], x)  # before any run of it
  if check:
    y = jax.jit(layer)(prepared[0], x)
    ref = jax.jit(lambda q, x: hj.quant_dense(q, x, backend="xla"))(qs[0], x)
    res["rel_err"] = common.rel_err(y, ref)
    res["nan"] = bool(jnp.isnan(y).any())
  # Each layer's x through its own barrier: with one shared x XLA runs the activation
  # quantization once per call, not per layer (common.unshared; session 17).
  xs = common.unshared(x)
  t = common.time_chain(layer, prepared, xs, calls=calls, repeats=repeats)
  res.update(t)
  if KERNEL_TIMES:  # the launch-free number: decode walls move with the host (NOTES.md v19)
    chained = jax.jit(lambda ps, x: common.chain(layer, ps, x))
    kt = common.kernel_times(chained, (prepared, xs), iterations=3, per=len(prepared))
    res["kernel_us"] = sum(kt.values())
    res["kernels"] = kt
  res["weight_bytes"] = qs[0].nbytes()
  res["tbps"] = res["weight_bytes"] / (t["us"] * 1e-6) / 1e12
  res["tflops"] = 2 * m * n * k / (t["us"] * 1e-6) / 1e12
  return res


def xla_baselines(ws, x, *, calls, repeats):
  """XLA bf16 dot; XLA dot_general fp8 x fp8 -> f32 and int8 x int8 -> int32 on operands
  quantized outside the timed call (the GEMM alone)."""
  out = {}
  wb = [w.astype(jnp.bfloat16) for w in ws]
  out["xla_bf16_us"] = common.time_chain(
      lambda w, x: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype),
      wb, x, calls=calls, repeats=repeats)["us"]
  w8 = [w.astype(jnp.float8_e4m3fn) for w in wb]
  x8 = x.astype(jnp.float8_e4m3fn)
  out["xla_fp8_us"] = common.time_chain(
      lambda w, x: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32
                                       ).astype(jnp.bfloat16),
      w8, x8, calls=calls, repeats=repeats)["us"]
  wi = [jnp.clip(jnp.round(w * 127 / jnp.max(jnp.abs(w))), -127, 127).astype(jnp.int8)
        for w in ws]
  xi = jnp.clip(jnp.round(x.astype(jnp.float32) * 30), -127, 127).astype(jnp.int8)
  out["xla_int8_us"] = common.time_chain(
      lambda w, x: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.int32
                                       ).astype(jnp.bfloat16),
      wi, xi, calls=calls, repeats=repeats)["us"]
  return out


def bench_humming(name, ws, m, *, calls, repeats):
  wcfg, icfg = HUMMING_CONFIGS[name]
  return common.time_humming_dense(wcfg, icfg, ws, m, calls=calls, repeats=repeats)


def sweep(qs, prepared, x, args):
  """A small grid of (TuningConfig, block_k) around the heuristic; [(cfg, us)] sorted."""
  m = x.shape[0]
  spec = qs[0].spec
  direct = w8a8.plan_for(spec).direct
  cands = []
  if m <= 64:
    for bn in (32, 64, 128):
      for split in (1, 2, 4, 8):
        for stages in (3, 4):
          for bk in ((128, 256, 512) if direct else (None,)):
            cands.append((tuning.TuningConfig(16 if m <= 16 else 64, bn, split, 4, stages),
                          bk))
  else:
    for bm, bn, warps in ((64, 128, 4), (128, 128, 4), (128, 128, 8), (64, 256, 8),
                          (128, 256, 8), (256, 128, 8)):
      for stages in (3, 4):
        for bk in ((64, 128, 256) if direct else (None,)):
          cands.append((tuning.TuningConfig(bm, bn, 1, warps, stages), bk))
  out = []
  for cfg, bk in cands:
    try:
      r = bench_point(qs, prepared, x, calls=max(args.calls // 2, 10), repeats=1,
                      check=False, config=cfg, block_k=bk)
      out.append(({**dataclasses.asdict(cfg), "block_k": bk}, round(r["us"], 2)))
    except Exception as e:  # noqa: BLE001 - a config the compiler refuses
      out.append(({**dataclasses.asdict(cfg), "block_k": bk}, type(e).__name__))
  out.sort(key=lambda t: t[1] if isinstance(t[1], float) else 1e9)
  print(f"   sweep best: {out[:3]}", flush=True)
  return out


def act_quant_study(ws, k, ms, args):
  """Pre-pass (XLA fusion) vs fused-in-prologue activation quantization, plus the
  pre-pass alone, for w8a8-fp8 (per token) and w8a8-int8-static (per tensor)."""
  rows = []
  for m in ms:
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    for name in ("w8a8-fp8", "w8a8-int8-static"):
      qs, prepared = quantize_chain(name, ws, x)
      spec = qs[0].spec
      row = {"spec": name, "M": m}
      for fuse in (False, True):
        r = bench_point(qs, prepared, x, calls=args.calls, repeats=args.repeats, fuse=fuse)
        row["fused_us" if fuse else "prepass_us"] = r["us"]
        row["fused_err" if fuse else "prepass_err"] = r["rel_err"]
      # Distinct inputs per chain link so XLA cannot merge the identical quantizations.
      xs = [(x * (1 + i / 64), q.act_scale) for i, q in enumerate(qs)]
      q_only = common.time_chain(
          lambda xi, _: act_quant.kernel_operand(xi[0], spec, xi[1], rows=xi[0].shape[0],
                                                 kp=xi[0].shape[1]).values,
          xs, x, calls=args.calls, repeats=args.repeats)
      row["act_quant_alone_us"] = q_only["us"]
      print(row, flush=True)
      rows.append(row)
  return rows


DECODE_SPECS = ("w8a8-int8", "w8a8-int8-static", "w8a8-fp8", "w8a8-fp8-static")
DECODE_SPECS_ENV = "BENCH_W8A8_DECODE_SPECS"  # a comma-separated subset (device calls)


def _prepass_variants(labels: str):
  """``decode_mgpu_s<S>[w<W>]`` labels: the decode route with its one-launch codes split
  over S programs per row (HUMMING_JAX_PREPASS_SPLITS), W warps each
  (HUMMING_JAX_PREPASS_WARPS); ``decode_mgpu_c<stages>x<substeps>x<warpgroups>``: the
  route on that Mosaic launch (explicit: its warpgroups are not lowered to fit)."""
  out = []
  for label in filter(None, labels.split(",")):
    cfg = re.fullmatch(r"decode_mgpu_c(\d+)x(\d+)x(\d+)", label)
    if cfg:  # the Mosaic launch: stages x substeps x warpgroups (the heuristic's others)
      base = wna16_mgpu.heuristic(1)
      config = dataclasses.replace(base, stages=int(cfg[1]), substeps=int(cfg[2]),
                                   warpgroups=int(cfg[3]))
      out.append((label, {"decode_mgpu": True, "config": config}, {}))
    env = common.prepass_variant_env(label.removeprefix("decode_mgpu_"))
    if env:
      out.append((label, {"decode_mgpu": True}, env))
    elif not cfg and label.startswith(("decode_mgpu_s", "decode_mgpu_c")):
      raise SystemExit(f"--decode-labels: {label!r} is neither decode_mgpu_s<S>[w<W>] nor "
                       f"decode_mgpu_c<stages>x<substeps>x<warpgroups>")
  return out


def decode_study(ws, k, ms, args):
  """W8A8 int8 / fp8 at decode: the Triton W8A8 kernel (what w8a8.run takes at small M),
  the same with the activation quantization inside it (fuse_act_quant), and
  w8a8.run_decode_mgpu (the Mosaic WnA16 kernel on the 8-bit codes, the scales in its
  epilogue) with its one-launch codes, with XLA's pre-pass, and with the codes as 16-bit
  operands (session 51's product)."""
  rows = []
  for m in ms:
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    for name in os.environ.get(DECODE_SPECS_ENV, ",".join(DECODE_SPECS)).split(","):
      qs, prepared = quantize_chain(name, ws, x)
      row = {"spec": name, "M": m}
      # "triton": w8a8.run with its decode route off (DECODE_MGPU_MAX_M = 0), whatever the
      # default; "decode_mgpu": the route itself
      for label, kw, env in (*_prepass_variants(args.decode_labels),
                             ("triton", {"triton": True}, {}),
                             ("triton_fused", {"fuse": True}, {}),
                             ("decode_mgpu", {"decode_mgpu": True}, {}),
                             # int8 / e4m3 x quantized inside the GEMM kernel / by the pre-pass
                             ("decode_mgpu_qx", {"decode_mgpu": True},
                              {"HUMMING_JAX_DECODE_QUANTIZE_X": "1"}),
                             ("decode_mgpu_pp", {"decode_mgpu": True},
                              {"HUMMING_JAX_DECODE_QUANTIZE_X": "0"}),
                             ("decode_mgpu_xla_prepass", {"decode_mgpu": True},
                              {"HUMMING_JAX_DECODE_PREPASS": "0"}),
                             # the codes as 16-bit operands (session 51's product)
                             ("decode_mgpu_16bit", {"decode_mgpu": True},
                              {"HUMMING_JAX_DECODE_MMA8": "0"})):
        if args.decode_labels and label not in args.decode_labels.split(","):
          continue
        saved = {v: os.environ.get(v) for v in env}
        os.environ.update(env)  # read at trace time (bench_point traces fresh functions)
        try:
          r = bench_point(qs, prepared, x, calls=args.calls, repeats=args.repeats, **kw)
          row[f"{label}_us"], row[f"{label}_err"] = r["us"], r["rel_err"]
          if "kernel_us" in r:  # --kernel-times: the launch-free number
            row[f"{label}_kernel_us"], row[f"{label}_kernels"] = r["kernel_us"], r["kernels"]
        except Exception as e:  # noqa: BLE001 - report and go on
          row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
          for v, old in saved.items():
            if old is None:
              os.environ.pop(v, None)
            else:
              os.environ[v] = old
      print(row, flush=True)
      rows.append(row)
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--specs", default=SPECS)
  ap.add_argument("--ms", default="1,16,128,1024,4096")
  ap.add_argument("--shape", default="8192x8192", help="KxN")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--calls", type=int, default=50)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--humming", action="store_true", help="also time humming-kernels")
  ap.add_argument("--no-baselines", action="store_true")
  ap.add_argument("--sweep", action="store_true", help="try a grid of configs per point")
  ap.add_argument("--act-quant-study", action="store_true",
                  help="only the fused-vs-pre-pass activation quantization measurement")
  ap.add_argument("--decode-study", action="store_true",
                  help="only W8A8 int8 / fp8 at decode: Triton kernel (pre-pass or fused "
                       "activation quantization) vs w8a8.run_decode_mgpu")
  ap.add_argument("--decode-labels", default="",
                  help="--decode-study: only these of triton, triton_fused, decode_mgpu, "
                       "decode_mgpu_xla_prepass, decode_mgpu_16bit (comma-separated; default all), "
                       "plus decode_mgpu_s<S>[w<W>] (pre-pass programs / warps per row) and "
                       "decode_mgpu_c<stages>x<substeps>x<warpgroups> (the Mosaic launch)")
  ap.add_argument("--json", default=None)
  ap.add_argument("--kernel-times", action="store_true",
                  help="also the CUPTI device time per layer of every kernel it launches")
  ap.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  global INTERPRET, KERNEL_TIMES
  INTERPRET = args.interpret
  KERNEL_TIMES = args.kernel_times

  info = common.device_info()
  print(f"# {info}", flush=True)
  k, n = (int(v) for v in args.shape.split("x"))
  ms = [int(v) for v in args.ms.split(",")]
  ws = make_weights(jax.random.key(0), args.layers, k, n)
  method = (f"chain of {args.layers} distinct {k}x{n} layers per jitted call, {args.calls} "
            f"calls, median of {args.repeats} repeats, wall clock / (calls*layers)")
  if args.act_quant_study:
    rows = act_quant_study(ws, k, ms, args)
    path = common.write_json(args.json or f"bench_w8a8_actquant_{int(time.time())}.json",
                             {"info": info, "method": method, "rows": rows})
    print(f"# wrote {path}")
    print("\n| spec | M | pre-pass µs | fused µs | act quant alone µs |\n|---|---|---|---|---|")
    for r in rows:
      print(f"| {r['spec']} | {r['M']} | {r['prepass_us']:.1f} | {r['fused_us']:.1f} | "
            f"{r['act_quant_alone_us']:.1f} |")
    return
  if args.decode_study:
    rows = decode_study(ws, k, ms, args)
    path = common.write_json(args.json or f"bench_w8a8_decode_{int(time.time())}.json",
                             {"info": info, "method": method, "rows": rows})
    print(f"# wrote {path}")
    return
  rows = []
  for m in ms:
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    base = {} if args.no_baselines else xla_baselines(ws, x, calls=args.calls,
                                                      repeats=args.repeats)
    print(f"# M={m} baselines {base}", flush=True)
    for name in args.specs.split(","):
      row = {"M": m, "K": k, "N": n, "spec": name, **base}
      try:
        qs, prepared = quantize_chain(name, ws, x)
        row.update(bench_point(qs, prepared, x, calls=args.calls, repeats=args.repeats))
        if args.sweep and qs[0].spec.act is not None:
          row["sweep"] = sweep(qs, prepared, x, args)
      except Exception as e:  # noqa: BLE001 - report and go on
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      if args.humming and name in HUMMING_CONFIGS and common.humming_available():
        try:
          h = bench_humming(name, ws, m, calls=args.calls, repeats=args.repeats)
          row["humming_us"], row["humming_first_s"] = h["us"], h["first_call_s"]
        except Exception as e:  # noqa: BLE001
          row["humming_error"] = f"{type(e).__name__}: {str(e)[:200]}"
      rows.append(row)
      print_row(row)
  path = common.write_json(args.json or f"bench_w8a8_{int(time.time())}.json",
                           {"info": info, "method": method, "rows": rows})
  print(f"# wrote {path}")
  print_table(rows)


def print_row(r):
  if "error" in r:
    print(f"M={r['M']:<5} {r['spec']:<18} ERROR {r['error']}", flush=True)
    return
  kern = f" kernels={r['kernel_us']:.1f}" if "kernel_us" in r else ""
  print(f"M={r['M']:<5} {r['spec']:<18} {r['us']:8.1f} us{kern} {r['tflops']:6.1f} TF/s "
        f"{r['tbps']:5.2f} TB/s err={r['rel_err']:.1e} compile={r['compile_s']:.2f}s "
        f"bf16={r.get('xla_bf16_us', float('nan')):.1f} fp8={r.get('xla_fp8_us', float('nan')):.1f} "
        f"int8={r.get('xla_int8_us', float('nan')):.1f} humming={r.get('humming_us')}",
        flush=True)


def print_table(rows):
  print("\n| M | spec | humming_jax µs | TFLOP/s | XLA bf16 | XLA fp8 dot | XLA int8 dot | "
        "Humming µs | vs bf16 | compile s | rel err |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  f = lambda v: "-" if v is None else f"{v:.1f}"
  for r in rows:
    if "error" in r:
      print(f"| {r['M']} | {r['spec']} | error: {r['error'][:80]} |")
      continue
    bf = r.get("xla_bf16_us")
    print(f"| {r['M']} | {r['spec']} | {r['us']:.1f} | {r['tflops']:.0f} | {f(bf)} | "
          f"{f(r.get('xla_fp8_us'))} | {f(r.get('xla_int8_us'))} | {f(r.get('humming_us'))} | "
          f"{'-' if not bf else f'{bf / r['us']:.2f}x'} | {r['compile_s']:.2f} | "
          f"{r['rel_err']:.1e} |")


if __name__ == "__main__":
  main()
