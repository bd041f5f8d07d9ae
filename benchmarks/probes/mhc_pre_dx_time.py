#!/usr/bin/env python3
"""GPU timing of mhc_pre's dx pass at issue 15's shape: cuTile's mhc_pr_bwd (with the aggregate term) against
cute_proj_rms's AGG_C kernel (``bwd_agg_into``: AGG_IL by default) and its other variants, one harness (do_bench median).

T=32768, n=4, C=7168 (K = n C = 28672, N = 24), bf16 x / weight / dlayer_in. Bytes by hand: x and dx (2 x 1.879 GB),
dlayer_in once (0.470 GB), dproj / dr / r / h_pre^T (3.9 MB), the dweight partials (7 N K fp32, written and read)
and dweight. Rows: each kernel with its reduction, the plain proj_rms backward (no aggregate term) and a copy of x
for reference; every AGG_C variant's dx is compared bitwise with the default's. Table last; JSON to --out. Needs
both toolchains in one process (the README's two-call flow: cuTile unpacked, then .gpu-cute).
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

BF, F32 = torch.bfloat16, torch.float32
AB = {"sm": dict(AGG_IL=False),
      "sm-stream-major": dict(AGG_IL=False, CHM=False), "no-sm": dict(AGG_IL=False, AGG_SM=False),
      "no-sm-stream-major": dict(AGG_IL=False, AGG_SM=False, CHM=False)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--ab", default=",".join(AB))
    ap.add_argument("--rep", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--only", choices=["agg", "plain", "cutile"],
                    help="run that pass 3 times and nothing else (for ncu: --launch-skip 2 --launch-count 1)")
    a = ap.parse_args()
    from tilekernels._cutile import run_all
    from tilekernels.mhc import cute_proj_rms as cpr
    from tilekernels.mhc import cutile_proj_rms as pr

    T, n, C = a.T, a.n, a.C
    N, K = n * n + 2 * n, n * C
    dev = "cuda"
    x = torch.randn(T, n, C, device=dev).to(BF)
    w = (torch.randn(N, K, device=dev) * K ** -0.5).to(BF)
    dproj, dr = torch.randn(T, N, device=dev), torch.randn(T, device=dev)
    r = torch.rand(T, device=dev) + 0.5
    dl = torch.randn(T, C, device=dev).to(BF)
    hpre_t = torch.rand(n, T, device=dev)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    res = probe_record(T=T, n=n, C=C)
    sx, small = 2 * T * K, 4 * T * (N + 2 + n)
    gm = min(7, -(-T // 64))
    parts = 8 * gm * N * K + 2 * N * K

    def row(name, ms, nbytes):
        res["rows"].append(dict(row=name, ms=ms, gb_s=nbytes / ms / 1e6))
        print(f"{name:40s} {ms * 1e3:9.1f} us {nbytes / ms / 1e6:8.0f} GB/s", flush=True)

    if a.only:
        fn = {"agg": lambda: cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx, dw, 1e-6),
              "plain": lambda: cpr.bwd_into(dproj, dr, x.view(T, K), w, r, dx.view(T, K), dw, 1e-6),
              "cutile": lambda: run_all(pr.bwd_launches(dproj, dr, x.view(T, K), w, r, dx.view(T, K), dw, 1e-6, None,
                                                        groups=n, agg=(dl, hpre_t)))}[a.only]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return
    row("copy x -> dx (floor of x + dx)", bench(lambda: dx.copy_(x), a.rep), 2 * sx)
    cut = pr.bwd_launches(dproj, dr, x.view(T, K), w, r, dx.view(T, K), dw, 1e-6, None, groups=n, agg=(dl, hpre_t))
    row("cuTile mhc_pr_bwd + reduce", bench(lambda: run_all(cut), a.rep), 2 * sx + T * C * 2 + small + parts)
    ref_dx = dx.clone()
    row("cute bwd_agg_into (default)",
        bench(lambda: cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx, dw, 1e-6), a.rep),
        2 * sx + T * C * 2 + small + parts)
    base = dx.clone()
    res["cute_vs_cutile_dx_max_abs"] = float((base.float() - ref_dx.float()).abs().max())
    row("cute bwd_into (no aggregate term)",
        bench(lambda: cpr.bwd_into(dproj, dr, x.view(T, K), w, r, dx.view(T, K), dw, 1e-6), a.rep),
        2 * sx + small + parts)
    for name in [s for s in a.ab.split(",") if s]:
        try:
            cfg = dataclasses.replace(cpr.ProjRmsBwdCuteCfg.heuristic(N, K), AGG_C=C, **AB[name])
            d2 = torch.empty_like(x)
            cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, d2, torch.empty_like(w), 1e-6, cfg=cfg)
            same = torch.equal(d2, base)
            row(f"cute bwd_agg_into {name}{'' if same else ' (DIFFERS)'}",
                bench(lambda: cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx, dw, 1e-6, cfg=cfg), a.rep),
                2 * sx + T * C * 2 + small + parts)
        except Exception:
            log_error(res["errors"], f"config {name}")
    print(f"\nmhc_pre's dx pass, {res['env'].get('device', '?')}, T={T} n={n} C={C}; do_bench median; "
          f"cute vs cuTile dx max |diff| {res['cute_vs_cutile_dx_max_abs']:.3g}")
    for r_ in res["rows"]:
        print(f"{r_['row']:40s} {r_['ms'] * 1e3:9.1f} us {r_['gb_s']:8.0f} GB/s")
    if a.out:
        with open(os.path.join(a.out, "mhc_pre_dx_time.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
