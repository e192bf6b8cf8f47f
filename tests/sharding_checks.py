"""Multi-device checks of humming_jax.sharding, run in a subprocess with 8 host devices.

The pytest process has initialised jax with one CPU device; the device count is fixed at
backend start, so tests/test_sharding.py runs this file with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` and reads one JSON line per check.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=. python tests/sharding_checks.py [names]
"""
from __future__ import annotations

import json
import re
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

jax.config.update("jax_default_matmul_precision", "highest")

import humming_jax as hj  # noqa: E402
from humming_jax import sharding as hs  # noqa: E402
from humming_jax.kernels import registry  # noqa: E402

CHECKS = {}


def check(fn):
  CHECKS[fn.__name__] = fn
  return fn


def mesh_of(n: int, name: str = "x"):
  return jax.make_mesh((n,), (name,), devices=jax.devices()[:n])


def rand(seed, shape, scale=1.0):
  # NumPy's generator: jax.random.normal compiles once per shape (~0.25 s each here).
  x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * scale
  return jnp.asarray(x, jnp.float32)


def close(got, want, rtol=2e-6, what=""):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  assert np.all(np.isfinite(got)), f"{what}: non-finite output"
  err = float(np.max(np.abs(got - want)))
  bound = rtol * float(np.max(np.abs(want)))
  assert err <= bound, f"{what}: max abs err {err:.3g} > {bound:.3g} (rtol {rtol})"
  return err


def raises(exc, match, fn):
  """``fn()`` raises ``exc`` with a message matching ``match`` (pytest.raises, here)."""
  try:
    fn()
  except exc as e:
    assert re.search(match, str(e)), f"{type(e).__name__}({e}) does not match {match!r}"
    return str(e)
  raise AssertionError(f"no {exc.__name__} matching {match!r}")


REF = jax.jit(hj.quant_dense, static_argnames="backend")
PER_TENSOR = hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                          act_granularity="tensor")


def _sweep(kind: str):
  # TP 2/4/8 at M = 1 and M = 33 on a group-scaled int4 weight with bias.
  f = hs.column_parallel_dense if kind == "column" else hs.row_parallel_dense
  q = hj.quantize(rand(1, (1024, 256)), "w4a16-g128", bias=rand(2, (256,)))
  errs = {}
  for m in (1, 33):
    x = rand(3 + m, (m, 1024))
    want = REF(q, x)
    for s in (2, 4, 8):
      errs[f"M={m} tp={s}"] = close(f(q, x, axis="x", mesh=mesh_of(s)), want,
                                    what=f"{kind} M={m} tp={s}")
  return errs


@check
def tp_column():
  errs = _sweep("column")
  # Dynamic per-token activation scales: every device sees all of K, nothing to combine.
  q = hj.quantize(rand(5, (256, 256)), "w8a8-fp8", bias=rand(6, (256,)))
  x = rand(7, (17, 256))
  errs["w8a8-fp8 tp=8"] = close(hs.column_parallel_dense(q, x, axis="x", mesh=mesh_of(8)),
                                REF(q, x), what="column w8a8-fp8")
  return errs


@check
def tp_row():
  return _sweep("row")


