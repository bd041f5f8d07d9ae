#!/usr/bin/env bash
# Session 47: name the registry drop-in GPU tests that failed in session 46's capped call (repo root):
#   A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session47_gpu.sh A
#   B (carry .gpu-cute):   source .gpu-cute/env.sh;   bash benchmarks/probes/session47_gpu.sh B
# Owed after session 47 (A ran at 82bf102: 4 GDN NaN failures, fixed on the CPU at 0746264 / 04731e6):
#   G1 (carry .gpu-cutile): the GDN NaN cases again, and the cuTile GDN files whole (their softplus changed)
#   G2 (carry .gpu-cutile): the GDN misaligned-input cases (a cuTile compile per misaligned input: minutes)
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
G1) step nan_gdn 200 $P $H -k "nan_reaches and gdn"
    step gdn_cutile_files 330 $P tests/gdn/test_gdn_cutile_decode.py tests/gdn/test_gdn_cutile_pre_gated.py \
      tests/gdn/test_gdn_cutile_pre_gated_bwd.py ;;
G2) step misaligned_gdn 540 $P $H -k "misaligned and gdn" ;;
*) echo "usage: $0 A|B|G1|G2"; exit 2 ;;
esac
cat "$SUM"
for f in "$OUT"/*.log; do grep -E "^ok |INSTAFAIL" "$f" | grep -c "^ok " | sed "s|^|$f ok: |"; done
grep -h -A25 "INSTAFAIL" "$OUT"/*.log | grep -vE "^\s*$" | head -150
