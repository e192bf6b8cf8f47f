"""Flax linen / nnx modules: outputs equal the functional API exactly; swap-in helpers."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import humming_jax as hj
from humming_jax import nn as hnn
from humming_jax import nnx as hnnx

K, N = 128, 64


def _x(seed=1, m=6, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), (2, m // 2, K)).astype(dtype)


# ---------------------------------------------------------------------------- linen
@pytest.mark.parametrize("spec,dtype,xdtype", [("w4a16-g128", None, jnp.float32),
                                               ("w8a8-fp8", jnp.bfloat16, jnp.float32),
                                               ("w4a16-nvfp4", None, jnp.bfloat16)])
def test_linen_quantdense_equals_functional(spec, dtype, xdtype):
  layer = hnn.QuantDense(N, spec=spec, dtype=dtype)
  x = _x(dtype=xdtype)
  v = layer.init(jax.random.key(0), x)
  qw = v["params"]["kernel"]
  assert isinstance(qw, hj.QuantizedWeight) and qw.shape == (K, N) and qw.bias is not None
  y = layer.apply(v, x)
  cdt = dtype or jnp.result_type(xdtype, jnp.float32)  # Flax's promotion rule
  np.testing.assert_array_equal(y, hj.quant_dense(qw, x.astype(cdt)))
  assert y.dtype == cdt and y.shape == (2, 3, N)
  np.testing.assert_array_equal(jax.jit(layer.apply)(v, x), y)


def test_linen_from_dense_params_and_from_dense():
  dense = nn.Dense(N, use_bias=True, dtype=jnp.bfloat16)
  x = _x(2)
  p = dense.init(jax.random.key(3), x)["params"]
  qp = hnn.QuantDense.from_dense_params(p, "w4a16-g128")
  ref = hj.quantize(p["kernel"], "w4a16-g128", bias=p["bias"])
  np.testing.assert_array_equal(qp["kernel"].codes, ref.codes)
  np.testing.assert_array_equal(qp["kernel"].bias, p["bias"])
  qd = hnn.QuantDense.from_dense(dense, "w4a16-g128")
  assert (qd.features, qd.use_bias, qd.dtype) == (N, True, jnp.bfloat16)
  y = qd.apply({"params": qp}, x)
  np.testing.assert_array_equal(y, hj.quant_dense(qp["kernel"], x.astype(jnp.bfloat16)))
  # Quantization is close to the float layer (sanity of the whole conversion).
  yf = dense.apply({"params": p}, x).astype(jnp.float32)
  err = jnp.linalg.norm(y.astype(jnp.float32) - yf) / jnp.linalg.norm(yf)
  assert err < 0.15


class _Block(nn.Module):
  """A small existing linen model written with plain nn.Dense."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(256, name="up")(x)
    h = nn.gelu(h)
    h = nn.Dense(K, name="down", dtype=jnp.bfloat16)(h)
    return nn.Dense(32, use_bias=False, name="head")(h + x)


def test_linen_interceptor_swaps_every_quantized_dense():
  model, x = _Block(), _x(4)
  params = model.init(jax.random.key(5), x)["params"]
  q = hnn.quantize_linen_params({"params": params}, {"*": "w4a16-g128", "head": None},
                                progress=False)["params"]
  assert isinstance(q["up"]["kernel"], hj.QuantizedWeight) and "bias" not in q["up"]
  assert q["head"]["kernel"] is params["head"]["kernel"]
  y = hnn.apply_quantized(model, {"params": q}, x)
  # The same computation through the functional API.
  h = nn.gelu(hj.quant_dense(q["up"]["kernel"], x))
  h = hj.quant_dense(q["down"]["kernel"], h.astype(jnp.bfloat16))
  ref = nn.Dense(32, use_bias=False).apply({"params": q["head"]}, h + x)
  np.testing.assert_array_equal(y, ref)
  f = jax.jit(lambda v, x: hnn.apply_quantized(model, v, x))
  np.testing.assert_array_equal(f({"params": q}, x), y)
  # Without the interceptor a quantized Dense is refused, never silently wrong.
  with pytest.raises(Exception):
    model.apply({"params": q}, x)


