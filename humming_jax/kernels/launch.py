"""The launch both dense kernel families share: grid (M tiles, N tiles, K splits), the
output block, split-K partials summed by XLA (bias added once, then the cast), crop."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax.kernels import tuning


def epilogue_operands(params, n: int, np_: int, n_spec, *, with_bias: bool
                      ) -> tuple[list, list]:
  """Operands + BlockSpecs read by :func:`store_output`: the (1, 1) fp32 global scale
  (when the params have one) and the N-padded (1, Np) bias (when ``with_bias``)."""
  operands, specs = [], []
  if params.global_scale is not None:
    operands.append(params.global_scale.astype(jnp.float32).reshape(1, 1))
    specs.append(pl.BlockSpec((1, 1), lambda i, j, s: (0, 0)))
  if with_bias:
    operands.append(jnp.pad(params.bias, (0, np_ - n)).reshape(1, np_))
    specs.append(n_spec(1))
  return operands, specs


def launch_dense(kernel, operands, in_specs, *, mp: int, np_: int, m: int, n: int,
                 block_m: int, block_n: int, split_k: int, out_dtype,
                 bias: jax.Array | None, config: tuning.TuningConfig, interpret: bool,
                 name: str) -> jax.Array:
  """Run ``kernel`` over (mp // block_m, np_ // block_n, split_k) and return (m, n).

  With ``split_k == 1`` the kernel writes ``out_dtype`` blocks (bias fused by the kernel);
  otherwise it writes float32 partials (split_k, mp, np_) and ``bias`` is added here."""
  if split_k == 1:
    out_shape = jax.ShapeDtypeStruct((mp, np_), out_dtype)
    out_spec = pl.BlockSpec((block_m, block_n), lambda i, j, s: (i, j))
  else:
    out_shape = jax.ShapeDtypeStruct((split_k, mp, np_), jnp.float32)
    out_spec = pl.BlockSpec((None, block_m, block_n), lambda i, j, s: (s, i, j))
  out = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(mp // block_m, np_ // block_n, split_k),
      in_specs=in_specs,
      out_specs=out_spec,
      compiler_params=plt.CompilerParams(num_warps=config.num_warps,
                                         num_stages=config.num_stages),
      interpret=interpret,
      name=name,
  )(*operands)
  if split_k > 1:
    out = out.sum(axis=0)
    if bias is not None:
      out = out + jnp.pad(bias, (0, np_ - n))
    out = out.astype(out_dtype)
  return out[:m, :n]


def gemm_dequantized(x: jax.Array, dequantize, bias: jax.Array | None, *,
                     highest_f32: bool = False, out_scale: jax.Array | None = None
                     ) -> jax.Array:
  """The large-M path of the WnA16 kernels: ``x @ dequantize(dtype) * out_scale + bias``
  with XLA's GEMM in the activation dtype (bf16 / fp16, else float32), float32
  accumulation, output in x's dtype.  ``dequantize(dtype)`` returns the (K, N) weights
  from the kernel layout; ``out_scale`` (a float32 scalar or (N,) row, e.g. NVFP4's global
  scale with fp16 activations: wna16_mgpu.dequant_gemm) multiplies the float32 product,
  so it is never rounded to the activation dtype; ``highest_f32``: float32 GEMMs at
  Precision.HIGHEST (not TF32)."""
  cdt = x.dtype if x.dtype in (jnp.bfloat16, jnp.float16) else jnp.float32
  precision = jax.lax.Precision.HIGHEST if (highest_f32 and cdt == jnp.float32) else None
  # Nothing to apply in float32: the GEMM writes x's dtype itself from its float32
  # accumulator.  A float32 product plus a convert cost a separate 47 us kernel at 8192^2,
  # M = 4096 on the H200 (cuBLAS does not fuse it; session 11).  One rounding, unless XLA
  # or cuBLAS splits K and reduces the partials in the output type (more bf16 roundings,
  # the error class of the kernel's bf16-rounded weights); the GPU tests bound both.
  out = x.dtype if out_scale is None and bias is None else jnp.float32
  y = jnp.dot(x.astype(cdt), dequantize(cdt), preferred_element_type=out,
              precision=precision)
  if out_scale is not None:
    y = y * out_scale.astype(jnp.float32)
  if bias is not None:
    y = y + bias
  return y.astype(x.dtype)


def store_output(acc: jax.Array, o_ref, *, s2_ref=None, bias_ref=None,
                 split_k: int = 1) -> None:
  """Kernel epilogue shared by the dense kernels: the per-tensor second-level scale, then
  either bias + cast + store (one K split) or the float32 partial (split-K)."""
  if s2_ref is not None:
    acc = acc * s2_ref[...]
  if split_k == 1:
    if bias_ref is not None:
      acc = acc + bias_ref[...]
    o_ref[...] = acc.astype(o_ref.dtype)
  else:
    o_ref[...] = acc
