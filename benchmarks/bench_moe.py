"""MoE grouped GEMM benchmark on the GPU (chain method of shared/GPU.md).

For each (shape, tokens): random top-k routing, rows sorted by expert; one call applies the
grouped GEMM to ``--layers`` distinct weight sets (each set is >= 100 MB, far past the 60 MB
L2; default 8 -- at decode a chain of 2 measured the call's host cost, not the GEMM: the
same 17.3 us kernel timed 47.7 us per layer in a chain of 2 and 19.2 in a chain of 8);
microseconds per grouped GEMM.  Methods, in the same run:
  hj:<spec>        hj.quant_ragged_dot, Pallas grouped kernel, params prepared once per
                   shape outside the timed call; TB/s = active experts' bytes / time;
                   (the default family for the shape: Mosaic for K >= 256
                   since session 34, 768 / 2048 / 4096 before; Pallas-Triton below;
                   W4A8 / W4A4 specs: grouped_wnam_mgpu);
                   ``<spec>@mgpu`` / ``<spec>@triton``: params prepared for that
                   family (``hj.prepare(..., kernel=)``)
  hj_kernels:<spec>  (--breakdown) device time per kernel name (a profiler trace), us per layer
  ragged_bf16      lax.ragged_dot on bf16 weights (XLA expands it densely: OOM is caught)
  deq_ragged       XLA dequantize (to bf16) + lax.ragged_dot
  hj_xla:<spec>    hj's XLA fallback (--xla-path; tiled gather + dequant)
  humming:<spec>   humming-kernels grouped_contiguous GEMM in a CUDA graph (--humming)
Prints a table, writes JSON to $OUT or benchmarks/results/.

  PYTHONPATH=. python3 benchmarks/bench_moe.py                      # full sweep
  PYTHONPATH=. python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens 1,4096
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax import moe  # noqa: E402
from humming_jax.quantize import array_bytes  # noqa: E402

SHAPES = {  # name: (E, top-k, N, K) of one grouped GEMM
    "deepseek-v3-gate_up": (256, 8, 512, 7168),
    "deepseek-v3-down": (256, 8, 7168, 256),
    "qwen3-30b-a3b-gate_up": (128, 8, 1536, 2048),
    "qwen3-30b-a3b-down": (128, 8, 2048, 768),
    "mixtral-gate_up": (8, 2, 28672, 4096),
    "mixtral-down": (8, 2, 4096, 14336),
}

HUMMING_CONFIGS = {  # our preset -> humming-kernels weight/input config (GPU.md)
    "w4a16-g128-zp": (dict(dtype="uint4", scale_dtype="bfloat16", group_size=128,
                           has_zero_point=True), None),
    "w4a16-mxfp4": (dict(dtype="float4e2m1", scale_dtype="float8e8m0", group_size=32), None),
    "w4a8-mxfp4": (dict(dtype="float4e2m1", scale_dtype="float8e8m0", group_size=32),
                   dict(dtype="float8e4m3", quant_mode="dynamic_token")),
}


def routing(key, tokens: int, e: int, topk: int):
  """Random top-k (distinct experts per token) -> (token_of_row, group sizes)."""
  ids = jnp.argsort(jax.random.uniform(key, (tokens, e)), axis=1)[:, :topk].astype(jnp.int32)
  r = moe.sort_tokens(ids, e)
  return r.token_of_row, r.group_sizes


def make_sets(key, layers: int, e: int, k: int, n: int):
  keys = jax.random.split(key, layers)
  gen = jax.jit(lambda kk: (jax.random.normal(kk, (e, k, n), jnp.float32)
                            / np.sqrt(k)).astype(jnp.bfloat16))
  return [gen(kk) for kk in keys]


def _safe(fn):
  """Run a timing; an error (OOM, missing kernel) becomes a short string in the table."""
  try:
    return fn()
  except Exception as ex:  # noqa: BLE001 - reported, not hidden
    msg = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
    # Triton's "Shared memory size limit exceeded" is also RESOURCE_EXHAUSTED: a kernel
    # config that does not compile, not device memory (the 2026-11-29 Mixtral "OOM").
    if "Shared memory size limit exceeded" in str(ex):
      msg = "SMEM: " + msg
    elif "RESOURCE_EXHAUSTED" in str(ex) or "out of memory" in str(ex).lower():
      msg = "OOM"
    return {"error": msg[:160]}


FAMILIES = {"mgpu": "grouped_wna16_mgpu", "triton": "grouped_wna16",  # <spec>@<family>
            "mgpu-xn": "grouped_wna16_mgpu",  # ... with four warpgroups sharing x tiles
            "wnam": "grouped_wnam_mgpu",  # W4A8 / W8A8 specs on the Mosaic WnA16 kernel
            "w8a8": "grouped_w8a8"}  # ... on the Pallas-Triton grouped W8A8 kernel
# <spec>@mgpu:<tokens>: the Mosaic grouped kernel with profile_mgpu.py's config tokens on
# top of grouped_wna16_mgpu.heuristic's launch for the default tile rows, e.g.
# w4a16-g128-zp@mgpu:wg2-xn or @mgpu:split2; rows<R> sets the tile rows (@mgpu:rows16).


def family_of(spec_name: str) -> str | None:
  """The kernel family of ``<spec>[@<family>[:<config tokens>]]`` (None: hj.prepare's)."""
  family, colon, _ = spec_name.partition("@")[2].partition(":")
  if family and family not in FAMILIES:
    raise ValueError(f"spec {spec_name!r}: unknown kernel family {family!r} (expected one "
                     f"of {sorted(FAMILIES)}, or mgpu:<config tokens>)")
  if colon and family != "mgpu":
    raise ValueError(f"spec {spec_name!r}: config tokens go with @mgpu only (the Mosaic "
                     f"grouped kernel); got @{family}")
  return FAMILIES.get(family)


def ragged_dot_fn(spec_name):
  """The timed call: ``hj.quant_ragged_dot``, or for ``@mgpu-xn`` / ``@mgpu:<tokens>`` the
  Mosaic grouped kernel with an explicit launch config (``@mgpu-xn``: four warpgroups
  splitting N over one shared x tile, MgpuConfig.split_warpgroups="n")."""
  family, _, tokens = spec_name.partition("@")[2].partition(":")
  if family != "mgpu-xn" and not tokens:
    return lambda p, xg: hj.quant_ragged_dot(p, xg[0], xg[1], backend="pallas")
  from benchmarks.profile_mgpu import parse_config  # noqa: PLC0415
  from humming_jax.kernels import grouped_wna16_mgpu as gm, wna16_mgpu  # noqa: PLC0415

  toks = tokens.split("-") if tokens else []
  # rows<R>: tiles of R rows, with the launch the heuristic picks for the default tile rows
  tile_rows = next((int(t[4:]) for t in toks if t.startswith("rows")), None)
  tokens = "-".join(t for t in toks if not t.startswith("rows"))

  def run(p, xg):
    m, e = xg[0].shape[0], p.shape[0]
    block_m = tile_rows or gm.tile_rows(m, e, p)  # (the rows gm.run takes by default)
    rows = gm.launch_rows(m, e, block_m)
    if family == "mgpu-xn":
      cfg = wna16_mgpu.shared_x_config(rows)
    else:  # the launch gm.run's heuristic picks, as the base of the tokens
      base = gm.default_launch(m, p, block_m)
      cfg = parse_config(tokens, rows, base=base) if tokens else base
    return gm.run(p, xg[0], xg[1], config=cfg, block_m=block_m)
  return run


def quantize_sets(spec_name, ws):
  """(canonical, prepared) params per weight set: done once per shape, never timed."""
  family = family_of(spec_name)
  key = (spec_name.partition("@")[0], family)  # @mgpu:<tokens> variants share the params
  held = _SETS.get(key)
  if held is None or held[0] is not ws:  # (the weights are held: no stale id matches)
    spec = hj.QuantSpec.preset(key[0])
    quant = jax.jit(hj.quantize, static_argnums=1)
    qs = [quant(w, spec) for w in ws]
    # eager, as a user prepares once: the fp8-MMA layout's ":cf" check (one-accumulator
    # tiles, wna16_mgpu.mark_column_fold) needs concrete scales
    prep = functools.partial(hj.prepare, grouped=True, kernel=family)
    _SETS[key] = (ws, (qs, [jax.block_until_ready(prep(q)) for q in qs]))
  return _SETS[key][1]


_SETS: dict = {}
CHAIN = ("outputs",)  # --chain: common.CHAINS keys for our layers (the first is "us")
SPAN = False  # --span: also the device time per layer of the resident chain
CONSUME = "sum"  # --consume: what the resident chain reads of each output


def active_bytes(pp, group_sizes) -> int:
  """Bytes the kernel must read per call: the prepared arrays of the active experts
  (padding included).  ``nbytes()`` of the params counts *all* E experts: the 2026-11-29
  "1.37 TB/s" at 1 token was 245 MB of all 256 DeepSeek experts over 179 µs, not traffic."""
  e = pp.shape[0]
  # array_bytes: the Mosaic layout's jnp.int4 codes are half a byte each (itemsize says 1;
  # before 2026-11-30 session 13 this column was 2x for those layouts).
  per_expert = sum(array_bytes(a) for a in jax.tree.leaves(pp)) // e
  return per_expert * int((np.asarray(group_sizes) > 0).sum())


def bench_hj(spec_name, sets, xg, *, calls, repeats, check):
  qs, pps = sets
  layer = ragged_dot_fn(spec_name)
  res = {}
  xg0 = common.first_input(xg)
  res["compile_s"] = common.compile_time(layer, pps[0], xg0)  # before any run of it
  if check:
    y = jax.jit(layer)(pps[0], xg0)
    ref = jax.jit(moe.ragged_dot_xla)(qs[0], *xg0)
    res["rel_err"] = common.rel_err(y, ref)
    total = int(xg0[1].sum())
    res["tail_zero"] = bool((y[total:] == 0).all())
  resident_kw = lambda chain, span: ({"span": span, "consume": CONSUME}
                                     if chain == "resident" else {})
  res.update(common.CHAINS[CHAIN[0]](layer, pps, xg, calls=calls, repeats=repeats,
                                     **resident_kw(CHAIN[0], SPAN)))
  for other in CHAIN[1:]:  # the same layers chained another way, same process
    res[f"{other}_us"] = common.CHAINS[other](layer, pps, xg, calls=calls, repeats=repeats,
                                              **resident_kw(other, False))["us"]
  res["weight_bytes_all_experts"] = qs[0].nbytes()
  res["weight_bytes"] = active_bytes(pps[0], xg0[1])
  res["tbps"] = res["weight_bytes"] / (res["us"] * 1e-6) / 1e12  # active experts only
  return res, qs


def bench_breakdown(spec_name, pps, xg):
  """Where one grouped GEMM's time goes: the device time of every kernel of the resident
  chain with ``--consume``'s consumer (a jax.profiler trace, as ``--span``), per layer,
  whatever ``--chain`` times.  (CUPTI through Mosaic's profiler aborted with "activity
  records were dropped" on this chain, H200 sessions 34 and 36; before CUPTI the schedule
  was timed in a jit of its own, which measured that call's dispatch, not a component:
  NOTES_moe.md session 2.)"""
  f = jax.jit(common.resident_program(ragged_dot_fn(spec_name), CONSUME), donate_argnums=2)
  held = [jax.block_until_ready(f(pps, xg, jnp.zeros((), jnp.float32)))]

  def step():
    held[0] = f(pps, xg, held[0])
    return held[0]
  times = common.per_kernel_us(common.traced_calls(step), len(pps))
  return {name: round(us, 2) for name, us in times.items()}


def bench_hj_xla(qs, xg, *, calls, repeats):
  return common.time_chain(lambda q, xg: moe.ragged_dot_xla(q, xg[0], xg[1]), qs, xg,
                           calls=calls, repeats=repeats)


def bench_ragged_bf16(ws, xg, *, calls, repeats):
  return common.time_chain(lambda w, xg: jax.lax.ragged_dot(xg[0], w, xg[1]), ws, xg,
                           calls=calls, repeats=repeats)


def bench_deq_ragged(qs, xg, *, calls, repeats):
  return common.time_chain(
      lambda q, xg: jax.lax.ragged_dot(xg[0], hj.dequantize(q).astype(jnp.bfloat16), xg[1]),
      qs, xg, calls=calls, repeats=repeats)


def bench_humming(spec_name, ws, xg, *, calls, repeats):
  import torch
  from humming.layer import HummingLayer
  wcfg, icfg = HUMMING_CONFIGS[spec_name]
  e, k, n = ws[0].shape
  xg = common.first_input(xg)  # one routing for all its layers (its graph computes any
  # per-call schedule in every layer)
  offsets = np.concatenate([[0], np.cumsum(np.asarray(xg[1]))]).astype(np.int32)
  layout = torch.from_numpy(offsets).to("cuda")
  held = _HUMMING_SETS.get(spec_name)  # built once per weight set, reused per token count
  if held is None or held[0] is not ws:
    _HUMMING_SETS.clear()
    built = []
    for w in ws:
      layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(wcfg),
                           input_config=None if icfg is None else dict(icfg),
                           num_experts=e, torch_dtype=torch.bfloat16).to("cuda")
      layer.load_from_unquantized(common.torch_from_jax(jnp.swapaxes(w, 1, 2)))
      layer.transform()
      built.append(layer)
    _HUMMING_SETS[spec_name] = (ws, built)
  layers = [functools.partial(layer, expert_layout=layout,
                              compute_config={"gemm_type": "grouped_contiguous"})
            for layer in _HUMMING_SETS[spec_name][1]]
  x = torch.randn(xg[0].shape[0], k, device="cuda", dtype=torch.bfloat16)
  return common.time_torch_graph(layers, x, calls=calls, repeats=repeats)


