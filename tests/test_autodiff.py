"""Reverse-mode gradients of quant_dense, quant_ragged_dot and quant_moe (autodiff.py):
the kernels run forward, the backward is the XLA reference's VJP.  Checked against
formulas written here (dx = dy W^T per expert, an explicit per-token MoE loop, exact
finite differences for the scales), not against the library's own backward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax import moe
from humming_jax.kernels import grouped_wna16_mgpu as gm


def rel(a, b):
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def weighted_sum(f, dy):
  """A scalar loss whose cotangent of f's output is dy."""
  return lambda *a: jnp.sum(f(*a).astype(jnp.float32) * dy)


@pytest.mark.parametrize("spec", ["w4a16-g128-zp", "w4a16-mxfp4", "w8a8-int8", "w4a8-fp8"])
@pytest.mark.parametrize("backend", ["interpret", "xla"])
def test_quant_dense_grad_x(spec, backend):
  """dx = dy @ W^T of the dequantized weight, with leading batch dimensions, under jit;
  activation-quantized specs pass the gradient straight through their rounding.  The
  value of value_and_grad is the forward's, bit for bit."""
  k, n = 256, 128
  ks = jax.random.split(jax.random.key(7), 3)
  p = hj.quantize(jax.random.normal(ks[0], (k, n)), spec,
                  bias=jax.random.normal(ks[1], (n,)))
  x = jax.random.normal(ks[2], (2, 3, k), jnp.bfloat16)
  dy = jax.random.normal(jax.random.key(8), (2, 3, n))
  f = lambda x: hj.quant_dense(p, x, backend=backend)
  loss, dx = jax.jit(jax.value_and_grad(weighted_sum(f, dy)))(x)
  assert dx.shape == x.shape and dx.dtype == x.dtype
  assert rel(dx, dy @ hj.dequantize(p).T) <= 1e-2
  assert float(loss) == float(jax.jit(weighted_sum(f, dy))(x))


def test_quant_dense_grad_x_prepared():
  """Params prepared for the Mosaic kernel: dx = dy @ W^T too (the backward reads them
  back to the canonical layout)."""
  k, n = 256, 128
  p = hj.quantize(jax.random.normal(jax.random.key(9), (k, n)), "w4a16-g128-zp")
  x = jax.random.normal(jax.random.key(10), (5, k), jnp.bfloat16)
  dy = jax.random.normal(jax.random.key(11), (5, n))
  q = hj.prepare(p, kernel="wna16_mgpu")
  dx = jax.jit(jax.grad(weighted_sum(lambda x: hj.quant_dense(q, x, backend="interpret"),
                                     dy)))(x)
  assert rel(dx, dy @ hj.dequantize(p).T) <= 1e-2


@pytest.mark.parametrize("spec", ["w4a16-g128-zp", "w8a16"])
def test_quant_dense_grad_scales_and_bias(spec):
  """d loss / d scales by exact finite differences: the output is linear in the scales,
  so doubling a random subset of them moves the loss by <grad, scales * mask> (doubling is
  exact in any float format); d loss / d bias = sum of dy over rows."""
  k, n, m = 256, 64, 6
  ks = jax.random.split(jax.random.key(12), 4)
  p = hj.quantize(jax.random.normal(ks[0], (k, n)), spec, bias=jax.random.normal(ks[1], (n,)))
  # float32 scales (same values): a bf16 cotangent's rounding would not survive the
  # cancellation in <grad, scales * mask>
  p = p.replace(scales=p.scales.astype(jnp.float32))
  x = jax.random.normal(ks[2], (m, k), jnp.float32)
  dy = jax.random.normal(ks[3], (m, n))
  loss = lambda s, b, backend: weighted_sum(
      lambda x: hj.quant_dense(p.replace(scales=s, bias=b), x, backend=backend), dy)(x)
  ds, db = jax.jit(jax.grad(lambda s, b: loss(s, b, "interpret"), argnums=(0, 1)))(
      p.scales, p.bias)
  assert ds.shape == p.scales.shape and db.shape == p.bias.shape
  np.testing.assert_allclose(db, dy.sum(0), rtol=1e-5, atol=1e-5)
  mask = jax.random.bernoulli(jax.random.key(13), 0.5, p.scales.shape)
  s2 = jnp.where(mask, p.scales * 2, p.scales)
  # (the exact float32 reference: the kernel's own rounding would not cancel)
  moved = float(loss(s2, p.bias, "xla")) - float(loss(p.scales, p.bias, "xla"))
  predicted = float(jnp.sum(jnp.where(mask, ds.astype(jnp.float32)
                                      * p.scales.astype(jnp.float32), 0)))
  assert abs(moved) > 1e-3
  assert abs(moved - predicted) <= 1e-3 * (abs(moved) + 1)


