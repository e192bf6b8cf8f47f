"""quantize_params: recipe precedence, None keeps float, bias folding, presets, errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax import recipes


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
