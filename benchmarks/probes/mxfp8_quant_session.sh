#!/usr/bin/env bash
# One GPU call for the MXFP8 quantize kernels (cute_quantize, cute_quantize_pipe), from the
# repository root on the device host: `source .gpu-cute/env.sh && bash benchmarks/probes/mxfp8_quant_session.sh`.
# Phase 1 (correctness, in parallel, each in a child under `timeout`): the GPU tests of
# tests/moe/test_mxfp8_cute.py (xdist, a per-test thread timeout) and the compute-sanitizer tools
# named in SAN on small cases; meanwhile the timing scripts compile their launches (CPU). Phase 2:
# the timing, once phase 1 is done. Logs under $OUT, a short table last. Knobs (seconds; 0 = skip):
#   TESTS   the GPU tests (default 100; TESTK: a -k selection; NPROC: xdist workers, default 4)
#   SAN     seconds for each sanitizer (default 0); SANTOOLS: tools (default "memcheck"); SANK: the -k
#   QBENCH  moe_cute_check.py (default 150); SWEEP 1: also its pipelined-kernel sweep (default 0)
#   PROBE   benchmarks/probes/mxfp8_quant_persist.py (default 0; PROBEOLD: --old-module file)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
: "${TESTS:=100}" "${QBENCH:=150}" "${SWEEP:=0}" "${SAN:=0}" "${SANTOOLS:=memcheck}" "${PROBE:=0}"
SANK_DEFAULT="test_quantize_bit_exact and (33x160 or 96x160) and not columnwise"
ENV=$(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>&1)
rm -f "$OUT/.phase1_done"
(
  pids=()
  if [ "$TESTS" != 0 ]; then
    ( timeout "$TESTS" python3 -m pytest -p no:cacheprovider -m gpu -n "${NPROC:-4}" --timeout=120 --timeout-method=thread -v \
        tests/moe/test_mxfp8_cute.py ${TESTK:+-k "$TESTK"} > "$OUT/t_mxfp8.log" 2>&1; echo "rc=$?" >> "$OUT/t_mxfp8.log" ) &
    pids+=($!)
  fi
  if [ "$SAN" != 0 ]; then
    # host API errors are not reported (the DSL's cuda-python bindings probe cuGetProcAddress);
    # initcheck: the outputs are poisoned by torch first, the kernels here store without TMA
    for tool in $SANTOOLS; do
      ( timeout "$SAN" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 \
          python3 -m pytest -q -p no:cacheprovider -m gpu tests/moe/test_mxfp8_cute.py -k "${SANK:-$SANK_DEFAULT}" \
          > "$OUT/san_$tool.log" 2>&1; echo "rc=$?" >> "$OUT/san_$tool.log" ) &
      pids+=($!)
    done
  fi
  for p in "${pids[@]}"; do wait "$p"; done
  touch "$OUT/.phase1_done"
) &
WAITMAX=$(( TESTS > SAN ? TESTS : SAN ))
if [ "$PROBE" != 0 ]; then
  timeout "$PROBE" python3 benchmarks/probes/mxfp8_quant_persist.py ${PROBEOLD:+--old-module "$PROBEOLD"} \
    --wait-for "$OUT/.phase1_done" --wait-max "$WAITMAX" --json "$OUT/persist.json" > "$OUT/b_persist.log" 2>&1
  echo "rc=$?" >> "$OUT/b_persist.log"
fi
if [ "$QBENCH" != 0 ]; then
  extra=""; [ "$SWEEP" = 1 ] && extra="--sweep --sweep-axes rowwise,both --sweep-kinds pipe"
  timeout "$QBENCH" python3 benchmarks/moe_cute_check.py --no-compile $extra --wait-for "$OUT/.phase1_done" \
    --wait-max "$WAITMAX" --json "$OUT/quant.json" > "$OUT/b_quant.log" 2>&1; echo "rc=$?" >> "$OUT/b_quant.log"
fi
wait
echo "==== summary"; echo "$ENV"
[ -f "$OUT/t_mxfp8.log" ] && echo "t_mxfp8: $(grep -E '(passed|failed|error)' "$OUT/t_mxfp8.log" | tail -1) $(tail -1 "$OUT/t_mxfp8.log")" \
  && grep -E "^(FAILED|ERROR)" "$OUT/t_mxfp8.log" | head -10
for f in "$OUT"/san_*.log; do
  [ -f "$f" ] && echo "$(basename "$f"): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$f" | tail -3 | tr '\n' ' ') $(tail -1 "$f")"
done
[ -f "$OUT/b_persist.log" ] && grep -E "precompiled|waited|clone|  (rowwise|both) |MISMATCH|failed|rc=" "$OUT/b_persist.log" | cut -c1-140
[ -f "$OUT/b_quant.log" ] && grep -E "precompiled|waited|clone| cute | old default|pipe |MISMATCH|failed|rc=" "$OUT/b_quant.log" | cut -c1-120
exit 0
