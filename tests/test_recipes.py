"""quantize_params: recipe precedence, None keeps float, bias folding, presets, errors."""
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax.linen as nn
from jax.sharding import PartitionSpec as P
from flax import nnx

import humming_jax as hj
from humming_jax import nn as hnn
from humming_jax import recipes
from humming_jax.quantize import stacked_layers


def _tree(key, k=128, n=64):
  ks = jax.random.split(key, 8)
  dense = lambda i, kk=k, nn=n: {"kernel": jax.random.normal(ks[i], (kk, nn)),
                                 "bias": jax.random.normal(ks[i + 1], (nn,))}
  return {"a": dense(0), "b": dense(1), "c": dense(2),
          "embed": {"embedding": jax.random.normal(ks[5], (50, k))},
          "norm": {"scale": jax.random.normal(ks[6], (k,))}}


def test_precedence_exact_beats_regex_beats_star():
  params = _tree(jax.random.key(0))
  recipe = {"*": "w4a16-g128", "re:^(a|b)/": "w8a16", "a/kernel": None}
  q = hj.quantize_params(params, recipe, progress=False)
  assert q["a"]["kernel"] is params["a"]["kernel"]  # exact None: float kept, same array
  assert q["a"]["bias"] is params["a"]["bias"]
  assert isinstance(q["b"]["kernel"], hj.QuantizedWeight)
  assert q["b"]["kernel"].spec == hj.QuantSpec.preset("w8a16")
  assert q["c"]["kernel"].spec == hj.QuantSpec.preset("w4a16-g128")
  # Exact layer path (without /kernel) also counts as exact, and beats the regex.
  q2 = hj.quantize_params(params, {"re:.*": "w8a16", "c": "w4a16-ch"}, progress=False)
  assert q2["c"]["kernel"].spec == hj.QuantSpec.preset("w4a16-ch")
  assert q2["a"]["kernel"].spec == hj.QuantSpec.preset("w8a16")


def test_first_matching_regex_wins_and_unmatched_stays_float():
  params = _tree(jax.random.key(1))
  q = hj.quantize_params(params, {"re:^b": "w8a16", "re:^(b|c)": "w4a16-g128"},
                         progress=False)
  assert q["b"]["kernel"].spec.name == hj.QuantSpec.preset("w8a16").name
  assert q["c"]["kernel"].spec.name == hj.QuantSpec.preset("w4a16-g128").name
  assert q["a"]["kernel"] is params["a"]["kernel"]


def test_quantized_leaf_equals_quantize_with_bias_folded_and_others_untouched():
  params = _tree(jax.random.key(2))
  q = hj.quantize_params(params, {"*": "w4a16-g128"}, progress=False)
  for name in "abc":
    assert set(q[name]) == {"kernel"}  # the bias moved into the QuantizedWeight
    ref = hj.quantize(params[name]["kernel"], "w4a16-g128", bias=params[name]["bias"])
    got = q[name]["kernel"]
    for f in ("codes", "scales", "bias"):
      np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)))
  # '*' only takes 2-D leaves named kernel: embeddings and norms stay as they were.
  assert q["embed"]["embedding"] is params["embed"]["embedding"]
  assert q["norm"]["scale"] is params["norm"]["scale"]
  # The input tree is not modified.
  assert set(params["a"]) == {"kernel", "bias"}
  assert not isinstance(params["a"]["kernel"], hj.QuantizedWeight)


def test_quantspec_values_and_lists():
  spec = hj.QuantSpec("int8", "channel", 0)
  params = {"layers": [{"kernel": jax.random.normal(jax.random.key(i), (64, 32))}
                       for i in range(3)]}
  q = hj.quantize_params(params, {"layers/1/kernel": None, "*": spec}, progress=False)
  assert isinstance(q["layers"], list)
  assert q["layers"][0]["kernel"].spec == spec
  assert q["layers"][1]["kernel"] is params["layers"][1]["kernel"]
  assert q["layers"][2]["kernel"].spec == spec