@check
def tp_row_activation_quant():
  # Activation scales over a K shard: per-token / per-tensor / NVFP4 two-level need the
  # pmax'd global amax; per-K-group scales are local.  All must equal unsharded.
  per_tensor = hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                            act_granularity="tensor")
  # a per-tensor e8m0 scale with the producers' rounding (its sharded plan is "static")
  mx_up = hj.QuantSpec("fp8_e4m3", "channel", 0, scale_dtype="float32", act="fp8_e4m3",
                       act_granularity="tensor", act_scale_dtype="e8m0",
                       act_mx_rounding="up")
  errs = {}
  specs = {"w8a8-int8": "w8a8-int8", "w4a4-nvfp4": "w4a4-nvfp4", "w8a8-mxfp8": "w8a8-mxfp8",
           "int8-per-tensor": per_tensor, "fp8-per-tensor-e8m0-up": mx_up}
  for i, (name, spec) in enumerate(specs.items()):
    q = hj.quantize(rand(10 + i, (512, 256)), spec, bias=rand(20 + i, (256,)))
    x = rand(30 + i, (33, 512)) * jnp.linspace(0.1, 3.0, 512)  # amax lands in one shard
    errs[name] = close(hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(4)), REF(q, x),
                       what=f"row {name}")
  # NVFP4 with an inf in one token: that row is NaN, the others equal unsharded (the global
  # scale is taken over the finite blocks on every shard)
  q = hj.quantize(rand(11, (512, 256)), "w4a4-nvfp4", bias=rand(21, (256,)))
  x = (rand(31, (33, 512)) * jnp.linspace(0.1, 3.0, 512)).at[5, 300].set(jnp.inf)
  got = np.asarray(hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(4)), np.float32)
  want = np.asarray(REF(q, x), np.float32)
  assert np.isnan(got[5]).all() and np.isnan(want[5]).all(), "the inf row is not NaN"
  rows = np.r_[0:5, 6:33]
  errs["w4a4-nvfp4 inf token"] = close(got[rows], want[rows], what="row nvfp4 inf token")
  # The test can fail: per-shard (local) token scales give a visibly different result.
  q = hj.quantize(rand(10, (512, 256)), "w8a8-int8", bias=rand(20, (256,)))
  x = rand(30, (33, 512)) * jnp.linspace(0.1, 3.0, 512)
  local = sum(REF(hs.slice_weight(q, "k", i, 4).replace(bias=None), x[:, i * 128:(i + 1) * 128])
              for i in range(4)) + q.bias
  want = REF(q, x)
  gap = float(jnp.max(jnp.abs(local - want)))
  assert gap > 1e-3 * float(jnp.max(jnp.abs(want))), f"local scales too close: {gap}"
  errs["local-scale gap (expected large)"] = gap
  return errs


@check
def tp_row_block_scales():
  # 2-D block scales (128x128): K and N shards must hold whole blocks.
  q = hj.quantize(rand(1, (1024, 256)), "w8a8-fp8-block", bias=rand(2, (256,)))
  x = rand(3, (7, 1024))
  want = REF(q, x)
  close(hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(8)), want, what="row tp=8")
  close(hs.column_parallel_dense(q, x, axis="x", mesh=mesh_of(2)), want, what="col tp=2")


@check
def tp_bf16_and_batch_dims():
  # bf16 activations with leading batch dims; row-parallel sums fp32 partials then casts
  # once, so it may differ from unsharded only by summation order (< 1 bf16 ulp).
  q = hj.quantize(rand(5, (512, 384)), "w4a16-g128", bias=rand(6, (384,)))
  x = rand(7, (2, 3, 512)).astype(jnp.bfloat16)
  want = REF(q, x)
  for s in (4,):
    got = hs.column_parallel_dense(q, x, axis="x", mesh=mesh_of(s), gather_output=True)
    assert got.dtype == jnp.bfloat16 and got.shape == (2, 3, 384)
    close(got, want, rtol=2**-7, what=f"column bf16 tp={s}")
    got = hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(s))
    assert got.dtype == jnp.bfloat16 and got.shape == (2, 3, 384)
    close(got, want, rtol=2**-7, what=f"row bf16 tp={s}")
    # bf16 partials (the fast kernel path): each partial rounded once before the psum.
    got = hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(s), partial_dtype=None)
    assert got.dtype == jnp.bfloat16
    close(got, want, rtol=2**-5, what=f"row bf16 partials tp={s}")


@check
def tp_megatron_mlp_in_user_shard_map():
  # Column then row inside the user's own shard_map: the per-device bodies (mesh=None).
  k, hdim = 256, 512
  up = hj.quantize(rand(11, (k, hdim)), "w8a8-int8", bias=rand(12, (hdim,)))
  down = hj.quantize(rand(13, (hdim, k)), "w8a8-int8", bias=rand(14, (k,)))
  x = rand(15, (9, k))
  mesh = mesh_of(4)
  ups = hs.partition_specs(up, P(None, "x"), mesh=mesh)
  downs = hs.partition_specs(down, P("x", None), mesh=mesh)

  def body(u, d, xx):
    h = jax.nn.gelu(hs.column_parallel_dense(u, xx, axis="x"))
    return h, hs.row_parallel_dense(d, h, axis="x")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(ups, downs, P()),
                            out_specs=(P(None, "x"), P()), check_vma=False))
  placed = hs.shard_params({"u": up, "d": down}, {"u": P(None, "x"), "d": P("x", None)}, mesh)
  assert placed["u"].codes.sharding.spec == P(None, "x")
  h, y = f(placed["u"], placed["d"], x)
  close(h, jax.nn.gelu(REF(up, x)), rtol=5e-6, what="mlp hidden")
  # int8 activation rounding is discontinuous: compare the second layer on the same input.
  close(y, REF(down, h), rtol=5e-6, what="mlp out")


