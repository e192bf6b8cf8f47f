#!/usr/bin/env bash
# Session 7, device call 2 (~8.5 minutes on an H200): what call 1 changed (M > 64: two
# warpgroups; W8A16 routed to the Mosaic kernel), whether XLA command buffers capture the
# Mosaic custom call (the ~12 us per-launch host cost, NOTES.md v8), the W4A8 words-first
# unpack (call 1's profile had a token-parsing bug), then the 8192^2 ladder with Humming
# and the other A16 formats.  Step timeouts sum to 520 s.  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 90 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "quant_dense_gpu and (w8a16 or 128)" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
step command_buffer
T 100 python3 benchmarks/probe_command_buffer.py --sizes 512 --flags default,custom_call_min1 \
  --timeout 45 > "$OUT/command_buffer.log" 2>&1
cat "$OUT/command_buffer.log" | cut -c1-250
step w4a8_unpack
T 50 python3 benchmarks/profile_w8a8_mgpu.py --specs w4a8-int8 --ms 4096 \
  --configs default,wfirst > "$OUT/w4a8_unpack.log" 2>&1
grep -E "^M=|rror" "$OUT/w4a8_unpack.log" | cut -c1-250
step dense_ladder
T 170 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 \
  --ms 1,16,128,1024,4096 --humming --calls 20 --repeats 2 --plot \
  --json "$OUT/dense_8192.json" > "$OUT/dense_8192.log" 2>&1
grep -E "^\|" "$OUT/dense_8192.log" | cut -c1-250
step a16_formats
T 110 python3 benchmarks/bench_dense.py --ms 1,16 --no-baselines --calls 20 --repeats 2 \
  --specs w8a16,w8a16-fp8,w4a16-g128,w4a16-ch,w4a16-mxint4 \
  --json "$OUT/dense_formats.json" > "$OUT/dense_formats.log" 2>&1
grep -E "^\|" "$OUT/dense_formats.log" | cut -c1-250
step done
