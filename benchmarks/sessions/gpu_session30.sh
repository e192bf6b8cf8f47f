#!/usr/bin/env bash
# Session 30 device calls (2026-12-02).  Every log goes to $OUT; the device tool returns at
# most 8 files, so each step appends to one log.  Carry: [".whl", ".ab_old"] for tests / ab
# (.ab_old: the package before the change, 6090062, with its bench scripts); [".whl",
# ".ab_inplace"] for inplace / w4a16 (.ab_inplace: the in-place build, inplace_build.diff).
#   tests: the grouped GPU tests with the rows stored in place (new: a zero tail); call 1
#          ran them on the first form (a plain output tile), which was slower (NOTES)
#   ab:    bench_moe walls, this package (with Humming) and the previous one in the same
#          call, per AB="shape:tokens ..." and SPECS (calls 1-2: the in-place build as "new")
#   inplace: (call 3, after the in-place build was reverted) HEAD against .ab_inplace
#          (that build) on gate_up shapes, W4A8 MXFP4
#   w4a16: (call 3) HEAD's W4A16 MoE rows with Humming (last measured in session 19)
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
MOE="--chain resident --span --calls 10 --repeats 2"
s_tests() {
  W=tests/test_grouped_wnam_mgpu.py
  T ${TT:-300} $PYT -m gpu -s ${TESTS:-tests/test_grouped_wna16_mgpu.py \
    $W::test_fp8_single_acc_default_gpu $W::test_single_acc_small_experts_default_gpu \
    "$W::test_fp8_single_acc_gpu[2-88]" "$W::test_fp8_single_acc_gpu[4-144]"} \
    > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|rel err" \
    "$OUT/tests.log" | cut -c1-250 | tail -40
}
s_ab() {
  bm() { local tag=$1 shape=$2 tokens=$3; shift 3; echo "== $tag $shape" >> "$OUT/ab.log"
    T ${BT:-150} python3 "$@" --shapes $shape --tokens $tokens --specs ${SPECS:-w4a8-mxfp4} \
      $MOE --no-baselines --json "$OUT/ab_${tag}_$shape.json" >> "$OUT/ab.log" 2>&1
    echo "$tag $shape rc=$?"; grep -E "T=|rror" "$OUT/ab.log" | tail -3 | cut -c1-400; }
  for spec in ${AB:-deepseek-v3-down:1024 qwen3-30b-a3b-down:256,1024}; do
    bm new ${spec%%:*} ${spec##*:} benchmarks/bench_moe.py --humming
    PYTHONPATH=/tmp/site:.ab_old bm old ${spec%%:*} ${spec##*:} .ab_old/benchmarks/bench_moe.py
  done
}
s_inplace() {
  for spec in ${IP:-qwen3-30b-a3b-gate_up:1024 mixtral-gate_up:1024}; do
    bm() { local tag=$1; shift; echo "== $tag $spec" >> "$OUT/inplace.log"
      T 150 python3 "$@" --shapes ${spec%%:*} --tokens ${spec##*:} --specs w4a8-mxfp4 $MOE \
        --no-baselines >> "$OUT/inplace.log" 2>&1
      echo "$tag $spec rc=$?"; grep -E "T=|rror" "$OUT/inplace.log" | tail -1 | cut -c1-300; }
    bm head benchmarks/bench_moe.py
    PYTHONPATH=/tmp/site:.ab_inplace bm inplace .ab_inplace/benchmarks/bench_moe.py
  done
}
s_w4a16() {
  for spec in ${W16:-qwen3-30b-a3b-gate_up:64,1024 deepseek-v3-gate_up:64,1024}; do
    T 200 python3 benchmarks/bench_moe.py --shapes ${spec%%:*} --tokens ${spec##*:} \
      --specs w4a16-g128-zp,w4a16-mxfp4 $MOE --humming --no-baselines \
      --json "$OUT/w4a16_${spec%%:*}.json" >> "$OUT/w4a16.log" 2>&1
    echo "${spec%%:*} rc=$?"; grep -E "T=|rror" "$OUT/w4a16.log" | tail -2 | cut -c1-400
  done
}
for s in ${@:-tests}; do step "$s"; "s_$s"; done
step done
