#!/usr/bin/env bash
# Session 11, device call 2 (~9 minutes on an H200).  Changed since call 1 (CPU-checked):
#   1. MgpuConfig.int4_ptx on by default (call 1: bit-identical in 14 GPU cases, M = 1
#      kernel 17.1 -> 16.0 us); M = 16 / 128 not yet timed: profile default vs noptx.
#   2. grouped_wna16_mgpu.run maps output rows with gathers only (output_rows), no scatter:
#      GPU tests of the grouped decode paths, and DeepSeek-V3 / Qwen3 gate_up at 1 / 64
#      tokens with Humming in the same run.
#   3. wnam_mgpu vs the W8A8 family for W4A8 / W8A8 with CUPTI kernel times (call 1's walls
#      at M = 16 were host bound: 34-52 us for 18 us kernels), M = 1 / 16 / 1024 / 4096.
# Step timeouts sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 150 python3 -m pytest tests/test_grouped_wna16_mgpu.py tests/test_wna16_mgpu.py -m gpu \
  -k "split_k_gpu or aligned_gpu or qwen3_decode or (quant_dense_gpu and (g128 or mxint4))" \
  -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
step profile_ptx
T 80 python3 benchmarks/profile_mgpu.py --spec w4a16-g128-zp --ms 16,128 \
  --configs default,noptx --iterations 3 > "$OUT/profile_ptx.log" 2>&1
grep -E "^M=" "$OUT/profile_ptx.log" | cut -c1-200
step w4a8_wnam
T 150 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16,1024,4096 \
  --specs w4a16-g128,w4a8-int8,w4a8-int8@wnam_mgpu --kernel-times --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/w4a8_int8.json" > "$OUT/w4a8_int8.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8_int8.log" | cut -c1-250
T 80 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 16,4096 \
  --specs w4a8-mxfp4,w4a8-mxfp4@wnam_mgpu,w8a8-int8,w8a8-int8@wnam_mgpu --kernel-times \
  --no-baselines --calls 10 --repeats 2 --json "$OUT/w4a8_more.json" > "$OUT/w4a8_more.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8_more.log" | cut -c1-250
step moe_with_humming
T 100 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up \
  --tokens 1,64 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_humming.json" > "$OUT/moe_humming.log" 2>&1
grep -E "T=|rror" "$OUT/moe_humming.log" | cut -c1-400
step done
