#!/usr/bin/env python3
"""Device host: PreGatedBwdCfg variants of the gdn_pre_gated cuTile backward, each checked and timed
in its own child process under a limit (tileiras 13.5 has built kernels that hang or compute wrong
at non-default settings), then Nsight Compute on the dpre launch of the default and the fastest.
From the repository root:

    python3 benchmarks/probes/gdn_pre_bwd_var.py --out "$OUT" [--variants 0,1,2] [--ncu] [--limit-s 200]

1. check (all variants at once, one process each, ``timeout``): the backward GPU test's check_bwd
   (float64 reference, NaN-poisoned outputs, two runs bitwise) on Qwen3-Next BSHD 2 x 70 with
   repeat_qk, THD (the test's mixed lengths + 300) with repeat_qk, and Hk2-Hv4-dk64-dv32-W3 THD
   without; this also fills cuTile's disk cache for the timing process;
2. time (one process, ``timeout``): the variants that passed, Qwen3-Next BSHD B=4 x T=8192 bf16
   with repeat_qk (benchmarks/gdn_pre_check.py's problem), triton do_bench median of the whole
   backward and of each dpre/dx/reduction launch alone, rel. errors against the torch reference
   in fp32; % of the ideal traffic (82,368 B a token at 4.27 TB/s);
3. --ncu: the dpre main launch of variant 0 and of the fastest variant under ncu (SpeedOfLight,
   Occupancy, LaunchStats, SchedulerStats, WarpStateStats; --clock-control none).
Writes var_*.log, time.json, ncu_*.txt under --out; prints a table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.dirname(HERE), HERE, os.path.join(ROOT, "tests", "gdn")]
T0 = time.time()

# PreGatedBwdCfg fields over the session-6 default (S6 over the heuristic's; Qwen3-Next, repeat_qk); 0-9 ran in
# session 7's first call (3 = the new default), 10 (XT) is new
S6 = dict(XS=False, DWA=False, NTB=1, OCC_A=4)
VARIANTS = [
    {},
    dict(XS=True, OCC_A=3),
    dict(XS=True, OCC_A=2),
    dict(XS=True, DWA=True, NTB=4, OCC_A=2),
    dict(XS=True, DWA=True, NTB=8, OCC_A=2),
    dict(XS=True, OCC_A=2, LT=False),
    dict(XS=True, NTB=4, OCC_A=2),
    dict(XS=True),
    dict(XS=True, DWA=True, NTB=8, OCC_A=2, LT=False),
    dict(XS=True, DWA=True, NTB=2, OCC_A=2),
    dict(XT=True, NTB=4, OCC_A=2),
]


def tag(over):
    return " ".join(f"{k}{v}" for k, v in over.items()) or "default"


def cfg_of(over, shape, rep):
    from tilekernels.gdn import cutile_pre_gated_bwd as cb
    base = cb.PreGatedBwdCfg.heuristic(shape["Hk"], shape["Hv"], shape["dk"], shape["dv"], shape["W"], rep)
    return dataclasses.replace(base, **{**S6, **over})


def check(k):
    import test_gdn_cutile_pre_gated_bwd as tb
    over = VARIANTS[k]
    small = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    for shape, layout, rep in [(tb.QWEN, (2, 70), True), (tb.QWEN, tb.THD_LENGTHS + [300], True),
                               (small, tb.THD_LENGTHS, False)]:
        t = time.time()
        tb.check_bwd(shape, layout, rep, cfg=cfg_of(over, shape, rep))
        print(f"ok {tag(over)} {shape['Hk']}x{shape['Hv']} {layout if isinstance(layout, tuple) else 'thd'} rep={rep}"
              f" {time.time() - t:.1f} s", flush=True)
    print("CHECK PASSED", flush=True)


def timing(ks, out):
    import torch
    import gdn_pre_check as gc
    from gdn_pre_bwd_time import call, grads_for
    from tilekernels.gdn import cutile_pre_gated_bwd as cb
    from tilekernels.gdn import reference as ref
    from tilekernels.testing import rel_err
    S = gc.SHAPE
    prob = gc.problem(False)
    x, w, A, dt, cu = prob
    grads = grads_for(x, True)
    want = ref.pre_gated_bwd(*grads, x, w, A, dt, cu, Hk=S["Hk"], dk=S["dk"], dv=S["dv"], repeat_qk=True)
    nb = gc.bwd_bytes(True)
    ideal = nb / (gc.COPY_TBS * 1e12) * 1e3
    recs = []
    for k in ks:
        over = VARIANTS[k]
        cfg = cfg_of(over, S, True)
        outs = [torch.full_like(t, float("nan")) for t in (x, w, A, dt)]
        fn = call(grads, prob, True, outs, cfg)
        fn()
        errs = [rel_err(o, r) for o, r in zip(outs, want)]
        r = dict(k=k, variant=tag(over), ms=gc.bench(fn), errs=errs, launches=[])
        for ln in cb.bwd_launches(*grads, x, w, A, dt, cu, *outs, S["Hk"], S["dk"], S["dv"], True, 1e-6, cfg=cfg):
            if ln.grid[0] > 1:
                r["launches"].append((ln.kernel._pyfunc.__name__, ln.grid[:2], gc.bench(ln.run)))
        r["pct_ideal"] = 100 * ideal / r["ms"]
        recs.append(r)
        print(f"{k} {r['variant']:<36}{r['ms']:8.3f} ms {r['pct_ideal']:5.1f}%  "
              + " ".join(f"{n[12:]}={ms:.3f}" for n, _, ms in r["launches"])
              + "  errs " + " ".join(f"{e:.1e}" for e in errs), flush=True)
        with open(os.path.join(out, "time.json"), "w") as f:
            json.dump(recs, f, indent=1, default=str)


def ncu_target(k):
    """The backward of variant k once (ncu profiles its dpre main launch)."""
    import torch
    import gdn_pre_check as gc
    from gdn_pre_bwd_time import call, grads_for
    prob = gc.problem(False)
    x, w, A, dt, cu = prob
    outs = [torch.empty_like(t) for t in (x, w, A, dt)]
    call(grads_for(x, True), prob, True, outs, cfg_of(VARIANTS[k], gc.SHAPE, True))()
    torch.cuda.synchronize()


def child(args, log, limit):
    cmd = ["timeout", str(limit), sys.executable, os.path.abspath(__file__), *args]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--variants", default=",".join(str(k) for k in range(len(VARIANTS))))
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--check-s", type=int, default=110)
    ap.add_argument("--time-s", type=int, default=60)
    ap.add_argument("--ncu-s", type=int, default=40)
    ap.add_argument("--check", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--time", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ncu-target", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.check is not None:
        return check(a.check)
    if a.time is not None:
        return timing([int(k) for k in a.time.split(",")], a.out)
    if a.ncu_target is not None:
        return ncu_target(a.ncu_target)
    os.makedirs(a.out, exist_ok=True)
    ks = [int(k) for k in a.variants.split(",")]
    ps = {k: child(["--check", str(k)], os.path.join(a.out, f"var_{k}.log"), a.check_s) for k in ks}
    ok = []
    for k, p in ps.items():
        p.wait()
        txt = open(os.path.join(a.out, f"var_{k}.log")).read()
        passed = "CHECK PASSED" in txt
        ok += [k] * passed
        tail = "" if passed else txt.strip().splitlines()[-1:] if txt.strip() else "no output"
        print(f"check {k} {tag(VARIANTS[k])}: rc={p.returncode} {'PASSED' if passed else 'FAILED'} "
              f"at {time.time() - T0:.0f} s {str(tail)[:300]}", flush=True)
    if not ok:
        return 1
    p = child(["--time", ",".join(map(str, ok)), "--out", a.out], os.path.join(a.out, "time.log"), a.time_s)
    p.wait()
    print(f"time: rc={p.returncode} at {time.time() - T0:.0f} s", flush=True)
    recs = []
    if os.path.exists(os.path.join(a.out, "time.json")):
        recs = json.load(open(os.path.join(a.out, "time.json")))
    if a.ncu and recs:
        best = min(recs, key=lambda r: r["ms"])["k"]
        for k in dict.fromkeys([0, best]):
            log = os.path.join(a.out, f"ncu_{k}.txt")
            cmd = ["timeout", str(a.ncu_s), "ncu", "--clock-control", "none", "--kernel-name", "regex:gdn_pre_bwd_dpre",
                   "--launch-skip", "1", "--launch-count", "1", "--section", "SpeedOfLight", "--section", "Occupancy",
                   "--section", "LaunchStats", "--section", "SchedulerStats", "--section", "WarpStateStats",
                   "--section", "MemoryWorkloadAnalysis", "--metrics",
                   "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,smsp__inst_executed.sum",
                   sys.executable, os.path.abspath(__file__),
                   "--ncu-target", str(k)]
            rc = subprocess.run(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT).returncode
            print(f"ncu {k}: rc={rc} at {time.time() - T0:.0f} s", flush=True)
            keep = ("Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM)", "Registers", "Achieved Occ",
                    "Theoretical Occ", "Issue Slots", "Issued Warp", "No Eligible", "Warp Cycles Per Issued",
                    "Block Limit", "Threads", "Shared Memory Config", "Dynamic Shared", "Static Shared", "L1/TEX Hit",
                    "L2 Hit", "Mem Busy", "Max Bandwidth", "Waves")
            for ln in open(log).read().splitlines():
                if any(s in ln for s in keep) or ("stalled" in ln and not ln.strip().endswith(" 0"))\
                        or "inst_executed" in ln:
                    print(f"  ncu{k} {ln.strip()[:110]}", flush=True)
    print("\n== table (BSHD B=4 x T=8192, repeat_qk, bf16; ideal 0.632 ms) ==", flush=True)
    for r in recs:
        print(f"{r['k']} {r['variant']:<36}{r['ms']:8.3f} ms {r['pct_ideal']:5.1f}%  "
              + " ".join(f"{n[12:]}={ms:.3f}" for n, _, ms in r["launches"])
              + "  errs " + " ".join(f"{e:.1e}" for e in r["errs"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
