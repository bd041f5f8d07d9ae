#!/usr/bin/env bash
# Issue 13 GPU session (one H200 run, ~3 min): the CP pack/unpack timing table (default vs
# the first design vs torch's index path, cp 8/4/2; SWEEP=1 adds the config sweep, ~+60 s),
# ncu of the cp 8 kernels (NCU=1), the merge row-alignment probe (ALIGN=1), then the GPU
# tests of tests/cp. Logs under $OUT; the table is printed again last.
#   source .gpu-cutile/env.sh && bash benchmarks/probes/cp_pack_session.sh
set -u
OUT=${OUT:-/tmp/cp_pack_session}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/benchmarks:$PYTHONPATH"
timeout ${BENCH_S:-95} python3 benchmarks/cp_pack_check.py --cps ${CPS:-8,4,2} ${SWEEP:+--sweep} > "$OUT/cp_pack_check.log" 2>&1; echo "bench rc=$?"
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout ${NCU_S:-35} ncu -k regex:cp_ --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats python3 benchmarks/probes/cp_pack_ncu.py > "$OUT/ncu.log" 2>&1; echo "ncu rc=$?"
  grep -E "^  cp_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Theoretical Occ|L2 Hit|L1/TEX Hit" "$OUT/ncu.log" | head -80
fi
if [ "${ALIGN:-0}" = 1 ]; then
  timeout ${ALIGN_S:-30} python3 benchmarks/probes/cp_merge_align.py > "$OUT/cp_merge_align.log" 2>&1; echo "align rc=$?"
  cat "$OUT/cp_merge_align.log"
fi
timeout "${TEST_S:-120}" python3 -m pytest -q --maxfail=5 tests/cp -m gpu -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest_gpu.log"
sed -n '/^NVIDIA\|^$/,$p' "$OUT/cp_pack_check.log" | tail -60
