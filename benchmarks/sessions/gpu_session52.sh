#!/usr/bin/env bash
# Session 52 (2026-12-06).  Steps (carry [".whl"]):
#   t52:  GPU tests of this session's change -- W8A8's Mosaic decode route on an 8-bit
#         WGMMA (wna16_mgpu.run direct layout with int8 / e4m3 x: both operands straight
#         from shared memory; w8a8.DECODE_MMA8) and, with HUMMING_JAX_DECODE_MMA8=0, the
#         16-bit-operand product; run_direct; the one-launch codes in the 8-bit carrier.
#   m8:   the route with the 8-bit WGMMA against the 16-bit-operand product and the Triton
#         W8A8 kernel, CUPTI kernel time, one process (bench_w8a8.py --decode-study).
#   h8:   w8a8.run at decode (M = 1 / 16) with kernel times and Humming's CUDA-graph
#         replay in the same process.
#   cp, sub, nv, fin, t50: sessions/gpu_session50.sh's steps; t51, w8d, w8r, pp:
#   gpu_session51.sh's.
source "$(dirname "$0")/../gpu_env.sh"
s_t52() {
  gpu_tests ${ST:-300} "${T52K:-decode_mgpu or run_direct or decode_codes_gpu}" \
    tests/test_w8a8_mgpu.py tests/test_act_prepass.py
}
s_m8() {
  T ${WT:-330} python3 benchmarks/bench_w8a8.py --decode-study --kernel-times --ms ${MS:-1,16} \
    --decode-labels ${LB:-triton,decode_mgpu,decode_mgpu_16bit} --calls 20 --repeats 2 \
    --json "$OUT/m8.json" > "$OUT/m8.log" 2>&1
  echo "m8 rc=$?"
  grep -E "^\{|rror" "$OUT/m8.log" | sed -E "s/'[a-z_0-9]+_kernels': \{[^}]*\}, //g" | cut -c1-520
}
s_h8() {
  T ${BT:-240} python3 benchmarks/bench_w8a8.py --specs ${SP:-w8a8-int8,w8a8-fp8} --ms ${MS:-1,16} \
    --kernel-times --humming --no-baselines --calls 20 --repeats 2 \
    --json "$OUT/h8.json" > "$OUT/h8.log" 2>&1
  echo "h8 rc=$?"; grep -E "^\||kernels=|rror" "$OUT/h8.log" | cut -c1-300 | tail -12
}
for s in ${@:-t52}; do
  case "$s" in
    t52|m8|h8) step "$s"; "s_$s" ;;
    t51|w8d|w8r|pp) bash "$(dirname "$0")/gpu_session51.sh" "$s" ;;
    *) bash "$(dirname "$0")/gpu_session50.sh" "$s" ;;
  esac
done
