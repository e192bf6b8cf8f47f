"""hj.save / hj.load: bit-exact round trip, read-only load, clear errors on bad files."""
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import humming_jax as hj

SPECS = ["w4a16-g128", "w4a16-g128-zp", "w4a16-mxfp4", "w4a4-nvfp4", "w8a8-fp8",
         "w8a8-fp8-block"]


def _tree():
  ks = jax.random.split(jax.random.key(7), 12)
  q = {name: hj.quantize(jax.random.normal(ks[i], (128, 128)), name,
                         bias=jax.random.normal(ks[i + 6], (128,)) if i % 2 else None)
       for i, name in enumerate(SPECS)}
  static = hj.QuantSpec("fp8_e4m3", "channel", 0, scale_dtype="float32", act="fp8_e4m3",
                        act_granularity="tensor", act_static=True)
  q["static"] = hj.quantize(jax.random.normal(ks[0], (64, 32)), static, act_scale=0.37)
  experts = hj.quantize(jax.random.normal(ks[1], (3, 128, 32)), "w4a16-g128")
  rng = np.random.default_rng(0)
  return {
      "q": q, "experts": [experts],
      "bf16": jax.random.normal(ks[2], (5, 7)).astype(jnp.bfloat16),
      "f8": np.asarray(rng.normal(size=(9,)), dtype=ml_dtypes.float8_e4m3fn),
      "i4": jnp.asarray(rng.integers(-8, 8, size=(6,)), jnp.int4),
      "f32": rng.normal(size=(2, 3)).astype(np.float32),
      "i64": np.arange(4, dtype=np.int64),
      "meta": ("tuple", 3, 2.5, True, None),
  }


def _bits(a):
  a = np.asarray(a)
  return a.dtype, a.shape, a.reshape(-1).view(np.uint8).tobytes()


def test_round_trip_is_bit_exact(tmp_path):
  tree = _tree()
  path = tmp_path / "ckpt.safetensors"
  hj.save(path, tree)
  back = hj.load(path)
  is_q = lambda x: isinstance(x, hj.QuantizedWeight)
  assert jax.tree.structure(back) == jax.tree.structure(tree)
  for (pa, a), (pb, b) in zip(jax.tree_util.tree_flatten_with_path(tree)[0],
                              jax.tree_util.tree_flatten_with_path(back)[0]):
    assert pa == pb
    if isinstance(a, (np.ndarray, jax.Array)):
      assert _bits(a) == _bits(b), pa
    else:
      assert a == b and type(a) is type(b), pa
  # Static aux data (spec, shape, layout) comes back equal.
  for qa, qb in zip(jax.tree.leaves(tree, is_leaf=is_q), jax.tree.leaves(back, is_leaf=is_q)):
    if is_q(qa):
      assert (qa.spec, qa.shape, qa.layout) == (qb.spec, qb.shape, qb.layout)
  # And the loaded weights compute exactly the same.
  x = jax.random.normal(jax.random.key(1), (4, 128))
  for name in ("w4a16-g128", "w4a16-g128-zp"):
    np.testing.assert_array_equal(hj.quant_dense(back["q"][name], x),
                                  hj.quant_dense(tree["q"][name], x))


def test_load_never_writes(tmp_path):
  path = tmp_path / "c.safetensors"
  hj.save(path, {"w": hj.quantize(jax.random.normal(jax.random.key(0), (128, 16)), "w8a16")})
  before = (sorted(os.listdir(tmp_path)), path.read_bytes(), os.stat(path).st_mtime_ns)
  os.chmod(path, 0o444)
  hj.load(path)
  assert (sorted(os.listdir(tmp_path)), path.read_bytes(), os.stat(path).st_mtime_ns) == before


def test_truncated_foreign_and_garbage_files_are_clear_errors(tmp_path):
  path = tmp_path / "c.safetensors"
  hj.save(path, {"w": jax.random.normal(jax.random.key(0), (64, 64))})
  data = path.read_bytes()
  cut = tmp_path / "cut.safetensors"
  cut.write_bytes(data[: len(data) - 100])
  with pytest.raises(ValueError, match="truncated"):
    hj.load(cut)
  cut.write_bytes(data[:20])
  with pytest.raises(ValueError, match="truncated|not a safetensors"):
    hj.load(cut)
  from safetensors.numpy import save_file
  foreign = tmp_path / "foreign.safetensors"
  save_file({"w": np.ones((2, 2), np.float32)}, str(foreign))
  with pytest.raises(ValueError, match="without humming_jax metadata"):
    hj.load(foreign)
  garbage = tmp_path / "g.bin"
  garbage.write_bytes(os.urandom(64))
  with pytest.raises(ValueError, match="safetensors"):
    hj.load(garbage)
  with pytest.raises(ValueError, match="no such checkpoint"):
    hj.load(tmp_path / "missing.safetensors")


