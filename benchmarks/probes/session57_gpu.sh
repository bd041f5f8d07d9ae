#!/usr/bin/env bash
# Session 57's last device call (repo root, carries .gpu-cute):
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session57_gpu.sh [K1|K2]
# K1: gdn_pre_gated's CuTe DSL backward with its new reduction default (RG 32, RV 4, RU 8, timed on an H100 earlier in
#     the session): the GPU tests of its file (the variants' configs aside, run before at these settings), then the
#     timing probe with the first default (RG8-RV1-RU4) beside it; then session 56's J1 (issue 15's h_post_bda
#     through the registry with fp32 and bf16 h, and the RG 8 chain A/B), which counts for the target on an H200 only.
# K2 (H200 only; elsewhere it stops at once): K1's timings without the tests, and issue 12's decode floor at B=32.
set -u
. "$(dirname "$0")/_steps.sh"
session_start
if [ "${1:-K1}" = K2 ]; then
  grep -q H200 "$OUT/device.txt" || { echo "K2: not an H200"; cat "$OUT/device.txt"; exit 3; }
  step pb_registry 160 python3 benchmarks/probes/mhc_cute_post_bda_time.py --registry-only --out "$OUT" \
    --h-order fp32,bf16,fp32,bf16,fp32,bf16
  step pb_chain 160 python3 benchmarks/probes/mhc_cute_post_bda_time.py --chain-ab rg8 --rounds 5 --out "$OUT"
  step red_time 90 python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT" --variants RG8-RV1-RU4 \
    --cases bshd-rep,thd-rep
  step floor 150 python3 benchmarks/probes/gdn_inplace_floor.py --b 32,256 --rounds 3
  grep -E "registry fwd\+bwd" "$OUT/pb_registry.log"; grep -E "rounds" "$OUT/pb_chain.log"
  grep -E "default|RG8|reduction" "$OUT/red_time.log" | tail -8; tail -12 "$OUT/floor.log"
  cat "$OUT/device.txt" "$SUM"; exit 0
fi
step gdn_bwd_tests 150 $P -n 8 tests/gdn/test_gdn_cute_pre_gated_bwd.py -k "not launch_config_variants"
step red_time 90 python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT" --variants RG8-RV1-RU4 --cases bshd-rep,thd-rep
step pb_registry 160 python3 benchmarks/probes/mhc_cute_post_bda_time.py --registry-only --out "$OUT" \
  --h-order fp32,bf16,fp32,bf16,fp32,bf16
step pb_chain 160 python3 benchmarks/probes/mhc_cute_post_bda_time.py --chain-ab rg8 --rounds 5 --out "$OUT"
grep -E "default|RG8|reduction" "$OUT/red_time.log" | tail -8
grep -E "registry fwd\+bwd" "$OUT/pb_registry.log"; grep -E "rounds" "$OUT/pb_chain.log"
cat "$OUT/device.txt" "$SUM"
