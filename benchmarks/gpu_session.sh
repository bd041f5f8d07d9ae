#!/usr/bin/env bash
# The lead's GPU-host session parts that are not one family's: the registry's hot path,
# host cost, and the compute-sanitizer runs of the GDN and MoE kernels. From the repo root:
#   source .gpu-cutile/env.sh && bash benchmarks/gpu_session.sh registry,host,sinkhorn,gdn-memcheck
#   source .gpu-cute/env.sh   && bash benchmarks/gpu_session.sh moe-memcheck,moe-racecheck,moe-initcheck
# Logs land in $OUT; a short summary is printed last.
set -u
OUT=$(cd "${OUT:-.}" && pwd)
parts=",${1:-registry,host},"
has() { [[ "$parts" == *",$1,"* ]]; }
summary=()
san() {  # san TOOL LOG TIMEOUT ARGS...: compute-sanitizer TOOL over a pytest selection ($SAN_EXTRA: its flags)
  local tool=$1 log=$2 t=$3; shift 3
  timeout "$t" compute-sanitizer --tool "$tool" --print-limit 50 ${SAN_EXTRA:-} python3 -m pytest -q -x -p no:cacheprovider "$@" \
    > "$OUT/$log" 2>&1
  summary+=("$log: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$log" | tail -1); $(grep -E ' passed| failed' "$OUT/$log" | tail -1)")
}
if has registry; then
  timeout 240 python3 -m pytest -q tests/registry/test_registry_hot_path.py tests/registry/test_registry_guards.py \
    -n 8 -p no:cacheprovider > "$OUT/registry-tests.txt" 2>&1
  summary+=("registry tests: $(grep -E 'passed|failed' "$OUT/registry-tests.txt" | tail -1)")
fi
if has host; then
  timeout 200 python3 benchmarks/host_overhead.py --device cuda --json "$OUT/host-overhead.json" \
    > "$OUT/host-overhead.txt" 2>&1
  summary+=("host_overhead: rc=$? (table in host-overhead.txt)")
fi
if has sinkhorn; then
  timeout 120 python3 benchmarks/probes/host_profile.py --sinkhorn --T 32768 > "$OUT/sinkhorn-host.txt" 2>&1
  summary+=("sinkhorn host profile: rc=$?")
fi
if has gdn-memcheck; then
  san memcheck gdn-memcheck.txt 200 tests/gdn/test_gdn_cutile_decode.py -m gpu
fi
MOE_SMALL=(tests/moe/test_moe_cute_registry.py -m gpu -k "not shape2 and not MF2 and not graph and not cpu-KN")
MOE_ONE=(tests/moe/test_moe_cute_registry.py -m gpu -k "grouped_mlp_forward_backward and splits0 and HF0")
if has moe-memcheck; then san memcheck moe-memcheck.txt 300 "${MOE_SMALL[@]}"; fi
if has moe-racecheck; then san racecheck moe-racecheck.txt 150 "${MOE_ONE[@]}"; fi
if has moe-initcheck; then san initcheck moe-initcheck.txt 150 "${MOE_ONE[@]}"; fi
# The cuTile kernels of issues 12, 13 and 15 under every sanitizer tool, on a few small cases
# each (the sanitizers run kernels ~100x slower): names san-<tool> with tool in memcheck,
# racecheck, initcheck, e.g. `bash benchmarks/gpu_session.sh san-racecheck,san-initcheck`.
CUTILE_SAN=(
  "gdn-pre:tests/gdn/test_gdn_cutile_pre_gated.py:Hk2-Hv4 and (thd-mixed or bshd-3x5)"
  "gdn-pre-bwd:tests/gdn/test_gdn_cutile_pre_gated_bwd.py:test_bwd_matches_float64_reference and Hk2-Hv4-dk64-dv32-W3-rep and (thd-mixed or bshd-2x70)"
  "gdn-decode:tests/gdn/test_gdn_cutile_decode.py:B5-N8 or B5-N9 or B1-N3 or B33-N33"
  "cp-pack:tests/cp/test_cp_cutile_pack.py:cu_dtype0 and (cp8-3-5 or cp2-16-8-1-float16 or cp4-32)"
  "mhc-post-pre:tests/mhc/test_mhc_post_pre.py:cutile_matches_float64 and (T37 or T129 or T0) or deterministic"
)
# initcheck does not record TMA (UTMASTG) stores as initialization: a kernel whose only inputs
# of that kind are another kernel's TMA-stored fp32 partials is left out of it (mhc_pr_reduce, as
# in mhc_gpu_session.sh) and its outputs are checked by the tests instead. The gdn_pre_gated
# backward stores its dpre scratch and partials without TMA (allow_tma=False): nothing excluded.
INITCHECK_EXCLUDE="--kernel-name-exclude kns=mhc_pr_reduce"
for tool in memcheck racecheck initcheck; do
  if has "san-$tool"; then
    SAN_EXTRA=""; [[ $tool == initcheck ]] && SAN_EXTRA=$INITCHECK_EXCLUDE
    for entry in "${CUTILE_SAN[@]}"; do
      IFS=: read -r name file sel <<< "$entry"
      san "$tool" "$name-$tool.txt" 150 "$file" -m gpu -k "$sel"
    done
  fi
