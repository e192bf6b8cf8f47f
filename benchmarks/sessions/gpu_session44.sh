#!/usr/bin/env bash
# Session 44 (2026-12-05): the device came back for at most one call, so session 43's two
# calls (gpu_session43.sh t43, d43) are folded into one that stays under ~560 s: the dx
# kernel's GPU tests, then its A/B against the XLA route on the dense int4 g128 zp layer
# (8192^2, M = 1 / 16 / 128) and the Qwen3-30B-A3B MoE backward at 16 tokens.  The MXFP4
# dense rows, 256 tokens and the W4A8 ':p8' MoE row stay in gpu_session43.sh d43.
# Carry [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
s_one() {
  gpu_tests ${ST:-240} "dx_gpu or grad_gpu or dx_kernel_gpu" tests/test_wna16_mgpu_dx.py \
    tests/test_autodiff.py
  T 130 python3 benchmarks/probe_grad.py --ms 1,16,128 --spec w4a16-g128-zp \
    >> "$OUT/d44.log" 2>&1
  echo "dense int4 rc=$?"
  T 150 python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16 >> "$OUT/d44.log" 2>&1
  echo "moe rc=$?"
  grep -vE "Warning|warn" "$OUT/d44.log" | grep -E "M=|MoE|moe_grad|dx_|grad" | tail -30
}
for s in ${@:-one}; do step "$s"; "s_$s"; done
