#!/usr/bin/env python3
"""Device host: the CuTe DSL gdn_pre_gated backward (tilekernels/gdn/cute_pre_gated_bwd.py; written without a
GPU, never run before this probe): its GPU tests, then its timing beside the cuTile backward where cuTile is
installed too. From the repository root, with the CuTe DSL bundle sourced (``source .gpu-cute/env.sh``):

    python3 benchmarks/probes/gdn_cute_pre_bwd.py --out "$OUT" [--tests 180 [--jobs 6]] [--memcheck] [--variants all]

Order (a kernel that never ran may hang or fault, and a fault stops the CUDA context):
  1. --tests S: ``pytest tests/gdn/test_gdn_cute_pre_gated_bwd.py -m gpu`` in a child process under
     ``timeout S`` (its log: tests.log); --memcheck: compute-sanitizer memcheck on a few small ones beside it.
  2. smoke: one small THD call in a child process under a 90 s timeout; the timings run only if it returns
     (or with --force).
  3. timings (triton do_bench median, ms) in the four cases of benchmarks/gdn_pre_check.py (Qwen3-Next
     Hk=16, Hv=32, dk=dv=128, W=4, bf16, 32768 tokens, BSHD B=4 x T=8192 / THD one 16384-token sequence
     plus short ones; repeat_qk on / off): each result first checked against the torch reference (fp32 math;
     rel. errors of dmixed, dconv_weight, dA_log, ddt_bias at 1e-2 / 1e-2 / 1e-5 / 1e-5), then the whole
     call, each launch alone (main, reduction), the cuTile backward's default where ``cuda.tile`` imports,
     and (cases bshd-rep and thd-rep) the launch-config variants of VARIANTS as prebuilt launches.
"% ideal": issue 12's ideal traffic (gdn_pre_check.bwd_bytes: 82,368 B a token with repeat_qk) at 4.27 TB/s
over the measured time (the bar: 80%, 0.79 ms with repeat_qk); "kernel B/tok": the bytes this kernel moves
(cute_pre_gated_bwd's doc: ~77,600 with repeat_qk at L=128). Prints a table last; writes gdn_cute_pre_bwd.json.
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
sys.path[:0] = [ROOT, os.path.dirname(HERE)]

import torch  # noqa: E402

import gdn_pre_check as gc  # noqa: E402  (the problem builders, bytes and timer)
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import rel_err  # noqa: E402

T0 = time.time()
TEST = "tests/gdn/test_gdn_cute_pre_gated_bwd.py"
MEMCHECK_K = ("(test_bwd_matches_float64_reference and Hk2-Hv4-dk64-dv32-W3 and not norep and (thd0 or bshd3x5)) or "
              "(test_bwd_bshd_start_variants and bshd3x301) or test_bwd_many_sequences or test_registry_autograd")
# over the heuristic's config (MINB 3 where it fits: variants with more registers a CTA ask for none)
VARIANTS = {"REG": dict(CA=False, MINB=0), "U4-S3": dict(U=4, S=3), "S6": dict(S=6), "U1-S8": dict(U=1, S=8),
            "L64": dict(L=64), "L256": dict(L=256), "T64": dict(THREADS=64), "T256": dict(THREADS=256, MINB=0),
            "VEC4": dict(VEC=4), "VEC4-U4": dict(VEC=4, U=4), "VEC4-REG": dict(VEC=4, CA=False),
            "MINB0": dict(MINB=0), "MINB4": dict(MINB=4),  # MINB: no bound / a register cap for 4 CTAs an SM
            "S6-T64": dict(S=6, THREADS=64), "L64-S6": dict(L=64, S=6), "VEC4-S6": dict(VEC=4, S=6),
            # the partials' reduction (session 55; its own launch timed too): row groups, 16-byte column loads, unroll;
            # the default since session 57 is RG 32, RV 4, RU 8 (RG8-RV1-RU4 the first default)
            "RG16": dict(RG=16), "RV4": dict(RV=4), "RV1": dict(RV=1), "RG32-RV4-RU8": dict(RG=32, RV=4, RU=8),
            "RG8-RV1-RU4": dict(RG=8, RV=1, RU=4)}
RED_FIELDS = {"RG", "RV", "RU"}
CASES = [(False, True), (False, False), (True, True), (True, False)]  # (thd, repeat_qk)
OUT: dict = {"records": [], "errors": [], "tests": {}}


def grads_for(x, repeat_qk):
    S = gc.SHAPE
    lead = x.shape[:-1]
    Hq = S["Hv"] if repeat_qk else S["Hk"]
    shapes = [(Hq, S["dk"]), (Hq, S["dk"]), (S["Hv"], S["dv"]), (S["Hv"], S["dv"]), (S["Hv"],), (S["Hv"],)]
    return [torch.randn(*lead, *s, device=x.device).to(torch.float32 if j == 4 else x.dtype)
            for j, s in enumerate(shapes)]


def kernel_bytes(cfg, NT: int) -> int:
    """Bytes the cute backward moves (its doc's count): grads and the q|k|v part of mixed read, dmixed written,
    the halo rows of every span read again, the partial rows written and read back."""
    e, Hk, Hv, dk, dv, W, R = cfg.ELT, cfg.Hk, cfg.Hv, cfg.dk, cfg.dv, cfg.W, cfg.R
    x_row, g_row = e * cfg.C, e * (2 * Hk * R * dk + Hv * dv)
    tok = x_row + g_row + e * Hv * dv + 4 * Hv + e * Hv + e * 2 * Hv + e * cfg.D
    P = -(-NT // cfg.L)
    return NT * tok + P * (W - 1) * (2 * x_row + g_row) + 2 * P * 4 * cfg.NCOL


def record(case, impl, ms, nbytes, kbytes=None, note=""):
    ideal_ms = nbytes / (gc.COPY_TBS * 1e12) * 1e3
    r = dict(case=case, impl=impl, ms=ms, bytes=nbytes, pct_ideal=100 * ideal_ms / ms, kernel_bytes=kbytes,
             note=note)
    OUT["records"].append(r)
    kb = f"{kbytes / gc.TOKENS:>8.0f}" if kbytes else " " * 8
    print(f"{case:<12}{impl:<28}{ms:>9.3f} ms {r['pct_ideal']:>6.1f}% {kb}  {note}", flush=True)


def time_case(thd, repeat_qk, variants):
    from tilekernels.gdn import cute_pre_gated_bwd as cb

    case = f"{'thd' if thd else 'bshd'}-{'rep' if repeat_qk else 'norep'}"
    x, w, A, dt, cu = gc.problem(thd)
    grads = grads_for(x, repeat_qk)
    S = gc.SHAPE
    p = (S["Hk"], S["dk"], S["dv"], repeat_qk, 1e-6)
    want = ref.pre_gated_bwd(*grads, x, w, A, dt, cu, Hk=S["Hk"], dk=S["dk"], dv=S["dv"], repeat_qk=repeat_qk)
    nb = gc.bwd_bytes(repeat_qk)
    outs = [torch.full_like(t, float("nan")) for t in (x, w, A, dt)]
    base = cb.BwdCfg.heuristic(S["Hk"], S["Hv"], S["dk"], S["dv"], S["W"], repeat_qk, thd)
    jobs = [("cute default", None, {})] + [(f"cute {k}", dataclasses.replace(base, **o), o)
                                           for k, o in variants.items()]
    for tag, cfg, over in jobs:
        if time.time() - T0 > LIMIT_S:
            OUT["errors"].append(f"{case} {tag}: skipped (time)")
            continue
        try:
            lns = cb.bwd_launches(*grads, x, w, A, dt, cu, *outs, *p, cfg=cfg)

            def fn(lns=lns):
                for ln in lns:
                    ln.run()
            for o in outs:
                o.fill_(float("nan"))
            fn()
            errs = [rel_err(o, r) for o, r in zip(outs, want)]
            ok = errs[0] <= 1e-2 and errs[1] <= 1e-2 and errs[2] <= 1e-5 and errs[3] <= 1e-5
            first = [o.clone() for o in outs]
            fn()
            det = all(torch.equal(a, b) for a, b in zip(first, outs))
            kb = kernel_bytes(lns[0].cfg, gc.TOKENS)
            note = "errs " + " ".join(f"{e:.1e}" for e in errs) + f" ok={ok} det={det}"
            record(case, tag, gc.bench(fn), nb, kb, note)
            if over and set(over) <= RED_FIELDS:
                record(case, f"  {tag} [1] reduction", gc.bench(lns[1].run), nb)
            if cfg is None:
                record(case, "  cute [0] main", gc.bench(lns[0].run), nb)
                record(case, "  cute [1] reduction", gc.bench(lns[1].run), nb)
                call = lambda: cb.pre_gated_bwd_into(*grads, x, w, A, dt, cu, *outs, *p)  # noqa: E731
                record(case, "cute (host path)", gc.bench(call), nb)
                time_registry(case, x, w, A, dt, cu, repeat_qk)
        except Exception:
            OUT["errors"].append(f"{case} {tag}: {traceback.format_exc(limit=6)}")
            print("ERROR", OUT["errors"][-1], flush=True)
    try:
        from tilekernels.gdn import cutile_pre_gated_bwd as cub
    except ImportError:
        cub = None
    if cub is not None:
        try:
            call = lambda: cub.pre_gated_bwd_into(*grads, x, w, A, dt, cu, *outs, *p, False)  # noqa: E731
            call()
            errs = [rel_err(o, r) for o, r in zip(outs, want)]
            record(case, "cutile default", gc.bench(call), nb, None, "errs " + " ".join(f"{e:.1e}" for e in errs))
        except Exception:
            OUT["errors"].append(f"{case} cutile: {traceback.format_exc(limit=6)}")


def time_registry(case, x, w, A, dt, cu, repeat_qk):
    """registry.get("gdn_pre_gated") with backend "cute": the forward alone, and fwd + autograd bwd (each step
    sets the leaves' grads to None and backpropagates the same pre-made grad outputs)."""
    import registry

    op = registry.get("gdn_pre_gated")
    S = gc.SHAPE
    p = dict(Hk=S["Hk"], dk=S["dk"], dv=S["dv"], repeat_qk=repeat_qk)
    leaves = [t.clone().requires_grad_() for t in (x, w, A, dt)]
    gouts = [torch.randn(o.shape, device=x.device).to(o.dtype) for o in op(x, w, A, dt, cu_seqlens=cu, **p)]

    def step():
        for t in leaves:
            t.grad = None
        torch.autograd.backward(op(*leaves, cu_seqlens=cu, backend="cute", **p), gouts)
    nf = gc.fwd_bytes(repeat_qk)
    record(case, "registry fwd (cute)", gc.bench(lambda: op(x, w, A, dt, cu_seqlens=cu, backend="cute", **p)), nf)
    record(case, "registry fwd+bwd (cute)", gc.bench(step), nf + gc.bwd_bytes(repeat_qk))


def smoke() -> None:
    """One small THD call (child process): returns, or hangs / faults here rather than in the timings."""
    from tilekernels.gdn import bench as mk
    from tilekernels.gdn import cute_pre_gated_bwd as cb

    h = (2, 4, 64, 32)
    w, A, dt = mk.weights(*h, 3, device="cuda")
    cu = mk.cu_seqlens([0, 1, 3, 4, 7, 0, 130, 2, 5], device="cuda")
    x = mk.mixed((152,), *h, device="cuda")
    grads = grads_for_shape(x, h, True)
    outs = [torch.full_like(t, float("nan")) for t in (x, w, A, dt)]
    cb.pre_gated_bwd_into(*grads, x, w, A, dt, cu, *outs, 2, 64, 32, True, 1e-6)
    torch.cuda.synchronize()
    want = ref.pre_gated_bwd(*[g.double() for g in grads], x.double(), w.double(), A.double(), dt.double(), cu, Hk=2,
                             dk=64, dv=32, repeat_qk=True)
    print("smoke errs", [f"{rel_err(o, r):.1e}" for o, r in zip(outs, want)], flush=True)


def grads_for_shape(x, h, repeat_qk):
    Hk, Hv, dk, dv = h
    lead = x.shape[:-1]
    Hq = Hv if repeat_qk else Hk
    shapes = [(Hq, dk), (Hq, dk), (Hv, dv), (Hv, dv), (Hv,), (Hv,)]
    return [torch.randn(*lead, *s, device=x.device).to(torch.float32 if j == 4 else x.dtype)
            for j, s in enumerate(shapes)]


def run_tests(out, tests_s, memcheck, jobs):
    ps = []
    par = ["-n", str(jobs)] if jobs > 1 else []
    log = open(os.path.join(out, "tests.log"), "w")
    ps.append(("tests", subprocess.Popen(["timeout", str(tests_s), sys.executable, "-m", "pytest", "-q", "-p",
                                          "no:cacheprovider", TEST, "-m", "gpu", *par], stdout=log,
                                         stderr=subprocess.STDOUT, cwd=ROOT)))
    if memcheck:
        mlog = open(os.path.join(out, "memcheck.log"), "w")
        ps.append(("memcheck", subprocess.Popen(["timeout", str(tests_s), "compute-sanitizer", "--tool", "memcheck",
                                                 "--report-api-errors", "no",
                                                 sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST,
                                                 "-m", "gpu", "-k", MEMCHECK_K], stdout=mlog,
                                                stderr=subprocess.STDOUT, cwd=ROOT)))
    for name, p in ps:
        p.wait()
        lines = open(os.path.join(out, f"{name}.log")).read().splitlines()
        OUT["tests"][name] = dict(rc=p.returncode, tail=lines[-25:])
        print(f"{name}: rc={p.returncode} at {time.time() - T0:.0f} s", flush=True)
        for ln in lines:
            if ln.startswith(("FAILED", "ERROR")) or "SUMMARY" in ln or " passed" in ln or " failed" in ln:
                print("  " + ln[:300], flush=True)


LIMIT_S = 400


def main():
    global LIMIT_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tests", type=int, default=0, help="run the GPU tests first, under this many seconds")
    ap.add_argument("--memcheck", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="pytest-xdist workers for --tests (1: no -n)")
    ap.add_argument("--variants", default="", help="comma-separated names of VARIANTS, or 'all'")
    ap.add_argument("--cases", default="all", help="comma-separated of bshd-rep,bshd-norep,thd-rep,thd-norep")
    ap.add_argument("--force", action="store_true", help="time even if the smoke call did not return")
    ap.add_argument("--limit-s", type=int, default=400)
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke:
        smoke()
        return
    LIMIT_S = a.limit_s
    os.makedirs(a.out, exist_ok=True)
    if a.tests:
        run_tests(a.out, a.tests, a.memcheck, a.jobs)
    sm = subprocess.run(["timeout", "90", sys.executable, os.path.abspath(__file__), "--smoke"], cwd=ROOT,
                        capture_output=True, text=True)
    print(f"smoke: rc={sm.returncode}", (sm.stdout + sm.stderr)[-1500:], flush=True)
    OUT["smoke"] = dict(rc=sm.returncode, tail=(sm.stdout + sm.stderr)[-3000:])
    names = list(VARIANTS) if a.variants == "all" else [v for v in a.variants.split(",") if v]
    try:
        if sm.returncode == 0 or a.force:
            for thd, rep in CASES:
                case = f"{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}"
                if a.cases != "all" and case not in a.cases.split(","):
                    continue
                time_case(thd, rep, {k: VARIANTS[k] for k in names} if rep else {})
                torch.cuda.empty_cache()  # the case's tensors went with time_case's frame
    finally:
        OUT["seconds"] = time.time() - T0
        json.dump(OUT, open(os.path.join(a.out, "gdn_cute_pre_bwd.json"), "w"), indent=1)
    print(f"\n{'case':<12}{'impl':<28}{'ms':>9}    {'% ideal':>7} {'B/tok':>8}  note")
    for r in OUT["records"]:
        kb = f"{r['kernel_bytes'] / gc.TOKENS:>8.0f}" if r["kernel_bytes"] else " " * 8
        print(f"{r['case']:<12}{r['impl']:<28}{r['ms']:>9.3f} ms {r['pct_ideal']:>6.1f}% {kb}  {r['note']}")
    for e in OUT["errors"]:
        print("ERROR", e.splitlines()[-1][:300])


if __name__ == "__main__":
    main()
