"""Grouped (MoE) WnA16: ``lax.ragged_dot`` with quantized stacked experts, Pallas-Triton.

``y[r] = x[r] @ W_deq[expert(r)] + bias[expert(r)]`` for rows ``r`` sorted by expert
(``group_sizes`` (E,) consecutive segments); rows past ``sum(group_sizes)`` are zero.

Layout: each expert is stored in the dense WnA16 slab layout (wna16.prepare per expert,
stacked along a leading E axis), so every weight format of the dense kernel runs here too.
The K tile is fitted to K (``wna16.slab_layout(fit_k=True)``): DeepSeek-V3 down (K=256)
gets int4 slab 32 / K tile 256 instead of 512 rows (padding K to 512 doubled its weight
bytes and MACs).

Schedule (no host sync, static shapes): the rows are cut into *tiles* of ``block_m`` rows
that never straddle two experts -- each expert's segment is split on its own, and the tail
``[sum(group_sizes), M)`` forms one more segment whose tiles write zeros.  A segment of
``g`` rows takes ``cdiv(g, block_m)`` tiles, so ``cdiv(M, block_m) + min(E, M)`` tiles
always suffice; that static count is the grid's first axis, unused tiles do nothing.
The per-tile ``(expert, row start, row end, kind)`` table is computed on the device by
:func:`tile_schedule` and read in the kernel by program id.

Kernel: grid = (tiles, N tiles, K splits).  A program loads rows ``[start, start+block_m)``
of x (masked to ``< end``), runs the K loop shared with the dense kernel
(:func:`humming_jax.kernels.wna16.accumulate_k`) on expert ``e``'s codes, and stores only
its own rows (masked store), so tiles of different experts may share a block of rows.
Split-K partials are float32 and summed by XLA; the bias is added by split 0 only.

Cost per call (prepared params): the kernel reads only the codes of the experts that own a
tile (inactive experts cost nothing: their codes are never loaded; the stacked-E BlockSpec
is only a base pointer), plus x, plus a few small XLA ops for the schedule.  No (E, K, N)
temporary exists on this path (tests/test_grouped_kernels.py checks the jaxpr).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax.kernels import layout as lay
from humming_jax.kernels import registry, tuning, wna16
from humming_jax.quantize import QuantizedWeight
from humming_jax.spec import QuantSpec

FAMILY = "grouped_wna16"
_SCHED_FIELDS = 4  # expert, row start, row end, kind (1 = compute, 0 = write zeros / idle)


def supports(spec: QuantSpec) -> bool:
  return wna16.supports(spec)


# ----------------------------------------------------------------------------------------
# Transform: the dense slab layout, once per expert
# ----------------------------------------------------------------------------------------
def per_expert(params: QuantizedWeight, layout: str) -> QuantizedWeight:
  """Stacked (E, K, N) params seen as one expert's (K, N) (for ``jax.vmap`` over E)."""
  e, k, n = params.shape
  return params.replace(shape=(k, n), layout=layout)


def stack_prepare(dense_prepare, params: QuantizedWeight, family: str,
                  dense_family: str) -> QuantizedWeight:
  """A grouped layout = the dense family's layout per expert, stacked on axis 0."""
  out = jax.vmap(dense_prepare)(per_expert(params, "canonical"))
  name = out.layout.replace(dense_family + ":", family + ":", 1)
  return out.replace(shape=params.shape, layout=name)


def stack_to_canonical(dense_to_canonical, prepared: QuantizedWeight, family: str,
                       dense_family: str) -> QuantizedWeight:
  """Inverse of :func:`stack_prepare`."""
  dense_name = prepared.layout.replace(family + ":", dense_family + ":", 1)
  out = jax.vmap(dense_to_canonical)(per_expert(prepared, dense_name))
  return out.replace(shape=prepared.shape, layout="canonical")


