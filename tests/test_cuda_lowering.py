"""Every GPU kernel lowers for an H200 on this (CPU) host.

``jit(f).trace(...).lower(lowering_platforms=("cuda",))`` under an abstract H200 device runs
the Pallas -> Triton IR and the Pallas -> Mosaic GPU lowerings without a GPU: the
interpreter tests check what a kernel computes, these check that the GPU program can be
built at benchmark shapes -- the class of failure seen first on the H200 before (Triton
cannot splat a constant into fp8; shared memory exceeded; too many barriers).  Passing
here does not mean the kernel compiles to SASS or runs: the @pytest.mark.gpu tests do.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from jax._src import mesh as mesh_lib

import humming_jax as hj
from humming_jax.kernels import registry, tuning, w8a8, w8a8_mgpu, wna16_mgpu as mg

H200 = jax.sharding.AbstractMesh(
    (1,), ("d",), abstract_device=mesh_lib.AbstractDevice(
        device_kind="NVIDIA H200", num_cores=132, platform="gpu"))


def lower_for_h200(fn, *args):
  """Lower ``fn(*args)`` (abstract args) for CUDA as on an H200; returns the text."""
  f = jax.jit(fn)
  f.trace(*args)  # one-time eager work (format tables) outside the abstract device
  with jax.sharding.use_abstract_mesh(H200):
    return f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def abstract_params(name, shape, grouped=False, kernel=None):
  spec = hj.QuantSpec.preset(name)
  q = jax.eval_shape(lambda w: hj.quantize(w, spec), jax.ShapeDtypeStruct(shape, jnp.float32))
  return jax.eval_shape(lambda q: hj.prepare(q, grouped=grouped, kernel=kernel), q)


ACT_4BIT = sorted(n for n in hj.PRESETS
                  if hj.PRESETS[n].act is not None and hj.PRESETS[n].weight_bits < 8)


@pytest.mark.parametrize("m,name,family",
                         [(m, n, None) for m in (1, 16, 128) for n in sorted(hj.PRESETS)]
                         + [(16, n, "w8a8") for n in ACT_4BIT])
def test_dense_kernels_lower_for_h200(m, name, family):
  """Every preset on its default family, and the sub-8-bit-weight activation presets on the
  W8A8 family too (their default is wnam_mgpu; M = 16, its Triton kernel)."""
  p = abstract_params(name, (8192, 8192), kernel=family)
  kernel = registry.find(p.spec) if family is None else registry.by_name(family)
  x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  text = lower_for_h200(lambda p, x: kernel.run(p, x), p, x)
  assert "custom_call" in text  # a kernel launch, not an XLA-only path


@pytest.mark.parametrize("tokens", [1, 256])
@pytest.mark.parametrize("name,family", [
    *[(n, None) for n in ("w4a16-g128-zp", "w4a16-mxfp4", "w8a8-fp8", "w8a8-int8",
                          "w4a8-fp8", "w4a8-mxfp4")],
    # the Pallas-Triton grouped kernel by name (the K-256 default until session 34; still
    # the family for shorter K and float32 tokens)
    ("w4a16-g128-zp", "grouped_wna16"), ("w4a16-mxfp4", "grouped_wna16")])
def test_grouped_kernels_lower_for_h200(name, family, tokens):
  """DeepSeek-V3 down (E 256, K 256, N 7168), top-8 routing: the shape's default family,
  or ``family``."""
  p = abstract_params(name, (256, 256, 7168), grouped=True, kernel=family)
  x = jax.ShapeDtypeStruct((tokens * 8, 256), jnp.bfloat16)
  gs = jax.ShapeDtypeStruct((256,), jnp.int32)
  kernel = (registry.by_name(family, grouped=True) if family  # the family p was prepared for
            else registry.find(p.spec, grouped=True, shape=p.shape))
  text = lower_for_h200(lambda p, x, gs: kernel.run(p, x, gs), p, x, gs)
  assert "custom_call" in text


@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_mgpu_candidates_lower_for_h200(m):
  """Every autotune candidate of the Mosaic kernel that passes the shared-memory check
  lowers (Mosaic's own limits: shared memory, barriers); zero_point_mma's Mosaic
  conversion is refused by name on the default, permuted layout (autotune skips it)."""
  p = abstract_params("w4a16-g128-zp", (8192, 8192))
  x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  lowered = 0
  for cfg in tuning.mgpu_candidates(m):
    try:
      lower_for_h200(lambda p, x, cfg=cfg: mg.run(p, x, config=cfg), p, x)
      lowered += 1
    except ValueError as e:  # our refusal, by name, before Mosaic sees it
      assert "shared memory" in str(e) or (cfg.zero_point_mma and "permute=False" in str(e)), e
  assert lowered >= 3


@pytest.mark.parametrize("cfg", [None, w8a8_mgpu.Config(64, 64),
                                 w8a8_mgpu.Config(64, 128, stages=3),
                                 w8a8_mgpu.Config(64, 128, group_pairs=True),
                                 w8a8_mgpu.Config(64, 128, group_pairs=True, split_m=True)])
@pytest.mark.parametrize("name", ["w8a8-int8", "w8a8-fp8", "w8a8-fp8-block", "w4a8-int8",
                                  "w4a8-fp8"])
def test_w8a8_mgpu_lowers_for_h200(name, cfg):
  """The Mosaic W8A8 kernel at M = 4096, 8192^2 (w8a8.run takes it there on a Hopper GPU;
  this CPU host is not one, so run_mgpu is called directly)."""
  p = abstract_params(name, (8192, 8192), kernel="w8a8")
  x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)
  text = lower_for_h200(lambda p, x: w8a8.run_mgpu(p, x, config=cfg), p, x)
  assert "custom_call" in text


@pytest.mark.parametrize("name", ["w8a8-fp8-block", "w4a8-int8", "w4a8-fp8"])
def test_w8a8_mgpu_group_waves_lower_for_h200(name):
  """Config.group_waves (two 64-row waves per warpgroup, 256 x 128 CTA tiles; int8's
  default since session 16) at M = 4096, 8192^2: on the W8A8 family's layout and through the W4A8 prefill
  of the wnam_mgpu layout."""
  from humming_jax.kernels import wnam_mgpu
  cfg = w8a8_mgpu.Config(128, 128, split_m=True, group_waves=True)
  assert w8a8_mgpu.fit_stages(cfg, True) == 3  # 4 stages of 256 x 128 tiles do not fit
  x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)
  p = abstract_params(name, (8192, 8192), kernel="w8a8")
  assert "custom_call" in lower_for_h200(lambda p, x: w8a8.run_mgpu(p, x, config=cfg), p, x)
  if name.startswith("w4a8"):
    p = abstract_params(name, (8192, 8192))
    assert p.layout.startswith(wnam_mgpu.FAMILY)
    text = lower_for_h200(lambda p, x: wnam_mgpu.run_prefill_8bit(p, x, config=cfg), p, x)
    assert "custom_call" in text


@pytest.mark.parametrize("name", ["w4a8-int8", "w4a8-mxfp4"])
def test_grouped_wnam_mgpu_lowers_for_h200(name):
  """The grouped quantized-activation family (the W4A8 / W4A4 default; GPU-run in session
  16) at DeepSeek-V3 gate_up (E 256, K 7168, N 512), 16 tokens x top-8: the activation fake-quantization and
  the Mosaic grouped kernel lower for the H200."""
  from humming_jax.kernels import grouped_wnam_mgpu as gw
  spec = hj.QuantSpec.preset(name)
  q = jax.eval_shape(lambda w: hj.quantize(w, spec),
                     jax.ShapeDtypeStruct((256, 7168, 512), jnp.float32))
  p = jax.eval_shape(lambda q: hj.prepare(q, grouped=True, kernel=gw.FAMILY), q)
  assert registry.layout_family(p.layout) == gw.FAMILY
  x = jax.ShapeDtypeStruct((128, 7168), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((256,), jnp.int32)
  assert "custom_call" in lower_for_h200(lambda p, x, g: gw.run(p, x, g), p, x, g)


@pytest.mark.parametrize("m", [1, 12, 24, 100])
def test_mgpu_unpadded_rows_lower_for_h200(m):
  """unpadded_rows at token counts that are not multiples of 8 (M = 100 failed on the H200:
  Mosaic's TMA wants fewer than 8 rows or a multiple of 8; run() pads those)."""
  p = abstract_params("w4a16-g128-zp", (4096, 1024))
  x = jax.ShapeDtypeStruct((m, 4096), jnp.bfloat16)
  cfg = mg.Config(64, 4, 1, warpgroups=4, unpadded_rows=True)
  assert "custom_call" in lower_for_h200(lambda p, x: mg.run(p, x, config=cfg), p, x)


@pytest.mark.parametrize("m,cfg", [
    (1, mg.Config(8, 4, 1, warpgroups=8, scale_after_mma=True))], ids=["wg8"])
def test_mgpu_decode_variants_lower_for_h200(m, cfg):
  """Eight warpgroups (8-row tiles: 64 registers per thread) lower at 8192^2 (session 13)."""
  p = abstract_params("w4a16-g128-zp", (8192, 8192))
  x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  assert "custom_call" in lower_for_h200(lambda p, x: mg.run(p, x, config=cfg), p, x)


@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("name", ["w8a8-int8", "w8a8-int8-static", "w8a8-fp8"])
def test_w8a8_decode_mgpu_lowers_for_h200(name, m):
  """W8A8 int8 / fp8 at decode on the Mosaic WnA16 kernel, reading W8A8's (N, K) codes in
  place (one TMA box per K tile, two per pipeline step at M <= 16), the per-token scales
  in its epilogue (computed in the kernel at one token)."""
  spec = (hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                       act_granularity="tensor", act_static=True)
          if name.endswith("static") else hj.QuantSpec.preset(name))
  w = jax.ShapeDtypeStruct((8192, 8192), jnp.float32)
  s = jax.ShapeDtypeStruct((), jnp.float32)
  q = jax.eval_shape(lambda w, s: hj.quantize(w, spec, act_scale=s if spec.act_static else None),
                     w, s)
  p = jax.eval_shape(hj.prepare, q)
  x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  text = lower_for_h200(lambda p, x: w8a8.run_decode_mgpu(p, x), p, x)
  assert "mosaic_gpu" in text  # the Mosaic kernel, not an XLA path
  # per token: the codes from the one-launch pre-pass (act_prepass.decode_codes_rows) at
  # 16 rows; at one token the kernel quantizes x itself (w8a8.DECODE_QUANTIZE_X_MAX_M)
  assert ("act_decode_codes_" in text) == (not spec.act_static and m > 1)


@pytest.mark.parametrize("m", [1, 16, 128])
def test_mgpu_fp8_weights_lower_for_h200(m):
  """fp8 e4m3 weights on the Mosaic WnA16 kernel (the e4m3 -> 16-bit cvt in registers)."""
  p = jax.eval_shape(mg.prepare, jax.eval_shape(
      lambda w: hj.quantize(w, hj.QuantSpec.preset("w8a16-fp8")),
      jax.ShapeDtypeStruct((8192, 8192), jnp.float32)))
  x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  assert "mosaic_gpu" in lower_for_h200(lambda p, x: mg.run(p, x), p, x)


@pytest.mark.parametrize("shape,tokens,topk", [((256, 7168, 512), 1024, 8),  # 48-row tiles
                                               ((128, 2048, 1536), 1024, 8),  # 80
                                               ((8, 4096, 28672), 1024, 2)])  # 128
def test_mgpu_grouped_prefill_tiles_lower_for_h200(shape, tokens, topk):
  """The Mosaic grouped kernel at the MoE benchmark's prefill shapes, where block_rows
  picks tiles of 48 / 80 / 128 rows (the last two: two warpgroups per CTA)."""
  from humming_jax.kernels import grouped_wna16_mgpu as gm
  q = jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset("w4a16-g128-zp")),
                     jax.ShapeDtypeStruct(shape, jnp.float32))
  p = jax.eval_shape(gm.prepare, q)
  x = jax.ShapeDtypeStruct((tokens * topk, shape[1]), jnp.bfloat16)
  gs = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
  assert gm.block_rows(tokens * topk, shape[0]) == {256: 48, 128: 80, 8: 128}[shape[0]]
  assert "mosaic_gpu" in lower_for_h200(lambda p, x, gs: gm.run(p, x, gs), p, x, gs)


