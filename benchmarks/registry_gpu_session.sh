#!/usr/bin/env bash
# GPU-host session for the registry hot path (issue 10), from the repo root with the cuTile bundle:
#   source .gpu-cutile/env.sh && bash benchmarks/registry_gpu_session.sh [tests,ab,overhead,bench]
# `ab` and `overhead` compare with an older checkout unpacked in .old/ (git archive <commit> registry
# specs tilekernels tools | tar x -C .old) when it exists. Logs and JSON land in $OUT.
set -u
OUT=${OUT:-.}
parts=",${1:-tests,ab,overhead,bench},"
has() { [[ "$parts" == *",$1,"* ]]; }
summary=()
if has tests; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider -n 8 tests/registry/test_registry_hot_path.py \
    tests/mhc/test_mhc_cutile_registry.py tests/mhc/test_mhc_cutile_gpu.py > "$OUT/gpu-tests.txt" 2>&1
  summary+=("tests: $(grep -E 'passed|failed' "$OUT/gpu-tests.txt" | tail -1)")
  grep -E "^FAILED|^ERROR" "$OUT/gpu-tests.txt" | head -20
fi
if has ab; then  # new and old interleaved twice, so the spread between repeats is visible
  for rep in 1 2; do
    for side in new old; do
      src=(); [ "$side" = old ] && { [ -d .old ] || continue; src=(--src .old); }
      timeout 150 python3 benchmarks/registry_ab.py "${src[@]}" --json "$OUT/ab-$side$rep.json" > /dev/null 2> "/tmp/ab-$side$rep.err" \
        || tail -5 "/tmp/ab-$side$rep.err"
    done
  done
  python3 - "$OUT" <<'PY'
import json, sys, os
o = sys.argv[1]
def load(n):
    p = f"{o}/ab-{n}.json"
    return {r["op"]: r for r in json.load(open(p))["rows"]} if os.path.exists(p) else {}
runs = {n: load(n) for n in ("new1", "old1", "new2", "old2")}
for op in runs["new1"]:
    f = lambda k: "/".join(f"{runs[n].get(op, {}).get(k, float('nan')):.4f}" for n in ("new1", "new2"))
    g = lambda k: "/".join(f"{runs[n].get(op, {}).get(k, float('nan')):.4f}" for n in ("old1", "old2"))
    print(f"{op:<22} fwd new {f('fwd_ms')} old {g('fwd_ms')}  f+b new {f('fwd_bwd_ms')} old {g('fwd_bwd_ms')}")
PY
fi
if has overhead; then
  for side in ${OVERHEAD_SIDES:-new old}; do
    src=(); [ "$side" = old ] && { [ -d .old ] || continue; src=(--src .old); }
    timeout 150 python3 benchmarks/host_overhead.py --device cuda "${src[@]}" --label "$side" --calls 100 --rounds 9 \
      --json "$OUT/overhead-$side.json" 2>&1 | tail -15
  done
fi
if has bench; then
  timeout 300 python3 -m tools.bench --family mhc > "$OUT/tk-bench-mhc.txt" 2>&1
  summary+=("tk-bench mhc: rc=$?")
  tail -14 "$OUT/tk-bench-mhc.txt"
fi
printf '%s\n' "${summary[@]}"