def test_capture_dense_inputs_feeds_error_report():
  model, x = _Block(), _x(4)
  params = model.init(jax.random.key(5), x)["params"]
  seen = hnn.capture_dense_inputs(model, {"params": params}, x)
  assert sorted(seen) == ["down", "head", "up"]
  np.testing.assert_array_equal(seen["up"], x)
  q = hj.quantize_params(params, {"*": "w8a16", "head": None}, progress=False)
  rep = hj.error_report(params, q, inputs={k: v for k, v in seen.items() if k != "head"})
  assert {l.path for l in rep.layers} == {"up/kernel", "down/kernel"}
  assert all(l.output_sqnr_db is not None and l.output_sqnr_db > 25 for l in rep.layers)


class _Uses(nn.Module):
  @nn.compact
  def __call__(self, x):
    return hnn.QuantDense(N, spec="w8a16", name="proj")(nn.LayerNorm(name="ln")(x))


def test_linen_quantdense_inside_a_model_and_errors():
  m, x = _Uses(), _x(6)
  v = m.init(jax.random.key(0), x)
  ln = nn.LayerNorm().apply({"params": v["params"]["ln"]}, x)
  np.testing.assert_array_equal(m.apply(v, x), hj.quant_dense(v["params"]["proj"]["kernel"],
                                                               ln))
  bad = {"params": {"ln": v["params"]["ln"], "proj": {"kernel": jnp.ones((K, N))}}}
  with pytest.raises(TypeError, match="must be a QuantizedWeight"):
    m.apply(bad, x)
  with pytest.raises(TypeError, match="QuantSpec or a preset"):
    hnn.QuantDense(N, spec=3).init(jax.random.key(0), x)
  # the expert stack and the setting behind its K are named
  with pytest.raises(ValueError, match=r"QuantMoE's down experts \(4, 64, 128\) \(K is "
                                       r"intermediate=64\): group_size=128 does not divide"):
    hnn.QuantMoE(num_experts=4, topk=2, intermediate=64).init(
        jax.random.key(0), jnp.ones((3, 128)))
  with pytest.raises(ValueError, match=r"QuantMoE's down experts"):
    hnnx.QuantMoE(128, 4, 2, 64, rngs=nnx.Rngs(0))


