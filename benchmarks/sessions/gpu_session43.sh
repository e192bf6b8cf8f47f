#!/usr/bin/env bash
# Session 43 (2026-12-05, no device lent): the backward's dy . W^T kernel
# (kernels/wna16_mgpu_dx.py, opt-in HUMMING_JAX_DX_KERNEL=1), dense and grouped.  Never run
# on a GPU: CPU interpreter tests and H200 lowering (Triton IR) only.  Carry [".whl"].
#   t43:  its GPU tests: dense 8192^2 (int4 g128 zp, MXFP4, NVFP4, int8, fp8; M = 1 / 16 /
#         128) and grouped Qwen3-30B-A3B gate_up (1 / 16 / 256 tokens) against the XLA route.
#   d43:  probe_grad.py, int4 g128 zp and MXFP4 8192^2, M = 1 / 16 / 128: dx_xla (session
#         41: ~120 us at M = 16) against dx_kernel (predicted 15-25 us: 33 MB of codes at
#         ~3 TB/s, ~8 integer / float ops per code), and a training step's grad against
#         grad_dxk; then the Qwen3-30B-A3B quant_moe layer at 16 / 256 tokens: moe_grad
#         (13.7 ms at 16 tokens) against moe_grad_dxk; W4A8 MXFP4 experts (":p8") at 16.
# Two calls: t43 (~250 s), then d43 (up to ~560 s: each step under its own timeout).
# If the kernel wins at every M it was timed at: flip the default (applies()) for those M,
# and record the numbers in benchmarks/NOTES.md.
source "$(dirname "$0")/../gpu_env.sh"
s_t43() {
  gpu_tests ${ST:-300} "dx_gpu or grad_gpu or dx_kernel_gpu" tests/test_wna16_mgpu_dx.py \
    tests/test_autodiff.py
}
s_d43() {
  local spec
  for spec in w4a16-g128-zp w4a16-mxfp4; do
    T ${ST:-150} python3 benchmarks/probe_grad.py --ms 1,16,128 --spec $spec \
      >> "$OUT/d43.log" 2>&1
    echo "$spec rc=$?"
  done
  T ${ST:-200} python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16,256 \
    >> "$OUT/d43.log" 2>&1
  echo "moe rc=$?"
  T ${ST:-120} python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16 --spec w4a8-mxfp4 \
    >> "$OUT/d43.log" 2>&1
  echo "moe w4a8-mxfp4 (':p8') rc=$?"
  grep -vE "Warning|warn" "$OUT/d43.log" | grep -E "M=|MoE|moe_grad" | tail -30
}
for s in ${@:-t43 d43}; do step "$s"; "s_$s"; done
