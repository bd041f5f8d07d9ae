#!/usr/bin/env bash
# GPU checks of mhc_post_pre's backward designs for mhc_pre's dh_pre and dweight (cute bundle, cuTile unpacked by a call
# before: see owed_gpu_checks.sh). PHASE:
#   split      (session 25) SPLIT_DW, the default: a smoke case, then post_pre_dhw_check.py --flag SPLIT_DW (every
#              output against SPLIT_DW off at 8 shapes, two runs bitwise equal, the backward timed both ways)
#   splittests (session 25) the post_pre file whole, memcheck / initcheck / racecheck on small SPLIT_DW cases
#   dhw        (session 24) FUSE_DHW's tests and sanitizers, the post_pre file
#   pre        (session 24) session 23's mix checks (initcheck / racecheck on mhc_pre_bwd_sk / _rest, test_pre)
#   all        dhw and pre
set -u
. "$(dirname "$0")/_steps.sh"
: > "$SUM"
PYT="python3 -m pytest -q -p no:cacheprovider -m gpu"
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
ls /tmp/tk-cutile > /dev/null || { echo "cuTile is not unpacked (call 1 first)"; exit 3; }
PHASE=${1:-all}
K='dhw_pass_matches_float64 and (T37-n3 or T1-n1)'
M='pre_backward_either_mix and split and (T37-n3 or T1-n1)'
S='cute_matches_float64 and (T37-n3 or T1-n1 or T300-n4)'
if [ "$PHASE" = split ]; then
  step smoke 90 $PYT tests/mhc/test_mhc_cute_post_pre.py -k "cute_matches_float64 and (T1-n1 or T37-n3)"
  grep -q "rc=0 " "$SUM" || { cat "$SUM"; tail -30 "$OUT/smoke.log"; exit 1; }
  step check 300 python3 benchmarks/probes/post_pre_dhw_check.py --flag SPLIT_DW --out "$OUT"
  tail -14 "$OUT/check.log"
fi
if [ "$PHASE" = splittests ]; then
  step post_pre_tests 300 $PYT tests/mhc/test_mhc_cute_post_pre.py
  step split_memcheck 200 $SAN --tool memcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$S" &
  step split_initcheck 200 $SAN --tool initcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$S" &
  step split_racecheck 200 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$S" &
  wait
fi
if [ "$PHASE" = dhw ] || [ "$PHASE" = all ]; then
  step post_pre_tests 300 $PYT tests/mhc/test_mhc_cute_post_pre.py
  step dhw_memcheck 200 $SAN --tool memcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
  step dhw_racecheck 200 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
  wait
fi
if [ "$PHASE" = pre ] || [ "$PHASE" = all ]; then
  step pre_tests 300 $PYT tests/mhc/test_mhc_cutile_gpu.py -k "test_pre"
  step mix_initcheck 200 $SAN --tool initcheck $PYT tests/mhc/test_mhc_cutile_gpu.py -k "$M" &
  step mix_racecheck 200 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cutile_gpu.py -k "$M" &
  wait
fi
cat "$SUM"