def test_prepared_params_are_not_differentiated():
  """Differentiating the leaves of kernel-layout params raises (their scales are
  transformed); canonical params are the ones to train."""
  k, n = 256, 128
  p = hj.prepare(hj.quantize(jax.random.normal(jax.random.key(14), (k, n)), "w4a16-g128-zp"),
                 kernel="wna16_mgpu")
  x = jax.random.normal(jax.random.key(15), (2, k), jnp.bfloat16)
  loss = lambda s: hj.quant_dense(p.replace(scales=s, fold_base=p.fold_base), x,
                                  backend="interpret").astype(jnp.float32).sum()
  with pytest.raises(ValueError, match="params: gradients with respect to params prepared"):
    jax.grad(loss)(p.scales)


def test_fake_quantize_is_straight_through():
  """fake_quantize_activations: the exact forward values, and the identity as derivative."""
  x = jax.random.normal(jax.random.key(16), (4, 256), jnp.float32)
  c = jax.random.normal(jax.random.key(17), (4, 256))
  spec = hj.QuantSpec.preset("w8a8-int8")
  y, g = jax.value_and_grad(lambda x: jnp.sum(hj.fake_quantize_activations(x, spec) * c))(x)
  np.testing.assert_array_equal(g, c)
  np.testing.assert_array_equal(
      y, jnp.sum(hj.quantize_activations(x, spec).dequantize() * c))


def test_forward_mode_is_refused_but_hessian_works():
  """jax.jvp is not defined on the kernel-backed ops, on the XLA backend too (JAX refuses
  custom_vjp functions); forward over reverse (jax.hessian) is, and is exact."""
  p = hj.quantize(jax.random.normal(jax.random.key(18), (256, 128)), "w4a16-g128")
  x = jax.random.normal(jax.random.key(19), (1, 256), jnp.float32)
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jvp(lambda x: hj.quant_dense(p, x, backend="xla"), (x,), (x,))
  w = hj.dequantize(p)
  hess = jax.hessian(lambda x: jnp.sum(jnp.tanh(hj.quant_dense(p, x, backend="xla"))))(x)
  assert rel(hess, jax.hessian(lambda x: jnp.sum(jnp.tanh(x @ w)))(x)) <= 1e-5


def test_x_cotangent_hook_only_when_x_alone_is_differentiated():
  """autodiff.with_reference_vjp's ``x_cotangent`` (the dx kernels' entry) gives the
  cotangent of x only where x is the one differentiated argument; elsewhere, and where it
  returns None, the reference's VJP runs."""
  from humming_jax import autodiff
  ref = lambda w, x: x @ w
  seen = []

  def hook(w, x, dy):
    seen.append(1)
    return None if float(jnp.sum(dy)) < 0 else jnp.full(x.shape, 7.0, x.dtype)

  f = autodiff.with_reference_vjp(ref, ref, ("w", "x"), x_cotangent=hook)
  w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
  dy = jnp.ones((4, 2))
  assert float(jax.vjp(lambda x: f(w, x), x)[1](dy)[0][0, 0]) == 7.0 and seen == [1]
  np.testing.assert_array_equal(jax.vjp(lambda x: f(w, x), x)[1](-dy)[0], -dy @ w.T)
  assert len(seen) == 2  # asked, declined: the reference's VJP
  dw, dx = jax.vjp(f, w, x)[1](dy)  # both differentiated: never asked
  np.testing.assert_array_equal(dx, dy @ w.T)
  np.testing.assert_array_equal(dw, x.T @ dy)
  assert len(seen) == 2
  np.testing.assert_array_equal(jax.vjp(lambda w: f(w, x), w)[1](dy)[0], x.T @ dy)
  assert len(seen) == 2


