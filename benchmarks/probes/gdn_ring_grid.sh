#!/usr/bin/env bash
# gdn_decode's TMA-ring kernel: its grid policies (cute_decode_ring.ring_grid: "full" min(items, SMs x CPS),
# "balanced" the fewest CTAs at the same rounds) timed beside the copy floor, their GPU tests, and Nsight Compute
# on B=256 fp32 under each; then the owed sanitizer checks (gdn_decode_sanitize.sh). One device call (cute bundle):
#   source .gpu-cute/env.sh; bash benchmarks/probes/gdn_ring_grid.sh
set -u
OUT=${OUT:-.}
SUM="$OUT/summary.txt"
: >> "$SUM"
. "$(dirname "$0")/_steps.sh"
PYT="python3 -m pytest -q -p no:cacheprovider"
step grid_tests 200 $PYT tests/gdn/test_gdn_cute_decode_ring.py -k "grid or registry or matches_register"
mkdir -p "$OUT/t1"
step timing 300 python3 benchmarks/gdn_decode_check.py --out "$OUT/t1" --backends ring --ring --copy-floor --no-ref \
  --ring-grid "full;balanced;balanced/STAGES=3" --batches 32,128,256
NCU="ncu --clock-control none --kernel-name regex:ring_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats"
step ncu_full 120 $NCU python3 benchmarks/probes/gdn_decode_ncu.py "256:fp32:ring=full"
step ncu_bal 120 $NCU python3 benchmarks/probes/gdn_decode_ncu.py "256:fp32:ring=balanced"
bash "$(dirname "$0")/gdn_decode_sanitize.sh"
tail -40 "$OUT/timing.log"
grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Issued Warp|Grid Size|Registers" \
  "$OUT/ncu_full.log" "$OUT/ncu_bal.log" | head -40
