"""Where a call's wall time goes between kernels: the GPU timeline of one resident-chain
call (common.time_resident's program), from a jax.profiler trace.

CUPTI kernel sums (``--breakdown``) say how long the kernels run; the wall says how long
the call takes.  At decode the two differ by more than the kernels' own ramps (MoE
DeepSeek-V3 gate_up at 1 token, session 16: 10.3 us of kernels, 21.6 us of wall per
grouped GEMM).  This prints, for the last of ``--calls`` traced calls, every GPU event in
start order with its duration and the idle gap before it, then totals per layer: the
kernels' sum, the span from the first kernel's start to the last one's end, and the idle
time inside that span.

  python3 benchmarks/probe_timeline.py --moe deepseek-v3-gate_up --tokens 1 \
      --spec w4a16-g128-zp
  python3 benchmarks/probe_timeline.py --dense 8192 --tokens 1 --spec w4a16-g128-zp
"""
from __future__ import annotations

import argparse
import glob
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import bench_moe, common  # noqa: E402


def build(args):
  """(layer_fn, params_list, x) of the case."""
  spec = hj.QuantSpec.preset(args.spec)
  key = jax.random.PRNGKey(0)
  if args.moe:
    e, topk, n, k = bench_moe.SHAPES[args.moe]
    ws = bench_moe.make_sets(key, args.layers, e, k, n)
    _, pps = bench_moe.quantize_sets(args.spec, ws)
    tok, gs = bench_moe.routing(jax.random.PRNGKey(args.tokens), args.tokens, e, topk)
    x = jax.random.normal(key, (args.tokens, k), jnp.bfloat16)
    xg = (jnp.take(x, tok, axis=0), gs)
    return (bench_moe.ragged_dot_fn(args.spec), pps,
            xg if args.shared_x else common.unshared(xg))
  n = k = args.dense
  keys = jax.random.split(key, args.layers)
  ws = [(jax.random.normal(kk, (k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
        for kk in keys]
  pps = [jax.block_until_ready(hj.prepare(hj.quantize(w, spec))) for w in ws]
  x = jax.random.normal(key, (args.tokens, k), jnp.bfloat16)
  return ((lambda p, x: hj.quant_dense(p, x)), pps,
          x if args.shared_x else common.unshared(x))


def host_totals(path: str, calls: int, top: int) -> list[tuple[float, int, str]]:
  """(us per call, count per call, name) of the host-side events (XLA runtime, CUDA API;
  not Python frames), largest first: where a call's dispatch spends its time.  Nested
  events each count in full."""
  data = jax.profiler.ProfileData.from_file(path)
  tot: dict[str, list[float]] = {}
  for plane in data.planes:
    if not plane.name.startswith("/host"):
      continue
    for line in plane.lines:
      if line.name == "python":
        continue
      for e in line.events:
        if e.name.startswith("$"):
          continue
        t = tot.setdefault(e.name, [0.0, 0])
        t[0] += e.duration_ns / 1e3
        t[1] += 1
  rows = sorted(((us / calls, n // calls, name) for name, (us, n) in tot.items()),
                reverse=True)
  return rows[:top]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  case = ap.add_mutually_exclusive_group(required=True)
  case.add_argument("--moe", choices=sorted(bench_moe.SHAPES))
  case.add_argument("--dense", type=int, help="N = K of a dense layer")
  ap.add_argument("--tokens", type=int, default=1)
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--shared-x", action="store_true",
                  help="all layers on one input buffer (XLA merges their identical work)")
  ap.add_argument("--calls", type=int, default=5)
  ap.add_argument("--show", type=int, default=40, help="events printed of the last call")
  ap.add_argument("--host", type=int, default=0, help="host-side event names printed")
  ap.add_argument("--schedule-warps", type=int, default=None,
                  help="grouped_wna16_mgpu.SCHEDULE_WARPS for this run (the tile schedule "
                       "kernel's warps per program)")
  args = ap.parse_args(argv)
  if args.schedule_warps is not None:
    from humming_jax.kernels import grouped_wna16_mgpu  # noqa: PLC0415
    grouped_wna16_mgpu.SCHEDULE_WARPS = args.schedule_warps
  layer, pps, x = build(args)

  f = jax.jit(common.resident_program(layer), donate_argnums=2)
  state = jax.block_until_ready(f(pps, x, jnp.zeros((), jnp.float32)))
  for _ in range(3):
    state = f(pps, x, state)
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(args.calls):
        state = f(pps, x, state)
      jax.block_until_ready(state)
    events = common.device_events(d)
    [path] = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
    hosts = host_totals(path, args.calls, args.host) if args.host else []
  if not events:
    raise SystemExit("no GPU stream events in the trace")
  # Calls: split where the idle gap is the largest few (host round trips between calls).
  gaps = sorted(((events[i][0] - (events[i - 1][0] + events[i - 1][1]), i)
                 for i in range(1, len(events))), reverse=True)
  cuts = sorted(i for _, i in gaps[:args.calls - 1])
  last = events[cuts[-1]:] if cuts else events
  t0 = last[0][0]
  print(f"case {args.moe or f'dense {args.dense}^2'} tokens={args.tokens} spec={args.spec} "
        f"layers={args.layers}: {len(events)} events in {args.calls} calls; last call:")
  prev_end = t0
  for start, dur, name in last[:args.show]:
    print(f"  t={start - t0:8.2f}  dur={dur:7.2f}  gap={start - prev_end:6.2f}  {name[:70]}")
    prev_end = max(prev_end, start + dur)
  busy = sum(d for _, d, _ in last)
  span = max(s + d for s, d, _ in last) - t0
  n = args.layers
  print(f"per layer: kernels {busy / n:.2f} us, span {span / n:.2f} us, idle inside the "
        f"span {(span - busy) / n:.2f} us, events {len(last) / n:.1f}")
  between = [events[i][0] - (events[i - 1][0] + events[i - 1][1]) for i in cuts]
  print(f"idle between calls (host): {', '.join(f'{g:.1f}' for g in between)} us")
  for us, count, name in hosts:
    print(f"  host {us:9.1f} us/call  x{count:<4d} {name[:90]}")
  t0 = time.perf_counter()  # untraced: how long the host takes to enqueue a call
  for _ in range(20):
    state = f(pps, x, state)
  t1 = time.perf_counter()
  jax.block_until_ready(state)
  t2 = time.perf_counter()
  print(f"untraced, 20 calls: host enqueue {(t1 - t0) / 20 * 1e6:.1f} us per call, "
        f"until done {(t2 - t0) / 20 * 1e6:.1f}")
  wall = common.time_resident(layer, pps, x, calls=20, repeats=3)["us"]
  print(f"untraced resident wall: {wall:.2f} us per layer ({wall * n:.1f} per call) against "
        f"{span / n:.2f} us of GPU span")


if __name__ == "__main__":
  main()
