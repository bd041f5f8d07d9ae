#!/usr/bin/env python3
"""Probe (device host): mhc_pre's backward mix kernel with either Sinkhorn backward.

For each mix config (the padded-tile Sinkhorn backward, mhc_pre_bwd_mix; the
entries one, mhc_pre_bwd_mix_e, at several token tiles) the whole mhc_pre
backward is checked against the float64 reference (gradients poisoned first),
then the mix launch alone and the whole backward are timed with
triton.testing.do_bench (median).
    source .gpu-cutile/env.sh && python3 benchmarks/probes/pre_mix_probe.py
"""
from __future__ import annotations

import dataclasses
import os
import sys
import traceback

# benchmarks/probes/ -> the repository root (for tilekernels)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from tilekernels._cutile import run_all  # noqa: E402
from tilekernels.mhc import cutile_pre as pre  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, upcast  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
PARAMS = (0.7, 1.3, 0.4)  # alpha_pre, alpha_post, alpha_res
EPS = 1e-6


def bench(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def variants(T, n, C, iters, tts=(128, 64, 32)):
    tile = pre.PreCfg.heuristic(T, n, C, iters, mix_entries=False)
    ent = pre.PreCfg.heuristic(T, n, C, iters)
    return [("tile", tile)] + [(f"entries TT={tt}", dataclasses.replace(ent, TT=tt)) for tt in tts]


def run_shape(T, n, C, iters=20, time_it=True, tts=(128, 64, 32)):
    N = n * n + 2 * n
    x = torch.randn(T, n, C, device="cuda").to(BF)
    w = (torch.randn(N, n * C, device="cuda") * (n * C) ** -0.5).to(BF)
    b = torch.randn(N, device="cuda")
    params = (*PARAMS, iters, EPS, EPS)
    outs = [torch.empty(s, dtype=dt, device="cuda") for s, dt in
            (((T, C), BF), ((T, n), F32), ((T, n, n), F32), ((T, N), F32), ((T,), F32))]
    run_all(pre.fwd_launches(x, w, b, *outs, *params))
    dli, dhp, dhr = torch.randn(T, C, device="cuda").to(BF), torch.randn(T, n, device="cuda"), \
        torch.randn(T, n, n, device="cuda")
    x64, w64, b64 = upcast(x), upcast(w), upcast(b)
    p64, r64 = ref.proj_rms(x64.reshape(T, n * C), w64, EPS)
    want = ref.mhc_pre_bwd(upcast(dli), upcast(dhp), upcast(dhr), x64, w64, b64, p64, r64, *params)
    del x64, w64, p64
    rows = []
    for name, cfg in variants(T, n, C, iters, tts):
        try:
            grads = [torch.full(t.shape, float("nan"), dtype=t.dtype, device="cuda") for t in (x, w, b)]
            ls = pre.bwd_launches(dli, dhp, dhr, x, w, b, outs[3], outs[4], *grads, *params, cfg=cfg)
            run_all(ls)
            errs = [assert_close(g, wt, what=k) for g, wt, k in zip(grads, want, ("dx", "dweight", "dbias"))]
            mix = ls[1]
            t_mix = bench(mix.run) if time_it else float("nan")
            t_all = bench(lambda: run_all(ls)) if time_it else float("nan")
            rows.append((f"T={T} n={n} C={C} {name} ({mix.kernel._pyfunc.__name__}, grid {mix.grid[0]})",
                         t_mix, t_all, max(errs)))
            print("|", rows[-1][0], f"| {t_mix:.4f} | {t_all:.4f} | {max(errs):.1e} |", flush=True)
        except Exception:
            print("FAIL", T, n, C, name, traceback.format_exc(limit=3), flush=True)
    return rows


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "commit", os.environ.get("TILEKERNELS_COMMIT", "?"), flush=True)
    rows = []
    for T, n, C in [(37, 3, 100), (1, 1, 64)]:
        rows += run_shape(T, n, C, iters=3, time_it=False)
    rows += run_shape(32768, 4, 7168)
    rows += run_shape(8192, 8, 4096, tts=(128,))  # n = 8: each entries variant compiles ~80 s
    print("\n| mhc_pre bwd, mix config | mix ms | whole bwd ms | max rel err |\n|---|---:|---:|---:|")
    for name, a, b, e in rows:
        print(f"| {name} | {a:.4f} | {b:.4f} | {e:.1e} |")
