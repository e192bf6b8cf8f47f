#!/usr/bin/env bash
# Session 49 (2026-12-06).  Steps (each one call; carry [".whl"]):
#   moe2: bench_moe DeepSeek-V3 / Mixtral gate_up + down at 16 / 256 / 1024 tokens, int4
#         g128 zp, Humming in the same process (call 4; Qwen3 was gpu_session47.sh moe).
#   ld:   the GPU tests of this session's checkpoint loaders: every fixture's linears
#         (compressed-tensors MX formats among them) and the AutoFP8 / fbgemm FP8
#         checkpoints through quant_dense's GPU kernels against the XLA path.
#   w4a, f8, moe, ...: sessions/gpu_session48.sh's steps (calls 1-3 ran w4a, f8, moe).
source "$(dirname "$0")/../gpu_env.sh"
s_moe2() {
  T ${MT:-440} python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,deepseek-v3-down,mixtral-gate_up,mixtral-down \
    --tokens 16,256,1024 --specs w4a16-g128-zp $MOE --consume row --humming --no-baselines \
    --json "$OUT/moe_dm.json" > "$OUT/moe_dm.log" 2>&1
  echo "moe rc=$?"; grep -E "T=|^\|" "$OUT/moe_dm.log" | cut -c1-300 | tail -30
}
s_ld() {
  gpu_tests ${ST:-200} "gpu or pallas" tests/test_checkpoints.py tests/test_hf_fp8.py \
    tests/test_modelopt_mixed.py
}
for s in ${@:-ld}; do
  case "$s" in
    moe2|ld) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session48.sh" "$s" ;;
  esac
done
