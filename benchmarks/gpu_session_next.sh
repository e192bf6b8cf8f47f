#!/usr/bin/env bash
# The next device calls, prepared 2026-11-30 session 14.  Step limits sum to ~20 minutes:
# split them over three calls by naming steps (mx_fold moe_ctas | dense_ctas qwen3_t1 moe_64 | w4a8).  Open:
#   qwen3_t1: the grouped two-warpgroup rule (session 14: Qwen3-30B-A3B gate_up at 1 token,
#      CUPTI kernel 11.66 -> 9.56 us, GPU-tested) was not timed in the resident chain beside
#      Humming: call 4's wall for it (31.2 us against 19.3) looked like an outlier and
#      call 5's bench_moe --humming step printed nothing within its 80 s limit.
#   moe_64: the MoE same-run table (1 / 64 tokens, resident, with Humming) on main's
#      heuristics.
#   w4a8: W4A8 / W4A16 at M = 1024 / 4096 with Humming's fp8 W4A8 (MXFP4) in the same run,
#      after the carrier unpack changes: int4 -> int8 52 -> 33 us, int4 -> e4m3 196 -> 121
#      (timed, call 5), then e4m3 by NumberFormat.encode_exact (built after the device time:
#      CPU-checked bit-identical, NOT timed; prediction ~35-45 us, near int8's).  Read the
#      w4a8-fp8 rows' loop_transpose_fusion in the JSON's kernel breakdown.
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_qwen3_t1() {
  T 180 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up --tokens 1 \
    --specs "w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:wg4" --humming --no-baselines \
    --breakdown --chain resident --calls 10 --repeats 2 > "$OUT/qwen3_t1.log" 2>&1
  grep -E "T=|rror" "$OUT/qwen3_t1.log" | cut -c1-900
}
s_moe_64() {
  T 240 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp@mgpu --humming --no-baselines --breakdown --chain resident \
    --calls 10 --repeats 2 --json "$OUT/moe_64.json" > "$OUT/moe_64.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_64.log" | cut -c1-900
}
s_w4a8() {
  T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-int8,w4a8-fp8,w4a8-mxfp4,w4a16-g128-zp,w4a16-mxfp4 --humming \
    --kernel-times --calls 5 --repeats 2 --json "$OUT/w4a8.json" > "$OUT/w4a8.log" 2>&1
  grep -E "^8192|rror" "$OUT/w4a8.log" | cut -c1-330
}
#   mx_fold: wnam_mgpu.MX_FOLD_PREFILL (built after session 14's device time; CPU-tested,
#      lowers for the H200, never GPU-run): its GPU test, then W4A8 MXFP4 at M = 1024 / 4096
#      with the fold against call 4's 284.8 / 812.9 us (kernels 259.9 / 758.6) and
#      Humming's 113.5 / 470.4.  Prediction at 4096: ~40 us fold + ~7 act quant + ~362 fp8
#      GEMM (w8a8-fp8's, NOTES_w8a8 session 4) = ~410 us of kernels; error ~3e-3.
s_mx_fold() {
  T 100 python3 -m pytest tests/test_wnam_mgpu.py -m gpu -k "mx_fold" -p no:cacheprovider \
    --tb=short -rA -s -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err" | cut -c1-300 | tail -6
  T 150 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4 --mx-fold --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/mx_fold.json" > "$OUT/mx_fold.log" 2>&1
  grep -E "^8192|rror" "$OUT/mx_fold.log" | cut -c1-330
}
#   moe_ctas: two or more CTAs per SM for the 64-token grouped GEMM.  Humming's source
#      (its wheel ships the CUDA; NOTES_moe.md session 14) runs 8-row expert tiles in 2-4
#      CTAs of 4-8 warps per SM with a persistent stream-K grid; ours runs one CTA of 4
#      warpgroups per SM in 13 waves at DeepSeek-V3 gate_up (1752 CTAs), each wave paying
#      its pipeline ramp.  Session 14's Qwen3 1-token result (2 warpgroups: 2 CTAs per SM,
#      -18 %) points the same way.  Screen wg2 / wg2-st2 / wg1 against the default, and
#      Humming's scale placement: on the bf16 weights before the MMA (acc-noovl: no
#      float32 work per K tile; error class ~2.4e-3, NOTES_moe session 10).
s_moe_ctas() {
  T 200 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 64 \
    --specs "w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:wg2,w4a16-g128-zp@mgpu:wg2-st2,w4a16-g128-zp@mgpu:wg1-st4,w4a16-g128-zp@mgpu:acc-noovl,w4a16-g128-zp@mgpu:wg2-acc-noovl" \
    --no-baselines --breakdown --chain resident --calls 10 --repeats 2 \
    > "$OUT/moe_ctas.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_ctas.log" | cut -c1-1200
}
#   dense_ctas: the same question for the dense decode (8192^2, M = 1 / 16): 128 CTAs of
#      4 warpgroups, one per SM, against grid split-K 2 with 2 warpgroups (256 CTAs, two
#      per SM; XLA sums the two float32 partials) -- Humming runs 2 CTAs of 8 warps per SM.
s_dense_ctas() {
  T 100 python3 benchmarks/profile_mgpu.py --ms 1,16 --spec w4a16-g128-zp \
    --configs default,split2-wg2,split2-wg2-st2,split2,acc-noovl,split2-wg2-acc-noovl 2>&1 \
    | grep -E "^M=|rror" | cut -c1-250
}
#   gputests: the GPU tests of what changed after its last H200 run (session 14): the
#      encode_exact e4m3 unpack (test_prefill_gpu), the grouped two-warpgroup rule's smem gate.
s_gputests() {
  T 200 python3 -m pytest tests/test_wnam_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
    -k "(prefill_gpu and not mx_fold) or qwen3_decode_gpu or deepseek_decode_split_k_gpu" -p no:cacheprovider \
    -o addopts="" --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|Error" | cut -c1-300 | tail -30
}
#   moe_ctas2: session 15 call 1's moe_ctas reached only DeepSeek-V3 gate_up at 64 tokens
#      (kernel: default 196.5, wg2 214.1, wg2-st2 164.0, wg1-st4 167.1 us).  The other
#      8-row-launch shapes, 3 weight sets (each > 100 MB: past the 50 MB L2) to fit the time.
s_moe_ctas2() {
  local S="w4a16-g128-zp@mgpu"
  T 200 python3 benchmarks/bench_moe.py \
    --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down,deepseek-v3-down --tokens 64 --layers 3 \
    --specs "$S,$S:wg2-st2,$S:wg1-st4,$S:xk-wg2-st2,$S:wg2-st3" \
    --no-baselines --breakdown --chain resident --calls 10 --repeats 2 \
    > "$OUT/moe_ctas2.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_ctas2.log" | cut -c1-1500
  T 100 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 16 --layers 3 \
    --specs "$S,$S:wg2-st2,$S:wg1-st4,$S:wg2-st3" \
    --no-baselines --breakdown --chain resident --calls 10 --repeats 2 \
    > "$OUT/moe_ctas16.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_ctas16.log" | cut -c1-1500
}
for s in ${@:-mx_fold moe_ctas dense_ctas qwen3_t1 moe_64 w4a8}; do step "$s"; "s_$s"; done
step done
