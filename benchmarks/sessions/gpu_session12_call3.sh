#!/usr/bin/env bash
# Session 12, device call 3 (~8.5 min of step limits; carry [".whl"]).
#   1. GPU tests not reached in call 2 (its test step was cut at 146 s): the DeepSeek-V3
#      grid split-K decode and the shared-x prefill tiles through the one-launch schedule;
#      the Qwen3 64-token decode on the new 16-row default tiles (tile_rows).
#   2. Grouped GEMM with Humming, same run: the 16-row tiles as the default, and the
#      "resident" chain (outputs consumed inside the program, fixed buffer addresses: a
#      layer inside a model step) beside the outputs chain.  Call 2: at 1 token the
#      kernels take 11.1 us of a 25.4 us wall (outputs chain); Humming replays a CUDA graph.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 150 python3 -m pytest tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "deepseek_decode_split_k_gpu or shared_x_tiles_gpu or (qwen3_decode_gpu and 64)" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -10
step moe_qwen3
T 150 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down \
  --tokens 1,64 --specs w4a16-g128-zp@mgpu --humming --no-baselines --breakdown \
  --chain outputs,resident --calls 10 --repeats 2 \
  --json "$OUT/moe_qwen3.json" > "$OUT/moe_qwen3.log" 2>&1
grep -E "T=|rror" "$OUT/moe_qwen3.log" | cut -c1-600
step moe_deepseek
T 190 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,deepseek-v3-down \
  --tokens 1,64 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --chain outputs,resident --calls 10 --repeats 2 \
  --json "$OUT/moe_deepseek.json" > "$OUT/moe_deepseek.log" 2>&1
grep -E "T=|rror" "$OUT/moe_deepseek.log" | cut -c1-600
step done
