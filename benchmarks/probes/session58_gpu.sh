#!/usr/bin/env bash
# Session 58's device calls (repo root):
#   source .gpu-cute/env.sh; export OUT; bash benchmarks/probes/session58_gpu.sh [A|A2|X]     (carry .gpu-cute)
#   source .gpu-cutile/env.sh; export OUT; bash benchmarks/probes/session58_gpu.sh C          (carry .gpu-cutile)
# A: on an H200, session 57's K2 (issue 15's h_post_bda through the registry with fp32 / bf16 h and the RG 8 chain
#    A/B; the GDN backward's reduction A/B; issue 12's decode floor at B=32 / 256). On any other card it runs X.
# A2: A's pb_registry and floor steps alone (a short lease); on any other card it runs X.
# X: the GPU tests that compare with the "exact" kind, now bitwise (-0 against +0 differs, NaN never passes;
#    tilekernels.testing.exact_mismatches), that the CuTe DSL bundle and torch can run.
# C: the same for the cuTile files.
set -u
. "$(dirname "$0")/_steps.sh"
session_start
MODE=${1:-A}
case "$MODE" in A|A2) grep -q H200 "$OUT/device.txt" || { echo "$MODE: not an H200, running X"; MODE=X; } ;; esac
if [ "$MODE" = A ]; then
  exec bash "$(dirname "$0")/session57_gpu.sh" K2
elif [ "$MODE" = A2 ]; then  # A's two target timings alone (issue 15's h_post_bda, issue 12's B=32), ~5 min
  step pb_registry 160 python3 benchmarks/probes/mhc_cute_post_bda_time.py --registry-only --out "$OUT" \
    --h-order fp32,bf16,fp32,bf16,fp32,bf16
  step floor 150 python3 benchmarks/probes/gdn_inplace_floor.py --b 32,256 --rounds 3
  grep -E "registry fwd\+bwd" "$OUT/pb_registry.log"; tail -12 "$OUT/floor.log"
elif [ "$MODE" = X ]; then
  step ex_moe 170 $P -n 14 tests/moe/test_swiglu_cute.py tests/moe/test_moe_cute_glue_emulated.py \
    tests/moe/test_grouped_gemm_bf16.py tests/moe/test_moe_grouped_linear.py tests/moe/test_moe_mxfp8.py \
    tests/moe/test_moe_frozen_weights.py tests/moe/test_moe_cute_registry.py
  step ex_gdn_mhc_cp 150 $P -n 14 tests/gdn/test_gdn_pre_gated.py tests/gdn/test_gdn_cute_decode.py \
    tests/gdn/test_gdn_cute_pre_gated.py tests/gdn/test_gdn_cute_decode_ring.py tests/gdn/test_gdn_decode.py \
    tests/mhc/test_mhc_cute_post_bda.py tests/mhc/test_mhc_h_aggregate.py tests/mhc/test_mhc_cute_proj_rms_fwd.py \
    tests/mhc/test_mhc_cute_aggregate.py tests/cp/test_cp_a2a.py tests/cp/test_cp_perm.py
  step ex_registry 200 $P -n 14 tests/registry/test_default_device.py tests/registry/test_registry_hot_path.py \
    tests/registry/test_opgen.py tests/registry/test_flop_counts.py tests/registry/test_func_transforms.py \
    tests/registry/test_training_stack.py
else
  step ex_cutile 400 $P -n 8 tests/mhc/test_mhc_cutile_gpu.py tests/gdn/test_gdn_cutile_pre_gated.py \
    tests/gdn/test_gdn_cutile_decode.py tests/cp/test_cp_cutile_pack.py
fi
cat "$OUT/device.txt" "$SUM"
