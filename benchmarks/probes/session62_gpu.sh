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
   for tool in memcheck initcheck racecheck; do
     step ${tool}_fused 400 $SAN --tool $tool $PYT -m gpu tests/mhc/test_mhc_cute_proj_rms.py -k "$FR" &
   done
   wait
   grep -E "passed|failed" "$OUT/tests.log" | tail -3 ;;
G) step proj_rms 300 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --registry cute --registry-ab sep,gm10 \
     --rounds 5 --ab sep,gm10,gm5,gm8
   step post_pre 240 python3 benchmarks/probes/mhc_post_pre_variants.py \
     --rows h_post_bda,mhc_pre,cute,h_post_bda,mhc_pre,cute
   tail -30 "$OUT/proj_rms.log"; tail -12 "$OUT/post_pre.log" ;;
*) echo "usage: session62_gpu.sh T|G"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
