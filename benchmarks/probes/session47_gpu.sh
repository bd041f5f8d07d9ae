#!/usr/bin/env bash
# The registry drop-in GPU checks and the GPU runs owed since sessions 46-47, one device call a part (repo root):
#   cuTile parts (carry .gpu-cutile): source .gpu-cutile/env.sh; bash benchmarks/probes/session47_gpu.sh PART
#   CuTe DSL parts (carry .gpu-cute): source .gpu-cute/env.sh;   bash benchmarks/probes/session47_gpu.sh PART
# A  (cuTile) NaN / autocast / FakeTensorMode, then misaligned inputs: every op (ran at 82bf102: 4 GDN NaN failures,
#    fixed on the CPU at 0746264 / 04731e6; the misaligned step's cap cut off the last 3 GDN cases).
# G1 (cuTile) the GDN NaN cases again, the cuTile GDN files whole (their softplus changed), then memcheck /
#    initcheck / racecheck over one gdn_pre_gated and one gdn_decode registry NaN case.
# G2 (cuTile) the GDN misaligned-input cases (cuTile compiles a kernel per misaligned input: minutes). Session 52:
#    3 of 4 passed, gdn_decode-fp32-state never finished (fixed after: aligned copies; passes since, session53_gpu.sh D1).
# B1 (CuTe) as A, on the CuTe DSL kernels (auto picks them): includes the NaN test over the proj_rms / post_pre
#    backward kernels whose RMS select changed in session 46 (never run on a GPU).
# T1 (cuTile) / T2 (CuTe) session 48's tests on the GPU kernels: tests/registry/test_training_stack.py
#    (checkpointing, selective checkpointing eager / compiled, offload hooks, retained-graph backward, deterministic
#    mode, outputs freed without the cycle collector), opcheck of the custom ops (test_opgen.py), and on T2 the
#    flop counts and frozen MoE weights (the cute backward skipping their wgrads; CPU-emulated so far); first,
#    session 49's torch.func tests (grad / vjp through the GPU kernels: tests/registry/test_func_transforms.py).
# S49 (CuTe) session 49's short version for a small budget: the NaN test on every op (the CuTe RMS selects never
#    run), the torch.func and checkpoint + create_graph tests, the mHC RMS-select files whole (no sanitizers).
# B2 (CuTe) torch.compile at 3 batch sizes (also reduce-overhead), the mHC CuTe proj_rms / post_pre files whole,
#    then memcheck / initcheck / racecheck over their RMS-term tests.
# G3 (cuTile, session 50) the cuTile backward's padding-products fix: its file whole (the pinned NaN-at-sequence-
#    edge test, the config variants), the registry's GDN NaN cases, memcheck on one edge case, then
#    the backward timed (gdn_pre_bwd_time.py: the four Qwen3-Next cases, against session 8's 2.06-2.19 ms).
# C3 (CuTe, session 50) the CuTe backward's edge test, then T2.
# Each failure's report is printed the moment it arrives (benchmarks/probes/instafail.py), so a step its cap cuts
# off still names what failed and why.
set -u
. "$(dirname "$0")/_steps.sh"  # step NAME SECONDS CMD...
: > "$SUM"
export PYTHONPATH="$(dirname "$0"):${PYTHONPATH:-}"
P="$PYT -p instafail -m gpu -rfE -n 8 --durations=8"
S="$PYT -p instafail -m gpu -rfE"  # (under a sanitizer: one process)
H=tests/registry/test_registry_hot_path.py
sanitize() {  # sanitize NAME SECONDS PYTEST-ARGS...: the three tools in turn
  local name=$1 secs=$2; shift 2
  for tool in memcheck initcheck racecheck; do step ${name}_$tool "$secs" $SAN --tool $tool $S "$@"; done
}
case "${1:-}" in
A|B1) step dropin_$1 230 $P $H -k "nan_reaches or autocast or fake_tensor"
      step misaligned_$1 270 $P $H -k "misaligned" ;;
G1) step nan_gdn 120 $P $H -k "nan_reaches and gdn"
    step gdn_cutile_files 300 $P tests/gdn/test_gdn_cutile_decode.py tests/gdn/test_gdn_cutile_pre_gated.py \
      tests/gdn/test_gdn_cutile_pre_gated_bwd.py
    sanitize gdn_nan 50 $H -k "nan_reaches and (gdn_pre_gated-thd or gdn_decode-fp32)" ;;
G3) step gdn_cutile_bwd 240 $P tests/gdn/test_gdn_cutile_pre_gated_bwd.py
    step nan_gdn 90 $P $H -k "nan_reaches and gdn"
    step gdn_edges_memcheck 60 $SAN --tool memcheck $S tests/gdn/test_gdn_cutile_pre_gated_bwd.py -k "edges and W4-rep and thd"
    step gdn_bwd_time 150 python3 benchmarks/probes/gdn_pre_bwd_time.py --out "$OUT" ;;
C3) step gdn_cute_edges 60 $P tests/gdn/test_gdn_cute_pre_gated_bwd.py -k "edges" ;;&
T1|T2|C3) step func_transforms_$1 60 $P tests/registry/test_func_transforms.py ;;&
T1) step training_stack_T1 460 $P tests/registry/test_training_stack.py tests/registry/test_opgen.py ;;
T2|C3) step training_stack_$1 420 $P tests/registry/test_training_stack.py tests/registry/test_opgen.py \
      tests/registry/test_flop_counts.py tests/moe/test_moe_frozen_weights.py ;;
G2) step misaligned_gdn 540 $P $H -k "misaligned and gdn" ;;
S49) step nan_cute 200 $P $H -k "nan_reaches"
     step func_transforms_S49 80 $P tests/registry/test_func_transforms.py
     step create_graph_S49 60 $P tests/registry/test_training_stack.py -k "create_graph"
     step mhc_cute_rms 160 $P tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_post_pre.py \
       tests/mhc/test_mhc_proj_rms.py ;;  # (test_mhc_post_pre.py's GPU tests are cuTile's: they need .gpu-cutile)
B2) step compile 200 $P $H -k "keeps_batch or reduce_overhead"
    step mhc_cute_rms 160 $P tests/mhc/test_mhc_cute_proj_rms.py tests/mhc/test_mhc_cute_post_pre.py \
      tests/mhc/test_mhc_proj_rms.py  # (test_mhc_post_pre.py's GPU tests are cuTile's: G-parts' bundle)
    sanitize mhc_rms 60 tests/mhc/test_mhc_cute_proj_rms.py -k "rms_term" ;;
*) echo "usage: $0 A|G1|G2|G3|T1|B1|B2|T2|C3|S49"; exit 2 ;;
esac
cat "$SUM"
for f in "$OUT"/*.log; do grep -c "^ok " "$f" | sed "s|^|$f ok: |"; done
grep -h -A25 "INSTAFAIL" "$OUT"/*.log | grep -vE "^\s*$" | head -150
