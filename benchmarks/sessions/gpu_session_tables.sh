#!/usr/bin/env bash
# The dense tables call (~8.5 minutes on an H200), prepared 2026-11-29 session 6: the 8192^2
# ladder with its plot, the Llama-3-8B projections (issue 3), the other A16 formats at
# decode (issue 3: >= 2.2 TB/s).  Step timeouts sum to 500 s (an H100 needs ~30 % more for the
# first two: LADDER_T, LLAMA_T; session 65).  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step dense_ladder
T ${LADDER_T:-200} python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 \
  --ms 1,16,128,1024,4096 --humming --calls 20 --repeats 2 --plot \
  --json "$OUT/dense_8192.json" > "$OUT/dense_8192.log" 2>&1
grep -E "^\|" "$OUT/dense_8192.log" | cut -c1-250
step llama
T ${LLAMA_T:-190} python3 benchmarks/bench_dense.py \
  --shapes llama3-8b-qkv,llama3-8b-o,llama3-8b-gate_up,llama3-8b-down --ms 1,16,128 \
  --specs w4a16-g128-zp,w4a16-mxfp4 --humming --calls 20 --repeats 2 --plot \
  --json "$OUT/dense_llama.json" > "$OUT/dense_llama.log" 2>&1
grep -E "^\|" "$OUT/dense_llama.log" | cut -c1-250
step a16_formats
T 110 python3 benchmarks/bench_dense.py --ms 1,16 --no-baselines --calls 20 --repeats 2 \
  --specs w8a16,w8a16-fp8,w4a16-g128,w4a16-ch,w4a16-mxint4 \
  --json "$OUT/dense_formats.json" > "$OUT/dense_formats.log" 2>&1
grep -E "^\|" "$OUT/dense_formats.log" | cut -c1-250
step done