@pytest.mark.parametrize("m,cfg", [
    (128, mg.shared_x_config(128)),
    (128, mg.Config(128, 4, 1, warpgroups=2, scale_after_mma=True, split_warpgroups="n")),
    (64, mg.Config(64, 4, 1, warpgroups=4, scale_after_mma=True, split_warpgroups="n")),
    (128, mg.Config(128, 4, 1, warpgroups=2, split_k=2, split_warpgroups="n")),
])
@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-nvfp4", "w8a16-fp8"])
def test_mgpu_shared_x_lowers_for_h200(name, m, cfg):
  """Warpgroups splitting N over one shared x tile (MgpuConfig.split_warpgroups="n"; not
  a default until timed): 8192^2 at the benchmark's M, up to four warpgroups (the CPU
  interpreter tests stop at two).  ``run`` lowers the stages to what fits."""
  p = abstract_params(name, (8192, 8192))
  x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  assert "mosaic_gpu" in lower_for_h200(lambda p, x: mg.run(p, x, config=cfg), p, x)


@pytest.mark.parametrize("shape,tokens,topk", [((256, 7168, 512), 1024, 8),
                                               ((8, 4096, 28672), 1024, 2)])
def test_mgpu_grouped_shared_x_lowers_for_h200(shape, tokens, topk):
  """The grouped kernel's prefill tiles with four warpgroups sharing each x tile."""
  from humming_jax.kernels import grouped_wna16_mgpu as gm
  q = jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset("w4a16-g128-zp")),
                     jax.ShapeDtypeStruct(shape, jnp.float32))
  p = jax.eval_shape(gm.prepare, q)
  x = jax.ShapeDtypeStruct((tokens * topk, shape[1]), jnp.bfloat16)
  gs = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
  bm = gm.block_rows(tokens * topk, shape[0])
  cfg = mg.shared_x_config(bm)
  assert cfg.scale_after_mma == (bm <= 64) and cfg.split_warpgroups == "n"
  assert "mosaic_gpu" in lower_for_h200(lambda p, x, gs: gm.run(p, x, gs, config=cfg),
                                        p, x, gs)


