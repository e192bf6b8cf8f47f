#!/usr/bin/env bash
# Session 59 (2026-12-07).  Steps (carry [".whl"]):
#   t59:  GPU tests of the one-token in-kernel activation quantization that converts the
#         row once per warpgroup (wna16_mgpu.resident_x_enabled): W4A8's fake_quantize_x
#         (test_fake_quantize_x_gpu, the mma.sync launch's), W8A8's quantize_x and the
#         W4A8 / W8A8 / W4A4 decode routes.
#   w59:  CUPTI kernel time per layer at M = 1 (probe_w4a8_decode --variants
#         qx1+rx1,qx1+rx0,qx0+rx0: the row converted once / every x tile / the pre-pass, one
#         process) for W4A8 and W8A8 specs; W4A16 of the same weights beside (A16).
#         W59="KxN:specs ..." (default 8192x8192).
#   h8:   bench_w8a8 at M = 1, 16 with Humming (gpu_session52.sh).
#   t58, w58, p58 and the earlier sessions' steps: gpu_session58.sh.
source "$(dirname "$0")/../gpu_env.sh"
s_t59() {  # (RX=0: the per-tile form)
  HUMMING_JAX_RESIDENT_X=${RX:-1} gpu_tests ${ST:-300} "${T59K:-fake_quantize_x_gpu or fake_quantize_x_mma_sync_gpu or decode_gpu or quantize_x_gpu}" \
    tests/test_wnam_mgpu.py tests/test_w8a8_mgpu.py
}
s_w59() {
  local line
  for line in ${W59:-8192x8192:w4a8-int8,w4a8-fp8,w4a8-mxfp4,w8a8-int8,w8a8-fp8}; do
    IFS=:x read -r k n specs <<< "$line"
    T ${WT:-200} python3 benchmarks/probe_w4a8_decode.py --specs $specs --ms ${WMS:-1} \
      --k $k --n $n --variants qx1+rx1,qx1+rx0,qx0+rx0 > "$OUT/w59_${k}x$n.log" 2>&1
    echo "w59 ${k}x$n rc=$?"; grep -E "kernels|rror" "$OUT/w59_${k}x$n.log" | cut -c1-300
    T ${WT:-200} python3 benchmarks/probe_w4a8_decode.py --specs ${A16:-w4a16-g128,w4a16-mxfp4} \
      --ms ${WMS:-1} --k $k --n $n > "$OUT/w59a_${k}x$n.log" 2>&1
    echo "w59a ${k}x$n rc=$?"; grep -E "kernels|rror" "$OUT/w59a_${k}x$n.log" | cut -c1-300
  done
}
for s in ${@:-t59}; do
  case "$s" in
    t59|w59) step "$s"; "s_$s" ;;
    h8) bash "$(dirname "$0")/gpu_session52.sh" "$s" ;;
    *) bash "$(dirname "$0")/gpu_session58.sh" "$s" ;;
  esac
done
