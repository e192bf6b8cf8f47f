#!/usr/bin/env bash
# The next device call (about 9 minutes on an H200), prepared 2026-11-29:
#   1. the Mosaic WnA16 kernel's GPU tests, including the split_k / optimized_load configs
#      that only ran in the interpreter so far;
#   2. its decode sweep over tuning.mgpu_candidates (split_k, optimized_load) with Humming;
#   3. the two Flax examples on the GPU (issue 6): llama_decode and the MiniLM demo from the
#      folder written here by `python examples/minilm_demo.py --export build/minilm_demo`;
#   4. the w4a8-int8 M = 4096 shared-memory fix; 5. the grouped W8A8 kernel's GPU tests.
# Carry: [".whl", "build/minilm_demo"].  Logs land in $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
T0=$(date +%s)
step() { echo "== $1 (+$(( $(date +%s) - T0 ))s)"; }
step test_wna16_mgpu
timeout -s INT 120 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -p no:cacheprovider \
  --tb=short -rA -W ignore::DeprecationWarning > "$OUT/mgpu_tests.log" 2>&1
grep -E "PASSED|FAILED|passed|failed" "$OUT/mgpu_tests.log" | tail -20
step bench_mgpu
timeout -s INT 170 python3 benchmarks/bench_mgpu.py --specs w4a16-g128-zp --ms 1,16 --humming \
  --calls 20 > "$OUT/mgpu_sweep.log" 2>&1
grep -v "^  File\|^    " "$OUT/mgpu_sweep.log" | tail -16
step llama_decode
timeout -s INT 100 python3 examples/llama_decode.py > "$OUT/llama_decode.log" 2>&1
tail -20 "$OUT/llama_decode.log"
step minilm_demo
HF_HUB_OFFLINE=1 timeout -s INT 100 python3 examples/minilm_demo.py \
  --model-dir build/minilm_demo > "$OUT/minilm_demo.log" 2>&1
tail -20 "$OUT/minilm_demo.log"
step w4a8_int8
timeout -s INT 50 python3 -m pytest tests/test_w8a8.py -m gpu -k "w4a8-int8" -p no:cacheprovider \
  --tb=short -rA > "$OUT/w4a8_int8.log" 2>&1
tail -4 "$OUT/w4a8_int8.log"
step grouped_w8a8
timeout -s INT 60 python3 -m pytest tests/test_grouped_w8a8.py -m gpu -p no:cacheprovider \
  --tb=short -rA > "$OUT/grouped_w8a8.log" 2>&1
grep -E "PASSED|FAILED|passed|failed" "$OUT/grouped_w8a8.log" | tail -10
step done
