#!/usr/bin/env bash
# Session 29 device calls (2026-12-02).  Every log goes to $OUT first; the device tool
# returns at most 8 files, so each step appends to one log.  Carry: [".whl"].
#   verify: the one-accumulator GPU tests session 28 could not see (24 / 48 / 80-row tiles,
#           the default on the stored base in its refactored form)
#   probe:  probe_fp8_moe.py --blocks at the small-expert rows (Qwen3-30B-A3B / DeepSeek-V3
#           gate_up, 256 / 1024 tokens): tile rows, stages, two-warpgroup CTAs (two per SM)
#   tiles:  (call 2) the tile-row model extended below 128 rows, two-warpgroup CTAs
#   check:  (call 3) the new launch: GPU tests, walls new (with Humming) / old per shape
#   split:  bench_moe --breakdown of one grouped GEMM: where the wall beyond the kernel goes
#   down:   bench_moe W4A8 MXFP4 DeepSeek-V3 / Qwen3-30B-A3B down rows with Humming
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
MOE="--specs w4a8-mxfp4 --chain resident --span --calls 10 --repeats 2"
s_verify() {
  T 240 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "single_acc" \
    > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/verify.log" \
    | cut -c1-250 | tail -20
}
s_probe() {
  pb() { local name=$1; shift; echo "== $name" >> "$OUT/probe.log"
    T 200 python3 benchmarks/probe_fp8_moe.py --sets 2 "$@" >> "$OUT/probe.log" 2>&1
    echo "$name rc=$?"; grep -E "T=|rror" "$OUT/probe.log" | tail -2 | cut -c1-2000; }
  pb qwen3_gu_1024 --shape 128,8,1536,2048 --tokens 1024 \
    --blocks ${QB:-80,96,112,128,96:4:6,96:2:4,96:2:3,80:2:3}
  pb deepseek_gu_1024 --shape 256,8,512,7168 --tokens 1024 \
    --blocks ${DB:-48,56,64,48:4:6,48:4:8,48:2:4,48:2:3}
  pb qwen3_gu_256 --shape 128,8,1536,2048 --tokens 256 --blocks ${QS:-24,32,24:4:6,24:2:3,32:2:3}
}
s_tiles() {  # call 2: the tile-row model (expected tiles x (rows + 128)) below 128 rows, on
  # two-warpgroup CTAs (two per SM) against four
  pb() { local name=$1; shift; echo "== $name" >> "$OUT/tiles.log"
    T 150 python3 benchmarks/probe_fp8_moe.py --sets 2 "$@" >> "$OUT/tiles.log" 2>&1
    echo "$name rc=$?"; grep -E "T=|rror" "$OUT/tiles.log" | tail -1 | cut -c1-2000; }
  pb qwen3_gu --shape 128,8,1536,2048 --tokens 1024 --blocks 88,88:2:3,88:2:4,96:2:4,104:2:4
  pb qwen3_gu --shape 128,8,1536,2048 --tokens 256 --blocks 32:2:2,32:2:3,32:2:4,40:2:3
  pb qwen3_dn --shape 128,8,2048,768 --tokens 1024 --blocks 88,88:2:3,88:2:4,96:2:4
  pb qwen3_dn --shape 128,8,2048,768 --tokens 256 --blocks 24:2:3,32,32:2:3
  for sh in 8,2,28672,4096 8,2,4096,14336; do
    pb mixtral --shape $sh --tokens 64 --blocks 32,32:2:3,24:2:3
    pb mixtral --shape $sh --tokens 256 --blocks 88,88:2:3,88:2:4
  done
  pb deepseek_dn --shape 256,8,7168,256 --tokens 1024 --blocks 48:2:3,48:2:2
}
s_check() {  # call 3: the session-29 launch (tile rows below 128, two-warpgroup CTAs):
  # its GPU tests, then bench_moe walls new (with Humming) and old (.ab_old: 8faccbf,
  # the package before it) in the same call
  if [ -z "${NOTESTS:-}" ]; then  # (call 4: NOTESTS=1, the walls of the other shapes)
    T 200 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "single_acc" > "$OUT/check.log" 2>&1
    echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|rel err" \
      "$OUT/check.log" | cut -c1-250 | tail -14
  fi
  bm() { local tag=$1 shape=$2 tokens=$3; shift 3; echo "== $tag $shape" >> "$OUT/check.log"
    T 150 python3 "$@" --shapes $shape --tokens $tokens $MOE --no-baselines \
      --json "$OUT/ab_${tag}_$shape.json" >> "$OUT/check.log" 2>&1
    echo "$tag $shape rc=$?"; grep -E "T=|rror" "$OUT/check.log" | tail -2 | cut -c1-300; }
  for spec in ${CHECK:-qwen3-30b-a3b-gate_up:256,1024 qwen3-30b-a3b-down:256,1024 deepseek-v3-down:1024 mixtral-down:64,256}; do
    bm new ${spec%%:*} ${spec##*:} benchmarks/bench_moe.py --humming
    PYTHONPATH=/tmp/site:.ab_old bm old ${spec%%:*} ${spec##*:} .ab_old/benchmarks/bench_moe.py
  done
}
s_split() {
  for shape in ${SPLIT:-qwen3-30b-a3b-gate_up deepseek-v3-gate_up}; do
    T 150 python3 benchmarks/bench_moe.py --shapes $shape --tokens 1024 $MOE --breakdown \
      --no-baselines --json "$OUT/split_$shape.json" >> "$OUT/split.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|hj_kernels|rror" "$OUT/split.log" | tail -3 | cut -c1-2500
  done
}
s_down() {
  for shape in ${DOWN:-qwen3-30b-a3b-down deepseek-v3-down}; do
    T 240 python3 benchmarks/bench_moe.py --shapes $shape --tokens 64,256,1024,4096 $MOE \
      --humming --no-baselines --json "$OUT/moe_$shape.json" >> "$OUT/down.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|rror" "$OUT/down.log" | tail -4 | cut -c1-300
  done
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
