#!/usr/bin/env bash
# The GPU checks sessions 10 and 11 owed (session 10's record: git show fccfcb8:benchmarks/results/h200-gpu-checks-session10.txt);
# session 12 ran most of them (benchmarks/results/h200-gpu-checks-session12.txt lists what is still owed), one device call per bundle, from the repository root:
#   cute:   source .gpu-cute/env.sh && bash benchmarks/probes/owed_gpu_checks.sh cute     (carry .gpu-cute)
#   cutile: source .gpu-cutile/env.sh && bash benchmarks/probes/owed_gpu_checks.sh cutile (carry .gpu-cutile)
# cute: the GPU files of the code moved without a GPU run (the gdn cute forward after the HeadGeometry /
#   copy_z_rows / ring_buffer moves, 8449107 and c6e6f84; the cute decode after BoundLaunch moved to _cute.py;
#   cute decode and h_post_bda after _cute.launch_bounded, c6e6f84: byte-identical PTX), initcheck of the cute
#   h_post_bda at its forward default (FSPLIT = KF, FCM). The never-run CuTe DSL gdn backward has its own
#   probe (benchmarks/probes/gdn_cute_pre_bwd.py), a call of its own.
# cutile: tests/gdn/test_gdn_cutile_pre_gated.py after its host-side moves, and memcheck / initcheck /
#   racecheck on mhc_post_pre's default backward at DP3 (mhc_pp_bwd_dx). racecheck's known benign report: the
#   write-write of equal values at cutile_post_pre_bwd.py:171 / cutile_proj_rms.py:91-92 (session 10).
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
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|error" "$OUT/$name.log" | tail -4; } >> "$SUM"
}
SAN="compute-sanitizer --report-api-errors no --print-limit 50"
case "$MODE" in
  cute)
    step cute_gpu_files 300 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 \
      tests/gdn/test_gdn_cute_pre_gated.py tests/gdn/test_gdn_cute_decode.py tests/mhc/test_mhc_cute_post_bda.py
    step post_bda_initcheck 200 $SAN --tool initcheck python3 -m pytest -q -p no:cacheprovider -m gpu \
      tests/mhc/test_mhc_cute_post_bda.py -k "test_against_float64 or test_bwd_grids"
    ;;
  cutile)
    step gdn_cutile_fwd 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/gdn/test_gdn_cutile_pre_gated.py
    K="test_cutile_matches_float64 and default and (T37-n3-C100 or T1001-n4-C2560)"
    for tool in memcheck initcheck racecheck; do
      extra=""
      [ "$tool" = racecheck ] && extra="--racecheck-report hazard --show-backtrace no"
      step "pp_dp3_$tool" 110 $SAN --tool $tool $extra python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/mhc/test_mhc_post_pre.py -k "$K"
    done
    ;;
  *) echo "mode: cute or cutile" >&2; exit 2 ;;
esac
cat "$SUM"
