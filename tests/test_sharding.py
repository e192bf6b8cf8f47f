"""humming_jax.sharding: partition specs, shard slicing, TP dense and EP MoE.

Spec derivation, alignment errors and shard slicing run in-process (an AbstractMesh needs no
devices).  The multi-device checks need 8 host devices, which must be requested before jax
starts its backend: they run once, in a subprocess (tests/sharding_checks.py) with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, and are reported one test each.
"""
import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

import humming_jax as hj
from humming_jax import sharding as hs

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import sharding_checks  # noqa: E402

MESH8 = AbstractMesh((2, 4), ("dp", "tp"))


def rand(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


# ----------------------------------------------------------------------------------------
# partition_specs
# ----------------------------------------------------------------------------------------
def test_partition_specs_tree():
  tree = {
      "attn": {"q": hj.quantize(rand(0, (256, 128)), "w4a16-g128-zp", bias=rand(1, (128,))),
               "o": hj.quantize(rand(2, (128, 256)), "w4a16-ch")},
      "moe": hj.quantize(rand(3, (4, 256, 64)), "w4a16-nvfp4", bias=rand(4, (4, 64))),
      "norm": rand(5, (256,)),
  }
  fspecs = {"attn": {"q": P(None, "tp"), "o": P("tp", None)}, "moe": P("tp", None, None),
            "norm": None}
  out = hs.partition_specs(tree, fspecs, mesh=MESH8)
  q, o, moe = out["attn"]["q"], out["attn"]["o"], out["moe"]
  assert isinstance(q, hj.QuantizedWeight) and q.spec == tree["attn"]["q"].spec
  assert (q.codes, q.scales, q.zeros, q.bias) == (P(None, "tp"),) * 3 + (P("tp"),)
  # Per-channel scales: one row covers all of K -> replicated along K.
  assert (o.codes, o.scales, o.bias) == (P("tp", None), P(None, None), None)
  assert (moe.codes, moe.scales, moe.global_scale, moe.bias) == (
      P("tp", None, None), P("tp", None, None), P("tp"), P("tp", None))
  assert out["norm"] == P()
  # The spec tree matches the params tree leaf for leaf (usable as in_specs / shardings).
  assert (jax.tree.structure(tree, is_leaf=lambda x: x is None) ==
          jax.tree.structure(out, is_leaf=lambda x: isinstance(x, P) or x is None))


def test_partition_specs_group_k_split_and_tensor_scale():
  q = hj.quantize(rand(6, (512, 256)), "w4a16-g128", bias=rand(7, (256,)))
  s = hs.weight_partition_spec(q, P("tp", "dp"), mesh=MESH8)
  assert (s.codes, s.scales, s.bias) == (P("tp", "dp"), P("tp", "dp"), P("dp"))
  t = hj.quantize(rand(8, (256, 64)), hj.QuantSpec("int8", "tensor", 0))
  st = hs.weight_partition_spec(t, P("tp", "dp"), mesh=MESH8)
  assert st.scales == P(None, None) and st.codes == P("tp", "dp")


@pytest.mark.parametrize("preset, shape, fspec, match", [
    # K/shards = 64 rows: not whole 128-row scale groups.
    ("w4a16-g128", (256, 64), P("tp", None), r"K=256 .* 4 shards .*K/shards=64.*lcm.*128"),
    # Per-channel: K/shards = 16 is not whole 32-code packing chunks.
    ("w4a16-ch", (64, 64), P("tp", None), r"K=64 .*K/shards=16.*32"),
    ("w4a16-g128", (512, 6), P(None, "tp"), r"N=6 is not divisible by 4"),
    # 2-D 128x128 blocks: N/shards = 64 straddles a block.
    ("w8a8-fp8-block", (256, 256), P(None, "tp"), r"N/shards=64.*block_n=128"),
    ("w4a16-g128", (128, 64), P("pp", None), r"mesh axis 'pp' is not in the mesh"),
])
def test_misaligned_split_is_refused(preset, shape, fspec, match):
  q = hj.quantize(rand(9, shape), preset)
  with pytest.raises(ValueError, match=match):
    hs.partition_specs({"w": q}, {"w": fspec}, mesh=MESH8)


def test_misaligned_experts_and_bad_specs():
  q = hj.quantize(rand(10, (6, 128, 64)), "w4a16-g128")
  with pytest.raises(ValueError, match=r"E=6 experts .* 4 shards"):
    hs.partition_specs(q, P("tp", None, None), mesh=MESH8)
  with pytest.raises(ValueError, match="4 entries"):
    hs.partition_specs(q, P(None, None, None, "tp"))
  with pytest.raises(TypeError, match="PartitionSpec"):
    hs.partition_specs({"w": q}, {"w": ("tp", None)})
  with pytest.raises(ValueError, match="kernel layout"):
    hs.weight_partition_spec(q.replace(layout="wna16"), P())


# ----------------------------------------------------------------------------------------
# Shard slicing
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["w4a16-g128-zp", "w4a16-nvfp4", "w8a8-fp8-block",
                                    "w4a16-ch"])
