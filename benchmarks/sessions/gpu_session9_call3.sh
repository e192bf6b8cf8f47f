#!/usr/bin/env bash
# Session 9, call 3 (~7 min, carry [".whl"]).
#   1. Column scales, after call 2: per-tile f32 partials kept (scale_after_mma) with no
#      multiply.  GPU tests again; CUPTI kernel time of the per-channel specs, the default
#      (partials) against "acc" (every K tile straight into the WGMMA accumulator), which
#      call 2's walls suggested is slower (int4 per channel 28.5 us at M = 1).
#   2. The MoE layer default is now chosen per layer (moe.prepare_experts: both stacks on
#      Mosaic from hidden size 4096): DeepSeek-V3 default should match call 1's "mgpu"
#      (41.4 / 168.7 / 331.3 us); Qwen3 (both Triton by default) against both on Mosaic.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 120 python3 -m pytest tests/test_wna16_mgpu.py tests/test_w8a8_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "(quant_dense_gpu and w8a16) or fp8_weights or narrow_n or decode_mgpu or quant_moe_aligned" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
step profile_channel
for s in w4a16-ch w8a16 w8a16-fp8; do
  T 45 python3 benchmarks/profile_mgpu.py --spec $s --ms 1,16 --configs default,acc \
    --iterations 3 > "$OUT/profile_$s.log" 2>&1
  echo "# $s"; grep -E "^M=" "$OUT/profile_$s.log" | cut -c1-220
done
step moe_layer
T 110 python3 benchmarks/bench_moe_layer.py --models deepseek-v3 --tokens 1,16,64 \
  --families default --calls 10 --repeats 2 --json "$OUT/moe_layer_deepseek.json" \
  > "$OUT/moe_layer_deepseek.log" 2>&1
grep -E "^\{|rror" "$OUT/moe_layer_deepseek.log" | cut -c1-300
T 120 python3 benchmarks/bench_moe_layer.py --models qwen3-30b-a3b --tokens 1,16,64 \
  --families triton,mgpu --calls 10 --repeats 2 --json "$OUT/moe_layer_qwen3.json" \
  > "$OUT/moe_layer_qwen3.log" 2>&1
grep -E "^\{|rror" "$OUT/moe_layer_qwen3.log" | cut -c1-300
step done
