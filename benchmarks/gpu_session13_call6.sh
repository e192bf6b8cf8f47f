#!/usr/bin/env bash
# Session 13, device call 6 (~2.5 min; carry [".whl"]): overlap_mma reads tile j - 1's
# accumulator with wait_n=1 (the reviewer's catch: a plain read waits for every WGMMA, so
# call 1-3's overlap only hid tile 0's MMA behind tile 1's dequantization).  GPU tests of
# the overlap configs and the default decode launch; M = 1 / 16 kernel time.
source "$(dirname "$0")/gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
step gpu_tests
T 70 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "(configs_gpu and (cfg12 or cfg13)) or (int4_ptx_gpu and w4a16-g128-zp)" \
  -p no:cacheprovider --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
  | grep -E "^(FAILED|ERROR|PASSED)|passed|failed" | cut -c1-200 | tail -5
step profile
T 60 python3 benchmarks/profile_mgpu.py --ms 1,16 --spec w4a16-g128-zp --configs default \
  2>&1 | grep -E "^M=|rror" | cut -c1-250
step done
