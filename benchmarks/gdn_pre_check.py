#!/usr/bin/env python3
"""GPU check and timing of the cuTile gdn_pre_gated kernels beside their peers (run on the device host).

From the repository root, on the GPU host (triton, fla are imported lazily: they exist only there):

    python3 benchmarks/gdn_pre_check.py --out "$OUT" [--tests 8] [--memcheck] [--no-compile-peer]

--tests P first runs tests/gdn/test_gdn_cutile_pre_gated.py (GPU and CPU tests) split into P
pytest processes at once (the kernels' JIT compiles dominate; cuTile's disk cache shares them),
logs in $OUT/tests_*.log; --memcheck runs a few forward tests under compute-sanitizer memcheck
and racecheck beside them ($OUT/memcheck.log, racecheck.log).

Timings (Qwen3-Next: Hk=16, Hv=32, dk=dv=128, W=4, bf16, 32768 tokens): BSHD B=4, T=8192 and
THD with one sequence of 16384 tokens plus many short ones (1..256 tokens, fixed seed) adding up
to the same total, repeat_qk on and off. --sweep first times forward launch-config variants
(FWD_SWEEP, each checked against the reference; a W=1 row: the same launches without taps).
Per case, triton's do_bench median (ms) of: ours (registry, backend="cutile"), torch eager
(backend="torch"; --no-eager), torch.compile of
reference.pre_gated (repeat_qk on only; compiles cost device time), and FLA's Triton
causal_conv1d (SiLU fused) + l2norm + torch glue for the rest (the issue's peer; the package
fla-core 0.6.0 on PYTHONPATH, outside the project's dependencies). Ours is first checked against
the torch backend in fp32 (rel. error at the bf16 tolerance).

Ideal bytes, by hand, per token (bf16 = 2 bytes): forward reads mixed once (D = 12352 -> 24704 B)
and writes q, k (2 * Hq * dk * 2: 16384 B with repeat_qk, Hq = Hv = 32; 8192 B without, Hq = Hk),
v, z (2 * Hv * dv * 2 = 16384 B), g (fp32, 128 B), beta (64 B): 57664 B with repeat, 49472 B
without (1.89 / 1.62 GB at 32768 tokens; the weights, ~66 KB, are noise). Backward reads the
six output grads (the forward's output bytes) and mixed, and writes dmixed: 82368 B a token with
repeat_qk (2.70 GB). %-of-copy is against 4.27 TB/s (H200 device-to-device copy).
Prints a table last; writes gdn_pre_check.json to --out.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

import torch  # noqa: E402


from _gpu import bench as _bench  # noqa: E402

import registry  # noqa: E402
from tilekernels.gdn import bench as mk  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import rel_err, tolerance  # noqa: E402

SHAPE = dict(Hk=16, Hv=32, dk=128, dv=128, W=4)
TOKENS = 4 * 8192
COPY_TBS = 4.27
TEST_FILE = "tests/gdn/test_gdn_cutile_pre_gated.py"
T_START = time.time()
COMPILE_PEER_BEFORE_S = 200  # torch.compile of the reference (~a minute of compiling) only before this
RESULTS: dict = {"records": [], "errors": [], "env": {}, "tests": {}}


def fwd_bytes(repeat_qk: bool, n: int = TOKENS) -> int:
    Hk, Hv, dk, dv = SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"]
    Hq = Hv if repeat_qk else Hk
    return n * (2 * mk.d_model(Hk, Hv, dk, dv) + 2 * 2 * Hq * dk + 2 * 2 * Hv * dv + 4 * Hv + 2 * Hv)


def bwd_bytes(repeat_qk: bool, n: int = TOKENS) -> int:
    return fwd_bytes(repeat_qk, n) + n * 2 * mk.d_model(SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"])


def thd_lengths() -> list[int]:
    g = torch.Generator().manual_seed(12)
    out, left = [TOKENS // 2], TOKENS // 2
    while left > 0:
        n = min(left, int(torch.randint(1, 257, (1,), generator=g)))
        out.append(n)
        left -= n
    perm = torch.randperm(len(out), generator=g).tolist()
    return [out[i] for i in perm]




bench = functools.partial(_bench, rep=100)  # do_bench median ms


# ------------------------------------------------------------------ tests (parallel processes)


WARM_SWEEP_PROCS = 3  # --warm-procs
SANITIZER_S = 120  # each sanitizer process's limit (they run beside the test processes)
TEST_PROC_S = 150  # each test process's limit (rc 124: a hung or runaway test; the timings still run)


def warm_sweep_procs(out: str) -> list:
    """WARM_SWEEP_PROCS processes compiling the sweep's kernels (each under TEST_PROC_S: a hung variant
    costs its process, not the run): [(name, Popen, log)]."""
    ps = []
    for j in range(WARM_SWEEP_PROCS):
        wl = open(os.path.join(out, f"warm_sweep{j}.log"), "w")
        ps.append((f"warm-sweep{j}", subprocess.Popen(
            ["timeout", str(TEST_PROC_S), sys.executable, os.path.abspath(__file__), "--warm-sweep", str(j),
             "--warm-procs", str(WARM_SWEEP_PROCS), "--out", out], stdout=wl, stderr=subprocess.STDOUT, cwd=ROOT), wl))
    return ps


def run_tests(out: str, procs: int, memcheck: bool, sweep_too: bool = False, kexpr: str = "",
              hang: tuple = (), per_test_s: int = 0, bwd: bool = True) -> None:
    """The test file's GPU tests (-k kexpr) in ``procs`` processes, the compiles of the timed kernels
    (and of the sweep's), the sanitizers (memcheck) and the hang probe of configs ``hang``
    (benchmarks/probes/gdn_pre_fwd_hang.py: each in a child killed 8 s after a launch that does not
    finish; a hang stalls the other processes' kernels that long) at once; per_test_s: pytest-timeout's
    per-test limit (thread method: a hung kernel fails its test)."""
    kx = ["-k", kexpr] if kexpr else []
    tmo = ["-v", f"--timeout={per_test_s}", "--timeout-method=thread"] if per_test_s else []
    ids = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-m", "gpu", "-p", "no:cacheprovider",
                          *kx, TEST_FILE], capture_output=True, text=True, cwd=ROOT).stdout.split()
    ids = [i for i in ids if "::" in i]
    # tests that share a compile key (same test, shape, layout kind, switches) go to one process
    groups: dict = {}
    for i in ids:
        groups.setdefault(re.sub(r"(bshd|thd)-[^-\]]*", r"\1", i), []).append(i)
    chunks = [[] for _ in range(procs)]
    for g in sorted(groups.values(), key=len, reverse=True):
        min(chunks, key=len).extend(g)
    t0 = time.time()
    # the benchmark's own compile keys, warmed at a few tokens beside the tests (cuTile's disk cache)
    warm = open(os.path.join(out, "warm.log"), "w")
    ps = [("warm", subprocess.Popen(["timeout", str(TEST_PROC_S), sys.executable, os.path.abspath(__file__), "--warm",
                                     "--out", out, *([] if bwd else ["--no-bwd"])],
                                    stdout=warm, stderr=subprocess.STDOUT, cwd=ROOT), warm)]
    ps += warm_sweep_procs(out) if sweep_too else []
    if hang:
        hl = open(os.path.join(out, "hang.log"), "w")
        ps.append(("hang", subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "benchmarks", "probes", "gdn_pre_fwd_hang.py"), "--out", out,
             "--budget-s", str(TEST_PROC_S - 40), *hang],
            stdout=hl, stderr=subprocess.STDOUT, cwd=ROOT), hl))
    san = []
    if memcheck:  # memcheck and racecheck on a few forward tests, beside the test processes
        sel = [i for i in ids if "test_fwd_matches" in i and "rep-state" in i and
               (("Hk2-Hv4" in i and ("thd-mixed" in i or "bshd-2x70" in i)) or ("Hk16" in i and "thd-mixed" in i))]
        for tool in ("memcheck", "racecheck"):
            log = open(os.path.join(out, f"{tool}.log"), "w")
            cmd = ["timeout", str(min(SANITIZER_S, TEST_PROC_S)), "compute-sanitizer", "--tool", tool, sys.executable, "-m", "pytest",
                   "-q", "-p", "no:cacheprovider", *sel]
            ps.append((tool, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), log))
            san.append((tool, log.name))
    for k, ch in enumerate(chunks):
        if ch:
            log = open(os.path.join(out, f"tests_{k}.log"), "w")
            ps.append((k, subprocess.Popen(["timeout", str(TEST_PROC_S), sys.executable, "-m", "pytest", "-q",
                                            "-p", "no:cacheprovider", *tmo,
                                            *ch], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), log))
    summary = {}
    for k, p, log in ps:
        p.wait()
        log.close()
        lines = open(log.name).read().strip().splitlines()
        tail = lines[-1:]
        for ln in lines:  # failures into the run's own log (the per-process logs may not come back)
            if ln.startswith(("FAILED", "ERROR", "hang-probe")) or " Error" in ln[:80]:
                print(f"[{k}] {ln[:300]}", flush=True)
        summary[k] = dict(rc=p.returncode, tail=tail)
    RESULTS["tests"] = dict(n=len(ids), procs=procs, seconds=time.time() - t0, parts=summary)
    print(f"tests: {len(ids)} in {procs} processes, {time.time() - t0:.0f} s; "
          + "; ".join(f"[{k}] rc={s['rc']} {s['tail']}" for k, s in summary.items()), flush=True)
    for tool, name in san:
        txt = open(name).read()
        summ = [ln for ln in txt.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln
                or " passed" in ln or " failed" in ln]
        RESULTS["tests"][tool] = dict(summary=summ)
        print(f"{tool}:", summ, flush=True)


# ------------------------------------------------------------------ timing


def problem(thd: bool):
    h = (SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"])
    w, A, dt = mk.weights(*h, SHAPE["W"], device="cuda")
    if thd:
        cu = mk.cu_seqlens(thd_lengths(), device="cuda")
        return mk.mixed((TOKENS,), *h, device="cuda"), w, A, dt, cu
    return mk.mixed((4, TOKENS // 4), *h, device="cuda"), w, A, dt, None


def fla_prep(mixed, w, A, dt, cu, repeat_qk):
    """The issue's peer (``tilekernels.gdn.bench.fla_prep``, also tk-bench's) at this run's heads."""
    return mk.fla_prep(mixed, w, A, dt, cu, Hk=SHAPE["Hk"], dk=SHAPE["dk"], dv=SHAPE["dv"], repeat_qk=repeat_qk)


def record(case, impl, ms, nbytes, **extra):
    tbs = nbytes / (ms * 1e-3) / 1e12
    rec = dict(case=case, impl=impl, ms=ms, bytes=nbytes, tbs=tbs, pct_copy=100 * tbs / COPY_TBS, **extra)
    RESULTS["records"].append(rec)
    print(f"{case:<22}{impl:<16}{ms:>9.3f}{nbytes / 1e9:>7.2f}{tbs:>7.2f}{rec['pct_copy']:>7.1f}  "
          f"{extra.get('err', '')}", flush=True)


def time_case(thd: bool, repeat_qk: bool, peers: bool, compiled: bool, eager: bool = True, bwd: bool = True):
    case = f"{'thd' if thd else 'bshd'}-{'rep' if repeat_qk else 'norep'}"
    op = registry.get("gdn_pre_gated")
    x, w, A, dt, cu = problem(thd)
    p = dict(Hk=SHAPE["Hk"], dk=SHAPE["dk"], dv=SHAPE["dv"], repeat_qk=repeat_qk)
    nb = fwd_bytes(repeat_qk)
    try:
        ours = op(x, w, A, dt, cu_seqlens=cu, backend="cutile", **p)
        want = op(x, w, A, dt, cu_seqlens=cu, backend="torch", **p)
        err = max(rel_err(o, r) for o, r in zip(ours, want))
        ok = err <= tolerance(torch.bfloat16)
        del ours, want
        record(case, "cutile fwd", bench(lambda: op(x, w, A, dt, cu_seqlens=cu, backend="cutile", **p)), nb,
               err=f"max rel err vs torch {err:.2e} ok={ok}", ok=ok)
    except Exception:
        RESULTS["errors"].append(f"{case} cutile fwd: {traceback.format_exc(limit=8)}")
        print("ERROR", RESULTS["errors"][-1], flush=True)
    if peers and eager:
        record(case, "torch eager fwd", bench(lambda: op(x, w, A, dt, cu_seqlens=cu, backend="torch", **p), rep=20),
               nb)
    if peers:
        try:
            outs = fla_prep(x, w, A, dt, cu, repeat_qk)
            want = ref.pre_gated(x, w, A, dt, cu, **p)
            err = max(rel_err(o, r) for o, r in zip(outs, want))
            del outs, want
            record(case, "fla+torch fwd", bench(lambda: fla_prep(x, w, A, dt, cu, repeat_qk)), nb,
                   err=f"max rel err vs torch {err:.2e}")
        except Exception:
            RESULTS["errors"].append(f"{case} fla: {traceback.format_exc(limit=8)}")
            print("ERROR", RESULTS["errors"][-1], flush=True)
    if compiled and time.time() - T_START > COMPILE_PEER_BEFORE_S:
        RESULTS["errors"].append(f"{case} torch.compile: skipped, {time.time() - T_START:.0f} s into the run")
        print("torch.compile skipped (time)", flush=True)
    elif compiled:
        try:
            fn = torch.compile(lambda *a: ref.pre_gated(*a, **p))
            t0 = time.time()
            fn(x, w, A, dt, cu)
            record(case, "torch.compile fwd", bench(lambda: fn(x, w, A, dt, cu), rep=50), nb,
                   err=f"compile {time.time() - t0:.0f} s")
        except Exception:
            RESULTS["errors"].append(f"{case} torch.compile: {traceback.format_exc(limit=8)}")
            print("ERROR", RESULTS["errors"][-1], flush=True)
    if repeat_qk and bwd:  # backward: ours and the torch backend, fp32-checked
        try:
            leaves = [t.clone().requires_grad_() for t in (x, w, A, dt)]
            outs = op(*leaves, cu_seqlens=cu, backend="cutile", **p)
            grads = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) for o in outs]
            from tilekernels.gdn import cutile_pre_gated_bwd as cb

            dx, dw = torch.empty_like(x), torch.empty_like(w)
            dA, ddt = torch.empty_like(A), torch.empty_like(dt)
            args = (*grads, x, w, A, dt, cu, dx, dw, dA, ddt, p["Hk"], p["dk"], p["dv"], repeat_qk, 1e-6, False)
            cb.pre_gated_bwd_into(*args)
            want = ref.pre_gated_bwd(*grads, x, w, A, dt, cu, **p)
            errs = [rel_err(o, r) for o, r in zip((dx, dw, dA, ddt), want)]
            ok = errs[0] <= 1e-2 and errs[1] <= 1e-2 and errs[2] <= 1e-5 and errs[3] <= 1e-5
            del want, outs, leaves
            record(case, "cutile bwd", bench(lambda: cb.pre_gated_bwd_into(*args)), bwd_bytes(True),
                   err="rel errs " + ", ".join(f"{e:.1e}" for e in errs) + f" ok={ok}", ok=ok)
            from tilekernels._glue import get_kernel

            tb = get_kernel("gdn_pre_gated", "torch", "bwd")
            if peers and eager:
                record(case, "torch eager bwd", bench(lambda: tb(*args), rep=20), bwd_bytes(True))
        except Exception:
            RESULTS["errors"].append(f"{case} bwd: {traceback.format_exc(limit=8)}")
            print("ERROR", RESULTS["errors"][-1], flush=True)
    torch.cuda.empty_cache()