def test_nvfp4_scale_leaves():
  """NVFP4: the fp32 global scale's gradient by exact doubling; the e4m3 block scales
  refuse a gradient (e4m3 cannot hold one) and a float32 copy of them takes it."""
  k, n, m = 256, 64, 4
  ks = jax.random.split(jax.random.key(63), 3)
  p = hj.quantize(jax.random.normal(ks[0], (k, n)), "w4a16-nvfp4")
  x = jax.random.normal(ks[1], (m, k), jnp.float32)
  dy = jax.random.normal(ks[2], (m, n))
  loss = lambda q, backend: weighted_sum(lambda x: hj.quant_dense(q, x, backend=backend),
                                         dy)(x)
  g = jax.grad(lambda gs: loss(p.replace(global_scale=gs), "interpret"))(p.global_scale)
  moved = float(loss(p.replace(global_scale=2 * p.global_scale), "xla") - loss(p, "xla"))
  assert abs(moved) > 1e-3
  assert abs(moved - float(jnp.sum(g * p.global_scale))) <= 1e-3 * (abs(moved) + 1)
  with pytest.raises(ValueError, match=r"params\.scales: gradients with respect to a "
                                       "float8_e4m3fn leaf"):
    jax.grad(lambda s: loss(p.replace(scales=s), "xla"))(p.scales)
  s32 = p.scales.astype(jnp.float32)
  ds = jax.grad(lambda s: loss(p.replace(scales=s), "interpret"))(s32)
  moved = float(loss(p.replace(scales=2 * s32), "xla") - loss(p.replace(scales=s32), "xla"))
  assert abs(moved - float(jnp.sum(ds * s32))) <= 1e-3 * (abs(moved) + 1)


@pytest.mark.parametrize("backend", ["interpret", "xla"])
def test_quant_ragged_dot_grad_x(backend):
  """dx of a grouped GEMM: each expert's rows get dy @ W_e^T; rows past sum(group_sizes)
  (output zero) get none; an empty expert is skipped."""
  e, k, n, m = 4, 256, 128, 24
  ks = jax.random.split(jax.random.key(20), 3)
  p = hj.quantize(jax.random.normal(ks[0], (e, k, n)), "w4a16-g128-zp")
  x = jax.random.normal(ks[1], (m, k), jnp.bfloat16)
  dy = jax.random.normal(ks[2], (m, n))
  sizes = jnp.array([7, 0, 9, 5], jnp.int32)  # 21 rows of 24
  f = lambda x: hj.quant_ragged_dot(p, x, sizes, backend=backend)
  dx = jax.jit(jax.grad(weighted_sum(f, dy)))(x)
  w = hj.dequantize(p)
  expert = np.repeat(np.arange(e), np.asarray(sizes))
  want = jnp.concatenate([jnp.einsum("mn,mkn->mk", dy[:21], w[expert]),
                          jnp.zeros((m - 21, k))])
  assert dx.dtype == x.dtype
  assert rel(dx, want) <= 1e-2
  assert not np.asarray(dx[21:], np.float32).any()


