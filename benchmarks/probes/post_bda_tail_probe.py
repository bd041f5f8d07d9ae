#!/usr/bin/env python3
"""Does the persistent h_post_bda backward lose time to its last partial round of tokens?

The CuTe DSL bwd (cute_post_bda) runs G = 2 x SMs CTAs over tokens t = g, g + G, ...; at T=32768 on 132 SMs (G=264)
232 CTAs take 124 tokens and 32 take 125, so the kernel ends one token-time after most CTAs are done. This times
the bwd kernels (bwd_into: the pass + its dbias reduction) at T = 264 k (every CTA the same count) and between,
fp32 and bf16 h, and prints us a token-round: if the partial round costs a whole round, t(32768) ~ t(33000).

    source .gpu-cute/env.sh && python3 benchmarks/probes/post_bda_tail_probe.py [--Ts 32736,32768,33000]
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench  # noqa: E402


def main():
    from tilekernels.mhc import cute_post_bda as cpb

    ap = argparse.ArgumentParser()
    ap.add_argument("--Ts", default="32736,32768,33000,32736,32768,33000")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--rep", type=int, default=100)
    o = ap.parse_args()
    n, C = o.n, o.C
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for hd in (torch.float32, torch.bfloat16):
        for T in [int(t) for t in o.Ts.split(",")]:
            g = lambda *s, dt=torch.bfloat16: torch.randn(*s, device="cuda").to(dt)  # noqa: E731
            h_res, res, h_post, x, bias = g(T, n, n, dt=hd), g(T, n, C), g(T, n, dt=hd), g(T, C), g(C)
            dout = g(T, n, C)
            outs = (torch.empty_like(h_res), torch.empty_like(res), torch.empty_like(h_post), torch.empty_like(x),
                    torch.empty_like(bias))
            ms = bench(lambda: cpb.bwd_into(dout, h_res, res, h_post, x, bias, *outs), o.rep)
            G = min(T, sms * cpb.config(res, True).CPS)
            rounds = -(-T // G)
            rows.append((str(hd)[6:], T, G, T / G, ms))
            print(f"{str(hd)[6:]:9s} T={T:6d} G={G} tokens/CTA {T / G:7.2f} (rounds {rounds}) bwd {ms * 1e3:8.1f} us "
                  f"= {ms * 1e3 / rounds:6.2f} us a round, {ms * 1e6 / T:6.2f} ns a token", flush=True)
            del h_res, res, h_post, x, bias, dout, outs
    print("\nh         T       tokens/CTA   bwd us")
    for h, T, G, tpc, ms in rows:
        print(f"{h:9s} {T:6d} {tpc:10.2f} {ms * 1e3:9.1f}")


if __name__ == "__main__":
    main()
