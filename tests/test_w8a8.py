"""W8A8 / W4A8 / W4A4 kernels (kernels/w8a8.py) against the XLA reference.

Interpret mode (CPU, CI): every activation-quantized preset and the static per-tensor
variant, tight against kernels/reference.py (same activation quantization) and loose
against the unquantized float product (the format's own error).  GPU tests (H200) repeat
that at the benchmark shape 8192 x 8192.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.quantize import decode_scales, expand_scales, unpacked_codes
from humming_jax.kernels import act_quant, reference, registry, tuning, w8a8

ACT_PRESETS = sorted(n for n, s in hj.PRESETS.items() if s.act is not None)
STATIC = {
    "w8a8-int8-static": hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                                     act_granularity="tensor", act_static=True),
    "w8a8-fp8-static": hj.QuantSpec("fp8_e4m3", "channel", 0, scale_dtype="float32",
                                    act="fp8_e4m3", act_granularity="tensor",
                                    act_static=True),
}
# Loose bound vs the float product: the format's expected error on Gaussian data.
LOOSE = {8: 0.05, 4: 0.2}


def spec_of(name):
  return STATIC[name] if name in STATIC else hj.QuantSpec.preset(name)


def rel(y, ref):
  y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
  return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def make(name, k, n, m, seed=0, bias=True):
  spec = spec_of(name)
  kw, kx, kb = jax.random.split(jax.random.key(seed), 3)
  w = jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
  b = jax.random.normal(kb, (n,), jnp.float32) if bias else None
  act_scale = (float(jnp.max(jnp.abs(x.astype(jnp.float32)))) / spec.act_format.max_value
               if spec.act_static else None)
  q = _quantize(w, spec, b, act_scale)
  return spec, w, x, b, q


# Jitted helpers: eager dispatch of the many small ops of quantize / the reference costs
# seconds per test on the CPU; one compile each is cheaper.
_quantize = jax.jit(lambda w, spec, b, s: hj.quantize(w, spec, bias=b, act_scale=s),
                    static_argnums=1)
_reference = jax.jit(reference.dense_reference)
_prepare = jax.jit(lambda q: hj.prepare(q, kernel="w8a8"))  # this family, also for W4A8
_to_canonical = jax.jit(registry.to_canonical)


def check(name, q, w, x, b, y):
  ref = _reference(q, x)
  exact = x.astype(jnp.float32) @ w + (0 if b is None else b)
  assert not bool(jnp.isnan(y).any())
  assert y.dtype == x.dtype and y.shape == ref.shape
  e_ref, e_float = rel(y, ref), rel(y, exact)
  assert e_ref <= 1e-2, (name, e_ref)
  assert e_float <= LOOSE[q.spec.weight_bits if q.spec.act_format.bits >= 8 else 4], \
      (name, e_float)
  return e_ref, e_float


@functools.lru_cache(maxsize=None)
def _jit_run(interpret, config, fuse=False):
  return jax.jit(lambda p, x: w8a8.run(p, x, interpret=interpret, config=config,
                                       fuse_act_quant=fuse))


SMALL = tuning.TuningConfig(16, 64, 1, num_warps=4, num_stages=3)


@pytest.mark.parametrize("name", ACT_PRESETS + sorted(STATIC))
def test_presets_interpret(name):
  """Every activation-quantized preset: registered, prepared, exact vs the reference.
  K=384 / N=192 exercise K and N padding (N=256 for the 128x128-block preset)."""
  n = 256 if spec_of(name).granularity == "block" else 192
  spec, w, x, b, q = make(name, 384, n, 5)
  # The default family: this one for 8-bit weights, wnam_mgpu (the WnA16 kernel at decode)
  # for fewer bits (its priority_for; tests/test_wnam_mgpu.py).
  assert registry.find(spec).name == ("w8a8" if spec.weight_bits == 8 else "wnam_mgpu")
  p = _prepare(q)
  assert p.layout.startswith("w8a8:")
  back = _to_canonical(p)
  for a, c in zip(jax.tree.leaves(back), jax.tree.leaves(q)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  y = _jit_run(True, SMALL)(p, x)
  check(name, q, w, x, b, y)


def test_quant_dense_interpret_entry_point():
  """hj.quant_dense(backend='interpret') routes to this family (canonical params in; 8-bit
  weights: this family is their default); at M = 3 its run() takes the Mosaic decode
  route (w8a8.run_decode_mgpu, tests/test_w8a8_mgpu.py)."""
  spec, w, x, b, q = make("w8a8-int8", 256, 64, 3)
  run = jax.jit(lambda q, x: hj.quant_dense(q, x, backend="interpret"))
  y = run(q, x.reshape(1, 3, 256))
  assert y.shape == (1, 3, 64)
  check("w8a8-int8", q, w, x, b, y.reshape(3, 64))


@pytest.mark.parametrize("name,cfg", [
    ("w8a8-int8", tuning.TuningConfig(16, 32, 2)),       # split-K, int32 accumulation
    ("w8a8-fp8-block", tuning.TuningConfig(32, 128, 1)),  # M padding, 2-D block scales
    ("w4a8-mxfp4", tuning.TuningConfig(16, 64, 2)),       # split-K on the slab path
])
def test_tilings_interpret(name, cfg):
  spec, w, x, b, q = make(name, 512, 256, 19, seed=1)
  y = _jit_run(True, cfg)(_prepare(q), x)
  check(name, q, w, x, b, y)


@pytest.mark.parametrize("name", ["w8a8-fp8", "w8a8-int8-static"])
def test_fused_act_quant_interpret(name):
  """Quantizing in the kernel prologue gives the pre-pass result."""
  spec, w, x, b, q = make(name, 512, 64, 7, seed=2)
  p = _prepare(q)
  y_fused = _jit_run(True, SMALL, True)(p, x)
  y_pre = _jit_run(True, SMALL)(p, x)
  assert rel(y_fused, y_pre) <= 1e-2
  check(name, q, w, x, b, y_fused)


def test_in_kernel_int8_rounding_is_rne():
  """The prologue's floor-based rounding (Pallas-Triton has no round) equals jnp.round
  (half to even) + clip, also under jit where XLA simplifies arithmetic."""
  v = jnp.concatenate([jnp.arange(-140, 140, 0.25, dtype=jnp.float32),
                       jax.random.normal(jax.random.key(7), (4096,)) * 60])
  got = jax.jit(lambda v: w8a8._round_to_carrier(v, spec_of("w8a8-int8")))(v)
  want = jnp.clip(jnp.round(v), -128, 127).astype(jnp.int8)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_fused_act_quant_refuses_group_scales():
  spec, w, x, b, q = make("w8a8-fp8-block", 256, 128, 2)
  with pytest.raises(ValueError, match="fuse_act_quant"):
    w8a8.run(_prepare(q), x, interpret=True, fuse_act_quant=True)


@pytest.mark.parametrize("name", ["w4a4-nvfp4", "w4a4-mxfp4"])
def test_fp4_act_quant_matches_quantize(name):
  """The kernels' fp4 activation pre-pass (act_quant, through quantize.py's fast e2m1
  rounding) equals the format's generic table rounding of x / scale bit for bit."""
  spec = hj.QuantSpec.preset(name)
  x = jax.random.normal(jax.random.key(3), (9, 256), jnp.float32) * 3
  x = x.at[0, :16].set(0.0)  # an all-zero group
  a = jax.jit(act_quant.quantize, static_argnums=1)(x, spec)
  s = jnp.repeat(a.scales, 256 // a.scales.shape[1], axis=1)
  want = hj.get_format("fp4_e2m1").quantize_dequantize(jnp.clip(x / s, -6.0, 6.0))
  np.testing.assert_array_equal(np.asarray(a.values, np.float32), np.asarray(want))


def test_round_e2m1_equals_format_rne():
  """Every representable value, every midpoint (ties) and points between, both signs."""
  x = jnp.arange(-6 * 64, 6 * 64 + 1, dtype=jnp.float32) / 64
  want = hj.get_format("fp4_e2m1").quantize_dequantize(x)
  np.testing.assert_array_equal(np.asarray(jax.jit(act_quant.round_e2m1)(x)),
                                np.asarray(want))


NO_CARRIER = [  # no 8-bit tensor-core carrier: the W8A8 family refuses them
    hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="fp8_e4m3"),  # int8 !⊂ e4m3
    hj.QuantSpec("fp8_e4m3", "channel", 0, scale_dtype="float32", act="fp8_e5m2"),
    hj.QuantSpec("uint4", "group", 128, zero_point=True, act="int8"),
]


