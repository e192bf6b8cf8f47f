#!/usr/bin/env bash
# Session 19's device calls (2026-12-01).  Usage: gpu_session19.sh STEP...  Carry: [".whl"].
#   sass: Nsight Compute source counters (per-SASS-instruction executed counts and stall
#      samples) of the decode kernel at 8192^2 M = 1 (int4 g128 zp, MXFP4) and the grouped
#      MXFP4 DeepSeek-V3 gate_up at 64 tokens: which instructions the K loop issues per
#      weight (NOTES.md v16's next measurement).  Reports and SASS CSVs under $OUT.
#   metadata: GPU tests of the fold with METADATA_* at session 19's probe winner, then
#      W4A8 MXFP4 at M = 1024 / 4096 with Humming in the same run.
source "$(dirname "$0")/../gpu_env.sh"
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
command -v ncu >/dev/null || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)"
s_sass() {
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  local NCU="ncu --clock-control none --kernel-name regex:mosaic_gpu --launch-skip 1
    --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight"
  for c in "dense_int4:--case dense --m 1 --spec w4a16-g128-zp" \
           "dense_mxfp4:--case dense --m 1 --spec w4a16-mxfp4" \
           "grouped_mxfp4_64:--case grouped --m 64 --k 7168 --n 512 --spec w4a16-mxfp4"; do
    local name=${c%%:*} args=${c#*:}
    T 90 $NCU -f -o "$OUT/$name" python3 benchmarks/probe_ncu.py $args > "$OUT/ncu_$name.log" 2>&1
    echo "$name rc=$?"; grep -E "==ERR|rror" "$OUT/ncu_$name.log" | head -3
    T 40 ncu -i "$OUT/$name.ncu-rep" --page source --print-source sass --csv \
      > "$OUT/sass_$name.csv" 2> "$OUT/sass_$name.err"
    echo "  sass rows $(wc -l < "$OUT/sass_$name.csv")"; head -c 300 "$OUT/sass_$name.err"
    T 40 ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/details_$name.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc A" "$OUT/details_$name.txt" | head -5
  done
}
s_metadata() {
  T 150 python3 -m pytest tests/test_carrier_unpack.py tests/test_wnam_mgpu.py -m gpu \
    -k "carrier or metadata or fold or unpack" -p no:cacheprovider -o addopts="" \
    --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | tail -12
  T 200 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1024,4096 \
    --specs w4a8-mxfp4 --humming --kernel-times --calls 5 --repeats 2 \
    --json "$OUT/dense_mxfp4.json" > "$OUT/dense_mxfp4.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_mxfp4.log" | cut -c1-330
}
#   permuted: the permuted K order of the 4-bit layout (built after call 2's SASS profile):
#      GPU tests (bit-equal to the K-order layout through the PTX paths; configs; grouped
#      decode), CUPTI kernel times permuted vs K order (probe_permuted.py), and the
#      DeepSeek-V3 gate_up MoE rows of call 1 on the new default.
s_permuted() {
  T 200 python3 -m pytest tests/test_wna16_mgpu.py tests/test_grouped_wna16_mgpu.py -m gpu \
    -k "int4_ptx_gpu or fp4_whole_registers_gpu or configs_gpu or qwen3_decode_gpu or split_k_gpu" \
    -p no:cacheprovider -o addopts="" --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | tail -14
  T 150 python3 benchmarks/probe_permuted.py 2>&1 | grep -E "M=|rror" | cut -c1-400
  for spec in w4a16-g128-zp w4a8-mxfp4; do
    T 100 python3 benchmarks/bench_moe.py --shapes deepseek-v3-gate_up --tokens 1,64 \
      --specs $spec --humming --no-baselines --chain resident --span --calls 20 \
      --repeats 2 --json "$OUT/moe_$spec.json" > "$OUT/moe_$spec.log" 2>&1
    grep -E "T=|rror" "$OUT/moe_$spec.log" | cut -c1-300
  done
}
#   (A record: the unpermute / fp4float steps used probe_permuted.py --modes, removed with
#   the three slower ways of undoing the permutation after the session; NOTES.md v21.)
#   large_m: call 4 found the MXFP4 dequantization fusion 30x slower when the permutation
#      was undone on the codes before their decode (1263 us); now undone in the values'
#      transpose.  Probe at M = 1024 / 4096, then the W4A16 decode ladder with Humming.
s_large_m() {
  T 100 python3 benchmarks/probe_permuted.py --ms 1024,4096 2>&1 | grep -E "M=|rror" | cut -c1-400
  T 240 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16,128 \
    --specs w4a16-g128-zp,w4a16-mxfp4 --humming --kernel-times --calls 20 --repeats 2 \
    --json "$OUT/dense_w4a16.json" > "$OUT/dense_w4a16.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_w4a16.log" | cut -c1-330
}
#   unpermute: call 5 found the values-transpose form slow for int4 too (1276 us): the
#      three wna16_mgpu.UNPERMUTE modes timed at M = 1024 / 4096, the large-M GPU tests,
#      then the W8A8 / W4A8 decode rows queued since session 18 (issue 4's M <= 16 targets).
s_unpermute() {
  T 150 python3 benchmarks/probe_permuted.py --ms 1024,4096 2>&1 | grep -E "M=|rror" | cut -c1-500
  T 120 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "dequant_gemm_output_gpu or quant_dense_gpu" \
    -p no:cacheprovider -o addopts="" --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | tail -8
  T 180 python3 benchmarks/bench_dense.py --shapes 8192x8192 --ms 1,16 \
    --specs w8a8-int8,w8a8-fp8,w4a8-fp8,w4a8-mxfp4 --humming --kernel-times --calls 20 \
    --repeats 2 --json "$OUT/dense_decode.json" > "$OUT/dense_decode.log" 2>&1
  grep -E "^8192|rror" "$OUT/dense_decode.log" | cut -c1-330
}
#   fp4float: call 6 found every fp4 mode but "codes" (1263 us) 16-33 % slower than the
#      K-order layout at large M; the "float" decode (e2m1 in float arithmetic after the
#      int4 convert, the form XLA fused well for int4), with the fp4 large-M GPU tests.
s_fp4float() {
  T 100 python3 benchmarks/probe_permuted.py --specs w4a16-mxfp4,w4a16-nvfp4 --ms 1024,4096 \
    --modes float 2>&1 | grep -E "M=|rror" | cut -c1-500
  T 90 python3 -m pytest tests/test_wna16_mgpu.py -m gpu -k "quant_dense_gpu and fp4" \
    -p no:cacheprovider -o addopts="" --tb=short -rA -W ignore::DeprecationWarning 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E |passed|failed" | cut -c1-300 | tail -6
}
for s in "$@"; do step "$s"; "s_$s"; done
step done
