#!/usr/bin/env bash
# Session 47: name the registry drop-in GPU tests that failed in session 46's capped call (repo root):
#   A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session47_gpu.sh A
#   B (carry .gpu-cute):   source .gpu-cute/env.sh;   bash benchmarks/probes/session47_gpu.sh B
# Each failure's report is printed the moment it arrives (benchmarks/probes/instafail.py), so a step its cap
# cuts off still names what failed and why; the misaligned-input tests (a kernel compile per misaligned
# input where a toolchain specializes on alignment) get a step of their own.
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
: > "$SUM"
export PYTHONPATH="$(dirname "$0"):${PYTHONPATH:-}"
P="$PYT -p instafail -m gpu -rfE -n 8 --durations=8"
H=tests/registry/test_registry_hot_path.py
case "${1:-}" in
A|B) step dropin_$1 230 $P $H -k "nan_reaches or autocast or fake_tensor"
     step misaligned_$1 270 $P $H -k "misaligned" ;;
*) echo "usage: $0 A|B"; exit 2 ;;
esac
cat "$SUM"
for f in "$OUT"/*.log; do grep -E "^ok |INSTAFAIL" "$f" | grep -c "^ok " | sed "s|^|$f ok: |"; done
grep -h -A25 "INSTAFAIL" "$OUT"/*.log | grep -vE "^\s*$" | head -150
