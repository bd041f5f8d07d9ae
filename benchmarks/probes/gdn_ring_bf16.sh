#!/usr/bin/env bash
# gdn_decode's TMA-ring kernel at session 18's bf16 heuristic (128-column tiles, one CTA of 256 consumers): the ring's
# GPU tests, the register kernel's dispatch / registry / graph tests, sanitizers on a bf16 case, graph-replayed timings
# of both kernels and the bf16 variants (stages, session 17's layout) beside the copy floor. One device call (cute
# bundle):   source .gpu-cute/env.sh; bash benchmarks/probes/gdn_ring_bf16.sh
set -u
OUT=${OUT:-.}
SUM="$OUT/summary.txt"
: >> "$SUM"
. "$(dirname "$0")/_steps.sh"
PYT="python3 -m pytest -q -p no:cacheprovider"
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
R=tests/gdn/test_gdn_cute_decode_ring.py
K='ring_matches_float64 and ctas7'   # B=33, bf16 state, padded rows, 7 CTAs
step ring_tests 240 $PYT $R
step dispatch 150 $PYT tests/gdn/test_gdn_cute_decode.py -k "registry or dispatch or graph or prefill"
step ring_memcheck 150 $SAN --tool memcheck $PYT $R -k "$K" &
step ring_initcheck 150 $SAN --tool initcheck $PYT $R -k "$K" &
step ring_racecheck 150 $SAN --tool racecheck $PYT $R -k "$K" &
wait
mkdir -p "$OUT/t1"
step timing 330 python3 benchmarks/gdn_decode_check.py --out "$OUT/t1" --backends cute --ring --copy-floor --no-ref \
  --ring-variants bf16-s17,bf16-s4,bf16-s6 --batches 4,8,32,64,128,256
grep -E "^(cute|ring|copy)" "$OUT/timing.log" | tail -60
cat "$SUM"
