"""Quantize one 4096x4096 N(0,1) layer under every preset and print what it costs and how
far it is from the float layer.

    PYTHONPATH=. python examples/presets_table.py [--k 4096 --n 4096 --m 8]

Columns: preset, weight format, bits/weight and bytes as stored (hj.report), relative
Frobenius error of the dequantized weight, relative error of ``quant_dense`` against a bf16
``x @ w`` on random x (M rows), and the wall time (quantize + quant_dense, compile included).
Everything runs under ``jax.jit``, so a 2-core CPU does all presets in about a minute.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import humming_jax as hj


def _rel(a: jax.Array, b: jax.Array) -> float:
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def rows(k: int = 4096, n: int = 4096, m: int = 8, seed: int = 0) -> list[dict]:
  """One dict per preset: the numbers of the table."""
  kw, kx = jax.random.split(jax.random.key(seed))
  w = jax.random.normal(kw, (k, n), jnp.float32)
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  y_bf16 = jnp.dot(x, w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
  quantize = jax.jit(hj.quantize, static_argnums=1)
  dense = jax.jit(hj.quant_dense)
  w_err = jax.jit(lambda q, w: jnp.linalg.norm(hj.dequantize(q) - w) / jnp.linalg.norm(w))
  out = []
  for name, spec in hj.PRESETS.items():
    t0 = time.perf_counter()
    q = quantize(w, name)
    y = dense(q, x).block_until_ready()
    seconds = time.perf_counter() - t0
    (t,) = hj.report(q).tensors
    out.append(dict(preset=name, format=spec.weight + (f" x {spec.act}" if spec.act else ""),
                    bits=t.bits_per_weight, bytes=t.bytes, w_err=float(w_err(q, w)),
                    y_err=_rel(y, y_bf16), seconds=seconds))
  return out


def format_table(rs: list[dict], k: int, n: int) -> str:
  head = (f"{'preset':<16} {'format':<22} {'bits/w':>7} {'bytes':>12} {'deq err':>8} "
          f"{'out err':>8} {'time s':>7}")
  lines = [head, "-" * len(head)]
  for r in rs:
    lines.append(f"{r['preset']:<16} {r['format']:<22} {r['bits']:>7.3f} {r['bytes']:>12,} "
                 f"{r['w_err']:>8.2%} {r['y_err']:>8.2%} {r['seconds']:>7.2f}")
  lines.append(f"bf16 reference: {2 * k * n:,} bytes (16 bits/weight). deq err: relative "
               "Frobenius error of the dequantized weight; out err: quant_dense vs bf16 x @ w.")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--k", type=int, default=4096)
  p.add_argument("--n", type=int, default=4096)
  p.add_argument("--m", type=int, default=8)
  a = p.parse_args(argv)
  t0 = time.perf_counter()
  rs = rows(a.k, a.n, a.m)
  print(f"{a.k}x{a.n} N(0,1) weight, x: ({a.m}, {a.k}) bf16, backend: "
        f"{jax.default_backend()}")
  print(format_table(rs, a.k, a.n))
  print(f"total {time.perf_counter() - t0:.1f} s")
  return rs


if __name__ == "__main__":
  main()
