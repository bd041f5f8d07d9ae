#!/usr/bin/env python3
"""GPU timing of mhc_h_aggregate at issue 15's shape: the CuTe DSL kernels (tilekernels/mhc/cute_aggregate.py)
and their A/B configs, or (--backend cutile) the registry rows of another backend, in one harness.

T=32768, n=4, C=7168, bf16 x, h_pre fp32 and bf16. Bytes by hand (every input read once, every
output written once): fwd x + h + out = 1.88 + 0.47 GB (+ h), bwd dout + x + h + dx + dh = 0.47 + 2 x
1.88 GB (+ 2 h). Rows (do_bench median, benchmarks/_gpu.bench): with --backend cute the kernels
(fwd_into, bwd_into) at the heuristic's config and at each A/B config of
tests/mhc/test_mhc_cute_aggregate.py (run once first and compared bitwise with the default's results:
"(DIFFERS)" marks another summation order); for every backend the registry's fwd and fwd+bwd in
the peers' harness (fwd+bwd = torch.autograd.grad(out, leaves, the same pre-made dout): no .grad
accumulation). % of the copy bandwidth measured in the same process. Table last; JSON to --out.

    source .gpu-cute/env.sh && python3 benchmarks/probes/mhc_cute_aggregate_time.py --out "$OUT"
    source .gpu-cutile/env.sh && python3 benchmarks/probes/mhc_cute_aggregate_time.py --backend cutile --out "$OUT"
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests", "mhc")]

import torch  # noqa: E402

from _gpu import bench, log_error, probe_record  # noqa: E402

T, n, C = 32768, 4, 7168
BF, F32 = torch.bfloat16, torch.float32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--backend", default="cute")
    ap.add_argument("--grids", default="", help="also the bwd kernel on these grids (comma list; T: a token a CTA)")
    ap.add_argument("--no-ab", action="store_true", help="skip the A/B configs")
    a = ap.parse_args()
    import registry

    op = registry.get("mhc_h_aggregate")
    res = probe_record(backend=a.backend, shape=dict(T=T, n=n, C=C))
    copy = res["copy_gb_s"]
    for hd in (F32, BF):
        hn, hb = str(hd)[6:], hd.itemsize
        x = torch.randn(T, n, C, device="cuda").to(BF)
        h = torch.randn(T, n, device="cuda").to(hd)
        dout = torch.randn(T, C, device="cuda").to(BF)
        bytes_f = 2 * T * n * C + hb * T * n + 2 * T * C
        bytes_b = 2 * T * C + 2 * (2 * T * n * C) + 2 * hb * T * n

        def row(name, ms, nbytes):
            r = {"h": hn, "what": name, "ms": round(ms, 4), "gb": round(nbytes / 1e9, 3),
                 "pct_copy": round(100 * nbytes / ms / 1e6 / copy, 1)}
            res["rows"].append(r)
            print(f"{hn:9s} {name:30s} {ms:8.4f} ms {r['pct_copy']:6.1f}% of copy", flush=True)

        try:
            if a.backend == "cute":
                import test_mhc_cute_aggregate as tc

                from tilekernels.mhc import cute_aggregate as ca
                out, dx, dh = torch.empty(T, C, dtype=BF, device="cuda"), torch.empty_like(x), torch.empty_like(h)
                ca.fwd_into(x, h, out)
                ca.bwd_into(dout, x, h, dx, dh)
                want = (out.clone(), dx.clone(), dh.clone())
                row("fwd kernel", bench(lambda: ca.fwd_into(x, h, out), a.rep), bytes_f)
                row("bwd kernel", bench(lambda: ca.bwd_into(dout, x, h, dx, dh), a.rep), bytes_b)
                for g in [int(v) for v in a.grids.split(",") if v]:  # session 20: the persistent grid vs more CTAs
                    ca.bwd_into(dout, x, h, dx, dh, grid=g)
                    same = torch.equal(dx, want[1]) and torch.equal(dh, want[2])
                    row(f"bwd grid {g}{'' if same else ' (DIFFERS)'}",
                        bench(lambda: ca.bwd_into(dout, x, h, dx, dh, grid=g), a.rep), bytes_b)
                base = ca.AggCuteCfg.heuristic(n, C, 2)
                for name, kw in ({} if a.no_ab else tc.AB_CONFIGS).items():
                    cfg = dataclasses.replace(base, **kw)
                    try:
                        if name in tc.FWD_AB:
                            ca.fwd_into(x, h, out, cfg=cfg)
                            same = torch.equal(out, want[0])
                            ms, nb = bench(lambda: ca.fwd_into(x, h, out, cfg=cfg), a.rep), bytes_f
                        else:
                            ca.bwd_into(dout, x, h, dx, dh, cfg=cfg)
                            same = torch.equal(dx, want[1]) and torch.equal(dh, want[2])
                            ms, nb = bench(lambda: ca.bwd_into(dout, x, h, dx, dh, cfg=cfg), a.rep), bytes_b
                        row(f"{'fwd' if nb == bytes_f else 'bwd'} {name}{'' if same else ' (DIFFERS)'}", ms, nb)
                    except Exception:  # noqa: BLE001
                        log_error(res["errors"], f"{hn} {name}")
                out = dx = dh = want = None
            leaves = [x.detach().requires_grad_(True), h.detach().requires_grad_(True)]
            torch.autograd.grad(op(*leaves, backend=a.backend), leaves, dout)
            row(f"registry fwd ({a.backend})", bench(lambda: op(x, h, backend=a.backend), a.rep), bytes_f)
            row(f"registry fwd+bwd ({a.backend})",
                bench(lambda: torch.autograd.grad(op(*leaves, backend=a.backend), leaves, dout), a.rep),
                bytes_f + bytes_b)
        except Exception:  # noqa: BLE001
            log_error(res["errors"], hn)
        x = h = dout = leaves = None
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, f"mhc_aggregate_{a.backend}_time.json"), "w") as f:
        json.dump(res, f, indent=1)
    floor = (2 * T * n * C + 4 * T * n + 2 * T * C) + (2 * T * C + 4 * T * n * C + 8 * T * n)
    print(f"\nfloor at {copy:.0f} GB/s: fwd+bwd {1e3 * floor / 1e9 / copy:.4f} ms (fp32 h)")
    print("| h | what | ms | % copy |")
    for r in res["rows"]:
        print(f"| {r['h']} | {r['what']} | {r['ms']:.4f} | {r['pct_copy']} |")


if __name__ == "__main__":
    main()
