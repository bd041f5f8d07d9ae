#!/usr/bin/env bash
# The GPU checks owed since sessions 45-46, one device call (carry .gpu-cute) after a call that sourced
# .gpu-cutile/env.sh on the same warm machine (the registry steps run the mHC ops' cuTile kernels too), repo root:
#   source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site PATH=/tmp/tk-cutile/cu13/bin:$PATH
#   unset CUDA_HOME CUDA_PATH; bash benchmarks/probes/frozen_weights_checks.sh PART
# PART 1 (the default): pre-quantized MoE weights and the GDN step; PART 2: the registry's session 46 GPU tests;
# PART 3: the mHC files; PART 4: the MoE files (each part fits one call's 600 s; the steps' timeouts are upper bounds).
# - grouped_mlp_mxfp8 with pre-quantized (frozen) weights on the cute kernels, every GEMM route
#   (test_moe_cute_registry.py -k prequantized, 18 cases), then memcheck / initcheck on one small case of it. They
#   passed in session 51 (H100), and the cute backend's "pre-quantized weights" limit in specs/moe.py went. initcheck
#   skips torch's own grouped GEMM (GemmUniversal) and host copies: initcheck does not see TMA stores, so it reports
#   their readers (moe.md, session 51).
# - gdn_pre_gated with a CPU cu_seqlens beside GPU tensors: bitwise the GPU cu_seqlens' outputs and gradients, and a
#   clear refusal inside a CUDA-graph capture (test_gdn_spec.py -k cpu_cu_seqlens).
# - the MoE and GDN registry GPU files whole, since the glue around them changed (cute_kernels' weight helpers,
#   _glue.on_device).
# - (session 46) torch.compile of every op's registry call at 3 batch sizes through the GPU backends: 2 graphs
#   (dynamic=None) or 1 (dynamic=True), each call equal to eager (test_registry_hot_path.py -m gpu -k keeps_batch_dims_dynamic), also with
#   mode="reduce-overhead" (-k reduce_overhead_gpu); and
#   every op under torch.autocast("cuda", bfloat16) bitwise the call without it (-k autocast_leaves_results_unchanged);
#   each tensor input of every op passed one element off its allocation's start (-k misaligned_inputs, -s: it
#   prints the inputs that sent a call to another backend); every op under FakeTensorMode (-k fake_tensor_mode);
#   one NaN in each floating input reaching exactly what the reference's NaN reaches (-k nan_reaches_what_depends_on_it;
#   the proj_rms / post_pre backward kernels' RMS coefficient changed from `rms > 0 ? c : 0` to `rms <= 0 ? 0 : c` in
#   session 46: PTX diff only that select, first GPU run here), then the mHC proj_rms / post_pre GPU files whole.
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
ls /tmp/tk-cutile > /dev/null || echo "cuTile is not unpacked: the mHC cases of the registry steps will fail (call 1 first)"
: > "$SUM"
P="$PYT -m gpu -rfE"
H=tests/registry/test_registry_hot_path.py
case "${1:-1}" in
1) step moe_prequant 240 $P tests/moe/test_moe_cute_registry.py -k prequantized
   K="prequantized and splits1 and fc1 and no-qdq"
   for tool in memcheck initcheck; do
     X=; [ $tool = initcheck ] && X="--kernel-name-exclude kns=GemmUniversal --check-api-memory-access no"
     step moe_prequant_$tool 200 $SAN --tool $tool $X $P tests/moe/test_moe_cute_registry.py -k "$K" &
   done
   wait
   step gdn_cpu_cu 60 $P tests/gdn/test_gdn_spec.py -k cpu_cu_seqlens ;;
2) step compile_dynamic 240 $P $H -k "keeps_batch_dims_dynamic or reduce_overhead_gpu"
   step autocast 60 $P $H -k autocast_leaves_results_unchanged
   step misaligned 90 $P -s $H -k misaligned_inputs
   step fake_mode 60 $P $H -k fake_tensor_mode
   step nan 90 $P $H -k nan_reaches_what_depends_on_it ;;
3) step mhc_rms_files 500 $P -n 8 tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_post_pre.py \
     tests/mhc/test_mhc_proj_rms.py tests/mhc/test_mhc_post_pre.py ;;
4) step moe_files 400 $P -n 8 tests/moe/test_moe_cute_registry.py tests/moe/test_grouped_gemm_predq.py tests/moe/test_qdq_cute.py ;;
esac
cat "$SUM"
