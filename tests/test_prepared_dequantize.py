"""registry.dequantize: prepared params read in their own layout give the canonical weights.

The XLA paths on prepared params (quant_dense's backward, the XLA grouped GEMM) decode
the kernel layout directly instead of converting every code back to canonical per call;
these tests hold each family's reader to quantize.dequantize of the canonical params:
bit-equal in float32, and the canonical values rounded once in bf16 / fp16.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.kernels import registry
from humming_jax.quantize import dequantize, with_input_permutation

# 16-bit reads must round once even where the scales are not in the read's dtype
# (GPTQ checkpoints keep float16 scales; float32 scales round in both)
FP16_SCALES = hj.QuantSpec("int4", "group", 128, scale_dtype="float16")
FP32_SCALES_ZP = hj.QuantSpec("uint4", "group", 128, scale_dtype="float32", zero_point=True)

# (kernel family, spec): every family has a layout reader
DENSE = [("wna16_mgpu", FP16_SCALES), ("wna16_mgpu", FP32_SCALES_ZP), ("wna16", FP16_SCALES),
         ("wna16", "w4a16-g128-zp"), ("wna16", "w4a16-nvfp4"),
         ("wna16_mgpu", "w4a16-g128-zp"), ("wna16_mgpu", "w4a16-mxfp4"),
         ("wna16_mgpu", "w4a16-nvfp4"), ("wna16_mgpu", "w8a16"), ("wna16_mgpu", "w8a16-fp8"),
         ("wna16_mgpu", "w4a16-ch"), ("wnam_mgpu", "w4a8-mxfp4"), ("wnam_mgpu", "w4a8-int8"),
         ("w8a8", "w8a8-int8"), ("w8a8", "w8a8-fp8"), ("w8a8", "w8a8-fp8-block"),
         ("w8a8", "w8a8-mxfp8"), ("w8a8", "w4a8-int8")]
GROUPED = [("grouped_wna16_mgpu", FP16_SCALES), ("grouped_wna16", "w4a16-g128-zp"), ("grouped_wna16_mgpu", "w4a16-g128-zp"),
           ("grouped_wna16_mgpu", "w4a16-nvfp4"), ("grouped_wnam_mgpu", "w4a8-mxfp4"),
           ("grouped_w8a8", "w8a8-fp8"), ("grouped_w8a8", "w8a8-int8")]


def _weights(shape, seed, scale=None):
  scale = shape[-2] ** -0.5 if scale is None else scale
  return jax.random.normal(jax.random.key(seed), shape) * scale


def test_small_weights_read_in_float16_round_once():
  """bf16 scales of small weights (3e-6: scales among float16 subnormals) read as float16: the product
  of the float32 values rounds once (a float16 multiply of scales already cast to float16
  would round twice)."""
  for family, preset in (("wna16_mgpu", "w4a16-g128-zp"), ("wnam_mgpu", "w4a8-int8")):
    q = hj.quantize(_weights((256, 128), 14, scale=3e-6), preset)
    _check(hj.prepare(q, kernel=family), q)


def _check(prepared, canonical):
  want = np.asarray(dequantize(canonical))
  np.testing.assert_array_equal(np.asarray(registry.dequantize(prepared)), want)
  for dtype in (jnp.bfloat16, jnp.float16):
    got16 = registry.dequantize(prepared, dtype)
    assert got16.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got16.astype(jnp.float32)),
                                  np.asarray(jnp.asarray(want).astype(dtype)
                                             .astype(jnp.float32)))


@pytest.mark.parametrize("family,preset", DENSE)
def test_dense_layouts_read_as_canonical(family, preset):
  n = 384 if str(preset).endswith("block") else 192  # (a 128-column scale block needs N % 128 == 0)
  q = hj.quantize(_weights((256, n), 0), preset)
  prepared = hj.prepare(q, kernel=family)
  assert registry.layout_family(prepared.layout) == family
  assert registry.by_layout(prepared.layout).dequantize is not None
  _check(prepared, q)


@pytest.mark.parametrize("family,preset", GROUPED)
def test_grouped_layouts_read_as_canonical(family, preset):
  q = hj.quantize(_weights((3, 256, 128), 1), preset)
  prepared = hj.prepare(q, grouped=True, kernel=family)
  assert registry.layout_family(prepared.layout) == family
  _check(prepared, q)


def test_act_order_rows_come_back_in_weight_order():
  q = hj.quantize(_weights((256, 128), 2), "w4a16-g128-zp")
  perm = jax.random.permutation(jax.random.key(3), 256)
  qp = with_input_permutation(q, perm)
  prepared = hj.prepare(qp, kernel="wna16_mgpu")
  assert prepared.input_perm is not None
  _check(prepared, qp)
  # the permutation is applied: rows differ from the stored order
  assert not np.array_equal(np.asarray(registry.dequantize(prepared)),
                            np.asarray(dequantize(q)))


def _no_relayout(monkeypatch):
  def refuse(params):
    raise AssertionError(f"to_canonical called on {params.layout!r}")
  monkeypatch.setattr(registry, "to_canonical", refuse)


def test_dense_backward_reads_the_prepared_layout(monkeypatch):
  """quant_dense's backward on prepared params: no re-layout to canonical, and dx is
  dy . W^T with W dequantized from the canonical params and rounded once to bf16, bit for
  bit (the same XLA GEMM)."""
  q = hj.quantize(_weights((256, 128), 4), "w4a16-g128-zp")
  prepared = hj.prepare(q, kernel="wna16_mgpu")
  x = jax.random.normal(jax.random.key(5), (4, 256), jnp.bfloat16)
  dy = jax.random.normal(jax.random.key(6), (4, 128), jnp.bfloat16)
  _no_relayout(monkeypatch)
  _, vjp = jax.vjp(lambda a: hj.quant_dense(prepared, a, backend="interpret"), x)
  (dx,) = vjp(dy)
  want = jnp.dot(dy, dequantize(q).astype(jnp.bfloat16).T)  # W rounded once, bf16 GEMM
  np.testing.assert_array_equal(np.asarray(dx.astype(jnp.float32)),
                                np.asarray(want.astype(jnp.float32)))


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("family,preset", [("grouped_wna16_mgpu", "w4a16-mxfp4"),
                                           ("grouped_wna16_mgpu", "w4a16-g128-zp"),
                                           ("grouped_wna16_mgpu", "w4a16-nvfp4"),
                                           ("grouped_wnam_mgpu", "w4a8-mxfp4")])
def test_xla_grouped_gemm_reads_the_prepared_layout(monkeypatch, family, preset, exact):
  """ragged_dot_xla (quant_ragged_dot's backward and XLA path) on prepared experts decodes
  only the routed ones in their own layout: equal to the canonical params' result."""
  from humming_jax.moe import ragged_dot_xla
  q = hj.quantize(_weights((4, 256, 128), 7), preset)
  prepared = hj.prepare(q, grouped=True, kernel=family)
  x = jax.random.normal(jax.random.key(8), (24, 256), jnp.bfloat16)
  group_sizes = jnp.array([5, 0, 11, 6])  # an empty expert; 2 rows past the sum
  want = np.asarray(ragged_dot_xla(q, x, group_sizes, exact=exact).astype(jnp.float32))
  _no_relayout(monkeypatch)
  got = np.asarray(ragged_dot_xla(prepared, x, group_sizes, exact=exact).astype(jnp.float32))
  np.testing.assert_array_equal(got, want)
  assert np.all(got[22:] == 0) and np.any(got[:22] != 0)


@pytest.mark.parametrize("preset", ["w4a16-g128-zp", "w4a16-mxfp4"])
def test_k_order_read_of_permuted_experts(monkeypatch, preset):
  """HUMMING_JAX_XLA_GROUPED_K_ORDER=1 (the A/B candidate for the XLA grouped GEMM):
  ":pk" experts decoded from codes materialized in K order give the same weights."""
  from humming_jax.kernels import grouped_wna16_mgpu, wna16_mgpu
  q = hj.quantize(_weights((3, 256, 128), 9), preset)
  prepared = hj.prepare(q, grouped=True, kernel="grouped_wna16_mgpu")
  assert wna16_mgpu.k_permuted(prepared.layout)
  view = wna16_mgpu.materialized_k_order(prepared)
  assert not wna16_mgpu.k_permuted(view.layout)
  assert not np.array_equal(np.asarray(view.codes), np.asarray(prepared.codes))
  monkeypatch.setenv("HUMMING_JAX_XLA_GROUPED_K_ORDER", "1")
  assert grouped_wna16_mgpu.xla_read_order(prepared).layout == view.layout
  _check(prepared, q)


def test_hj_dequantize_takes_prepared_params():
  q = hj.quantize(_weights((256, 128), 10), "w4a16-nvfp4")
  for kernel in ("wna16_mgpu", "wna16"):
    np.testing.assert_array_equal(np.asarray(hj.dequantize(hj.prepare(q, kernel=kernel))),
                                  np.asarray(hj.dequantize(q)))
  with pytest.raises(ValueError, match="unknown params layout 'no_such_family:x'"):
    hj.dequantize(q.replace(layout="no_such_family:x"))


def test_backward_products_are_16_bit():
  """For bf16 x the backward's GEMMs take bf16 operands (a float32 product would make dy
  float32 and dx a float32 GEMM over W widened to float32: 1.25 ms more at 8192^2,
  M = 4096 on the H200), dense and grouped."""
  from humming_jax.moe import ragged_dot_gradient_reference
  from humming_jax.kernels.reference import dense_gradient_reference
  x = jax.random.normal(jax.random.key(11), (8, 256), jnp.bfloat16)
  dense = hj.prepare(hj.quantize(_weights((256, 128), 12), "w4a16-g128-zp"))
  experts = hj.prepare(hj.quantize(_weights((2, 256, 128), 13), "w4a16-g128-zp"),
                       grouped=True)
  group_sizes = jnp.array([3, 5])
  for f in (lambda a: dense_gradient_reference(dense, a),
            lambda a: ragged_dot_gradient_reference(experts, a, group_sizes)):
    y, vjp = jax.vjp(f, x)
    jaxpr = jax.make_jaxpr(vjp)(jnp.ones_like(y))
    dots = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    assert dots, "no dot in the backward"
    for e in dots:
      assert all(v.aval.dtype == jnp.bfloat16 for v in e.invars), e


def _equations(jaxpr):
  """Every equation of a jaxpr and of the jaxprs in its equations' params (scan / map
  bodies, pjit, custom rules, cond branches)."""
  for e in jaxpr.eqns:
    yield e
    for param in e.params.values():
      for inner in (param if isinstance(param, (tuple, list)) else (param,)):
        inner = getattr(inner, "jaxpr", inner)  # ClosedJaxpr -> Jaxpr
        if hasattr(inner, "eqns"):
          yield from _equations(inner)
