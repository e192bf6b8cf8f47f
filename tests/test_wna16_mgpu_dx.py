"""kernels/wna16_mgpu_dx.py: dx = dy . W^T on the WnA16 Mosaic layout (Pallas-Triton),
against its XLA reference (the backward's dequantization + GEMM) on fresh random inputs,
in the interpreter and on the H200; and the backward's route to it (opt-in)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.kernels import mgpu_convert, wna16_mgpu, wna16_mgpu_dx as dxk, wnam_mgpu


def rel(a, b):
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def prepared(spec, k, n, seed=0):
  w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32)
  p = hj.quantize(w, spec)
  return wnam_mgpu.prepare(p) if p.spec.act else wna16_mgpu.prepare(p)


def close_to_reference(got, want):
  """bf16 outputs of the same float32 sums in another order: equal but for the last bit
  of a few outputs."""
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  scale = np.max(np.abs(want))
  assert np.max(np.abs(got - want)) <= 2 ** -7 * scale
  assert np.mean(got != want) <= 0.05


@pytest.mark.parametrize("spec,m,k,n", [
    ("w4a16-g128-zp", 5, 384, 256),   # int4 zero points, ":pk"
    ("w4a16-mxfp4", 33, 256, 320),    # e2m1, 4 e8m0 rows per tile, ":sf"; Np % 128 != 0
    ("w4a16-nvfp4", 1, 256, 192),     # groups of 16 in the permuted order, global scale
    ("w4a16-ch", 7, 200, 136),        # per channel (column row), K and N padded
    ("w8a16", 100, 256, 128),         # int8 per channel, two row blocks of 64
    ("w4a8-fp8", 16, 256, 128),       # the W4A8 view of the layout (wnam_mgpu)
])
def test_dx_matches_reference_interpret(spec, m, k, n):
  p = prepared(spec, k, n)
  dy = jax.random.normal(jax.random.key(1), (m, n), jnp.bfloat16)
  assert dxk.unsupported_reason(p, dy) is None
  got = dxk.run(p, dy, interpret=True)
  assert got.shape == (m, k) and got.dtype == jnp.bfloat16
  close_to_reference(got, dxk.reference(p, dy))


def test_k_order_and_fp16_and_one_split_interpret():
  """A K-order 4-bit layout (HUMMING_JAX_PERMUTE_K=0's form), float16 dy, and every N
  chunk in one program (splits=1) against N split in two."""
  p = wna16_mgpu.prepare(hj.quantize(jax.random.normal(jax.random.key(2), (256, 256)),
                                     "w4a16-g128"), permute=False)
  assert not wna16_mgpu.k_permuted(p.layout)
  dy = jax.random.normal(jax.random.key(3), (9, 256), jnp.float16)
  want = dxk.reference(p, dy)
  close_to_reference(dxk.run(p, dy, interpret=True, splits=1), want)
  close_to_reference(dxk.run(p, dy, interpret=True, splits=2), want)


def test_plane_positions_invert_the_stored_order():
  """Plane j of word w is stored code w * per + j; for ":pk" the stored code's K position
  is what mgpu_convert.permute_k moved there."""
  for bits, permuted in ((4, True), (4, False), (8, False)):
    pos = dxk.plane_positions(128, bits, permuted)
    per = 32 // bits
    stored = (np.arange(128 // per)[None, :] * per + np.arange(per)[:, None])
    k_order = np.arange(128)
    if permuted:
      k_order = np.asarray(mgpu_convert.permute_k(jnp.arange(128)))
    np.testing.assert_array_equal(pos, k_order[stored])
    assert sorted(pos.reshape(-1)) == list(range(128))


def test_refusals_name_the_argument():
  p = prepared("w4a16-g128", 256, 128)
  dy = jnp.ones((4, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="dy.dtype=float32"):
    dxk.run(p, dy.astype(jnp.float32))
  with pytest.raises(ValueError, match=r"dy.shape=\(4, 64\)"):
    dxk.run(p, dy[:, :64])
  canonical = hj.quantize(jnp.ones((256, 128)), "w4a16-g128")
  with pytest.raises(ValueError, match="params.layout='canonical'"):
    dxk.run(canonical, dy)
  g64 = prepared(hj.QuantSpec(weight="int4", group_size=64), 256, 128)
  assert "words per tile row" in dxk.unsupported_reason(g64, dy)
  with pytest.raises(ValueError, match="splits=3"):
    dxk.run(p, dy, splits=3)


def test_backward_routes_to_the_kernel_when_asked(monkeypatch):
  """quant_dense's cotangent of x comes from the kernel with HUMMING_JAX_DX_KERNEL=1 (the
  launch is in the backward's jaxpr), equals the reference's VJP, and stays on the
  reference by default, for float32 x, and where the params are differentiated too."""
  p = prepared("w4a16-mxfp4", 256, 128)
  x = jax.random.normal(jax.random.key(4), (6, 256), jnp.bfloat16)
  dy = jax.random.normal(jax.random.key(5), (6, 128), jnp.bfloat16)
  loss = lambda x: jnp.sum((hj.quant_dense(p, x, backend="interpret") * dy)
                           .astype(jnp.float32))
  grad = jax.grad(loss)
  launches = lambda f, *a: str(jax.make_jaxpr(f)(*a)).count("name=wna16_mgpu_dx")
  monkeypatch.delenv("HUMMING_JAX_DX_KERNEL", raising=False)
  assert launches(grad, x) == 0
  want = jax.jit(grad)(x)
  monkeypatch.setenv("HUMMING_JAX_DX_KERNEL", "1")
  jax.clear_caches()  # the switch is read when the backward is traced
  assert launches(grad, x) == 1
  close_to_reference(jax.jit(grad)(x), want)
  assert launches(grad, x.astype(jnp.float32)) == 0  # float32: the exact reference
  big = jnp.ones((dxk.MAX_M + 1, 256), jnp.bfloat16)
  assert launches(jax.grad(lambda x: jnp.sum(hj.quant_dense(p, x, backend="interpret")
                                             .astype(jnp.float32))), big) == 0
  canonical = hj.quantize(jax.random.normal(jax.random.key(6), (256, 128)), "w4a16-mxfp4")
  both = jax.grad(lambda q, x: jnp.sum(hj.quant_dense(q, x, backend="interpret")
                                       .astype(jnp.float32)), argnums=(0, 1),
                  allow_int=True)
  assert launches(both, canonical, x) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["w4a16-g128-zp", "w4a16-mxfp4", "w4a16-nvfp4", "w8a16",
                                  "w8a16-fp8"])
@pytest.mark.parametrize("m", [1, 16, 128])
def test_dx_gpu(spec, m):
  """On the H200 at a benchmark shape: the kernel against the XLA route it replaces."""
  p = hj.prepare(hj.quantize(jax.random.normal(jax.random.key(7), (8192, 8192)) / 90, spec))
  dy = jax.random.normal(jax.random.key(8), (m, 8192), jnp.bfloat16)
  close_to_reference(jax.jit(dxk.run)(p, dy), jax.jit(dxk.reference)(p, dy))
