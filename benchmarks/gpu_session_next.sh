#!/usr/bin/env bash
# The next device call, prepared 2026-11-30 session 16 after its calls 1-3 (which ran the
# session-15 queue: benchmarks/results/2026-11-30-session16/call1..3).  About 8 minutes:
#   tests: GPU tests of session 16's changes -- the Pallas-Triton unpack (kernels/
#      carrier_unpack.py) bit-equal to the XLA reference at 8192 x 4096; wnam_mgpu's prefill
#      (w4a8-int8 now on group_waves, w4a8-fp8 and the MXFP4 fold on the Pallas unpack);
#      the grouped W4A8 default (grouped_wnam_mgpu through hj.prepare's own choice).
#   dense: W4A8 int8 / fp8 / MXFP4 x fp8 at M = 1024 / 4096 with Humming, kernels by CUPTI.
#      Session 16 call 1 (XLA unpack): MXFP4 239.3 / 504.2 wall, fold fusion 117 us; the
#      prediction with the Pallas unpack at ~40 us: ~165 / ~430.
#   unpack: bench_unpack.py, the XLA reference against the Pallas kernel, CUPTI us.
#   moe1024: W4A8 MXFP4 at 1024 tokens, DeepSeek-V3 gate_up / down, the new default
#      (grouped_wnam_mgpu) vs the Pallas-Triton grouped W8A8 (@w8a8) vs Humming: is the
#      Mosaic WnA16 route also the better one at prefill sizes?
#   qwen_down: Qwen3-30B-A3B down (K 768) at 64 tokens, Mosaic vs Triton (the T = 64 half
#      of session 16 call 2's K-2048 step ran out of time): MIN_DEFAULT_K below 2048?
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_tests() {
  T 200 python3 -m pytest tests/test_carrier_unpack.py tests/test_wnam_mgpu.py \
    tests/test_grouped_wnam_mgpu.py -m gpu -p no:cacheprovider -o addopts="" --tb=short -rA \
    -k "unpack_gpu or mx_fold or prefill_gpu or default_gpu" -s -W ignore::DeprecationWarning \
    2>&1 | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -20
}
s_dense() {
  T 220 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4,w4a8-fp8,w4a8-int8 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense.log" | cut -c1-330
}
s_unpack() {
  T 90 python3 benchmarks/bench_unpack.py > "$OUT/unpack.log" 2>&1
  grep -vE "^\{" "$OUT/unpack.log" | cut -c1-300 | tail -10
}
s_moe1024() {
  T 150 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,deepseek-v3-down \
    --tokens 1024 --specs "w4a8-mxfp4,w4a8-mxfp4@w8a8" --humming --no-baselines --breakdown \
    --chain resident --calls 10 --repeats 2 --json "$OUT/moe1024.json" > "$OUT/moe1024.log" 2>&1
  grep -E "T=|rror" "$OUT/moe1024.log" | cut -c1-1200
}
s_qwen_down() {
  local S=w4a16-g128-zp
  T 90 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 64 --layers 8 \
    --specs "$S@mgpu,$S@triton" --no-baselines --breakdown --chain resident --calls 10 \
    --repeats 2 --json "$OUT/qwen_down.json" > "$OUT/qwen_down.log" 2>&1
  grep -E "T=|rror" "$OUT/qwen_down.log" | cut -c1-900
}
for s in ${@:-tests dense unpack moe1024 qwen_down}; do step "$s"; "s_$s"; done
step done
