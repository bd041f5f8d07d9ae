#!/usr/bin/env python3
"""Device host: the gdn_pre_gated cuTile backward (tilekernels/gdn/cutile_pre_gated_bwd.py), each
launch alone and its config variants, with its GPU tests first. From the repository root:

    python3 benchmarks/probes/gdn_pre_bwd_time.py --out "$OUT" [--tests 4] [--sanitize] [--old] [--sweep]

(The first backward, timed beside this one in session 6: `git show 525096e:benchmarks/probes/gdn_pre_bwd_v0.py`.)

--tests P: the backward GPU tests (tests/gdn/test_gdn_cutile_pre_gated_bwd.py -m gpu, and the forward file's
registry autograd test, which runs the registered backward) under
pytest-xdist with P workers and a per-test thread timeout, beside processes that compile the timed
kernels at 64 tokens (cuTile's disk cache then serves the timing process); --sanitize:
compute-sanitizer memcheck, racecheck and initcheck on two small backward tests beside them. Timing
starts when those are done (nothing else on the GPU). --old: the first design's default (cutile_pre_gated_bwd's
PreGatedBwdCfg.heuristic; the default is the second design, cutile_pre_gated_bwd2, for W <= WMAX) timed beside
the default in every case, per launch too. Variants new to the kernel are first run by
gdn_pre_bwd_var.py (a child process each, under a limit).

Cases (benchmarks/gdn_pre_check.py's problems: Qwen3-Next Hk=16, Hv=32, dk=dv=128, W=4, bf16,
32768 tokens, BSHD B=4 x T=8192 and THD one 16384-token sequence plus many short ones), repeat_qk
on and off: each impl's result is checked against the torch reference in fp32 (rel. errors of
dmixed, dconv_weight, dA_log, ddt_bias), then timed (triton do_bench median, ms); new: each launch
timed alone too. Ideal bytes by hand (gdn_pre_check.bwd_bytes: the six output grads and mixed
read, dmixed written; 82,368 B a token with repeat_qk); "% ideal" = ideal bytes at 4.27 TB/s over
the measured time. --sweep: PreGatedBwd2Cfg variants (SWEEP) on BSHD repeat_qk. Prints a table last;
writes gdn_pre_bwd_time.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.dirname(HERE), HERE]

import torch  # noqa: E402




import gdn_pre_check as gc  # noqa: E402  (the problem builders and bytes)
from tilekernels.gdn import cutile_pre_gated_bwd as cb  # noqa: E402
from tilekernels.gdn import cutile_pre_gated_bwd2 as c2  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import rel_err  # noqa: E402

T0 = time.time()
TESTS = ["tests/gdn/test_gdn_cutile_pre_gated_bwd.py", "tests/gdn/test_gdn_cutile_pre_gated.py::"
         "test_registry_autograd_matches_torch_backend"]
# --old: the first design's default (PreGatedBwdCfg.heuristic: XS DWA NTB4 OCC_A2), timed beside the default
OLD = {}
# session 8: over the second design's default (PreGatedBwd2Cfg.heuristic: dpre TT32 OCC4; dx + partials TB8
# NTX32 LB; session 7's sweep of the first design: git show 485227c:<this file>)
SWEEP = [dict(LB=False), dict(NTX=64), dict(SPLIT=True, NTX=32)]
SAN = ["tests/gdn/test_gdn_cutile_pre_gated_bwd.py", "-m", "gpu", "-k",
       "test_bwd_matches_float64_reference and Hk2-Hv4-dk64-dv32-W3-rep and (thd-mixed or bshd-2x70)"]
TOOLS = ("memcheck", "racecheck", "initcheck")
OUT: dict = {"records": [], "errors": []}


def grads_for(x, repeat_qk):
    lead = x.shape[:-1]
    S = gc.SHAPE
    Hq = S["Hv"] if repeat_qk else S["Hk"]
    shapes = [(Hq, S["dk"]), (Hq, S["dk"]), (S["Hv"], S["dv"]), (S["Hv"], S["dv"]), (S["Hv"],), (S["Hv"],)]
    return [torch.randn(*lead, *s, device=x.device).to(torch.float32 if j == 4 else x.dtype)
            for j, s in enumerate(shapes)]


def call(grads, prob, repeat_qk, outs, cfg=None):
    x, w, A, dt, cu = prob
    S = gc.SHAPE
    args = (*grads, x, w, A, dt, cu, *outs, S["Hk"], S["dk"], S["dv"], repeat_qk, 1e-6, False)
    return lambda: cb.pre_gated_bwd_into(*args, cfg=cfg)


def record(case, impl, ms, nbytes, note=""):
    ideal_ms = nbytes / (gc.COPY_TBS * 1e12) * 1e3
    r = dict(case=case, impl=impl, ms=ms, bytes=nbytes, pct_ideal=100 * ideal_ms / ms, note=note)
    OUT["records"].append(r)
    print(f"{case:<12}{impl:<34}{ms:>9.3f} ms {r['pct_ideal']:>6.1f}%  {note}", flush=True)


def time_case(thd, repeat_qk, sweep=False, old=False, default=True):
    case = f"{'thd' if thd else 'bshd'}-{'rep' if repeat_qk else 'norep'}"
    prob = gc.problem(thd)
    x, w, A, dt, cu = prob
    grads = grads_for(x, repeat_qk)
    S = gc.SHAPE
    want = ref.pre_gated_bwd(*grads, x, w, A, dt, cu, Hk=S["Hk"], dk=S["dk"], dv=S["dv"], repeat_qk=repeat_qk)
    nb = gc.bwd_bytes(repeat_qk)
    variants = [(None, "default")] if default else []
    base = cb.PreGatedBwdCfg.heuristic(S["Hk"], S["Hv"], S["dk"], S["dv"], S["W"], repeat_qk)
    base2 = c2.PreGatedBwd2Cfg.heuristic(S["Hk"], S["Hv"], S["dk"], S["dv"], S["W"], repeat_qk)
    if old:
        variants.append((dataclasses.replace(base, **OLD), "old (first design)"))
    if sweep:
        variants += [(dataclasses.replace(base2, **o), " ".join(f"{k}{v}" for k, v in o.items())) for o in SWEEP]
    for cfg, tag in variants:
        if time.time() - T0 > LIMIT_S:
            OUT["errors"].append(f"{case} {tag}: skipped (time)")
            continue
        try:
            outs = [torch.full_like(t, float("nan")) for t in (x, w, A, dt)]
            fn = call(grads, prob, repeat_qk, outs, cfg)
            fn()
            errs = [rel_err(o, r) for o, r in zip(outs, want)]
            ok = errs[0] <= 1e-2 and errs[1] <= 1e-2 and errs[2] <= 1e-5 and errs[3] <= 1e-5
            record(case, tag, gc.bench(fn), nb, "errs " + " ".join(f"{e:.1e}" for e in errs) + f" ok={ok}")
            # each launch alone (the sweep's variants: the dpre main and dx launches)
            for j, ln in enumerate(cb.bwd_launches(*grads, x, w, A, dt, cu, *outs, S["Hk"], S["dk"], S["dv"],
                                                   repeat_qk, 1e-6, cfg=cfg)):
                name = ln.kernel._pyfunc.__name__
                if all(g > 0 for g in ln.grid) and (cfg is None or tag.startswith("old") or name in (
                        "gdn_pre_bwd_dx", "gdn_pre_bwd2_dx", "gdn_pre_bwd2_dpre") and ln.grid[0] > 1):
                    record(case, f"  [{j}] {name} {ln.grid[:2]}", gc.bench(ln.run), nb)
        except Exception:
            OUT["errors"].append(f"{case} {tag}: {traceback.format_exc(limit=6)}")
            print("ERROR", OUT["errors"][-1], flush=True)
    del want, grads
    torch.cuda.empty_cache()


def warm(part, parts):
    """Compile the timed keys (and the sweep's, BSHD repeat_qk) at 64 tokens, slice part of parts."""
    gc.TOKENS = 64
    jobs = [(thd, rep, None) for thd in (False, True) for rep in (True, False)]
    base2 = c2.PreGatedBwd2Cfg.heuristic(16, 32, 128, 128, 4, True)
    jobs += [(thd, rep, dataclasses.replace(cb.PreGatedBwdCfg.heuristic(16, 32, 128, 128, 4, rep), **OLD))
             for thd in (False, True) for rep in (True, False)]
    jobs += [(False, True, dataclasses.replace(base2, **o)) for o in SWEEP]
    for k, (thd, rep, cfg) in enumerate(jobs):
        if k % parts == part:
            prob = gc.problem(thd)
            x, w, A, dt, cu = prob
            outs = [torch.empty_like(t) for t in (x, w, A, dt)]
            call(grads_for(x, rep), prob, rep, outs, cfg)()
    torch.cuda.synchronize()
    print(f"warm {part}/{parts} done {time.time() - T0:.0f} s", flush=True)


def run_tests(out, procs, sanitize, nwarm, tests_s, kexpr=""):
    ps = []
    for k in range(nwarm):
        log = open(os.path.join(out, "warm.log"), "a")
        ps.append(("warm", subprocess.Popen(["timeout", str(tests_s), sys.executable, os.path.abspath(__file__), "--warm",
                                             str(k), str(nwarm)],
                                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)))
    if sanitize:
        for tool in TOOLS:
            log = open(os.path.join(out, f"{tool}.log"), "w")
            ps.append((tool, subprocess.Popen(["timeout", str(tests_s), "compute-sanitizer", "--tool", tool,
                                               sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SAN],
                                              stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)))
    if procs:
        log = open(os.path.join(out, "tests.log"), "w")
        ps.append(("tests", subprocess.Popen(
            ["timeout", str(tests_s), sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", str(procs),
             "--timeout=240", "--timeout-method=thread", *TESTS, "-m", "gpu",
             *(["-k", kexpr] if kexpr else [])],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)))
    for name, p in ps:
        p.wait()
        print(f"{name}: rc={p.returncode} at {time.time() - T0:.0f} s", flush=True)
    if procs:
        lines = open(os.path.join(out, "tests.log")).read().splitlines()
        for ln in lines:
            if ln.startswith(("FAILED", "ERROR")) or "Timeout" in ln[:40]:
                print(ln[:400], flush=True)
        print("tests:", lines[-1:] if lines else "no output", flush=True)
    for tool in TOOLS if sanitize else ():
        txt = open(os.path.join(out, f"{tool}.log")).read().splitlines()
        print(tool, [ln for ln in txt if "SUMMARY" in ln or " passed" in ln or " failed" in ln][-3:], flush=True)


LIMIT_S = 185


def main():
    global LIMIT_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tests", type=int, default=0)
    ap.add_argument("--warm-procs", type=int, default=4)
    ap.add_argument("--tests-s", type=int, default=110)
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--kexpr", default="", help="pytest -k expression for the test pool")
    ap.add_argument("--old", action="store_true", help="time the session-6 default (OLD) beside the default")
    ap.add_argument("--limit-s", type=int, default=185)
    ap.add_argument("--warm", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.warm:
        return warm(*a.warm)
    LIMIT_S = a.limit_s
    os.makedirs(a.out, exist_ok=True)
    run_tests(a.out, a.tests, a.sanitize, a.warm_procs, a.tests_s, a.kexpr)
    print(f"{'case':<12}{'impl':<34}{'ms':>9}    {'% ideal at 4.27 TB/s':>6}", flush=True)
    # repeat_qk first (the headline), then without, then the sweep (BSHD repeat_qk): what runs out of time is last
    for thd, rep, sweep in [(False, True, False), (True, True, False), (False, False, False), (True, False, False),
                            (False, True, True)][:5 if a.sweep else 4]:
        time_case(thd, rep, sweep=sweep, old=a.old and not sweep, default=not sweep)
        with open(os.path.join(a.out, "gdn_pre_bwd_time.json"), "w") as f:
            json.dump(OUT, f, indent=1, default=str)
    print("\n== summary ==", flush=True)
    for r in OUT["records"]:
        if not r["impl"].startswith("  "):
            print(f"{r['case']:<11}{r['impl']:<30}{r['ms']:>8.3f} ms {r['pct_ideal']:>6.1f}% ideal  {r['note']}", flush=True)
    print("errors:", len(OUT["errors"]), [e[:200] for e in OUT["errors"]], flush=True)


if __name__ == "__main__":
    sys.exit(main())
