"""mgpu_mma.mma_sync (mma.sync on register operands): a one-warpgroup kernel that loads a
(64, K) weight tile in the WGMMA layout and an (R, K) x tile in MMA_X from swizzled shared
memory, as the decode kernel does, against ``w @ x.T`` in float32.  The inline PTX runs on
the GPU only; on the CPU the kernel is lowered for an H200 (the layouts, the register
indexing and the PTX operands are built there)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from humming_jax.kernels import mgpu_mma
from tests.test_cuda_lowering import lower_for_h200


def _swizzled(cols, dtype):
  swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8, "probe")
  return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
          plgpu.SwizzleTransform(swizzle))


def mma_probe(w, x, acc0, *, chains=2):
  """acc0 + w @ x.T through mma_sync in one warpgroup: (64, K), (R, K), (64, R) -> (64, R)."""
  (n, k), rows = w.shape, x.shape[0]

  def kernel(w_gmem, x_gmem, a_gmem, o_gmem, w_smem, x_smem, a_smem, o_smem, bar):
    plgpu.copy_gmem_to_smem(w_gmem, w_smem, bar)
    plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
    plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar)
    plgpu.barrier_wait(bar)
    wv = plgpu.load(w_smem, layout=plgpu.Layout.WGMMA)
    xv = plgpu.load(x_smem, layout=mgpu_mma.MMA_X)
    acc = plgpu.load(a_smem, layout=plgpu.Layout.WGMMA)
    o_smem[...] = mgpu_mma.mma_sync(acc, wv, xv, chains=chains)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((n, rows), jnp.float32),
      scratch_types=dict(
          w_smem=plgpu.SMEM((n, k), w.dtype, transforms=_swizzled(k, w.dtype)),
          x_smem=plgpu.SMEM((rows, k), x.dtype, transforms=_swizzled(k, x.dtype)),
          a_smem=plgpu.SMEM((n, rows), jnp.float32),
          o_smem=plgpu.SMEM((n, rows), jnp.float32),
          bar=plgpu.Barrier(num_arrivals=3)),
      num_threads=1, thread_name="wg")(w, x, acc0)


CASES = [(8, 128, jnp.bfloat16, 2), (16, 256, jnp.bfloat16, 2), (8, 64, jnp.float16, 1),
         (8, 128, jnp.bfloat16, 4), (24, 64, jnp.bfloat16, 16)]  # (chains past K / 16: 4)


@pytest.mark.parametrize("rows,k,dtype,chains", CASES)
def test_mma_sync_lowers_for_h200(rows, k, dtype, chains, mma_sync_calls):
  """The probe kernel lowers for an H200 with one mma.sync per 8 x rows and 16-deep K step
  (the inline_mgpu body ran: the layouts' register shapes are the ones it indexes)."""
  emitted = mma_sync_calls
  sd = jax.ShapeDtypeStruct
  text = lower_for_h200(functools.partial(mma_probe, chains=chains), sd((64, k), dtype),
                        sd((rows, k), dtype), sd((64, rows), jnp.float32))
  assert "custom_call" in text
  assert emitted == [("bf16" if dtype == jnp.bfloat16 else "f16",)] * (rows // 8 * k // 16)


def test_mma_sync_rejects_bad_shapes():
  with pytest.raises(ValueError, match="R a multiple of 8"):
    mgpu_mma.mma_sync(jnp.zeros((64, 4), jnp.float32), jnp.zeros((64, 16), jnp.bfloat16),
                      jnp.zeros((4, 16), jnp.bfloat16))
  with pytest.raises(ValueError, match="both bfloat16 or both float16"):
    mgpu_mma.mma_sync(jnp.zeros((64, 8), jnp.float32), jnp.zeros((64, 16), jnp.bfloat16),
                      jnp.zeros((8, 16), jnp.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k,dtype,chains", CASES)
def test_mma_sync_gpu(rows, k, dtype, chains):
  kw, kx, ka = jax.random.split(jax.random.key(rows * k + chains), 3)
  w = jax.random.normal(kw, (64, k), jnp.float32).astype(dtype)
  x = jax.random.normal(kx, (rows, k), jnp.float32).astype(dtype)
  acc0 = jax.random.normal(ka, (64, rows), jnp.float32)
  got = np.asarray(jax.jit(functools.partial(mma_probe, chains=chains))(w, x, acc0))
  want = np.asarray(acc0) + np.asarray(w, np.float32) @ np.asarray(x, np.float32).T
  # float32 sums of exact 16-bit products: only the summation order differs
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
