#!/usr/bin/env bash
# gdn_decode's TMA-ring kernel at the current heuristic: the ring's GPU tests, the register kernel's dispatch / registry /
# graph tests, the sanitizers on a bf16 case, then graph-replayed timings of both kernels beside the copy floor, with
# any extra gdn_decode_check.py arguments (variants, configs, batches). One device call (cute bundle), e.g. session 18:
#   source .gpu-cute/env.sh; bash benchmarks/probes/gdn_ring_check.sh --ring-variants bf16-s17,bf16-s4,bf16-s6
set -u
. "$(dirname "$0")/_steps.sh"
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
  --batches 4,8,32,64,128,256 "$@"
grep -E "^(cute|ring|copy)" "$OUT/timing.log" | tail -60
cat "$SUM"