@pytest.mark.parametrize("name", ["w4a16-g128-zp", "w4a16-mxfp4"])
@pytest.mark.parametrize("shape,tokens,rows", [((8, 4096, 28672), 1024, 144),
                                               ((8, 14336, 4096), 4096, 152)])
def test_mgpu_grouped_wide_tiles_lower_for_h200(name, shape, tokens, rows, monkeypatch):
  """Mixtral's capped experts on the 16-bit route past 128 rows (grouped_wna16_mgpu.
  wide_tiles): the default launch, four shared-x warpgroups with one accumulator."""
  from humming_jax.kernels import grouped_wna16_mgpu as gm
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "1")
  q = jax.eval_shape(lambda w: hj.quantize(w, hj.QuantSpec.preset(name)),
                     jax.ShapeDtypeStruct(shape, jnp.float32))
  p = jax.eval_shape(gm.prepare, q)
  x = jax.ShapeDtypeStruct((tokens * 2, shape[1]), jnp.bfloat16)
  gs = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
  assert gm.tile_rows(tokens * 2, shape[0], p) == rows
  assert "mosaic_gpu" in lower_for_h200(lambda p, x, gs: gm.run(p, x, gs), p, x, gs)


def test_mx_fold_prefill_lowers_for_h200():
  """The MXFP4 fold (wnam_mgpu.MX_FOLD_PREFILL, the default) at M = 4096, 8192^2: the
  per-call e4m3 fold and the per-channel fp8 Mosaic GEMM lower for the H200, alone and as
  run()'s route."""
  from humming_jax.kernels import wnam_mgpu
  p = abstract_params("w4a8-mxfp4", (8192, 8192))
  assert p.layout.startswith(wnam_mgpu.FAMILY)
  x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)
  assert "custom_call" in lower_for_h200(wnam_mgpu.run_prefill_mx_fold, p, x)
  text = lower_for_h200(wnam_mgpu.run, p, x)  # run()'s default route: the fold, no branch
  assert "custom_call" in text and "stablehlo.case" not in text
  assert "carrier_unpack_e2m1_pk" in text  # the fold on the Pallas-Triton unpack (":pk")
  assert "carrier_unpack_fold_metadata" in text  # its metadata kernel
  from humming_jax.kernels import carrier_unpack
  scales = jax.ShapeDtypeStruct((112 * 4, 4096), jnp.bfloat16)  # K = 14336: 7 chunks
  text = lower_for_h200(lambda s: carrier_unpack.fold_metadata(
      s, tiles=112, real_groups=448, pallas=True), scales)
  assert "carrier_unpack_fold_metadata" in text


