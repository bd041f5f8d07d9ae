#!/usr/bin/env bash
# Session 13's review call (cute bundle): compute-sanitizer on the GPU code this session's change touched, beside
# the GPU files of the host-side refactors. From the repository root: source .gpu-cute/env.sh && bash benchmarks/probes/session13_sanitizers.sh
#   gdn_decode (grid regimes): initcheck on every regime's cases (memcheck / racecheck ran in call 7);
#   gdn_pre_gated forward (session 12's shared device helpers): memcheck, initcheck, racecheck on 8 cases;
#   grouped_linear bf16 (torch._grouped_mm + copy): memcheck, initcheck, racecheck;
#   then tests/mhc/test_mhc_cute_post_bda.py and the MoE registry file at the tree (aligned16 moved to _glue).
set -u
OUT=${OUT:-.}
SAN="compute-sanitizer --report-api-errors no --print-limit 30"
PYT="python3 -m pytest -q -p no:cacheprovider -m gpu"
DEC="test_cute_regimes or (test_decode_matches and Hk16)"
FWD="test_fwd_matches_float64_reference and (Hk2-Hv4 or Hk16-Hv32) and (thd-edges or bshd-3x5)"
GL="bf16 and (KN0 or unaligned)"
run() { local name=$1; shift; timeout 240 "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY| passed| failed|no tests ran" "$OUT/$name.log" | tail -2; }
run decode_initcheck $SAN --tool initcheck $PYT tests/gdn/test_gdn_cute_decode.py -k "$DEC" &
run fwd_memcheck $SAN --tool memcheck $PYT tests/gdn/test_gdn_cute_pre_gated.py -k "$FWD" &
run fwd_initcheck $SAN --tool initcheck $PYT tests/gdn/test_gdn_cute_pre_gated.py -k "$FWD" &
run fwd_racecheck $SAN --tool racecheck --racecheck-report hazard $PYT tests/gdn/test_gdn_cute_pre_gated.py -k "$FWD" &
wait
for tool in memcheck initcheck racecheck; do
  run "gl_$tool" $SAN --tool $tool $PYT tests/moe/test_moe_cute_registry.py -k "$GL" &
done
run files $PYT -n 4 tests/mhc/test_mhc_cute_post_bda.py tests/moe/test_moe_cute_registry.py &
wait