@pytest.mark.parametrize("spec", NO_CARRIER)
def test_specs_without_a_carrier_run_on_the_wna16_kernel(spec):
  """The W8A8 family refuses them; the wnam_mgpu family (activations quantized, then
  rounded to bf16, on the WnA16 Mosaic kernel) computes them within the bf16 rounding."""
  from humming_jax.kernels import reference, registry
  assert not w8a8.supports(spec)
  assert registry.find(spec).name == "wnam_mgpu"
  k, n = 256, 128
  w = jax.random.normal(jax.random.key(4), (k, n))
  q = hj.quantize(w, spec)
  x = jax.random.normal(jax.random.key(5), (2, k), jnp.bfloat16)
  y = hj.quant_dense(q, x, backend="interpret")
  ref = reference.dense_reference(q, x)
  assert float(jnp.linalg.norm((y - ref).astype(jnp.float32))
               / jnp.linalg.norm(ref.astype(jnp.float32))) <= 1e-2


@pytest.mark.parametrize("spec", [
    hj.QuantSpec("fp8_e4m3", "block", 128, block_n=128, scale_dtype="float32",
                 act="fp8_e5m2"),
    hj.QuantSpec("int8", "block", 128, block_n=128, scale_dtype="float32", act="fp8_e4m3"),
])
def test_unsupported_specs_refused(spec):
  from humming_jax.kernels import registry, wnam_mgpu
  assert not w8a8.supports(spec) and registry.find(spec) is None
  assert "granularity='block'" in wnam_mgpu.unsupported_reason(spec)
  k, n = 256, 128
  w = jax.random.normal(jax.random.key(4), (k, n))
  q = hj.quantize(w, spec)
  x = jnp.ones((2, k), jnp.bfloat16)
  with pytest.raises(ValueError, match="no Pallas dense kernel"):
    hj.quant_dense(q, x, backend="interpret")