def _bert_llama_tree():
  z = lambda *s: jnp.ones(s, jnp.float32)
  bert_layer = {
      "attention": {"self": {n: {"kernel": z(128, 128)} for n in ("query", "key", "value")},
                    "output": {"dense": {"kernel": z(128, 128)}}},
      "intermediate": {"dense": {"kernel": z(128, 256)}},
      "output": {"dense": {"kernel": z(256, 128)}}}
  llama_layer = {
      "self_attn": {n: {"kernel": z(128, 128)} for n in ("q_proj", "k_proj", "v_proj",
                                                         "o_proj")},
      "mlp": {n: {"kernel": z(128, 256) if n != "down_proj" else z(256, 128)}
              for n in ("gate_proj", "up_proj", "down_proj")}}
  return {"bert": {"layer_0": bert_layer, "pooler": {"dense": {"kernel": z(128, 128)}}},
          "llama": {"layers_0": llama_layer, "lm_head": {"kernel": z(128, 64)}}}


def test_mixed_preset_patterns_on_bert_and_llama_names():
  plan = recipes.plan(_bert_llama_tree(), "fp8-attn-nvfp4-mlp")
  fp8, nv = hj.QuantSpec.preset("w8a8-fp8"), hj.QuantSpec.preset("w4a4-nvfp4")
  for p, s in plan.items():
    if "attention" in p or "self_attn" in p:
      assert s == fp8, p
    elif "intermediate" in p or "mlp" in p or p.endswith("layer_0/output/dense/kernel"):
      assert s == nv, p
    else:
      assert s is None, p  # pooler, lm_head: no pattern, kept float
  assert plan["bert/layer_0/attention/output/dense/kernel"] == fp8
  assert plan["bert/layer_0/output/dense/kernel"] == nv
  assert len(plan) == 15


@pytest.mark.parametrize("name", sorted(hj.RECIPES))
def test_every_named_recipe_is_valid(name):
  rec = recipes.get_recipe(name)
  assert rec and all(v is None or isinstance(hj.QuantSpec.preset(v) if isinstance(v, str)
                                             else v, hj.QuantSpec) for v in rec.values())


def test_errors_name_the_problem():
  params = {"odd": {"kernel": jax.random.normal(jax.random.key(3), (96, 32))}}
  with pytest.raises(ValueError, match="odd/kernel"):
    hj.quantize_params(params, {"*": "w4a16-g128"}, progress=False)  # 128 does not divide 96
  nan = {"bad": {"kernel": jnp.full((128, 32), jnp.nan)}}
  with pytest.raises(ValueError, match="bad/kernel.*NaN"):
    hj.quantize_params(nan, {"*": "w8a16"}, progress=False)
  with pytest.raises(ValueError, match="unknown preset"):
    hj.quantize_params(params, {"*": "w3a16"}, progress=False)
  with pytest.raises(ValueError, match="not a valid regex"):
    hj.quantize_params(params, {"re:(": "w8a16"}, progress=False)
  with pytest.raises(ValueError, match="unknown recipe"):
    hj.quantize_params(params, "no-such-recipe", progress=False)
  with pytest.raises(TypeError, match="preset name, a QuantSpec or None"):
    hj.quantize_params(params, {"*": 4}, progress=False)


def test_progress_bar_on_large_trees(capsys):
  params = {f"l{i}": {"kernel": jax.random.normal(jax.random.key(i), (32, 16))}
            for i in range(8)}
  q = hj.quantize_params(params, {"*": "w8a16"}, progress=True)
  assert all(isinstance(v["kernel"], hj.QuantizedWeight) for v in q.values())
  assert "quantize_params" in capsys.readouterr().err
  hj.quantize_params(params, {"*": "w8a16"}, progress=False)
  assert capsys.readouterr().err == ""


def test_prepare_params_is_identity_on_the_xla_path():
  params = _tree(jax.random.key(4))
  q = hj.quantize_params(params, {"*": "w4a16-g128"}, progress=False)
  p = recipes.prepare_params(q, backend="xla")
  assert p["a"]["kernel"] is q["a"]["kernel"]
  assert p["embed"]["embedding"] is q["embed"]["embedding"]


class _ScannedBody(nn.Module):
  dtype: Any = None

  @nn.compact
  def __call__(self, x, _):
    return jnp.tanh(nn.Dense(128, dtype=self.dtype, name="fc")(x)), None


