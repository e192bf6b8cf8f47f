"""W8A8 at large M on Hopper tensor cores through Mosaic GPU: 8-bit x 8-bit WGMMA.

``y = (a_q @ w_q^T) * sa * sw [* s2] + bias`` for 8-bit operands (s8 x s8 -> s32 or
e4m3 x e4m3 -> f32) with per-token / per-tensor activation scales and per-channel /
per-tensor weight scales in the epilogue, or K-group scales of 128 (2-D weight blocks,
activation groups, int4 g128 weights unpacked to 8-bit by the caller) applied to each
K step's partial product: w8a8-int8, w8a8-fp8 (+ static), w8a8-fp8-block, w4a8-int8,
w4a8-fp8 (kernels/w8a8.py::mgpu_runs decides).

Accuracy: without K-group scales the fp8 products are summed over the whole K in the
WGMMA accumulator, which on Hopper keeps fewer bits than float32: 3e-3 relative error
against the float32-accumulating reference at K = 8192 on the H200 (int8: 8e-5, exact
int32 sums; fp8-block, promoted every 128: 6e-4).  Within the 1e-2 contract, ~10x below
fp8 activation quantization's own error.

Why (benchmarks/NOTES_w8a8.md): at M = 4096 the Pallas-Triton kernel ran 8192^2 in 615 us
(int8) and 1338 us (fp8), XLA's own fp8 / int8 dots 762 / 390+ us, bf16 794 us; the GEMM
is compute bound there and 8-bit WGMMA has twice bf16's rate.

The kernel is a persistent, warp-specialized GEMM (the structure of jax's
``pallas/ops/gpu/hopper_matmul_mgpu.py``, for 8-bit operands with a scaled epilogue):

  operands: activations quantized by the pre-pass (kernels/act_quant.py) to (Mp, Kp)
       int8 / e4m3; weights in w8a8's "direct" layout, (Np, Kp) -- K-major, which is what
       an 8-bit WGMMA needs for both operands (the B tile is read through a transposed
       view of its (tile_n, tile_k) shared-memory buffer);
  grid: one CTA per SM, walking the (M / cta_m) x (N / cta_n) output tiles in a planar
       snake (neighbouring CTAs share operand tiles in L2);
  pipeline: a memory warpgroup streams (A, B) K tiles by TMA ``stages`` deep
       (plgpu.emit_pipeline_warp_specialized); two compute warpgroups each own a
       (tile_m, tile_n) accumulator half of the CTA tile (split along N, or along M with
       Config.split_m);
  epilogue (per compute warpgroup): float32 accumulator x per-row activation scale x
       per-column weight scale (x global scale, folded into the column scale) + bias, cast
       to the activation dtype, stored by TMA in 64 x 64 tiles while the next tile's K loop
       starts.  The scale / bias vectors are fetched by TMA during the K loop.

The XLA reference beside it is kernels/reference.py::dense_reference; kernels/w8a8.py (the
Pallas-Triton kernel) runs every W8A8 spec and every M, and calls this one for the specs
of its ``mgpu_runs`` from ``MIN_M`` tokens on a Hopper GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from humming_jax.kernels import mgpu_convert, tuning
from humming_jax.quantize import QuantizedWeight

FAMILY = "w8a8_mgpu"
MIN_M = 512  # below this the weight bytes, not the MMAs, bound the GEMM: Triton kernel
SMEM_BYTES = tuning.MOSAIC_SMEM_BUDGET
EPI_TILE = 64  # output rows / columns per TMA store
WAVE_M = 64  # rows of one WGMMA (Config.group_waves)
OUT_DTYPES = (jnp.bfloat16, jnp.float16)  # 64 columns = one 128-byte swizzle row
E2M1_GROUP = 32  # codes per e8m0 group scale of E2M1Weights (MXFP4)
E2M1_BLOCK = mgpu_convert.PERMUTE_RUN  # codes per ":p8" run (e2m1_to_e4m3_ptx's blocks)
E2M1_ROWS = 64  # weight rows (output columns) converted at once: one WGMMA_UPCAST_4X tile


@dataclasses.dataclass(frozen=True)
class E2M1Weights:
  """MXFP4 weights that :func:`gemm` converts to e4m3 itself, one K step at a time, in
  shared memory beside the product (no per-call unpack to an (Np, Kp) e4m3 array).

  ``codes``: (Kp / 128, Np, 128) int4 e2m1 codes in ``mgpu_convert.p8_store``'s order
  (the WnA16 family's fp8-MMA layout ":p8"); ``scales``: (>= Kp / 32, Np) e8m0 group
  scales as a float dtype (rows past K hold 1.0 and meet zero codes); ``top``: (1, Np)
  float32, each column's largest real group scale (``wna16_mgpu.column_fold_row``), an exact
  power of two as the e8m0 scales are (the kernel reads its exponent field), every
  real group of the column within ``mgpu_convert.FOLD_MAX_SHIFT`` binades of it (the ":cf"
  check, ``wna16_mgpu.mark_column_fold``).  Each group's codes become the e4m3 values
  ``e2m1 * 2**(raise - 6)`` with ``raise = fold_shift - log2(top / scale)``
  (``mgpu_convert.e2m1_to_e4m3_ptx``'s column fold, exact), and each output column is
  multiplied by ``top * 2**(6 - fold_shift)``: the weight is ``e2m1 * scale``.
  ``fold_shift``: FOLD_MAX_SHIFT (raises 0 .. 11), or FOLD_SHIFT_LIMIT (1 .. 12: no
  subnormal operand, so no select in the table words; :func:`e2m1_fold_shift`)."""

  codes: jax.Array
  scales: jax.Array
  top: jax.Array
  fold_shift: int = mgpu_convert.FOLD_MAX_SHIFT

  def __post_init__(self):
    if self.fold_shift not in (mgpu_convert.FOLD_MAX_SHIFT, mgpu_convert.FOLD_SHIFT_LIMIT):
      raise ValueError(f"fold_shift={self.fold_shift}: expected "
                       f"{mgpu_convert.FOLD_MAX_SHIFT} or {mgpu_convert.FOLD_SHIFT_LIMIT}")

  def column_multiplier(self) -> jax.Array:
    """(Np,) float32: what each output column is multiplied by (a power of two)."""
    return self.top.reshape(-1).astype(jnp.float32) * (2.0 ** (6 - self.fold_shift))


def convert_e2m1_chunk(codes_smem, scales_smem, top_smem, row0, *, w: E2M1Weights,
                       interpret: bool) -> jax.Array:
  """One warpgroup converts 64 weight rows (output columns ``row0 ...``) of a K step's
  ":p8" codes (``codes_smem`` (1, cta_n, 128) int4) to folded e4m3, from the step's
  group-scale rows (``scales_smem`` (4, cta_n)) and the column maxima (``top_smem``
  (cta_n,)): the E2M1 kernels' one conversion.  Returns the (64, 128) float8_e4m3fn rows
  of a B tile, in registers (the caller stores them)."""
  cs = pl.ds(row0, E2M1_ROWS)
  tk = w.codes.shape[2]
  row = plgpu.Layout.WGMMA.reduce(1)
  top = plgpu.load(top_smem.at[cs], layout=row).astype(jnp.float32)
  scales = [plgpu.load(scales_smem.at[g, cs], layout=row)
            for g in range(tk // E2M1_GROUP)]
  # bfloat16 scale rows go to the conversion as they are on the GPU (it reads their
  # exponent fields); float16 ones, and the interpreter's, widened to float32
  if interpret or w.scales.dtype != jnp.bfloat16:
    scales = [s.astype(jnp.float32) for s in scales]
  codes = plgpu.load(codes_smem.at[0, cs], layout=plgpu.Layout.WGMMA_UPCAST_4X)
  if interpret:  # the same values from the K-order codes (no PTX on the CPU)
    _, raises = mgpu_convert.fold_shifts(scales, top=top, shift=w.fold_shift)
    return mgpu_convert.p8_e2m1_to_e4m3_interpret(codes, jnp.stack(raises, axis=1),
                                                  E2M1_GROUP)
  # (":cf": every real group's raise in range, so no zeroing select)
  (converted,) = mgpu_convert.e2m1_to_e4m3_ptx(
      codes, tk // E2M1_BLOCK, scales=scales, top=top,
      group_blocks=E2M1_GROUP // E2M1_BLOCK, raises_in_range=True, whole=True,
      fold_shift=w.fold_shift)
  return converted


def store_tile(y: jax.Array, o_smem, wg, o_tile, r0: int, slots: int) -> None:
  """The epilogue's stores: ``y`` (rows, cols) in the output dtype -> rows ``r0 ...`` of
  the warpgroup's output tile ``o_tile`` (a gmem view), by TMA in EPI_TILE x EPI_TILE
  pieces through the warpgroup's ``slots`` staging tiles ``o_smem[wg]`` (round robin;
  a tile is rewritten once its previous store has read it out)."""
  rows, cols = y.shape
  for ei in range(rows // EPI_TILE):
    for ej in range(cols // EPI_TILE):
      slot = ((r0 // EPI_TILE + ei) * (cols // EPI_TILE) + ej) % slots
      plgpu.wait_smem_to_gmem(slots - 1, wait_read_only=True)
      o_smem[wg, slot] = y[ei * EPI_TILE:(ei + 1) * EPI_TILE, ej * EPI_TILE:(ej + 1) * EPI_TILE]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem.at[wg, slot],
                              o_tile.at[pl.ds(r0 + ei * EPI_TILE, EPI_TILE),
                                        pl.ds(ej * EPI_TILE, EPI_TILE)])


def e2m1_fold_shift() -> int:
  """The fold shift of the E2M1Weights the dense route builds: FOLD_MAX_SHIFT, or
  FOLD_SHIFT_LIMIT with HUMMING_JAX_E2M1_FOLD12=1 (no ISETP / SEL per table word).
  H100, session 64, 8192^2, CUPTI GEMM at M = 1024: 124.53 us with 12 against 120.65
  with 11 with Pallas' automatic barriers, 118.45 against 119.00 without (within
  noise), bit-equal: no gain, so off."""
  return (mgpu_convert.FOLD_SHIFT_LIMIT if tuning.env_flag("HUMMING_JAX_E2M1_FOLD12", False)
          else mgpu_convert.FOLD_MAX_SHIFT)


@dataclasses.dataclass(frozen=True)
class Config:
  """Launch shape.  A CTA computes (tile_m, 2 * tile_n): two compute warpgroups side by
  side along N (``split_m``: along M, (2 * tile_m, tile_n)), each with a (tile_m, tile_n)
  accumulator (tile_m * tile_n / 128 registers per thread: 128 for 128 x 128).  With
  K-group scales a warpgroup holds a float32 running sum of (tile_m, tile_n) beside the
  accumulator of one K group: (tile_m, tile_n) too, or (64, tile_n) with
  ``group_waves``."""

  tile_m: int = 128
  tile_n: int = 128
  tile_k: int = 128  # K elements (= bytes) per pipeline step: one 128-byte swizzle row
  stages: int = 4  # K steps in flight (lowered to fit shared memory)
  grid_minor_n: bool = True  # the snake walks N fastest
  grid_tile_width: int = 8  # output tiles per snake column
  # K-group scales only: two K groups per pipeline step, the first one's partial product
  # promoted while the second's WGMMA runs (the promotion otherwise waits for every WGMMA;
  # NOTES_w8a8.md).  The heuristic turns it on when K allows (H200: -6 % / -9 %).
  group_pairs: bool = False
  # < 8-bit weights (W4A8): the caller's per-call unpack to the (N, K) 8-bit operand
  # transposes the packed words first (32 MB at 8192^2) and unpacks along K after, instead
  # of unpacking (K, N) codes and transposing the bytes (64 MB): bit-identical, predicted
  # ~45 us instead of the measured 87-89 (NOTES_w8a8.md).  Off until measured.
  unpack_words_first: bool = False
  # K-group scales with a per-token (not per-group) activation scale (w4a8-int8 / -fp8):
  # the token scale and the bias go to the epilogue, so each K group's promotion is one
  # convert and one FMA per accumulator element instead of two multiplies and an add.
  # H200 session 13, 8192^2 at M = 4096, CUPTI: w4a8-int8 kernel 583.1 -> 537.4 us,
  # w4a8-fp8 552.8 -> 520.5, same error; GPU-tested with a bias.  The GPU interpreter
  # hangs on it on a 2-core machine: two warpgroups blocked in barrier-wait callbacks
  # hold XLA:CPU's two pool threads and the third never runs (traced in session 13;
  # NOTES_w8a8.md).  So interpret mode keeps the folded
  # scale: CPU tests check that path, the @gpu test and the H200 lowering test this one.
  epilogue_row_scale: bool = True
  # The two compute warpgroups side by side along M (CTA tile 2 * tile_m x tile_n)
  # instead of N (tile_m x 2 * tile_n).  For K-group scales' 64 x 128 warpgroup tiles the
  # N split re-reads the (N, K) weights once per 64 token rows: at 8192^2, M = 4096, the
  # operand tiles streamed into shared memory total 32 x 33.5 MB of activations + 64 x 67 MB
  # of weights = 5.4 GB, against 4.3 GB side by side along M (64 x + 32 x).
  split_m: bool = False
  # K-group scales: each warpgroup owns tile_m = 128 rows in two 64-row waves -- per K
  # group, wave 0's WGMMA, wait, promote, then wave 1's -- with one 64-row accumulator and
  # a 128-row running sum (DeepGEMM's schedule; NOTES_w8a8.md session 14).  With split_m,
  # 256 x 128 CTA tiles: at 8192^2, M = 4096 the streamed operand tiles drop from 4.3 GB
  # to 3.2 GB.  It gives up group_pairs' overlap inside a warpgroup (the other warpgroup
  # still overlaps).  H200 session 16 (8192^2, CUPTI GEMM, pairs -> waves): int8 135.7 ->
  # 131.0 us at M = 1024, 522.3 -> 500.8 at 4096; fp8 130.1 -> 129.4 and 490.1 -> 506.5;
  # w8a8-fp8-block 527.1 -> 543.6 at 4096.  The heuristic's choice for int8 operands.
  group_waves: bool = False
  # E2M1Weights: each warpgroup converts step k's codes while its own step k - 1 WGMMA runs
  # (two converted B tiles; the A slot released one step late, by hand).  H100, session
  # 62, 8192^2, CUPTI GEMM: without it 160.7 us at M = 1024 and 636.6 at 4096, with it
  # 144.9 / 552.2 (128 x 256 CTA tiles), against 91.2 / 349.7 on TMA-loaded e4m3 weights.
  # HUMMING_JAX_E2M1_OVERLAP=0 turns it off (the side-by-side probe).
  e2m1_overlap: bool = dataclasses.field(
      default_factory=lambda: tuning.env_flag("HUMMING_JAX_E2M1_OVERLAP", True))
  # Output staging tiles per warpgroup (64 x 64 each, the TMA stores of one alternate
  # between them).  One frees 16 KB of shared memory: the shared-tile E2M1 form's fourth
  # pipeline stage (3 fit beside its two converted B tiles otherwise; e2m1_heuristic).
  epilogue_slots: int = 2
  # E2M1Weights, the shared-tile form (split_m with e2m1_overlap, the default): Pallas'
  # warpgroup barriers around each shared-memory store (two per converted 64-row chunk:
  # session 63's profile) and before each TMA load are left out
  # (CompilerParams.unsafe_no_auto_barriers).  That form needs none: every thread waits
  # for its own step k - 1 WGMMA before arriving on the tile barrier (cvt_bar), so no
  # thread writes a B tile until every warp's part of the WGMMAs reading it is done; the
  # rest goes through the kernel's own fences and barriers (commit_smem before the WGMMA
  # and the TMA stores, the staging tiles' waits, the per-thread mbarrier arrivals).  The
  # own-tile and serial forms keep them: there a warp's wgmma_wait covers only its own
  # part, and the barrier before the store is what orders the other warps' reads first.
  # H100, session 64, 8192^2, CUPTI GEMM: 119.00 us at M = 1024 against 120.65 with them,
  # 60.87 / 62.12 at 512, bit-equal.  HUMMING_JAX_E2M1_AUTO_BARRIERS=1 puts them back.
  e2m1_auto_barriers: bool = dataclasses.field(
      default_factory=lambda: tuning.env_flag("HUMMING_JAX_E2M1_AUTO_BARRIERS", False))
  # E2M1Weights, the shared tile: a third warpgroup converts the codes, and the two
  # compute warpgroups only issue WGMMAs (_gemm_e2m1_converter: the K loop by hand, four
  # warpgroups with their own register counts).  Session 64's profile: a converting warp
  # spent ~46 % of a step converting, ~18 % issuing WGMMAs into a full queue and ~18 % in
  # the barriers around the shared tile, so the conversion sat on the critical path; here
  # step k + 1's conversion runs while step k's WGMMAs do.  HUMMING_JAX_E2M1_CONVERTER=1.
  # H100, session 66, 8192^2, CUPTI GEMM, bit-equal, each beside the pipeline form in its
  # own process: M = 1024 114.98 us (one converter) against 118.33, 113.30 (two) against
  # 119.26; M = 512 (two, three B tiles) 58.79 against 60.39 -- 3-5 % faster, still
  # conversion-bound (the TMA-fed e4m3 GEMM: 92.2).  Opt-in.
  e2m1_converter: bool = dataclasses.field(
      default_factory=lambda: tuning.env_flag("HUMMING_JAX_E2M1_CONVERTER", False))
  # The converter form's converted B tiles: with 3 the converter may run two steps ahead of
  # the WGMMAs instead of one (one pipeline stage fewer fits).  HUMMING_JAX_E2M1_BTILES.
  e2m1_b_tiles: int = dataclasses.field(
      default_factory=lambda: tuning.env_int("HUMMING_JAX_E2M1_BTILES", 2))
  # The converter form's converting warpgroups: 1, or 2 each converting half of the B tile
  # (five warpgroups, 640 threads: fewer registers for each).  Session 66, H100: 113.30
  # against 114.98 us with one (other processes and cards: within the pipeline form's own
  # 0.8 % drift between them), 114.44 with two and three B tiles.
  # HUMMING_JAX_E2M1_CONVERTERS.
  e2m1_converters: int = dataclasses.field(
      default_factory=lambda: tuning.env_int("HUMMING_JAX_E2M1_CONVERTERS", 1))

  @property
  def cta_m(self) -> int:
    """Token rows of one CTA's output tile."""
    return 2 * self.tile_m if self.split_m else self.tile_m

  @property
  def cta_n(self) -> int:
    """Output columns of one CTA's output tile."""
    return self.tile_n if self.split_m else 2 * self.tile_n

  def __post_init__(self):
    if self.tile_m % 64 or not 64 <= self.tile_m <= 256:
      raise ValueError(f"tile_m={self.tile_m} must be 64, 128, 192 or 256 (WGMMA M = 64)")
    if self.tile_n % EPI_TILE or not EPI_TILE <= self.tile_n <= 256:
      raise ValueError(f"tile_n={self.tile_n} must be a multiple of {EPI_TILE} in "
                       f"[{EPI_TILE}, 256] (WGMMA N <= 256)")
    if self.tile_k not in (64, 128):
      raise ValueError(f"tile_k={self.tile_k} must be 64 or 128 (8-bit swizzle rows)")
    if self.stages < 2:
      raise ValueError(f"stages={self.stages} must be >= 2")
    if self.epilogue_slots not in (1, 2):
      raise ValueError(f"epilogue_slots={self.epilogue_slots} must be 1 or 2")
    if self.e2m1_b_tiles not in (2, 3):
      raise ValueError(f"e2m1_b_tiles={self.e2m1_b_tiles} must be 2 or 3")
    if self.e2m1_converters not in (1, 2):
      raise ValueError(f"e2m1_converters={self.e2m1_converters} must be 1 or 2")
    if self.tile_m * self.tile_n > 128 * 128:
      raise ValueError(f"tile_m x tile_n = {self.tile_m} x {self.tile_n}: the accumulator "
                       f"would need more than 128 registers per thread (max 128 x 128)")
    if self.group_waves and (self.tile_m != 2 * WAVE_M or self.tile_n > 128
                             or self.group_pairs):
      raise ValueError(f"group_waves: tile_m must be {2 * WAVE_M} (two {WAVE_M}-row waves), "
                       f"tile_n <= 128 and group_pairs off; got tile_m={self.tile_m}, "
                       f"tile_n={self.tile_n}, group_pairs={self.group_pairs}")

  @property
  def waves(self) -> int:
    """WGMMA row blocks per warpgroup tile, promoted one after the other."""
    return self.tile_m // WAVE_M if self.group_waves else 1


