#!/usr/bin/env bash
# Session 24 device calls (2026-12-01/02): x tiles TMA-multicast to clusters of column CTAs
# (Config.cluster_n, HUMMING_JAX_CLUSTER_N).  Every log goes to $OUT first.
#   verify:  GPU tests of the cluster path (grouped fp8 / 16-bit, dense shared-x configs)
#   probe:   probe_fp8_moe.py --cluster: Mixtral gate_up / down and Qwen3-30B-A3B gate_up at
#            1024 tokens, W4A8 MXFP4 (fp8 MMA) and W4A16 MXFP4 (16-bit route)
#   default: GPU tests of the heuristic's clusters; probe_exact_mxfp4.py
#   ncu:     Nsight Compute L2 / DRAM bytes and warp stalls of Mixtral gate_up at 1024 tokens,
#            HUMMING_JAX_CLUSTER_N=1 / 2 (session 22 call 7's metrics)
#   layer:   bench_moe_layer Mixtral W4A8 MXFP4 at 1024 tokens, HUMMING_JAX_CLUSTER_N=1 / default
#   moetests: tests/test_moe.py and test_grouped_wna16_mgpu.py -m gpu
#   moe:     bench_moe Mixtral gate_up / down, 1024 / 4096 tokens, W4A8 MXFP4 with Humming,
#            HUMMING_JAX_CLUSTER_N=1 / 2 (every shared-x launch)
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
PYT="python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA -W ignore::DeprecationWarning"
s_verify() {
  T 240 $PYT tests/test_grouped_wnam_mgpu.py tests/test_wna16_mgpu.py -m gpu -s \
    -k "cluster or test_configs_gpu" > "$OUT/verify.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/verify.log" | cut -c1-250 | tail -24
}
s_probe() {
  for preset in w4a8-mxfp4 w4a16-mxfp4; do
    for shape in 8,2,28672,4096 8,2,4096,14336 128,8,1536,2048; do
      T 150 python3 benchmarks/probe_fp8_moe.py --cluster --preset $preset --shape $shape \
        --tokens 1024 >> "$OUT/probe_$preset.log" 2>&1
      echo "rc=$?"
    done
    grep -E "^E[0-9]|rror" "$OUT/probe_$preset.log" | cut -c1-400
  done
}
s_moe() {  # the grouped GEMM with Humming in the same run, per cluster size
  for cl in 1 2; do
    for shape in mixtral-gate_up mixtral-down; do
      HUMMING_JAX_CLUSTER_N=$cl T 130 python3 benchmarks/bench_moe.py --shapes $shape \
        --tokens 1024,4096 --specs w4a8-mxfp4 --humming --no-baselines --chain resident \
        --span --calls 10 --repeats 2 --json "$OUT/moe_${shape}_cl$cl.json" \
        > "$OUT/moe_${shape}_cl$cl.log" 2>&1
      echo "HUMMING_JAX_CLUSTER_N=$cl rc=$?"; grep -E "T=|rror" "$OUT/moe_${shape}_cl$cl.log" | cut -c1-300
    done
  done
}
s_default() {  # the heuristic's clusters (fp8 tiles over 80 rows) through hj.quant_ragged_dot
  T 200 $PYT tests/test_grouped_wnam_mgpu.py -m gpu -k "fp8_mma_gpu" > "$OUT/default.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed|rel err" "$OUT/default.log" | cut -c1-250 | tail -10
  T 120 python3 benchmarks/probe_exact_mxfp4.py > "$OUT/exact_mxfp4.log" 2>&1
  echo "rc=$?"; grep -vE "Warning|warn" "$OUT/exact_mxfp4.log" | tail -6 | cut -c1-250
}
s_ncu() {  # L2 / DRAM bytes of the Mixtral gate_up tile at 1024 tokens, clusters of 1 / 2
  command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  for cl in 1 2; do
    HUMMING_JAX_CLUSTER_N=$cl T 150 ncu --clock-control none --kernel-name regex:mosaic_gpu \
      --launch-skip 1 --launch-count 1 --section WarpStateStats --metrics \
      dram__bytes_read.sum,gpu__time_duration.sum,lts__t_bytes.sum,lts__t_sectors_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active \
      python3 benchmarks/probe_ncu.py --spec w4a8-mxfp4 --case grouped8 --m 1024 --k 4096 \
      --n 28672 --experts 8 --topk 2 > "$OUT/ncu_cl$cl.log" 2>&1
    echo "cl$cl rc=$?"; grep -E "mosaic_gpu_kernel \(|__|Stall|Warp Cycles|rror" "$OUT/ncu_cl$cl.log" | cut -c1-160 | head -16
  done
}
s_layer() {  # the whole Mixtral W4A8 layer (quant_moe), unclustered against the default
  for cl in 1 default; do
    if [ $cl = default ]; then unset HUMMING_JAX_CLUSTER_N; else export HUMMING_JAX_CLUSTER_N=$cl; fi
    T 170 python3 benchmarks/bench_moe_layer.py --models mixtral --tokens 1024 \
      --spec w4a8-mxfp4 --families default --breakdown --calls 10 --repeats 2 \
      --json "$OUT/layer_cl$cl.json" > "$OUT/layer_cl$cl.log" 2>&1
    echo "cluster $cl rc=$?"; grep -E "^\{|rror|mosaic" "$OUT/layer_cl$cl.log" | cut -c1-250 | head -8
  done
  unset HUMMING_JAX_CLUSTER_N
}
s_moetests() {  # the MoE layer and grouped 16-bit GPU tests on the new default
  T 200 $PYT tests/test_moe.py tests/test_grouped_wna16_mgpu.py -m gpu -x > "$OUT/moetests.log" 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|^E |passed|failed" "$OUT/moetests.log" | cut -c1-250 | tail -8
}
for s in ${@:-verify}; do step "$s"; "s_$s"; done
step done
