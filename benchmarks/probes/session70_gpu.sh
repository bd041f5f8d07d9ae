#!/usr/bin/env bash
# Session 70's device call (repo root; OUT exported), carry .gpu-cutile (any GPU):
#   source .gpu-cutile/env.sh; bash benchmarks/probes/session70_gpu.sh P
# P: thd_cp_a2a_perm's total_tokens form captured in a CUDA graph (tests/cp/test_cp_perm.py's new test), first with
#    main's perm.py (an untracked copy in benchmarks/probes/_main/perm.py, made with `git show`: its feature maps are
#    a pageable host-to-device copy; expected to fail in the sections case), then with this tree's (expected to pass),
#    then test_cp_perm.py whole (its CPU and GPU tests); tests/test_capture_host_reads.py (the torch backends' host
#    reads of m_splits / cu_seqlens: refused in a real capture, no sync eager under sync-debug "error"; its CP plans
#    test was dropped with that change after the review).
# Q: cp's cuTile pack file (its feature maps from perm.feature_perm) on the GPU.
# Issue 15's H200 rows stay session65_gpu.sh H1 / H2 (after this call, on the same warm machine).
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
case "${1:-}" in
P) session_start
   cp tilekernels/cp/perm.py /tmp/perm_tree.py; cp "$D/_main/perm.py" tilekernels/cp/perm.py
   step cap_main 120 $P -rA tests/cp/test_cp_perm.py -k captured
   cp /tmp/perm_tree.py tilekernels/cp/perm.py
   step cap 120 $P -rA tests/cp/test_cp_perm.py -k captured
   step cp_perm 120 $PYT -rfE tests/cp/test_cp_perm.py
   step host_reads 120 $PYT -rfE tests/test_capture_host_reads.py ;;
Q) session_start
   step cp_pack 200 $P -n 8 tests/cp/test_cp_cutile_pack.py ;;
*) echo "usage: session70_gpu.sh P|Q"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
