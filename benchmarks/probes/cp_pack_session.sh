#!/usr/bin/env bash
# Issue 13 GPU session (one H200 run, ~3.5 min): the CP pack/unpack timing table (default vs
# the previous default vs torch's index path, cp 8/4/2; SWEEP=1 adds the SWEEP variants,
# FIRST=1 the first design), then the tests of tests/cp under xdist (N workers, verbose,
# faulthandler after FH s, MARK=gpu: the GPU tests only; PROBE=1 adds
# benchmarks/probes/cp_world1_fixture_probe.py, the world-1 NCCL test as the module fixture in
# the worker it was; HANGPROBE=1 runs that probe alone under -n 2, timed out at HANG_S), the
# world-1 NCCL child alone (WORLD1=1), and with SAN=1 compute-sanitizer memcheck / racecheck /
# initcheck over the CUTILE_SAN selection of benchmarks/gpu_session.sh plus the variant test's
# SAN_VARIANT (default-qwen: the defaults and the previous defaults at Qwen3-Next cp 8), all
# beside the pool. Logs under $OUT; the table is printed again last.
#   source .gpu-cutile/env.sh && bash benchmarks/probes/cp_pack_session.sh
set -u
OUT=${OUT:-/tmp/cp_pack_session}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/benchmarks:$PYTHONPATH"
timeout ${BENCH_S:-100} python3 benchmarks/cp_pack_check.py --cps ${CPS:-8,4,2} ${SWEEP:+--sweep} ${FIRST:+--first} \
  > "$OUT/cp_pack_check.log" 2>&1; echo "bench rc=$?"
SAN_SEL='cu_dtype0 and (cp8-3-5 or cp2-16-8-1-float16 or cp4-32)'
if [ "${SAN:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck initcheck; do
    timeout ${SAN_S:-150} compute-sanitizer --tool $tool --print-limit 50 python3 -m pytest -q -x -p no:cacheprovider \
      tests/cp/test_cp_cutile_pack.py -m gpu -k "$SAN_SEL or variants and ${SAN_VARIANT:-default-qwen}" \
      > "$OUT/san-$tool.txt" 2>&1 &
  done
fi
if [ "${HANGPROBE:-0}" = 1 ]; then  # the old module-fixture NCCL world alone under xdist: does its teardown stall?
  (timeout ${HANG_S:-75} python3 -m pytest -v -n 2 -m gpu -p no:cacheprovider benchmarks/probes/cp_world1_fixture_probe.py \
     > "$OUT/hangprobe.log" 2>&1; echo "hang probe rc=$? (124: stalled) $(grep -cE 'PASSED' "$OUT/hangprobe.log") passed") &
fi
if [ "${WORLD1:-0}" = 1 ]; then  # beside the pytest pool
  (timeout 90 python3 tests/cp/test_cp_cutile_pack.py --world1 1 > "$OUT/world1-child.log" 2>&1
   echo "world1 child rc=$? $(tail -2 "$OUT/world1-child.log" | tr '\n' ' ')") &
fi
timeout "${TEST_S:-100}" python3 -m pytest -v -n ${N:-4} -o faulthandler_timeout=${FH:-60} -p no:cacheprovider \
  tests/cp ${PROBE:+benchmarks/probes/cp_world1_fixture_probe.py} ${MARK:+-m $MARK} > "$OUT/pytest-cp.log" 2>&1
echo "pytest rc=$?"; grep -E "Timeout|File \"|Thread 0x|passed|failed|error" "$OUT/pytest-cp.log" | grep -v PASSED | tail -40
wait
for tool in memcheck racecheck initcheck; do
  [ -f "$OUT/san-$tool.txt" ] && echo "san-$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.txt" | tail -1);" \
    "$(grep -E ' passed| failed' "$OUT/san-$tool.txt" | tail -1)"
done
sed -n '/^NVIDIA/,$p' "$OUT/cp_pack_check.log" | tail -90
