#!/usr/bin/env bash
# Session 46's GPU checks when a device came back late in the session (repo root, one warm machine):
#   A (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session46_gpu.sh A
#      the registry's drop-in GPU tests with only cuTile present (auto picks the cuTile kernels for mHC / GDN; MoE
#      falls back to torch), incl. the NaN test over cuTile's changed proj_rms / post_pre backwards; the mHC cuTile
#      GPU file's proj_rms / pre / post_pre cases.
#   B (carry .gpu-cute, cuTile from A on the path: see frozen_weights_checks.sh's header): ... session46_gpu.sh B
#      the same drop-in tests with both toolchains (auto picks the CuTe DSL kernels), the compile tests, and the
#      mHC CuTe DSL proj_rms / post_pre files whole (their backward kernels' RMS select changed).
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
: > "$SUM"
P="$PYT -m gpu -rfE -n 8"
H=tests/registry/test_registry_hot_path.py
case "${1:-}" in
A) step dropin_cutile 300 $P $H -k "nan_reaches or autocast or misaligned or fake_tensor"
   step mhc_cutile 200 $P tests/mhc/test_mhc_cutile_gpu.py -k "proj_rms or pre or post_pre" ;;
B) step dropin_cute 240 $P $H -k "nan_reaches or autocast or misaligned or fake_tensor"
   step compile 200 $P $H -k "keeps_batch or reduce_overhead"
   step mhc_cute_rms 140 $P tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_post_pre.py \
     tests/mhc/test_mhc_proj_rms.py tests/mhc/test_mhc_post_pre.py ;;
*) echo "usage: $0 A|B"; exit 2 ;;
esac
cat "$SUM"
