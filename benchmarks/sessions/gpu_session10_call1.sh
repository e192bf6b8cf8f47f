#!/usr/bin/env bash
# Session 10, device call 1 (~9 minutes on an H200).  Carry: [".whl"].
#   1. GPU tests of the Mosaic WnA16 kernels: the K-split default path was restructured
#      after session 9's last device call (reviewed identical; interpreter + lowering only),
#      and the shared-x mode (split_warpgroups="n") never ran on a GPU.
#   2. Nsight Compute on the decode kernel (never measured: NOTES.md v5's "issue-bound at
#      ~0.5 IPC" hypothesis), the 128-row tile and the DeepSeek-V3 grouped gate_up at 64
#      tokens (0.58x Humming).
#   3. Shared x tiles: CUPTI profile (dense) and the grouped gate_up shapes, @mgpu vs @mgpu-xn.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
step gpu_tests
T 150 python3 -m pytest tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "configs_gpu or shared_x or quant_dense_gpu" -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
step ncu
NCU="ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1 --launch-count 1
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
  --section InstructionStats --section SourceCounters"
T 60 $NCU python3 benchmarks/probe_ncu.py --case dense --m 1 > "$OUT/ncu_dense_m1.log" 2>&1
echo "rc=$?"; grep -E "probe_ncu|Duration|Throughput|Issue Slots|Issued Ipc|No Eligible|Active Warps|Registers|==ERR|==WARN" \
  "$OUT/ncu_dense_m1.log" | cut -c1-160 | head -30
T 50 $NCU python3 benchmarks/probe_ncu.py --case dense --m 128 > "$OUT/ncu_dense_m128.log" 2>&1
grep -E "Duration|DRAM Throughput|Issue Slots|Issued Ipc" "$OUT/ncu_dense_m128.log" | head -6
T 60 $NCU python3 benchmarks/probe_ncu.py --case grouped --m 64 --k 7168 --n 512 \
  > "$OUT/ncu_grouped_ds64.log" 2>&1
grep -E "Duration|DRAM Throughput|Issue Slots|Issued Ipc|Grid Size" "$OUT/ncu_grouped_ds64.log" | head -6
step profile_shared_x
T 70 python3 benchmarks/profile_mgpu.py --ms 128,64 \
  --configs default,wg4-acc-xn,wg2-xn,wg2-xn-split2 --iterations 3 \
  > "$OUT/profile_shared_x.log" 2>&1
grep -E "^M=" "$OUT/profile_shared_x.log" | cut -c1-220
step moe_shared_x
T 140 python3 benchmarks/bench_moe.py \
  --shapes deepseek-v3-gate_up,mixtral-gate_up,qwen3-30b-a3b-gate_up --tokens 64,1024 \
  --specs w4a16-g128-zp@mgpu,w4a16-g128-zp@mgpu-xn --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_shared_x.json" > "$OUT/moe_shared_x.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_shared_x.log" | cut -c1-300
step done
