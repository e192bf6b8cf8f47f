#!/usr/bin/env bash
# Session 12, device call 1 (~9.5 min of step limits; carry [".whl"]).
#   1. GPU tests of session 11's CPU-only work: the large-M GEMM writing bf16 itself, the
#      W4A8 e5m2-activation decode, the exact-operand prefill route of wnam_mgpu.
#   2. Decode tiles of 8 / 16 token rows (MgpuConfig.block_m) instead of 64: the WGMMA
#      accumulator, and the per-K-tile float32 scale of every accumulator value, shrink 8x /
#      4x (prediction: ~60 of ~240 instructions per thread per K tile at M = 1).
#   3. The large-M route with the bf16-output GEMM (prediction int4 M = 4096: ~757 -> ~710
#      us of kernels), dense ladder M = 16 / 128 with Humming, XLA HLO of the 1-token
#      grouped glue.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 150 python3 -m pytest tests/test_wna16_mgpu.py tests/test_wnam_mgpu.py -m gpu \
  -k "dequant_gemm_output or (quant_dense_gpu and 1024) or e5m2 or prefill_exact_route_gpu" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|rel err" "$OUT/gpu_tests.log" | cut -c1-200 | tail -14
step decode_rows
for spec in w4a16-g128-zp w4a16-mxfp4; do
  T 75 python3 benchmarks/profile_mgpu.py --spec $spec --ms 1 \
    --configs default,bm8,bm8-sub4,bm8-st6 2>&1 | grep -vE "^(W|I)[0-9]" | tail -6
done
T 60 python3 benchmarks/profile_mgpu.py --spec w4a16-g128-zp --ms 16 \
  --configs default,bm16,bm16-sub4 2>&1 | grep -vE "^(W|I)[0-9]" | tail -5
step large_m
T 120 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
  --specs w4a16-g128-zp,w4a16-nvfp4 --kernel-times --calls 5 --repeats 2 \
  --json "$OUT/large_m.json" > "$OUT/large_m.log" 2>&1
grep -E "^8192|rror" "$OUT/large_m.log" | cut -c1-250
step dense_ladder
T 130 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 16,128 \
  --specs w4a16-g128-zp,w4a16-mxfp4 --kernel-times --humming \
  --calls 20 --repeats 2 --json "$OUT/dense_ladder.json" > "$OUT/dense_ladder.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_ladder.log" | cut -c1-250
step hlo_grouped
T 40 python3 benchmarks/probe_ncu.py --case grouped --m 1 --k 7168 --n 512 --runs 1 \
  --hlo "$OUT/grouped_deepseek_gate_up_t1.hlo.txt" 2>&1 | grep -E "^hlo|rror" | cut -c1-900
step done
