"""What a training step pays for quant_dense: CUPTI kernel time of the forward and of
value_and_grad with respect to x, against a bf16 layer, on the GPU.

    PYTHONPATH=. python3 benchmarks/probe_grad.py [--ms 16,1024,4096] [--size 8192]

Rows per M (µs, the sum of the kernels one call launches, median of 5):
  fwd        hj.quant_dense (the Pallas kernel)
  grad       jax.value_and_grad of sum(quant_dense(p, x) * dy) w.r.t. x: the kernel forward
             and quant_dense's XLA backward (reference.dense_gradient_reference: W in bf16,
             default precision; HUMMING_JAX_DX_KERNEL=0, the dx kernel being the default
             at M <= 64 since session 46)
  grad_relayout  the same with the backward's W read through to_canonical (session 40's
             form: the prepared layout converted back to canonical codes on every call)
  grad_dxk   grad with HUMMING_JAX_DX_KERNEL=1: the cotangent of x from the Pallas-Triton
             dy . W^T kernel on the prepared layout (kernels/wna16_mgpu_dx.py), where M
             <= wna16_mgpu_dx.MAX_M
  dx_xla / dx_kernel   the cotangent alone: XLA's dequantization + GEMM, and the kernel
             (checked against it first)
  bf16_fwd / bf16_grad   x @ W with a bf16 W (XLA): what a float layer pays
With --moe-tokens, a Qwen3-30B-A3B-shaped hj.quant_moe layer (E 128, top-8, H 2048, I 768,
experts prepared for the grouped kernel): moe_fwd and moe_grad (value_and_grad w.r.t. x;
the backward is ragged_dot_xla's VJP, which decodes only the routed experts, from their
prepared layout), and moe_grad_dxk (HUMMING_JAX_DX_KERNEL=1: both GEMMs' cotangents of x
from the grouped dy . W_e^T kernel; its dx checked against moe_grad's first).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import humming_jax as hj  # noqa: E402
from benchmarks import common  # noqa: E402
from humming_jax.kernels import registry, wna16_mgpu_dx  # noqa: E402


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ms", default="16,1024,4096")
  ap.add_argument("--size", type=int, default=8192)
  ap.add_argument("--spec", default="w4a16-g128-zp")
  ap.add_argument("--moe-tokens", default="", help="e.g. 16,256 (empty: no MoE rows)")
  ap.add_argument("--no-relayout", action="store_true",
                  help="skip the grad_relayout row (session 40's form: one more compile)")
  ap.add_argument("--breakdown", action="store_true",
                  help="also print the grad row's kernels (largest first)")
  args = ap.parse_args()
  k = n = args.size
  w = jax.random.normal(jax.random.key(0), (k, n)) / k ** 0.5
  p = hj.prepare(hj.quantize(w, args.spec))
  wb = w.astype(jnp.bfloat16)
  for m in (int(v) for v in args.ms.split(",") if v):
    x = jax.random.normal(jax.random.key(1), (m, k), jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(2), (m, n), jnp.bfloat16)
    loss = lambda x: jnp.sum((hj.quant_dense(p, x) * dy).astype(jnp.float32))
    bf16_loss = lambda x: jnp.sum(((x @ wb) * dy).astype(jnp.float32))
    rows = {"fwd": (lambda x: hj.quant_dense(p, x)),
            "grad": jax.value_and_grad(loss),
            "bf16_fwd": (lambda x: x @ wb),
            "bf16_grad": jax.value_and_grad(bf16_loss)}
    with env("HUMMING_JAX_DX_KERNEL", "0"):  # "grad": the XLA route (the kernel is the
      # default at M <= 64 since session 46; grad_dxk below has it)
      times = {name: common.kernel_times(jax.jit(f), (x,)) for name, f in rows.items()}
    out = {name: sum(t.values()) for name, t in times.items()}
    if args.breakdown:
      for name, us in sorted(times["grad"].items(), key=lambda kv: -kv[1])[:8]:
        print(f"  M={m} grad kernel {us:8.1f} us  {name}")
      # the backward's GEMM alone, W in either orientation
      alone = {"bwd_kn": lambda dy: jnp.dot(dy, registry.dequantize(p, jnp.bfloat16).T),
               "bwd_nk": lambda dy: jnp.dot(dy, transposed_weights(p))}
      ref = jnp.dot(dy, registry.dequantize(p, jnp.bfloat16).T)
      assert float(jnp.max(jnp.abs(alone["bwd_nk"](dy) - ref))) <= 1e-2 * float(
          jnp.max(jnp.abs(ref))), "transposed_weights disagrees"
      for name, f in alone.items():
        t = common.kernel_times(jax.jit(f), (dy,))
        print(f"  M={m} {name} {sum(t.values()):.1f} us: " + ", ".join(
            f"{k_} {v:.1f}" for k_, v in sorted(t.items(), key=lambda kv: -kv[1])[:4]))
    if m <= wna16_mgpu_dx.MAX_M and wna16_mgpu_dx.unsupported_reason(p, dy) is None:
      dx_rows = {"dx_xla": lambda dy: wna16_mgpu_dx.reference(p, dy),
                 "dx_kernel": lambda dy: wna16_mgpu_dx.run(p, dy)}
      ref, got = (jax.jit(f)(dy).astype(jnp.float32) for f in dx_rows.values())
      err = float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))
      assert err <= 1e-2, f"dx kernel disagrees with its reference: {err:.2e}"
      for name, f in dx_rows.items():
        out[name] = sum(common.kernel_times(jax.jit(f), (dy,)).values())
      with env("HUMMING_JAX_DX_KERNEL", "1"):
        out["grad_dxk"] = sum(common.kernel_times(jax.jit(jax.value_and_grad(loss)),
                                                  (x,)).values())
    if not args.no_relayout:
      with env("HUMMING_JAX_DX_KERNEL", "0"):
        out["grad_relayout"] = relayout_grad_us(p, x, dy)
    print(f"M={m} {args.spec} {k}x{n} us: " + "  ".join(f"{name} {us:.1f}"
                                                          for name, us in out.items()))
  if args.moe_tokens:
    moe_rows(args.spec, [int(v) for v in args.moe_tokens.split(",")])


def relayout_grad_us(p, x, dy) -> float:
  """The grad row with session 40's backward: every call re-lays W out to canonical."""
  read = registry.dequantize
  registry.dequantize = lambda q, dtype=jnp.float32: read(registry.to_canonical(q), dtype)
  try:
    return sum(common.kernel_times(jax.jit(jax.value_and_grad(
        lambda x: jnp.sum((hj.quant_dense(p, x) * dy).astype(jnp.float32)))), (x,)).values())
  finally:
    registry.dequantize = read


