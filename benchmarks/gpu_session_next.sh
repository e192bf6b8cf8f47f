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
#   3. M = 128 (issue 3: <= 25 us, 58.5 measured): 128-token tiles run one warpgroup per
#      CTA; 2 warpgroups splitting K (4 do not fit shared memory with 128-token tiles: CPU
#      lowering), or two 64-token tiles of 2 / 4 warpgroups, scale after the MMA or not;
#   4. W8A16 on the Mosaic kernel (never timed: int8 stays on Triton, 24-28 us), and the
#      candidate path for W8A8 decode (issue 4: <= 20 us at M <= 16).
# Then `gpu_session_tables.sh` (dense ladder, Llama-3-8B, other A16 formats) and
# `gpu_session_moe_tables.sh` (MoE table with a chain of 8).
# Step timeouts (SIGINT, SIGKILL 5 s later) sum to 490 s.  Carry: [".whl"].
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
step m128
T 100 python3 benchmarks/profile_mgpu.py --ms 128 --configs default,wg2,wg2-after,bm64-wg4-after,bm64-wg2-after \
  --layers 8 --iterations 3 > "$OUT/m128.log" 2>&1
grep -E "^M=|rror" "$OUT/m128.log" | cut -c1-220
step w8a16_mosaic
T 60 python3 benchmarks/profile_mgpu.py --spec w8a16 --ms 1,16 --configs default \
  --layers 8 --iterations 3 > "$OUT/w8a16_mosaic.log" 2>&1
grep -E "^M=|rror" "$OUT/w8a16_mosaic.log" | cut -c1-220
step done
