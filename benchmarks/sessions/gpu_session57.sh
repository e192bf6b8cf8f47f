#!/usr/bin/env bash
# Session 57 (2026-12-06).  Steps (carry [".whl"]):
#   t57:  GPU tests of the grouped launches on mma.sync (test_mma_sync_launches_gpu: streamed
#         column blocks, small CTAs, two warpgroups, shared x, one K tile per step, against
#         the same launch on WGMMA and the reference), the pair tiles and Qwen3 decode on the
#         new default (8-row tiles take mma.sync), the dense mma_sync tests.
#   g57:  CUPTI/wall A/B per grouped GEMM at 1 token (8-row tiles), one process per shape:
#         <spec>@mgpu:noms (the launch of before: WGMMA), <spec> (the new default:
#         mma.sync), <spec>@mgpu:sub1 (mma.sync, one K tile per step), Humming beside.
#   l57:  the whole MoE layer (bench_moe_layer, pair tiles) with HUMMING_JAX_MMA_SYNC=1,0
#         in one process: 1 token at Qwen3-30B-A3B / DeepSeek-V3 / Mixtral, DeepSeek-V3 16.
#   fin, ms2, q55, h8, p54: the earlier sessions' steps (gpu_session56.sh).
source "$(dirname "$0")/../gpu_env.sh"
s_t57() {
  gpu_tests ${ST:-300} "${T57K:-mma_sync or pair_tiles_gpu or qwen3_decode_gpu}" \
    tests/test_grouped_wna16_mgpu.py tests/test_wna16_mgpu.py
}
G57_SHAPES="qwen3-30b-a3b-gate_up qwen3-30b-a3b-down deepseek-v3-gate_up deepseek-v3-down"
G57_SHAPES+=" mixtral-gate_up mixtral-down"
s_g57() {
  local shape spec=${GS:-w4a16-g128-zp}
  for shape in ${GSH:-$G57_SHAPES}; do
    T ${GT:-120} python3 benchmarks/bench_moe.py --shapes $shape --tokens ${GTOK:-1} \
      --specs "$spec@mgpu:noms,$spec,$spec@mgpu:sub1" $MOE --consume row --humming \
      --no-baselines --json "$OUT/g57_$shape.json" > "$OUT/g57_$shape.log" 2>&1
    echo "g57 $shape rc=$?"; grep -E "T=|rror" "$OUT/g57_$shape.log" | cut -c1-700
  done
}
s_l57() {
  local line model tokens
  for line in ${L57:-qwen3-30b-a3b:1 deepseek-v3:1 mixtral:1 deepseek-v3:16}; do
    IFS=: read -r model tokens <<< "$line"
    T ${LT:-150} python3 benchmarks/bench_moe_layer.py --models $model --tokens $tokens \
      --families default --env HUMMING_JAX_MMA_SYNC=1,0 --spec ${LS:-w4a16-g128-zp} \
      --json "$OUT/l57_${model}_$tokens.json" > "$OUT/l57_${model}_$tokens.log" 2>&1
    echo "l57 $model $tokens rc=$?"; grep "'tokens'" "$OUT/l57_${model}_$tokens.log" | cut -c1-600
  done
}
for s in ${@:-t57}; do
  case "$s" in
    t57|g57|l57) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session56.sh" "$s" ;;
  esac
done
