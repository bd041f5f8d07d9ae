#!/usr/bin/env bash
# Session 62's device calls (repo root, carry .gpu-cute; cuTile from an earlier .gpu-cutile call on the same machine
# where present, as session60_gpu.sh says):
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session62_gpu.sh T|G
# T (any card): proj_rms's backward with FUSE_RED (the slice's last CTA sums dweight's partials; session 62):
#    the GPU files that run it (proj_rms, mhc_pre's cute backend, mhc_post_pre's cute passes), then compute-sanitizer
#    memcheck / initcheck / racecheck on small cases of the fused sums (1, 2 and 7 row groups, slice tails, DW_ONLY,
#    AGG_C, another stream, graph replays) and of the float64 checks.
# G (any card; the device is recorded): the A/B through the registry (issue 15's proj_rms fwd+bwd) against the
#    separate reduction launch ("sep") and GM 10, the kernel rows, then mhc_pre / mhc_post_pre / h_post_bda's rows.
# K (any card; cuTile on the path): mhc_sinkhorn's new cute backend (cute_sinkhorn, cute_sk_bwd's LOGITS mode): the
#    sinkhorn GPU files (cute, cute_sk_bwd, the op's, the registry's default), compute-sanitizer on small cases, then
#    host_profile.py --sinkhorn-ab: the eager fwd+bwd with each backend beside torch's autograd floor, both measured as
#    host us a call and by do_bench.
# H (H200 only; elsewhere it stops at once; cuTile on the path): issue 15's rows at this tree: proj_rms through the
#    registry (FUSE_RED against sep), mhc_post_pre against its two ops apart, the eager sinkhorn's backends.
# P (any card; cuTile on the path): host_profile.py --sinkhorn: the eager sinkhorn's layers and cProfile of its registry
#    step (the default: cute), to see where the host time above torch's floor goes.
# L (any card; cuTile on the path): _cute.Launch.run's launch with its argument array built once (_prepacked): the
#    CuTe DSL GPU files of every family (mHC, MoE, GDN), then the sinkhorn A/B (its kernel-fn rows: the launch's host
#    cost against call 7's).
set -u
. "$(dirname "$0")/_steps.sh"
session_start
MODE=${1:-T}
case "$MODE" in
T) step tests 420 $P -n 8 tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_pre.py \
     tests/mhc/test_mhc_cute_post_pre.py
   FR='test_fused_sums_bitwise and (65-8 or 130-3 or 777-32 or 300-24 or 37-15)'
   FR="$FR or (test_bwd_matches_float64 and (M3-N3 or M65-N8 or M129-N15)) or (test_dweight_only and 65)"
   FR="$FR or (test_bwd_agg_matches_float64 and (T65-n4-C200 or T37-n2 or T5-n4))"
   sanitize fused 400 tests/mhc/test_mhc_cute_proj_rms.py -k "$FR"
   grep -E "passed|failed" "$OUT/tests.log" | tail -3 ;;
G) step proj_rms 300 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --registry cute --registry-ab sep,gm10 \
     --rounds 5 --ab sep,gm10,gm5,gm8
   step post_pre 240 python3 benchmarks/probes/mhc_post_pre_variants.py \
     --rows h_post_bda,mhc_pre,cute,h_post_bda,mhc_pre,cute
   tail -30 "$OUT/proj_rms.log"; tail -12 "$OUT/post_pre.log" ;;
K) step sk_tests 400 $P -n 8 tests/mhc/test_mhc_cute_sinkhorn.py tests/mhc/test_mhc_cute_sk_bwd.py \
     tests/mhc/test_mhc_sinkhorn.py tests/mhc/test_mhc_cutile_registry.py
   SK='test_matches_float64 and (T1-n4 or T33-n4 or T129-n4 or T333-n3 or T37-n1 or T67-n7) and unit'
   SK="$SK or test_empty_and_ties or (test_registry_default_and_autograd and T7-n3)"
   sanitize sk 300 tests/mhc/test_mhc_cute_sinkhorn.py -k "$SK"
   step sk_ab 300 python3 benchmarks/probes/host_profile.py --sinkhorn-ab --T 32768
   tail -14 "$OUT/sk_ab.log" ;;
H) grep -q H200 "$OUT/device.txt" || { echo "H: not an H200"; cat "$OUT/device.txt"; exit 4; }
   step proj_rms 300 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --registry cute --registry-ab sep \
     --rounds 5 --ab sep
   step post_pre 240 python3 benchmarks/probes/mhc_post_pre_variants.py \
     --rows h_post_bda,mhc_pre,cute,h_post_bda,mhc_pre,cute
   step sk_ab 300 python3 benchmarks/probes/host_profile.py --sinkhorn-ab --T 32768
   tail -24 "$OUT/proj_rms.log"; tail -12 "$OUT/post_pre.log"; tail -14 "$OUT/sk_ab.log" ;;
P) step sk_prof 300 python3 benchmarks/probes/host_profile.py --sinkhorn --T 32768
   grep -A40 "tottime" "$OUT/sk_prof.log" | head -45; tail -14 "$OUT/sk_prof.log" ;;
L) step cute_files 560 $P -n 12 tests/mhc/test_mhc_cute_aggregate.py tests/mhc/test_mhc_cute_post_bda.py \
     tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_sinkhorn.py tests/mhc/test_mhc_cute_sk_bwd.py \
     tests/mhc/test_mhc_cute_pre_rest.py tests/mhc/test_mhc_cute_pp_mix.py tests/moe/test_mxfp8_cute.py \
     tests/moe/test_swiglu_cute.py tests/moe/test_qdq_cute.py tests/moe/test_moe_cute_registry.py \
     tests/gdn/test_gdn_cute_decode.py tests/gdn/test_gdn_cute_pre_gated.py tests/test_cute_launch.py
   grep -E "passed|failed" "$OUT/cute_files.log" | tail -3 ;;
M) step sk_ab 300 python3 benchmarks/probes/host_profile.py --sinkhorn-ab --T 32768
   tail -14 "$OUT/sk_ab.log" ;;
*) echo "usage: session62_gpu.sh T|G|K|H|P|L|M"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
