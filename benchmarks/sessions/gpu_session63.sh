#!/usr/bin/env bash
# Session 63 (2026-12-07).  Steps (carry [".whl"]):
#   a63:  the in-GEMM W4A8 MXFP4 GPU tests (test_w8a8_mgpu, test_wnam_mgpu), then
#         probe_e2m1_prefill.py (CUPTI kernels per 8192^2 layer, one process, Humming W4A8
#         MXFP4 beside).  EMS=512,1024,4096, EFORMS=p8,p8-e2m1-st4.  (Call 1 ran it with
#         the form p8-e2m1-ahead, w8a8_mgpu.Config.e2m1_mma_ahead: slower, reverted.)
#   k63:  the 8-bit GEMM's tests with several output tiles per CTA (test_w8a8_mgpu
#         tiles_per_cta, e2m1_gpu), then probe_multitile_k.py: fp8 operands and the in-GEMM
#         default form at K = 128, 256, 1152, several output tiles per CTA against one per
#         CTA and the float product (call 1: the since-reverted ahead form at K = 128 on 5
#         CTAs differed from the fp8 GEMM in 1.9 % of outputs).
#   s63:  per-SASS stall samples of the in-GEMM GEMM (default form) at M = 1024
#         (gpu_session62.sh s62), logs renamed s63*.
#   e62, n62, s62, and the earlier sessions' steps: gpu_session62.sh.
source "$(dirname "$0")/../gpu_env.sh"
s_a63() {
  gpu_tests ${AT:-200} "e2m1" tests/test_w8a8_mgpu.py tests/test_wnam_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_a63.log"
  T ${APT:-330} python3 benchmarks/probe_e2m1_prefill.py --ms ${EMS:-512,1024,4096} --humming \
    --forms ${EFORMS:-p8,p8-e2m1-st4} > "$OUT/a63.log" 2>&1
  echo "a63 rc=$?"; grep -E "^M=|rror" "$OUT/a63.log" | cut -c1-400
}
s_k63() {
  gpu_tests ${KTT:-150} "tiles_per_cta or e2m1_gpu" tests/test_w8a8_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_k63.log"
  T ${KT:-150} python3 benchmarks/probe_multitile_k.py --ks ${KS:-128,256,1152} > "$OUT/k63.log" 2>&1
  echo "k63 rc=$?"; grep -E "^K=|rror" "$OUT/k63.log" | cut -c1-300
}
s_s63() {
  bash "$(dirname "$0")/gpu_session62.sh" s62
  for f in s62.log s62_src.csv s62_src.err s62_top.log; do
    [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/s63${f#s62}"
  done
  rm -f "$OUT/s62.ncu-rep"
}
for s in ${@:-k63}; do
  case "$s" in
    a63|k63|s63) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session62.sh" "$s" ;;
  esac
done