@pytest.mark.parametrize("backend", ["interpret", "xla"])
def test_quant_ragged_dot_grad_params(backend):
  """Scale and bias gradients of a grouped GEMM by exact doubling / row sums per expert;
  NaN rows past sum(group_sizes) (output zero) leave them finite."""
  e, k, n, m = 3, 256, 64, 16
  ks = jax.random.split(jax.random.key(64), 4)
  p = hj.quantize(jax.random.normal(ks[0], (e, k, n)), "w4a16-g128-zp",
                  bias=jax.random.normal(ks[1], (e, n)))
  p = p.replace(scales=p.scales.astype(jnp.float32))  # (see the dense case)
  x = jax.random.normal(ks[2], (m, k), jnp.float32).at[12:].set(jnp.nan)
  dy = jax.random.normal(ks[3], (m, n))
  sizes = jnp.array([5, 0, 7], jnp.int32)  # 12 rows of 16
  loss = lambda s, b, backend: weighted_sum(
      lambda x: hj.quant_ragged_dot(p.replace(scales=s, bias=b), x, sizes, backend=backend),
      dy)(x)
  ds, db = jax.jit(jax.grad(lambda s, b: loss(s, b, backend), argnums=(0, 1)))(
      p.scales, p.bias)
  assert np.isfinite(np.asarray(ds)).all()
  np.testing.assert_allclose(db, jnp.stack([dy[:5].sum(0), jnp.zeros(n), dy[5:12].sum(0)]),
                             rtol=1e-5, atol=1e-5)
  mask = jax.random.bernoulli(jax.random.key(65), 0.5, p.scales.shape)
  s2 = jnp.where(mask, p.scales * 2, p.scales)
  moved = float(loss(s2, p.bias, "xla")) - float(loss(p.scales, p.bias, "xla"))
  predicted = float(jnp.sum(jnp.where(mask, ds * p.scales, 0)))
  assert abs(moved) > 1e-3
  assert abs(moved - predicted) <= 1e-3 * (abs(moved) + 1)


def moe_explicit(gu_w, dn_w, x, weights, ids):
  """The MoE layer as a per-slot loop over dequantized float32 experts (ids outside
  [0, E) contribute nothing)."""
  e, inter = gu_w.shape[0], dn_w.shape[1]
  out = jnp.zeros((x.shape[0], dn_w.shape[2]))
  for j in range(ids.shape[1]):
    i = jnp.clip(ids[:, j], 0, e - 1)
    h = jnp.einsum("th,thn->tn", x.astype(jnp.float32), gu_w[i])
    y = jnp.einsum("ti,tih->th", jax.nn.silu(h[:, :inter]) * h[:, inter:], dn_w[i])
    ok = (ids[:, j] >= 0) & (ids[:, j] < e)
    out = out + jnp.where(ok[:, None], weights[:, j:j + 1] * y, 0)
  return out


@pytest.mark.parametrize("backend,tokens", [("interpret", 3), ("xla", 5)])
def test_quant_moe_grad(backend, tokens, monkeypatch):
  """d loss / d x and d loss / d topk_weights of the MoE layer match the explicit loop's
  (its own autodiff); the interpreter case runs the Mosaic pair tiles forward (the default
  at 3 tokens of these small experts)."""
  e, h, inter, topk = 6, 256, 128, 2
  ks = jax.random.split(jax.random.key(21 + tokens), 5)
  spec = hj.QuantSpec.preset("w4a16-g128-zp")
  gu = hj.quantize(jax.random.normal(ks[0], (e, h, 2 * inter)) / 16, spec)
  dn = hj.quantize(jax.random.normal(ks[1], (e, inter, h)) / 11, spec)
  x = jax.random.normal(ks[2], (tokens, h), jnp.bfloat16)
  weights, ids = moe.topk_routing(jax.random.normal(ks[3], (tokens, e)), topk)
  ids = ids.at[0, 1].set(e + 1)  # contributes nothing, gets no gradient
  dy = jax.random.normal(ks[4], (tokens, h))
  calls = []
  if backend == "interpret":
    gu, dn = gm.prepare(gu), gm.prepare(dn)
    real = gm.run_pairs
    monkeypatch.setattr(gm, "run_pairs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
  f = lambda x, w: hj.quant_moe(gu, dn, x, w, ids, backend=backend)
  dx, dw = jax.jit(jax.grad(weighted_sum(f, dy), argnums=(0, 1)))(x, weights)
  assert len(calls) == (2 if backend == "interpret" else 0)  # the pair tiles ran forward
  gu_w, dn_w = (hj.dequantize(moe.registry.to_canonical(q)) for q in (gu, dn))
  want_dx, want_dw = jax.grad(weighted_sum(
      lambda x, w: moe_explicit(gu_w, dn_w, x, w, ids), dy), argnums=(0, 1))(
          x.astype(jnp.float32), weights)
  assert dx.dtype == x.dtype and dw.shape == weights.shape
  assert rel(dx, want_dx) <= 2e-2
  assert rel(dw, want_dw) <= 2e-2
  assert float(dw[0, 1]) == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["w4a16-g128-zp", "w4a16-mxfp4", "w8a8-fp8"])
