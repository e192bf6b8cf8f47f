"""hj.stack_experts: per-expert checkpoint layers -> the stacked gate_up / down weights of
hj.quant_moe, checked against a per-expert loop over the separate layers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax import moe


def _experts(spec, e=4, h=256, inter=128, names=("gate_proj", "up_proj", "down_proj"),
             bias=False, seed=0):
  ks = iter(jax.random.split(jax.random.key(seed), 6 * e))
  layer = lambda k, n: {"weight": hj.quantize(
      jax.random.normal(next(ks), (k, n)) / 8, spec,
      bias=jax.random.normal(next(ks), (n,)) if bias else None)}
  return {str(i): {names[0]: layer(h, inter), names[1]: layer(h, inter),
                   names[2]: layer(inter, h)} for i in range(e)}


def _loop(experts, names, x, weights, ids):
  """The MoE layer from the separate per-expert layers (float32 dequantized)."""
  gate, up, down = names
  dense = lambda layer, a: a @ hj.dequantize(layer["weight"]) + (
      0 if layer["weight"].bias is None else layer["weight"].bias)
  out = jnp.zeros(x.shape, jnp.float32)
  for t in range(x.shape[0]):
    for j in range(ids.shape[1]):
      ex = experts[str(int(ids[t, j]))]
      xt = x[t:t + 1].astype(jnp.float32)
      hid = jax.nn.silu(dense(ex[gate], xt)) * dense(ex[up], xt)
      out = out.at[t].add(weights[t, j] * dense(ex[down], hid)[0])
  return out


@pytest.mark.parametrize("spec,names,bias", [
    ("w4a16-g128-zp", ("gate_proj", "up_proj", "down_proj"), False),
    ("w8a16", ("w1", "w3", "w2"), True),   # Mixtral names, per-channel scales, biases
    ("w8a8-fp8-block", ("gate_proj", "up_proj", "down_proj"), False),  # DeepSeek-V3 FP8
])
def test_stacked_experts_run_quant_moe(spec, names, bias):
  experts = _experts(spec, names=names, bias=bias)
  mlp_in = {"experts": experts, "gate": {"kernel": jnp.ones(3)}}
  tree = {"model": {"layers": {"0": {"mlp": mlp_in}}}}
  out = hj.stack_experts(tree)
  stacked = out["model"]["layers"]["0"]["mlp"]["experts"]
  assert set(stacked) == {"gate_up", "down"}
  mlp = out["model"]["layers"]["0"]["mlp"]
  assert mlp["gate"]["kernel"] is mlp_in["gate"]["kernel"]  # other leaves kept, not copied
  assert isinstance(tree["model"]["layers"]["0"]["mlp"]["experts"]["0"], dict)  # unmodified
  gu, dn = stacked["gate_up"], stacked["down"]
  assert gu.shape == (4, 256, 256) and dn.shape == (4, 128, 256) and gu.spec.name == \
      experts["0"][names[0]]["weight"].spec.name
  x = jax.random.normal(jax.random.key(1), (5, 256), jnp.float32)
  weights, ids = moe.topk_routing(jax.random.normal(jax.random.key(2), (5, 4)), 2)
  act = gu.spec.act is not None  # fp8 activations: the loop over float weights is looser
  want = _loop(experts, names, x, weights, ids)
  for backend in ("xla", "interpret"):
    y = jax.jit(lambda *a: hj.quant_moe(*a, backend=backend))(gu, dn, x, weights, ids)
    tol = (5e-2 if act else 1e-4) * float(jnp.abs(want).max())
    np.testing.assert_allclose(y, want, rtol=0, atol=tol)
  # the stacked leaves are the per-expert ones, as stored
  np.testing.assert_array_equal(
      np.asarray(hj.dequantize(gu))[1],
      np.concatenate([np.asarray(hj.dequantize(experts["1"][n]["weight"]))
                      for n in names[:2]], axis=1))


def test_stack_experts_refusals():
  """What one stacked weight cannot hold is refused by name: gate and up with different
  NVFP4 global scales, experts of different specs, extra tensors an expert holds."""
  nv = _experts("w4a16-nvfp4", e=2)
  with pytest.raises(ValueError, match=r"experts\.0\.gate_proj\+up_proj: global scales "
                                       "differ"):
    hj.stack_experts({"experts": nv})
  mixed = _experts("w4a16-g128", e=2)
  mixed["1"]["down_proj"] = _experts("w4a16-g128-zp", e=1)["0"]["down_proj"]
  with pytest.raises(ValueError, match=r"experts down_proj\[1\]: spec .*expected"):
    hj.stack_experts({"experts": mixed})
  extra = _experts("w4a16-g128", e=2)
  extra["1"]["down_proj"]["input_scale"] = jnp.ones(())
  with pytest.raises(ValueError, match=r"model\.3\.experts\.1: holds "
                                       r"\['down_proj\.input_scale'\]"):
    hj.stack_experts({"model": {"3": {"experts": extra}}})
  permuted = _experts("w4a16-g128", e=2)
  w = permuted["0"]["gate_proj"]["weight"]
  permuted["0"]["gate_proj"]["weight"] = w.replace(input_perm=jnp.arange(w.in_features))
  with pytest.raises(ValueError, match=r"input_perm is set \(act-order rows\)"):
    hj.stack_experts({"experts": permuted})
  # not expert groups: left alone
  other = {"experts": {"0": {"gate_proj": {"weight": jnp.ones((2, 2))}}}, "x": [1]}
  kept = hj.stack_experts(other)
  assert kept["experts"]["0"]["gate_proj"]["weight"] is other["experts"]["0"]["gate_proj"][
      "weight"] and kept["x"] is other["x"]


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["w4a16-g128-zp", "w8a8-fp8-block"])
def test_stacked_experts_gpu(spec):
  """On the H200: experts stacked from per-expert layers (Qwen3-30B-A3B-like widths, 16
  experts) through quant_moe's Pallas path against the XLA path."""
  experts = _experts(spec, e=16, h=2048, inter=768, seed=3)
  stacked = hj.stack_experts({"experts": experts})["experts"]
  gu, dn = moe.prepare_experts(stacked["gate_up"], stacked["down"])
  x = jax.random.normal(jax.random.key(4), (24, 2048), jnp.bfloat16)
  weights, ids = moe.topk_routing(jax.random.normal(jax.random.key(5), (24, 16)), 4)
  y = jax.jit(hj.quant_moe)(gu, dn, x, weights, ids).astype(jnp.float32)
  want = jax.jit(lambda *a: hj.quant_moe(*a, backend="xla"))(
      stacked["gate_up"], stacked["down"], x, weights, ids).astype(jnp.float32)
  assert float(jnp.max(jnp.abs(y - want)) / jnp.max(jnp.abs(want))) <= 2e-2
