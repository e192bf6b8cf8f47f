#!/usr/bin/env bash
# Session 13, device call 1 (~7.5 min of step limits; carry [".whl"]).
#   Decode is latency-bound (NOTES.md v12-v14: issue slots 50 %, DRAM 45 %, 3.9 warps per
#   scheduler with 1.4 eligible).  Two levers, screened by CUPTI kernel time:
#   1. more warps per SM: 8-row tiles leave the WGMMA accumulators at 4 registers, so 8
#      warpgroups (64 registers per thread) may fit; tokens bm8-wg8[-sub1];
#   2. overlap_mma ("ovl"): each K tile's WGMMA waited for only after the next tile is
#      dequantized and issued.
#   Then the grouped GEMM at 1 / 64 tokens with the same tokens (resident chain).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step dense_int4
T 200 python3 benchmarks/profile_mgpu.py --ms 1 --spec w4a16-g128-zp \
  --configs default,ovl,bm8-ovl,bm8-wg8,bm8-wg8-ovl,bm8-wg8-sub1 2>&1 | grep -E "^M=|rror" | cut -c1-300
T 90 python3 benchmarks/profile_mgpu.py --ms 16 --spec w4a16-g128-zp \
  --configs default,ovl,bm16-wg8-sub1 2>&1 | grep -E "^M=|rror" | cut -c1-300
step dense_mxfp4
T 80 python3 benchmarks/profile_mgpu.py --ms 1 --spec w4a16-mxfp4 \
  --configs default,bm8-wg8,bm8-wg8-sub1 2>&1 | grep -E "^M=|rror" | cut -c1-300
step ptxas_wg8
mkdir -p /tmp/dump
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=/tmp/dump T 60 python3 benchmarks/profile_mgpu.py \
  --ms 1 --configs bm8-wg8 --layers 8 --iterations 1 > /dev/null 2>&1
ls /tmp/dump | head -20; grep -h -iE "registers|spill|bytes stack" /tmp/dump/*ptxas* 2>/dev/null | sort | uniq -c | head
tar czf "$OUT/dump.tgz" -C /tmp dump 2>/dev/null
step moe
T 220 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up \
  --tokens 1,64 --specs "w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:wg8-sub1-xk,w4a16-g128-zp@mgpu:ovl" \
  --no-baselines --breakdown --chain resident --calls 10 --repeats 2 \
  --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1
grep -E "T=|rror" "$OUT/moe.log" | cut -c1-700
step done
