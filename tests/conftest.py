"""Shared test setup: GPU tests skip without a GPU; CPU tests run everywhere."""
import os

# The GPU interpreter runs each CTA / warpgroup as a thread whose jitted program blocks in
# callbacks (barrier waits, the thread map) on the XLA CPU client's thread pool, one
# thread per core by default.  On a 2-core machine two blocked callbacks can hold the
# whole pool while the program they wait for has no thread to run on: session 29's CI
# hung so in test_io (a warpgroup in a barrier wait, the thread-map callback waiting,
# two warpgroup programs inside their jitted calls; session 25 saw the same with
# clusters).  A larger pool (PJRT_NPROC, read when the CPU client starts) leaves threads
# for them; it changes no result.  Set before any backend starts.
os.environ.setdefault("PJRT_NPROC", "8")

import jax  # noqa: E402
import pytest

# Exact float32 matmuls in references on the CPU.
jax.config.update("jax_default_matmul_precision", "highest")

# The GPU interpreter's clusters (Config.cluster_n) can deadlock: on this 2-core machine
# test_fp8_cluster_interpret hung with every thread idle twice in session 25 (a full-file
# run, and a CI run with the CPU client's async dispatch off, which was tried as the fix
# and did not help) and once in session 24, while it passes in ~13 s otherwise.  The
# cluster interpreter tests run only with HUMMING_JAX_INTERPRET_CLUSTERS=1; the clusters
# stay covered by the H200 tests (test_cluster_gpu, test_cluster_dense_gpu) and the CPU
# lowering for the H200 (test_clusters_lower_for_h200).
interpret_clusters = pytest.mark.skipif(
    os.environ.get("HUMMING_JAX_INTERPRET_CLUSTERS") != "1",
    reason="the GPU interpreter's cluster barrier can deadlock (HUMMING_JAX_INTERPRET_"
           "CLUSTERS=1 runs it)")


def _has_gpu() -> bool:
  try:
    return jax.default_backend() == "gpu"
  except RuntimeError:
    return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
  if HAS_GPU:
    return
  skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the lent H200)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_host_tuning_cache(monkeypatch, tmp_path_factory):
  """Every test starts from an empty autotune cache: a host's own
  (~/.cache/humming_jax/tuning.json, e.g. after ``python -m humming_jax.autotune``)
  would change the default launches the tests check.  Tests that write a cache point
  HUMMING_JAX_TUNING_CACHE at their own file."""
  monkeypatch.setenv("HUMMING_JAX_TUNING_CACHE",
                     str(tmp_path_factory.getbasetemp() / "no-tuning-cache.json"))


def _record_launches(monkeypatch, pick):
  """``pick(keyword arguments)`` of every Mosaic GPU kernel launch from here on, in order;
  traced launches count (lowering included)."""
  from humming_jax.kernels import wna16_mgpu
  seen, real = [], wna16_mgpu.plgpu.kernel
  monkeypatch.setattr(wna16_mgpu.plgpu, "kernel", lambda *a, **kw: seen.append(pick(kw))
                      or real(*a, **kw))
  return seen


@pytest.fixture
def launched_clusters(monkeypatch):
  """The ``cluster`` argument of every Mosaic GPU kernel launch that wna16_mgpu.run builds
  from here on (None: no cluster), in order; traced launches count (lowering included)."""
  return _record_launches(monkeypatch, lambda kw: kw.get("cluster"))


@pytest.fixture
def mosaic_launches(monkeypatch):
  """The keyword arguments (``grid``, ``out_type``, ...) of every Mosaic GPU kernel
  launch from here on, in order."""
  return _record_launches(monkeypatch, dict)


@pytest.fixture
def grouped_launches(monkeypatch):
  """Every config ``grouped_wna16_mgpu.heuristic`` returns from here on, in order (the
  launch a grouped Mosaic call takes when no config is given)."""
  from humming_jax.kernels import grouped_wna16_mgpu
  seen, real = [], grouped_wna16_mgpu.heuristic
  monkeypatch.setattr(grouped_wna16_mgpu, "heuristic",
                      lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
  return seen