def test_carrier_unpack_lowers_for_h200():
  """W4A8 fp8 prefill: the int4 -> e4m3 Pallas-Triton unpack of the permuted layout and the
  Mosaic GEMM lower; the unpack's three orders lower alone (e2m1 without the fold's shift
  too: it once negated a literal, which Triton's lowering refuses)."""
  from humming_jax.kernels import carrier_unpack, wnam_mgpu
  p = abstract_params("w4a8-fp8", (8192, 8192))
  assert ":pk" in p.layout
  x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)
  text = lower_for_h200(wnam_mgpu.run, p, x)
  assert "carrier_unpack_int_pk" in text and "mosaic_gpu" in text
  codes = jax.ShapeDtypeStruct((64, 8192, 128), jnp.int4)
  for kind, order in (("int", "k"), ("int", "pk"), ("e2m1", "pk"), ("e2m1", "p8"), ("e2m1", "k")):
    text = lower_for_h200(lambda c: carrier_unpack.unpack(c, kind=kind, order=order), codes)
    name = f"carrier_unpack_{kind}" + ("" if order == "k" else f"_{order}")
    assert set(re.findall(r"carrier_unpack_\w+", text)) == {name}, (kind, order)


@pytest.mark.parametrize("name", ["w8a8-fp8", "w8a8-int8", "w4a8-mxfp4"])
@pytest.mark.parametrize("k", [8192, 7168, 14336])
def test_act_prepass_lowers_for_h200(name, k):
  """The one-pass activation pre-pass (w8a8.FUSED_PREPASS, on by default) at the
  benchmark's prefill rows: K in 2048- and 1024-column chunks held in registers, and
  14336 (past MAX_HELD_K) read twice."""
  from humming_jax.kernels import act_prepass
  spec = hj.QuantSpec.preset(name)
  x = jax.ShapeDtypeStruct((4096, k), jnp.bfloat16)
  text = lower_for_h200(lambda x: act_prepass.quantize_rows(x, spec, rows=4096, kp=k), x)
  assert f"act_prepass_{spec.act_format.name}" in text


