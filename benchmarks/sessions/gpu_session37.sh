#!/usr/bin/env bash
# Session 37 (2026-12-04) device calls; results in benchmarks/results/2026-12-04-session37.
# Carry: [".whl"].  Every bench_moe step: resident chain, --consume row.
#   p16: 16-row launches (block_rows 16: ~5-8 rows per active expert) beside DeepSeek-V3
#        gate_up at 256 tokens (call 1 of this session: the four shared-x warpgroups 318.1,
#        the decode launch's small CTAs 207.9 / 221.8): default (shared-x) against one
#        warpgroup of four stages and two of two, both splitting K.
#   q3w: Qwen3-30B-A3B down (K 768: 6 K tiles) at 16 / 64 / 128 tokens: the default
#        against one warpgroup streaming 2 column blocks (256 tokens: 72.9 -> 67.0, call 2).
#   ver: after the two rules (16-row launches on one warpgroup of four stages; K <= 768
#        streamed): the GPU tests of the changed launches, then the new defaults beside
#        Humming at the points above.
source "$(dirname "$0")/../gpu_env.sh"
ROW="$MOE --consume row --no-baselines"
W1="w4a16-g128-zp@mgpu:wg1-st4-sub2-xk-ovl-unpad"
W2="w4a16-g128-zp@mgpu:wg2-st2-sub2-xk-ovl-unpad"
s_p16() {
  for st in qwen3-30b-a3b-gate_up:128 mixtral-gate_up:32 mixtral-down:32 deepseek-v3-gate_up:192 \
            qwen3-30b-a3b-down:128; do
    T ${ST:-120} python3 benchmarks/bench_moe.py --shapes ${st%%:*} --tokens ${st##*:} \
      --specs "${SPECS:-w4a16-g128-zp,$W1,$W2}" $ROW --json "$OUT/p16_${st%%:*}_${st##*:}.json" \
      >> "$OUT/p16.log" 2>&1
    echo "$st rc=$?"; grep -E "T=|rror" "$OUT/p16.log" | tail -1 | cut -c1-1200
  done
}
s_q3w() {
  T ${ST:-200} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 16,64,128 \
    --specs w4a16-g128-zp,w4a16-g128-zp@mgpu:wg1-cb2 $ROW --json "$OUT/q3w.json" > "$OUT/q3w.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/q3w.log" | cut -c1-1200
}
s_ver() {
  gpu_tests 200 "session37 or qwen3_decode" tests/test_grouped_wna16_mgpu.py
  for st in deepseek-v3-gate_up:192,256 qwen3-30b-a3b-gate_up:128 mixtral-gate_up:32 \
            mixtral-down:32 qwen3-30b-a3b-down:16,64,128,256; do
    T ${ST:-150} python3 benchmarks/bench_moe.py --shapes ${st%%:*} --tokens ${st##*:} \
      --specs w4a16-g128-zp $ROW --humming --json "$OUT/ver_${st%%:*}.json" >> "$OUT/ver.log" 2>&1
    echo "$st rc=$?"
  done
  T 100 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 256 \
    --specs w4a16-mxfp4 $ROW --humming --json "$OUT/ver_mxfp4.json" >> "$OUT/ver.log" 2>&1
  echo "mxfp4 rc=$?"; grep -E "T=|rror" "$OUT/ver.log" | cut -c1-400
}
for s in ${@:-p16 q3w}; do step "$s"; "s_$s"; done
step done
