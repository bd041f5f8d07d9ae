#!/usr/bin/env bash
# One GPU-host session for the cuTile mHC kernels (issue 3), in parts that each fit one
# device call (<= 10 min). From the repository root on the GPU host:
#   source .gpu-cutile/env.sh && bash benchmarks/mhc_gpu_session.sh tests,memcheck,bench
#   source .gpu-cutile/env.sh && bash benchmarks/mhc_gpu_session.sh check,host,peer
# Everything lands in $OUT (logs, JSON); a short summary is printed last.
set -u
OUT=${OUT:-.}
parts=",${1:-tests,memcheck,bench,check,peer},"
has() { [[ "$parts" == *",$1,"* ]]; }
summary=()
if has tests; then
  timeout 240 python3 -m pytest -q tests/test_mhc_cutile_gpu.py tests/test_mhc_cutile_registry.py \
    -n 8 --dist loadgroup -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
  summary+=("tests: $(grep -E 'passed|failed' "$OUT/gpu-tests.txt" | tail -1)")
fi
if has memcheck; then
  timeout 240 compute-sanitizer --tool memcheck python3 benchmarks/mhc_cutile_check.py --memcheck \
    > "$OUT/memcheck.txt" 2>&1
  summary+=("memcheck: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1)")
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
  timeout 120 python3 benchmarks/host_overhead.py --json "$OUT/host-overhead.json" > "$OUT/host-overhead.txt" 2>&1
  summary+=("host: rc=$?")
  cat "$OUT/host-overhead.txt"
fi
if has peer && [ -f benchmarks/peer_megatron_mhc.py ]; then
  timeout 420 python3 benchmarks/peer_megatron_mhc.py --out "$OUT" > "$OUT/peer.txt" 2>&1
  summary+=("peer: rc=$?")
  tail -12 "$OUT/peer.txt"
fi
printf '%s\n' "${summary[@]}"
