#!/usr/bin/env bash
# Session 33 device calls (2026-12-03) ran gpu_session32.sh's steps with other points:
#   call 1: ST=170 AB="qwen3-30b-a3b-down:256,1024 mixtral-gate_up:64,256" cost_ab, and
#           screen of qwen3-30b-a3b-gate_up:64 (SSPECS: default, rows8, xn-wg2-st2,
#           xn-wg4-st2, wg1-st4; MXFP4 default, rows8)
#   call 2: ST=150 AB="qwen3-30b-a3b-down:1024 mixtral-down:64,256 deepseek-v3-gate_up:1024"
#           cost_ab
#   call 3: TK=cost_sized tests; screen qwen3-30b-a3b-gate_up:64 default / wg1-st4
# Queued here for session 34 (every log to $OUT; carry [".whl"]):
#   check: GPU tests of the decode launch that session 33 changed without a device test
#          (Qwen3 gate_up int4 at 16-64 tokens: one warpgroup of four stages)
#   time:  that launch at 16 / 32 / 64 tokens (bench_moe, default against the old wg2-st2),
#          and the cost-tile rule's last untimed point, DeepSeek-V3 down at 1024 tokens
source "$(dirname "$0")/../gpu_env.sh"
s_check() {
  gpu_tests ${TT:-300} "${TK:-qwen3_decode or cost_sized}" tests/test_grouped_wna16_mgpu.py
}
s_time() {
  T ${ST:-200} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up \
    --tokens 16,32,64 --specs w4a16-g128-zp,w4a16-g128-zp@mgpu:wg2-st2 $MOE --humming \
    --no-baselines --json "$OUT/decode_wg.json" > "$OUT/decode_wg.log" 2>&1
  echo "decode rc=$?"; grep -E "^\| qwen3" "$OUT/decode_wg.log"
  AB=deepseek-v3-down:1024 bash "$(dirname "$0")/gpu_session32.sh" cost_ab
}
for s in ${@:-check}; do step "$s"; "s_$s"; done
step done
