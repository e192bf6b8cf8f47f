"""Fine-tuning around frozen quantized weights: LoRA adapters on a 4-bit base (QLoRA-style).

    PYTHONPATH=. python examples/lora_finetune.py               # CPU: XLA path, seconds
    PYTHONPATH=. python examples/lora_finetune.py --backend interpret   # the Pallas kernels
    PYTHONPATH=. python3 examples/lora_finetune.py --dim 4096   # GPU: the Pallas kernels

A "pretrained" float layer W0 is quantized once (int4, groups of 128, zero points) and
frozen; a rank-r adapter ``x @ A @ B`` is trained with Adam so that the layer learns a new
task, ``y = x @ (W0 + U V)`` with a rank-4 change U V.  The forward runs
``hj.quant_dense`` (the Pallas kernel on a GPU); ``jax.grad`` reaches A, B and x through
its backward (the XLA reference's VJP, humming_jax/autodiff.py).  Prints the loss before
training (the adapter is zero) and after, beside the quantized base plus the exact change
(the base's quantization error; the adapter can also fit a little of that error, so it may
end slightly below).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax  # a dependency of flax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import humming_jax as hj  # noqa: E402
from humming_jax import nn as hnn  # noqa: E402


class LoRAQuantDense(nn.Module):
  """A frozen quantized Dense plus a trainable low-rank adapter (B starts at zero, so the
  adapted layer starts as the quantized base)."""
  features: int
  rank: int = 16
  spec: str = "w4a16-g128-zp"
  backend: str | None = None

  @nn.compact
  def __call__(self, x):
    base = hnn.QuantDense(self.features, use_bias=False, spec=self.spec,
                          backend=self.backend, name="base")(x)
    a = self.param("lora_a", nn.initializers.normal(x.shape[-1] ** -0.5),
                   (x.shape[-1], self.rank), jnp.float32)
    b = self.param("lora_b", nn.initializers.zeros, (self.rank, self.features), jnp.float32)
    return base + ((x.astype(jnp.float32) @ a) @ b).astype(base.dtype)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--dim", type=int, default=512, help="in = out features")
  ap.add_argument("--rank", type=int, default=16)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--backend", default=None, choices=[None, "pallas", "interpret", "xla"])
  args = ap.parse_args()
  d, dtype = args.dim, jnp.bfloat16
  ks = jax.random.split(jax.random.key(0), 5)
  w0 = jax.random.normal(ks[0], (d, d)) * d ** -0.5             # the "pretrained" layer
  u = jax.random.normal(ks[1], (d, 4)) * d ** -0.5
  v = jax.random.normal(ks[2], (4, d)) * 0.5                      # the task's rank-4 change
  w_task = w0 + u @ v

  model = LoRAQuantDense(d, rank=args.rank, backend=args.backend)
  x0 = jnp.zeros((1, d), dtype)
  params = model.init(ks[3], x0)["params"]
  params["base"] = hnn.QuantDense.from_dense_params({"kernel": w0}, "w4a16-g128-zp")
  frozen = {"base": params.pop("base")}
  trainable = params                                              # lora_a, lora_b
  opt = optax.adam(args.lr)
  opt_state = opt.init(trainable)

  def loss_fn(trainable, x):
    y = model.apply({"params": {**frozen, **trainable}}, x).astype(jnp.float32)
    return jnp.mean((y - x.astype(jnp.float32) @ w_task) ** 2)

  @jax.jit
  def step(trainable, opt_state, key):
    x = jax.random.normal(key, (args.batch, d), dtype)
    loss, grads = jax.value_and_grad(loss_fn)(trainable, x)
    updates, opt_state = opt.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state, loss

  x_eval = jax.random.normal(ks[4], (1024, d), dtype)
  deq = hj.dequantize(frozen["base"]["kernel"])
  floor = float(jnp.mean((x_eval.astype(jnp.float32) @ (deq - w0)) ** 2))
  print(f"backend={args.backend or 'default'} ({jax.default_backend()}), dim {d}, "
        f"rank {args.rank}, {frozen['base']['kernel'].spec.name} base "
        f"({frozen['base']['kernel'].nbytes() / 2**20:.2f} MiB vs {d * d * 2 / 2**20:.2f} "
        "MiB bf16)")
  print(f"eval loss before training: {float(jax.jit(loss_fn)(trainable, x_eval)):.5f}; "
        f"quantized base + the exact change: {floor:.5f}")
  t0 = time.perf_counter()
  for i in range(args.steps):
    trainable, opt_state, loss = step(trainable, opt_state, jax.random.key(1000 + i))
    if i in (0, args.steps // 4, args.steps // 2) or i == args.steps - 1:
      print(f"  step {i:4d}  train loss {float(loss):.5f}")
  final = float(jax.jit(loss_fn)(trainable, x_eval))
  print(f"eval loss after {args.steps} steps: {final:.5f} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
  main()