@pytest.mark.parametrize("name", ["w8a8-int8", "w4a8-mxfp4"])
@pytest.mark.parametrize("m,k", [(1, 8192), (16, 14336)])
def test_decode_fake_quant_lowers_for_h200(name, m, k):
  """The W4A8 decode's one-launch fake quantization (act_prepass.fake_quantize_rows), alone
  and in front of the WnA16 kernel on wnam_mgpu's decode route (the default); with
  wnam_mgpu.FAKE_QUANTIZE_X_BY_DEFAULT the kernel quantizes x itself at one token
  (wna16_mgpu.run's fake_quantize_x): no pre-pass."""
  from humming_jax.kernels import act_prepass, w8a8, wnam_mgpu
  spec = hj.QuantSpec.preset(name)
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  text = lower_for_h200(lambda x: act_prepass.fake_quantize_rows(x, spec), x)
  assert f"act_fake_quant_{spec.act_format.name}" in text
  p = abstract_params(name, (k, 4096), kernel=wnam_mgpu.FAMILY)
  text = lower_for_h200(wnam_mgpu.run, p, x)
  in_kernel = wnam_mgpu.FAKE_QUANTIZE_X_BY_DEFAULT and m <= w8a8.DECODE_QUANTIZE_X_MAX_M
  assert (f"act_fake_quant_{spec.act_format.name}" in text) != in_kernel
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("splits", [2, 8])
@pytest.mark.parametrize("m,k", [(1, 8192), (16, 14336)])
def test_split_decode_prepass_lowers_for_h200(splits, m, k):
  """The decode pre-pass with each row split over several programs (act_prepass.
  decode_splits): the W8A8 codes in the carrier and W4A8's fake quantization."""
  from humming_jax.kernels import act_prepass
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  spec = hj.QuantSpec.preset("w8a8-int8")
  fn = lambda x: act_prepass.decode_codes_rows(x, spec, codes_dtype=jnp.int8, splits=splits)
  text = lower_for_h200(fn, x)
  assert "act_decode_codes_int8" in text
  assert f"grid=({m}, {splits})" in str(jax.make_jaxpr(fn)(x))  # the grid lowered
  spec = hj.QuantSpec.preset("w4a8-mxfp4")
  text = lower_for_h200(lambda x: act_prepass.fake_quantize_rows(x, spec, splits=splits), x)
  assert "act_fake_quant_fp8_e4m3" in text


def test_prefill_with_the_one_pass_prepass_lowers_for_h200(monkeypatch):
  """The W4A8 MXFP4 prefill route with FUSED_PREPASS on (the kernel before the Mosaic
  GEMM)."""
  from humming_jax.kernels import w8a8, wnam_mgpu
  monkeypatch.setattr(w8a8, "FUSED_PREPASS", True)
  x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)
  p = abstract_params("w4a8-mxfp4", (8192, 8192))
  # A fresh function: jit's cache would return an earlier trace of wnam_mgpu.run (the
  # flag is read at trace time).
  text = lower_for_h200(lambda p, x: wnam_mgpu.run(p, x), p, x)
  assert "act_prepass_fp8_e4m3" in text and "carrier_unpack_e2m1" in text


@pytest.mark.parametrize("group,tokens", [(32, 1), (32, 64), (32, 1024), (64, 16), (128, 16),
                                          (128, 256)])
