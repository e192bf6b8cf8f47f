#!/usr/bin/env bash
# Session 50 (2026-12-06).  Steps (carry [".whl"]):
#   cp:   where a new (spec, shape)'s compile goes (probe_compile.py: trace / lower /
#         compile / first run, cold and warm), int4 g128 zp / MXFP4 / NVFP4 at M = 1 / 16,
#         the default against two K tiles per step -- issue 3's <= 2 s was missed by
#         NVFP4 on session 48's H200 host (2.32-2.34 s) -- and the Mosaic GPU environment
#         switches the CUDA plugin reads (strings).  Never ran (call 4 ran its probe inline).
#   sub:  NVFP4 / MXFP4 / int4 at M = 1 / 16 with one K tile per pipeline step (sub1)
#         against the default's two: compile (probe_compile.py) and CUPTI kernel time
#         (profile_mgpu.py).  On the CPU, sub1 lowers NVFP4 in 0.40 s against 0.68.
#   nv:   after the rule (NVFP4 decodes with one K tile per step, wna16_mgpu.
#         one_k_tile_per_step): its GPU tests, the compile split of the default against
#         the old two tiles (sub2), and bench_dense NVFP4 / int4 at M = 1 / 16 with Humming.
#   w8d:  W8A8 int8 at decode, the Triton W8A8 kernel against run_decode_mgpu (the
#         W8A16 Mosaic kernel on the int8 codes) by CUPTI kernel time: session 8 kept the
#         Mosaic route off on walls (25.3 / 25.0 against 23.1 / 25.8), host-bound numbers;
#         H100 session 49 timed the Triton kernels at 33.5 / 34.5 us.
#   fin:  w8d, then nv's compile split and bench_dense rows (for an H200 if one comes).
#   t50:  GPU tests not run this session: the one-tile NVFP4 rule under W4A4 NVFP4's
#         decode (test_wnam_mgpu decode cases) and the W8A8 Mosaic decode route that w8d
#         times (test_decode_mgpu_gpu).
#   ld, w4a, s3, s4, ...: sessions/gpu_session49.sh's and earlier scripts' steps.
source "$(dirname "$0")/../gpu_env.sh"
s_cp() {
  T ${CT:-200} python3 benchmarks/probe_compile.py --specs w4a16-g128-zp,w4a16-mxfp4,w4a16-nvfp4 \
    --ms 1,16 --configs default,sub2 --json "$OUT/compile.json" > "$OUT/compile.log" 2>&1
  echo "compile rc=$?"; grep -E "M=|rror" "$OUT/compile.log" | cut -c1-200
  for f in $(python3 -c "import jax_plugins, os; print(os.path.dirname(jax_plugins.__path__[0]))" 2>/dev/null)/jax_cuda*/*.so \
      $(python3 -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")/mlir/_mlir_libs/_mosaic_gpu_ext.so; do
    [ -f "$f" ] && strings "$f" | grep -oE 'MOSAIC_GPU_[A-Z0-9_]+' | sort -u | sed "s|^|$(basename $f): |"
  done > "$OUT/mosaic_env.txt" 2>&1
  wc -l "$OUT/mosaic_env.txt"; cut -d' ' -f2 "$OUT/mosaic_env.txt" | sort -u | tr '\n' ' '; echo
}
s_sub() {
  T ${CT:-200} python3 benchmarks/probe_compile.py --specs w4a16-nvfp4,w4a16-mxfp4,w4a16-g128-zp \
    --ms 1,16 --configs default,sub1 --json "$OUT/compile_sub.json" > "$OUT/compile_sub.log" 2>&1
  echo "compile rc=$?"; grep -E "M=|rror" "$OUT/compile_sub.log" | cut -c1-200
  for spec in w4a16-nvfp4 w4a16-mxfp4 w4a16-g128-zp; do
    T ${PT:-90} python3 benchmarks/profile_mgpu.py --spec $spec --ms 1,16 --configs default,sub1 \
      > "$OUT/prof_sub_$spec.log" 2>&1
    echo "$spec rc=$?"; grep -vE "^(W|I)[0-9]|Warn|warn" "$OUT/prof_sub_$spec.log" | tail -8 | cut -c1-220
  done
}
s_nv() {
  gpu_tests ${ST:-150} "nvfp4 and (quant_dense_gpu or narrow_n_split_k_gpu)" tests/test_wna16_mgpu.py
  T ${CT:-120} python3 benchmarks/probe_compile.py --specs w4a16-nvfp4 --ms 1,16 \
    --configs default,sub2 --json "$OUT/compile_nv.json" > "$OUT/compile_nv.log" 2>&1
  echo "compile rc=$?"; grep -E "M=|rror" "$OUT/compile_nv.log" | cut -c1-200
  T ${BT:-240} python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 \
    --repeats 2 --specs w4a16-nvfp4,w4a16-g128-zp --ms 1,16 --humming \
    --json "$OUT/nv_dense.json" > "$OUT/nv_dense.log" 2>&1
  echo "dense rc=$?"; grep -E "^\|" "$OUT/nv_dense.log" | tail -8
}
s_w8d() {
  T ${WT:-200} python3 benchmarks/bench_w8a8.py --decode-study --kernel-times --ms 1,16 \
    --calls 20 --repeats 2 --json "$OUT/w8d.json" > "$OUT/w8d.log" 2>&1
  echo "w8d rc=$?"; grep -E "^\{|rror" "$OUT/w8d.log" | sed -E "s/'(triton|decode_mgpu)_kernels': \{[^}]*\}, //g" | cut -c1-330
}
s_fin() {
  s_w8d
  T ${CT:-100} python3 benchmarks/probe_compile.py --specs w4a16-nvfp4 --ms 1,16 \
    --configs default,sub2 --json "$OUT/compile_nv.json" > "$OUT/compile_nv.log" 2>&1
  echo "compile rc=$?"; grep -E "M=|rror" "$OUT/compile_nv.log" | cut -c1-200
  T ${BT:-150} python3 benchmarks/bench_dense.py --shapes 8192x8192 --kernel-times --calls 20 \
    --repeats 2 --specs w4a16-nvfp4 --ms 1,16 --humming \
    --json "$OUT/nv_dense.json" > "$OUT/nv_dense.log" 2>&1
  echo "dense rc=$?"; grep -E "M=" "$OUT/nv_dense.log" | cut -c1-250
}
s_t50() {
  gpu_tests ${ST:-240} "decode_mgpu_gpu or (nvfp4 and decode)" \
    tests/test_w8a8_mgpu.py tests/test_wnam_mgpu.py
}
for s in ${@:-cp}; do
  case "$s" in
    cp|sub|nv|w8d|fin|t50) step "$s"; "s_$s" ;;
    *) bash "$(dirname "$0")/gpu_session49.sh" "$s" ;;
  esac
done
