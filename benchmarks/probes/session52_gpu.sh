#!/usr/bin/env bash
# Session 52's two device calls on one warm machine (repo root); each packs what sessions 43-51 still owed:
#   C1 (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session52_gpu.sh C1
#   C2 (carry .gpu-cute, C1 before it on the same machine so cuTile is unpacked under /tmp/tk-cutile):
#       source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#         PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session52_gpu.sh C2
# C1: l2_reuse_session.sh 1's aggregate REV tests and sanitizers, beside initcheck / racecheck of the cuTile GDN
#     backward's THD W=4 edge case (session 50's padding fix; memcheck ran in session 51); then the mhc_pre sweep.
# C2: the pre-quantized MoE test through auto (session 51's version, asserting auto picks cute) beside
#     h_post_bda's REV tests; then l2_reuse_session.sh 2's timing (the chain A/B and the AGG_ rows).
# (The GPU run of the fix made after call 7, once C3 here, is session53_gpu.sh D1 / D2: it ran in session 53.)
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
session_start
case "${1:-}" in
C1) step agg_rev_tests 200 $P -n 4 tests/mhc/test_mhc_cutile_gpu.py -k reversed &
    K="reversed and (T37-n3 or T1-n1)"
    for tool in memcheck initcheck; do
      step agg_rev_$tool 160 $SAN --tool $tool $P tests/mhc/test_mhc_cutile_gpu.py -k "$K" &
    done
    for tool in initcheck racecheck; do
      step gdn_edges_$tool 200 $SAN --tool $tool $P tests/gdn/test_gdn_cutile_pre_gated_bwd.py \
        -k "edges and W4-rep and thd" &
    done
    wait
    step pre_sweep 300 python3 benchmarks/mhc_cutile_check.py --phases sweep --ops mhc_pre --out "$OUT"
    grep -h '"op": "mhc_pre"' "$OUT/pre_sweep.log" | cut -c1-400 ;;
C2) step predq_auto 150 $P -n 4 tests/moe/test_moe_cute_registry.py -k prequantized &
    step pb_rev_tests 150 $P -n 4 tests/mhc/test_mhc_cute_post_bda.py -k "rev or reversed" &
    wait
    step pb_chain 170 python3 benchmarks/probes/mhc_cute_post_bda_time.py --chain-ab rev --rounds 5 --out "$OUT"
    R=cute,cute:AGG_REV=1,mhc_pre,mhc_pre:AGG_REV=1,mhc_pre:AGG_REV_B=1,mhc_pre:AGG_REV=1:AGG_REV_B=1
    step pre_rows 210 python3 benchmarks/probes/mhc_post_pre_variants.py --rows "$R,$R" --out "$OUT"
    tail -14 "$OUT/pb_chain.log"; tail -16 "$OUT/pre_rows.log" ;;
*) echo "usage: session52_gpu.sh C1|C2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
