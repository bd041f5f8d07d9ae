#!/usr/bin/env python3
"""Is h_post_bda's fp32-h backward ~10 us slower than bf16 h because of h's dtype, or because of where the
activations land? (H200, T=32768, n=4, C=7168; issue 15's h_post_bda target, 2.55 ms fwd+bwd, is met with bf16 h
and missed by ~5-15 us with fp32 h; sessions 14-30 found the same DRAM bytes and load requests for both dtypes, and
no kernel change moved the gap.) The harness allocates h_res [T, n, n] first, so fp32 h (2 MiB) and bf16 h (1 MiB)
put residual, x, dout and the gradients at other addresses. This times the cute kernels (fwd_into; bwd_into, the
pass and its dbias reduction) for each h dtype with h allocated first (as the harness) or after every activation
(the activations then at the same addresses for both dtypes), behind a pad allocation of 0 or 1 MiB, in rotated
order each round; prints each case's big tensors' addresses modulo 2 MiB and the medians.

    source .gpu-cute/env.sh && python3 benchmarks/probes/post_bda_layout_probe.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, save_probe_record  # noqa: E402

T, n, C = 32768, 4, 7168


def _case(hd, h_last: bool, pad: int):
    """Inputs, outputs and the pad, allocated in the case's order (bf16 activations, h of dtype hd)."""
    bf = torch.bfloat16
    keep = torch.empty(max(pad, 1), dtype=torch.uint8, device="cuda")

    def h():
        hr = torch.softmax(torch.randn(T, n, n, device="cuda"), -1)
        return hr.to(hd), (torch.rand(T, n, device="cuda") * 2).to(hd)

    hr, hp = (None, None) if h_last else h()
    res, x, bias = torch.randn(T, n, C, device="cuda").to(bf), torch.randn(T, C, device="cuda").to(bf), \
        torch.randn(C, device="cuda").to(bf)
    dout = torch.randn(T, n, C, device="cuda").to(bf)
    out = torch.empty_like(res)
    dres, dx, dbias = torch.empty_like(res), torch.empty_like(x), torch.empty_like(bias)
    if h_last:
        hr, hp = h()
    dhr, dhp = torch.empty_like(hr), torch.empty_like(hp)
    return dict(keep=keep, hr=hr, hp=hp, res=res, x=x, bias=bias, dout=dout, out=out, dres=dres, dx=dx, dbias=dbias,
                dhr=dhr, dhp=dhp)


def main() -> int:
    from tilekernels.mhc import cute_post_bda as cpb

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=100)
    o = ap.parse_args()
    cases = list(itertools.product((torch.float32, torch.bfloat16), (False, True), (0, 1 << 20)))
    times = {c: dict(fwd=[], bwd=[]) for c in cases}
    addrs = {}
    for rnd in range(o.rounds):
        for c in cases[rnd % len(cases):] + cases[:rnd % len(cases)]:
            hd, h_last, pad = c
            torch.cuda.empty_cache()
            t = _case(hd, h_last, pad)
            addrs[c] = {k: t[k].data_ptr() % (1 << 21) for k in ("res", "x", "dout", "out", "dres", "dx")}
            times[c]["fwd"].append(bench(lambda: cpb.fwd_into(t["hr"], t["res"], t["hp"], t["x"], t["bias"], t["out"]),
                                         o.rep) * 1e3)
            times[c]["bwd"].append(bench(lambda: cpb.bwd_into(t["dout"], t["hr"], t["res"], t["hp"], t["x"], t["bias"],
                                                              t["dhr"], t["dres"], t["dhp"], t["dx"], t["dbias"]),
                                         o.rep) * 1e3)
            del t
    rows = []
    print(f"{'h':9s} {'h alloc':8s} {'pad':>8s} {'fwd us':>9s} {'bwd us':>9s}  bwd rounds / addresses mod 2 MiB (KiB)")
    for c in cases:
        hd, h_last, pad = c
        f, b = statistics.median(times[c]["fwd"]), statistics.median(times[c]["bwd"])
        rows.append(dict(h=str(hd)[6:], h_last=h_last, pad=pad, fwd_us=f, bwd_us=b, fwd=times[c]["fwd"],
                         bwd=times[c]["bwd"], addr_mod_2MiB=addrs[c]))
        print(f"{str(hd)[6:]:9s} {'last' if h_last else 'first':8s} {pad:8d} {f:9.1f} {b:9.1f}  "
              f"{' '.join(f'{v:.1f}' for v in times[c]['bwd'])} / "
              f"{' '.join(f'{k}={v >> 10}' for k, v in addrs[c].items())}", flush=True)
    save_probe_record("post_bda_layout_probe", rows, T=T, n=n, C=C)
    return 0


if __name__ == "__main__":
    sys.exit(main())
