#!/usr/bin/env bash
# The next device call (about 9 minutes on an H200), prepared 2026-11-29 session 5.
# Open since the last GPU runs (benchmarks/NOTES.md v7):
#   0. re-confirm the Mosaic WnA16 kernel after its body moved into a per-tile function
#      (quant_dense / configs GPU tests; last H200 run 17:17 UTC, before that change);
#   1. MgpuConfig.fp4_whole_registers (the int4 relayout inside the inline PTX block, so each
#      fp4 pair's PTX reads its 32-bit register: ~3 instructions fewer per pair) -- GPU test
#      and CUPTI time against the default, then flip it on if faster and correct;
#   2. the launch gap (wall - kernel = 3-15 us per decode layer): does XLA put the Mosaic
#      custom calls in a command buffer (CUDA graph)?  The tiny-layer chain with the default
#      flags and with command buffers off;
#   3. the Mosaic grouped WnA16 kernel (kernels/grouped_wna16_mgpu.py: interpreter-exact,
#      lowers for the H200, never run on a GPU): its GPU tests, then Qwen3 decode rows
#      beside the Triton grouped kernel and Humming (issue 5's decode gap is ~3x).
# (Still open after this call: MXFP4 / NVFP4 at M = 128, the Llama-3-8B table.)
# Step timeouts (SIGINT, SIGKILL 5 s later) sum to 540 s.  Carry: [".whl"].
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 200 python3 -m pytest tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
  -k "quant_dense or whole or configs or qwen3" -p no:cacheprovider --tb=short -q \
  -W ignore::DeprecationWarning > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -8
step profile_fp4
for s in w4a16-mxfp4 w4a16-nvfp4; do
  T 50 python3 benchmarks/profile_mgpu.py --spec $s --ms 1,16 --configs default,whole \
    --layers 8 --iterations 3 >> "$OUT/profile_fp4.log" 2>&1
done
grep -E "^M=|^#" "$OUT/profile_fp4.log" | cut -c1-200
step launch_gap
T 60 python3 benchmarks/profile_mgpu.py --overhead --overhead-cases mosaic,xla \
  > "$OUT/overhead_default.log" 2>&1
XLA_FLAGS=--xla_gpu_enable_command_buffer= T 60 python3 benchmarks/profile_mgpu.py \
  --overhead --overhead-cases mosaic,xla > "$OUT/overhead_no_cmdbuf.log" 2>&1
grep -H "^overhead" "$OUT"/overhead_*.log | cut -c1-220
step moe_mgpu
T 120 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down \
  --tokens 1,16 --specs w4a16-g128-zp,w4a16-g128-zp@mgpu,w4a16-mxfp4@mgpu --layers 2 \
  --calls 20 --repeats 2 --humming --json "$OUT/moe_mgpu.json" > "$OUT/moe_mgpu.log" 2>&1
grep -E "^qwen|rror" "$OUT/moe_mgpu.log" | cut -c1-300
step done
