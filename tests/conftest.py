"""Shared test setup: GPU tests skip without a GPU; CPU tests run everywhere."""
import os

import jax
import pytest

# Exact float32 matmuls in references on the CPU.
jax.config.update("jax_default_matmul_precision", "highest")
# The GPU interpreter runs each CTA / warpgroup of a launch as a Python thread that calls
# its own jitted program, and with async dispatch the CPU client runs those programs on
# its thread pool (one thread per core).  A cluster test on 2 cores then deadlocked now
# and then (session 25: test_fp8_cluster_interpret, all threads idle after 10 min): the
# outer program's thread-map callback held one pool thread waiting for the CTAs, one CTA
# held the other blocked on the cluster barrier, and the second CTA found no thread to
# run on.  Executed inline, each program runs on its own calling thread.
jax.config.update("jax_cpu_enable_async_dispatch", False)


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


@pytest.fixture
def launched_clusters(monkeypatch):
  """The ``cluster`` argument of every Mosaic GPU kernel launch that wna16_mgpu.run builds
  from here on (None: no cluster), in order; traced launches count (lowering included)."""
  from humming_jax.kernels import wna16_mgpu
  clusters, real = [], wna16_mgpu.plgpu.kernel
  monkeypatch.setattr(wna16_mgpu.plgpu, "kernel", lambda *a, **kw: clusters.append(
      kw.get("cluster")) or real(*a, **kw))
  return clusters
