"""One Mosaic WnA16 launch for Nsight Compute: where the decode kernel's time goes.

The weights are made (jax.random: XLA kernels, not profiled) and prepared before the kernel under study runs, then the jitted layer
runs ``--runs`` times; profile only the Mosaic kernel (its symbol ends in ``_mosaic_gpu``):

  ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1 --launch-count 1 \\
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats \\
      python3 benchmarks/probe_ncu.py --case dense --m 1

Cases: ``dense`` (K x N weights, M token rows, ``--config`` as in profile_mgpu.py) and
``grouped`` (DeepSeek-V3-style gate_up stack, E experts, top-k routing of ``--m`` tokens,
through ``grouped_wna16_mgpu.run``); ``dense8`` / ``grouped8`` the same on the fp8-MMA
layout (W4A8 MXFP4: e4m3 activation codes and row scales, ``wna16_mgpu.prepare(mma="fp8")``;
``e2m1`` (session 62) the W4A8 MXFP4 prefill converting the codes inside the 8-bit GEMM
(``wnam_mgpu.run_prefill_e2m1_mma``; HUMMING_JAX_E2M1_SHARED / _OVERLAP / _STAGES4 pick its form);
session 21's questions: why the dense M = 1 decode takes ~18 us and the 128-row grouped
tile ~400 TFLOP/s).  Question it answers (NOTES.md v5/v6): is the M = 1
plateau (~17-18 us per 8192^2 int4 layer, ~1.9 TB/s) instruction issue, barrier / TMA
latency, or DRAM?  The hypothesis of v5 (issue-bound at ~0.5 IPC) was never measured.

``--hlo FILE`` also writes XLA's optimized HLO of the call and lists its entry computation's
ops by name (the names CUPTI reports for the XLA kernels beside the Mosaic one).
"""
from __future__ import annotations

