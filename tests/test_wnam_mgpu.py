"""Quantized-activation specs on the Mosaic WnA16 kernel (kernels/wnam_mgpu.py; the default
family for W4A8 / W4A4).

Interpret mode (CPU, CI): every supported activation-quantized preset and a static
per-tensor spec against kernels/reference.py (the same activation quantization) and against
the W8A8 family; the prefill routes; the layout round trip; named errors; the H200
lowering.  The @pytest.mark.gpu tests run the 8192^2 decode and prefill shapes on the H200
(passed in sessions 11 and 12).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax import formats
from humming_jax.kernels import act_quant, reference, registry, w8a8, wna16_mgpu, wnam_mgpu as wm
from test_wna16_mgpu import normal  # jax.random.normal, bit for bit, one compile per size class

TOL = 1e-2  # relative, vs the reference: one bf16 rounding of each activation (<= 2**-8)
STATIC = hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                      act_granularity="tensor", act_static=True)
SPECS = {n: hj.QuantSpec.preset(n) for n in ("w4a8-int8", "w4a8-fp8", "w4a8-mxfp4",
                                              "w8a8-int8", "w8a8-fp8", "w8a8-mxfp8",
                                              "w4a4-nvfp4", "w4a4-mxfp4")}
SPECS["w8a8-int8-static"] = STATIC


def rel(y, ref):
  y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
  return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def make(spec, m, k, n, seed=0, dtype=jnp.bfloat16):
  kw, kb, kx = jax.random.split(jax.random.key(seed), 3)
  w = normal(kw, (k, n)) / np.sqrt(k)
  b = normal(kb, (n,))
  x = normal(kx, (m, k), jnp.float32).astype(dtype)
  # A calibrated scale that clips the largest activations: the static path differs from
  # the dynamic one on this x.
  s = (0.5 * float(jnp.max(jnp.abs(x.astype(jnp.float32)))) / spec.act_format.max_value
       if spec.act_static else None)
  q = hj.quantize(w, spec, bias=b, act_scale=s)
  return q, x


@pytest.mark.parametrize("name", sorted(SPECS))
def test_matches_the_reference_and_the_w8a8_family(name):
  spec = SPECS[name]
  # The default for sub-8-bit weights (wnam_mgpu.priority_for, H200 session 11); 8-bit
  # weights stay on the W8A8 family, which reads its own int8 layout at prefill.
  default = wm.FAMILY if spec.weight_bits < 8 else "w8a8"
  assert wm.supports(spec) and registry.find(spec).name == default
  assert registry.find(spec, shape=(256, 192)).name == default
  q, x = make(spec, 5, 256, 192, seed=1)
  p = hj.prepare(q, kernel=wm.FAMILY)
  assert registry.layout_family(p.layout) == wm.FAMILY and p.spec == spec
  y = jax.jit(lambda p, x: hj.quant_dense(p, x, backend="interpret"))(p, x)
  assert y.shape == (5, 192) and y.dtype == x.dtype
  assert rel(y, reference.dense_reference(q, x)) <= TOL
  y8 = hj.quant_dense(hj.prepare(q, kernel="w8a8"), x, backend="interpret")  # the W8A8 family
  assert rel(y, y8) <= TOL
  # Exactly the spec's activation quantization, rounded to bf16, on the WnA16 kernel (and
  # not the bare activations: a dropped quantization would sit within TOL for int8).
  from humming_jax.kernels import wna16_mgpu
  view = p.replace(spec=spec.weight_only(), act_scale=None,
                   layout=wna16_mgpu.FAMILY + p.layout[p.layout.index(":"):])
  xq = hj.quantize_activations(x, spec, q.act_scale).dequantize().astype(x.dtype)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(
      wna16_mgpu.run(view, xq, interpret=True), np.float32))
  assert not np.array_equal(np.asarray(y, np.float32), np.asarray(
      wna16_mgpu.run(view, x, interpret=True), np.float32))


def test_float16_activations():
  spec = SPECS["w4a8-int8"]
  q, x = make(spec, 3, 256, 64, seed=2, dtype=jnp.float16)
  y = wm.run(wm.prepare(q), x, interpret=True)
  assert y.dtype == jnp.float16
  assert rel(y, reference.dense_reference(q, x)) <= TOL


@pytest.mark.parametrize("name", ["w4a8-int8", "w4a4-nvfp4", "w8a8-int8-static"])
def test_prepare_round_trip_is_exact(name):
  q, _ = make(SPECS[name], 1, 256, 64, seed=3)
  back = wm.to_canonical(wm.prepare(q))
  assert back.layout == "canonical" and back.spec == q.spec
  assert jax.tree.structure(back) == jax.tree.structure(q)  # no field dropped
  assert (back.act_scale is None) == (q.act_scale is None) and back.bias is not None
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(q)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="act=None"):
    wm.prepare(hj.quantize(jnp.ones((256, 64)), "w4a16-g128"))
  with pytest.raises(ValueError, match="granularity='block'"):
    wm.prepare(hj.quantize(normal(jax.random.key(0), (256, 128)),
                           "w8a8-fp8-block"))
  q, x = make(SPECS["w4a8-int8"], 2, 256, 64)
  with pytest.raises(ValueError, match="expected wnam_mgpu"):
    wm.run(hj.prepare(q, kernel="w8a8"), x)
  with pytest.raises(ValueError, match=r"x must be \(M, K=256\)"):
    wm.run(wm.prepare(q), x[:, :128], interpret=True)


def test_gpu_fences(monkeypatch):
  """No 8-bit carrier (the W8A8 family refuses the spec): this family runs it on the GPU
  (test_decode_gpu passed on the H200: sessions 11 and 12, e5m2 activations included); a
  fence of the WnA16 kernel on the weight half still applies."""
  no_carrier = hj.QuantSpec("uint4", "group", 128, zero_point=True, act="int8")
  assert not w8a8.supports(no_carrier) and wm.supports(no_carrier)
  assert wm.KERNEL.gpu_known_bad(no_carrier) is None
  e5m2 = hj.QuantSpec("int4", "group", 128, act="fp8_e5m2")
  assert wm.supports(e5m2) and wm.KERNEL.gpu_known_bad(e5m2) is None
  assert all(wm.KERNEL.gpu_known_bad(SPECS[n]) is None for n in SPECS)
  fenced = dataclasses.replace(
      wna16_mgpu.KERNEL, gpu_known_bad=lambda s: "fenced" if s == no_carrier.weight_only()
      else None)
  monkeypatch.setattr(wna16_mgpu, "KERNEL", fenced)
  assert wm.KERNEL.gpu_known_bad(no_carrier) == "fenced"


def test_empty_batch():
  q, x = make(SPECS["w4a8-int8"], 1, 256, 64)
  y = wm.run(wm.prepare(q), x[:0], interpret=True)
  assert y.shape == (0, 64) and y.dtype == x.dtype


@pytest.mark.parametrize("name", ["w4a8-int8", "w4a4-nvfp4"])
def test_lowers_for_h200(name):
  from test_cuda_lowering import lower_for_h200
  spec = SPECS[name]
  q = jax.eval_shape(lambda w: hj.quantize(w, spec), jax.ShapeDtypeStruct((8192, 8192),
                                                                         jnp.float32))
  p = jax.eval_shape(wm.prepare, q)
  x = jax.ShapeDtypeStruct((16, 8192), jnp.bfloat16)
  assert "custom_call" in lower_for_h200(lambda p, x: wm.run(p, x), p, x)


GPU_SPECS = dict(SPECS, **{  # + specs only this family runs (no 8-bit carrier: W8A8 refuses)
    "w8a8-int8-fp8act": hj.QuantSpec("int8", "channel", 0, scale_dtype="float32",
                                     act="fp8_e4m3"),
    "w4a8-uint4-zp": hj.QuantSpec("uint4", "group", 128, zero_point=True, act="int8"),
    "w4a8-e5m2act": hj.QuantSpec("int4", "group", 128, act="fp8_e5m2")})


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4", "w8a8-int8", "w4a4-nvfp4",
                                  "w8a8-int8-fp8act", "w4a8-uint4-zp", "w4a8-e5m2act"])
def test_decode_gpu(name, m):
  spec = GPU_SPECS[name]
  q, x = make(spec, m, 8192, 8192, seed=4)
  p = jax.jit(wm.prepare)(q)
  y = jax.jit(wm.run)(p, x)
  e = rel(y, jax.jit(reference.dense_reference)(q, x))
  print(f"wnam_mgpu {name} M={m}: rel err {e:.2e}")
  assert e <= TOL


PREFILL = dict(SPECS, **{"fp4-g128-fp8act": hj.QuantSpec("fp4_e2m1", "group", 128,
                                                         act="fp8_e4m3")})


@pytest.mark.parametrize("name,k", [("w4a8-int8", 384), ("w4a8-fp8", 384),
                                    ("w8a8-int8", 320), ("w8a8-int8-static", 384),
                                    ("w8a8-fp8", 320), ("fp4-g128-fp8act", 384)])
def test_prefill_runs_the_8bit_gemm_from_this_layout(name, k, monkeypatch):
  """M >= 512: the W8A8 family's Mosaic 8-bit GEMM on the weights unpacked from the WnA16
  layout (int4 -> int8 / e4m3, fp8 as is, fp4 -> e4m3; per-channel K = 320 padded) -- the same
  result as that family's own prefill path (w8a8.run_mgpu), and the reference with the
  same activation quantization."""
  from humming_jax.kernels import w8a8, w8a8_mgpu
  calls = []
  orig = w8a8_mgpu.gemm
  monkeypatch.setattr(w8a8_mgpu, "gemm", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
  spec = PREFILL[name]
  q, x = make(spec, w8a8_mgpu.MIN_M + 8, k, 256, seed=6)
  p = wm.prepare(q)
  assert wm.prefill_8bit_runs(p, x.dtype)
  y = wm.run(p, x, interpret=True)
  assert calls == [1]
  y8 = w8a8.run_mgpu(hj.prepare(q, kernel="w8a8"), x, interpret=True)
  assert rel(y, y8) <= 1e-6
  assert rel(y, reference.dense_reference(q, x)) <= 2e-4


@pytest.mark.parametrize("name", ["w4a8-mxfp4", "w4a4-mxfp4", "w4a4-nvfp4"])
def test_prefill_with_exact_bf16_operands_takes_the_w8a8_route(name, monkeypatch):
  """MXFP4 / NVFP4 weights (K groups below 128: no 8-bit GEMM here): M >= 512 runs the W8A8
  family's large-M route (w8a8.dequant_gemm: exact bf16 operands, activation scales in the
  float32 epilogue) on weights dequantized from this layout -- the same numbers as that
  family on its own layout, and the reference's, not the decode path's bf16 rounding of
  code * scale."""
  from humming_jax.kernels import w8a8
  calls = []
  orig = w8a8.dequant_gemm
  monkeypatch.setattr(w8a8, "dequant_gemm", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
  q, x = make(SPECS[name], w8a8.DEQUANT_GEMM_MIN_M + 8, 256, 136, seed=7)
  p = wm.prepare(q)
  assert not wm.prefill_8bit_runs(p, x.dtype)
  y = jax.jit(lambda p, x: wm.run(p, x, interpret=True))(p, x)
  assert calls == [1] and y.shape == (x.shape[0], 136) and y.dtype == x.dtype
  y8 = orig(hj.prepare(q, kernel="w8a8"), x)
  assert rel(y, y8) <= 1e-6
  # NVFP4 activations: groups of 16 fold their scales into bf16 operands, as the W8A8
  # kernel does (w8a8.dequant_gemm_exact), so the WnA16 error class; else exact operands.
  bound = TOL if w8a8.plan_for(q.spec).fold else 2e-4
  assert rel(y, reference.dense_reference(q, x)) <= bound


@pytest.mark.parametrize("name", ["w4a4-mxfp4", "w4a4-nvfp4"])
def test_w4a4_large_m_route_writes_bf16(name):
  """W4A4 with bf16 x and no bias at M >= 512: nothing per row to apply, so the route's
  GEMM writes bf16 itself (NVFP4's global scale folded into the weights in float32,
  rounded once).  MXFP4: the same numbers as the float32 product rounded afterwards;
  NVFP4: the bf16 rounding of the scaled weight on top, the reference's error class."""
  q, x = make(SPECS[name], w8a8.DEQUANT_GEMM_MIN_M + 8, 256, 136, seed=8)
  q = q.replace(bias=None)
  p = wm.prepare(q)
  run = lambda p, x: wm.run(p, x, interpret=True)
  y = jax.jit(run)(p, x)
  assert y.dtype == jnp.bfloat16 and y.shape == (x.shape[0], 136)
  assert "preferred_element_type=bfloat16" in str(jax.make_jaxpr(run)(p, x))
  # the float32-epilogue form, by hand: exact bf16 operands, product, global scale, cast
  qa = act_quant.quantize(x, q.spec, q.act_scale)
  g = 1.0 if q.global_scale is None else q.global_scale.astype(jnp.float32).reshape(-1)[0]
  w = (hj.dequantize(q) / g).astype(jnp.bfloat16)  # code x scale: a bf16 number
  f32 = jnp.dot(qa.dequantize().astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
  f32 = f32 * g
  assert rel(y, f32.astype(jnp.bfloat16)) <= (1e-6 if q.global_scale is None else 4e-3)
  assert rel(y, reference.dense_reference(q, x)) <= TOL
  # fp16 x keeps the float32 epilogue
  assert "preferred_element_type=float32" in str(jax.make_jaxpr(run)(p, x.astype(jnp.float16)))


def test_prefill_without_an_exact_route_takes_the_wna16_path():
  """Zero-point weights with int8 activations (no 8-bit carrier, no exact bf16 operands):
  M >= 512 runs wna16_mgpu.run on the fake-quantized activations."""
  from humming_jax.kernels import w8a8
  spec = hj.QuantSpec("uint4", "group", 128, zero_point=True, act="int8")
  q, x = make(spec, w8a8.DEQUANT_GEMM_MIN_M + 8, 256, 128, seed=7)
  p = wm.prepare(q)
  assert not wm.prefill_8bit_runs(p, x.dtype) and not wm._exact_dequant(spec)
  y = jax.jit(lambda p, x: wm.run(p, x, interpret=True))(p, x)
  assert rel(y, reference.dense_reference(q, x)) <= TOL


def test_float32_activations_run_elsewhere():
  """The WnA16 kernel takes 16-bit x: float32 x on W4A8 params prepared here runs the W8A8
  family (after a re-layout), and a no-carrier spec with float32 x goes to XLA under
  backend=None."""
  from humming_jax import ops
  spec = SPECS["w4a8-int8"]
  assert registry.find(spec, x_dtype=jnp.float32).name == "w8a8"
  assert registry.find(spec, x_dtype=jnp.bfloat16).name == wm.FAMILY
  q, x = make(spec, 3, 256, 64, seed=3)
  p = wm.prepare(q)
  assert ops.kernel_for(p, x_dtype=jnp.float32).name == "w8a8"
  x32 = x.astype(jnp.float32)
  y = jax.jit(lambda p, x: hj.quant_dense(p, x, backend="interpret"))(p, x32)
  assert y.dtype == jnp.float32 and rel(y, reference.dense_reference(q, x32)) <= 1e-4
  no_carrier = hj.QuantSpec("uint4", "group", 128, zero_point=True, act="int8")
  assert registry.find(no_carrier, x_dtype=jnp.float32) is None
  assert ops.resolve_backend(None, no_carrier, x_dtype=jnp.float32) == "xla"
  qn, xn = make(no_carrier, 3, 256, 64, seed=3)
  with pytest.raises(ValueError, match="x.dtype=float32; use backend='xla'"):
    hj.quant_dense(qn, xn.astype(jnp.float32), backend="interpret")


@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-fp8", "fp4-g128-fp8act", "w8a8-fp8"])
def test_carrier_codes_are_the_exact_values(name):
  """The per-call unpack to the 8-bit carrier (int8, or e4m3 by the format's encode rather
  than XLA's convert) holds every code's value exactly: all 16 codes of 4-bit weights."""
  spec = PREFILL[name]
  q, _ = make(spec, 1, 256, 128, seed=2)
  p = wm.prepare(q)
  if p.codes.dtype == jnp.int4:  # every code in the first 16 positions of one K row
    codes = p.codes.at[0, 0, :16].set(jnp.arange(-8, 8, dtype=jnp.int32).astype(jnp.int4))
    p = p.replace(codes=codes)
  got = wm._carrier_codes(p)
  want = wm.wna16_mgpu.code_values(p, jnp.float32)
  t, np_, bk = p.codes.shape
  want = want.transpose(1, 0, 2).reshape(np_, t * bk)
  assert got.dtype == wm.w8a8._carrier(spec)
  np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(want))