_HUMMING_SETS: dict = {}


def _calls(tokens: int, base: int) -> int:
  return base if tokens <= 256 else max(base // 5, 4)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--shapes", default=",".join(SHAPES))
  ap.add_argument("--tokens", default="1,16,64,256,1024,4096")
  ap.add_argument("--specs", default="w4a16-g128-zp,w4a16-mxfp4")
  ap.add_argument("--layers", type=int, default=8,
                  help="distinct weight sets per call (>= 8: a chain of 2 leaves the jitted "
                       "call's host cost in the per-layer time; NOTES_moe.md session 6)")
  ap.add_argument("--calls", type=int, default=30)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--humming", action="store_true", help="also time humming-kernels")
  ap.add_argument("--no-baselines", action="store_true")
  ap.add_argument("--xla-path", action="store_true", help="also time hj's XLA fallback")
  ap.add_argument("--breakdown", action="store_true",
                  help="also print the device time of every kernel of a call (a profiler "
                       "trace of the resident chain)")
  ap.add_argument("--chain", default="outputs",
                  help="comma list of outputs / resident: how our layers are chained "
                       "(benchmarks/common.py; the first gives 'us', the others "
                       "'<chain>_us'); Humming is always its CUDA graph")
  common.add_chain_flags(ap, "(x, group_sizes) pair")
  ap.add_argument("--consume", default="sum", choices=common.RESIDENT_CONSUMERS,
                  help="with --chain resident: sum every output (default) or only its "
                       "first row (common.resident_program)")
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  global CHAIN, SPAN, CONSUME
  CHAIN = tuple(args.chain.split(","))
  SPAN = args.span
  CONSUME = args.consume
  if not set(CHAIN) <= {"outputs", "resident"}:
    raise SystemExit(f"--chain {args.chain!r}: expected outputs and / or resident")
  if CONSUME != "sum" and "resident" not in CHAIN:
    raise SystemExit(f"--consume {CONSUME}: only the resident chain consumes its outputs "
                     f"(--chain {args.chain!r})")
  info = common.device_info()
  print(info, flush=True)
  specs = [s for s in args.specs.split(",") if s]
  results = []
  for shape_name in args.shapes.split(","):
    e, topk, n, k = SHAPES[shape_name]
    ws = make_sets(jax.random.PRNGKey(0), args.layers, e, k, n)
    sets = {}
    for spec_name in specs:
      got = _safe(lambda: quantize_sets(spec_name, ws))
      sets[spec_name] = got
    for tokens in map(int, args.tokens.split(",")):
      calls = _calls(tokens, args.calls)
      key = jax.random.PRNGKey(tokens)
      tok, gs = routing(key, tokens, e, topk)
      x = jax.random.normal(jax.random.fold_in(key, 1), (tokens, k), jnp.bfloat16)
      xg = (jnp.take(x, tok, axis=0), gs)
      if not args.shared_x:  # each layer through its own barrier: no work merged by XLA
        xg = common.unshared(xg)
      row = {"shape": shape_name, "E": e, "topk": topk, "N": n, "K": k, "tokens": tokens,
             "rows": tokens * topk, "active_experts": int((gs > 0).sum())}
      t0 = time.time()
      qs_any = None
      for spec_name in specs:
        if isinstance(sets[spec_name], dict):  # quantize/prepare failed: report it
          row[f"hj:{spec_name}"] = sets[spec_name]
          continue
        out = _safe(lambda: bench_hj(spec_name, sets[spec_name], xg, calls=calls,
                                     repeats=args.repeats, check=True))
        if args.breakdown:
          row[f"hj_kernels:{spec_name}"] = _safe(lambda: bench_breakdown(spec_name, sets[spec_name][1], xg))
        if isinstance(out, tuple):
          row[f"hj:{spec_name}"], qs = out
          qs_any = qs_any or qs
          if args.xla_path:
            row[f"hj_xla:{spec_name}"] = _safe(
                lambda: bench_hj_xla(qs, xg, calls=calls, repeats=args.repeats))
        else:
          row[f"hj:{spec_name}"] = out
        base = spec_name.partition("@")[0]  # one Humming row per base spec and point
        if (args.humming and base in HUMMING_CONFIGS and f"humming:{base}" not in row
            and common.humming_available()):
          row[f"humming:{base}"] = _safe(
              lambda: bench_humming(base, ws, xg, calls=calls, repeats=args.repeats))
      if not args.no_baselines:
        row["ragged_bf16"] = _safe(
            lambda: bench_ragged_bf16(ws, xg, calls=calls, repeats=args.repeats))
        if qs_any is not None:
          row["deq_ragged"] = _safe(
              lambda: bench_deq_ragged(qs_any, xg, calls=calls, repeats=args.repeats))
      row["wall_s"] = time.time() - t0
      results.append(row)
      print(format_row(row), flush=True)
  print()
  print(format_table(results))
  path = common.write_json(args.json or f"moe_{time.strftime('%Y%m%d_%H%M%S')}.json",
                           {"info": info, "args": vars(args), "results": results})
  print(f"wrote {path}")
  return results


def _us(v) -> str:
  if not isinstance(v, dict):
    return "-"
  if "error" in v:
    if v["error"] == "OOM":
      return "OOM"
    return "SMEM" if v["error"].startswith("SMEM") else "err"
  return f"{v['us']:.1f}"


def format_row(row) -> str:
  cols = [k for k in row if ":" in k or k in ("ragged_bf16", "deq_ragged")]
  parts = [f"{row['shape']} T={row['tokens']} rows={row['rows']} "
           f"active={row['active_experts']}"]
  for c in cols:
    v = row[c]
    if c.startswith("hj_kernels:"):
      parts.append(f"{c}={v}")
      continue
    s = f"{c}={_us(v)}"
    if isinstance(v, dict) and "rel_err" in v:
      s += f" (err {v['rel_err']:.1e}, {v['tbps']:.2f} TB/s, compile {v['compile_s']:.1f}s)"
    if isinstance(v, dict):
      s += "".join(f" {k[:-3]}={v[k]:.1f}" for k in v if k.endswith("_us") and k != "us")
    if isinstance(v, dict) and "error" in v and v["error"] != "OOM":
      s += f" [{v['error']}]"
    parts.append(s)
  return "  ".join(parts)


def format_table(results) -> str:
  cols = []
  for r in results:
    for c in r:
      if ((":" in c or c in ("ragged_bf16", "deq_ragged")) and c not in cols
          and not c.startswith("hj_kernels:")):
        cols.append(c)
  head = "| shape | tokens | " + " | ".join(cols) + " |"
  lines = [head, "|" + "---|" * (len(cols) + 2)]
  for r in results:
    lines.append(f"| {r['shape']} | {r['tokens']} | "
                 + " | ".join(_us(r.get(c)) for c in cols) + " |")
  return "µs per grouped GEMM (median, chain method)\n" + "\n".join(lines)


if __name__ == "__main__":
  try:
    main()
  except Exception:  # noqa: BLE001
    traceback.print_exc()
    raise
