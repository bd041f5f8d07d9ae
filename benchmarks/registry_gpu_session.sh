#!/usr/bin/env bash
# GPU-host session for the registry hot path (issue 10), from the repo root with the cuTile bundle:
#   source .gpu-cutile/env.sh && bash benchmarks/registry_gpu_session.sh [tests,ab,overhead]
# `ab` and `overhead` compare with an older checkout unpacked in .old/ (git archive <commit> registry
# specs tilekernels tools | tar x -C .old) when it exists. Logs and JSON land in $OUT.
set -u
OUT=${OUT:-.}
parts=",${1:-tests,ab,overhead},"
has() { [[ "$parts" == *",$1,"* ]]; }
summary=()
if has tests; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider -n 8 tests/registry/test_registry_hot_path.py \
    tests/mhc/test_mhc_cutile_registry.py tests/mhc/test_mhc_cutile_gpu.py > "$OUT/gpu-tests.txt" 2>&1
  summary+=("tests: $(grep -E 'passed|failed' "$OUT/gpu-tests.txt" | tail -1)")
  grep -E "^FAILED|^ERROR" "$OUT/gpu-tests.txt" | head -20
fi
if has ab; then
  for side in new old; do
    src=(); [ "$side" = old ] && { [ -d .old ] || continue; src=(--src .old); }
    timeout 150 python3 benchmarks/registry_ab.py "${src[@]}" --json "$OUT/ab-$side.json" > "$OUT/ab-$side.txt" 2>&1
    summary+=("ab $side: rc=$?")
  done
  python3 - "$OUT" <<'PY'
import json, sys, os
o = sys.argv[1]
rows = {s: {r["op"]: r for r in json.load(open(f"{o}/ab-{s}.json"))["rows"]} for s in ("new", "old") if os.path.exists(f"{o}/ab-{s}.json")}
for op, r in rows.get("new", {}).items():
    old = rows.get("old", {}).get(op, {})
    print(f"{op:<24} fwd {r['fwd_ms']:.4f} (old {old.get('fwd_ms', float('nan')):.4f})  f+b {r['fwd_bwd_ms']:.4f} (old {old.get('fwd_bwd_ms', float('nan')):.4f})")
PY
fi
if has overhead; then
  for side in new old; do
    src=(); [ "$side" = old ] && { [ -d .old ] || continue; src=(--src .old); }
    timeout 150 python3 benchmarks/host_overhead.py --device cuda "${src[@]}" --label "$side" --calls 100 --rounds 9 \
      --json "$OUT/overhead-$side.json" > "$OUT/overhead-$side.txt" 2>&1
    summary+=("overhead $side: rc=$?")
    tail -16 "$OUT/overhead-$side.txt"
  done
fi
printf '%s\n' "${summary[@]}"
