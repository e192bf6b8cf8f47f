#!/usr/bin/env bash
# The next device calls, prepared 2026-11-30 session 15 after its device time (all of the
# session-15 queue ran: benchmarks/results/2026-11-30-session15).  Pick steps by name;
# about 20 minutes in all: (tests w4a8mx unpack | waves moe_k2048 | moe_64 moe_w4a8).
#   tests: GPU tests of what changed after session 15's last H200 run -- the MXFP4 fold as
#      run()'s default with no branch (far groups rounded to e4m3 subnormals;
#      test_mx_fold_prefill_gpu now also runs a column 17 octaves wide through run();
#      test_mx_fold_subnormal_column_gpu: does the fp8 WGMMA take e4m3 subnormal weights?).
#   w4a8mx: W4A8 MXFP4 at M = 1024 / 4096 with Humming, the fold without the output select
#      (call 1 with it: 213.6 / 530.5 us wall, 199.4 / 499.2 kernels; prediction ~202 /
#      ~490 wall), kernels by CUPTI (no lax.cond now, so the breakdown should work again).
#   unpack: bench_unpack.py -- integer-only and table forms of the int4 -> e4m3 unpack and
#      of the fold (81 us each in session 15) against int4 -> int8's 33 us; each variant is
#      checked bit-equal to the library's first (CPU-checked at a small shape).
#   moe_k2048: Qwen3-30B-A3B gate_up (K 2048) on the Mosaic grouped kernel (the default
#      since session 15, from calls of two sessions) and on Triton (@triton), same run,
#      1 / 64 tokens, int4 zp and MXFP4 -- the side-by-side check of MIN_DEFAULT_K = 2048,
#      and Qwen3 down (K 768) both ways, to decide it.
#   moe_64: the resident table with Humming, 8 weight sets (session 15 call 4 had 4, which
#      inflated the 1-token walls), on the small-CTA rule.
#   waves: w8a8_mgpu.Config.group_waves (built after session 15's device time; interpreter
#      tests and H200 lowering only): its GPU test, then the K-group GEMM at M = 1024 / 4096
#      default (64 x 128 warpgroup tiles, pairs) vs waves (128 x 128 in two 64-row waves,
#      256 x 128 CTAs).  Prediction: operand tiles 4.3 -> 3.2 GB at 4096; GEMM 526 ->
#      ~450-470 us (w4a8-int8) if shared-memory streaming is what limits it, less the
#      pairs' in-warpgroup overlap (9 % in session 13).
#   moe_w4a8: the grouped W4A8 family on the Mosaic WnA16 kernel (grouped_wnam_mgpu, opt-in,
#      built after session 15's device time; interpreter tests and H200 lowering only): its
#      GPU test, then W4A8 MXFP4 x fp8 at 1 / 16 / 64 tokens on it (@wnam) vs the default
#      Pallas-Triton grouped W8A8 kernel vs Humming's W4A8.  Prediction: about the Mosaic
#      W4A16 times (DeepSeek-V3 gate_up 64 tokens MXFP4: 211 us of kernels) against
#      Humming's W4A8 (BASELINES: 17.1 / 57.0 at 1 / 16 tokens); if it wins, its priority
#      goes above grouped_w8a8 at decode sizes.
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_tests() {
  T 120 python3 -m pytest tests/test_wnam_mgpu.py -m gpu -p no:cacheprovider -o addopts="" \
    --tb=short -rA -k "mx_fold or prefill_gpu" -s -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -20
}
s_w4a8mx() {
  T 150 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4,w4a16-mxfp4 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/w4a8mx.json" > "$OUT/w4a8mx.log" 2>&1
  grep -E "^8192|rror" "$OUT/w4a8mx.log" | cut -c1-330
}
s_unpack() {
  T 90 python3 benchmarks/bench_unpack.py > "$OUT/unpack.log" 2>&1
  grep -vE "^\{" "$OUT/unpack.log" | cut -c1-300 | tail -16
}
s_moe_k2048() {
  local S=w4a16-g128-zp M=w4a16-mxfp4
  T 200 python3 benchmarks/bench_moe.py \
    --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 --layers 8 \
    --specs "$S@mgpu,$S@triton,$M@mgpu,$M@triton" --no-baselines --breakdown \
    --chain resident --calls 10 --repeats 2 --json "$OUT/moe_k2048.json" \
    > "$OUT/moe_k2048.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_k2048.log" | cut -c1-1500
}
s_moe_64() {
  T 240 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp --humming --no-baselines --breakdown --chain resident \
    --calls 10 --repeats 2 --json "$OUT/moe_64.json" > "$OUT/moe_64.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_64.log" | cut -c1-1200
}
s_waves() {
  T 150 python3 -m pytest tests/test_w8a8_mgpu.py -m gpu -p no:cacheprovider -o addopts="" \
    --tb=short -rA -k "group_waves_gpu" -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|Error" | cut -c1-300 | tail -8
  T 150 python3 benchmarks/profile_w8a8_mgpu.py --specs w4a8-int8,w4a8-fp8,w8a8-fp8-block \
    --ms 1024,4096 --configs default,waves 2>&1 | grep -vE "^\{" | cut -c1-250 | tail -20
}
s_moe_w4a8() {
  T 120 python3 -m pytest tests/test_grouped_wnam_mgpu.py -m gpu -p no:cacheprovider \
    -o addopts="" --tb=short -rA -s -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -10
  T 240 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,deepseek-v3-down,qwen3-30b-a3b-gate_up --tokens 1,16,64 \
    --specs "w4a8-mxfp4,w4a8-mxfp4@wnam" --humming --no-baselines --breakdown \
    --chain resident --calls 10 --repeats 2 --json "$OUT/moe_w4a8.json" \
    > "$OUT/moe_w4a8.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a8.log" | cut -c1-1200
}
for s in ${@:-tests w4a8mx unpack waves moe_k2048 moe_64 moe_w4a8}; do step "$s"; "s_$s"; done
step done
