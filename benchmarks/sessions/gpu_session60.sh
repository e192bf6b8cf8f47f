#!/usr/bin/env bash
# Session 60 (2026-12-07).  Steps (carry [".whl"]):
#   r60:  8-row expert tiles past one token (tile_rows gives 16-row tiles from 16 tokens
#         on, on the WGMMA; 8-row ones take mma.sync): bench_moe per grouped GEMM,
#         one process per shape, the default / @mgpu:rows8 / @mgpu:rows8-noms, Humming
#         beside.  R60="shape ..." (default the four small-expert shapes), RTOK=16,64.
#   t59, w59, h8 and the earlier sessions' steps: gpu_session59.sh.
source "$(dirname "$0")/../gpu_env.sh"
R60_SHAPES="qwen3-30b-a3b-down deepseek-v3-down qwen3-30b-a3b-gate_up deepseek-v3-gate_up"
s_r60() {
  local shape spec=${RS:-w4a16-g128-zp}
  for shape in ${R60:-$R60_SHAPES}; do
    T ${RT:-150} python3 benchmarks/bench_moe.py --shapes $shape --tokens ${RTOK:-16,64} \
      --specs "$spec,$spec@mgpu:rows8,$spec@mgpu:rows8-noms" $MOE --consume row --humming \
      --no-baselines --json "$OUT/r60_$shape.json" > "$OUT/r60_$shape.log" 2>&1
    echo "r60 $shape rc=$?"; grep -E "T=|rror" "$OUT/r60_$shape.log" | cut -c1-700
  done
}
for s in ${@:-r60}; do
  case "$s" in
    r60) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session59.sh" "$s" ;;
  esac
done
