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


def test_arrays_that_do_not_match_the_spec_are_refused():
  """Params whose arrays do not match their spec / shape / layout (aux data) are refused
  by every entry point, naming the field: leaves restored into a template of another
  spec, a spec swapped with ``replace``, e8m0 scale codes cast to floats, one expert
  taken from a prepared stack leaf by leaf.  Before, each backend computed its own wrong
  answer (interpret vs xla 56.6 apart at outputs of ~44).  A float copy of float scales
  (what gradients with respect to the scales take, docs/training.md) is not a mismatch."""
  w = rand((256, 128), 0)
  q = hj.quantize(w, "w4a16-g128")
  template = hj.quantize(jnp.zeros((256, 128)), QuantSpec("int4", "group", 64))
  mixed = jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(q))
  x = rand((4, 256), 1)
  for backend in ("xla", "interpret"):
    with pytest.raises(ValueError, match=r"quant_dense: params: scales bfloat16\[2, 128\]: "
                                         r"expected shape \[4, 128\]"):
      hj.quant_dense(mixed, x, backend=backend)
  with pytest.raises(ValueError, match=r"q: scales .* expected"):
    hj.dequantize(mixed)
  with pytest.raises(ValueError, match=r"prepare: params: scales .* expected"):
    hj.prepare(mixed)
  with pytest.raises(ValueError, match="zeros is missing; spec.zero_point=True"):
    hj.quant_dense(q.replace(spec=hj.QuantSpec.preset("w4a16-g128-zp")), x)
  mx = hj.quantize(w, "w4a16-mxfp4")  # e8m0 scales are codes: a float copy is refused
  with pytest.raises(ValueError, match=r"scales float32\[8, 128\]: expected shape \[8, 128\] of uint8"):
    hj.quant_dense(mx.replace(scales=mx.scales.astype(jnp.float32)), x, backend="xla")
  nv = hj.quantize(w, "w4a16-nvfp4")  # a float copy of other scales runs (gradients)
  np.testing.assert_allclose(
      hj.quant_dense(nv.replace(scales=nv.scales.astype(jnp.float32)), x, backend="xla"),
      hj.quant_dense(nv, x, backend="xla"), rtol=1e-6)
  experts = hj.prepare(hj.quantize(rand((3, 256, 128), 2), "w4a16-g128"), grouped=True)
  one = jax.tree.map(lambda a: a[1], experts)
  assert "layers" not in repr(one)  # (it read the sliced codes as a layer stack)
  gs = jnp.array([2, 1, 1], jnp.int32)
  with pytest.raises(ValueError, match="this layout stores 4-D codes per layer"):
    hj.quant_ragged_dot(one, x, gs, backend="xla")
  with pytest.raises(ValueError, match="codes.shape=.*stores 4-D codes"):
    hj.dequantize(one)
  # the arrays as quantize made them still pass, prepared or not, stacked or not
  np.testing.assert_array_equal(hj.quant_dense(q, x, backend="xla"),
                                hj.quant_dense(hj.prepare(q), x, backend="xla"))
  hj.quant_ragged_dot(experts, x, gs, backend="xla")


def test_static_activation_scale_must_be_finite_and_positive():
  """A calibrated scale of 0 (all-zero calibration data) zeroed every output; negative,
  NaN and inf scales were stored too."""
  spec = QuantSpec("int8", "channel", act="int8", act_granularity="tensor", act_static=True)
  w = rand((128, 64), 0)
  for bad in (0.0, -0.5, float("nan"), float("inf")):
    with pytest.raises(ValueError, match=r"act_scale=.*expected a finite scale > 0"):
      hj.quantize(w, spec, act_scale=bad)
  q = hj.quantize(w, spec, act_scale=0.05)
  assert float(q.act_scale) == pytest.approx(0.05)
  # a NaN in x under a static int8 scale: NaN out, the whole tensor, as a per-tensor
  # scale's (its int8 code was 0 on the CPU: finite outputs equal to x with a 0 there),
  # on every backend and layout
  x = rand((4, 128), 1).at[0, 3].set(jnp.nan)
  for params, backend in ((q, "xla"), (q, "interpret"), (hj.prepare(q), "interpret")):
    assert np.isnan(np.asarray(hj.quant_dense(params, x, backend=backend))).all(), backend
  finite = hj.quant_dense(q, x.at[0, 3].set(1e4), backend="xla")  # inf-like: clipped
  assert np.isfinite(np.asarray(finite)).all()
  # fp8 codes carry NaN themselves: only the NaN's row (no whole-tensor poisoning there)
  fp8 = hj.quantize(w, spec.replace(weight="fp8_e4m3", act="fp8_e4m3"), act_scale=0.05)
  rows = np.isnan(np.asarray(hj.quant_dense(fp8, x, backend="xla"))).any(axis=1)
  np.testing.assert_array_equal(rows, [True, False, False, False])


def test_a_group_that_does_not_divide_k_is_a_mismatch():
  """quantize refuses a group size that does not divide K; params built another way (a
  checkpoint whose scales hold K // 16 groups for K = 24: rows 16-23 took group 0's
  scale) are refused too, naming the geometry (session 48's loader audit)."""
  from humming_jax import packing
  spec = QuantSpec.preset("w4a16-nvfp4")
  good = hj.quantize(rand((32, 16), 0), spec)
  codes = jnp.zeros((packing.packed_rows(24, 4), 16), jnp.uint32)
  bad = good.replace(codes=codes, scales=good.scales[:1], shape=(24, 16))
  with pytest.raises(ValueError, match=r"shape \(K=24, N=16\): the scale blocks \(16 x 1"):
    hj.dequantize(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 1024])
def test_static_int8_nan_gpu(m):
  """The static int8 NaN rule on the GPU kernels (decode and prefill routes): a NaN in x
  makes the whole output NaN, as on the CPU; finite x gives the reference's values."""
  spec = QuantSpec("int8", "channel", act="int8", act_granularity="tensor", act_static=True)
  w = rand((2048, 1024), 0)
  q = hj.quantize(w, spec, act_scale=0.05)
  x = rand((m, 2048), 1, jnp.bfloat16)
  run = jax.jit(lambda q, x: hj.quant_dense(q, x, backend="pallas"))  # no XLA fallback
  y = run(q, x)
  ref = hj.quant_dense(q, x, backend="xla")
  err = float(jnp.linalg.norm((y - ref).astype(jnp.float32)) /
              jnp.linalg.norm(ref.astype(jnp.float32)))
  assert err <= 1e-2, err
  y_nan = run(q, x.at[m // 2, 7].set(jnp.nan))
  assert np.isnan(np.asarray(y_nan, np.float32)).all()


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
