#!/usr/bin/env bash
# Issue 12's gdn_decode GPU session in one call (GPU host, repository root, carry .gpu-cutile and
# .gpu-fla):  source .gpu-cutile/env.sh && bash benchmarks/probes/gdn_decode_session.sh
# 1. at once: the decode GPU tests (tests/gdn/test_gdn_cutile_decode.py -m gpu, TESTS_N workers,
#    120 s a test, TESTS_K a -k selection) and the compiles of every timed config (8 processes);
#    with SAN=1 also compute-sanitizer memcheck and racecheck on the gpu_session.sh CUTILE_SAN
#    gdn-decode selection at the default config (SAN_K: more -k terms);
# 2. then alone: with NCU=1 one Nsight Compute profile of each NCU_CASES launch
#    (benchmarks/probes/gdn_decode_ncu.py), then benchmarks/gdn_decode_check.py: the default
#    beside the named config variants (VARIANTS=0 skips them), FLA beside, at BATCHES; then the
#    resources of the cubins the JIT built (benchmarks/probes/gdn_decode_cubins.py).
# Logs in $OUT; the table and a summary are printed last. T_TESTS / T_SAN / T_NCU / T_CHECK: timeouts.
set -u
OUT=$(cd "${OUT:-.}" && pwd)
summary=()
if ls .gpu-fla/*.whl >/dev/null 2>&1; then  # FLA (the peer), off the project's dependencies
  pip install -q --no-deps --no-index --target /tmp/fla .gpu-fla/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/fla:$PYTHONPATH
fi
V=--variants; [ "${VARIANTS:-1}" = 0 ] && V=
timeout "${T_TESTS:-100}" python3 -m pytest -v -rfE -p no:cacheprovider -m gpu -n "${TESTS_N:-6}" \
  --timeout 120 --timeout-method thread -k "${TESTS_K:-}" tests/gdn/test_gdn_cutile_decode.py > "$OUT/tests.txt" 2>&1 &
tests_pid=$!
timeout "${T_WARM:-100}" python3 benchmarks/gdn_decode_check.py --out /tmp/warm $V --warm "${WARM_N:-8}" --warm-only \
  > "$OUT/warm.txt" 2>&1 &
warm_pid=$!
if [ "${SAN:-0}" = 1 ]; then
  SEL=(tests/gdn/test_gdn_cutile_decode.py -m gpu -k "B5-N8 or B5-N9 or B1-N3 or B33-N33${SAN_K:+ or $SAN_K}")
  for tool in memcheck racecheck; do
    timeout "${T_SAN:-100}" compute-sanitizer --tool $tool --print-limit 50 python3 -m pytest -q \
      -p no:cacheprovider "${SEL[@]}" > "$OUT/san-$tool.txt" 2>&1 &
  done
fi
wait $tests_pid; rc_tests=$?
wait
summary+=("tests: rc=$rc_tests $(grep -E ' passed| failed' "$OUT/tests.txt" | tail -1)")
if [ "${SAN:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    summary+=("$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tail -1);"\
" $(grep -E ' passed| failed' "$OUT/san-$tool.txt" | tail -1)")
  done
fi
if [ "${NCU:-0}" = 1 ]; then
  # one profile per case: the third launch of each (the first two warm up)
  read -r -a cases <<< "${NCU_CASES:-256:fp32:{} 1:fp32:{}}"
  i=0
  for c in "${cases[@]}"; do
    timeout "${T_NCU:-40}" ncu --clock-control none --kernel-name regex:gdn_decode --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis python3 benchmarks/probes/gdn_decode_ncu.py "$c" > "$OUT/ncu-$i.txt" 2>&1
    summary+=("ncu $c: rc=$?"); i=$((i + 1))
  done
fi
timeout "${T_CHECK:-100}" python3 benchmarks/gdn_decode_check.py --out "$OUT" $V --no-ref \
  --batches "${BATCHES:-1,32,256}" --rep "${REP:-40}" > "$OUT/check.txt" 2>&1
summary+=("gdn_decode_check: rc=$?")
# what the JIT built on this host (threads, registers, shared memory, SASS mix per kernel)
timeout 30 python3 benchmarks/probes/gdn_decode_cubins.py > "$OUT/cubins.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20
tail -3 "$OUT/check.txt"; sed -n "/^tag /,\$p" "$OUT/check.txt"
printf '%s\n' "${summary[@]}"
