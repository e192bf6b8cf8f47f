#!/usr/bin/env bash
# Session 35 device calls (2026-12-03; every log to $OUT; carry [".whl"]):
#   `cb`: the GPU test of MgpuConfig.column_blocks (DeepSeek-V3 down, bit-equal to one
#         block per CTA), then DeepSeek-V3 down timed with 2 / 4 / 8 column blocks per CTA
#         on the default launch (and on one warpgroup), Humming in the same process
#   `tests`: the Mosaic kernels' GPU tests (the K loop and epilogue were restructured):
#           the rest of the column-block test, the new DeepSeek-V3 down default, session
#           34's two untimed tests, dense decode of three formats
#   call 3 (inline): DeepSeek-V3 down 4096 tokens, default (four warpgroups) against
#           @mgpu:wg1-after; call 4 (inline): Qwen3-30B-A3B down 64 / 256 tokens, default,
#           @mgpu:cb4, @mgpu:wg1-cb4 (bench_moe $MOE --humming --no-baselines)
#   `new`:  DeepSeek-V3 down at 16 / 1024 / 4096 tokens on the new default (streamed
#           column blocks) against the launch before (@mgpu:cb1 at 16, @mgpu:wg2-cb1 at
#           1024) and Humming
source "$(dirname "$0")/../gpu_env.sh"
s_cb() {
  gpu_tests ${TT:-180} "column_blocks_gpu" tests/test_grouped_wna16_mgpu.py
  T ${ST:-390} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down \
    --tokens ${TOK:-1,64,256,1024} \
    --specs ${SPECS:-w4a16-g128-zp,w4a16-g128-zp@mgpu:cb2,w4a16-g128-zp@mgpu:cb4,w4a16-g128-zp@mgpu:cb8,w4a16-g128-zp@mgpu:wg1-cb8,w4a16-mxfp4,w4a16-mxfp4@mgpu:cb4} \
    $MOE --humming --no-baselines --json "$OUT/cb.json" > "$OUT/cb.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/cb.log" | cut -c1-2500
}
s_tests() {
  gpu_tests ${TT:-260} "${EXPR:-(column_blocks_gpu and mxfp4 and (256 or 1024)) or (grouped_kernel_gpu and 7168x256) or triton_grouped_kernel_gpu or quant_moe_aligned_gpu or (quant_dense_gpu and (zp or fp4) and not 128 and not 1024)}" \
    tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py tests/test_grouped_kernels.py
}
s_new() {
  T ${ST:-320} python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens ${TOK:-16,1024,4096} \
    --specs ${SPECS:-w4a16-g128-zp,w4a16-g128-zp@mgpu:cb1,w4a16-g128-zp@mgpu:wg2-cb1,w4a16-mxfp4} \
    $MOE --humming --no-baselines --json "$OUT/new.json" > "$OUT/new.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/new.log" | cut -c1-2500
}
for s in ${@:-cb}; do step "$s"; "s_$s"; done
step done
