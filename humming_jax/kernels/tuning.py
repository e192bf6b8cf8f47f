"""Per-shape kernel configuration: a frozen TuningConfig, heuristics, an autotune cache.

Shapes are static under jit, so the config is chosen at trace time from
(kernel family, spec, M, N, K, device kind).  Lookup order: an explicit config argument,
then the JSON autotune cache (``HUMMING_JAX_TUNING_CACHE`` or
``~/.cache/humming_jax/tuning.json``, written by ``python -m humming_jax.autotune``), then
the heuristics below.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import warnings
import os
from pathlib import Path

import jax

NUM_SMS_DEFAULT = 132  # H100 / H200 SXM
SMEM_BYTES = 232448  # H100 / H200 opt-in shared memory per block (227 KiB)
# What a Mosaic GPU kernel may allocate: the block maximum less its barriers and alignment.
MOSAIC_SMEM_BUDGET = SMEM_BYTES - 2048
SM_SMEM_BYTES = 233472  # H100 / H200 shared memory per SM (228 KiB; 1 KiB reserved per CTA)


def smem_round(nbytes: int) -> int:
  """A Mosaic GPU scratch buffer's shared-memory footprint: rounded up to 1 KB."""
  return -(-nbytes // 1024) * 1024


def env_flag(name: str, default: bool | None) -> bool | None:
  """An on / off switch from the environment ("0" / "1"; unset: ``default``, which may be
  None where unset means something of its own)."""
  value = os.environ.get(name)
  if value is None:
    return default
  if value not in ("0", "1"):
    raise ValueError(f"{name}={value!r}: expected '0' or '1'")
  return value == "1"


def env_int(name: str, default: int) -> int:
  """A non-negative int from the environment (unset or empty: ``default``)."""
  value = os.environ.get(name) or None
  if value is None:
    return default
  if not value.isdecimal() or not value.isascii():
    raise ValueError(f"{name}={value!r}: expected a non-negative integer")
  return int(value)


def env_choice(name: str, choices: tuple[str, ...]) -> str | None:
  """One of ``choices`` from the environment (unset or empty: None)."""
  value = os.environ.get(name) or None
  if value is not None and value not in choices:
    raise ValueError(f"{name}={value!r}: expected one of {choices}")
  return value


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """Tiling of one Pallas-Triton GEMM launch."""

  block_m: int = 16
  block_n: int = 64
  split_k: int = 1
  num_warps: int = 4
  num_stages: int = 3
  swap_ab: bool = False  # compute (W^T x^T)^T: dequantized weights as the MMA A operand
  # "mma": tensor-core dot per slab; "fma": multiply-add + reduce without tensor cores
  # (tiny M: no shared-memory round trip of the dequantized weights); "dequant_gemm":
  # dequantize to the activation dtype (one XLA fusion) and run the vendor GEMM -- at large
  # M the GEMM is compute bound and the dequantization is a few percent of it.
  strategy: str = "mma"

  def __post_init__(self):
    if self.strategy not in ("mma", "fma", "dequant_gemm"):
      raise ValueError(f"strategy={self.strategy!r}; expected 'mma', 'fma' or "
                       "'dequant_gemm'")
    min_m = 1 if self.strategy == "fma" else 16
    if self.block_m < min_m or self.block_m & (self.block_m - 1):
      raise ValueError(f"block_m={self.block_m} must be a power of two >= {min_m}")
    if self.block_n < 16 or self.block_n & (self.block_n - 1):
      raise ValueError(f"block_n={self.block_n} must be a power of two >= 16")
    if self.split_k < 1:
      raise ValueError(f"split_k={self.split_k} must be >= 1")
    if self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"num_warps={self.num_warps} must be a power of two <= 16")


