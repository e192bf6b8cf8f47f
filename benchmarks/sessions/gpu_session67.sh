#!/usr/bin/env bash
# Session 67 (2026-12-07).  Steps (carry [".whl"]):
#   wt:  the wide 16-bit tiles' GPU tests (grouped_wna16_mgpu.wide_tiles: capped experts past
#        128 rows, four shared-x warpgroups, one accumulator) beside the cost-sized ones.
#   wp:  probe_fp8_moe.py --wide: the 16-bit route's one-accumulator tile at 128 / 144 / 152 /
#        160 rows (CUPTI µs of the grouped kernel, outputs against the default's) at Mixtral
#        gate_up / down (WP_POINTS "shape:tokens:preset").
#   wb:  bench_moe A/B, HUMMING_JAX_WIDE_TILES=1 (with Humming) then 0, at WB_POINTS.
#   earlier steps: gpu_session66.sh (cv...), gpu_session65.sh (kt, moe, tables).
source "$(dirname "$0")/../gpu_env.sh"
s_wt() {
  gpu_tests ${TT:-240} "wide_tiles or cost_sized_tiles_default_gpu" \
    tests/test_grouped_wna16_mgpu.py
  mv "$OUT/tests.log" "$OUT/tests_wt.log"
}
s_wp() {
  local point shape tokens preset
  for point in ${WP_POINTS:-8,2,28672,4096:512,1024,4096:w4a16-g128-zp 8,2,4096,14336:1024,4096:w4a16-g128-zp 8,2,28672,4096:1024:w4a16-mxfp4}; do
    IFS=: read -r shape tokens preset <<< "$point"
    T ${WPT:-200} python3 benchmarks/probe_fp8_moe.py --wide --preset "$preset" --shape "$shape" \
      --tokens "$tokens" --blocks ${WP_BLOCKS:-128,144,152,160} >> "$OUT/wp.log" 2>&1
    echo "wp $point rc=$?"
  done
  grep -E "^E[0-9]|rror" "$OUT/wp.log" | cut -c1-700
}
s_wb() {
  bench_ab HUMMING_JAX_WIDE_TILES wb ${WB_SPECS:-w4a16-g128-zp} \
    ${WB_POINTS:-mixtral-gate_up:512,1024,4096 mixtral-down:1024,4096}
}
for s in ${@:-wt}; do
  case "$s" in
    wt|wp|wb) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session66.sh" "$s" ;;
  esac
done
