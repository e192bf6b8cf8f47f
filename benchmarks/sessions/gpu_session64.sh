#!/usr/bin/env bash
# Session 64 (2026-12-07).  Steps (carry [".whl"]):
#   t64:  the in-GEMM MXFP4 GPU tests (test_w8a8_mgpu e2m1_gpu: the four forms, several
#         output tiles per CTA, K = 128; fold_shift 12 and no automatic barriers).
#   o64:  probe_e2m1_onestep.py: which side of the K = 128 mismatch is off, in which form.
#   a64:  probe_e2m1_prefill.py, CUPTI kernels per 8192^2 layer, Humming beside:
#         EMS=512,1024, EFORMS=p8,p8-e2m1-st4,p8-e2m1-f12,p8-e2m1-nab,p8-e2m1-f12-nab.
#   c64:  the conversion alone on the GPU (test_e2m1_fold_conversion_gpu: one chunk, column
#         maxima 2**-12 .. 2**13), the in-GEMM GPU tests (test_w8a8_mgpu, test_wnam_mgpu:
#         exact test maxima, no automatic barriers by default), then o64.
#   v64:  c64's tests alone (after the review: the shared tile's GPU cases without automatic
#         barriers, the own-tile / serial forms keeping them).
#   earlier steps: gpu_session63.sh (a63, k63, s63, and gpu_session62.sh's).
source "$(dirname "$0")/../gpu_env.sh"
s_t64() {
  gpu_tests ${TT:-240} "e2m1_gpu" tests/test_w8a8_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_t64.log"
}
s_o64() {
  PYTHONPATH=$PYTHONPATH:tests T ${OT:-150} python3 benchmarks/probe_e2m1_onestep.py \
    > "$OUT/o64.log" 2>&1
  echo "o64 rc=$?"; grep -E "^K=|rror" "$OUT/o64.log" | cut -c1-300
}
s_c64() {
  gpu_tests ${CT:-240} "fold_conversion_gpu or e2m1" tests/test_w8a8_mgpu.py \
    tests/test_wnam_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_c64.log"
  s_o64
}
s_v64() {
  gpu_tests ${CT:-240} "fold_conversion_gpu or e2m1" tests/test_w8a8_mgpu.py \
    tests/test_wnam_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_v64.log"
}
s_a64() {
  T ${APT:-330} python3 benchmarks/probe_e2m1_prefill.py --ms ${EMS:-512,1024} --humming \
    --forms ${EFORMS:-p8,p8-e2m1-st4,p8-e2m1-f12,p8-e2m1-nab,p8-e2m1-f12-nab} \
    > "$OUT/a64.log" 2>&1
  echo "a64 rc=$?"; grep -E "^M=|rror" "$OUT/a64.log" | cut -c1-300
}
for s in ${@:-t64}; do
  case "$s" in
    t64|o64|a64|c64|v64) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session63.sh" "$s" ;;
  esac
done
