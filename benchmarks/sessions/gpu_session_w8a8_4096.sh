#!/usr/bin/env bash
# Last device call of 2026-11-29 session 3 (about 2.5 minutes): issue 4's M = 4096 row
# (cut by the previous call's limit) and the corrected warpgroups x split-K GPU config test.
source "$(dirname "$0")/../gpu_env.sh"
timeout -s INT 100 python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8,w4a8-mxfp4 \
  --ms 4096 --layers 4 --calls 10 --repeats 2 --humming --json "$OUT/w8a8_4096.json" \
  > "$OUT/w8a8_4096.log" 2>&1
grep -E "^M=|^# M" "$OUT/w8a8_4096.log" | cut -c1-250
timeout -s INT 40 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -p no:cacheprovider \
  --tb=line -rA -k "cfg7" > "$OUT/cfg7.log" 2>&1
tail -3 "$OUT/cfg7.log"