class _Scanned(nn.Module):
  """Three layers under nn.scan (params (3, 128, 128)), then a plain head."""
  dtype: Any = None  # the layers' compute dtype (bf16 on the GPU: the scan carry's)

  @nn.compact
  def __call__(self, x):
    x = nn.scan(_ScannedBody, variable_axes={"params": 0}, split_rngs={"params": True},
                length=3)(self.dtype, name="layers")(x, None)[0]
    return nn.Dense(64, dtype=self.dtype, name="head")(x)


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_scanned_layers_quantize_layer_by_layer_and_run_under_scan(backend):
  model, x = _Scanned(), jax.random.normal(jax.random.key(1), (4, 128))
  params = model.init(jax.random.key(0), x)["params"]
  q = hj.quantize_params(params, "w4a16-all", progress=False, scanned=("layers",))
  stack = q["layers"]["fc"]["kernel"]
  assert stack.shape == (128, 128) and stacked_layers(stack) == (3,)
  assert "layers=(3,)" in repr(stack) and "bias" not in q["layers"]["fc"]
  for i in range(3):  # each layer is hj.quantize of that layer, bias folded
    one = hj.quantize(params["layers"]["fc"]["kernel"][i], "w4a16-g128",
                      bias=params["layers"]["fc"]["bias"][i])
    for f in ("codes", "scales", "bias"):
      np.testing.assert_array_equal(getattr(stack, f)[i], getattr(one, f))
  if backend == "interpret":  # prepared layer by layer, stacked again
    q = recipes.prepare_params(q, backend="interpret")
    prepared = q["layers"]["fc"]["kernel"]
    assert prepared.layout != "canonical" and stacked_layers(prepared) == (3,)
    assert "layers=(3,)" in repr(prepared)
    np.testing.assert_array_equal(hj.dequantize(prepared), hj.dequantize(stack))
    with pytest.raises(ValueError, match=r"a stack of \(3,\) layers"):
      hj.quant_dense(prepared, x, backend=backend)
  y = jax.jit(lambda p: hnn.apply_quantized(model, {"params": p}, x, backend=backend))(q)
  h = x  # the same model as a loop over one layer at a time
  for i in range(3):
    h = jnp.tanh(hj.quant_dense(jax.tree.map(lambda a: a[i], q["layers"]["fc"]["kernel"]), h,
                                backend=backend))
  np.testing.assert_allclose(y, hj.quant_dense(q["head"]["kernel"], h, backend=backend),
                             rtol=1e-5, atol=1e-5)
  y_float = model.apply({"params": params}, x)  # four int4 g128 layers: ~0.09 each
  assert jnp.linalg.norm(y - y_float) / jnp.linalg.norm(y_float) < 0.3
  # Reports count every layer of the stack.
  row = next(r for r in hj.report(q).tensors if r.path == "layers/fc/kernel")
  assert row.bits_per_weight == pytest.approx(4.125) and row.bf16_bytes == 2 * 3 * 128 * 128
  err = hj.error_report(params, q)["layers/fc/kernel"]
  assert 15 < err.weight_sqnr_db < 25


def test_layer_stacks_without_scanned_are_named_not_quantized_silently():
  model, x = _Scanned(), jnp.ones((2, 128))
  params = model.init(jax.random.key(0), x)["params"]
  with pytest.warns(UserWarning, match=r"1 kernels with more than 2 dims stay float.*"
                                       r"layers/fc/kernel \(3, 128, 128\)"):
    q = hj.quantize_params(params, "w8a16-all", progress=False)
  assert q["layers"]["fc"]["kernel"] is params["layers"]["fc"]["kernel"]
  with pytest.raises(ValueError, match=r"recipe\['layers/fc'\] asks for .* \(3, 128, 128\).*"
                                       r"scanned="):
    hj.quantize_params(params, {"layers/fc": "w8a16"}, progress=False)
  with pytest.raises(ValueError, match=r"scanned=\['layerz'\] holds no float kernel"):
    hj.quantize_params(params, "w8a16-all", progress=False, scanned=("layerz",))
  with pytest.raises(ValueError, match="head/kernel .* no 1 leading layer axes"):
    hj.quantize_params(params, "w8a16-all", progress=False, scanned=("head",))
  with pytest.raises(TypeError, match="scanned must be a sequence of module paths"):
    hj.quantize_params(params, "w8a16-all", progress=False, scanned="layers")
  q = hj.quantize_params(params, "w8a16-all", progress=False, scanned=("layers",))
  with pytest.raises(ValueError, match=r"a stack of \(3,\) layers .* jax.tree.map"):
    hj.quant_dense(q["layers"]["fc"]["kernel"], x)
  specs = hj.sharding.weight_partition_spec(q["layers"]["fc"]["kernel"], P(None, None, "tp"))
  assert (specs.codes, specs.scales, specs.bias) == (P(None, None, "tp"),) * 2 + (
      P(None, "tp"),)  # the layer axis stays whole (tests/sharding_checks.py runs it)


