#!/usr/bin/env bash
# The next device calls, prepared 2026-12-01 at the end of session 21 (its calls:
# benchmarks/results/2026-12-01-session21, script gpu_session21.sh).  In order:
#   verify: what session 21 built after its device time -- quant_moe's W4A8 gate_up on
#      tokens quantized before the row gather (test_quant_moe_w4a8_quantizes_tokens_first_gpu),
#      the grouped fp8 tests again (the overlapped K loop was removed from the kernel).
#   layer: the whole W4A8 MoE layer (bench_moe_layer.py), DeepSeek-V3 and Qwen3 at 16 / 64
#      / 1024 tokens, HUMMING_JAX_MOE_QUANTIZE_FIRST=0 / 1 (predicted at DeepSeek 1024
#      tokens: ~60 us less per layer -- the pre-pass over 1/8 of the rows and a 1-byte
#      gather; NOTES_moe.md session 21).  Opt-in until then: if it passes and wins, make
#      HUMMING_JAX_MOE_QUANTIZE_FIRST default on (moe._gate_up_quantized_first).
#   dense128: the dense fp8-MMA layout (HUMMING_JAX_DENSE_FP8_MMA=1) at the M it was not
#      timed at (128, 4096; 8192^2 W4A8 MXFP4, with Humming); default-on if it holds there.
#   m1: the dense ":p8" decode at M = 1 against M = 8 / 16 (M = 1 was 2-3 us slower on
#      every launch in session 21's sweep; probe_dense_fp8.py).
#   mixtral16: grouped fp8 decode launches at Mixtral shapes, 16 tokens (gate_up 184.2 us
#      wall vs Humming 134.2 in session 21; the 16-row fp8 rule was tuned on DeepSeek-V3).
#   ncu: Nsight Compute on the two fp8 misses (probe_ncu.py's dense8 / grouped8 cases):
#      the dense ":p8" decode at M = 1 / 16 and Mixtral gate_up's 128-row tiles at 1024
#      tokens (~400 TFLOP/s against Humming's ~945): stall reasons and the SASS.
# Usage: gpu_session_next.sh [STEP...]  (default: verify).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_verify() {
  T 300 $PYT tests/test_moe.py tests/test_grouped_wnam_mgpu.py -m gpu \
    -k "quantizes_tokens_first or fp8_mma_gpu or deepseek" 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err|quantize-first" | cut -c1-300 | tail -16
}
s_layer() {
  for flag in 0 1; do
    HUMMING_JAX_MOE_QUANTIZE_FIRST=$flag T 270 python3 benchmarks/bench_moe_layer.py \
      --models deepseek-v3,qwen3-30b-a3b --tokens 16,64,1024 --spec w4a8-mxfp4 \
      --families default --breakdown --calls 10 --repeats 2 \
      --json "$OUT/layer_w4a8_qfirst$flag.json" > "$OUT/layer_w4a8_qfirst$flag.log" 2>&1
    echo "HUMMING_JAX_MOE_QUANTIZE_FIRST=$flag"; grep -vi "warn" "$OUT/layer_w4a8_qfirst$flag.log" | tail -8 | cut -c1-300
  done
}
s_dense128() {
  for flag in 0 1; do
    HUMMING_JAX_DENSE_FP8_MMA=$flag T 200 python3 benchmarks/bench_dense.py \
      --shapes 8192x8192 --ms 128,4096 --specs w4a8-mxfp4 --humming --kernel-times \
      --calls 10 --repeats 2 --json "$OUT/dense_w4a8_fp8mma$flag.json" \
      > "$OUT/dense_w4a8_fp8mma$flag.log" 2>&1
    echo "HUMMING_JAX_DENSE_FP8_MMA=$flag"; grep -E "^8192|rror" "$OUT/dense_w4a8_fp8mma$flag.log" | cut -c1-330
  done
}
s_m1() {
  T 150 python3 benchmarks/probe_dense_fp8.py --shape 8192,8192 --ms 1,8,16 2>&1 | grep -v Warn | tail -40
}
s_mixtral16() {
  T 150 python3 benchmarks/probe_fp8_moe.py --shape 8,2,28672,4096 --tokens 16 2>&1 | grep -v Warn | tail -3
  T 150 python3 benchmarks/probe_fp8_moe.py --shape 8,2,4096,14336 --tokens 16 2>&1 | grep -v Warn | tail -3
}
s_ncu() {
  command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  local NCU="ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1
    --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight
    --section SchedulerStats"
  for c in "dense8_m1:--case dense8 --m 1" "dense8_m16:--case dense8 --m 16" \
           "grouped8_mixtral1024:--case grouped8 --m 1024 --k 4096 --n 28672 --experts 8 --topk 2"; do
    local name=${c%%:*} args=${c#*:}
    T 120 $NCU -f -o "$OUT/$name" python3 benchmarks/probe_ncu.py --spec w4a8-mxfp4 $args \
      > "$OUT/ncu_$name.log" 2>&1
    echo "$name rc=$?"; grep -E "==ERR|rror" "$OUT/ncu_$name.log" | head -3
    T 40 ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/details_$name.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc A|Registers Per|Stall" \
      "$OUT/details_$name.txt" | head -12
    T 40 ncu -i "$OUT/$name.ncu-rep" --page source --print-source sass --csv \
      > "$OUT/sass_$name.csv" 2> /dev/null; rm -f "$OUT/$name.ncu-rep"
  done
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
