#!/usr/bin/env bash
# Session 26 device calls (2026-12-02).  Every log goes to $OUT first.  Carry: [".whl"].
#   verify: GPU tests of the one-accumulator fp8 tiles (128 / 144 / 160 rows per tile),
#           the default route's test, and the per-group Mixtral-like case session 25's
#           step limit cut
#   blocks: probe_fp8_moe.py --blocks: the one-accumulator tile at 128 / 144 / 160 rows,
#           Mixtral gate_up / down at 1024 and 4096 (call 1 also timed a since-removed
#           fp8_mma_in_flight beside each: -4 % to +2 %, outputs not bit-equal)
#   default: the rows-per-tile chooser (grouped_wna16_mgpu.single_acc_tile_rows) as the
#           default: GPU tests, bench_moe Mixtral with Humming, the Mixtral W4A8 layer
#   others: bench_moe W4A8 rows the chooser changed on the other shapes, with Humming
#   check:  probe_fp8_moe.py --blocks on those shapes: the chooser's pick against 128 rows
#   wide:   the one-accumulator tile on two warpgroups at 192-256 rows (one conversion
#           for more MMA work), against the four-warpgroup 144 / 152
#   ncu:    Nsight Compute of the default Mixtral gate_up 1024-token launch (eager prepare,
#           ":cf"): speed of light, warp states, scheduler, memory, source counters
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
s_verify() {
  T 150 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s \
    -k "single_acc or (fp8_mma_gpu and 512)" > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/verify.log" | cut -c1-250 | tail -14
}
blocks_probe() {  # NAME "SHAPE TOKENS BLOCKS"...: probe_fp8_moe.py --blocks, ptxas registers
  local name=$1; shift
  for st in "$@"; do
    set -- $st
    MOSAIC_GPU_DUMP_PTXAS=1 T 150 python3 benchmarks/probe_fp8_moe.py --blocks $3 --shape $1 \
      --tokens $2 > "$OUT/${name}_$2.log" 2>&1
    echo "moe $1 T=$2 rc=$?"; grep -E "^E[0-9]|rror" "$OUT/${name}_$2.log" | cut -c1-700
    grep -E "Used [0-9]+ registers|spill" "$OUT/${name}_$2.log" \
      | sed -E 's/.*(Used [0-9]+ registers).*/\1/' | sort | uniq -c | tr '\n' ';'; echo
  done
}
s_blocks() {  # (call 1 ran each step with `T 140` and logs named blocks_SHAPE_TOKENS.log)
  blocks_probe blocks "8,2,28672,4096 1024 128,144,160" "8,2,4096,14336 1024 128,144,160" \
    "8,2,28672,4096 4096 128,152,160"
}
s_ncu() {
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  local NCU="ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
    --section ComputeWorkloadAnalysis --section SourceCounters"
  T 150 $NCU -f -o "$OUT/mixtral_gu_1024" python3 benchmarks/probe_ncu.py --case grouped8 \
    --spec w4a8-mxfp4 --eager --m 1024 --k 4096 --n 28672 --experts 8 --topk 2 \
    > "$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"; grep -E "==ERR|rror|probe_ncu" "$OUT/ncu.log" | head -5
  T 40 ncu -i "$OUT/mixtral_gu_1024.ncu-rep" --page details > "$OUT/details.txt" 2>&1
  grep -E "Duration|Throughput|Issue Slots Busy|Executed Ipc A|Registers Per|Achieved Occ|Stall|L2 Hit|Block Limit" "$OUT/details.txt" | head -40
  T 40 ncu -i "$OUT/mixtral_gu_1024.ncu-rep" --page source --print-source sass --csv \
    > "$OUT/sass.csv" 2> "$OUT/sass.err"; echo "sass rows $(wc -l < "$OUT/sass.csv")"
}
s_wide() {  # two warpgroups of 64 columns x up to 256 tokens: one e2m1 -> e4m3 conversion
  # feeds twice the MMA work (Nsight Compute, call 3: the ALU pipe is the busiest, 56 %)
  blocks_probe wide "8,2,28672,4096 1024 144,192:2,224:2,256:2" \
    "8,2,28672,4096 4096 152,208:2,256:2"
}
s_check() {  # the chooser's picks on the other shapes it widened, against 128-row tiles
  blocks_probe check "256,8,512,7168 4096 128,144,160" "128,8,1536,2048 4096 128,144,160" \
    "8,2,28672,4096 512 128,144,160"  # (call 5: the two 4096 runs shared one log name)
}
s_default() {  # the chooser's tiles (144 / 152 / 160 rows) as the default: GPU tests, then
  # bench_moe Mixtral with Humming in the same process, the whole Mixtral W4A8 layer
  T 150 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "single_acc" \
    > "$OUT/default.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/default.log" | cut -c1-250 | tail -10
  for shape in mixtral-gate_up mixtral-down; do
    T 150 python3 benchmarks/bench_moe.py --shapes $shape --tokens 1024,4096 \
      --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 10 \
      --repeats 2 --json "$OUT/moe_$shape.json" > "$OUT/moe_$shape.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|rror" "$OUT/moe_$shape.log" | cut -c1-300
  done
  T 130 python3 benchmarks/bench_moe_layer.py --models mixtral --tokens 1024 \
    --spec w4a8-mxfp4 --families default --breakdown --calls 10 --repeats 2 \
    --json "$OUT/layer.json" > "$OUT/layer.log" 2>&1
  echo "layer rc=$?"; grep -E "^\{|rror|mosaic" "$OUT/layer.log" | cut -c1-250 | head -8
}
s_others() {  # the other shapes whose tiles the chooser widened (4096 tokens; Mixtral 512)
  for st in "deepseek-v3-gate_up 4096" "qwen3-30b-a3b-gate_up 4096" \
            "qwen3-30b-a3b-down 4096" "mixtral-gate_up 256,512"; do
    set -- $st
    T 110 python3 benchmarks/bench_moe.py --shapes $1 --tokens $2 \
      --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 10 \
      --repeats 2 --json "$OUT/moe_$1_$2.json" > "$OUT/moe_$1_$2.log" 2>&1
    echo "$1 rc=$?"; grep -E "T=|rror" "$OUT/moe_$1_$2.log" | cut -c1-300
  done
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
