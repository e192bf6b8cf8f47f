#!/usr/bin/env bash
# Session 18's device calls after the queue of session 17 (gpu_session_next.sh) ran as
# calls 1 and 3.  Usage: gpu_session18.sh STEP...  Carry: [".whl"].
#   prepass: the one-pass pre-pass by variant (rows held in registers / re-read, rows per
#      program, warps), each variant's codes compared with a baseline (as run in call 5 the
#      baseline was the kernel itself, not XLA's fusions; the probe is fixed since).
#   tests: with FUSED_PREPASS on by default -- the pre-pass GPU test, the W4A8 / W8A8
#      prefill routes and the MXFP4 fold tests (fixed after call 2).
#   dense: W4A8 MXFP4 and W8A8 fp8 / int8 at M = 1024 / 4096 with Humming and the XLA
#      pre-pass rows beside.
#   fold: the MXFP4 fold's metadata kernel (carrier_unpack.fold_metadata) -- GPU tests of
#      the unpack / fold / prefill, W4A8 MXFP4 at M = 1024 / 4096 with Humming.
#   moe: gpu_session_next.sh's moe step (Qwen3 down W4A16, DeepSeek-V3 down W4A8 MXFP4).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_prepass() {
  T 200 python3 benchmarks/probe_act_prepass.py --ms 1024,4096 --ks 8192,14336 2>&1 \
    | grep -E "^M=|rror" | cut -c1-260
}
s_tests() {
  T 240 python3 -m pytest tests/test_act_prepass.py tests/test_wnam_mgpu.py \
    tests/test_w8a8_mgpu.py -m gpu -p no:cacheprovider -o addopts="" --tb=short -rA -s \
    -k "one_pass or prefill or mx_fold or route_gpu" -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" | cut -c1-300 | tail -40
}
s_dense() {
  T 330 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4,w8a8-fp8,w8a8-int8 --humming --kernel-times --calls 5 \
    --xla-prepass --repeats 2 --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense.log" | cut -c1-330
}
s_fold() {
  T 150 python3 -m pytest tests/test_carrier_unpack.py tests/test_wnam_mgpu.py -m gpu \
    -p no:cacheprovider -o addopts="" --tb=short -rA -s -k "unpack_gpu or mx_fold or prefill" \
    -W ignore::DeprecationWarning 2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" \
    | cut -c1-300 | tail -20
  T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense_fold.json" > "$OUT/dense_fold.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_fold.log" | cut -c1-330
}
s_moe() {  # session 17's queued MoE rows (run as call 6)
  T 120 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp --humming --no-baselines --chain resident --span --calls 20 \
    --repeats 2 --json "$OUT/moe_w4a16.json" > "$OUT/moe_w4a16.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a16.log" | cut -c1-300
  T 120 python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens 1,64 \
    --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 20 \
    --repeats 2 --json "$OUT/moe_w4a8.json" > "$OUT/moe_w4a8.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a8.log" | cut -c1-300
}
for s in "$@"; do step "$s"; "s_$s"; done
step done