@dataclasses.dataclass(frozen=True)
class MgpuConfig:
  """Launch shape of the Mosaic GPU WnA16 kernel (kernels/wna16_mgpu.py)."""

  block_m: int = 64  # tokens per CTA (the WGMMA N dimension: a multiple of 8, <= 256)
  stages: int = 4  # pipeline steps in flight per warpgroup (lowered to fit shared memory)
  substeps: int = 1  # K tiles per pipeline step
  dequant_gemm_min_m: int = 512  # from this M on: XLA dequantize + GEMM
  # Decode is bound by the per-step dequant -> WGMMA chain of one warpgroup (NOTES.md v5):
  # more warpgroups streaming different K ranges of the same output rows hide it.
  warpgroups: int = 1  # warpgroups per CTA, each with its own K range; summed in SMEM
  split_k: int = 1  # CTAs per N tile along K (f32 partials summed by XLA)
  optimized_load: bool = False  # Mosaic's vectorised-only smem -> register load of codes
  # v6 (NOTES.md v6, H200): the group scale multiplies each K tile's float32 partial
  # product instead of every code (-5% kernel time at M = 1; default for decode).
  scale_after_mma: bool = False
  # ... and the zero point as z * sum_k x (a second WGMMA with an all-ones A operand per K
  # tile) instead of a subtraction per code; needs scale_after_mma.  Measured +23% kernel
  # time (the extra WGMMA costs more than the subtraction it saves): off.
  zero_point_mma: bool = False
  # Rows past M through TMA's out-of-bounds zero fill / clipped store instead of an XLA pad
  # and slice around the kernel (one launch fewer each; default for decode).
  unpadded_rows: bool = False
  # fp4 weights: the int4 -> WGMMA relayout inside the inline PTX block, so each pair's PTX
  # reads the 32-bit register it was sliced from (kernels/mgpu_convert.py; ~3 instructions
  # fewer per pair than shifting each pair down first).  H200, 8192^2, M = 1, CUPTI:
  # MXFP4 21.6 -> 19.2 us, NVFP4 21.4 -> 19.3, same output (benchmarks/NOTES.md v8): on.
  fp4_whole_registers: bool = True
  # What the warpgroups of a CTA split: "k" (each its own K range of the same 64 output
  # columns, summed in SMEM: decode hides the dequant -> WGMMA latency this way) or "n"
  # (each its own 64 columns over all of K, sharing one x tile in SMEM: the x tile is read
  # from L2 once per CTA instead of once per 64 columns -- the traffic that bounds
  # 128-row tiles, ~2 MB of x per 64 columns at 8192^2 M = 128; NOTES.md v11).  H200
  # session 10: loses on the dense kernel (L2 serves the re-reads), wins 1.12-1.38x on
  # grouped prefill tiles (grouped_wna16_mgpu.heuristic picks it there); off here.
  split_warpgroups: str = "k"
  # int4 codes: one inline PTX block per pair (prmt, lop3, sub) with the zero point folded
  # into the magic-number constant (kernels/mgpu_convert.int4_to_float_ptx) instead of
  # Mosaic's conversion plus a subtraction per pair.  H200, session 11 (NOTES.md v13):
  # bit-identical outputs in 14 GPU cases (zp / symmetric / MXINT4 / per-channel, bf16 and
  # fp16, M = 1 / 16 / 128); 8192^2 int4 g128 zp at M = 1: CUPTI 17.1 -> 16.0 us, Nsight
  # Compute 17.73 -> 16.93 us: on.  It reads Mosaic's register layout of int4 fragments
  # (jax 0.11.2's, GPU-tested); a jax that lays them out otherwise is refused at lowering
  # by name, and HUMMING_JAX_INT4_PTX=0 turns it off (Mosaic's conversion, same values).
  int4_ptx: bool = dataclasses.field(
      default_factory=lambda: env_flag("HUMMING_JAX_INT4_PTX", True))
  # With scale_after_mma and two or more K tiles per step: each K tile's WGMMA into its
  # own accumulator, all of a step's issued before the first is read, so tile j + 1's
  # dequantization overlaps tile j's MMA (before: every K tile waited for its MMA before
  # the next was dequantized).  H200 session 13 (NOTES.md v15): 8192^2 M = 16 17.1 ->
  # 16.4 us, M = 1 unchanged; grouped 1 token 10.3 -> 9.4.  On in the decode heuristic;
  # no effect with one K tile per step, several scale rows per tile or zero_point_mma.
  # (Session 14 timed the wider form -- tile j - 1's accumulator read with
  # wgmma_accumulator_load(wait_n=1) so tile j's MMA also runs while j - 1 is scaled -- and
  # removed it: M = 1 15.8 vs 16.0 us, grouped 1 token 9.94 vs 9.31, and ptxas failed on
  # it at M = 16; NOTES.md v16.)
  overlap_mma: bool = False
  # fp8-MMA layout with e8m0 group scales (W4A8 MXFP4): fold each K tile's power-of-two
  # group scales into the e4m3 operands' exponents (mgpu_convert.e2m1_to_e4m3_ptx's fold),
  # one float32 partial and one WGMMA wait per K tile instead of one per 32-deep group.
  # Off: H200 session 22 (CUPTI kernel us) Mixtral gate_up 1024 tokens 1202.8 -> 1238.8,
  # dense 8192^2 M = 128 44.8 -> 45.3; error 2.8e-4 -> 4.8e-4 (128-deep fp8 accumulation).
  # The waits were not the bound (nor L2 traffic: session 24's clusters; the tile is
  # latency-bound at one 8-warp CTA per SM, NOTES.md v25).  Kept (opt-in, GPU-tested) as
  # the step to one accumulator per CTA, which fewer registers per thread need.  Its error
  # is relative to the tile's largest group: codes > 11 binades below it are zeroed, so
  # where that group meets near-zero activations the zeroed groups' whole share is lost
  # (test_fp8_fold_interpret shows it).  Only where K needs no padding (the padding scale
  # rows, 1.0, would enter the last tile's base): HUMMING_JAX_FP8_FOLD=1 leaves padded-K
  # weights on the per-group route, and run() refuses an explicit config there.
  fp8_fold: bool = False
  # With split_warpgroups="n": CTAs of adjacent column blocks and the same rows run as one
  # cluster sharing each x tile: every CTA loads 1/cluster_n of it and TMA multicasts that
  # part into the others' shared memory.  A slot is refilled once every warpgroup of the
  # cluster has released it (a cluster barrier).  run() halves it until it divides the
  # column blocks and the tile's 8-row groups (Mosaic splits the leading dimension), so
  # e.g. 104-row tiles or an odd count of column CTAs run unclustered.  The 128-row fp8
  # expert tiles gain 3.8-4.0 % with pairs; the 16-bit route's lose (NOTES.md v25).
  cluster_n: int = 1
  # Session 25: the fold against each column's largest group scale over all of K (not the
  # K tile's), so every K tile's fp8 WGMMAs accumulate straight into one accumulator (no
  # float32 partial, no per-group multiply, no wait per group) and the epilogue multiplies
  # each column by max * 2**-11.  Exact only where every column's scales span <= 11
  # binades: run() takes it on layouts marked ":cf" (wna16_mgpu.mark_column_fold) and
  # nowhere else.  The fp8 MMA then sums all of K in its reduced-precision accumulator
  # (w8a8_mgpu's class of error).  The loop body alone runs 1561 against 869 TFLOP/s
  # (probe_wgmma_rate.py, 128-row tiles, two warpgroups) in 106 against 255 registers, so
  # 128-row tiles fit four warpgroups (grouped_wna16_mgpu.heuristic takes that).
  fp8_single_acc: bool = False
  # Session 35: each CTA computes this many adjacent column blocks (of 64 columns per
  # warpgroup) one after another through one pipeline -- the next block's weights are in
  # flight during this block's epilogue -- so a CTA's fixed costs (launch, barrier set-up,
  # the first TMA latency, the store wait) are paid once per `column_blocks` blocks.  For
  # short K (DeepSeek-V3 down: K 256, one pipeline step per block) where those costs are
  # most of a CTA's time.  run() lowers it to a divisor of the column blocks; the 16-bit
  # route only (not the fp8-MMA layout, not with cluster_n).
  column_blocks: int = 1
  # Session 56: the decode product on mma.sync (kernels/mgpu_mma.py) instead of the
  # register-A WGMMA: each warp multiplies its 16 dequantized weight rows by x fragments it
  # loads itself (no shared-memory descriptors, fences or warpgroup waits).  The 16-bit
  # route only, block_m <= 32, no cluster, on the GPU (the interpreter runs the WGMMA form).
  # wna16_mgpu.default_config takes it at M <= 8 for int4 / uint4 / MXFP4 on an H100
  # (MMA_SYNC_MAX_M, MMA_SYNC_DEVICES), grouped_wna16_mgpu.heuristic on 8-row expert tiles
  # of those whose warpgroups stream at most 16 K tiles (session 57).
  mma_sync: bool = False
  mma_chains: int = 2  # mma_sync: independent accumulators per 8 x rows (alternate K steps)

  def __post_init__(self):
    if self.column_blocks < 1:
      raise ValueError(f"column_blocks={self.column_blocks} must be >= 1")
    if self.column_blocks > 1 and self.cluster_n > 1:
      raise ValueError(f"column_blocks={self.column_blocks} with cluster_n="
                       f"{self.cluster_n}: a cluster's CTAs share x tiles block by block; "
                       f"use one of the two")
    if self.split_warpgroups not in ("k", "n"):
      raise ValueError(f"split_warpgroups={self.split_warpgroups!r}: expected 'k' or 'n'")
    if self.split_k < 1:
      raise ValueError(f"split_k={self.split_k} must be >= 1")
    if self.warpgroups not in range(1, 9):
      raise ValueError(f"warpgroups={self.warpgroups} must be in [1, 8] (128 threads "
                       f"each; 4 leave 128 registers per thread, 8 leave 64)")
    if self.block_m % 8 or not 8 <= self.block_m <= 256:
      raise ValueError(f"block_m={self.block_m} must be a multiple of 8 in [8, 256]")
    if self.stages < 1 or self.substeps < 1:
      raise ValueError(f"stages={self.stages} and substeps={self.substeps} must be >= 1")
    if self.cluster_n not in (1, 2, 4):
      raise ValueError(f"cluster_n={self.cluster_n}: expected 1, 2 or 4 CTAs per cluster")
    if self.cluster_n > 1 and self.split_warpgroups != "n":
      raise ValueError(f"cluster_n={self.cluster_n} needs split_warpgroups='n' (one x tile "
                       f"per CTA to multicast); got {self.split_warpgroups!r}")
    if self.zero_point_mma and not self.scale_after_mma:
      raise ValueError("zero_point_mma=True needs scale_after_mma=True")
    if self.overlap_mma and not self.scale_after_mma:
      raise ValueError("overlap_mma=True needs scale_after_mma=True")
    if self.mma_chains < 1:
      raise ValueError(f"mma_chains={self.mma_chains} must be >= 1")
    if self.mma_sync and self.block_m > 32:
      raise ValueError(f"mma_sync=True with block_m={self.block_m}: the warp-level MMA "
                       f"holds every x row in each warp's registers; use block_m <= 32")


