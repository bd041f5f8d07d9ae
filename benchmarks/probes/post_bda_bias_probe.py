#!/usr/bin/env python3
"""What h_post_bda's dbias costs its backward, and vector h loads in the forward with fp32 h (session 55, issue 15).

Issue 15's h_post_bda with fp32 h sits ~4 us over 2.55 ms on the H200 (session 55: 2.5536-2.5550; bf16 h 2.540). Two
things no record had measured at today's default config: (1) the dbias path's share of the backward: bwd_into with
bias (the pass adds dx into its CTA's [C] fp32 slots, writes a [G, C] fp32 partial at its end, a PDL kernel sums the
G rows) against bias=None (none of that), and the dbias kernel alone on a [G, C] partial; (2) FHV (h_res[t], h_post[t]
by 16-byte vector loads) on today's forward (FSPLIT = KF, FCM) with fp32 h: round 2 (session 10) timed it with bf16 h
only (0.9901 against 0.9832 ms). FHV's out is checked bitwise against the default's first. Rows rotate over --rounds
rounds; do_bench medians (benchmarks/_gpu.bench). T=32768, n=4, C=7168, bf16 activations and bias.

    source .gpu-cute/env.sh && python3 benchmarks/probes/post_bda_bias_probe.py --out "$OUT"
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, save_probe_record  # noqa: E402
from mhc_cute_post_bda_time import BF, C, F32, T, _case, n  # noqa: E402  (the headline shape and its inputs)


def main():
    from tilekernels.mhc import cute_post_bda as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--db", default="", help="also the backward and the dbias kernel at these RG:DBV:DBU (comma list)")
    a = ap.parse_args()
    cfg = cp.PostBdaCuteCfg.heuristic(n, C, 2, True)
    hv = dataclasses.replace(cfg, FHV=True)
    G = min(T, torch.cuda.get_device_properties(0).multi_processor_count * cfg.CPS)
    times: dict = {}
    for hd in (F32, BF):
        hn = str(hd)[6:]
        (hr, res, hp, x, bias), dout = _case(hd)
        out, out_hv = torch.full_like(res, float("nan")), torch.full_like(res, float("nan"))
        cp.fwd_into(hr, res, hp, x, bias, out)
        cp.fwd_into(hr, res, hp, x, bias, out_hv, cfg=hv)
        torch.cuda.synchronize()
        assert torch.equal(out, out_hv), f"{hn}: FHV's out differs from the default's"
        grads = [torch.empty_like(t) for t in (hr, res, hp, x, bias)]
        nob = [torch.empty_like(t) for t in (hr, res, hp, x)] + [None]
        pb, db = torch.randn(G, C, device="cuda"), torch.empty(C, dtype=BF, device="cuda")
        rows = {"fwd default": lambda: cp.fwd_into(hr, res, hp, x, bias, out),
                "fwd FHV": lambda: cp.fwd_into(hr, res, hp, x, bias, out_hv, cfg=hv),
                "bwd with bias": lambda: cp.bwd_into(dout, hr, res, hp, x, bias, *grads),
                "bwd bias None": lambda: cp.bwd_into(dout, hr, res, hp, x, None, *nob),
                "dbias kernel alone": lambda: cp.dbias_launch(cfg, BF).run(pb, db, G)}
        for spec in [v for v in a.db.split(",") if v]:
            c = dataclasses.replace(cfg, **dict(zip(("RG", "DBV", "DBU"), map(int, spec.split(":")))))
            rows[f"bwd {spec}"] = lambda c=c: cp.bwd_into(dout, hr, res, hp, x, bias, *grads, cfg=c)
            rows[f"dbias alone {spec}"] = lambda c=c: cp.dbias_launch(c, BF).run(pb, db, G)
        cp.bwd_into(dout, hr, res, hp, x, bias, *grads)
        want = grads[3].double().sum(0)   # dbias = dx summed over the tokens (dx as written, bf16)
        for spec in [v for v in a.db.split(",") if v] + ["default"]:
            if spec != "default":
                rows[f"bwd {spec}"]()
            torch.cuda.synchronize()
            err = ((grads[4].double() - want).norm() / want.norm()).item()
            print(f"{hn} dbias {spec}: rel err {err:.2e} against dx summed in float64", flush=True)
            assert err < 1e-2, (spec, err)
        names = list(rows)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times.setdefault((hn, name), []).append(bench(rows[name], a.rep) * 1e3)
        hr = res = hp = x = bias = dout = out = out_hv = grads = nob = pb = None
        torch.cuda.empty_cache()
    out_rows = []
    print(f"h_post_bda's dbias and FHV, T={T} n={n} C={C}, G={G}; do_bench medians, us")
    for (hn, name), us in times.items():
        med = sorted(us)[len(us) // 2]
        out_rows.append({"h": hn, "what": name, "us": round(med, 1), "rounds": [round(v, 1) for v in us]})
        print(f"{hn:9s} {name:20s} {med:8.1f}  rounds {' '.join(f'{v:.1f}' for v in us)}", flush=True)
    save_probe_record("post_bda_bias_probe", out_rows, shape=dict(T=T, n=n, C=C, G=G))


if __name__ == "__main__":
    main()
