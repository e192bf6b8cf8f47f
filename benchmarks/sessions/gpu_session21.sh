#!/usr/bin/env bash
# Session 21's device calls (logs: benchmarks/results/2026-12-01-session21/callN).
#   call 1: gpu_session_next.sh verify dense8 (session 20's post-device builds).
#   call 2 (this: probe overlap moe): the dense fp8-MMA decode launch sweep
#     (probe_dense_fp8.py: call 1 measured ~18 us of kernel at 8192^2 M = 1 on the
#     heuristic's 64-row launch), then gpu_session_next.sh's overlap and moe steps.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_probe() {
  T 150 python3 benchmarks/probe_dense_fp8.py --shape 8192,8192 --ms 1,16 2>&1 | grep -v Warn | tail -30
  T 100 python3 benchmarks/probe_dense_fp8.py --shape 14336,4096 --ms 1 2>&1 | grep -v Warn | tail -15
}
# call 3 (moe128): launch shapes of the grouped fp8 route's wide tiles (probe_fp8_moe.py):
#   call 2 measured Mixtral gate_up W4A8 at 1024 tokens 7152 us (Humming 502): 128-row
#   tiles on four shared-x warpgroups.
s_moe128() {
  T 220 python3 benchmarks/probe_fp8_moe.py --shape 8,2,28672,4096 --tokens 256,1024 2>&1 | grep -v Warn | tail -4
  T 150 python3 benchmarks/probe_fp8_moe.py --shape 8,2,4096,14336 --tokens 1024 2>&1 | grep -v Warn | tail -4
  T 120 python3 benchmarks/probe_fp8_moe.py --shape 256,8,512,7168 --tokens 1024 2>&1 | grep -v Warn | tail -4
}
# call 4 (wide): the two-warpgroup rule for fp8 tiles over 80 rows, GPU-tested (the
#   128-row test) and timed on Mixtral at 1024 tokens with Humming.
s_wide() {
  T 120 python3 -m pytest -p no:cacheprovider -o addopts= -rA tests/test_grouped_wnam_mgpu.py \
    -m gpu -k "fp8_mma_gpu and 512" 2>&1 | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" | tail -5
  for shape in mixtral-gate_up mixtral-down; do
    T 110 python3 benchmarks/bench_moe.py --shapes $shape --tokens 1024 --specs w4a8-mxfp4 \
      --humming --no-baselines --chain resident --span --calls 10 --repeats 2 \
      --json "$OUT/moe_$shape.json" 2>&1 | grep -E "T=|rror" | cut -c1-300
  done
}
for s in ${@:-probe}; do
  if declare -f "s_$s" >/dev/null; then step "$s"; "s_$s" 2>&1 | tee "$OUT/$s.log"; else bash "$(dirname "$0")/../gpu_session_next.sh" "$s"; fi
done
step done
