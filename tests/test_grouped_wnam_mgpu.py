"""The grouped quantized-activation family on the Mosaic grouped WnA16 kernel
(kernels/grouped_wnam_mgpu.py): interpreter vs the per-expert reference with the same
activation quantization, the layout round trip, the ranking (default for 4-bit weights), bad input; H200 tests
under @pytest.mark.gpu."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.kernels import grouped_wnam_mgpu as gw, reference, registry

from test_grouped_wna16_mgpu import TOL, make, rel, routed_error

CASES = [  # (preset, E, K, N, group_sizes, M): uneven, empty experts, a zero tail
    ("w4a8-int8", 4, 256, 128, [3, 0, 5, 2], 12),
    ("w4a8-fp8", 3, 512, 64, [1, 1, 1], 3),  # decode: one row per expert
    ("w4a8-mxfp4", 5, 256, 192, [0, 7, 2, 0, 9], 20),
    ("w4a4-nvfp4", 3, 256, 64, [4, 0, 3], 9),
    ("w8a8-int8", 3, 256, 128, [2, 5, 0], 8),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-e{c[1]}-m{c[5]}")
def test_matches_the_reference_interpret(case):
  """hj.quant_ragged_dot on params prepared for this family: the spec's activation
  quantization, rounded to bf16, on the grouped WnA16 kernel, against the reference (the
  same quantization, exact products); rows past sum(group_sizes) are zeros."""
  name, e, k, n, gs, m = case
  q, x = make(name, e, k, n, m, True, seed=21)
  g = jnp.asarray(gs, jnp.int32)
  p = hj.prepare(q, grouped=True, kernel=gw.FAMILY)
  assert registry.layout_family(p.layout) == gw.FAMILY and p.spec == q.spec
  y = jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g, backend="interpret"))(p, x, g)
  total = sum(gs)
  want = reference.ragged_dot_reference(q, x, g)
  assert y.shape == (m, n) and y.dtype == x.dtype
  assert rel(y[:total], want[:total]) <= TOL, rel(y[:total], want[:total])
  assert not bool(jnp.any(y[total:] != 0))
  # Not the weight-only product: the activation quantization is applied.
  unq = reference.ragged_dot_reference(q.replace(spec=q.spec.weight_only()), x, g)
  assert rel(y[:total], unq[:total]) > rel(y[:total], want[:total])


def test_round_trip_and_ranking():
  """prepare / to_canonical are exact inverses; the family is the default for 4-bit weights
  with quantized activations (above the Pallas-Triton grouped W8A8 family, session 16's
  H200 times) and for the 4-bit specs no other grouped family takes, not for 8-bit weights
  that grouped_w8a8 takes; weight-only specs and 32-bit tokens are refused by name."""
  q, x = make("w4a8-mxfp4", 3, 256, 128, 6, True, seed=22)
  c = gw.to_canonical(gw.prepare(q))
  for f in ("codes", "scales", "zeros", "global_scale", "bias", "act_scale"):
    a, b = getattr(c, f), getattr(q, f)
    assert (a is None) == (b is None), f
    if a is not None:
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert c.spec == q.spec and c.layout == "canonical"
  find = lambda spec: registry.find(spec, grouped=True, shape=q.shape)
  for name in ("w4a8-mxfp4", "w4a8-int8", "w4a8-fp8", "w4a4-mxfp4", "w4a4-nvfp4"):
    assert find(hj.QuantSpec.preset(name)).name == gw.FAMILY, name
  zp = hj.QuantSpec.preset("w4a16-g128-zp").replace(act="int8")  # no other grouped family
  assert gw.supports(zp) and find(zp).name == gw.FAMILY
  w8 = hj.QuantSpec.preset("w8a8-int8")
  assert gw.supports(w8) and find(w8).name == "grouped_w8a8"
  # 8-bit weights never default here, also where grouped_w8a8 refuses (static scales,
  # int8 weights x fp8 activations): XLA, as before.
  for spec in (w8.replace(act_static=True, act_granularity="tensor"),
               w8.replace(act="fp8_e4m3")):
    assert gw.supports(spec) and gw.priority_for(spec, q.shape) is None
    assert find(spec) is None or find(spec).name != gw.FAMILY
  assert registry.by_name(gw.FAMILY, grouped=True) is gw.KERNEL
  assert registry.by_layout(gw.prepare(q).layout) is gw.KERNEL
  w16, _ = make("w4a16-g128-zp", 3, 256, 128, 6, False)
  assert not gw.supports(w16.spec)
  with pytest.raises(ValueError, match="not supported by the grouped_wnam_mgpu kernel"):
    gw.prepare(w16)
  p = gw.prepare(q)
  g = jnp.asarray([2, 2, 2], jnp.int32)
  with pytest.raises(ValueError, match="bfloat16 / float16 tokens"):
    gw.run(p, x.astype(jnp.float32), g, interpret=True)
  with pytest.raises(ValueError, match="expected grouped_wnam_mgpu"):
    gw.run(q, x, g, interpret=True)
  with pytest.raises(ValueError, match=r"x must be \(M, K=256\)"):
    gw.run(p, x[:, :128], g, interpret=True)
  y0 = gw.run(p, x[:0], g, interpret=True)  # no tokens: (0, N), no quantization of nothing
  assert y0.shape == (0, 128) and y0.dtype == x.dtype


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 16, 64])
@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4"])
def test_deepseek_gate_up_gpu(name, tokens):
  """DeepSeek-V3 gate_up (E=256, K=7168, N=512), top-8 rows sorted by expert, on the H200."""
  e_, _ = routed_error(name, 256, 7168, 512, tokens, 23,
                       lambda q: hj.prepare(q, grouped=True, kernel=gw.FAMILY),
                       hj.quant_ragged_dot)
  print(f"grouped_wnam_mgpu {name} {tokens} tokens: rel err {e_:.2e}")
  assert e_ <= TOL


@pytest.mark.gpu
def test_default_choice_gpu():
  """hj.prepare's own choice for W4A8 MXFP4 experts is this family (session 16), and runs
  DeepSeek-V3 down (E=256, K=256, N=7168) at 16 tokens on the H200 within the tolerance."""
  e_, p = routed_error("w4a8-mxfp4", 256, 256, 7168, 16, 25,
                       lambda q: hj.prepare(q, grouped=True), hj.quant_ragged_dot)
  assert registry.layout_family(p.layout) == gw.FAMILY
  print(f"grouped_wnam_mgpu default, DeepSeek-V3 down 16 tokens: rel err {e_:.2e}")
  assert e_ <= TOL
