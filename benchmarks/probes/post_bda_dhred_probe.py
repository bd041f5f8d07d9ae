#!/usr/bin/env python3
"""h_post_bda's cute backward: what the per-token barrier of the dh sums costs (issue 15: fwd+bwd <= 2.55 ms with
fp32 h, 4-12 us short on recent leases). PostBdaCuteCfg.DHRED: "sync" (the default: every warp waits at one
barrier a token), "nb" (named barriers: warps 1.. arrive and go on, warp 0 sums; the same sums in the same order,
so bitwise the default's), "none" (probe only: no sum over the warps, wrong dh; the bound).

T=32768, n=4, C=7168, bf16 activations and bias, h fp32 and bf16. Per h dtype: "nb" and "none" checked against
"sync" (every gradient bitwise: nb must be equal; none's dh differ by design), then ROUNDS rounds of the bwd
kernels (bwd_into: the pass + its dbias reduction) in rotating order, then the registry's fwd+bwd in issue 15's
harness (torch.autograd.grad of the same pre-made dout, no .grad accumulation) with the heuristic's DHRED set to
each of sync / nb in turn. do_bench medians (benchmarks/_gpu.bench). JSON to --out.

    source .gpu-cute/env.sh && python3 benchmarks/probes/post_bda_dhred_probe.py --out "$OUT"
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

T, n, C = 32768, 4, 7168
BF, F32 = torch.bfloat16, torch.float32
MODES = ("sync", "nb", "none")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reg-rounds", type=int, default=2)
    a = ap.parse_args()
    import registry
    from tilekernels.mhc import cute_post_bda as cp

    res = probe_record(shape=dict(T=T, n=n, C=C))
    copy = res["copy_gb_s"]
    op = registry.get("mhc_h_post_bda")
    orig = cp.PostBdaCuteCfg.heuristic
    for hd in (F32, BF):
        hn = str(hd)[6:]
        g = lambda *s, dt=BF: torch.randn(*s, device="cuda").to(dt)  # noqa: E731
        ins = (g(T, n, n, dt=hd) * 0.5, g(T, n, C), g(T, n, dt=hd), g(T, C), g(C))
        dout = g(T, n, C)
        hb = hd.itemsize
        big = 2 * T * n * C
        bytes_b = 3 * big + 2 * hb * T * (n * n + n) + 2 * (2 * T * C) + 2 * 2 * C
        bytes_f = hb * T * (n * n + n) + big + 2 * T * C + 2 * C + big
        base = cp.PostBdaCuteCfg.heuristic(n, C, 2, True)
        cfgs = {m: dataclasses.replace(base, DHRED=m) for m in MODES}
        grads = [torch.empty_like(t) for t in ins]

        def row(what, ms, nbytes):
            r = {"h": hn, "what": what, "ms": round(ms, 4), "pct_copy": round(100 * nbytes / ms / 1e6 / copy, 1)}
            res["rows"].append(r)
            print(f"{hn:9s} {what:34s} {ms:8.4f} ms {r['pct_copy']:6.1f}% of copy", flush=True)

        try:
            want = None
            for m in MODES:
                for t in grads:
                    t.fill_(float("nan"))
                cp.bwd_into(dout, *ins, *grads, cfg=cfgs[m])
                got = [t.clone() for t in grads]
                if want is None:
                    want = got
                    continue
                same = [torch.equal(x, y) for x, y in zip(got, want)]
                res.setdefault("bitwise", {})[f"{hn} {m}"] = same
                print(f"{hn} {m} bitwise vs sync (dh_res, dres, dh_post, dx, dbias): {same}", flush=True)
            want = got = None
            for rd in range(a.rounds):
                order = MODES[rd % 3:] + MODES[:rd % 3]
                for m in order:
                    row(f"bwd kernels {m} r{rd}", bench(lambda: cp.bwd_into(dout, *ins, *grads, cfg=cfgs[m]), a.rep),
                        bytes_b)
            leaves = [t.detach().requires_grad_(True) for t in ins]
            for rd in range(a.reg_rounds):
                for m in (("sync", "nb") if rd % 2 == 0 else ("nb", "sync")):
                    cp.PostBdaCuteCfg.heuristic = classmethod(
                        lambda cls, *args, m=m: dataclasses.replace(orig(*args), DHRED=m))
                    torch.autograd.grad(op(*leaves, backend="cute"), leaves, dout)
                    row(f"registry fwd+bwd {m} r{rd}",
                        bench(lambda: torch.autograd.grad(op(*leaves, backend="cute"), leaves, dout), a.rep),
                        bytes_f + bytes_b)
                    cp.PostBdaCuteCfg.heuristic = orig
        except Exception:  # noqa: BLE001
            log_error(res["errors"], hn)
        finally:
            cp.PostBdaCuteCfg.heuristic = orig
        ins = dout = grads = leaves = None
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "post_bda_dhred_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\n| h | what | ms | % copy |")
    for r in res["rows"]:
        print(f"| {r['h']} | {r['what']} | {r['ms']:.4f} | {r['pct_copy']} |")


if __name__ == "__main__":
    main()
