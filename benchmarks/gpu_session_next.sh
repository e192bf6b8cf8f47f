#!/usr/bin/env bash
# The next device calls, prepared 2026-12-03 at the end of session 36 (its calls:
# benchmarks/results/2026-12-03-session36, script gpu_session36.sh); it replaces the queue
# prepared after session 22 (in git history).  Every bench_moe step times with --consume
# row (NOTES_moe.md session 36) and Humming in the same process.  Carry: [".whl"].
#   gu:  DeepSeek-V3 gate_up (E 256, K 7168, N 512) at 128 / 256 / 512 tokens.  Session 36
#        measured 323.7 us at 256 tokens against 285.7 at 1024 (Humming 179.2 / 239.1): at
#        256 tokens the tiles are 16 rows and the launch four shared-x warpgroups (xn4,
#        256 columns per CTA), never timed against the decode launch there.  Candidates
#        (all lower for the H200, checked on the CPU): the 64-token launch (two
#        warpgroups splitting K, two stages), one warpgroup over K, two shared-x
#        warpgroups, 32-row tiles on their default launch, 24-row tiles (16-row ones
#        split 11 % of the experts there: expected_tiles) on the 64-token launch.  MXFP4
#        at 256 tokens too.
#   q3:  Qwen3-30B-A3B down (K 768) at 256 tokens: one warpgroup streaming 2 / 4 / 8
#        column blocks (sessions 35-36: wg1-cb4 -9 % twice; the streamed rule stops at
#        K 256 and its waves bound would give 2 blocks there).
#   bd:  where a 1-token grouped GEMM's time goes, per kernel (bench_moe --breakdown, now
#        from a profiler trace: CUPTI aborted in session 36), DeepSeek-V3 / Qwen3 down.
# Usage: gpu_session_next.sh [STEP...]  (default: gu q3 bd).
source "$(dirname "$0")/gpu_env.sh"
ROW="$MOE --consume row --humming --no-baselines"
GU="w4a16-g128-zp@mgpu:wg2-st2-sub2-xk-ovl-unpad,w4a16-g128-zp@mgpu:wg1-st4-sub2-xk-ovl-unpad"
GU="w4a16-g128-zp,$GU,w4a16-g128-zp@mgpu:wg2-xn,w4a16-g128-zp@mgpu:rows32"
GU="$GU,w4a16-g128-zp@mgpu:rows24-wg2-st2-sub2-xk-ovl-unpad"
s_gu() {
  T ${ST:-330} python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up \
    --tokens ${TOK:-256,128,512} --specs ${SPECS:-$GU} $ROW --json "$OUT/gu.json" \
    > "$OUT/gu.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/gu.log" | cut -c1-2500
  T ${ST:-150} python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 256 \
    --specs "${MX_SPECS:-${GU//g128-zp/mxfp4}}" $ROW --json "$OUT/gu_mxfp4.json" > "$OUT/gu_mxfp4.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/gu_mxfp4.log" | cut -c1-2500
}
s_q3() {
  T ${ST:-200} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 256 \
    --specs w4a16-g128-zp,w4a16-g128-zp@mgpu:wg1-cb2,w4a16-g128-zp@mgpu:wg1-cb4,w4a16-g128-zp@mgpu:wg1-cb8 \
    $ROW --json "$OUT/q3.json" > "$OUT/q3.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/q3.log" | cut -c1-2500
}
s_bd() {
  T ${ST:-200} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down,qwen3-30b-a3b-down \
    --tokens 1 --specs w4a16-g128-zp $ROW --breakdown --json "$OUT/bd.json" > "$OUT/bd.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror|hj_kernels" "$OUT/bd.log" | cut -c1-2500
}
for s in ${@:-gu q3 bd}; do step "$s"; "s_$s"; done
step done