done
# verify: every cuTile family's GPU tests plus the registry's hot path after a change
# (two pytest pools at once: compiles are CPU-bound), then the default-config tables of the CP
# pack kernels, gdn_decode and gdn_pre_gated (carry .gpu-fla too for the FLA rows) and the
# sinkhorn host profile, on a quiet host. Logs in $OUT/verify/, packed into $OUT/verify.tar.gz
# (a call brings back at most 8 files).
if has verify; then
  V="$OUT/verify"; mkdir -p "$V"
  if ls .gpu-fla/*.whl >/dev/null 2>&1; then  # FLA (the GDN peer), off the project's dependencies
    pip install -q --no-deps --no-index --target /tmp/fla .gpu-fla/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/fla:$PYTHONPATH
  fi
  # per-test limit (pytest-timeout is on the GPU host): a hung kernel fails its test, not the pool
  P="python3 -m pytest -q -p no:cacheprovider -m gpu --timeout=${VERIFY_TEST_T:-240} --timeout-method=thread"
  timeout ${VERIFY_T:-300} $P -n ${VERIFY_N:-8} tests/gdn tests/cp tests/test_cutile_workspace.py tests/registry/test_registry_hot_path.py \
    tests/registry/test_registry_guards.py > "$V/tests.txt" 2>&1 &
  timeout ${VERIFY_T:-300} $P -n 4 tests/mhc -k sinkhorn > "$V/tests-sinkhorn.txt" 2>&1 &
  wait
  summary+=("verify tests: $(grep -E ' passed| failed' "$V/tests.txt" | tail -1)")
  summary+=("verify sinkhorn tests: $(grep -E ' passed| failed' "$V/tests-sinkhorn.txt" | tail -1)")
  OUT="$V" timeout 90 python3 benchmarks/cp_pack_check.py --cps 8,4,2 > "$V/cp-pack.txt" 2>&1
  summary+=("cp_pack_check: rc=$?")
  timeout 70 python3 benchmarks/gdn_decode_check.py --out "$V" > "$V/gdn-decode.txt" 2>&1
  summary+=("gdn_decode_check: rc=$?")
  timeout 100 python3 benchmarks/gdn_pre_check.py --out "$V" --no-compile-peer --no-eager > "$V/gdn-pre.txt" 2>&1
  summary+=("gdn_pre_check: rc=$?")
  timeout 60 python3 benchmarks/probes/host_profile.py --sinkhorn --T 32768 > "$V/sinkhorn-host.txt" 2>&1
  summary+=("sinkhorn host profile: rc=$?")
  tar czf "$OUT/verify.tar.gz" -C "$OUT" verify
fi
printf '%s\n' "${summary[@]}"
if has host; then tail -20 "$OUT/host-overhead.txt"; fi
if has sinkhorn; then grep -E "us/call|do_bench" "$OUT/sinkhorn-host.txt"; fi