def test_mx_fold_prefill_interpret(monkeypatch):
  """MX_FOLD_PREFILL (the default): MXFP4 x fp8 at M >= 512 folded onto the per-channel
  fp8 8-bit GEMM (every weight e4m3 x one power of two per column, exact) -- the route is
  taken, with K (224) and N (200) padded to 256, and matches the reference with the same
  activation quantization (the interpreter sums the fp8 products in float32; both outputs
  bf16)."""
  from humming_jax.kernels import w8a8_mgpu
  spec = SPECS["w4a8-mxfp4"]
  assert wm.mx_fold_applies(spec) and not wm.mx_fold_applies(SPECS["w4a8-int8"])
  assert wm.MX_FOLD_PREFILL
  calls = []
  orig = w8a8_mgpu.gemm
  monkeypatch.setattr(w8a8_mgpu, "gemm", lambda *a, **kw: calls.append(kw) or orig(*a, **kw))
  q, x = make(spec, w8a8_mgpu.MIN_M + 8, 224, 200, seed=11)
  p = wm.prepare(q)
  assert wm.mx_fold_runs(p) and p.codes.shape[-2:] == (256, 128)
  y = wm.run(p, x, interpret=True)
  assert len(calls) == 1 and calls[0]["col_group_scale"] is None  # per-channel GEMM
  assert y.shape == (x.shape[0], 200) and y.dtype == x.dtype
  assert rel(y, reference.dense_reference(q, x)) <= 5e-5
  np.testing.assert_array_equal(np.asarray(y), np.asarray(
      wm.run_prefill_mx_fold(p, x, interpret=True)))
  assert len(calls) == 2
  monkeypatch.setattr(wm, "MX_FOLD_PREFILL", False)  # off: the bf16 route, no 8-bit GEMM
  assert rel(wm.run(p, x, interpret=True), y) <= 5e-5 and len(calls) == 2


