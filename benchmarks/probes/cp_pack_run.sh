#!/usr/bin/env bash
# Issue 13, one H200 run under 200 s: tests/cp/test_cp_cutile_pack.py -m gpu (verbose, a per-test
# thread timeout of TT s; TESTK: a -k selection) and, with SAN=1, compute-sanitizer memcheck and racecheck over SAN_SEL,
# all beside the timing table's compiles; the table (benchmarks/cp_pack_check.py, cp CPS, SWEEP=1:
# the sweep, REPS timing passes) is timed only once the tests and sanitizers are done
# (--wait-for). Logs under $OUT; summaries and the table printed last.
#   source .gpu-cutile/env.sh && SWEEP=1 bash benchmarks/probes/cp_pack_run.sh
set -u
OUT=${OUT:-/tmp/cp_pack_run}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/benchmarks:$PYTHONPATH"
T0=$(date +%s)
DONE="$OUT/.tests-done"; rm -f "$DONE"
SAN_SEL=${SAN_SEL:-'cu_dtype0 and (cp8-3-5 or cp2-16-8-1-float16 or cp4-32) or variants and default-qwen'}
(
  if [ "${SAN:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      timeout ${SAN_S:-100} compute-sanitizer --tool $tool --print-limit 50 python3 -m pytest -q -x \
        -p no:cacheprovider tests/cp/test_cp_cutile_pack.py -m gpu -k "$SAN_SEL" > "$OUT/san-$tool.txt" 2>&1 &
    done
  fi
  timeout ${TEST_S:-100} python3 -m pytest -v -n ${N:-6} --timeout=${TT:-90} --timeout-method=thread \
    -p no:cacheprovider tests/cp/test_cp_cutile_pack.py -m gpu ${TESTK:+-k "$TESTK"} > "$OUT/pytest-cp.log" 2>&1
  echo "pytest rc=$? at $(( $(date +%s) - T0 )) s" > "$OUT/pytest-rc.txt"
  wait
  touch "$DONE"
) &
timeout ${BENCH_S:-190} python3 benchmarks/cp_pack_check.py --cps ${CPS:-8,4,2} ${SWEEP:+--sweep} \
  --reps ${REPS:-2} --wait-for "$DONE" > "$OUT/cp_pack_check.log" 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s"
wait
cat "$OUT/pytest-rc.txt"
grep -E "FAILED|ERROR|Timeout|passed|failed" "$OUT/pytest-cp.log" | grep -v PASSED | tail -25
for tool in memcheck racecheck; do
  [ -f "$OUT/san-$tool.txt" ] && echo "san-$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tail -1);" \
    "$(grep -E ' passed| failed| error' "$OUT/san-$tool.txt" | tail -1)"
done
grep -E "^waited|Error|error" "$OUT/cp_pack_check.log" | head -8
sed -n '/^NVIDIA/,$p' "$OUT/cp_pack_check.log"
