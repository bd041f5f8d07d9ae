#!/usr/bin/env bash
# Session 59's device calls (repo root):
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session59_gpu.sh A          (carry .gpu-cute)
# A: on an H200, session 58's A (= session 57's K2: issue 15's h_post_bda through the registry, issue 12's decode floor,
#    the GDN backward's reduction A/B). On any other card, the whole GPU suite at this tree instead, in three calls
#    on one warm machine: gpu_suite.sh B1 here, then its A (.gpu-cutile) and BC (.gpu-cute, cuTile on the path).
set -u
. "$(dirname "$0")/_steps.sh"
session_start
if grep -q H200 "$OUT/device.txt"; then
  exec bash "$(dirname "$0")/session58_gpu.sh" A
fi
echo "not an H200: the GPU suite's B1 (moe, gdn_cute)"
cat "$OUT/device.txt"
exec bash "$(dirname "$0")/gpu_suite.sh" B1
