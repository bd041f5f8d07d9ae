#!/usr/bin/env bash
# The whole GPU test suite at one tree in three device calls (session 43's run; h200-gpu-tests.txt). From the repository
# root, on one warm machine:
#   call A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/gpu_suite.sh A   # cuTile files
#   calls B, C (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/gpu_suite.sh B (then C)
# mhc_post_pre's CuTe DSL files (test_mhc_cute_post_pre*.py) are owed_gpu_checks.sh's (its `tests` phase). Session 43's
# times: A 187 + (cp 56, gdn_cutile 71 with warm caches; together cold they overran 270 s), B 156 + 73 + 70, C 166 s;
# C's gdn_cutile compiles cold here (session 35: 230 s cut), hence its 300 s.
# B1 / BC split the same steps otherwise: B1 = B's moe and gdn_cute steps (they need no cuTile, so they can run in a call
# made before the cuTile bundle was unpacked); BC = B's mhc_cute step, then C (its call as C's); BC1 = that step alone.
# Session 59's times on an H100: B1 119 + 54, A 125 + 61, BC 51 + 213 + 155 s.
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
P="python3 -m pytest -q -p no:cacheprovider -m gpu -rfE"
mhc_cute_step() {  # B's third step; BC runs it with C (cuTile on the path: its cuTile comparisons run)
  step mhc_cute 200 $P -n 12 --junitxml="$OUT/mhc_cute.xml" tests/mhc/test_mhc_cute_aggregate.py \
     tests/mhc/test_mhc_cute_post_bda.py tests/mhc/test_mhc_cute_pp_mix.py tests/mhc/test_mhc_cute_pre_rest.py \
     tests/mhc/test_mhc_cute_sk_bwd.py tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_proj_rms_fwd.py \
     tests/mhc/test_mhc_cute_pre.py tests/mhc/test_mhc_big_cases.py tests/mhc/test_mhc_cute_sinkhorn.py \
     tests/test_cute_launch.py
}
case "${1:-}" in
A) step mhc_cutile 300 $P -n 8 --junitxml="$OUT/mhc_cutile.xml" tests/mhc/test_mhc_cutile_gpu.py \
     tests/mhc/test_mhc_cutile_registry.py tests/mhc/test_mhc_cutile_sanitize.py tests/test_cutile_workspace.py
   step cp_cutile 120 $P -n 14 --junitxml="$OUT/cp_cutile.xml" tests/cp/test_cp_cutile_pack.py ;;
B|B1) step moe 250 $P -n 14 --junitxml="$OUT/moe.xml" tests/moe
   step gdn_cute 120 $P -n 14 --junitxml="$OUT/gdn_cute.xml" tests/gdn/test_gdn_cute_pre_gated.py \
     tests/gdn/test_gdn_cute_pre_gated_bwd.py tests/gdn/test_gdn_cute_decode.py tests/gdn/test_gdn_cute_decode_ring.py
   [ "$1" = B1 ] || mhc_cute_step ;;
BC1) mhc_cute_step ;;   # B's mhc_cute step alone (cuTile on the path)
C|BC) [ "$1" = BC ] && mhc_cute_step
   step reg_pp 240 $P -n 14 --junitxml="$OUT/reg_pp.xml" tests/registry tests/mhc/test_mhc_post_pre.py \
     tests/test_big_gpu_lock.py
   step gdn_cutile 300 $P -n 14 --junitxml="$OUT/gdn_cutile.xml" tests/gdn/test_gdn_cutile_pre_gated.py \
     tests/gdn/test_gdn_cutile_pre_gated_bwd.py tests/gdn/test_gdn_cutile_decode.py ;;
*) echo "usage: gpu_suite.sh A|B|C|B1|BC|BC1"; exit 2 ;;
esac
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$SUM"
cat "$SUM"
