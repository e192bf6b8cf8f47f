"""Where does the ~12-25 us host cost per Mosaic launch come from, and does it survive in
a decode-like loop?  (benchmarks/NOTES.md v8-v10.)

Session 9 (call 1): XLA's thunk dump shows the Mosaic custom calls *inside* the
kCommandBuffer thunk (a CUDA graph), yet a chain of 16 tiny 512^2 layers takes 20.7 us
per layer for 3.1 us of kernels.  XLA records an FFI custom call into the graph by
tracing it (stream capture of the handler, which encodes TMA descriptors on the host), and
re-records when the buffers the graph uses move.  The benchmark chain returns every
layer's output (fresh buffers, new addresses every call), so it may force a re-record of
every call.  This probe times the same Mosaic layers four ways in one process:

  outputs   the benchmark chain (common.time_chain): every layer's output returned;
  seq       layers applied in sequence (x -> y1 -> y2 ...), only the last returned, the
            intermediates live in XLA's temp buffer (as in a model);
  donated   seq, with the output aliased to a donated input that is fed back (the
            addresses of every buffer stay put, as in a decode loop with donated state);
  blocked   seq, blocking after each call (nothing in flight: one execution at a time);

plus the kernel time (CUPTI) and an XLA bf16 dot chain for reference, for each
``--flags`` set in a subprocess (XLA_FLAGS is read once per process).

    python benchmarks/probe_launch.py --sizes 512,8192 --flags default,no_custom_call
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FLAG_SETS = {
    "default": "",
    # command buffers for XLA's own kernels only: Mosaic launches straight on the stream
    "no_custom_call": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT",
    "off": "--xla_gpu_enable_command_buffer=",
}


def _wall(f, args, calls: int, *, block_each: bool = False, feed=None) -> float:
  """Microseconds per call: ``calls`` calls back to back (or blocked one by one); ``feed``:
  the index of an argument replaced by each call's output (donated state)."""
  args = list(args)

  def once():
    out = f(*args)
    if feed is not None:
      args[feed] = out
    if block_each:
      jax.block_until_ready(out)
    return out

  jax.block_until_ready(once())
  jax.block_until_ready(once())
  best = []
  for _ in range(3):
    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
      out = once()
    jax.block_until_ready(out)
    best.append((time.perf_counter() - t0) / calls * 1e6)
  return sorted(best)[1]


def child(size: int, layers: int, calls: int) -> None:
  global jax
  import jax  # noqa: PLC0415 - after XLA_FLAGS is set
  import jax.numpy as jnp  # noqa: PLC0415

  import humming_jax as hj  # noqa: PLC0415
  from benchmarks import common  # noqa: PLC0415
  from benchmarks.bench_dense import make_weights  # noqa: PLC0415
  from humming_jax.kernels import wna16_mgpu  # noqa: PLC0415
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  ws = make_weights(jax.random.key(1), layers, size, size)
  ps = [jax.jit(wna16_mgpu.prepare)(jax.jit(hj.quantize, static_argnums=1)(w, spec))
        for w in ws]
  bf = [w.astype(jnp.bfloat16) for w in ws]
  x = jax.random.normal(jax.random.key(2), (1, size), jnp.bfloat16)
  layer = lambda p, x: wna16_mgpu.run(p, x)

  def seq(ps, x):
    for p in ps:
      x = layer(p, x) * 0.03  # keep the values bounded; one fused multiply per layer
    return x

  f_seq = jax.jit(seq)
  f_don = jax.jit(lambda ps, x, state: seq(ps, x + state), donate_argnums=2)
  f_xla = jax.jit(lambda ws, x: seq_xla(ws, x))

  def seq_xla(ws, x):
    for w in ws:
      x = jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype) * 0.03
    return x

  res = {"outputs": common.time_chain(layer, ps, x, calls=calls, repeats=3)["us"] * layers}
  res["seq"] = _wall(f_seq, (ps, x), calls)
  res["donated"] = _wall(f_don, (ps, x, jnp.zeros_like(x)), calls, feed=2)
  res["blocked"] = _wall(f_seq, (ps, x), calls, block_each=True)
  res["xla_bf16_seq"] = _wall(f_xla, (bf, x), calls)
  res["xla_bf16_donated"] = _wall(jax.jit(lambda ws, x, s: seq_xla(ws, x + s), donate_argnums=2),
                                  (bf, x, jnp.zeros_like(x)), calls, feed=2)
  kt = common.kernel_times(f_seq, (ps, x), iterations=3)
  kernels = sum(kt.values())
  line = " ".join(f"{k} {v / layers:.1f}" for k, v in res.items())
  print(f"size={size} layers={layers}: us per layer: {line}; kernels (seq) "
        f"{kernels / layers:.1f}", flush=True)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--sizes", default="512,8192")
  ap.add_argument("--layers", type=int, default=16)
  ap.add_argument("--calls", type=int, default=30)
  ap.add_argument("--flags", default=",".join(FLAG_SETS))
  ap.add_argument("--timeout", type=int, default=60, help="seconds per child")
  ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    child(args.child, args.layers, args.calls)
    return
  from benchmarks import common  # noqa: PLC0415 - imports jax; children set XLA_FLAGS first
  for name in args.flags.split(","):
    for size in map(int, args.sizes.split(",")):
      print(f"# flags {name}: [{FLAG_SETS[name]}]", flush=True)
      common.run_child(__file__, size, ["--layers", str(args.layers), "--calls",
                                        str(args.calls)], FLAG_SETS[name], timeout=args.timeout)


if __name__ == "__main__":
  main()
