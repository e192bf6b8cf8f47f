#!/usr/bin/env bash
# Session 17's device calls (queued at the end of session 16, whose six calls ran:
# benchmarks/results/2026-11-30-session16), plus the timeline probe.  About 8 minutes:
#   tests: what session 16 changed after its last device call -- test_default_choice_gpu
#      (hj.prepare's own choice for W4A8 experts, grouped_wnam_mgpu: its -k missed in call
#      4), the unpack's GPU test with the fold's far groups in every other N block (the
#      per-block "all normal" flag), and the W4A8 prefill routes.
#   dense: W4A8 int4 -> fp8 / int8 and MXFP4 x fp8 at M = 1024 / 4096 with Humming.  The
#      fp8 carrier's packed-word unpack was not timed at 4096 (call 4: 616.4 us with the old
#      unpack; prediction ~565); MXFP4 425.8 / 150.6 (calls 5-6).
#   moe: one same-run table with Humming at 1 / 64 tokens -- W4A16 int4 g128 zp at
#      DeepSeek-V3 gate_up and Qwen3 gate_up / down (down on Mosaic since session 16), and
#      W4A8 MXFP4 (the grouped_wnam_mgpu default) at DeepSeek-V3 gate_up / down.
# Usage: gpu_session_next.sh [STEP...]  (default: all, in order).  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
s_tests() {
  T 150 python3 -m pytest tests/test_carrier_unpack.py tests/test_wnam_mgpu.py \
    tests/test_grouped_wnam_mgpu.py -m gpu -p no:cacheprovider -o addopts="" --tb=short -rA \
    -k "unpack_gpu or mx_fold or prefill_gpu or default_choice_gpu" -s \
    -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -20
}
s_dense() {
  T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-fp8,w4a8-int8,w4a8-mxfp4 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense.log" | cut -c1-330
}
s_timeline() {  # the idle time between a decode call's kernels (probe_timeline.py)
  for a in "--moe deepseek-v3-gate_up --spec w4a16-g128-zp" "--moe deepseek-v3-gate_up --spec w4a8-mxfp4" \
      "--moe qwen3-30b-a3b-down --spec w4a16-g128-zp" "--dense 8192 --spec w4a16-g128-zp"; do
    T 90 python3 benchmarks/probe_timeline.py $a --tokens 1 --show 12 2>&1 | grep -v Warning | tail -18
  done
}
s_moe() {
  T 240 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp --humming --no-baselines --breakdown --chain resident \
    --calls 10 --repeats 2 --json "$OUT/moe_w4a16.json" > "$OUT/moe_w4a16.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a16.log" | cut -c1-1000
  T 200 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,deepseek-v3-down \
    --tokens 1,64 --specs w4a8-mxfp4 --humming --no-baselines --breakdown --chain resident \
    --calls 10 --repeats 2 --json "$OUT/moe_w4a8.json" > "$OUT/moe_w4a8.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a8.log" | cut -c1-1000
}
s_fold() {  # call 4: the fold reading its shifts off the scale rows (kernel change)
  T 150 python3 -m pytest tests/test_carrier_unpack.py tests/test_wnam_mgpu.py -m gpu \
    -p no:cacheprovider -o addopts="" --tb=short -rA -k "unpack_gpu or mx_fold" -s \
    -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR|PASSED)|passed|failed|rel err|Error" | cut -c1-300 | tail -12
  T 90 python3 benchmarks/bench_unpack.py 2>&1 | grep -v Warn | tail -14
  T 150 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense_fold.json" > "$OUT/dense_fold.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_fold.log" | cut -c1-330
}
s_moe_span() {  # call 4: decode / 64-token MoE walls, device spans and Humming, one run
  T 200 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp --humming --no-baselines --chain resident --span \
    --calls 20 --repeats 2 --json "$OUT/moe_w4a16.json" > "$OUT/moe_w4a16.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a16.log" | cut -c1-400
  T 150 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,deepseek-v3-down \
    --tokens 1,64 --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span \
    --calls 20 --repeats 2 --json "$OUT/moe_w4a8.json" > "$OUT/moe_w4a8.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a8.log" | cut -c1-400
}
s_honest() {  # call 5: each layer its own x / routing buffers (common.per_layer), so the
  # activation quantization and the tile schedule run once per layer, as in a model
  T 170 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4,w4a8-fp8 --humming --kernel-times --no-baselines --calls 5 --repeats 2 \
    --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense.log" | cut -c1-330
  T 150 python3 benchmarks/bench_moe.py \
    --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down --tokens 1,64 \
    --specs w4a16-g128-zp --humming --no-baselines --chain resident --span \
    --calls 20 --repeats 2 --json "$OUT/moe_w4a16.json" > "$OUT/moe_w4a16.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a16.log" | cut -c1-300
  T 100 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up,deepseek-v3-down \
    --tokens 1,64 --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span \
    --calls 20 --repeats 2 --json "$OUT/moe_w4a8.json" > "$OUT/moe_w4a8.log" 2>&1
  grep -E "T=|rror" "$OUT/moe_w4a8.log" | cut -c1-300
}
for s in ${@:-tests timeline dense moe}; do step "$s"; "s_$s"; done
step done
