#!/usr/bin/env bash
# Session 36 device calls (2026-12-03; every log to $OUT; carry [".whl"]):
#   `tests`: session 35's untimed GPU tests of MgpuConfig.column_blocks (default launch
#            shape, 2 / 4 / 7 blocks against one; four shared-x and two K-split warpgroups)
#   `bd`:    where a 1-token grouped GEMM's time goes (CUPTI per kernel, --breakdown, as
#            bench_moe did then: it aborted, "activity records were dropped") at
#            DeepSeek-V3 down and Qwen3-30B-A3B down, with the wall / span and Humming
#   `q3`:    Qwen3-30B-A3B down (K 768) at 16 / 64 / 256 tokens: default against
#            cb4 / cb8 / wg1-cb4 / wg1-cb8 (the streamed rule stops at K 256)
#   `mx`:    DeepSeek-V3 down MXFP4 at 64 / 256 tokens: default (8 blocks) against cb4
#   `consume`: the resident chain reading each output in full (the sum, as before) against
#            its first row only (--consume row: the kernel without a full read of its
#            output), int4 g128 zp, default launch; Humming in the sum runs only
#   call 4 (inline): bench_moe --consume row --humming at DeepSeek-V3 / Qwen3-30B-A3B
#            gate_up, Qwen3-30B-A3B down, Mixtral down / gate_up, 16 / 256 / 1024 tokens
source "$(dirname "$0")/../gpu_env.sh"
s_tests() {
  gpu_tests ${TT:-300} "${EXPR:-column_blocks_gpu or column_blocks_warpgroups_gpu}" \
    tests/test_grouped_wna16_mgpu.py
}
s_bd() {
  T ${ST:-200} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down,qwen3-30b-a3b-down \
    --tokens 1 --specs w4a16-g128-zp $MOE --breakdown --humming --no-baselines \
    --json "$OUT/bd.json" > "$OUT/bd.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror|hj_kernels" "$OUT/bd.log" | cut -c1-2500
}
s_q3() {
  T ${ST:-330} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens ${TOK:-16,64,256} \
    --specs ${SPECS:-w4a16-g128-zp,w4a16-g128-zp@mgpu:cb4,w4a16-g128-zp@mgpu:cb8,w4a16-g128-zp@mgpu:wg1-cb4,w4a16-g128-zp@mgpu:wg1-cb8} \
    $MOE --humming --no-baselines --json "$OUT/q3.json" > "$OUT/q3.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/q3.log" | cut -c1-2500
}
s_mx() {
  T ${ST:-200} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens ${TOK:-64,256} \
    --specs ${SPECS:-w4a16-mxfp4,w4a16-mxfp4@mgpu:cb4} \
    $MOE --humming --no-baselines --json "$OUT/mx.json" > "$OUT/mx.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/mx.log" | cut -c1-2500
}
s_consume() {
  local c pt
  for pt in ${PTS:-deepseek-v3-down:1,256,1024,4096 mixtral-gate_up:1024 qwen3-30b-a3b-gate_up:4096}; do
    for c in sum row; do
      T ${ST:-200} python3 benchmarks/bench_moe.py --shapes ${pt%%:*} --tokens ${pt##*:} \
        --specs w4a16-g128-zp $MOE --consume $c $([ $c = sum ] && echo --humming) \
        --no-baselines --json "$OUT/consume_${pt%%:*}_$c.json" >> "$OUT/consume.log" 2>&1
      echo "== ${pt%%:*} consume=$c rc=$?" | tee -a "$OUT/consume.log"
    done
  done
  grep -E "^== |T=|rror" "$OUT/consume.log" | cut -c1-400
}
for s in ${@:-tests}; do step "$s"; "s_$s"; done
step done
