#!/usr/bin/env bash
# The MoE tables call (~7 minutes on an H200), prepared 2026-11-29 session 6: issue 5's
# grouped-GEMM table (DeepSeek-V3, Qwen3-30B-A3B, Mixtral; W4A16 int4 g128 zp and MXFP4)
# with a chain of 8 weight sets (chains of 2 measured host cost: NOTES_moe.md session 6),
# Humming and lax.ragged_dot bf16 in the same run; then issue 4's fused-vs-pre-pass
# activation quantization study (NOTES_w8a8.md: never measured).  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step moe
T 380 python3 benchmarks/bench_moe.py --tokens 1,64,1024 --specs w4a16-g128-zp,w4a16-mxfp4 \
  --humming --calls 20 --repeats 2 --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1
grep -E "^\|" "$OUT/moe.log" | cut -c1-300
step act_quant_study
T 100 python3 benchmarks/bench_w8a8.py --act-quant-study --ms 16,1024 --calls 10 --repeats 2 \
  > "$OUT/act_quant_study.log" 2>&1
grep -vE "^\s*$|Warning|warn" "$OUT/act_quant_study.log" | cut -c1-250 | tail -12
step done
