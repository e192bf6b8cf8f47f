"""Device probe: carrier_unpack.fold_metadata's kernel by variant (tiles per load, warps,
exponents held between its passes) at 8192^2 MXFP4 scale rows, CUPTI time, each checked
equal to the XLA reference.  Usage: probe_fold_metadata.py [--k 8192] [--n 8192]"""
import argparse
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import common
from humming_jax.kernels import carrier_unpack as cu


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=8192)
  a = ap.parse_args()
  tiles, g = a.k // 128, 4
  e = np.random.default_rng(0).integers(-20, 20, (tiles * g, a.n))
  scales = jnp.asarray(np.exp2(e.astype(np.float64)).astype(np.float32), jnp.bfloat16)
  ref = jax.jit(lambda s: cu.fold_metadata(s, tiles=tiles, real_groups=tiles * g))
  want = ref(scales)
  t = common.kernel_times(ref, (scales,))
  print(f"K={a.k} N={a.n} XLA: {sum(t.values()):6.1f} us {({n: round(v, 1) for n, v in t.items()})}")
  seen = set()
  for chunk, warps, hold in itertools.product((8, 16, 64), (4, 8), (False, True)):
    used = 1
    while used < chunk and tiles % (2 * used) == 0:  # the kernel's chunk for these tiles
      used *= 2
    if (used, warps, hold) in seen:
      continue
    seen.add((used, warps, hold))
    cu.METADATA_CHUNK, cu.METADATA_WARPS, cu.METADATA_HOLD = chunk, warps, hold
    f = jax.jit(lambda s: cu._fold_metadata_pallas(s, tiles=tiles, real_groups=tiles * g,
                                                    block_n=64, interpret=False))
    try:
      got = f(scales)
      same = all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
                 for x, y in zip(got, want))
      us = sum(common.kernel_times(f, (scales,)).values())
      print(f"K={a.k} chunk={used:2d} warps={warps} hold={hold!s:5}: {us:6.2f} us  equal {same}")
    except Exception as ex:  # noqa: BLE001 - a variant that does not compile is a result
      print(f"chunk={chunk} warps={warps} hold={hold}: {type(ex).__name__} {str(ex)[:200]}")


if __name__ == "__main__":
  main()
