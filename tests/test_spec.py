"""QuantSpec: presets, hashing/equality, the general constructor and its validation."""
import dataclasses

import pytest

import humming_jax as hj
from humming_jax.spec import PRESETS, QuantSpec

REQUIRED = ["w4a16-g128", "w4a16-g128-zp", "w4a16-ch", "w8a16", "w8a16-fp8", "w4a16-mxfp4",
            "w4a16-mxint4", "w4a16-nvfp4", "w8a8-int8", "w8a8-fp8", "w8a8-fp8-block",
            "w8a8-mxfp8", "w4a8-int8", "w4a8-fp8", "w4a8-mxfp4", "w4a4-nvfp4", "w4a4-mxfp4"]


def test_required_presets_exist_and_are_consistent():
  assert set(REQUIRED) <= set(PRESETS)
  for name in REQUIRED:
    spec = QuantSpec.preset(name)
    assert spec is PRESETS[name]
    wbits, abits = name.split("-")[0][1:].split("a")
    assert spec.weight_bits == int(wbits), name
    assert (spec.act_format.bits if spec.act else 16) == int(abits), name
    assert spec.name.startswith(f"w{wbits}a{abits}-")
  assert PRESETS["w4a16-mxfp4"].is_mx and PRESETS["w4a16-mxfp4"].group_size == 32
  nv = PRESETS["w4a16-nvfp4"]
  assert (nv.weight, nv.group_size, nv.scale_dtype, nv.global_scale) == (
      "fp4_e2m1", 16, "fp8_e4m3", True)
  blk = PRESETS["w8a8-fp8-block"]
  assert (blk.granularity, blk.group_size, blk.block_n, blk.act_group_size) == (
      "block", 128, 128, 128)


def test_frozen_hashable_and_normalised():
  a = QuantSpec(weight="e2m1", group_size=32, scale_dtype="e8m0")
  b = QuantSpec(weight="fp4_e2m1", group_size=32, scale_dtype="e8m0")
  assert a == b == PRESETS["w4a16-mxfp4"] and hash(a) == hash(b)
  assert len({a, b, PRESETS["w4a16-g128"]}) == 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.group_size = 64  # type: ignore[misc]
  # group_size is meaningless per channel: the default 128 normalises to the preset's 0.
  assert QuantSpec("int8", "channel") == PRESETS["w8a16"]
  assert QuantSpec("int4", "tensor").group_size == 0
  assert a.replace(group_size=64).group_size == 64 and a.group_size == 32


@pytest.mark.parametrize("bits", range(1, 9))
def test_constructor_expresses_every_int_width(bits):
  s = QuantSpec(f"int{bits}", "group", 64)
  assert s.weight_bits == bits and not s.zero_point
  u = QuantSpec(f"uint{bits}", "group", 32, zero_point=True)
  assert u.weight_format.kind == "uint" and u.name.endswith("-zp")


