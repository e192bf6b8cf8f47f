"""Activation quantization for the W8A8 / W4A8 / W4A4 kernels: the pre-kernel path.

The kernels take activations already on the format's grid in the tensor-core carrier dtype
(int8, float8_e4m3fn) plus float32 scales: ``quantize.quantize_activations`` defines the
semantics (scale rules, rounding, saturation).  Under ``jit`` XLA turns it into one or two
fused passes over x (amax reduction, then scale-round-convert), which is cheap next to the
GEMM (see benchmarks/NOTES_w8a8.md for the measurement against quantizing in the kernel
prologue).

The only thing added here is a fast rounding for fp4 e2m1 activations (W4A4): the generic
``fmt.encode`` is a table search.  e2m1's grid has step 0.5 below 2, 1 below 4 and 2 up to
6, so ``round_half_even(x / step) * step`` is its RNE rounding (even multiples of the step
are exactly the even mantissas; equality with ``fmt.encode`` is asserted in
tests/test_w8a8.py).  Not XLA's ``float4_e2m1fn`` convert: on the H200 (2026-11-29) the
chain f32 -> f4 -> f8 reached the kernel as plain f32 -> f8 rounding, the fp4
quantization silently skipped (8e-2 error vs the reference).  e2m1 values are exact in
e4m3.  The scales still come from ``quantize_activations`` (under jit its unused values are
dead code), so the two paths cannot drift apart.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from humming_jax.quantize import QuantizedActivations, quantize_activations
from humming_jax.spec import QuantSpec


def quantize(x: jax.Array, spec: QuantSpec,
             act_scale: jax.Array | None = None) -> QuantizedActivations:
  """(M, K) float activations -> values in the carrier dtype + float32 scales.

  Same result as :func:`humming_jax.quantize.quantize_activations` (bit for bit)."""
  q = quantize_activations(x, spec, act_scale)
  if spec.act != "fp4_e2m1":
    return q
  m, k = x.shape
  s = q.scales
  full = jnp.repeat(jnp.repeat(s, m // s.shape[0], 0), k // s.shape[1], 1)
  xs = x.astype(jnp.float32) / full
  fmax = spec.act_format.max_value
  return QuantizedActivations(round_e2m1(jnp.clip(xs, -fmax, fmax)).astype(jnp.float8_e4m3fn),
                              s)


def round_e2m1(x: jax.Array) -> jax.Array:
  """float32 ``x`` with |x| <= 6 rounded (RNE) onto the fp4 e2m1 grid, float32 out."""
  ax = jnp.abs(x)
  step = jnp.where(ax < 2.0, 0.5, jnp.where(ax < 4.0, 1.0, 2.0))
  return jnp.round(x / step) * step  # jnp.round: half to even; x / step is exact