def test_e2m1_mma_prefill_interpret(monkeypatch):
  """Session 60: MXFP4 x fp8 at M >= 512 on the fp8-MMA layout with the column fold
  (":p8:cf", now marked by prepare where the scales allow) converts the codes inside the
  8-bit GEMM (w8a8_mgpu.E2M1Weights) -- bit-equal to the fold's unpack route on the same
  params and within 5e-5 of the reference, K (224) and N (200) padded; run() takes it with
  HUMMING_JAX_E2M1_MMA=1 only (off by default), up to E2M1_MMA_MAX_M rows, the K-order /
  ":pk" layouts and columns past the fold's span never."""
  from humming_jax.kernels import w8a8_mgpu
  spec = SPECS["w4a8-mxfp4"]
  q, x = make(spec, w8a8_mgpu.MIN_M + 8, 224, 200, seed=11)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  monkeypatch.delenv("HUMMING_JAX_E2M1_MMA", raising=False)
  assert not wm.E2M1_MMA_PREFILL and "cf" not in wm.prepare(q).layout.split(":")  # route off
  monkeypatch.setenv("HUMMING_JAX_E2M1_MMA", "1")
  p = wm.prepare(q)
  assert p.layout.split(":")[-2:] == ["p8", "cf"] and wm.e2m1_mma_runs(p), p.layout
  assert p.fold_base is not None
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "0")
  assert not wm.e2m1_mma_runs(wm.prepare(q))  # ":pk": the unpack reads it, not the GEMM
  y = jax.jit(lambda p, x: wm.run_prefill_e2m1_mma(p, x, interpret=True))(p, x)
  assert y.shape == (x.shape[0], 200) and y.dtype == x.dtype
  np.testing.assert_array_equal(np.asarray(y), np.asarray(
      wm.run_prefill_mx_fold(p, x, interpret=True)))
  assert rel(y, reference.dense_reference(q, x)) <= 5e-5
  # stored fold base or one computed per call: the same
  np.testing.assert_array_equal(np.asarray(y), np.asarray(wm.run_prefill_e2m1_mma(
      p.replace(fold_base=None), x, interpret=True)))
  weights = []
  orig = w8a8_mgpu.gemm
  monkeypatch.setattr(w8a8_mgpu, "gemm", lambda a, w, *r, **kw: weights.append(
      isinstance(w, w8a8_mgpu.E2M1Weights)) or orig(a, w, *r, **kw))
  monkeypatch.delenv("HUMMING_JAX_E2M1_MMA", raising=False)
  wm.run(p, x, interpret=True)
  monkeypatch.setenv("HUMMING_JAX_E2M1_MMA", "1")
  np.testing.assert_array_equal(np.asarray(wm.run(p, x, interpret=True)), np.asarray(y))
  assert weights == [False, True], weights  # the unpack's e4m3 array, then E2M1Weights
  monkeypatch.setattr(wm, "E2M1_MMA_MAX_M", x.shape[0] - 1)  # past the bound: the unpack
  np.testing.assert_array_equal(np.asarray(wm.run(p, x, interpret=True)), np.asarray(y))
  assert weights == [False, True, False], weights
  # a column whose groups span more than the fold's 11 binades: no ":cf", the unpack route
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  wide = wm.prepare(_with_span(q, 12))
  assert wm.mx_fold_runs(wide)
  assert "cf" not in wide.layout.split(":") and not wm.e2m1_mma_runs(wide)
  with pytest.raises(ValueError, match="checked by the column fold"):
    wm.run_prefill_e2m1_mma(wide, x, interpret=True)


@pytest.mark.gpu
def test_e2m1_mma_prefill_gpu(monkeypatch):
  """The in-GEMM conversion on the GPU at 8192^2, M = 1024: the PTX conversion's e4m3
  values in the 128-byte-swizzled B tile give the unpack route's output (the same fp8
  WGMMA on the same operands), and the reference's error class."""
  spec = SPECS["w4a8-mxfp4"]
  q, x = make(spec, 1024, 8192, 8192, seed=8)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  monkeypatch.setenv("HUMMING_JAX_E2M1_MMA", "1")
  p = wm.prepare(q)  # eager: the ":cf" check needs concrete scales
  assert wm.e2m1_mma_runs(p), p.layout
  y = jax.jit(lambda p, x: wm.run_prefill_e2m1_mma(p, x))(p, x)
  y0 = jax.jit(lambda p, x: wm.run_prefill_mx_fold(p, x))(p, x)
  e = rel(y, jax.jit(reference.dense_reference)(q, x))
  print(f"wnam_mgpu MXFP4 in-GEMM conversion M=1024: rel err {e:.2e}, vs the unpack route "
        f"{rel(y, y0):.2e}")
  assert e <= 5e-3 and rel(y, y0) <= 1e-6


def _with_span(q, span):
  """q with column 5's e8m0 group codes all equal but the first, ``span`` octaves lower."""
  s = q.scales.at[:, 5].set(q.scales[1, 5])
  return q.replace(scales=s.at[0, 5].set(q.scales[1, 5] - span))


