#!/usr/bin/env bash
# The GPU checks owed at the end of session 16 (its device time ran out; the mHC ledger's session-16 entry lists
# them). Session 13's version of this script: git show 12b5508:benchmarks/probes/owed_gpu_checks.sh.
# Both toolchains in one process (mhc_post_pre's cute backend runs cuTile and CuTe DSL kernels): two device
# calls on the same warm machine, from the repository root:
#   call 1 (carry .gpu-cutile): source .gpu-cutile/env.sh            # unpacks cuTile into /tmp/tk-cutile
#   call 2 (carry .gpu-cute):   source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#                                   PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH
#                               bash benchmarks/probes/owed_gpu_checks.sh
# Steps: tests/mhc/test_mhc_cute_post_pre.py -m gpu whole (the cases added after helper 49's review: chunks ==
#   stages and stages + 1 at 4 stages, CW 16; the fused forward pass cute_post_pre_fwd, FUSE_FWD forced on:
#   never run before); memcheck / initcheck / racecheck on two small fused-forward cases; then the fused forward
#   timed beside the default, the two ops composed and the two ops timed apart (benchmarks/probes/mhc_post_pre_variants.py, alone on the GPU).
# Each step has its own timeout; logs under $OUT; a summary (each tool's summary line, pytest's result) last.
set -u
OUT=${OUT:-.}
SUM="$OUT/summary.txt"
: > "$SUM"
step() {  # step NAME SECONDS CMD...: run under a timeout, keep the tail of its log in the summary
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  { echo "== $name rc=$rc $((SECONDS - t0)) s"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|error" "$OUT/$name.log" | tail -4; } >> "$SUM"
}
ls /tmp/tk-cutile > /dev/null || { echo "cuTile is not unpacked (call 1 first)"; exit 3; }
SAN="compute-sanitizer --report-api-errors no --print-limit 50"
PYT="python3 -m pytest -q -p no:cacheprovider -m gpu"
K='fused_forward and (T37-n3 or T1-n1)'
PHASE=${1:-all}  # tests | timing | all (one device call may run 600 s: tests and timing fit two calls)
if [ "$PHASE" != timing ]; then
step post_pre_tests 240 $PYT tests/mhc/test_mhc_cute_post_pre.py
step fwd_memcheck 150 $SAN --tool memcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
step fwd_initcheck 150 $SAN --tool initcheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
step fwd_racecheck 150 $SAN --tool racecheck $PYT tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
wait
fi
[ "$PHASE" = tests ] || step variants 240 python3 benchmarks/probes/mhc_post_pre_variants.py \
  --rows separate,h_post_bda,mhc_pre,cute,cute:FUSE_FWD=1,cute,cute:FUSE_FWD=1,separate,h_post_bda,mhc_pre --out "$OUT"
[ "$PHASE" = tests ] || tail -12 "$OUT/variants.log"
cat "$SUM"
