#!/usr/bin/env python3
"""Probe: where mhc_post_pre's resident forward pass (tilekernels/mhc/cute_post_pre_res.py) spends its time (H200;
issue 15). The pass at issue 15's shape (T=32768, n=4, C=7168, bf16, fp32 h, bias) with its config's probe field
CUT (wrong results by design): 1 no exchange (no lock, each CTA's own partials), 2 the out math hoisted (every
stream formed as stream 0: n times fewer FMAs, as the session-39 probe's MATH let the compiler do), 3 both (session
40 also ran a ping-pong variant, since removed). Beside them in the same run: today's two forward passes
(cute_post_pre_fwd's fused pass, cute_aggregate's forward) and the CUT 0 rows again. Each row's out / layer_in is
checked only for CUT 0 (against its formula in fp32, within bf16 rounding, and layer_in from it and the pass's own
h_pre recomputed in float64 from its planes).

    python benchmarks/probes/post_pre_res_cut.py          (cute bundle; JSON to $OUT)
    python benchmarks/probes/post_pre_res_cut.py --check T n C    (one checked launch: what the sanitizers run)
    python benchmarks/probes/post_pre_res_cut.py --check-fused T n C    (the same for today's fused forward pass)
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

from _gpu import bench, save_probe_record  # noqa: E402

ROWS = [0, 1, 2, 3, 0]


def _inputs(T, n, C, dev="cuda"):
    bf = torch.bfloat16
    N = n * n + 2 * n
    g = torch.Generator(device=dev).manual_seed(0)
    return (torch.randn(T, n, C, device=dev, dtype=bf, generator=g),
            torch.randn(T, C, device=dev, dtype=bf, generator=g), torch.randn(C, device=dev, dtype=bf, generator=g),
            (torch.randn(N, n * C, device=dev, generator=g) * (n * C) ** -0.5).to(bf),
            torch.softmax(torch.randn(T, n, n, device=dev, generator=g), -1),
            torch.rand(T, n, device=dev, generator=g) * 2, torch.randn(N, device=dev, generator=g))


def check(T: int, n: int, C: int) -> int:
    """One CUT-0 launch at [T, n, C] (what the sanitizers run): out and layer_in against float64 of the
    formulas (layer_in from the pass's own out and planes), the planes against float64 of the pass's out, every
    plane element written (NaN-poisoned first)."""
    from tilekernels.mhc import cute_post_pre_res as RS

    res, x, bias, w, hres, hpost, hb = _inputs(T, n, C)
    cfg = RS.PostPreResCuteCfg.heuristic(n, C, n * n + 2 * n, True)
    out = torch.full_like(res, float("nan"))
    li = torch.full_like(x, float("nan"))
    pp_ = torch.full((cfg.CL, T, cfg.NPAD), float("nan"), device="cuda")
    ps = torch.full((cfg.CL, T), float("nan"), device="cuda")
    RS.launch(cfg).run(res, x, bias, w, hres, hpost, hb, out, li, pp_, ps, T, RS.ctas(cfg, T, res.device), 1e-6, 1.0)
    torch.cuda.synchronize()
    ref = hpost.double()[:, :, None] * (x.double() + bias.double())[:, None] + \
        torch.einsum("tij,tjc->tic", hres.double(), res.double())
    o64 = out.double()
    r = 1.0 / (torch.sqrt(ps.double().sum(0) / (n * C)) + 1e-6)
    h = torch.sigmoid(r[:, None] * pp_.double().sum(0)[:, :n] + hb[:n].double())
    want = (h[:, :, None] * o64).sum(1)
    eo = ((o64 - ref).norm() / ref.norm()).item()
    el = ((li.double() - want).norm() / want.norm()).item()
    ep = ((pp_.double().sum(0)[:, :n * n + 2 * n] - o64.view(T, -1) @ w.double().t()).norm() /
          (o64.view(T, -1) @ w.double().t()).norm()).item()
    ok = eo < 1e-2 and el < 1e-2 and ep < 1e-5 and not pp_.isnan().any() and not ps.isnan().any()
    print(f"check T={T} n={n} C={C}: out {eo:.1e} layer_in {el:.1e} proj {ep:.1e}", "ok" if ok else "WRONG")
    return 0 if ok else 1


def check_fused(T: int, n: int, C: int) -> int:
    """One launch of today's fused forward pass (cute_post_pre_fwd, the op's default) at [T, n, C] with the op's
    heuristic config (what the sanitizers run, as check does for the resident pass): out against float64 of its
    formula, the summed planes against float64 of the pass's own out (the projection's first N columns and the sums
    of squares), every used plane element written (NaN-poisoned first)."""
    from tilekernels.mhc import cute_post_pre_fwd as F

    N = n * n + 2 * n
    res, x, bias, w, hres, hpost, _ = _inputs(T, n, C)
    npad = 16 if N <= 16 else 32
    cfg = F.PostPreFwdCuteCfg.heuristic(n, C, N, npad, True)
    out = torch.full_like(res, float("nan"))
    pp_ = torch.full((cfg.SPLIT, T, npad), float("nan"), device="cuda")
    ps = torch.full((cfg.SPLIT, T), float("nan"), device="cuda")
    F.launch(cfg).run(res, x, bias, w, hres, hpost, out, pp_, ps, T)
    torch.cuda.synchronize()
    ref = hpost.double()[:, :, None] * (x.double() + bias.double())[:, None] + \
        torch.einsum("tij,tjc->tic", hres.double(), res.double())
    o64 = out.double()
    eo = ((o64 - ref).norm() / ref.norm()).item()
    pw = o64.view(T, -1) @ w.double().t()
    ep = ((pp_.double().sum(0)[:, :N] - pw).norm() / pw.norm()).item()
    ss = o64.view(T, -1).square().sum(1)
    es = ((ps.double().sum(0) - ss).norm() / ss.norm()).item()
    ok = eo < 1e-2 and ep < 1e-5 and es < 1e-5 and not pp_[:, :, :N].isnan().any() and not ps.isnan().any()
    print(f"check_fused T={T} n={n} C={C} {cfg}: out {eo:.1e} proj {ep:.1e} ss {es:.1e}", "ok" if ok else "WRONG")
    return 0 if ok else 1


def main() -> int:
    from tilekernels.mhc import cute_aggregate as agg
    from tilekernels.mhc import cute_post_pre_fwd as F
    from tilekernels.mhc import cute_post_pre_res as RS

    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        return check(*map(int, sys.argv[2:5]))
    if len(sys.argv) > 1 and sys.argv[1] == "--check-fused":
        return check_fused(*map(int, sys.argv[2:5]))
    T, n, C = 32768, 4, 7168
    N = n * n + 2 * n
    f4, dev = torch.float32, "cuda"
    res, x, bias, w, hres, hpost, hb = _inputs(T, n, C, dev)
    out, li = torch.empty_like(res), torch.empty_like(x)
    base = RS.PostPreResCuteCfg.heuristic(n, C, N, True)
    pp_ = torch.empty((base.CL, T, base.NPAD), device=dev, dtype=f4)
    ps = torch.empty((base.CL, T), device=dev, dtype=f4)
    ctas = RS.ctas(base, T, torch.device(dev))
    rows = []
    for cut in ROWS:
        cfg = dataclasses.replace(base, CUT=cut)
        ln = RS.launch(cfg)

        def run():
            ln.run(res, x, bias, w, hres, hpost, hb, out, li, pp_, ps, T, ctas, 1e-6, 1.0)

        out.fill_(float("nan"))
        li.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        ok = "-"
        if cut == 0:
            ref = (hpost[:, :, None] * (x.float() + bias.float())[:, None] +
                   torch.einsum("tij,tjc->tic", hres, res.float()))
            eo = ((out.float() - ref).norm() / ref.norm()).item()
            del ref
            o64 = out.double()
            pre = pp_.double().sum(0)[:, :n]
            r = 1.0 / (torch.sqrt(ps.double().sum(0) / (n * C)) + 1e-6)
            h = torch.sigmoid(r[:, None] * pre + hb[:n].double())
            want = (h[:, :, None] * o64).sum(1)
            el = ((li.double() - want).norm() / want.norm()).item()
            ok = "ok" if eo < 1e-2 and el < 1e-2 else "WRONG"
            ok += f" (out {eo:.1e}, layer_in {el:.1e})"
        t = bench(run) * 1e3
        rows.append(dict(name=f"resident CUT {cut}", us=t, ok=ok, cfg=dataclasses.asdict(cfg)))
        print(rows[-1]["name"], f"{t:.1f}", ok, flush=True)
    # today's two forward passes (last: a fault there loses no resident row)
    fcfg = F.PostPreFwdCuteCfg.heuristic(n, C, N, 32, True)
    fo = torch.empty_like(res)
    fp = torch.empty((fcfg.SPLIT, T, 32), device=dev, dtype=f4)
    fs = torch.empty((fcfg.SPLIT, T), device=dev, dtype=f4)
    fl = F.launch(fcfg)
    print("fused", fcfg, flush=True)
    fl.run(res, x, bias, w, hres, hpost, fo, fp, fs, T)
    torch.cuda.synchronize()
    t_f = bench(lambda: fl.run(res, x, bias, w, hres, hpost, fo, fp, fs, T)) * 1e3
    hp = torch.rand(T, n, device=dev)
    t_a = bench(lambda: agg.fwd_into(fo, hp, li)) * 1e3
    rows.append(dict(name="fused pass + aggregate (today's forward)", us=t_f + t_a, ok=f"{t_f:.1f} + {t_a:.1f}"))
    save_probe_record("post_pre_res_cut", rows, T=T, n=n, C=C, ctas=ctas)   # (probe_record(rows=) kept none)
    print(f"{'row':44s} {'us':>8s}  check")
    for r_ in rows:
        print(f"{r_['name']:44s} {r_['us']:8.1f}  {r_['ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
