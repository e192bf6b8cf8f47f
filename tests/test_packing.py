"""Canonical bit packing: round trip for every width, ragged K, stacked experts, and the
exact byte cost (bits/8 per weight after padding K to 32)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from humming_jax import packing


def _bitstream_oracle(codes: np.ndarray, bits: int) -> np.ndarray:
  """Independent packer: per column, the little-endian bitstream of the K-padded codes."""
  k, n = codes.shape
  kp = -(-k // 32) * 32
  c = np.zeros((kp, n), np.uint64)
  c[:k] = codes
  out = np.zeros((kp * bits // 32, n), np.uint64)
  for col in range(n):
    stream = 0
    for i in reversed(range(kp)):
      stream = (stream << bits) | int(c[i, col])
    for w in range(out.shape[0]):
      out[w, col] = (stream >> (32 * w)) & 0xFFFFFFFF
  return out.astype(np.uint32)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("k", [32, 70, 5])
def test_round_trip_and_layout(bits, k):
  rng = np.random.default_rng(bits * 100 + k)
  n = 6
  codes = rng.integers(0, 1 << bits, (k, n), dtype=np.uint8)
  packed = packing.pack_codes(jnp.asarray(codes), bits)
  assert packed.dtype == jnp.uint32
  assert packed.shape == (packing.packed_rows(k, bits), n) == (-(-k // 32) * bits, n)
  # Exactly bits/8 bytes per weight after padding K to a multiple of 32.
  assert packed.nbytes == -(-k // 32) * 32 * n * bits // 8
  np.testing.assert_array_equal(np.asarray(packed), _bitstream_oracle(codes, bits))
  back = packing.unpack_codes(packed, bits, k)
  assert back.dtype == jnp.uint8 and back.shape == (k, n)
  np.testing.assert_array_equal(np.asarray(back), codes)


@pytest.mark.parametrize("bits", [1, 3, 4, 5, 7])
def test_stacked_experts_and_high_bits_ignored(bits):
  rng = np.random.default_rng(bits)
  codes = rng.integers(0, 256, (3, 96 + 13, 5), dtype=np.uint8)  # high bits set: masked
  packed = packing.pack_codes(jnp.asarray(codes), bits)
  assert packed.shape == (3, 4 * bits, 5)
  back = np.asarray(packing.unpack_codes(packed, bits, 109))
  np.testing.assert_array_equal(back, codes & ((1 << bits) - 1))
  for e in range(3):  # each expert is packed like its own 2-D matrix
    np.testing.assert_array_equal(np.asarray(packed[e]),
                                  np.asarray(packing.pack_codes(jnp.asarray(codes[e]), bits)))


def test_jit_round_trip():
  codes = jnp.asarray(np.random.default_rng(0).integers(0, 64, (64, 8), dtype=np.uint8))
  f = jax.jit(lambda c: packing.unpack_codes(packing.pack_codes(c, 6), 6, 64))
  np.testing.assert_array_equal(np.asarray(f(codes)), np.asarray(codes))


def test_bad_bits():
  with pytest.raises(ValueError, match="bits=9; expected 1..8"):
    packing.pack_codes(jnp.zeros((32, 2), jnp.uint8), 9)
  with pytest.raises(ValueError, match="not a multiple of bits=3"):
    packing.unpack_codes(jnp.zeros((4, 2), jnp.uint32), 3, 32)
