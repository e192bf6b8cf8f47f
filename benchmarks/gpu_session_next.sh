#!/usr/bin/env bash
# The next device calls, prepared 2026-12-01 at the end of session 22 (its calls:
# benchmarks/results/2026-12-01-session22, scripts gpu_session22.sh / gpu_session22_fold.sh).
# Session 22 ran verify, layer (DeepSeek-V3) and dense128 and answered the fp8-tile question
# (L2-bound, NOTES.md v24).  In order, each step writes its log to $OUT first (a pipe the
# timeout kills loses the output: session 22 call 1):
#   layer: the whole W4A8 MoE layer (quantize-first now the default) for Qwen3-30B-A3B at
#      16 / 64 / 1024 tokens -- the chain of 8 at 1024 stalled in Mosaic layout inference in
#      session 22 call 1 and not in probe_layout_hang.py (call 2); the probe runs first so
#      a repeat names the kernel (its .mlir files: copy only the last two back).
#   m1: the dense ":p8" decode at M = 1 against M = 8 / 16 (M = 1 was 2-3 us slower on
#      every launch in session 21's sweep; probe_dense_fp8.py).
#   mixtral16: grouped fp8 decode launches at Mixtral shapes, 16 tokens (gate_up 184.2 us
#      wall vs Humming 134.2 in session 21; the 16-row fp8 rule was tuned on DeepSeek-V3).
#   ncu: Nsight Compute on the dense ":p8" decode at M = 1 / 16 (stall reasons, SASS).
# Usage: gpu_session_next.sh [STEP...]  (default: layer).  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_layer() {
  mkdir -p /tmp/diag
  T 100 python3 benchmarks/probe_layout_hang.py --model qwen3-30b-a3b --tokens 1024 \
    --layers 8 --limit 90 --out /tmp/diag > "$OUT/diag.log" 2>&1
  echo "diag rc=$?"; grep -E "lowered|s$" "$OUT/diag.log" | tail -4
  cp $(ls /tmp/diag/*.mlir | tail -2) "$OUT/" 2>/dev/null
  T 240 python3 benchmarks/bench_moe_layer.py --models qwen3-30b-a3b --tokens 16,64,1024 \
    --spec w4a8-mxfp4 --families default --breakdown --calls 10 --repeats 2 \
    --json "$OUT/layer_qwen3_w4a8.json" > "$OUT/layer_qwen3_w4a8.log" 2>&1
  echo "layer rc=$?"; grep -E "^\{" "$OUT/layer_qwen3_w4a8.log" | cut -c1-160
}
s_m1() {
  T 150 python3 benchmarks/probe_dense_fp8.py --shape 8192,8192 --ms 1,8,16 > "$OUT/m1.log" 2>&1
  echo "rc=$?"; grep -v Warn "$OUT/m1.log" | tail -40
}
s_mixtral16() {
  for s in 28672,4096 4096,14336; do
    T 150 python3 benchmarks/probe_fp8_moe.py --shape 8,2,$s --tokens 16 > "$OUT/mixtral16_$s.log" 2>&1
    echo "rc=$?"; grep -v Warn "$OUT/mixtral16_$s.log" | tail -3
  done
}
s_ncu() {
  command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  local NCU="ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1
    --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight
    --section SchedulerStats"
  for c in "dense8_m1:--case dense8 --m 1" "dense8_m16:--case dense8 --m 16"; do
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
for s in ${@:-layer}; do step "$s"; "s_$s"; done
step done
