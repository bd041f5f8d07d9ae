#!/usr/bin/env bash
# One GPU call for the MXFP8 bandwidth kernels (cute_quantize, cute_swiglu), from the repository
# root on the device host: `source .gpu-cute/env.sh && bash benchmarks/probes/mxfp8_session.sh`.
# Logs under $OUT (at most 8 files come back); a short table last. Knobs (seconds, 0 = skip):
#   QBENCH  quantize timing (moe_cute_check.py)                         (default 60); QSWEEP=1
#           adds the shared-memory config sweep of rowwise and both
#   SBENCH  fused SwiGLU + MXFP8 timing; SWEEP=1 adds its config sweep  (default 90)
#   TESTS   the GPU tests of both files + the registry's cute MoE tests (default 0), in parallel
#   MLP     benchmarks/moe_mlp_check.py at the G=8 shape                (default 0)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
: "${QBENCH:=60}" "${SBENCH:=90}" "${TESTS:=0}" "${MLP:=0}" "${SWEEP:=1}"
ENV=$(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>&1)
if [ "$QBENCH" != 0 ]; then
  timeout "$QBENCH" python3 benchmarks/moe_cute_check.py --no-compile ${QSWEEP:+--sweep --sweep-axes rowwise,both --sweep-smem-only} \
    > "$OUT/b_quant.log" 2>&1; echo "rc=$?" >> "$OUT/b_quant.log"
fi
if [ "$SBENCH" != 0 ]; then
  extra="--quant-only"; [ "$SWEEP" = 1 ] || extra="$extra --no-sweep"
  timeout "$SBENCH" python3 benchmarks/moe_swiglu_check.py --no-compile $extra --out "$OUT" \
    > "$OUT/b_swiglu.log" 2>&1; echo "rc=$?" >> "$OUT/b_swiglu.log"
fi
if [ "$TESTS" != 0 ]; then
  # GPU tests only (their CPU compile tests run in CI), five processes (compiles are CPU-bound)
  P="python3 -m pytest -q -p no:cacheprovider -m gpu"
  t() { local name=$1; shift; (timeout "$TESTS" $P "$@" > "$OUT/t_$name.log" 2>&1; echo "rc=$?" >> "$OUT/t_$name.log") & }
  t mxfp8_a tests/moe/test_mxfp8_cute.py -k "config"
  t mxfp8_b tests/moe/test_mxfp8_cute.py -k "not config"
  t swiglu_q tests/moe/test_swiglu_cute.py -k "quant"
  t swiglu_plain tests/moe/test_swiglu_cute.py -k "not quant"
  t registry tests/moe/test_moe_cute_registry.py -k "not shape2 and not MF2"
  wait
fi
if [ "$MLP" != 0 ]; then
  timeout "$MLP" python3 benchmarks/moe_mlp_check.py --shapes g8 --out "$OUT" > "$OUT/b_mlp.log" 2>&1; echo "rc=$?" >> "$OUT/b_mlp.log"
fi
echo "==== summary"; echo "$ENV"
for f in "$OUT"/t_*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -E 'passed|failed|error' "$f" | tail -1) $(tail -1 "$f")"; done
[ -f "$OUT/b_quant.log" ] && grep -E "cute|smem|direct|MISMATCH|rc=" "$OUT/b_quant.log" | cut -c1-110
[ -f "$OUT/b_swiglu.log" ] && sed -n '/^op /,$p' "$OUT/b_swiglu.log" | cut -c1-150 && grep -E "MISMATCH|^ERROR" "$OUT/b_swiglu.log" | head -5
[ -f "$OUT/b_mlp.log" ] && tail -20 "$OUT/b_mlp.log"
exit 0
