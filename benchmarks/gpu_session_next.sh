#!/usr/bin/env bash
# The next device call (~9 minutes on an H200), prepared 2026-11-30 session 8.
# Open since session 8 (NOTES.md v10, NOTES_moe.md session 8):
#   1. Are Mosaic launches captured in CUDA graphs after all?  Source reading (session 8)
#      says XLA builds command buffers from the thunk sequence, not the HLO that session 7
#      inspected, and the Mosaic FFI handler is kCmdBufferCompatible since jax 0.8.0.
#      probe_command_buffer.py now dumps and counts kCommandBuffer thunks.  If captured,
#      the 12-25 us host cost per launch is graph re-recording or descriptor encoding:
#      next, test stable buffer addresses (donation / one jit).
#   2. The whole MoE layer with the session-8 default (Mosaic for K >= 4096, per stack):
#      DeepSeek-V3 (mixed stacks), Mixtral (both Mosaic, aligned), Qwen3 (both Triton).
#   3. MXFP4 MoE on the default family with Humming (issue 5 names int4 g128 and MXFP4).
#   4. The Qwen3 grouped autotune that session 8 cut (Triton family, 64 / 1024 tokens).
# Step timeouts sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step command_buffer_probe
T 110 python3 benchmarks/probe_command_buffer.py --sizes 512,8192 --flags default,min1 \
  --timeout 50 > "$OUT/command_buffer.log" 2>&1
grep -E "^size=|kCommandBuffer|rror" "$OUT/command_buffer.log" | cut -c1-200
step moe_layer
T 170 python3 benchmarks/bench_moe_layer.py --models deepseek-v3,mixtral,qwen3-30b-a3b \
  --tokens 1,16,64 --families default,triton,mgpu --calls 10 --repeats 2 \
  --json "$OUT/moe_layer.json" > "$OUT/moe_layer.log" 2>&1
grep -E "^\{|rror" "$OUT/moe_layer.log" | cut -c1-400
step moe_mxfp4
T 160 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,mixtral-down,qwen3-30b-a3b-gate_up \
  --tokens 1,64,1024 --specs w4a16-mxfp4 --no-baselines --humming --calls 10 --repeats 2 \
  --json "$OUT/moe_mxfp4.json" > "$OUT/moe_mxfp4.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_mxfp4.log" | cut -c1-300
step qwen3_autotune
export HUMMING_JAX_TUNING_CACHE="$OUT/tuning.json"
T 120 python3 -m humming_jax.autotune --specs w4a16-g128-zp --grouped 128:8:2048x1536 \
  --tokens 64,1024 > "$OUT/qwen3_autotune.log" 2>&1
tr '\r' '\n' < "$OUT/qwen3_autotune.log" | grep -E "us per grouped|rror" | cut -c1-250
step done
