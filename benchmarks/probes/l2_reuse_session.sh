#!/usr/bin/env bash
# Session 43's L2-reuse probe fields on the GPU (PostBdaCuteCfg.REV, AggCfg.REV / REV_B: token walks last to first
# so that a kernel starts on what the kernel before it touched last). Two calls (a third if REV wins) on one warm
# machine, repo root:
#   call 1 (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/l2_reuse_session.sh 1
#   call 2 (carry .gpu-cute):   source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#                                   PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH
#                               bash benchmarks/probes/l2_reuse_session.sh 2   (call 3: the same with 3)
# 1: the aggregate's REV tests (bitwise the default, float64) and sanitizers, then mhc_cutile_check.py's mhc_pre
#    sweep (its agg rows: the cuTile launch lists, L2 flushed before each list, so the forward's REV row sees the
#    projection pass's x).
# 2: h_post_bda's REV tests, then its timing with the backward right after the forward (--chain-ab rev: the kernels
#    and the registry's fwd+bwd, rounds interleaved); then mhc_pre and mhc_post_pre through the registry with the
#    aggregate reversed (mhc_post_pre_variants.py AGG_ rows, interleaved with the defaults).
# 3 (carry .gpu-cute, after 2, only if REV is to become h_post_bda's default): the post_bda GPU file whole at REV
#    (TK_TEST_PB_CUTE_CFG) and memcheck / initcheck / racecheck on two small REV cases (a 5-CTA grid over 37 tokens,
#    4 CTAs over 6). Mode 1 already runs memcheck / initcheck on the aggregate's small REV cases.
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
: > "$SUM"
P="python3 -m pytest -q -p no:cacheprovider -m gpu -rfE"
case "${1:-}" in
1) step agg_rev_tests 200 $P tests/mhc/test_mhc_cutile_gpu.py -k reversed
   K="reversed and (T37-n3 or T1-n1)"
   for tool in memcheck initcheck; do
     step agg_rev_$tool 150 $SAN --tool $tool $P tests/mhc/test_mhc_cutile_gpu.py -k "$K" &
   done
   wait
   step pre_sweep 300 python3 benchmarks/mhc_cutile_check.py --phases sweep --ops mhc_pre --out "$OUT"
   grep -h '"op": "mhc_pre"' "$OUT/pre_sweep.log" | cut -c1-400 ;;
2) step pb_rev_tests 200 $P tests/mhc/test_mhc_cute_post_bda.py -k "rev or reversed"
   step pb_chain 200 python3 benchmarks/probes/mhc_cute_post_bda_time.py --chain-ab rev --rounds 5 --out "$OUT"
   R=cute,cute:AGG_REV=1,mhc_pre,mhc_pre:AGG_REV=1,mhc_pre:AGG_REV_B=1,mhc_pre:AGG_REV=1:AGG_REV_B=1
   step pre_rows 240 python3 benchmarks/probes/mhc_post_pre_variants.py --rows "$R,$R" --out "$OUT"
   tail -12 "$OUT/pb_chain.log"; tail -16 "$OUT/pre_rows.log" ;;
3) step pb_file_rev 360 env TK_TEST_PB_CUTE_CFG='{"REV": true}' $P tests/mhc/test_mhc_cute_post_bda.py
   K="reversed_walk and (37-4-7168-5 or 6-2-104-4)"
   for tool in memcheck initcheck racecheck; do
     step pb_rev_$tool 180 $SAN --tool $tool $P tests/mhc/test_mhc_cute_post_bda.py -k "$K" &
   done
   wait ;;
*) echo "usage: l2_reuse_session.sh 1|2|3"; exit 2 ;;
esac
cat "$SUM"