def test_fp8_mma_layouts_lower_for_h200(group, tokens, monkeypatch):
  """The grouped kernel on the fp8-MMA layout (":p8": e4m3 WGMMA operands from fp4 codes)
  lowers for the H200 for scale groups of 32 (one WGMMA per group partial) and 64 / 128
  (several per partial), at decode, 256 and 1024 tokens (DeepSeek-V3 gate_up, top-8), and
  with grid split-K and 128-row tiles on a Mixtral-like shape."""
  from humming_jax.kernels import grouped_wnam_mgpu as gw, wna16_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  spec = hj.QuantSpec("fp4_e2m1", "group", group, scale_dtype="e8m0", act="fp8_e4m3")
  for shape, rows, cfg in (((256, 7168, 512), tokens * 8, None),
                           ((8, 4096, 2048), 1024, None),
                           ((256, 7168, 512), 8, dataclasses.replace(
                               wna16_mgpu.heuristic(1, 512), split_k=2))):
    q = jax.eval_shape(lambda w: hj.quantize(w, spec), jax.ShapeDtypeStruct(shape, jnp.float32))
    p = jax.eval_shape(gw.prepare, q)
    assert "p8" in p.layout.split(":"), p.layout
    x = jax.ShapeDtypeStruct((rows, shape[1]), jnp.bfloat16)
    g = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
    text = lower_for_h200(lambda p, x, g, cfg=cfg: gw.run(p, x, g, config=cfg), p, x, g)
    assert "custom_call" in text


def test_dense_fp8_mma_lowers_for_h200(monkeypatch):
  """HUMMING_JAX_DENSE_FP8_MMA=1: dense W4A8 MXFP4 in the fp8-MMA layout at 8192^2 --
  the decode (M = 1, 16) on fp8 WGMMA and the fold's prefill (M = 4096) through the
  ":p8"-reading Pallas-Triton unpack -- lower for the H200."""
  from humming_jax.kernels import wnam_mgpu
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  p = abstract_params("w4a8-mxfp4", (8192, 8192))
  assert "p8" in p.layout.split(":"), p.layout
  run = lambda p, x: wnam_mgpu.run(p, x)  # fresh: a cached trace of run would hide a route
  for m in (1, 16):
    x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
    assert "custom_call" in lower_for_h200(run, p, x)
  x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16)
  text = lower_for_h200(run, p, x)
  assert "carrier_unpack_e2m1_p8" in text and "mosaic_gpu" in text


def test_fp8_fold_lowers_for_h200(monkeypatch):
  """HUMMING_JAX_FP8_FOLD=1 (the e8m0 group scales folded into the e4m3 operands, one
  partial per K tile): the grouped fp8 kernel at Mixtral gate_up, 1024 tokens (128-row
  tiles on two warpgroups) and DeepSeek-V3 gate_up at 16 tokens, and the dense ":p8"
  decode at M = 128, lower for the H200."""
  from humming_jax.kernels import grouped_wnam_mgpu as gw, mgpu_convert, wnam_mgpu
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.setenv("HUMMING_JAX_FP8_FOLD", "1")
  folded = []  # the folded conversion is what lowers (not the per-group partials)
  real = mgpu_convert.e2m1_to_e4m3_ptx
  monkeypatch.setattr(mgpu_convert, "e2m1_to_e4m3_ptx", lambda *a, **kw: (
      kw.get("scales") is not None and folded.append(kw["group_blocks"])) or real(*a, **kw))
  for shape, rows in (((8, 4096, 28672), 2048), ((256, 7168, 512), 128)):
    p = abstract_params("w4a8-mxfp4", shape, grouped=True, kernel=gw.FAMILY)
    assert "p8" in p.layout.split(":"), p.layout
    x = jax.ShapeDtypeStruct((rows, shape[1]), jnp.bfloat16)
    g = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
    before = len(folded)
    text = lower_for_h200(lambda p, x, g: gw.run(p, x, g), p, x, g)
    assert "custom_call" in text and len(folded) > before
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  p = abstract_params("w4a8-mxfp4", (8192, 8192))
  assert "p8" in p.layout.split(":"), p.layout
  x = jax.ShapeDtypeStruct((128, 8192), jnp.bfloat16)
  before = len(folded)
  assert "mosaic_gpu" in lower_for_h200(lambda p, x: wnam_mgpu.run(p, x), p, x)
  assert len(folded) > before and set(folded) == {1}  # groups of 32: one run per group