ROUTED = ["w4a8-mxfp4", "w4a4-mxfp4", "w4a4-nvfp4"]  # weights exact in bf16 once scaled


def test_large_m_route_is_chosen_only_for_bf16_exact_operands():
  routed = [n for n in ACT_PRESETS
            if w8a8.dequant_gemm_exact(spec_of(n), w8a8.plan_for(spec_of(n)))]
  assert sorted(routed) == sorted(ROUTED)
  _, _, x, _, q = make("w4a8-fp8", 256, 64, 3)  # int4 x bf16 scales: 11 significant bits
  with pytest.raises(ValueError, match="not exact in bfloat16"):
    w8a8.dequant_gemm(_prepare(q), x)


@pytest.mark.parametrize("name", ROUTED)
def test_large_m_route_operands_are_bf16_numbers(name):
  """The premise of the route: code x K-group scale is a bfloat16 number, for weights and
  (group-scaled) activations, over scales spanning many binades.  (NVFP4 activations carry
  a float32 second-level scale: there the kernel itself rounds the folded operand to bf16,
  and the route does the same.)"""
  spec = spec_of(name)
  k, n = 256, 128
  w = (jax.random.normal(jax.random.key(1), (k, n))
       * jnp.exp2(jax.random.randint(jax.random.key(2), (1, n), -12, 12)))
  q = hj.quantize(w, spec)
  s = decode_scales(q.replace(global_scale=None))
  wd = spec.weight_format.decode(unpacked_codes(q)) * expand_scales(s, k, n)
  np.testing.assert_array_equal(np.asarray(wd.astype(jnp.bfloat16).astype(jnp.float32)),
                                np.asarray(wd))
  if w8a8.plan_for(spec).fold:
    return
  x = jax.random.normal(jax.random.key(3), (16, k)) * jnp.exp2(
      jax.random.randint(jax.random.key(4), (16, 1), -12, 12))
  qa = act_quant.quantize(x, spec, None)
  a = qa.dequantize() if spec.act_granularity == "group" else qa.values.astype(jnp.float32)
  np.testing.assert_array_equal(np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32)),
                                np.asarray(a))


