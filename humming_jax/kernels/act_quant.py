"""Activation quantization for the W8A8 / W4A8 / W4A4 kernels: the pre-kernel path.

The kernels take activations already on the format's grid in the tensor-core carrier dtype
(int8, float8_e4m3fn) plus float32 scales: ``quantize.quantize_activations`` defines the
semantics (scale rules, rounding, saturation).  Under ``jit`` XLA turns it into one or two
fused passes over x (amax reduction, then scale-round-convert), which is cheap next to the
GEMM (see benchmarks/NOTES_w8a8.md for the measurement against quantizing in the kernel
prologue).

The only thing added here is a fast rounding for fp4 e2m1 activations (W4A4): the generic
``fmt.encode`` is a table search; XLA's own convert to ``float4_e2m1fn`` rounds to nearest
even the same way (asserted in tests/test_w8a8.py), and e2m1 values are exact in e4m3.
The scales still come from ``quantize_activations`` (under jit its unused values are dead
code), so the two paths cannot drift apart.
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
  vals = jnp.clip(xs, -fmax, fmax).astype(jnp.float4_e2m1fn).astype(jnp.float8_e4m3fn)
  return QuantizedActivations(vals, s)
