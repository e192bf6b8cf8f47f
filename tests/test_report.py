"""hj.report: stored dtypes/shapes/bytes per tensor agree with the arrays; bits/weight."""
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj


def rand(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def test_int4_g128_is_4_125_bits_and_agrees_with_nbytes():
  k, n = 512, 256
  p = hj.quantize(rand((k, n)), "w4a16-g128", bias=rand((n,), 1))
  r = hj.report({"layer": {"kernel": p}, "norm": jnp.ones((n,), jnp.bfloat16)})
  t, f = r.tensors
  assert t.path == "layer/kernel" and t.kind == "quantized" and t.logical_shape == (k, n)
  assert t.bits_per_weight == pytest.approx(4.125)
  assert t.bytes == p.nbytes() == p.codes.nbytes + p.scales.nbytes
  stored = {name: (dt, shape, b) for name, dt, shape, b in t.stored}
  assert stored["codes"] == ("uint32", (k // 32 * 4, n), k * n // 2)
  assert stored["scales"] == ("bfloat16", (k // 128, n), k // 128 * n * 2)
  assert "bias" not in stored  # a float layer has a bias too
  assert (f.path, f.kind, f.bytes, f.bits_per_weight) == ("norm", "float", 2 * n, 16)
  assert r.total_bytes == t.bytes + f.bytes and r.bf16_bytes == 2 * k * n + 2 * n
  text = str(r)
  assert "layer/kernel" in text and "4.125" in text and "total:" in text


@pytest.mark.parametrize("name", ["w4a16-g128", "w4a16-g128-zp", "w4a16-mxfp4",
                                  "w4a16-nvfp4", "w4a16-mxint4"])
@pytest.mark.parametrize("shape", [(256, 128), (96, 64), (2, 128, 64)])
def test_four_bit_storage_bound(name, shape):
  spec = hj.QuantSpec.preset(name)
  if shape[-2] % spec.group_size:
    shape = (*shape[:-2], 128, shape[-1])
  p = hj.quantize(rand(shape), name)
  numel = int(np.prod(shape))
  scale_bytes = sum(a.nbytes for a in (p.scales, p.zeros, p.global_scale) if a is not None)
  assert p.codes.nbytes <= 1.05 * numel / 2
  assert p.nbytes() == p.codes.nbytes + scale_bytes
  (t,) = hj.report(p).tensors
  assert t.bytes == p.nbytes() and t.bits_per_weight == pytest.approx(8 * p.nbytes() / numel)
  expect = {"w4a16-g128": 4 + 16 / 128, "w4a16-g128-zp": 4 + 24 / 128,
            "w4a16-mxfp4": 4 + 8 / 32, "w4a16-mxint4": 4 + 8 / 32,
            "w4a16-nvfp4": 4 + 8 / 16}[name]
  e = shape[0] if len(shape) == 3 else 1
  extra = 32 * e / numel if name == "w4a16-nvfp4" else 0  # the fp32 global scale
  assert t.bits_per_weight == pytest.approx(expect + extra)


def test_bits_per_weight_every_width():
  for bits in (1, 3, 6, 8):
    p = hj.quantize(rand((256, 64)), hj.QuantSpec(f"int{bits}", "channel",
                                                  scale_dtype="float32"))
    (t,) = hj.report([p]).tensors
    assert t.path == "0"
    assert t.bits_per_weight == pytest.approx(bits + 32 / 256)


def test_prepared_int4_codes_count_half_a_byte():
  """The Mosaic layout stores ``jnp.int4`` codes, whose numpy itemsize is 1: nbytes and the
  report count 4 bits per code there too, as for the packed canonical codes."""
  k, n = 512, 256
  p = hj.prepare(hj.quantize(rand((k, n)), "w4a16-g128-zp"), kernel="wna16_mgpu")
  assert p.codes.dtype == jnp.int4
  codes_bytes = p.codes.size // 2
  assert p.nbytes() == codes_bytes + p.scales.nbytes + p.zeros.nbytes
  (t,) = hj.report({"w": p}).tensors
  assert dict((name, b) for name, _, _, b in t.stored)["codes"] == codes_bytes
  assert t.bits_per_weight == pytest.approx(8 * p.nbytes() / (k * n))
