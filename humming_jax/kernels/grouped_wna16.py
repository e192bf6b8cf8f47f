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
Each program computes its tile's ``(expert, row start, row end, kind)`` from the (E,)
group sizes itself (:func:`tile_at`: two cumsums and a few reductions over E), so a call
is one launch -- at decode the schedule's former XLA ops (4 kernels, 4.4 us device time,
each with its launch gap) cost more than a third of the call (NOTES_moe.md session 6).

Kernel: grid = (tiles, N tiles, K splits).  A program loads rows ``[start, start+block_m)``
of x (masked to ``< end``), runs the K loop shared with the dense kernel
(:func:`humming_jax.kernels.wna16.accumulate_k`) on expert ``e``'s codes, and stores only
its own rows (masked store), so tiles of different experts may share a block of rows.
Split-K partials are float32 and summed by XLA; the bias is added by split 0 only.

Cost per call (prepared params): the kernel reads only the codes of the experts that own a
tile (inactive experts cost nothing: their codes are never loaded; the stacked-E BlockSpec
is only a base pointer), plus x and the (E,) group sizes.  No (E, K, N)
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


def per_expert_dense(prepared: QuantizedWeight, family: str,
                     dense_family: str) -> QuantizedWeight:
  """A :func:`stack_prepare` layout seen as one expert in the dense family's layout (for
  ``jax.vmap`` over E)."""
  return per_expert(prepared, prepared.layout.replace(family + ":", dense_family + ":", 1))


def stack_to_canonical(dense_to_canonical, prepared: QuantizedWeight, family: str,
                       dense_family: str) -> QuantizedWeight:
  """Inverse of :func:`stack_prepare`."""
  out = jax.vmap(dense_to_canonical)(per_expert_dense(prepared, family, dense_family))
  return out.replace(shape=prepared.shape, layout="canonical")


def stack_dequantize(dense_dequantize, prepared: QuantizedWeight, family: str,
                     dense_family: str, dtype) -> jax.Array:
  """(E, K, N) weights in ``dtype`` from a :func:`stack_prepare` layout, read per expert in
  the dense family's layout (``DenseKernel.dequantize``)."""
  return jax.vmap(lambda p: dense_dequantize(p, dtype))(
      per_expert_dense(prepared, family, dense_family))


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


