#!/usr/bin/env bash
# The next device call (~9.5 minutes on an H200), prepared 2026-11-30 session 9.
# Open since session 9 (NOTES.md v11, NOTES_moe.md session 9):
#   1. Model-like timing: XLA re-records a Mosaic launch into its CUDA graph when the
#      graph's buffers move, and the benchmark chain (all outputs returned) moves them
#      every call.  --chain sequential threads x through the layers with a donated state
#      (stable addresses).  Dense 8192^2, 16 layers, M = 1 / 16, beside Humming's graph.
#   2. The whole MoE layer the same way (Qwen3, DeepSeek-V3, Mixtral), default (both
#      stacks on Mosaic) vs both on Triton, with the CUPTI kernel sums: at 1 token the
#      Qwen3 kernels sum to 23.8 us (Humming's two GEMMs alone: 12.8 + 12.1).
#   3. MXFP4 grouped GEMM rows that call 1 lost to the step timeout.
# Step timeouts sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step dense_sequential
T 170 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4,w8a16-fp8 \
  --ms 1,16 --layers 16 --chain sequential --humming --calls 20 --repeats 2 \
  --json "$OUT/dense_sequential.json" > "$OUT/dense_sequential.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_sequential.log" | cut -c1-250
step moe_layer_sequential
for model in qwen3-30b-a3b deepseek-v3 mixtral; do
  T 85 python3 benchmarks/bench_moe_layer.py --models $model --tokens 1,16 \
    --families default,triton --chain sequential --breakdown --calls 10 --repeats 2 \
    --json "$OUT/moe_layer_seq_$model.json" > "$OUT/moe_layer_seq_$model.log" 2>&1
  grep -E "^\{|rror" "$OUT/moe_layer_seq_$model.log" | cut -c1-300
done
step moe_mxfp4
T 120 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,mixtral-down \
  --tokens 1,64 --specs w4a16-mxfp4 --no-baselines --humming --calls 10 --repeats 2 \
  --json "$OUT/moe_mxfp4.json" > "$OUT/moe_mxfp4.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_mxfp4.log" | cut -c1-300
step done
