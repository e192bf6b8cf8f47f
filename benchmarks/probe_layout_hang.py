"""Which Mosaic GPU kernel's layout inference stalls when a chain of MoE layers compiles.

H200 session 22, call 1: ``bench_moe_layer.py`` (W4A8 MXFP4) compiled one Qwen3-30B-A3B
layer at 1024 tokens, then spent 270 s in ``layout_inference.find_assignments_for`` while
lowering the resident chain of 8 layers; with HUMMING_JAX_MOE_QUANTIZE_FIRST=1 the same
at DeepSeek-V3, 64 tokens.  The same lowering for an abstract H200 on the CPU takes
0.3 s per kernel (tests/test_cuda_lowering.py's method).  This probe lowers the chain on
the GPU, times every ``infer_layout`` call and writes each module's text to --out before
inferring it, so the last file written is the stalled kernel's; faulthandler dumps the
stacks and exits after --limit seconds.

  python3 benchmarks/probe_layout_hang.py --model qwen3-30b-a3b --tokens 1024 --layers 8
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_moe_layer import MODELS  # noqa: E402
from humming_jax import moe  # noqa: E402


def spy_layout_inference(out_dir: str, log: list) -> None:
  from jax.experimental.mosaic.gpu import layout_inference
  original = layout_inference.infer_layout

  def timed(module, *args, **kwargs):
    n = len(log)
    with open(os.path.join(out_dir, f"infer_{n:03d}.mlir"), "w") as f:
      f.write(str(module))
    t0 = time.perf_counter()
    result = original(module, *args, **kwargs)
    log.append(time.perf_counter() - t0)
    print(f"infer_layout #{n}: {log[-1]:.2f} s", flush=True)
    return result

  layout_inference.infer_layout = timed  # core calls it through the module


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(MODELS))
  ap.add_argument("--tokens", type=int, default=1024)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--spec", default="w4a8-mxfp4")
  ap.add_argument("--limit", type=float, default=90.0)
  ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
  args = ap.parse_args(argv)
  log: list[float] = []
  spy_layout_inference(args.out, log)
  faulthandler.dump_traceback_later(args.limit, exit=True)
  e, topk, h, inter = MODELS[args.model]
  spec = hj.QuantSpec.preset(args.spec)
  gu = jax.eval_shape(lambda w: hj.quantize(w, spec),
                      jax.ShapeDtypeStruct((e, h, 2 * inter), jnp.float32))
  dn = jax.eval_shape(lambda w: hj.quantize(w, spec),
                      jax.ShapeDtypeStruct((e, inter, h), jnp.float32))
  p = jax.eval_shape(lambda gu, dn: moe.prepare_experts(gu, dn), gu, dn)
  a = (jax.ShapeDtypeStruct((args.tokens, h), jnp.bfloat16),
       jax.ShapeDtypeStruct((args.tokens, topk), jnp.float32),
       jax.ShapeDtypeStruct((args.tokens, topk), jnp.int32))
  layer = lambda p, a: hj.quant_moe(*p, a[0], a[1], a[2])
  for layers in (1, args.layers):
    t0 = time.perf_counter()
    f = jax.jit(lambda ps, a: common.chain(layer, ps, a))
    f.trace([p] * layers, common.unshared(a)).lower()
    print(f"{args.model} {args.tokens} tokens, {layers} layers: lowered in "
          f"{time.perf_counter() - t0:.1f} s, {len(log)} inferences, max "
          f"{max(log, default=0):.2f} s", flush=True)
  faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
  main()