def float32_moe_grad(gate_up, down, x, dy, topk_weights, topk_ids):
  """d/dx of sum(layer(x) * dy) for the same quantized experts, every step in float32 at
  HIGHEST precision: the oracle both backward routes round away from.  Each routed pair's
  experts are gathered whole (Qwen3-30B-A3B: ~2.4 GB at 16 tokens, growing with the
  tokens): for small token counts only."""
  wgu, wdn = hj.dequantize(gate_up), hj.dequantize(down)  # float32 (E, K, N)
  w = topk_weights.astype(jnp.float32)

  def layer(x):
    h = jnp.einsum("tk,tjkn->tjn", x, wgu[topk_ids], precision="highest")
    i = h.shape[-1] // 2
    z = jax.nn.silu(h[..., :i]) * h[..., i:]
    y = jnp.einsum("tji,tjih->tjh", z, wdn[topk_ids], precision="highest")
    return jnp.einsum("tj,tjh->th", w, y, precision="highest")
  return jax.jit(jax.grad(lambda x: jnp.sum(layer(x) * dy.astype(jnp.float32))))(
      x.astype(jnp.float32))


@contextlib.contextmanager
def env(name: str, value: str):
  """An environment switch for what is traced inside (the kernels read it at trace time:
  JAX's trace caches are cleared on the way in and out)."""
  old = os.environ.get(name)
  os.environ[name] = value
  jax.clear_caches()
  try:
    yield
  finally:
    if old is None:
      del os.environ[name]
    else:
      os.environ[name] = old
    jax.clear_caches()


