#!/usr/bin/env bash
# The next device calls, prepared 2026-11-30 at the end of session 18 (its calls:
# benchmarks/results/2026-11-30-session18).  Two calls (each step's timeouts sum under
# 600 s): `gpu_session_next.sh metadata moe`, then `gpu_session_next.sh dense`.
#   metadata: carrier_unpack.fold_metadata's kernel by variant (tiles per load, warps,
#      exponents held between its passes; probe_fold_metadata.py) -- 7.9 us at 8192^2 as
#      built, predicted ~3 (4 MB) -- then its GPU tests at the defaults.  If a variant
#      wins, set METADATA_* and re-run the tests in the next call.  Also the one-pass
#      pre-pass against XLA's codes at K = 8192 (held) and 14336 (read twice).
#   dense: W4A8 int4 -> fp8 at M = 1024 / 4096 with the final pre-pass form (session 18
#      timed it only with the 4-row form), and W8A8 / W4A8 at M = 1 / 16 (issue 4's
#      <= 20 / <= 12 us decode targets, last timed with one shared x).
#   moe: DeepSeek-V3 gate_up
#      W4A16 and W4A8 MXFP4 at 1 / 64 tokens with spans (session 17's rows, re-measured).
# Usage: gpu_session_next.sh [STEP...]  (default: metadata moe).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_metadata() {
  for k in 8192 14336; do
    T 80 python3 benchmarks/probe_fold_metadata.py --k $k 2>&1 | grep -E "^K=|rror" | cut -c1-250
  done
  T 120 python3 -m pytest tests/test_carrier_unpack.py tests/test_act_prepass.py -m gpu \
    -p no:cacheprovider \
    -o addopts="" --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | tail -8
}
s_dense() {
  T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-fp8 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense_w4a8_fp8.json" > "$OUT/dense_w4a8_fp8.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_w4a8_fp8.log" | cut -c1-330
  T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16 \
    --specs w8a8-int8,w8a8-fp8,w4a8-fp8,w4a8-mxfp4 --humming --kernel-times --calls 20 \
    --repeats 2 --json "$OUT/dense_decode.json" > "$OUT/dense_decode.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_decode.log" | cut -c1-330
}
s_moe() {
  for spec in w4a16-g128-zp w4a8-mxfp4; do
    T 120 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 1,64 \
      --specs $spec --humming --no-baselines --chain resident --span --calls 20 \
      --repeats 2 --json "$OUT/moe_$spec.json" > "$OUT/moe_$spec.log" 2>&1
    grep -E "T=|rror" "$OUT/moe_$spec.log" | cut -c1-300
  done
}
for s in ${@:-metadata moe}; do step "$s"; "s_$s"; done
step done
