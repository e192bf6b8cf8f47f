#!/usr/bin/env bash
# Session 4, second device call: the rows the first call's timeouts cut (W8A8 at M = 4096
# with Humming; WnA16 decode at M = 16 / 128 with the v6 heuristic).
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step bench_w8a8
T 170 python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 4096 --layers 4 \
  --calls 10 --repeats 2 --humming --json "$OUT/w8a8_4096.json" > "$OUT/bench_w8a8.log" 2>&1
grep -E "^M=|^# M" "$OUT/bench_w8a8.log" | cut -c1-250
step bench_dense
T 150 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-g128 --ms 16,128 \
  --layers 8 --calls 20 --repeats 2 --humming --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
grep -E "^8192|ERROR" "$OUT/dense.log" | cut -c1-250
step done
