#!/usr/bin/env bash
# The next device calls, prepared 2026-11-30 at the end of session 17 (its five calls ran:
# benchmarks/results/2026-11-30-session17).  About 15 minutes: run it as two calls,
# `gpu_session_next.sh tests schedule` and `gpu_session_next.sh dense moe`:
#   tests: the fp8 pre-pass through one convert (quantize.kernel_activations) and the
#      one-pass pre-pass kernel (kernels/act_prepass.py, off), both built after session
#      17's device time: the W8A8 / W4A8 prefill routes, the Mosaic W8A8 GEMM and the
#      one-pass kernel's GPU tests.
#   dense: each layer's x through its own barrier (common.unshared, the corrected chain):
#      W4A8 MXFP4 / int4 -> fp8 and W8A8 fp8 / int8 at M = 1024 / 4096 with Humming, and
#      each with the one-pass pre-pass (rows <spec>+1pass).  Predictions (NOTES.md v19):
#      the convert 60.7 -> ~30 us at 4096, W4A8 MXFP4 ~469 us, ~452 with the one-pass
#      pre-pass (call 5: 499.6; Humming 478.4).  W8A8 was last timed with one shared x
#      (session 8).  Also check in the log that the kernel sums still show one pre-pass
#      per layer (the barrier form of the fix, not yet GPU-run).
#   schedule: the MoE tile schedule kernel (3.6 us at DeepSeek-V3, 1 token: every lone
#      grouped GEMM's own) at 1 / 2 / 4 warps per program -- its GPU test, then its
#      duration in the timeline (grouped_wna16_mgpu.SCHEDULE_WARPS; 4 until timed).
#   moe: the rows session 17's call 5 cut -- Qwen3 down (W4A16) and DeepSeek-V3 down (W4A8
#      MXFP4) at 1 / 64 tokens, per-layer inputs, device spans, Humming.
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_tests() {
  T 200 python3 -m pytest tests/test_wnam_mgpu.py tests/test_w8a8_mgpu.py \
    tests/test_act_prepass.py -m gpu \
    -p no:cacheprovider -o addopts="" --tb=short -rA -s \
    -k "prefill or mx_fold or route_gpu or group_waves_gpu or row_scale_gpu or one_pass" \
    -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -24
}
s_dense() {
  T 420 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4,w4a8-fp8,w8a8-fp8,w8a8-int8 --humming --kernel-times --calls 5 \
    --one-pass-prepass \
    --repeats 2 --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense.log" | cut -c1-330
}
s_schedule() {
  T 120 python3 -m pytest tests/test_grouped_wna16_mgpu.py -m gpu -p no:cacheprovider \
    -o addopts="" --tb=short -rA -k schedule_kernel_gpu -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|Error" | cut -c1-300 | tail -6
  for w in 1 2 4; do
    T 90 python3 benchmarks/probe_timeline.py --moe deepseek-v3-gate_up --tokens 1 \
      --schedule-warps $w --show 3 2>&1 | grep -E "schedule|per layer|wall" | head -4
  done
}
s_moe() {
  T 120 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp --humming --no-baselines --chain resident --span --calls 20 \
    --repeats 2 --json "$OUT/moe_w4a16.json" > "$OUT/moe_w4a16.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a16.log" | cut -c1-300
  T 120 python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens 1,64 \
    --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 20 \
    --repeats 2 --json "$OUT/moe_w4a8.json" > "$OUT/moe_w4a8.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a8.log" | cut -c1-300
}
for s in ${@:-tests schedule dense moe}; do step "$s"; "s_$s"; done
step done
