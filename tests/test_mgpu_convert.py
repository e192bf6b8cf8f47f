"""fp4 e2m1 and int4 -> bf16 / fp16 register conversions (kernels/mgpu_convert.py) without
a GPU.

The PTX the kernel inlines is executed here by a small evaluator of the instructions it
uses (prmt, shifts, and, lop3, mov, fma and sub on packed 16-bit floats), on every nibble value at
every position of the 32-bit register: the bit construction is checked exactly, signed
zeros and the e2m1 subnormal (0.5) included.  The GPU tests check the same code on the H200.
"""
import re

import jax.numpy as jnp
import numpy as np
import pytest

from humming_jax.kernels import mgpu_convert as mc

E2M1 = np.asarray(mc.E2M1.decode(jnp.arange(16, dtype=jnp.uint32)), np.float32)
FLOAT = {"bf16": jnp.bfloat16, "f16": np.float16}


def _prmt(a: int, b: int, sel: int) -> int:
  pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
  out = 0
  for i in range(4):
    s = (sel >> (4 * i)) & 0xF
    byte = pool[s & 7]
    if s & 8:  # sign-replicate mode
      byte = 0xFF if byte & 0x80 else 0
    out |= byte << (8 * i)
  return out


def _halves(v: int, ftype: str) -> np.ndarray:
  return np.array([v & 0xFFFF, v >> 16], np.uint16).view(FLOAT[ftype]).astype(np.float32)


def run_ptx(text: str, a1: int, a2: int, a3: int | None = None) -> int:
  """Evaluate the inline-asm body: $1, $2 [, $3] inputs, $0 output (32-bit)."""
  regs = {"$1": a1, "$2": a2} | ({} if a3 is None else {"$3": a3})
  val = lambda t: regs[t] if t in regs else int(t, 0)
  for line in text.splitlines():
    line = line.strip().rstrip(";")
    if not line or line[0] in "{}." or line.startswith(".reg"):
      continue
    op, args = line.split(None, 1)
    args = [x.strip() for x in args.split(",")]
    d, src = args[0], [val(x) for x in args[1:]]
    if op == "prmt.b32":
      r = _prmt(*src)
    elif op == "shl.b32":
      r = src[0] << src[1]
    elif op == "shr.b32":
      r = src[0] >> src[1]
    elif op == "lop3.b32":  # bit i of the LUT at index (a_i << 2 | b_i << 1 | c_i)
      a, b, c, lut = src
      r = 0
      for i in range(32):
        idx = ((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1)
        r |= ((lut >> idx) & 1) << i
    elif op == "and.b32":
      r = src[0] & src[1]
    elif op == "mad.lo.u32":
      r = src[0] * src[1] + src[2]
    elif op == "mov.b32":
      r = src[0]
    elif m := re.fullmatch(r"fma\.rn\.(bf16|f16)x2", op):
      ft = m.group(1)
      a, b, c = (_halves(x, ft) for x in src)
      res = (a * b + c).astype(FLOAT[ft])  # exact here: a power-of-two product
      r = int(res.view(np.uint16)[0]) | (int(res.view(np.uint16)[1]) << 16)
    elif m := re.fullmatch(r"sub\.rn\.(bf16|f16)x2", op):
      ft = m.group(1)
      a, b = (_halves(x, ft) for x in src)
      res = (a - b).astype(FLOAT[ft])  # exact here: small integers
      r = int(res.view(np.uint16)[0]) | (int(res.view(np.uint16)[1]) << 16)
    else:
      raise AssertionError(f"unexpected instruction {op!r}")
    regs[d] = r & 0xFFFFFFFF
  return regs["$0"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_ptx_pairs_decode_every_nibble_exactly(dtype):
  shift, scale_bits = mc._target(dtype)
  ftype = "bf16" if dtype == jnp.bfloat16 else "f16"
  rng = np.random.default_rng(0)
  nibble_sets = [np.full(8, v) for v in range(16)] + [rng.integers(0, 16, 8) for _ in range(64)]
  for nib in nibble_sets:
    reg = sum(int(v) << (4 * i) for i, v in enumerate(nib))
    for part in range(4):
      out = run_ptx(mc._pair_ptx(part, shift, scale_bits, ftype), (reg << 4) & 0xFFFFFFFF, reg)
      got = _halves(out, ftype)
      want = E2M1[nib[2 * part: 2 * part + 2]]
      np.testing.assert_array_equal(got, want)
      np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_interpret_conversion_is_the_format_decode(dtype):
  codes = jnp.asarray(((np.arange(16) + 8) & 15) - 8, jnp.int4)  # patterns as int4
  got = np.asarray(mc.to_float_interpret(codes, dtype).astype(jnp.float32))
  np.testing.assert_array_equal(got, E2M1)


def test_unsupported_target_is_named():
  with pytest.raises(ValueError, match="dtype=float32"):
    mc._target(jnp.float32)


@pytest.mark.parametrize("whole", [True, False])
def test_lowering_reads_whole_registers(whole, monkeypatch):
  """Lowered for an H200 (CPU host): with ``fp4_whole_registers`` each pair's PTX reads the
  32-bit register of 8 nibbles it was sliced from (parts 0-3); without, every pair is
  shifted down to the low bits first (part 0 only, ~3 instructions more per pair)."""
  import jax
  import humming_jax as hj
  from test_cuda_lowering import lower_for_h200
  parts = []
  orig = mc._pair_ptx
  monkeypatch.setattr(mc, "_pair_ptx", lambda part, *a: parts.append(part) or orig(part, *a))
  from humming_jax.kernels import wna16_mgpu
  q = jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset("w4a16-mxfp4")),
                     jax.ShapeDtypeStruct((1024, 256), jnp.float32))
  p = jax.eval_shape(lambda q: wna16_mgpu.prepare(q, permute=False), q)
  x = jax.ShapeDtypeStruct((1, 1024), jnp.bfloat16)
  cfg = wna16_mgpu.Config(64, 4, 1, fp4_whole_registers=whole)
  lower_for_h200(lambda p, x: wna16_mgpu.run(p, x, config=cfg), p, x)
  assert set(parts) == ({0, 1, 2, 3} if whole else {0}), sorted(set(parts))


