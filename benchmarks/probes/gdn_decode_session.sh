#!/usr/bin/env bash
# Issue 12's gdn_decode GPU session in one call (GPU host, repository root, carry .gpu-cutile and
# .gpu-fla):  source .gpu-cutile/env.sh && bash benchmarks/probes/gdn_decode_session.sh
# 1. at once: the decode GPU tests (tests/gdn/test_gdn_cutile_decode.py -m gpu, 10 workers, 80 s a
#    test) and, with SAN=1, compute-sanitizer memcheck and racecheck on three decode tests at the
#    default config (Qwen3-Next fp32 B=1: split path and counters; bf16 B=33: gdn_decode_whole;
#    a small padded fp32 case);
# 2. then alone: benchmarks/gdn_decode_check.py, default vs the previous kernels (v2, v1) vs the
#    named config variants (VARIANTS=0 skips them), FLA beside; compiles first in 8 processes.
# Logs in $OUT; the table and a summary are printed last. T_TESTS / T_SAN / T_CHECK: timeouts.
set -u
OUT=$(cd "${OUT:-.}" && pwd)
summary=()
if ls .gpu-fla/*.whl >/dev/null 2>&1; then  # FLA (the peer), off the project's dependencies
  pip install -q --no-deps --no-index --target /tmp/fla .gpu-fla/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/fla:$PYTHONPATH
fi
timeout "${T_TESTS:-95}" python3 -m pytest -q -rfE -p no:cacheprovider -m gpu -n 10 --timeout 80 \
  tests/gdn/test_gdn_cutile_decode.py > "$OUT/tests.txt" 2>&1 &
tests_pid=$!
if [ "${SAN:-0}" = 1 ]; then
  SEL=(tests/gdn/test_gdn_cutile_decode.py -m gpu -k "B1-N4 or B33-N33 or B5-N8")
  for tool in memcheck racecheck; do
    timeout "${T_SAN:-95}" compute-sanitizer --tool $tool --print-limit 50 python3 -m pytest -q \
      -p no:cacheprovider "${SEL[@]}" > "$OUT/san-$tool.txt" 2>&1 &
  done
  wait $tests_pid; rc_tests=$?
  wait
  for tool in memcheck racecheck; do
    summary+=("$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tail -1);"\
" $(grep -E ' passed| failed' "$OUT/san-$tool.txt" | tail -1)")
  done
else
  wait $tests_pid; rc_tests=$?
fi
summary=("tests: rc=$rc_tests $(grep -E ' passed| failed' "$OUT/tests.txt" | tail -1)" "${summary[@]}")
V=--variants; [ "${VARIANTS:-1}" = 0 ] && V=
timeout "${T_CHECK:-100}" python3 benchmarks/gdn_decode_check.py --out "$OUT" --ab $V --warm 8 --no-ref \
  --rep "${REP:-40}" > "$OUT/check.txt" 2>&1
summary+=("gdn_decode_check: rc=$?")
sed -n '/^tag /,$p' "$OUT/check.txt"
printf '%s\n' "${summary[@]}"
