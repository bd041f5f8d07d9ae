#!/usr/bin/env python3
"""Probe (device host): the two mhc_sinkhorn backward designs.

Checks both backward designs (entries + scratch, padded tile) against the
float64 reference at edge shapes (outputs poisoned first), then times the
forward and each backward variant at T=32768, n=4, iters=20 with
triton.testing.do_bench (median), and the registry op forward + autograd
backward eager and as a CUDA graph.
    source .gpu-cutile/env.sh && python3 benchmarks/probes/sinkhorn_probe.py [check|time|all]
"""
from __future__ import annotations

import dataclasses
import os
import sys
import traceback

# benchmarks/probes/ -> the repository root (for tilekernels)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from tilekernels.mhc import cutile_sinkhorn as sk  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, upcast  # noqa: E402

F32 = torch.float32
EPS = 1e-6


def bench(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def check(T, n, iters, entries, scale=2.0, **v):
    lg = torch.randn(T, n, n, device="cuda") * scale
    dout = torch.randn(T, n, n, device="cuda")
    out = torch.full_like(lg, float("nan"))
    dl = torch.full_like(lg, float("nan"))
    cfg = dataclasses.replace(sk.SinkhornCfg.heuristic(T, n, iters, entries=entries), **v)
    sk.fwd_launch(lg, out, iters, EPS, cfg).run()
    sk.bwd_launch(dout, lg, dl, iters, EPS, cfg).run()
    l64 = upcast(lg)
    e_out = assert_close(out, ref.sinkhorn(l64, iters, EPS), what="out")
    want = ref.sinkhorn_bwd(upcast(dout), l64, iters, EPS)
    if n == 1:  # the exact gradient is 0 (a 1x1 Sinkhorn is constant): compare absolutely
        assert torch.isfinite(dl).all() and dl.abs().max().item() < 1e-6, dl.abs().max().item()
        return e_out, 0.0
    return e_out, assert_close(dl, want, what="dlogits")


def correctness(**v):
    cases = [(T, n, it) for n in (1, 2, 3, 4, 8) for T in (1, 3, 1000) for it in (1, 3, 20)]
    cases += [(32768, 4, 20), (32768, 8, 20), (0, 4, 20), (129, 4, 64)]
    ok, bad, worst = 0, 0, {}
    for c in cases:
        for entries in (True, False):
            try:
                eo, eb = check(*c, entries, **v)
                ok += 1
                k = "entries" if entries else "tile"
                worst[k] = max(worst.get(k, 0.0), eb)
            except Exception:
                bad += 1
                print("FAIL", c, "entries" if entries else "tile", traceback.format_exc(limit=3), flush=True)
    print(f"correctness {v}: {ok} ok, {bad} failed; worst dlogits rel err {worst}", flush=True)


# relative to the heuristic's config (n <= 4: entries backward, approximate divides, prefetch)
BWD_VARIANTS = [dict(), dict(PF=0), dict(APPROX=0, PF=0), dict(TT_BWD=64), dict(OCC_BWD=4),
                dict(BWD_ENTRIES=False, TT_BWD=8, OCC_BWD=8)]
FWD_VARIANTS = [dict(), dict(APPROX=0), dict(TT_FWD=64)]


def per_launch_in_graph(fn):
    """ms per call of ``fn`` with many calls captured back to back in one CUDA graph
    (no per-launch host gap; inputs stay in L2 between launches)."""
    from triton.testing import do_bench_cudagraph
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=100, return_mode="median")


def timing(T=32768, n=4, iters=20, variants=BWD_VARIANTS, fwd_variants=FWD_VARIANTS):
    lg = torch.randn(T, n, n, device="cuda") * 2.0
    dout = torch.randn(T, n, n, device="cuda")
    out, dl = torch.empty_like(lg), torch.empty_like(lg)
    cfg = sk.SinkhornCfg.heuristic(T, n, iters)
    print(f"T={T} n={n} iters={iters}; default {cfg}", flush=True)
    want_f = ref.sinkhorn(upcast(lg), iters, EPS)
    want = ref.sinkhorn_bwd(upcast(dout), upcast(lg), iters, EPS)
    rows = []
    jobs = [("fwd", v, out, want_f, sk.fwd_launch, (lg, out)) for v in fwd_variants] + \
        [("bwd", v, dl, want, sk.bwd_launch, (dout, lg, dl)) for v in variants]
    for pas, v, res, ref_, make, args in jobs:
        try:
            ln = make(*args, iters, EPS, dataclasses.replace(cfg, **v))
            res.fill_(float("nan"))
            ln.run()
            err = assert_close(res, ref_, what=pas)
            rows.append((f"{pas} {v}", bench(ln.run), per_launch_in_graph(ln.run), err))
        except Exception:
            print(pas, "variant", v, "FAILED", traceback.format_exc(limit=3), flush=True)
    # the op as users call it: registry forward + autograd backward, eager and as a CUDA graph
    from tilekernels.mhc import ops
    x = lg.clone().requires_grad_(True)

    def step():
        y = ops.sinkhorn(x, iters=iters, eps=EPS, backend="cutile")
        (g,) = torch.autograd.grad(y, x, dout)
        return g

    step()
    rows.append(("registry f+b eager", bench(step), float("nan"), float("nan")))
    rows.append(("registry f+b CUDA graph", per_launch_in_graph(step), float("nan"), float("nan")))
    print("\n| launch | do_bench ms | ms per call, many in a CUDA graph | rel err |\n|---|---:|---:|---:|")
    for name, ms, gms, err in rows:
        print(f"| {name} | {ms:.4f} | {gms:.4f} | {err:.1e} |")
    return rows


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    print(torch.cuda.get_device_name(), "commit", os.environ.get("TILEKERNELS_COMMIT", "?"), flush=True)
    if which in ("all", "check"):
        correctness()
    if which in ("all", "time"):
        timing()
        e8 = dict(BWD_ENTRIES=True, OCC_BWD=0, PF=1)
        timing(n=8, variants=[dict(), dict(e8, TT_BWD=128), dict(e8, TT_BWD=64), dict(e8, TT_BWD=32)],
               fwd_variants=[dict()])
    if which == "ncu":  # each variant twice, for Nsight Compute's kernel durations
        T, n, iters = 32768, 4, 20
        lg, dout = torch.randn(T, n, n, device="cuda"), torch.randn(T, n, n, device="cuda")
        out = torch.empty_like(lg)
        cfg = sk.SinkhornCfg.heuristic(T, n, iters)
        for v in FWD_VARIANTS:
            for _ in range(2):
                sk.fwd_launch(lg, out, iters, EPS, dataclasses.replace(cfg, **v)).run()
        for v in BWD_VARIANTS:
            for _ in range(2):
                sk.bwd_launch(dout, lg, out, iters, EPS, dataclasses.replace(cfg, **v)).run()
        torch.cuda.synchronize()
