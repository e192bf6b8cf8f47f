"""Grouped (MoE) WnA16 on the Mosaic GPU kernel: one expert per row tile (decode).

``y[r] = x[r] @ W_deq[expert(r)] + bias[expert(r)]`` for rows sorted by expert
(``group_sizes`` (E,) consecutive segments), ``lax.ragged_dot`` semantics: rows past
``sum(group_sizes)`` are zero.

Why: at decode every active expert's weights are read once and the work is weight-bandwidth
bound -- the regime of the dense Mosaic kernel (kernels/wna16_mgpu.py: int4 / fp4 codes
dequantized in registers as the WGMMA A operand, several warpgroups per CTA splitting K).
The Pallas-Triton grouped kernel (grouped_wna16.py) trails Humming by ~3x there
(benchmarks/NOTES_moe.md).

How: the dense kernel with a tile axis (``wna16_mgpu.Tiles``): each expert's rows are cut
into tiles of ``block_m`` rows starting at the expert's first row rounded down to a
multiple of 8 (:func:`tile_schedule`, computed on the device: no host sync, static shapes)
-- Mosaic's TMA into the swizzled x buffer needs the row offset provably a multiple of 8;
rows of the previous expert in front are computed and dropped.  Tile ``i`` reads its
(expert, first row) from the schedule, streams that expert's codes / scales by TMA
(inactive experts are never read) and x rows [first, first + block_m) straight from x, and
writes its own ``block_m`` output rows; one XLA gather picks each row from its tile (rows
past ``sum(group_sizes)`` zero).  Layout: the dense layout per expert, stacked on axis 0.

Status: interpreter-exact, lowers for the H200, GPU tests pass (sessions 6-12).
:func:`run` adds two launches beside the kernel: the schedule (:func:`schedule`, one
Pallas-Triton kernel) and the output gather;
:func:`run_aligned` (what ``hj.quant_moe`` uses when both stacks are in this layout) drops
the gather: tile-aligned segments, rows read and written in place; at decode
:func:`run_pairs` drops the sort and the schedule too: a tile per routed (token, slot) pair
from the router's ids (session 38: the whole layer at one token 2x faster).  Session 8
timed it on every MoE benchmark shape (gate_up at 1 / 64 / 1024 tokens, down at 1 / 1024;
benchmarks/NOTES_moe.md): ``hj.prepare(..., grouped=True)`` picks it for experts with
K >= 256 (4096 until session 15, 2048 in session 15, 768 until session 34; side by side
with the Pallas-Triton grouped kernel in sessions 16 and 34, :func:`priority_for`); with
shorter K the Triton kernel stays the per-stack default.  A whole
MoE layer (``moe.prepare_experts``) puts both of its stacks here wherever this kernel runs
them (session 9).  Launch shapes by
rows per tile, K and active experts (:func:`heuristic`, session 10): shared x tiles for
prefill, grid split-K 2 for narrow experts at decode.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax.kernels import grouped_wna16, registry, tuning, wna16_mgpu
from humming_jax.quantize import QuantizedWeight
from humming_jax.spec import QuantSpec

FAMILY = "grouped_wna16_mgpu"


def supports(spec: QuantSpec) -> bool:
  return wna16_mgpu.supports(spec)


def prepare(params: QuantizedWeight, *, permute: bool | None = None,
            mma: str = "bf16") -> QuantizedWeight:
  """Canonical stacked (E, K, N) params -> the dense Mosaic layout per expert, stacked
  (``permute``, ``mma``: as in ``wna16_mgpu.prepare``)."""
  if params.num_experts is None:
    raise ValueError(f"grouped kernels need stacked experts (E, K, N); got shape "
                     f"{params.shape}")
  if (why := wna16_mgpu.unsupported_reason(params.spec)) is not None:
    raise ValueError(f"spec {params.spec.name}: not supported by the {FAMILY} kernel ({why})")
  stacked = grouped_wna16.stack_prepare(
      functools.partial(wna16_mgpu.prepare, permute=permute, mma=mma), params, FAMILY,
      wna16_mgpu.FAMILY)
  return wna16_mgpu.settle_scale_fold(stacked)  # (per expert under vmap: traced there)


def to_canonical(prepared: QuantizedWeight) -> QuantizedWeight:
  """Inverse of :func:`prepare` (bit-exact)."""
  return grouped_wna16.stack_to_canonical(wna16_mgpu.to_canonical, prepared, FAMILY,
                                          wna16_mgpu.FAMILY)


MAX_BLOCK_M = 128  # above 64 rows: two warpgroups (wna16_mgpu.heuristic's prefill tile)
# Rows per tile a caller may ask for with an explicit one-accumulator launch (the fp8 route's
# fp8_single_acc, the 16-bit route's scales before the MMA): the widest WGMMA N (tokens are
# the MMA's N here)
MAX_RUN_BLOCK_M = 256


def block_rows(m: int, num_experts: int) -> int:
  """Rows per tile: the expected rows per active expert (M rows over min(E, M) experts)
  plus two standard deviations of a random routing, rounded up to the 8-row granule, at
  most 128.  Every tile dequantizes its expert's whole weight slab, so an expert cut into
  two tiles costs twice the dequantization: at DeepSeek-V3 gate_up, 1024 tokens (32 rows
  per expert on average) 32-row tiles split ~half the experts in two (H200 session 8: 493
  us); 48-row tiles almost none."""
  rows = grouped_wna16.rows_per_active_expert(m, num_experts)
  want = math.ceil(rows + 2 * math.sqrt(rows))
  return min(MAX_BLOCK_M, max(8, -(-want // 8) * 8))


def expected_tiles(rows: float, block_m: int) -> float:
  """The tiles an expert takes, expected over a random routing: an expert of n rows
  starting o rows past an 8-row boundary takes ceil((n + o) / block_m) tiles
  (:func:`tile_schedule`), n ~ Normal(rows, sqrt(rows)) (the binomial count of a uniform
  routing, slightly wide), o uniform in 0..7."""
  sd = max(math.sqrt(rows), 1e-9)
  total = weight = 0.0
  for i in range(-48, 49):  # +-6 standard deviations in steps of 1/8
    n = rows + i * sd / 8
    p = math.exp(-0.5 * (i / 8) ** 2)
    if n > 0:
      total += p * sum(math.ceil((n + o) / block_m) for o in range(8)) / 8
      weight += p
  return total / weight


# A tile's cost beyond its rows, in rows (:func:`cheapest_tile_rows`, both routes): fitted
# to the fp8 tiles' H200 times of session 26 below (the tiles of 128 rows cost ~9 % more
# per row than those of 152 at equal padded rows).
TILE_ROWS_OVERHEAD = 128


@functools.lru_cache(maxsize=256)  # (a few ms each; run() traces ask up to three times)
def cheapest_tile_rows(m: int, num_experts: int, choices: tuple[int, ...]) -> int:
  """Of ``choices`` (rows per tile), the one of least expected cost, tiles x (rows +
  :data:`TILE_ROWS_OVERHEAD`) (:func:`expected_tiles`), no wider than the rows
  (one expert) rounded up to 8 unless that is below 128: every tile streams its expert's
  whole weight slab, so a tile that splits an expert costs about a tile of 128 more rows."""
  rows = grouped_wna16.rows_per_active_expert(m, num_experts)
  best = min(choices, key=lambda b: (
      round(expected_tiles(rows, b) * (b + TILE_ROWS_OVERHEAD), 6), -b))
  return min(best, max(MAX_BLOCK_M, -(-m // 8) * 8))


def single_acc_tile_rows(m: int, num_experts: int) -> int:
  """Rows per tile for the one-accumulator fp8 tiles: of :data:`SINGLE_ACC_BLOCK_MS`, the
  one of least expected cost, tiles x (rows + :data:`TILE_ROWS_OVERHEAD`)
  (:func:`expected_tiles`).  Every tile streams its expert's whole weight slab, so a tile
  that splits an expert costs about a tile of 128 more rows.

  - Capped experts (~110+ rows; session 26): a ~256-row Mixtral expert at 1024 tokens took
    three 128-row tiles about half the time; two 144-row tiles hold it.  H200, CUPTI
    kernel us, 128 -> 144 / 160 rows per tile: Mixtral gate_up 1024 tokens 909.5 ->
    728.5 / 791.9, down 496.1 -> 341.5 / 396.9; gate_up 4096 tokens (~1024 rows per
    expert), 128 -> 152 / 160: 2869.2 -> 2617.8 / 2691.6.  The model picks 144 and 152.
  - Smaller experts (session 29; before, :func:`block_rows`' mean + 2 standard deviations,
    which splits ~6-15 % of them): the model picks a tile that holds nearly every expert
    in one.  H200, probe_fp8_moe.py --blocks, CUPTI kernel us, block_rows' tile -> the
    model's (on the launch :func:`heuristic` takes for it): Qwen3-30B-A3B gate_up 1024
    tokens (64 rows per expert) 80 -> 88 rows 141.3 -> 124.9 (96: 128.0; 112 on four
    warpgroups: 136.4), 256 tokens (16) 24 -> 32 rows 90.5 -> 80.3; down 1024 tokens 91.6
    -> 74.9; Mixtral down 64 tokens 24 -> 32 rows 162.7 -> 98.0 (the probe's routing took
    one tile per expert either way: why 24-row tiles ran so slowly there is not known);
    DeepSeek-V3 gate_up 1024 tokens: 48 either way (56 / 64: +3 / +4 %)."""
  return cheapest_tile_rows(m, num_experts, SINGLE_ACC_BLOCK_MS)


# The fewest rows per tile that run as one-accumulator fp8 tiles (below: 16-row tiles on
# one warpgroup over K, per-group partials).  H200 session 28, probe_fp8_moe.py --blocks,
# CUPTI kernel us, the per-group launch of the same rows -> one accumulator on four shared-x
# warpgroups: Qwen3-30B-A3B gate_up 256 tokens (24-row tiles) 118.1 -> 90.9, 1024 tokens
# (80 rows) 176.7 -> 140.7; DeepSeek-V3 gate_up 1024 tokens (48 rows) 249.9 -> 211.9; at
# 256 tokens DeepSeek-V3's 16-row per-group tiles ran 170.7, 24-row one-accumulator ones
# 166.0; at 64 tokens its 16-row tiles ran 134.6 per group, 136.9 with one accumulator
# (session 27, NOTES.md v28), so 16-row tiles stay.
SINGLE_ACC_MIN_ROWS = 24
# Rows per tile the one-accumulator fp8 tiles may take (:func:`single_acc_tile_rows`), up
# to 160: H200 session 26, ptxas 116-128 registers and no spills up to 160 on four
# shared-x warpgroups.  (From 152 rows four stages do not fit shared memory and fit_stages
# runs three; 136 and 152 rows have an odd count of 8-row groups, so an opt-in
# cluster_n=2 runs unclustered there.)
SINGLE_ACC_BLOCK_MS = tuple(range(SINGLE_ACC_MIN_ROWS, 161, 8))
# The widest tiles that run on two-warpgroup CTAs (:func:`_two_per_sm`): the widest timed
# that way on the one-accumulator route (H200 session 29; 104 rows with four stages, where
# two such CTAs do not fit an SM's shared memory, ran 177.7 us against 124.9 at 88 rows).
TWO_WG_MAX_ROWS = 96
# The fewest K steps (both warpgroups' together) for which the small decode CTAs of
# :func:`heuristic` (more than two waves) take two warpgroups of two stages rather than
# one of four: below, each warpgroup's two-stage pipeline fills and drains around a few
# steps.  H200 session 33, bench_moe, Qwen3-30B-A3B gate_up int4 g128 zp at 64 tokens
# (16-row tiles, 8 steps), us wall (device span) in two calls, two -> one warpgroup:
# 101.8 (97.7) -> 96.5 (89.9) and 101.5 (97.7) -> 90.1 (88.2) (session 15: 87.2 / 87.1
# CUPTI kernel us).  DeepSeek-V3 gate_up (28 steps) keeps two: 164.0 against 167.1
# (session 15); Mixtral gate_up (16) is untimed either way and keeps two.  Timed on
# run()'s 16-row tiles only: run_aligned's / run_pairs' 8-row ones (``hj.quant_moe``)
# keep two.
SMALL_TWO_WG_MIN_STEPS = 16
# Short experts (at most this many K tiles: K <= 768 at the 128-deep tile, DeepSeek-V3
# down's 256 and Qwen3-30B-A3B down's 768) on the 16-bit route stream up to
# STREAMED_BLOCKS column blocks per CTA (MgpuConfig.column_blocks) on one warpgroup,
# while that leaves at least STREAMED_MIN_WAVES CTAs per SM (:func:`streamed_blocks`),
# in tiles of up to STREAMED_MAX_ROWS rows (H200 session 35, DeepSeek-V3 down at 4096
# tokens, 128-row tiles: streamed 913.5 us against 878.9 on one warpgroup without blocks
# in one call; in the next, the four-warpgroup launch of before 897.9 against 887.8: it
# stays).  Through run() only: run_aligned's / run_pairs' tiles (``hj.quant_moe``) are
# untimed with it and keep one block per CTA.  Qwen3-30B-A3B down (6 K tiles), H200
# sessions 36-37, us wall, one -> two column blocks (the rule's at 16-256 tokens): 43.2
# -> 42.4 at 16 tokens, 57.0 -> 55.4 at 64, 72.9 -> 67.0 at 256 (32-row tiles); at 128
# (16-row tiles) 63.9 against 62.3 on the 16-row launch of :func:`heuristic` without
# blocks (noise ~3 %).
STREAMED_MAX_K_TILES = 6
STREAMED_MAX_ROWS = 64
STREAMED_BLOCKS = 8
STREAMED_MIN_WAVES = 8


def single_acc_tiles(params: QuantizedWeight | None) -> bool:
  """Whether tiles of :data:`SINGLE_ACC_MIN_ROWS` rows and more of ``params`` run as
  one-accumulator fp8 tiles on shared-x warpgroups (:func:`heuristic`,
  :func:`_single_acc_launch`; over 80 rows before session 28): the fp8-MMA layout marked ":cf"
  (``wna16_mgpu.single_acc_layout``, the check ``wna16_mgpu.run`` makes of the config),
  unless HUMMING_JAX_FP8_SINGLE_ACC=0."""
  return (params is not None and wna16_mgpu.single_acc_layout(params)
          and tuning.env_flag("HUMMING_JAX_FP8_SINGLE_ACC", True))


# Rows per tile the 16-bit-MMA tiles of 4-bit weights may take from
# :data:`SINGLE_ACC_MIN_ROWS` up (:func:`cheapest_tile_rows`; up to 128: past it, capped
# experts only, :data:`WIDE_BLOCK_MS`).
BF16_BLOCK_MS = tuple(range(SINGLE_ACC_MIN_ROWS, MAX_BLOCK_M + 1, 8))


def cost_sized_tiles(params: QuantizedWeight | None) -> bool:
  """Whether tiles of :data:`SINGLE_ACC_MIN_ROWS` rows and more of ``params`` take
  :func:`cheapest_tile_rows`' rows on two-warpgroup CTAs where four-warpgroup ones would
  make more than two waves (:func:`cost_sized_rows`; elsewhere the rows and launch of
  before): 4-bit weights on the 16-bit MMA, the
  rule session 29 found for the one-accumulator fp8 tiles (:func:`single_acc_tiles`).
  H200 session 32, bench_moe, Qwen3-30B-A3B gate_up at 1024 tokens (64 rows per expert),
  us wall (device span), 80-row tiles on four warpgroups (the rule before) -> 88 rows on
  two warpgroups of two stages: int4 g128 zp 208.5 (197.9) -> 186.7 (173.0), MXFP4 227.2
  (206.4) -> 197.8 (186.2); also timed (int4): 88 rows on four 200.6, on two of three
  stages (one CTA per SM) 235.5; 80 / 96 rows on two of two stages 193.7 / 194.5.
  Session 33, the same method, off -> on, int4 / MXFP4 wall: Qwen3 down 256 tokens
  96.8 / 103.2 -> 76.0 / 86.6, 1024 tokens 138.7 / 151.4 -> 121.6 / 130.3; Mixtral gate_up
  64 tokens 266.8 / 280.0 -> 230.6 / 264.0, 256 tokens 338.0 / 355.0 -> 329.6 / 347.2;
  DeepSeek-V3 gate_up 1024 tokens (48 rows either way) 304.5 / 316.2 -> 302.5 / 313.7.
  W4A8 / W4A4 experts on the 16-bit route (``grouped_wnam_mgpu``: the same kernel on
  bf16-rounded quantized x) take it too.  Only :func:`run`'s default launch
  (:func:`default_launch`); ``run_aligned`` / ``run_pairs`` (``hj.quant_moe``) keep their
  tiles (but for :func:`wide_tiles`' capped experts, :func:`aligned_tile_rows`).
  HUMMING_JAX_COST_TILES=0 turns it off (the A/B switch)."""
  return (params is not None and params.spec.weight_bits == 4
          and not wna16_mgpu.fp8_mma(params.layout)
          and tuning.env_flag("HUMMING_JAX_COST_TILES", True))


# Rows per tile the 16-bit-MMA tiles of capped experts may take (:func:`wide_tiles`): the
# one-accumulator fp8 route's from 128 up (session 26), so four shared-x warpgroups hold a
# tile's accumulator (b / 2 registers per thread of the 128 four leave).
WIDE_BLOCK_MS = tuple(r for r in SINGLE_ACC_BLOCK_MS if r >= MAX_BLOCK_M)
# On by default since session 67 (H100, bench_moe resident chain, µs wall per grouped GEMM,
# int4 g128 zp, Mixtral 1024 tokens, 128 -> 144 rows in two processes of one call: gate_up
# 1107.7 -> 921.9, down 580.7 -> 432.9; Humming 823.6 / 416.6 in the first).  Untimed: the
# 160 / 152 rows of 512 / 4096 tokens and other models at 4096 (the fp8 route's same picks
# won there in session 26), the fp4 formats' times (their 144-row tiles are GPU-tested).
WIDE_TILES = True


def wide_tiles(params: QuantizedWeight | None) -> bool:
  """Whether experts that :func:`block_rows` caps at :data:`MAX_BLOCK_M` rows (~105+ rows
  each) take :data:`WIDE_BLOCK_MS`' rows of least expected cost on the 16-bit route
  (:func:`tile_rows`), as the fp8 route's one-accumulator tiles do since session 26: a
  Mixtral expert of 256 +- 16 rows at 1024 tokens took three 128-row tiles about half
  the time, where two of 144 hold it.  The tile's launch is four shared-x warpgroups with
  the scales on the bf16 weights before the MMA (:func:`wna16_mgpu.shared_x_config` above
  64 rows): one accumulator, as on the fp8 route (times at :data:`WIDE_TILES`).  For
  :func:`run`'s tiles (:func:`tile_rows`) and ``hj.quant_moe``'s aligned segments
  (:func:`aligned_tile_rows`); :func:`cost_sized_tiles` params only.
  HUMMING_JAX_WIDE_TILES=0 / 1 overrides :data:`WIDE_TILES` (the A/B switch)."""
  return cost_sized_tiles(params) and tuning.env_flag("HUMMING_JAX_WIDE_TILES", WIDE_TILES)


def _wide_rows(m: int, num_experts: int, params: tuple[QuantizedWeight, ...]) -> int | None:
  """:data:`WIDE_BLOCK_MS`' rows of least expected cost where :func:`block_rows` caps the
  experts and :func:`wide_tiles` holds for every one of ``params``, else None."""
  if (params and block_rows(m, num_experts) == MAX_BLOCK_M
      and all(wide_tiles(p) for p in params)):
    return cheapest_tile_rows(m, num_experts, WIDE_BLOCK_MS)
  return None


def widest_rows(params: QuantizedWeight | None) -> int:
  """The widest tile :func:`run`'s default launch takes for ``params``: 160 rows on the
  one-accumulator routes (:func:`single_acc_tiles`, :func:`wide_tiles`), else
  :data:`MAX_BLOCK_M`."""
  return (max(SINGLE_ACC_BLOCK_MS) if single_acc_tiles(params) or wide_tiles(params)
          else MAX_BLOCK_M)


def _one_acc_launch(params: QuantizedWeight, config: wna16_mgpu.Config | None) -> bool:
  """Whether ``config`` (None: the default launch for ``params``) holds one accumulator
  per warpgroup, so its tiles may pass :data:`MAX_BLOCK_M` rows (per-group partials, or the
  16-bit route's scales after the MMA, take twice the registers): the fp8 route's
  ``fp8_single_acc``, the 16-bit route's scales on the weights before the MMA.  By the
  flag: where the kernel puts the scales before the MMA whatever it says (several scale
  rows per K tile: MXFP4 / NVFP4), ``scale_after_mma=True`` still counts as two (refused
  past 128 rows, the safe side)."""
  if config is None:
    return single_acc_tiles(params)
  return (config.fp8_single_acc if wna16_mgpu.fp8_mma(params.layout)
          else not config.scale_after_mma)


def _launch_widest(params: QuantizedWeight, config: wna16_mgpu.Config | None) -> int:
  """The most rows per tile ``config``'s registers hold: :data:`MAX_RUN_BLOCK_M` (the
  widest WGMMA N) for an explicit one-accumulator config, :func:`widest_rows` (the
  default launch's rows: 160 where a one-accumulator route is on) without one, else
  :data:`MAX_BLOCK_M`."""
  return (widest_rows(params) if config is None
          else MAX_RUN_BLOCK_M if _one_acc_launch(params, config) else MAX_BLOCK_M)


def _check_tile_rows(block_m: int, params: QuantizedWeight,
                     config: wna16_mgpu.Config | None) -> None:
  """``block_m`` rows per tile within :func:`_launch_widest`."""
  widest = _launch_widest(params, config)
  if block_m % 8 or not 8 <= block_m <= widest:
    raise ValueError(f"block_m={block_m} must be a multiple of 8 in [8, {widest}] (over "
                     f"{MAX_BLOCK_M}: one-accumulator tiles only -- Config.fp8_single_acc "
                     f"on the fp8 route, scale_after_mma=False on the 16-bit one; over "
                     f"{max(SINGLE_ACC_BLOCK_MS)}: with an explicit config)")


def aligned_tile_rows(m: int, num_experts: int, *params: QuantizedWeight) -> int:
  """Rows per tile of :func:`run_aligned` for M routed rows through every one of
  ``params`` on the same aligned segments (``hj.quant_moe``'s gate_up and down):
  :func:`block_rows`, or where that caps the experts and :func:`wide_tiles` holds for each
  of ``params``, :data:`WIDE_BLOCK_MS`' rows of least expected cost (the model counts a
  segment's first row off the 8-row grid, which aligned segments do not have: at most
  one tile too many per expert in its sum)."""
  return _wide_rows(m, num_experts, params) or block_rows(m, num_experts)


def tile_rows(m: int, num_experts: int, params: QuantizedWeight | None = None) -> int:
  """Rows per tile of :func:`run`: :func:`block_rows`, except that 8-row decode tiles
  become 16-row ones above 8 rows, and that tiles of :data:`SINGLE_ACC_MIN_ROWS` rows and
  more of ``params`` take the rows of least expected cost: on the one-accumulator fp8
  route :func:`single_acc_tile_rows` (capped ones only before session 29), 4-bit weights
  on the 16-bit MMA (:func:`cost_sized_tiles`, sessions 32-33) the same model's rows
  where their launch is two warpgroups (:func:`cost_sized_rows`: at most
  :data:`TWO_WG_MAX_ROWS`), and capped experts of those params past 128 rows where
  :func:`wide_tiles` is on.  A tile starts at its
  expert's first row rounded down to 8, so an expert whose rows cross an 8-row boundary
  took two 8-row tiles, each dequantizing its whole weight slab: a random top-8 routing
  of 64 tokens gave 251 tiles for 224 active DeepSeek-V3 experts and 170 for 123
  Qwen3-30B-A3B experts.  H200 session 12, DeepSeek-V3 gate_up at 64 tokens, the 8-row
  tiles' launch (:func:`heuristic` of ``block_rows``) on 16-row tiles: kernel 221.8 ->
  197.3 us (wall 233.1 -> 206.0).  Up to 8 rows (1 token, top-8) every row lies in one
  8-row window."""
  rows = block_rows(m, num_experts)
  if rows >= SINGLE_ACC_MIN_ROWS and single_acc_tiles(params):
    return single_acc_tile_rows(m, num_experts)
  if wide := _wide_rows(m, num_experts, (params,)):
    return wide
  if rows >= SINGLE_ACC_MIN_ROWS and cost_sized_tiles(params):
    rows = cost_sized_rows(m, params) or rows
  return 16 if rows == 8 and m > 8 else rows


def cost_sized_rows(m: int, params: QuantizedWeight) -> int | None:
  """:func:`cheapest_tile_rows` for M rows of :func:`cost_sized_tiles` params where
  their launch takes two warpgroups, else None (the rows and launch of before).  The rows
  alone on four warpgroups lost: H200 session 33, bench_moe, Mixtral down (one wave of
  four-warpgroup CTAs), us wall (device span), HUMMING_JAX_COST_TILES off -> on: int4
  g128 zp 64 tokens (24 -> 32 rows) 132.8 (128.9) -> 138.0 (132.9), 256 tokens (80 -> 88)
  164.5 (159.3) -> 173.1 (167.5); MXFP4 141.4 (135.2) -> 140.4 (135.4), 168.8 (164.2) ->
  176.0 (169.6).  (E is ``params``' experts.)"""
  e, _, n = params.shape
  rows = cheapest_tile_rows(m, e, BF16_BLOCK_MS)
  return rows if _cost_sized_launch(min(e, m), n, rows, params).warpgroups == 2 else None


def launch_rows(m: int, num_experts: int, block_m: int) -> int:
  """The rows :func:`heuristic` chooses the launch for, given ``block_m``-row tiles: the
  decode tiles of up to 16 rows keep the launch of the expected rows (:func:`block_rows`;
  16-row tiles on the 8-row launch is what session 12 measured), wider tiles their own
  (a decode launch cannot hold them: shared memory)."""
  return block_rows(m, num_experts) if block_m <= 16 else block_m


def default_launch(m: int, params: QuantizedWeight, block_m: int) -> wna16_mgpu.Config:
  """The launch :func:`run` takes for M rows of ``params`` in ``block_m``-row tiles
  without a config or a cache entry: :func:`heuristic` of :func:`launch_rows`, with about
  the active experts as the tiles.  :func:`cost_sized_tiles` params take the two- or
  four-warpgroup choice for tiles of 24+ rows, except on :func:`block_rows`' rows where
  :func:`cost_sized_rows` gives none (its fallback: the launch of before).  (Short
  experts' streamed launch, :func:`heuristic`, comes before that choice: their tile rows
  are still chosen by the cost model, for a launch they do not run.)"""
  e, _, n = params.shape
  cost_sized = (block_m >= SINGLE_ACC_MIN_ROWS and cost_sized_tiles(params)
                and not (block_m == block_rows(m, e) and cost_sized_rows(m, params) is None))
  return heuristic(min(e, m), n, params.codes.shape[-3], launch_rows(m, e, block_m),
                   params=params, tile_rows=block_m, cost_sized=cost_sized)


def heuristic(tiles: int, n: int, k_tiles: int, block_m: int, *,
              params: QuantizedWeight | None = None, tile_rows: int = 8,
              cost_sized: bool = False, streamed: bool = True) -> wna16_mgpu.Config:
  """Launch shape for tiles of one expert each whose experts are expected to hold
  ``block_m`` rows (:func:`launch_rows`: the tile rows, or for 16-row decode tiles the
  8 of :func:`block_rows`), ``tiles`` of them expected to compute (about the active
  experts), ``k_tiles`` K tiles per expert.  H200 sweeps of
  session 10 (benchmarks/NOTES_moe.md; int4 g128 zp, us per grouped GEMM):

  - Short experts (at most :data:`STREAMED_MAX_K_TILES` K tiles) on the 16-bit route,
    ``streamed`` (:func:`run`'s tiles; :func:`run_aligned` / :func:`run_pairs` pass
    False):
    one warpgroup streaming several column blocks per CTA (:func:`_streamed_launch`,
    session 35: DeepSeek-V3 down 64 / 256 tokens 155.0 -> 105.8 / 294.4 -> 139.6), where
    that leaves :data:`STREAMED_MIN_WAVES` CTAs per SM (:func:`streamed_blocks`).
  - fp8 one-accumulator tiles (24+ rows of ":cf" weights): four shared-x warpgroups, or
    two where four would make more than two waves (:func:`_single_acc_launch`, session
    29); the other fp8 routes below.
  - ``cost_sized`` (set by :func:`default_launch` only, for tiles of 24+ rows of
    :func:`cost_sized_tiles` params): the same choice of two or four shared-x warpgroups
    (session 32).
  - 16-row launches (:func:`block_rows` 16: about 5-8 rows per active expert) on the
    16-bit route: the decode branch's small CTAs below, one warpgroup of four stages
    (else the shared-x launch of the next rule).  H200 session 37, bench_moe resident
    chain (row consumer), us wall, the four shared-x warpgroups of before -> one
    warpgroup of four stages / two of two splitting K: DeepSeek-V3 gate_up 256 tokens
    318.1 -> 207.9 / 221.8, 192 tokens 257.4 -> 194.7 / 204.2; Qwen3-30B-A3B gate_up 128
    tokens 147.4 -> 96.2 / 106.3, down 88.9 -> 62.3 / 60.1; Mixtral gate_up 32 tokens
    293.3 -> 187.8 / 196.3, down 251.6 -> 115.5 / 111.0 (MXFP4 DeepSeek-V3 gate_up 256:
    336.4 -> 243.5 / 241.1).  Tiles of ~8 rows reuse an x tile little, and the 64-column
    CTAs make several waves of several CTAs per SM where the 256-column ones made few,
    long ones.  Timed through :func:`run`; :func:`run_aligned`'s 16-row tiles
    (``hj.quant_moe``: one expert per tile, as here) and the W4A8 / W4A4 experts of
    ``grouped_wnam_mgpu`` on this route take it too, untimed there.
  - 24+ rows per tile: warpgroups splitting N over one shared x tile
    (:func:`wna16_mgpu.shared_x_config`): each CTA reads its x rows once instead of once per
    64 columns.  DeepSeek-V3 gate_up / down at 1024 tokens (48-row tiles) 418.0 -> 345.7 /
    494.1 -> 415.9, Mixtral gate_up at 64 / 1024 tokens 336.7 -> 299.9 / 1491.5 -> 1175.9,
    Qwen3-30B-A3B gate_up / down at 1024 tokens 290.9 -> 232.0 / 213.9 -> 155.2.  Above 64
    rows the scales go on the bf16 weights before the MMA (register limit): relative error
    ~2.4e-3, the class of any bf16-dequantizing kernel.
  - 8-row tiles (decode): warpgroups splitting K (the dense decode shape), except when that
    leaves each warpgroup at most 2 of at least 3 K steps and the shared-x CTAs still make
    two waves: Qwen3 gate_up / down at 64 tokens 198.2 -> 143.3 / 99.1 -> 90.3 (since
    session 15 only where three of the small CTAs below do not fit an SM: W8A16).  It loses
    with long K (DeepSeek-V3 gate_up, 64 tokens: 246.3 -> 273.4), with one K step
    (DeepSeek-V3 down: 134.1 -> 279.0) and with few tiles (1 token: 26.2 -> 37.6).
  - Two warpgroups per CTA (each streaming half the K steps) when the 64-column CTAs of
    four make between one and two waves and two such CTAs fit one SM's shared memory
    (``params``' weights in ``tile_rows``-row tiles; without params: int4 g128 with zero
    points): Qwen3-30B-A3B gate_up at 1 token (8 experts x 24 column blocks = 192 CTAs on
    132 SMs), CUPTI kernel 11.66 -> 9.56 us (session 14).
  - Grid split-K 2 when the tiles' 64-column CTAs fill at most half the SMs (the dense
    narrow-N rule, NOTES.md v8): DeepSeek-V3 gate_up at 1 token (8 experts x 8 column
    blocks = 64 CTAs) 35.1 -> 29.6; XLA sums the two float32 partials.
  - More than two waves of 64-column CTAs (16-64 tokens): small CTAs, three or more per
    SM, so each SM runs several tiles' pipelines at once -- two warpgroups of two stages
    when the K steps split evenly between them, are at least
    :data:`SMALL_TWO_WG_MIN_STEPS` (session 33; any count for 8-row tiles) and three
    such CTAs fit an SM, else one
    warpgroup of four stages (two warpgroups on an odd step count degenerate to one with
    two stages; MXFP4's 16-row tiles miss the three by 144 bytes).  Humming runs 2-4
    CTAs per SM (NOTES_moe.md session 14).  H200 session 15, CUPTI kernel us, default ->
    wg2-st2 / wg1-st4: DeepSeek-V3 gate_up 64 tokens 196.5 -> 164.0 / 167.1, 16 tokens
    94.0 -> 82.2 / 85.7; Qwen3-30B-A3B gate_up 64 tokens 98.2 -> 87.2 / 87.1 (it was the
    shared-x rule's), down (3 K steps) 67.0 -> 54.9 / 48.6.
  - 8-row tiles of :func:`wna16_mgpu.mma_sync_applies` weights (int4 / uint4, MXFP4) whose
    warpgroups each stream at most :data:`MMA_SYNC_MAX_K_TILES` K tiles: the product on
    mma.sync (the dense decode's product of session 56) on whichever launch the rules
    above give (session 57, below)."""
  config = _launch_shape(tiles, n, k_tiles, block_m, params=params, tile_rows=tile_rows,
                         cost_sized=cost_sized, streamed=streamed)
  if (max(tile_rows, block_m) <= MMA_SYNC_TILE_ROWS and params is not None
      and config.cluster_n == 1 and warpgroup_k_tiles(config, k_tiles) <= mma_sync_max_k_tiles()
      and wna16_mgpu.mma_sync_applies(params)):
    # (a grouped launch's rows are its tiles': run() reads Tiles.block_m, not this one)
    config = dataclasses.replace(config, block_m=tile_rows, mma_sync=True)
  return config


# 8-row expert tiles take the product on mma.sync where each warpgroup streams at most
# MMA_SYNC_MAX_K_TILES K tiles (:func:`heuristic`).  H200 session 57, bench_moe resident
# chain at one token (8-row tiles), device span per grouped GEMM (the walls there are
# host-bound), the same launch on the WGMMA -> on mma.sync, K tiles per warpgroup in ():
# DeepSeek-V3 down (2) 12.5 / 12.5 -> 11.2 / 11.3 (two processes), Qwen3-30B-A3B down (2)
# 12.7 / 12.6 -> 10.6 / 10.6, gate_up (8) 13.2 -> 13.2, DeepSeek-V3 gate_up (14) 14.2 ->
# 13.9, Mixtral gate_up (16) 49.9 -> 47.7; Mixtral down (28) 28.7 -> 30.4 (not taken).  The
# whole layer (bench_moe_layer, pair tiles, HUMMING_JAX_MMA_SYNC=1 / 0, one process, every
# 8-row tile on mma.sync): Qwen3-30B-A3B one token 34.6 -> 32.0, DeepSeek-V3 one token
# 29.5 -> 30.1 (walls); at 16 tokens 152.1 -> 137.1, where its gate_up pairs (small CTAs
# of two warpgroups, 28 K tiles each) took it too -- beyond this bound, which keeps them
# on the WGMMA (untimed alone).  16-row tiles keep the WGMMA (dense 16-row mma.sync lost,
# H100 session 56).  Not timed on an H100.
MMA_SYNC_TILE_ROWS = 8
MMA_SYNC_MAX_K_TILES = 16


def mma_sync_max_k_tiles() -> int:
  """:data:`MMA_SYNC_MAX_K_TILES`, or HUMMING_JAX_MMA_SYNC_MAX_K_TILES where set (read at
  trace time, so one process can time two bounds: ``bench_moe_layer --env``)."""
  return tuning.env_int("HUMMING_JAX_MMA_SYNC_MAX_K_TILES", MMA_SYNC_MAX_K_TILES)


def warpgroup_k_tiles(config: wna16_mgpu.Config, k_tiles: int) -> int:
  """K tiles each warpgroup of ``config`` streams per column block for experts of
  ``k_tiles`` K tiles, as wna16_mgpu.run divides them (substeps, grid split-K, warpgroups
  splitting K; shared-x warpgroups each stream all of the CTA's K)."""
  sub = wna16_mgpu.divisor(config.substeps, k_tiles)
  steps = k_tiles // sub
  steps //= wna16_mgpu.divisor(config.split_k, steps)
  if config.split_warpgroups == "k":
    steps //= wna16_mgpu.divisor(config.warpgroups, steps)
  return steps * sub


def _launch_shape(tiles: int, n: int, k_tiles: int, block_m: int, *,
                  params: QuantizedWeight | None, tile_rows: int, cost_sized: bool,
                  streamed: bool) -> wna16_mgpu.Config:
  """:func:`heuristic`'s launch before its choice of MMA instruction."""
  fp8 = params is not None and wna16_mgpu.fp8_mma(params.layout)
  blocks = (0 if fp8 or not streamed or k_tiles > STREAMED_MAX_K_TILES
            or block_m > STREAMED_MAX_ROWS else streamed_blocks(tiles, n))
  if blocks > 1:
    return _streamed_launch(block_m, blocks)
  if block_m >= 16 and tile_rows <= 16 and fp8:
    # fp8-MMA layout, 16-row tiles: one warpgroup per CTA over K, not the shared-x CTAs
    # (H200 session 20, DeepSeek-V3 gate_up at 256 tokens, CUPTI kernel us: 224.7 ->
    # 168.4; the 16-bit route's conversion made the shared x tile pay, NOTES_moe.md).
    return dataclasses.replace(wna16_mgpu.shared_x_config(block_m), warpgroups=1,
                               substeps=1, split_warpgroups="k")
  if block_m >= SINGLE_ACC_MIN_ROWS and single_acc_tiles(params):
    # Weights whose e8m0 scales fold exactly against each column's largest (":cf",
    # wna16_mgpu.mark_column_fold): one accumulator per warpgroup (Config.fp8_single_acc)
    # leaves the registers (106 against 255 per thread in probe_wgmma_rate.py) for four
    # shared-x warpgroups, 256 columns per CTA, each x tile read half as often.  H200
    # session 25, probe_fp8_moe.py --single, CUPTI kernel us: Mixtral gate_up 1024 tokens
    # 1151.6 -> 922.1 (clusters of two: 939.5), 4096 tokens 3643.6 -> 2891.8, down 1024
    # 633.3 -> 514.2; the same fold on the two-warpgroup launch: 1138.5 (NOTES_moe.md
    # session 25).  The fp8 MMA then sums all of K in its reduced-precision accumulator:
    # 1.7e-3 / 2.6e-3 against the reference at K 4096 / 14336 (bench_moe), the class of
    # w8a8_mgpu's fp8 GEMM and of the 16-bit route, against ~3e-4 for per-group partials.
    # HUMMING_JAX_FP8_SINGLE_ACC=0 keeps the per-group launch below.
    return _single_acc_launch(tiles, n, block_m, params)
  if block_m > 80 and fp8:
    # fp8-MMA layout, wide tiles: two shared-x warpgroups.  Four leave 128 registers per
    # thread, and a 128-row tile's running sum and group partial take 64 each: H200
    # session 21, Mixtral gate_up / down at 1024 tokens (128-row tiles), CUPTI kernel us,
    # 7089.6 -> 1199.3 / 3932.8 -> 657.8.  80-row tiles (256 tokens) run well on four:
    # 316.6 against 388.0 on two.  (Tiles of 88-120 rows are untimed.)  Pairs of column
    # CTAs as one cluster, each x tile read once per pair and multicast (Config.cluster_n):
    # H200 session 24, probe_fp8_moe.py at 1024 tokens, CUPTI kernel us: Mixtral gate_up
    # 1191.6 -> 1146.6 (four: 1266.3), down 655.6 -> 631.4 (four: 633.1).  The 16-bit
    # route's tiles lose with it (990.2 -> 1016.4, 544.4 -> 565.5): not there.
    return dataclasses.replace(wna16_mgpu.shared_x_config(block_m, warpgroups=2),
                               cluster_n=2)
  if cost_sized:
    return _cost_sized_launch(tiles, n, block_m, params)
  if block_m > 16:
    return wna16_mgpu.shared_x_config(block_m)
  config = wna16_mgpu.heuristic(block_m)
  steps = k_tiles // wna16_mgpu.divisor(config.substeps, k_tiles)  # as run() does
  col_blocks = tiles * -(-n // wna16_mgpu.BLOCK_N)
  if col_blocks > 2 * tuning.num_sms():
    small = [small_cta(block_m, 1, 4)]
    if (block_m <= 8 and steps % 2 == 0
        and (steps >= SMALL_TWO_WG_MIN_STEPS or tile_rows <= 8)):
      small.insert(0, small_cta(block_m, 2, 2))
    for candidate in small:
      if _fits_per_sm(candidate, params, tile_rows, 3):
        return candidate
  if block_m > 8:
    # 16-row launches the small CTAs do not take (two waves or fewer, or three do not fit
    # an SM: W8A16) keep the shared-x launch of before session 37 (untimed otherwise).
    return wna16_mgpu.shared_x_config(block_m)
  wgs = config.warpgroups
  per_wg = steps // wna16_mgpu.divisor(wgs, steps)
  if steps >= 3 and per_wg <= 2 and col_blocks >= 2 * wgs * tuning.num_sms():
    return dataclasses.replace(config, split_warpgroups="n")
  if (wgs == 4 and steps % 2 == 0 and tuning.num_sms() < col_blocks <= 2 * tuning.num_sms()
      and _fits_per_sm(dataclasses.replace(config, warpgroups=2), params, tile_rows, 2)):
    # Between one and two waves of 4-warpgroup CTAs: two CTAs of two warpgroups per SM
    # run the tiles in one wave.
    return dataclasses.replace(config, warpgroups=2)
  if 2 * col_blocks <= tuning.num_sms():
    config = dataclasses.replace(config, split_k=2)
  return config


def small_cta(block_m: int, warpgroups: int, stages: int) -> wna16_mgpu.Config:
  """The decode tiles' small CTA: the dense decode launch for ``block_m`` rows
  (``wna16_mgpu.heuristic``: warpgroups splitting K, two K tiles per step) with
  ``warpgroups`` warpgroups and ``stages`` stages (:func:`heuristic`'s 16-64-token
  launches, :func:`_streamed_launch`'s base, :func:`launch_candidates`)."""
  return dataclasses.replace(wna16_mgpu.heuristic(block_m), warpgroups=warpgroups,
                             stages=stages)


def streamed_blocks(tiles: int, n: int) -> int:
  """Column blocks per CTA for short experts (:func:`heuristic`): the most, up to
  :data:`STREAMED_BLOCKS` and halving, that leave at least :data:`STREAMED_MIN_WAVES` CTAs
  per SM of the ``tiles`` tiles' 64-column blocks (1: none; run() lowers it further to a
  divisor of the column blocks)."""
  col_blocks = tiles * -(-n // wna16_mgpu.BLOCK_N)
  blocks = STREAMED_BLOCKS
  while blocks > 1 and col_blocks < blocks * STREAMED_MIN_WAVES * tuning.num_sms():
    blocks //= 2
  return blocks


def _streamed_launch(block_m: int, blocks: int) -> wna16_mgpu.Config:
  """The launch of short experts' tiles (:func:`heuristic`): one warpgroup, four stages,
  ``blocks`` column blocks streamed per CTA -- the decode launch (two K tiles per step)
  for 8-row launches, the shared-x launch's shape on one warpgroup for wider tiles.

  Why: at K 256 a 64-column block is one or two pipeline steps, so a CTA of one block is
  mostly fixed cost (launch, barrier set-up, the first TMA latency, the store wait).  H200
  session 35, DeepSeek-V3 down (E 256, K 256, N 7168), int4 g128 zp, bench_moe resident
  chain us: 64 tokens (8-row launch) 155.0 -> 121.2 / 112.8 / 105.8 with 2 / 4 / 8
  blocks; 256 tokens (16-row tiles) four shared-x warpgroups 294.4 -> 214.5 with 8
  blocks, one warpgroup with 8 blocks 139.6; MXFP4 with 4 blocks 173.2 -> 135.6 /
  341.7 -> 235.2.  As the default: 16 tokens 75.4 -> 57.5, 1024 tokens (48-row tiles, two
  shared-x warpgroups before) 329.2 -> 227.4.  1 token (8 tiles, 896 column blocks: ~7 CTAs
  per SM) loses with any (17.7 -> 20.8 / 22.2 / 19.9 with 2 / 4 / 8 blocks, 448 / 224 /
  112 CTAs on 132 SMs; 27.0 on one warpgroup with 8), hence the waves bound."""
  if block_m <= 8:
    config = small_cta(block_m, 1, 4)
  else:
    config = wna16_mgpu.shared_x_config(block_m, warpgroups=1)
  return dataclasses.replace(config, column_blocks=blocks)


def _single_acc_launch(tiles: int, n: int, block_m: int, params: QuantizedWeight
                       ) -> wna16_mgpu.Config:
  """The one-accumulator launch (:func:`heuristic`): four shared-x warpgroups (256
  columns per CTA), or two (128 columns) where the four-warpgroup CTAs make more than two
  waves, the tile has at most :data:`TWO_WG_MAX_ROWS` rows and two such CTAs
  fit an SM's shared memory (the most stages up to the config's for which they do).

  Why: with one accumulator the four-warpgroup CTA holds a whole SM (~106 registers per
  thread), so its pipeline's fill and its epilogue stand alone in every wave; two CTAs
  of two warpgroups per SM overlap one's with the other's K loop.  Wide tiles (128+ rows)
  keep four: they re-read x, and 256 columns per CTA read it half as often (session 25).
  H200 session 29, probe_fp8_moe.py --blocks, CUPTI kernel us, four -> two warpgroups at
  the same rows: DeepSeek-V3 down 1024 tokens (48 rows, K 256: two K tiles per CTA) 313.6
  -> 200.2; Qwen3-30B-A3B down 1024 tokens (88 rows) 85.5 -> 74.9, 256 tokens (32) 66.6
  -> 50.2; Qwen3 gate_up 256 tokens (32 rows) 99.8 -> 80.3, 1024 tokens (88) 124.9 ->
  124.9; Mixtral gate_up 64 / 256 tokens (32 / 88 rows) 206.8 -> 171.0 / 255.6 -> 246.1;
  DeepSeek-V3 gate_up 1024 tokens (48) 212.2 -> 214.0 (three stages: 210.4).  One wave
  of four-warpgroup CTAs stays on four: Mixtral down 64 tokens (32 rows, 128 CTAs) 98.0
  against 168.3 on two, 256 tokens (88 rows) 117.9 against 132.3."""
  single = lambda wgs: dataclasses.replace(
      wna16_mgpu.shared_x_config(block_m, warpgroups=wgs), fp8_single_acc=True)
  return _two_per_sm(single(4), single(2), tiles, n, block_m, params, fp8_route=True)


def _cost_sized_launch(tiles: int, n: int, block_m: int, params: QuantizedWeight | None
                       ) -> wna16_mgpu.Config:
  """The launch of :func:`cost_sized_tiles` tiles (:func:`heuristic`): four shared-x
  warpgroups, or two where four would make more than two waves (:func:`_two_per_sm`; the
  timed two-warpgroup launch keeps four's scale placement)."""
  four = wna16_mgpu.shared_x_config(block_m)
  return _two_per_sm(four, dataclasses.replace(four, warpgroups=2), tiles, n, block_m,
                     params)


def _two_per_sm(four: wna16_mgpu.Config, two: wna16_mgpu.Config, tiles: int, n: int,
                block_m: int, params: QuantizedWeight | None, *, fp8_route: bool = False
                ) -> wna16_mgpu.Config:
  """``four`` (a four-warpgroup shared-x launch), or ``two`` (its two-warpgroup form) with
  the most stages (up to its own) for which two CTAs fit an SM, where ``four``'s CTAs make
  more than two waves and the tile has at most :data:`TWO_WG_MAX_ROWS` rows
  (:func:`_single_acc_launch`, :func:`cost_sized_tiles`)."""
  ctas = tiles * -(-n // (4 * wna16_mgpu.BLOCK_N))
  if block_m > TWO_WG_MAX_ROWS or ctas <= 2 * tuning.num_sms():
    return four
  for stages in range(two.stages, 1, -1):
    candidate = dataclasses.replace(two, stages=stages)
    if _fits_per_sm(candidate, params, block_m, 2, fp8_route=fp8_route):
      return candidate
  return four


def _fits_per_sm(config: wna16_mgpu.Config, params: QuantizedWeight | None,
                 tile_rows: int, ctas: int, *, fp8_route: bool = False) -> bool:
  """Whether ``ctas`` CTAs of ``config`` fit one SM's shared memory, counted as
  ``wna16_mgpu.smem_bytes`` does (one x tile per slot for ``split_warpgroups="n"``, one
  per warpgroup else).  ``fp8_route``: with the fp8-MMA route's buffers (1-byte x, the
  scale rows in their 16-bit dtype or float32, the row scales); without it the 16-bit
  route's, which the decode rules' launches were timed with (NOTES_moe.md session 20: the
  fp8 route's x counted as 2 bytes then)."""
  if params is None:  # the measured case: int4 g128 with zero points
    bits, has_zeros, bk, gpt, col = 4, True, 128, 1, False
  else:
    spec = params.spec
    bits, has_zeros = spec.weight_bits, params.zeros is not None
    bk = wna16_mgpu.block_k_for(spec)
    gpt, col = bk // wna16_mgpu.scale_k(spec), wna16_mgpu.column_scaled(spec)
  fp8 = {}
  if fp8_route:
    fp8 = dict(x_bytes=1, x_scales=True,
               scale_bytes=(params.scales.dtype.itemsize
                            if params.scales.dtype in (jnp.bfloat16, jnp.float16) else 4))
  need = wna16_mgpu.smem_bytes(tile_rows, config.stages, config.substeps, bk, bits, has_zeros,
                               warpgroups=config.warpgroups, scale_rows=gpt,
                               column_scale=col, share_x=config.split_warpgroups == "n",
                               column_blocks=config.column_blocks, **fp8)
  return ctas * (need + 1024) <= tuning.SM_SMEM_BYTES


def launch_cache_key(params: QuantizedWeight, m: int) -> str:
  """The autotune cache key of :func:`run`'s launch for M rows of ``params``: experts and
  the default rows per tile (:func:`tile_rows`: the rows per expert, which the M bucket
  alone does not tell -- it stops at 8192), weight spec and route (the fp8-MMA layout
  ":p8"; ":cf" where the one-accumulator tiles run, :func:`single_acc_tiles`), M bucket,
  N, K and the device kind."""
  e, k, n = params.shape
  name = (params.spec.name + (":p8" if wna16_mgpu.fp8_mma(params.layout) else "")
          + (":cf" if single_acc_tiles(params) else ""))
  return tuning.cache_key(f"{FAMILY}/e{e}/r{tile_rows(m, e, params)}", name,
                          tuning.bucket_m(m), n, k, tuning.device_kind())


def cached_launch(params: QuantizedWeight, m: int) -> tuple[int, wna16_mgpu.Config] | None:
  """(rows per tile, launch) of the autotune cache for M rows of ``params``, or None.  A
  grouped entry is a ``Config`` whose ``block_m`` is the rows per tile (the grouped
  kernel's tiles carry their own rows; a Config's block_m sizes dense CTAs only).  One
  entry serves every M of its key (the same M bucket and default rows per tile), as the
  autotune command measured it at one M.  Entries the default path would not run are
  ignored with a warning: rows past its widest (:func:`widest_rows` for a one-accumulator
  launch, else :data:`MAX_BLOCK_M`), or a one-accumulator fp8 launch where that route is
  off (weights not marked ":cf", HUMMING_JAX_FP8_SINGLE_ACC=0)."""
  key = launch_cache_key(params, m)
  cfg = tuning.cached_config(key, wna16_mgpu.Config)
  if cfg is None:
    return None
  widest = widest_rows(params) if _one_acc_launch(params, cfg) else MAX_BLOCK_M
  why = (f"{cfg.block_m} rows per tile (at most {widest} on this route)"
         if cfg.block_m > widest else
         "a one-accumulator launch, and that route is off for these params"
         if cfg.fp8_single_acc and not single_acc_tiles(params) else None)
  if why is not None:
    warnings.warn(f"ignoring autotune cache entry {key!r}: {why}", stacklevel=3)
    return None
  return cfg.block_m, cfg


SMALL_CTA_MAX_ROWS = 32  # the widest tiles launch_candidates tries on the decode CTAs


def launch_candidates(m: int, params: QuantizedWeight) -> list[tuple[int, wna16_mgpu.Config]]:
  """The autotune search space of :func:`run`'s launch for M rows of ``params``: (rows per
  tile, Config) pairs, the default first.  Rows: the default's, 8 either side and
  :func:`block_rows`'; launches: :func:`heuristic`'s at those rows, shared-x CTAs of
  two and four warpgroups (on the one-accumulator route with 2-4 stages: H200 session 29
  found the best of these to move with the shape, NOTES.md v30), and on the 16-bit route
  for tiles of up to :data:`SMALL_CTA_MAX_ROWS` rows the decode tiles' small CTAs (two
  warpgroups splitting K over two stages, one over four): H200 session 36 found
  DeepSeek-V3 gate_up at 256 tokens (16-row tiles on four shared-x warpgroups) at 0.55x
  Humming with that launch never timed there; session 37 timed it and made it the
  16-row launches' default (:func:`heuristic`, NOTES_moe.md).  A launch on mma.sync
  (8-row tiles, session 57) comes with its WGMMA form."""
  e = params.shape[0]
  single = single_acc_tiles(params)
  widest = widest_rows(params)
  default = tile_rows(m, e, params)
  launch = functools.partial(default_launch, m, params)
  out = [(default, launch(default))]
  for rows in sorted({default - 8, default, default + 8, block_rows(m, e)}):
    if not 8 <= rows <= widest:
      continue
    out.append((rows, launch(rows)))
    if out[-1][1].mma_sync:  # (8-row tiles: the same launch on the WGMMA too)
      out.append((rows, dataclasses.replace(out[-1][1], mma_sync=False)))
    if rows < 16:
      continue
    for wgs in (2, 4):
      base = wna16_mgpu.shared_x_config(rows, warpgroups=wgs)
      if single and rows >= SINGLE_ACC_MIN_ROWS:
        out += [(rows, dataclasses.replace(base, fp8_single_acc=True, stages=st))
                for st in (2, 3, 4)]
      elif rows <= MAX_BLOCK_M:
        out.append((rows, base))
    if rows <= SMALL_CTA_MAX_ROWS and not wna16_mgpu.fp8_mma(params.layout):
      out += [(rows, small_cta(8, wgs, st)) for wgs, st in ((2, 2), (1, 4))]
  return list(dict.fromkeys(out))  # (in order, once each)


def max_tiles(m: int, num_experts: int, block_m: int) -> int:
  """Static bound on the tiles of any split: each of the at most min(E, M) non-empty
  segments adds up to 7 rows (its start rounded down to 8) and one partial tile; and every
  tile holds at least one of the M rows as its own, so at most M tiles.  (The grid is this
  bound: at 1 token, top-8, the first bound alone launched twice the CTAs, half of them
  idle -- Nsight Compute, NOTES_moe.md session 10.)"""
  active = min(num_experts, m)
  return min(m, -(-(m + 7 * active) // block_m) + active)


def _segments(group_sizes: jax.Array, m: int, block_m: int
              ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per expert: (start, end, first tile row, tiles) int32 of its rows [start, end)
  clipped to M, covered by ``block_m``-row tiles from ``8 * (start // 8)``.  Along the
  last axis (the experts), so the schedule kernel runs it on a (1, E) row too."""
  gs = jnp.maximum(group_sizes.astype(jnp.int32), 0)
  incl = jnp.cumsum(gs, axis=-1)
  ends = jnp.minimum(incl, m)
  starts = jnp.minimum(incl - gs, m)
  first = starts // 8 * 8
  seg_tiles = jnp.where(ends > starts, (ends - first + block_m - 1) // block_m, 0)
  return starts, ends, first, seg_tiles


def tile_schedule(group_sizes: jax.Array, m: int, block_m: int, num_tiles: int
                  ) -> tuple[jax.Array, ...]:
  """Per tile: (expert, first x row (a multiple of 8), first own row, end, kind) int32.

  Expert e's rows [start_e, end_e) (clipped to M) are covered by tiles starting at
  ``8 * (start_e // 8)``; tile rows outside [own, end) belong to other experts or none and
  are dropped.  kind 1: a tile to compute; 0: unused (all fields 0)."""
  starts, ends, first, seg_tiles = _segments(group_sizes, m, block_m)
  piece, local, used = grouped_wna16.tiles_of_pieces(seg_tiles, num_tiles)
  row0 = first[piece] + local * block_m
  own = jnp.maximum(row0, starts[piece])
  end = jnp.minimum(row0 + block_m, ends[piece])
  zero = lambda v: jnp.where(used, v, 0)
  return piece, zero(row0), zero(own), zero(end), used.astype(jnp.int32)


def output_rows(group_sizes: jax.Array, m: int, block_m: int, num_tiles: int) -> jax.Array:
  """(M,) int32: the row of the (num_tiles * block_m, N) stacked tile outputs that output
  row r takes, or num_tiles * block_m (out of range: the fill-mode gather's zero).  Row r
  of expert e lies in e's tile ``(r - first_e) // block_m`` at slot
  ``(r - first_e) % block_m``; rows past sum(group_sizes) take the zero.  Gathers only
  (no scatter), so XLA fuses it into the output gather (the interpreter's form; on a GPU
  :func:`schedule` computes the same in its launch): one kernel fewer per call at
  decode.  The expert search compares every row with every expert's end (M x E: ~33 M
  compares at 16k tokens x top-8 x 256 experts; still one small fusion)."""
  starts, ends, first, seg_tiles = _segments(group_sizes, m, block_m)
  r = jnp.arange(m, dtype=jnp.int32)
  e = jnp.minimum(jnp.searchsorted(ends, r, side="right", method="compare_all"),
                  ends.shape[0] - 1).astype(jnp.int32)
  local = r - first[e]
  tile = jnp.cumsum(seg_tiles)[e] - seg_tiles[e] + local // block_m
  ok = (r < ends[-1]) & (tile < num_tiles)
  return jnp.where(ok, tile * block_m + local % block_m, num_tiles * block_m)


def reference_schedule(group_sizes: jax.Array, m: int, block_m: int, num_tiles: int
                       ) -> tuple[jax.Array, jax.Array]:
  """What :func:`schedule` returns, in XLA: :func:`tile_schedule`'s (expert, first row,
  end, kind) per tile flattened (the kernel's ``Tiles.sched``) and :func:`output_rows`."""
  expert, row0, _, end, kind = tile_schedule(group_sizes, m, block_m, num_tiles)
  return (jnp.stack([expert, row0, end, kind], axis=1).reshape(-1),
          output_rows(group_sizes, m, block_m, num_tiles))


SCHEDULE_BLOCK = 32  # tiles and output rows per program of the schedule kernel
# Warps per program of the schedule kernel.  H200 session 17: 3.6 us at DeepSeek-V3 (E =
# 256) and 3.1 at Qwen3 (E = 128) for 1 token, each grouped GEMM's own when every call has
# its own routing -- a latency chain of ~14 reductions over E lanes, cross-warp at 4 warps
# (shared memory and a barrier each).  Fewer warps reduce in shuffles, but timed on the
# H200 (session 18, DeepSeek-V3, 1 token, probe_timeline.py --schedule-warps) 1 / 2 / 4
# warps ran 4.06 / 3.39 / 3.36 us, so 4 stays.
SCHEDULE_WARPS = 4


def _schedule_kernel(gs_ref, sched_ref, src_ref, *, m: int, block_m: int, num_tiles: int,
                     experts: int):
  """One program: tiles and output rows [i * B, (i + 1) * B) of :func:`tile_schedule` and
  :func:`output_rows`, from the E group sizes (every program redoes the two cumsums over E:
  a few hundred adds).  Gathers by expert index are one-hot sums over E (Triton has no
  register gather)."""
  b = sched_ref.shape[0]
  lane = jnp.arange(gs_ref.shape[0], dtype=jnp.int32)[None, :]  # (1, E padded)
  real = lane < experts
  _, ends, first, seg_tiles = _segments(gs_ref[...][None, :], m, block_m)
  tile_end = jnp.cumsum(seg_tiles, axis=1)

  def at(vec, idx):  # vec[idx] for an index column (B, 1) -> (B, 1)
    return jnp.sum(jnp.where(lane == idx, vec, 0), axis=1, keepdims=True)

  def count_le(vec, v):  # searchsorted(vec[:E], v, side="right") by compare-and-count
    return jnp.sum(jnp.where(real & (vec <= v), 1, 0), axis=1, keepdims=True)

  i = pl.program_id(0) * b + jnp.arange(b, dtype=jnp.int32)[:, None]  # (B, 1)
  # Tiles: expert piece, first x row, end, kind (tile_schedule).
  piece = count_le(tile_end, i)
  used = piece < experts
  piece = jnp.minimum(piece, experts - 1)
  row0 = at(first, piece) + (i - (at(tile_end, piece) - at(seg_tiles, piece))) * block_m
  end = jnp.minimum(row0 + block_m, at(ends, piece))
  field = jnp.arange(4, dtype=jnp.int32)[None, :]
  sched_ref[...] = jnp.where(field == 0, piece, jnp.where(
      used, jnp.where(field == 1, row0, jnp.where(field == 2, end, 1)), 0))
  # Output rows: the stacked tile row each takes (output_rows).
  e = jnp.minimum(count_le(ends, i), experts - 1)
  local = i - at(first, e)
  tile = at(tile_end, e) - at(seg_tiles, e) + local // block_m
  total = jnp.max(jnp.where(real, ends, 0), axis=1, keepdims=True)
  ok = (i < total) & (tile < num_tiles)
  src_ref[...] = jnp.where(ok, tile * block_m + local % block_m, num_tiles * block_m)[:, 0]


def schedule(group_sizes: jax.Array, m: int, block_m: int, num_tiles: int, *,
             interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """:func:`tile_schedule`'s (expert, first row, end, kind) per tile, flattened -- the
  kernel's ``Tiles.sched`` -- and :func:`output_rows`, in one Pallas-Triton launch.

  Why: written in XLA the two took six small fusions (cumsums as reduce-windows, each
  searchsorted a compare and a reduce, a concatenate) beside the kernel and the output
  gather (H200, session 12: the optimized HLO of DeepSeek-V3 gate_up at 1 token); this
  kernel takes 0.4 us there (CUPTI).  The wall of a 1-token call hardly moved (24.6 ->
  24.3 us): launch and graph cost dominate it, not those fusions
  (benchmarks/NOTES_moe.md, session 12).  Returns ((T * 4,) sched, (R,) src) with
  T, R >= num_tiles, m padded to the program block: entries past num_tiles / m are
  computed for indices that do not exist and are never read (the Mosaic kernel reads
  tiles < num_tiles; callers take ``src[:m]``)."""
  e = group_sizes.shape[0]
  if m == 0 or num_tiles == 0:
    return jnp.zeros((4 * num_tiles,), jnp.int32), jnp.zeros((m,), jnp.int32)
  e_pad = max(8, pl.next_power_of_2(e))
  gs = group_sizes.astype(jnp.int32)
  if e_pad != e:  # Triton blocks are powers of two; zero-sized experts change nothing
    gs = jnp.pad(gs, (0, e_pad - e))
  b = min(SCHEDULE_BLOCK, max(8, pl.next_power_of_2(m)))
  grid = -(-max(m, num_tiles) // b)
  kernel = functools.partial(_schedule_kernel, m=m, block_m=block_m, num_tiles=num_tiles,
                             experts=e)
  sched, src = pl.pallas_call(
      kernel,
      out_shape=(jax.ShapeDtypeStruct((grid * b, 4), jnp.int32),
                 jax.ShapeDtypeStruct((grid * b,), jnp.int32)),
      grid=(grid,),
      in_specs=[pl.BlockSpec((e_pad,), lambda i: (0,))],
      out_specs=(pl.BlockSpec((b, 4), lambda i: (i, 0)), pl.BlockSpec((b,), lambda i: (i,))),
      compiler_params=plt.CompilerParams(num_warps=SCHEDULE_WARPS, num_stages=1),
      interpret=interpret,
      name="grouped_tile_schedule",
  )(gs)
  return sched.reshape(-1), src


def run(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
        interpret: bool = False, config: wna16_mgpu.Config | None = None,
        block_m: int | None = None, x_scale: jax.Array | None = None,
        out_dtype=None) -> jax.Array:
  """(M, K) bf16 / fp16 rows sorted by expert x prepared stacked params -> (M, N).

  ``block_m``: rows per tile (a multiple of 8 up to :data:`MAX_BLOCK_M`; on the
  one-accumulator routes -- the fp8 route's ":cf" weights, :func:`wide_tiles` on the 16-bit
  one -- up to 160, or :data:`MAX_RUN_BLOCK_M` with an explicit one-accumulator config:
  ``Config.fp8_single_acc`` on the fp8 layout, ``scale_after_mma=False`` on the 16-bit
  one; default :func:`tile_rows`); ``config``: the launch (default :func:`heuristic` of
  :func:`launch_rows`).  With neither given, an autotune cache entry for the shape
  (:func:`cached_launch`, ``python -m humming_jax.autotune --grouped``) gives both.  The
  fp8-MMA layout (``prepare(mma="fp8")``) takes float8_e4m3fn rows with their (M,)
  float32 ``x_scale`` and returns ``out_dtype`` (``wna16_mgpu.run``)."""
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params; call "
                     f"grouped_wna16_mgpu.prepare first")
  e, k, n = params.shape
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (M, K={k}); got shape {x.shape}")
  if group_sizes.shape != (e,):
    raise ValueError(f"group_sizes must be ({e},); got shape {group_sizes.shape}")
  if config is None and block_m is None and (hit := cached_launch(params, x.shape[0])):
    block_m, config = hit  # the autotune command's launch for this shape
  if block_m is not None:
    _check_tile_rows(block_m, params, config)
  m = x.shape[0]
  if m == 0:
    return jnp.zeros((0, n), wna16_mgpu.output_dtype(x, out_dtype))
  # (the default rows of params, unless those are the one-accumulator fp8 route's and this
  # launch is not on it; at most what the launch holds: 128 for two accumulators)
  if block_m is None:
    single = _one_acc_launch(params, config)
    block_m = min(_launch_widest(params, config), tile_rows(
        m, e, params if single or not single_acc_tiles(params) else None))
  num_tiles = max_tiles(m, e, block_m)
  if interpret:
    # The Pallas-Triton and Mosaic GPU interpreters in one CPU program hang (session 12:
    # 190 rows in 80-row tiles, every time; each alone, or the schedule passed in, runs).
    # The interpreter takes the XLA reference schedule; tests check the kernel against it.
    sched, src = reference_schedule(group_sizes, m, block_m, num_tiles)
  else:
    sched, src = schedule(group_sizes, m, block_m, num_tiles)
  config = config or default_launch(m, params, block_m)
  y_tiles = wna16_mgpu.run(params, x, interpret=interpret, config=config,
                           tiles=wna16_mgpu.Tiles(sched, num_tiles, block_m),
                           x_scale=x_scale, out_dtype=out_dtype)
  return y_tiles.at[src[:m]].get(mode="fill", fill_value=0)


def run_aligned(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
                block_m: int, interpret: bool = False,
                config: wna16_mgpu.Config | None = None) -> jax.Array:
  """Rows in tile-aligned expert segments (``moe.align_tokens(ids, E, block_m)``) -> (R, N).

  Contract (not checked on the device): every ``group_sizes[e]`` is a multiple of
  ``block_m`` and x's R rows are a multiple of ``block_m`` covering them.  Tile ``i`` is
  rows [i * block_m, (i + 1) * block_m) of its expert, so it reads x and writes the output
  in place: no gather; the schedule is :func:`aligned_schedule`'s (by default the
  Pallas-Triton schedule kernel).  Output rows
  past ``sum(group_sizes)`` are **unspecified** (no tile writes them): callers read only
  the rows they routed (``moe.combine`` does).  ``block_m``: up to :data:`MAX_BLOCK_M`, or
  past it as :func:`run` allows one-accumulator tiles (:func:`aligned_tile_rows`' wide
  rows; the fp8 route's ":cf" weights too, whose default launch here is the same
  one-accumulator one)."""
  e, k, n = params.shape
  r = x.shape[0]
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params")
  _check_tile_rows(block_m, params, config)
  if x.ndim != 2 or x.shape[1] != k or r % block_m:
    raise ValueError(f"x must be (R, K={k}) with R a multiple of block_m={block_m}; got "
                     f"shape {x.shape}")
  if group_sizes.shape != (e,):
    raise ValueError(f"group_sizes must be ({e},); got shape {group_sizes.shape}")
  num_tiles = r // block_m
  # The plain expert-pure tiling: with aligned segments tile i starts at row i * block_m,
  # which is where the kernel writes it.
  return _run_tiles(params, x, aligned_schedule(group_sizes, r, block_m, num_tiles,
                                                interpret=interpret),
                    num_tiles, block_m, interpret=interpret, config=config)


# How run_aligned builds its schedule (HUMMING_JAX_ALIGNED_SCHEDULE, read while tracing):
#   "kernel": :func:`schedule`'s Pallas-Triton launch (quant_ragged_dot's), whose tiles are
#             the same on aligned segments (every segment starts at a multiple of the tile);
#             ``moe.align_tokens`` then computes its cumsums over E once (an optimization
#             barrier before the gathers that read them);
#   "xla":    grouped_wna16.tile_schedule as XLA ops, and align_tokens, fused as XLA likes
#             (to session 38: at DeepSeek-V3, 1 token, the cumsums fused into the (tiles, E)
#             compare-and-count took one 13.2 µs fusion).
# H200 session 39, whole layer past the pair cut (bench_moe_layer, int4 g128 zp, one
# process; a third variant, XLA ops with barriers after each cumsum, in the logs), xla ->
# kernel, µs per layer: DeepSeek-V3 32 / 128 tokens 263.1 / 385.6 -> 248.2 / 369.4,
# Qwen3-30B-A3B 16 / 64 tokens 118.4 / 154.3 -> 112.7 / 152.6.
ALIGNED_SCHEDULES = ("kernel", "xla")
ALIGNED_SCHEDULE = "kernel"


def aligned_schedule(group_sizes: jax.Array, r: int, block_m: int, num_tiles: int, *,
                     interpret: bool = False) -> jax.Array:
  """``Tiles.sched`` of :func:`run_aligned`: (expert, first row, end, kind) per tile of
  ``block_m`` rows over R tile-aligned rows, flattened (entries past ``num_tiles`` unread).
  The interpreter always takes the XLA ops (the Triton and Mosaic interpreters in one
  program hang: :func:`run`)."""
  if aligned_schedule_mode() == "kernel" and not interpret:
    return schedule(group_sizes, r, block_m, num_tiles)[0]
  expert, start, end, kind = grouped_wna16.tile_schedule(group_sizes, r, block_m, num_tiles)
  return jnp.stack([expert, start, end, kind], axis=1).reshape(-1)


def aligned_schedule_mode() -> str:
  """:data:`ALIGNED_SCHEDULE`, or HUMMING_JAX_ALIGNED_SCHEDULE where set."""
  return (tuning.env_choice("HUMMING_JAX_ALIGNED_SCHEDULE", ALIGNED_SCHEDULES)
          or ALIGNED_SCHEDULE)


def _run_tiles(params: QuantizedWeight, x: jax.Array, sched: jax.Array, num_tiles: int,
               block_m: int, *, interpret: bool, config: wna16_mgpu.Config | None
               ) -> jax.Array:
  """The kernel on a given schedule; the launch of :func:`run_aligned`'s tiles (every tile
  its own rows, none streamed) unless ``config`` is given."""
  e, _, n = params.shape
  config = config or heuristic(min(e, num_tiles), n, params.codes.shape[-3], block_m,
                               params=params, tile_rows=block_m, streamed=False)
  return wna16_mgpu.run(params, x, interpret=interpret, config=config,
                        tiles=wna16_mgpu.Tiles(sched, num_tiles, block_m))


PAIR_BLOCK_M = 8  # rows per pair tile: the kernel's smallest (x rows from a multiple of 8)


def pair_schedule(expert_ids: jax.Array, first_rows, num_experts: int) -> jax.Array:
  """``Tiles.sched`` of one tile per routed (token, slot) pair: tile p reads x rows
  [first_rows[p], + 8) against expert ``expert_ids[p]``; kind 0 (nothing computed, output
  rows unwritten) where the id is outside [0, E)."""
  ok = (expert_ids >= 0) & (expert_ids < num_experts)  # before the int32 cast (int64 ids)
  ids = expert_ids.astype(jnp.int32)
  first = jnp.asarray(first_rows, jnp.int32)
  return jnp.stack([jnp.where(ok, ids, 0), jnp.where(ok, first, 0),
                    jnp.where(ok, first + PAIR_BLOCK_M, 0), ok.astype(jnp.int32)],
                   axis=1).reshape(-1)


def run_pairs(params: QuantizedWeight, x: jax.Array, expert_ids: jax.Array, first_rows, *,
              interpret: bool = False, config: wna16_mgpu.Config | None = None
              ) -> jax.Array:
  """One 8-row tile per routed pair, straight from the router's ids: no sort, no schedule
  scan over E, no gather.  ``hj.quant_moe`` at decode (``moe.pair_tiles``,
  ``moe._quant_moe_pairs``).

  Tile p computes x rows [first_rows[p], first_rows[p] + 8) (``first_rows`` static,
  multiples of 8; rows past x's read as zeros) against expert ``expert_ids[p]`` and writes
  output rows [8p, 8p + 8): (8P, N).  The caller picks each pair's row from its tile; a
  tile whose id is outside [0, E) computes nothing and its rows are **unspecified**.  Two
  pairs of one expert read its weights twice, so this pays while those reads stay cheap
  beside a sort (one token's top-k are distinct; ``moe.pair_tiles`` has the cut)."""
  e, k, n = params.shape
  if registry.layout_family(params.layout) != FAMILY:
    raise ValueError(f"params.layout={params.layout!r}: expected {FAMILY}:... params")
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (R, K={k}); got shape {x.shape}")
  if expert_ids.ndim != 1 or not jnp.issubdtype(expert_ids.dtype, jnp.integer):
    raise ValueError(f"expert_ids must be (P,) int; got {expert_ids.dtype}"
                     f"{list(expert_ids.shape)}")
  first = list(first_rows)
  if (len(first) != expert_ids.shape[0]
      or not all(isinstance(f, (int, np.integer)) and f % 8 == 0 and 0 <= f < x.shape[0]
                 for f in first)):
    raise ValueError(f"first_rows must be {expert_ids.shape[0]} static int multiples of 8 "
                     f"below x's {x.shape[0]} rows; got {first}")
  p = expert_ids.shape[0]
  if p == 0:
    return jnp.zeros((0, n), x.dtype)
  sched = pair_schedule(expert_ids, first, e)
  return _run_tiles(params, x, sched, p, PAIR_BLOCK_M, interpret=interpret, config=config)


MIN_DEFAULT_K = 256


def priority_for(spec: QuantSpec, shape: tuple[int, ...]) -> int:
  """Above the Pallas-Triton grouped kernel for experts with K >= 256, below it else.

  Session 34, DeepSeek-V3 down (E 256, K 256, N 7168), both kernels and Humming in one
  process (H200, bench_moe resident chain, us wall per grouped GEMM, Triton / this kernel /
  Humming): int4 g128 zp 18.8 / 19.1 / 11.1 at 1 token, 202.0 / **154.3** / 84.7 at 64,
  **252.7** / 292.7 / 104.4 at 256, 513.9 / **327.5** / 203.6 at 1024; MXFP4 19.3 / 20.9 /
  11.8, 256.9 / **170.9** / 90.6, **313.4** / 338.9 / 112.5, 575.0 / **349.3** / 209.6.
  This kernel lost at 256 tokens then (8 rows per expert in 16-row tiles; 8-row tiles were
  slower still, 449.2) and tied at 1; it won by 24-39 % at 64 and 1024, and
  ``quant_moe`` already ran the DeepSeek-V3 layer's down stack here
  (``moe.layer_kernel``): K >= 256 moved from Triton to this kernel.  Since session 35
  (column blocks streamed per CTA, :func:`streamed_blocks`) it takes 139.6 at 256 tokens.
  Shorter K (a single 128-deep K tile or less; untimed) stays on Triton.

  Session 16, the two kernels side by side in one run (H200, resident chain of 8, CUPTI
  kernel us / wall us, benchmarks/NOTES_moe.md): Qwen3-30B-A3B gate_up (K 2048), int4 g128
  zp, 1 token 9.46 / 16.1 vs 17.74 / 24.6, 64 tokens 96.1 / 106.7 vs 142.5 / 149.8 (MXFP4
  11.6 / 17.7 vs 25.4 / 33.1 and 106.2 / 115.7 vs 218.7 / 227.8); Qwen3 down (K 768) 1
  token 7.48 / 13.0 vs 11.49 / 16.0, 64 tokens 48.7 / 56.2 vs 87.2 / 94.7 (MXFP4 1 token
  8.57 / 15.0 vs 13.68 / 17.5).  Session 8's short-K ordering below held before the
  two-warpgroup and small-CTA rules (sessions 14-15).

  H200, session 8, int4 g128 zp, chain of 8, us per grouped GEMM, this kernel vs Triton
  (benchmarks/NOTES_moe.md): K >= 4096 it wins at every token count measured --
  DeepSeek-V3 gate_up (K 7168) 24.8 / 246.9 / 419.2 vs 29.1 / 283.6 / 708.5 at 1 / 64 /
  1024 tokens, Mixtral gate_up (K 4096) 78.2 / 338.8 / 1510.7 vs 98.6 / 393.9 / 4078.3,
  Mixtral down (K 14336) 37.3 / 729.1 vs 61.6 / 2126.1 at 1 / 1024.  With short K (Qwen3
  K 2048 / 768, DeepSeek-V3 down K 256) its K split has little to split and it loses at
  decode (42.1 vs 21.8, 25.3 vs 18.1, 23.5 vs 16.6 at 1 token); at 1024 tokens it wins for
  Qwen3 (306.4 vs 721.9, 217.0 vs 322.0) and ties for DeepSeek-V3 down (494.1 vs 485.3).
  bf16 / fp16 tokens only (``x_dtypes``): float32 tokens run the
  Pallas-Triton grouped kernel."""
  k = shape[-2] if len(shape) >= 2 else 0
  return 1 if k >= MIN_DEFAULT_K else -1


def xla_read_order(params: QuantizedWeight) -> QuantizedWeight:
  """The experts as the XLA grouped GEMM (``moe.ragged_dot_xla``: quant_ragged_dot's and
  quant_moe's backward) decodes them.  H200 session 41: quant_moe's backward at
  Qwen3-30B-A3B, 16 tokens, int4 g128 zp (":pk") took 13.7 ms, 12.7 of it in three XLA
  transpose fusions (8.7 ms in one), against 108 us forward; the candidate,
  HUMMING_JAX_XLA_GROUPED_K_ORDER=1, materializes the codes in K order first
  (``wna16_mgpu.materialized_k_order``).  Off until an H200 A/B
  (``benchmarks/gpu_session_next.sh g42``) shows it is faster."""
  if tuning.env_flag("HUMMING_JAX_XLA_GROUPED_K_ORDER", False):
    return wna16_mgpu.materialized_k_order(params)
  return params


KERNEL = registry.register(registry.DenseKernel(
    name=FAMILY, layout=FAMILY, codes_ndim=4, supports=supports, prepare=prepare,
    to_canonical=to_canonical, run=run, grouped=True, priority=-1,
    priority_for=priority_for, x_dtypes=("bfloat16", "float16"),
    dequantize=lambda params, dtype: grouped_wna16.stack_dequantize(
        wna16_mgpu.KERNEL.dequantize, xla_read_order(params), FAMILY, wna16_mgpu.FAMILY,
        dtype)))
