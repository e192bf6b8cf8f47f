"""Autotune the WnA16 kernel configs for given shapes and write the JSON cache.

  python -m humming_jax.autotune --specs w4a16-g128,w4a16-mxfp4 --shapes 8192x8192 --ms 1,16,128

The kernel family is the one ``hj.quant_dense`` uses for the spec (registry): the Mosaic GPU
kernel (int4/int8 on Hopper; candidates ``tuning.mgpu_candidates``) or the Pallas-Triton
kernel (``tuning.wna16_candidates``).  Each candidate is timed with the chain method
(8 distinct weight sets per jitted call so the L2 cache does not hold them); the fastest
per (device kind, spec, M bucket, N, K) is merged into the cache that
``kernels/tuning.py`` consults at trace time (``HUMMING_JAX_TUNING_CACHE`` or
``~/.cache/humming_jax/tuning.json``).  Needs a GPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from tqdm import tqdm

import humming_jax as hj
from humming_jax.kernels import registry, tuning, wna16, wna16_mgpu


def _time(fn, params_list, x, calls: int) -> float:
  f = jax.jit(lambda ps, x: tuple(fn(p, x) for p in ps))
  jax.block_until_ready(f(params_list, x))
  samples = []
  for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(params_list, x)
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
        us = _time(lambda p, x, c=cfg: mod.run(p, x, config=c), params, x, calls)
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


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--specs", default="w4a16-g128")
  ap.add_argument("--shapes", default="8192x8192", help="KxN[,KxN...]")
  ap.add_argument("--ms", default="1,16,128")
  args = ap.parse_args(argv)
  if jax.default_backend() != "gpu":
    raise SystemExit("autotune needs a GPU (jax.default_backend() is "
                     f"{jax.default_backend()!r})")
  entries = {}
  for spec_name in args.specs.split(","):
    for shape in args.shapes.split(","):
      k, n = (int(v) for v in shape.lower().split("x"))
      entries.update(autotune(spec_name, k, n, [int(m) for m in args.ms.split(",")]))
  path = tuning.store_configs(entries)
  print(f"wrote {len(entries)} configs to {path}")


if __name__ == "__main__":
  main()
