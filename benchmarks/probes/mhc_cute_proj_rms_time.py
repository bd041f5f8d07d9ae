#!/usr/bin/env python3
"""GPU timing of mhc_proj_rms at issue 15's shape: the registry's backends side by side (--registry), the
CuTe DSL kernels (tilekernels/mhc/cute_proj_rms.py, cute_proj_rms_fwd.py) and their A/B configs; one harness.

M=32768, N=24 (n=4), K=28672, bf16 x / weight. Bytes by hand (every input read once, every output
written once): bwd x + dx = 2 x 1.879 GB, + dproj, dr, r (3.3 MB) + the dweight partials (GM x N x K
fp32, written and read) + dweight; fwd x = 1.879 GB + proj, r; registry fwd+bwd: their sum (floor
3 x 1.879 GB). Rows (do_bench median, benchmarks/_gpu.bench): per --registry backend op(x, w) and
torch.autograd.grad((proj, r), (x, w), the same pre-made (dproj, dr)) (no .grad accumulation), with
the backends' relative differences; the bwd kernel alone, bwd + reduction (``bwd_into``), each A/B
config (run once first and compared bitwise with the default's dx: the dweight sums' order depends on
GM), the fwd and its A/B configs; % of the copy bandwidth measured in the same process. Table last;
JSON to --out.

    source .gpu-cute/env.sh && python3 benchmarks/probes/mhc_cute_proj_rms_time.py --out "$OUT"

--registry cutile,cute needs both toolchains in one process: source .gpu-cutile/env.sh in one call (it
unpacks cuTile into /tmp/tk-cutile), then in the next call on the same machine source .gpu-cute/env.sh,
add /tmp/tk-cutile/site to PYTHONPATH and /tmp/tk-cutile/cu13/bin to PATH, unset CUDA_HOME (README).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, log_error, probe_record  # noqa: E402

M, N, K = 32768, 24, 28672
BF, F32 = torch.bfloat16, torch.float32
# (session 21's "dxst", DXST=True: the variant's code is at 65426d5)
AB = {"st4": dict(STAGES=4), "gm5": dict(GM=5), "gm8": dict(GM=8), "gm12": dict(GM=12), "gm14": dict(GM=14),
      # session 30: one CTA a channel slice walking every row tile (112 CTAs at K=28672, one wave, the CTAs side by
      # side along a row band), two, six
      "gm1": dict(GM=1), "gm1st4": dict(GM=1, STAGES=4), "gm2": dict(GM=2), "gm6": dict(GM=6),
      # session 62: dweight's partials summed by a separate launch (the default before FUSE_RED), and FUSE_RED with
      # more row groups (each costs less than with the separate launch)
      "sep": dict(FUSE_RED=False), "gm10": dict(GM=10)}


def _registry_ab_rows(res, row, a, x, w, dproj, dr):
    """The registry's cute fwd+bwd (issue 15's harness) at the heuristic's bwd config and with each A/B config of
    ``a.registry_ab`` put into it (the heuristic patched), in ``a.rounds`` rounds of alternating order; every
    variant's dx and dweight compared bitwise with the default's first."""
    import registry
    from tilekernels.mhc import cute_proj_rms as cpr

    op = registry.get("mhc_proj_rms")
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    orig = cpr.ProjRmsBwdCuteCfg.heuristic
    nbytes = 3 * 2 * M * K + 4 * M * (2 * N + 3) + 3 * 2 * N * K   # weight read by fwd and bwd, dweight written

    def step():
        p_, r_ = op(xl, wl, backend="cute")
        return torch.autograd.grad((p_, r_), (xl, wl), (dproj, dr))

    def use(kw):
        cpr.ProjRmsBwdCuteCfg.heuristic = classmethod(lambda cls, *args: dataclasses.replace(orig(*args), **kw))

    names = ["default"] + [s_ for s_ in a.registry_ab.split(",") if s_]
    try:
        want = [t.clone() for t in step()]
        ok = {}
        for name in names[1:]:
            use(AB[name])
            ok[name] = all(torch.equal(u, v) for u, v in zip(step(), want))
            res["checks"][f"registry {name} bitwise"] = ok[name]
        times = {n: [] for n in names}
        for rnd in range(a.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                use(AB.get(name, {}))
                times[name].append(bench(step, a.rep))
        for name in names:
            ms = sorted(times[name])[len(times[name]) // 2]
            tag = "" if name == "default" else f" ({name}{'' if ok[name] else ', DIFFERS'})"
            row(f"registry cute fwd+bwd{tag} median of {a.rounds}", ms, nbytes, rounds=[round(t, 4) for t in times[name]])
    except Exception:
        log_error(res["errors"], "registry A/B")
    finally:
        cpr.ProjRmsBwdCuteCfg.heuristic = orig


def _registry_rows(res, row, a, x, w, dproj, dr, rel_err):
    """Per backend of ``a.registry``: registry fwd and fwd+bwd rows (backend=...), proj against
    float64, and the two backends' relative differences of proj, r, dx, dweight."""
    import registry

    op = registry.get("mhc_proj_rms")
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    sx = 2 * M * K
    fwd_b = sx + 4 * M * (N + 1) + 2 * N * K
    bwd_b = 2 * sx + 4 * M * (N + 2) + 2 * 2 * N * K   # weight read, dweight written
    p64 = x.double() @ w.double().t()
    outs = {}
    for b in [s for s in a.registry.split(",") if s]:
        try:
            proj, r = op(xl, wl, backend=b)
            gx, gw = torch.autograd.grad((proj, r), (xl, wl), (dproj, dr))
            torch.cuda.synchronize()
            outs[b] = (proj.detach(), r.detach(), gx, gw)
            res["checks"][b] = {"proj_vs_f64": rel_err(proj, p64)}

            def step():
                p_, r_ = op(xl, wl, backend=b)
                torch.autograd.grad((p_, r_), (xl, wl), (dproj, dr))

            row(f"registry {b} fwd", bench(lambda: op(xl, wl, backend=b), a.rep), fwd_b, backend=b)
            row(f"registry {b} fwd+bwd", bench(step, a.rep), fwd_b + bwd_b, backend=b)
        except Exception:
            log_error(res["errors"], f"backend {b}")
    if len(outs) == 2:
        (b1, o1), (b2, o2) = outs.items()
        res["checks"]["between"] = {n: rel_err(u, v) for n, u, v in zip(("proj", "r", "dx", "dweight"), o2, o1)}
        print(f"{b2} vs {b1}: " + ", ".join(f"{k} {v:.2e}" for k, v in res["checks"]["between"].items()))
    print(f"registry fwd+bwd copy floor {3 * sx / res['copy_gb_s'] / 1e6:.4f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--ab", default="st4,gm14")
    ap.add_argument("--fwd-ab", default="bk64,ctas1,bk64ctas1,evict")
    ap.add_argument("--registry", default="", help="backends timed through the registry, e.g. cutile,cute")
    ap.add_argument("--registry-ab", default="", help="A/B configs (AB names) timed through the registry's cute backend")
    ap.add_argument("--rounds", type=int, default=5, help="--registry-ab: rounds, alternating order")
    a = ap.parse_args()
    from tilekernels.mhc import cute_proj_rms as cpr
    from tilekernels.mhc import reference as ref
    from tilekernels.testing import rel_err

    res = probe_record(shape=dict(M=M, N=N, K=K), checks={})
    copy = res["copy_gb_s"]
    x = torch.randn(M, K, device="cuda").to(BF)
    w = (torch.randn(N, K, device="cuda") * 0.02).to(BF)
    dproj = torch.randn(M, N, device="cuda")
    dr = torch.randn(M, device="cuda")
    r = ref.proj_rms(x.float(), w.float(), 1e-6)[1].float()
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    sx = 2 * M * K
    small = 4 * M * (N + 2)

    def row(name, ms, nbytes, **extra):
        rr = {**extra, "what": name, "ms": round(ms, 4), "gb": round(nbytes / 1e9, 3),
              "pct_copy": round(100 * nbytes / ms / 1e6 / copy, 1)}
        res["rows"].append(rr)
        print(f"{name:34s} {ms:8.4f} ms {rr['pct_copy']:6.1f}% of copy", flush=True)

    if a.registry:
        _registry_rows(res, row, a, x, w, dproj, dr, rel_err)
    if a.registry_ab:
        _registry_ab_rows(res, row, a, x, w, dproj, dr)
    # correctness at the headline shape (float64 reference in column chunks)
    cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6)
    torch.cuda.synchronize()
    gx = None
    try:
        xs = x[:, :4096].double()
        norm = torch.linalg.vector_norm(x.double(), dim=1)
        coef = torch.where(norm > 0, -dr.double() * r.double() ** 2 / K ** 0.5 / norm, 0.0)
        gx = dproj.double() @ w[:, :4096].double() + coef[:, None] * xs
        gw = dproj.double().t() @ x.double()
        res["rel_err_dx_first4096"] = rel_err(dx[:, :4096], gx)
        res["rel_err_dweight"] = rel_err(dw, gw)
        print(f"rel err dx[:, :4096] {res['rel_err_dx_first4096']:.2e}, dweight {res['rel_err_dweight']:.2e}")
        del gw, xs
    except Exception:
        log_error(res["errors"], "headline check")
    base = cpr.ProjRmsBwdCuteCfg.heuristic(N, K)
    gme = min(base.GM, -(-M // base.BM))
    p_dw = torch.empty((gme, N, K), dtype=F32, device="cuda")
    ln = cpr.bwd_launch(base)
    cnt = torch.zeros(-(-K // 64), dtype=torch.int32, device="cuda")   # FUSE_RED's slice counters (left zero)
    row("copy x -> dx (floor)", bench(lambda: dx.copy_(x), a.rep), 2 * sx)
    row("bwd kernel", bench(lambda: ln.run(x, w, dproj, dr, r, dx, p_dw, x, dproj, dw, cnt, M, gme, 1e-6), a.rep),
        2 * sx + small + 2 * N * K + 4 * gme * N * K)   # + the weight read
    row("bwd_into (kernel + reduction)", bench(lambda: cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6), a.rep),
        2 * sx + small + 2 * N * K + 8 * gme * N * K + 2 * N * K)
    ref_dx = dx.clone()
    for name in [s for s in a.ab.split(",") if s]:
        try:
            cfg = dataclasses.replace(base, **AB[name])
            d2 = torch.empty_like(dx)
            cpr.bwd_into(dproj, dr, x, w, r, d2, torch.empty_like(dw), 1e-6, cfg=cfg)
            same = torch.equal(d2, ref_dx)
            if not same and gx is not None:  # how far the variant's dx is from float64 (the default's: above)
                res[f"rel_err_dx_first4096 {name}"] = rel_err(d2[:, :4096], gx)
                print(f"rel err dx[:, :4096] {name} {res[f'rel_err_dx_first4096 {name}']:.2e}")
            g2 = min(cfg.GM, -(-M // cfg.BM))
            row(f"bwd_into {name}{'' if same else ' (DIFFERS)'}",
                bench(lambda: cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6, cfg=cfg), a.rep),
                2 * sx + small + 2 * N * K + 8 * g2 * N * K + 2 * N * K)
        except Exception:
            log_error(res["errors"], f"config {name}")
    try:
        from tilekernels.mhc import cute_proj_rms_fwd as fw

        proj = torch.empty(M, N, device="cuda")
        rr_ = torch.empty(M, device="cuda")
        fw.fwd_into(x, w, proj, rr_, 1e-6)
        torch.cuda.synchronize()
        p64 = x.double() @ w.double().t()
        res["rel_err_proj"] = rel_err(proj, p64)
        res["rel_err_r"] = rel_err(rr_, r.double())
        print(f"fwd rel err proj {res['rel_err_proj']:.2e}, r {res['rel_err_r']:.2e} (r vs the fp32 reference)")
        row("fwd (cute)", bench(lambda: fw.fwd_into(x, w, proj, rr_, 1e-6), a.rep), sx + 4 * M * (N + 1))
        fab = {"bk64": dict(BK=64), "ctas1": dict(ctas=1), "bk64ctas1": dict(BK=64, ctas=1),
               "noevict": dict(evict_first=False), "evict": dict(evict_first=True)}
        for name in [s_ for s_ in a.fwd_ab.split(",") if s_]:
            try:
                cfg = fw.ProjRmsFwdCuteCfg.heuristic(N, K, **fab[name])
                p2 = torch.empty_like(proj)
                fw.fwd_into(x, w, p2, torch.empty_like(rr_), 1e-6, cfg=cfg)
                row(f"fwd {name} (stages {cfg.stages}){'' if torch.equal(p2, proj) else ' (DIFFERS)'}",
                    bench(lambda: fw.fwd_into(x, w, p2, rr_, 1e-6, cfg=cfg), a.rep), sx + 4 * M * (N + 1))
            except Exception:
                log_error(res["errors"], f"fwd config {name}")
    except Exception:
        log_error(res["errors"], "fwd")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "mhc_cute_proj_rms_time.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\n| what | ms | % copy |\n|---|---|---|")
    for rr in res["rows"]:
        print(f"| {rr['what']} | {rr['ms']:.4f} | {rr['pct_copy']:.1f} |")
    print(f"errors: {len(res['errors'])}")


if __name__ == "__main__":
    main()
