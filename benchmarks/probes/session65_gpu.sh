#!/usr/bin/env bash
# Session 65's device calls (repo root; OUT exported), on one warm machine in this order:
#   A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session65_gpu.sh A
#   H1, H2 (H200 only), B, C (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session65_gpu.sh B ...
# What is owed at 8670b4d (session 64's review follow-ups and final read ran on the CPU only):
# A: cuTile unpacked (for the later calls' cuTile comparisons), its workspace file.
# B: gpu_suite.sh B: moe (test_swiglu_cute's dprobs on its terms' scale), gdn_cute, mhc_cute with the cute sinkhorn and
#    test_cute_launch (every CuTe DSL launch through _cute's pack with its _store fallback).
# C: the registry's GPU files (the quick path through CallGuards.lookup(quick=True), the Prepared call's run_fwd), then
#    the eager sinkhorn at this tree (host_profile.py --sinkhorn-ab --backends cute), three processes.
# V: after the validation fixes (storage-span overlap screen, eps >= 2**-126, iters <= 1024, the a2a perm's bounds,
#    conftest's process-group teardown): the registry's GPU files, gdn_decode's CuTe DSL files (the in-place overlap
#    recheck on every cached call), cp's cuTile pack (a world-size-1 NCCL group), the spec files.
# S: V's least part (gdn_decode's files, the spec files) for a small budget.
# VM (session 67; run in session 69): V, then the MoE files whose registry calls run the grouped ops' m_splits rules
#    on CUDA tensors (e662aa4's order min, max, sum, G*M; the device message's >= 255-character fallback). VR: VM
#    without dec (a small budget).
# H1 / H2 (H200 only): issue 15's rows: proj_rms with FUSE_RED against sep; mhc_post_pre against its two ops and the
#    sinkhorn A/B (session62_gpu.sh H's steps, split in two calls).
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
h200() { grep -q H200 "$OUT/device.txt" || { echo "$1: not an H200"; cat "$OUT/device.txt"; exit 4; }; }
case "${1:-}" in
A) session_start
   step cutile_ws 150 $P tests/test_cutile_workspace.py ;;
B) session_start
   bash "$D/gpu_suite.sh" B > /dev/null ;;
C) session_start
   step reg 250 $P -n 14 --junitxml="$OUT/reg.xml" tests/registry tests/test_big_gpu_lock.py
   for r in 1 2 3; do
     step sk$r 110 python3 "$D/host_profile.py" --sinkhorn-ab --T 32768 --rounds 3 --backends cute
   done
   for f in "$OUT"/sk?.log; do echo "== $f"; tail -13 "$f"; done ;;
V|S|VM|VR) session_start   # S: V without the registry files and cp's pack, for a small budget
   [ "$1" != S ] && step reg 250 $P -n 14 --junitxml="$OUT/reg.xml" tests/registry tests/test_big_gpu_lock.py
   [ "$1" != VR ] && step dec 150 $P -n 8 --junitxml="$OUT/dec.xml" tests/gdn/test_gdn_cute_decode.py tests/gdn/test_gdn_decode.py \
     $([ "$1" != S ] && echo tests/gdn/test_gdn_cute_decode_ring.py tests/cp/test_cp_cutile_pack.py)
   step spec 60 $PYT tests/gdn/test_gdn_spec.py tests/mhc/test_mhc_spec.py tests/cp/test_cp_perm.py
   [ "$1" = VM ] || [ "$1" = VR ] && step moe 200 $P -n 14 --junitxml="$OUT/moe.xml" tests/moe/test_moe_cute_registry.py \
     tests/moe/test_moe_grouped_linear.py tests/moe/test_moe_grouped_mlp.py tests/moe/test_moe_constraints.py \
     tests/moe/test_moe_frozen_weights.py ;;
H1) session_start; h200 H1
   step proj_rms 420 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --registry cute --registry-ab sep \
     --rounds 5 --ab sep
   tail -24 "$OUT/proj_rms.log" ;;
H2) session_start; h200 H2
   step post_pre 280 python3 benchmarks/probes/mhc_post_pre_variants.py \
     --rows h_post_bda,mhc_pre,cute,h_post_bda,mhc_pre,cute
   step sk_ab 250 python3 benchmarks/probes/host_profile.py --sinkhorn-ab --T 32768 --backends cute
   tail -12 "$OUT/post_pre.log"; tail -14 "$OUT/sk_ab.log" ;;
*) echo "usage: session65_gpu.sh A|B|C|V|VM|VR|S|H1|H2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