@pytest.mark.parametrize("name", ROUTED)
def test_large_m_route_matches_reference(name):
  """M >= DEQUANT_GEMM_MIN_M without a config: XLA's bf16 GEMM on the dequantized operands,
  no Pallas kernel, equal to the reference up to float32 summation order."""
  spec, w, x, b, q = make(name, 256, 128, w8a8.DEQUANT_GEMM_MIN_M, seed=3)
  p = _prepare(q)
  run = jax.jit(lambda p, x: w8a8.run(p, x))
  assert "pallas_call" not in str(jax.make_jaxpr(run)(p, x))
  y = run(p, x)
  assert y.dtype == x.dtype and y.shape == (x.shape[0], 128)
  assert rel(y, _reference(q, x)) <= 4e-3  # the output's bf16 rounding (2**-9) dominates
  y32 = jax.jit(lambda p, x: w8a8.run(p, x))(p, x.astype(jnp.float32))
  ref32 = _reference(q, x.astype(jnp.float32))
  # exact operands: float32 summation order only; NVFP4: the kernel's bf16 fold rounding,
  # which the route reproduces (same operands as the kernel, in the interpreter)
  if w8a8.plan_for(spec).fold:
    assert rel(y32, ref32) <= 2e-3
    assert rel(y32, _jit_run(True, SMALL)(p, x.astype(jnp.float32))) <= 1e-5
  else:
    assert rel(y32, ref32) <= 1e-5


# ---------------------------------------------------------------------------------------
# GPU (H200): benchmark shape
# ---------------------------------------------------------------------------------------
def check_run_gpu(name, m):
  """8192^2 through w8a8.run as hj.quant_dense calls it (whichever kernel or route M picks)
  against the reference and the float product."""
  spec, w, x, b, q = make(name, 8192, 8192, m, seed=5)
  p = _prepare(q)  # this family (W4A8 presets default to wnam_mgpu)
  y = jax.jit(lambda p, x: w8a8.run(p, x))(p, x)
  e_ref, e_float = check(name, q, w, x, b, y)
  print(f"{name} M={m}: rel err vs reference {e_ref:.2e}, vs float {e_float:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4096])
@pytest.mark.parametrize("name", ACT_PRESETS + sorted(STATIC))
def test_presets_gpu(name, m):
  """M = 1: the Mosaic WnA16 decode kernel for the specs of w8a8.decode_mgpu_runs (int8 /
  fp8 per channel), the Triton kernel for the rest; M = 4096: the Mosaic kernel
  (tests/test_w8a8_mgpu.py) or, for ROUTED specs, the XLA route (test_large_m_kernel_gpu
  runs the Triton kernel there)."""
  check_run_gpu(name, m)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ROUTED)
