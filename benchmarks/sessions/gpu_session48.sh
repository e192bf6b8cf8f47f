#!/usr/bin/env bash
# Session 48 (2026-12-06).  Steps (each one call, <= ~560 s; carry [".whl"]):
#   t48:  the GPU test of the static int8 NaN rule (session 47's audit; CPU-tested only),
#         decode and prefill routes.
#   n48:  the large-M WnA16 route with every scale folded into the bf16 weights (NVFP4's
#         global scale, column scales: the GEMM writes bf16, no float32 product and pass):
#         its GPU tests, then bench_dense NVFP4 / W8A16 at M = 1024 / 4096 with XLA and
#         Humming, and the same points on the previous commit carried as old/ (carry
#         [".whl", "old"]), one call.
#   lay:  probe_gemm_layout.py: cuBLAS ran another GEMM for int4's dequantized weights than
#         for MXFP4's at M = 4096 (H100, session 47: 688 vs 638 us); the route against
#         the same weights with their layout pinned, and XLA's x @ w.
#   mix:  probe_mixed_matmul.py: JAX's Mosaic mixed-type GEMM (int8 weights converted in
#         registers) at M = 4096 against cuBLAS -- is a fused prefill kernel worth
#         building; and whether XLA fuses a bias into a bf16-output cuBLAS GEMM.
#   fus:  probe_gemm_layout.py --fused: can XLA fuse the int4 dequantization into its own
#         GEMM at M = 1024 / 4096 (one einsum over the stored tiles; the ":pk" order undone
#         on the codes, on x's columns, or a K-order layout)?
#   w4a:  (built after the device time; not yet GPU-run) W4A4's large-M route writes bf16
#         (NVFP4's global scale folded into the weights): its GPU tests, then bench_dense
#         w4a4-nvfp4 / w4a4-mxfp4 at M = 1024 / 4096 on this tree and on old/ = the tree
#         before it (git archive a6b42d7 humming_jax benchmarks/bench_dense.py
#         benchmarks/common.py | tar -x -C old; carry [".whl", "old"]).
#   f8:   W8A8 fp8 at M = 4096 with Humming (cut from call 5's step by its limit), and
#         W8A8 int8 / fp8 decode (M = 1 / 16) kernel times (bench_w8a8 --kernel-times, new
#         after the device time: call 5's decode walls were host-bound, 41-46 us).
#   moe, s3, s4, s4b: sessions/gpu_session47.sh's steps (its queue: s3 / s4 on the H200).
source "$(dirname "$0")/../gpu_env.sh"
s_t48() {
  gpu_tests ${ST:-120} "static_int8_nan_gpu" tests/test_api.py
}
DENSE="python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 --repeats 2"
s_n48() {
  gpu_tests ${ST:-150} "(quant_dense_gpu and 1024) or dequant_gemm_output_gpu or static_int8_nan_gpu" \
    tests/test_wna16_mgpu.py tests/test_api.py
  T ${BT:-220} $DENSE --specs w4a16-nvfp4,w8a16 --ms 1024,4096 --humming \
    --json "$OUT/n48_new.json" > "$OUT/n48_new.log" 2>&1
  echo "new rc=$?"; grep -E "M=" "$OUT/n48_new.log" | cut -c1-250
  (cd old && PYTHONPATH=/tmp/site:. T ${OT:-120} $DENSE --specs w4a16-nvfp4,w8a16 --ms 4096 \
    --no-baselines --json "$OUT/n48_old.json" > "$OUT/n48_old.log" 2>&1)
  echo "old rc=$?"; grep -E "M=" "$OUT/n48_old.log" | cut -c1-250
}
s_lay() {
  T ${LT:-200} python3 benchmarks/probe_gemm_layout.py > "$OUT/layout.log" 2>&1
  echo "layout rc=$?"; cut -c1-300 "$OUT/layout.log"
}
s_mix() {
  T ${XT:-300} python3 benchmarks/probe_mixed_matmul.py > "$OUT/mixed.log" 2>&1
  echo "mixed rc=$?"; cut -c1-260 "$OUT/mixed.log"
}
s_fus() {
  T ${FT:-240} python3 benchmarks/probe_gemm_layout.py --fused --ms 1024,4096 > "$OUT/fused.log" 2>&1
  echo "fused rc=$?"; cut -c1-300 "$OUT/fused.log"
}
s_w4a() {
  gpu_tests ${ST:-150} "w4a4_large_m_route_gpu or prefill_exact_route_gpu" tests/test_wnam_mgpu.py
  T ${BT:-200} $DENSE --specs w4a4-nvfp4,w4a4-mxfp4 --ms 1024,4096 --humming \
    --json "$OUT/w4a_new.json" > "$OUT/w4a_new.log" 2>&1
  echo "new rc=$?"; grep -E "M=" "$OUT/w4a_new.log" | cut -c1-250
  (cd old && PYTHONPATH=/tmp/site:. T ${OT:-120} $DENSE --specs w4a4-nvfp4,w4a4-mxfp4 \
    --ms 1024,4096 --no-baselines --json "$OUT/w4a_old.json" > "$OUT/w4a_old.log" 2>&1)
  echo "old rc=$?"; grep -E "M=" "$OUT/w4a_old.log" | cut -c1-250
}
s_f8() {
  T ${WT:-300} python3 benchmarks/bench_w8a8.py --specs w8a8-fp8 --ms 4096 --humming \
    --json "$OUT/f8.json" > "$OUT/f8.log" 2>&1
  echo "f8 rc=$?"; grep -E "^M=" "$OUT/f8.log" | cut -c1-250
  T ${DT:-150} python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 1,16 \
    --kernel-times --no-baselines --json "$OUT/w8a8_decode.json" > "$OUT/w8a8_decode.log" 2>&1
  echo "decode rc=$?"; grep -E "^M=" "$OUT/w8a8_decode.log" | cut -c1-250
}
for s in ${@:-t48}; do
  case "$s" in
    t48|n48|lay|mix|fus|w4a|f8) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session47.sh" "$s" ;;
  esac
done