def tile_at(group_sizes: jax.Array, m: int, block_m: int, i: jax.Array
            ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(expert, row start, row end, kind) int32 of tile ``i`` (a scalar, or an array of tile
  indices: fields of the same shape).

  kind 1: rows [start, end) of ``expert``; kind 0: rows [start, end) are written with zeros
  (the tail past ``sum(group_sizes)``; idle tiles have start == end).  Segments past row
  ``m`` are clipped (``lax.ragged_dot`` leaves sum(group_sizes) > M undefined).

  Written with cumsums and compare-and-count reductions over the E experts only, so the
  same code runs inside a Triton kernel (each program computes its own tile from the (E,)
  group sizes: no schedule ops or launches beside the kernel) and in XLA
  (:func:`tile_schedule`).  E must be a power of two inside a kernel (pad with empty experts)."""
  gs = jnp.maximum(group_sizes.astype(jnp.int32), 0)
  e = gs.shape[0]
  c = jnp.cumsum(gs)
  ends = jnp.minimum(c, m)
  starts = jnp.minimum(c - gs, m)
  seg_tiles = (ends - starts + block_m - 1) // block_m
  tile_end = jnp.cumsum(seg_tiles)
  i = jnp.asarray(i, jnp.int32)
  before = tile_end <= i[..., None]  # experts whose tiles all come before tile i
  piece = jnp.sum(before.astype(jnp.int32), axis=-1)  # tile i's expert; e: the zero tail
  pick = lambda v: jnp.sum(
      jnp.where(jnp.arange(e, dtype=jnp.int32) == piece[..., None], v, 0), axis=-1)
  local = i - jnp.sum(jnp.where(before, seg_tiles, 0), axis=-1)  # tile within its piece
  is_expert = piece < e
  seg_start = jnp.where(is_expert, pick(starts), jnp.max(ends))
  seg_end = jnp.where(is_expert, pick(ends), m)
  start = seg_start + local * block_m
  used = start < seg_end
  end = jnp.where(used, jnp.minimum(start + block_m, seg_end), 0)
  start = jnp.where(used, start, 0)
  kind = (used & is_expert).astype(jnp.int32)
  return jnp.minimum(piece, e - 1), start, end, kind


def tile_schedule(group_sizes: jax.Array, m: int, block_m: int, num_tiles: int
                  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """:func:`tile_at` for tiles 0 .. num_tiles - 1: (num_tiles,) int32 arrays."""
  return tile_at(group_sizes, m, block_m, jnp.arange(num_tiles, dtype=jnp.int32))


def pow2_experts(group_sizes: jax.Array) -> jax.Array:
  """(E,) -> (2^ceil(log2 E),) int32 group sizes, padded with empty experts (a Triton block
  is a power of two long; empty experts own no tile)."""
  e = group_sizes.shape[0]
  gs = group_sizes.astype(jnp.int32)
  p = 1 << max(e - 1, 0).bit_length()
  return gs if p == e else jnp.pad(gs, (0, p - e))


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------
def _kernel(gs_ref, x_ref, codes_ref, scales_ref, *rest, spec: QuantSpec,
            lt: lay.SlabLayout, tiles_per_split: int, group_rows: int, has_zeros: bool,
            has_s2: bool, has_bias: bool, split_k: int, block_m: int, m: int,
            num_experts: int, compute_dtype):
  rest = list(rest)
  zeros_ref = rest.pop(0) if has_zeros else None
  s2_ref = rest.pop(0) if has_s2 else None
  bias_ref = rest.pop(0) if has_bias else None
  (o_ref,) = rest
  block_n = o_ref.shape[-1]
  split = pl.program_id(2)
  e, start, end, kind = tile_at(gs_ref[...], m, block_m, pl.program_id(0))
  e = jnp.minimum(e, num_experts - 1)  # padded (empty) experts own no tile
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


def rows_per_active_expert(m: int, e: int) -> float:
  """The expected rows per active expert: M routed rows over min(E, M) experts (at most M
  of them can be non-empty); the quantity every grouped tiling rule starts from."""
  return m / max(min(e, m), 1)


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
  rows = rows_per_active_expert(m, e)
  if rows <= 32:
    block_m = 16 if rows <= 16 else 32
    # Each N tile re-reads its expert's activation rows: with more than one row per expert
    # 64-wide tiles halve that.  H200 grouped autotune (NOTES_moe.md session 8), DeepSeek-V3
    # gate_up (N 512): 64 tokens 316.9 -> 277.9 us, 1024 tokens 1949.6 -> 685.4.
    block_n = 64 if n >= 64 * sms // 2 or rows >= 2 else 32
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


def grouped_candidates(m: int, e: int, n: int, k_tiles: int, *,
                       lt: lay.SlabLayout | None = None, x_bytes: int = 2
                       ) -> list[tuning.TuningConfig]:
  """The autotune search space for M routed rows over E experts (``python -m
  humming_jax.autotune --grouped``): the heuristic's config first, then row tiles covering
  the expected rows per active expert (and the next smaller one), N tiles 32 ... 256, split
  K 1 / 2 / 4 while rows are few (decode).  Wide N tiles are in the space because an
  expert's activations are re-read once per N tile: at DeepSeek-V3 gate_up, 1024 tokens
  (32 rows per expert, N 512), the heuristic's 32-wide tiles read them 16 times, 1.9 GB
  beside 470 MB of weights (NOTES_moe.md session 7).  Every candidate is shrunk to fit
  shared memory (:func:`fit_smem`); duplicates dropped."""
  lt = lt or lay.SlabLayout(4, 64)
  rows = rows_per_active_expert(m, e)
  cover = 16
  while cover < min(rows, 128):
    cover *= 2
  block_ms = sorted({max(16, cover // 2), cover})
  splits = (1, 2, 4) if rows <= 32 else (1,)
  out = [grouped_heuristic(m, e, n, k_tiles, sms=tuning.num_sms(), lt=lt, x_bytes=x_bytes)]
  for bm in block_ms:
    for bn in (32, 64, 128, 256):
      if bn > n or n % bn:
        continue
      for split in splits:
        if k_tiles % split or k_tiles // split < 1:
          continue
        c = tuning.TuningConfig(bm, bn, split, num_warps=8 if bm * bn >= 128 * 128 else 4,
                                num_stages=3 if rows <= 32 else 2)
        c = fit_smem(c, lt, k_tiles // split, x_bytes)
        if c not in out:
          out.append(c)
  return out


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
  gs = pow2_experts(group_sizes)  # each program computes its own tile from these

  has_zeros = params.zeros is not None
  has_s2 = params.global_scale is not None
  has_bias = params.bias is not None
  full = lambda shape: pl.BlockSpec(shape, lambda i, j, s: (0,) * len(shape))
  n_block = lambda a: pl.BlockSpec((*a.shape[:-1], block_n),
                                   lambda i, j, s: (0,) * (a.ndim - 1) + (j,))
  operands = [gs, xp, params.codes, params.scales]
  in_specs = [full(gs.shape), full(xp.shape), n_block(params.codes),
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
      has_bias=has_bias, split_k=split_k, block_m=block_m, m=m, num_experts=e,
      compute_dtype=compute_dtype)
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
    name=FAMILY, layout=FAMILY, codes_ndim=3, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, grouped=True,
    dequantize=lambda params, dtype: stack_dequantize(
        wna16.KERNEL.dequantize, params, FAMILY, wna16.FAMILY, dtype)))
