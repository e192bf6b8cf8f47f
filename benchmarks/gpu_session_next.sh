#!/usr/bin/env bash
# The next device call (~8 minutes on an H200), prepared 2026-11-30 session 11.
# Open since session 11 (built after the device time was spent; CPU-checked only):
#   1. The WnA16 large-M route (M >= 512: XLA dequantize + GEMM) lets the GEMM write bf16
#      itself when there is no bias or float32 output scale.  Session 11 call 4 (8192^2,
#      M = 4096, CUPTI): dequant fusion 42.3 + cuBLAS 667.5 + a separate f32 -> bf16
#      convert 47.3 us.  Prediction: the convert kernel gone, ~757 -> ~710 us of kernels.
#      Same-run baselines: XLA bf16 with a float32 product + convert (the form so far, and
#      BASELINES.md's 769 us) and plain `x @ w` (bf16 out, what a user writes).
#   2. Dense ladder M = 16 / 128 with Humming (session 11's ladder step was cut at M = 1).
#   3. The MoE down projections with Humming in the same run.
#   4. XLA's optimized HLO beside the kernels (probe_ncu.py --hlo): why NVFP4's XLA
#      dequantization takes 82 us where int4's takes 42 (call 4), and which XLA ops run
#      around the grouped kernel at 1 token (~13 us of glue, NOTES_moe.md session 10).
# Step timeouts sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 90 python3 -m pytest tests/test_wna16_mgpu.py -m gpu \
  -k "dequant_gemm_output or (quant_dense_gpu and 1024)" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
step large_m
T 120 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
  --specs w4a16-g128-zp,w4a16-g128,w4a16-nvfp4 --kernel-times --calls 5 --repeats 2 \
  --json "$OUT/large_m.json" > "$OUT/large_m.log" 2>&1
grep -E "^8192|rror" "$OUT/large_m.log" | cut -c1-250
step dense_ladder
T 150 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 16,128 \
  --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --kernel-times --humming \
  --calls 20 --repeats 2 --json "$OUT/dense_ladder.json" > "$OUT/dense_ladder.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_ladder.log" | cut -c1-250
step moe_down_with_humming
T 120 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down,deepseek-v3-down \
  --tokens 1,64,1024 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_humming.json" > "$OUT/moe_humming.log" 2>&1
grep -E "T=|rror" "$OUT/moe_humming.log" | cut -c1-400
step hlo
for spec in w4a16-g128-zp w4a16-nvfp4; do
  T 40 python3 benchmarks/probe_ncu.py --case dense --m 4096 --spec $spec --runs 1 \
    --hlo "$OUT/dense_${spec}_m4096.hlo.txt" 2>&1 | grep -E "^hlo|rror" | cut -c1-600
done
T 40 python3 benchmarks/probe_ncu.py --case grouped --m 1 --k 7168 --n 512 --runs 1 \
  --hlo "$OUT/grouped_deepseek_gate_up_t1.hlo.txt" 2>&1 | grep -E "^hlo|rror" | cut -c1-900
step done
