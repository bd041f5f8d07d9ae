# Sourced by the device-call scripts here: step NAME SECONDS CMD... runs CMD under a timeout with its output in
# $OUT/NAME.log and appends, in one write (the sanitizers' steps run at once), its exit code, seconds, the failed
# tests' ids (a log may not come back, session 69: pytest -rfE's FAILED / ERROR lines, 10 and 2 at most, or, in a
# step its timeout ended before pytest's summary, the instafail plugin's lines) and the log's summary lines (sanitizer
# summaries, pytest's result) to $SUM ($OUT/summary.txt). PYT and SAN: the pytest and compute-sanitizer command lines the scripts use.
OUT=${OUT:-.}
SUM="$OUT/summary.txt"
: >> "$SUM"
PYT="python3 -m pytest -q -p no:cacheprovider"
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
step() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local log="$OUT/$name.log"
  { echo "== $name rc=$rc $((SECONDS - t0)) s"
    if grep -qE "^(FAILED|ERROR) " "$log"; then
      grep -E "^FAILED " "$log" | cut -c1-200 | head -10
      grep -E "^ERROR " "$log" | cut -c1-200 | head -2
    else
      grep -E "^===== INSTAFAIL " "$log" | cut -c1-200 | head -12
    fi
    grep -vE "^(FAILED|ERROR) " "$log" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|error" | tail -4
  } > "$OUT/$name.sum"
  cat "$OUT/$name.sum" >> "$SUM"
  rm -f "$OUT/$name.sum"
}
# session_start: what a session's device-call script (sessionNN_gpu.sh) does first: an empty $SUM, this folder on
# PYTHONPATH (the instafail plugin), P = the GPU pytest line, the device's name, clock and power limit in device.txt.
session_start() {
  : > "$SUM"
  export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd):${PYTHONPATH:-}"
  P="$PYT -p instafail -m gpu -rfE"
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader > "$OUT/device.txt"
}
# sanitize NAME SECONDS PYTEST-ARGS...: the three compute-sanitizer tools (memcheck, initcheck, racecheck) on one GPU
# pytest selection at once, each a step named <tool>_NAME.
sanitize() {
  local name=$1 secs=$2; shift 2
  for tool in memcheck initcheck racecheck; do
    step ${tool}_$name $secs $SAN --tool $tool $PYT -m gpu "$@" &
  done
  wait
}
