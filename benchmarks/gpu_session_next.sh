#!/usr/bin/env bash
# The next device calls, prepared 2026-12-01 at the end of session 19 (its calls:
# benchmarks/results/2026-12-01-session19, script gpu_session19.sh).  One call first:
#   verify: the mend after session 19's device time -- permuted (":pk") codes take the
#      in-place PTX route under any config, only the flags of their format (the grouped
#      kernels pass their heuristic's config explicitly; under HUMMING_JAX_INT4_PTX=0 the
#      session-19 form refused every fp4 MoE call).  GPU tests with the default env, then
#      the fp4 grouped decode and the int4 PTX cases under HUMMING_JAX_INT4_PTX=0, then
#      HUMMING_JAX_PERMUTE_K=0 (the K-order fallback) on the dense decode tests.
#   dense: the W4A16 ladder at 8192^2 (M = 1 ... 4096) and the four Llama-3-8B projections
#      (M = 1 / 16 / 128), with Humming (issue 3's table on the permuted layout).
# Usage: gpu_session_next.sh [STEP...]  (default: verify).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_verify() {
  T 200 $PYT tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
    -k "int4_ptx_gpu or fp4_whole_registers_gpu or qwen3_decode_gpu or split_k_gpu" 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | tail -10
  HUMMING_JAX_INT4_PTX=0 T 120 $PYT tests/test_grouped_wna16_mgpu.py -m gpu \
    -k "qwen3_decode_gpu" 2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed" | tail -6
  HUMMING_JAX_PERMUTE_K=0 T 120 $PYT tests/test_wna16_mgpu.py -m gpu -k "quant_dense_gpu" \
    2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed" | tail -6
}
s_dense() {
  T 300 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16,128,1024,4096 \
    --specs w4a16-g128-zp,w4a16-mxfp4 --humming --kernel-times --calls 10 --repeats 2 \
    --json "$OUT/dense_ladder.json" > "$OUT/dense_ladder.log" 2>&1
  grep -E "^[0-9]+x|rror" "$OUT/dense_ladder.log" | cut -c1-330
  T 280 python3 benchmarks/bench_dense.py --shapes 4096x6144,4096x4096,4096x28672,14336x4096 \
    --ms 1,16,128 --specs w4a16-g128-zp --humming --kernel-times --calls 10 --repeats 2 \
    --json "$OUT/dense_llama.json" > "$OUT/dense_llama.log" 2>&1
  grep -E "^[0-9]+x|rror" "$OUT/dense_llama.log" | cut -c1-330
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
