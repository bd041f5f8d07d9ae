# Sourced by the device-call scripts here: step NAME SECONDS CMD... runs CMD under a timeout with its output in
# $OUT/NAME.log and appends its exit code, seconds, the failed tests' ids (pytest -rfE's lines, at most 12: a log
# may not come back, session 69) and the log's summary lines (sanitizer summaries, pytest's result) to $SUM
# ($OUT/summary.txt). PYT and SAN: the pytest and compute-sanitizer command lines the scripts use.
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
  { echo "== $name rc=$rc $((SECONDS - t0)) s"
    grep -E "^(FAILED|ERROR) " "$OUT/$name.log" | cut -c1-200 | head -12
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|error" "$OUT/$name.log" | tail -4; } >> "$SUM"
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
