#!/usr/bin/env bash
# The next device call (about 9 minutes on an H200), prepared 2026-11-29 session 4.
# What is open since the last GPU runs (benchmarks/NOTES*.md):
#   1. every GPU test file once with the session-4 defaults (W8A8 Mosaic route, v6 decode);
#   2. the decode table of every A16 preset at M = 1 / 16 / 128 with Humming (issue 3's
#      "every other A16 format >= 2.2 TB/s" row was never measured for most formats);
#   3. W8A8 Mosaic kernel below MIN_M = 512 (is it faster than Triton at 128 / 256?) and
#      the grouped variant's Config.group_pairs experiment (NOTES_w8a8.md: the promotion
#      stalls the MMA; pairs promote one group while the next one's WGMMA runs);
#   4. MoE rows (Qwen3, Mixtral) with --breakdown.
# Step timeouts (SIGINT, SIGKILL 5 s later) sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 180 python3 -m pytest tests -m gpu -p no:cacheprovider --tb=line -q \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
step dense_formats
T 110 python3 benchmarks/bench_dense.py \
  --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4,w8a16,w8a16-fp8,w4a16-mxint4 \
  --ms 1,16,128 --layers 8 --calls 20 --repeats 2 --humming --json "$OUT/dense.json" \
  > "$OUT/dense.log" 2>&1
grep -E "^8192|ERROR" "$OUT/dense.log" | cut -c1-250
step w8a8_small_m
T 80 python3 benchmarks/profile_w8a8_mgpu.py --specs w8a8-int8,w8a8-fp8 --ms 128,256 \
  --layers 4 --iterations 3 > "$OUT/profile_w8a8_small.log" 2>&1
T 50 python3 benchmarks/profile_w8a8_mgpu.py --specs w4a8-int8,w8a8-fp8-block --ms 4096 \
  --layers 4 --iterations 3 --configs default,pairs >> "$OUT/profile_w8a8_small.log" 2>&1
grep -E "^M=" "$OUT/profile_w8a8_small.log" | cut -c1-200
T 50 python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 16,128,256 --layers 4 \
  --calls 10 --repeats 2 --humming > "$OUT/bench_w8a8_small.log" 2>&1
grep -E "^M=" "$OUT/bench_w8a8_small.log" | cut -c1-200
step moe_rows
T 90 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down \
  --tokens 1,256 --specs w4a16-g128-zp --layers 2 --calls 20 --repeats 2 --humming \
  --breakdown --json "$OUT/moe_qwen.json" > "$OUT/moe_qwen.log" 2>&1
grep -E "^qwen" "$OUT/moe_qwen.log" | cut -c1-300
step done