def test_slice_weight_is_a_valid_local_weight(preset):
  # A 3-bit weight straddles uint32 words: the K slice must still take whole chunks.
  q = hj.quantize(rand(11, (512, 256)), preset, bias=rand(12, (256,)))
  full = np.asarray(hj.dequantize(q))
  for dim, n in (("k", 4), ("n", 2)):
    for i in range(n):
      part = hs.slice_weight(q, dim, i, n)
      ks, ns = (512 // n, 256) if dim == "k" else (512, 256 // n)
      assert part.shape == (ks, ns)
      want = full[i * ks:(i + 1) * ks] if dim == "k" else full[:, i * ns:(i + 1) * ns]
      np.testing.assert_array_equal(np.asarray(hj.dequantize(part)), want)
      # Shape inference from the leaves alone (what shard_map hands a device).
      assert hs.local_weight(part.replace(shape=q.shape)).shape == (ks, ns)


def test_slice_weight_odd_bits_and_experts():
  spec = hj.QuantSpec("int3", "group", 32, scale_dtype="float32")
  q = hj.quantize(rand(13, (3, 256, 64)), spec, bias=rand(14, (3, 64)))
  full = np.asarray(hj.dequantize(q))
  for i in range(4):
    part = hs.slice_weight(q, "k", i, 4)
    np.testing.assert_array_equal(np.asarray(hj.dequantize(part)), full[:, i * 64:(i + 1) * 64])
  e = hs.slice_weight(q, "e", 1, 3)
  assert e.shape == (1, 256, 64) and e.bias.shape == (1, 64)
  np.testing.assert_array_equal(np.asarray(hj.dequantize(e)), full[1:2])
  with pytest.raises(ValueError, match="index=3 is out of range"):
    hs.slice_weight(q, "k", 3, 3)
  with pytest.raises(ValueError, match="dim='e' needs stacked experts"):
    hs.slice_weight(hj.quantize(rand(15, (64, 64)), spec), "e", 0, 2)


# ----------------------------------------------------------------------------------------
# Multi-device checks (subprocess with 8 host devices)
# ----------------------------------------------------------------------------------------
# The checks run in two subprocesses of about equal cost: the TP checks, and the EP checks
# with the TP checks named in WITH_EP (session 45, per-check seconds of one warm local
# run, summed: 17.7 s and 17.0 s; the TP group alone had grown to 21 s against 12).
# Under pytest-xdist every worker that reaches these tests would otherwise start its own
# subprocess (the fixture is per worker): each worker claims the groups no one has claimed
# yet (an exclusive file create in the run's shared temp dir), runs them, writes their
# results there, then reads every group's results, so each check runs once per pytest run.
WITH_EP = ("tp_nonfinite_activations", "tp_scanned_layer_stacks")
_SECOND = lambda n: n.startswith("ep_") or n in WITH_EP
CHECK_GROUPS = (tuple(n for n in sharding_checks.CHECKS if not _SECOND(n)),
                tuple(n for n in sharding_checks.CHECKS if _SECOND(n)))
assert sorted(sum(CHECK_GROUPS, ())) == sorted(sharding_checks.CHECKS)


def _run_checks(names) -> dict:
  env = dict(os.environ)
  # --xla_backend_optimization_level=0: LLVM's codegen optimizations off (about 25% of
  # this subprocess is XLA compiling ~100 small programs); the programs and their float
  # semantics are the same, and every check compares against an unsharded run compiled
  # the same way.
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                      " --xla_backend_optimization_level=0").strip()
  env["JAX_PLATFORMS"] = "cpu"
  # No persistent compilation cache (make test sets one): tp_eager_calls_compile_once counts
  # backend compiles, and a cache hit would hide a recompile from it.
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  root = HERE.parent
  env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  try:
    proc = subprocess.run([sys.executable, str(HERE / "sharding_checks.py"), *names], env=env,
                          capture_output=True, text=True, timeout=600, cwd=root)
  except Exception as e:  # a timeout: the waiting workers must still get an answer
    return {"__failure__": f"sharding_checks.py {' '.join(names)} failed: {e!r}"}
  results = {}
  for line in proc.stdout.splitlines():
    if line.startswith("CHECK "):
      rec = json.loads(line[6:])
      results[rec["name"]] = rec
  if not results:
    results["__failure__"] = (f"sharding_checks.py {' '.join(names)} produced no results "
                              f"(rc={proc.returncode}):\n{proc.stderr[-4000:]}")
  return results


