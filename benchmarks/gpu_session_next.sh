#!/usr/bin/env bash
# Session 11, device call 3 (~7.5 minutes on an H200).  Since call 2 (CPU-checked):
#   - wnam_mgpu is the default family for sub-8-bit weights with quantized activations
#     (W4A8, W4A4): its M = 4096 prefill (8-bit GEMM on weights unpacked from the WnA16
#     layout) was cut by the step limit twice; timed here against the W8A8 family.
#   - The dense ladder with int4_ptx on, Humming in the same run (issue 3's table).
#   - Grouped rows cut in call 2 (Qwen3 gate_up 64 tokens; DeepSeek-V3 1024) with Humming.
# Step timeouts sum to 440 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step w4a8_prefill
T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 4096 \
  --specs w4a8-int8@wnam_mgpu,w4a8-int8@w8a8,w4a16-g128 --kernel-times --no-baselines \
  --calls 5 --repeats 2 --json "$OUT/w4a8_prefill.json" > "$OUT/w4a8_prefill.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8_prefill.log" | cut -c1-250
step dense_ladder
T 130 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16,128 \
  --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --kernel-times --humming \
  --calls 20 --repeats 2 --json "$OUT/dense_ladder.json" > "$OUT/dense_ladder.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_ladder.log" | cut -c1-250
step moe_with_humming
T 110 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,deepseek-v3-gate_up \
  --tokens 64,1024 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_humming.json" > "$OUT/moe_humming.log" 2>&1
grep -E "T=|rror" "$OUT/moe_humming.log" | cut -c1-400
step done
