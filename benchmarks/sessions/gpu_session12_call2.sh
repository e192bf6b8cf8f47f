#!/usr/bin/env bash
# Session 12, device call 2 (~9.5 min of step limits; carry [".whl"]).
#   1. GPU tests: the grouped Mosaic kernel with its one-launch Pallas-Triton schedule
#      (grouped_wna16_mgpu.schedule, replacing six XLA fusions: call 1's HLO), and the
#      native e2m1 convert in the large-M dequantization (quant_dense at M = 1024).
#   2. Grouped GEMM with Humming, same run, CUPTI breakdown; tiles of 16 rows at 64 tokens
#      (rows16: a segment crossing an 8-row boundary stays one tile: 12 % / 37 % fewer tiles
#      for DeepSeek-V3 / Qwen3 gate_up, each a whole expert slab). Prediction: 1 token ~7 us
#      lower: DeepSeek-V3 gate_up 24.6 -> ~17, Qwen3 gate_up 30.2 -> ~22).
#   3. The large-M route for fp4 (prediction NVFP4 dequantization 82 -> ~42 us).
#   4. The MoE down projections with Humming.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 150 python3 -m pytest tests/test_grouped_wna16_mgpu.py tests/test_wna16_mgpu.py -m gpu \
  -k "grouped_wna16_mgpu or (quant_dense_gpu and 1024 and fp4)" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|rel err" "$OUT/gpu_tests.log" | cut -c1-200 | tail -14
step moe_gate_up
T 200 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up \
  --tokens 1,64 --specs w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:rows16 --humming --no-baselines --breakdown \
  --calls 10 --repeats 2 --json "$OUT/moe_gate_up.json" > "$OUT/moe_gate_up.log" 2>&1
grep -E "T=|rror" "$OUT/moe_gate_up.log" | cut -c1-600
step large_m_fp4
T 80 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
  --specs w4a16-nvfp4,w4a16-mxfp4 --kernel-times --calls 5 --repeats 2 --no-baselines \
  --json "$OUT/large_m_fp4.json" > "$OUT/large_m_fp4.log" 2>&1
grep -E "^8192|rror|kernel" "$OUT/large_m_fp4.log" | cut -c1-300
step moe_down
T 120 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down,deepseek-v3-down \
  --tokens 1,64 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_down.json" > "$OUT/moe_down.log" 2>&1
grep -E "T=|rror" "$OUT/moe_down.log" | cut -c1-400
step done
