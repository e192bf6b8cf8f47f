#!/usr/bin/env bash
# Session 32 device calls (2026-12-03).  Every log goes to $OUT; carry [".whl"].
#   tests:  GPU tests of the ":sf" scale fold (MXFP4 and, new, NVFP4 with the base first
#           in the epilogue: bit-equal to the unfolded kernel) and the fp4 / grouped decode
#   prof:   CUPTI kernel us per 8192^2 layer, fold on / off / on / off (PSPECS)
#   moe:    bench_moe W4A16 walls, fold on (with Humming) then off, 64-token rows (W16)
#   screen: bench_moe launch screen of the W4A16 grouped tiles at 1024 tokens (SCREEN:
#           "shape:tokens" entries; specs SSPECS, @mgpu:<tokens> = profile_mgpu's config
#           tokens on the heuristic's launch, rows<R> the tile rows)
#   cost_ab: (not run in session 32) HUMMING_JAX_COST_TILES on / off at the shapes the
#           W4A16 tile rule changed but session 32 did not time (AB: "shape:tokens")
source "$(dirname "$0")/../gpu_env.sh"
s_tests() {
  gpu_tests ${TT:-300} "${TK:-scale_fold or qwen3_decode or deepseek_decode_split or fp4_whole}" \
    tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py
}
s_prof() {  # session 31's step (fold on / off / on / off per spec), NVFP4 by default
  PSPECS=${PSPECS:-w4a16-nvfp4} bash "$(dirname "$0")/gpu_session31.sh" prof
}
s_moe() {  # (the logs of call 2 name their json moe_<shape>_<tokens>_f<fold>)
  ST=200 bench_ab HUMMING_JAX_SCALE_FOLD moe ${MSPECS:-w4a16-mxfp4,w4a16-nvfp4,w4a16-g128-zp} \
    ${W16:-qwen3-30b-a3b-gate_up:64 deepseek-v3-gate_up:64}
}
s_screen() {
  for spec in ${SCREEN:-qwen3-30b-a3b-gate_up:1024}; do
    echo "== ${spec}" >> "$OUT/screen.log"
    T ${ST:-240} python3 benchmarks/bench_moe.py --shapes ${spec%%:*} --tokens ${spec##*:} \
      --specs "$SSPECS" $MOE ${SH:---humming} --no-baselines \
      --json "$OUT/screen_${spec%%:*}_${spec##*:}.json" >> "$OUT/screen.log" 2>&1
    echo "${spec} rc=$?"; grep -E "^\| ${spec%%:*}" "$OUT/screen.log" | tail -1 | cut -c1-900
    grep -E "^\| shape" "$OUT/screen.log" | tail -1 | cut -c1-900
  done
}
s_cost_ab() {  # queued for session 33: the W4A16 rule's untimed shapes, on / off
  bench_ab HUMMING_JAX_COST_TILES cost_ab w4a16-g128-zp,w4a16-mxfp4 \
    ${AB:-deepseek-v3-gate_up:1024 qwen3-30b-a3b-down:1024 qwen3-30b-a3b-down:256 \
         mixtral-gate_up:64 mixtral-gate_up:256}
}
for s in ${@:-tests}; do step "$s"; "s_$s"; done
step done
