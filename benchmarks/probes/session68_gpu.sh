#!/usr/bin/env bash
# Session 68's device calls (repo root; OUT exported). Each call stands alone; on one warm machine, in this order:
#   Z1 / G1 (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session68_gpu.sh Z1
#   Z2 / G2 (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session68_gpu.sh Z2
# Each first runs a fix's new GPU test with main's kernel files (untracked copies in benchmarks/probes/_main/, made
# before the call from the branch's checkout with `git show main:<path>`, swapped in on the device: expected to fail),
# then with the branch's (expected to pass), then the three sanitizers on part of it; then the GPU files of what changed.
# Z1 / Z2 (session 68, branch wip/rms-zero-row-guard, merged as f4c9abe): the mHC GPU backwards' zero-row test
#   rms <= eps * reference.ZERO_ROW. Z1 on the cuTile backends and the cuTile mHC files (gpu_suite.sh A's mhc_cutile
#   step); Z2 on the CuTe DSL ones (and cuTile where Z1 unpacked it) and the CuTe DSL / registry files of proj_rms,
#   mhc_pre, mhc_post_pre. _main/: tilekernels/mhc/{cute,cutile}_{proj_rms,post_pre_bwd}.py.
# G1 / G2 (branch wip/gdn-fp32-edges, session 68; run in session 69, merged as 389d318): G1 (cuTile) the softplus as
#   log1p(e^x) (gdn_pre_gated's g at a + dt_bias << 0) and gdn_decode's FUSE k.q order (zero heads at eps 2**-126), then
#   the cuTile GDN files; _main/: tilekernels/gdn/cutile_pre_gated.py, cutile_decode.py. G2 (CuTe DSL) the pre_gated
#   backward's l2norm term without s^3 (zero heads at a tiny eps), then the CuTe DSL pre_gated files and
#   test_gdn_pre_gated.py (the registry op); _main/: tilekernels/gdn/cute_pre_gated_bwd.py. The test runs' sanitizer
#   selections: 2-4 tests each.
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
# swap_check DIR "FILES" "TESTS" K [SANITIZE-K]: the pytest selection TESTS -k K with _main's FILES over DIR's (expected
# to fail), then DIR's own (expected to pass), then the three sanitizers on TESTS -k SANITIZE-K (K "": every test)
swap_check() {
  local dir=$1 files=$2 t=$3 k=$4 sk=${5:-}
  mkdir -p /tmp/swap_branch
  for f in $files; do cp "$dir/$f" /tmp/swap_branch/; cp "$D/_main/$f" "$dir/$f"; done
  step swap_main 200 $P -n 6 $t -k "$k"
  for f in $files; do cp "/tmp/swap_branch/$f" "$dir/$f"; done
  step swap 200 $P -n 6 $t -k "$k"
  [ -n "$sk" ] && sanitize swap 240 $t -k "$sk"
}
ZT=tests/mhc/test_mhc_zero_rows_gpu.py
ZF="cute_post_pre_bwd.py cute_proj_rms.py cutile_post_pre_bwd.py cutile_proj_rms.py"
case "${1:-}" in
Z1) session_start
   swap_check tilekernels/mhc "$ZF" $ZT "" e-24
   step mhc_cutile 300 $P -n 8 --junitxml="$OUT/mhc_cutile.xml" tests/mhc/test_mhc_cutile_gpu.py \
     tests/mhc/test_mhc_cutile_registry.py tests/mhc/test_mhc_cutile_sanitize.py tests/test_cutile_workspace.py ;;
Z2) session_start
   swap_check tilekernels/mhc "$ZF" $ZT "" e-24
   step mhc_cute 360 $P -n 12 --junitxml="$OUT/mhc_cute.xml" tests/mhc/test_mhc_cute_proj_rms.py \
     tests/mhc/test_mhc_cute_pre.py tests/mhc/test_mhc_cute_pre_rest.py tests/mhc/test_mhc_big_cases.py \
     tests/mhc/test_mhc_cute_post_pre.py tests/mhc/test_mhc_cute_post_pre_res.py tests/mhc/test_mhc_post_pre.py \
     tests/mhc/test_mhc_proj_rms.py tests/mhc/test_mhc_pre.py ;;
G1) session_start
   swap_check tilekernels/gdn "cutile_pre_gated.py cutile_decode.py" \
     "tests/gdn/test_gdn_cutile_pre_gated.py tests/gdn/test_gdn_cutile_decode.py" \
     "very_negative_gate or zero_heads_at_tiny" \
     "(very_negative_gate and thd) or (zero_heads_at_tiny and fp32state)"
   step gdn_cutile 300 $P -n 14 --junitxml="$OUT/gdn_cutile.xml" tests/gdn/test_gdn_cutile_pre_gated.py \
     tests/gdn/test_gdn_cutile_pre_gated_bwd.py tests/gdn/test_gdn_cutile_decode.py ;;
G2) session_start
   swap_check tilekernels/gdn cute_pre_gated_bwd.py tests/gdn/test_gdn_cute_pre_gated_bwd.py zero_heads \
     "zero_heads and bf16 and thd"
   step gdn_cute 200 $P -n 12 --junitxml="$OUT/gdn_cute.xml" tests/gdn/test_gdn_cute_pre_gated_bwd.py \
     tests/gdn/test_gdn_cute_pre_gated.py tests/gdn/test_gdn_pre_gated.py ;;
*) echo "usage: session68_gpu.sh Z1|Z2|G1|G2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