def _pack(pair, ftype: str) -> int:
  h = np.asarray(pair, np.float32).astype(FLOAT[ftype]).view(np.uint16)
  return int(h[0]) | int(h[1]) << 16


@pytest.mark.parametrize("zero_point", [True, False])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_int4_ptx_pairs_are_code_minus_zero_exactly(dtype, zero_point):
  """MgpuConfig.int4_ptx: every signed int4 code at every nibble position of the 32-bit
  register, minus every zero point (folded into the offset row), exactly."""
  ftype = "bf16" if dtype == jnp.bfloat16 else "f16"
  magic = mc._magic(dtype)
  const = None if zero_point else int(np.array(mc.int4_offset(dtype), dtype).view(np.uint16))
  rng = np.random.default_rng(1)
  nibble_sets = [np.full(8, v) for v in range(16)] + [rng.integers(0, 16, 8) for _ in range(64)]
  zeros = range(-8, 8) if zero_point else [0]
  for nib in nibble_sets:
    reg = sum(int(v) << (4 * i) for i, v in enumerate(nib))
    codes = np.where(nib >= 8, nib - 16, nib)  # two's complement nibbles
    for z in zeros:
      off = _pack([mc.int4_offset(dtype) + z] * 2, ftype) if zero_point else None
      for part in range(4):
        out = run_ptx(mc._int4_pair_ptx(part, magic, ftype, const), reg, reg >> 4, off)
        np.testing.assert_array_equal(_halves(out, ftype),
                                      codes[2 * part: 2 * part + 2].astype(np.float32) - z)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_int4_reference_matches_the_cast(dtype):
  codes = jnp.asarray(np.arange(-8, 8), jnp.int4)
  z = jnp.asarray(np.random.default_rng(2).integers(-8, 8, 16), dtype)
  want = codes.astype(jnp.float32) - z.astype(jnp.float32)
  np.testing.assert_array_equal(
      np.asarray(mc.int4_to_float_reference(codes, dtype, z).astype(jnp.float32)), want)