# ---------------------------------------------------------------------------- nnx
def test_nnx_quantdense_init_and_from_linear():
  x = _x(7)
  layer = hnnx.QuantDense(K, N, spec="w4a16-g128", rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(layer(x), hj.quant_dense(layer.kernel.get_value(), x))
  lin = nnx.Linear(K, N, dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
  q = hnnx.QuantDense.from_linear(lin, "w8a8-fp8")
  ref = hj.quantize(lin.kernel[...], "w8a8-fp8", bias=lin.bias[...])
  np.testing.assert_array_equal(q.kernel.get_value().codes, ref.codes)
  y = q(x)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(y, hj.quant_dense(ref, x.astype(jnp.bfloat16)))
  with pytest.raises(ValueError, match="rngs"):
    hnnx.QuantDense(K, N)


class _Net(nnx.Module):
  def __init__(self, rngs):
    self.layers = nnx.List([nnx.Linear(K, K, rngs=rngs) for _ in range(2)])
    self.mlp = nnx.Sequential(nnx.Linear(K, 256, rngs=rngs), nnx.gelu,
                              nnx.Linear(256, K, rngs=rngs))
    self.head = nnx.Linear(K, 16, use_bias=False, rngs=rngs)

  def __call__(self, x):
    for l in self.layers:
      x = jax.nn.relu(l(x))
    return self.head(self.mlp(x))


def test_quantize_nnx_model_graph_surgery():
  net, x = _Net(nnx.Rngs(0)), _x(8)
  lin0 = net.layers[0]
  out = hnnx.quantize_nnx_model(net, {"*": "w4a16-g128", "head": None,
                                      "re:^mlp/layers/2": "w8a16"}, progress=False)
  assert out is net
  assert isinstance(net.layers[0], hnnx.QuantDense) and isinstance(net.layers[1],
                                                                    hnnx.QuantDense)
  assert isinstance(net.mlp.layers[0], hnnx.QuantDense)
  assert net.mlp.layers[2].spec == hj.QuantSpec.preset("w8a16")
  assert isinstance(net.head, nnx.Linear)
  q0 = net.layers[0].kernel.get_value()
  np.testing.assert_array_equal(
      q0.codes, hj.quantize(lin0.kernel[...], "w4a16-g128", bias=lin0.bias[...]).codes)
  # Output = the same computation through the functional API.
  h = x
  for l in net.layers:
    h = jax.nn.relu(hj.quant_dense(l.kernel.get_value(), h))
  h = hj.quant_dense(net.mlp.layers[0].kernel.get_value(), h)
  h = hj.quant_dense(net.mlp.layers[2].kernel.get_value(), nnx.gelu(h))
  ref = h @ net.head.kernel[...]
  np.testing.assert_array_equal(net(x), ref)
  # split / merge and nnx.jit carry the quantized variables (jit may fuse differently).
  g, state = nnx.split(net)
  np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(nnx.merge(g, state), x), ref,
                             rtol=1e-5, atol=1e-6)


def test_quantize_nnx_model_error_names_path():
  net = _Net(nnx.Rngs(0))
  net.head = nnx.Linear(96, 16, rngs=nnx.Rngs(1))  # 128-groups do not divide 96
  with pytest.raises(ValueError, match="head/kernel"):
    hnnx.quantize_nnx_model(net, {"*": "w4a16-g128"}, progress=False)


# ---------------------------------------------------------------------------- MoE
E, TOPK, INTER = 4, 2, 128


def _moe_oracle(x, router_kernel, gate_up, down):
  """Per token, per chosen expert: down(silu(gate) * up), weighted by renormalised top-k."""
  x = np.asarray(x, np.float64).reshape(-1, K)
  probs = jax.nn.softmax(jnp.asarray(x @ np.asarray(router_kernel, np.float64),
                                     jnp.float32), axis=-1)
  w, ids = jax.lax.top_k(probs, TOPK)
  w = np.asarray(w / w.sum(-1, keepdims=True), np.float64)
  gu = np.asarray(hj.dequantize(gate_up), np.float64)
  dn = np.asarray(hj.dequantize(down), np.float64)
  y = np.zeros_like(x)
  for t in range(x.shape[0]):
    for j in range(TOPK):
      e = int(ids[t, j])
      h = x[t] @ gu[e]
      g, u = h[:INTER], h[INTER:]
      y[t] += w[t, j] * ((g / (1 + np.exp(-g))) * u) @ dn[e]
  return y


def test_linen_and_nnx_quantmoe_match_expert_loop():
  x = _x(9, m=8)
  moe = hnn.QuantMoE(num_experts=E, topk=TOPK, intermediate=INTER, spec="w4a16-g128")
  v = moe.init(jax.random.key(0), x)
  p = v["params"]
  assert p["gate_up"].shape == (E, K, 2 * INTER) and p["down"].shape == (E, INTER, K)
  y = jax.jit(moe.apply)(v, x)  # jit: the eager op-by-op MoE path is slow on CPU
  assert y.shape == x.shape and y.dtype == x.dtype
  ref = _moe_oracle(x, p["router"]["kernel"], p["gate_up"], p["down"])
  np.testing.assert_allclose(np.asarray(y).reshape(-1, K), ref, rtol=2e-4, atol=2e-4)
  # nnx from the same float-free pieces: same numbers.
  m2 = hnnx.QuantMoE(K, E, TOPK, INTER, spec="w4a16-g128", router=nnx.Linear(
      K, E, use_bias=False, rngs=nnx.Rngs(0)), gate_up=p["gate_up"], down=p["down"])
  m2.router.kernel[...] = p["router"]["kernel"]
  run = nnx.jit(lambda m, x: m(x))
  np.testing.assert_array_equal(run(m2, x), y)
  # from_float quantizes float experts like hj.quantize.
  gu = jax.random.normal(jax.random.key(1), (E, K, 2 * INTER))
  dn = jax.random.normal(jax.random.key(2), (E, INTER, K))
  m3 = hnnx.QuantMoE.from_float(p["router"]["kernel"], gu, dn, "w4a16-g128", TOPK)
  np.testing.assert_array_equal(m3.gate_up.get_value().codes,
                                hj.quantize(gu, "w4a16-g128").codes)
  np.testing.assert_allclose(np.asarray(run(m3, x)).reshape(-1, K),
                             _moe_oracle(x, p["router"]["kernel"], m3.gate_up.get_value(),
                                         m3.down.get_value()), rtol=2e-4, atol=2e-3)


@pytest.mark.parametrize("model", ["deepseek_v3", "gpt_oss"])
def test_quantmoe_routing_options(model):
  """QuantMoE (linen and nnx) with a Routing: DeepSeek-V3's sigmoid, group-limited,
  bias-corrected, scaled routing (a ``correction_bias`` parameter) and gpt-oss's top-k
  then softmax over a biased router equal hj.moe.topk_routing with those options and
  hj.quant_moe on the module's own parameters; a router bias given without the routing
  that uses it is refused."""
  from humming_jax import moe as hmoe
  routing = (hmoe.Routing(scoring="sigmoid", correction_bias=True, num_groups=4,
                          topk_groups=2, scaling_factor=2.5) if model == "deepseek_v3"
             else hmoe.Routing(order="topk_softmax", router_bias=True))
  x = _x(11, m=8)
  layer = hnn.QuantMoE(num_experts=E, topk=TOPK, intermediate=INTER, spec="w4a16-g128",
                       routing=routing)
  v = layer.init(jax.random.key(0), x)
  p = dict(v["params"])
  ks = jax.random.split(jax.random.key(1), 2)
  variables, correction = {"params": p}, None
  if routing.correction_bias:  # non-zero, so that it is seen to act; not a param
    assert "correction_bias" not in p and v["routing"]["correction_bias"].shape == (E,)
    correction = jax.random.normal(ks[0], (E,)) / 4
    variables["routing"] = {"correction_bias": correction}
  if routing.router_bias:
    p["router"] = {**p["router"], "bias": jax.random.normal(ks[1], (E,))}
  y = jax.jit(layer.apply)(variables, x)
  x2 = x.reshape(-1, K)
  logits = x2 @ p["router"]["kernel"] + p["router"].get("bias", 0.0)
  w, ids = hmoe.topk_routing(logits, TOPK, correction_bias=correction,
                             **{f: getattr(routing, f) for f in (
                                 "renormalize", "order", "scoring", "num_groups",
                                 "topk_groups", "scaling_factor")})
  want = hj.quant_moe(p["gate_up"], p["down"], x2, w, ids, backend="xla")
  np.testing.assert_allclose(np.asarray(y).reshape(-1, K), np.asarray(want), rtol=2e-4,
                             atol=2e-4)
  # the options changed the routing (gpt-oss's order alone would not: top-k then softmax
  # is softmax, top-k, renormalised; its router bias does)
  plain = hmoe.topk_routing(x2 @ p["router"]["kernel"], TOPK)
  assert not (np.array_equal(plain[1], ids) and np.allclose(plain[0], w))
  # nnx: the same numbers from the same pieces
  m2 = hnnx.QuantMoE.from_float(p["router"]["kernel"], jnp.zeros((E, K, 2 * INTER)),
                                jnp.zeros((E, INTER, K)), "w4a16-g128", TOPK,
                                routing=routing, router_bias=p["router"].get("bias"))
  m2.gate_up.set_value(p["gate_up"])
  m2.down.set_value(p["down"])
  if routing.correction_bias:
    assert isinstance(m2.correction_bias, hnnx.RoutingBias)
    assert not isinstance(m2.correction_bias, nnx.Param)  # out of an optimizer's reach
    m2.correction_bias[...] = correction
  np.testing.assert_array_equal(nnx.jit(lambda m, x: m(x))(m2, x), y)
  # a router given with a bias keeps it (nnx.Linear's default), as before Routing
  biased = hnnx.QuantMoE(K, E, TOPK, INTER, spec="w4a16-g128", gate_up=p["gate_up"],
                         down=p["down"], router=nnx.Linear(K, E, rngs=nnx.Rngs(3)))
  assert biased.routing.router_bias
  with pytest.raises(ValueError, match="router_bias is given; routing.router_bias=False"):
    hnnx.QuantMoE.from_float(p["router"]["kernel"], jnp.zeros((E, K, 2 * INTER)),
                             jnp.zeros((E, INTER, K)), "w4a16-g128", TOPK,
                             router_bias=jnp.zeros(E))
  with pytest.raises(ValueError, match="renormalize=False with routing"):
    hnn.QuantMoE(num_experts=E, topk=TOPK, intermediate=INTER, routing=routing,
                 renormalize=False).init(jax.random.key(0), x)


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["w4a16-all", "w8a8-fp8-all", "fp8-attn-nvfp4-mlp"])
def test_gpu_swapped_model_runs_the_kernels_and_matches_functional(recipe):
  model, x = _Block(), _x(4, m=32).astype(jnp.bfloat16)
  params = model.init(jax.random.key(5), x)["params"]
  q = hj.quantize_params(params, recipe, progress=False)
  prepared = hj.recipes.prepare_params(q)
  f = jax.jit(lambda p, x: hnn.apply_quantized(model, {"params": p}, x))
  y, yp = f(q, x), f(prepared, x)
  np.testing.assert_allclose(np.asarray(yp, np.float32), np.asarray(y, np.float32),
                             rtol=1e-6, atol=1e-6)
  layer = hnn.QuantDense(N, spec=hj.RECIPES[recipe].get("*", "w8a8-fp8"),
                         dtype=jnp.bfloat16)
  v = layer.init(jax.random.key(0), x)
  backend = "pallas" if hj.ops.resolve_backend(None, v["params"]["kernel"].spec) == \
      "pallas" else "xla"
  np.testing.assert_array_equal(
      jax.jit(layer.apply)(v, x),
      jax.jit(lambda q, x: hj.quant_dense(q, x, backend=backend))(v["params"]["kernel"], x))


