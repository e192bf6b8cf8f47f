#!/usr/bin/env bash
# Session 12, device call 4 (~3 min; carry [".whl"]): the dense decode layer in the
# "resident" chain (outputs consumed inside the program at fixed addresses, as in a model
# step) beside Humming's CUDA graph, same run.  Call 3: the 1-token grouped GEMM costs
# 16.0 us resident against 24.3 in the outputs chain (Humming 15.4).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step dense_resident
T 170 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1 \
  --specs w4a16-g128-zp,w4a16-mxfp4 --chain resident --humming --no-baselines \
  --calls 20 --repeats 2 --json "$OUT/dense_resident.json" > "$OUT/dense_resident.log" 2>&1
grep -E "^8192|rror" "$OUT/dense_resident.log" | cut -c1-250
step done
