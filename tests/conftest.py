"""Shared test setup: GPU tests skip without a GPU; CPU tests run everywhere."""
import os

import jax
import pytest

# Exact float32 matmuls in references on the CPU.
jax.config.update("jax_default_matmul_precision", "highest")


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