def test_unsupported_leaf_is_a_type_error(tmp_path):
  with pytest.raises(TypeError, match="at /x"):
    hj.save(tmp_path / "c.safetensors", {"x": object()})
  assert not os.listdir(tmp_path)


def test_version_1_files_load_except_prepared_fp8_mma_words(tmp_path, monkeypatch):
  """Version 1 files (before the ':p8' words changed in session 27) still load, but a
  prepared ':p8' QuantizedWeight in one is refused by name rather than decoded wrongly;
  the same tree saved by this version loads."""
  from humming_jax import io as hio
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  q = hj.quantize(jax.random.normal(jax.random.key(3), (2, 256, 128)) / 16, "w4a8-mxfp4")
  p8 = hj.prepare(q, grouped=True, kernel="grouped_wnam_mgpu")
  assert "p8" in p8.layout.split(":"), p8.layout
  monkeypatch.setattr(hio, "VERSION", 1)
  hj.save(str(tmp_path / "plain.safetensors"), {"q": q})
  hj.save(str(tmp_path / "p8.safetensors"), {"p8": p8})
  monkeypatch.setattr(hio, "VERSION", 2)
  back = hj.load(str(tmp_path / "plain.safetensors"))["q"]
  np.testing.assert_array_equal(np.asarray(back.codes), np.asarray(q.codes))
  with pytest.raises(ValueError, match="version 1.*':p8'.*prepare them again"):
    hj.load(str(tmp_path / "p8.safetensors"))
  hj.save(str(tmp_path / "p8_v2.safetensors"), {"p8": p8})
  again = hj.load(str(tmp_path / "p8_v2.safetensors"))["p8"]
  assert again.layout == p8.layout
  np.testing.assert_array_equal(np.asarray(again.codes, np.int8), np.asarray(p8.codes, np.int8))


def test_version_2_files_load_without_the_fold_base(tmp_path, monkeypatch, grouped_launches):
  """Version 3 stores a prepared ':cf' layout's ``fold_base`` (bit-exact round trip); a
  tree without one is still written as version 2 (older releases read it).  A version-2
  file of a ':cf' layout (its QuantizedWeight entry lacks the leaf) loads with it None and
  the same layout, and computes the same on the one-accumulator route (the kernel then
  derives the base per call)."""
  import json
  from humming_jax import io as hio
  from humming_jax.checkpoints._io import SafetensorsFile
  monkeypatch.delenv("HUMMING_JAX_FP8_MMA", raising=False)
  monkeypatch.delenv("HUMMING_JAX_FP8_SINGLE_ACC", raising=False)
  version = lambda name: json.loads(SafetensorsFile(str(tmp_path / name)).metadata[
      "humming_jax"])
  q = hj.quantize(jax.random.normal(jax.random.key(4), (2, 256, 128)) / 16, "w4a8-mxfp4")
  p = hj.prepare(q, grouped=True, kernel="grouped_wnam_mgpu")
  assert p.layout.endswith(":cf") and p.fold_base is not None, p.layout
  hj.save(str(tmp_path / "v3.safetensors"), {"p": p})
  hj.save(str(tmp_path / "canonical.safetensors"), {"q": q})
  assert version("v3.safetensors")["version"] == 3
  assert version("canonical.safetensors")["version"] == 2
  back = hj.load(str(tmp_path / "v3.safetensors"))["p"]
  assert back.layout == p.layout and _bits(back.fold_base) == _bits(p.fold_base)
  with monkeypatch.context() as m:  # a version-2 writer: no fold_base entry at all
    m.setattr(hio, "VERSION", 2)
    m.setattr(hj.QuantizedWeight, "_LEAVES", tuple(  # (nor the later input_perm)
        f for f in hj.QuantizedWeight._LEAVES if f not in ("fold_base", "input_perm")))
    hj.save(str(tmp_path / "v2.safetensors"), {"p": p})
  doc = version("v2.safetensors")
  assert doc["version"] == 2
  assert "fold_base" not in doc["tree"]["dict"]["p"]["quantized"]["leaves"]
  old = hj.load(str(tmp_path / "v2.safetensors"))["p"]
  assert old.fold_base is None and old.layout == p.layout
  x = jax.random.normal(jax.random.key(5), (200, 256)).astype(jnp.bfloat16)
  g = jnp.asarray([90, 110], jnp.int32)
  seen = grouped_launches
  run = jax.jit(lambda p, x: hj.quant_ragged_dot(p, x, g, backend="interpret"))
  y_old, y_new = run(old, x), run(back, x)
  assert seen and all(c.fp8_single_acc for c in seen), seen  # the route that reads the base
  np.testing.assert_array_equal(np.asarray(y_old, np.float32), np.asarray(y_new, np.float32))


