#!/usr/bin/env bash
# The next device calls, prepared 2026-11-30 session 15 (the session-14 queue ran in calls
# 1-2: benchmarks/results/2026-11-30-session15).  Pick steps by name: (tests w4a8 | moe_64).
#   tests: the GPU tests of session 15's changes -- the MXFP4 fold as run()'s default
#      (a lax.cond with the bf16 route), and the grouped heuristic's small CTAs beyond two
#      waves (16-64 tokens, every benchmark MoE shape, int4 g128 zp and MXFP4).
#   w4a8: W4A8 at M = 1024 / 4096 with Humming's fp8 W4A8 (MXFP4) in the same run: the fold
#      through run()'s cond (call 1 ran it with a NaN select: 530.5 / 213.6 us wall, of which
#      the select ~41 / 11), and the w4a8-fp8 unpack by NumberFormat.encode_exact (CPU
#      bit-identical, not yet timed; prediction ~35-45 us against encode's 121): read
#      loop_transpose_fusion in the JSON's kernel breakdown.  The wall minus the kernels
#      tells whether the cond costs a host round trip.
#   moe_64: the MoE same-run table (1 / 64 tokens, resident, with Humming) on the new rule
#      (screen, calls 1-2, CUPTI kernel us: DeepSeek-V3 gate_up 64 tokens 196.5 -> 164.0,
#      Qwen3 gate_up 98.2 -> 87.2, down 67.0 -> 48.6).
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_tests() {
  T 240 python3 -m pytest tests/test_wnam_mgpu.py tests/test_grouped_wna16_mgpu.py \
    tests/test_grouped_kernels.py -m gpu -p no:cacheprovider -o addopts="" --tb=short -rA \
    -k "mx_fold_prefill_gpu or qwen3_decode_gpu or quant_moe_aligned_gpu or (grouped_kernel_gpu and [64-)" \
    -s -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -40
}
s_w4a8() {
  T 220 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-int8,w4a8-fp8,w4a8-mxfp4,w4a16-mxfp4 --humming \
    --kernel-times --calls 5 --repeats 2 --json "$OUT/w4a8.json" > "$OUT/w4a8.log" 2>&1
  grep -E "^8192|rror" "$OUT/w4a8.log" | cut -c1-330
}
s_moe_64() {
  T 240 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp,w4a16-mxfp4 --humming --no-baselines --breakdown --chain resident \
    --layers 4 --calls 10 --repeats 2 --json "$OUT/moe_64.json" > "$OUT/moe_64.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_64.log" | cut -c1-1200
}
#   w4a8mx: call 3's w4a8-mxfp4 rows failed in the CUPTI breakdown ("Kernel names are not
#      consistent across iterations": the lax.cond's branch); its walls without it.
s_w4a8mx() {
  T 130 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4 --humming --calls 5 --repeats 2 --json "$OUT/w4a8mx.json" \
    > "$OUT/w4a8mx.log" 2>&1
  grep -E "^8192|rror" "$OUT/w4a8mx.log" | cut -c1-330
}
for s in ${@:-tests w4a8 moe_64}; do step "$s"; "s_$s"; done
step done
