#!/usr/bin/env bash
# gdn_decode config variants in one device call (GPU host, repository root, carry .gpu-cutile and
# .gpu-fla):  source .gpu-cutile/env.sh && VARS="dflt f-Fq f-o4" SAN_VAR=dflt bash benchmarks/probes/gdn_decode_variants.sh
# 1. at once, one process each under a time limit (a hung variant cannot stall the others'
#    results): the decode GPU tests with the variant as the heuristic's default
#    (probes/gdn_decode_variant_tests.py, TESTS_K a -k selection, default: all but the
#    kernel-variant tests);
# 2. then alone: benchmarks/gdn_decode_check.py's table (default, FLA, the variants whose tests
#    finished), then the resources of the cubins the JIT built.
# With SAN_VAR=<variant>, memcheck and racecheck on four decode tests at it, beside the tests.
# Logs in $OUT (tests.txt: every variant's log in turn); a summary is printed last.
set -u
OUT=$(cd "${OUT:-.}" && pwd)
VARS=${VARS:-"dflt f-Fq f-E f-o4 f-Fqo4 b-Fq"}
if ls .gpu-fla/*.whl >/dev/null 2>&1; then  # FLA (the peer), off the project's dependencies
  pip install -q --no-deps --no-index --target /tmp/fla .gpu-fla/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/fla:$PYTHONPATH
fi
mkdir -p /tmp/vt
declare -A pids
for v in $VARS; do
  k=${TESTS_K:-"not kernel_variant"}; n=${TESTS_N:-2}
  case $v in *PF*) k="$k and not (tiling and 128)";; dflt) k="not nothing"; n=${DFLT_N:-6};; esac  # dflt: every test
  timeout "${T_TESTS:-110}" python3 benchmarks/probes/gdn_decode_variant_tests.py "$v" -q -rfE -n "$n" \
    --timeout 100 --timeout-method thread -k "$k" > "/tmp/vt/$v.txt" 2>&1 &
  pids[$v]=$!
done
# with SAN_VAR (a variant name): compute-sanitizer memcheck and racecheck over a few decode tests at it
if [ -n "${SAN_VAR:-}" ]; then
  for tool in memcheck racecheck; do
    timeout "${T_SAN:-100}" compute-sanitizer --tool $tool --print-limit 50 python3 benchmarks/probes/gdn_decode_variant_tests.py \
      "$SAN_VAR" -q -k "B5-N8 or B5-N9 or B1-N3 or B33-N33" > "$OUT/san-$tool.txt" 2>&1 &
  done
fi
ok=()
summary=()
for v in $VARS; do
  wait "${pids[$v]}"; rc=$?
  summary+=("tests $v: rc=$rc $(grep -E ' passed| failed|no tests ran' "/tmp/vt/$v.txt" | tail -1)")
  [ $rc -ne 124 ] && [ $rc -ne 137 ] && ok+=("$v")
  { echo "===== $v rc=$rc"; cat "/tmp/vt/$v.txt"; } >> "$OUT/tests.txt"
done
wait  # the sanitizers
if [ -n "${SAN_VAR:-}" ]; then
  for tool in memcheck racecheck; do
    summary+=("$tool ($SAN_VAR): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tail -1);"\
" $(grep -E ' passed| failed' "$OUT/san-$tool.txt" | tail -1)")
  done
fi
only=$(IFS=,; echo "${ok[*]}")
timeout "${T_CHECK:-75}" python3 benchmarks/gdn_decode_check.py --out "$OUT" --variants --only "${only:-none}" --no-ref \
  --batches "${BATCHES:-1,32,256}" --rep "${REP:-40}" > "$OUT/check.txt" 2>&1
summary+=("gdn_decode_check: rc=$? (variants timed: ${only:-none})")
timeout 20 python3 benchmarks/probes/gdn_decode_cubins.py > "$OUT/cubins.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20
sed -n "/^tag /,\$p" "$OUT/check.txt"
printf '%s\n' "${summary[@]}"