def _rewrite_metadata(src, dst, edit):
  """``src`` saved again as ``dst`` with ``edit(doc)`` applied to its humming_jax
  document: a checkpoint whose metadata someone changed."""
  import json
  from safetensors import safe_open
  from safetensors.numpy import save_file
  with safe_open(str(src), framework="numpy") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
    doc = json.loads(f.metadata()["humming_jax"])
  edit(doc)
  save_file(tensors, str(dst), metadata={"humming_jax": json.dumps(doc)})


@pytest.mark.parametrize("edit,match", [
    (lambda e: e["spec"].update(group_size=64), r"scales bfloat16\[2, 128\]: expected "
                                                r"shape \[4, 128\]"),
    (lambda e: e["spec"].update(weight="int2"), r"codes.shape=\(32, 128\): expected "
                                                r"\(\.\.\., 16, 128\)"),
    (lambda e: e["spec"].update(weight="uint4", zero_point=True), "zeros is missing"),
    (lambda e: e["spec"].update(scale_dtype="e8m0"), r"scales bfloat16.*of uint8"),
    (lambda e: e.update(shape=[3, 256, 128]), r"codes uint32\[32, 128\]: expected .*E=3, "),
    (lambda e: e["leaves"].update(foo=None), r"stores leaves .*'foo'"),
    (lambda e: e["leaves"].pop("codes"), "expected codes, scales"),
])
def test_metadata_that_does_not_match_the_arrays_is_refused(tmp_path, edit, match):
  """A checkpoint whose stored spec, shape or leaves do not match its arrays is refused
  by name with the file and the weight's path (it loaded before, and each backend then
  computed its own wrong answer: the reference read the group size off the scales' shape,
  the kernels off the spec)."""
  q = hj.quantize(jax.random.normal(jax.random.key(1), (256, 128)), "w4a16-g128")
  hj.save(tmp_path / "ok.safetensors", {"layer": q})
  _rewrite_metadata(tmp_path / "ok.safetensors", tmp_path / "bad.safetensors",
                    lambda doc: edit(doc["tree"]["dict"]["layer"]["quantized"]))
  before = (tmp_path / "bad.safetensors").read_bytes()
  with pytest.raises(ValueError, match=match) as e:
    hj.load(tmp_path / "bad.safetensors")
  assert str(tmp_path / "bad.safetensors") in str(e.value) and "/layer" in str(e.value)
  assert (tmp_path / "bad.safetensors").read_bytes() == before


def test_damaged_entries_are_value_errors_naming_the_file(tmp_path):
  """Tree entries of the wrong JSON type are damaged metadata (a ValueError naming the
  file), not an AttributeError / TypeError from deep inside the decoder."""
  hj.save(tmp_path / "ok.safetensors", {"a": {"b": jnp.ones(3)}})
  _rewrite_metadata(tmp_path / "ok.safetensors", tmp_path / "bad.safetensors",
                    lambda doc: doc["tree"].update(dict=[["a", 1]]))
  with pytest.raises(ValueError, match="bad.safetensors: damaged humming_jax metadata"):
    hj.load(tmp_path / "bad.safetensors")


def test_save_file_mode_and_failed_rename(tmp_path):
  """A checkpoint gets the mode of any new file (0666 less the umask; safetensors alone
  makes it 0600), and a save whose rename fails (the path is a directory) leaves no
  temporary file behind."""
  mask = os.umask(0o022)
  try:
    hj.save(tmp_path / "c.safetensors", {"x": jnp.ones(3)})
  finally:
    os.umask(mask)
  assert os.stat(tmp_path / "c.safetensors").st_mode & 0o777 == 0o644
  (tmp_path / "d").mkdir()
  with pytest.raises(OSError):
    hj.save(tmp_path / "d", {"x": jnp.ones(3)})
  assert sorted(os.listdir(tmp_path)) == ["c.safetensors", "d"]
