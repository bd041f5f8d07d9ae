#!/usr/bin/env bash
# gdn_decode's two CuTe DSL kernels under compute-sanitizer (memcheck, initcheck, racecheck on the ring; memcheck and
# initcheck on the register kernel) plus the registry / dispatch / graph GPU tests, one device call (cute bundle):
#   source .gpu-cute/env.sh; bash benchmarks/probes/gdn_decode_sanitize.sh
set -u
. "$(dirname "$0")/_steps.sh"
R='tests/gdn/test_gdn_cute_decode_ring.py'
G='tests/gdn/test_gdn_cute_decode.py'
step ring_memcheck 150 $SAN --tool memcheck $PYT $R -k "ring_matches_float64 and ctas7" &
step ring_initcheck 150 $SAN --tool initcheck $PYT $R -k "ring_matches_float64 and ctas7" &
step ring_racecheck 150 $SAN --tool racecheck $PYT $R -k "ring_matches_float64 and ctas7" &
step reg_memcheck 150 $SAN --tool memcheck $PYT $G -k "regimes and B5-N7" &
step reg_initcheck 150 $SAN --tool initcheck $PYT $G -k "regimes and B5-N7" &
step dispatch 150 $PYT $R $G -k "registry or dispatch or graph" &
wait
cat "$SUM"
