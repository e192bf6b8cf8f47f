#!/usr/bin/env bash
# Session 10, device call 2 (~8 minutes on an H200).  Carry: [".whl"].
#   1. GPU tests: grid split-K for narrow grouped decode (new), the Qwen3 decode and the
#      aligned-layer tests on the same kernel.
#   2. Nsight Compute on the dense decode kernel (M = 1, 8192^2 int4 g128 zp) and the split
#      grouped decode; call 1's dense / grouped runs failed because XLA preallocated 75 % of
#      the GPU and ncu saved and restored it around every replay pass.
#   3. Grouped decode: DeepSeek-V3 gate_up at 1 token, split-K default vs split 1, Humming.
#   4. Shared x tiles on the grouped prefill rows call 1 did not reach (Qwen3) and the
#      accurate (scales after the MMA, heuristic warpgroups) variant @mgpu:xn.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
step gpu_tests
T 100 python3 -m pytest tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "split_k or qwen3_decode or aligned_gpu" -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|rel err" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
step ncu
NCU="ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1 --launch-count 1
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --print-details all
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
T 60 $NCU python3 benchmarks/probe_ncu.py --case dense --m 1 > "$OUT/ncu_dense_m1.log" 2>&1
echo "rc=$?"; grep -E "probe_ncu|Duration|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued|==ERR" \
  "$OUT/ncu_dense_m1.log" | cut -c1-160 | head -12
grep -E "stalled_.*ratio" "$OUT/ncu_dense_m1.log" | sort -k3 -n -r | head -8 | cut -c1-120
T 50 $NCU python3 benchmarks/probe_ncu.py --case grouped --m 1 --k 7168 --n 512 \
  > "$OUT/ncu_grouped_ds1.log" 2>&1
grep -E "Duration|DRAM Throughput|Issued Warp|==ERR" "$OUT/ncu_grouped_ds1.log" | head -5
unset XLA_PYTHON_CLIENT_PREALLOCATE
step moe_decode
T 110 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 1 \
  --specs w4a16-g128-zp,w4a16-g128-zp@mgpu:split1,w4a16-mxfp4 --humming --no-baselines \
  --breakdown --calls 10 --repeats 2 --json "$OUT/moe_decode.json" > "$OUT/moe_decode.log" 2>&1
grep -E "T=1 |rror" "$OUT/moe_decode.log" | cut -c1-600
step moe_shared_x
T 150 python3 benchmarks/bench_moe.py \
  --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down,mixtral-gate_up --tokens 64,1024 \
  --specs w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu:xn,w4a16-g128-zp@mgpu-xn --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_shared_x.json" > "$OUT/moe_shared_x.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_shared_x.log" | cut -c1-400
step done
