#!/usr/bin/env bash
# The next device calls (~11 minutes on an H200, two calls), prepared 2026-11-30 session 13.  Open:
#   1. The 1024-token MoE rows with Humming in the same run (cut in sessions 12 and 13;
#      session 11: 0.72x / 0.64x).
#   2. W4A8 at M = 1024 / 4096 with the epilogue token scale (session 13 measured 4096:
#      648.7 us wall), beside W4A16 of the same weights (issue 4: never slower).
#   0. MgpuConfig.overlap_read_early (NOTES.md v15, "Review catch"; built, interpreter-
#      tested, not GPU-run): tile j - 1's accumulator read with wait_n=1, so tile j's MMA
#      runs while j - 1 is scaled.  Its GPU test (test_configs_gpu includes it), then
#      CUPTI against the default at M = 1 / 16 and the grouped 1 / 64 tokens.
#   3. Qwen3-30B-A3B gate_up at 1 token: 192 CTAs of 4 warpgroups on 132 SMs (1.45 waves;
#      0.64x Humming).  Two warpgroups per CTA use ~100 KB of shared memory, so two CTAs
#      fit per SM: one wave.  Tokens wg2 (and wg2-st2) against the default.
# Step timeouts sum to ~680 s: split across two calls.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step overlap_read_early
T 120 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "configs_gpu" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-200 | tail -6
T 80 python3 benchmarks/profile_mgpu.py --ms 1,16 --spec w4a16-g128-zp --configs default,ovl1 \
  2>&1 | grep -E "^M=|rror" | cut -c1-250
T 90 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 1,64 \
  --specs "w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:ovl1" --no-baselines --breakdown \
  --chain resident --calls 10 --repeats 2 2>&1 | grep -E "T=|rror" | cut -c1-700
step moe_1024
T 170 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up \
  --tokens 1024 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 4 --repeats 2 --json "$OUT/moe_1024.json" > "$OUT/moe_1024.log" 2>&1
grep -E "T=|rror" "$OUT/moe_1024.log" | cut -c1-600
step w4a8
T 150 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
  --specs w4a8-int8,w4a16-g128-zp --kernel-times --calls 5 --repeats 2 \
  --json "$OUT/w4a8.json" > "$OUT/w4a8.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8.log" | cut -c1-300
step qwen3_t1_waves
T 60 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up --tokens 1 \
  --specs "w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:wg2,w4a16-g128-zp@mgpu:wg2-st2" \
  --no-baselines --breakdown --chain resident --calls 10 --repeats 2 2>&1 \
  | grep -E "T=|rror" | cut -c1-700
step done
