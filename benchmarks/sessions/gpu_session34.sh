#!/usr/bin/env bash
# Session 34 device calls (2026-12-03; every log to $OUT; carry [".whl"]):
#   call 1: gpu_session33.sh's `check` (the decode launch session 33 changed) and `time`'s
#           bench (Qwen3 gate_up 16 / 32 / 64 tokens, int4 with and without zero points,
#           default against @mgpu:wg2-st2, Humming in the same process)
#   call 2: AB=deepseek-v3-down:1024 gpu_session32.sh cost_ab -- which timed the Triton
#           grouped kernel, the default there (K 256 < MIN_DEFAULT_K 768), both times
#   call 3: the same point with --breakdown: the CUPTI profiler aborted ("activity records
#           were dropped"), no numbers
#   call 4: `ds` below: DeepSeek-V3 down, Triton (the default then) against the Mosaic
#           grouped kernel (@mgpu) and Humming
#   call 5: `check` below: the GPU tests of the new K-256 default, DeepSeek-V3 down at 256
#           tokens with 8-row tiles
source "$(dirname "$0")/../gpu_env.sh"
s_ds() {
  T ${ST:-400} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down \
    --tokens 1,64,256,1024 --specs w4a16-g128-zp,w4a16-g128-zp@mgpu,w4a16-mxfp4,w4a16-mxfp4@mgpu \
    $MOE --humming --no-baselines --json "$OUT/ds_down.json" > "$OUT/ds_down.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/ds_down.log" | cut -c1-1500
}
s_check() {
  gpu_tests ${TT:-200} "7168x256" tests/test_grouped_kernels.py
  T ${ST:-120} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens 256 \
    --specs w4a16-g128-zp,w4a16-g128-zp@mgpu:rows8,w4a16-g128-zp@triton $MOE --no-baselines \
    --json "$OUT/ds256.json" > "$OUT/ds256.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/ds256.log" | cut -c1-1500
}
for s in ${@:-check}; do step "$s"; "s_$s"; done
step done