@check
def gspmd_jit_with_named_sharding():
  # Plain jax.jit(hj.quant_dense) on NamedSharding-placed params: GSPMD partitions the
  # reference path; and the shard_map wrappers accept placed params without resharding.
  q = hj.quantize(rand(21, (1024, 256)), "w4a16-g128", bias=rand(22, (256,)))
  x = rand(23, (16, 1024))
  want = REF(q, x)
  mesh = jax.make_mesh((2, 4), ("dp", "tp"), devices=jax.devices())
  for fspec in (P(None, "tp"), P("dp", "tp")):
    placed = hs.shard_params(q, fspec, mesh)
    got = jax.jit(hj.quant_dense)(placed, x)
    close(got, want, rtol=5e-6, what=f"gspmd {fspec}")
  placed = hs.shard_params(q, P("tp", None), mesh)
  xs = jax.device_put(x, NamedSharding(mesh, P("dp", "tp")))
  got = jax.jit(lambda p, xx: hs.row_parallel_dense(p, xx, axis="tp", mesh=mesh,
                                                    batch_axis="dp"))(placed, xs)
  assert got.sharding.spec[0] == "dp", got.sharding
  close(got, want, what="row with dp batch")


@check
def tp_interpret_backend():
  # The Pallas kernel (interpret mode) on each shard, where one is registered.
  q = hj.quantize(rand(31, (512, 256)), "w4a16-g128", bias=rand(32, (256,)))
  if registry.find(q.spec) is None:
    return "no Pallas kernel registered for w4a16-g128: interpret case not applicable"
  x = rand(33, (3, 512))
  want = REF(q, x, backend="interpret")
  close(hs.column_parallel_dense(q, x, axis="x", mesh=mesh_of(2), backend="interpret"),
        want, rtol=1e-5, what="column interpret")
  close(hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(2), backend="interpret"),
        want, rtol=1e-5, what="row interpret")
  close(want, REF(q, x), rtol=1e-2, what="interpret vs xla")


def mesh_dp_tp():
  return jax.make_mesh((2, 4), ("dp", "tp"), devices=jax.devices())


@check
def tp_batch_axis_tensor_act_scale():
  # Data parallel (batch_axis) with a dynamic tensor-level activation scale (per-tensor, and
  # NVFP4's fp32 factor): the scale spans the tokens of every batch shard, so the amax is
  # pmax-ed over the batch axis as well.  dp shard 0's tokens are 10x larger, so a
  # per-batch-shard scale is visibly off (~1e-2).
  mesh = mesh_dp_tp()
  errs = {}
  for i, spec in enumerate(["w4a4-nvfp4", PER_TENSOR]):
    name = spec if isinstance(spec, str) else "int8-per-tensor"
    q = hj.quantize(rand(40 + i, (512, 256)), spec, bias=rand(42 + i, (256,)))
    x = (rand(44 + i, (8, 512)) * jnp.linspace(0.1, 3.0, 512)).at[:4].multiply(10.0)
    want = REF(q, x)
    got = hs.column_parallel_dense(q, x, axis="tp", mesh=mesh, batch_axis="dp",
                                   gather_output=True)
    errs[f"{name} column"] = close(got, want, what=f"column dp {name}")
    got = hs.row_parallel_dense(q, x, axis="tp", mesh=mesh, batch_axis="dp")
    errs[f"{name} row"] = close(got, want, what=f"row dp {name}")
  # The per-device body in the caller's shard_map: batch_axis names its token axis.
  specs = hs.partition_specs(q, P("tp", None), mesh=mesh)
  f = jax.jit(jax.shard_map(
      lambda p, xx: hs.row_parallel_dense(p, xx, axis="tp", batch_axis="dp"), mesh=mesh,
      in_specs=(specs, P("dp", "tp")), out_specs=P("dp", None), check_vma=False))
  got = f(hs.shard_params(q, P("tp", None), mesh),
          jax.device_put(x, NamedSharding(mesh, P("dp", "tp"))))
  errs["int8-per-tensor row in shard_map"] = close(got, want, what="row dp shard_map")
  return errs


