#!/usr/bin/env bash
# mhc_post_pre's cute backend on the GPU: tests, sanitizers, timing (first written for the checks session 16 owed). Session 13's version of this script: git show 12b5508:benchmarks/probes/owed_gpu_checks.sh.
# Both toolchains in one process (mhc_post_pre's cute backend runs cuTile and CuTe DSL kernels): two device
# calls on the same warm machine, from the repository root:
#   call 1 (carry .gpu-cutile): source .gpu-cutile/env.sh            # unpacks cuTile into /tmp/tk-cutile
#   call 2 (carry .gpu-cute):   source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#                                   PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH
#                               bash benchmarks/probes/owed_gpu_checks.sh
# Steps (session 17): tests/mhc/test_mhc_cute_post_pre.py -m gpu whole (every case takes the default fused forward,
#   cute_post_pre_fwd, FUSE_FWD on since session 17; test_cute_composed_forward_* the composition); memcheck /
#   initcheck / racecheck on two small default cases; then the timing rows (mhc_post_pre_variants.py, alone on the
#   GPU): the default, the composed forward (FUSE_FWD=0), the two ops composed and the two ops timed apart
#   (ROWS=... replaces the rows; PROFILE=1 adds each row's kernel table).
# Each step has its own timeout; logs under $OUT; a summary (each tool's summary line, pytest's result) last.
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
: > "$SUM"  # a fresh summary
ls /tmp/tk-cutile > /dev/null || { echo "cuTile is not unpacked (call 1 first)"; exit 3; }
SAN="compute-sanitizer --report-api-errors no --print-limit 50"
PYT="python3 -m pytest -q -p no:cacheprovider -m gpu"
# sanitized cases: two small default ones (fused forward + the backward pass)
K='cute_matches_float64 and (T37-n3 or T1-n1)'
ROWS=${ROWS:-separate,h_post_bda,mhc_pre,cute,cute:FUSE_FWD=0,cute,cute:FUSE_FWD=0,separate,h_post_bda,mhc_pre}
PHASE=${1:-all}  # smoke | tests | timing | all (one device call may run 600 s: tests and timing fit two calls)
if [ "$PHASE" = smoke ]; then   # one small case first: a hang costs 60 s, not the call
  step smoke 60 $PYT tests/mhc/test_mhc_cute_post_pre.py -k "cute_matches_float64 and T1-n1"
  tail -3 "$SUM"; grep -q "rc=0 " "$SUM"; exit $?
fi
if [ "$PHASE" != timing ]; then
step post_pre_tests 240 $PYT tests/mhc/test_mhc_cute_post_pre.py
step fwd_memcheck 150 $SAN --tool memcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
step fwd_initcheck 150 $SAN --tool initcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
step fwd_racecheck 150 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
wait
fi
[ "$PHASE" = tests ] || step variants 240 python3 benchmarks/probes/mhc_post_pre_variants.py \
  --rows "$ROWS" ${PROFILE:+--profile} --out "$OUT"
[ "$PHASE" = tests ] || tail -16 "$OUT/variants.log"
cat "$SUM"
