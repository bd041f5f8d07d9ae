#!/usr/bin/env python3
"""SPLIT_DW's two CuTe DSL kernels alone on small random inputs, for compute-sanitizer (no cuTile needed: one device
call): cute_post_pre_dhdw's pass and the backward pass with DWPRE, at shapes with tails (T past a row tile, C past a
chunk and a slice, n = 3 and 4). Checks nothing itself beyond finite outputs; the float64 tests check the values.

    source .gpu-cute/env.sh; compute-sanitizer --tool racecheck python3 benchmarks/probes/split_dw_sanitize.py
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT]

import torch  # noqa: E402

from tilekernels.mhc import cute_post_pre_bwd as K  # noqa: E402
from tilekernels.mhc import cute_post_pre_dhdw as DD  # noqa: E402


def main():
    dev, bf, f32 = "cuda", torch.bfloat16, torch.float32
    for T, n, C in [(130, 4, 200), (37, 3, 520)]:
        N = n * n + 2 * n
        NP = 16 if N <= 16 else 32
        out = torch.randn(T, n, C, device=dev).to(bf)
        dl = torch.randn(T, C, device=dev).to(bf)
        dproj0 = torch.randn(T, NP, device=dev)
        cfg = DD.PostPreDhdwCuteCfg.heuristic(n, C, N, NP)
        gm = DD.row_groups(T)
        p_dh = torch.full((cfg.S, T, n), float("nan"), device=dev)
        p_dw = torch.full((gm + 1, N, n * C), float("nan"), device=dev)
        DD.launch(cfg).run(out, dl, dproj0, p_dh, p_dw, T, gm)

        kq = K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(n, C, N, True))
        ntm = -(-T // K.BM)
        rnd = lambda *s, dt=bf: torch.randn(*s, device=dev).to(dt)  # noqa: E731
        dout, res, x, bias = rnd(T, n, C), rnd(T, n, C), rnd(T, C), rnd(C)
        wp = K.permuted_weight(rnd(N, n * C), kq)
        dproj, dr, r = rnd(T, N, dt=f32), rnd(T, dt=f32), torch.rand(T, device=dev) + 0.5
        h_res, h_post, hpre_t = rnd(T, n, n, dt=f32), rnd(T, n, dt=f32), rnd(n, T, dt=f32)
        dres, dx = torch.empty_like(res), torch.empty_like(x)
        p_bias = torch.empty(ntm, C, device=dev)
        p_dhr = torch.empty(kq.SPLIT, T, n, n, device=dev)
        p_dhp = torch.empty(kq.SPLIT, T, n, device=dev)
        p_pre = torch.full((ntm, n, n * C), float("nan"), device=dev)
        K.launch(kq).run(dout, res, x, dl, bias, wp, dproj, dr, r, h_res, h_post, hpre_t, dres, dx, p_bias, p_dhr,
                         p_dhp, p_pre, T, 1e-6)
        torch.cuda.synchronize()
        ok = all(bool(t.isfinite().all()) for t in (p_dh, p_dw[:gm], p_pre, dres, dx))
        print(f"T={T} n={n} C={C}: finite={ok}", flush=True)
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
