#!/usr/bin/env bash
# Session 9, call 4 (~3.5 min, the last of the session's device time; carry [".whl"]).
#   1. Qwen3-30B-A3B MoE layer, both stacks on the Pallas-Triton grouped kernel (today's
#      default below hidden 4096) vs both on the Mosaic one (aligned path), with the CUPTI
#      kernel sums: call 3 had Mosaic ahead at 1 / 16 / 64 tokens (37.4 / 147.4 / 228.5 vs
#      41.1 / 201.6 / 243.1 us), session 7 had Triton ahead at 1 token (37.2 vs 72.3).
#   2. Dense 8192^2 at M = 1 with 16 layers per jitted call (GPU.md: L >= 8), ours and
#      Humming's CUDA graph of the same 16 layers: the per-call cost amortised over twice
#      the layers (probe_launch: 18.9 us per layer for 18.0 us of kernels at 16 layers).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step qwen3_layer
T 95 python3 benchmarks/bench_moe_layer.py --models qwen3-30b-a3b --tokens 1,16 \
  --families triton,mgpu --calls 10 --repeats 3 --breakdown \
  --json "$OUT/moe_layer_qwen3_breakdown.json" > "$OUT/moe_layer_qwen3_breakdown.log" 2>&1
grep -E "^\{|rror" "$OUT/moe_layer_qwen3_breakdown.log" | cut -c1-900
step dense_16_layers
T 95 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4 --ms 1 --layers 16 \
  --humming --calls 20 --repeats 2 --json "$OUT/dense_16_layers.json" > "$OUT/dense_16_layers.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_16_layers.log" | cut -c1-250
step done
