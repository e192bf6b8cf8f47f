#!/usr/bin/env bash
# Session 59 (2026-12-07): two calls, both on H100s (eleven asks found no machine, ~1200 s).
# Landed: the one-token in-kernel activation quantization converts the row once per
# warpgroup (wna16_mgpu.RESIDENT_X, default; GPU-tested on the H100, 44 passed): W8A8 int8
# 25.43 -> 25.26 us, W4A8's opt-in form 18.99 / 23.36 / 25.91 -> 17.03 / 17.34 / 19.55
# (level with pre-pass + GEMM there).  Nothing ran on an H200.  First in the next device
# session, on an H200 (carry [".whl"]):
#   sessions/gpu_session59.sh t59 w59 (the new default's GPU tests and the A/B on the
#   H200; W59="8192x8192:... 14336x4096:w4a8-int8,w4a8-mxfp4,w8a8-int8" for both shapes),
#   then gpu_session52.sh h8 (W8A8 M = 1 against <= 20 beside Humming) and
#   gpu_session58.sh p58 (the carried A16 formats on the H200), then session 58's queue.
# Session 58 (2026-12-06): three calls (an H100, an H200, an H100; ~8 asks found none).
# Found: the W4A8 decode quantizing its activations inside the WnA16 kernel is bit-equal
# but slower on the H200 (8192^2 int4 x int8 17.22 vs 15.78, MXFP4 x e4m3 24.67 vs 18.97):
# opt-in only (wnam_mgpu.FAKE_QUANTIZE_X_BY_DEFAULT).  Session 57's grouped rule GPU-tested
# on an H100 (31 passed); its bound 16 best on the H100 at DeepSeek-V3 16 tokens.  First
# in the next device session, on an H200 (carry [".whl"]):
#   gpu_session55.sh h8 (W8A8 M = 1 against <= 20 on the H200: only H100 numbers since
#   session 55's in-kernel quantization), gpu_session58.sh p58 (the carried A16 formats'
#   >= 2.2 TB/s on the H200), T58K=mma_sync_gpu gpu_session58.sh t58 (the opt-in kernel
#   form on the mma.sync launch, never GPU-run), then session 57's l57 / g57 below.
# Session 57 (2026-12-06): four calls, all on one H200 (benchmarks/results/2026-12-06-
# session57; sessions/gpu_session57.sh t57 g57, then inline ms2 / l57 / g57 / profile_mgpu).
# Found: session 56's dense decode rule loses on the H200 (int4 14.6-14.7 -> 15.0-15.2,
# MXFP4 17.2-17.3 -> 18.1-18.4): now the H100's only (wna16_mgpu.MMA_SYNC_DEVICES).
# Landed: grouped 8-row expert tiles on mma.sync where each warpgroup streams <= 16 K tiles
# (grouped_wna16_mgpu.MMA_SYNC_MAX_K_TILES; GPU-tested 37 passed; H200 spans -10 to -16 %
# at short K).  The final tree had no device time left: first in the next device session,
# on an H200 (carry [".whl"]):
#   T57K="qwen3_decode_gpu or pair_tiles_gpu or mma_sync" gpu_session57.sh t57 (the final
#   tree), L57=deepseek-v3:16 gpu_session57.sh l57 (its gate_up pairs now on the WGMMA:
#   against 137.1 / 152.1 us per layer with every 8-row tile on mma.sync / none), then
#   gpu_session55.sh q55 h8 (W8A8 M = 1 against <= 20 on the H200, never run there), then
#   gpu_session54.sh p54.  On an H100: GSH="qwen3-30b-a3b-down deepseek-v3-down
#   mixtral-gate_up mixtral-down" gpu_session57.sh g57 (the grouped rule, untimed there).
# Session 56 (2026-12-06): five calls, all on H100s (three asks for an H200 found no machine;
# benchmarks/results/2026-12-06-session56; sessions/gpu_session56.sh t56 ms / ms2 / fin / ms2).
# Landed: the dense decode product on mma.sync (kernels/mgpu_mma.py) with one K tile per
# step on 8-row tiles for int4 / uint4 / MXFP4 at M <= 8 (wna16_mgpu.MMA_SYNC_MAX_M;
# GPU-tested; H100 -0.6 to -1.0 us per 8192^2 layer).  Session 55's final tree GPU-tested
# (quantize_x: 20 passed).  First in the next device session, on an H200 (carry [".whl"]):
#   MS2="w4a16-g128-zp:1:default,sub1,wg4 w4a16-mxfp4:1:default,sub1,wg4"
#   gpu_session56.sh ms2 (the new default on the H200, predicted int4 zp ~13.7 / MXFP4
#   ~16.5 us), then gpu_session55.sh q55 h8 (W8A8 M = 1
#   against <= 20, predicted 18.3-18.8), then session 55's list below.
# Session 55 (2026-12-06): four calls, all on H100s (one start for an H200 failed;
# benchmarks/results/2026-12-06-session55; sessions/gpu_session55.sh t55 q55 h8, t55 q55 x3).
# Landed: W8A8 int8 / fp8 decode quantizing its own activations inside the Mosaic kernel
# at one token (wna16_mgpu.run quantize_x, w8a8.DECODE_QUANTIZE_X_MAX_M; GPU-tested: 20
# passed; -1.2 to -2.5 us per layer on H100s); session 54's carried default route
# GPU-tested (3 passed).  First in the next device session, on an H200 (carry [".whl"]):
#   gpu_session55.sh q55 h8 (W8A8 M = 1 against issue 4's <= 20: predicted 18.3-18.8),
#   then gpu_session54.sh p54 and QV=s1w4,s4w8 gpu_session53.sh q53, then the lists below.
# Session 54 (2026-12-06): two calls, both on H100s (five starts for an H200 were refused;
# benchmarks/results/2026-12-06-session54; sessions/gpu_session54.sh t54 ab54 / p54).
# Landed: the other A16 formats (int1-3 / uint1-3, int5-7 / uint5-7, fp6, fp8 e5m2) on the
# Mosaic WnA16 kernel in a wider carrier (wna16_mgpu.code_bits; GPU-tested: 30 passed),
# quant_dense's default for those under twice the codes' memory (CARRIED_BY_DEFAULT, H100:
# 1.2-3.3x the Pallas-Triton kernel).  First in the next device session, on an H200
# (carry [".whl"]):
#   gpu_session54.sh p54 (issue 3's ">= 2.2 TB/s" for these formats is an H200 number:
#   predicted ~2.5 for 6 bits / fp6, ~2.1 int5, ~1.7 for 3 bits), with the default
#   route's GPU test (T54K=carried_default_route_gpu gpu_session54.sh t54, never run);
#   then session 53's list below (gpu_session52.sh h8, QV=s1w4,s4w8 gpu_session53.sh q53;
#   its `af` step is superseded by p54).
# Session 53 (2026-12-06): five calls, all on H100s though an H200 was asked for
# (benchmarks/results/2026-12-06-session53; sessions/gpu_session53.sh t53 p53 q53 / q53 c53
# / r53 q53 + gpu_session52.sh h8 / h8 q53 / the final tree's tests).  Landed: the decode
# pre-pass split over four programs of eight warps per row at M <= 16 (act_prepass.
# decode_splits; GPU-tested: 75 passed, the final tree 53 passed).
# First in the next device session, on an H200 (carry [".whl"]):
#   gpu_session52.sh h8, then QV=s1w4,s4w8 gpu_session53.sh q53 (W8A8 decode against
#   <= 20 us and W4A8 with the new pre-pass: predicted 19.6-20.0 at M = 1, 20.3-20.6 at
#   M = 16), then gpu_session53.sh af (issue 3's "every other A16 format >= 2.2 TB/s":
#   the Pallas-Triton formats uint1, int2-3, int5-7, fp6, e5m2 never timed), then session
#   52's list.
# Session 52 (2026-12-06): five calls, 1-3 on H100s, 4-5 on an H200 (benchmarks/results/
# 2026-12-06-session52; gpu_session51.sh t51 + pp, sessions/gpu_session52.sh t52 m8 h8
# (twice), t52 m8 h8 cp, bench_dense issue 3 decode rows).  Landed: the W8A8 decode's
# product on an 8-bit WGMMA with both operands from shared memory (w8a8.DECODE_MMA8;
# GPU-tested on both cards; H200 layer 20.1-21.0 us against <= 20).  First in the next
# device session, on an H200 (carry [".whl"]; old/ as gpu_session48.sh w4a says):
#   gpu_session47.sh s3 / s4 (the issue tables: call 5 ran only int4 / NVFP4 at M = 1 /
#   16), gpu_session48.sh w4a, then session 46's list below.
# Session 51 (2026-12-06): four calls, each on a different H100 (benchmarks/results/
# 2026-12-06-session51; sessions/gpu_session51.sh t51 w8d / t51 w8d cp / w8r / pp).  Landed:
# W8A8 int8 / fp8 decode (M <= 16) on the Mosaic WnA16 kernel by default (per-token scale in
# its epilogue: GPU-tested in calls 1-3; codes from one launch: call 4).  First in the next device
# session (carry [".whl"]):
#   NOTEST=1 LB=triton,decode_mgpu,decode_mgpu_xla_prepass gpu_session51.sh pp on an H200
#   (the route against the Triton kernel, and the one-launch codes at M = 16: cut in call 4;
#   revert DECODE_MGPU_MAX_M to 0 if the Triton kernel wins there), then gpu_session50.sh cp
#   on an H200 (the compile target's host), then session 49's s3 / s4 / w4a (below).
#   Also: the GPU tests of session 51's review mends (gpu_session51.sh t51 with
#   T51K="decode_mgpu or run_direct"): the Triton comparison now forced, split-K with row
#   scales at N = 4096 (test_decode_mgpu_split_k_gpu), never GPU-run.
# Session 50 (2026-12-06): five calls, all on an H100 (benchmarks/results/2026-12-06-session50;
# sessions/gpu_session50.sh sub / nv / w8d, probe_compile inline, gpu_session49.sh ld: 22
# passed).  Landed: NVFP4 decodes with one K tile per step (compile, wna16_mgpu.
# one_k_tile_per_step: GPU-tested in call 3).  First in the next device session (carry
# [".whl"]):
#   gpu_session50.sh t50 (GPU tests: W4A4 NVFP4's decode under the one-tile rule, the
#   W8A8 Mosaic decode route), then w8d on an H200 (the Mosaic route against
#   the Triton W8A8 decode by kernel time; switch w8a8.DECODE_MGPU_MAX_M to 16 if it wins
#   there too), then cp on an H200 (probe_compile: the compile target's host), then the
#   queue below from session 49's second item (the issue tables s3 / s4 and w4a on an H200).
# Session 49 (2026-12-06): four calls, all on an H100 (benchmarks/results/2026-12-06-session49;
# gpu_session48.sh w4a / f8, gpu_session47.sh moe, gpu_session49.sh moe2), then a fifth
# (gpu_session49.sh ld: the loaded-checkpoint GPU tests, 22 passed).  First in the next
# device session: gpu_session49.sh ld again (QuantSpec.act_mx_rounding, built after call 5:
# the ct-mxfp4-a4 layer with the producer's MX activation rule), then on an H200 the issue
# tables (gpu_session47.sh s3 / s4) and gpu_session48.sh w4a (W4A4's route, H100-only so far), then the queue below from session 46's second item.
# Session 48 (2026-12-06): five calls (benchmarks/results/2026-12-06-session48; calls 1-2
# H100, 3-5 H200; sessions/gpu_session48.sh n48 / lay / mix fus, gpu_session47.sh s3, and
# s4's parts inline).  First in the next device session (carry [".whl", "old"], old/ as
# that script's w4a step says): gpu_session48.sh w4a (W4A4's large-M route writing bf16,
# built after the device time: GPU tests + same-call A/B), then f8 (W8A8 fp8 at M = 4096
# with Humming, cut this session), gpu_session47.sh moe (never ran), then the queue below
# from session 46's second item.
# Session 47 (2026-12-05): three calls late in the session, all on an H100 (an H200 was
# asked for): sessions/gpu_session47.sh t46 (30 GPU tests pass: session 46's mends and
# the checkpoint-over-scan test), s3 and s4 (issues 3 / 4 standing tables with Humming in
# the same run; s4's W4A8 part cut before its last two M = 4096 points); a fourth call
# (moe) was taken back, then refused.  First in the next device session, on the H200
# (carry [".whl"]): gpu_session47.sh s3, then s4 (the issue targets are H200 numbers),
# s4b if s4's W4A8 part is cut again, moe; then session 46's list below from its second
# item.
# Session 46 (2026-12-05): five calls (benchmarks/results/2026-12-05-session46; calls 1-3
# H200, 4-5 H100; sessions/gpu_session46.sh pp / one / two / three).  Landed: the pre-pass's
# single reduction (session 42's queue: t42b ran in pp), the dx kernel by default for
# dense M <= 64.  First in the next device session, on the H200:
#   the GPU tests of the post-device mends (the dx kernel under custom_jvp / custom_vmap,
#     its tangent XLA's): pytest -m gpu -k "grad_gpu or hessian_vector_product_gpu or
#     dx_kernel_gpu or dx_gpu" tests/test_autodiff.py tests/test_wna16_mgpu_dx.py;
#   gpu_session46.sh moe (MT=300): the Qwen3-30B-A3B MoE backward at 16 tokens, both
#     routes against the float32 layer, then timed with the switch on (stacks opt-in
#     until it wins and is no further from the float32 layer than the XLA route);
#   probe_grad.py --ms 32,64 on the H200 (the default's cut was timed on an H100);
#   bench_dense W4A8 MXFP4 M = 4096 with --humming (same-run ratio for issue 4).
# Then session 42's p42 / w42p and session 41's g42, g42d, bd (below).
# Session 45 (2026-12-05): two short calls (benchmarks/results/2026-12-05-session45: call 1
# H100 `gpu_session45.sh one`, call 2 H200 `m1`).  First in the next device session, on the
# H200: gpu_session45.sh one again (the dx tests with the float32 oracle, the scanned test,
# probe_grad at M = 1 / 16 / 128: give its steps ~200 s each, compiles ran past 130 s),
# then gpu_session43.sh d43.
# Session 44 (2026-12-05): a machine was listed but none could be started.  First in the
# next device session: sessions/gpu_session44.sh one (one call, <= ~560 s: session 43's t43
# and the int4 dense + Qwen3 MoE part of d43), then gpu_session43.sh d43 for the rest.
# Session 43 (2026-12-05) was lent no machine.  First in the next device session:
#   sessions/gpu_session43.sh t43, then d43 (two calls): the backward's dy . W^T kernel
#   (dense and grouped, opt-in HUMMING_JAX_DX_KERNEL=1) on the H200 for the first time --
#   its GPU tests, then probe_grad's A/B against the XLA route (dense M = 1 / 16 / 128,
#   the Qwen3-30B-A3B MoE layer at 16 / 256 tokens).  Then session 42's queue below.
# Session 42 (2026-12-05) got one call (benchmarks/results/2026-12-05-session42/call1:
# sessions/gpu_session42.sh t42 w42), then no machine.  Next, before this script's queue:
#   sessions/gpu_session42.sh p42 w42p (one call, ~450 s): the W4A8 decode's kernels by
#   name on the new form / the XLA pre-pass / the old K order, and the M = 4096 prefill on
#   ":pk" against the K order in one run.  Then branch queued/session42-prepass (the
#   pre-pass kernel's single reduction, the grouped 16-bit route on it; also as
#   benchmarks/sessions/session42_queued.patch, git apply): gpu_session42.sh t42b.
# Session 41 ran g41 (call 1), q16 (call 2) and g41b (call 3): benchmarks/results/
# 2026-12-05-session41.  Still to run: g42 and g42d first (one call each), then bd.
# Session 40 ran t39 and g40 (call 1: benchmarks/results/2026-12-05-session40); q16, qm, bd are still to run.
# Session 39 ran pt, pe, px (call 1), pr (call 2) and as (call 3): results in
# benchmarks/results/2026-12-04-session39; q16, qm and bd are still to run, and t39 (the
# GPU tests written after the device was gone: run it first).
# The next device calls, prepared 2026-12-04 at the end of session 38 (its calls:
# benchmarks/results/2026-12-04-session38, script sessions/gpu_session38.sh); it replaces session
# 37's queue (s37 and mx ran in session 38 call 1; qm's Qwen3 point in call 4).  Every
# bench_moe step times with --consume row and Humming in the same process.
# Carry: [".whl"] (qm: [".whl", "old"]).
#   pe:  quant_moe's pair tiles past what session 38 timed: DeepSeek-V3 at 6 / 8 tokens
#        (on pair tiles by the 1/8 rule, untimed) and 12 (sorted), forced (=16) vs sorted
#        (=0) in one process.
#   px:  the same A/B at one token with MXFP4 experts (Qwen3-30B-A3B, DeepSeek-V3).
#   q16: Qwen3-30B-A3B down at 128 tokens (16-row launch, K 768): the default streams two
#        column blocks on the shared-x shape of one warpgroup (63.9 / 64.9 us in session
#        37) where the small CTA without blocks ran 62.3 and two warpgroups 60.1; the small
#        CTA with two blocks (sub2-xk-ovl-unpad on the default) is untimed.
#   qm:  hj.quant_moe (run_aligned's tiles) at DeepSeek-V3 256 and Mixtral 32 tokens, this
#        tree against 6207b22 (before session 37's 16-row rule; Qwen3 128: 217.8 -> 163.1
#        in session 38).  Needs old/ (ignored, carried): git archive 6207b22 humming_jax |
#        tar -x -C old with old/ in .git/info/exclude.  It swaps the device copy's tree
#        (humming_jax imports from the repo root whatever PYTHONPATH says) and puts it back.
#   pt:  the GPU tests of session 38's last changes (the pair path's k-sum as combine's
#        gather, the aligned test forcing HUMMING_JAX_MOE_PAIR_TOKENS=0): pair tiles and
#        aligned tiles of hj.quant_moe against the XLA path.
#   pr:  where pair tiles stop paying (session 39, after pe had them ahead at DeepSeek-V3
#        12 tokens, past the 1/8 cut): DeepSeek-V3 16-48 and Qwen3-30B-A3B 6-24 tokens,
#        forced (=64) vs sorted (=0) in one process per model.
#   as:  run_aligned's schedule (HUMMING_JAX_ALIGNED_SCHEDULE=xla,kernel: XLA ops as fused
#        to session 38, the Pallas-Triton schedule kernel, the default since session 39)
#        on the sorted path past the pair cut, whole layer in one process per model; and
#        its GPU tests (each schedule against Triton tiles).  Session 39 ran it (call 3)
#        with a third value, "barrier", since removed.
#   bd:  where the sorted path's wall goes past the pair cut now (schedule kernel default):
#        --breakdown at DeepSeek-V3 32 and Qwen3-30B-A3B 16 tokens, the default rule.
#   t39: session 39's GPU tests that never ran on the H200: test_quant_moe_aligned_gpu
#        (asserts now that the schedule kernel ran) and test_quant_moe_pair_tiles_gpu at 8 /
#        16 tokens (pair tiles past one token on the default rule, experts shared), with
#        the 1-token cases again.
#   g40: session 40 (no device lent) made quant_dense / quant_ragged_dot / quant_moe
#        differentiable (custom_vjp: kernel forward, XLA reference backward): their GPU
#        test and the act-order (input_perm) GPU test, and the dense decode row (8192^2, int4 g128 zp / MXFP4, M = 1 / 16, kernel
#        times with Humming) to check that the forward kept session 39's 14.1 / 17.35 us;
#        probe_grad.py: a training step's forward + dx against a bf16 layer, and the
#        backward at bf16 default precision against the float32 HIGHEST first form.
#   g41: session 41's GPU checks of the backward on prepared params (test_grad_gpu, the
#        act-order and stacked-expert tests, tests/test_prepared_dequantize.py on the GPU's
#        XLA: bit-equal readers), then probe_grad.py: dense 8192^2 forward + dx, the
#        backward against session 40's re-layout form, and a Qwen3-30B-A3B quant_moe layer.
#   g41b: the same after the backward's products moved to x's 16-bit dtype (dense and
#        grouped), with the dense backward's kernels and its GEMM alone in both W orientations.
#   g42: the A/B that session 41 had no device time for: quant_moe's backward (Qwen3-30B-A3B,
#        int4 g128 zp, 16 tokens: 13.7 ms, 12.7 of it XLA transposes) with the experts'
#        codes materialized in K order before the XLA decode
#        (HUMMING_JAX_XLA_GROUPED_K_ORDER=1) against without (=0), same tokens, then 256
#        tokens with whichever is on; the readers and grad tests under =1.
#   g42d: the readers after session 41's post-device mend (float32 then one cast; W8A8
#        readers) on the GPU's XLA, and the dense forward + dx re-timed with them
#        (M = 16 / 4096, kernel breakdown).
# Usage: gpu_session_next.sh [STEP...]  (default: g42 g42d bd; about one call each; qm needs old/ carried).
source "$(dirname "$0")/gpu_env.sh"
ROW="$MOE --consume row --humming --no-baselines"
s_pt() {
  gpu_tests ${ST:-240} "pair_tiles_gpu or quant_moe_aligned_gpu" tests/test_grouped_wna16_mgpu.py
}
s_pe() {
  T ${ST:-200} python3 benchmarks/bench_moe_layer.py --models deepseek-v3 --tokens 6,8,12 \
    --families default --env HUMMING_JAX_MOE_PAIR_TOKENS=16,0 --json "$OUT/pe.json" \
    > "$OUT/pe.log" 2>&1
  echo "rc=$?"; grep "'tokens'" "$OUT/pe.log" | cut -c1-400
}
s_pr() {
  local mt
  for mt in deepseek-v3:16,24,32,48 qwen3-30b-a3b:6,8,12,16,24; do
    T ${ST:-250} python3 benchmarks/bench_moe_layer.py --models ${mt%%:*} --tokens ${mt##*:} \
      --families default --env HUMMING_JAX_MOE_PAIR_TOKENS=64,0 \
      --json "$OUT/pr_${mt%%:*}.json" >> "$OUT/pr.log" 2>&1
    echo "${mt%%:*} rc=$?"; grep "'tokens'" "$OUT/pr.log" | grep "${mt%%:*}" | cut -c1-400
  done
}
s_as() {
  gpu_tests ${ST:-200} "quant_moe_aligned_gpu" tests/test_grouped_wna16_mgpu.py
  local mt
  for mt in deepseek-v3:32,128 qwen3-30b-a3b:16,64; do
    T ${ST:-250} python3 benchmarks/bench_moe_layer.py --models ${mt%%:*} --tokens ${mt##*:} \
      --families default --env HUMMING_JAX_ALIGNED_SCHEDULE=xla,kernel \
      --json "$OUT/as_${mt%%:*}.json" >> "$OUT/as.log" 2>&1
    echo "${mt%%:*} rc=$?"; grep "'tokens'" "$OUT/as.log" | grep "${mt%%:*}" | cut -c1-500
  done
}
s_t39() {
  gpu_tests ${ST:-240} "quant_moe_aligned_gpu or pair_tiles_gpu" \
    tests/test_grouped_wna16_mgpu.py
}
s_g40() {
  gpu_tests ${ST:-200} "grad_gpu or act_order_gpu or stacked_experts_gpu" \
    tests/test_autodiff.py tests/test_act_order.py tests/test_stack_experts.py
  T ${ST:-200} python3 benchmarks/bench_dense.py --specs w4a16-g128-zp,w4a16-mxfp4 --ms 1,16 \
    --humming --kernel-times --json "$OUT/g40_dense.json" > "$OUT/g40_dense.log" 2>&1
  echo "dense rc=$?"; grep -vE "^#|^$" "$OUT/g40_dense.log" | tail -12 | cut -c1-250
  T ${ST:-150} python3 benchmarks/probe_grad.py --ms 16,1024,4096 > "$OUT/g40_grad.log" 2>&1
  echo "grad rc=$?"; grep "^M=" "$OUT/g40_grad.log"
}
s_g41() {
  gpu_tests ${ST:-200} "grad_gpu or act_order_gpu or stacked_experts_gpu" \
    tests/test_autodiff.py tests/test_act_order.py tests/test_stack_experts.py
  T ${ST:-150} python3 -m pytest -p no:cacheprovider -o addopts= -q --tb=short \
    tests/test_prepared_dequantize.py > "$OUT/g41_readers.log" 2>&1
  echo "readers rc=$?"; grep -E "passed|failed|^E " "$OUT/g41_readers.log" | head -12
  T ${ST:-220} python3 benchmarks/probe_grad.py --ms 16,1024,4096 --moe-tokens 16,256 \
    > "$OUT/g41_grad.log" 2>&1
  echo "grad rc=$?"; grep -E "^M=|^MoE|rror" "$OUT/g41_grad.log" | cut -c1-300
}
s_g41b() {  # after the 16-bit cotangents (dense and grouped backward), call 3
  gpu_tests ${ST:-150} "grad_gpu" tests/test_autodiff.py
  T ${ST:-200} python3 benchmarks/probe_grad.py --ms 16,1024,4096 --breakdown \
    > "$OUT/g41b_grad.log" 2>&1
  echo "grad rc=$?"; grep -E "^M=|^  M=|rror" "$OUT/g41b_grad.log" | cut -c1-300
  T ${ST:-200} python3 benchmarks/probe_grad.py --ms "" --moe-tokens 16,256 \
    > "$OUT/g41b_moe.log" 2>&1
  echo "moe rc=$?"; grep -E "^MoE|tokens=|rror" "$OUT/g41b_moe.log" | cut -c1-300
}
s_g42() {
  local on
  for on in 0 1; do
    HUMMING_JAX_XLA_GROUPED_K_ORDER=$on T ${ST:-150} python3 benchmarks/probe_grad.py --ms "" \
      --moe-tokens 16 > "$OUT/g42_moe_$on.log" 2>&1
    echo "K_ORDER=$on rc=$?"; grep -E "^MoE|tokens=|rror" "$OUT/g42_moe_$on.log" | cut -c1-300
  done
  HUMMING_JAX_XLA_GROUPED_K_ORDER=1 T ${ST:-200} python3 benchmarks/probe_grad.py --ms "" \
    --moe-tokens 256 > "$OUT/g42_moe256.log" 2>&1
  echo "256 rc=$?"; grep -E "^MoE|tokens=|rror" "$OUT/g42_moe256.log" | cut -c1-300
  HUMMING_JAX_XLA_GROUPED_K_ORDER=1 gpu_tests ${ST:-150} "grad_gpu" tests/test_autodiff.py
}
s_g42d() {
  T ${ST:-150} python3 -m pytest -p no:cacheprovider -o addopts= -q --tb=short \
    tests/test_prepared_dequantize.py > "$OUT/g42d_readers.log" 2>&1
  echo "readers rc=$?"; grep -E "passed|failed|^E " "$OUT/g42d_readers.log" | head -12
  T ${ST:-200} python3 benchmarks/probe_grad.py --ms 16,4096 --breakdown \
    > "$OUT/g42d_grad.log" 2>&1
  echo "grad rc=$?"; grep -E "^M=|^  M=|rror" "$OUT/g42d_grad.log" | cut -c1-300
}
s_bd() {
  local mt
  for mt in deepseek-v3:32 qwen3-30b-a3b:16; do
    T ${ST:-200} python3 benchmarks/bench_moe_layer.py --models ${mt%%:*} --tokens ${mt##*:} \
      --families default --breakdown --json "$OUT/bd_${mt%%:*}.json" >> "$OUT/bd.log" 2>&1
    echo "${mt%%:*} rc=$?"; grep "'tokens'" "$OUT/bd.log" | tail -1 | cut -c1-1500
  done
}
s_px() {
  T ${ST:-240} python3 benchmarks/bench_moe_layer.py --models qwen3-30b-a3b,deepseek-v3 \
    --tokens 1 --spec w4a16-mxfp4 --families default --env HUMMING_JAX_MOE_PAIR_TOKENS=1,0 \
    --json "$OUT/px.json" > "$OUT/px.log" 2>&1
  echo "rc=$?"; grep "'tokens'" "$OUT/px.log" | cut -c1-400
}
s_q16() {
  T ${ST:-150} python3 benchmarks/bench_moe.py --shapes qwen3-30b-a3b-down --tokens 128 \
    --specs "w4a16-g128-zp,w4a16-g128-zp@mgpu:sub2-xk-ovl-unpad,w4a16-g128-zp@mgpu:cb1-sub2-xk-ovl-unpad,w4a16-g128-zp@mgpu:cb1-wg2-st2-sub2-xk-ovl-unpad" \
    $ROW --json "$OUT/q16.json" > "$OUT/q16.log" 2>&1
  echo "rc=$?"; grep -E "T=|rror" "$OUT/q16.log" | cut -c1-1200
}
s_qm() {
  local tree mt
  cp -r humming_jax /tmp/hj_new_tree  # put back after the old tree's run
  for tree in new old; do
    [ $tree = old ] && rm -rf humming_jax && cp -r old/humming_jax humming_jax
    python3 -c "from humming_jax.kernels import grouped_wna16_mgpu as g; \
      print('tree', g.__file__, g.STREAMED_MAX_K_TILES)"  # 6 / 2
    for mt in deepseek-v3:256 mixtral:32; do
      T ${ST:-150} python3 benchmarks/bench_moe_layer.py --models ${mt%%:*} \
        --tokens ${mt##*:} --families default --json "$OUT/qm_${tree}_${mt%%:*}.json" \
        >> "$OUT/qm.log" 2>&1
      echo "$tree $mt rc=$?"; grep "'tokens'" "$OUT/qm.log" | tail -1 | cut -c1-300
    done
  done
  rm -rf humming_jax && cp -r /tmp/hj_new_tree humming_jax && rm -rf /tmp/hj_new_tree  # restored
}
for s in ${@:-g42 g42d bd}; do step "$s"; "s_$s"; done
step done