# fwd launch-config variants (PreGatedCfg fields over the heuristic's): the sweep's rows
# V1: the previous forward, a verbatim copy at benchmarks/probes/gdn_pre_fwd_v1.py when present
# (removed after its A/B; `git show 2e8a94d:benchmarks/probes/gdn_pre_fwd_v1.py` restores it)
_HAS_V1 = os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes", "gdn_pre_fwd_v1.py"))
# NW8 (num_worker_warps 8): the compiler reads the tap tiles from shared memory as LDS.128 instead of
# one LDS.U16 per element (static counts in the sm_90 SASS of the main launch at FT32 OCC4: 512 LDS.U16
# and 6.8K instructions with the compiler's warps, no LDS.U16 and 3.5K instructions with NW8); timed slower (0.64-0.77 ms, session 6)
# MA (THD: masks on every tile, no branch before the tap loads), OCCH (the head launch's occupancy), SX (the
# tanh SiLU, 16-bit outputs): session 7's switches (H200 timings in PreGatedCfg.heuristic)
FWD_SWEEP = [dict(V1=True)] * _HAS_V1 + [
    dict(FT=32, OCC=4, MA=False, OCCH=0, SX=False), dict(MA=True, OCCH=2, SX=False), dict(MA=True, OCCH=2, SX=True),
    dict(FT=16, OCC=8), dict(FT=32, OCC=4, NW=8), dict(FT=32, OCC=4, CB=True), dict(FT=32, OCC=4, HBZ=16, ZC=2)]
