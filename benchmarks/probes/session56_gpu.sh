#!/usr/bin/env bash
# The next session's device calls (repo root; written in session 55, not yet run). Both carry .gpu-cute:
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session56_gpu.sh J1   (then J2 on the same machine)
# J1 (an H200 for the numbers to count): issue 15's h_post_bda at HEAD, where session 55 made the dbias reduction's 32
#     row groups the default (868cfa2) after the H200 lease had gone: the registry's fwd+bwd with fp32 and bf16 h in
#     three interleaved rounds (target <= 2.55 ms; RG 8 read 2.5536-2.5550 with fp32 h) and the backward-after-forward
#     A/B against the old RG 8 (`--chain-ab rg8`, five rounds).
# J2: gdn_pre_gated's CuTe DSL backward's new reduction fields (0377cb7; the default unchanged): their GPU tests
#     (float64, the odd-dims column tail, one partial row), memcheck / initcheck on the tail test, then the timing
#     probe's reduction variants beside the default (bshd-rep, thd-rep: the whole backward and the reduction alone).
# J3: racecheck on h_post_bda's dbias reduction at RG 32 (owed since session 55, whose racecheck step timed out on
#     the T=1000 cases): test_bwd_grids only (T=37, bias fp32 and bf16, grids 1 / 7 / 36).
# J4: session 56's registry changes (CPU value tensors compared by bytes in the value caches; non-dense tensors and
#     neg / conj views refused; every failing limit listed; the direct path's version bump) on the GPU: the
#     hot-path, guard and defect files whole (graphs, compile, reduce-overhead through the registry); then the mHC
#     GPU runners with session 56's rounded-once checks (assert_one_rounding) on the cuTile and CuTe DSL kernels are
#     J5 (the CuTe DSL bundle with cuTile beside it, as session 55's F2).
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
session_start
case "${1:-}" in
J1) step pb_registry 200 python3 benchmarks/probes/mhc_cute_post_bda_time.py --registry-only --out "$OUT" \
      --h-order fp32,bf16,fp32,bf16,fp32,bf16
    step pb_chain 200 python3 benchmarks/probes/mhc_cute_post_bda_time.py --chain-ab rg8 --rounds 5 --out "$OUT"
    grep -E "registry fwd\+bwd" "$OUT/pb_registry.log"; grep -E "rounds" "$OUT/pb_chain.log" ;;
J2) B=tests/gdn/test_gdn_cute_pre_gated_bwd.py
    step red_tests 300 $P -n 8 $B -k "reduction or (launch_config_variants and (RG or RV))"
    for tool in memcheck initcheck; do
      step red_$tool 200 $SAN --tool $tool $PYT -m gpu $B -k "reduction_variants_column_tail" &
    done; wait
    step red_time 300 python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT" --variants RG16,RV4,RG32-RV4-RU8 \
      --cases bshd-rep,thd-rep
    grep -E "default|reduction|RG|RV" "$OUT/red_time.log" | tail -16 ;;
J3) step pb_racecheck 500 $SAN --tool racecheck $PYT -m gpu tests/mhc/test_mhc_cute_post_bda.py -k bwd_grids
    tail -3 "$OUT/pb_racecheck.log" ;;
J4) step reg_hot 540 $P -n 8 tests/registry/test_registry_hot_path.py tests/registry/test_registry_guards.py \
      tests/registry/test_registry_defects.py
    tail -3 "$OUT/reg_hot.log" ;;
J5) step once 500 $P -n 8 tests/mhc/test_mhc_cutile_gpu.py tests/mhc/test_mhc_cute_pre.py \
      tests/mhc/test_mhc_cute_post_bda.py -k "float64 or h_post_bda or h_aggregate or pre"
    step deq 120 $P tests/moe/test_mxfp8_cute.py -k dequantize_bit_exact   # (its finite pre-fill, session 56)
    tail -3 "$OUT/once.log" "$OUT/deq.log" ;;
*) echo "usage: session56_gpu.sh J1|J2|J3|J4|J5"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
