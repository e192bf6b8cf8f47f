"""SHA-256 of the Mosaic GPU module each kernel lowers to for an H200, per case, on the CPU.

A refactor that should not change the GPU program is checked by running this before and
after (e.g. the old commit in a ``git worktree`` with ``PYTHONPATH`` pointing there) and
diffing the lines: the module is captured at ``lower_mgpu_module`` as MLIR without debug
info, so file paths and line numbers do not enter the hash.  Session 24 used it to show
that ``Config.cluster_n == 1`` (``HUMMING_JAX_CLUSTER_N=1``) emits the same programs as
before clusters existed.

Usage (repo root): python scripts/mosaic_module_hashes.py
"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src.pallas.mosaic_gpu import lowering as mgpu_lowering  # noqa: E402

from humming_jax.kernels import grouped_wna16_mgpu as gm  # noqa: E402
from humming_jax.kernels import grouped_wnam_mgpu as gw  # noqa: E402
from humming_jax.kernels import wna16_mgpu as mg  # noqa: E402
from test_cuda_lowering import abstract_params, lower_for_h200  # noqa: E402

_modules: list[str] = []
_lower = mgpu_lowering.mgpu_core.lower_mgpu_module


def _capture(module, *args, **kwargs):
  out = _lower(module, *args, **kwargs)
  _modules.append(module.operation.get_asm(enable_debug_info=False))
  return out


def cases():
  """(label, thunk lowering one jitted call for the H200)."""
  for name in ("w4a16-g128-zp", "w4a16-mxfp4", "w8a16-fp8"):
    for m in (1, 16, 128):
      yield f"dense {name} M={m}", lambda name=name, m=m: lower_for_h200(
          lambda p, x: mg.run(p, x), abstract_params(name, (8192, 8192)),
          jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16))
  for name, family, shape, rows in (
      ("w4a8-mxfp4", gw, (8, 4096, 28672), 2048), ("w4a8-mxfp4", gw, (256, 7168, 512), 128),
      ("w4a16-mxfp4", gm, (8, 14336, 4096), 2048),
      ("w4a16-g128-zp", gm, (256, 7168, 512), 8192), ("w4a16-g128-zp", gm, (128, 2048, 1536), 8)):
    yield f"grouped {name} {shape} rows={rows}", (
        lambda name=name, family=family, shape=shape, rows=rows: lower_for_h200(
            lambda p, x, g: family.run(p, x, g),
            abstract_params(name, shape, grouped=True, kernel=family.FAMILY),
            jax.ShapeDtypeStruct((rows, shape[1]), jnp.bfloat16),
            jax.ShapeDtypeStruct((shape[0],), jnp.int32)))


def main():
  mgpu_lowering.mgpu_core.lower_mgpu_module = _capture
  for label, lower in cases():
    _modules.clear()
    lower()
    digest = hashlib.sha256("".join(_modules).encode()).hexdigest()[:16]
    print(f"{label}: {len(_modules)} module(s) {digest}", flush=True)


if __name__ == "__main__":
  main()