@pytest.mark.parametrize("w", ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2"])
def test_constructor_expresses_every_float(w):
  assert QuantSpec(w, "channel").weight == w


@pytest.mark.parametrize("kwargs,match", [
    (dict(weight="uint4", group_size=32, scale_dtype="e8m0", zero_point=True),
     "zero_point=True is not allowed with MX"),
    (dict(weight="uint4"), "weight='uint4' is unsigned: it needs zero_point=True"),
    (dict(weight="int4", zero_point=True), "zero_point=True needs an unsigned integer"),
    (dict(weight="fp8_e4m3", zero_point=True), "zero_point=True needs an unsigned integer"),
    (dict(weight="int8", granularity="channel", act="int4"),
     "act='int4' has 4 bits < weight 'int8' 8 bits"),
    (dict(weight="fp8_e4m3", granularity="channel", act="fp4_e2m1"), "4 bits < weight"),
    (dict(weight="fp4_e2m1", group_size=16, scale_dtype="fp8_e4m3"),
     "scale_dtype='fp8_e4m3' needs global_scale=True"),
    (dict(weight="fp4_e2m1", group_size=16, global_scale=True),
     "global_scale=True .* needs scale_dtype='fp8_e4m3'"),
    (dict(weight="uint4", zero_point=True, group_size=16, scale_dtype="fp8_e4m3",
          global_scale=True), "global_scale=True .* with zero_point=True"),
    (dict(weight="fp4_e2m1", granularity="channel", scale_dtype="e8m0"),
     "scale_dtype='e8m0' needs granularity='group'"),
    (dict(weight="e8m0"), "weight='e8m0' is a scale format"),
    (dict(weight="int9"), "weight='int9': unknown number format"),
    (dict(weight="int4", act="int3"), "act='int3'; activations quantize to"),
    (dict(weight="int4", act="fp9"), "act='fp9': unknown number format"),
    (dict(granularity="row"), "granularity='row'"),
    (dict(group_size=0), "group_size=0 must be a positive int"),
    (dict(group_size=100), "group_size=100 must be a multiple of 16"),
    (dict(granularity="block", group_size=128), "block_n=0 must be a positive int"),
    (dict(block_n=128), "block_n=128 is only meaningful with granularity='block'"),
    (dict(scale_dtype="float8"), "scale_dtype='float8'; expected one of"),
    (dict(act_static=True), "act_static=True needs an activation format"),
    (dict(act="int8", act_static=True), "act_static=True .* needs act_granularity='tensor'"),
    (dict(act="int8", act_granularity="group"), "act_group_size=0 must be a positive int"),
    (dict(act="int8", act_group_size=64), "act_group_size is only meaningful"),
    (dict(act="int8", act_granularity="row"), "act_granularity='row'"),
    (dict(act="int8", act_scale_dtype="int8"), "act_scale_dtype='int8'"),
    (dict(weight="fp4_e2m1", group_size=32, act="int8"), "integer tensor cores"),
    (dict(weight="fp4_e2m1", group_size=32, scale_dtype="e8m0", act="fp4_e2m1",
          act_granularity="group", act_group_size=32, act_scale_dtype="e8m0",
          act_mx_rounding="nearest"), "act_mx_rounding='nearest'; expected one of"),
    (dict(act="int8", act_mx_rounding="up"),
     "act_mx_rounding='up' chooses dynamic e8m0 activation scales; this spec has "
     "act_scale_dtype='float32'"),
    (dict(weight="uint4", zero_point=True, act="fp4_e2m1"), "no kernel path"),
    # values of the wrong type
    (dict(weight="uint4", zero_point="no"), "zero_point='no' must be True or False"),
    (dict(weight="uint4", zero_point=2), "zero_point=2 must be True or False"),
    (dict(weight="fp4_e2m1", group_size=16, scale_dtype="fp8_e4m3", global_scale="False"),
     "global_scale='False' must be True or False"),
    (dict(granularity="channel", group_size="x"), "group_size='x' must be an int"),
    (dict(group_size=True), "group_size=True must be an int"),
    (dict(group_size=128.0), "group_size=128.0 must be an int"),
])
def test_invalid_combinations_name_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    QuantSpec(**kwargs)


def test_unknown_preset():
  with pytest.raises(ValueError, match="unknown preset 'w3a16'; expected one of"):
    QuantSpec.preset("w3a16")
  with pytest.raises(ValueError, match="unknown preset"):
    hj.quantize(__import__("numpy").ones((32, 4), "float32"), "nope")


def test_numpy_scalars_normalise_to_python_values():
  """np.int64 group sizes and np.bool_ flags (read from a config with numpy) give the
  same spec as Python values: equal, equal hash, and a checkpoint can store it."""
  import json

  import numpy as np
  spec = QuantSpec("uint4", "group", np.int64(128), zero_point=np.bool_(True))
  assert spec == hj.QuantSpec.preset("w4a16-g128-zp")
  assert hash(spec) == hash(hj.QuantSpec.preset("w4a16-g128-zp"))
  assert type(spec.group_size) is int and type(spec.zero_point) is bool
  json.dumps(dataclasses.asdict(spec))
  assert QuantSpec("int8", "channel", np.int64(128)) == hj.QuantSpec.preset("w8a16")


def test_activation_fields_without_an_activation_format_reset():
  """act=None leaves the activation fields meaningless: they take their defaults, so the
  spec equals (and hashes as) its twin -- no recompile -- and replace(act=None) of an
  activation spec, or a checkpoint saved with such a spec, still works."""
  plain = QuantSpec("int4")
  for kwargs in (dict(act_group_size=32), dict(act_granularity="group"),
                 dict(act_scale_dtype="bfloat16")):
    spec = QuantSpec("int4", **kwargs)
    assert spec == plain and hash(spec) == hash(plain)
  block = hj.QuantSpec.preset("w8a8-fp8-block")
  assert block.replace(act=None) == block.weight_only()
  assert QuantSpec("uint4", zero_point=1) == QuantSpec("uint4", zero_point=True)
