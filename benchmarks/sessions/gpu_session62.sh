#!/usr/bin/env bash
# Session 62 (2026-12-07).  Steps (carry [".whl"]):
#   e62:  the W4A8 MXFP4 prefill converting its codes inside the 8-bit GEMM, session 62's
#         forms: its GPU test (the default form: overlap + the shared B tile), then
#         probe_e2m1_prefill.py (CUPTI kernels per 8192^2 layer, one process; Humming
#         W4A8 MXFP4 beside).  EMS=512,1024,4096, EFORMS=p8,p8-e2m1-st4,p8-e2m1 (the
#         four-stage default, then three stages).
#   n62:  Nsight Compute on that GEMM at M = 1024 (probe_ncu.py --case e2m1): issue
#         slots, warp stall reasons, pipe use.  NFORM=shared|own.
#   s62:  the same GEMM's stall samples per SASS instruction (ncu SourceCounters, the
#         source page as CSV, benchmarks/ncu_top_stalls.py): which waits cost the time.
#   e60, r60 and the earlier sessions' steps: gpu_session60.sh.
source "$(dirname "$0")/../gpu_env.sh"
s_e62() {
  gpu_tests ${ET:-150} "e2m1" tests/test_wnam_mgpu.py; mv "$OUT/tests.log" "$OUT/tests_e62.log"
  T ${EPT:-320} python3 benchmarks/probe_e2m1_prefill.py --ms ${EMS:-512,1024,4096} --humming \
    --forms ${EFORMS:-p8,p8-e2m1-st4,p8-e2m1} > "$OUT/e62.log" 2>&1
  echo "e62 rc=$?"; grep -E "^M=|rror" "$OUT/e62.log" | cut -c1-400
}
s_n62() {
  command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
  local shared=1; [ "${NFORM:-shared}" = own ] && shared=0
  XLA_PYTHON_CLIENT_PREALLOCATE=false HUMMING_JAX_E2M1_SHARED=$shared T ${NT:-120} \
    ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy \
    python3 benchmarks/probe_ncu.py --case e2m1 --spec w4a8-mxfp4 --m ${NM:-1024} \
    > "$OUT/n62.log" 2>&1
  echo "n62 rc=$?"; grep -E "probe_ncu|Duration|Throughput|Issue Slots|Issued Ipc|No Eligible|Eligible Warps|Stall|Pipe|Registers|==ERR|==WARN" \
    "$OUT/n62.log" | cut -c1-160 | head -40
}
s_s62() {  # per-SASS-instruction stall samples of the same GEMM (ncu source page)
  command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
  XLA_PYTHON_CLIENT_PREALLOCATE=false T ${NT:-150} ncu --clock-control none \
    --kernel-name regex:mosaic_gpu --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -f -o "$OUT/s62" \
    python3 benchmarks/probe_ncu.py --case e2m1 --spec w4a8-mxfp4 --m ${NM:-1024} \
    > "$OUT/s62.log" 2>&1
  echo "s62 rc=$?"; tail -3 "$OUT/s62.log"
  ncu --import "$OUT/s62.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/s62_src.csv" 2> "$OUT/s62_src.err"
  echo "source page rc=$? $(wc -c < "$OUT/s62_src.csv") bytes"; head -c 300 "$OUT/s62_src.err"
  python3 benchmarks/ncu_top_stalls.py "$OUT/s62_src.csv" --top 40 > "$OUT/s62_top.log" 2>&1
  cut -c1-250 "$OUT/s62_top.log" | head -45
}
for s in ${@:-e62}; do
  case "$s" in
    e62|n62|s62) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session60.sh" "$s" ;;
  esac
done