def test_mx_fold_scale_span_bound(monkeypatch):
  """At MX_FOLD_SPAN octaves (14) the folded weights times their column scales are the
  dequantized weights, bit for bit (the smallest, 0.5 x 2**-8 = 2**-9, is the least e4m3
  subnormal).  Wider, the far group rounds to e4m3 subnormals: within 2**-16 of the column's
  largest group scale, the folded codes those of the general encode, the product finite
  and within the reference's error; other specs are refused by name."""
  from humming_jax.kernels import w8a8_mgpu
  spec = SPECS["w4a8-mxfp4"]
  calls = []
  orig = w8a8_mgpu.gemm
  monkeypatch.setattr(w8a8_mgpu, "gemm", lambda *a, **kw: calls.append(kw) or orig(*a, **kw))
  q, x = make(spec, w8a8_mgpu.MIN_M, 256, 128, seed=12)
  for span in (5, wm.MX_FOLD_SPAN, wm.MX_FOLD_SPAN + 1, wm.MX_FOLD_SPAN + 6, 40):
    q_s = _with_span(q, span)
    p = wm.prepare(q_s)
    scale, exact = wm.mx_fold_column_scales(p)
    codes = wm.mx_fold_codes(p)
    folded = codes.astype(jnp.float32) * scale[:, None]  # (Np, Kp)
    want = wm.wna16_mgpu.dequantize_prepared(p, jnp.float32)  # (K, N)
    got = np.asarray(folded[:128, :256].T)
    assert bool(exact) == (span <= wm.MX_FOLD_SPAN), span
    if span <= wm.MX_FOLD_SPAN:
      np.testing.assert_array_equal(got, np.asarray(want))
    else:  # only column 5's first group (32 rows) moves, by at most half a subnormal step
      diff = np.abs(got - np.asarray(want))
      top = float(scale[5]) * 2.0 ** 6  # the column's largest group scale
      assert diff[:, [c for c in range(128) if c != 5]].max() == 0
      assert diff[32:].max() == 0 and 0 < diff[:32, 5].max() <= top * 2.0 ** -16, span
      shifted = wm.wna16_mgpu.dequantize_prepared(p, jnp.float32)[:, 5] / scale[5]
      general = formats.get_format("fp8_e4m3").encode(shifted)  # round to nearest even
      np.testing.assert_array_equal(np.asarray(codes[5, :256]).view(np.uint8),
                                    np.asarray(general))
    n_calls = len(calls)
    y = jax.jit(lambda p, x: wm.run(p, x, interpret=True))(p, x)
    assert len(calls) == n_calls + 1, span  # the fold's 8-bit GEMM, not the bf16 route
    assert bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))
    assert rel(y, reference.dense_reference(q_s, x)) <= 5e-5, span
  q8, x8 = make(SPECS["w4a8-int8"], w8a8_mgpu.MIN_M, 256, 128)
  with pytest.raises(ValueError, match="MXFP4 fold takes MXFP4 x fp8"):
    wm.run_prefill_mx_fold(wm.prepare(q8), x8, interpret=True)


def test_mx_fold_nan_and_tiny_scales():
  """A NaN group scale (e8m0 code 255) makes its column's outputs NaN, as the reference's
  are, and leaves the others alone; a column whose scales are all 2**-125 (its base
  2**-131 clamped to 2**-126) folds exactly.  (2**-127, e8m0's least, is a float32
  subnormal that XLA's CPU dequantization flushes, so it is not the test value.)"""
  from humming_jax.kernels import w8a8_mgpu
  spec = SPECS["w4a8-mxfp4"]
  q, x = make(spec, w8a8_mgpu.MIN_M, 256, 128, seed=13)
  s = q.scales.at[3, 7].set(255).at[:, 9].set(2)
  q = q.replace(scales=s)
  p = wm.prepare(q)
  scale, _ = wm.mx_fold_column_scales(p)
  assert bool(jnp.isnan(scale[7])) and float(scale[9]) == 2.0 ** -126
  y = np.asarray(wm.run(p, x, interpret=True), np.float32)
  want = np.asarray(reference.dense_reference(q, x), np.float32)
  assert np.isnan(y[:, 7]).all() and np.isnan(want[:, 7]).all()
  others = [c for c in range(y.shape[1]) if c != 7]
  assert np.isfinite(y[:, others]).all()
  assert rel(jnp.asarray(y[:, others]), jnp.asarray(want[:, others])) <= 5e-5
  folded = wm.mx_fold_codes(p).astype(jnp.float32)[9, :256] * scale[9]
  np.testing.assert_array_equal(
      np.asarray(folded), np.asarray(wm.wna16_mgpu.dequantize_prepared(p, jnp.float32)[:, 9]))


def _subnormal_column(seed):
  """W4A8 MXFP4 params with column 5's first group at code zero and every other group
  14 octaves below it: that column's weights are all e4m3 subnormals once folded."""
  from humming_jax.kernels import w8a8_mgpu
  q, x = make(SPECS["w4a8-mxfp4"], w8a8_mgpu.MIN_M, 256, 128, seed=seed)
  q = _with_span(q, -wm.MX_FOLD_SPAN).replace(bias=None)  # group 0 the highest
  words = 32 * q.codes.shape[0] // q.shape[0]  # packed rows holding K rows 0..31
  codes = q.codes.at[:words, 5].set(jnp.zeros((words,), q.codes.dtype))
  return q.replace(codes=codes), x


def _check_subnormal_column(y, q, x, p):
  codes = np.asarray(wm.mx_fold_codes(p)).view(np.uint8)[5, :256] & 0x7F
  assert (codes[:32] == 0).all() and (codes <= 12).all()  # 6 x 2**-8 = 12 x 2**-9
  assert ((codes > 0) & (codes < 8)).sum() > 100  # mostly subnormal codes
  want = np.asarray(reference.dense_reference(q, x), np.float32)[:, 5]
  got = np.asarray(y, np.float32)[:, 5]
  assert np.abs(want).max() > 0
  assert rel(jnp.asarray(got), jnp.asarray(want)) <= 1e-2  # a flush to zero gives 1.0


def test_mx_fold_subnormal_column_interpret():
  """A column folded entirely into e4m3 subnormals (exact at MX_FOLD_SPAN) computes."""
  q, x = _subnormal_column(14)
  p = wm.prepare(q)
  assert bool(wm.mx_fold_column_scales(p)[1])
  _check_subnormal_column(wm.run(p, x, interpret=True), q, x, p)


@pytest.mark.gpu
def test_mx_fold_subnormal_column_gpu():
  """The same on the H200: the fp8 WGMMA must take e4m3 subnormal weights as their values
  (spans 12-14 rely on it; the span bound before session 15 kept every code normal)."""
  q, x = _subnormal_column(14)
  p = jax.jit(wm.prepare)(q)
  _check_subnormal_column(jax.jit(wm.run)(p, x), q, x, p)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-fp8"])
def test_prefill_gpu(name):
  """W4A8 at 8192^2, M = 1024: the 8-bit GEMM on weights unpacked from this layout."""
  from humming_jax.kernels import w8a8
  spec = SPECS[name]
  q, x = make(spec, 1024, 8192, 8192, seed=8)
  p = jax.jit(wm.prepare)(q)
  assert wm.prefill_8bit_runs(p, x.dtype)
  y = jax.jit(wm.run)(p, x)
  e = rel(y, jax.jit(reference.dense_reference)(q, x))
  e8 = rel(y, jax.jit(w8a8.run_mgpu)(jax.jit(lambda q: hj.prepare(q, kernel="w8a8"))(q), x))
  print(f"wnam_mgpu prefill {name} M=1024: rel err {e:.2e}, vs w8a8.run_mgpu {e8:.2e}")
  assert e8 <= 1e-6  # the same GEMM, carrier values and scales as the W8A8 family's route
  # fp8: the WGMMA's fp8 products within a 128-deep group are summed with fewer bits than
  # float32 (w8a8_mgpu's docstring; 4.4e-4 at 8192^2 on the H200, session 14 call 5)
  assert e <= (2e-4 if name == "w4a8-int8" else 1e-3)


def test_fences_of_the_prepared_family_apply(monkeypatch):
  """W4A8 params prepared for the W8A8 family (not the default): that family's GPU fence
  decides, not the default family's -- backend=None computes them with XLA, 'pallas'
  refuses by name."""
  from humming_jax import ops
  q, x = make(SPECS["w4a8-int8"], 3, 256, 64, seed=2)
  p = hj.prepare(q, kernel="w8a8")
  fenced = dataclasses.replace(registry.by_name("w8a8"),
                               gpu_known_bad=lambda s: "measured wrong")
  monkeypatch.setattr(registry, "by_layout", lambda layout: fenced)
  monkeypatch.setattr(ops, "on_gpu", lambda: True)
  assert wm.KERNEL.gpu_known_bad(q.spec) is None  # the default family is not fenced
  y = hj.quant_dense(p, x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(reference.dense_reference(q, x)))
  with pytest.raises(ValueError, match="w8a8 kernel is known to disagree"):
    hj.quant_dense(p, x, backend="pallas")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a4-mxfp4", "w4a4-nvfp4"])
