#!/usr/bin/env bash
# Session 60's device calls (repo root), on one warm machine:
#   call 1 (carry .gpu-cutile): source .gpu-cutile/env.sh; export OUT; bash benchmarks/probes/session60_gpu.sh U
#   then (carry .gpu-cute):     source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \
#       PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH; export OUT; bash benchmarks/probes/session60_gpu.sh A|E1|E2
# U: unpacks cuTile (env.sh did) and names the card.
# A: on an H200 only, session 58's A (= session 57's K2: issue 15's h_post_bda through the registry, fp32 / bf16 h,
#    RG 32 default against the RG 8 chain; the GDN backward's reduction A/B; issue 12's in-place decode floor).
#    A2: its two target timings alone (h_post_bda through the registry, the decode floor at B=32 / 256), ~5 min.
# E1: the sigmoids of cute_pre_rest (mhc_pre's and mhc_post_pre's default backward) and cute_post_pre_dhw (FUSE_DHW)
#    on cute.math.exp(fastmath=True) instead of the deprecated cute.arch.exp: their GPU test files, then memcheck /
#    initcheck / racecheck on small cases.
# E2: the same change timed: mhc_post_pre_variants.py (cute, cute with FUSE_DHW, separate, with its kernel table) with
#    the new form, the old form (sed back), the new form again, each in its own process.
# E3: initcheck on FUSE_DHW's pass (E1 ran memcheck and racecheck there).
# H1 (.gpu-cute, after A2 on an H200; call 20): proj_rms through the registry, then h_post_bda's RG 8 chain A/B.
# H2 (.gpu-cute with cuTile on the path; call 22): mhc_post_pre against its two ops timed apart, then E3.
set -u
. "$(dirname "$0")/_steps.sh"
session_start
MODE=${1:-U}
F="tilekernels/mhc/cute_pre_rest.py tilekernels/mhc/cute_post_pre_dhw.py"
K='dhw_pass_matches_float64 and (T37-n3 or T1-n1)'   # FUSE_DHW's small cases (E1, E3, H2)
NEW='cute.math.exp(-h, fastmath=True)'
OLD='cute.arch.exp(-h)'
case "$MODE" in
U) ls /tmp/tk-cutile ;;
A|A2) grep -q H200 "$OUT/device.txt" || { echo "$MODE: not an H200"; exit 4; }
   exec bash "$(dirname "$0")/session58_gpu.sh" "$MODE" ;;
E1) grep -c "$NEW" $F
   step e1_tests 300 $P -n 12 tests/mhc/test_mhc_cute_pre_rest.py tests/mhc/test_mhc_cute_post_pre.py \
     tests/mhc/test_mhc_cute_pre.py tests/mhc/test_mhc_post_pre.py
   R='(test_matches_float64 and (T1-n4 or T37-n1 or T333-n3)) or dproj_only'
   step e1_mem_rest 200 $SAN --tool memcheck $PYT -m gpu tests/mhc/test_mhc_cute_pre_rest.py -k "$R" &
   step e1_init_rest 200 $SAN --tool initcheck $PYT -m gpu tests/mhc/test_mhc_cute_pre_rest.py -k "$R" &
   step e1_race_rest 200 $SAN --tool racecheck $PYT -m gpu tests/mhc/test_mhc_cute_pre_rest.py -k "$R" &
   step e1_mem_dhw 200 $SAN --tool memcheck $PYT -m gpu tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
   step e1_race_dhw 200 $SAN --tool racecheck $PYT -m gpu tests/mhc/test_mhc_cute_post_pre.py -k "$K" &
   wait ;;
E3) step e3_init_dhw 200 $SAN --tool initcheck $PYT -m gpu tests/mhc/test_mhc_cute_post_pre.py -k "$K" ;;
H1) step h1_proj_rms 100 python3 benchmarks/probes/mhc_cute_proj_rms_time.py --registry cute
   step h1_chain 150 python3 benchmarks/probes/mhc_cute_post_bda_time.py --registry-only --out "$OUT" --chain-ab rg8 ;;
H2) step h2_post_pre 150 python3 benchmarks/probes/mhc_post_pre_variants.py \
     --rows h_post_bda,mhc_pre,cute,h_post_bda,mhc_pre,cute --out "$OUT"
   step e3_init_dhw 200 $SAN --tool initcheck $PYT -m gpu tests/mhc/test_mhc_cute_post_pre.py -k "$K" ;;
E2) mkdir -p "$OUT/new1" "$OUT/old" "$OUT/new2"; V="python3 benchmarks/probes/mhc_post_pre_variants.py --rows cute,cute:FUSE_DHW=1,separate,cute --profile"
   step e2_new1 170 $V --out "$OUT/new1"
   sed -i "s/cute\.math\.exp(-h, fastmath=True)/cute.arch.exp(-h)/" $F; grep -c "$OLD" $F
   step e2_old 170 $V --out "$OUT/old"
   sed -i "s/cute\.arch\.exp(-h)/cute.math.exp(-h, fastmath=True)/" $F; grep -c "$NEW" $F
   step e2_new2 170 $V --out "$OUT/new2" ;;
*) echo "usage: session60_gpu.sh U|A|A2|E1|E2|E3|H1|H2"; exit 2 ;;
esac
cat "$OUT/device.txt" "$SUM"
