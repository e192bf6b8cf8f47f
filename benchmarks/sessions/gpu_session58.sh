#!/usr/bin/env bash
# Session 58 (2026-12-06).  Steps (carry [".whl"]):
#   l58:  the whole MoE layer (bench_moe_layer, default families) with the grouped mma.sync
#         bound HUMMING_JAX_MMA_SYNC_MAX_K_TILES = 16 (the rule), 64 (every 8-row tile) and
#         0 (none) in one process; DeepSeek-V3 16 tokens by default (L58="model:tokens ...").
#   g58:  bench_moe per grouped GEMM past one token (GTOK, default 16,64), the launch of
#         before session 57 (@mgpu:noms: WGMMA) against the default, Humming beside.
#   t58:  GPU tests of the W4A8 decode quantizing its activations inside the WnA16 kernel
#         (wna16_mgpu.run fake_quantize_x; test_fake_quantize_x_gpu, the W4A8 decode tests
#         now on it at one token), and of the code it shares with W8A8's quantize_x and the
#         pre-pass (round_half_even).
#   w58:  CUPTI kernel time per layer at M = 1 (probe_w4a8_decode --variants qx1,qx0: in the
#         kernel / the pre-pass, one process), W4A16 of the same formats beside.
#   p58:  the carried A16 formats on the Mosaic kernel only (probe_carried --families).
#   t57, g57, l57 and the earlier sessions' steps: gpu_session57.sh.
source "$(dirname "$0")/../gpu_env.sh"
s_l58() {
  local line model tokens
  for line in ${L58:-deepseek-v3:16}; do
    IFS=: read -r model tokens <<< "$line"
    T ${LT:-200} python3 benchmarks/bench_moe_layer.py --models $model --tokens $tokens \
      --families default --env HUMMING_JAX_MMA_SYNC_MAX_K_TILES=${LV:-16,64,0} \
      --spec ${LS:-w4a16-g128-zp} \
      --json "$OUT/l58_${model}_$tokens.json" > "$OUT/l58_${model}_$tokens.log" 2>&1
    echo "l58 $model $tokens rc=$?"; grep "'tokens'" "$OUT/l58_${model}_$tokens.log" | cut -c1-600
  done
}
s_g58() {
  local shape spec=${GS:-w4a16-g128-zp}
  for shape in ${GSH:-qwen3-30b-a3b-down deepseek-v3-down}; do
    T ${GT:-120} python3 benchmarks/bench_moe.py --shapes $shape --tokens ${GTOK:-16,64} \
      --specs "$spec@mgpu:noms,$spec" $MOE --consume row --humming \
      --no-baselines --json "$OUT/g58_$shape.json" > "$OUT/g58_$shape.log" 2>&1
    echo "g58 $shape rc=$?"; grep -E "T=|rror" "$OUT/g58_$shape.log" | cut -c1-700
  done
}
s_t58() {
  gpu_tests ${ST:-300} "${T58K:-fake_quantize_x_gpu or decode_gpu or quantize_x_gpu or fake_quant_gpu or split_rows_gpu}" \
    tests/test_wnam_mgpu.py tests/test_w8a8_mgpu.py tests/test_act_prepass.py
}
s_w58() {
  local line
  for line in ${W58:-8192x8192:w4a8-int8,w4a8-fp8,w4a8-mxfp4,w4a16-g128,w4a16-mxfp4 14336x4096:w4a8-int8,w4a8-mxfp4,w4a16-g128}; do
    IFS=:x read -r k n specs <<< "$line"
    T ${WT:-150} python3 benchmarks/probe_w4a8_decode.py --specs $specs --ms ${WMS:-1} \
      --k $k --n $n --variants qx1,qx0 > "$OUT/w58_${k}x$n.log" 2>&1
    echo "w58 ${k}x$n rc=$?"; grep -E "kernels|rror" "$OUT/w58_${k}x$n.log" | cut -c1-300
  done
}
s_p58() {
  T ${PT:-300} python3 benchmarks/probe_carried.py --formats ${PF:-int3:g128,int5:g128,int6:g128,int7:g128,fp6_e2m3:g32:e8m0,fp6_e3m2:g128,fp8_e5m2:ch,uint6:g32:zp,int2:g128} \
    --families wna16_mgpu --ms ${PMS:-1,16} --json "$OUT/p58.json" > "$OUT/p58.log" 2>&1
  echo "p58 rc=$?"; grep -E "^\+|rror" "$OUT/p58.log" | cut -c1-200 | tail -30
}
for s in ${@:-l58}; do
  case "$s" in
    l58|g58|t58|w58|p58) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session57.sh" "$s" ;;
  esac
done
