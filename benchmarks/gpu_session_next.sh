#!/usr/bin/env bash
# The next device call (~8 minutes on an H200), prepared 2026-11-30 session 12.  Open:
#   1. Where the dense decode wall goes: 8192^2 int4 g128 zp at M = 1 takes 15.9 us of
#      kernel and 21.6 us of wall per layer in the resident chain (fixed addresses; session
#      12 call 4), so it is not the graph re-recording.  Walls of 8 and 16 layers per call
#      in the resident chain: the per-layer slope against the kernel time separates a
#      per-call cost from a per-launch gap.
#   2. The MoE rows the step limits cut in session 12: Qwen3-30B-A3B down at 1 / 64 tokens
#      with Humming (both chains), and 1024 tokens for all four shapes.
# Step timeouts sum to ~480 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step dense_layers
for layers in 8 16; do
  T 80 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1 --specs w4a16-g128-zp \
    --chain resident --layers $layers --kernel-times --no-baselines --calls 20 --repeats 2 \
    --json "$OUT/dense_resident_l$layers.json" 2>&1 | grep -E "^8192|rror" | cut -c1-250
done
step moe_qwen3_down
T 150 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 1,64,1024 \
  --specs w4a16-g128-zp@mgpu --humming --no-baselines --breakdown --chain outputs,resident \
  --calls 10 --repeats 2 --json "$OUT/moe_qwen3_down.json" > "$OUT/moe_qwen3_down.log" 2>&1
grep -E "T=|rror" "$OUT/moe_qwen3_down.log" | cut -c1-600
step moe_1024
T 170 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up \
  --tokens 1024 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 4 --repeats 2 --json "$OUT/moe_1024.json" > "$OUT/moe_1024.log" 2>&1
grep -E "T=|rror" "$OUT/moe_1024.log" | cut -c1-600
step done