def test_recipe_keys_that_decide_no_kernel_warn_or_raise():
  params = _tree(jax.random.key(5))
  with pytest.warns(UserWarning, match=r"decided no kernel: \['b/kernal', 're:\^zz'\]"):
    q = hj.quantize_params(params, {"b/kernal": None, "re:^zz": "w8a16", "*": "w8a16"},
                           progress=False)
  assert isinstance(q["b"]["kernel"], hj.QuantizedWeight)  # the misspelt None did nothing
  with pytest.raises(ValueError, match=r"decided no kernel: \['embed/embedding'\]"):
    hj.quantize_params(params, {"embed/embedding": "w8a16"}, progress=False, strict=True)
  with pytest.warns(UserWarning, match="decided no kernel"):  # a named recipe, no match
    hj.quantize_params(params, "fp8-attn-w4a16-mlp", progress=False)


def test_nnx_state_is_refused_by_name():
  state = nnx.state(nnx.Linear(128, 64, rngs=nnx.Rngs(0)))
  with pytest.raises(TypeError, match="quantize_nnx_model"):
    hj.quantize_params(state, {"kernel": "w8a16"}, progress=False)
  pure = hj.quantize_params(nnx.to_pure_dict(state), {"kernel": "w8a16"}, progress=False)
  assert isinstance(pure["kernel"], hj.QuantizedWeight)


def test_quantize_params_under_jit_equals_eager():
  params = _tree(jax.random.key(6))
  eager = hj.quantize_params(params, "w4a16-all", progress=False)
  traced = jax.jit(lambda p: hj.quantize_params(p, "w4a16-all", progress=False))(params)
  for name in "abc":
    for f in ("codes", "scales", "bias"):
      np.testing.assert_array_equal(getattr(traced[name]["kernel"], f),
                                    getattr(eager[name]["kernel"], f))


