#!/usr/bin/env bash
# Session 47 (2026-12-05) was lent no machine ("no new device machine is lent at present").
# Written then for the next device session, on the H200 (carry [".whl"]):
#   t46:  the GPU tests of session 46's post-device mends (the dx kernel under custom_jvp /
#         custom_vmap, its tangent the XLA reference's), never run on a GPU, and session
#         47's test_checkpoint_scan_grad_gpu (jax.checkpoint in a scan over prepared
#         layers on the default backend: the CPU interpreter cannot run it).
#   s3:   issue 3's standing table in one run: 8192^2, int4 g128 zp / MXFP4 / NVFP4 at
#         M = 1 / 16 / 128 / 4096, chain method, kernel times, Humming and XLA bf16 in the
#         same process, JSON + PNG (the README's table is a patchwork of sessions 12-46).
#   s4:   issue 4's in one run: W8A8 int8 / fp8 (bench_w8a8, Humming W8A8) and W4A8 MXFP4 /
#         int4 x fp8 (bench_dense, Humming W4A8 MXFP4) at M = 1 / 16 / 1024 / 4096.
# Each step is one call (<= ~560 s); run s3 and s4 with the same card, and say which.
source "$(dirname "$0")/../gpu_env.sh"
DENSE="python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 --repeats 2"
s_t46() {
  gpu_tests ${ST:-330} "grad_gpu or hessian_vector_product_gpu or dx_kernel_gpu or dx_gpu" \
    tests/test_autodiff.py tests/test_wna16_mgpu_dx.py
}
s_s3() {
  T ${BT:-540} $DENSE --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 --ms 1,16,128,4096 \
    --humming --plot --json "$OUT/issue3.json" > "$OUT/issue3.log" 2>&1
  echo "issue3 rc=$?"; grep -E "^\|" "$OUT/issue3.log" | tail -16
}
s_s4() {
  T ${WT:-260} python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 1,16,1024,4096 \
    --humming --json "$OUT/issue4_w8a8.json" > "$OUT/issue4_w8a8.log" 2>&1
  echo "w8a8 rc=$?"; grep -E "^\|" "$OUT/issue4_w8a8.log" | tail -10
  T ${BT:-280} $DENSE --specs w4a8-mxfp4,w4a8-fp8,w4a16-mxfp4 --ms 1,16,1024,4096 --humming \
    --json "$OUT/issue4_w4a8.json" > "$OUT/issue4_w4a8.log" 2>&1
  echo "w4a8 rc=$?"; grep -E "^\|" "$OUT/issue4_w4a8.log" | tail -14
}
# Session 47 ran t46 (call 1), s3 (call 2) and s4 (call 3) on an H100 (an H200 was asked
# for; results/2026-12-05-session47).  s4's W4A8 part was cut at 280 s before its last
# two points (w4a8-fp8 and w4a16-mxfp4 at M = 4096): s4b gives it a call of its own.
s_s4b() {
  T ${BT:-520} $DENSE --specs w4a8-mxfp4,w4a8-fp8,w4a16-mxfp4 --ms 1,16,1024,4096 --humming \
    --json "$OUT/issue4_w4a8.json" > "$OUT/issue4_w4a8.log" 2>&1
  echo "w4a8 rc=$?"; grep -E "^\|" "$OUT/issue4_w4a8.log" | tail -14
}
# moe: a same-run MoE sample with Humming (the call was refused in session 47).
s_moe() {
  T ${MT:-480} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down \
    --tokens 16,256,1024 --specs w4a16-g128-zp $MOE --consume row --humming --no-baselines \
    --json "$OUT/moe_qwen3.json" > "$OUT/moe_qwen3.log" 2>&1
  echo "moe rc=$?"; grep -E "T=|^\|" "$OUT/moe_qwen3.log" | cut -c1-300 | tail -14
}
for s in ${@:-t46}; do step "$s"; "s_$s"; done
