"""Autotune the WnA16 kernel configs for given shapes and write the JSON cache.

  python -m humming_jax.autotune --specs w4a16-g128,w4a16-mxfp4 --shapes 8192x8192 --ms 1,16,128
  python -m humming_jax.autotune --specs w4a16-g128-zp --grouped 256:8:7168x512 --tokens 64,1024

The kernel family is the one ``hj.quant_dense`` uses for the spec (registry): the Mosaic GPU
kernel (int4/int8 on Hopper; candidates ``tuning.mgpu_candidates``) or the Pallas-Triton
kernel (``tuning.wna16_candidates``).  Each candidate is timed with the chain method
(8 distinct weight sets per jitted call so the L2 cache does not hold them); the fastest
per (device kind, spec, M bucket, N, K) is merged into the cache that
``kernels/tuning.py`` consults at trace time (``HUMMING_JAX_TUNING_CACHE`` or
``~/.cache/humming_jax/tuning.json``).  Needs a GPU.

``--grouped E:TOPK:KxN`` tunes the MoE grouped kernel ``hj.prepare(grouped=True)`` picks
for stacked (E, K, N) experts at the given token counts: tokens x TOPK rows routed
uniformly at random, the chain of 8 expert stacks; the winner is checked against
``reference.ragged_dot_reference`` before it is stored.
- The Mosaic grouped kernel (``grouped_wna16_mgpu``, and ``grouped_wnam_mgpu``'s W4A8 /
  W4A4 experts on it): rows per tile and launch, candidates
  ``grouped_wna16_mgpu.launch_candidates``, stored under ``launch_cache_key``, which
  ``grouped_wna16_mgpu.run`` looks up (``hj.quant_ragged_dot``, and ``hj.quant_moe``
  where it sorts rows; its tile-aligned W4A16 path keeps its own tile rows).  Weights are
  prepared eagerly, as a user would, so W4A8 MXFP4 experts tune the one-accumulator route.
- The Pallas-Triton grouped kernel (``kernels/grouped_wna16.py``, candidates
  ``grouped_wna16.grouped_candidates``), under the key ``grouped_wna16.choose_config``
  looks up.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
from tqdm import tqdm

import humming_jax as hj
from humming_jax import moe
from humming_jax.kernels import grouped_wna16, layout, reference, registry, tuning, wna16
from humming_jax.kernels import grouped_wna16_mgpu, grouped_wnam_mgpu, wna16_mgpu, wnam_mgpu


def _time(fn, params_list, args: tuple, calls: int) -> float:
  """Microseconds per layer of ``fn(p, *args)`` over the chain of ``params_list``."""
  f = jax.jit(lambda ps, *a: tuple(fn(p, *a) for p in ps))
  jax.block_until_ready(f(params_list, *args))
  samples = []
  for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(params_list, *args)
    jax.block_until_ready(out)
    samples.append((time.perf_counter() - t0) / (calls * len(params_list)) * 1e6)
  return statistics.median(samples)


def autotune(spec_name: "str | hj.QuantSpec", k: int, n: int, ms: list[int], *, layers: int = 8,
             calls: int = 20) -> dict:
  spec = spec_name if isinstance(spec_name, hj.QuantSpec) else hj.QuantSpec.preset(spec_name)
  family = registry.find(spec)
  if family is None or family.name not in (wna16.FAMILY, wna16_mgpu.FAMILY):
    raise ValueError(f"spec {spec.name}: no WnA16 kernel to tune")
  mod = wna16_mgpu if family.name == wna16_mgpu.FAMILY else wna16
  candidates = (tuning.mgpu_candidates if mod is wna16_mgpu else tuning.wna16_candidates)
  keys = jax.random.split(jax.random.key(0), layers + 1)
  quant = jax.jit(hj.quantize, static_argnums=1)
  params = [jax.jit(mod.prepare)(quant(jax.random.normal(kk, (k, n)) / k**0.5, spec))
            for kk in keys[:layers]]
  best = {}
  for m in ms:
    x = jax.random.normal(keys[-1], (m, k), jnp.bfloat16)
    results = []
    for cfg in tqdm(candidates(m), desc=f"{spec.name} M={m}", leave=False):
      try:
        us = _time(lambda p, x, c=cfg: mod.run(p, x, config=c), params, (x,), calls)
        results.append((us, cfg))
      except Exception as e:  # noqa: BLE001 - e.g. shared memory exceeded: skip the candidate
        tqdm.write(f"  skip {cfg}: {type(e).__name__}")
    if not results:
      raise RuntimeError(f"no candidate config ran for {spec.name} M={m}")
    us, cfg = min(results, key=lambda t: t[0])
    key = tuning.cache_key(mod.FAMILY, spec.name, tuning.bucket_m(m), n, k,
                           tuning.device_kind())
    best[key] = cfg
    print(f"{spec.name} M={m} K={k} N={n}: {us:.1f} us/layer with {cfg}")
  return best


MOSAIC_GROUPED = (grouped_wna16_mgpu.FAMILY, grouped_wnam_mgpu.FAMILY)


def _checked(y: jax.Array, ref: jax.Array, tol: float, what: str) -> float:
  """The relative error of a tuning winner's output ``y`` against the reference; raises
  (naming ``what``) past ``tol``, so a wrong launch is never stored."""
  err = float(jnp.linalg.norm((y - ref).astype(jnp.float32))
              / jnp.maximum(jnp.linalg.norm(ref.astype(jnp.float32)), 1e-30))
  if not err <= tol:
    raise RuntimeError(f"{what} gives relative error {err:.2e} vs the reference (limit "
                       f"{tol}); not stored")
  return err


def _fastest(runs, params: list, args: tuple, calls: int, what: str):
  """(us, tag) of the fastest of ``runs`` -- (tag, fn(p, *args)) pairs -- over the chain
  of ``params``; a candidate that fails (e.g. shared memory exceeded) is skipped, and
  RuntimeError (naming ``what``) if none ran."""
  results = []
  for tag, run in tqdm(runs, desc=what, leave=False):
    try:
      results.append((_time(run, params, args, calls), tag))
    except Exception as e:  # noqa: BLE001 - e.g. shared memory exceeded: skip it
      tqdm.write(f"  skip {tag}: {type(e).__name__}")
  if not results:
    raise RuntimeError(f"no candidate ran for {what}")
  return min(results, key=lambda r: r[0])


def _routed_rows(num_experts: int, topk: int, k: int, tokens: int, key: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
  """(tokens * topk, K) bf16 rows sorted by expert and their (E,) group sizes: a uniform
  random top-k routing of random tokens (what both grouped tunings time)."""
  ids = jnp.argsort(jax.random.uniform(jax.random.fold_in(key, 0), (tokens, num_experts)),
                    axis=1)[:, :topk].astype(jnp.int32)
  routed = moe.sort_tokens(ids, num_experts)
  x = jax.random.normal(jax.random.fold_in(key, 1), (tokens, k), jnp.bfloat16)
  return jnp.take(x, routed.token_of_row, axis=0), routed.group_sizes


def autotune_grouped(spec_name: "str | hj.QuantSpec", num_experts: int, topk: int, k: int,
                     n: int, tokens: list[int], *, layers: int = 8, calls: int = 20,
                     interpret: bool = False, candidates=None, tol: float = 1e-2) -> dict:
  """Time the grouped kernel's candidates at each token count; return {cache key: best}.

  ``candidates(m, e, n_padded, k_tiles)`` overrides the search space (tests);
  ``interpret`` runs the kernels in the Pallas interpreter (CPU tests: timings there mean
  nothing, the keys and the correctness check do)."""
  spec = spec_name if isinstance(spec_name, hj.QuantSpec) else hj.QuantSpec.preset(spec_name)
  if not grouped_wna16.supports(spec):
    raise ValueError(f"spec {spec.name}: the grouped WnA16 kernel does not run it")
  if not 1 <= topk <= num_experts:
    raise ValueError(f"topk={topk}: expected 1 <= topk <= num_experts={num_experts}")
  default = registry.find(spec, grouped=True, shape=(num_experts, k, n))
  if default is not None and default.name != grouped_wna16.FAMILY:
    # The entries still serve params prepared with kernel="grouped_wna16".
    tqdm.write(f"note: hj.prepare(grouped=True) picks {default.name} for (E={num_experts}, "
               f"K={k}, N={n}); this tunes the {grouped_wna16.FAMILY} kernel")
  keys = jax.random.split(jax.random.key(0), layers + 1)
  quant = jax.jit(hj.quantize, static_argnums=1)
  qs = [quant(jax.random.normal(kk, (num_experts, k, n)) / k**0.5, spec) for kk in keys[:layers]]
  params = [jax.jit(grouped_wna16.prepare)(q) for q in qs]
  _, lt = layout.parse_layout_name(params[0].layout)
  np_ = params[0].codes.shape[2]
  k_tiles = lt.k_of_rows(params[0].codes.shape[1]) // lt.block_k
  cands = candidates or (lambda m, e, n_, kt: grouped_wna16.grouped_candidates(
      m, e, n_, kt, lt=lt))
  best = {}
  for t in tokens:
    xr, gs = _routed_rows(num_experts, topk, k, t, jax.random.fold_in(keys[-1], t))
    m = xr.shape[0]
    runs = [(cfg, lambda p, x, g, c=cfg: grouped_wna16.run(p, x, g, config=c,
                                                            interpret=interpret))
            for cfg in cands(m, num_experts, np_, k_tiles)]
    us, cfg = _fastest(runs, params, (xr, gs), calls, f"{spec.name} E={num_experts} T={t}")
    err = _checked(grouped_wna16.run(params[0], xr, gs, config=cfg, interpret=interpret),
                   reference.ragged_dot_reference(qs[0], xr, gs), tol,
                   f"{spec.name} E={num_experts} T={t}: config {cfg}")
    key = tuning.cache_key(f"{grouped_wna16.FAMILY}/e{num_experts}", spec.name,
                           tuning.bucket_m(m), np_, k, tuning.device_kind())
    best[key] = cfg
    print(f"{spec.name} E={num_experts} top{topk} T={t} (M={m}) K={k} N={n}: {us:.1f} us "
          f"per grouped GEMM with {cfg} (rel err {err:.1e})")
  return best


def autotune_grouped_mgpu(spec_name: "str | hj.QuantSpec", num_experts: int, topk: int,
                          k: int, n: int, tokens: list[int], *, layers: int = 8,
                          calls: int = 20, interpret: bool = False, candidates=None,
                          tol: float = 1e-2) -> dict:
  """Time the Mosaic grouped kernel's launches (rows per tile, Config) at each token
  count; return {``grouped_wna16_mgpu.launch_cache_key``: Config with ``block_m`` = the
  rows per tile}.  ``candidates(m, params)`` overrides the search space (tests);
  ``interpret`` as in :func:`autotune_grouped`.  Token counts whose M falls under one
  cache key (``launch_cache_key``: M bucket and default rows per tile) are refused: the
  later winner would replace the earlier."""
  spec = spec_name if isinstance(spec_name, hj.QuantSpec) else hj.QuantSpec.preset(spec_name)
  if not 1 <= topk <= num_experts:
    raise ValueError(f"topk={topk}: expected 1 <= topk <= num_experts={num_experts}")
  family = registry.find(spec, grouped=True, shape=(num_experts, k, n))
  if family is None or family.name not in MOSAIC_GROUPED:
    raise ValueError(f"spec {spec.name} with (E={num_experts}, K={k}, N={n}): "
                     f"hj.prepare(grouped=True) picks "
                     f"{None if family is None else family.name}, not one of the Mosaic "
                     f"grouped kernels {MOSAIC_GROUPED}")
  keys = jax.random.split(jax.random.key(0), layers + 1)
  quant = jax.jit(hj.quantize, static_argnums=1)
  qs = [quant(jax.random.normal(kk, (num_experts, k, n)) / k**0.5, spec) for kk in keys[:-1]]
  # eagerly, as a user prepares: the ":cf" check of W4A8 MXFP4 experts needs the scales
  params = [jax.block_until_ready(hj.prepare(q, grouped=True, kernel=family.name))
            for q in qs]
  wnam = family.name == grouped_wnam_mgpu.FAMILY
  run_family = grouped_wnam_mgpu.run if wnam else grouped_wna16_mgpu.run
  # the params grouped_wna16_mgpu.run sees (and keys its cache lookup on)
  view = (wnam_mgpu.family_view(params[0], grouped_wna16_mgpu.FAMILY) if wnam
          else params[0])
  cands = candidates or grouped_wna16_mgpu.launch_candidates
  owners = {}
  for t in tokens:
    owners.setdefault(grouped_wna16_mgpu.launch_cache_key(view, t * topk), []).append(t)
  if shared := [ts for ts in owners.values() if len(ts) > 1]:
    raise ValueError(f"tokens {shared}: each group falls under one autotune cache key (M "
                     f"bucket and default rows per tile); tune one token count of each")
  best = {}
  for t in tokens:
    xr, gs = _routed_rows(num_experts, topk, k, t, jax.random.fold_in(keys[-1], t))
    m = xr.shape[0]
    runs = [((rows, cfg), lambda p, x, g, c=cfg, r=rows: run_family(
        p, x, g, config=c, block_m=r, interpret=interpret)) for rows, cfg in cands(m, view)]
    us, (rows, cfg) = _fastest(runs, params, (xr, gs), calls,
                               f"{spec.name} E={num_experts} T={t}")
    err = _checked(run_family(params[0], xr, gs, config=cfg, block_m=rows,
                              interpret=interpret),
                   reference.ragged_dot_reference(qs[0], xr, gs), tol,
                   f"{spec.name} E={num_experts} T={t}: {rows} rows per tile with {cfg}")
    best[grouped_wna16_mgpu.launch_cache_key(view, m)] = dataclasses.replace(cfg,
                                                                             block_m=rows)
    print(f"{spec.name} E={num_experts} top{topk} T={t} (M={m}) K={k} N={n}: {us:.1f} us "
          f"per grouped GEMM, {rows} rows per tile with {cfg} (rel err {err:.1e})")
  return best


def _parse_grouped(item: str) -> tuple[int, int, int, int]:
  try:
    e, topk, shape = item.split(":")
    k, n = (int(v) for v in shape.lower().split("x"))
    return int(e), int(topk), k, n
  except ValueError:
    raise SystemExit(f"--grouped {item!r}: expected E:TOPK:KxN, e.g. 256:8:7168x512") from None


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--specs", default="w4a16-g128")
  ap.add_argument("--shapes", default="8192x8192", help="KxN[,KxN...]")
  ap.add_argument("--ms", default="1,16,128")
  ap.add_argument("--grouped", default=None,
                  help="MoE experts E:TOPK:KxN[,...] (tunes the grouped kernel instead)")
  ap.add_argument("--tokens", default="1,64,1024", help="token counts for --grouped")
  ap.add_argument("--triton", action="store_true",
                  help="--grouped: tune the Pallas-Triton grouped kernel even where "
                       "hj.prepare(grouped=True) picks a Mosaic one (for params prepared "
                       "with kernel='grouped_wna16')")
  args = ap.parse_args(argv)
  groups = [_parse_grouped(g) for g in args.grouped.split(",")] if args.grouped else []
  if jax.default_backend() != "gpu":
    raise SystemExit("autotune needs a GPU (jax.default_backend() is "
                     f"{jax.default_backend()!r})")
  entries = {}
  for spec_name in args.specs.split(","):
    for e, topk, k, n in groups:
      spec = hj.QuantSpec.preset(spec_name)
      family = registry.find(spec, grouped=True, shape=(e, k, n))
      tune = (autotune_grouped_mgpu if family is not None and family.name in MOSAIC_GROUPED
              and not args.triton else autotune_grouped)
      entries.update(tune(spec, e, topk, k, n, [int(t) for t in args.tokens.split(",")]))
    for shape in ([] if groups else args.shapes.split(",")):
      k, n = (int(v) for v in shape.lower().split("x"))
      entries.update(autotune(spec_name, k, n, [int(m) for m in args.ms.split(",")]))
  path = tuning.store_configs(entries)
  print(f"wrote {len(entries)} configs to {path}")


if __name__ == "__main__":
  main()
