#!/usr/bin/env bash
# One device call that re-validates and re-measures everything (about 9 minutes on an H200).
# Run from the repo root on the GPU machine, with .whl (humming-kernels wheel, shared/GPU.md)
# carried:   bash benchmarks/gpu_session.sh      (logs and JSON land in $OUT)
# Each step has its own time limit so one slow step cannot eat the whole call; pytest writes
# a junit XML per file; SIGINT (not KILL) at the limit makes pytest print its summary.
source "$(dirname "$0")/gpu_env.sh"
gpu_tests() {  # file, seconds
  local name; name=$(basename "$1" .py)
  step "$name"
  timeout -s INT "$2" python3 -m pytest "$1" -m gpu -q -p no:cacheprovider --tb=line \
    --junitxml="$OUT/$name.xml" > "$OUT/$name.log" 2>&1
  grep -E "passed|failed|FAILED|Error" "$OUT/$name.log" | tail -8
}
gpu_tests tests/test_wna16_mgpu.py 110
gpu_tests tests/test_wna16.py 150
gpu_tests tests/test_w8a8.py 110
gpu_tests tests/test_grouped_kernels.py 80
gpu_tests tests/test_grouped_w8a8.py 60
gpu_tests tests/test_moe.py 40
gpu_tests tests/test_nn.py 30
step bench_dense
timeout 130 python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 \
  --ms 1,16,128,4096 --humming --calls 30 --repeats 2 --plot --json dense.json \
  > "$OUT/bench_dense.log" 2>&1; grep "^|" "$OUT/bench_dense.log"
step bench_w8a8
timeout 60 python3 benchmarks/bench_w8a8.py --specs w8a8-int8,w8a8-fp8,w4a8-mxfp4 --ms 16,4096 \
  --calls 20 --repeats 2 > "$OUT/bench_w8a8.log" 2>&1; tail -8 "$OUT/bench_w8a8.log"
step bench_moe
timeout 60 python3 benchmarks/bench_moe.py --shapes deepseek-v3-down,mixtral-gate_up \
  --tokens 1,256,4096 --specs w4a16-g128-zp --calls 20 --repeats 2 --breakdown \
  > "$OUT/bench_moe.log" 2>&1; tail -10 "$OUT/bench_moe.log"
step done
