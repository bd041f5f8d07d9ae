#!/usr/bin/env python3
"""Probe: what h_post_bda's cute backward would gain from fewer dh_res FMAs (H200, T=32768, n=4, C=7168; issue 15's
h_post_bda target, 2.55 ms fwd+bwd, missed by ~5-15 us with fp32 h). The backward pass runs at the board's 700 W cap
(power_probe.py, session 37), so instructions cost time through the clock. dh_res [t, i, j] = sum_c dout[t, i, c]
residual[t, j, c] is 16 of the pass's 40 FMAs a (token, channel) at n = 4; a tensor-core dh_res would take them off
the FMA pipe. PostBdaCuteCfg.CUT 1 (probe only, wrong dh_res; bwd_into refuses it) keeps stream 0's row only (4 of
the 16; residual still loaded and converted), the ceiling of such a design before its own costs. Times the backward
kernels (the pass and its dbias reduction, as bwd_into launches them) for fp32 and bf16 h, CUT 0 / 1, rotated order
each round, do_bench medians; checks CUT 0's dresidual / dx / dh against bwd_into's bitwise.

    source .gpu-cute/env.sh && python3 benchmarks/probes/post_bda_cut_probe.py [--rounds 4]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, save_probe_record  # noqa: E402

T, n, C = 32768, 4, 7168


def main() -> int:
    from tilekernels.mhc import cute_post_bda as B

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rep", type=int, default=100)
    o = ap.parse_args()
    bf = torch.bfloat16
    res, x, bias, dout = (torch.randn(*s, device="cuda").to(bf) for s in ((T, n, C), (T, C), (C,), (T, n, C)))
    hs = {hd: (torch.softmax(torch.randn(T, n, n, device="cuda"), -1).to(hd), (torch.rand(T, n, device="cuda") * 2)
               .to(hd)) for hd in (torch.float32, bf)}
    base = B.config(res, True)
    G = min(T, torch.cuda.get_device_properties(0).multi_processor_count * base.CPS)
    dres, dx, dbias = torch.empty_like(res), torch.empty_like(x), torch.empty_like(bias)
    pb = torch.empty(G, C, device="cuda")

    def runner(hd, cut):
        hr, hp = hs[hd]
        dhr, dhp = torch.empty_like(hr), torch.empty_like(hp)
        cfg = dataclasses.replace(base, CUT=cut)
        ln, db = B.bwd_launch(cfg, hd, bf, bf), B.dbias_launch(cfg, bf)

        def run():
            ln.run(dout, hr, res, hp, x, bias, dres, dx, dhr, dhp, pb, T, G)
            db.run(pb, dbias, G)
        return run, (dres, dx, dhr, dhp, dbias)

    ok = {}
    for hd in hs:   # CUT 0 through the launches here = bwd_into (same config), bitwise
        run, outs = runner(hd, 0)
        run()
        got = [t.clone() for t in outs]
        want = [torch.empty_like(t) for t in outs]
        hr, hp = hs[hd]
        B.bwd_into(dout, hr, res, hp, x, bias, want[2], want[0], want[3], want[1], want[4])
        ok[str(hd)[6:]] = all(torch.equal(a, b) for a, b in zip(got, want))
    print("CUT 0 launches bitwise bwd_into:", ok, flush=True)
    cases = [(hd, cut) for hd in hs for cut in (0, 1)]
    times = {c: [] for c in cases}
    for rnd in range(o.rounds):
        for c in cases[rnd % len(cases):] + cases[:rnd % len(cases)]:
            run, _ = runner(*c)
            times[c].append(bench(run, o.rep) * 1e3)
    rows = []
    print(f"{'h':9s} {'CUT':>3s} {'bwd us':>9s}  rounds")
    for c in cases:
        m = statistics.median(times[c])
        rows.append(dict(h=str(c[0])[6:], CUT=c[1], us=m, rounds=times[c]))
        print(f"{str(c[0])[6:]:9s} {c[1]:3d} {m:9.1f}  {' '.join(f'{v:.1f}' for v in times[c])}", flush=True)
    save_probe_record("post_bda_cut_probe", rows, T=T, n=n, C=C, cut0_bitwise=ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