class _ScannedAttentionBody(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    h = nn.DenseGeneral((4, 32), name="heads")(x)  # (128, 4, 32) per layer
    return x + nn.Dense(128, name="fc")(h.reshape(*x.shape[:-1], 128)), None


def test_scanned_heads_stay_float_and_the_rest_quantizes():
  scan = nn.scan(_ScannedAttentionBody, variable_axes={"params": 0},
                 split_rngs={"params": True}, length=2)(name="layers")
  x = jax.random.normal(jax.random.key(2), (4, 128))
  params = scan.init(jax.random.key(0), x, None)["params"]
  with pytest.warns(UserWarning, match=r"layers/heads/kernel \(2, 128, 4, 32\)"):
    q = hj.quantize_params({"layers": params}, "w8a16-all", progress=False,
                           scanned={"layers": 1})
  assert q["layers"]["heads"]["kernel"] is params["heads"]["kernel"]
  assert stacked_layers(q["layers"]["fc"]["kernel"]) == (2,)


def test_each_layout_declares_the_rank_of_its_codes():
  """stacked_layers (and check_params) read a prepared stack's layer axes off
  DenseKernel.codes_ndim: every family's prepared codes have that rank, for every spec it
  runs here (grouped families: one expert axis more)."""
  from humming_jax.kernels import registry
  registry._load_kernels()
  w = jax.random.normal(jax.random.key(7), (256, 256))
  checked = set()
  for preset in ("w4a16-g128", "w4a16-g128-zp", "w8a16", "w8a16-fp8", "w4a16-mxfp4",
                 "w4a16-nvfp4", "w4a16-mxint4", "w8a8-fp8", "w8a8-int8", "w4a8-mxfp4",
                 "w4a4-nvfp4", hj.QuantSpec("int3", "group", 64)):
    q = hj.quantize(w, preset)
    for kernel in registry._DENSE:
      if kernel.supports(q.spec):
        prepared = hj.prepare(q, kernel=kernel.name)
        assert prepared.codes.ndim == kernel.codes_ndim, (kernel.name, q.spec.name)
        assert stacked_layers(prepared) == ()
        checked.add(kernel.name)
  assert checked == {k.name for k in registry._DENSE}
  experts = jax.random.normal(jax.random.key(8), (2, 256, 256))  # and every grouped family
  for preset in ("w4a16-g128", "w4a16-mxfp4", "w8a8-fp8", "w4a8-mxfp4"):
    q = hj.quantize(experts, preset)
    for kernel in registry._GROUPED:
      if kernel.supports(q.spec):
        prepared = hj.prepare(q, grouped=True, kernel=kernel.name)
        assert prepared.codes.ndim == kernel.codes_ndim, (kernel.name, q.spec.name)
        assert stacked_layers(prepared) == ()
        checked.add(kernel.name)
  assert checked == {k.name for k in registry._DENSE + registry._GROUPED}


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["w4a16-all", "mxfp4-all"])
def test_gpu_scanned_layers_run_the_kernels_layer_by_layer(preset):
  """A scanned model's prepared stack on the H200: the scan body runs the Pallas kernel on
  one prepared layer, equal to the same kernel called on that layer outside the scan."""
  model = _Scanned(jnp.bfloat16)
  x = jax.random.normal(jax.random.key(1), (16, 128)).astype(jnp.bfloat16)
  params = model.init(jax.random.key(0), x)["params"]
  q = recipes.prepare_params(hj.quantize_params(params, preset, progress=False,
                                                scanned=("layers",)))
  stack = q["layers"]["fc"]["kernel"]
  assert stack.layout != "canonical" and stacked_layers(stack) == (3,)
  y = jax.jit(lambda p, x: hnn.apply_quantized(model, {"params": p}, x))(q, x)
  layer = jax.jit(lambda w, h: jnp.tanh(hj.quant_dense(w, h)))
  h = x
  for i in range(3):
    h = layer(jax.tree.map(lambda a: a[i], stack), h)
  ref = jax.jit(hj.quant_dense)(q["head"]["kernel"], h)
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32),
                             rtol=2e-2, atol=2e-2)


def test_stacks_of_expert_stacks_prepare_by_layer_and_abstract_stacks_get_specs():
  # A stack of (E, K, N) expert stacks: its grouped layout says its codes' rank
  # (DenseKernel.codes_ndim), so prepare_params prepares it layer by layer, as a dense
  # layer stack, and a scan over the layers runs each prepared expert stack.
  experts = [hj.quantize(jax.random.normal(jax.random.key(i), (4, 256, 128)), "w4a16-g128")
             for i in range(2)]
  stack = jax.tree.map(lambda *a: jnp.stack(a), *experts)
  assert stacked_layers(stack) == (2,)
  out = recipes.prepare_params({"moe": stack}, backend="interpret")["moe"]
  assert out.layout != "canonical" and stacked_layers(out) == (2,)
  x = jax.random.normal(jax.random.key(5), (6, 256), jnp.bfloat16)
  gs = jnp.array([2, 0, 3, 1], jnp.int32)
  layer = lambda b: lambda p: hj.quant_ragged_dot(p, x, gs, backend=b)
  ys = jax.lax.map(layer("interpret"), out)
  for i in range(2):
    np.testing.assert_array_equal(np.asarray(ys[i]), np.asarray(
        hj.quant_ragged_dot(hj.prepare(experts[i], grouped=True), x, gs,
                            backend="interpret")))
  # Partition specs of a layer stack from its shapes alone (jax.eval_shape, before init).
  params = {"fc": {"kernel": jax.random.normal(jax.random.key(3), (3, 256, 128))}}
  q = hj.quantize_params(params, "w4a16-all", progress=False, scanned=("fc",))
  fspec = {"fc": {"kernel": P(None, None, "tp")}}
  assert (hj.sharding.partition_specs(jax.eval_shape(lambda: q), fspec)
          == hj.sharding.partition_specs(q, fspec))
