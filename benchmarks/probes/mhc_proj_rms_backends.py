#!/usr/bin/env python3
"""mhc_proj_rms through the registry, every available backend in one process (issue 15's harness).

M=32768, N=24 (n=4), K=28672, bf16 x / weight. fwd = op(x, w, backend=b); fwd+bwd =
torch.autograd.grad((proj, r), (x, w), the same pre-made (dproj, dr)) (no .grad accumulation);
do_bench medians. Bytes by hand: fwd x (1.879 GB) + proj + r; bwd x + dx (2 x 1.879 GB) + dproj, dr,
r, dweight. The copy floor of fwd+bwd is 3 x 1.879 GB at the copy rate measured in the same run.
Also prints each backend's proj error against float64 and the relative differences of proj, r, dx,
dweight between the two backends (their summation orders differ, so not bitwise).

The cute and cutile backends need two toolchains in one process: on the GPU host, after a call that
unpacked .gpu-cutile (its env.sh puts it in /tmp/tk-cutile), source .gpu-cute/env.sh and add
/tmp/tk-cutile/site to PYTHONPATH and /tmp/tk-cutile/cu13/bin to PATH (CUDA_HOME unset):

    python3 benchmarks/probes/mhc_proj_rms_backends.py --out "$OUT"
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, copy_gb_s, device_env, log_error  # noqa: E402

M, N, K = 32768, 24, 28672


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep", type=int, default=200)
    ap.add_argument("--backends", default="cutile,cute")
    a = ap.parse_args()
    import registry
    from tilekernels.testing import rel_err

    op = registry.get("mhc_proj_rms")
    res = {"env": device_env(), "shape": dict(M=M, N=N, K=K), "rows": [], "errors": [], "checks": {}}
    copy = res["copy_gb_s"] = copy_gb_s()
    print(f"copy {copy:.0f} GB/s", flush=True)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") * 0.02).to(torch.bfloat16)
    dproj = torch.randn(M, N, device="cuda")
    dr = torch.randn(M, device="cuda")
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    sx = 2 * M * K
    fwd_b = sx + 4 * M * (N + 1)
    bwd_b = 2 * sx + 4 * M * (N + 2) + 2 * N * K
    p64 = x.double() @ w.double().t()
    outs = {}
    for b in [s for s in a.backends.split(",") if s]:
        try:
            proj, r = op(xl, wl, backend=b)
            gx, gw = torch.autograd.grad((proj, r), (xl, wl), (dproj, dr))
            torch.cuda.synchronize()
            outs[b] = (proj.detach(), r.detach(), gx, gw)
            res["checks"][b] = {"proj_vs_f64": rel_err(proj, p64)}
            print(f"{b}: proj rel err vs float64 {res['checks'][b]['proj_vs_f64']:.2e}", flush=True)

            def fwd():
                return op(xl, wl, backend=b)

            def step():
                p_, r_ = op(xl, wl, backend=b)
                torch.autograd.grad((p_, r_), (xl, wl), (dproj, dr))

            for what, fn, nb in (("fwd", fwd, fwd_b), ("fwd+bwd", step, fwd_b + bwd_b)):
                ms = bench(fn, a.rep)
                row = {"backend": b, "what": what, "ms": round(ms, 4), "pct_copy": round(100 * nb / ms / 1e6 / copy, 1)}
                res["rows"].append(row)
                print(f"{b:7s} {what:8s} {ms:8.4f} ms {row['pct_copy']:6.1f}% of copy", flush=True)
        except Exception:
            log_error(res["errors"], f"backend {b}")
    if len(outs) == 2:
        (b1, o1), (b2, o2) = outs.items()
        res["checks"]["between"] = {n: rel_err(u, v) for n, u, v in zip(("proj", "r", "dx", "dweight"), o2, o1)}
        print(f"{b2} vs {b1}: " + ", ".join(f"{k} {v:.2e}" for k, v in res["checks"]["between"].items()))
    floor = 3 * sx / copy / 1e6
    print(f"fwd+bwd copy floor {floor:.4f} ms")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "mhc_proj_rms_backends.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\n| backend | fwd ms | fwd+bwd ms |\n|---|---|---|")
    for b in outs:
        r_ = {row["what"]: row["ms"] for row in res["rows"] if row["backend"] == b}
        print(f"| {b} | {r_.get('fwd', float('nan')):.4f} | {r_.get('fwd+bwd', float('nan')):.4f} |")
    print(f"errors: {len(res['errors'])}")


if __name__ == "__main__":
    main()
