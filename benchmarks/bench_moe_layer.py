"""The whole routed MoE MLP, ``hj.quant_moe`` (routing sort, gate/up grouped GEMM, GLU, down
grouped GEMM, weighted combine), on the GPU with the chain method of shared/GPU.md.

Per (shape, tokens): a chain of ``--layers`` distinct expert stacks in one jitted call;
microseconds per MoE layer, and (--breakdown) the device time of every kernel (CUPTI).
Kernel families: ``default`` (``moe.prepare_experts``: picked for the layer by its shapes),
``triton`` (the Pallas-Triton grouped kernel, rows sorted by expert) and ``mgpu`` (the Mosaic
grouped kernel; two such stacks run on tile-aligned segments, ``moe.align_tokens``: no row
gather).  Each
result is checked against the same layer on the XLA path.

  PYTHONPATH=. python3 benchmarks/bench_moe_layer.py --tokens 1,16,64 --breakdown
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax import moe  # noqa: E402

MODELS = {  # name: (E, top-k, hidden H, expert intermediate I)
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v3": (256, 8, 7168, 256),
    "mixtral": (8, 2, 4096, 14336),
    "tiny": (4, 2, 256, 128),  # a CPU smoke run of this script (XLA path there)
}


def make_layers(key, layers, e, h, inter, spec):
  """Canonical (gate_up (E, H, 2I), down (E, I, H)) params per layer, made on the device."""
  quant = jax.jit(lambda kk: (
      hj.quantize(jax.random.normal(kk, (e, h, 2 * inter), jnp.float32) / np.sqrt(h), spec),
      hj.quantize(jax.random.normal(jax.random.fold_in(kk, 1), (e, inter, h), jnp.float32)
                  / np.sqrt(inter), spec)))
  return [quant(kk) for kk in jax.random.split(key, layers)]


FAMILIES = {"default": None, "triton": "grouped_wna16", "mgpu": "grouped_wna16_mgpu"}


def prepare(layers, family):
  if family not in FAMILIES:
    raise ValueError(f"--families: unknown family {family!r}; expected {sorted(FAMILIES)}")
  # eager, as a user prepares once: the fp8-MMA layout's ":cf" check needs concrete scales
  prep = lambda gu, dn: moe.prepare_experts(gu, dn, kernel=FAMILIES[family])
  return [jax.block_until_ready(prep(*pair)) for pair in layers]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--models", default="qwen3-30b-a3b")
  ap.add_argument("--tokens", default="1,16,64")
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--families", default="default,triton,mgpu")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--chain", choices=sorted(common.CHAINS), default="outputs",
                  help="outputs: every layer on the same tokens, all outputs returned; "
                       "sequential: tokens -> layer_1 -> ... with a donated state, the same "
                       "routing for every layer (as in a model, routing aside)")
  ap.add_argument("--calls", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--breakdown", action="store_true")
  ap.add_argument("--json", default=None)
  ap.add_argument("--env", default=None, metavar="NAME=V1,V2",
                  help="an A/B of a trace-time switch in one process: every family runs "
                       "once per value of the environment variable NAME (row key "
                       "'family:V'; an empty value sets NAME empty, which the library "
                       "reads as unset), e.g. HUMMING_JAX_MOE_PAIR_TOKENS=1,0")
  args = ap.parse_args(argv)
  env_name, env_values = None, [None]
  if args.env:
    env_name, _, values = args.env.partition("=")
    if not env_name or not values:
      raise SystemExit(f"--env {args.env!r}: expected NAME=V1,V2")
    env_values = values.split(",")
  info = common.device_info()
  print("#", info, flush=True)
  spec = hj.QuantSpec.preset(args.spec)
  results = []
  for model in args.models.split(","):
    e, topk, h, inter = MODELS[model]
    canon = make_layers(jax.random.key(0), args.layers, e, h, inter, spec)
    fams = {f: prepare(canon, f) for f in args.families.split(",")}
    for tokens in map(int, args.tokens.split(",")):
      key = jax.random.key(tokens)
      x = jax.random.normal(key, (tokens, h), jnp.bfloat16)
      w, ids = moe.topk_routing(jax.random.normal(jax.random.fold_in(key, 1), (tokens, e)),
                                topk)
      ref = jax.jit(lambda p, x, w, ids: hj.quant_moe(*p, x, w, ids, backend="xla"))(
          canon[0], x, w, ids)
      row = {"model": model, "tokens": tokens, "spec": args.spec}
      for (fam, layers), value in ((f, v) for f in fams.items() for v in env_values):
        if env_name:  # read while tracing: each timing below traces anew
          os.environ[env_name] = value
          fam = f"{fam}:{value}"
        layer = lambda p, a: hj.quant_moe(*p, a[0], a[1], a[2])
        try:
          y = jax.jit(layer)(layers[0], (x, w, ids))
          err = common.rel_err(y, ref)
          if args.chain == "sequential":  # x threads through; the routing is fixed
            seq = lambda p, y, w=w, ids=ids: hj.quant_moe(*p, y, w, ids)
            t = common.time_sequential(seq, layers, x, calls=args.calls, repeats=args.repeats)
          else:  # each layer's inputs through its own barrier: no routing / quantization
            # merged across the layers by XLA (common.unshared; session 17)
            t = common.time_chain(layer, layers, common.unshared((x, w, ids)),
                                  calls=args.calls, repeats=args.repeats)
          row[fam] = {"us": round(t["us"], 1), "err": err}
          if args.breakdown:
            fn = jax.jit(lambda ps, a: common.chain(layer, ps, a))
            row[fam]["kernels"] = {k: round(v, 2) for k, v in common.kernel_times(
                fn, (layers, common.unshared((x, w, ids))), iterations=3,
                per=len(layers)).items()}
        except Exception as ex:  # noqa: BLE001 - reported in the row
          row[fam] = {"error": f"{type(ex).__name__}: {str(ex)[:200]}"}
      results.append(row)
      print(row, flush=True)
  path = common.write_json(args.json or f"moe_layer_{time.strftime('%Y%m%d_%H%M%S')}.json",
                           {"info": info, "args": vars(args), "results": results})
  print(f"# wrote {path}")


if __name__ == "__main__":
  main()