@pytest.fixture(scope="module")
def device_checks(tmp_path_factory):
  shared = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    shared = shared.parent  # the run's temp dir, common to all workers
  shared = shared / "sharding_checks"
  shared.mkdir(exist_ok=True)
  for i, names in enumerate(CHECK_GROUPS):
    try:
      os.close(os.open(shared / f"group{i}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
      continue  # another worker runs (or ran) this group
    tmp = shared / f"group{i}.json.tmp"
    tmp.write_text(json.dumps(_run_checks(names)))
    os.replace(tmp, shared / f"group{i}.json")
  results = {}
  deadline = time.monotonic() + 900
  for i in range(len(CHECK_GROUPS)):
    path = shared / f"group{i}.json"
    while not path.exists():
      if time.monotonic() > deadline:
        pytest.fail(f"no results for the checks {CHECK_GROUPS[i]} (its worker died?)")
      time.sleep(0.2)
    group = json.loads(path.read_text())
    if "__failure__" in group:
      pytest.fail(group["__failure__"])
    results.update(group)
  return results


@pytest.mark.parametrize("name", list(sharding_checks.CHECKS))
def test_on_8_devices(device_checks, name):
  rec = device_checks.get(name)
  assert rec is not None, f"check {name} did not report (subprocess crashed?)"
  assert rec["ok"], rec["error"]


def test_expert_parallel_refusals():
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))  # one device: checks before compute
  gu = hj.quantize(rand(20, (4, 128, 64)), "w4a16-g128")
  dn = hj.quantize(rand(21, (4, 32, 128)), "w4a16-ch")
  x, w, ids = rand(22, (3, 128)), jnp.ones((3, 2)), jnp.zeros((3, 2), jnp.int32)
  tensor_act = hj.QuantSpec("int8", "channel", 0, scale_dtype="float32", act="int8",
                            act_granularity="tensor")
  bad = hj.quantize(rand(23, (4, 128, 64)), tensor_act)
  with pytest.raises(ValueError, match="tensor-level activation scale"):
    hs.expert_parallel_moe(bad, dn, x, w, ids, axis="x", mesh=mesh)
  with pytest.raises(ValueError, match="all_to_all' needs tokens sharded"):
    hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh, dispatch="all_to_all",
                           tokens_sharded=False)
  with pytest.raises(ValueError, match="dispatch='ring'"):
    hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh, dispatch="ring")
  with pytest.raises(ValueError, match="E=4 experts .* 8 shards"):
    hs.expert_parallel_moe(gu, dn, x, w, ids, axis="tp", mesh=AbstractMesh((8,), ("tp",)))
  with pytest.raises(TypeError, match="stacked-expert"):
    hs.expert_parallel_moe(hj.quantize(rand(24, (128, 64)), "w4a16-g128"), dn, x, w, ids,
                           axis="x", mesh=mesh)
  # A single device is still a valid (trivial) expert-parallel mesh: equals quant_moe.
  from humming_jax import moe
  ids = jnp.array([[0, 3], [2, 2], [1, 0]], jnp.int32)
  w = jax.nn.softmax(rand(25, (3, 2)), axis=-1)
  np.testing.assert_allclose(
      np.asarray(hs.expert_parallel_moe(gu, dn, x, w, ids, axis="x", mesh=mesh)),
      np.asarray(moe.quant_moe(gu, dn, x, w, ids)), rtol=1e-5, atol=1e-4)
