"""Decode-step time of a Llama-style block stack per recipe vs bf16: the concurrency ladder.

    PYTHONPATH=. python3 examples/llama_decode.py                 # Llama-3-8B shapes (GPU)
    PYTHONPATH=. python examples/llama_decode.py --small          # tiny shapes, CPU, seconds

Random weights at Llama-3-8B shapes (hidden 4096, intermediate 14336, 32 query heads / 8
KV heads of 128, RMSNorm, RoPE, SwiGLU), ``--layers`` blocks (default 2), one decode step
(one new token per sequence attending to a ``--context``-token KV cache) at batch 1, 8,
32, 128.  The model is plain ``flax.linen`` with ``nn.Dense`` (HF names: self_attn/q_proj,
mlp/gate_proj, ...); each recipe is ``hj.quantize_params`` + ``hj.nn.apply_quantized``
(backend=None: Pallas on GPU where a kernel exists, XLA otherwise).  Prints weight bytes
and, per batch, the first call (compile + run) and the steady-state step time (median).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import humming_jax as hj  # noqa: E402
from humming_jax import nn as hnn  # noqa: E402

LLAMA3_8B = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128)
SMALL = dict(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)


class RMSNorm(nn.Module):
  eps: float = 1e-5

  @nn.compact
  def __call__(self, x):
    w = self.param("weight", nn.initializers.ones, (x.shape[-1],), jnp.bfloat16)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def rope(x, pos, theta=500000.0):
  """Rotary embedding of (B, T, heads, d) at integer positions (T,)."""
  d = x.shape[-1]
  inv = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  ang = pos[:, None].astype(jnp.float32) * inv[None]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


class Attention(nn.Module):
  heads: int
  kv_heads: int
  head_dim: int

  @nn.compact
  def __call__(self, x, k_cache, v_cache):
    b, t, h = x.shape
    dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=jnp.bfloat16,
                                     param_dtype=jnp.bfloat16, name=name)
    pos = jnp.full((t,), k_cache.shape[1], jnp.int32)
    q = rope(dense(self.heads * self.head_dim, "q_proj")(x).reshape(
        b, t, self.heads, self.head_dim), pos)
    k = rope(dense(self.kv_heads * self.head_dim, "k_proj")(x).reshape(
        b, t, self.kv_heads, self.head_dim), pos)
    v = dense(self.kv_heads * self.head_dim, "v_proj")(x).reshape(
        b, t, self.kv_heads, self.head_dim)
    k = jnp.concatenate([k_cache, k], axis=1)
    v = jnp.concatenate([v_cache, v], axis=1)
    g = self.heads // self.kv_heads  # grouped-query attention
    q = q.reshape(b, t, self.kv_heads, g, self.head_dim)
    s = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s / np.sqrt(self.head_dim), axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgts,bskd->btkgd", p, v).reshape(b, t, self.heads * self.head_dim)
    return dense(h, "o_proj")(o)


class MLP(nn.Module):
  intermediate: int

  @nn.compact
  def __call__(self, x):
    dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=jnp.bfloat16,
                                     param_dtype=jnp.bfloat16, name=name)
    h = jax.nn.silu(dense(self.intermediate, "gate_proj")(x)) * dense(
        self.intermediate, "up_proj")(x)
    return dense(x.shape[-1], "down_proj")(h)


class Block(nn.Module):
  cfg: dict

  @nn.compact
  def __call__(self, x, k_cache, v_cache):
    c = self.cfg
    x = x + Attention(c["heads"], c["kv_heads"], c["head_dim"], name="self_attn")(
        RMSNorm(name="input_layernorm")(x), k_cache, v_cache)
    return x + MLP(c["intermediate"], name="mlp")(RMSNorm(name="post_attention_layernorm")(x))


class Decoder(nn.Module):
  cfg: dict
  layers: int

  @nn.compact
  def __call__(self, x, caches):
    for i in range(self.layers):
      x = Block(self.cfg, name=f"layers_{i}")(x, *caches[i])
    return x


def random_params(model, x, caches, seed=0):
  """bf16 random weights with the model's tree (std 0.02; norms at 1): no fp32 init pass."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, caches))["params"]
  leaves, tree = jax.tree.flatten(shapes)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  out = [jnp.ones(s.shape, s.dtype) if len(s.shape) == 1 else
         (0.02 * jax.random.normal(k, s.shape, jnp.float32)).astype(jnp.bfloat16)
         for k, s in zip(keys, leaves)]
  return jax.tree.unflatten(tree, out)


def step_time(fn, *args, runs):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  ts = []
  for _ in range(runs):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return first, float(np.median(ts))


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke run)")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--context", type=int, default=None, help="cached tokens (default 1024; "
                  "64 with --small)")
  ap.add_argument("--batches", default=None, help="comma list (default 1,8,32,128; 1,8 with "
                  "--small)")
  ap.add_argument("--recipes", default="w4a16-all,w8a16-all,w8a8-fp8-all,w8a8-int8-all,"
                  "nvfp4-all,fp8-attn-nvfp4-mlp")
  ap.add_argument("--runs", type=int, default=None, help="steady-state calls (default 20; "
                  "3 with --small)")
  args = ap.parse_args(argv)
  cfg = SMALL if args.small else LLAMA3_8B
  ctx = args.context or (64 if args.small else 1024)
  batches = [int(b) for b in (args.batches or ("1,8" if args.small else "1,8,32,128"))
             .split(",")]
  runs = args.runs or (3 if args.small else 20)
  recipes = [r for r in args.recipes.split(",") if r]

  print(f"Llama-style decoder, {args.layers} layers, {cfg}, context {ctx}; jax "
        f"{jax.__version__} on {jax.devices()[0].device_kind}")
  model = Decoder(cfg, args.layers)

  def inputs(b):
    kv = lambda i: jax.random.normal(jax.random.key(100 + i), (b, ctx, cfg["kv_heads"],
                                                               cfg["head_dim"]), jnp.bfloat16)
    caches = [(kv(2 * i), kv(2 * i + 1)) for i in range(args.layers)]
    return jax.random.normal(jax.random.key(1), (b, 1, cfg["hidden"]), jnp.bfloat16), caches

  x0, c0 = inputs(1)
  params = random_params(model, x0, c0)
  fwd = jax.jit(lambda p, x, c: hnn.apply_quantized(model, {"params": p}, x, c))
  variants = [("bf16", params)]
  for r in recipes:
    t0 = time.perf_counter()
    q = hj.recipes.prepare_params(hj.quantize_params(params, r, progress=False))
    jax.block_until_ready(q)
    variants.append((r, q))
    print(f"  quantized {r} in {time.perf_counter() - t0:.1f}s")

  results = {}
  head = "".join(f" {'b=' + str(b) + ' first s':>13} {'steady ms':>10} {'x':>5}" for b in batches)
  print(f"\n{'recipe':<20} {'MiB':>9}" + head)
  base = {}
  for name, p in variants:
    mib = hj.report(p).total_bytes / 2**20
    line = f"{name:<20} {mib:>9.1f}"
    for b in batches:
      x, c = inputs(b)
      first, steady = step_time(fwd, p, x, c, runs=runs)
      base.setdefault(b, steady)
      results[(name, b)] = (first, steady)
      line += f" {first:>13.2f} {steady * 1e3:>10.3f} {base[b] / steady:>5.2f}"
    print(line, flush=True)
  print("x = bf16 steady time / this recipe's (higher is faster); first = compile + run")
  return results


if __name__ == "__main__":
  main()