@pytest.mark.gpu
def test_gpu_quantmoe_matches_expert_loop():
  x = _x(9, m=64).astype(jnp.bfloat16)
  moe = hnn.QuantMoE(num_experts=E, topk=TOPK, intermediate=INTER, spec="w4a16-g128",
                     dtype=jnp.bfloat16)
  v = moe.init(jax.random.key(0), x)
  p = v["params"]
  y = np.asarray(jax.jit(moe.apply)(v, x), np.float32).reshape(-1, K)
  ref = _moe_oracle(x.astype(jnp.float32), p["router"]["kernel"], p["gate_up"], p["down"])
  assert np.isfinite(y).all()
  assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 2e-2


# ------------------------------------------------------- settings against held weights
def test_linen_quantdense_refuses_settings_its_weight_contradicts():
  x = _x(7)
  with_bias = hnn.QuantDense(N, spec="w8a16").init(jax.random.key(0), x)
  no_bias = hnn.QuantDense(N, spec="w8a16", use_bias=False).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"QuantDense 'QuantDense': use_bias=False but the "
                                       r"quantized kernel's bias is set"):
    hnn.QuantDense(N, spec="w8a16", use_bias=False).apply(with_bias, x)
  with pytest.raises(ValueError, match="use_bias=True but the quantized kernel's bias is None"):
    hnn.QuantDense(N, spec="w8a16").apply(no_bias, x)
  with pytest.raises(ValueError, match=r"quantized with w8a16-int8-ch-bfloat16, not spec="
                                       r"w4a16-int4-g128"):
    hnn.QuantDense(N, spec="w4a16-g128").apply(with_bias, x)
  with pytest.raises(ValueError, match=r"QuantDense 'proj': use_bias=False"):
    class _Wrong(nn.Module):
      @nn.compact
      def __call__(self, x):
        return hnn.QuantDense(N, spec="w8a16", use_bias=False, name="proj")(x)
    _Wrong().apply({"params": {"proj": with_bias["params"]}}, x)