def test_w4a4_large_m_route_gpu(name):
  """test_w4a4_large_m_route_writes_bf16 at 8192^2, M = 1024 on the GPU (cuBLAS writing
  bf16; no bias), against the reference."""
  q, x = make(SPECS[name], 1024, 8192, 8192, seed=9)
  q = q.replace(bias=None)
  y = jax.jit(wm.run)(jax.jit(wm.prepare)(q), x)
  e = rel(y, jax.jit(reference.dense_reference)(q, x))
  print(f"{name} M=1024 no bias: rel err {e:.2e}")
  assert y.dtype == jnp.bfloat16 and e <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a8-mxfp4", "w4a4-nvfp4"])
def test_prefill_exact_route_gpu(name):
  """MXFP4 / NVFP4 weights at 8192^2, M = 1024: run()'s prefill route on this layout
  against the W8A8 family's exact bf16-operand route.  NVFP4 takes that route here (the
  same numbers); MXFP4 takes the fp8 fold (run() then checks the fold's error class
  against both; the fold's own test: test_mx_fold_prefill_gpu)."""
  from humming_jax.kernels import w8a8
  spec = SPECS[name]
  q, x = make(spec, 1024, 8192, 8192, seed=9)
  p = jax.jit(wm.prepare)(q)
  assert not wm.prefill_8bit_runs(p, x.dtype) and wm._exact_dequant(spec)
  y = jax.jit(wm.run)(p, x)
  e = rel(y, jax.jit(reference.dense_reference)(q, x))
  e8 = rel(y, jax.jit(w8a8.dequant_gemm)(jax.jit(lambda q: hj.prepare(q, kernel="w8a8"))(q), x))
  print(f"wnam_mgpu prefill {name} M=1024: rel err {e:.2e}, vs w8a8.dequant_gemm {e8:.2e}")
  # MXFP4 at M >= 512 takes the fold: fp8 products in WGMMA's accumulator, the w8a8-fp8
  # error class against both (1.6e-3 on the H200, session 18).  NVFP4 folds its scales
  # into bf16 operands as the exact route does (plan.fold): the reference's error class.
  if wm.mx_fold_runs(p):
    assert e8 <= 5e-3 and e <= 5e-3
  else:
    assert e8 <= 1e-3 and e <= (TOL if w8a8.plan_for(spec).fold else 2e-4)


@pytest.mark.gpu
def test_mx_fold_prefill_gpu(monkeypatch):
  """The MXFP4 fold on the H200 at 8192^2, M = 1024: within the w8a8-fp8 error class of
  the reference (fp8 products summed in the WGMMA accumulator)."""
  from humming_jax.kernels import w8a8_mgpu
  spec = SPECS["w4a8-mxfp4"]
  calls = []
  orig = w8a8_mgpu.gemm
  monkeypatch.setattr(w8a8_mgpu, "gemm", lambda *a, **kw: calls.append(kw) or orig(*a, **kw))
  q, x = make(spec, 1024, 8192, 8192, seed=8)
  p = jax.jit(wm.prepare)(q)
  # Fresh lambdas: jax.jit(wm.run) shares its trace cache with the earlier tests at this
  # shape, and a cache hit would not call the monkeypatched gemm.
  y = jax.jit(lambda p, x: wm.run_prefill_mx_fold(p, x))(p, x)  # the route itself
  assert len(calls) == 1 and calls[0]["col_group_scale"] is None
  e = rel(y, jax.jit(reference.dense_reference)(q, x))
  print(f"wnam_mgpu MXFP4 fold prefill M=1024: rel err {e:.2e}")
  assert e <= 5e-3
  y_run = jax.jit(lambda p, x: wm.run(p, x))(p, x)  # the default route
  assert rel(y_run, y) <= 1e-6 and len(calls) == 2
  q_wide = _with_span(q, wm.MX_FOLD_SPAN + 3)  # a group rounded to e4m3 subnormals
  y_wide = jax.jit(wm.run)(jax.jit(wm.prepare)(q_wide), x)
  e = rel(y_wide, jax.jit(reference.dense_reference)(q_wide, x))
  print(f"wnam_mgpu MXFP4 fold past the exact span, run(): rel err {e:.2e}")
  assert bool(jnp.all(jnp.isfinite(y_wide.astype(jnp.float32)))) and e <= 5e-3


def test_dense_fp8_mma_layout_interpret(monkeypatch):
  """HUMMING_JAX_DENSE_FP8_MMA=1 (off by default; not yet GPU-run): W4A8 MXFP4 prepared in
  the fp8-MMA layout (":p8"); decode on fp8 WGMMA (e4m3 codes and row scales) within 1e-4
  of the reference, the MXFP4 fold's prefill through the ":p8"-reading Pallas unpack equal
  to the same prefill from the default (":pk") layout, the layout round trip exact."""
  from humming_jax.kernels import w8a8_mgpu
  monkeypatch.delenv("HUMMING_JAX_DENSE_FP8_MMA", raising=False)
  spec = SPECS["w4a8-mxfp4"]
  q, x = make(spec, 5, 256, 192, seed=13)
  assert wm.fp8_mma_applies(spec) and not wm.dense_fp8_mma(spec)
  default = wm.prepare(q)
  assert not wna16_mgpu.fp8_mma(default.layout)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  assert not wm.dense_fp8_mma(SPECS["w4a8-int8"])
  p = wm.prepare(q)
  assert "p8" in p.layout.split(":"), p.layout
  np.testing.assert_array_equal(np.asarray(wm.to_canonical(p).codes), np.asarray(q.codes))
  y = jax.jit(lambda p, x: wm.run(p, x, interpret=True))(p, x)
  assert y.dtype == x.dtype and rel(y, reference.dense_reference(q, x)) <= 1e-4
  q, x = make(spec, w8a8_mgpu.MIN_M + 8, 224, 200, seed=11)
  p = wm.prepare(q)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "0")
  default = wm.prepare(q)  # the default layout: the permuted K order
  assert "pk" in default.layout.split(":"), default.layout
  bits = lambda a: np.asarray(a).view(np.uint8)
  np.testing.assert_array_equal(bits(wm.mx_fold_codes(p, pallas=True, interpret=True)),
                                bits(wm.mx_fold_codes(default, pallas=True, interpret=True)))
  np.testing.assert_array_equal(bits(wm.mx_fold_codes(p)), bits(wm.mx_fold_codes(default)))
  orders = []
  orig = wm.carrier_unpack.unpack
  monkeypatch.setattr(wm.carrier_unpack, "unpack",
                      lambda *a, **kw: orders.append(kw.get("order")) or orig(*a, **kw))
  assert wm.mx_fold_runs(p)
  np.testing.assert_array_equal(np.asarray(wm.run(p, x, interpret=True)),
                                np.asarray(wm.run(default, x, interpret=True)))
  assert orders == ["p8", "pk"], orders  # the fold's route, each reading its own layout
  # No 8-bit route (fp4 with bf16 scales in groups of 128) at M >= 512 and float32 x: the
  # layout's XLA dequantize + GEMM, as from the K order.
  spec = hj.QuantSpec("fp4_e2m1", "group", 128, act="fp8_e4m3")
  q, x = make(spec, w8a8_mgpu.MIN_M + 8, 256, 192, seed=14)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  p = wm.prepare(q)
  assert "p8" in p.layout.split(":"), p.layout
  for xx in (x, x[:3].astype(jnp.float32)):
    want = reference.dense_reference(q, xx)
    assert rel(wm.run(p, xx, interpret=True), want) <= TOL