@pytest.mark.parametrize("cluster", ["2", "4"])
def test_clusters_lower_for_h200(cluster, monkeypatch, launched_clusters):
  """HUMMING_JAX_CLUSTER_N (x tiles multicast to clusters of column CTAs, Config.cluster_n)
  on the shared-x launches: the grouped fp8 kernel at Mixtral gate_up, 1024 tokens
  (128-row tiles on two warpgroups), the grouped 16-bit kernel at Mixtral down, 1024
  tokens (128-row tiles on four), and the dense kernel at M = 128 on an explicit shared-x
  config -- lower for the H200 with the cluster in the launch."""
  from humming_jax.kernels import grouped_wna16_mgpu as gm, grouped_wnam_mgpu as gw
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.setenv("HUMMING_JAX_CLUSTER_N", cluster)
  # the 16-bit kernel's 128-row tiles (wide tiles' 144 rows: 18 groups of 8, which a
  # cluster of 4 does not divide, so that launch runs unclustered)
  monkeypatch.setenv("HUMMING_JAX_WIDE_TILES", "0")
  clusters = launched_clusters
  want = (int(cluster), 1, 1)
  for name, family, shape, rows in (("w4a8-mxfp4", gw, (8, 4096, 28672), 2048),
                                    ("w4a16-mxfp4", gm, (8, 14336, 4096), 2048)):
    p = abstract_params(name, shape, grouped=True, kernel=family.FAMILY)
    x = jax.ShapeDtypeStruct((rows, shape[1]), jnp.bfloat16)
    g = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
    clusters.clear()
    text = lower_for_h200(lambda p, x, g, f=family: f.run(p, x, g), p, x, g)
    assert "custom_call" in text and clusters and set(clusters) == {want}, (name, clusters)
  p = abstract_params("w4a16-g128-zp", (8192, 8192))
  x = jax.ShapeDtypeStruct((128, 8192), jnp.bfloat16)
  cfg = dataclasses.replace(mg.shared_x_config(128, warpgroups=2), cluster_n=int(cluster))
  clusters.clear()
  assert "custom_call" in lower_for_h200(lambda p, x: mg.run(p, x, config=cfg), p, x)
  assert clusters and set(clusters) == {want}, clusters  # (traced twice)


@pytest.mark.parametrize("shape,rows,tile,wgs", [((8, 4096, 28672), 2048, 144, 4),
                                                 ((8, 14336, 4096), 8192, 152, 4),
                                                 ((128, 2048, 1536), 8192, 88, 2),
                                                 ((8, 14336, 4096), 128, 32, 4)])
def test_single_acc_tiles_lower_for_h200(shape, rows, tile, wgs, monkeypatch):
  """The one-accumulator fp8 tiles (Config.fp8_single_acc on shared-x warpgroups, the
  grouped heuristic's launch for tiles of 24+ rows of ":cf" weights) lower for the H200
  in the tiles grouped_wna16_mgpu.single_acc_tile_rows picks: Mixtral gate_up (1024
  tokens, 144 rows) and down (4096 tokens, 152; 64 tokens, 32: one wave, four
  warpgroups) and Qwen3-30B-A3B gate_up (1024 tokens, 88 rows on two warpgroups, session
  29).  (abstract params carry no values: the ":cf" mark an eager prepare would add is
  added by hand.)"""
  from humming_jax.kernels import grouped_wna16_mgpu as gm, grouped_wnam_mgpu as gw
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  p = abstract_params("w4a8-mxfp4", shape, grouped=True, kernel=gw.FAMILY)
  p = p.replace(layout=p.layout + ":cf")
  x = jax.ShapeDtypeStruct((rows, shape[1]), jnp.bfloat16)
  g = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
  seen, heuristic = [], gm.heuristic
  monkeypatch.setattr(gm, "heuristic", lambda *a, **k: seen.append(heuristic(*a, **k))
                      or seen[-1])
  assert "custom_call" in lower_for_h200(lambda p, x, g: gw.run(p, x, g), p, x, g)
  assert seen and all(c.fp8_single_acc and c.warpgroups == wgs
                      and c.block_m == max(64, tile) for c in seen), seen


@pytest.mark.parametrize("name,m", [("w4a16-g128-zp", 16), ("w4a16-nvfp4", 1),
                                    ("w8a16-fp8", 128), ("w4a8-mxfp4", 16)])
def test_dx_kernel_lowers_for_h200(name, m):
  """The backward's dy . W^T kernel (kernels/wna16_mgpu_dx.py) at 8192^2 on each
  code kind: int4 with zero points, fp4 with groups of 16 in the permuted order, fp8
  codes (two row blocks), and the W4A8 view of the layout."""
  from humming_jax.kernels import wna16_mgpu_dx
  p = abstract_params(name, (8192, 8192))
  dy = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
  text = lower_for_h200(lambda p, dy: wna16_mgpu_dx.run(p, dy), p, dy)
  assert f"wna16_mgpu_dx_b{p.spec.weight_bits}" in text


@pytest.mark.parametrize("name,shape,rows", [("w4a16-g128-zp", (128, 2048, 1536), 128),
                                             ("w4a16-mxfp4", (60, 2048, 1408), 2048),
                                             ("w4a16-nvfp4", (256, 7168, 512), 8),
                                             ("w4a8-mxfp4", (128, 768, 2048), 128)])
