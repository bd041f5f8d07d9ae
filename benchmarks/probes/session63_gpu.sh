#!/usr/bin/env bash
# Session 63's device calls (repo root; OUT exported), on one warm machine in this order:
#   A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session63_gpu.sh A
#   B, C, then H or M (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session63_gpu.sh B ...
# The tree's change: the registry's guard pattern keeps the generated op's Prepared call (tilekernels/_opgen.py), which
# every eager call of seen metadata now takes, so the whole GPU suite runs at this tree (gpu_suite.sh, split so no call
# overruns: A = its A; B = B1 + the mhc_cute step (with the cute sinkhorn and launch files); C = reg_pp + gdn_cutile,
# which holds the registry's drop-in checks with the cute sinkhorn default and test_opgen's GPU cases).
# A also times the wrapper's host layers with no-op kernels (opgen_host.py: the registry with and without the
# Prepared call). M (any card): the eager sinkhorn A/B (host_profile.py --sinkhorn-ab: cute, cutile, the default and
# the default's general path, beside torch's floor). N (CuTe DSL alone): the GPU files that run the Prepared call,
# then the A/B with the cute backend only (not run: no machine came). H (H200 only): issue 15's rows at this tree (session62_gpu.sh H).
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
case "${1:-}" in
A) session_start
   step opgen 150 python3 "$D/opgen_host.py" --device cuda --rounds 5 --calls 1000
   bash "$D/gpu_suite.sh" A > /dev/null
   tail -12 "$OUT/opgen.log" ;;
B) session_start
   bash "$D/gpu_suite.sh" B > /dev/null ;;
C) session_start
   bash "$D/gpu_suite.sh" C > /dev/null ;;
M) session_start
   step sk_ab 300 python3 "$D/host_profile.py" --sinkhorn-ab --T 32768 --rounds ${ROUNDS:-3}
   tail -16 "$OUT/sk_ab.log" ;;
N) session_start  # (carry .gpu-cute alone, no cuTile: a lease's first call) the GPU files that run the Prepared
   # call (fwd, bwd, no_grad, frozen weights), then the sinkhorn A/B with the cute backend only
   step prep_tests 150 $P -n 8 tests/registry/test_opgen.py tests/moe/test_moe_frozen_weights.py \
     tests/mhc/test_mhc_cute_sinkhorn.py
   step sk_ab 120 python3 "$D/host_profile.py" --sinkhorn-ab --T 32768 --rounds ${ROUNDS:-5} --backends cute
   tail -12 "$OUT/sk_ab.log" ;;
H) bash "$D/session62_gpu.sh" H; exit $? ;;
*) echo "usage: session63_gpu.sh A|B|C|M|N|H"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
