#!/usr/bin/env bash
# Session 10, device call 4 (~6 minutes on an H200).  Carry: [".whl"].
# The grouped launch shapes of grouped_wna16_mgpu.heuristic (shared x tiles for prefill,
# split-K 2 for narrow decode) are the default now: every grouped Mosaic GPU test, then the
# default at the benchmark rows and the whole MoE layer on it.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 130 python3 -m pytest tests/test_grouped_wna16_mgpu.py -m gpu -p no:cacheprovider \
  --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|rel err" "$OUT/gpu_tests.log" | cut -c1-200 | tail -14
step moe_default
T 130 python3 benchmarks/bench_moe.py \
  --shapes qwen3-30b-a3b-gate_up,deepseek-v3-gate_up,qwen3-30b-a3b-down --tokens 1,64,1024 \
  --specs w4a16-g128-zp@mgpu --no-baselines --calls 10 --repeats 2 \
  --json "$OUT/moe_default.json" > "$OUT/moe_default.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_default.log" | cut -c1-300
step moe_layer
for model in qwen3-30b-a3b deepseek-v3; do
  T 60 python3 benchmarks/bench_moe_layer.py --models $model --tokens 1,16,64 \
    --families default,triton --calls 10 --repeats 2 \
    --json "$OUT/moe_layer_$model.json" > "$OUT/moe_layer_$model.log" 2>&1
  grep -E "^\{|rror|^\|" "$OUT/moe_layer_$model.log" | cut -c1-300 | tail -6
done
step done
