#!/usr/bin/env bash
# Session 6, first measurement call (~6 min): (1) is the Mosaic WnA16 kernel short of CTAs
# at narrow N (Llama-3-8B down / o / qkv: N/64 = 64-96 CTAs for 132 SMs)? grid split-K
# 1 / 2 / 4 at M = 1, 16 (CUPTI kernel time); (2) fp4_whole_registers for NVFP4 (MXFP4:
# 21.6 -> 19.2 us kernel, 18:59 UTC); (3) where a Qwen3 decode grouped GEMM's time goes
# (Triton and Mosaic grouped kernels, CUPTI per kernel).  Carry: [".whl"].
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step narrow_n
T 150 python3 benchmarks/profile_mgpu.py --shapes 14336x4096,4096x4096,4096x6144 --ms 1,16 \
  --configs default,split2,split4 --layers 4 --iterations 3 > "$OUT/narrow_n.log" 2>&1
grep -E "^M=|^# K" "$OUT/narrow_n.log" | cut -c1-200
step nvfp4_whole
T 60 python3 benchmarks/profile_mgpu.py --spec w4a16-nvfp4 --ms 1,16 --configs default,whole \
  --layers 4 --iterations 3 > "$OUT/nvfp4_whole.log" 2>&1
grep -E "^M=" "$OUT/nvfp4_whole.log" | cut -c1-200
step moe_breakdown
T 100 python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-gate_up --tokens 1 \
  --specs w4a16-g128-zp,w4a16-g128-zp@mgpu --layers 2 --calls 20 --repeats 2 --breakdown \
  --no-baselines --json "$OUT/moe_breakdown.json" > "$OUT/moe_breakdown.log" 2>&1
grep -E "^qwen|rror" "$OUT/moe_breakdown.log" | cut -c1-600
python3 -c "import json; [print({k: v for k, v in r.items() if 'kernels' in k}) for r in json.load(open('$OUT/moe_breakdown.json'))['results']]" 2>&1 | cut -c1-800
step done
