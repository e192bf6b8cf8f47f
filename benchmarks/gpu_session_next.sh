#!/usr/bin/env bash
# The next device call (about 9 minutes on an H200), prepared 2026-11-29 session 5.
# Open since the last GPU runs (benchmarks/NOTES.md v7):
#   1. MgpuConfig.fp4_whole_registers (the int4 relayout inside the inline PTX block, so each
#      fp4 pair's PTX reads its 32-bit register: ~3 instructions fewer per pair) -- GPU test
#      and CUPTI time against the default, then flip it on if faster and correct;
#   2. the launch gap (wall - kernel = 3-15 us per decode layer): does XLA put the Mosaic
#      custom calls in a command buffer (CUDA graph)?  The tiny-layer chain with the default
#      flags and with command buffers off;
#   3. MXFP4 / NVFP4 at M = 128 and the Llama-3-8B down projection (cut by timeouts so far).
# Step timeouts (SIGINT, SIGKILL 5 s later) sum to 560 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 120 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "whole or global_scale" \
  -p no:cacheprovider --tb=short -q -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -8
step profile_fp4
for s in w4a16-mxfp4 w4a16-nvfp4; do
  T 60 python3 benchmarks/profile_mgpu.py --spec $s --ms 1,16 --configs default,whole \
    --layers 8 --iterations 3 >> "$OUT/profile_fp4.log" 2>&1
done
grep -E "^M=|^#" "$OUT/profile_fp4.log" | cut -c1-200
step launch_gap
T 80 python3 benchmarks/profile_mgpu.py --overhead --overhead-cases mosaic,xla \
  > "$OUT/overhead_default.log" 2>&1
XLA_FLAGS=--xla_gpu_enable_command_buffer= T 80 python3 benchmarks/profile_mgpu.py \
  --overhead --overhead-cases mosaic,xla > "$OUT/overhead_no_cmdbuf.log" 2>&1
grep -H "^overhead" "$OUT"/overhead_*.log | cut -c1-220
step dense
T 160 python3 benchmarks/bench_dense.py --specs w4a16-mxfp4,w4a16-nvfp4,w4a16-g128-zp \
  --ms 128 --layers 8 --calls 10 --repeats 2 --humming --json "$OUT/dense128.json" \
  > "$OUT/dense128.log" 2>&1
grep -E "^8192|ERROR|rror" "$OUT/dense128.log" | cut -c1-250
step done
