#!/usr/bin/env bash
# Session 46 (2026-12-05).  Carry [".whl"] (pp: [".whl", "old"]).
#   pp:   with benchmarks/sessions/session42_queued.patch applied to the working tree (the
#         decode pre-pass kernel's single reduction; the grouped 16-bit route on it) and
#         old/ = this commit unpatched (git archive HEAD humming_jax benchmarks | tar -x -C
#         old): the patch's GPU tests (session 42's t42b), the W4A8 decode kernels by name
#         on both trees in one call (probe_w4a8_decode.py, M = 1 / 16), then W4A8 at
#         M = 4096 on the ":pk" layout (session 42's w42p, never timed: cut by its limit).
#   one:  the dx kernel (opt-in HUMMING_JAX_DX_KERNEL=1) on the H200: its GPU tests with
#         the float32 oracle, probe_grad's A/B at M = 1 / 16 (no relayout row: one compile
#         fewer), and the Qwen3-30B-A3B MoE backward at 16 tokens (one compile fewer too).
source "$(dirname "$0")/../gpu_env.sh"
DENSE="python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 --repeats 2 --no-baselines"
s_pp() {
  gpu_tests ${ST:-150} "one_pass_gpu or fake_quant_gpu or (deepseek_gate_up_gpu and int8) or (decode_gpu and w4a8-int8)" \
    tests/test_act_prepass.py tests/test_grouped_wnam_mgpu.py tests/test_wnam_mgpu.py
  local specs=w4a8-fp8,w4a8-mxfp4,w4a16-g128
  T 100 python3 benchmarks/probe_w4a8_decode.py --specs $specs --ms 1,16 > "$OUT/pp_new.log" 2>&1
  echo "patched rc=$?"; grep -E "^#|M=" "$OUT/pp_new.log" | cut -c1-400
  (cd old && T 100 python3 benchmarks/probe_w4a8_decode.py --specs $specs --ms 1,16) \
    > "$OUT/pp_old.log" 2>&1
  echo "unpatched rc=$?"; grep -E "M=" "$OUT/pp_old.log" | cut -c1-400
  T ${WT:-130} $DENSE --specs w4a8-mxfp4,w4a8-fp8 --ms 4096 --json "$OUT/w4096.json" \
    > "$OUT/w4096.log" 2>&1
  echo "M=4096 rc=$?"; grep -E "M=|T=" "$OUT/w4096.log" | tail -6
}
s_one() {
  gpu_tests ${ST:-170} "dx_gpu or dx_kernel_gpu" tests/test_wna16_mgpu_dx.py
  T ${GT:-200} python3 benchmarks/probe_grad.py --ms 1,16 --spec w4a16-g128-zp --no-relayout \
    > "$OUT/dense.log" 2>&1
  echo "dense rc=$?"; grep -E "^M=" "$OUT/dense.log"
  T ${MT:-170} python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16 > "$OUT/moe.log" 2>&1
  echo "moe rc=$?"; grep -E "MoE|tokens=" "$OUT/moe.log" | tail -8
}
# Call 3 (after call 2: the dx tests all pass on the H200, M = 1 included; dense M = 1 / 16
# timed; the MoE step was cut at 170 s while tracing the kernel route, each route's trace
# and compile being ~1 min):
#   two:  probe_grad at M = 128 (the dense kernel's largest M) and the MoE backward alone.
s_two() {
  T ${GT:-150} python3 benchmarks/probe_grad.py --ms 128 --spec w4a16-g128-zp --no-relayout \
    > "$OUT/dense128.log" 2>&1
  echo "dense rc=$?"; grep -E "^M=" "$OUT/dense128.log"
  T ${MT:-320} python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16 > "$OUT/moe.log" 2>&1
  echo "moe rc=$?"; grep -E "MoE|tokens=" "$OUT/moe.log" | tail -8
}
# Call 4 (after call 3: at M = 128 the dense dx kernel ties XLA's route and the step
# loses; the MoE dx with the kernel was 1.17e-2 from the XLA route's, past the probe's
# 1e-2 assert): the dx kernel on by default for dense M <= 16, forward over reverse
# through the kernels (their JVPs); the GPU tests of both, dense M = 32 / 64 (where the
# default cut could go: one row tile), and the MoE gradient of both routes against a
# float32 layer (which side is off).
s_three() {
  gpu_tests ${ST:-110} "grad_gpu or hessian_vector_product_gpu or dx_kernel_gpu" \
    tests/test_autodiff.py tests/test_wna16_mgpu_dx.py
  T ${GT:-120} python3 benchmarks/probe_grad.py --ms 32,64 --spec w4a16-g128-zp --no-relayout \
    > "$OUT/dense64.log" 2>&1
  echo "dense rc=$?"; grep -E "^M=" "$OUT/dense64.log"
}
# (a refused start cost 211 s of budget before call 4: the MoE part became its own step)
s_moe() {
  T ${MT:-260} python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16 > "$OUT/moe.log" 2>&1
  echo "moe rc=$?"; grep -E "MoE|tokens=" "$OUT/moe.log" | tail -8
}
for s in ${@:-one}; do step "$s"; "s_$s"; done
