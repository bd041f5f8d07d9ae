#!/usr/bin/env bash
# Session 68's device calls (repo root; OUT exported), at the tree of branch wip/rms-zero-row-guard (the mHC GPU
# backwards' zero-row test rms <= eps * reference.ZERO_ROW). Each call stands alone; on one warm machine, in this order:
#   Z1 (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session68_gpu.sh Z1
#   Z2 (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session68_gpu.sh Z2
# Both first run zero_rows on the backends the process can run (Z1: cuTile; Z2: CuTe DSL, and cuTile where Z1 unpacked
# it): tests/mhc/test_mhc_zero_rows_gpu.py with main's four kernel files (untracked copies in
# benchmarks/probes/_zr_main/, swapped in on the device: expected to fail where a zero row's dx is NaN), then with the
# branch's (expected to pass), then the three sanitizers on one eps per test. Then the GPU files of the ops whose
# backwards changed (proj_rms, mhc_pre, mhc_post_pre): Z1 the cuTile mHC files (gpu_suite.sh A's mhc_cutile step),
# Z2 the CuTe DSL and registry ones.
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
ZF="cute_post_pre_bwd.py cute_proj_rms.py cutile_post_pre_bwd.py cutile_proj_rms.py"
zero_rows() {
  mkdir -p /tmp/zr_branch
  for f in $ZF; do cp tilekernels/mhc/$f /tmp/zr_branch/; cp "$D/_zr_main/$f" tilekernels/mhc/$f; done
  step zr_main 200 $P -n 6 tests/mhc/test_mhc_zero_rows_gpu.py
  for f in $ZF; do cp /tmp/zr_branch/$f tilekernels/mhc/$f; done
  step zr 200 $P -n 6 tests/mhc/test_mhc_zero_rows_gpu.py
  sanitize zr 240 tests/mhc/test_mhc_zero_rows_gpu.py -k "e-24"
}
case "${1:-}" in
Z1) session_start
   zero_rows
   step mhc_cutile 300 $P -n 8 --junitxml="$OUT/mhc_cutile.xml" tests/mhc/test_mhc_cutile_gpu.py \
     tests/mhc/test_mhc_cutile_registry.py tests/mhc/test_mhc_cutile_sanitize.py tests/test_cutile_workspace.py ;;
Z2) session_start
   zero_rows
   step mhc_cute 360 $P -n 12 --junitxml="$OUT/mhc_cute.xml" tests/mhc/test_mhc_cute_proj_rms.py \
     tests/mhc/test_mhc_cute_pre.py tests/mhc/test_mhc_cute_pre_rest.py tests/mhc/test_mhc_big_cases.py \
     tests/mhc/test_mhc_cute_post_pre.py tests/mhc/test_mhc_cute_post_pre_res.py tests/mhc/test_mhc_post_pre.py \
     tests/mhc/test_mhc_proj_rms.py tests/mhc/test_mhc_pre.py ;;
*) echo "usage: session68_gpu.sh Z1|Z2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
