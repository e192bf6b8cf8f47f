#!/usr/bin/env bash
# Session 4 device call (2026-11-29): the new Mosaic W8A8 kernel (kernels/w8a8_mgpu.py),
# the WnA16 decode heuristic with the v6 options on, and the launch-overhead question
# (XLA command buffers).  Step timeouts (kill 5 s after SIGINT) sum to < 560 s.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step test_w8a8_mgpu
T 100 python3 -m pytest tests/test_w8a8_mgpu.py -m gpu -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/w8a8_mgpu_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^E " "$OUT/w8a8_mgpu_tests.log" | cut -c1-200 | tail -14
step profile_w8a8_mgpu
T 110 python3 benchmarks/profile_w8a8_mgpu.py --ms 4096,1024 --layers 4 --iterations 3 \
  --configs default,n64,st3,w4,w16,minor_m > "$OUT/profile_w8a8.log" 2>&1
grep -E "^M=" "$OUT/profile_w8a8.log" | cut -c1-230
step bench_w8a8
T 90 python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 1024,4096 --layers 4 \
  --calls 10 --repeats 2 --humming --json "$OUT/w8a8.json" > "$OUT/bench_w8a8.log" 2>&1
grep -E "^M=|^# M" "$OUT/bench_w8a8.log" | cut -c1-250
step test_wna16_mgpu
T 80 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/mgpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/mgpu_tests.log" | cut -c1-200 | tail -6
step bench_dense
T 70 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-g128 --ms 1,16 \
  --layers 8 --calls 20 --repeats 2 --humming --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
grep -E "^8192|ERROR" "$OUT/dense.log" | cut -c1-250
step overhead_cmdbuf
for flags in "" "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,CUBLAS,CUBLASLT --xla_gpu_graph_min_graph_size=1"; do
  echo "XLA_FLAGS=[$flags]"
  XLA_FLAGS="$flags" T 45 python3 benchmarks/profile_mgpu.py --overhead \
    --overhead-cases mosaic,triton 2>&1 | grep -E "^overhead|rror" | cut -c1-200
done
step done
