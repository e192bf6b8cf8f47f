#!/usr/bin/env bash
# Session 28 device calls (2026-12-02).  Every log goes to $OUT first.
# Carry: [".whl", ".ab_old"] -- .ab_old holds humming_jax and benchmarks/*.py at c709dab
# (the bench scripts put their own repo root first on sys.path), the package with the
# column-fold base reduced from the scale rows on every call, for same-call A/B walls
# against the base stored at prepare time (QuantizedWeight.fold_base).
#   verify: GPU tests of the one-accumulator route (eagerly prepared: the stored base) and
#           the W4A8 MoE layer
#   moe:    bench_moe W4A8 MXFP4 Mixtral gate_up / down at 1024 / 4096 tokens, Humming in
#           the same process, resident chain with spans (call 1 also asked for --breakdown:
#           CUPTI aborted, "activity records were dropped", and no row was written)
#   ab:     the same walls at 1024 tokens with the old package (no Humming)
#   layer:  the Mixtral W4A8 layer at 1024 tokens (breakdown), old package then new
#   probe:  probe_fp8_moe.py --blocks: the one-accumulator tile at 24-96 rows (Qwen3 /
#           DeepSeek-V3 gate_up at 256 / 1024 tokens) against the heuristic's per-group one
#   small:  the one-accumulator default from 24 rows: its GPU tests, the per-group launch
#           (old package) against it on the shapes "probe" did not time, bench_moe rows
#   others: bench_moe W4A8 MXFP4 DeepSeek-V3 / Qwen3-30B-A3B rows with Humming
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
NEW=$PYTHONPATH; OLD=/tmp/site:.ab_old
MOE="--specs w4a8-mxfp4 --chain resident --span --calls 10 --repeats 2"
s_verify() {
  T 200 $PYT tests/test_grouped_wnam_mgpu.py tests/test_moe.py -m gpu -s \
    -k "single_acc or quantizes_tokens_first_gpu" > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/verify.log" \
    | cut -c1-250 | tail -20
}
s_moe() {
  for shape in mixtral-gate_up mixtral-down; do
    T 200 python3 benchmarks/bench_moe.py --shapes $shape --tokens 1024,4096 $MOE --humming \
      --no-baselines --json "$OUT/moe_$shape.json" > "$OUT/moe_$shape.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|rror" "$OUT/moe_$shape.log" | cut -c1-1800
  done
}
s_ab() {
  PYTHONPATH=$OLD T 150 python3 .ab_old/benchmarks/bench_moe.py --shapes mixtral-gate_up,mixtral-down \
    --tokens 1024 $MOE --no-baselines --json "$OUT/moe_old.json" > "$OUT/moe_old.log" 2>&1
  echo "old rc=$?"; grep -E "T=|rror" "$OUT/moe_old.log" | cut -c1-300
}
s_layer() {
  for v in old new; do
    local pp=$NEW dir=benchmarks; [ $v = old ] && pp=$OLD dir=.ab_old/benchmarks
    PYTHONPATH=$pp T 150 python3 $dir/bench_moe_layer.py --models mixtral --tokens 1024 \
      --spec w4a8-mxfp4 --families default --breakdown --calls 10 --repeats 2 \
      --json "$OUT/layer_$v.json" > "$OUT/layer_$v.log" 2>&1
    echo "layer $v rc=$?"; grep -E "^\{|rror" "$OUT/layer_$v.log" | cut -c1-2500 | head -3
  done
}
s_others() {  # OTHERS="deepseek-v3-down qwen3-30b-a3b-down" for the down rows (not run)
  for shape in ${OTHERS:-deepseek-v3-gate_up qwen3-30b-a3b-gate_up}; do
    T 240 python3 benchmarks/bench_moe.py --shapes $shape --tokens 64,256,1024,4096 $MOE \
      --humming --no-baselines --json "$OUT/moe_$shape.json" > "$OUT/moe_$shape.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|rror" "$OUT/moe_$shape.log" | cut -c1-300
  done
}
s_probe() {  # the one-accumulator tile below 88 rows (the heuristic's per-group launch there)
  T 200 python3 benchmarks/probe_fp8_moe.py --shape 128,8,1536,2048 --tokens 256,1024 \
    --blocks 24,32,48,64,80,96 > "$OUT/probe_qwen3_gu.log" 2>&1
  echo "qwen3 rc=$?"; grep -E "T=|rror" "$OUT/probe_qwen3_gu.log" | cut -c1-1500
  T 200 python3 benchmarks/probe_fp8_moe.py --shape 256,8,512,7168 --tokens 256,1024 \
    --blocks 24,32,48,64 > "$OUT/probe_deepseek_gu.log" 2>&1
  echo "deepseek rc=$?"; grep -E "T=|rror" "$OUT/probe_deepseek_gu.log" | cut -c1-1500
}
s_small() {  # one accumulator from 24 rows (SINGLE_ACC_MIN_ROWS): GPU tests, then the old
  # package's per-group heuristic against the one-accumulator tile at the rows the new
  # default takes, on the shapes call 4 did not time (CUPTI), then bench_moe with Humming
  T 120 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "single_acc_gpu" \
    > "$OUT/small_tests.log" 2>&1
  echo "rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|rel err" \
    "$OUT/small_tests.log" | cut -c1-200 | tail -12  # (call 5: this log did not come back)
  # (call 5 wrote one log per probe: the device tool returns at most 8 files, and dropped
  # the test log; the probes now append to one file)
  pb() { local name=$1; shift; echo "== $name" >> "$OUT/pb_small.log"
    PYTHONPATH=$OLD T 90 python3 benchmarks/probe_fp8_moe.py --sets 1 "$@" >> "$OUT/pb_small.log" 2>&1
    echo "$name rc=$?"; grep -E "T=|rror" "$OUT/pb_small.log" | tail -2 | cut -c1-600; }
  pb qwen3_dn_256 --shape 128,8,2048,768 --tokens 256 --blocks 24
  pb qwen3_dn_1024 --shape 128,8,2048,768 --tokens 1024 --blocks 80
  pb deepseek_dn_1024 --shape 256,8,7168,256 --tokens 1024 --blocks 48
  T 150 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up --tokens 256,1024 $MOE \
    --humming --no-baselines --json "$OUT/moe_small_qwen3.json" > "$OUT/moe_small_qwen3.log" 2>&1
  echo "qwen3 rc=$?"; grep -E "T=|rror" "$OUT/moe_small_qwen3.log" | cut -c1-300
  T 100 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 1024 $MOE \
    --humming --no-baselines --json "$OUT/moe_small_ds.json" > "$OUT/moe_small_ds.log" 2>&1
  echo "deepseek rc=$?"; grep -E "T=|rror" "$OUT/moe_small_ds.log" | cut -c1-300
  pb mixtral_gu_small --shape 8,2,28672,4096 --tokens 64,256 --blocks 24,80
  pb mixtral_dn_small --shape 8,2,4096,14336 --tokens 64,256 --blocks 24,80
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
