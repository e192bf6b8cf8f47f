#!/usr/bin/env bash
# Session 55 (2026-12-06).  Steps (carry [".whl"]):
#   t55:  GPU tests of the in-kernel int8 / e4m3 activation quantization (wna16_mgpu.run's
#         quantize_x: run_direct against the same kernel on XLA's codes, NaN rows, the
#         w8a8-int8 decode route against reference / float / Triton at 8192^2 and
#         14336 -> 4096) and session 54's untested default route of the carried formats.
#   q55:  W8A8 int8 / fp8 decode, x quantized in the kernel (decode_mgpu_qx) against the
#         pre-pass launch (decode_mgpu_pp), one process per shape, CUPTI kernel time per
#         layer (bench_w8a8.py --decode-study --kernel-times), M = 1 / 16.
#   h8, p54, q53, ...: the earlier sessions' steps.
source "$(dirname "$0")/../gpu_env.sh"
s_t55() {
  gpu_tests ${ST:-360} "${T55K:-quantize_x or carried_default_route_gpu}" \
    tests/test_w8a8_mgpu.py tests/test_wna16_mgpu.py
}
s_q55() {
  local shape
  for shape in ${SHAPES:-8192x8192 14336x4096}; do
    BENCH_W8A8_DECODE_SPECS=${QS:-w8a8-int8,w8a8-fp8} T ${QT:-240} python3 benchmarks/bench_w8a8.py \
      --decode-study --kernel-times --ms ${MS:-1,16} --calls 20 --repeats 2 --shape $shape \
      --decode-labels ${QL:-decode_mgpu_qx,decode_mgpu_pp} \
      --json "$OUT/q55_$shape.json" > "$OUT/q55_$shape.log" 2>&1
    echo "q55 $shape rc=$?"
    grep -E "^\{|rror" "$OUT/q55_$shape.log" | sed -E "s/'[a-z_0-9]+_kernels': \{[^}]*\}, //g" | cut -c1-700
  done
}
for s in ${@:-t55}; do
  case "$s" in
    t55|q55) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session54.sh" "$s" ;;
  esac
done
