#!/usr/bin/env bash
# The next device calls, prepared 2026-12-04 at the end of session 37 (its calls:
# benchmarks/results/2026-12-04-session37, script gpu_session37.sh); it replaces the queue
# prepared after session 36 (in git history: gu, q3, bd, all run in session 37).  Every
# bench_moe step times with --consume row and Humming in the same process.
# Carry: [".whl"].
#   s37: session 37's GPU tests that its last call did not reach
#        (test_session37_launches_gpu: the MXFP4 cases and int4 Qwen3 down at 256 tokens;
#        DeepSeek-V3 gate_up's quantization makes these slow: 300 s).
#   mx:  the new defaults with MXFP4 (16-row launches, K 768 streamed) beside Humming:
#        DeepSeek-V3 gate_up 256 (call 1: 243.5 on the launch now the default; Humming
#        189.0), Qwen3-30B-A3B gate_up 128, down 128 / 256; int4 Qwen3 down 256 (the
#        step call 4 did not finish).
#   q16: Qwen3-30B-A3B down at 128 tokens (16-row launch, K 768): the default streams two
#        column blocks on the shared-x shape of one warpgroup (63.9 / 64.9 us in session
#        37) where the small CTA without blocks ran 62.3 and two warpgroups 60.1; the small
#        CTA with two blocks (sub2-xk-ovl-unpad on the default) is untimed.
#   qm:  hj.quant_moe (run_aligned's tiles), which session 37's 16-row rule reaches untimed:
#        bench_moe_layer at the 16-row points, this tree against the tree before the rule.
#        Needs old/ (ignored, carried): git archive 6207b22 humming_jax | tar -x -C old
#        with old/ in .git/info/exclude; carry [".whl", "old"].
# Usage: gpu_session_next.sh [STEP...]  (default: s37 mx q16).
source "$(dirname "$0")/gpu_env.sh"
ROW="$MOE --consume row --humming --no-baselines"
s_s37() {
  gpu_tests ${ST:-300} "session37" tests/test_grouped_wna16_mgpu.py
}
s_mx() {
  for st in deepseek-v3-gate_up:256 qwen3-30b-a3b-gate_up:128 qwen3-30b-a3b-down:128,256; do
    T ${ST:-120} python3 benchmarks/bench_moe.py --shapes ${st%%:*} --tokens ${st##*:} \
      --specs w4a16-mxfp4 $ROW --json "$OUT/mx_${st%%:*}.json" >> "$OUT/mx.log" 2>&1
    echo "$st rc=$?"
  done
  T 60 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 256 \
    --specs w4a16-g128-zp $ROW --json "$OUT/q3_256.json" >> "$OUT/mx.log" 2>&1
  echo "int4 q3 256 rc=$?"; grep -E "T=|rror" "$OUT/mx.log" | cut -c1-400
}
s_q16() {
  T ${ST:-150} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 128 \
    --specs "w4a16-g128-zp,w4a16-g128-zp@mgpu:sub2-xk-ovl-unpad,w4a16-g128-zp@mgpu:cb1-sub2-xk-ovl-unpad,w4a16-g128-zp@mgpu:cb1-wg2-st2-sub2-xk-ovl-unpad" \
    $ROW --json "$OUT/q16.json" > "$OUT/q16.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/q16.log" | cut -c1-1200
}
s_qm() {
  local tree
  for tree in . old; do
    PYTHONPATH=/tmp/site:$tree:. python3 -c "from humming_jax.kernels import grouped_wna16_mgpu \
      as g; print('tree', g.__file__, 'STREAMED_MAX_K_TILES', g.STREAMED_MAX_K_TILES)"  # 6 / 2
    for mt in qwen3-30b-a3b:128 deepseek-v3:256 mixtral:32; do
      PYTHONPATH=/tmp/site:$tree:. T ${ST:-150} python3 benchmarks/bench_moe_layer.py \
        --models ${mt%%:*} --tokens ${mt##*:} --families default --chain resident \
        --json "$OUT/qm_${tree//./new}_${mt%%:*}.json" >> "$OUT/qm.log" 2>&1
      echo "$tree $mt rc=$?"; tail -3 "$OUT/qm.log" | cut -c1-300
    done
  done
}
for s in ${@:-s37 mx q16}; do step "$s"; "s_$s"; done
step done
