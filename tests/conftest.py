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

# Without a GPU: LLVM's codegen optimizations off for the CPU programs (as in
# tests/sharding_checks.py).  Most of a CPU run is XLA compiling thousands of small
# programs (the interpreter's included); at -O0 the suite takes ~20% less CPU time on CI's
# 2 cores, with the same HLO and float semantics.  Left alone on a GPU host (its kernels'
# own codegen) and where XLA_FLAGS already sets the level.
if (not any(os.path.exists(f"/dev/nvidia{i}") for i in range(16))
    and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_backend_optimization_level=0").strip()

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


# The slowest CPU tests (~7-30 s each on CI's 2 cores), run first.  pytest-xdist's default
# (load) scheduling hands tests out in collection order, so a slow test collected late can
# end the run on one worker while the other idles; begun first, the short tests after them
# even out the two workers' ends.  Node id prefixes, slowest first.
SLOW_FIRST = (
    "tests/test_sharding.py::test_on_8_devices",  # the 8-device subprocesses (~30 s)
    "tests/test_wna16_mgpu_dx.py::test_w4a8_mxfp4_moe_backward_on_the_fp8_mma_layout",
    "tests/test_moe.py::test_quant_moe_w4a8_",
    "tests/test_wnam_mgpu.py::test_mx_fold_scale_span_bound",
    "tests/test_wnam_mgpu.py::test_dense_fp8_mma_layout_interpret",
    "tests/test_grouped_wna16_mgpu.py::test_quant_moe_pair_tiles_interpret",
    "tests/test_grouped_wna16_mgpu.py::test_tile_schedule_covers_every_row_once",
    "tests/test_wna16_mgpu_dx.py::test_moe_backwards_route_to_the_kernel_when_asked",
    "tests/test_wna16_mgpu_dx.py::test_kernel_backward_under_other_transformations",
    "tests/test_autotune.py::test_autotune_grouped_mgpu_stores_what_run_reads",
    "tests/test_autodiff.py::test_quant_moe_grad",
    "tests/test_grouped_wna16_mgpu.py::test_scale_fold_interpret",
    "tests/test_grouped_wna16_mgpu.py::test_quant_moe_on_mosaic_params_interpret",
    "tests/test_grouped_wnam_mgpu.py::test_fp8_single_acc_route",
    "tests/test_grouped_wnam_mgpu.py::test_fp8_mma_split_k_and_dense_interpret",
    "tests/test_wna16_mgpu.py::test_scale_fold_matches_unfolded_interpret",
    "tests/test_grouped_wna16_mgpu.py::test_column_blocks_interpret",
    "tests/test_wnam_mgpu.py::test_prefill_runs_the_8bit_gemm_from_this_layout",
    "tests/test_wna16_mgpu.py::test_prepare_round_trip_is_exact",
    "tests/test_grouped_wna16_mgpu.py::test_streamed_launch_is_run_s_not_run_aligned_s",
    "tests/test_wnam_mgpu.py::test_mx_fold_prefill_interpret",
    "tests/test_wna16.py::test_shapes_sweep_interpret",
    "tests/test_wna16_mgpu_dx.py::test_backward_routes_to_the_kernel",
    "tests/test_wna16_mgpu_dx.py::test_moe_hessian_vector_product_on_kernels",
)


def _slow_rank(item) -> int:
  return next((i for i, p in enumerate(SLOW_FIRST) if item.nodeid.startswith(p)),
              len(SLOW_FIRST))


def pytest_collection_modifyitems(config, items):
  items.sort(key=_slow_rank)  # stable: the rest keep their collection order
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


@pytest.fixture
def mma_sync_calls(monkeypatch):
  """The arguments of every mma.sync PTX string kernels/mgpu_mma.py builds from here on
  (one per 16-row x 8-column x 16-deep product), in order; traced launches count."""
  from humming_jax.kernels import mgpu_mma
  seen, real = [], mgpu_mma._mma_ptx
  monkeypatch.setattr(mgpu_mma, "_mma_ptx", lambda *a: seen.append(a) or real(*a))
  return seen