W1_PROBE = [dict(FT=32, OCC=4, NW=8)]  # the same launches at W=1: no taps
if os.environ.get("GDN_PRE_VARIANTS"):  # a run's own sweep ("{...};{...}", inherited by the warm processes): no W=1 row
    import ast

    FWD_SWEEP = [ast.literal_eval(v) for v in os.environ["GDN_PRE_VARIANTS"].split(";") if v.strip()]
    W1_PROBE = []
SWEEP_OK: set | None = None  # with --warm-first: the sweep jobs whose compile-and-run process finished them
CASES = [(False, True), (False, False), (True, True), (True, False)]  # (thd, repeat_qk)


def _tag(over, w1=False):
    return ("W1 " if w1 else "") + (" ".join("v1 (7b5141c)" if k == "V1" else f"{k}{int(v) if isinstance(v, bool) else v}"
                                             for k, v in over.items())
                                   or "default")


def sweep_launches(prob, over, w1=False, outs=None, repeat_qk=True):
    """The fwd launches of config variant ``over`` on problem ``prob`` (w1: the conv weight cut to its
    last tap, W=1: no taps, same bytes), and their outputs."""
    import dataclasses

    x, w, A, dt, cu = prob
    if w1:
        w = w[:, -1:].contiguous()
    over = dict(over)
    if over.pop("V1", False):  # the previous forward (benchmarks/probes/gdn_pre_fwd_v1.py) at its default
        sys.path.insert(0, os.path.join(ROOT, "benchmarks", "probes"))
        import gdn_pre_fwd_v1 as cp
    else:
        from tilekernels.gdn import cutile_pre_gated as cp
    cfg = dataclasses.replace(cp.PreGatedCfg.heuristic(SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"],
                                                       w.shape[1], repeat_qk), **over)
    outs = outs or [torch.empty(o.shape, dtype=o.dtype, device=x.device) for o in ref_outs(prob, repeat_qk)]
    return (cp.fwd_launch(x, w, A, dt, cu, *outs, None, SHAPE["Hk"], SHAPE["dk"], SHAPE["dv"], repeat_qk, 1e-6,
                          cfg=cfg), outs)


