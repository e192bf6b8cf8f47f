#!/usr/bin/env bash
# Session 42 (2026-12-05): W4A8 dense on the permuted (":pk") layout and the one-launch
# decode pre-pass (act_prepass.fake_quantize_rows).  Carry [".whl"].
#   t42:  GPU tests of the change: the ":pk" unpack (test_unpack_gpu), the fake
#         quantization against XLA's, the wnam decode / prefill tests on the new layout.
#   w42:  bench_dense, 8192^2, W4A8 (int4 g128 x fp8, MXFP4 x fp8) and the W4A16 of the
#         same weights, M = 1, 16, 1024, 4096, CUPTI kernel times, Humming W4A8 MXFP4.
#   w42o: the same W4A8 rows on the old form (HUMMING_JAX_PERMUTE_K=0: K order, XLA's
#         two-fusion pre-pass with HUMMING_JAX_DECODE_PREPASS=0), then the new layout
#         with the XLA pre-pass at M = 1 / 16 (the pre-pass A/B alone).
source "$(dirname "$0")/../gpu_env.sh"
DENSE="python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 --repeats 2 --no-baselines"
s_t42() {
  gpu_tests ${ST:-240} "unpack_gpu or fake_quant_gpu or decode_gpu or prefill_gpu or prefill_exact_route_gpu or mx_fold" \
    tests/test_carrier_unpack.py tests/test_act_prepass.py tests/test_wnam_mgpu.py
}
s_w42() {
  T ${ST:-300} $DENSE --specs w4a8-fp8,w4a16-g128,w4a8-mxfp4,w4a16-mxfp4 --ms 1,16,1024,4096 \
    --humming --json "$OUT/w42.json" > "$OUT/w42.log" 2>&1
  echo "rc=$?"; grep -vE "Warning|warn" "$OUT/w42.log" | tail -30
}
s_w42o() {
  HUMMING_JAX_PERMUTE_K=0 HUMMING_JAX_DECODE_PREPASS=0 T ${ST:-240} $DENSE \
    --specs w4a8-fp8,w4a8-mxfp4 --ms 1,16,1024,4096 --json "$OUT/w42o.json" \
    > "$OUT/w42o.log" 2>&1
  echo "old rc=$?"; grep -vE "Warning|warn" "$OUT/w42o.log" | tail -14
  HUMMING_JAX_DECODE_PREPASS=0 T ${ST:-150} $DENSE --specs w4a8-fp8,w4a8-mxfp4 --ms 1,16 \
    --json "$OUT/w42x.json" > "$OUT/w42x.log" 2>&1
  echo "xla-prepass rc=$?"; grep -vE "Warning|warn" "$OUT/w42x.log" | tail -8
}
# Call 2 (after call 1's w42 was cut at M = 4096 MXFP4):
#   p42:  probe_w4a8_decode.py, kernel time by name, M = 1 / 16: this tree, the XLA
#         pre-pass (HUMMING_JAX_DECODE_PREPASS=0), the old form (PERMUTE_K=0 too).
#   w42p: bench_dense W4A8 at M = 4096 on this tree and on the old form (the ":pk" unpack).
s_p42() {
  local env specs=w4a8-fp8,w4a8-mxfp4,w4a16-g128,w4a16-mxfp4
  for env in "" "HUMMING_JAX_DECODE_PREPASS=0" "HUMMING_JAX_DECODE_PREPASS=0 HUMMING_JAX_PERMUTE_K=0"; do
    env $env timeout -k 5 -s INT ${ST:-100} python3 benchmarks/probe_w4a8_decode.py \
      --specs $specs --ms 1,16 >> "$OUT/p42.log" 2>&1
    echo "[$env] rc=$?"
    specs=w4a8-fp8,w4a8-mxfp4  # the W4A16 rows once
  done
  grep -E "^#|M=" "$OUT/p42.log" | cut -c1-400
}
s_w42p() {
  T ${ST:-130} $DENSE --specs w4a8-fp8,w4a8-mxfp4 --ms 4096 --json "$OUT/w42p.json" \
    > "$OUT/w42p.log" 2>&1
  echo "new rc=$?"; grep -E "M=" "$OUT/w42p.log"
  HUMMING_JAX_PERMUTE_K=0 T ${ST:-130} $DENSE --specs w4a8-fp8,w4a8-mxfp4 --ms 4096 \
    --json "$OUT/w42po.json" > "$OUT/w42po.log" 2>&1
  echo "K order rc=$?"; grep -E "M=" "$OUT/w42po.log"
}
#   t42b: after `git apply benchmarks/sessions/session42_queued.patch` (the pre-pass
#         kernel's single reduction, both forms; the grouped 16-bit route's pre-pass,
#         w4a8-int8 experts): their GPU tests.
s_t42b() {
  gpu_tests ${ST:-150} "one_pass_gpu or fake_quant_gpu or (deepseek_gate_up_gpu and int8) or (decode_gpu and w4a8-int8)" \
    tests/test_act_prepass.py tests/test_grouped_wnam_mgpu.py tests/test_wnam_mgpu.py
}
for s in ${@:-t42 w42}; do step "$s"; "s_$s"; done