def mgpu_candidates(m: int) -> list[MgpuConfig]:
  """The autotune grid of the Mosaic GPU kernel (large block_m x substeps that cannot fit
  shared memory are left out)."""
  if m <= 64:
    # (M <= 8: the 8-row one-K-tile launch, on WGMMA and on mma.sync -- default_config's
    # rule for int4 / MXFP4; run() refuses mma_sync where it does not apply, and the
    # autotuner skips a refused candidate)
    small = ([MgpuConfig(8, 4, 1, warpgroups=4, scale_after_mma=True, mma_sync=ms)
              for ms in (False, True)] if m <= 8 else [])
    return small + ([MgpuConfig(64, 4, 1, warpgroups=w) for w in (1, 2, 4)]
            + [MgpuConfig(64, 4, 2, warpgroups=w) for w in (2, 4)]
            + [MgpuConfig(64, 4, 1, warpgroups=w, split_k=2) for w in (2, 4)]
            + [MgpuConfig(64, 4, 1, split_k=4), MgpuConfig(64, 6, 2)]
            + [MgpuConfig(64, 4, sub, warpgroups=4, scale_after_mma=True) for sub in (1, 2)]
            + [MgpuConfig(64, 4, 2, warpgroups=4, scale_after_mma=True, overlap_mma=True)]
            + [MgpuConfig(64, 4, 1, warpgroups=4, scale_after_mma=True,
                          zero_point_mma=True)]
            + [MgpuConfig(64, 4, 1, warpgroups=2, scale_after_mma=True,
                          split_warpgroups="n")])
  return ([MgpuConfig(128, 4, 1), MgpuConfig(128, 2, 2), MgpuConfig(64, 4, 1),
           MgpuConfig(128, 4, 1, warpgroups=2)]
          + [MgpuConfig(128, 4, 1, warpgroups=2, scale_after_mma=True, split_warpgroups="n"),
             # four warpgroups: 128 registers per thread, no room for the partials
             MgpuConfig(128, 4, 1, warpgroups=4, split_warpgroups="n")]
          + [MgpuConfig(128, 4, 1, warpgroups=2, scale_after_mma=True, split_k=2,
                        split_warpgroups="n")])


