"""The Pallas-Triton unpack of 4-bit codes to e4m3 (kernels/carrier_unpack.py): its element
maps bit-equal to the formats' decode / encode_exact on every input they take, the kernel
bit-equal to wnam_mgpu's XLA reference (interpreter; @gpu: the H200), refusals by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax import formats
from humming_jax.kernels import carrier_unpack as cu, wnam_mgpu as wm

E4M3, E2M1 = formats.get_format("fp8_e4m3"), formats.get_format("fp4_e2m1")
NIBBLES = jnp.arange(16, dtype=jnp.int32)


def test_e2m1_map_is_the_formats_on_every_code_and_shift():
  lo, hi = cu.SHIFT_RANGE
  shifts = jnp.arange(lo, hi + 1, dtype=jnp.int32)[:, None]
  vals = E2M1.decode(NIBBLES)[None].astype(jnp.float32) * formats.exp2_int(shifts)
  want = E4M3.encode_exact(vals, round_subnormals=True)
  got = cu.e2m1_e4m3_codes(jnp.broadcast_to(NIBBLES, want.shape), shifts)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want, np.int32))
  # The general (rounding) encode agrees too, and small shifts do reach subnormals.
  np.testing.assert_array_equal(np.asarray(got), np.asarray(E4M3.encode(vals), np.int32))
  assert ((np.asarray(got) & 0x78) == 0).any() and (np.asarray(got)[:, 1:8] > 0).any()


def test_int4_map_is_the_formats_on_every_code():
  v = jnp.where(NIBBLES >= 8, NIBBLES - 16, NIBBLES).astype(jnp.float32)
  got = np.asarray(cu.int_e4m3_codes(NIBBLES))
  np.testing.assert_array_equal(got, np.asarray(E4M3.encode_exact(v), np.int32))
  np.testing.assert_array_equal(np.asarray(E4M3.decode(got)), np.asarray(v))


def params(name, k, n, seed, wide=False):
  w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / 40
  q = jax.jit(lambda w: hj.quantize(w, name))(w)
  if wide:  # group rows 0..19 octaves down: past the fold's exact 14 (subnormal rounding)
    s = q.scales.astype(jnp.int32)
    s = s - (jnp.arange(s.shape[0], dtype=jnp.int32) * 3 % 20)[:, None]
    q = q.replace(scales=jnp.clip(s, 1, 254).astype(q.scales.dtype))
  return jax.jit(wm.prepare)(q)


def bits(a):
  return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("wide", [False, True])
def test_fold_kernel_is_the_reference(wide):
  p = params("w4a8-mxfp4", 512, 256, seed=1, wide=wide)
  want = bits(wm.mx_fold_codes(p))
  got = bits(wm.mx_fold_codes(p, pallas=True, interpret=True))
  assert got.shape == want.shape == (256, 512)
  np.testing.assert_array_equal(got, want)
  if wide:  # nonzero subnormal codes: the rounding branch ran
    assert (((want & 0x78) == 0) & ((want & 0x07) != 0)).any()
  assert len(np.unique(want)) > 15  # many exponents, both signs


@pytest.mark.parametrize("name", ["w4a8-fp8", "w4a8-mxfp4"])
def test_carrier_kernel_is_the_reference(name):
  """int4 integers (w4a8-fp8) and e2m1 codes with no shift (the carrier route) -> e4m3."""
  p = params(name, 384, 128, seed=2)
  want = bits(wm._carrier_codes(p))
  got = bits(wm._carrier_codes(p, pallas=True, interpret=True))
  np.testing.assert_array_equal(got, want)
  assert len(np.unique(want)) >= 15


def test_refusals():
  p = params("w4a8-mxfp4", 256, 128, seed=3)
  sh = wm.mx_fold_shifts(p)
  with pytest.raises(ValueError, match=r"codes: expected \(Kp / bk, Np, bk\) int4"):
    cu.unpack(p.codes.astype(jnp.int8), kind="int")
  with pytest.raises(ValueError, match="kind='x'"):
    cu.unpack(p.codes, kind="x")
  with pytest.raises(ValueError, match="shifts: only for kind='e2m1'"):
    cu.unpack(p.codes, sh, kind="int")
  with pytest.raises(ValueError, match="shifts: expected"):
    cu.unpack(p.codes, sh[:, :64], kind="e2m1")
  with pytest.raises(ValueError, match="Np=128 must be a multiple of block_n=256"):
    cu.unpack(p.codes, kind="int", block_n=256)


@pytest.mark.gpu
@pytest.mark.parametrize("wide", [False, True])
def test_unpack_gpu(wide):
  """The kernels on the H200, bit-equal to the XLA reference at 8192 x 4096."""
  p = params("w4a8-mxfp4", 8192, 4096, seed=4, wide=wide)
  want = bits(jax.jit(wm.mx_fold_codes)(p))
  got = bits(jax.jit(lambda p: wm.mx_fold_codes(p, pallas=True))(p))
  np.testing.assert_array_equal(got, want)
  p = params("w4a8-fp8", 8192, 4096, seed=5)
  np.testing.assert_array_equal(bits(jax.jit(lambda p: wm._carrier_codes(p, pallas=True))(p)),
                                bits(jax.jit(wm._carrier_codes)(p)))
