"""The per-call weight unpack of the W4A8 prefill routes (``wnam_mgpu``), variant by variant.

At 8192^2 the 8-bit GEMM of W4A8 reads (N, K) 8-bit codes made per call from the 4-bit
prepared layout.  H200 session 15, CUPTI: int4 -> int8 33 us, int4 -> e4m3 81 us (the
format's ``encode_exact`` off float32 values), the MXFP4 fold 81 us.  The int8 unpack is a
plain convert; the two e4m3 ones go through float32.  This times integer-only forms of the
two e4m3 unpacks (and a 16-entry table for int4) against the library's, each checked
bit-equal to the library's codes first.

  PYTHONPATH=. python3 benchmarks/bench_unpack.py            # H200: 8192^2, CUPTI us
  PYTHONPATH=. python3 benchmarks/bench_unpack.py --check    # any machine: small shape,
                                                             # bit-equality only
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import humming_jax as hj  # noqa: E402
from humming_jax import formats  # noqa: E402
from humming_jax.kernels import wna16_mgpu, wnam_mgpu as wm  # noqa: E402

E4M3 = formats.get_format("fp8_e4m3")


def _as_np_k(codes: jax.Array) -> jax.Array:
  """(t, Np, bk) uint8 e4m3 bit patterns -> (Np, Kp) float8_e4m3fn, as the GEMM takes them."""
  return wm.k_major(jax.lax.bitcast_convert_type(codes.astype(jnp.uint8), jnp.float8_e4m3fn))


# ---- int4 -> e4m3 ------------------------------------------------------------------------
def int4_library(p):
  return wm._carrier_codes(p)


def int4_integer(p):
  """|v| = 2**e x (1 + f / 8) for v in -8..7: e from three compares, f from one shift."""
  v = p.codes.astype(jnp.int32)
  a = jnp.abs(v)
  e = (a >= 2).astype(jnp.int32) + (a >= 4) + (a >= 8)
  code = ((e + 7) << 3) | ((a << (3 - e)) & 7)
  return _as_np_k(jnp.where(a == 0, 0, code | ((v < 0).astype(jnp.int32) << 7)))


INT4_TABLE = np.asarray(E4M3.encode(jnp.arange(-8, 8, dtype=jnp.float32)))  # eager, once


def int4_table(p):
  return _as_np_k(jnp.asarray(INT4_TABLE)[p.codes.astype(jnp.int32) + 8])


# ---- MXFP4 fold -> e4m3 --------------------------------------------------------------------
def fold_library(p):
  return wm.mx_fold_codes(p)


def fold_integer(p):
  """e2m1 code (s, e1 e0, m) x 2**shift -> e4m3 code in integer ops: the exponent field
  moves by the shift; below the least normal the value (2 + m) x 2**(field + 1) subnormal
  steps is rounded half to even with four guard bits."""
  t, np_, bk = p.codes.shape
  g = p.spec.group_size
  e, base, _ = wm._mx_fold_exponents(p)
  shift = jnp.clip(e - base[None], -20, 6).reshape(t, bk // g, np_).transpose(0, 2, 1)
  c = (p.codes.astype(jnp.int32) & 15).reshape(t, np_, bk // g, g)
  mag, sign = c & 7, c >> 3
  m = jnp.where(mag >= 2, mag & 1, 0)
  field = jnp.where(mag >= 2, (mag >> 1) - 1, -1) + shift[..., None] + 7
  normal = (field << 3) | (m << 2)
  num = (2 + m) << 4
  sh = jnp.clip(3 - field, 1, 31)
  q = num >> sh
  rem = num & ((1 << sh) - 1)
  half = 1 << (sh - 1)
  q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).astype(jnp.int32)
  code = jnp.where(field >= 1, normal, q)
  code = jnp.where((mag == 0) | (code == 0), 0, code | (sign << 7))
  return _as_np_k(code.reshape(t, np_, bk))


VARIANTS = {
    "w4a8-fp8": {"library": int4_library, "integer": int4_integer, "table": int4_table},
    "w4a8-mxfp4": {"library": fold_library, "integer": fold_integer},
}


def params_for(spec_name: str, k: int, n: int, seed: int, *, wide: bool = False):
  spec = hj.QuantSpec.preset(spec_name)
  w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / 40
  q = jax.jit(lambda w: hj.quantize(w, spec))(w)
  if wide and spec_name == "w4a8-mxfp4":  # group rows 0..19 octaves down: past the exact 14
    s = q.scales.astype(jnp.int32)
    s = s - (jnp.arange(s.shape[0], dtype=jnp.int32) * 3 % 20)[:, None]
    q = q.replace(scales=jnp.clip(s, 1, 254).astype(q.scales.dtype))
  return jax.jit(wm.prepare)(q)


def check(k: int, n: int) -> None:
  for spec_name, variants in VARIANTS.items():
    for wide in (False, True):
      p = params_for(spec_name, k, n, seed=1, wide=wide)
      want = np.asarray(jax.jit(variants["library"])(p)).view(np.uint8)
      for name, fn in variants.items():
        got = np.asarray(jax.jit(fn)(p)).view(np.uint8)
        bad = int((got != want).sum())
        print(f"{spec_name:11s} {'wide' if wide else 'real':4s} {name:8s} "
              f"{'bit-equal' if bad == 0 else f'{bad} codes differ'}")
        if bad:
          raise SystemExit(f"{spec_name} {name}: {bad} codes differ from the library's")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--check", action="store_true", help="small shape, bit-equality only")
  ap.add_argument("--shape", default="8192x8192", help="KxN of the timed weights")
  ap.add_argument("--sets", type=int, default=4, help="weight sets per timed call (L2)")
  args = ap.parse_args(argv)
  if args.check:
    check(512, 384)
    return
  k, n = map(int, args.shape.split("x"))
  print(common.device_info())
  check(k, n)
  for spec_name, variants in VARIANTS.items():
    ps = [params_for(spec_name, k, n, seed=i) for i in range(args.sets)]
    for name, fn in variants.items():
      times = common.kernel_times(lambda ps, fn=fn: tuple(fn(p) for p in ps), (ps,),
                                  per=len(ps))
      detail = ", ".join(f"{kn}={us:.1f}" for kn, us in times.items())
      print(f"{args.shape} {spec_name:11s} {name:8s} {sum(times.values()):7.1f} us  ({detail})")


if __name__ == "__main__":
  main()
