#!/usr/bin/env bash
# Session 53's device calls on one warm machine (repo root). What sessions 52 owed, the decode fix first:
#   D1, D2 (carry .gpu-cutile): source .gpu-cutile/env.sh && export OUT && bash benchmarks/probes/session53_gpu.sh D1
#   D3 (carry .gpu-cute, after D1 or D2 on the same machine so cuTile is unpacked under /tmp/tk-cutile):
#       source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#         PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/session53_gpu.sh D3
# D1: session 52's fix (cutile_decode.decode_into runs the kernel on 16-byte aligned copies; never GPU-run):
#     the new per-input GPU test (each of the 8 tensors misaligned, fp32 and bf16 state, against float64), memcheck /
#     initcheck / racecheck on its fp32-state ssm_state and o cases (the inputs whose misaligned cubins changed
#     most), then the registry's misaligned gdn_decode cases (fp32-state, B=8: never finished before the fix).
# Ran in session 53 (H100, all passed; record: the session 53 block of ../results/h200-gpu-tests.txt).
# D2: tests/gdn/test_gdn_cutile_decode.py whole, then the diagnosis left open: which misaligned input stalls the
#     raw kernel (gdn_decode_misaligned.py: each input in a child process under HT seconds).
# D3: frozen_weights_checks.sh 4's MoE files whole (part 3's mHC files ran in session 52's B2 and call 5).
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
session_start
D=tests/gdn/test_gdn_cutile_decode.py
case "${1:-}" in
D1) step misaligned_input 200 $P -n 4 $D -k misaligned_input &
    for tool in memcheck initcheck racecheck; do
      step misaligned_$tool 240 $SAN --tool $tool $P $D -k "misaligned_input and fp32state and (ssm_state or o-fp32state)" &
    done
    wait
    step registry_misaligned 240 $P -n 2 tests/registry/test_registry_hot_path.py -k "misaligned and gdn_decode" ;;
D2) step cutile_decode_file 280 $P -n 6 $D
    step which_stalls 260 env HT=60 python3 benchmarks/probes/gdn_decode_misaligned.py ssm_state o conv_weight
    cat "$OUT/which_stalls.log" ;;
D3) step moe_files 500 $P -n 8 tests/moe/test_moe_cute_registry.py tests/moe/test_grouped_gemm_predq.py \
      tests/moe/test_qdq_cute.py ;;
*) echo "usage: session53_gpu.sh D1|D2|D3"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
