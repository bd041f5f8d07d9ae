#!/usr/bin/env bash
# gdn_decode's TMA-ring kernel (tilekernels/gdn/cute_decode_ring.py) on the GPU, one device call (cute bundle):
#   source .gpu-cute/env.sh; bash benchmarks/probes/gdn_ring_session.sh [tests|timing|all]
# tests: the ring's GPU tests, the register kernel's file (unchanged kernel, shared helpers), the registry decode tests
# with the ring switched on; racecheck / synccheck / memcheck on small ring cases. timing: graph-replayed rows of the
# register kernel, the ring (heuristic and variants) and the copy floor (benchmarks/gdn_decode_check.py).
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
PHASE=${1:-all}
PYT="python3 -m pytest -q -p no:cacheprovider -x"
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
K='ring_matches_float64 and ctas7'
if [ "$PHASE" != timing ]; then
  step ring_tests 200 $PYT tests/gdn/test_gdn_cute_decode_ring.py
  step reg_tests 150 $PYT tests/gdn/test_gdn_cute_decode.py
  TILEKERNELS_GDN_DECODE_RING=1 step ring_registry 150 $PYT tests/gdn/test_gdn_cute_decode.py -k "registry or graph or prefill"
  step ring_racecheck 150 $SAN --tool racecheck $PYT tests/gdn/test_gdn_cute_decode_ring.py -k "$K" &
  step ring_synccheck 150 $SAN --tool synccheck $PYT tests/gdn/test_gdn_cute_decode_ring.py -k "$K" &
  step ring_memcheck 150 $SAN --tool memcheck $PYT tests/gdn/test_gdn_cute_decode_ring.py -k "$K" &
  wait
fi
if [ "$PHASE" != tests ]; then
  mkdir -p "$OUT/t1" "$OUT/t2"
  step timing 240 python3 benchmarks/gdn_decode_check.py --out "$OUT/t1" --backends cute --ring --copy-floor --no-ref \
    --batches 1,8,32,64,256
  step timing_var 200 python3 benchmarks/gdn_decode_check.py --out "$OUT/t2" --backends cute --ring --ring-variants all \
    --no-ref --batches 32,256
  tail -25 "$OUT/timing.log"; tail -30 "$OUT/timing_var.log"
fi
cat "$SUM"
