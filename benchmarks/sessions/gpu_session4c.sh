#!/usr/bin/env bash
# Session 4, third device call: the Mosaic W8A8 kernel with K-group scales (w8a8-fp8-block,
# w4a8-int8, w4a8-fp8 from M = 512): GPU tests at 8192^2 M = 4096, timing beside XLA,
# W4A16 and Humming, kernel profile.  Step timeouts sum to 310 s.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step test_grouped_route
T 70 python3 -m pytest tests/test_w8a8_mgpu.py -m gpu -p no:cacheprovider --tb=short -rA \
  -k "route_gpu and 4096 and (block or w4a8)" > "$OUT/w8a8_mgpu_grouped_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^E " "$OUT/w8a8_mgpu_grouped_tests.log" | cut -c1-200 | tail -8
step bench_w4a8
T 170 python3 benchmarks/bench_w8a8.py --specs w4a8-int8,w4a8-fp8,w8a8-fp8-block,w4a16-g128 \
  --ms 4096 --layers 4 --calls 10 --repeats 2 --humming --json "$OUT/w4a8_4096.json" \
  > "$OUT/bench_w4a8.log" 2>&1
grep -E "^M=|^# M" "$OUT/bench_w4a8.log" | cut -c1-250
step profile_grouped
T 70 python3 benchmarks/profile_w8a8_mgpu.py --specs w4a8-int8,w8a8-fp8-block --ms 4096 \
  --layers 4 --iterations 3 --configs default,n64 > "$OUT/profile_grouped.log" 2>&1
grep -E "^M=" "$OUT/profile_grouped.log" | cut -c1-250
step done
