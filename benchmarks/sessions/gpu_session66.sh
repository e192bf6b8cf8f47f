#!/usr/bin/env bash
# Session 66 (2026-12-07).  Steps (carry [".whl"]):
#   cv:  the converter warpgroup (w8a8_mgpu.Config.e2m1_converter): ptxas's report on one
#        compile of it (registers per setmaxnreg region, spills, warnings); its GPU tests beside
#        the other in-GEMM forms' (the conversion moved into convert_e2m1_chunk), the
#        route's prefill test with it on, then probe_e2m1_prefill.py at EMS (512,1024,4096)
#        for p8 / p8-e2m1-nab (the default) / p8-e2m1-cv with Humming.
#   t2:  (after call 1) the two-converter GPU cases and the shipped in-GEMM form's tests.
#   cv2: probe_e2m1_prefill.py at M = 1024 with two converters, the shipped form beside.
#   cvx: the converter's variants at M = 1024: other register counts (CV_REGS,
#        "40,96,184"), three B tiles, two converter warpgroups, both.
#   earlier steps: gpu_session65.sh (kt, moe, tables, and gpu_session64.sh's).
source "$(dirname "$0")/../gpu_env.sh"
s_cv() {
  # ptxas's word on the four warpgroups' setmaxnreg (512 threads start at 128 registers;
  # the MMA warpgroups hold a 128-register accumulator): registers, spills, warnings
  # C7508 (setmaxnreg ignored) / C7510 / C7602
  MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" \
    gpu_tests ${TT0:-90} "converter_gpu and None-1152-11-None-2-" tests/test_w8a8_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_cv_ptxas.log"
  grep -rhE "Used [0-9]+ registers|spill|C75|C76|warn" "$OUT/dump" "$OUT/tests_cv_ptxas.log" \
    2>/dev/null | sort | uniq -c | head -20
  grep -rhE "^\.(maxntid|reqntid|maxnreg|minnctapersm)|setmaxnreg" "$OUT/dump" 2>/dev/null \
    | sort | uniq -c | head; (cd "$OUT" && tar czf dump.tgz dump && rm -rf dump)
  gpu_tests ${TT:-200} "e2m1" tests/test_w8a8_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_cv.log"
  HUMMING_JAX_E2M1_CONVERTER=1 gpu_tests ${TT2:-120} "e2m1_mma_prefill_gpu" tests/test_wnam_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_cv_route.log"
  T ${APT:-260} python3 benchmarks/probe_e2m1_prefill.py --ms ${EMS:-512,1024,4096} --humming \
    --forms ${EFORMS:-p8,p8-e2m1-nab,p8-e2m1-cv} > "$OUT/cv.log" 2>&1
  echo "cv rc=$?"; grep -E "^M=|rror" "$OUT/cv.log" | cut -c1-300
}
s_t2() {  # after call 1: the two-converter cases (registers within the entry allocation now)
  # and the shipped form's in-GEMM tests (call 1's step limit cut them)
  gpu_tests ${TT3:-150} "converter_gpu and -2] or e2m1_gpu or fold_conversion_gpu" \
    tests/test_w8a8_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_t2.log"
}
s_cv2() {  # two converters (and the shipped form beside them) at M = 1024
  HUMMING_JAX_E2M1_CONVERTERS=2 T ${APT3:-120} python3 benchmarks/probe_e2m1_prefill.py \
    --ms ${EMS2:-1024} --forms p8-e2m1-nab,p8-e2m1-cv > "$OUT/cv2.log" 2>&1
  echo "cv2 rc=$?"; grep -E "^M=|rror" "$OUT/cv2.log" | cut -c1-250
}
s_cvx() {  # the converter's variants at M = 1024 (EMS2), each in its own process
  local v
  for v in "HUMMING_JAX_E2M1_REGS=${CV_REGS:-40,96,184}" HUMMING_JAX_E2M1_BTILES=3 \
           HUMMING_JAX_E2M1_CONVERTERS=2 "HUMMING_JAX_E2M1_CONVERTERS=2 HUMMING_JAX_E2M1_BTILES=3"; do
    env $v timeout -k 5 -s INT ${APT2:-100} python3 benchmarks/probe_e2m1_prefill.py \
      --ms ${EMS2:-1024} --forms p8-e2m1-cv >> "$OUT/cvx.log" 2>&1
    echo "cvx [$v] rc=$?"; grep -E "^M=|rror|Interrupt" "$OUT/cvx.log" | tail -1 | cut -c1-300
  done
}
for s in ${@:-cv}; do
  case "$s" in
    cv|cvx|t2|cv2) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session65.sh" "$s" ;;
  esac
done