def test_grad_gpu(spec):
  """On the H200: the Pallas forward under jax.grad, dx against dy @ W^T (dense), and the
  MoE layer's dx / dweights against the explicit loop."""
  k, n, m = 4096, 2048, 16
  ks = jax.random.split(jax.random.key(30), 3)
  p = hj.prepare(hj.quantize(jax.random.normal(ks[0], (k, n)), spec))
  x = jax.random.normal(ks[1], (m, k), jnp.bfloat16)
  dy = jax.random.normal(ks[2], (m, n))
  loss, dx = jax.jit(jax.value_and_grad(weighted_sum(lambda x: hj.quant_dense(p, x), dy)))(x)
  assert rel(dx, dy @ hj.dequantize(moe.registry.to_canonical(p)).T) <= 1e-2
  assert float(loss) == float(jax.jit(weighted_sum(lambda x: hj.quant_dense(p, x), dy))(x))
  if spec == "w8a8-fp8":
    return
  e, h, inter, topk, tokens = 16, 2048, 256, 4, 24
  ks = jax.random.split(jax.random.key(31), 5)
  gu, dn = moe.prepare_experts(hj.quantize(jax.random.normal(ks[0], (e, h, 2 * inter)) / 40,
                                           spec),
                               hj.quantize(jax.random.normal(ks[1], (e, inter, h)) / 16, spec))
  x = jax.random.normal(ks[2], (tokens, h), jnp.bfloat16)
  weights, ids = moe.topk_routing(jax.random.normal(ks[3], (tokens, e)), topk)
  dy = jax.random.normal(ks[4], (tokens, h))
  dx, dw = jax.jit(jax.grad(weighted_sum(lambda x, w: hj.quant_moe(gu, dn, x, w, ids), dy),
                            argnums=(0, 1)))(x, weights)
  gu_w, dn_w = (hj.dequantize(moe.registry.to_canonical(q)) for q in (gu, dn))
  want_dx, want_dw = jax.grad(weighted_sum(
      lambda x, w: moe_explicit(gu_w, dn_w, x, w, ids), dy), argnums=(0, 1))(
          x.astype(jnp.float32), weights)
  assert rel(dx, want_dx) <= 2e-2 and rel(dw, want_dw) <= 2e-2


def test_lora_example_learns(monkeypatch, capsys):
  """examples/lora_finetune.py: Adam on a LoRA adapter over a frozen int4 base (XLA path on
  the CPU) brings the eval loss from the task's change down to the base's quantization
  error."""
  import pathlib
  import re
  import runpy
  path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "lora_finetune.py"
  monkeypatch.setattr("sys.argv", [str(path), "--dim", "256", "--steps", "200"])
  runpy.run_path(str(path), run_name="__main__")
  out = capsys.readouterr().out
  before, floor = map(float, re.search(r"before training: ([\d.]+); .*: ([\d.]+)", out).groups())
  after = float(re.search(r"after 200 steps: ([\d.]+)", out).group(1))
  assert before > 50 * floor and after < 2 * floor


def test_grad_through_scan_and_checkpoint():
  """The backward composes with lax.scan over stacked layers and jax.checkpoint: dx equals
  the chain rule through the dequantized layers."""
  d, layers = 256, 3
  ws = [jax.random.normal(jax.random.key(40 + i), (d, d)) * d ** -0.5 for i in range(layers)]
  qs = [hj.quantize(w, "w4a16-g128") for w in ws]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *qs)  # leaves stacked, spec shared
  x = jax.random.normal(jax.random.key(50), (4, d), jnp.float32)

  def net(x):
    body = jax.checkpoint(lambda h, q: (jnp.tanh(hj.quant_dense(q, h, backend="xla")), None))
    return jax.lax.scan(body, x, stacked)[0].sum()

  def explicit(x):
    for q in qs:
      x = jnp.tanh(x @ hj.dequantize(q))
    return x.sum()

  assert rel(jax.jit(jax.grad(net))(x), jax.grad(explicit)(x)) <= 1e-5


