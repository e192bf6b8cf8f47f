#!/usr/bin/env bash
# The next device call (~9 minutes on an H200), prepared 2026-11-30 session 10.
# Open since session 10 (built after the device time was spent; CPU-checked only):
#   1. MgpuConfig.int4_ptx: int4 codes and the zero point through one PTX block per pair
#      (mgpu_convert.int4_to_float_ptx; the PTX is checked by tests/test_mgpu_convert.py's
#      evaluator on every code x zero, and lowers for the H200).  GPU tests compare it bit
#      for bit with the default launch.  Prediction (NOTES.md v12): ~4.2 -> ~3.6
#      instructions per weight, ~-15 % kernel time at M = 1 (17.7 -> ~15 us).
#   2. grouped_wna16_mgpu.max_tiles <= M: at 1 token the grid no longer launches twice the
#      CTAs (Nsight Compute: 128 of 256 idle).  Prediction: a few us off DeepSeek-V3 gate_up
#      at 1 token (29.6 / 27.1 us wall, 16.9 us kernel).
#   3. The opt-in wnam_mgpu family: W4A8 / W8A8 / W4A4 at decode on the WnA16 Mosaic
#      kernel (activations fake-quantized).  Prediction: W4A8 at M <= 16 from the W8A8
#      Triton kernel's ~50 us (session 2) to W4A16's ~22 us + ~2 us of activation
#      quantization, and at M = 4096 the same 8-bit GEMM as the default (weights unpacked
#      from the WnA16 layout instead of the slab); if so, make it the default for the W4A8
#      presets (issue 4: W4A8 never slower than W4A16).
#   4. Same-run Humming rows for the grouped GEMM (weights handed over by DLPack now).
# Step timeouts sum to 570 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
step gpu_tests
T 190 python3 -m pytest tests/test_wnam_mgpu.py tests/test_wna16_mgpu.py \
  tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "int4_ptx or split_k or qwen3_decode or decode_gpu or prefill_gpu or fp4_whole or moe_aligned" \
  -p no:cacheprovider --tb=short -rA \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -12
grep -E "(int4_ptx|wnam_mgpu) .*rel err" "$OUT/gpu_tests.log" | head -12
step profile_int4_ptx
T 70 python3 benchmarks/profile_mgpu.py --spec w4a16-g128-zp --ms 1,16,128 \
  --configs default,ptx --iterations 3 > "$OUT/profile_ptx.log" 2>&1
grep -E "^M=" "$OUT/profile_ptx.log" | cut -c1-200
step ncu_int4_ptx
export XLA_PYTHON_CLIENT_PREALLOCATE=false
T 60 ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
  python3 benchmarks/probe_ncu.py --case dense --m 1 --config ptx > "$OUT/ncu_ptx_m1.log" 2>&1
grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|SM Active" \
  "$OUT/ncu_ptx_m1.log" | head -6
unset XLA_PYTHON_CLIENT_PREALLOCATE
step w4a8_wnam
T 100 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16,4096 \
  --specs w4a16-g128,w4a8-int8,w4a8-int8@wnam_mgpu \
  --calls 20 --repeats 2 --json "$OUT/w4a8_int8.json" > "$OUT/w4a8_int8.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8_int8.log" | cut -c1-250
T 60 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 16 \
  --specs w4a16-mxfp4,w4a8-mxfp4,w4a8-mxfp4@wnam_mgpu \
  --calls 20 --repeats 2 --json "$OUT/w4a8_mxfp4.json" > "$OUT/w4a8_mxfp4.log" 2>&1
grep -E "^8192|rror" "$OUT/w4a8_mxfp4.log" | cut -c1-250
step moe_with_humming
T 90 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up \
  --tokens 1,64,1024 --specs w4a16-g128-zp@mgpu --humming --no-baselines \
  --calls 10 --repeats 2 --json "$OUT/moe_humming.json" > "$OUT/moe_humming.log" 2>&1
grep -E "T=|rror" "$OUT/moe_humming.log" | cut -c1-400
step done
