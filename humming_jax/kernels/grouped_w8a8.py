"""Grouped (MoE) W8A8 / W4A8 / W4A4: ``lax.ragged_dot`` with activation-quantized experts.

``y[rows of expert e] = A_deq[rows] @ W_deq[e]`` for x sorted by expert, on the same 8-bit
tensor-core K loop as the dense kernel (``w8a8.accumulate``: int8 x int8 -> int32 or
e4m3 x e4m3 -> f32, K-group scales on the partial products, bf16 fold for groups < 32) and
the same tile schedule as the grouped WnA16 kernel, computed by each program from the
group sizes (``grouped_wna16.tile_at``: expert-pure row tiles, a zero-writing tail, a
static number of programs, no host sync, no schedule ops beside the launch).

Activations are quantized once for all rows by the dense pre-pass (kernels/act_quant.py):
per-token and per-(token, K group) scales belong to the row, not to the expert.  Static
(calibrated) activation scales are per layer in the dense API and have no stacked-expert
form yet: those specs stay on the XLA path.

The XLA reference beside it is kernels/reference.py::ragged_dot_reference.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax.kernels import grouped_wna16, registry, tuning, w8a8, wna16
from humming_jax.kernels import layout as lay
from humming_jax.quantize import QuantizedWeight
from humming_jax.spec import QuantSpec

FAMILY = "grouped_w8a8"


def supports(spec: QuantSpec) -> bool:
  return w8a8.supports(spec) and not spec.act_static


# ----------------------------------------------------------------------------------------
# Transform: the dense W8A8 layout, once per expert
# ----------------------------------------------------------------------------------------
def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical stacked (E, K, N) params -> per-expert dense W8A8 layout, stacked on axis 0."""
  if params.num_experts is None:
    raise ValueError(f"grouped kernels need stacked experts (E, K, N); got shape "
                     f"{params.shape}")
  if params.act_scale is not None:
    raise ValueError("params.act_scale is set (static activation scales): the grouped W8A8 "
                     "kernel takes dynamic activation scales only; use backend='xla'")
  return grouped_wna16.stack_prepare(w8a8.prepare, params, FAMILY, w8a8.FAMILY)


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare`."""
  return grouped_wna16.stack_to_canonical(w8a8.to_canonical, prepared, FAMILY, w8a8.FAMILY)


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------
def _kernel(gs_ref, a_ref, sa_ref, w_ref, sw_ref, *rest, spec: QuantSpec,
            plan: w8a8.Plan, lt: lay.SlabLayout | None, block_k: int, k_tiles: int,
            block_m: int, m: int, num_experts: int, per_row_sa: bool, has_s2: bool,
            has_bias: bool):
  rest = list(rest)
  s2_ref = rest.pop(0) if has_s2 else None
  bias_ref = rest.pop(0) if has_bias else None
  (o_ref,) = rest
  block_n = o_ref.shape[-1]
  e, start, end, kind = grouped_wna16.tile_at(gs_ref[...], m, block_m, pl.program_id(0))
  e = jnp.minimum(e, num_experts - 1)  # padded (empty) experts own no tile
  row_ok = (start + jnp.arange(block_m, dtype=jnp.int32) < end)[:, None]
  rows = pl.ds(start, block_m)
  o_rows = o_ref.at[rows, :]

  def load_sa(cols):
    if not per_row_sa:  # one dynamic per-tensor scale
      return sa_ref[:, cols]
    return plt.load(sa_ref.at[rows, cols], mask=row_ok, other=1.0)

  @pl.when(kind == 1)
  def _compute():
    acc = w8a8.accumulate(
        jnp.zeros((block_m, block_n), w8a8.acc_dtype(plan)), spec=spec, plan=plan, lt=lt,
        block_k=block_k, first_tile=0, num_tiles=k_tiles,
        # No `other`: Triton cannot splat a constant into fp8, and rows outside the
        # group only reach accumulator rows that the masked store drops.
        load_a=lambda k0, size: plt.load(
            a_ref.at[rows, pl.ds(k0, size)],
            mask=jnp.broadcast_to(row_ok, (block_m, size))),
        load_sa_col=lambda c: load_sa(pl.ds(c, 1)),
        load_w=lambda k0, size: w_ref[e, :, pl.ds(k0, size)],
        load_words=lambda r, n: w_ref[e, pl.ds(r, n), :],
        load_sw_row=lambda r: sw_ref[e, pl.ds(r, 1), :])
    if not plan.a_group:
      acc = acc * load_sa(pl.ds(0, 1))
    if not plan.w_group:
      acc = acc * wna16._decode_scale_row(sw_ref[e, pl.ds(0, 1), :], spec)
    if has_s2:
      acc = acc * s2_ref[pl.ds(e, 1), :]
    if has_bias:
      acc = acc + bias_ref[pl.ds(e, 1), :]
    plt.store(o_rows, acc.astype(o_ref.dtype),
              mask=jnp.broadcast_to(row_ok, (block_m, block_n)))

  @pl.when(kind == 0)
  def _zero_fill():
    plt.store(o_rows, jnp.zeros((block_m, block_n), o_ref.dtype),
              mask=jnp.broadcast_to(row_ok, (block_m, block_n)))


def heuristic(m: int, e: int, np_: int) -> tuning.TuningConfig:
  """Rows per active expert pick the row tile (decode: 16; prefill: up to 64); 64-wide N
  tiles (128 when rows are many and N allows)."""
  rows = grouped_wna16.rows_per_active_expert(m, e)
  block_m = 16 if rows <= 16 else (32 if rows <= 32 else 64)
  block_n = 128 if (rows > 32 and np_ % 128 == 0) else 64
  return tuning.TuningConfig(block_m, min(block_n, np_), 1, num_warps=4, num_stages=2)


def run(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
        interpret: bool = False, config: tuning.TuningConfig | None = None) -> jax.Array:
  """(M, K) float rows sorted by expert x prepared stacked params -> (M, N) in x.dtype."""
  spec = params.spec
  plan = w8a8.plan_for(spec)
  e, k, n = params.shape
  m = x.shape[0]
  lt, block_k, kp, np_ = w8a8.kernel_dims(params, plan)
  config = config or heuristic(m, e, np_)
  block_m = config.block_m
  block_n = min(config.block_n, np_)
  while np_ % block_n:
    block_n //= 2
  num_tiles = grouped_wna16.max_tiles(m, e, block_m)
  # On the GPU masked loads/stores make rows past M harmless; the interpreter slices blocks
  # exactly, so there the row blocks must stay in bounds (pad block_m rows).
  row_pad = block_m if interpret else 0
  per_row_sa = spec.act_granularity != "tensor"
  a, sa = w8a8.act_operands(x, spec, plan, None, rows=m + row_pad, kp=kp, per_row=per_row_sa,
                            interpret=interpret)
  gs = grouped_wna16.pow2_experts(group_sizes)  # each program computes its own tile

  full = lambda shape: pl.BlockSpec(shape, lambda i, j: (0,) * len(shape))
  if plan.direct:  # (E, Np, Kp): N blocks on axis 1
    w_spec = pl.BlockSpec((e, block_n, kp), lambda i, j: (0, j, 0))
  else:  # (E, words, Np)
    w_spec = pl.BlockSpec((e, params.codes.shape[1], block_n), lambda i, j: (0, 0, j))
  operands = [gs, a, sa, params.codes, params.scales]
  in_specs = [full(gs.shape), full(a.shape), full(sa.shape), w_spec,
              pl.BlockSpec((e, params.scales.shape[1], block_n), lambda i, j: (0, 0, j))]
  has_s2 = params.global_scale is not None
  has_bias = params.bias is not None
  if has_s2:
    operands.append(params.global_scale.astype(jnp.float32).reshape(e, 1))
    in_specs.append(full((e, 1)))
  if has_bias:
    bias = jnp.pad(params.bias.astype(jnp.float32), ((0, 0), (0, np_ - n)))
    operands.append(bias)
    in_specs.append(pl.BlockSpec((e, block_n), lambda i, j: (0, j)))
  mo = m + row_pad
  kernel = functools.partial(
      _kernel, spec=spec, plan=plan, lt=lt, block_k=block_k, k_tiles=kp // block_k,
      block_m=block_m, m=m, num_experts=e, per_row_sa=per_row_sa, has_s2=has_s2, has_bias=has_bias)
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((mo, np_), x.dtype),
      grid=(num_tiles, np_ // block_n),
      in_specs=in_specs,
      out_specs=pl.BlockSpec((mo, block_n), lambda i, j: (0, j)),
      compiler_params=plt.CompilerParams(num_warps=config.num_warps,
                                         num_stages=config.num_stages),
      interpret=interpret,
      name=f"grouped_w8a8_{spec.weight}_{spec.act}",
  )(*operands)
  return out[:m, :n]


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=3, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, grouped=True,
    dequantize=lambda params, dtype: grouped_wna16.stack_dequantize(
        w8a8.KERNEL.dequantize, params, FAMILY, w8a8.FAMILY, dtype)))