@pytest.mark.gpu
def test_checkpoint_scan_grad_gpu():
  """On a GPU, with the default backend (the Mosaic kernels forward, the dx kernel at
  M = 16 backward): jax.checkpoint inside lax.scan over prepared layers.  In the CPU
  interpreter this fails (JAX's Mosaic GPU interpreter runs through io_callback, an
  effect remat refuses, docs/training.md); never yet run on a GPU (session 47)."""
  d, layers = 2048, 3
  ws = [jax.random.normal(jax.random.key(60 + i), (d, d)) * d ** -0.5 for i in range(layers)]
  qs = [hj.prepare(hj.quantize(w, "w4a16-g128-zp")) for w in ws]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *qs)
  x = jax.random.normal(jax.random.key(70), (16, d), jnp.bfloat16)

  def net(backend):
    def f(x):
      body = jax.checkpoint(lambda h, q: (jnp.tanh(hj.quant_dense(q, h, backend=backend)),
                                          None))
      return jax.lax.scan(body, x, stacked)[0].astype(jnp.float32).sum()
    return jax.jit(jax.grad(f))

  assert rel(net(None)(x), net("xla")(x)) <= 2e-2


def test_nnx_lora_over_quant_dense():
  """nnx.LoRA with an nnx QuantDense as its base module (QLoRA in nnx): nnx.grad reaches
  the LoRA params through the quantized base; the quantized weight (a QuantizedParam, not
  an nnx.Param) is not differentiated.  d/dB = (x A)^T dy, d/dA = x^T (dy B^T)."""
  from flax import nnx
  import humming_jax.nnx as hnnx
  d, r = 256, 8
  rngs = nnx.Rngs(0)
  base = hnnx.QuantDense(d, d, spec="w4a16-g128", use_bias=False, rngs=rngs)
  model = nnx.LoRA(d, r, d, base_module=base, rngs=rngs)
  model.lora_b[...] = jax.random.normal(jax.random.key(60), (r, d)) * 0.1  # A and B non-zero
  x = jax.random.normal(jax.random.key(61), (4, d), jnp.float32)
  dy = jax.random.normal(jax.random.key(62), (4, d))
  loss = lambda m: jnp.sum(m(x) * dy)
  grads = nnx.grad(loss)(model)  # nnx.Param leaves: lora_a, lora_b
  a, b = model.lora_a[...], model.lora_b[...]
  assert rel(grads.lora_b[...], (x @ a).T @ dy) <= 1e-5
  assert rel(grads.lora_a[...], x.T @ (dy @ b.T)) <= 1e-5
  assert "kernel" not in nnx.to_pure_dict(grads).get("base_module", {})


def test_quant_moe_module_router_trains():
  """hj.nn.QuantMoE: the router's kernel gets the gradient of the explicit layer (softmax
  top-k routing over the dequantized experts), through quant_moe's backward."""
  from humming_jax import nn as hnn
  e, h, inter, t = 4, 256, 128, 6
  layer = hnn.QuantMoE(num_experts=e, topk=2, intermediate=inter, spec="w4a16-g128",
                       backend="xla")
  x = jax.random.normal(jax.random.key(70), (t, h), jnp.float32)
  params = layer.init(jax.random.key(71), x)["params"]
  dy = jax.random.normal(jax.random.key(72), (t, h))
  router = params["router"]["kernel"]
  loss = lambda r: jnp.sum(layer.apply({"params": {**params, "router": {"kernel": r}}}, x) * dy)
  gu_w, dn_w = hj.dequantize(params["gate_up"]), hj.dequantize(params["down"])

  def explicit(r):
    weights, ids = moe.topk_routing(x @ r, 2)
    return jnp.sum(moe_explicit(gu_w, dn_w, x, weights, ids) * dy)

  g = jax.grad(loss)(router)
  assert float(jnp.abs(g).max()) > 0
  assert rel(g, jax.grad(explicit)(router)) <= 1e-4
