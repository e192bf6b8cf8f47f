#!/usr/bin/env bash
# Session 51 (2026-12-06).  Steps (carry [".whl"]):
#   t51:  GPU tests of this session's change -- W8A8's Mosaic decode route with the
#         per-token scale in the kernel's epilogue (wna16_mgpu.run_direct row_scale) and
#         fp8 e4m3 codes on it (test_decode_mgpu_gpu, test_decode_mgpu_fp16_gpu); the fp8-MMA
#         route whose row-scale plumbing it shares (test_dense_fp8_mma_gpu / _fold_gpu,
#         W4A8 / W4A4 decode: test_decode_gpu, which also runs W4A4 NVFP4 under session
#         50's one-tile rule), fp8 weights (test_fp8_weights_gpu).
#   w8d:  W8A8 int8 / fp8 at decode by CUPTI kernel time: Triton W8A8 (pre-pass), Triton
#         with the activation quantization fused, the Mosaic route (bench_w8a8.py
#         --decode-study), 8192^2, M = 1 / 16.  Switch w8a8.DECODE_MGPU_MAX_M to 16 where
#         the Mosaic route takes the least device time.
#   w8r:  after the switch: w8a8.run's decode route on the GPU (test_presets_gpu at M = 1,
#         int8 / fp8, per token and static) and bench_w8a8 int8 / fp8 at M = 1 / 16 with
#         kernel times and Humming's CUDA-graph replay in the same process.
#   pp:   the W8A8 decode's per-token codes from one launch (act_prepass.decode_codes_rows)
#         where XLA's pre-pass took three: GPU tests, then the A/B in one process.
#   cp, sub, nv, fin, t50: sessions/gpu_session50.sh's steps.
source "$(dirname "$0")/../gpu_env.sh"
s_t51() {
  gpu_tests ${ST:-300} "${T51K:-decode_mgpu or decode_gpu or dense_fp8_mma_gpu or dense_fp8_fold_gpu or fp8_weights_gpu}" \
    tests/test_w8a8_mgpu.py tests/test_wnam_mgpu.py tests/test_wna16_mgpu.py
}
s_w8d() {
  T ${WT:-330} python3 benchmarks/bench_w8a8.py --decode-study --kernel-times --ms ${MS:-1,16} \
    --calls 20 --repeats 2 --json "$OUT/w8d.json" > "$OUT/w8d.log" 2>&1
  echo "w8d rc=$?"
  grep -E "^\{|rror" "$OUT/w8d.log" | sed -E "s/'(triton|triton_fused|decode_mgpu)_kernels': \{[^}]*\}, //g" | cut -c1-420
}
s_w8r() {  # after the switch (DECODE_MGPU_MAX_M = 16): w8a8.run's own route at decode
  T ${ST:-200} python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA \
    -W ignore::DeprecationWarning -m gpu -s "tests/test_w8a8.py::test_presets_gpu[w8a8-int8-1]" \
    "tests/test_w8a8.py::test_presets_gpu[w8a8-fp8-1]" \
    "tests/test_w8a8.py::test_presets_gpu[w8a8-int8-static-1]" \
    "tests/test_w8a8.py::test_presets_gpu[w8a8-fp8-static-1]" > "$OUT/tests_w8r.log" 2>&1
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/tests_w8r.log" | tail -12
  T ${BT:-240} python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 1,16 \
    --kernel-times --humming --no-baselines --calls 20 --repeats 2 \
    --json "$OUT/w8r.json" > "$OUT/w8r.log" 2>&1
  echo "bench rc=$?"; grep -E "^\||kernels=|rror" "$OUT/w8r.log" | cut -c1-300 | tail -12
}
s_pp() {  # the one-launch decode codes (act_prepass.decode_codes_rows): GPU tests, then
  # the route with them against XLA's three-fusion pre-pass, one process
  [ -n "${NOTEST:-}" ] || gpu_tests ${ST:-200} "decode_codes_gpu or decode_mgpu_gpu" \
    tests/test_act_prepass.py tests/test_w8a8_mgpu.py
  T ${WT:-330} python3 benchmarks/bench_w8a8.py --decode-study --kernel-times --ms ${MS:-1,16} \
    --decode-labels ${LB:-triton,decode_mgpu,decode_mgpu_xla_prepass} --calls 20 --repeats 2 \
    --json "$OUT/pp.json" > "$OUT/pp.log" 2>&1
  echo "pp rc=$?"
  grep -E "^\{|rror" "$OUT/pp.log" | sed -E "s/'[a-z_]+_kernels': \{[^}]*\}, //g" | cut -c1-420
}
for s in ${@:-t51}; do
  case "$s" in
    t51|w8d|w8r|pp) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session50.sh" "$s" ;;
  esac
done
