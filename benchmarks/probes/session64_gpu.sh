#!/usr/bin/env bash
# Session 64's device calls (repo root; OUT exported), on one warm machine in this order:
#   A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session64_gpu.sh A
#   B, C, then H (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session64_gpu.sh B ...
# The tree's changes (host code only, no kernel): _cute.Launch.run writes a launch's arguments with one
# struct.pack_into (every CuTe DSL launch); the Prepared call's backward runs its bwd kernel itself; the registry's
# quick path hands a seen call to its pattern's Prepared call (registry/core.py, guards.py).
# BASE: the library at the session's start (tilekernels/, registry/, specs/ of 4d3900b) as an untracked tarball,
# benchmarks/probes/_base_src.tar.xz (git archive 4d3900b tilekernels registry specs | xz), unpacked to /tmp/base.
# A: opgen_host.py --device cuda (the wrapper's host layers, no-op kernels) base / this tree / base / this tree.
# B: gpu_suite.sh B (moe, gdn_cute, mhc_cute with the cute sinkhorn and launch files: every CuTe DSL launch).
# C: gpu_suite.sh's reg_pp step (the registry's GPU files: test_opgen's Prepared cases, the drop-in checks), then the
#    eager sinkhorn A/B (host_profile.py --sinkhorn-ab) base / this tree / base / this tree, one process each.
# H (H200 only): issue 15's rows at this tree (session62_gpu.sh H: proj_rms FUSE_RED vs sep, mhc_post_pre vs apart,
#    the sinkhorn A/B).
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
base() { [ -d /tmp/base/registry ] || { mkdir -p /tmp/base && tar -xJf "$D/_base_src.tar.xz" -C /tmp/base; }; }
case "${1:-}" in
A) session_start; base
   for r in 1 2; do
     step opgen_base$r 100 python3 "$D/opgen_host.py" --device cuda --rounds 5 --calls 1000 --src /tmp/base
     step opgen_new$r 100 python3 "$D/opgen_host.py" --device cuda --rounds 5 --calls 1000
   done
   for f in "$OUT"/opgen_*.log; do echo "== $f"; grep -E "floor|hand|registry  |no_grad: registry  " "$f"; done ;;
B) session_start
   bash "$D/gpu_suite.sh" B > /dev/null ;;
C) session_start; base
   step reg_pp 260 $P -n 14 --junitxml="$OUT/reg_pp.xml" tests/registry tests/mhc/test_mhc_post_pre.py \
     tests/test_big_gpu_lock.py
   for r in 1 2; do
     step sk_base$r 150 python3 "$D/host_profile.py" --sinkhorn-ab --T 32768 --rounds 3 --src /tmp/base
     step sk_new$r 150 python3 "$D/host_profile.py" --sinkhorn-ab --T 32768 --rounds 3
   done
   for f in "$OUT"/sk_*.log; do echo "== $f"; tail -13 "$f"; done ;;
H) bash "$D/session62_gpu.sh" H; exit $? ;;
*) echo "usage: session64_gpu.sh A|B|C|H"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