@pytest.mark.gpu
def test_dense_fp8_fold_gpu(monkeypatch):
  """HUMMING_JAX_FP8_FOLD=1 with HUMMING_JAX_DENSE_FP8_MMA=1 on the H200 (session 22): the
  dense fp8 kernel with the e8m0 group scales folded into its e4m3 operands at M = 16 /
  128, within 1e-3 of the reference."""
  spec = SPECS["w4a8-mxfp4"]
  q, x = make(spec, 128, 8192, 8192, seed=9)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  p = jax.jit(lambda q: wm.prepare(q))(q)
  assert "p8" in p.layout.split(":"), p.layout
  for m in (16, 128):
    want = jax.jit(reference.dense_reference)(q, x[:m])
    ys = {}
    for flag in ("0", "1"):  # the per-group partials, then the fold (fresh traces)
      monkeypatch.setenv("HUMMING_JAX_FP8_FOLD", flag)
      ys[flag] = jax.jit(lambda p, x: wm.run(p, x))(p, x[:m])
    e, d = rel(ys["1"], want), rel(ys["1"], ys["0"])
    print(f"wnam_mgpu fp8 fold M={m}: rel err {e:.2e} (partials {rel(ys['0'], want):.2e}), "
          f"fold vs partials {d:.1e}")
    assert e <= 1e-3 and d <= 1e-3


@pytest.mark.gpu
def test_dense_fp8_mma_gpu(monkeypatch):
  """HUMMING_JAX_DENSE_FP8_MMA=1 on the H200 (built after session 20's device time): W4A8
  MXFP4 8192^2 in the fp8-MMA layout -- decode at M = 1 / 16 within 1e-3 of the reference,
  the fold's prefill at M = 1024 (":p8"-reading unpack) equal to the default (":pk") layout's."""
  spec = SPECS["w4a8-mxfp4"]
  q, x = make(spec, 1024, 8192, 8192, seed=8)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "0")
  default = jax.jit(wm.prepare)(q)
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  p = jax.jit(lambda q: wm.prepare(q))(q)
  assert "p8" in p.layout.split(":"), p.layout
  for m in (1, 16):
    e = rel(jax.jit(lambda p, x: wm.run(p, x))(p, x[:m]),
            jax.jit(reference.dense_reference)(q, x[:m]))
    print(f"wnam_mgpu fp8 MMA decode M={m}: rel err {e:.2e}")
    assert e <= 1e-3
  fold = lambda p: wm.mx_fold_codes(p, pallas=True)
  np.testing.assert_array_equal(np.asarray(jax.jit(fold)(p)).view(np.uint8),
                                np.asarray(jax.jit(fold)(default)).view(np.uint8))
  y = jax.jit(lambda p, x: wm.run(p, x))(p, x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(
      jax.jit(lambda p, x: wm.run(p, x))(default, x)))


@pytest.mark.parametrize("name", ["w4a8-mxfp4", "w4a8-fp8"])
def test_k_order_layouts_still_run(name, monkeypatch):
  """Params prepared before session 42 (K order: no ":pk" in the layout) still run on
  every route, bit-equal to the default permuted layout: the decode (XLA pre-pass in the
  interpreter) and the prefill's Pallas unpack, which reads the order off the layout."""
  from humming_jax.kernels import w8a8_mgpu
  spec = SPECS[name]
  q, x = make(spec, w8a8_mgpu.MIN_M + 8, 256, 128, seed=21)
  default = wm.prepare(q)
  monkeypatch.setenv("HUMMING_JAX_PERMUTE_K", "0")
  old = wm.prepare(q)
  assert "pk" in default.layout.split(":") and "pk" not in old.layout.split(":"), (
      default.layout, old.layout)
  assert (wm.wna16_mgpu.code_order(default.layout),
          wm.wna16_mgpu.code_order(old.layout)) == ("pk", "k")
  np.testing.assert_array_equal(np.asarray(wm.to_canonical(old).codes),
                                np.asarray(wm.to_canonical(default).codes))
  for m in (3, x.shape[0]):  # decode, prefill
    np.testing.assert_array_equal(np.asarray(wm.run(old, x[:m], interpret=True)),
                                  np.asarray(wm.run(default, x[:m], interpret=True)))


# ----------------------------------------------------------------------------------------
# Decode activations quantized inside the WnA16 kernel (wna16_mgpu.run's fake_quantize_x)
# ----------------------------------------------------------------------------------------
FAKE_X = {"w4a8-int8": "int8", "w4a8-fp8": "fp8_e4m3", "w4a8-mxfp4": "fp8_e4m3",
          "w4a8-uint4-zp": "int8"}


def _view_and_x(name, m, k, n, seed, dtype=jnp.bfloat16):
  """Prepared params of a W4A8 spec, their WnA16 view and x, with one row whose spread
  puts most of its e4m3 values among the subnormals (one large value sets the scale)."""
  q, x = make(GPU_SPECS[name], m, k, n, seed=seed, dtype=dtype)
  x = x.at[m - 1, 5].set(300.0)
  p = wm.prepare(q)
  return q, p, wm.family_view(p, wna16_mgpu.FAMILY), x


def _xla_fake_quantized(x, spec):
  """XLA's fake quantization (the reference's), rounded to x.dtype: what the pre-pass route
  multiplies in the interpreter."""
  from humming_jax.quantize import fake_quantize_activations
  return fake_quantize_activations(x, spec).astype(x.dtype)


def test_round_to_e4m3_is_the_convert():
  """mgpu_convert.round_to_e4m3 (integer arithmetic) against XLA's float32 -> e4m3 -> float32
  on every bfloat16 and float16 value within e4m3's range, e4m3's own values, the midpoints
  between them and their float32 neighbours (ties to even, subnormals, signed zeros), and
  NaN (including a NaN whose low mantissa bits would round over)."""
  from humming_jax.kernels import mgpu_convert
  e4m3 = np.asarray(jnp.arange(256, dtype=jnp.uint8).view(jnp.float8_e4m3fn)
                    .astype(jnp.float32))
  e4m3 = np.sort(e4m3[np.isfinite(e4m3)])
  mids = ((e4m3[1:] + e4m3[:-1]) / 2).astype(np.float32)
  t = np.concatenate([
      np.arange(2**16, dtype=np.uint16).view(jnp.bfloat16).astype(np.float32),
      np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32),
      e4m3, mids, np.nextafter(mids, np.float32(np.inf)),
      np.nextafter(mids, np.float32(-np.inf))]).astype(np.float32)
  t = t[np.isfinite(t) & (np.abs(t) <= 448)]
  want = np.asarray(jnp.asarray(t).astype(jnp.float8_e4m3fn).astype(jnp.float32))
  got = np.asarray(jax.jit(mgpu_convert.round_to_e4m3)(jnp.asarray(t)))
  np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
  nans = np.array([0x7FC00000, 0x7FFFFFFF, -1], np.int32).view(np.float32)
  assert np.isnan(np.asarray(mgpu_convert.round_to_e4m3(jnp.asarray(nans)))).all()


# Each launch with one int8-activation and one e4m3-activation spec; each spec once (the
# full 4 x 2 grid took 35 s of CI time).
@pytest.mark.parametrize("name,m,k,cfg", [
    # one token: the row view, two warpgroups
    ("w4a8-int8", 1, 1024, dict(stages=2, warpgroups=2)),
    ("w4a8-mxfp4", 1, 1024, dict(stages=2, warpgroups=2)),
    # rows streamed through the x slots
    ("w4a8-fp8", 3, 1024, dict(stages=2, warpgroups=1)),
    ("w4a8-uint4-zp", 3, 1024, dict(stages=2, warpgroups=1)),
])
def test_fake_quantize_x_interpret(name, m, k, cfg, monkeypatch):
  """x quantized per token and dequantized inside the kernel: bit for bit the same kernel
  on the pre-pass route's values (fake_quantize_activations rounded to bf16), on int8 and
  e4m3 activations (a row of mostly e4m3 subnormals), int4 / uint4 zp / MXFP4 weights; and
  not the kernel on the bare x.  One token: the row converted once per warpgroup and the
  per-tile form (HUMMING_JAX_RESIDENT_X=0) alike."""
  q, p, view, x = _view_and_x(name, m, k, 128, seed=m + k)
  config = wna16_mgpu.Config(8, substeps=2, unpadded_rows=True, **cfg)
  run = lambda x, **kw: jax.jit(lambda v, x: wna16_mgpu.run(
      v, x, interpret=True, config=config, **kw))(view, x)
  monkeypatch.setenv("HUMMING_JAX_RESIDENT_X", "1")
  y = run(x, fake_quantize_x=FAKE_X[name])
  want = run(_xla_fake_quantized(x, p.spec))
  assert y.dtype == x.dtype and y.shape == (m, 128)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(want, np.float32))
  if m == 1:
    monkeypatch.setenv("HUMMING_JAX_RESIDENT_X", "0")
    np.testing.assert_array_equal(np.asarray(run(x, fake_quantize_x=FAKE_X[name]), np.float32),
                                  np.asarray(want, np.float32))
    monkeypatch.delenv("HUMMING_JAX_RESIDENT_X")
  assert not np.array_equal(np.asarray(y, np.float32), np.asarray(run(x), np.float32))
  assert rel(y, reference.dense_reference(q, x)) <= TOL