@check
def tp_nonfinite_activations():
  # A NaN or inf in x gives what unsharded gives: a dynamic per-tensor scale turns every
  # row NaN (on every K and batch shard, though XLA's CPU max drops NaN); per-token and
  # NVFP4 block scales only the row holding it.  x[5, 400]: dp shard 1, tp shard 3.
  mesh = mesh_dp_tp()
  errs = {}
  for i, spec in enumerate([PER_TENSOR, "w8a8-int8", "w4a4-nvfp4"]):
    name = spec if isinstance(spec, str) else "int8-per-tensor"
    q = hj.quantize(rand(50 + i, (512, 128)), spec, bias=rand(53 + i, (128,)))
    for bad in (jnp.nan, jnp.inf):
      x = rand(56 + i, (8, 512)).at[5, 400].set(bad)
      want = np.asarray(REF(q, x), np.float32)
      runs = {"row": lambda: hs.row_parallel_dense(q, x, axis="tp", mesh=mesh),
              "row dp": lambda: hs.row_parallel_dense(q, x, axis="tp", mesh=mesh,
                                                      batch_axis="dp"),
              "column dp": lambda: hs.column_parallel_dense(q, x, axis="tp", mesh=mesh,
                                                            batch_axis="dp",
                                                            gather_output=True)}
      for how, run in runs.items():
        got = np.asarray(run(), np.float32)
        what = f"{how} {name} x[5, 400]={bad}"
        nan_rows = np.isnan(got).any(1).tolist()
        assert nan_rows == np.isnan(want).any(1).tolist(), f"{what}: NaN rows {nan_rows}"
        fin = ~np.isnan(want).any(1)
        if fin.any():
          errs[what] = close(got[fin], want[fin], what=what)
  return errs


@check
def tp_quantize_params_float_spec_tree():
  # hj.quantize_params folds each quantized Dense's bias into its QuantizedWeight (the
  # sibling "bias" key goes); the float model's spec tree, bias specs included, still
  # places the tree.  A bias spec contradicting the kernel's N split is refused.
  params = {"mlp": {"up": {"kernel": rand(60, (256, 512)), "bias": rand(61, (512,))},
                    "down": {"kernel": rand(62, (512, 256)), "bias": rand(63, (256,))}},
            "norm": {"scale": jnp.ones((256,))}}
  fspecs = {"mlp": {"up": {"kernel": P(None, "x"), "bias": P("x")},
                    "down": {"kernel": P("x", None), "bias": P()}},
            "norm": {"scale": None}}
  qp = hj.quantize_params(params, "w4a16-all", progress=False)
  mesh = mesh_of(4)
  placed = hs.shard_params(qp, fspecs, mesh)
  up, down = placed["mlp"]["up"]["kernel"], placed["mlp"]["down"]["kernel"]
  assert up.bias.sharding.spec == P("x") and down.codes.sharding.spec == P("x", None)
  assert placed["norm"]["scale"].sharding.spec == P()
  x = rand(64, (5, 256))
  h = hs.column_parallel_dense(up, x, axis="x", mesh=mesh)
  want = REF(qp["mlp"]["down"]["kernel"], REF(qp["mlp"]["up"]["kernel"], x))
  close(hs.row_parallel_dense(down, h, axis="x", mesh=mesh), want, rtol=5e-6, what="mlp")
  # Spec trees without the folded biases' entries work as before.
  no_bias = {"mlp": {k: {"kernel": v["kernel"]} for k, v in fspecs["mlp"].items()},
             "norm": fspecs["norm"]}
  assert hs.partition_specs(qp, no_bias, mesh=mesh) == hs.partition_specs(qp, fspecs,
                                                                           mesh=mesh)
  bad = {**fspecs, "mlp": {**fspecs["mlp"], "up": {"kernel": P(None, "x"), "bias": P()}}}
  raises(ValueError, r"bias folded into params\['mlp'\]\['up'\]\['kernel'\].*P\('x',?\)",
         lambda: hs.partition_specs(qp, bad, mesh=mesh))


