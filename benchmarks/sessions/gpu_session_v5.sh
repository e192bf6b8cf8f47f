#!/usr/bin/env bash
# Device call, 2026-11-29 session 3 (about 8 minutes on an H200):
#   1. the Mosaic WnA16 kernel's GPU tests after the hand-written pipeline / warpgroups change;
#   2. decode profile (CUPTI kernel time + chain wall time) of warpgroup / split configs;
#   3. bench_dense: 8192^2 int4 at every M and Llama-3-8B shapes at decode, with Humming;
#   4. bench_w8a8 (issue 4 table) and 5. bench_moe (issue 5 rows), with Humming.
# Carry: [".whl"].  Logs land in $OUT.
source "$(dirname "$0")/../gpu_env.sh"
step test_wna16_mgpu
timeout -s INT 100 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -p no:cacheprovider \
  --tb=short -rA -W ignore::DeprecationWarning -k "configs or -1] or -16]" \
  > "$OUT/mgpu_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/mgpu_tests.log" | tail -20
step profile
timeout -s INT 120 python3 benchmarks/profile_mgpu.py --ms 1,16 \
  --configs wg1,wg2,default,wg4-sub2,wg4-st6,wg2-split2,wg4-split2,wg1-split4 \
  > "$OUT/profile.log" 2>&1
grep -E "^M=|Error" "$OUT/profile.log" | cut -c1-300
step bench_dense
timeout -s INT 170 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-g128 \
  --ms 1,16,128,1024,4096 --shapes 8192x8192 --layers 8 --calls 20 --repeats 2 --humming \
  --json "$OUT/dense_8192.json" > "$OUT/dense_8192.log" 2>&1
grep -E "^8192|ERROR" "$OUT/dense_8192.log" | cut -c1-250
timeout -s INT 80 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp \
  --ms 1,16 --shapes llama3-8b-gate_up,llama3-8b-down,llama3-8b-qkv --layers 8 --calls 20 \
  --repeats 2 --humming --json "$OUT/dense_llama.json" > "$OUT/dense_llama.log" 2>&1
grep -E "^llama|ERROR" "$OUT/dense_llama.log" | cut -c1-250
step bench_w8a8
timeout -s INT 110 python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8,w4a8-mxfp4 \
  --ms 16,1024,4096 --layers 4 --calls 20 --repeats 2 --humming \
  --json "$OUT/w8a8.json" > "$OUT/w8a8.log" 2>&1
grep -E "^\|" "$OUT/w8a8.log" | tail -12
step bench_moe
timeout -s INT 110 python3 benchmarks/bench_moe.py --shapes deepseek-v3-down,qwen3-30b-a3b-gate_up \
  --tokens 1,16,256 --specs w4a16-g128-zp,w4a8-mxfp4 --layers 2 --calls 20 --repeats 2 \
  --humming --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1
tail -12 "$OUT/moe.log" | cut -c1-250
step done
