#!/usr/bin/env bash
# The GPU checks owed at the start of session 13 (h200-gpu-checks-session12.txt listed them: git show 90fe93c:benchmarks/results/h200-gpu-checks-session12.txt; that
# session's version of this script: git show bf4da61:benchmarks/probes/owed_gpu_checks.sh), one device call per
# bundle, from the repository root:
#   cute:   source .gpu-cute/env.sh && bash benchmarks/probes/owed_gpu_checks.sh cute     (carry .gpu-cute)
#   cutile: source .gpu-cutile/env.sh && bash benchmarks/probes/owed_gpu_checks.sh cutile (carry .gpu-cutile)
# cute: phase 1 at once (separate processes): the CuTe DSL gdn backward's GPU tests with memcheck
#   (benchmarks/probes/gdn_cute_pre_bwd.py --tests), initcheck and racecheck on the same small selection (never
#   run on it), the gdn cute forward and decode GPU files (the forward after 7c2ee82's shared helpers, never
#   run on a GPU); phase 2 alone: the backward timed at bshd-rep / thd-rep, gdn_decode graph-replayed beside a
#   copy of each step's bytes (benchmarks/gdn_decode_check.py --copy-floor).
# cutile: tests/gdn/test_gdn_cutile_pre_gated.py whole (session 12 ran 70 tests before its 140 s limit),
#   racecheck of mhc_post_pre's default backward at DP3 to the end (cut at 90 s in session 12; its known benign
#   report: the write-write of equal values at cutile_post_pre_bwd.py:177), and the compiled fwd+bwd test
#   through the registry with the cuTile backends (tests/registry -k compile_fwd_bwd).
# Each step has its own timeout; logs under $OUT; a summary (each tool's summary line, pytest's result) last.
set -u
OUT=${OUT:-.}
MODE=${1:?cute or cutile}
SUM="$OUT/summary.txt"
: > "$SUM"
step() {  # step NAME SECONDS CMD...: run under a timeout, keep the tail of its log in the summary
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  { echo "== $name rc=$rc $((SECONDS - t0)) s"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|error|^smoke" "$OUT/$name.log" | tail -4; } >> "$SUM"
}
SAN="compute-sanitizer --report-api-errors no --print-limit 50"
PYT="python3 -m pytest -q -p no:cacheprovider -m gpu"
case "$MODE" in
  cute)
    BWD_K=$(python3 -c "import sys; sys.path[:0] = ['benchmarks/probes', 'benchmarks']; import gdn_cute_pre_bwd as g; print(g.MEMCHECK_K)")
    step bwd_tests "${T_BWD:-280}" python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT/bwd_tests" --tests 240 \
      --jobs 5 --memcheck --cases none &
    step bwd_initcheck 280 $SAN --tool initcheck $PYT tests/gdn/test_gdn_cute_pre_gated_bwd.py -k "$BWD_K" &
    step bwd_racecheck 280 $SAN --tool racecheck --racecheck-report hazard --show-backtrace no \
      $PYT tests/gdn/test_gdn_cute_pre_gated_bwd.py -k "$BWD_K" &
    step fwd_decode_files 280 $PYT -n 4 tests/gdn/test_gdn_cute_pre_gated.py tests/gdn/test_gdn_cute_decode.py &
    wait
    step bwd_timing 130 python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT/bwd_timing" --cases bshd-rep,thd-rep
    step decode_timing 110 python3 benchmarks/gdn_decode_check.py --out "$OUT" --backends cute --copy-floor --rep 100
    ;;
  cutile)
    step gdn_cutile_fwd 300 $PYT -n 6 tests/gdn/test_gdn_cutile_pre_gated.py &
    K="test_cutile_matches_float64 and default and (T37-n3-C100 or T1001-n4-C2560)"
    step pp_dp3_racecheck 300 $SAN --tool racecheck --racecheck-report hazard --show-backtrace no \
      $PYT tests/mhc/test_mhc_post_pre.py -k "$K" &
    step compile_fwd_bwd 300 $PYT tests/registry -k compile_fwd_bwd &
    wait
    ;;
  *) echo "mode: cute or cutile" >&2; exit 2 ;;
esac
cat "$SUM"
