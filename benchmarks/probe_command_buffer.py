"""Do XLA command buffers (CUDA graphs) capture the Mosaic GPU custom call, and what does
that do to the per-launch host cost?  (benchmarks/NOTES.md v8: a Mosaic launch costs
~12 us of host time; XLA's own kernels ~4 us less with command buffers.)

For each ``--flags`` set (run in a subprocess, since XLA_FLAGS is read once per process):
compile a chain of ``--layers`` distinct Mosaic W4A16 layers (M = 1), count the
``mosaic_gpu_v2`` custom calls in the optimized HLO and how many of them sit inside a
``command_buffer`` computation, then time the chain (GPU.md chain method) and its kernels
(CUPTI).

Session 8 (source reading, not yet run): XLA forms command buffers from the *thunk
sequence* after compilation (command_buffer_conversion_pass.cc), so the optimized HLO never
shows them -- session 7's "0 of 16 captured" counted the wrong artifact.  The Mosaic FFI
handler carries the kCmdBufferCompatible trait since jax 0.8.0.  So each child also dumps
(``--xla_dump_to``) and counts ``kCommandBuffer`` / custom-call thunks in
``*thunk_sequence_after_thunk_passes.txt``, printing the file's head for the log.

    python benchmarks/probe_command_buffer.py --sizes 512,4096
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FLAG_SETS = {
    "default": "",
    "min1": "--xla_gpu_graph_min_graph_size=1",
    "custom_call": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL",
    "custom_call_min1": ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL "
                         "--xla_gpu_graph_min_graph_size=1"),
}


def captured(hlo: str) -> tuple[int, int]:
  """(mosaic custom calls, of which inside a command_buffer computation) in HLO text."""
  total = inside = 0
  in_cmd = False
  for line in hlo.splitlines():
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      in_cmd = bool(re.search(r"command_buffer", line.split("(")[0]))
    if 'custom_call_target="mosaic_gpu_v2"' in line:
      total += 1
      inside += in_cmd
  return total, inside


def child(size: int, layers: int) -> None:
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
  x = jax.random.normal(jax.random.key(2), (1, size), jnp.bfloat16)
  layer = lambda p, x: wna16_mgpu.run(p, x)
  fn = jax.jit(lambda ps, x: common.chain(layer, ps, x))
  total, inside = captured(fn.lower(ps, x).compile().as_text())
  dump = os.environ.get("PROBE_DUMP_DIR")
  if dump:
    for f in sorted(Path(dump).glob("*thunk_sequence_after_thunk_passes*")):
      text = f.read_text(errors="replace")
      print(f"thunks {f.name}: kCommandBuffer lines {text.count('kCommandBuffer')}, "
            f"custom-call lines {len(re.findall(r'(?i)custom.?call', text))}", flush=True)
      for line in text.splitlines()[:30]:
        print(f"thunks| {line[:160]}", flush=True)
  kt = common.kernel_times(fn, (ps, x), iterations=3, per=layers)
  wall = common.time_chain(layer, ps, x, calls=20, repeats=3)["us"]
  print(f"size={size} layers={layers}: mosaic calls {total}, in command buffers {inside}; "
        f"wall {wall:.1f} us/layer, kernels {sum(kt.values()):.1f}", flush=True)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--sizes", default="512,4096")
  ap.add_argument("--layers", type=int, default=16)
  ap.add_argument("--flags", default=",".join(FLAG_SETS))
  ap.add_argument("--timeout", type=int, default=50, help="seconds per flag set")
  ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    child(args.child, args.layers)
    return
  from benchmarks import common  # noqa: PLC0415 - imports jax; children set XLA_FLAGS first
  for name in args.flags.split(","):
    for size in map(int, args.sizes.split(",")):
      dump = tempfile.mkdtemp(prefix=f"probe_{name}_{size}_")
      print(f"# flags {name}: [{FLAG_SETS[name]}]", flush=True)
      common.run_child(__file__, size, ["--layers", str(args.layers)],
                       f"{FLAG_SETS[name]} --xla_dump_to={dump}".strip(), timeout=args.timeout,
                       keep=("size=", "thunks"), last=40, env={"PROBE_DUMP_DIR": dump})


if __name__ == "__main__":
  main()