SPLIT_ZP_BLOCKS = dict(warpgroups=2, split_k=2, scale_after_mma=True, zero_point_mma=True,
                       column_blocks=2)


@pytest.mark.parametrize("name,m,k,cfg", [
    # streamed amax over two warpgroups (their maxima meet in SMEM), grid split-K (each CTA
    # reads the whole rows), the zero points' ones-tile x sums, two column blocks
    ("w4a8-uint4-zp", 3, 1024, SPLIT_ZP_BLOCKS),
    # one token (the row converted once per warpgroup): a K split's steps read the other
    # warpgroup's share of the row; the ones-tile sums and two column blocks beside
    ("w4a8-uint4-zp", 1, 2048, SPLIT_ZP_BLOCKS),
    ("w4a8-fp8", 1, 2048, dict(warpgroups=2, split_k=4)),  # one step per warpgroup and CTA
    # per-channel 8-bit weights (their column scale), K padded 1000 -> 1024
    ("w8a8-int8", 3, 1000, dict(warpgroups=2)),
    ("w8a8-int8", 1, 1000, dict(warpgroups=1, column_blocks=2)),
])
def test_fake_quantize_x_launches_interpret(name, m, k, cfg, monkeypatch):
  """The in-kernel quantization on other launches and weights: bit for bit the same launch
  on the pre-pass route's values (one token: the row converted once per warpgroup)."""
  monkeypatch.setenv("HUMMING_JAX_RESIDENT_X", "1")
  spec = GPU_SPECS[name]
  q, x = make(spec, m, k, 256, seed=5)
  x = x.at[0, 3].set(-250.0)
  view = wm.family_view(wm.prepare(q), wna16_mgpu.FAMILY)
  config = wna16_mgpu.Config(8, stages=2, substeps=2, unpadded_rows=True, **cfg)
  run = lambda x, **kw: wna16_mgpu.run(view, x, interpret=True, config=config, **kw)
  y = run(x, fake_quantize_x=spec.act_format.name)
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                np.asarray(run(_xla_fake_quantized(x, spec)), np.float32))
  assert rel(y, reference.dense_reference(q, x)) <= TOL


def test_fake_quantize_x_nan_zero_rows_and_fp16():
  """A row holding inf comes out NaN (its scale is NaN, as the reference's), an all-zero
  row zero, the other rows unchanged; fp16 x matches the pre-pass values too."""
  config = wna16_mgpu.Config(8, stages=2, substeps=2, warpgroups=1, unpadded_rows=True)
  for dtype in (jnp.bfloat16, jnp.float16):
    _, p, view, x = _view_and_x("w4a8-fp8", 4, 512, 128, seed=7, dtype=dtype)
    run = lambda x: wna16_mgpu.run(view, x, interpret=True, config=config,
                                   fake_quantize_x="fp8_e4m3")
    y = run(x)
    np.testing.assert_array_equal(
        np.asarray(y, np.float32),
        np.asarray(wna16_mgpu.run(view, _xla_fake_quantized(x, p.spec), interpret=True,
                                  config=config), np.float32))
    x_bad = x.at[1, 9].set(jnp.inf).at[2].set(0)
    bad = np.asarray(run(x_bad), np.float32)
    want = np.asarray(wna16_mgpu.run(view, _xla_fake_quantized(x_bad, p.spec), interpret=True,
                                     config=config), np.float32)
    assert np.isnan(bad[1]).all() and not np.isnan(bad[[0, 2, 3]]).any()
    np.testing.assert_array_equal(bad[[0, 2, 3]], want[[0, 2, 3]])  # (row 2: the bias)
    np.testing.assert_array_equal(bad[[0, 3]], np.asarray(y, np.float32)[[0, 3]])


def test_fake_quantize_x_errors():
  _, p, view, x = _view_and_x("w4a8-int8", 2, 512, 128, seed=1)
  with pytest.raises(ValueError, match="fake_quantize_x='fp8_e5m2': expected one of"):
    wna16_mgpu.run(view, x, interpret=True, fake_quantize_x="fp8_e5m2")
  with pytest.raises(ValueError, match="fake_quantize_x='int8': the kernel computes the row"):
    wna16_mgpu.run(view, x, interpret=True, fake_quantize_x="int8",
                   x_scale=jnp.ones((2,), jnp.float32))
  with pytest.raises(ValueError, match="fake_quantize_x='int8': expected bfloat16 / float16"):
    wna16_mgpu.run(view, x.astype(jnp.float32), interpret=True, fake_quantize_x="int8")
  with pytest.raises(ValueError, match="fake_quantize_x='int8': the x tile .* multiple of 256"):
    wna16_mgpu.run(view, x, interpret=True, fake_quantize_x="int8",
                   config=wna16_mgpu.Config(8, stages=2, substeps=1, warpgroups=1))
  with pytest.raises(ValueError, match="warpgroups split K only"):
    wna16_mgpu.run(view, x, interpret=True, fake_quantize_x="int8",
                   config=wna16_mgpu.Config(8, stages=2, substeps=2, warpgroups=2,
                                            split_warpgroups="n"))
  with pytest.raises(ValueError, match="dequant_gemm_min_m"):
    wna16_mgpu.run(view, x, interpret=True, fake_quantize_x="int8",
                   config=wna16_mgpu.Config(8, stages=2, substeps=2, dequant_gemm_min_m=2))


def test_decode_route_quantizes_x_in_the_kernel(monkeypatch):
  """wnam_mgpu.run at one token: the in-kernel quantization where it applies and
  HUMMING_JAX_DECODE_QUANTIZE_X=1 asks for it (off by default: slower on the H200,
  FAKE_QUANTIZE_X_BY_DEFAULT), the same output as the pre-pass route; e5m2 activations,
  static scales, an odd K-tile count and M >= dequant_gemm_min_m keep the pre-pass.  With
  the default on, W8A8's rule (the GPU, one token)."""
  q, p, view, x = _view_and_x("w4a8-int8", 1, 1024, 192, seed=3)
  assert not wm.quantizes_x_in_kernel(p, view, x, interpret=False)  # the default
  monkeypatch.setattr(wm, "FAKE_QUANTIZE_X_BY_DEFAULT", True)
  assert wm.quantizes_x_in_kernel(p, view, x, interpret=False)
  assert not wm.quantizes_x_in_kernel(p, view, x, interpret=True)
  assert not wm.quantizes_x_in_kernel(p, view, jnp.zeros((2, 1024), x.dtype))  # one token
  monkeypatch.setattr(wm, "FAKE_QUANTIZE_X_BY_DEFAULT", False)
  # forced on: the spec and launch checks still win
  monkeypatch.setenv("HUMMING_JAX_DECODE_QUANTIZE_X", "1")
  assert wm.quantizes_x_in_kernel(p, view, jnp.zeros((2, 1024), x.dtype), interpret=True)
  assert not wm.quantizes_x_in_kernel(p, view, jnp.zeros((600, 1024), x.dtype))  # XLA's GEMM
  e5m2, _ = make(GPU_SPECS["w4a8-e5m2act"], 1, 1024, 128)
  pe = wm.prepare(e5m2)
  assert not wm.quantizes_x_in_kernel(pe, wm.family_view(pe, wna16_mgpu.FAMILY), x)
  static = hj.QuantSpec("int4", "group", 128, act="int8", act_granularity="tensor",
                        act_static=True)
  ps = wm.prepare(make(static, 1, 1024, 128)[0])
  assert not wm.quantizes_x_in_kernel(ps, wm.family_view(ps, wna16_mgpu.FAMILY), x)
  odd = wm.prepare(make(GPU_SPECS["w4a8-int8"], 1, 1152, 128)[0])  # 9 K tiles of 128
  assert not wm.quantizes_x_in_kernel(odd, wm.family_view(odd, wna16_mgpu.FAMILY),
                                      jnp.zeros((1, 1152), x.dtype))
  monkeypatch.delenv("HUMMING_JAX_DECODE_QUANTIZE_X")
  calls, real = [], wna16_mgpu.run
  monkeypatch.setattr(wna16_mgpu, "run", lambda *a, **kw: (
      calls.append(kw.get("fake_quantize_x")), real(*a, **kw))[1])
  y_pre = jax.jit(lambda p, x: wm.run(p, x, interpret=True))(p, x)
  monkeypatch.setenv("HUMMING_JAX_DECODE_QUANTIZE_X", "1")
  y_in = jax.jit(lambda p, x: wm.run(p, x, interpret=True))(p, x)
  assert calls == [None, "int8"], calls
  np.testing.assert_array_equal(np.asarray(y_in, np.float32), np.asarray(y_pre, np.float32))
  assert rel(y_in, reference.dense_reference(q, x)) <= TOL