def prepare(params: QuantizedWeight) -> QuantizedWeight:
  """Canonical stacked (E, K, N) params -> per-expert slab layout, stacked on axis 0."""
  if params.num_experts is None:
    raise ValueError(f"grouped kernels need stacked experts (E, K, N); got shape "
                     f"{params.shape}")
  if params.act_scale is not None:
    raise ValueError("grouped WnA16 params carry no activation scale")
  e, k, n = params.shape
  lt = wna16.slab_layout(params.spec, k, fit_k=True)
  return stack_prepare(functools.partial(wna16.prepare, layout=lt), params, FAMILY,
                       wna16.FAMILY)


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare`."""
  return stack_to_canonical(wna16.to_canonical, prepared, FAMILY, wna16.FAMILY)


# ----------------------------------------------------------------------------------------
# Schedule
# ----------------------------------------------------------------------------------------
def max_tiles(m: int, num_experts: int, block_m: int) -> int:
  """Static bound on the tiles of any split of M rows into E expert segments + a tail."""
  return -(-m // block_m) + min(num_experts, m)


def tiles_of_pieces(piece_tiles: jax.Array, num_tiles: int
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Tile i -> (piece, tile index within the piece, used) for pieces of ``piece_tiles``
  consecutive tiles each; tiles past the last piece are unused (piece clipped to the last).

  "compare_all": one (tiles, pieces) compare-and-count fusion.  The default "scan" method
  is an XLA while loop of ~log2(pieces) iterations, each a few tiny kernels (and on the GPU
  a loop-predicate round trip): tens of µs of fixed cost per call at decode."""
  tile_end = jnp.cumsum(piece_tiles)
  i = jnp.arange(num_tiles, dtype=jnp.int32)
  piece = jnp.searchsorted(tile_end, i, side="right", method="compare_all").astype(jnp.int32)
  used = piece < piece_tiles.shape[0]
  piece = jnp.minimum(piece, piece_tiles.shape[0] - 1)
  return piece, i - (tile_end[piece] - piece_tiles[piece]), used


def tile_schedule(group_sizes: jax.Array, m: int, block_m: int, num_tiles: int
                  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per tile: (expert, row start, row end, kind) int32 arrays of length ``num_tiles``.

  kind 1: rows [start, end) of ``expert``; kind 0: rows [start, end) are written with zeros
  (the tail past ``sum(group_sizes)``; idle tiles have start == end).  Segments past row
  ``m`` are clipped (``lax.ragged_dot`` leaves sum(group_sizes) > M undefined)."""
  gs = jnp.maximum(group_sizes.astype(jnp.int32), 0)
  e = gs.shape[0]
  ends = jnp.minimum(jnp.cumsum(gs), m)
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
  total = ends[-1]
  p_start = jnp.concatenate([starts, total[None]])  # E expert segments + the zero tail
  p_end = jnp.concatenate([ends, jnp.full((1,), m, jnp.int32)])
  p_tiles = (p_end - p_start + block_m - 1) // block_m
  piece, local, used = tiles_of_pieces(p_tiles, num_tiles)
  start = p_start[piece] + local * block_m
  end = jnp.minimum(start + block_m, p_end[piece])
  start = jnp.where(used, start, 0)
  end = jnp.where(used, end, 0)
  kind = (used & (piece < e)).astype(jnp.int32)
  return jnp.minimum(piece, e - 1), start, end, kind


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------
def _kernel(sched_ref, x_ref, codes_ref, scales_ref, *rest, spec: QuantSpec,
            lt: lay.SlabLayout, tiles_per_split: int, group_rows: int, has_zeros: bool,
            has_s2: bool, has_bias: bool, split_k: int, block_m: int, compute_dtype):
  rest = list(rest)
  zeros_ref = rest.pop(0) if has_zeros else None
  s2_ref = rest.pop(0) if has_s2 else None
  bias_ref = rest.pop(0) if has_bias else None
  (o_ref,) = rest
  block_n = o_ref.shape[-1]
  i, split = pl.program_id(0), pl.program_id(2)
  base = i * _SCHED_FIELDS
  e = sched_ref[base]
  start = sched_ref[base + 1]
  end = sched_ref[base + 2]
  kind = sched_ref[base + 3]
  row_ok = (start + jnp.arange(block_m, dtype=jnp.int32) < end)[:, None]
  out_mask = jnp.broadcast_to(row_ok, (block_m, block_n))
  o_rows = o_ref.at[pl.ds(start, block_m), :]

  def load_x(k0, n):
    return plt.load(x_ref.at[pl.ds(start, block_m), pl.ds(k0, n)],
                    mask=jnp.broadcast_to(row_ok, (block_m, n)), other=0)

  @pl.when(kind == 1)
  def _compute():
    acc = jnp.zeros((block_m, block_n), jnp.float32)
    acc = wna16.accumulate_k(
        acc, load_words=lambda r, n: codes_ref[e, pl.ds(r, n), :], load_x=load_x,
        load_scale_row=lambda g: scales_ref[e, pl.ds(g, 1), :],
        load_zero_row=(lambda g: zeros_ref[e, pl.ds(g, 1), :]) if has_zeros else None,
        spec=spec, lt=lt, first_tile=split * tiles_per_split, num_tiles=tiles_per_split,
        group_rows=group_rows, compute_dtype=compute_dtype)
    if spec.granularity not in ("group", "block"):
      acc = acc * wna16._decode_scale_row(scales_ref[e, pl.ds(0, 1), :], spec)
    if has_s2:
      acc = acc * s2_ref[pl.ds(e, 1), :]
    if has_bias:
      b = bias_ref[pl.ds(e, 1), :]
      acc = acc + (b if split_k == 1 else jnp.where(split == 0, b, 0.0))
    plt.store(o_rows, acc.astype(o_ref.dtype), mask=out_mask)

  @pl.when(kind == 0)
  def _zero_fill():
    plt.store(o_rows, jnp.zeros((block_m, block_n), o_ref.dtype), mask=out_mask)


SMEM_BYTES = tuning.SMEM_BYTES


def smem_estimate(config: tuning.TuningConfig, lt: lay.SlabLayout, loop_tiles: int,
                  x_bytes: int = 2) -> int:
  """Rough shared memory (bytes) of one program: Triton's loop pipeliner keeps
  ``num_stages`` copies of every load of a K tile (x: block_m x block_k, codes:
  rows_per_tile x block_n words) plus the dequantized slab staged for the MMA.  A K loop
  of one trip is not pipelined (measured: (128, 128, 3 stages) ran for K=256 but failed
  with "Shared memory size limit exceeded" for K=4096 on the H200)."""
  per_tile = config.block_m * lt.block_k * x_bytes + lt.rows_per_tile * config.block_n * 4
  stages = config.num_stages if loop_tiles > 1 else 1
  return stages * per_tile + lt.slab * config.block_n * x_bytes


def fit_smem(config: tuning.TuningConfig, lt: lay.SlabLayout, loop_tiles: int,
             x_bytes: int = 2, budget: int = SMEM_BYTES) -> tuning.TuningConfig:
  """``config`` shrunk until :func:`smem_estimate` fits ``budget``: first 2 stages, then
  half the rows (down to 16), then half the columns (down to 32)."""
  c = config
  while smem_estimate(c, lt, loop_tiles, x_bytes) > budget:
    if c.num_stages > 2:
      c = dataclasses.replace(c, num_stages=2)
    elif c.block_m > 16:
      c = dataclasses.replace(c, block_m=c.block_m // 2)
    elif c.block_n > 32:
      c = dataclasses.replace(c, block_n=c.block_n // 2)
    else:
      break
  return c


def choose_config(m: int, e: int, n: int, k_tiles: int, spec_name: str, k: int,
                  lt: lay.SlabLayout | None = None, x_bytes: int = 2
                  ) -> tuning.TuningConfig:
  """The autotune cache entry for this shape if any, else :func:`grouped_heuristic`."""
  key = tuning.cache_key(f"{FAMILY}/e{e}", spec_name, tuning.bucket_m(m), n, k,
                         tuning.device_kind())
  return tuning.cached_config(key) or grouped_heuristic(
      m, e, n, k_tiles, sms=tuning.num_sms(), lt=lt, x_bytes=x_bytes)


def grouped_heuristic(m: int, e: int, n: int, k_tiles: int, *,
                      sms: int = tuning.NUM_SMS_DEFAULT, lt: lay.SlabLayout | None = None,
                      x_bytes: int = 2) -> tuning.TuningConfig:
  """Tiles from the expected rows per *active* expert (M rows over min(E, M) experts).

  Decode (few rows per expert): every active expert's weights are read once, the work is
  weight-bandwidth bound -> block_m 16, narrow N tiles, split K until ~2 programs per SM.
  Prefill (many rows per expert): MMA bound -> block_m 64/128, 128-wide N tiles, 2 stages,
  shrunk to fit shared memory (:func:`fit_smem`; ``lt`` default: int4 slab 64, K tile 512).
  The prefill tiles before that cap, (64|128, 128, 3 stages) with a 512-row K tile, needed
  288-864 KiB and failed to compile for Mixtral gate_up (reported as "OOM")."""
  lt = lt or lay.SlabLayout(4, 64)
  active = max(min(e, m), 1)
  rows = m / active
  if rows <= 32:
    block_m = 16 if rows <= 16 else 32
    block_n = 64 if n >= 64 * sms // 2 else 32
    while n % block_n:
      block_n //= 2
    programs = active * -(-int(rows) // block_m) * max(n // block_n, 1)
    split = 1
    for cand in (2, 3, 4, 6, 8, 12, 16):
      if programs * split >= 2 * sms:
        break
      if k_tiles % cand == 0 and k_tiles // cand >= 2:
        split = cand
    c = tuning.TuningConfig(block_m, block_n, split, num_warps=4, num_stages=3)
    return fit_smem(c, lt, k_tiles // split, x_bytes)
  bn = 128 if n % 128 == 0 else 64
  if rows <= 96:
    c = tuning.TuningConfig(64, bn, 1, num_warps=4, num_stages=2)
  else:
    c = tuning.TuningConfig(128, bn, 1, num_warps=8, num_stages=2)
  return fit_smem(c, lt, k_tiles, x_bytes)


def run(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
        interpret: bool = False, config: tuning.TuningConfig | None = None) -> jax.Array:
  """(M, K) rows sorted by expert x prepared stacked params -> (M, N) in x.dtype."""
  spec = params.spec
  e, k, n = params.shape
  _, lt = lay.parse_layout_name(params.layout)
  m = x.shape[0]
  kp = lt.k_of_rows(params.codes.shape[1])
  np_ = params.codes.shape[2]
  k_tiles = kp // lt.block_k
  if config is None:
    config = choose_config(m, e, np_, k_tiles, spec.name, k, lt,
                           jnp.dtype(x.dtype).itemsize)
  block_m = config.block_m
  block_n = min(config.block_n, np_)
  split_k = config.split_k if k_tiles % config.split_k == 0 else 1
  num_tiles = max_tiles(m, e, block_m)
  compute_dtype = x.dtype if x.dtype in (jnp.bfloat16, jnp.float16) else jnp.float32
  # On the GPU, masked loads/stores make rows past M harmless; the interpreter slices
  # blocks exactly, so there the row blocks must stay in bounds (pad block_m rows).
  row_pad = block_m if interpret else 0
  xp = x if (kp == k and not row_pad) else jnp.pad(x, ((0, row_pad), (0, kp - k)))
  mo = m + row_pad
  sched = jnp.stack(tile_schedule(group_sizes, m, block_m, num_tiles), axis=1).reshape(-1)

  has_zeros = params.zeros is not None
  has_s2 = params.global_scale is not None
  has_bias = params.bias is not None
  full = lambda shape: pl.BlockSpec(shape, lambda i, j, s: (0,) * len(shape))
  n_block = lambda a: pl.BlockSpec((*a.shape[:-1], block_n),
                                   lambda i, j, s: (0,) * (a.ndim - 1) + (j,))
  operands = [sched, xp, params.codes, params.scales]
  in_specs = [full(sched.shape), full(xp.shape), n_block(params.codes),
              n_block(params.scales)]
  if has_zeros:
    operands.append(params.zeros)
    in_specs.append(n_block(params.zeros))
  if has_s2:
    operands.append(params.global_scale.astype(jnp.float32).reshape(e, 1))
    in_specs.append(full((e, 1)))
  if has_bias:
    bias = jnp.pad(params.bias, ((0, 0), (0, np_ - n)))
    operands.append(bias)
    in_specs.append(n_block(bias))
  if split_k == 1:
    out_shape = jax.ShapeDtypeStruct((mo, np_), x.dtype)
    out_spec = pl.BlockSpec((mo, block_n), lambda i, j, s: (0, j))
  else:
    out_shape = jax.ShapeDtypeStruct((split_k, mo, np_), jnp.float32)
    out_spec = pl.BlockSpec((None, mo, block_n), lambda i, j, s: (s, 0, j))
  kernel = functools.partial(
      _kernel, spec=spec, lt=lt, tiles_per_split=k_tiles // split_k,
      group_rows=wna16._group_rows(spec, k), has_zeros=has_zeros, has_s2=has_s2,
      has_bias=has_bias, split_k=split_k, block_m=block_m, compute_dtype=compute_dtype)
  out = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(num_tiles, np_ // block_n, split_k),
      in_specs=in_specs,
      out_specs=out_spec,
      compiler_params=plt.CompilerParams(num_warps=config.num_warps,
                                         num_stages=config.num_stages),
      interpret=interpret,
      name=f"grouped_wna16_{spec.weight}_{lt.name}",
  )(*operands)
  if split_k > 1:
    out = out.sum(axis=0).astype(x.dtype)
  return out[:m, :n]


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, grouped=True))
