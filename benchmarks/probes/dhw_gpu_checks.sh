#!/usr/bin/env bash
# Session 24's GPU checks (cute bundle, cuTile unpacked by a call before: see owed_gpu_checks.sh): mhc_post_pre's
# FUSE_DHW pass (cute_post_pre_dhw) against float64 and under the sanitizers, the default backward unchanged, and the
# checks session 23 owed on mhc_pre's split mix (initcheck / racecheck on mhc_pre_bwd_sk / _rest, the whole test_pre).
# PHASE: dhw (the dhw pass's tests and sanitizers, the post_pre file) | pre (the mix checks) | all.
set -u
. "$(dirname "$0")/_steps.sh"
: > "$SUM"
PYT="python3 -m pytest -q -p no:cacheprovider -m gpu"
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
ls /tmp/tk-cutile > /dev/null || { echo "cuTile is not unpacked (call 1 first)"; exit 3; }
PHASE=${1:-all}
K='dhw_pass_matches_float64 and (T37-n3 or T1-n1)'
M='pre_backward_either_mix and split and (T37-n3 or T1-n1)'
if [ "$PHASE" != pre ]; then
  step post_pre_tests 300 $PYT tests/mhc/test_mhc_cute_post_pre.py
  step dhw_memcheck 200 $SAN --tool memcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
  step dhw_racecheck 200 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
  wait
fi
if [ "$PHASE" != dhw ]; then
  step pre_tests 300 $PYT tests/mhc/test_mhc_cutile_gpu.py -k "test_pre"
  step mix_initcheck 200 $SAN --tool initcheck $PYT tests/mhc/test_mhc_cutile_gpu.py -k "$M" &
  step mix_racecheck 200 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cutile_gpu.py -k "$M" &
  wait
fi
cat "$SUM"
