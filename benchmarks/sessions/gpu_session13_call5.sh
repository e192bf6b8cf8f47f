#!/usr/bin/env bash
# Session 13, device call 5 (~4 min of step limits; carry [".whl"]).
#   1. Is the int4 decode stream bound by the TMA box's 64-byte rows?  (NOTES.md v15: no
#      launch shape moves M = 1 off 15.8 us; 8-bit weights, 128-byte rows, stream at
#      3.5 TB/s through the same kernel.)  int4 with groups of 256 has 256-deep K tiles:
#      128-byte rows, one scale row per tile, the same kernel otherwise.
#   2. W4A8 at M = 4096 on the default route (wnam_mgpu) with the epilogue token scale.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step rows128
for spec in w4a16-g128-zp uint4-g256-zp int4-g256 w8a16; do
  T 40 python3 benchmarks/profile_mgpu.py --ms 1 --spec $spec --configs default,sub1 2>&1 \
    | grep -E "^M=|rror" | sed "s/^/$spec /" | cut -c1-250
done
step w4a8_4096
T 100 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 4096 --specs w4a8-int8 \
  --kernel-times --calls 5 --repeats 2 --json "$OUT/w4a8_4096.json" > "$OUT/w4a8_4096.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8_4096.log" | cut -c1-300
step done
