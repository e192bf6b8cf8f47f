#!/usr/bin/env bash
# Session 6, third call (~4 min): what call 2 (s6b) left unrun -- the grouped W8A8 GPU tests
# (in-kernel tile schedule) and the narrow-N split-K tests through quant_dense -- then MoE
# decode and two Llama rows with a chain of 8 layers (call 2's chains of 2 / 4 layers were
# dominated by per-call host cost: walls 30-48 us around 7-17 us kernels).  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 95 python3 -m pytest tests/test_grouped_w8a8.py tests/test_wna16_mgpu.py -m gpu \
  -k "deepseek or narrow" -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -20
step moe
T 60 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up --tokens 1 \
  --specs w4a16-g128-zp --layers 8 --calls 20 --repeats 2 --humming --no-baselines \
  --json "$OUT/moe_qwen3_l8.json" > "$OUT/moe_qwen3_l8.log" 2>&1
grep -E "^qwen|rror" "$OUT/moe_qwen3_l8.log" | cut -c1-500
step llama
T 85 python3 benchmarks/bench_dense.py --shapes llama3-8b-down,llama3-8b-o --ms 1 \
  --specs w4a16-g128-zp,w4a16-mxfp4 --layers 8 --calls 20 --repeats 2 --humming \
  --json "$OUT/dense_llama_l8.json" > "$OUT/dense_llama_l8.log" 2>&1
grep -E "^llama|rror" "$OUT/dense_llama_l8.log" | cut -c1-300
step done
