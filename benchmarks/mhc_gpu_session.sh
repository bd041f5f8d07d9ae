#!/usr/bin/env bash
# The GPU-host session: the cuTile mHC kernels and the registry's hot path, in parts that each
# fit one device call (<= 10 min). From the repository root on the GPU host:
#   source .gpu-cutile/env.sh && bash benchmarks/mhc_gpu_session.sh tests,memcheck,bench
#   source .gpu-cutile/env.sh && bash benchmarks/mhc_gpu_session.sh initcheck,racecheck
#   source .gpu-cutile/env.sh && bash benchmarks/mhc_gpu_session.sh check,host,ab,peer
# `host` and `ab` also time an older checkout unpacked in .old/ when it exists
# (git archive <commit> registry specs tilekernels tools | tar x -C .old): registry overhead
# per op (host_overhead.py) and tk-bench's mHC rows without peers, new and old interleaved twice.
# Everything lands in $OUT (logs, JSON); a short summary is printed last.
set -u
OUT=$(cd "${OUT:-.}" && pwd)  # absolute: the `ab` part runs the old checkout from .old/
parts=",${1:-tests,memcheck,initcheck,racecheck,bench,check,peer},"
has() { [[ "$parts" == *",$1,"* ]]; }
summary=()
if has tests; then
  timeout 330 python3 -m pytest -q tests/mhc/test_mhc_cutile_gpu.py tests/mhc/test_mhc_cutile_registry.py \
    tests/registry/test_registry_hot_path.py -n 8 -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
  summary+=("tests: $(grep -E 'passed|failed' "$OUT/gpu-tests.txt" | tail -1)")
fi
if has memcheck; then
  timeout 240 compute-sanitizer --tool memcheck python3 benchmarks/mhc_cutile_check.py --memcheck \
    > "$OUT/memcheck.txt" 2>&1
  summary+=("memcheck: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1)")
fi
# initcheck / racecheck: the five ops fwd+bwd at n=6 C=96 T=37 and n=3 C=100 T=5
# (tests/mhc/test_mhc_cutile_sanitize.py; ~2 min each on the H100; racecheck is slow, so small
# shapes only). The summary keeps each tool's own summary line and pytest's result.
# initcheck skips mhc_pr_reduce: its only input, the dweight partials, is written by TMA
# (bulk tensor) stores, which initcheck does not record as initialization (~4k false
# reports); the test file checks those partials instead (NaN-filled, then all written).
# racecheck: the write-write hazards of mhc_pr_bwd's replicated h_pre copy
# (same value from two threads; see cutile_proj_rms.py) are benign; the count of others is added.
if has initcheck; then
  timeout 240 compute-sanitizer --tool initcheck --kernel-name-exclude kns=mhc_pr_reduce --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/mhc/test_mhc_cutile_sanitize.py > "$OUT/initcheck.txt" 2>&1
  summary+=("initcheck: $(grep -m1 'ERROR SUMMARY' "$OUT/initcheck.txt"); \
$(grep -E ' passed| failed' "$OUT/initcheck.txt" | tail -1)")
fi
if has racecheck; then
  timeout 240 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 100000 --show-backtrace no \
    python3 -m pytest -q -p no:cacheprovider tests/mhc/test_mhc_cutile_sanitize.py > "$OUT/racecheck.txt" 2>&1
  ln=$(grep -n 'hpre = ct.reshape(ct.load(hpre_t' tilekernels/mhc/cutile_proj_rms.py | cut -d: -f1)
  other=$(awk -v at="cutile_proj_rms.py:$ln" '/ (Error|Warning): /{h++}
    / Thread .* at / && $NF != at {o[h]=1}
    /Current Value/{split($0, v, /[:,] */); if (v[2] != v[4]) o[h]=1}
    END{for (k in o) c++; print c+0}' "$OUT/racecheck.txt")
  summary+=("racecheck: $(grep -m1 'RACECHECK SUMMARY' "$OUT/racecheck.txt"), $other not the known benign one; \
$(grep -E ' passed| failed' "$OUT/racecheck.txt" | tail -1)")
fi
if has bench; then
  timeout 300 python3 -m tools.bench --family mhc --json "$OUT/tk-bench-mhc.json" > "$OUT/tk-bench-mhc.txt" 2>&1
  summary+=("tk-bench: rc=$?")
  tail -25 "$OUT/tk-bench-mhc.txt"
fi
if has check; then
  timeout 330 python3 benchmarks/mhc_cutile_check.py --out "$OUT" --phases env,compile --sweep-seconds 0 \
    > "$OUT/check.txt" 2>&1
  summary+=("check: rc=$?")
  tail -9 "$OUT/check.txt"
fi
if has host; then
  for side in new old; do
    src=(); [ "$side" = old ] && { [ -d .old ] || continue; src=(--src .old); }
    timeout 150 python3 benchmarks/host_overhead.py --device cuda "${src[@]}" --label "$side" \
      --json "$OUT/host-overhead-$side.json" > "$OUT/host-overhead-$side.txt" 2>&1
    summary+=("host $side: rc=$?")
    tail -15 "$OUT/host-overhead-$side.txt"
  done
fi
if has ab && [ -d .old ]; then
  for rep in 1 2; do
    timeout 200 python3 -m tools.bench --family mhc --no-compare --json "$OUT/ab-new$rep.json" > /dev/null 2>&1
    (cd .old && timeout 200 python3 -m tools.bench --family mhc --no-compare --json "$OUT/ab-old$rep.json" > /dev/null 2>&1)
  done
  summary+=("ab: $(ls "$OUT"/ab-*.json 2>/dev/null | wc -l) tk-bench runs (new1 old1 new2 old2)")
fi
if has peer && [ -f benchmarks/peer_megatron_mhc.py ]; then
  timeout 420 python3 benchmarks/peer_megatron_mhc.py --out "$OUT" > "$OUT/peer.txt" 2>&1
  summary+=("peer: rc=$?")
  tail -12 "$OUT/peer.txt"
fi
printf '%s\n' "${summary[@]}"
