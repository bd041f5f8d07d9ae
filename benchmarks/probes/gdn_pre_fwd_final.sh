#!/bin/bash
# Device host, from the repository root (carry .gpu-cutile and .gpu-fla):
#   source .gpu-cutile/env.sh && bash benchmarks/probes/gdn_pre_fwd_final.sh
# A: the forward variants of GDN_PRE_VARIANTS (the first: the current default), each compiled and run first
#    in timed child processes, then timed in all four cases (BSHD/THD x repeat_qk on/off) against the torch
#    reference; gdn_pre_fwd_choose.py writes the winner into this copy's defaults line.
# B: at that default, the forward GPU tests (pytest-xdist, a per-test limit: a hung kernel fails its test)
#    beside compute-sanitizer memcheck and racecheck on four small forward tests.
# C: the four cases through the registry at that default beside FLA + torch. Logs in $OUT, a summary last.
set -o pipefail
OUT=${OUT:-/tmp/gdn_pre_out}
LOGS=/tmp/gdn_pre_final_logs
mkdir -p "$OUT" "$LOGS/a" "$LOGS/c"
if ls .gpu-fla/*.whl >/dev/null 2>&1; then  # FLA (the peer), off the project's dependencies
  pip install -q --no-deps --no-index --target /tmp/fla .gpu-fla/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/fla:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/smi.txt" 2>&1
# (session 7 ran "{};{'MA': True, 'OCCH': 2};{'MA': True, 'OCCH': 2, 'SX': True}" and two plain-tap-load
# variants since dropped; A took ~95 s, the 73 tests did not finish in 88 s: give B ~150 s, timeout_s >= 300)
export GDN_PRE_VARIANTS=${GDN_PRE_VARIANTS:-"{'MA': False, 'OCCH': 0, 'SX': False};{'MA': True, 'OCCH': 2, 'SX': True}"}
timeout "${T_A:-100}" python3 benchmarks/gdn_pre_check.py --out "$LOGS/a" --sweep --sweep-all --warm-first \
  --warm-procs "${WARM_PROCS:-5}" --test-proc-s 85 --no-cases --no-eager --no-bwd --no-compile-peer 2>&1 | tee "$OUT/sweep.log"
python3 benchmarks/probes/gdn_pre_fwd_choose.py "$LOGS/a/gdn_pre_check.json" --write 2>&1 | tee -a "$OUT/sweep.log"
grep -h "^FWD_HB" tilekernels/gdn/cutile_pre_gated.py | tee -a "$OUT/sweep.log"
unset GDN_PRE_VARIANTS
TF=tests/gdn/test_gdn_cutile_pre_gated.py
SEL="test_fwd_matches and Hk2-Hv4 and (thd-mixed or bshd-3x5)"
for tool in memcheck racecheck; do
  timeout "${T_B:-150}" compute-sanitizer --tool $tool python3 -m pytest -q -p no:cacheprovider -m gpu -k "$SEL" $TF \
    > "$LOGS/$tool.log" 2>&1 &
done
timeout "${T_B:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu -n "${NPROC:-12}" --timeout=120 \
  --timeout-method=thread -rf $TF > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
wait
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$LOGS/memcheck.log" "$LOGS/racecheck.log" > "$OUT/sanitizers.txt"
timeout "${T_C:-60}" python3 benchmarks/gdn_pre_check.py --out "$LOGS/c" --no-eager --no-bwd --no-compile-peer \
  2>&1 | tee "$OUT/cases.log"
cp "$LOGS/a/gdn_pre_check.json" "$OUT/sweep.json" 2>/dev/null
cp "$LOGS/c/gdn_pre_check.json" "$OUT/cases.json" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
echo "== summary"
grep -A8 "side by side" "$OUT/sweep.log" | head -8
grep "^choose: current" "$OUT/sweep.log"
tail -3 "$OUT/tests.log"
cat "$OUT/sanitizers.txt"
grep -E "^(bshd|thd)-" "$OUT/cases.log" | head -12