def sweep_jobs():
    return [(o, False) for o in FWD_SWEEP] + [(o, True) for o in W1_PROBE]


def sweep(thd_all: bool = False, all_cases: bool = False) -> None:
    """Launch-config variants of ours (BSHD with repeat_qk; THD too with thd_all; all four cases
    with all_cases): fwd timed on the kernels directly, each checked against the torch reference
    first (W=1 rows: speed only)."""
    cases = CASES if all_cases else [(thd, True) for thd in ((False, True) if thd_all else (False,))]
    for thd, rep in cases:
        prob = problem(thd)
        case = f"{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}"
        want = ref_outs(prob, rep)
        outs = None
        for j, (over, w1) in enumerate(sweep_jobs()):
            if SWEEP_OK is not None and j not in SWEEP_OK:  # a hang or a runaway compile: not run here
                RESULTS["errors"].append(f"{case} sweep {over} w1={w1}: skipped, its warm run did not finish")
                print("SKIPPED", _tag(over, w1), "(its warm run did not finish)", flush=True)
                continue
            try:
                ls, outs = sweep_launches(prob, over, w1, outs, rep)
                for o in outs:
                    o.fill_(float("nan"))
                for ln in ls:
                    ln.run()
                err = "" if w1 else f"err {max(rel_err(o, r) for o, r in zip(outs, want)):.1e}"
                record(case, "sw " + _tag(over, w1), bench(lambda: [ln.run() for ln in ls]), fwd_bytes(rep),
                       err=err, sweep=True, over=over, w1=w1)
            except Exception:
                RESULTS["errors"].append(f"{case} sweep {over} w1={w1}: {traceback.format_exc(limit=8)}")
                print("ERROR", RESULTS["errors"][-1], flush=True)
        del want, outs
        torch.cuda.empty_cache()


