#!/usr/bin/env bash
# Session 8, call 2 (~9 min, carry [".whl"]): the grouped kernels after the session-8
# changes -- Triton grouped heuristic with 64-wide N tiles from 2 rows per expert (the
# grouped-autotune winners of call 1), Mosaic grouped block_rows = mean + 2 sd (tiles up to
# 128 rows, two warpgroups above 64) -- GPU tests, then the MoE gate_up table on both
# kernels beside Humming.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step grouped_gpu_tests
T 100 python3 -m pytest tests/test_grouped_wna16_mgpu.py tests/test_grouped_kernels.py -m gpu \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/grouped_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/grouped_tests.log" | cut -c1-200 | tail -8
step moe_gate_up
T 430 python3 benchmarks/bench_moe.py \
  --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,mixtral-gate_up --tokens 1,64,1024 \
  --specs w4a16-g128-zp,w4a16-g128-zp@mgpu --no-baselines --humming \
  --calls 10 --repeats 2 --json "$OUT/moe_gate_up.json" > "$OUT/moe_gate_up.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_gate_up.log" | cut -c1-300
step done
