#!/usr/bin/env bash
# The next device call (~9.5 minutes on an H200), prepared 2026-11-30 session 9.
# Open since session 9 (NOTES.md v11, NOTES_moe.md session 9):
#   1. Warpgroups splitting N over one shared x tile (MgpuConfig.split_warpgroups="n",
#      built after the device time was spent: interpreter-tested with two warpgroups,
#      lowers for the H200 with four).  Prediction: x is read from L2 once per CTA
#      instead of once per 64 columns -- 268 MB of x reads per 8192^2 layer at M = 128
#      (37 us at ~7 TB/s) become 67 MB with four warpgroups; Mixtral gate_up at 1024
#      tokens reads ~7 GB of x for 470 MB of weights.  GPU tests first, then CUPTI
#      (dense M = 128 / 64) and the grouped gate_up shapes, @mgpu vs @mgpu-xn.
#   2. Model-like timing (--chain sequential: donated state, stable buffer addresses).
#   3. The whole MoE layer the same way, with the CUPTI kernel sums.
# Step timeouts sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step shared_x_gpu_tests
T 80 python3 -m pytest tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "configs_gpu or shared_x" -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
step profile_shared_x
T 70 python3 benchmarks/profile_mgpu.py --ms 128,64 \
  --configs default,wg4-acc-xn,wg2-xn,wg2-xn-split2 --iterations 3 \
  > "$OUT/profile_shared_x.log" 2>&1
grep -E "^M=" "$OUT/profile_shared_x.log" | cut -c1-220
step moe_shared_x
T 150 python3 benchmarks/bench_moe.py \
  --shapes deepseek-v3-gate_up,mixtral-gate_up,qwen3-30b-a3b-gate_up --tokens 64,1024 \
  --specs w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu-xn --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_shared_x.json" > "$OUT/moe_shared_x.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_shared_x.log" | cut -c1-300
step dense_sequential
T 120 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4 \
  --ms 1,16 --layers 16 --chain sequential --humming --calls 20 --repeats 2 \
  --json "$OUT/dense_sequential.json" > "$OUT/dense_sequential.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_sequential.log" | cut -c1-250
step moe_layer_sequential
for model in qwen3-30b-a3b deepseek-v3; do
  T 70 python3 benchmarks/bench_moe_layer.py --models $model --tokens 1,16 \
    --families default,triton --chain sequential --breakdown --calls 10 --repeats 2 \
    --json "$OUT/moe_layer_seq_$model.json" > "$OUT/moe_layer_seq_$model.log" 2>&1
  grep -E "^\{|rror" "$OUT/moe_layer_seq_$model.log" | cut -c1-300
done
step done