@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-g128", "w4a16-mxint4"])
def test_int4_ptx_lowers_reading_whole_registers(name, monkeypatch):
  """Lowered for an H200 with int4_ptx: each pair's PTX reads the 32-bit register of 8
  codes it was sliced from (parts 0-3), with a zero-point offset operand only for
  zero-point specs; fp16 activations too."""
  import jax
  import humming_jax as hj
  from test_cuda_lowering import lower_for_h200
  from humming_jax.kernels import wna16_mgpu
  calls = []
  orig = mc._int4_pair_ptx
  monkeypatch.setattr(mc, "_int4_pair_ptx",
                      lambda part, magic, ft, const: calls.append((part, ft, const)) or
                      orig(part, magic, ft, const))
  q = jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset(name)),
                     jax.ShapeDtypeStruct((1024, 256), jnp.float32))
  p = jax.eval_shape(lambda q: wna16_mgpu.prepare(q, permute=False), q)
  cfg = wna16_mgpu.Config(64, 4, 1, int4_ptx=True)
  for dt in (jnp.bfloat16, jnp.float16):
    x = jax.ShapeDtypeStruct((1, 1024), dt)
    lower_for_h200(lambda p, x: wna16_mgpu.run(p, x, config=cfg), p, x)
  assert {c[0] for c in calls} == {0, 1, 2, 3}
  assert {c[1] for c in calls} == {"bf16", "f16"}
  assert {c[2] is None for c in calls} == {name.endswith("-zp")}


@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-g128", "w4a16-mxint4", "w4a16-mxfp4",
                                  "w4a16-nvfp4"])