def device_kind() -> str:
  try:
    return jax.devices()[0].device_kind
  except RuntimeError:
    return "cpu"


def num_sms() -> int:
  """SMs of the device kernels are built for: an abstract device's (lowering without a
  GPU, tests/test_cuda_lowering.py), else the first device's, else the H100/H200 count."""
  dev = jax.sharding.get_abstract_mesh().abstract_device
  if dev is not None and dev.num_cores:  # inside shard_map on a CPU mesh: None
    return dev.num_cores
  try:
    d = jax.devices()[0]
    return int(getattr(d, "core_count", 0) or NUM_SMS_DEFAULT)
  except RuntimeError:
    return NUM_SMS_DEFAULT


def is_hopper() -> bool:
  """Whether the first device is an sm_90 GPU (what WGMMA needs)."""
  d = jax.devices()[0]
  return d.platform == "gpu" and str(getattr(d, "compute_capability", "0")).startswith("9")


def cache_path() -> Path:
  env = os.environ.get("HUMMING_JAX_TUNING_CACHE")
  return Path(env) if env else Path.home() / ".cache" / "humming_jax" / "tuning.json"


def cache_key(family: str, spec_name: str, m: int, n: int, k: int, kind: str) -> str:
  return f"{kind}|{family}|{spec_name}|{m}|{n}|{k}"