def test_large_m_kernel_gpu(name):
  """The kernel itself at M = 4096 (what run() routes to XLA there without a config)."""
  spec, w, x, b, q = make(name, 8192, 8192, 4096, seed=5)
  p = jax.jit(lambda q: hj.prepare(q, kernel="w8a8"))(q)
  plan = w8a8.plan_for(spec)
  _, bk, kp, np_ = w8a8.kernel_dims(p, plan)
  cfg = w8a8.heuristic(4096, np_, kp // bk, plan)
  check(name, q, w, x, b, jax.jit(lambda p, x: w8a8.run(p, x, config=cfg))(p, x))


@pytest.mark.gpu
def test_fused_act_quant_gpu():
  spec, w, x, b, q = make("w8a8-fp8", 8192, 8192, 256, seed=6)
  p = jax.jit(lambda q: hj.prepare(q, kernel="w8a8"))(q)
  y = jax.jit(lambda p, x: w8a8.run(p, x, fuse_act_quant=True))(p, x)
  check("w8a8-fp8", q, w, x, b, y)


def test_known_bad_gpu_specs_are_never_picked(monkeypatch):
  """The fence mechanism (registry.DenseKernel.gpu_known_bad; no spec is fenced since the
  fp8/fp4 fixes passed on the H200): on a GPU backend=None routes a fenced spec to XLA and
  backend='pallas' refuses it with the reason."""
  import dataclasses as dc
  from humming_jax import ops
  monkeypatch.setattr(ops, "on_gpu", lambda: True)
  spec = hj.QuantSpec.preset("w4a4-nvfp4")
  assert ops.resolve_backend(None, spec) == "pallas"
  fenced = dc.replace(registry.find(spec), gpu_known_bad=lambda s: "measured wrong")
  monkeypatch.setattr(registry, "find", lambda s, grouped=False, **kw: fenced)
  assert ops.resolve_backend(None, spec) == "xla"
  with pytest.raises(ValueError, match="known to disagree with the reference"):
    ops.resolve_backend("pallas", spec)
  assert ops.resolve_backend("interpret", spec) == "interpret"

@pytest.mark.parametrize("name,nan_code,kernel", [
    ("w4a16-mxfp4", 0xFF, None), ("w4a16-nvfp4", 0x7F, None), ("w4a8-mxfp4", 0xFF, None),
    ("w4a4-nvfp4", 0x7F, None), ("w4a8-mxfp4", 0xFF, "w8a8"), ("w4a4-nvfp4", 0x7F, "w8a8")])
def test_nan_scale_code_gives_nan_like_the_reference(name, nan_code, kernel):
  """A NaN scale code (e8m0 0xFF, e4m3 0x7F: a corrupt checkpoint) makes its output column
  NaN in the kernel, as in the reference -- never a finite wrong number.  W4A8 / W4A4: the
  default family (wnam_mgpu) and this one."""
  spec = hj.QuantSpec.preset(name)
  kw, kx = jax.random.split(jax.random.key(9))
  q = hj.quantize(jax.random.normal(kw, (128, 64)) / 11, spec)
  codes = jax.lax.bitcast_convert_type(q.scales, jnp.uint8) if q.scales.dtype != jnp.uint8 \
      else q.scales
  codes = codes.at[1, 5].set(nan_code)
  q = q.replace(scales=codes if q.scales.dtype == jnp.uint8
                else jax.lax.bitcast_convert_type(codes, q.scales.dtype))
  x = jax.random.normal(kx, (3, 128), jnp.float32).astype(jnp.bfloat16)
  ref = reference.dense_reference(q, x)
  p = q if kernel is None else hj.prepare(q, kernel=kernel)
  y = jax.jit(lambda p, x: hj.quant_dense(p, x, backend="interpret"))(p, x)
  assert bool(jnp.isnan(ref[:, 5]).all())
  assert bool(jnp.isnan(y[:, 5]).all()), y[:, 5]
  others = np.delete(np.arange(64), 5)
  assert not bool(jnp.isnan(y[:, others]).any())


def test_run_names_unprepared_params():
  _, _, x, _, q = make("w4a8-mxfp4", 256, 64, 3)
  with pytest.raises(ValueError, match="params.layout='canonical'"):
    w8a8.run(q, x)


def test_triton_route_prepass_in_the_interpreter():
  """The Triton kernel (an explicit config) at M = FUSED_PREPASS_MIN_M in the interpreter:
  XLA's pre-pass (the one-pass kernel is the GPU's; interpret= reaches act_operands), and
  the reference's result."""
  m = w8a8.FUSED_PREPASS_MIN_M
  spec, w, x, b, q = make("w8a8-fp8", 256, 128, m, seed=11)
  p = _prepare(q)
  run = lambda p, x: w8a8.run(p, x, interpret=True, config=tuning.TuningConfig(128, 64, 1))
  assert w8a8.FUSED_PREPASS and "act_prepass" not in str(jax.make_jaxpr(run)(p, x))
  check("w8a8-fp8", q, w, x, b, jax.jit(run)(p, x))
  # the Mosaic 8-bit GEMM's route (gemm_8bit) likewise, traced only
  mgpu = lambda p, x: w8a8.run_mgpu(p, x, interpret=True)
  assert "act_prepass" not in str(jax.make_jaxpr(mgpu)(p, x))
  assert "act_prepass" in str(jax.make_jaxpr(lambda p, x: w8a8.run_mgpu(p, x))(p, x))
