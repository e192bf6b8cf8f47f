#!/usr/bin/env bash
# Session 45 (2026-12-05): session 44's one call (sessions/gpu_session44.sh one: the dx
# kernel's GPU tests, then probe_grad's A/B of it on int4 8192^2 M = 1 / 16 / 128 and the
# Qwen3-30B-A3B MoE backward at 16 tokens), with this session's GPU test of a scanned
# model's prepared layer stack (tests/test_recipes.py, ~30 s) in the same test step.
# Carry [".whl"].  One call, <= ~560 s with ST=200.
source "$(dirname "$0")/../gpu_env.sh"
s_one() {
  gpu_tests ${ST:-240} "dx_gpu or grad_gpu or dx_kernel_gpu or gpu_scanned" \
    tests/test_wna16_mgpu_dx.py tests/test_autodiff.py tests/test_recipes.py
  T 130 python3 benchmarks/probe_grad.py --ms 1,16,128 --spec w4a16-g128-zp \
    >> "$OUT/d45.log" 2>&1
  echo "dense int4 rc=$?"
  T 150 python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16 >> "$OUT/d45.log" 2>&1
  echo "moe rc=$?"
  grep -vE "Warning|warn" "$OUT/d45.log" | grep -E "M=|MoE|moe_grad|dx_|grad" | tail -30
}
for s in ${@:-one}; do step "$s"; "s_$s"; done
