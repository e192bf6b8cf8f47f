#!/usr/bin/env bash
# The next device call, prepared 2026-11-30 session 16 after its call 4 (logs:
# benchmarks/results/2026-11-30-session16/call1..4).  About 3 minutes (call 5 has ~320 s):
#   tests: the packed-word unpack (kernels/carrier_unpack.py, four codes per 32-bit op;
#      call 4 timed the one-code-per-lane version equal to XLA: ALU-bound) bit-equal to the
#      XLA reference at 8192 x 4096 (normal blocks and blocks with subnormal results), and
#      wnam_mgpu's prefill routes that call it.
#   unpack: bench_unpack.py, XLA vs Pallas.  Prediction: int4 81.8 -> ~40 us, the fold
#      113.9 -> ~45 (memory floor ~30: 32 MB read + 64 MB written).
#   dense: W4A8 MXFP4 x fp8 and int4 -> fp8 at M = 1024 / 4096 with Humming.  Call 4:
#      236.4 / 519.7 and 245.3 / 616.4 us wall; prediction ~170 / ~440 and ~200 / ~570.
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_tests() {
  T 100 python3 -m pytest tests/test_carrier_unpack.py tests/test_wnam_mgpu.py -m gpu \
    -p no:cacheprovider -o addopts="" --tb=short -rA -k "unpack_gpu or mx_fold or prefill_gpu" \
    -s -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -20
}
s_unpack() {
  T 60 python3 benchmarks/bench_unpack.py > "$OUT/unpack.log" 2>&1
  grep -vE "^\{" "$OUT/unpack.log" | cut -c1-300 | tail -10
}
s_dense() {
  T 130 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4,w4a8-fp8 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense.log" | cut -c1-330
}
for s in ${@:-tests unpack dense}; do step "$s"; "s_$s"; done
step done
