#!/usr/bin/env bash
# The device call that produced the v3 (Mosaic GPU) numbers of benchmarks/NOTES.md:
# GPU tests of kernels/wna16_mgpu.py, the dense table with Humming, the config sweep.
# Run from the repo root on the GPU machine with .whl carried; logs land in $OUT.
source "$(dirname "$0")/../gpu_env.sh"
timeout -s INT 110 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > $OUT/mgpu_tests.log 2>&1
grep -E "PASSED|FAILED|passed|failed|rel err" $OUT/mgpu_tests.log | tail -20; echo "t=$(( $(date +%s) - T0 ))"
timeout -s INT 170 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-g128 --ms 1,16,128,1024,4096 --layers 4 --calls 20 --repeats 2 --humming --plot --json dense_v3.json > $OUT/dense.log 2>&1
grep -E "^[0-9]|^\|" $OUT/dense.log | tail -14; echo "t=$(( $(date +%s) - T0 ))"
cp benchmarks/results/dense_v3* $OUT/ 2>/dev/null
timeout -s INT $(( 500 - ($(date +%s) - T0) )) python3 benchmarks/bench_mgpu.py --specs w4a16-g128-zp,w4a16-g128 --ms 1,16,128 --calls 20 > $OUT/mgpu_sweep.log 2>&1
grep -v "^  File\|^    " $OUT/mgpu_sweep.log | tail -30