def side_by_side() -> None:
    """The records as one table: a row per implementation / sweep variant, a column per case (ms, % of copy)."""
    cases = [f"{'thd' if t else 'bshd'}-{'rep' if r else 'norep'}" for t, r in CASES]
    rows: dict = {}
    for r in RESULTS["records"]:
        rows.setdefault(r["impl"], {})[r["case"]] = r
    print("\n== side by side: ms (% of 4.27 TB/s) ==", flush=True)
    print(f"{'impl':<34}" + "".join(f"{c:>17}" for c in cases), flush=True)
    for impl, byc in rows.items():
        print(f"{impl[:33]:<34}" + "".join(f"{byc[c]['ms']:>9.3f} ({byc[c]['pct_copy']:4.1f})" if c in byc
                                           else f"{'-':>17}" for c in cases), flush=True)


def ref_outs(prob, repeat_qk: bool = True):
    x, w, A, dt, cu = prob
    return ref.pre_gated(x, w, A, dt, cu, Hk=SHAPE["Hk"], dk=SHAPE["dk"], dv=SHAPE["dv"], repeat_qk=repeat_qk)


def warm_sweep(part: int, parts: int) -> None:
    """Compile slice ``part`` of ``parts`` of the sweep's variants (BSHD and THD, at 256 tokens: a
    body launch for every tile size)."""
    global TOKENS
    TOKENS = 256
    for j, (over, w1) in enumerate(sweep_jobs()):
        if j % parts == part:
            for thd, rep in CASES:
                for ln in sweep_launches(problem(thd), over, w1, repeat_qk=rep)[0]:
                    ln.run()
            torch.cuda.synchronize()
            print(f"warm ok {j}", flush=True)
    print(f"warm sweep {part}/{parts}: done", flush=True)