@check
def tp_scanned_layer_stacks():
  # quantize_params(scanned=) stacks: the float spec tree of the (layers, K, N) kernels
  # places them (layer axis whole), and a lax.scan over the layers inside shard_map runs
  # column- then row-parallel on one layer's shard per step, equal to the unsharded loop.
  layers = {"up": {"kernel": rand(70, (3, 256, 512)), "bias": rand(71, (3, 512))},
            "down": {"kernel": rand(72, (3, 512, 256))}}
  qp = hj.quantize_params({"layers": layers}, "w4a16-all", progress=False,
                          scanned=("layers",))["layers"]
  fspecs = {"up": {"kernel": P(None, None, "x"), "bias": P(None, "x")},
            "down": {"kernel": P(None, "x", None)}}
  mesh = mesh_of(4)
  specs = hs.partition_specs(qp, fspecs, mesh=mesh)
  assert specs["up"]["kernel"].codes == P(None, None, "x")
  assert specs["down"]["kernel"].codes == P(None, "x", None)
  placed = hs.shard_params(qp, fspecs, mesh)

  def body(h, layer):
    h = hs.column_parallel_dense(layer["up"]["kernel"], h, axis="x")
    return hs.row_parallel_dense(layer["down"]["kernel"], jnp.tanh(h), axis="x"), None

  run = jax.jit(jax.shard_map(lambda p, x: jax.lax.scan(body, x, p)[0], mesh=mesh,
                              in_specs=(specs, P()), out_specs=P(), check_vma=False))
  x = rand(73, (5, 256))
  want = x
  for i in range(3):
    one = jax.tree.map(lambda a: a[i], qp)
    want = REF(one["down"]["kernel"], jnp.tanh(REF(one["up"]["kernel"], want)))
  # fp32 partial sums in another order, through three layers whose activations grow to
  # ~1e3: ~3e-5 of the output's max (layers taken out of order differ by ~1.5x of it)
  close(run(placed, x), want, rtol=1e-4, what="scanned mlp")
  raises(ValueError, r"splits the layer axes \(3,\)",
         lambda: hs.partition_specs(qp, {"up": {"kernel": P("x")}, "down": fspecs["down"]},
                                    mesh=mesh))


@check
def tp_eager_calls_compile_once():
  # Repeated eager calls with the same configuration reuse one compiled program.
  compiles = []
  listener = lambda event, secs, **kw: compiles.append(event) if event.endswith(
      "/backend_compile_duration") else None
  q = hj.quantize(rand(65, (512, 128)), "w4a16-g128", bias=rand(66, (128,)))
  x = rand(67, (4, 512))
  gu, dn, xm, w, ids, _ = _moe_case(68, 4, e=8, h=128, i=128, k=2)
  calls = {
      "row": lambda: hs.row_parallel_dense(q, x, axis="x", mesh=mesh_of(4)),
      "column": lambda: hs.column_parallel_dense(q, x, axis="x", mesh=mesh_of(4)),
      "moe": lambda: hs.expert_parallel_moe(gu, dn, xm, w, ids, axis="x", mesh=mesh_of(4)),
  }
  counts = {}
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for name, call in calls.items():
      call().block_until_ready()  # the first call compiles
      compiles.clear()
      for _ in range(3):
        call().block_until_ready()
      counts[name] = len(compiles)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not any(counts.values()), f"compiles in 3 repeated eager calls: {counts}"
  return counts


@check
def tp_act_group_k_alignment():
  # Activation groups are quantized shard by shard, so a K shard holds whole ones too:
  # weight groups of 32 with activation groups of 128 cannot split K=256 four ways.
  spec = hj.QuantSpec("int8", "group", 32, scale_dtype="float32", act="int8",
                      act_granularity="group", act_group_size=128)
  mesh = mesh_of(4)
  q = hj.quantize(rand(70, (256, 128)), spec)
  msg = raises(ValueError, r"K/shards=64 .*act_group_size=128.*=128",
               lambda: hs.partition_specs({"w": q}, {"w": P("x", None)}, mesh=mesh))
  q = hj.quantize(rand(71, (512, 128)), spec)
  x = rand(72, (3, 512))
  close(hs.row_parallel_dense(q, x, axis="x", mesh=mesh), REF(q, x), what="act g128 tp=4")
  return msg


