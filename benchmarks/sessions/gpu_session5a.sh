#!/usr/bin/env bash
# Session 5, first kernel call: fp4 e2m1 (MXFP4 / NVFP4) and group-32 int (MXINT4) on the
# Mosaic WnA16 kernel (kernels/mgpu_convert.py's PTX conversion), and group_pairs as the
# W8A8 K-group default.  Step timeouts (SIGINT, SIGKILL 5 s later) sum to 560 s.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 200 python3 -m pytest tests/test_wna16_mgpu.py tests/test_w8a8_mgpu.py -m gpu \
  -k "mxfp4 or nvfp4 or mxint4 or group_pairs" -p no:cacheprovider --tb=short -q \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/gpu_tests.log" | cut -c1-300 | tail -12
step profile
for s in w4a16-mxfp4 w4a16-nvfp4; do
  T 60 python3 benchmarks/profile_mgpu.py --spec $s --ms 1,16 --configs default,sub1,wg2 \
    --layers 4 --iterations 3 >> "$OUT/profile.log" 2>&1
done
T 40 python3 benchmarks/profile_mgpu.py --spec w4a16-g128-zp --ms 1,16 --configs default \
  --layers 4 --iterations 3 >> "$OUT/profile.log" 2>&1
grep -vE "^#|Warning|warn" "$OUT/profile.log" | cut -c1-250 | tail -20
step dense
T 200 python3 benchmarks/bench_dense.py --specs w4a16-mxfp4,w4a16-nvfp4,w4a16-mxint4 \
  --ms 1,16,128 --layers 4 --calls 10 --repeats 2 --humming --json "$OUT/dense.json" \
  > "$OUT/dense.log" 2>&1
grep -E "^8192|ERROR|rror" "$OUT/dense.log" | cut -c1-250
step done
