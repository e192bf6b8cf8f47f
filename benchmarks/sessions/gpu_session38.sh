#!/usr/bin/env bash
# Session 38's device calls (2026-12-04; results in benchmarks/results/2026-12-04-session38).
# Call 1 ran gpu_session_next.sh s37 mx.  Carry: [".whl"] (qm: [".whl", "old"]).
#   pt: GPU tests of quant_moe's pair tiles (one token: a tile per routed pair, no sort),
#       int4 / MXFP4 at Qwen3-30B-A3B and DeepSeek-V3, and the aligned layer test.
#   pl: the whole layer (bench_moe_layer, default family) with the pair tiles and without
#       (HUMMING_JAX_MOE_PAIR_TOKENS=1 / 0 in one process) at one token, with the kernel
#       breakdown; then 2 and 4 tokens with the pair tiles forced (=4) against the sorted
#       path (=0): does the rule pay past one token?
#   pr: the pair-tile rule's edges (call 3): Qwen3-30B-A3B at 3 / 4 tokens and Mixtral at
#       2 with the pair tiles forced (=4) and not.  The rule then (a shared-expert share up
#       to 1/16) sorted all three; from these rows it is 1/8 (Qwen3 3 / 4 on pair tiles).
#   q3: quant_moe at Qwen3-30B-A3B 128 tokens, this tree vs 6207b22 (needs old/; call 3
#       ran an earlier form that timed this tree twice, call 4 this one's swap by hand; it
#       swaps the tree in the device's copy and puts it back).
# Usage: gpu_session38.sh [STEP...]  (default: pt pl).
source "$(dirname "$0")/../gpu_env.sh"
s_pt() {
  gpu_tests ${ST:-240} "pair_tiles_gpu or quant_moe_aligned_gpu" tests/test_grouped_wna16_mgpu.py
}
# layer_ab LOG NAME MODEL TOKENS VALUES [FLAGS...]: bench_moe_layer's default family once
# per HUMMING_JAX_MOE_PAIR_TOKENS value, in one process; $OUT/NAME.json, log $OUT/LOG.log.
layer_ab() {
  local log=$1 name=$2 model=$3 tokens=$4 values=$5; shift 5
  T ${ST:-150} python3 benchmarks/bench_moe_layer.py --models $model --tokens $tokens \
    --families default --env HUMMING_JAX_MOE_PAIR_TOKENS=$values "$@" \
    --json "$OUT/$name.json" >> "$OUT/$log.log" 2>&1
  echo "$model $tokens rc=$?"; grep "'tokens'" "$OUT/$log.log" | tail -2 | cut -c1-900
}
s_pl() {
  local m
  for m in qwen3-30b-a3b deepseek-v3 mixtral; do
    layer_ab pl pl_$m $m 1 1,0 --breakdown
  done
  for m in deepseek-v3 qwen3-30b-a3b; do
    layer_ab pl pl24_$m $m 2,4 4,0
  done
}
s_pr() {
  layer_ab pr pr_qwen3-30b-a3b qwen3-30b-a3b 3,4 4,0
  layer_ab pr pr_mixtral mixtral 2 4,0
}
s_q3() {
  # The trees swapped in place: on the device humming_jax imports from the repo root
  # whatever PYTHONPATH says (call 3's PYTHONPATH=old run timed this tree twice).
  local tree
  cp -r humming_jax /tmp/hj_new_tree  # put back after the old tree's run
  for tree in new old; do
    [ $tree = old ] && rm -rf humming_jax && cp -r old/humming_jax humming_jax
    python3 -c "from humming_jax.kernels import grouped_wna16_mgpu as g; \
      print('tree', g.__file__, g.STREAMED_MAX_K_TILES)"  # 6 / 2
    T ${ST:-90} python3 benchmarks/bench_moe_layer.py --models qwen3-30b-a3b --tokens 128 \
      --families default --json "$OUT/q3_$tree.json" >> "$OUT/q3.log" 2>&1
    echo "$tree rc=$?"; grep "'tokens'" "$OUT/q3.log" | tail -1 | cut -c1-300
  done
  rm -rf humming_jax && cp -r /tmp/hj_new_tree humming_jax && rm -rf /tmp/hj_new_tree  # restored
}
for s in ${@:-pt pl}; do step "$s"; "s_$s"; done
step done