@functools.lru_cache(maxsize=1)
def _load_cache(path: str, mtime: float) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


# Fields the autotune command does not search and no heuristic sets: their stored value is
# the class default at tuning time, so a cache written before a default changed must not
# pin the old one (the fp4 whole-register relayout went on in session 6, the int4 PTX
# conversion in session 11; both give the same bits, only faster).
NOT_TUNED = ("int4_ptx", "fp4_whole_registers", "fp8_fold")


def cached_config(key: str, cls: type = TuningConfig):
  """The cached config for ``key`` as a ``cls`` (TuningConfig or MgpuConfig), or None;
  fields in :data:`NOT_TUNED` take the current default."""
  p = cache_path()
  if not p.exists():
    return None
  entry = _load_cache(str(p), p.stat().st_mtime).get(key)
  if not entry:
    return None
  entry = {k: v for k, v in entry.items() if k not in NOT_TUNED}
  try:
    return cls(**entry)
  except (TypeError, ValueError) as e:  # another version's or another family's entry
    warnings.warn(f"ignoring autotune cache entry {key!r} in {p}: {e}", stacklevel=2)
    return None


def store_configs(entries: dict) -> Path:
  """Merge ``entries`` into the JSON cache (used by the autotune command)."""
  p = cache_path()
  p.parent.mkdir(parents=True, exist_ok=True)
  data = _load_cache(str(p), p.stat().st_mtime) if p.exists() else {}
  data = dict(data)
  data.update({k: dataclasses.asdict(v) for k, v in entries.items()})
  tmp = p.with_suffix(".tmp")
  tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
  tmp.replace(p)
  return p


def bucket_m(m: int) -> int:
  """M rounded up to the ladder the cache is keyed on."""
  for b in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
    if m <= b:
      return b
  return 8192


DEQUANT_GEMM_MIN_M = 1024  # measured crossover on the H200, benchmarks/NOTES.md


def wna16_heuristic(m: int, n: int, k_tiles: int, *, sms: int = NUM_SMS_DEFAULT
                    ) -> TuningConfig:
  """WnA16 tiles, from the H200 sweeps in benchmarks/NOTES.md.

  Small M is bound by the per-weight instruction path: narrow N tiles (64) and split-K
  until there are ~8 programs per SM (best at M = 1 and 16: 64-wide tiles, split 8, two
  stages; swap-AB and the no-tensor-core 'fma' path measured slower for int4).  Medium M:
  64x128 tiles, 8 warps.  Large M is compute bound: dequantize + vendor GEMM."""
  if m >= DEQUANT_GEMM_MIN_M:
    return TuningConfig(128, 128, 1, strategy="dequant_gemm")
  if m <= 16:
    block_n = 64
    while n % block_n:
      block_n //= 2
    programs = max(n // block_n, 1)
    split = 1
    for cand in (2, 4, 8):
      if programs * split >= 8 * sms:
        break
      if k_tiles % cand == 0 and k_tiles // cand >= 2:
        split = cand
    return TuningConfig(16, block_n, split, num_warps=4, num_stages=2)
  block_m = 32 if m <= 32 else 64
  return TuningConfig(block_m, 128 if n % 128 == 0 else 64, 1, num_warps=8, num_stages=2)


def wna16_candidates(m: int) -> list[TuningConfig]:
  """The autotune search space around the heuristics (also the benchmark's --sweep)."""
  T = TuningConfig
  cands = []
  if m <= 4:
    for bn in (64, 128, 256):
      for split in (1, 2, 4, 8):
        for warps in (4, 8):
          cands.append(T(1 if m == 1 else 4, bn, split, warps, 2, strategy="fma"))
  if m <= 64:
    for bn in (64, 128):
      for split in (2, 4, 8):
        for stages in (2, 3):
          cands.append(T(16 if m <= 16 else 64, bn, split, 4, stages))
  elif m <= 512:
    for bm in (16, 32, 64, 128):
      for bn in (64, 128):
        for split in (1, 2, 4):
          for warps in (4, 8):
            cands.append(T(bm, bn, split, warps, 2))
    cands.append(T(128, 128, 1, strategy="dequant_gemm"))
  else:
    for bm, bn, warps in ((64, 128, 4), (128, 128, 8), (128, 64, 4), (64, 256, 8)):
      for stages in (1, 2):
        cands.append(T(bm, bn, 1, warps, stages))
    cands.append(T(128, 128, 1, strategy="dequant_gemm"))
  return cands
