#!/bin/bash
# Device host, from the repository root (carry .gpu-cutile and .gpu-fla):
#   source .gpu-cutile/env.sh && bash benchmarks/probes/gdn_pre_fwd_session.sh [sweep|final]
# sweep: the forward GPU tests, the compiles of the sweep and the hang probe at once (the probe's
#   hung children are killed 8 s after their launch), then the launch-config sweep of the forward
#   in all four cases (BSHD/THD x repeat_qk on/off) beside FLA + torch; a side-by-side table last.
# final: the sweep in all four cases, its winner written into this copy's defaults line
#   (gdn_pre_fwd_choose.py), then the forward GPU tests with compute-sanitizer memcheck and racecheck
#   on three forward tests, then the four cases (ours at that default, FLA + torch).
set -o pipefail
MODE=${1:-sweep}
OUT=${OUT:-/tmp/gdn_pre_out}
LOGS=/tmp/gdn_pre_logs  # every log here, one archive of them in $OUT at the end ($OUT returns 8 files at most)
LIMIT=${LIMIT:-182}      # seconds from the start to the end of the python parts (the device call's limit minus the archive)
mkdir -p "$OUT" "$LOGS"
if ls .gpu-fla/*.whl >/dev/null 2>&1; then  # FLA (the peer), off the project's dependencies
  pip install -q --no-deps --no-index --target /tmp/fla .gpu-fla/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/fla:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$LOGS/smi.txt" 2>&1
HANG=(
  "{'FT': 16, 'HB': 4, 'HBV': 4, 'HBZ': 8, 'OCC': 2, 'ST': True}"
  "{'FT': 16, 'HB': 4, 'OCC': 2, 'ST': True}"
  "{'FT': 16, 'HBV': 4, 'OCC': 2, 'ST': True}"
  "{'FT': 16, 'HBZ': 8, 'OCC': 2, 'ST': True}"
  "{'FT': 16, 'HB': 4, 'HBV': 4, 'HBZ': 8, 'OCC': 2, 'ST': True, 'LT': False}"
  "{'FT': 16, 'HB': 4, 'HBV': 4, 'HBZ': 8, 'OCC': 0, 'ST': True}"
  "{'FT': 16, 'HB': 2, 'HBV': 2, 'HBZ': 8, 'OCC': 4, 'ST': True}"
)
TESTS=(--test-k "not bwd and not autograd" --no-compile-peer --no-eager --no-bwd)
if [ "$MODE" = sweep ]; then
  timeout "$LIMIT" python3 benchmarks/gdn_pre_check.py --out "$LOGS" --tests 6 --per-test-s 100 --test-proc-s 110 \
    --sweep --sweep-all --warm-procs 5 "${TESTS[@]}" --hang "${HANG[@]}" 2>&1 | tee "$OUT/check.log"
  rc=$?
else
  # A: the sweep (compiled first in 10 processes), four cases, no tests; then its winner becomes the
  # default in this copy of the tree (gdn_pre_fwd_choose.py); B: the GPU tests, memcheck and racecheck
  # and the four cases (ours at that default, FLA + torch) against it.
  mkdir -p "$LOGS/a" "$LOGS/b"
  timeout "${LIMIT_A:-85}" python3 benchmarks/gdn_pre_check.py --out "$LOGS/a" --sweep --sweep-all --warm-first \
    --warm-procs 10 --test-proc-s 60 --no-cases "${TESTS[@]}" 2>&1 | tee "$OUT/check_a.log"
  python3 benchmarks/probes/gdn_pre_fwd_choose.py "$LOGS/a/gdn_pre_check.json" --write 2>&1 | tee -a "$OUT/check_a.log"
  left=$((LIMIT - SECONDS))
  timeout "$left" python3 benchmarks/gdn_pre_check.py --out "$LOGS/b" --tests 8 --per-test-s 80 --test-proc-s 90 \
    --memcheck "${TESTS[@]}" 2>&1 | tee "$OUT/check.log"
  rc=$?
  cp "$LOGS/a/gdn_pre_check.json" "$OUT/sweep.json" 2>/dev/null
  cp "$LOGS/b/gdn_pre_check.json" "$OUT/" 2>/dev/null
  grep -h "^FWD_HB" tilekernels/gdn/cutile_pre_gated.py
fi
cp "$LOGS/gdn_pre_check.json" "$LOGS/gdn_pre_fwd_hang.json" "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$LOGS" . && echo "rc=$rc; logs: $(ls "$LOGS" | tr '\n' ' ')"
