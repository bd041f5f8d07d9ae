#!/usr/bin/env bash
# One GPU call for the MXFP8 bandwidth kernels (cute_quantize, cute_swiglu), from the repository
# root on the device host: `source .gpu-cute/env.sh && bash benchmarks/probes/mxfp8_session.sh`.
# Logs under $OUT (at most 8 files come back); a short table last. Knobs (seconds, 0 = skip):
#   QBENCH  quantize timing (moe_cute_check.py)                         (default 60); QSWEEP=1
#           adds the shared-memory config sweep of rowwise and both
#   SBENCH  fused SwiGLU + MXFP8 timing; SWEEP=1 adds its config sweep  (default 90)
#   TESTS   the GPU tests of both files + the registry's cute MoE tests (default 0), in parallel
#   MLP     benchmarks/moe_mlp_check.py at the G=8 shape                (default 0)
#   WS      the warp-specialized grouped GEMM (cute_gemm_ws.py): a smoke call per variant,
#           its GPU tests (+ a subset of the two-warpgroup kernel's) in 4 processes while
#           moe_gemm_check.py --sweep-set ws compiles, then the timing table (default 0)
#   SAN     compute-sanitizer memcheck + racecheck on one small ws GEMM test     (default 0)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
: "${QBENCH:=60}" "${SBENCH:=90}" "${TESTS:=0}" "${MLP:=0}" "${SWEEP:=1}" "${WS:=0}" "${SAN:=0}"
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
san() {   # compute-sanitizer memcheck + racecheck on small ws GEMM tests (fwd, wgrad)
  for tool in memcheck racecheck; do
    timeout "$SAN" compute-sanitizer --tool $tool --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider -m gpu \
      tests/moe/test_grouped_gemm_cute_ws.py -k "matches_reference and zeros_odd and bf16 and not dgrad" \
      > "$OUT/san_$tool.log" 2>&1; echo "rc=$?" >> "$OUT/san_$tool.log"
  done
}
if [ "$WS" != 0 ]; then
  P="python3 -m pytest -q -p no:cacheprovider -m gpu"
  timeout 60 $P tests/moe/test_grouped_gemm_cute_ws.py -k "matches_reference and zeros_odd and bf16" \
    > "$OUT/w_smoke.log" 2>&1; echo "rc=$?" >> "$OUT/w_smoke.log"
  if grep -q "rc=124" "$OUT/w_smoke.log"; then WS=1; echo "ws smoke timed out (hang?): tests cut to 1 s" >> "$OUT/w_smoke.log"; fi
  rm -f "$OUT/.tests_done"
  pids=""
  w() { local name=$1; shift; (timeout "$WS" $P "$@" > "$OUT/w_$name.log" 2>&1; echo "rc=$?" >> "$OUT/w_$name.log") & pids="$pids $!"; }
  if [ -n "${WSK:-}" ]; then   # a -k subset of the ws tests instead of all (and no old-kernel subset)
    w sub tests/moe/test_grouped_gemm_cute_ws.py -k "$WSK"
  else
    w ref tests/moe/test_grouped_gemm_cute_ws.py -k "matches_reference and not wgrad"
    w refw tests/moe/test_grouped_gemm_cute_ws.py -k "matches_reference and wgrad"
    w rest tests/moe/test_grouped_gemm_cute_ws.py -k "not matches_reference"
    w old tests/moe/test_grouped_gemm_cute.py -k "int32_offsets or cuda_graph or nan_scale or headline or persistent_edge"
  fi
  # (a subshell cannot `wait` for its siblings: poll their pids)
  (for p in $pids; do while kill -0 "$p" 2>/dev/null; do sleep 1; done; done
   [ "$SAN" != 0 ] && san; touch "$OUT/.tests_done") &
  timeout "${WSBENCH:-200}" python3 benchmarks/moe_gemm_check.py --no-check --sweep-set ws --rep 100 \
    --precompile --wait-for "$OUT/.tests_done" --out "$OUT" > "$OUT/w_bench.log" 2>&1
  echo "rc=$?" >> "$OUT/w_bench.log"
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
for f in "$OUT"/w_*.log "$OUT"/san_*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -E 'passed|failed|error|ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1) $(tail -1 "$f")"; done
[ -f "$OUT/w_bench.log" ] && grep -E "precompiled|waited" "$OUT/w_bench.log" && sed -n '/^summary/,$p' "$OUT/w_bench.log" | cut -c1-150
exit 0
