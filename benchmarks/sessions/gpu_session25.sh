#!/usr/bin/env bash
# Session 25 device calls (2026-12-02).  Every log goes to $OUT first.
#   verify: GPU tests not run before (test_cluster_dense_gpu, test_cluster_gpu's launch
#           check) and the static-slot GPU tests (Config.static_slots)
#   rate:   probe_wgmma_rate.py: the fp8 tile's loop body with no memory traffic (register-A
#           fp8 WGMMA rate, + conversion, + per-tile / per-group partials; bf16 beside it),
#           with ptxas' register counts
#   slots:  Config.static_slots against the rolled loop: dense 8192^2 decode / M = 128
#           (profile_mgpu.py), grouped fp8 Mixtral gate_up 1024 tokens and DeepSeek-V3
#           gate_up 64 tokens (probe_fp8_moe.py --slots).  Call 1 ran verify, rate and
#           slots at commit 396c33a; static slots were 1.6-2.5x slower and were reverted
#           (c2faa0e), so `slots` and the static-slot tests of `verify` no longer exist.
#   single: Config.fp8_single_acc (one accumulator, the fold against each column's max):
#           GPU tests, probe_fp8_moe.py --single on Mixtral gate_up / down and DeepSeek-V3
#   moe:    bench_moe Mixtral gate_up / down, 1024 / 4096 tokens, W4A8 MXFP4 with Humming,
#           HUMMING_JAX_FP8_SINGLE_ACC=1 (call 3, at 0982b26: then an opt-in)
#   default: the one-accumulator tiles as the grouped default for ":cf" weights: GPU tests,
#           bench_moe Mixtral with Humming, the whole Mixtral W4A8 layer at 1024 tokens
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_verify() {
  T 200 $PYT tests/test_wna16_mgpu.py tests/test_grouped_wnam_mgpu.py -m gpu \
    -k "cluster or static_slots" > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT/verify.log" | cut -c1-250 | tail -16
}
s_rate() {
  for bw in "128 2" "64 4" "128 1"; do
    set -- $bw
    MOSAIC_GPU_DUMP_PTXAS=1 T 100 python3 benchmarks/probe_wgmma_rate.py --block-m $1 --wgs $2 \
      > "$OUT/rate_bm$1_wg$2.log" 2>&1
    echo "bm$1 wg$2 rc=$?"; grep -E "TFLOP|FAILED|rror" "$OUT/rate_bm$1_wg$2.log" | cut -c1-200
    grep -E "Used [0-9]+ registers" "$OUT/rate_bm$1_wg$2.log" | sed -E 's/.*(Used [0-9]+ registers).*/\1/' | tr '\n' ';'; echo
  done
}
s_slots() {
  for spec in w4a16-g128-zp w4a16-mxfp4; do
    T 150 python3 benchmarks/profile_mgpu.py --spec $spec --ms 1,16,128 --configs default,ss \
      > "$OUT/slots_dense_$spec.log" 2>&1
    echo "$spec rc=$?"; grep -E "^M=" "$OUT/slots_dense_$spec.log" | cut -c1-200
  done
  for st in "8,2,28672,4096 1024" "256,8,512,7168 64"; do
    set -- $st
    T 120 python3 benchmarks/probe_fp8_moe.py --slots --shape $1 --tokens $2 \
      > "$OUT/slots_moe_$2.log" 2>&1
    echo "moe $1 T=$2 rc=$?"; grep -E "^E[0-9]|rror" "$OUT/slots_moe_$2.log" | cut -c1-300
  done
}
s_single() {  # Config.fp8_single_acc (opt-in): GPU tests, then the grouped fp8 launches
  T 150 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "single_acc" > "$OUT/single.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/single.log" | cut -c1-250 | tail -8
  for st in "8,2,28672,4096 1024" "8,2,4096,14336 1024" "8,2,28672,4096 4096" "256,8,512,7168 64"; do
    set -- $st
    T 130 python3 benchmarks/probe_fp8_moe.py --single --shape $1 --tokens $2 \
      > "$OUT/single_$1_$2.log" 2>&1
    echo "moe $1 T=$2 rc=$?"; grep -E "^E[0-9]|rror" "$OUT/single_$1_$2.log" | cut -c1-400
  done
}
s_moe() {  # HUMMING_JAX_FP8_SINGLE_ACC=1 (the grouped heuristic's opt-in) with Humming
  for shape in mixtral-gate_up mixtral-down; do
    HUMMING_JAX_FP8_SINGLE_ACC=1 T 200 python3 benchmarks/bench_moe.py --shapes $shape \
      --tokens 1024,4096 --specs w4a8-mxfp4 --humming --no-baselines --chain resident \
      --span --calls 10 --repeats 2 --json "$OUT/moe_${shape}_single.json" \
      > "$OUT/moe_${shape}_single.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|rror" "$OUT/moe_${shape}_single.log" | cut -c1-300
  done
}
s_default() {  # the one-accumulator tiles as the default for ":cf" weights (eager prepare)
  T 170 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -s -k "single_acc or fp8_mma_gpu" \
    > "$OUT/default.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/default.log" | cut -c1-250 | tail -12
  for shape in mixtral-gate_up mixtral-down; do
    T 110 python3 benchmarks/bench_moe.py --shapes $shape --tokens 1024 \
      --specs w4a8-mxfp4 --humming --no-baselines --chain resident --span --calls 10 \
      --repeats 2 --json "$OUT/moe_$shape.json" > "$OUT/moe_$shape.log" 2>&1
    echo "$shape rc=$?"; grep -E "T=|rror" "$OUT/moe_$shape.log" | cut -c1-300
  done
  T 130 python3 benchmarks/bench_moe_layer.py --models mixtral --tokens 1024 \
    --spec w4a8-mxfp4 --families default --breakdown --calls 10 --repeats 2 \
    --json "$OUT/layer.json" > "$OUT/layer.log" 2>&1
  echo "layer rc=$?"; grep -E "^\{|rror|mosaic" "$OUT/layer.log" | cut -c1-250 | head -8
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