def groups_per_step(config: Config, grouped: bool) -> int:
  return 2 if grouped and config.group_pairs else 1


def smem_bytes(config: Config, stages: int, out_bytes: int = 2, grouped: bool = False,
               e2m1: bool = False) -> int:
  """Shared memory of one CTA: the pipeline's (A, B[, K-group scale rows]) stages, the
  output staging tiles and the epilogue vectors, each rounded up to Mosaic's 1 KB
  alignment.  ``e2m1`` (:class:`E2M1Weights`): B is 4-bit codes with their group-scale
  rows (2 bytes) and the column maxima, and the converted e4m3 B tiles: one per compute
  warpgroup (one shared with ``split_m``), two of each with ``e2m1_overlap``
  (``e2m1_b_tiles`` shared ones in the converter form)."""
  kb = tuning.smem_round
  gps = groups_per_step(config, grouped)
  k_step = gps * config.tile_k
  b_bytes = config.cta_n * k_step // 2 if e2m1 else config.cta_n * k_step
  step = kb(config.cta_m * k_step) + kb(b_bytes)
  if grouped:  # K-group scale rows: one per token tile, up to two (scale, bias) per N tile
    step += kb(gps * config.cta_m * 4) + 2 * kb(gps * config.cta_n * 4)
  if e2m1:
    step += kb(k_step // E2M1_GROUP * config.cta_n * 2) + kb(config.cta_n * 4)
  b_tiles = (config.e2m1_b_tiles if config.split_m and config.e2m1_converter
             else 2 if config.e2m1_overlap else 1)
  converted = (kb((1 if config.split_m else 2) * b_tiles * config.tile_n * k_step)
               if e2m1 else 0)
  return (stages * step + converted
          + kb(2 * config.epilogue_slots * EPI_TILE * EPI_TILE * out_bytes)
          + 3 * kb(2 * max(config.tile_m, config.tile_n) * 4))


def fit_stages(config: Config, grouped: bool = False, e2m1: bool = False) -> int:
  size = lambda st: smem_bytes(config, st, grouped=grouped, e2m1=e2m1)
  stages = config.stages
  while stages > 2 and size(stages) > SMEM_BYTES:
    stages -= 1
  if size(stages) > SMEM_BYTES:
    raise ValueError(f"config={config}: needs {size(stages)} bytes of shared memory even "
                     f"with 2 stages (limit {SMEM_BYTES}); lower tile_m / tile_n")
  return stages


def heuristic(m: int, n: int, grouped: bool = False, k: int | None = None, *,
              int8: bool = False) -> Config:
  """128 x 256 CTA tiles (two 128 x 128 warpgroup halves); 128 x 128 when N is not a
  multiple of 256.  With K-group scales each warpgroup holds the scaled running sum
  beside the WGMMA accumulator: 64 x 128 warpgroup tiles (two 64-register tiles) side by
  side along M (``split_m``: 128 x 128 CTA tiles; 128 x 64 when N is not a multiple of
  128), and two K groups per step (``group_pairs``) when the padded K is a multiple of 256.
  (H200, benchmarks/NOTES_w8a8.md: at M = 4096 the snake and stage variants are within
  1 %, tile_n 64 is 12 % slower; group_pairs: CUPTI kernel 626.0 -> 589.9 us (w4a8-int8),
  619.5 -> 561.4 (w8a8-fp8-block), same error; split_m (session 14, 8192^2, M = 4096):
  w4a8-int8 543.7 -> 526.2, w4a8-fp8 518.9 -> 485.5, w8a8-fp8-block 560.9 -> 526.1, and
  3.7-4.7 % less at M = 1024.)  K-group scales on ``int8`` operands: 128 x 128 warpgroup
  tiles in two 64-row waves (``group_waves``, 256 x 128 CTAs), 3-4 % faster than the pairs
  at M = 1024 / 4096 on the H200 in session 16 (fp8 lost 3 % at 4096: pairs kept)."""
  pairs = grouped and k is not None and k % (2 * Config.tile_k) == 0
  if grouped and int8 and n % 128 == 0:
    return Config(tile_m=2 * WAVE_M, tile_n=128, split_m=True, group_waves=True)
  if grouped:
    return Config(tile_m=64, tile_n=128 if n % 128 == 0 else 64, group_pairs=pairs,
                  split_m=True)
  return Config(tile_m=128, tile_n=128 if n % 256 == 0 else 64)


def e2m1_heuristic(m: int, n: int) -> Config:
  """:class:`E2M1Weights`: 256 x 128 CTA tiles, the two warpgroups side by side along M
  (``split_m``) sharing one converted B tile, each converting half of it, so each code is
  converted once per 256 token rows instead of once per 128.  H100, session 62, 8192^2,
  CUPTI GEMM, against 128 x 256 tiles converting their own: 66.4 / 75.5 us at M = 512,
  131.7 / 144.8 at 1024, 526.8 / 556.8 at 4096 (the TMA-fed e4m3 GEMM: 50.5, 92.0,
  356.7); with four stages (one output staging tile per warpgroup, the default) 122.3 at
  1024 against 131.0 with three (call 10).  Nsight Compute at 1024 (three stages): the
  tensor pipe 53 % busy, issue slots 35 %, no eligible warp 63 % of cycles, no local
  memory -- the conversion's latency and the barriers, not issue or DRAM (14 %).
  HUMMING_JAX_E2M1_SHARED=0: 128 x 256 CTA tiles
  (128 x 128 where N, padded to 128 by the layout, is not a multiple of 256), each
  warpgroup converting its own columns (so too without ``e2m1_overlap``, which the shared
  tile's pipeline form needs; its converter form, ``e2m1_converter``, does not).  The
  caller pads M to the CTA tile (256 rows for the shared tile)."""
  del m
  config = Config(tile_m=128, tile_n=128 if n % 256 == 0 else 64)
  if ((config.e2m1_overlap or config.e2m1_converter)
      and tuning.env_flag("HUMMING_JAX_E2M1_SHARED", True)):
    # One output staging tile per warpgroup: four pipeline stages instead of three.  H100,
    # session 62, 8192^2, M = 1024, CUPTI GEMM: 122.3 us against 131.0 (kernels per layer
    # 135.8 against 144.5; the unpack route 146.3).  HUMMING_JAX_E2M1_STAGES4=0: three.
    slots = 1 if tuning.env_flag("HUMMING_JAX_E2M1_STAGES4", True) else 2
    return dataclasses.replace(config, tile_n=128, split_m=True, epilogue_slots=slots)
  return config


def gemm(a: jax.Array, w: jax.Array | E2M1Weights, row_scale: jax.Array | None,
         col_scale: jax.Array | None, bias: jax.Array | None, *, out_dtype,
         row_group_scale: jax.Array | None = None, col_group_scale: jax.Array | None = None,
         config: Config | None = None, interpret: bool = False) -> jax.Array:
  """(Mp, Kp) x (Np, Kp)^T 8-bit GEMM -> (Mp, Np) ``out_dtype``:

    y = sum_g (a_g @ w_g^T) * rgs[g, :, None] * cgs[g, None, :]   (K groups g of tile_k)
    y = y * row_scale[:, None] * col_scale[None, :] + bias[None, :]

  ``a`` and ``w``: both int8 or both float8_e4m3fn, or float8_e4m3fn ``a`` and
  :class:`E2M1Weights` (MXFP4 codes converted in the kernel; no K groups; its column
  multiplier joins ``col_scale``).  Every scale / bias argument is
  optional float32: ``row_scale`` (Mp,), ``col_scale`` and ``bias`` (Np,) in the epilogue;
  ``row_group_scale`` (Kp / tile_k, Mp) and ``col_group_scale`` (Kp / tile_k, Np) on each
  K step's partial product (DeepSeek-style: the 8-bit WGMMA sums one group exactly, the
  float32 running sum takes its scales).  Mp must be a multiple of ``config.cta_m``, Np
  of ``config.cta_n``, Kp of ``config.tile_k`` (the caller pads)."""
  mp, kp = a.shape
  e2m1 = isinstance(w, E2M1Weights)
  if jnp.dtype(out_dtype) not in map(jnp.dtype, OUT_DTYPES):
    raise ValueError(f"out_dtype={out_dtype}: expected bfloat16 or float16")
  grouped = row_group_scale is not None or col_group_scale is not None
  if e2m1:
    np_ = _check_e2m1(a, w, kp, grouped)
  else:
    np_, kp2 = w.shape
    if a.dtype != w.dtype or a.dtype not in (jnp.int8, jnp.float8_e4m3fn):
      raise ValueError(f"a.dtype={a.dtype}, w.dtype={w.dtype}: expected both int8 or both "
                       f"float8_e4m3fn")
    if kp != kp2:
      raise ValueError(f"a.shape={a.shape}, w.shape={w.shape}: K must match")
  config = config or (e2m1_heuristic(mp, np_) if e2m1 else
                      heuristic(mp, np_, grouped, kp, int8=a.dtype == jnp.int8))
  if e2m1 and config.tile_k != w.codes.shape[2]:
    raise ValueError(f"config={config}: E2M1Weights need tile_k={w.codes.shape[2]} (the "
                     f"codes' K tile)")
  if e2m1 and config.split_m and config.tile_n % (2 * E2M1_ROWS):
    raise ValueError(f"config={config}: with split_m each warpgroup converts half of the "
                     f"shared B tile, {E2M1_ROWS} columns at a time; tile_n must be a "
                     f"multiple of {2 * E2M1_ROWS}")
  if e2m1 and config.e2m1_converter and not config.split_m:
    raise ValueError(f"config={config}: e2m1_converter is a form of the shared B tile; it "
                     f"needs split_m")
  if e2m1 and config.split_m and not (config.e2m1_overlap or config.e2m1_converter):
    raise ValueError(f"config={config}: split_m E2M1Weights share each converted B tile "
                     f"between the warpgroups, which needs e2m1_overlap (two B tiles)")
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  cta_m, cta_n = config.cta_m, config.cta_n
  if mp % cta_m or np_ % cta_n or kp % tk:
    raise ValueError(f"padded shapes M={mp}, N={np_}, K={kp} must be multiples of the CTA "
                     f"tile {cta_m} x {cta_n} (config.cta_m, config.cta_n) and "
                     f"tile_k={tk}")
  if grouped and tm * tn > 64 * 128 * config.waves:
    raise ValueError(f"config={config}: with K-group scales a warpgroup holds two "
                     f"{tm} x {tn} float32 tiles; tile_m x tile_n must be <= 64 x 128 "
                     f"(or 128 x 128 in two waves: group_waves)")
  if config.group_waves and not grouped:
    raise ValueError(f"config={config}: group_waves is for K-group scales "
                     f"(row_group_scale / col_group_scale)")
  groups = kp // tk
  gps = groups_per_step(config, grouped)  # K groups per pipeline step
  k_step = gps * tk
  if kp % k_step:
    raise ValueError(f"config={config}: K={kp} must be a multiple of {k_step} (two K groups "
                     f"per step)")
  if e2m1:  # the fold's power of two per column (the kernel's e4m3 values are scaled)
    mult = w.column_multiplier()
    col_scale = mult if col_scale is None else col_scale * mult
  for name, v, shape in (("row_scale", row_scale, (mp,)), ("col_scale", col_scale, (np_,)),
                         ("bias", bias, (np_,)),
                         ("row_group_scale", row_group_scale, (groups, mp)),
                         ("col_group_scale", col_group_scale, (groups, np_))):
    if v is not None and (v.shape != shape or v.dtype != jnp.float32):
      raise ValueError(f"{name}: expected float32 {shape}, got {v.dtype} {v.shape}")
  # A per-token scale without K-group row scales stays in the epilogue (with the bias,
  # which must come after it): y = (sum_g part_g * cgs_g) * row_scale + bias.
  row_epilogue = (grouped and config.epilogue_row_scale and row_group_scale is None
                  and not interpret)  # the interpreter hangs on it (Config)
  if grouped:  # the other scales on the K steps' partial products
    if row_scale is not None and not row_epilogue:
      row_group_scale = (row_scale[None] if row_group_scale is None
                         else row_group_scale * row_scale[None])
      row_group_scale = jnp.broadcast_to(row_group_scale, (groups, mp))
    if col_scale is not None:
      col_group_scale = (col_scale[None] if col_group_scale is None
                         else col_group_scale * col_scale[None])
      col_group_scale = jnp.broadcast_to(col_group_scale, (groups, np_))
    col_scale = None
    if not row_epilogue:
      row_scale = None
  stages = fit_stages(config, grouped, e2m1)
  # E2M1Weights' kernel inputs beside the codes: the K steps' group-scale rows, the maxima
  e2m1_in = [w.scales[:kp // E2M1_GROUP], w.top.astype(jnp.float32)] if e2m1 else []
  if e2m1 and config.e2m1_converter:  # (split_m, checked above)
    return _gemm_e2m1_converter(a, w, e2m1_in, row_scale, col_scale, bias,
                                out_dtype=out_dtype, config=config, stages=stages,
                                interpret=interpret)
  overlap = e2m1 and config.e2m1_overlap
  m_iters, n_iters, k_iters = mp // cta_m, np_ // cta_n, kp // k_step
  # the pipeline's buffers (it keeps no more than its steps): the A slots released by hand
  pipeline_slots = min(stages, k_iters)
  acc_dtype = jnp.int32 if a.dtype == jnp.int8 else jnp.float32
  in_tf = (plgpu.TilingTransform((8, tk)), plgpu.SwizzleTransform(tk))  # 8-bit: tk bytes
  # E2M1Weights: the codes (cta_n, 128) as int4 rows of 64 bytes; the converted B tile in
  # the A tile's 128-byte swizzle, stored 64 rows x 128 columns at a time (session 61: in
  # 32-byte swizzle tiles, four 32-deep WGMMAs a step, the H100's GEMM took 163.4 us at
  # 8192^2, M = 1024, against 92.0 for the same product on TMA-loaded e4m3 weights).
  codes_tf = (plgpu.TilingTransform((8, tk)), plgpu.SwizzleTransform(tk // 2))
  out_sw = EPI_TILE * jnp.dtype(out_dtype).itemsize
  out_tf = (plgpu.TilingTransform((8, out_sw // jnp.dtype(out_dtype).itemsize)),
            plgpu.SwizzleTransform(out_sw))
  # Epilogue vectors, fetched by TMA during the K loop: at most one row vector and up to
  # two column vectors (scale, bias).
  # With K-group scales and the token scale in the epilogue (row_epilogue, the GPU
  # default) the bias follows it there.  Otherwise (K-group row scales, or the
  # interpreter) the bias rides the pipeline, as a (K steps, Np) array that is the bias on
  # step 0 and zeros after (the pipeline takes only step-indexed inputs; one barrier
  # fewer -- the GPU interpreter hung on a separate vector barrier beside the K-group
  # inputs).
  epi_bias = bias is not None and (not grouped or row_epilogue)
  rows = [] if row_scale is None else [row_scale.reshape(1, mp)]
  cols = [v.reshape(1, np_) for v in (col_scale, bias if epi_bias else None) if v is not None]
  has_col_scale = col_scale is not None
  g_rows = [] if row_group_scale is None else [row_group_scale]
  g_cols = [] if col_group_scale is None else [col_group_scale]
  g_bias = []
  if bias is not None and grouped and not epi_bias:
    g_bias = [jnp.zeros((groups, np_), jnp.float32).at[0].set(bias)]

  def kernel(a_gmem, w_gmem, *refs):
    refs = list(refs)
    o_gmem = refs.pop()
    e2m1_gmem = [refs.pop(0) for _ in e2m1_in]  # [group scale rows, column maxima]
    rows_gmem = [refs.pop(0) for _ in rows]
    cols_gmem = [refs.pop(0) for _ in cols]
    grows_gmem = [refs.pop(0) for _ in g_rows]
    gcols_gmem = [refs.pop(0) for _ in g_cols]
    gbias_gmem = [refs.pop(0) for _ in g_bias]

    def pipeline(body, context):
      plain = lambda shape: plgpu.BlockSpec(shape, lambda k: (k, 0), memory_space=plgpu.SMEM)
      if e2m1:  # (K step, columns, 128) codes; 4 group-scale rows; the column maxima
        b_specs = [plgpu.BlockSpec((1, cta_n, tk), lambda k: (k, 0, 0), transforms=codes_tf,
                                   memory_space=plgpu.SMEM),
                   plain((tk // E2M1_GROUP, cta_n)),
                   # (the maxima again each step: the pipeline takes only step-indexed
                   # inputs, and k * 0 reads as one; 1 KB per step)
                   plgpu.BlockSpec((1, cta_n), lambda k: (k * 0, 0), memory_space=plgpu.SMEM)]
      else:
        b_specs = [plgpu.BlockSpec((cta_n, k_step), lambda k: (0, k), transforms=in_tf,
                                   memory_space=plgpu.SMEM)]
      return plgpu.emit_pipeline_warp_specialized(
          body, grid=(k_iters,), memory_registers=40,
          in_specs=[
              plgpu.BlockSpec((cta_m, k_step), lambda k: (0, k), transforms=in_tf,
                              memory_space=plgpu.SMEM),
              *b_specs,
              *[plain((gps, cta_m)) for _ in g_rows],
              *[plain((gps, cta_n)) for _ in g_cols + g_bias]],
          wg_axis="wg", num_compute_wgs=2, max_concurrent_steps=stages,
          compute_context=context, manual_consumed_barriers=overlap)

    ignore = lambda *_, **__: None
    b_args = lambda cns: ((w_gmem.at[:, cns, :], *[g.at[:, cns] for g in e2m1_gmem]) if e2m1
                          else (w_gmem.at[cns, :],))
    pipeline_args = lambda ms, cns: (
        a_gmem.at[ms, :], *b_args(cns), *[g.at[:, ms] for g in grows_gmem],
        *[g.at[:, cns] for g in gcols_gmem], *[g.at[:, cns] for g in gbias_gmem])
    scratch = dict(
        allocs=pipeline(ignore, ignore).get_allocations(
            *pipeline_args(pl.ds(0, cta_m), pl.ds(0, cta_n))),
        o_smem=plgpu.SMEM((2, config.epilogue_slots, EPI_TILE, EPI_TILE), out_dtype,
                          transforms=out_tf))
    if e2m1:  # the converted (tile_n, tile_k) e4m3 B tile(s): shared with split_m, else
      # one per compute warpgroup; two with the overlap (step k's beside step k - 1's)
      scratch["b_smem"] = plgpu.SMEM((1 if config.split_m else 2, 2 if overlap else 1, tn,
                                      tk), jnp.float8_e4m3fn, transforms=in_tf)
      if config.split_m:  # both halves of a shared B tile converted (one per B tile)
        scratch["cvt_bar"] = plgpu.Barrier(num_arrivals=2, num_barriers=2)
    if rows or cols:
      scratch["vec_bar"] = plgpu.Barrier(num_arrivals=len(rows) + len(cols), num_barriers=2)
    if rows:
      scratch["rows_smem"] = plgpu.SMEM((2, 1, tm), jnp.float32)
    if cols:
      scratch["cols_smem"] = plgpu.SMEM((2, len(cols), tn), jnp.float32)

    @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
    def scope(allocs, o_smem, vec_bar=None, rows_smem=None, cols_smem=None, b_smem=None,
              cvt_bar=None):
      wg = lax.axis_index("wg")
      waves = config.waves
      shape = (tm // waves, tn)  # one wave's tile (the whole warpgroup tile without waves)
      wm_ = shape[0]
      # This warpgroup's rows of the CTA's A tile and columns of its B tile.
      a_off, w_off = (wg * tm, 0) if config.split_m else (0, wg * tn)
      bcast_row = lambda v: lax.broadcast_in_dim(v, shape, (0,))  # one value per row
      bcast_col = lambda v: lax.broadcast_in_dim(v, shape, (1,))  # one value per column

      @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm")
      def _tile(info: plgpu.NDLoopInfo):
        (lin,) = info.index
        mi, ni = plgpu.planar_snake(lin, (m_iters, n_iters),
                                    1 if config.grid_minor_n else 0, config.grid_tile_width)
        cta_ms = pl.ds(mi * cta_m, cta_m)
        cta_ns = pl.ds(ni * cta_n, cta_n)
        wg_ms = pl.ds(mi * cta_m + a_off, tm)  # this warpgroup's output rows
        wg_ns = pl.ds(ni * cta_n + w_off, tn)  # ... and columns

        def epilogue(ys):
          """float32 (tm, tn) sum, one (tm / waves, tn) array per wave -> epilogue vectors
          -> out_dtype -> TMA stores."""
          if vec_bar is not None:
            plgpu.barrier_wait(vec_bar.at[wg])
          epi_slots = config.epilogue_slots
          for v, y in enumerate(ys):
            r0 = v * wm_
            if rows:
              y = y * bcast_row(rows_smem[wg, 0, :] if waves == 1
                                else rows_smem[wg, 0, pl.ds(r0, wm_)])
            if has_col_scale:
              y = y * bcast_col(cols_smem[wg, 0, :])
            if epi_bias:
              y = y + bcast_col(cols_smem[wg, len(cols) - 1, :])
            y = y.astype(out_dtype)
            if v == 0:
              plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # last tile's stores read out
            store_tile(y, o_smem, wg, o_gmem.at[wg_ms, wg_ns], r0, epi_slots)

        def context(run_k_loop):
          if vec_bar is not None:  # the epilogue vectors travel while the K loop runs
            bar = vec_bar.at[wg]
            for g in rows_gmem:
              plgpu.copy_gmem_to_smem(g.at[:, wg_ms], rows_smem.at[wg], bar)
            for i, g in enumerate(cols_gmem):
              plgpu.copy_gmem_to_smem(g.at[:, wg_ns], cols_smem.at[wg, pl.ds(i, 1)], bar)
          if grouped:  # the scaled running sum is the pipeline's carry (registers)
            epilogue(run_k_loop(tuple(jnp.zeros(shape, jnp.float32) for _ in range(waves))))
            return

          @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC(shape, acc_dtype))
          def _(acc_ref):
            run_k_loop(acc_ref)
            epilogue([acc_ref[...].astype(jnp.float32)])

        def w_t(w_smem, j=0):
          # B = w^T: the (tile_n, tile_k) K-major buffer read through a transposed view.
          return w_smem.at[pl.ds(w_off, tn), pl.ds(j * tk, tk)].transpose((1, 0))

        def wave_rows(v):  # this warpgroup's first row of wave v in the CTA's A tile
          return a_off + v * wm_ if v else a_off

        def a_tile(a_smem, j=0, v=0):
          return a_smem.at[pl.ds(wave_rows(v), wm_), pl.ds(j * tk, tk)]

        def mma(_, a_smem, w_smem, acc_ref):
          plgpu.wgmma(acc_ref, a_tile(a_smem), w_t(w_smem))
          plgpu.wgmma_wait(0)
          return acc_ref

        def mma_e2m1(idx, a_smem, codes_smem, scales_smem, top_smem, *rest):
          """The step's (tile_n, 128) codes -> e4m3 in a B tile, then the step's WGMMA.

          ``e2m1_overlap``: step k's conversion runs while this warpgroup's step k - 1
          WGMMA is in flight; B tiles alternate, the codes' slots are released once
          converted and the A slot of step k - 1 once its WGMMA is waited for (manual
          consumed barriers).  ``split_m``: one B tile for both warpgroups, each
          converting half; each waits for its own step k - 1 WGMMA before arriving on the
          tile's barrier, so a warpgroup past that barrier knows the other is done with
          the tile it is about to overwrite (step k - 1's reads of tile k + 1 mod 2, k
          counted over the CTA's output tiles).  Neither: the previous step's WGMMA was
          waited for, and a warpgroup's conversion could only hide behind the other's
          WGMMA (it did not: benchmarks/NOTES.md, sessions 61 and 62)."""
          *consumed, acc_ref = rest
          k = idx[0]
          # B tiles alternate with the CTA's step count, not the tile's: at an odd number
          # of K steps a tile's step 0 would otherwise write the tile its predecessor's
          # last WGMMAs read, which the shared tile's barrier does not cover for the
          # other warpgroup (its step k - 1 wait precedes the arrival, step k's does not)
          buf = lax.rem(info.local_index * k_iters + k, 2) if overlap else 0
          b_tile = b_smem.at[0 if config.split_m else wg, buf]

          def convert(c):  # weight rows c * 64 ... of the B tile
            b_tile.at[pl.ds(c * E2M1_ROWS, E2M1_ROWS)][...] = convert_e2m1_chunk(
                codes_smem, scales_smem, top_smem.at[0], w_off + c * E2M1_ROWS, w=w,
                interpret=interpret)

          chunks = tn // E2M1_ROWS
          for c in range(chunks):
            if config.split_m:  # warpgroup 0 the first half of the shared tile, 1 the second
              pl.when(wg == c * 2 // chunks)(functools.partial(convert, c))
            else:
              convert(c)
          if overlap:  # the codes, scales and maxima are in registers / the B tile now
            a_done, *b_done = consumed
            for bar in b_done:
              plgpu.barrier_arrive(bar)
          plgpu.commit_smem()  # generic-proxy stores -> the WGMMAs' reads
          if not overlap:
            plgpu.wgmma(acc_ref, a_tile(a_smem), b_tile.T)
            plgpu.wgmma_wait(0)
            return acc_ref
          a_slots = allocs["flat_consumed_barrier_refs"][0]

          def release_previous_a():  # step k - 1's WGMMA done: its A slot is free
            pl.when(k > 0)(lambda: plgpu.barrier_arrive(
                a_slots.at[lax.rem(k - 1, pipeline_slots)]))

          if config.split_m:
            plgpu.wgmma_wait(0)
            release_previous_a()
            plgpu.barrier_arrive(cvt_bar.at[buf])  # my half written, my step k - 1 read done
            plgpu.barrier_wait(cvt_bar.at[buf])  # ... and the other warpgroup's
            plgpu.wgmma(acc_ref, a_tile(a_smem), b_tile.T)
          else:
            plgpu.wgmma(acc_ref, a_tile(a_smem), b_tile.T)
            plgpu.wgmma_wait(1)
            release_previous_a()

          @pl.when(k == k_iters - 1)  # the tile's last step: nothing left to overlap
          def _():
            plgpu.wgmma_wait(0)
            plgpu.barrier_arrive(a_done)
          return acc_ref

        def mma_grouped(_, a_smem, w_smem, *refs):
          *g_smem, totals = refs  # one running sum per wave

          def promote(total, part, j, v=0):
            """total + this group's partial product x its row / column scales (+ bias)."""
            part = part.astype(jnp.float32)
            g = list(g_smem)
            if g_rows:
              part = part * bcast_row(g.pop(0)[j, pl.ds(wave_rows(v), wm_)])
            if g_cols:
              part = part * bcast_col(g.pop(0)[j, pl.ds(w_off, tn)])
            if g_bias:  # the bias on step 0, zeros after
              part = part + bcast_col(g.pop(0)[j, pl.ds(w_off, tn)])
            return total + part

          def group_products(*acc_refs):
            for j, acc_ref in enumerate(acc_refs):  # every WGMMA of the step in flight ...
              plgpu.wgmma(acc_ref, a_tile(a_smem, j), w_t(w_smem, j))
            out = totals[0]
            for j, acc_ref in enumerate(acc_refs):  # ... group j promoted while j + 1 runs
              part = plgpu.wgmma_accumulator_load(acc_ref, wait_n=gps - 1 - j)
              out = promote(out, part, j)
            return (out,)

          if waves == 1:
            return pl.run_scoped(group_products, *[plgpu.ACC(shape, acc_dtype)] * gps)

          def wave_product(acc_ref, v):  # one 64-row WGMMA, waited for
            plgpu.wgmma(acc_ref, a_tile(a_smem, 0, v), w_t(w_smem))
            return plgpu.wgmma_accumulator_load(acc_ref, wait_n=0)

          # Waves one after the other, each in its own scoped accumulator: one 64-row
          # accumulator live at a time beside the running sums.
          return tuple(
              promote(totals[v], pl.run_scoped(functools.partial(wave_product, v=v),
                                               plgpu.ACC(shape, acc_dtype)), 0, v)
              for v in range(waves))

        pipeline(mma_grouped if grouped else mma_e2m1 if e2m1 else mma, context)(
            *pipeline_args(cta_ms, cta_ns), allocations=allocs)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  sms = tuning.num_sms()
  call = plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((mp, np_), out_dtype),
      grid=(min(sms, m_iters * n_iters),), grid_names=("sm",),
      num_threads=3, thread_name="wg",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
          # (the shared tile: split_m, which for E2M1Weights implies e2m1_overlap, above)
          unsafe_no_auto_barriers=e2m1 and config.split_m and not config.e2m1_auto_barriers),
      interpret=plgpu.InterpretGPUParams() if interpret else False)
  return call(a, w.codes if e2m1 else w, *e2m1_in, *rows, *cols, *g_rows, *g_cols, *g_bias)


# Register counts of _gemm_e2m1_converter's warpgroups by its number of converters
# (setmaxnreg; the CTA's threads start with 65,536 / threads each, rounded down to 8 --
# 128 for four warpgroups, 96 for five -- and may not take more than 65,536 in all): the
# TMA issue loop, each converter (its 64-row chunks: 8 code words, 16 e4m3 words and the
# table words each), the two MMA warpgroups (a 128 x 128 float32 accumulator, 128, and
# the epilogue).  HUMMING_JAX_E2M1_REGS="memory,converter,mma" for the GPU probes.
E2M1_CONVERTER_REGS = {1: (32, 88, 192), 2: (24, 56, 168)}


def _converter_regs(converters: int) -> tuple[int, int, int]:
  text = os.environ.get("HUMMING_JAX_E2M1_REGS")
  regs = (tuple(int(v) for v in text.split(",")) if text
          else E2M1_CONVERTER_REGS[converters])
  wgs = 3 + converters
  entry = 65536 // (128 * wgs) // 8 * 8
  # setmaxnreg.dec must not go above the entry count, nor .inc below it, and the
  # increases come only from what this CTA's decreases release: the total stays within
  # the entry allocation (H100, session 66: with five warpgroups at 24 / 64 / 176, 504
  # against 5 x 96 = 480, the MMA warpgroups' .inc waited forever -- the kernel hung)
  if (len(regs) != 3 or any(r % 8 or not 24 <= r <= 256 for r in regs)
      or not regs[0] <= entry >= regs[1] or regs[2] < entry
      or regs[0] + converters * regs[1] + 2 * regs[2] > wgs * entry):
    raise ValueError(f"HUMMING_JAX_E2M1_REGS={text!r}: expected three multiples of 8 in "
                     f"[24, 256], memory and converter <= {entry} <= mma, memory + "
                     f"{converters} x converter + 2 x mma <= {wgs * entry}")
  return regs


def _gemm_e2m1_converter(a: jax.Array, w: E2M1Weights, e2m1_in: list[jax.Array],
                         row_scale, col_scale, bias, *, out_dtype, config: Config,
                         stages: int, interpret: bool) -> jax.Array:
  """:func:`gemm` for E2M1Weights with ``Config.e2m1_converter`` (checked and scaled by
  it: ``col_scale`` already carries the column multiplier; ``e2m1_in`` the scale rows
  and maxima as the kernel reads them).

  Four warpgroups per CTA (five with two converters) and a K loop written out (no
  emit_pipeline, which gives every compute warpgroup one register count and one K loop
  per output tile):
    last  memory: for each K step of each of the CTA's output tiles, in order, the codes /
       scale rows / column maxima (``w_full``) then the A tile (``a_full``) by TMA into
       slot ``g % stages`` (g counts the CTA's steps over its tiles, so the loads of the
       next tile start while this one's run), once the slot's previous step released
       them (``w_free`` by the converters, ``a_free`` by both MMA warpgroups);
    2 (and 3)  converters: step g's codes -> e4m3 in registers (every 64-row chunk of
       the B tile, or with ``Config.e2m1_converters`` 2 chunk c by converter 2 + c % 2),
       stored into
       B tile ``g % b_tiles`` once both MMA warpgroups are done reading its step
       g - b_tiles (``b_free``, ``Config.e2m1_b_tiles``); a proxy fence, then the codes'
       slot released (``w_free``) and the tile announced (``b_full``);
    0, 1  MMA: rows wg * tile_m ... of A slot g against B tile g, one WGMMA group in
       flight; step g - 1's slots (A, B tile) released once its WGMMA is waited for; at
       the tile's end the epilogue (the scale / bias vectors fetched by TMA at its start).
  Every barrier is waited on by each thread in phase order (Mosaic tracks the parity per
  thread); the first ``stages`` (``b_tiles``) uses of a slot (B tile) skip the wait for
  a release that never came."""
  mp, kp = a.shape
  np_ = w.codes.shape[1]
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  cta_m, cta_n = config.cta_m, config.cta_n
  m_iters, n_iters, k_iters = mp // cta_m, np_ // cta_n, kp // tk
  groups = tk // E2M1_GROUP
  b_tiles = config.e2m1_b_tiles
  converters = config.e2m1_converters
  memory_wg = 2 + converters
  memory_regs, converter_regs, mma_regs = _converter_regs(converters)
  in_tf = (plgpu.TilingTransform((8, tk)), plgpu.SwizzleTransform(tk))
  codes_tf = (plgpu.TilingTransform((8, tk)), plgpu.SwizzleTransform(tk // 2))
  out_sw = EPI_TILE * jnp.dtype(out_dtype).itemsize
  out_tf = (plgpu.TilingTransform((8, out_sw // jnp.dtype(out_dtype).itemsize)),
            plgpu.SwizzleTransform(out_sw))
  rows = [] if row_scale is None else [row_scale.reshape(1, mp)]
  cols = [v.reshape(1, np_) for v in (col_scale, bias) if v is not None]
  slots = config.epilogue_slots
  shape = (tm, tn)

  def kernel(a_gmem, codes_gmem, scales_gmem, top_gmem, *refs):
    *vec_gmem, o_gmem = refs
    rows_gmem, cols_gmem = vec_gmem[:len(rows)], vec_gmem[len(rows):]

    def tiles(body):
      """Every warpgroup walks the CTA's output tiles in the same order: body(g0, mi, ni)
      per tile, g0 the CTA's K steps before it; returns the CTA's K steps in all."""
      @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm", init_carry=jnp.int32(0))
      def steps(info: plgpu.NDLoopInfo, carry):
        (lin,) = info.index
        mi, ni = plgpu.planar_snake(lin, (m_iters, n_iters),
                                    1 if config.grid_minor_n else 0, config.grid_tile_width)
        body(carry, mi, ni)
        return carry + k_iters
      return steps

    def drain(barriers, n, steps):
      """Wait for the releases of the last ``n`` steps, which no load or conversion
      waited for (a barrier's phases are all observed before it is freed)."""
      @pl.loop(lax.max(steps - n, 0), steps)
      def _(g):
        for bar in barriers:
          plgpu.barrier_wait(bar.at[lax.rem(g, n)])

    def scope(a_smem, codes_smem, scales_smem, top_smem, b_smem, o_smem, a_full, w_full,
              a_free, w_free, b_full, b_free, vec_bar=None, rows_smem=None, cols_smem=None):
      wg = lax.axis_index("wg")

      @pl.when(wg == memory_wg)
      def _memory():
        plgpu.set_max_registers(memory_regs, action="decrease")

        @tiles
        def steps(g0, mi, ni):
          cns = pl.ds(ni * cta_n, cta_n)

          @pl.loop(0, k_iters)
          def _(k):
            g = g0 + k
            s = lax.rem(g, stages)
            pl.when(g >= stages)(lambda: plgpu.barrier_wait(w_free.at[s]))
            plgpu.copy_gmem_to_smem(codes_gmem.at[pl.ds(k, 1), cns], codes_smem.at[s],
                                    w_full.at[s])
            plgpu.copy_gmem_to_smem(scales_gmem.at[pl.ds(k * groups, groups), cns],
                                    scales_smem.at[s], w_full.at[s])
            plgpu.copy_gmem_to_smem(top_gmem.at[:, cns], top_smem.at[s], w_full.at[s])
            pl.when(g >= stages)(lambda: plgpu.barrier_wait(a_free.at[s]))
            plgpu.copy_gmem_to_smem(a_gmem.at[pl.ds(mi * cta_m, cta_m), pl.ds(k * tk, tk)],
                                    a_smem.at[s], a_full.at[s])

        drain((w_free, a_free), stages, steps)

      def converter(chunks):  # this converter warpgroup's 64-row chunks of the B tile
        plgpu.set_max_registers(converter_regs, action="decrease")

        @tiles
        def steps(g0, mi, ni):
          del mi, ni

          @pl.loop(0, k_iters)
          def _(k):
            g = g0 + k
            s, b = lax.rem(g, stages), lax.rem(g, b_tiles)
            plgpu.barrier_wait(w_full.at[s])
            # converted in registers before the B tile is free (step g - b_tiles' WGMMAs
            # may still read it): only the stores wait
            converted = [convert_e2m1_chunk(codes_smem.at[s], scales_smem.at[s],
                                            top_smem.at[s, 0], c * E2M1_ROWS, w=w,
                                            interpret=interpret) for c in chunks]
            pl.when(g >= b_tiles)(lambda: plgpu.barrier_wait(b_free.at[b]))
            for c, chunk in zip(chunks, converted):
              b_smem.at[b, pl.ds(c * E2M1_ROWS, E2M1_ROWS)][...] = chunk
            # proxy fence: the stores -> the WGMMAs' reads, and the codes' reads -> the
            # next TMA write of their slot (the interpreter's race detector flags the
            # slot's release before it)
            plgpu.commit_smem()
            plgpu.barrier_arrive(w_free.at[s])
            plgpu.barrier_arrive(b_full.at[b])

        drain((b_free,), b_tiles, steps)

      for ci in range(converters):  # chunk c to converter c % converters
        pl.when(wg == 2 + ci)(functools.partial(
            converter, [c for c in range(tn // E2M1_ROWS) if c % converters == ci]))

      @pl.when(wg < 2)
      def _mma():
        plgpu.set_max_registers(mma_regs, action="increase")

        @tiles
        def _(g0, mi, ni):
          wg_ms = pl.ds(mi * cta_m + wg * tm, tm)
          wg_ns = pl.ds(ni * cta_n, cta_n)
          if vec_bar is not None:  # the epilogue vectors travel while the K loop runs
            for g in rows_gmem:
              plgpu.copy_gmem_to_smem(g.at[:, wg_ms], rows_smem.at[wg], vec_bar.at[wg])
            for i, g in enumerate(cols_gmem):
              plgpu.copy_gmem_to_smem(g.at[:, wg_ns], cols_smem.at[wg, pl.ds(i, 1)],
                                      vec_bar.at[wg])

          def release(g):  # step g's A slot and B tile
            plgpu.barrier_arrive(a_free.at[lax.rem(g, stages)])
            plgpu.barrier_arrive(b_free.at[lax.rem(g, b_tiles)])

          def k_loop(acc_ref):
            @pl.loop(0, k_iters)
            def _(k):
              g = g0 + k
              s, b = lax.rem(g, stages), lax.rem(g, b_tiles)
              plgpu.barrier_wait(a_full.at[s])
              plgpu.barrier_wait(b_full.at[b])
              plgpu.wgmma(acc_ref, a_smem.at[s, pl.ds(wg * tm, tm)], b_smem.at[b].T)
              plgpu.wgmma_wait(1)  # step g - 1's WGMMA done: its slots are free
              pl.when(k > 0)(lambda: release(g - 1))

            plgpu.wgmma_wait(0)
            release(g0 + k_iters - 1)
            return acc_ref[...]

          y = pl.run_scoped(k_loop, plgpu.ACC(shape, jnp.float32))
          if vec_bar is not None:
            plgpu.barrier_wait(vec_bar.at[wg])
          if rows:
            y = y * lax.broadcast_in_dim(rows_smem[wg, 0, :], shape, (0,))
          if col_scale is not None:
            y = y * lax.broadcast_in_dim(cols_smem[wg, 0, :], shape, (1,))
          if bias is not None:
            y = y + lax.broadcast_in_dim(cols_smem[wg, len(cols) - 1, :], shape, (1,))
          y = y.astype(out_dtype)
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # last tile's stores read out
          store_tile(y, o_smem, wg, o_gmem.at[wg_ms, wg_ns], 0, slots)

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    scratch = [
        plgpu.SMEM((stages, cta_m, tk), jnp.float8_e4m3fn, transforms=in_tf),
        plgpu.SMEM((stages, 1, cta_n, tk), jnp.int4, transforms=codes_tf),
        plgpu.SMEM((stages, groups, cta_n), w.scales.dtype),
        plgpu.SMEM((stages, 1, cta_n), jnp.float32),
        plgpu.SMEM((b_tiles, tn, tk), jnp.float8_e4m3fn, transforms=in_tf),
        plgpu.SMEM((2, slots, EPI_TILE, EPI_TILE), out_dtype, transforms=out_tf),
        plgpu.Barrier(num_barriers=stages),  # a_full: the A tile's TMA
        plgpu.Barrier(num_arrivals=3, num_barriers=stages),  # w_full: codes, scales, maxima
        plgpu.Barrier(num_arrivals=2, num_barriers=stages),  # a_free: both MMA warpgroups
        plgpu.Barrier(num_arrivals=converters, num_barriers=stages),  # w_free: converters
        plgpu.Barrier(num_arrivals=converters, num_barriers=b_tiles),  # b_full: converters
        plgpu.Barrier(num_arrivals=2, num_barriers=b_tiles)]  # b_free: both MMA warpgroups
    if rows or cols:
      scratch += [plgpu.Barrier(num_arrivals=len(rows) + len(cols), num_barriers=2),
                  plgpu.SMEM((2, 1, tm), jnp.float32) if rows else None,
                  plgpu.SMEM((2, len(cols), tn), jnp.float32) if cols else None]
    pl.run_scoped(scope, *scratch, collective_axes="wg")

  call = plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((mp, np_), out_dtype),
      grid=(min(tuning.num_sms(), m_iters * n_iters),), grid_names=("sm",),
      num_threads=3 + converters, thread_name="wg",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
          unsafe_no_auto_barriers=not config.e2m1_auto_barriers),
      interpret=plgpu.InterpretGPUParams() if interpret else False)
  return call(a, w.codes, *e2m1_in, *rows, *cols)


def _check_e2m1(a: jax.Array, w: E2M1Weights, kp: int, grouped: bool) -> int:
  """:func:`gemm`'s checks of E2M1Weights against (Mp, Kp) ``a``; returns Np."""
  if a.dtype != jnp.float8_e4m3fn:
    raise ValueError(f"a.dtype={a.dtype}: E2M1Weights take float8_e4m3fn activations")
  if grouped:
    raise ValueError("E2M1Weights take no K-group scales (row_group_scale / "
                     "col_group_scale): their group scales are folded into the codes")
  if w.codes.ndim != 3 or w.codes.dtype != jnp.int4 or w.codes.shape[0] * w.codes.shape[2] != kp:
    raise ValueError(f"w.codes: expected int4 (Kp / tile_k, Np, tile_k) codes with Kp={kp}; "
                     f"got {w.codes.dtype} {w.codes.shape}")
  np_ = w.codes.shape[1]
  if w.scales.ndim != 2 or w.scales.shape[1] != np_ or w.scales.shape[0] < kp // E2M1_GROUP:
    raise ValueError(f"w.scales: expected (>= {kp // E2M1_GROUP}, {np_}) group-scale rows "
                     f"(one per {E2M1_GROUP} codes of K); got {w.scales.shape}")
  if w.scales.dtype not in (jnp.bfloat16, jnp.float16):  # (2 bytes: smem_bytes)
    raise ValueError(f"w.scales: expected bfloat16 / float16 e8m0 values (the layout's "
                     f"scale rows); got {w.scales.dtype}")
  if w.top.shape != (1, np_):
    raise ValueError(f"w.top: expected (1, {np_}) column maxima; got {w.top.shape}")
  return np_
