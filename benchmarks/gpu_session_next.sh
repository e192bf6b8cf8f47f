#!/usr/bin/env bash
# The next device call (~9 minutes on an H200), prepared 2026-11-29 session 7.
# Open since session 7's device calls (NOTES_moe.md session 7, NOTES.md v9):
#   1. the grouped autotune (new: `python -m humming_jax.autotune --grouped`) where the
#      MoE table is worst: DeepSeek-V3 gate_up and Qwen3 gate_up at 64 / 1024 tokens; the
#      analysis predicts wide N tiles (>= 4 x rows per expert) take DeepSeek gate_up at 1024
#      tokens from 1969 us to ~400.  The winners come back in tuning.json: turn them into
#      grouped_heuristic rules, then re-run the MoE table;
#   2. the Mosaic grouped kernel (quant_ragged_dot on `@mgpu`-prepared params) at 64 / 1024
#      tokens, where its WGMMA should beat the Triton kernel's mma.sync (1.35x at 16 tokens);
#   3. W8A8 int8 at decode on the Mosaic WnA16 kernel (w8a8.run_decode_mgpu, CPU-tested):
#      its GPU tests, then Triton vs Mosaic at M = 1 / 16 (issue 4: <= 20 us; Triton 38.0;
#      W8A16 on that kernel 21.0) -- if it wins, set w8a8.DECODE_MGPU_MAX_M = 16;
#   4. fp8 e4m3 weights on the Mosaic WnA16 kernel (CPU-tested; Triton's W8A16-fp8 is 33.0
#      us, 2.04 TB/s, issue 3 wants >= 2.2): its GPU tests and CUPTI time -- if it wins,
#      drop the FP8 exclusion in wna16_mgpu.supports.
#   (Then: the dense M = 1024 / 4096 rows cut in session 7, bench_dense --ms 1024,4096.)
# Step timeouts sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
export HUMMING_JAX_TUNING_CACHE="$OUT/tuning.json"
step grouped_autotune
T 150 python3 -m humming_jax.autotune --specs w4a16-g128-zp \
  --grouped 256:8:7168x512,128:8:2048x1536 --tokens 64,1024 > "$OUT/grouped_autotune.log" 2>&1
grep -E "us per grouped|rror" "$OUT/grouped_autotune.log" | cut -c1-250
step moe_tuned_and_mgpu
T 140 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up \
  --tokens 64,1024 --specs w4a16-g128-zp,w4a16-g128-zp@mgpu --no-baselines --humming \
  --calls 10 --repeats 2 --json "$OUT/moe_tuned.json" > "$OUT/moe_tuned.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_tuned.log" | cut -c1-300
unset HUMMING_JAX_TUNING_CACHE
step w8a8_decode
T 90 python3 -m pytest tests/test_w8a8_mgpu.py -m gpu -k decode -p no:cacheprovider --tb=short \
  -rA -W ignore::DeprecationWarning > "$OUT/w8a8_decode_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/w8a8_decode_tests.log" | cut -c1-200 | tail -6
T 60 python3 benchmarks/bench_w8a8.py --decode-study --ms 1,16 --calls 20 --repeats 2 \
  --json "$OUT/w8a8_decode.json" > "$OUT/w8a8_decode.log" 2>&1
grep -E "^\{|rror" "$OUT/w8a8_decode.log" | cut -c1-300
step fp8_weights
T 70 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k fp8 -p no:cacheprovider --tb=short \
  -rA -W ignore::DeprecationWarning > "$OUT/fp8_tests.log" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/fp8_tests.log" | cut -c1-200 | tail -4
T 50 python3 benchmarks/profile_mgpu.py --spec w8a16-fp8 --ms 1,16 --configs default \
  --layers 8 --iterations 3 > "$OUT/fp8_profile.log" 2>&1
grep -E "^M=|rror" "$OUT/fp8_profile.log" | cut -c1-220
step done
