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
for s in ${@:-t51}; do
  case "$s" in
    t51|w8d) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session50.sh" "$s" ;;
  esac
done
