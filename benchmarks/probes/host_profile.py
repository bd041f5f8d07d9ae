#!/usr/bin/env python3
"""Device host: where the host time of one eager mHC call goes (registry op forward +
autograd backward) at a small T, where the GPU work is tiny and the host sets the pace.
Prints per-call host microseconds of each layer, then cProfile's top functions.
    source .gpu-cutile/env.sh && python3 benchmarks/probes/host_profile.py [--T 1024] [--gap]
"""
from __future__ import annotations

import argparse
import os
import sys

# benchmarks/probes/ -> benchmarks/ (for _host) and the repository root (for tilekernels)
_BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(_BENCH), _BENCH]

import torch  # noqa: E402

import registry  # noqa: E402
from tilekernels._cutile import run_all  # noqa: E402
from tilekernels._glue import get_kernel  # noqa: E402
from tilekernels.mhc import cutile_post_bda as pb  # noqa: E402
from _host import cprofile_top, per_call_us  # noqa: E402


def fwd_bwd(op, leaves, dout):
    for t in leaves:
        t.grad = None
    torch.autograd.backward(op(*leaves), dout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--gap", action="store_true", help="do_bench vs CUDA-graph times of each layer (T=32768)")
    a = ap.parse_args()
    T, n, C = a.T, 4, 7168
    r = lambda *s, dt=torch.bfloat16: torch.randn(*s, device="cuda").to(dt)  # noqa: E731
    hr, res, hp, x, b = r(T, n, n, dt=torch.float32), r(T, n, C), r(T, n, dt=torch.float32), r(T, C), r(C)
    dout = r(T, n, C)
    grads = [torch.empty_like(t) for t in (hr, res, hp, x, b)]
    op = registry.get("mhc_h_post_bda")
    leaves = [t.clone().requires_grad_() for t in (hr, res, hp, x, b)]
    fl, bl = pb.fwd_launches(hr, res, hp, x, b, torch.empty_like(res)), pb.bwd_launches(dout, hr, res, hp, x, b, *grads)
    kf, kb = get_kernel("mhc_h_post_bda", "cutile", "fwd"), get_kernel("mhc_h_post_bda", "cutile", "bwd")
    out = torch.empty_like(res)
    steps = {
        f"fwd prebuilt launches ({len(fl)})": lambda: run_all(fl),
        f"bwd prebuilt launches ({len(bl)})": lambda: run_all(bl),
        "fwd kernel fn (builds launches)": lambda: kf(hr, res, hp, x, b, out),
        "bwd kernel fn (builds launches, allocates partials)": lambda: kb(dout, hr, res, hp, x, b, *grads),
        "registry fwd (no grad)": lambda: op(hr, res, hp, x, b),
        "registry fwd + autograd bwd": lambda: fwd_bwd(op, leaves, dout),
        "torch.empty x3 (partials)": lambda: [torch.empty((1024, 7168), device="cuda") for _ in range(3)],
    }
    if a.gap:
        from triton.testing import do_bench, do_bench_cudagraph
        steps.pop("torch.empty x3 (partials)")
        for name, fn in steps.items():
            with torch.no_grad() if "no grad" in name else torch.enable_grad():
                e = do_bench(fn, warmup=25, rep=100, return_mode="median")
                g = do_bench_cudagraph(fn, rep=100, return_mode="median")
                print(f"{name:<55} do_bench {e:.3f} ms, graph {g:.3f} ms", flush=True)
        return
    for name, fn in steps.items():
        with torch.no_grad() if "no grad" in name else torch.enable_grad():
            print(f"{name:<55} {per_call_us(fn, n=500):8.1f} us/call", flush=True)
    print(cprofile_top(steps["registry fwd + autograd bwd"], 300, keys=("tottime", "cumulative")))


if __name__ == "__main__":
    main()
