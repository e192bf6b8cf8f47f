#!/usr/bin/env bash
# Session 63 (2026-12-07).  Steps (carry [".whl"]):
#   a63:  the W4A8 MXFP4 prefill's in-GEMM conversion with each step's WGMMA issued before
#         the previous one is waited for (w8a8_mgpu.Config.e2m1_mma_ahead, the shared-tile
#         form's "free" barriers): the in-GEMM GPU tests (test_w8a8_mgpu, test_wnam_mgpu),
#         then probe_e2m1_prefill.py (CUPTI kernels per 8192^2 layer, one process, Humming
#         W4A8 MXFP4 beside).  EMS=512,1024,4096, EFORMS=p8,p8-e2m1-st4,p8-e2m1-ahead.
#   s63:  per-SASS stall samples of the in-GEMM GEMM at M = 1024 (gpu_session62.sh s62)
#         for each HUMMING_JAX_E2M1_AHEAD value in S63 (default "1": the ahead form;
#         "0 1": the four-stage default too), logs s63_ahead<v>*.
#   k63:  probe_multitile_k.py: the 8-bit GEMM (fp8 operands, the in-GEMM forms) at
#         K = 128, 256, 1152 with several output tiles per CTA against one per CTA and the
#         exact product (call 1: the ahead form at K = 128 differed from the fp8 GEMM).
#   e62, n62, s62, and the earlier sessions' steps: gpu_session62.sh.
source "$(dirname "$0")/../gpu_env.sh"
s_a63() {
  gpu_tests ${AT:-200} "e2m1" tests/test_w8a8_mgpu.py tests/test_wnam_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_a63.log"
  T ${APT:-330} python3 benchmarks/probe_e2m1_prefill.py --ms ${EMS:-512,1024,4096} --humming \
    --forms ${EFORMS:-p8,p8-e2m1-st4,p8-e2m1-ahead} > "$OUT/a63.log" 2>&1
  echo "a63 rc=$?"; grep -E "^M=|rror" "$OUT/a63.log" | cut -c1-400
}
s_s63() {
  local here; here="$(dirname "$0")"
  for ahead in ${S63:-1}; do
    HUMMING_JAX_E2M1_AHEAD=$ahead bash "$here/gpu_session62.sh" s62
    for f in s62.log s62_src.csv s62_src.err s62_top.log; do
      [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/s63_ahead${ahead}${f#s62}"
    done
    rm -f "$OUT/s62.ncu-rep"
  done
}
s_k63() {  # the 8-bit GEMM at few K steps, several output tiles per CTA (call 1's failure)
  T ${KT:-150} python3 benchmarks/probe_multitile_k.py --ks ${KS:-128,256,1152} > "$OUT/k63.log" 2>&1
  echo "k63 rc=$?"; grep -E "^K=|rror" "$OUT/k63.log" | cut -c1-300
}
for s in ${@:-a63}; do
  case "$s" in
    a63|s63|k63) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session62.sh" "$s" ;;
  esac
done
