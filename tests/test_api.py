"""Public API: quant_dense eager vs jit, no retrace for new params of the same spec/shape,
params as a pytree with static spec, leading dims, bias, dtypes, and every bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.spec import QuantSpec


def rand(shape, seed, dtype=np.float32):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def reference(params, x):
  """Independent of kernels/reference.py: fake-quant x (if the spec says so) @ W_deq + b."""
  x2 = x.reshape(-1, x.shape[-1])
  a = (hj.fake_quantize_activations(x2, params.spec, params.act_scale) if params.spec.act
       else x2.astype(jnp.float32))
  y = np.asarray(a, np.float64) @ np.asarray(hj.dequantize(params), np.float64)
  if params.bias is not None:
    y = y + np.asarray(params.bias)
  return y.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("name", ["w4a16-g128", "w8a8-int8", "w4a4-nvfp4", "w8a8-fp8-block"])
def test_jit_equals_eager_and_reference(name):
  w, b = rand((256, 128), 0), rand((128,), 1)
  p = hj.quantize(w, name, bias=b)
  x = rand((5, 256), 2, jnp.float32)
  y = hj.quant_dense(p, x, backend="xla")
  yj = jax.jit(hj.quant_dense)(p, x)
  assert y.shape == (5, 128) and y.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(yj), np.asarray(y), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(y), reference(p, x), rtol=1e-4, atol=1e-4)
  # And close to the float layer.
  exact = np.asarray(x) @ np.asarray(w) + np.asarray(b)
  assert np.linalg.norm(np.asarray(y) - exact) / np.linalg.norm(exact) < 0.15


def test_no_retrace_for_new_params_of_same_spec_and_shape():
  traces = []

  def f(params, x):
    traces.append(params.spec)  # Python side effect: runs once per trace
    return hj.quant_dense(params, x)

  fj = jax.jit(f)
  x = rand((4, 128), 0, jnp.bfloat16)
  p1 = hj.quantize(rand((128, 64), 1), "w4a16-g128")
  p2 = hj.quantize(rand((128, 64), 2), "w4a16-g128")
  y1, y2 = fj(p1, x), fj(p2, x)
  assert len(traces) == 1
  assert not np.array_equal(np.asarray(y1, np.float32), np.asarray(y2, np.float32))
  np.testing.assert_array_equal(np.asarray(y2), np.asarray(hj.quant_dense(p2, x)))
  fj(hj.quantize(rand((128, 64), 3), "w4a16-g128-zp"), x)  # a different spec: retrace
  assert len(traces) == 2
  fj(hj.quantize(rand((128, 32), 4), "w4a16-g128"), x)  # a different shape: retrace
  assert len(traces) == 3
  # The jit of quant_dense itself: its cache grows only for new specs/shapes.
  qd = jax.jit(hj.quant_dense)
  qd(p1, x)
  n = qd._cache_size()
  qd(p2, x)
  assert qd._cache_size() == n


def test_params_are_a_pytree_with_static_spec():
  p = hj.quantize(rand((128, 64), 0), "w4a16-nvfp4", bias=rand((64,), 1))
  leaves, treedef = jax.tree_util.tree_flatten(p)
  assert all(isinstance(l, jax.Array) for l in leaves)
  assert len(leaves) == 4  # codes, scales, global_scale, bias (None leaves drop out)
  q = jax.tree_util.tree_unflatten(treedef, leaves)
  assert q.spec is p.spec and q.shape == p.shape and q.layout == p.layout
  # tree_map keeps the spec; specs differ -> treedefs differ.
  doubled = jax.tree_util.tree_map(lambda a: a, p)
  assert doubled.spec == p.spec
  other = hj.quantize(rand((128, 64), 0), "w4a16-mxfp4")
  assert jax.tree_util.tree_structure(other) != treedef
  paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(p)[0]]
  assert paths == [".codes", ".scales", ".global_scale", ".bias"]


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 3)])
def test_leading_dims(lead):
  p = hj.quantize(rand((128, 32), 0), "w4a16-g128", bias=rand((32,), 1))
  x = rand((*lead, 128), 2)
  y = hj.quant_dense(p, x)
  assert y.shape == (*lead, 32)
  np.testing.assert_allclose(np.asarray(y), reference(p, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_output_dtype_and_bias(dtype):
  w, b = rand((128, 48), 0), rand((48,), 1) * 10
  x = rand((4, 128), 2, dtype)
  p, pb = hj.quantize(w, "w8a16"), hj.quantize(w, "w8a16", bias=b)
  y, yb = hj.quant_dense(p, x), hj.quant_dense(pb, x)
  assert y.dtype == dtype and yb.dtype == dtype
  diff = np.asarray(yb, np.float32) - np.asarray(y, np.float32)
  # Both outputs are rounded to dtype: allow a few roundings at |y| ~ 20 (bf16 ulp 0.125).
  tol = 4 * float(jnp.finfo(dtype).eps) * float(np.abs(np.asarray(yb, np.float32)).max())
  assert np.abs(diff - np.asarray(b)).max() <= tol


def test_errors():
  p = hj.quantize(rand((128, 64), 0), "w4a16-g128")
  with pytest.raises(ValueError, match=r"x.shape\[-1\] must equal the weight's in_features "
                                       r"K=128 .* got x.shape=\(4, 96\)"):
    hj.quant_dense(p, rand((4, 96), 1))
  with pytest.raises(ValueError, match="x must be a float array"):
    hj.quant_dense(p, jnp.ones((4, 128), jnp.int32))
  with pytest.raises(TypeError, match="params must be a QuantizedWeight"):
    hj.quant_dense({"kernel": rand((128, 64), 0)}, rand((4, 128), 1))
  with pytest.raises(ValueError, match=r"backend='cuda'; expected one of"):
    hj.quant_dense(p, rand((4, 128), 1), backend="cuda")
  stacked = hj.quantize(rand((2, 128, 64), 0), "w4a16-g128")
  with pytest.raises(ValueError, match="params hold stacked experts"):
    hj.quant_dense(stacked, rand((4, 128), 1))
  with pytest.raises(TypeError, match="quant_dense: x must be a jax or numpy array; got list"):
    hj.quant_dense(p, [[1.0] * 128])
  # 8-bit floats are the spec's business (it quantizes activations), not the caller's
  with pytest.raises(ValueError, match="x must be a float array .* got dtype float8_e4m3fn"):
    hj.quant_dense(p, rand((4, 128), 1).astype(jnp.float8_e4m3fn), backend="xla")
  with pytest.raises(TypeError, match="prepare: params must be a QuantizedWeight"):
    hj.prepare(rand((128, 64), 0))


def test_pallas_backend_is_never_a_silent_fallback():
  x = rand((4, 128), 1)
  # A spec no Pallas kernel runs (the first of some unusual ones without a kernel).
  from humming_jax.kernels import registry
  odd_specs = [QuantSpec("fp6_e3m2", "tensor", act="fp8_e5m2"),
               QuantSpec("uint3", "block", 128, block_n=32, zero_point=True, act="fp8_e5m2"),
               QuantSpec("int2", "tensor", scale_dtype="float16", act="fp8_e5m2")]
  odd_specs = [s for s in odd_specs if registry.find(s) is None]
  assert odd_specs, "every odd spec has a kernel now: add one that has none"
  odd = hj.quantize(rand((128, 64), 0), odd_specs[0])
  with pytest.raises(ValueError, match="backend='interpret': no Pallas dense kernel"):
    hj.quant_dense(odd, x, backend="interpret")
  # On the CPU: "needs a GPU"; on a GPU: "no Pallas dense kernel".  Never a result.
  with pytest.raises(ValueError, match="backend='pallas'"):
    hj.quant_dense(odd, x, backend="pallas")
  if jax.default_backend() != "gpu":
    p = hj.quantize(rand((128, 64), 0), "w4a16-g128")
    with pytest.raises(ValueError, match="backend='pallas'"):
      hj.quant_dense(p, x, backend="pallas")
    # backend=None on the CPU is the XLA reference.
    np.testing.assert_array_equal(np.asarray(hj.quant_dense(p, x)),
                                  np.asarray(hj.quant_dense(p, x, backend="xla")))
