#!/usr/bin/env bash
# Session 53 (2026-12-06).  Steps (carry [".whl"]):
#   t53:  GPU tests of the decode pre-pass split over several programs per row
#         (act_prepass.decode_splits) and the existing one-launch pre-pass tests.
#   p53:  W8A8 decode (bench_w8a8.py --decode-study, CUPTI kernel time, one process): the
#         one-launch codes with S programs per row / W warps (decode_mgpu_s<S>[w<W>]).
#         Calls 1-2 ran before DECODE_WARPS = 8: their s<S> labels without w<W> meant 4
#         warps (now 8 at M <= 16); the defaults here name the warps (s1w4: the old form).
#   q53:  W4A8 decode (probe_w4a8_decode.py, one process): the same pre-pass variants.
#   c53:  W8A8 decode on other Mosaic launches (decode_mgpu_c<stages>x<substeps>x<wgs>).
#   r53:  the decode route GPU tests with the default the A/B picked.
#   af:   issue 3's "every other A16 format at M <= 16: >= 2.2 TB/s effective" (codes +
#         scales + zero points over the layer's time; bench_dense.py's TB/s column and
#         --kernel-times), the formats no preset names through common.spec_arg: on the
#         Pallas-Triton wna16 kernel, never timed, uint1 / int2 / uint2 / int3 / uint3 /
#         int5-7 / uint5 / fp6 e2m3 (MXFP6) and e3m2 / fp8 e5m2; beside them MXFP8 weight-
#         only (fp8_e4m3 g32 e8m0, the Mosaic kernel) and four Mosaic presets.  One run and
#         one JSON per M.  Not run yet.
#   h8, m8, t52: gpu_session52.sh's.
source "$(dirname "$0")/../gpu_env.sh"
s_t53() {
  gpu_tests ${ST:-300} "${T53K:-split or decode_codes_gpu or fake_quant_gpu}" \
    tests/test_act_prepass.py
}
s_p53() {
  BENCH_W8A8_DECODE_SPECS=${DS:-w8a8-int8,w8a8-fp8} T ${WT:-400} python3 benchmarks/bench_w8a8.py \
    --decode-study --kernel-times --ms ${MS:-1,16} --calls 20 --repeats 2 \
    --decode-labels ${LB:-decode_mgpu,decode_mgpu_s1w4,decode_mgpu_s2w8,decode_mgpu_s4w16,decode_mgpu_s8w8} \
    --json "$OUT/p53.json" > "$OUT/p53.log" 2>&1
  echo "p53 rc=$?"
  grep -E "^\{|rror" "$OUT/p53.log" | sed -E "s/'[a-z_0-9]+_kernels': \{[^}]*\}, //g" | cut -c1-900
}
s_q53() {
  T ${QT:-240} python3 benchmarks/probe_w4a8_decode.py --specs ${QS:-w4a8-fp8,w4a8-mxfp4} \
    --ms ${MS:-1,16} --variants ${QV:-s1w4,s2w8,s4w8,s4w16,s8w8} > "$OUT/q53.log" 2>&1
  echo "q53 rc=$?"; grep -E "kernels|rror" "$OUT/q53.log" | cut -c1-300
}
s_c53() {
  BENCH_W8A8_DECODE_SPECS=${DS:-w8a8-int8,w8a8-fp8} T ${WT:-400} python3 benchmarks/bench_w8a8.py \
    --decode-study --kernel-times --ms ${MS:-1,16} --calls 20 --repeats 2 \
    --decode-labels ${LC:-decode_mgpu,decode_mgpu_c5x1x4,decode_mgpu_c4x2x2,decode_mgpu_c8x1x2,decode_mgpu_c8x2x1,decode_mgpu_c12x1x1} \
    --json "$OUT/c53.json" > "$OUT/c53.log" 2>&1
  echo "c53 rc=$?"
  grep -E "^\{|rror" "$OUT/c53.log" | sed -E "s/'[a-z_0-9]+_kernels': \{[^}]*\}, //g" | cut -c1-900
}
s_r53() {
  gpu_tests ${ST:-300} "${R53K:-decode_mgpu or decode_codes_gpu or fake_quant_gpu or split or decode_gpu}" \
    tests/test_act_prepass.py tests/test_w8a8_mgpu.py tests/test_wnam_mgpu.py
}
AF_SPECS="uint1:g128:zp,int2:g128,uint2:g128:zp,int3:g128,uint3:g128:zp,int5:g128,uint5:g128:zp"
AF_SPECS+=",int6:g128,int7:g128"
AF_SPECS+=",fp6_e2m3:g32:e8m0,fp6_e3m2:g128,fp8_e5m2:ch,fp8_e4m3:g32:e8m0"
AF_SPECS+=",w4a16-ch,w4a16-mxint4,w8a16,w8a16-fp8"
s_af() {
  local m
  for m in ${MS:-1 16}; do
    T ${AT:-270} python3 benchmarks/bench_dense.py --specs ${AF:-$AF_SPECS} --ms $m \
      --kernel-times --no-baselines --calls 20 --repeats 2 --json "$OUT/af_m$m.json" \
      > "$OUT/af_m$m.log" 2>&1
    echo "af M=$m rc=$?"; grep -E "kernels=|rror" "$OUT/af_m$m.log" | cut -c1-200 | tail -20
  done
}
for s in ${@:-t53}; do
  case "$s" in
    t53|p53|q53|c53|r53|af) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session52.sh" "$s" ;;
  esac
done