def transposed_weights(p, dtype=jnp.bfloat16):
  """(N, K) W^T from a wna16_mgpu layout of groups that are whole K tiles (int4 g128 zp):
  the (t, Np, bk) codes keep bk contiguous, so only the tile axis moves."""
  from humming_jax.kernels import wna16_mgpu  # noqa: PLC0415
  k, n = p.shape
  t, np_, bk = p.codes.shape
  gk = t * bk // p.scales.shape[0]
  assert gk % bk == 0, "probe: groups of whole K tiles only"
  rows = (jnp.arange(t) * bk) // gk
  c = wna16_mgpu.code_values(p, dtype)  # (t, Np, bk)
  if p.zeros is not None:
    c = c - p.zeros[rows].astype(dtype)[:, :, None]
  w = c * p.scales[rows].astype(dtype)[:, :, None]
  return w.transpose(1, 0, 2).reshape(np_, t * bk)[:n, :k]


def moe_rows(spec: str, token_counts: list[int], e: int = 128, topk: int = 8,
             h: int = 2048, i: int = 768) -> None:
  keys = jax.random.split(jax.random.key(3), 6)
  gate_up = hj.prepare(hj.quantize(jax.random.normal(keys[0], (e, h, 2 * i)) / h ** 0.5,
                                   spec), grouped=True)
  down = hj.prepare(hj.quantize(jax.random.normal(keys[1], (e, i, h)) / i ** 0.5, spec),
                    grouped=True)
  for t in token_counts:
    x = jax.random.normal(keys[2], (t, h), jnp.bfloat16)
    dy = jax.random.normal(keys[3], (t, h), jnp.bfloat16)
    logits = jax.random.normal(keys[4], (t, e))
    topk_weights, topk_ids = jax.lax.top_k(jax.nn.softmax(logits), topk)
    layer = lambda x: hj.quant_moe(gate_up, down, x, topk_weights, topk_ids)
    loss = lambda x: jnp.sum((layer(x) * dy).astype(jnp.float32))
    with env("HUMMING_JAX_DX_KERNEL", "0"):  # the XLA route (stacks: also the default)
      grad = jax.jit(jax.value_and_grad(loss))  # one compile for its time and the check
      times = {"moe_fwd": common.kernel_times(jax.jit(layer), (x,)),
               "moe_grad": common.kernel_times(grad, (x,))}
      want = grad(x)[1].astype(jnp.float32)
    truth = (float32_moe_grad(gate_up, down, x, dy, topk_weights, topk_ids) if t <= 32
             else None)  # (its whole-expert gathers grow with the tokens)
    with env("HUMMING_JAX_DX_KERNEL", "1"):  # the grouped dx kernel (opt-in)
      grad_k = jax.jit(jax.value_and_grad(loss))
      got = grad_k(x)[1].astype(jnp.float32)
      rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
      print(f"tokens={t} dx max|err|/max: kernel route vs XLA route {rel(got, want):.2e}",
            flush=True)
      if truth is not None:
        print(f"tokens={t} vs the float32 layer: XLA route {rel(want, truth):.2e}, kernel "
              f"route {rel(got, truth):.2e}; mean|err| XLA "
              f"{float(jnp.mean(jnp.abs(want - truth))):.3e} kernel "
              f"{float(jnp.mean(jnp.abs(got - truth))):.3e}", flush=True)
      times["moe_grad_dxk"] = common.kernel_times(grad_k, (x,))
    out = {name: sum(t.values()) for name, t in times.items()}
    for name, us in sorted(times["moe_grad"].items(), key=lambda kv: -kv[1])[:6]:
      print(f"  tokens={t} moe_grad kernel {us:8.1f} us  {name}")
    print(f"MoE tokens={t} {spec} E={e} top-{topk} H={h} I={i} us: "
          + "  ".join(f"{name} {us:.1f}" for name, us in out.items()))


if __name__ == "__main__":
  main()
