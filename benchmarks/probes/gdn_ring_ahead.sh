#!/usr/bin/env bash
# gdn_decode's TMA-ring kernel after AHEAD (no PF load stalls its thread) and HOIST (k, q' of a thread's rows once an
# item): the ring's GPU tests, sanitizers on a small case, graph-replayed timings of the default against the variants
# with either switched off, and Nsight Compute's stall reasons at B=256 fp32. One device call (cute bundle):
#   source .gpu-cute/env.sh; bash benchmarks/probes/gdn_ring_ahead.sh
set -u
OUT=${OUT:-.}
SUM="$OUT/summary.txt"
: >> "$SUM"
. "$(dirname "$0")/_steps.sh"
PYT="python3 -m pytest -q -p no:cacheprovider"
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
R=tests/gdn/test_gdn_cute_decode_ring.py
K='ring_matches_float64 and ctas7'
step ring_tests 240 $PYT $R
step ring_memcheck 150 $SAN --tool memcheck $PYT $R -k "$K" &
step ring_initcheck 150 $SAN --tool initcheck $PYT $R -k "$K" &
step ring_racecheck 150 $SAN --tool racecheck $PYT $R -k "$K" &
wait
mkdir -p "$OUT/t1"
step timing 300 python3 benchmarks/gdn_decode_check.py --out "$OUT/t1" --backends ring --ring --copy-floor --no-ref \
  --ring-variants noahead,nohoist --ring-cfg AHEAD=False,HOIST=False --batches 32,128,256
STALL='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
step ncu 150 ncu --clock-control none --kernel-name regex:ring_kernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --metrics "$STALL" \
  python3 benchmarks/probes/gdn_decode_ncu.py "256:fp32:ring"
tail -32 "$OUT/timing.log"
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|stalled" "$OUT/ncu.log" | awk '$NF+0 >= 0.2 || /Duration|DRAM|Cycles/' | head -40
cat "$SUM"
