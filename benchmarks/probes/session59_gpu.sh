#!/usr/bin/env bash
# Session 59's device calls (repo root), and what it leaves owed:
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session59_gpu.sh A          (carry .gpu-cute)
# A: on an H200, session 58's A (= session 57's K2: issue 15's h_post_bda through the registry, issue 12's decode floor,
#    the GDN backward's reduction A/B). On any other card, session 59 ran the whole GPU suite at ed1bd46 instead, in
#    three calls on one warm machine: gpu_suite.sh B1 here, then its A (.gpu-cutile) and BC (.gpu-cute, cuTile on the
#    path); now it runs O1.
# O1 (.gpu-cute): the GPU tests of the CuTe DSL kernels whose LayoutEnum import changed after that run (PTX
#    byte-identical, so a confirmation only), those that need no cuTile.
# O2 (.gpu-cute with cuTile on the path, after a .gpu-cutile call on the same machine): gpu_suite.sh's mhc_cute step at
#    -n 12 with tests/conftest.py's per-test release of cached GPU memory (dea1b5e; on an 80 GB card its headline
#    float64 test ran out of memory beside the other workers' caches), which also runs pre_rest's cuTile comparison.
set -u
. "$(dirname "$0")/_steps.sh"
session_start
MODE=${1:-A}
if [ "$MODE" = A ]; then
  grep -q H200 "$OUT/device.txt" && exec bash "$(dirname "$0")/session58_gpu.sh" A
  echo "not an H200: O1"; MODE=O1
fi
if [ "$MODE" = O1 ]; then
  step o1 300 $P -n 8 tests/mhc/test_mhc_cute_pre_rest.py tests/mhc/test_mhc_cute_post_pre.py \
    tests/mhc/test_mhc_cute_post_pre_res.py tests/mhc/test_mhc_cute_proj_rms.py
else
  exec bash "$(dirname "$0")/gpu_suite.sh" BC1
fi
cat "$OUT/device.txt" "$SUM"
