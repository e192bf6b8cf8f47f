#!/usr/bin/env bash
# Session 65 (2026-12-07).  Steps (carry [".whl"]):
#   v64:    the in-GEMM MXFP4 GPU tests after da88d49 (the barrier switch on split_m; the
#           scale rows' widening per step body) -- gpu_session64.sh's step.
#   tables: the dense tables (gpu_session_tables.sh: 8192^2 ladder with Humming, Llama-3-8B
#           projections, the other A16 formats at decode).
#   moe:    W4A16 MoE beside Humming at 16 / 256 / 1024 tokens (int4 g128 zp; MOE_SPECS for
#           others, MOE_SHAPES / MOE_TOKENS for the points).
#   kt:     issue 3 / 4 decode by CUPTI kernel time beside Humming's graph replay (8192^2:
#           W4A16 int4 g128 zp / MXFP4 / NVFP4 at M = 1 / 16 / 128; W8A8 int8 / fp8 at 1 / 16).
#   earlier steps: gpu_session64.sh.
source "$(dirname "$0")/../gpu_env.sh"
s_kt() {
  T ${KT:-120} python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 \
    --ms ${KMS:-1,16,128} --kernel-times --humming --no-baselines --calls 20 --repeats 2 \
    --json "$OUT/kt.json" > "$OUT/kt.log" 2>&1
  echo "kt rc=$?"; grep -E "M=" "$OUT/kt.log" | cut -c1-230
  T ${KT8:-100} python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8 --ms 1,16 \
    --kernel-times --humming --no-baselines --calls 20 --repeats 2 > "$OUT/kt8.log" 2>&1
  echo "kt8 rc=$?"; grep -E "M=" "$OUT/kt8.log" | cut -c1-230
}
s_tables() { bash "$(dirname "$0")/gpu_session_tables.sh"; }
s_moe() {
  local shape
  for shape in ${MOE_SHAPES:-qwen3-30b-a3b-down,qwen3-30b-a3b-gate_up deepseek-v3-down,deepseek-v3-gate_up mixtral-down,mixtral-gate_up}; do
    T ${MT:-170} python3 benchmarks/bench_moe.py --shapes "$shape" --tokens ${MOE_TOKENS:-16,256,1024} \
      --specs ${MOE_SPECS:-w4a16-g128-zp} $MOE --consume row --humming --no-baselines \
      >> "$OUT/moe.log" 2>&1
    echo "moe $shape rc=$?"
  done
  grep -E "^\|" "$OUT/moe.log" | cut -c1-250
}
for s in ${@:-v64}; do
  case "$s" in
    tables|moe|kt) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session64.sh" "$s" ;;
  esac
done
