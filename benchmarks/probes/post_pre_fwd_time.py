#!/usr/bin/env python3
"""GPU timing of mhc_post_pre's fused forward pass alone (cute_post_pre_fwd) at issue 15's shape, its configs side by
side in alternating rounds (do_bench median, us), each checked bitwise against the default config's out and within
fp32 rounding of its projection / squares partials summed over the planes.

Run on the GPU: ``python benchmarks/probes/post_pre_fwd_time.py [--rounds 3] [--cfgs default,h2]`` (cute bundle);
JSON to $OUT. Config names: default (the heuristic's), h2 (H2), h2s4 / h2s16 (H2 at SPLIT 4 / 16), h2st2 (H2, 2 stages).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from tilekernels.mhc import cute_post_pre_fwd as F


def _cfgs(n, C, N, NPAD):
    base = F.PostPreFwdCuteCfg.heuristic(n, C, N, NPAD, True, h2=False)
    h2 = F.PostPreFwdCuteCfg.heuristic(n, C, N, NPAD, True, h2=True)
    return {"default": base, "h2": h2, "h2s4": dataclasses.replace(h2, SPLIT=4),
            "h2s16": dataclasses.replace(h2, SPLIT=16), "h2st2": dataclasses.replace(h2, STAGES=2)}


def main(argv=None) -> int:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cfgs", default="default,h2")
    ap.add_argument("--T", type=int, default=32768)
    a = ap.parse_args(argv)
    T, n, C = a.T, 4, 7168
    N, NPAD = n * n + 2 * n, 32
    dev, bf, f32 = "cuda", torch.bfloat16, torch.float32
    res = torch.randn(T, n, C, device=dev, dtype=bf)
    x = torch.randn(T, C, device=dev, dtype=bf)
    bias = torch.randn(C, device=dev, dtype=bf)
    w = (torch.randn(N, n * C, device=dev) / (n * C) ** 0.5).to(bf)
    hres = torch.rand(T, n, n, device=dev, dtype=f32)
    hpost = torch.rand(T, n, device=dev, dtype=f32)
    nbytes = 2 * (2 * res.numel() + x.numel())
    big = torch.empty_like(res)
    t_copy = do_bench(lambda: big.copy_(res), warmup=25, rep=200) * 1e3
    rate = 2 * 2 * res.numel() / t_copy
    cfgs = {k: v for k, v in _cfgs(n, C, N, NPAD).items() if k in a.cfgs.split(",")}
    runs, ref = {}, None
    for name, cfg in cfgs.items():
        out = torch.full_like(res, float("nan"))
        pp = torch.full((cfg.SPLIT, T, NPAD), float("nan"), device=dev)
        ps = torch.full((cfg.SPLIT, T), float("nan"), device=dev)
        ln = F.launch(cfg)
        args = (res, x, bias, w, hres, hpost, out, pp, ps, T)
        ln.run(*args)
        torch.cuda.synchronize()
        sums = (pp.double().sum(0), ps.double().sum(0))
        if ref is None:
            ref = (out.clone(), sums)
            chk = "ref"
        else:
            e_p = ((sums[0] - ref[1][0]).norm() / ref[1][0].norm()).item()
            e_s = ((sums[1] - ref[1][1]).norm() / ref[1][1].norm()).item()
            chk = f"out {'bitwise' if torch.equal(out, ref[0]) else 'DIFFERS'}, proj {e_p:.1e}, ss {e_s:.1e}"
        runs[name] = dict(cfg=dataclasses.asdict(cfg), check=chk, us=[], ln=ln, args=args)
    for _ in range(a.rounds):
        for name, rr in runs.items():
            rr["us"].append(do_bench(lambda: rr["ln"].run(*rr["args"]), warmup=25, rep=200) * 1e3)
    rows = []
    print(f"fused forward pass, T={T} n={n} C={C}: {nbytes / 1e9:.2f} GB; copy {rate / 1e6:.3f} TB/s")
    for name, rr in runs.items():
        best = min(rr["us"])
        rows.append(dict(name=name, us=rr["us"], pct_copy=100 * nbytes / best / rate, check=rr["check"],
                         cfg=rr["cfg"]))
        print(f"{name:8s} " + " ".join(f"{u:8.1f}" for u in rr["us"]) + f"  {rows[-1]['pct_copy']:5.1f}%  "
              f"{rr['check']}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "post_pre_fwd_time.json"), "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), T=T, n=n, C=C, bytes=nbytes, copy_us=t_copy,
                           rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
