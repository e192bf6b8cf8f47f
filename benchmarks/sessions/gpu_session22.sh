#!/usr/bin/env bash
# Session 22 device calls (2026-12-01).  Call 1 was `gpu_session_next.sh verify layer`: its
# verify output went through a pipe the timeout killed (lost), and the layer step stalled
# in Mosaic GPU layout inference (results/2026-12-01-session22/call1).  Steps here write
# every log to $OUT first and print from the file.
#   diag:    probe_layout_hang.py on the stalled case (Qwen3-30B-A3B W4A8, 1024 tokens, 8 layers)
#   verify:  as gpu_session_next.sh's (quantize-first GPU test, grouped fp8 tests)
#   layerq:  bench_moe_layer DeepSeek-V3 W4A8 16/64/1024 with HUMMING_JAX_MOE_QUANTIZE_FIRST=1
#            (call 1 has the =0 row; chain of 8 as there)
#   dense128: dense W4A8 MXFP4 8192^2 at M = 128 / 4096, HUMMING_JAX_DENSE_FP8_MMA=0 / 1
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_diag() {
  mkdir -p "$OUT/diag"
  T 100 python3 benchmarks/probe_layout_hang.py --model qwen3-30b-a3b --tokens 1024 \
    --layers 8 --limit 90 --out "$OUT/diag" > "$OUT/diag.log" 2>&1
  echo "rc=$?"; grep -E "infer_layout #|lowered|Thread|File \"/work" "$OUT/diag.log" | head -40 | cut -c1-200
  ls "$OUT/diag" | tail -2
}
s_verify() {
  T 240 $PYT tests/test_moe.py tests/test_grouped_wnam_mgpu.py -m gpu \
    -k "quantizes_tokens_first or fp8_mma_gpu or deepseek" > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR|PASSED)|^E |passed|failed|rel err" "$OUT/verify.log" | cut -c1-250 | tail -20
}
s_layerq() {
  HUMMING_JAX_MOE_QUANTIZE_FIRST=1 T 200 python3 benchmarks/bench_moe_layer.py \
    --models deepseek-v3 --tokens 16,64,1024 --spec w4a8-mxfp4 --families default \
    --breakdown --calls 10 --repeats 2 --json "$OUT/layer_w4a8_qfirst1.json" \
    > "$OUT/layer_w4a8_qfirst1.log" 2>&1
  echo "rc=$?"; grep -E "^\{" "$OUT/layer_w4a8_qfirst1.log" | cut -c1-200
}
s_dense128() {
  for flag in 0 1; do
    HUMMING_JAX_DENSE_FP8_MMA=$flag T 130 python3 benchmarks/bench_dense.py \
      --shapes 8192x8192 --ms 128,4096 --specs w4a8-mxfp4 --humming --kernel-times \
      --calls 10 --repeats 2 --json "$OUT/dense_w4a8_fp8mma$flag.json" \
      > "$OUT/dense_w4a8_fp8mma$flag.log" 2>&1
    echo "HUMMING_JAX_DENSE_FP8_MMA=$flag rc=$?"; grep -E "^8192|rror" "$OUT/dense_w4a8_fp8mma$flag.log" | cut -c1-330
  done
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
# Calls 3-7 (as run; each from the repo root, `source benchmarks/gpu_env.sh` first):
#   3: pytest tests/test_moe.py -m gpu -k quantizes_tokens_first -s  (the operands' report)
#   4: bash benchmarks/gpu_session22_fold.sh
#   5: ncu --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis
#        python3 benchmarks/probe_ncu.py --spec w4a8-mxfp4 --case grouped8 --m 1024 --k 4096
#        --n 28672 --experts 8 --topk 2   (ncu --clock-control none --kernel-name
#        regex:mosaic_gpu --launch-skip 1 --launch-count 1, as s_ncu in gpu_session_next.sh)
#   6: the same launch with --metrics launch__registers_per_thread, local / shared loads,
#        stall ratios; and --case dense8 --m 128
#   7: the grouped8 launch with --metrics lts__t_bytes.sum, lts__t_sectors_op_read.sum,
#        lts__t_sectors_srcunit_tex_op_read.sum, dram__bytes_read.sum
