#!/usr/bin/env python3
"""Could mhc_pre's backward mix run beside the dh_pre pass instead of after it?

mhc_pre's backward head (cutile_pre.bwd_launches) runs the dh_pre pass (mhc_agg_bwd: reads out and dlayer_in, a
bandwidth-bound stream, ~530 us at T=32768, n=4, C=7168) and then the mix (mhc_pre_bwd_mix: Sinkhorn backward and
dproj, ~85 us, bound by its dependent chains, not by memory). Only the mix's pre entries need the pass's dh_pre;
its Sinkhorn backward does not. This times, on the same launches (timing only: the concurrent mix reads dh_pre
before the pass has written it, so its results are not used):

  pass, then mix (today's order)   |   pass alone   |   mix alone   |   mix on a side stream beside the pass

If "beside" is close to "pass alone", splitting the mix (Sinkhorn backward beside the pass, a small dh_pre-dependent
tail after it) would save about the mix's time in both mhc_pre's and mhc_post_pre's backward.

The mix is the one-kernel design (padded-tile Sinkhorn backward), the n <= 4 default when this ran (session 23, tree
313fd2c); since 346632d the default splits it (pre_mix_split_probe.py), and this probe pins the old design.

    source .gpu-cutile/env.sh && python3 benchmarks/probes/pre_mix_overlap_probe.py [--T 32768]
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench  # noqa: E402


from mhc_post_pre_check import PARAMS as _P  # noqa: E402  (issue 15's harness: the alphas and iters)

PARAMS = (_P["alpha_pre"], _P["alpha_post"], _P["alpha_res"], _P["iters"], 1e-6, 1e-6)  # + rms_eps, sinkhorn_eps


def pre_inputs(T: int, n: int, C: int, cfg):
    """mhc_pre's forward (cutile_pre.fwd_launches at ``cfg``) on random bf16 streams, then random incoming grads:
    (x, weight, hbias, proj, r, (dlayer_in, dh_post, dh_res)). Shared with pre_mix_split_probe.py."""
    from tilekernels.mhc import cutile_pre as pre

    N, dev, bf = n * n + 2 * n, "cuda", torch.bfloat16
    x = torch.randn(T, n, C, device=dev).to(bf)
    weight = (torch.randn(N, n * C, device=dev) * (n * C) ** -0.5).to(bf)
    hbias = torch.randn(N, device=dev) * 0.1
    layer_in, h_post, h_res = (torch.empty(T, C, device=dev, dtype=bf), torch.empty(T, n, device=dev),
                               torch.empty(T, n, n, device=dev))
    proj, r = torch.empty(T, N, device=dev), torch.empty(T, device=dev)
    for ln in pre.fwd_launches(x, weight, hbias, layer_in, h_post, h_res, proj, r, *PARAMS, cfg=cfg):
        ln.run()
    grads = (torch.randn(T, C, device=dev).to(bf), torch.randn(T, n, device=dev), torch.randn(T, n, n, device=dev))
    return x, weight, hbias, proj, r, grads


def main():
    from tilekernels.mhc import cutile_pre as pre

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--rep", type=int, default=200)
    o = ap.parse_args()
    T, n, C = o.T, o.n, o.C
    N = n * n + 2 * n
    cfg = pre.PreCfg.heuristic(T, n, C, 20, mix_entries=False)   # the one-kernel mix
    x, weight, hbias, proj, r, grads = pre_inputs(T, n, C, cfg)
    dweight, dbias = torch.empty(N, n * C, device="cuda", dtype=torch.bfloat16), torch.empty(N, device="cuda")
    pass_, mix, red = pre.bwd_launches(*grads, x, weight, hbias, proj, r, None, dweight, dbias, *PARAMS, cfg=cfg)
    side = torch.cuda.Stream()
    main_s = torch.cuda.current_stream()

    def beside():
        ev = torch.cuda.Event()
        ev.record(main_s)
        with torch.cuda.stream(side):
            side.wait_event(ev)
            mix.run()
            done = torch.cuda.Event()
            done.record(side)
        pass_.run()
        main_s.wait_event(done)

    rows = [("pass, then mix", lambda: (pass_.run(), mix.run())), ("pass alone", pass_.run), ("mix alone", mix.run),
            ("mix beside the pass", beside)]
    res = {}
    for rnd in range(2):
        for name, fn in rows:
            ms = bench(fn, o.rep)
            res.setdefault(name, []).append(ms * 1e3)
            print(f"round {rnd} {name:24s} {ms * 1e3:8.1f} us", flush=True)
    print(f"\nT={T} n={n} C={C}: us (two rounds)")
    for name, v in res.items():
        print(f"{name:24s} " + " ".join(f"{u:8.1f}" for u in v))


if __name__ == "__main__":
    main()
