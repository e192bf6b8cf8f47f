#!/usr/bin/env bash
# The next device call (~9 minutes on an H200), prepared 2026-11-29 session 6.
# Open since the last GPU runs (benchmarks/NOTES.md v8, NOTES_moe.md session 6,
# NOTES_w8a8.md):
#   0. GPU tests of what session 6 built after its last device call: quant_moe on
#      Mosaic-prepared experts (tile-aligned segments, grouped_wna16_mgpu.run_aligned) and
#      the words-first W4A8 operand unpack (off by default);
#   1. the MoE MLP, Triton grouped kernel vs the aligned Mosaic path (bench_moe_layer.py,
#      CUPTI per kernel): the Mosaic kernel was 11.9 us vs 17.5 at Qwen3 decode, its gather
#      glue is gone now -- flip quant_moe's default family for decode if it wins;
#   2. W4A8 int4 at M = 4096: words-first unpack vs default (predicted ~45 vs 87 us);
#   3. the dense 8192^2 ladder with the plot (issue 3's table; last full ladder: session 3-4).
# Then `gpu_session_tables.sh` (Llama-3-8B table, MoE table with a chain of 8).
# Step timeouts (SIGINT, SIGKILL 5 s later) sum to 550 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 130 python3 -m pytest tests/test_grouped_wna16_mgpu.py tests/test_w8a8_mgpu.py -m gpu \
  -k "aligned or words_first or qwen3" -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -14
step moe_layer
T 130 python3 benchmarks/bench_moe_layer.py --tokens 1,16,64 --breakdown \
  --json "$OUT/moe_layer.json" > "$OUT/moe_layer.log" 2>&1
grep -E "^\{|rror" "$OUT/moe_layer.log" | cut -c1-900
step w4a8_unpack
T 70 python3 benchmarks/profile_w8a8_mgpu.py --specs w4a8-int8 --ms 4096 \
  --configs default,wfirst > "$OUT/w4a8_unpack.log" 2>&1
grep -E "^M=|rror" "$OUT/w4a8_unpack.log" | cut -c1-250
step dense_ladder
T 220 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 \
  --ms 1,16,128,1024,4096 --humming --calls 20 --repeats 2 --plot \
  --json "$OUT/dense_8192.json" > "$OUT/dense_8192.log" 2>&1
grep -E "^\|" "$OUT/dense_8192.log" | cut -c1-250
step done
