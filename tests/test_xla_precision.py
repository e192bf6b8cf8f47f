"""Quantization round trips must survive XLA's GPU simplify-fp-conversions pass.

With xla_allow_excess_precision (on by default) XLA folds a chain of float converts
``f32 -> narrow -> f32`` into nothing on the GPU, which silently skipped the fp8
activation quantization of the XLA reference on the H200.  The rounding helpers widen
the narrow values through integer bit operations instead; these tests check (a) they equal
XLA's own converts on the CPU and (b) the lowered program contains no narrowing convert
that feeds a widening convert.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.quantize import _FAST_ROUND, round_to_float_dtype


def _values():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.standard_normal(20000) * s
                      for s in (1e-8, 1e-5, 1e-3, 1, 100, 6e4, 1e5)]).astype(np.float32)
  special = np.array([np.inf, -np.inf, np.nan, 0.0, 65504, 65520, -65520, 2**-24, 2**-25,
                      3 * 2**-26], np.float32)
  return jnp.asarray(np.concatenate([x, special]))


@pytest.mark.parametrize("name,dtype", [("bfloat16", jnp.bfloat16), ("float16", jnp.float16)])
def test_round_to_float_dtype_equals_convert(name, dtype):
  x = _values()
  want = x.astype(dtype).astype(jnp.float32)
  np.testing.assert_array_equal(np.asarray(round_to_float_dtype(x, name)), np.asarray(want))
  np.testing.assert_array_equal(
      np.asarray(jax.jit(lambda v: round_to_float_dtype(v, name))(x)), np.asarray(want))


@pytest.mark.parametrize("name,dtype,maxv", [("fp8_e4m3", jnp.float8_e4m3fn, 448.0),
                                             ("fp8_e5m2", jnp.float8_e5m2, 57344.0)])
def test_fast_fp8_round_equals_convert(name, dtype, maxv):
  x = _values()[:-10] / (1e3 if name == "fp8_e4m3" else 1.0)
  want = jnp.clip(x, -maxv, maxv).astype(dtype).astype(jnp.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(_FAST_ROUND[name])(x)), np.asarray(want))


def _narrow_to_wide_chains(text: str) -> list[str]:
  """SSA values produced by a convert to a <=16-bit float that feed a convert to f32."""
  narrow = set(re.findall(r"(%[\w#.]+) = stablehlo\.convert [^\n]*-> tensor<[^>]*x?"
                          r"(?:f8E\w+|bf16|f16|f4E\w+)>", text))
  bad = []
  for line in text.splitlines():
    m = re.search(r"stablehlo\.convert (%[\w#.]+)[^\n]*-> tensor<[^>]*f32>", line)
    if m and m.group(1) in narrow:
      bad.append(line.strip())
  return bad


@pytest.mark.parametrize("preset", ["w8a8-fp8", "w8a8-fp8-block", "w4a8-fp8"])
def test_reference_has_no_foldable_convert_chain(preset):
  spec = hj.QuantSpec.preset(preset)
  x = jax.random.normal(jax.random.key(0), (4, 256), jnp.bfloat16)
  text = jax.jit(lambda v: hj.fake_quantize_activations(v, spec)).lower(x).as_text()
  assert "stablehlo.convert" in text
  assert _narrow_to_wide_chains(text) == []


def test_weight_scale_rounding_has_no_foldable_convert_chain():
  w = jax.random.normal(jax.random.key(1), (256, 64))
  for preset in ("w4a16-g128", "w8a16"):
    text = jax.jit(lambda v: hj.quantize(v, preset).scales).lower(w).as_text()
    assert _narrow_to_wide_chains(text) == [], preset


@pytest.mark.parametrize("preset", ["w4a4-nvfp4", "w4a4-mxfp4"])
def test_fp4_activation_quant_uses_no_fp4_convert(preset):
  """The W4A4 pre-pass rounds to e2m1 arithmetically: on the H200 an XLA f32 -> f4 -> f8
  convert chain reached the kernel as f32 -> f8 (fp4 rounding skipped)."""
  from humming_jax.kernels import act_quant
  spec = hj.QuantSpec.preset(preset)
  x = jax.random.normal(jax.random.key(0), (4, 256), jnp.bfloat16)
  text = jax.jit(lambda v: act_quant.quantize(v, spec).values).lower(x).as_text()
  assert "f4E2M1" not in text
  assert _narrow_to_wide_chains(text) == []
