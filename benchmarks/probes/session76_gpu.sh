#!/usr/bin/env bash
# Session 76's device calls (repo root; OUT exported), on one warm machine:
#   G (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session76_gpu.sh G
#   R (carry .gpu-cute): source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#     PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session76_gpu.sh R
#   R after G has cuTile beside CuTe DSL (G unpacks it); R alone runs the CuTe DSL and torch cases (cuTile's skip).
#   Then, on an H200 only, session65_gpu.sh H1 / H2 (issue 15's rows) with R's exports.
# G: cuTile unpacked for the later calls (its workspace test); the interleaved A/B that session 75 owed: the cuTile GDN
#    backward's fp32 dpre scratch (default) against the old bf16 one (SD1), twice each, alternating.
#    Session 77: also the GDN gate's wide-range softplus check on the cuTile backend (sp_cutile; R1: sp_cute).
# R: the registry's and tools' GPU tests, 0e40d21's CuTe DSL compile key (never run on a GPU), the mHC cuTile registry
#    file and the MoE cute registry file (its grouped MLP now also checked for one rounding, as on the CPU).
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
case "${1:-}" in
G) session_start
   step cutile_ws 150 $P tests/test_cutile_workspace.py
   step sp_cutile 90 $P tests/gdn/test_gdn_pre_gated.py -k "softplus and cutile"
   step sd_ab 300 python3 "$D/gdn_cutile_bwd_rounding.py" --variants default,SD1,default,SD1
   tail -6 "$OUT/sd_ab.log" ;;
R) session_start
   step reg 280 $P -n 14 --junitxml="$OUT/reg.xml" tests/registry tests/tools tests/test_cute_launch.py \
     tests/mhc/test_mhc_cutile_registry.py tests/moe/test_moe_cute_registry.py ;;
R1) session_start   # R's most-owed part in less device time: the CuTe DSL compile key, the MoE cute registry file
   step reg1 200 $P -n 14 --junitxml="$OUT/reg1.xml" tests/test_cute_launch.py tests/moe/test_moe_cute_registry.py
   step sp_cute 90 $P tests/gdn/test_gdn_pre_gated.py -k "softplus and cute and not cutile" ;;
*) echo "usage: session76_gpu.sh G|R|R1"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