def test_permuted_codes_lower_without_relayout(name, monkeypatch):
  """The default prepared 4-bit layout (permuted K order, ":pk") lowers for an H200 with
  every pair converted in place from its loaded 32-bit register (parts 0-3 through
  ``_direct_pairs``) and no Mosaic relayout of the int4 fragment (``to_layout`` is never
  called on it), dense and grouped."""
  import jax
  import humming_jax as hj
  from test_cuda_lowering import abstract_params, lower_for_h200
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  from humming_jax.kernels import grouped_wna16_mgpu, wna16_mgpu
  for var in ("HUMMING_JAX_PERMUTE_K", "HUMMING_JAX_INT4_PTX"):  # the default layout
    monkeypatch.delenv(var, raising=False)
  direct, relayouts = [], []
  orig_pairs, orig_to_layout = mc._direct_pairs, fa.FragmentedArray.to_layout
  monkeypatch.setattr(mc, "_direct_pairs", lambda arr, f: direct.append(arr.shape) or
                      orig_pairs(arr, lambda w, c, i: direct.append(c) or f(w, c, i)))

  def to_layout(self, layout):
    if fa.WGMMA_LAYOUT_UPCAST_4X in (self.layout, layout) and self.layout != layout:
      relayouts.append((self.layout, layout))
    return orig_to_layout(self, layout)
  monkeypatch.setattr(fa.FragmentedArray, "to_layout", to_layout)
  p = abstract_params(name, (1024, 256))
  assert wna16_mgpu.k_permuted(p.layout), p.layout
  x = jax.ShapeDtypeStruct((1, 1024), jnp.bfloat16)
  lower_for_h200(lambda p, x: wna16_mgpu.run(p, x), p, x)
  assert {0, 1, 2, 3} <= set(direct) and not relayouts, (sorted(map(str, set(direct))),
                                                         relayouts)
  direct.clear()
  pg = abstract_params(name, (8, 1024, 256), grouped=True)
  assert pg.layout.startswith(grouped_wna16_mgpu.FAMILY) and wna16_mgpu.k_permuted(pg.layout)
  xg = jax.ShapeDtypeStruct((16, 1024), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((8,), jnp.int32)
  lower_for_h200(lambda p, x, g: grouped_wna16_mgpu.run(p, x, g), pg, xg, g)
  assert {0, 1, 2, 3} <= set(direct) and not relayouts


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_float_arithmetic_decode_is_the_format_decode(dtype):
  """``e2m1_from_int4_float`` (the large-M dequantization of permuted fp4 codes) gives the
  format's decode of every pattern, -0 included."""
  codes = jnp.asarray(((np.arange(16) + 8) & 15) - 8, jnp.int4)
  got = np.asarray(mc.e2m1_from_int4_float(codes, dtype).astype(jnp.float32))
  want = np.asarray(mc.to_float_interpret(codes, dtype).astype(jnp.float32))
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_fp8_mma_order_and_e4m3_bits():
  """The ":p8" K order: stored position 8q + 2b + h of each run of 32 holds column
  16 (1 - h) + 4q + b, and the inverse undoes it; p8_store's regrouped words load back
  exactly (p8_load)."""
  x = jnp.arange(2 * 64).reshape(2, 64)
  y = mc.permute_k8(x)
  for run in range(2):
    for q in range(4):
      for b in range(4):
        for h in range(2):
          assert int(y[0, 32 * run + 8 * q + 2 * b + h]) == 32 * run + 16 * (1 - h) + 4 * q + b
  np.testing.assert_array_equal(mc.permute_k8(y, inverse=True), x)
  with pytest.raises(ValueError, match="multiple of 32"):
    mc.permute_k8(x[:, :48])
  codes = jnp.asarray(np.random.default_rng(0).integers(-8, 8, (64, 256)), jnp.int8)
  stored = mc.p8_store(codes)
  assert stored.dtype == codes.dtype and int(stored.min()) >= -8 and int(stored.max()) <= 7
  np.testing.assert_array_equal(mc.p8_load(stored), codes)
  np.testing.assert_array_equal(mc.p8_load(mc.p8_store(codes.astype(jnp.int4))), codes)
  want = np.asarray(mc.e2m1_to_e4m3_interpret(jnp.arange(16) - 16 * (jnp.arange(16) >= 8))
                    .astype(jnp.float32))
  decoded = np.asarray(mc.to_float_interpret(jnp.arange(16), jnp.float32)) * 2.0 ** -6
  np.testing.assert_array_equal(want, decoded)


def test_prmt_reference_is_the_ptx_prmt():
  """mgpu_convert.prmt_reference (the numpy prmt behind e2m1_to_e4m3_reference) agrees
  with this file's evaluator, sign-replicate selectors included."""
  rng = np.random.default_rng(1)
  a, b, c = (rng.integers(0, 1 << 32, 256, dtype=np.uint64) for _ in range(3))
  got = mc.prmt_reference(a, b, c)
  for i in range(256):
    assert int(got[i]) == _prmt(int(a[i]), int(b[i]), int(c[i]) & 0xFFFF), i


@pytest.mark.parametrize("r", list(range(-2, mc.FOLD_SHIFT_LIMIT + 1)))
def test_p8_table_conversion_every_code_and_position(r):
  """The integer ops of e2m1_to_e4m3_ptx (e2m1_to_e4m3_reference) on words that p8_store
  wrote: every code at every position of a run of 32, raised r binades, lands in the byte
  of its column's register (columns 4q + b in the first, 16 + 4q + b in the second) as
  its e2m1 value times 2**(r - 6), signed zeros included; a negative raise gives zeros.
  Up to FOLD_SHIFT_LIMIT (12: E2M1Weights' fold_shift 12, largest 6 * 2**6 = 384)."""
  import ml_dtypes
  rng = np.random.default_rng(r + 2)
  codes = np.concatenate([np.repeat(np.arange(16)[:, None], 32, axis=1),  # every code
                          rng.integers(0, 16, (512, 32))]).astype(np.int32)
  signed = jnp.asarray(codes - 16 * (codes >= 8), jnp.int8)
  nib = (np.asarray(mc.p8_store(signed)).astype(np.int64) & 0xF).reshape(-1, 4, 8)
  words = (nib << (4 * np.arange(8))).sum(-1).astype(np.uint32)  # (rows, 4) lanes q
  first, second = mc.e2m1_to_e4m3_reference(words, r)
  to_vals = lambda w: (w.astype("<u4").view(np.uint8).view(ml_dtypes.float8_e4m3fn)
                       .astype(np.float64).reshape(-1, 16))  # column 4q + b of each half
  want = E2M1[codes].astype(np.float64) * 2.0 ** (r - 6)
  if r < 0:
    want = 0.0 * want
  got = np.concatenate([to_vals(first), to_vals(second)], axis=1)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