def test_shared_memory_estimate_with_fake_quantize_x(monkeypatch):
  """fake_quantize_x's buffers (no code tile: the values go over the x tile; the amax
  pass's barriers, the warpgroups' maxima, one token's row view) are counted: Mosaic's
  count or up to 2 KB above."""
  import re
  monkeypatch.setattr(wna16_mgpu, "SMEM_BYTES", 10**7)
  q, _ = make(GPU_SPECS["w4a8-int8"], 1, 8192, 256)
  view = wm.family_view(wm.prepare(q), wna16_mgpu.FAMILY)
  cfg = wna16_mgpu.Config(8, 8, 2, warpgroups=4, unpadded_rows=True)  # (over the limit)
  x = jax.ShapeDtypeStruct((1, 8192), jnp.bfloat16)
  with pytest.raises(Exception, match="exceeds available shared memory") as err:
    jax.jit(lambda v, x: wna16_mgpu.run(v, x, config=cfg, fake_quantize_x="int8")).trace(
        view, x).lower(lowering_platforms=("cuda",))
  count = int(re.search(r"smem_bytes=(\d+)", str(err.value)).group(1))
  est = wna16_mgpu.smem_bytes(8, 8, 2, 128, 4, False, 2, 4, False, 1, False,
                              x_codes=True, code_tiles=False, x_row_view_k=8192)
  assert 0 <= est - count < 2048, (est, count)


# The H100's decode launch (mma.sync, one 8-row tile; session 56) takes the in-kernel
# quantization with two K tiles per step (its 256-column x tiles); the interpreter runs the
# WGMMA form, so this launch is checked by lowering here and on the GPU below.
MMA_SYNC_CONFIG = wna16_mgpu.Config(8, stages=4, substeps=2, warpgroups=4, unpadded_rows=True,
                                    mma_sync=True)


@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4"])
def test_fake_quantize_x_mma_sync_lowers_for_h200(name):
  from test_cuda_lowering import lower_for_h200
  spec = GPU_SPECS[name]
  q = jax.eval_shape(lambda w: hj.quantize(w, spec), jax.ShapeDtypeStruct((8192, 8192),
                                                                         jnp.float32))
  view = jax.eval_shape(lambda q: wm.family_view(wm.prepare(q), wna16_mgpu.FAMILY), q)
  x = jax.ShapeDtypeStruct((1, 8192), jnp.bfloat16)
  text = lower_for_h200(lambda v, x: wna16_mgpu.run(
      v, x, config=MMA_SYNC_CONFIG, fake_quantize_x=FAKE_X[name]), view, x)
  assert "mosaic_gpu" in text


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4"])
def test_fake_quantize_x_mma_sync_gpu(name):
  """The mma.sync launch with the in-kernel quantization against the same launch on XLA's
  fake-quantized x (the reference's values) and against the reference."""
  q, x = make(GPU_SPECS[name], 1, 8192, 8192, seed=12)
  view = jax.jit(lambda q: wm.family_view(wm.prepare(q), wna16_mgpu.FAMILY))(q)
  run = jax.jit(lambda v, x, fq: wna16_mgpu.run(v, x, config=MMA_SYNC_CONFIG,
                                                fake_quantize_x=fq), static_argnums=2)
  y = run(view, x, FAKE_X[name])
  y_xla = run(view, jax.jit(lambda x: _xla_fake_quantized(x, q.spec))(x), None)
  e_ref, e_same = rel(y, jax.jit(reference.dense_reference)(q, x)), rel(y, y_xla)
  print(f"{name} M=1 mma.sync, x quantized in the kernel: rel err vs reference {e_ref:.2e}, "
        f"vs XLA's values on the same launch {e_same:.2e}")
  assert e_ref <= TOL and e_same <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(8192, 8192), (14336, 4096)])
@pytest.mark.parametrize("name", sorted(FAKE_X))
def test_fake_quantize_x_gpu(name, k, n, monkeypatch):
  """The one-token W4A8 decode with the activations quantized in the kernel
  (HUMMING_JAX_DECODE_QUANTIZE_X=1): against the reference, and against the pre-pass
  route (its Pallas launch divides by the scale where XLA and the kernel multiply by its
  reciprocal: a code step apart in rare ties; H200 session 58: bit-equal at these shapes)."""
  q, x = make(GPU_SPECS[name], 1, k, n, seed=11)
  p = jax.jit(wm.prepare)(q)
  monkeypatch.setenv("HUMMING_JAX_DECODE_QUANTIZE_X", "1")
  calls, real = [], wna16_mgpu.run
  monkeypatch.setattr(wna16_mgpu, "run", lambda *a, **kw: (
      calls.append(kw.get("fake_quantize_x")), real(*a, **kw))[1])
  y = jax.jit(lambda p, x: wm.run(p, x))(p, x)
  assert calls == [FAKE_X[name]], calls  # the route ran the in-kernel quantization
  monkeypatch.setenv("HUMMING_JAX_DECODE_QUANTIZE_X", "0")
  y_pre = jax.jit(lambda p, x: wm.run(p, x))(p, x)
  e_ref, e_pre = rel(y, jax.jit(reference.dense_reference)(q, x)), rel(y, y_pre)
  print(f"{name} {k}->{n} M=1, x quantized in the kernel: rel err vs reference {e_ref:.2e}, "
        f"vs the pre-pass route {e_pre:.2e}")
  assert e_ref <= TOL and e_pre <= 2e-3


@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4"])
@pytest.mark.parametrize("k,n,split_k", [(8192, 8192, 1), (14336, 4096, 2)])
def test_fake_quantize_x_row_view_lowers_for_h200(name, k, n, split_k, monkeypatch):
  """One token's row converted once per warpgroup (the row view) on the WGMMA decode
  launch, one CTA per K range and over grid K splits (other warpgroups' rows)."""
  from test_cuda_lowering import abstract_params, lower_for_h200
  monkeypatch.setenv("HUMMING_JAX_RESIDENT_X", "1")
  view = jax.eval_shape(lambda p: wm.family_view(p, wna16_mgpu.FAMILY),
                        abstract_params(name, (k, n), kernel=wm.FAMILY))
  x = jax.ShapeDtypeStruct((1, k), jnp.bfloat16)
  cfg = wna16_mgpu.Config(8, stages=4, substeps=2, warpgroups=2, split_k=split_k,
                          unpadded_rows=True)
  text = lower_for_h200(lambda v, x: wna16_mgpu.run(
      v, x, config=cfg, fake_quantize_x=FAKE_X[name]), view, x)
  assert "mosaic_gpu" in text
  assert f"tensor<{k // 256}x256xbf16>" in text  # the row view's operand
  monkeypatch.setenv("HUMMING_JAX_RESIDENT_X", "0")  # (the per-tile form: another kernel)
  assert lower_for_h200(lambda v, x: wna16_mgpu.run(
      v, x, config=cfg, fake_quantize_x=FAKE_X[name]), view, x) != text
