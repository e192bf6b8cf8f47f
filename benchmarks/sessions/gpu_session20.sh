#!/usr/bin/env bash
# Session 20's device calls (2026-12-01; logs benchmarks/results/2026-12-01-session20).
#   verify: session 19's mend (gpu_session_next.sh verify)
#   llama:  W4A16 int4 g128 zp on the four Llama-3-8B projections, M = 1 / 16 / 128, Humming
#   fp8:    the fp8-MMA layout of W4A8 MXFP4 experts (":p8"): GPU tests, then MoE rows with
#           Humming (DeepSeek-V3 gate_up / down, Qwen3-30B-A3B gate_up / down)
#   sweep:  probe_fp8_moe.py (launch shapes of the fp8-MMA grouped kernel, DeepSeek-V3
#           gate_up at 16 / 64 / 256 tokens); the M = 128 Llama rows on the split-K rule
#   final:  the 16-row fp8-MMA launch (one warpgroup over K): its GPU test and DeepSeek-V3 rows
#           at 256 tokens with Humming
#   tiles:  probe_prefill_tiles.py (M = 128 launch shapes on the Llama projections)
# Usage: gpu_session20.sh [STEP...].  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_verify() { bash benchmarks/gpu_session_next.sh verify 2>&1 | grep -v "^== "; }
s_llama() {
  T 240 python3 benchmarks/bench_dense.py --shapes 4096x6144,4096x4096,4096x28672,14336x4096 \
    --ms 1,16,128 --specs w4a16-g128-zp --humming --kernel-times --calls 10 --repeats 2 \
    --json "$OUT/dense_llama.json" > "$OUT/dense_llama.log" 2>&1
  grep -E "^[0-9]+x|rror" "$OUT/dense_llama.log" | cut -c1-330
}
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_fp8() {
  T 240 $PYT tests/test_grouped_wnam_mgpu.py -m gpu 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" | cut -c1-300 | tail -20
  for shape in deepseek-v3-gate_up deepseek-v3-down qwen3-30b-a3b-gate_up qwen3-30b-a3b-down; do
    T 110 python3 benchmarks/bench_moe.py --shapes $shape --tokens 1,16,64,256 \
      --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 20 \
      --repeats 2 --json "$OUT/moe_$shape.json" > "$OUT/moe_$shape.log" 2>&1
    grep -E "T=|rror" "$OUT/moe_$shape.log" | cut -c1-300
  done
}
s_sweep() {
  T 330 python3 benchmarks/probe_fp8_moe.py --tokens 16,64,256 2>&1 | grep -E "T=|rror" | cut -c1-900
  T 100 python3 benchmarks/bench_dense.py --shapes 14336x4096,4096x4096 --ms 128 \
    --specs w4a16-g128-zp --humming --kernel-times --calls 10 --repeats 2 \
    --json "$OUT/dense_m128.json" > "$OUT/dense_m128.log" 2>&1
  grep -E "^[0-9]+x|rror" "$OUT/dense_m128.log" | cut -c1-330
}
s_final() {
  T 120 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -k "fp8_mma_gpu and 256" 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" | cut -c1-300 | tail -6
  for shape in deepseek-v3-gate_up deepseek-v3-down; do
    T 100 python3 benchmarks/bench_moe.py --shapes $shape --tokens 256 \
      --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 20 \
      --repeats 2 --json "$OUT/moe256_$shape.json" > "$OUT/moe256_$shape.log" 2>&1
    grep -E "T=|rror" "$OUT/moe256_$shape.log" | cut -c1-300
  done
}
s_tiles() { T 150 python3 benchmarks/probe_prefill_tiles.py --ms 128 2>&1 | grep -E "M=|rror" | cut -c1-600; }
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
