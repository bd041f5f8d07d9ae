#!/usr/bin/env bash
# Session 61's device calls (repo root, carry .gpu-cute):
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session61_gpu.sh G|S
# G (H200 only; elsewhere it stops at once): what sessions 57-60 owed on an H200: the GDN CuTe DSL backward's
#    reduction A/B (RG 32 default against the first RG 8 / RV 1 / RU 4), then issue 12's in-place decode floor at
#    B = 32 / 256 and issue 15's proj_rms through the registry, re-timed.
# S (any card): compute-sanitizer memcheck / initcheck / racecheck on small cases of the mHC kernels whose
#    LayoutEnum import changed in session 59 (PTX byte-identical; never rerun under the sanitizers): post_pre's fused
#    forward and backward with SPLIT_DW's dh_pre pass (dhdw), the resident forward, proj_rms's backward and mhc_pre's
#    dx pass (AGG); then tk-bench on the cp and moe families, whose bitwise ("exact") outputs session 59 moved to a
#    chunked on-device check (never run on a GPU).
# T (any card; cuTile unpacked by an earlier call with .gpu-cutile, then PYTHONPATH / PATH as session60_gpu.sh says):
#    the mHC kernel-list checks through mhc_helpers.kernel_names / skip_if_unprofiled (5566e1a): the tests that use
#    them, plainly (they pass), then two of them under memcheck (they skip after their float64 checks, 0 errors).
set -u
. "$(dirname "$0")/_steps.sh"
session_start
MODE=${1:-S}
case "$MODE" in
G) grep -q H200 "$OUT/device.txt" || { echo "G: not an H200"; cat "$OUT/device.txt"; exit 4; }
   step red_time 120 python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT" --variants RG8-RV1-RU4 \
     --cases bshd-rep,thd-rep
   step floor 150 python3 benchmarks/probes/gdn_inplace_floor.py --b 32,256 --rounds 3
   step proj_rms 120 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --registry cute
   grep -E "default|RG8|reduction" "$OUT/red_time.log" | tail -8; tail -12 "$OUT/floor.log"; tail -22 "$OUT/proj_rms.log" ;;
S) PP='(test_cute_matches_float64 and (T37-n3 or T1-n1 or T3-n2 or T9-n1)) or (split_configs and T65-n3)'
   RS='test_resident_matches_float64 and (T37-n3 or T1-n1)'
   PR='(test_bwd_matches_float64 and (M3-N3 or M65-N8 or M129-N15 or M70-N24))'
   PR="$PR or (test_bwd_agg_matches_float64 and (T65-n4-C200 or T37-n2 or T5-n4 or T64-n4-C256))"
   for tool in memcheck initcheck racecheck; do
     step ${tool}_post_pre 300 $SAN --tool $tool $PYT -m gpu tests/mhc/test_mhc_cute_post_pre.py -k "$PP" &
     step ${tool}_res 300 $SAN --tool $tool $PYT -m gpu tests/mhc/test_mhc_cute_post_pre_res.py -k "$RS" &
     step ${tool}_proj_rms 300 $SAN --tool $tool $PYT -m gpu tests/mhc/test_mhc_cute_proj_rms.py -k "$PR" &
   done
   wait
   step bench_exact 200 python3 -m tools.bench --family cp --family moe --no-compare --json "$OUT/bench.jsonl"
   tail -30 "$OUT/bench_exact.log" ;;
T) KL='resident_matches_float64 or forward_epilogue_matches_float64 or replaces_both_passes or drops_the_dweight_pass or with_cutile_mix_kernel'
   step kl_tests 300 $P -n 8 tests/mhc/test_mhc_cute_post_pre_res.py tests/mhc/test_mhc_cute_post_pre.py -k "$KL"
   step kl_memcheck 200 $SAN --tool memcheck $PYT -m gpu -rs tests/mhc/test_mhc_cute_post_pre_res.py \
     -k "resident_matches_float64 and (T37-n3 or T1-n1)"
   grep -E "SKIPPED|passed|skipped" "$OUT/kl_memcheck.log" | tail -4 ;;
*) echo "usage: session61_gpu.sh G|S|T"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
