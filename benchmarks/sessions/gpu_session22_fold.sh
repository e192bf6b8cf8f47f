#!/usr/bin/env bash
# Session 22, call 4: the e8m0 group-scale fold (config.fp8_fold / HUMMING_JAX_FP8_FOLD=1,
# mgpu_convert.e2m1_to_e4m3_folded_ptx), built after calls 1-3: its GPU tests, then the
# grouped kernel at Mixtral gate_up 1024 tokens (128-row tiles: ~400 TFLOP/s with a
# partial and a wait per 32-deep group) and the dense ":p8" kernel at M = 128 (47.6 us of
# kernels in call 2, against 41.3 on the default layout and Humming's 28.8 wall).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
T 150 python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -s -W ignore::DeprecationWarning \
  tests/test_wnam_mgpu.py tests/test_grouped_wnam_mgpu.py -m gpu -k "fp8_fold" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "fp8 fold|^E |passed|failed" "$OUT/tests.log" | cut -c1-250 | tail -12
step moe
T 110 python3 benchmarks/probe_fp8_moe.py --shape 8,2,28672,4096 --tokens 1024 --fold > "$OUT/moe.log" 2>&1
echo "rc=$?"; grep -v Warn "$OUT/moe.log" | tail -2 | cut -c1-600
step dense
T 70 python3 benchmarks/probe_dense_fp8.py --shape 8192,8192 --ms 128 --fold --sets 4 > "$OUT/dense.log" 2>&1
echo "rc=$?"; grep -v Warn "$OUT/dense.log" | tail -10
step done