def test_from_dense_refuses_a_custom_dot_general():
  with pytest.raises(ValueError, match="custom dot_general"):
    hnn.QuantDense.from_dense(nn.Dense(N, dot_general=jax.lax.dot_general), "w8a16")


class _General(nn.Module):
  """DenseGeneral as a Dense (last axis, one output axis), and as attention heads."""

  @nn.compact
  def __call__(self, x):
    h = nn.DenseGeneral(N, name="proj")(x)
    return nn.DenseGeneral((4, 16), name="heads")(h)


def test_dense_general_over_the_last_axis_runs_quantized():
  model, x = _General(), _x(8)
  params = model.init(jax.random.key(2), x)["params"]
  with pytest.warns(UserWarning, match=r"heads/kernel \(64, 4, 16\)"):
    q = hj.quantize_params(params, "w8a16-all", progress=False)
  assert isinstance(q["proj"]["kernel"], hj.QuantizedWeight)
  y = jax.jit(lambda p: hnn.apply_quantized(model, {"params": p}, x))(q)
  ref = nn.DenseGeneral((4, 16)).apply({"params": q["heads"]},
                                       hj.quant_dense(q["proj"]["kernel"], x))
  np.testing.assert_array_equal(y, ref)
  assert y.shape == (2, 3, 4, 16)


