#!/usr/bin/env bash
# Session 55's device calls on one warm machine (repo root). What session 54 owed after its workspace fix (b1130bf,
# tilekernels._glue.may_keep: a scratch buffer made in a private pool is handed out, not cached):
#   F1 (carry .gpu-cutile): source .gpu-cutile/env.sh && export OUT && bash benchmarks/probes/session55_gpu.sh F1
#   F2 (carry .gpu-cute, after F1 on the same machine so cuTile is unpacked under /tmp/tk-cutile):
#       source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#         PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session55_gpu.sh F2
# F1: memcheck and initcheck on the two cuTile backwards that take workspace() buffers (mHC Sinkhorn's, inside the
#     five-op sanitizer test; gdn_pre_gated's, its THD and BSHD Qwen cases) and on the workspace tests (the
#     private-pool path included). The kernels did not change; the buffers' life did.
# F2: with both toolchains in the process: the registry files, mhc_post_pre's op file and the big lock whole
#     (session 54's E4 failed 1 there, the reduce-overhead case the fix is for) and tests/cp whole (_ranks).
# H1, H2: session54_gpu.sh's (an H200 only).
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
session_start
G="tests/gdn/test_gdn_cutile_pre_gated_bwd.py -m gpu -k"
GK="test_bwd_matches_float64_reference and Hk16 and rep- and (thd-mixed or bshd-3x5)"
case "${1:-}" in
F1) for tool in memcheck initcheck; do
      step sk_$tool 240 $SAN --tool $tool $PYT tests/mhc/test_mhc_cutile_sanitize.py -k five_ops &
      step gdn_bwd_$tool 240 $SAN --tool $tool $PYT $G "$GK" &
      step ws_$tool 240 $SAN --tool $tool $PYT -m gpu tests/test_cutile_workspace.py &
    done; wait ;;
F2) step reg_pp 330 $PYT -m gpu -rfE -n 14 tests/registry tests/mhc/test_mhc_post_pre.py tests/test_big_gpu_lock.py
    step cp 200 $PYT -m gpu -rfE -n 14 tests/cp ;;
H1|H2) bash "$(dirname "$0")/session54_gpu.sh" "$1"; exit ;;
*) echo "usage: session55_gpu.sh F1|F2|H1|H2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
