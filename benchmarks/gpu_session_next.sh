#!/usr/bin/env bash
# The next device calls, prepared 2026-12-04 at the end of session 37 (its calls:
# benchmarks/results/2026-12-04-session37, script gpu_session37.sh); it replaces the queue
# prepared after session 36 (in git history: gu, q3, bd, all run in session 37).  Every
# bench_moe step times with --consume row and Humming in the same process.
# Carry: [".whl"].
#   s37: session 37's GPU tests that its last call did not reach
#        (test_session37_launches_gpu: the MXFP4 cases and int4 Qwen3 down at 256 tokens;
#        DeepSeek-V3 gate_up's quantization makes these slow: 300 s).
#   mx:  the new defaults with MXFP4 (16-row launches, K 768 streamed) beside Humming:
#        DeepSeek-V3 gate_up 256 (call 1: 243.5 on the launch now the default; Humming
#        189.0), Qwen3-30B-A3B gate_up 128, down 128 / 256; int4 Qwen3 down 256 (the
#        step call 4 did not finish).
# Usage: gpu_session_next.sh [STEP...]  (default: s37 mx).
source "$(dirname "$0")/gpu_env.sh"
ROW="$MOE --consume row --humming --no-baselines"
s_s37() {
  gpu_tests ${ST:-300} "session37" tests/test_grouped_wna16_mgpu.py
}
s_mx() {
  for st in deepseek-v3-gate_up:256 qwen3-30b-a3b-gate_up:128 qwen3-30b-a3b-down:128,256; do
    T ${ST:-120} python3 benchmarks/bench_moe.py --shapes ${st%%:*} --tokens ${st##*:} \
      --specs w4a16-mxfp4 $ROW --json "$OUT/mx_${st%%:*}.json" >> "$OUT/mx.log" 2>&1
    echo "$st rc=$?"
  done
  T 60 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 256 \
    --specs w4a16-g128-zp $ROW --json "$OUT/q3_256.json" >> "$OUT/mx.log" 2>&1
  echo "int4 q3 256 rc=$?"; grep -E "T=|rror" "$OUT/mx.log" | cut -c1-400
}
for s in ${@:-s37 mx}; do step "$s"; "s_$s"; done
step done
