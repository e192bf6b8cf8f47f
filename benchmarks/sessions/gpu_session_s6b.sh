#!/usr/bin/env bash
# Session 6, second call (~9 min): GPU tests of this session's changes, then the tables.
#   - grouped Triton kernels (WnA16, W8A8) now compute their tile from the group sizes
#     in the kernel (grouped_wna16.tile_at): no schedule ops beside the launch;
#   - Mosaic WnA16: grid split-K 2 for narrow N by default; fp4_whole_registers on;
#   - Qwen3 MoE decode rows (before: gate_up 1 token 37.7 us with 4 schedule kernels);
#   - the Llama-3-8B projections table (issue 3), M = 1, 16, with Humming and XLA.
# Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 210 python3 -m pytest tests/test_grouped_kernels.py tests/test_grouped_w8a8.py \
  tests/test_wna16_mgpu.py -m gpu -k "grouped or deepseek or narrow or mxfp4 or nvfp4" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -60
step moe
T 110 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down \
  --tokens 1,16 --specs w4a16-g128-zp,w4a16-mxfp4 --layers 2 --calls 20 --repeats 2 \
  --humming --breakdown --no-baselines --json "$OUT/moe_qwen3.json" > "$OUT/moe_qwen3.log" 2>&1
grep -E "^qwen|rror" "$OUT/moe_qwen3.log" | cut -c1-700
step llama
T 210 python3 benchmarks/bench_dense.py --shapes llama3-8b-qkv,llama3-8b-o,llama3-8b-gate_up,llama3-8b-down \
  --ms 1,16 --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --layers 4 --calls 20 --repeats 2 \
  --humming --plot --json "$OUT/dense_llama.json" > "$OUT/dense_llama.log" 2>&1
grep -vE "^\s*$|Warning|warn" "$OUT/dense_llama.log" | cut -c1-300 | tail -40
step done
