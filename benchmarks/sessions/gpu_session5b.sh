#!/usr/bin/env bash
# Session 5, second kernel call: the 5-instruction fp4 conversion (prmt / shr / and / lop3 /
# fma), its GPU tests, CUPTI kernel time beside int4, and the same-run decode table with
# Humming on chains of 8 layers.  Step timeouts sum to 520 s.  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 150 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "mxfp4 or nvfp4 or mxint4" \
  -p no:cacheprovider --tb=short -q -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/gpu_tests.log" | cut -c1-300 | tail -12
step profile
for s in w4a16-mxfp4 w4a16-nvfp4 w4a16-mxint4 w4a16-g128-zp; do
  T 35 python3 benchmarks/profile_mgpu.py --spec $s --ms 1,16 --configs default \
    --layers 8 --iterations 3 >> "$OUT/profile.log" 2>&1
done
grep -E "^M=|^#" "$OUT/profile.log" | cut -c1-200
step dense
T 230 python3 benchmarks/bench_dense.py \
  --specs w4a16-mxfp4,w4a16-nvfp4,w4a16-mxint4,w4a16-g128-zp \
  --ms 1,16,128 --layers 8 --calls 10 --repeats 2 --humming --json "$OUT/dense.json" \
  > "$OUT/dense.log" 2>&1
grep -E "^8192|ERROR|rror" "$OUT/dense.log" | cut -c1-250
step done
