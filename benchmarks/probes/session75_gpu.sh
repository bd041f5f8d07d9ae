#!/usr/bin/env bash
# Session 75's device calls (repo root; OUT exported), on one warm machine in this order:
#   G (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session75_gpu.sh G
#   then session65_gpu.sh H1 / H2 (carry .gpu-cute, H200 only) and R here (carry .gpu-cute, same exports as H1).
# G: cuTile unpacked for the later calls (its workspace file); compute-sanitizer's three tools on c1e3e23's cuTile
#    gdn_pre_gated backward with the fp32 dpre scratch (the one-rounding GPU cases, fwd+bwd); the fwd+bwd time of
#    the default (SD=False) against the old bf16 scratch (SD1), same process tree.
# R: the registry's and tools' GPU tests after 7da4d58 / 09dd17b, 0e40d21's CuTe DSL compile key (the host function
#    named) and the mHC registry file (CuTe DSL bundle, cuTile on PYTHONPATH).
set -u
D="$(dirname "$0")"
. "$D/_steps.sh"
case "${1:-}" in
G) session_start
   step cutile_ws 150 $P tests/test_cutile_workspace.py
   sanitize gdnbwd 260 tests/gdn/test_gdn_pre_gated.py -k "rounded_once_gpu and cutile"
   step sd_ab 200 python3 "$D/gdn_cutile_bwd_rounding.py" --variants default,SD1
   tail -6 "$OUT/sd_ab.log" ;;
R) session_start
   step reg 300 $P -n 14 --junitxml="$OUT/reg.xml" tests/registry tests/tools tests/test_cute_launch.py \
     tests/mhc/test_mhc_cutile_registry.py ;;
*) echo "usage: session75_gpu.sh G|R"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
