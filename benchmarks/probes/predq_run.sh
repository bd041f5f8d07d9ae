#!/usr/bin/env bash
# GPU runs of the predq MXFP8 GEMM path (issue 11, helper A), from the repo root after
# `source .gpu-cute/env.sh`:  bash benchmarks/probes/predq_run.sh 1|2
# 1: torch._grouped_mm edge cases, the predq GPU tests, the per-GEMM table (dq / predq / torch bf16).
# 2: the fused MLP through the registry (predq default vs dq vs torch bf16), the registry MoE GPU
#    tests at the default, initcheck over a few ws GEMM tests, memcheck over small predq tests.
set -u
OUT=$(cd "${OUT:-.}" && pwd)
PT=(python3 -m pytest -q -p no:cacheprovider --timeout=120 --timeout-method=thread)
sum=()
if [[ ${1:-1} == 1 ]]; then
  timeout 45 python3 benchmarks/probes/grouped_mm_edges.py > "$OUT/edges.txt" 2>&1
  sum+=("edges rc=$?"); sum+=("$(grep -c '^grouped_mm OK' "$OUT/edges.txt") OK, $(grep -c '^grouped_mm BAD' "$OUT/edges.txt") BAD")
  timeout 80 "${PT[@]}" -v tests/moe/test_grouped_gemm_predq.py -m gpu > "$OUT/predq-tests.txt" 2>&1
  sum+=("predq tests rc=$?: $(tail -1 "$OUT/predq-tests.txt")")
  timeout 95 python3 benchmarks/moe_gemm_check.py --no-sweep --rep 80 --out "$OUT" > "$OUT/gemm.txt" 2>&1
  sum+=("gemm check rc=$?")
  grep '^grouped_mm BAD' "$OUT/edges.txt"
  grep -E 'FAILED|ERROR' "$OUT/predq-tests.txt" | head -20
  sed -n '/^summary/,$p' "$OUT/gemm.txt"
else
  MOE_MLP_KERNELS=dq timeout 80 python3 benchmarks/moe_mlp_check.py --out "$OUT" > "$OUT/mlp.txt" 2>&1
  sum+=("mlp rc=$?")
  timeout 28 "${PT[@]}" tests/moe/test_grouped_gemm_predq.py -m gpu > "$OUT/predq-tests.txt" 2>&1
  sum+=("predq tests rc=$?: $(tail -1 "$OUT/predq-tests.txt")")
  timeout 45 "${PT[@]}" tests/moe/test_moe_cute_registry.py -m gpu -k "not shape2 and not MF2" > "$OUT/registry-tests.txt" 2>&1
  sum+=("registry tests rc=$?: $(tail -1 "$OUT/registry-tests.txt")")
  timeout 35 compute-sanitizer --tool memcheck --print-limit 20 "${PT[@]}" tests/moe/test_grouped_gemm_predq.py -m gpu \
    -k "N352K224 and (G4 or G1-) or nan_scale and fwd-a or mlp_through_both_paths and predq" > "$OUT/memcheck-predq.txt" 2>&1
  sum+=("memcheck predq rc=$?: $(grep 'ERROR SUMMARY' "$OUT/memcheck-predq.txt" | tail -1); $(tail -1 "$OUT/memcheck-predq.txt")")
  timeout 25 compute-sanitizer --tool initcheck --print-limit 20 "${PT[@]}" tests/moe/test_grouped_gemm_cute_ws.py -m gpu \
    -k "${WS_SEL:-test_ws_matches_reference and bf16 and (zeros_odd or M32)}" > "$OUT/initcheck-ws.txt" 2>&1
  sum+=("initcheck ws rc=$?: $(grep 'ERROR SUMMARY' "$OUT/initcheck-ws.txt" | tail -1); $(tail -1 "$OUT/initcheck-ws.txt")")
  grep -hE 'FAILED' "$OUT/registry-tests.txt" "$OUT/predq-tests.txt" | head
  sed -n '/^shape/,$p' "$OUT/mlp.txt"
fi
printf '%s\n' "${sum[@]}"
