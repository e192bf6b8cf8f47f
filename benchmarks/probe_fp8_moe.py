"""Device probe (session 20): launch shapes of the grouped kernel on the fp8-MMA layout
(W4A8 MXFP4 experts, ``wna16_mgpu.prepare(mma="fp8")``).  The grouped heuristic was tuned
on the 16-bit route, whose e2m1 -> bf16 conversion made 64-token launches issue-bound
(NOTES_moe.md session 19); the fp8 route converts in ~0.9 instructions per weight, so
the best launch may differ.  CUPTI time of the grouped kernel per layer over ``--sets``
expert sets, each config's output compared with the heuristic's.
``--single`` (session 25): ``Config.fp8_single_acc`` (the fold against each column's
largest group, one accumulator; the heuristic's launch for tiles over 80 rows of ":cf"
weights since) against the per-group launch it replaced, on two and four shared-x
warpgroups (128 / 256 columns per CTA), in clusters of 2 / 1.
``--cluster`` (session 24): the heuristic's shared-x launch with its x tiles multicast to
clusters of 2 / 4 column CTAs (``Config.cluster_n``); ``--preset w4a16-mxfp4`` times the
16-bit route (grouped_wna16_mgpu) instead.
``--blocks 128,144,256:2`` (session 26): that launch at other rows per tile (tiles of
more than 128 rows pad Mixtral's ~256-row experts less), ``:2`` on two warpgroups;
``96:4:6`` (session 29) with 6 stages (lowered by ``run`` to what fits).
``--wide --blocks 128,144 --preset w4a16-g128-zp`` (session 67): the 16-bit route's shared-x
tile at those rows with the scales on the bf16 weights before the MMA (one accumulator, as
the fp8 route's ``fp8_single_acc``; ``grouped_wna16_mgpu.wide_tiles``).
Call 1 of session 26 also timed each with a step's WGMMAs left in flight (a
``Config.fp8_mma_in_flight``, since removed: -4 % to +2 %, and its outputs differed
from the plain launch's on the H200).
Usage: probe_fp8_moe.py [--shape 256,8,512,7168] [--tokens 16,64,256] [--fold] [--cluster] [--single]
                        [--blocks 128,144] [--preset w4a8-mxfp4]"""
import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import common
import humming_jax as hj
from humming_jax import moe
from humming_jax.kernels import grouped_wna16_mgpu as g16, grouped_wnam_mgpu as gw
from humming_jax.kernels import wna16_mgpu as mg


