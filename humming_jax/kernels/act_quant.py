"""Activation quantization for the W8A8 / W4A8 / W4A4 kernels: the pre-kernel path.

The kernels take activations already on the format's grid in the tensor-core carrier dtype
(int8, float8_e4m3fn) plus float32 scales.  ``quantize.quantize_activations`` defines the
semantics (scale rules, rounding, saturation) and is what this pre-pass runs: under ``jit``
XLA turns it into one or two fused passes over x (amax reduction, then
scale-round-convert), cheap next to the GEMM (benchmarks/NOTES_w8a8.md has the measurement
against quantizing in the kernel prologue).  fp4 e2m1 values are exact in e4m3, the carrier.
Its fast rounding (``round_e2m1``) lives with the other fast roundings in quantize.py, so the
reference and the kernels round through the same code.
"""
from __future__ import annotations

import jax

from humming_jax.quantize import (QuantizedActivations, kernel_activations,
                                  quantize_activations, round_e2m1)  # noqa: F401
from humming_jax.spec import QuantSpec


def quantize(x: jax.Array, spec: QuantSpec,
             act_scale: jax.Array | None = None) -> QuantizedActivations:
  """(M, K) float activations -> values in the carrier dtype + float32 scales
  (:func:`humming_jax.quantize.quantize_activations`)."""
  return quantize_activations(x, spec, act_scale)


def kernel_operand(x: jax.Array, spec: QuantSpec, act_scale: jax.Array | None = None, *,
                   rows: int, kp: int, values_dtype=None) -> QuantizedActivations:
  """The same values zero-padded to a kernel's (rows, kp) operand, for kernels only
  (:func:`humming_jax.quantize.kernel_activations`: fp8 through one convert; with
  ``values_dtype``, the values in that 16-bit dtype)."""
  return kernel_activations(x, spec, act_scale, rows=rows, kp=kp, values_dtype=values_dtype)
