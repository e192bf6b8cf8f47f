#!/usr/bin/env bash
# Session 56 (2026-12-06).  Steps (carry [".whl"]):
#   t56:  GPU tests of the decode product on mma.sync (kernels/mgpu_mma.py: the probe
#         kernel against w @ x.T; MgpuConfig.mma_sync against the WGMMA launch and the
#         reference) and session 55's final tree (quantize_x).
#   ms:   CUPTI kernel time per 8192^2 layer (profile_mgpu.py, 8 distinct layers per call),
#         the WGMMA launches against mma.sync ones, one process per spec.
#   q55, h8, p54, ...: the earlier sessions' steps (gpu_session55.sh).
source "$(dirname "$0")/../gpu_env.sh"
s_t56() {
  gpu_tests ${ST:-420} "${T56K:-mma_sync or quantize_x}" tests/test_mgpu_mma.py \
    tests/test_wna16_mgpu.py tests/test_w8a8_mgpu.py
}
MS_CONFIGS="default,bm8,bm8-ms,bm8-ms-ch1,bm8-ms-ch4,bm8-ms-sub1,bm8-ms-wg2-st6,bm16,bm16-ms"
s_ms() {
  local spec
  for spec in ${MSPECS:-w4a16-g128-zp w4a16-mxfp4 w4a16-nvfp4}; do
    T ${MT:-200} python3 benchmarks/profile_mgpu.py --spec $spec --ms ${MS:-1,16} \
      --configs ${MC:-$MS_CONFIGS} > "$OUT/ms_$spec.log" 2>&1
    echo "ms $spec rc=$?"; grep -E "^M=|rror" "$OUT/ms_$spec.log" | cut -c1-160
  done
}
# ms2 (call 2): one K tile per step on mma.sync, with the WGMMA's same launch beside it
s_ms2() {
  local line spec m cfgs
  for line in ${MS2:-"w4a16-g128-zp:1:default,bm8-sub1,bm8-ms-sub1,bm8-ms-sub1-st6,bm8-ms-sub1-wg8" \
      "w4a16-g128-zp:16:default,bm16-sub1,bm16-ms-sub1,bm16-ms" \
      "w4a16-mxfp4:1:default,bm8-sub1,bm8-ms-sub1" "w4a16-nvfp4:1:default,bm8,bm8-ms"}; do
    IFS=: read -r spec m cfgs <<< "$line"
    T ${MT:-150} python3 benchmarks/profile_mgpu.py --spec $spec --ms $m --configs $cfgs \
      > "$OUT/ms2_${spec}_m$m.log" 2>&1
    echo "ms2 $spec M=$m rc=$?"; grep -E "^M=|rror" "$OUT/ms2_${spec}_m$m.log" | cut -c1-160
  done
}
# fin (call 3): the new default (mma.sync at M <= 8 for int4 / uint4 / MXFP4) through its
# entry points on the GPU, then the default against the heuristic's old launch ("wg4": the
# heuristic as an explicit config) in one process per spec, and compile time.
FIN_TESTS="tests/test_mgpu_mma.py tests/test_wna16_mgpu.py::test_mma_sync_gpu"
for n in w4a16-g128-zp w4a16-g128 w4a16-mxfp4 w4a16-mxint4 w4a16-nvfp4; do
  FIN_TESTS+=" tests/test_wna16_mgpu.py::test_quant_dense_gpu[$n-1]"
done
for n in w4a8-int8 w4a8-mxfp4 w4a8-uint4-zp w4a4-nvfp4; do
  FIN_TESTS+=" tests/test_wnam_mgpu.py::test_decode_gpu[$n-1]"
done
s_fin() {
  T ${ST:-300} python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA \
    -W ignore::DeprecationWarning -m gpu -s $FIN_TESTS > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT/tests.log" | tail -12
  [ -n "${QX:-}" ] && gpu_tests 200 quantize_x tests/test_w8a8_mgpu.py
  MS2="w4a16-g128-zp:1:default,wg4 w4a16-mxfp4:1:default,wg4 w4a16-g128:1:default,wg4"
  MS2+=" w4a16-mxint4:1:default,wg4" s_ms2
  T ${HT:-150} python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 \
    --repeats 2 --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --ms 1 --humming \
    --no-baselines --json "$OUT/issue3_m1.json" > "$OUT/issue3_m1.log" 2>&1
  echo "issue3 M=1 rc=$?"; grep -E "^\||rror" "$OUT/issue3_m1.log" | tail -8 | cut -c1-220
  T 120 python3 benchmarks/probe_compile.py --specs w4a16-g128-zp,w4a16-mxfp4 --ms 1 \
    > "$OUT/compile.log" 2>&1; echo "compile rc=$?"; tail -4 "$OUT/compile.log" | cut -c1-200
}
for s in ${@:-t56}; do
  case "$s" in
    t56|ms|ms2|fin) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session55.sh" "$s" ;;
  esac
done