def warm(bwd: bool = True) -> None:
    """Compile the timed cases' kernels at 64 tokens (same compile keys: token counts are dynamic)."""
    global TOKENS
    TOKENS = 64
    op = registry.get("gdn_pre_gated")
    from tilekernels.gdn import cutile_pre_gated_bwd as cb

    for thd in (False, True):
        for rep in (True, False):
            x, w, A, dt, cu = problem(thd)
            p = dict(Hk=SHAPE["Hk"], dk=SHAPE["dk"], dv=SHAPE["dv"], repeat_qk=rep)
            outs = op(x, w, A, dt, cu_seqlens=cu, backend="cutile", **p)
            if rep and bwd:
                cb.pre_gated_bwd_into(*outs, x, w, A, dt, cu, torch.empty_like(x), torch.empty_like(w),
                                      torch.empty_like(A), torch.empty_like(dt), *p.values(), 1e-6, False)
    torch.cuda.synchronize()
    print("warm: done", flush=True)


def main():
    global WARM_SWEEP_PROCS, TEST_PROC_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tests", type=int, default=0, help="run the test file in this many processes first")
    ap.add_argument("--memcheck", action="store_true")
    ap.add_argument("--no-compile-peer", action="store_true", help="skip torch.compile of the reference")
    ap.add_argument("--no-peers", action="store_true", help="time ours only")
    ap.add_argument("--warm", action="store_true", help="only compile the timed cases (at 64 tokens)")
    ap.add_argument("--sweep", action="store_true", help="time fwd launch-config variants (BSHD) before the cases")
    ap.add_argument("--sweep-thd", action="store_true", help="with --sweep: THD too")
    ap.add_argument("--sweep-all", action="store_true", help="with --sweep: all four cases (BSHD/THD, repeat on/off)")
    ap.add_argument("--warm-procs", type=int, default=WARM_SWEEP_PROCS, help="processes compiling the sweep")
    ap.add_argument("--test-k", default="", help="pytest -k expression for --tests")
    ap.add_argument("--per-test-s", type=int, default=0, help="pytest-timeout per test (thread method)")
    ap.add_argument("--test-proc-s", type=int, default=TEST_PROC_S, help="each test process's limit")
    ap.add_argument("--warm-first", action="store_true", help="with --sweep and no --tests: compile the sweep first")
    ap.add_argument("--no-cases", action="store_true", help="skip the four cases (ours at its default, peers)")
    ap.add_argument("--hang", nargs="*", default=(), help="configs for benchmarks/probes/gdn_pre_fwd_hang.py")
    ap.add_argument("--warm-sweep", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--no-eager", action="store_true", help="skip the torch backend's timings")
    ap.add_argument("--no-bwd", action="store_true", help="skip the backward's timing")
    ap.add_argument("--cases-first", action="store_true", help="with --sweep: time the four cases before the sweep")
    a = ap.parse_args()
    WARM_SWEEP_PROCS, TEST_PROC_S = a.warm_procs, a.test_proc_s
    os.makedirs(a.out, exist_ok=True)
    if a.warm:
        return warm(not a.no_bwd)
    if a.warm_sweep >= 0:
        return warm_sweep(a.warm_sweep, a.warm_procs)
    if a.sweep and a.warm_first and not a.tests:
        global SWEEP_OK
        t0, SWEEP_OK = time.time(), set()
        for k, p, log in warm_sweep_procs(a.out):
            p.wait()
            log.close()
            lines = open(log.name).read().strip().splitlines()
            SWEEP_OK |= {int(ln.split()[2]) for ln in lines if ln.startswith("warm ok ")}
            print(f"{k}: rc={p.returncode} {lines[-1:]}", flush=True)
        print(f"sweep compiled in {time.time() - t0:.0f} s; jobs ok: {sorted(SWEEP_OK)}", flush=True)
    if a.tests:
        run_tests(a.out, a.tests, a.memcheck, a.sweep, a.test_k, tuple(a.hang), a.per_test_s, not a.no_bwd)
    RESULTS["env"] = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, tokens=TOKENS,
                          thd_sequences=len(thd_lengths()), shape=SHAPE)
    print(json.dumps(RESULTS["env"]), flush=True)
    print(f"{'case':<22}{'impl':<16}{'ms':>9}{'GB':>7}{'TB/s':>7}{'%4.27':>7}  note", flush=True)
    path = os.path.join(a.out, "gdn_pre_check.json")

    def dump():
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)

    if a.sweep and not a.cases_first:  # first: the variants are what a short run is for
        sweep(a.sweep_thd, a.sweep_all)
        dump()
    for thd in (() if a.no_cases else (False, True)):
        for rep in (True, False):
            time_case(thd, rep, peers=not a.no_peers,
                      compiled=rep and not thd and not a.no_compile_peer and not a.no_peers,
                      eager=not a.no_eager, bwd=not a.no_bwd)
            dump()
    if a.sweep and a.cases_first:
        sweep(a.sweep_thd, a.sweep_all)
        dump()
    print("\n== summary ==", flush=True)
    for r in RESULTS["records"]:
        print(f"{r['case']:<12}{r['impl']:<18}{r['ms']:>8.3f} ms {r['tbs']:>6.2f} TB/s {r['pct_copy']:>6.1f}%  "
              f"{r.get('err', '')}", flush=True)
    side_by_side()
    print("errors:", len(RESULTS["errors"]), "| tests:", {k: v["rc"] for k, v in RESULTS["tests"].get("parts", {}).items()},
          "| wrote", path, flush=True)
    return 1 if RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
