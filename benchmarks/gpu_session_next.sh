#!/usr/bin/env bash
# The next device calls, prepared 2026-12-01 at the end of session 20 (its calls:
# benchmarks/results/2026-12-01-session20, script gpu_session20.sh).  In order:
#   verify: what session 20 built after its device time -- the fp8-MMA layout's scale
#      groups of 64 / 128 (several 32-deep WGMMAs per group partial), grouped W4A8 at one
#      token with grid split-K, 128-row fp8 tiles on two warpgroups, and the dense
#      fp8-MMA layout (HUMMING_JAX_DENSE_FP8_MMA=1: decode on fp8 WGMMA, the fold's
#      prefill through the ":p8"-reading unpack).
#   dense8: W4A8 MXFP4 8192^2 at M = 1 / 16 / 1024 / 4096 with Humming, the dense fp8-MMA
#      layout against the K-order one (issue 4: decode <= 12 us; prefill must not lose).
#      If it wins at decode and holds at prefill, make HUMMING_JAX_DENSE_FP8_MMA default on.
#   moe:  W4A8 MXFP4 MoE rows at 16 / 1024 tokens on Mixtral-like shapes (128-row fp8
#      tiles on the default four warpgroups); then compare two warpgroups by hand
#      (config=wna16_mgpu.shared_x_config(128, warpgroups=2)): registers may spill at four.
#   overlap: HUMMING_JAX_FP8_OVERLAP=0 / 1 (a step's K tiles keep their group partials, so
#      tile j converts while tile j - 1's WGMMAs run) on DeepSeek-V3 gate_up at 1 / 16 / 64
#      tokens; if it wins, make it the default.
# Usage: gpu_session_next.sh [STEP...]  (default: verify).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_verify() {
  T 300 $PYT tests/test_grouped_wnam_mgpu.py tests/test_wnam_mgpu.py -m gpu \
    -k "fp8_mma" 2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" | cut -c1-300 | tail -16
  HUMMING_JAX_FP8_OVERLAP=1 T 200 $PYT tests/test_grouped_wnam_mgpu.py -m gpu \
    -k "fp8_mma_gpu or deepseek" 2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" | cut -c1-300 | tail -16
}
s_dense8() {
  for flag in 0 1; do
    HUMMING_JAX_DENSE_FP8_MMA=$flag T 240 python3 benchmarks/bench_dense.py \
      --shapes 8192x8192 --ms 1,16,1024,4096 --specs w4a8-mxfp4 --humming --kernel-times \
      --calls 10 --repeats 2 --json "$OUT/dense_w4a8_fp8mma$flag.json" \
      > "$OUT/dense_w4a8_fp8mma$flag.log" 2>&1
    echo "HUMMING_JAX_DENSE_FP8_MMA=$flag"; grep -E "^8192|rror" "$OUT/dense_w4a8_fp8mma$flag.log" | cut -c1-330
  done
}
s_moe() {
  for shape in mixtral-gate_up mixtral-down; do
    T 150 python3 benchmarks/bench_moe.py --shapes $shape --tokens 16,1024 \
      --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 10 \
      --repeats 2 --json "$OUT/moe_$shape.json" > "$OUT/moe_$shape.log" 2>&1
    grep -E "T=|rror" "$OUT/moe_$shape.log" | cut -c1-300
  done
}
s_overlap() {
  for flag in 0 1; do
    HUMMING_JAX_FP8_OVERLAP=$flag T 120 python3 benchmarks/bench_moe.py \
      --shapes deepseek-v3-gate_up --tokens 1,16,64 --specs w4a8-mxfp4 --no-baselines \
      --chain resident --span --calls 20 --repeats 2 --json "$OUT/moe_overlap$flag.json" \
      > "$OUT/moe_overlap$flag.log" 2>&1
    echo "HUMMING_JAX_FP8_OVERLAP=$flag"; grep -E "T=|rror" "$OUT/moe_overlap$flag.log" | cut -c1-300
  done
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