def test_grouped_dx_kernel_lowers_for_h200(name, shape, rows):
  """The MoE backward's dy . W_e^T kernel at Qwen3-30B-A3B gate_up (16 tokens, top-8), 60
  experts (not a power of two) at 2048 rows, DeepSeek-V3 gate_up at one token, and W4A8
  MXFP4 experts on their fp8-MMA layout (":p8") at Qwen3-30B-A3B down."""
  from humming_jax.kernels import wna16_mgpu_dx
  p = abstract_params(name, shape, grouped=True)
  dy = jax.ShapeDtypeStruct((rows, shape[2]), jnp.bfloat16)
  gs = jax.ShapeDtypeStruct((shape[0],), jnp.int32)
  text = lower_for_h200(lambda p, dy, gs: wna16_mgpu_dx.run(p, dy, gs), p, dy, gs)
  assert "grouped_wna16_mgpu_dx_b4" + ("_p8" if "mxfp4" in name and "a8" in name
                                       else "_pk") in text


@pytest.mark.parametrize("overlap,shared,stages4,fold12,barriers,converter", [
    ("1", "1", "0", "0", "1", "0"), ("1", "1", "1", "0", "1", "0"),
    ("1", "0", "0", "0", "1", "0"), ("0", "0", "0", "0", "1", "0"),
    ("1", "1", "1", "1", "0", "0"), ("1", "1", "1", "0", "0", "1"),
    ("1", "1", "1", "0", "0", "2")])
def test_e2m1_mma_prefill_lowers_for_h200(overlap, shared, stages4, fold12, barriers,
                                          converter, monkeypatch):
  """Session 60's in-GEMM MXFP4 conversion (wnam_mgpu.run_prefill_e2m1_mma) at 8192^2, M =
  1024, through Mosaic GPU for an H200: the PTX conversion, the stores of its (64, 128)
  WGMMA_8BIT arrays into the 128-byte-swizzled B tile, and the fp8 WGMMA on it inside the
  warp-specialized pipeline (the interpreter runs none of these); with the conversion
  beside the previous step's WGMMA (session 62's manual A-slot release), with the B tile
  shared by the two warpgroups (256 x 128 CTA tiles, e2m1_heuristic's default; with one
  output staging tile and four stages) or one each, and neither.  Session 64: fold_shift
  12 (bfloat16 exponents, no select) without Pallas' automatic barriers.  Session 66: the
  converter warpgroup (four warpgroups, the K loop by hand, setmaxnreg per warpgroup),
  and two of them (five)."""
  from humming_jax.kernels import wnam_mgpu
  monkeypatch.setenv("HUMMING_JAX_DENSE_FP8_MMA", "1")
  monkeypatch.setenv("HUMMING_JAX_E2M1_OVERLAP", overlap)
  monkeypatch.setenv("HUMMING_JAX_E2M1_SHARED", shared)
  monkeypatch.setenv("HUMMING_JAX_E2M1_STAGES4", stages4)
  monkeypatch.setenv("HUMMING_JAX_E2M1_FOLD12", fold12)
  monkeypatch.setenv("HUMMING_JAX_E2M1_AUTO_BARRIERS", barriers)
  monkeypatch.setenv("HUMMING_JAX_E2M1_CONVERTER", "1" if converter != "0" else "0")
  monkeypatch.setenv("HUMMING_JAX_E2M1_CONVERTERS", converter if converter != "0" else "1")
  assert wnam_mgpu.w8a8_mgpu.e2m1_fold_shift() == (12 if fold12 == "1" else 11)
  config = wnam_mgpu.w8a8_mgpu.e2m1_heuristic(1024, 8192)  # what the route below launches
  assert (config.e2m1_overlap, config.split_m) == (overlap == "1", shared == "1"), config
  assert config.epilogue_slots == (1 if stages4 == "1" else 2), config
  assert config.e2m1_auto_barriers == (barriers == "1"), config
  assert config.e2m1_converter == (converter != "0"), config
  assert config.e2m1_converters == (int(converter) or 1), config
  p = abstract_params("w4a8-mxfp4", (8192, 8192), kernel="wnam_mgpu")
  p = p.replace(layout=p.layout + ":cf")  # (prepare marks it only for concrete scales)
  assert wnam_mgpu.e2m1_mma_runs(p), p.layout
  x = jax.ShapeDtypeStruct((1024, 8192), jnp.bfloat16)
  text = lower_for_h200(lambda p, x: wnam_mgpu.run_prefill_e2m1_mma(p, x), p, x)
  assert text.count("mosaic_gpu") >= 1