import argparse
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
import humming_jax as hj  # noqa: E402
from benchmarks.profile_mgpu import parse_config  # noqa: E402
from humming_jax import moe  # noqa: E402
from humming_jax.kernels import (grouped_wna16_mgpu, grouped_wnam_mgpu,  # noqa: E402
                                 wna16_mgpu, wnam_mgpu)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--case", choices=("dense", "grouped", "dense8", "grouped8", "e2m1"),
                  default="dense")
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--m", type=int, default=1, help="token rows (grouped: tokens)")
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  ap.add_argument("--experts", type=int, default=256)
  ap.add_argument("--topk", type=int, default=8)
  ap.add_argument("--config", default="default")
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--eager", action="store_true",
                  help="grouped8: prepare eagerly (the ':cf' mark, one-accumulator tiles)")
  ap.add_argument("--interpret", action="store_true", help="CPU check of the script")
  ap.add_argument("--hlo", default=None, metavar="FILE",
                  help="also write XLA's optimized HLO of the call and list the ops of its "
                       "entry computation (which fusions / custom calls run beside the kernel)")
  args = ap.parse_args()
  spec = hj.QuantSpec.preset(args.spec)
  rng = np.random.default_rng(0)
  fp8 = args.case.endswith("8")
  if fp8 and not wnam_mgpu.fp8_mma_applies(spec):
    raise SystemExit(f"--case {args.case}: --spec {args.spec} has no fp8-MMA layout "
                     f"(e.g. w4a8-mxfp4)")
  if args.case == "e2m1":  # session 62: the prefill's in-GEMM MXFP4 conversion
    import os  # noqa: PLC0415
    os.environ.update(HUMMING_JAX_DENSE_FP8_MMA="1", HUMMING_JAX_E2M1_MMA="1")
    w = jax.random.normal(jax.random.key(0), (args.k, args.n), jnp.float32) / np.sqrt(args.k)
    params = wnam_mgpu.prepare(jax.jit(hj.quantize, static_argnums=1)(w, spec))  # eager: ":cf"
    assert wnam_mgpu.e2m1_mma_runs(params), params.layout
    x = jnp.asarray(rng.standard_normal((args.m, args.k), np.float32), jnp.bfloat16)
    fn = jax.jit(lambda p, x: wnam_mgpu.run_prefill_e2m1_mma(p, x, interpret=args.interpret))
    inputs = (params, x)
  elif args.case == "dense8":
    w = jax.random.normal(jax.random.key(0), (args.k, args.n), jnp.float32) / np.sqrt(args.k)
    params = jax.jit(lambda w: wna16_mgpu.prepare(
        wnam_mgpu.weight_view(hj.quantize(w, spec), "canonical"), permute=False,
        mma="fp8"))(w)
    x = jnp.asarray(rng.standard_normal((args.m, args.k), np.float32), jnp.bfloat16)
    codes, x_scale = wnam_mgpu.fp8_operands(x, params.replace(spec=spec),
                                            interpret=args.interpret)
    cfg = parse_config(args.config, args.m)
    fn = jax.jit(lambda p, c, s: wna16_mgpu.run(p, c, x_scale=s, config=cfg,
                                                interpret=args.interpret))
    inputs = (params, codes, x_scale)
  elif args.case == "grouped8":
    e, k, n = args.experts, args.k, args.n
    w = jax.random.normal(jax.random.key(0), (e, k, n), jnp.float32) / np.sqrt(k)
    q = jax.jit(lambda w: hj.quantize(w, spec))(w)
    # --eager: prepared outside jit, so the ":cf" check can mark the layout for the
    # one-accumulator tiles (the default launch for tiles over 80 rows since session 25)
    params = (grouped_wnam_mgpu.prepare if args.eager else jax.jit(grouped_wnam_mgpu.prepare))(q)
    assert wna16_mgpu.fp8_mma(params.layout), params.layout
    ids = jnp.asarray(np.argsort(rng.random((args.m, e)), axis=1)[:, :args.topk], jnp.int32)
    r = moe.sort_tokens(ids, e)
    xt = jnp.asarray(rng.standard_normal((args.m, k), np.float32), jnp.bfloat16)
    codes, x_scale = grouped_wnam_mgpu.fp8_operands(xt, params, interpret=args.interpret)
    codes, x_scale = codes[r.token_of_row], x_scale[r.token_of_row]
    fn = jax.jit(lambda p, c, s, g: grouped_wnam_mgpu.run_quantized(
        p, c, s, g, interpret=args.interpret))
    inputs = (params, codes, x_scale, r.group_sizes)
  elif args.case == "dense":
    w = jax.random.normal(jax.random.key(0), (args.k, args.n), jnp.float32) / np.sqrt(args.k)
    params = jax.jit(wna16_mgpu.prepare)(jax.jit(hj.quantize, static_argnums=1)(w, spec))
    x = jnp.asarray(rng.standard_normal((args.m, args.k), np.float32), jnp.bfloat16)
    cfg = parse_config(args.config, args.m)
    fn = jax.jit(lambda p, x: wna16_mgpu.run(p, x, config=cfg,
                                                 interpret=args.interpret))
    inputs = (params, x)
  else:
    e, k, n = args.experts, args.k, args.n
    w = (jax.random.normal(jax.random.key(0), (e, k, n), jnp.float32) / np.sqrt(k)
         ).astype(jnp.bfloat16)
    params = jax.jit(grouped_wna16_mgpu.prepare)(
        jax.jit(hj.quantize, static_argnums=1)(w, spec))
    ids = jnp.asarray(np.argsort(rng.random((args.m, e)), axis=1)[:, :args.topk], jnp.int32)
    r = moe.sort_tokens(ids, e)
    xt = jnp.asarray(rng.standard_normal((args.m, k), np.float32), jnp.bfloat16)
    x = xt[r.token_of_row]
    block_m = grouped_wna16_mgpu.tile_rows(x.shape[0], e, params)  # run's default rows
    rows = grouped_wna16_mgpu.launch_rows(x.shape[0], e, block_m)
    cfg = None if args.config == "default" else parse_config(
        args.config, rows, base=grouped_wna16_mgpu.default_launch(x.shape[0], params,
                                                                  block_m))
    fn = jax.jit(lambda p, x, g: grouped_wna16_mgpu.run(
        p, x, g, config=cfg, block_m=block_m, interpret=args.interpret))
    inputs = (params, x, r.group_sizes)
  jax.block_until_ready(inputs)
  if args.hlo:
    write_hlo(fn, inputs, args.hlo)
  for _ in range(args.runs):
    out = jax.block_until_ready(fn(*inputs))
  print(f"probe_ncu {args.case} {args.spec} m={args.m} k={args.k} n={args.n} "
        f"config={args.config}: out {out.shape} finite={bool(jnp.isfinite(out).all())}",
        flush=True)


def write_hlo(fn, inputs, path: str) -> None:
  """The compiled module's text to ``path``; prints the entry computation's launches:
  fusions (with their kind), custom calls and the other non-trivial ops."""
  text = fn.lower(*inputs).compile().as_text()
  with open(path, "w") as f:
    f.write(text)
  entry = text[text.index("ENTRY"):] if "ENTRY" in text else text
  skip = ("parameter(", "constant(", "get-tuple-element(", "tuple(", "bitcast(")
  ops = []
  for line in entry.splitlines()[1:]:
    if line.startswith("}"):
      break
    if "=" not in line or any(s in line for s in skip):
      continue
    found = re.search(r"(?:^|\s)([a-z][\w\-]*)\(", line.split("=", 1)[1])
    if found is None:
      continue
    op = found.group(1)  # after the result type (tuple types start with "(" themselves)
    kind = line.split("kind=", 1)[1].split(",")[0].split()[0] if "kind=" in line else ""
    target = (line.split('custom_call_target="', 1)[1].split('"', 1)[0]
              if "custom_call_target" in line else "")
    name = line.split("=", 1)[0].split()[-1].lstrip("%")  # CUPTI names kernels so
    ops.append(" ".join(v for v in (name, op, kind, target) if v))
  print(f"hlo: {len(ops)} ops in the entry computation ({path}): " + "; ".join(ops),
        flush=True)


if __name__ == "__main__":
  main()
