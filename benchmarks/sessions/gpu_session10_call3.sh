#!/usr/bin/env bash
# Session 10, device call 3 (~5 minutes on an H200).  Carry: [".whl"].
# The grouped launch-shape sweep that decides grouped_wna16_mgpu.heuristic (call 2: shared
# x tiles win at Qwen3 64 / 1024 tokens and the 16+-row tiles of call 1, lose at DeepSeek-V3
# gate_up 64 tokens): decode (1 token) on all four narrow-expert shapes -- the split-K
# default vs split 1, shared x with 4 / 2 warpgroups, one warpgroup -- and the DeepSeek-V3
# down / Mixtral prefill rows not yet timed.  Then the SASS of the dense decode kernel.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
V=w4a16-g128-zp
step moe_decode_sweep
T 150 python3 benchmarks/bench_moe.py \
  --shapes deepseek-v3-gate_up,qwen3-30b-a3b-gate_up,qwen3-30b-a3b-down,deepseek-v3-down \
  --tokens 1 --specs $V@mgpu,$V@mgpu:split1,$V@mgpu:xn,$V@mgpu:wg2-xn,$V@mgpu:wg1 \
  --no-baselines --calls 10 --repeats 2 --json "$OUT/moe_decode_sweep.json" \
  > "$OUT/moe_decode_sweep.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_decode_sweep.log" | cut -c1-700
step moe_prefill
T 90 python3 benchmarks/bench_moe.py --shapes deepseek-v3-down --tokens 64,1024 \
  --specs $V@mgpu,$V@mgpu:xn,$V@mgpu:wg2-xn --no-baselines --calls 10 --repeats 2 \
  --json "$OUT/moe_prefill_ds_down.json" > "$OUT/moe_prefill_ds_down.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_prefill_ds_down.log" | cut -c1-500
T 60 python3 benchmarks/bench_moe.py --shapes mixtral-gate_up --tokens 1024 \
  --specs $V@mgpu:xn --no-baselines --calls 10 --repeats 2 \
  --json "$OUT/moe_prefill_mixtral.json" > "$OUT/moe_prefill_mixtral.log" 2>&1
grep -E "hj:|rror" "$OUT/moe_prefill_mixtral.log" | cut -c1-300
step sass
mkdir -p "$OUT/sass"
MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO="$OUT/sass" T 40 python3 benchmarks/probe_ncu.py \
  --case dense --m 1 --runs 1 > "$OUT/sass.log" 2>&1
ls "$OUT/sass" | head; wc -c "$OUT/sass.log"
step done
