#!/usr/bin/env bash
# Device call, 2026-11-29 session 3 (about 7 minutes on an H200):
#   1. where the decode layer's time goes (CUPTI per-kernel times vs chain wall time) for the
#      Mosaic WnA16 kernel's configs; 2. its SASS and ptxas resource use at M = 1;
#   3. the grouped W8A8 kernel's GPU tests after the fp8 masked-load fix;
#   4. llama_decode (issue 6) on fewer batches / recipes than its default.
# Carry: [".whl", "build/minilm_demo"].  Logs land in $OUT.
source "$(dirname "$0")/../gpu_env.sh"
step profile
timeout -s INT 200 python3 benchmarks/profile_mgpu.py --ms 1,16 \
  --configs default,st8,sub2-st6,split2,split4,split8,split4-st2,opt,split4-opt \
  > "$OUT/profile.log" 2>&1
grep -E "^M=|Error" "$OUT/profile.log" | cut -c1-400
step sass
mkdir -p "$OUT/sass"
MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/sass" \
  timeout -s INT 60 python3 benchmarks/profile_mgpu.py --ms 1 --configs default --layers 1 \
  --iterations 1 > "$OUT/sass.log" 2>&1
ls -la "$OUT/sass" | head; grep -i -E "registers|spill" -r "$OUT/sass" "$OUT/sass.log" | head -5
step grouped_w8a8
timeout -s INT 70 python3 -m pytest tests/test_grouped_w8a8.py -m gpu -p no:cacheprovider \
  --tb=short -rA > "$OUT/grouped_w8a8.log" 2>&1
grep -E "PASSED|FAILED|passed|failed" "$OUT/grouped_w8a8.log" | tail -10
step llama_decode
timeout -s INT 130 python3 examples/llama_decode.py --batches 1,8 \
  --recipes w4a16-all,w8a8-fp8-all,nvfp4-all > "$OUT/llama_decode.log" 2>&1
tail -8 "$OUT/llama_decode.log"
step done
