#!/bin/bash
# Device host, from the repository root (carry .gpu-cutile):
#   source .gpu-cutile/env.sh && bash benchmarks/probes/gdn_pre_fwd_ncu_sweep.sh
# 1. the forward variants of GDN_PRE_VARIANTS ("{...};{...}", PreGatedCfg fields over the heuristic's;
#    default below), each compiled and run first in timed child processes (gdn_pre_check --warm-first:
#    a hang costs its process), then timed in all four cases (BSHD/THD x repeat_qk on/off), each checked
#    against the torch reference; 2. Nsight Compute of the default's two launches (head, main) in BSHD
#    and of the default's and NCU_THD_ALSO's in THD (SpeedOfLight, WarpStateStats, SchedulerStats,
#    Occupancy, LaunchStats, MemoryWorkloadAnalysis). Logs to $OUT; the side-by-side table last.
set -o pipefail
OUT=${OUT:-/tmp/gdn_pre_out}
LOGS=/tmp/gdn_pre_logs
mkdir -p "$OUT" "$LOGS"
# (session 7's run 1 ran "{};{'MA': True};{'MA': True, 'OCCH': 2};{'FT': 64, 'OCC': 2};{'FT': 64, 'OCC': 2, 'MA': True}"
# with NCU_THD_ALSO "{'MA': True, 'OCCH': 2}": records in gdn.md)
export GDN_PRE_VARIANTS=${GDN_PRE_VARIANTS:-"{'MA': False, 'OCCH': 0, 'SX': False};{'MA': True, 'OCCH': 2, 'SX': True}"}
NCU_THD_ALSO=${NCU_THD_ALSO:-"{'MA': True, 'OCCH': 2, 'SX': True}"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/smi.txt" 2>&1
timeout "${T_SWEEP:-140}" python3 benchmarks/gdn_pre_check.py --out "$LOGS" --sweep --sweep-all --warm-first \
  --warm-procs "${WARM_PROCS:-6}" --test-proc-s "${WARM_S:-100}" --no-cases --no-eager --no-bwd --no-compile-peer \
  2>&1 | tee "$OUT/sweep.log"
rc=$?
SEC=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
     --section LaunchStats --section MemoryWorkloadAnalysis)
timeout "${T_NCU:-30}" ncu --clock-control none --kernel-name regex:gdn_pre_fwd --launch-count 2 "${SEC[@]}" \
  python3 benchmarks/probes/gdn_pre_ncu.py "{}" > "$OUT/ncu_bshd.txt" 2>&1
echo "ncu bshd rc=$?"
timeout "${T_NCU:-30}" ncu --clock-control none --kernel-name regex:gdn_pre_fwd --launch-count 4 "${SEC[@]}" \
  python3 benchmarks/probes/gdn_pre_ncu.py --thd "{}" "$NCU_THD_ALSO" > "$OUT/ncu_thd.txt" 2>&1
echo "ncu thd rc=$?"
cp "$LOGS/gdn_pre_check.json" "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
for f in "$OUT"/ncu_*.txt; do
  echo "== $f"; grep -E "gdn_pre_fwd|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued" "$f" | head -60
done
grep -A30 "side by side" "$OUT/sweep.log" | head -20
echo "sweep rc=$rc"