def _moe_case(seed, t, e=16, h=256, i=128, k=4, preset="w4a16-g128", dtype=jnp.float32):
  """Experts with skewed load: experts 0-2 favoured, expert 5 never picked, one invalid id."""
  from humming_jax import moe
  gu = hj.quantize(rand(seed, (e, h, 2 * i)), preset)
  dn = hj.quantize(rand(seed + 1, (e, i, h)), preset, bias=rand(seed + 2, (e, h)))
  x = rand(seed + 3, (t, h)).astype(dtype)
  logits = rand(seed + 4, (t, e)) + jnp.where(jnp.arange(e) < 3, 3.0, 0.0)
  w, ids = moe.topk_routing(logits.at[:, 5].set(-1e9), k)
  if t > 1:
    ids = ids.at[1, 0].set(-1)  # an invalid id contributes nothing
  want = jax.jit(moe.quant_moe, static_argnames=("backend",))(gu, dn, x, w, ids)
  return gu, dn, x, w, ids, want


@check
def ep_sweep():
  # EP 2/4/8: decode (T=1, replicated tokens, all_gather) and T=64 (sharded tokens,
  # all_to_all; all_gather + psum_scatter at 8).
  errs = {}
  small = _moe_case(40, 1)
  large = _moe_case(50, 64)
  for s in (2, 4, 8):
    mesh = mesh_of(s)
    gu, dn, x, w, ids, want = small
    got = hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh)
    errs[f"T=1 all_gather ep={s}"] = close(got, want, rtol=1e-6, what=f"T=1 ep={s}")
    gu, dn, x, w, ids, want = large
    got = hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh, dispatch="all_to_all")
    errs[f"T=64 all_to_all ep={s}"] = close(got, want, rtol=1e-6, what=f"a2a ep={s}")
  got = hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh_of(8),
                               tokens_sharded=True)
  errs["T=64 all_gather sharded ep=8"] = close(got, want, rtol=1e-6, what="ag sharded")
  return errs


@check
def ep_fp8_activations_bf16():
  # Per-token fp8 activation scales, bf16 tokens: one cast at the end (<= 1 bf16 ulp).
  gu, dn, x, w, ids, want = _moe_case(60, 32, preset="w8a8-fp8", dtype=jnp.bfloat16)
  got = hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh_of(4),
                               dispatch="all_to_all")
  assert got.dtype == jnp.bfloat16
  return close(got, want, rtol=2**-7, what="w8a8-fp8 bf16 ep=4")


@check
def ep_input_checks():
  # The token and id checks of hj.quant_moe: integer ids, H matching the experts, and
  # no tokens -> (0, H) zeros (not an einsum error from inside the shard).
  from humming_jax import moe
  gu, dn, x, w, ids, _ = _moe_case(80, 4, e=8, h=128, i=128, k=2)
  mesh = mesh_of(4)
  run = lambda xx, ww, ii, **kw: hs.expert_parallel_moe(gu, dn, xx, ww, ii, axis="x",
                                                         mesh=mesh, **kw)
  raises(ValueError, "topk_ids must be integer", lambda: run(x, w, ids.astype(jnp.float32)))
  raises(ValueError, r"x must be \(tokens, H=128\); got shape \(4, 256\)",
         lambda: run(rand(81, (4, 256)), w, ids))
  want = moe.quant_moe(gu, dn, x[:0], w[:0], ids[:0])
  for dispatch in ("all_gather", "all_to_all"):
    got = run(x[:0], w[:0], ids[:0], dispatch=dispatch)
    assert got.shape == want.shape == (0, 128) and got.dtype == want.dtype, (got, want)


def main(names):
  assert len(jax.devices()) == 8, f"expected 8 host devices, got {len(jax.devices())}"
  for name in names or CHECKS:
    t0 = time.perf_counter()
    try:
      info = CHECKS[name]()
      rec = {"name": name, "ok": True, "info": info}
    except Exception:  # report every check, keep going
      rec = {"name": name, "ok": False, "error": traceback.format_exc()}
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    print("CHECK " + json.dumps(rec, default=str), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