def variants(tokens, e, rows, fold=False, cluster=False, single=False, blocks=None,
             wide=False):
  """(name, block_m or None, config changes or a Config) to time.  ``fold`` (session 22):
  the heuristic and the wide tiles' launches with and without ``fp8_fold``; ``cluster``
  (session 24): the heuristic's launch on clusters of 1 / 2 / 4 CTAs (its fp8 tiles over
  80 rows run in pairs since), and for tiles over 64 rows the four-warpgroup 64-row
  shared-x launch with and without them; ``blocks`` (sessions 26 / 29) the one-accumulator
  tile at those rows, on the 16-bit route with ``wide`` (session 67)."""
  base = [("heuristic", None, None)]
  if blocks:  # session 26: the one-accumulator shared-x tile at other row counts
    # (session 29: and other stages; run() lowers them to what fits shared memory; session
    # 67, ``wide``: the 16-bit route's, scales before the MMA)
    name, one = ("wide", dict(scale_after_mma=False)) if wide else (
        "single", dict(fp8_single_acc=True))
    return base + [(f"{name}-bm{bm}-wg{w}" + (f"-st{st}" if st else ""), bm,
                    dataclasses.replace(mg.shared_x_config(bm, warpgroups=w), **one,
                                        **({"stages": st} if st else {})))
                   for bm, w, st in blocks]
  if single:  # session 25: Config.fp8_single_acc (the heuristic's for tiles over 80 rows
    # of ":cf" weights since) against the per-group launch it replaced, and variants
    one = dict(fp8_single_acc=True, split_k=1)
    if rows <= 80:
      return base + [("heuristic+single", None, one)]
    return base + [  # (the per-group launch at most 128 rows: its registers)
        ("pergroup-shx2-cl2", min(rows, g16.MAX_BLOCK_M), dataclasses.replace(
            mg.shared_x_config(min(rows, g16.MAX_BLOCK_M), warpgroups=2), cluster_n=2)),
        ("single-shx2-cl2", None, dataclasses.replace(
            mg.shared_x_config(rows, warpgroups=2), cluster_n=2, **one))] + [
        (f"single-shx4-cl{c}", None, dataclasses.replace(
            mg.shared_x_config(rows, warpgroups=4), cluster_n=c, **one)) for c in (2, 1)]
  if cluster:
    out = base + [(f"heuristic+cl{c}", None, dict(cluster_n=c)) for c in (1, 2, 4)]
    if rows > 64:
      out += [(f"shx4-bm64-cl{c}", 64, dataclasses.replace(mg.shared_x_config(64),
                                                           cluster_n=c)) for c in (1, 2)]
    return out
  if fold:
    out = base + [("heuristic+fold", None, dict(fp8_fold=True))]
    if rows > 64:
      out += [(f"shx{w}-bm{bm}" + ("+fold" if f else ""), bm,
               dataclasses.replace(mg.shared_x_config(bm, warpgroups=w), fp8_fold=f))
              for bm, w in ((64, 4), (64, 2)) for f in (False, True)]
    return out
  decode = [(f"wg{w}-st{s}-sub{b}", 16, dict(warpgroups=w, stages=s, substeps=b))
            for w, s, b in ((1, 4, 2), (2, 2, 2), (2, 4, 2), (1, 6, 2), (1, 8, 1), (4, 4, 2),
                            (1, 4, 1), (2, 3, 2))]
  if tokens > 64 and rows > 64:  # session 21: 128-row tiles on four shared-x warpgroups
    # (the heuristic) took 7.2 ms at Mixtral gate_up 1024 tokens (Humming 0.50 ms)
    wide = [(f"shx{w}-bm{bm}", bm, mg.shared_x_config(bm, warpgroups=w))
            for bm in (rows, 64) for w in (2, 1)]
    wide += [(f"bm{bm}-wg{w}-st{s}-k", bm, dict(warpgroups=w, stages=s, substeps=1,
                                                split_warpgroups="k"))
             for bm in (rows, 64) for w, s in ((1, 4), (2, 2))]
    wide += [("shx4-bm64", 64, mg.shared_x_config(64))]
    return base + wide
  wide = [(f"shx-bm{bm}", bm, mg.shared_x_config(bm)) for bm in (16, 32, 48)]
  wide += [(f"bm{bm}-wg{w}-st{s}", bm, dict(warpgroups=w, stages=s, substeps=1,
                                            split_warpgroups="k"))
           for bm in (16, 32) for w, s in ((1, 4), (2, 2))]
  return base + (decode if tokens <= 64 else wide)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--shape", default="256,8,512,7168")  # E, top-k, N, K
  ap.add_argument("--tokens", default="16,64,256")
  ap.add_argument("--sets", type=int, default=2)
  ap.add_argument("--interpret", action="store_true")  # a CPU check of the configs
  ap.add_argument("--fold", action="store_true", help="time fp8_fold against the partials")
  ap.add_argument("--cluster", action="store_true", help="time clusters of column CTAs")
  ap.add_argument("--single", action="store_true", help="time Config.fp8_single_acc")
  ap.add_argument("--preset", default="w4a8-mxfp4")
  ap.add_argument("--wide", action="store_true",
                  help="--blocks on the 16-bit route (an A16 preset), scales before the MMA")
  ap.add_argument("--blocks", default=None,
                  help="comma list of rows per tile[:warpgroups[:stages]] (default 4 "
                       "warpgroups, the config's stages): the one-accumulator shared-x "
                       "tile at each (eager prepare)")
  a = ap.parse_args()
  e, topk, n, k = map(int, a.shape.split(","))
  spec = hj.QuantSpec.preset(a.preset)
  family = gw if spec.act is not None else g16  # the 16-bit route for A16 presets
  quant = jax.jit(lambda w: hj.quantize(w, spec))
  # --single: eager, so the ":cf" check (concrete scales) marks the layout for the
  # one-accumulator launch; the other modes time the per-group route of unmarked params
  def block(v):  # rows[:warpgroups[:stages]] (default 4 warpgroups, stages 0: the config's)
    parts = v.split(":")
    return tuple(map(int, parts + ["4", "0"][len(parts) - 1:]))
  blocks = [block(v) for v in a.blocks.split(",")] if a.blocks else None
  if a.wide and (not blocks or family is not g16):
    raise SystemExit("--wide needs --blocks and an A16 preset")
  prep = family.prepare if a.single or blocks else jax.jit(family.prepare)
  ps = [prep(quant(jax.random.normal(jax.random.key(i), (e, k, n), jnp.float32) / np.sqrt(k)))
        for i in range(a.sets)]
  assert family is g16 or "p8" in ps[0].layout.split(":"), ps[0].layout
  for tokens in map(int, a.tokens.split(",")):
    key = jax.random.key(tokens)
    ids = jnp.argsort(jax.random.uniform(key, (tokens, e)), axis=1)[:, :topk].astype(jnp.int32)
    g = moe.sort_tokens(ids, e).group_sizes
    x = jax.random.normal(jax.random.key(1), (tokens * topk, k), jnp.bfloat16)
    ref, line = None, []
    m = x.shape[0]
    for name, bm, change in variants(tokens, e, g16.tile_rows(m, e, ps[0]), a.fold,
                                    a.cluster, a.single, blocks, a.wide):
      block_m = bm or g16.tile_rows(m, e, ps[0])  # (the rows run() takes by default)
      if change is None:
        cfg = None
      elif isinstance(change, dict):
        launch = g16.default_launch(m, ps[0], block_m)
        if "cluster_n" in change and launch.split_warpgroups != "n":
          line.append(f"{name} n/a ({launch.split_warpgroups}-split launch)")
          continue
        cfg = dataclasses.replace(launch, **change)
      else:
        cfg = change
      f = jax.jit(lambda ps, x, g, cfg=cfg, bm=block_m: [
          family.run(p, x, g, config=cfg, block_m=bm, interpret=a.interpret) for p in ps])
      entry, ref = common.time_variant(name, f, (ps, x, g), per=a.sets, interpret=a.interpret,
                                       ref=ref, with_total=True, err_chars=60)
      line.append(entry)
    print(f"E{e} N{n} K{k} T={tokens}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
  main()
