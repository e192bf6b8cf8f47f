#!/usr/bin/env bash
# Session 27 device calls (2026-12-02).  Every log goes to $OUT first.
# Carry: [".whl", ".ab_old"] -- .ab_old/humming_jax is the package at d87191d (the
# per-byte fold arithmetic), for same-call A/B timings against the prmt tables.
#   verify: GPU tests of every fp8-MMA route (grouped per-group / fold / one-accumulator,
#           clusters, the dense ":p8" layout, the W4A8 MoE layer) on the ":p8" words
#   ab:     probe_fp8_moe.py (CUPTI µs of the grouped kernel) with the old package and
#           with the new one, same call: Mixtral gate_up / down 1024 tokens (--blocks at
#           the chooser's pick: the default and the explicit launch)
#   ab2:    the same on DeepSeek-V3 gate_up 64 / 4096 (--single: the per-group route at
#           64 tokens beside the one-accumulator one)
#   ab3:    the same on Qwen3 gate_up 4096 and Mixtral gate_up 4096
#   rest:   the grouped GPU tests that call 1's verify step limit cut (rest2: the rest)
#   prepass: the one-pass pre-pass on the grouped fp8 route: GPU tests, Mixtral 1024 rows,
#           the layer
#   moe:    bench_moe W4A8 MXFP4 Mixtral with Humming in the same process; the layer
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
NEW=$PYTHONPATH; OLD=/tmp/site:.ab_old
s_verify() {
  T 240 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT/verify.log" | cut -c1-250 | tail -12
  T 150 $PYT tests/test_wnam_mgpu.py tests/test_moe.py -m gpu -s -k "fp8 or w4a8" \
    > "$OUT/verify2.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT/verify2.log" | cut -c1-250 | tail -12
}
ab_probe() {  # NAME ARGS...: probe_fp8_moe.py with the old package, then the new one
  local name=$1; shift
  for v in old new; do
    local pp=$NEW; [ $v = old ] && pp=$OLD
    PYTHONPATH=$pp T 150 python3 benchmarks/probe_fp8_moe.py "$@" > "$OUT/${name}_$v.log" 2>&1
    echo "$name $v rc=$?"; grep -E "^E[0-9]|rror" "$OUT/${name}_$v.log" | cut -c1-400
  done
}
s_ab() {
  ab_probe mixtral_gu_1024 --shape 8,2,28672,4096 --tokens 1024 --blocks 144
  ab_probe mixtral_dn_1024 --shape 8,2,4096,14336 --tokens 1024 --blocks 144
}
s_ab2() {
  ab_probe deepseek_gu --shape 256,8,512,7168 --tokens 64,4096 --single
}
s_rest2() {  # the ones call 2's rest step left (6 passed before its 200 s limit)
  T 230 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "cluster_gpu or groups_gpu or \
    default_choice" > "$OUT/rest2.log" 2>&1
  echo "rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed" "$OUT/rest2.log" | cut -c1-200 | tail -14
}
s_ab3() {
  ab_probe qwen3_gu_4096 --shape 128,8,1536,2048 --tokens 4096 --blocks 144
  ab_probe mixtral_gu_4096 --shape 8,2,28672,4096 --tokens 4096 --blocks 152
}
s_rest() {  # the grouped GPU tests call 1's 240 s step limit cut (after 14 passed)
  T 200 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "(fp8_mma_gpu and (256 or 512)) or \
    fold_gpu or cluster_gpu or groups_gpu or default_choice" > "$OUT/rest.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT/rest.log" | cut -c1-250 | tail -12
}
s_moe() {
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
s_prepass() {  # the one-pass pre-pass on the grouped fp8-MMA route: its GPU tests, then
  # bench_moe Mixtral at 1024 tokens with Humming, the Mixtral W4A8 layer
  T 120 $PYT tests/test_grouped_wnam_mgpu.py tests/test_moe.py -m gpu -s \
    -k "one_pass_gpu or quantizes_tokens_first_gpu" > "$OUT/prepass.log" 2>&1
  echo "rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed|pre-pass|quantize-first" \
    "$OUT/prepass.log" | cut -c1-250 | tail -8
  T 110 python3 benchmarks/bench_moe.py --shapes mixtral-gate_up,mixtral-down --tokens 1024 \
    --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 10 \
    --repeats 2 --json "$OUT/moe_1024.json" > "$OUT/moe_1024.log" 2>&1
  echo "moe rc=$?"; grep -E "T=|rror" "$OUT/moe_1024.log" | cut -c1-300
  T 90 python3 benchmarks/bench_moe_layer.py --models mixtral --tokens 1024 \
    --spec w4a8-mxfp4 --families default --breakdown --calls 10 --repeats 2 \
    --json "$OUT/layer2.json" > "$OUT/layer2.log" 2>&1
  echo "layer rc=$?"; grep -E "^\{|rror" "$OUT/layer2.log" | cut -c1-2500 | head -3
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
