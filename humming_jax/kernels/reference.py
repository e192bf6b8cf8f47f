"""XLA reference of every kernel: the oracle for tests and the CPU fallback.

``out = (A_deq @ W_deq) + bias``, accumulated in float32, cast to the activation dtype.
``A_deq`` is the quantize-dequantized activation when the spec quantizes activations.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from humming_jax.quantize import (QuantizedWeight, dequantize, fake_quantize_activations)
from humming_jax.kernels import registry


def dense_reference(params: QuantizedWeight, x: jax.Array) -> jax.Array:
  """(M, K) x quantized (K, N) -> (M, N) in x.dtype."""
  params = registry.to_canonical(params)
  w = dequantize(params)
  a = (fake_quantize_activations(x, params.spec, params.act_scale)
       if params.spec.act else x.astype(jnp.float32))
  y = jnp.dot(a, w, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  if params.bias is not None:
    y = y + params.bias
  return y.astype(x.dtype)


def dense_gradient_reference(params: QuantizedWeight, x: jax.Array) -> jax.Array:
  """:func:`dense_reference` as quant_dense's backward differentiates it: for 16-bit x the
  operands in x's dtype at the default precision (float32 accumulation), as a bf16 layer's
  own backward would run, instead of float32 at HIGHEST (several tensor-core passes per
  product on a GPU: a training step's dx at M = 4096 would cost several forward GEMMs).
  The dequantized weight rounds to x's dtype (relative 2**-9 in bf16), as gradients
  tolerate; float32 x keeps the exact reference.  For 16-bit x, prepared params are
  dequantized from their own layout (no re-layout to canonical per call)."""
  if x.dtype not in (jnp.bfloat16, jnp.float16):
    return dense_reference(params, x)
  w = registry.dequantize(params, x.dtype)  # prepared params read in their own layout
  a = (fake_quantize_activations(x, params.spec, params.act_scale)
       if params.spec.act else x).astype(x.dtype)
  # The product in x's dtype (float32 accumulation inside the GEMM): its cotangent stays
  # 16-bit, so dx = dy . W^T is one 16-bit GEMM.  A float32 product here made dy float32
  # and dx a float32 (TF32) GEMM over W widened to float32 (H200, 8192^2, M = 4096:
  # 1251 + 97 us of convert, against the 676 us bf16 GEMM).
  y = jnp.dot(a, w)
  if params.bias is not None:
    y = y + params.bias
  return y.astype(x.dtype)


def ragged_dot_reference(params: QuantizedWeight, x: jax.Array,
                         group_sizes: jax.Array) -> jax.Array:
  """(M, K) rows sorted by expert x quantized (E, K, N) experts -> (M, N) in x.dtype.

  Rows past ``sum(group_sizes)`` are zero.  Activation quantization (if any) is per row or
  per tensor over the whole (M, K) input, as in the dense case.
  """
  params = registry.to_canonical(params)
  w = dequantize(params)  # (E, K, N)
  m = x.shape[0]
  e = w.shape[0]
  a = (fake_quantize_activations(x, params.spec, params.act_scale)
       if params.spec.act else x.astype(jnp.float32))
  ends = jnp.cumsum(group_sizes)
  expert_of_row = jnp.searchsorted(ends, jnp.arange(m), side="right")
  valid = expert_of_row < e
  expert_of_row = jnp.minimum(expert_of_row, e - 1)
  y = jnp.zeros((m, w.shape[-1]), jnp.float32)
  for i in range(e):  # a per-expert loop: slow, obviously right
    yi = jnp.dot(a, w[i], precision=jax.lax.Precision.HIGHEST,
                 preferred_element_type=jnp.float32)
    if params.bias is not None:
      yi = yi + params.bias[i]
    y = jnp.where((expert_of_row == i)[:, None], yi, y)
  y = jnp.where(valid[:, None], y, 0.0)
  return y.astype(x.dtype)
