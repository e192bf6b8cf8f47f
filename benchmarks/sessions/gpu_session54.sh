#!/usr/bin/env bash
# Session 54 (2026-12-06).  Steps (carry [".whl"]):
#   t54:  GPU tests of the carried formats on the Mosaic WnA16 kernel (int1-3 / uint1-3 in
#         the int4 carrier, int5-7 / uint5-7 in int8, fp6 as e4m3 bytes) and fp8 e5m2
#         (test_carried_formats_gpu: 8192^2, M = 1 / 16 / 128, prepared by name).
#   ab54: issue 3's "every other A16 format at M <= 16: >= 2.2 TB/s effective" with the
#         lowering chosen by measurement: each format on the Pallas-Triton kernel
#         (<spec>@wna16, today's default) and on the Mosaic kernel (<spec>@wna16_mgpu) in
#         one process per M, CUPTI kernel time and the effective TB/s (canonical codes +
#         scales + zero points over the layer's kernel time), int4 g128 beside them.
#         Call 1 (H100) cut it after int2 at each M: ~60 s per point through bench_dense.
#   p54:  the same A/B through benchmarks/probe_carried.py (CUPTI only, both M on one
#         prepared set, a timestamp per point): what call 2 ran; since then int4 g128 first,
#         the same-process anchor of the 4-bit carrier.
#   h8, q53, af...: the earlier sessions' steps (gpu_session53.sh).
source "$(dirname "$0")/../gpu_env.sh"
s_t54() {
  gpu_tests ${ST:-300} "${T54K:-carried_formats_gpu}" tests/test_wna16_mgpu.py
}
AB_FORMATS="int2:g128 uint1:g128:zp int3:g128 uint3:g128:zp int5:g128 int6:g128 int7:g128"
AB_FORMATS+=" uint6:g32:zp fp6_e2m3:g32:e8m0 fp6_e3m2:g128 fp8_e5m2:ch"
s_ab54() {
  local m f specs="w4a16-g128"
  for f in ${ABF:-$AB_FORMATS}; do specs+=",$f@wna16,$f@wna16_mgpu"; done
  for m in ${MS:-1 16}; do
    T ${AT:-280} python3 benchmarks/bench_dense.py --specs "$specs" --ms $m \
      --kernel-times --no-baselines --calls ${CALLS:-10} --repeats 2 \
      --json "ab54_m$m.json" > "$OUT/ab54_m$m.log" 2>&1
    echo "ab54 M=$m rc=$?"; grep -E "kernels=|rror" "$OUT/ab54_m$m.log" | cut -c1-220 | tail -30
  done
}
P54_FORMATS="w4a16-g128,int3:g128,fp6_e2m3:g32:e8m0,fp8_e5m2:ch,int6:g128,int5:g128,uint3:g128:zp"
P54_FORMATS+=",fp6_e3m2:g128,int7:g128,uint6:g32:zp,uint1:g128:zp,int2:g128"
s_p54() {
  T ${PT:-420} python3 benchmarks/probe_carried.py --formats ${PF:-$P54_FORMATS} \
    --ms ${PMS:-1,16} --json p54.json > "$OUT/p54.log" 2>&1
  echo "p54 rc=$?"; grep -E "^\+|rror" "$OUT/p54.log" | cut -c1-200 | tail -50
}
for s in ${@:-t54}; do
  case "$s" in
    t54|ab54|p54) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session53.sh" "$s" ;;
  esac
done
