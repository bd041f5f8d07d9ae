#!/usr/bin/env python3
"""Device host: time the CuTe DSL gdn_pre_gated forward (tilekernels/gdn/cute_pre_gated.py) beside
FLA + torch, in the four cases of benchmarks/gdn_pre_check.py (Qwen3-Next Hk=16, Hv=32, dk=dv=128,
W=4, bf16, 32768 tokens: BSHD B=4 x T=8192 and THD one 16384-token sequence plus short ones, its
fixed seed; repeat_qk on and off).

    python3 benchmarks/probes/gdn_cute_pre.py --out "$OUT" [--wait FILE] [--no-fla] [--variants default,S6]

Every launch is compiled first (CPU work: it may overlap a test run; --wait FILE then waits for
that run's mark so the timings start on a quiet GPU). Rows, each checked first against the torch
backend in fp32 (rel. error at the bf16 tolerance): "cute" = the registry call (backend="cute":
the heuristic's config, its host path and THD's start-mask allocation included), then the
launch-config variants of VARIANTS as prebuilt launches (cases bshd-rep and thd-rep only, and the
default config the same way, for a like-for-like comparison), then FLA's causal_conv1d + l2norm +
torch glue (fla-core 0.6.0 on PYTHONPATH). triton do_bench medians; % of the 4.27 TB/s copy
ceiling on gdn_pre_check's hand-counted bytes. Prints a table last; writes gdn_cute_pre.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

import gdn_pre_check as pc  # noqa: E402
from _gpu import bench, device_env, log_error, wait_for  # noqa: E402

import registry  # noqa: E402
from tilekernels.gdn import cute_pre_gated as cp  # noqa: E402
from tilekernels.testing import rel_err, tolerance  # noqa: E402

VARIANTS = {"default": {}, "REG": dict(CA=False), "REG-U8": dict(CA=False, U=8), "S3": dict(S=3), "S6": dict(S=6),
            "U2-S8": dict(U=2, S=8), "U8-S3": dict(U=8, S=3), "L16": dict(L=16), "T256": dict(THREADS=256)}
CASES = [(False, True), (False, False), (True, True), (True, False)]
RECORDS: list = []
ERRORS: list = []


def case_name(thd, rep):
    return f"{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}"


def rec(case, impl, ms, nb, **kw):
    tbs = nb / (ms * 1e-3) / 1e12
    r = dict(case=case, impl=impl, ms=ms, bytes=nb, tbs=tbs, pct_copy=100 * tbs / pc.COPY_TBS, **kw)
    RECORDS.append(r)
    print(f"{case:<12}{impl:<22}{ms:>8.3f}{tbs:>7.2f}{r['pct_copy']:>7.1f}  {kw.get('err', '')}", flush=True)


def outs_for(x, cu, rep):
    S = pc.SHAPE
    lead = x.shape[:-1]
    Hq = S["Hv"] if rep else S["Hk"]
    e = torch.empty
    return (e(*lead, Hq, S["dk"], dtype=x.dtype, device="cuda"), e(*lead, Hq, S["dk"], dtype=x.dtype, device="cuda"),
            e(*lead, S["Hv"], S["dv"], dtype=x.dtype, device="cuda"), e(*lead, S["Hv"], S["dv"], dtype=x.dtype,
                                                                          device="cuda"),
            e(*lead, S["Hv"], dtype=torch.float32, device="cuda"), e(*lead, S["Hv"], dtype=x.dtype, device="cuda"))


def dump(out, t0):
    json.dump(dict(env=device_env(), records=RECORDS, errors=ERRORS, seconds=time.time() - t0),
              open(os.path.join(out, "gdn_cute_pre.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--wait", default=None)
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="names of VARIANTS to time (comma-separated)")
    a = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    S = pc.SHAPE
    probs = {thd: pc.problem(thd) for thd in (False, True)}
    op = registry.get("gdn_pre_gated")
    # ---- every launch built and compiled before the GPU is quiet
    jobs = []
    for thd, rep in CASES:
        x, w, A, dt, cu = probs[thd]
        outs = outs_for(x, cu, rep)
        for name, over in VARIANTS.items():
            if (over and not rep) or name not in a.variants.split(","):
                continue
            base = cp.PreCfg.heuristic(S["Hk"], S["Hv"], S["dk"], S["dv"], S["W"], rep, thd, False, 2, 16)
            try:
                cfg = dataclasses.replace(base, **over)
                lns = cp.fwd_launches(x, w, A, dt, cu, *outs, None, S["Hk"], S["dk"], S["dv"], rep, 1e-6, cfg=cfg)
                for ln in lns:
                    ln.launch._executor(0)  # compiled and loaded (CPU work; the GPU stays free)
                jobs.append((thd, rep, name, lns, outs))
            except Exception:
                log_error(ERRORS, f"build {case_name(thd, rep)} {name}")
    print(f"compiled {len(jobs)} launch sets in {time.time() - t0:.0f} s", flush=True)
    wait_for(a.wait, 150)
    print(f"{'case':<12}{'impl':<22}{'ms':>8}{'TB/s':>7}{'%copy':>7}", flush=True)
    for thd, rep in CASES:
        case = case_name(thd, rep)
        x, w, A, dt, cu = probs[thd]
        p = dict(Hk=S["Hk"], dk=S["dk"], dv=S["dv"], repeat_qk=rep)
        nb = pc.fwd_bytes(rep)
        want = op(x.float(), w.float(), A, dt, cu_seqlens=cu, backend="torch", **p)
        try:
            got = op(x, w, A, dt, cu_seqlens=cu, backend="cute", **p)
            err = max(rel_err(o, r) for o, r in zip(got, want))
            del got
            rec(case, "cute (registry)", bench(lambda: op(x, w, A, dt, cu_seqlens=cu, backend="cute", **p)), nb,
                err=f"rel err vs torch fp32 {err:.2e} ok={err <= tolerance(torch.bfloat16)}",
                ok=err <= tolerance(torch.bfloat16))
        except Exception:
            log_error(ERRORS, f"{case} cute registry")
        for jt, jr, name, lns, outs in jobs:
            if (jt, jr) != (thd, rep):
                continue
            try:
                for o in outs:
                    o.fill_(float("nan"))
                for ln in lns:
                    ln.run()
                err = max(rel_err(o, r) for o, r in zip(outs, want))

                def run(lns=lns):
                    for ln in lns:
                        ln.run()
                rec(case, f"cute {name}", bench(run), nb, cfg=str(lns[-1].cfg),
                    err=f"rel err {err:.2e} ok={err <= tolerance(torch.bfloat16)}", ok=err <= tolerance(torch.bfloat16))
            except Exception:
                log_error(ERRORS, f"{case} cute {name}")
        del want
        dump(a.out, t0)
    for thd, rep in ([] if a.no_fla else CASES):  # the peer last (its Triton compiles and autotuning)
        case = case_name(thd, rep)
        x, w, A, dt, cu = probs[thd]
        try:
            rec(case, "fla+torch", bench(lambda: pc.fla_prep(x, w, A, dt, cu, rep)), pc.fwd_bytes(rep))
        except Exception:
            log_error(ERRORS, f"{case} fla")
        dump(a.out, t0)
    env = device_env()
    print(f"\n{env}\nTABLE (ms / % of copy)")
    for r in RECORDS:
        print(f"{r['case']:<12}{r['impl']:<22}{r['ms']:>8.3f}{r['pct_copy']:>7.1f}  ok={r.get('ok', '-')}")
    print(f"errors: {len(ERRORS)}")


if __name__ == "__main__":
    main()
