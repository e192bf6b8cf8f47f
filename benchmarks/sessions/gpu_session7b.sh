#!/usr/bin/env bash
# Session 7, device call 3 (~9 minutes on an H200, the session's last): issue 5's MoE table
# with a chain of 8 (int4 g128 zp vs Humming, every shape, tokens 1 / 64 / 1024), issue 4's
# fused-vs-pre-pass activation quantization study, a CUPTI profile of int4 at M = 16 (call
# 2's ladder: 31.7 us vs 21.6 in session 5), and the M = 128 ladder row with the new
# two-warpgroup heuristic.  Step timeouts sum to 520 s.  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step moe
T 300 python3 benchmarks/bench_moe.py --tokens 1,64,1024 --specs w4a16-g128-zp --no-baselines \
  --humming --calls 20 --repeats 2 --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1
grep -E "hj:|^\||rror" "$OUT/moe.log" | cut -c1-250
step act_quant_study
T 100 python3 benchmarks/bench_w8a8.py --act-quant-study --ms 16,1024 --calls 10 --repeats 2 \
  > "$OUT/act_quant_study.log" 2>&1
grep -vE "^\s*$|Warning|warn" "$OUT/act_quant_study.log" | cut -c1-250 | tail -12
step int4_m16
T 60 python3 benchmarks/profile_mgpu.py --ms 1,16 --configs default,sub1 --layers 8 \
  --iterations 3 > "$OUT/int4_m16.log" 2>&1
grep -E "^M=|rror" "$OUT/int4_m16.log" | cut -c1-220
step dense_m128
T 60 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4 --ms 128 --humming \
  --calls 20 --repeats 2 --json "$OUT/dense_m128.json" > "$OUT/dense_m128.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_m128.log" | cut -c1-250
step done
