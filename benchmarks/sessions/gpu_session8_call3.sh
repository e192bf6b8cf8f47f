#!/usr/bin/env bash
# Session 8, call 3 (~9 min, carry [".whl"]): the dense 8192^2 ladder (M 1 ... 4096) for
# the 4-bit formats and fp8 weights (now on the Mosaic kernel) beside XLA bf16 and Humming;
# then the MoE down shapes (never run for Mixtral) on both grouped kernels beside Humming.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step dense_ladder
T 250 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4,w8a16-fp8 \
  --ms 1,16,128,1024,4096 --humming --calls 20 --repeats 2 --json "$OUT/dense_ladder.json" \
  > "$OUT/dense_ladder.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_ladder.log" | cut -c1-250
step moe_down
T 290 python3 benchmarks/bench_moe.py \
  --shapes mixtral-down,deepseek-v3-down,qwen3-30b-a3b-down --tokens 1,1024 \
  --specs w4a16-g128-zp,w4a16-g128-zp@mgpu --no-baselines --humming \
  --calls 10 --repeats 2 --json "$OUT/moe_down.json" > "$OUT/moe_down.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_down.log" | cut -c1-300
step done
