#!/usr/bin/env python3
"""GPU timing of cute_post_pre_dhdw's pass alone (SPLIT_DW's dh_pre partials + dweight post / res rows) at issue 15's
shape (bytes: out and dlayer_in read once; the reference rows count their own), under config variants: STAGES, row groups (GM), and the probe-only SKIP bits (1: no dh partials, 2: no wgmmas,
4: no [hi | lo] build; their results are wrong), against the two passes it stands for (the dh_pre pass and the dweight
pass) and a torch copy of the same bytes. do_bench median, us; a table last.

    source .gpu-cute/env.sh; python3 benchmarks/probes/dhdw_probe.py [--rows default,SKIP=1,STAGES=3,GM=14] [--out $OUT]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="default,SKIP=1,SKIP=2,SKIP=4,SKIP=7,STAGES=3,STAGES=2,GM=14,GM=28,default")
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--out")
    o = ap.parse_args()
    import triton.testing as tt

    from tilekernels.mhc import cute_post_pre_dhdw as DD
    from tilekernels.mhc import cute_proj_rms as cpr

    T, n, C = o.T, o.n, o.C
    N = n * n + 2 * n
    dev, bf, f32 = "cuda", torch.bfloat16, torch.float32
    out = torch.randn(T, n, C, device=dev).to(bf)
    dl = torch.randn(T, C, device=dev).to(bf)
    dproj0 = torch.randn(T, 32, device=dev)
    base = DD.PostPreDhdwCuteCfg.heuristic(n, C, N, 32)
    nbytes = (out.numel() + dl.numel()) * 2
    res = []

    def add(name, fn, nb=nbytes):
        """One row: do_bench median of fn, and nb (the row's own bytes moved, counted by hand) / time."""
        us = tt.do_bench(fn, warmup=5, rep=60, return_mode="median") * 1e3
        res.append(dict(row=name, us=us, gb=nb / 1e9, tbps=nb / us / 1e6))
        print(f"{name:22s} {us:8.1f} us  {nb / us / 1e6:6.2f} TB/s", flush=True)

    dst = torch.empty_like(out)
    add("copy out (read+write)", lambda: dst.copy_(out), 2 * out.numel() * 2)
    dw = torch.empty(N, n * C, device=dev, dtype=bf)
    dpn = dproj0[:, :N].contiguous()
    add("dweight pass", lambda: cpr.dweight_into(dpn, out.view(T, n * C), dw), out.numel() * 2)
    for spec in o.rows.split(","):
        ch = {} if spec == "default" else {k: int(v) for k, v in (kv.split("=") for kv in spec.split(":"))}
        gm = ch.pop("GM", DD.row_groups(T))
        cfg = dataclasses.replace(base, **ch)
        p_dh = torch.empty(cfg.S, T, n, device=dev, dtype=f32)
        p_dw = torch.empty(gm + 1, N, n * C, device=dev, dtype=f32)
        ln = DD.launch(cfg)
        add(spec, lambda: ln.run(out, dl, dproj0, p_dh, p_dw, T, gm))
    print(f"\ncute_post_pre_dhdw alone, {torch.cuda.get_device_name()}, T={T} n={n} C={C}; bytes {nbytes / 1e9:.3f} GB")
    for r in res:
        print(f"{r['row']:22s} {r['us']:8.1f} us  {r['tbps']:6.2f} TB/s")
    if o.out:
        with open(os.path.join(o.out, "dhdw_probe.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
