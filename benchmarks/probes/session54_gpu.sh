#!/usr/bin/env bash
# Session 54's device calls on one warm machine (repo root). What session 53 owed: its review refactored the cuTile
# decode tests (one reference check, _check_step) and the CuTe DSL decode file reuses them; neither had run on a GPU.
#   E1 (carry .gpu-cutile): source .gpu-cutile/env.sh && export OUT && bash benchmarks/probes/session54_gpu.sh E1
#   E2 (carry .gpu-cute, after E1 on the same machine so cuTile is unpacked under /tmp/tk-cutile):
#       source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#         PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session54_gpu.sh E2
# E1: tests/gdn/test_gdn_cutile_decode.py whole (the refactored reference check and the misaligned-input test).
# E2: tests/gdn/test_gdn_cute_decode.py whole (it runs the cuTile file's tests on the CuTe DSL kernels).
# Ran in session 54 (H100): 58 and 48 passed; record: the session 54 block of ../results/h200-gpu-tests.txt.
# E3 (carry .gpu-cute; alone): issue 15's h_post_bda with fp32 h is ~13 us over bf16 h on the H200 with the same DRAM
#     bytes and fewer instructions (session 36's Nsight); the kernels run at the 700 W cap there. Hypothesis: bf16 h's
#     operands (16 zero low mantissa bits) switch less in the FMAs, so the clock drops less. Test: fp32 h holding
#     bf16 values ("fp32bf": fp32's code and bytes, bf16's bits), registry fwd+bwd and the kernels alone,
#     interleaved with fp32 and bf16 h; then power_probe.py's bwd kernel with both fp32 h kinds (power, SM clock).
#     Ran on an H100 (uncapped there): fp32bf costs what fp32 costs (mHC ledger, session 54).
# E4 (carry .gpu-cute after E1 on the same machine, as E2): the files whose last whole GPU run was session 43's
#     (since then: opgen's dispatch-mode path, misaligned copies, pre-quantized MoE weights through auto):
#     gpu_suite.sh's reg_pp (tests/registry, mhc/test_mhc_post_pre.py, test_big_gpu_lock.py) and tests/moe whole.
#     Ran: moe 968 passed; reg_pp 386 passed, 1 failed: test_compile_reduce_overhead_gpu[mhc_sinkhorn] (the cuTile
#     backward's cached workspace allocated in Inductor's CUDA-graph pool during the warm-up, see E5).
# E5 (carry .gpu-cutile): the fix (tilekernels._glue.may_keep: a workspace or table made in a private pool is not
#     cached): the workspace tests, test_compile_reduce_overhead_gpu for every op on the cuTile kernels (before,
#     E4 ran it with CuTe DSL's kernels beside, and session 52 with CuTe DSL's alone), the CP pack file (_ranks).
#     Ran: 2, 16 and 51 passed (H100).
# H1, H2 (an H200 only; not run in session 54, none came): issue 12's and 15's targets re-timed at HEAD (their last
#     H200 numbers are sessions 41 / 39-42, before session 46 changed the RMS selects of three mHC backwards) and E3's
#     question there, where the kernels run at the 700 W cap. H1 (carry .gpu-cute after E1 unpacked cuTile): E3, then
#     mhc_post_pre against h_post_bda + mhc_pre (mhc_post_pre_variants.py, two passes), proj_rms through the
#     registry. H2 (carry .gpu-cute): gdn_decode's ring beside the copy and the in-place floor (gdn_inplace_floor.py).
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
session_start
case "${1:-}" in
E1) step cutile_decode_file 400 $P -n 6 tests/gdn/test_gdn_cutile_decode.py ;;
E2) step cute_decode_file 400 $P -n 6 tests/gdn/test_gdn_cute_decode.py ;;
E3) step h_values 300 python3 benchmarks/probes/mhc_cute_post_bda_time.py --registry-only --out "$OUT" \
      --h-order fp32,fp32bf,bf16,fp32,fp32bf,bf16,fp32,fp32bf,bf16
    step h_power 200 python3 benchmarks/probes/power_probe.py --out "$OUT" \
      --rows pbda_bwd,pbda_bwd:H=1,pbda_bwd,pbda_bwd:H=1,pbda_fwd,pbda_fwd:H=1,copy
    grep -E "ms$" "$OUT/h_values.log"; tail -12 "$OUT/h_power.log" ;;
E4) step reg_pp 300 $PYT -m gpu -rfE -n 14 tests/registry tests/mhc/test_mhc_post_pre.py tests/test_big_gpu_lock.py
    step moe 280 $PYT -m gpu -rfE -n 14 tests/moe ;;
E5) step workspace 120 $P -n 2 tests/test_cutile_workspace.py
    step reduce_overhead 300 $P -n 8 tests/registry/test_registry_hot_path.py -k reduce_overhead
    step cp_pack 200 $P -n 8 tests/cp/test_cp_cutile_pack.py ;;
H1) bash "$0" E3
    step post_pre 300 python3 benchmarks/probes/mhc_post_pre_variants.py --out "$OUT" \
      --rows h_post_bda,mhc_pre,cute,separate,h_post_bda,mhc_pre,cute
    step proj_rms 200 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --out "$OUT" --registry cute --ab "" --fwd-ab ""
    tail -15 "$OUT/post_pre.log"; grep -E "registry" "$OUT/proj_rms.log" ;;
H2) step decode_floor 300 python3 benchmarks/probes/gdn_inplace_floor.py --b 32,256 --rounds 3
    tail -12 "$OUT/decode_floor.log" ;;
*) echo "usage: session54_gpu.sh E1|E2|E3|E4|E5|H1|H2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
