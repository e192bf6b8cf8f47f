#!/usr/bin/env bash
# Session 60 (2026-12-07).  Steps (carry [".whl"]):
#   r60:  8-row expert tiles past one token (tile_rows gives 16-row tiles from 16 tokens
#         on, on the WGMMA; 8-row ones take mma.sync): bench_moe per grouped GEMM,
#         one process per shape, the default / @mgpu:rows8 / @mgpu:rows8-noms, Humming
#         beside.  R60="shape ..." (default the four small-expert shapes), RTOK=16,64.
#   e60:  the W4A8 MXFP4 prefill converting its codes inside the 8-bit GEMM
#         (w8a8_mgpu.E2M1Weights, wnam_mgpu.run_prefill_e2m1_mma): its GPU test, then
#         probe_e2m1_prefill.py (CUPTI kernels per 8192^2 layer, ":pk" unpack / ":p8"
#         unpack / ":p8" in-GEMM, one process; Humming W4A8 MXFP4 beside).  EMS=1024,4096,
#         EFORMS=pk,p8,p8-e2m1 (session 61: the 128-byte form with EFORMS=p8,p8-e2m1).
#   t59, w59, h8 and the earlier sessions' steps: gpu_session59.sh.
source "$(dirname "$0")/../gpu_env.sh"
R60_SHAPES="qwen3-30b-a3b-down deepseek-v3-down qwen3-30b-a3b-gate_up deepseek-v3-gate_up"
s_r60() {
  local shape spec=${RS:-w4a16-g128-zp}
  for shape in ${R60:-$R60_SHAPES}; do
    T ${RT:-150} python3 benchmarks/bench_moe.py --shapes $shape --tokens ${RTOK:-16,64} \
      --specs "$spec,$spec@mgpu:rows8,$spec@mgpu:rows8-noms" $MOE --consume row --humming \
      --no-baselines --json "$OUT/r60_$shape.json" > "$OUT/r60_$shape.log" 2>&1
    echo "r60 $shape rc=$?"; grep -E "T=|rror" "$OUT/r60_$shape.log" | cut -c1-700
  done
}
s_e60() {
  gpu_tests ${ET:-150} "e2m1" tests/test_wnam_mgpu.py; mv "$OUT/tests.log" "$OUT/tests_e60.log"
  T ${EPT:-240} python3 benchmarks/probe_e2m1_prefill.py --ms ${EMS:-1024,4096} --humming \
    --forms ${EFORMS:-pk,p8,p8-e2m1} \
    > "$OUT/e60.log" 2>&1
  echo "e60 rc=$?"; grep -E "^M=|layout|rror" "$OUT/e60.log" | cut -c1-400
}
for s in ${@:-r60}; do
  case "$s" in
    r60|e60) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session59.sh" "$s" ;;
  esac
done
