#!/usr/bin/env bash
# Session 31 device calls (2026-12-03): the fp4 group scale folded into the conversion's
# multiply (wna16_mgpu ":sf" layouts, HUMMING_JAX_SCALE_FOLD; NOTES.md v32).  Every log
# goes to $OUT; carry [".whl"].
#   tests: the GPU tests of the fold (bit-equal to the unfolded kernel) and the fp4 /
#          grouped decode GPU tests it runs under
#   prof:  CUPTI kernel us per 8192^2 layer, MXFP4 / NVFP4, fold on / off / on / off
#   moe:   bench_moe W4A16 walls (MXFP4, int4 as the control) with Humming, fold on, then
#          fold off in the next process
#   dense: bench_dense W4A16 MXFP4 / NVFP4 walls with Humming (fold on)
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
MOE="--chain resident --span --calls 10 --repeats 2"
s_tests() {
  T ${TT:-330} $PYT -m gpu -s tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py \
    -k "${TK:-scale_fold or fp4 or quant_dense_gpu or qwen3_decode}" \
    > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed" \
    "$OUT/tests.log" | cut -c1-250 | tail -40
}
s_prof() {
  for spec in ${PSPECS:-w4a16-mxfp4 w4a16-nvfp4}; do
    for fold in 1 0 1 0; do
      echo "== $spec fold=$fold" >> "$OUT/prof.log"
      HUMMING_JAX_SCALE_FOLD=$fold T 120 python3 benchmarks/profile_mgpu.py --spec $spec \
        --ms ${PMS:-1,16,128} --configs default >> "$OUT/prof.log" 2>&1
      echo "$spec fold=$fold rc=$?"; grep -E "^M=" "$OUT/prof.log" | tail -3 | cut -c1-200
    done
  done
}
s_moe() {
  for spec in ${W16:-qwen3-30b-a3b-gate_up:64 deepseek-v3-gate_up:64 qwen3-30b-a3b-down:64}; do
    for fold in 1 0; do
      echo "== ${spec} fold=$fold" >> "$OUT/moe.log"
      HUMMING_JAX_SCALE_FOLD=$fold T 200 python3 benchmarks/bench_moe.py \
        --shapes ${spec%%:*} --tokens ${spec##*:} --specs ${MSPECS:-w4a16-mxfp4,w4a16-g128-zp} \
        $MOE $([ $fold = 1 ] && echo --humming) --no-baselines \
        --json "$OUT/moe_${spec%%:*}_f$fold.json" >> "$OUT/moe.log" 2>&1
      echo "${spec} fold=$fold rc=$?"; grep -E "T=|rror" "$OUT/moe.log" | tail -3 | cut -c1-300
    done
  done
}
s_dense() {
  T 300 python3 benchmarks/bench_dense.py --specs w4a16-mxfp4,w4a16-nvfp4 --ms ${DMS:-1,16,128} \
    --humming --kernel-times --json "$OUT/dense.json" > "$OUT/dense.log" 2>&1
  echo "dense rc=$?"; grep -vE "^#|^$" "$OUT/dense.log" | tail -20 | cut -c1-250
}
for s in ${@:-tests}; do step "$s"; "s_$s"; done
step done