class _Einsum(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Einsum((K, N), "...k,kn->...n", name="mix")(x)


def test_other_modules_holding_a_quantized_kernel_are_named():
  model, x = _Einsum(), _x(9)
  params = model.init(jax.random.key(3), x)["params"]
  q = hj.quantize_params(params, "w8a16-all", progress=False)  # a 2-D kernel: a candidate
  with pytest.raises(TypeError, match=r"Einsum 'mix' holds a quantized kernel, but only "
                                      r"nn.Dense and nn.DenseGeneral"):
    hnn.apply_quantized(model, {"params": q}, x)


class _Named(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(N, name="proj")(x)


def test_quantize_linen_params_tells_a_params_submodule_from_variables():
  class _Two(nn.Module):
    @nn.compact
    def __call__(self, x):
      return _Named(name="params")(x) + nn.Dense(N, name="proj")(x)

  x = _x(10)
  params = _Two().init(jax.random.key(4), x)["params"]  # top-level keys: params, proj
  q = hnn.quantize_linen_params(params, "w8a16-all", progress=False)
  assert isinstance(q["proj"]["kernel"], hj.QuantizedWeight)
  assert isinstance(q["params"]["proj"]["kernel"], hj.QuantizedWeight)
  variables = {"params": params, "batch_stats": {"bn": {"mean": jnp.ones(4)}}}
  qv = hnn.quantize_linen_params(variables, "w8a16-all", progress=False)
  assert isinstance(qv["params"]["proj"]["kernel"], hj.QuantizedWeight)
  assert qv["batch_stats"] is variables["batch_stats"]


def test_quantmoe_routers_stay_float_under_every_recipe():
  x = jax.random.normal(jax.random.key(11), (5, K))
  moe = hnn.QuantMoE(num_experts=4, topk=2, intermediate=128)
  v = moe.init(jax.random.key(0), x)
  q = hj.quantize_params(v["params"], "w8a16-all", progress=False)
  assert q["router"]["kernel"] is v["params"]["router"]["kernel"]
  np.testing.assert_array_equal(hnn.apply_quantized(moe, {"params": q}, x), moe.apply(v, x))
  m = hnnx.QuantMoE(K, 4, 2, 128, rngs=nnx.Rngs(0))
  router = m.router
  with pytest.warns(UserWarning, match=r"decided no kernel: \['router'\]"):
    hnnx.quantize_nnx_model(m, {"router": "w8a16"}, progress=False)
  hnnx.quantize_nnx_model(m, {"*": "w8a16"}, progress=False)
  assert m.router is router and isinstance(m.router, nnx.Linear)


class _OwnQuantized(nn.Module):
  """A user's module that holds a quantized kernel and runs hj.quant_dense itself."""

  @nn.compact
  def __call__(self, x):
    w = self.param("kernel", lambda r: hj.quantize(
        jax.random.normal(r, (K, N)), "w8a16"))
    return hj.quant_dense(w, x)


def test_the_interceptor_leaves_a_users_own_quantized_module_alone():
  model, x = _OwnQuantized(), _x(12)
  v = model.init(jax.random.key(0), x)
  np.testing.assert_array_equal(hnn.apply_quantized(model, v, x), model.apply(v, x))
