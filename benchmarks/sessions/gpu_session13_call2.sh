#!/usr/bin/env bash
# Session 13, device call 2 (~8 min of step limits; carry [".whl"]).
#   1. GPU tests of this session's kernel changes: overlap_mma (now the decode default:
#      every default-launch test runs it), 8 warpgroups, the W4A8 epilogue row scale
#      (off when this call ran; made the GPU default after it.  The interpreter hangs on
#      it, so only the GPU can check it).
#   2. W4A8 at M = 4096: the per-token scale in the epilogue (one convert + FMA per
#      promotion) against the default (the token scale folded into each promotion).
#   3. The dense ladder with Humming, same run, on the new default (M = 1 / 16 / 128).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PT="-p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning"
step gpu_tests
T 60 python3 -m pytest tests/test_w8a8_mgpu.py -m gpu -k "epilogue_row_scale_gpu" $PT \
  > "$OUT/gpu_tests_w8a8.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_w8a8.log" | cut -c1-200 | tail -5
T 150 python3 -m pytest tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "configs_gpu or int4_ptx_gpu or qwen3_decode_gpu or deepseek_decode_split_k_gpu" $PT \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
step w4a8_4096
T 100 python3 benchmarks/profile_w8a8_mgpu.py --specs w4a8-int8,w4a8-fp8 --ms 4096 \
  --configs default,rowe 2>&1 | grep -vE "^(W|I)[0-9]" | cut -c1-300 | tail -12
step dense_ladder
T 170 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16,128 \
  --specs w4a16-g128-zp,w4a16-mxfp4 --kernel-times --humming \
  --calls 20 --repeats 2 --json "$OUT/dense_ladder.json" > "$OUT/dense_ladder.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_ladder.log" | cut -c1-250
step done
