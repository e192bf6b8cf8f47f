#!/usr/bin/env bash
# Session 13, device call 3 (~7 min of step limits; carry [".whl"]).
#   1. The grouped GPU tests call 2's step limit cut, on the new decode default
#      (overlap_mma): Qwen3 decode at 1 / 16 / 64 tokens, the DeepSeek-V3 split-K decode.
#   2. The grouped GEMM table with Humming in the same run (resident chain), int4 g128 zp.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PT="-p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning"
step gpu_tests
T 140 python3 -m pytest tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "qwen3_decode_gpu or deepseek_decode_split_k_gpu" $PT > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR|PASSED)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
step moe
T 270 python3 benchmarks/bench_moe.py \
  --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
  --specs w4a16-g128-zp@mgpu --humming --no-baselines --breakdown --chain resident \
  --calls 10 --repeats 2 --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1
grep -E "T=|rror" "$OUT/moe.log" | cut -c1-600
step done
