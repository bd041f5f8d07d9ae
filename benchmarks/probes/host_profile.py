#!/usr/bin/env python3
"""Device host: where the host time of one eager mHC call goes (registry op forward +
autograd backward) at a small T, where the GPU work is tiny and the host sets the pace.
Prints per-call host microseconds of each layer, then cProfile's top functions.
    source .gpu-cutile/env.sh && python3 benchmarks/probes/host_profile.py [--T 1024] [--gap]
    ... host_profile.py --sinkhorn [--T 32768]   (issue 15: where eager sinkhorn fwd+bwd's time goes)
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
    ap.add_argument("--sinkhorn", action="store_true", help="mhc_sinkhorn's layers instead (n=4)")
    a = ap.parse_args()
    if a.sinkhorn:
        return sinkhorn(a.T)
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


def sinkhorn(T: int, n: int = 4, iters: int = 20, eps: float = 1e-6) -> None:
    """mhc_sinkhorn eager fwd+bwd (the issue's <= 0.08 ms target): host us per call of each
    layer (queued back to back, one sync), do_bench / CUDA-graph ms of the full step, and
    cProfile of the registry step. Every fwd+bwd step sets grads to None and backpropagates
    the same pre-made dout."""
    from triton.testing import do_bench, do_bench_cudagraph

    logits = torch.randn(T, n, n, device="cuda")
    dout = torch.randn(T, n, n, device="cuda")
    out, dl = torch.empty_like(logits), torch.empty_like(logits)
    op = registry.get("mhc_sinkhorn")
    leaf = logits.clone().requires_grad_()
    kf, kb = get_kernel("mhc_sinkhorn", "cutile", "fwd"), get_kernel("mhc_sinkhorn", "cutile", "bwd")
    params = dict(iters=iters, eps=eps)
    with torch.no_grad():
        chosen = op.choose(op.bind(logits, **params))
    assert chosen == "cutile", chosen

    def step(f):
        def run():
            leaf.grad = None
            torch.autograd.backward(f(leaf), dout)
        return run

    stub = lambda *a, **k: None  # noqa: E731
    real_entry = op.entry

    def registry_only():
        op._entry = stub
        try:
            op(leaf, **params)
        finally:
            op._entry = real_entry

    steps = {
        "fwd kernel fn (launch)": (False, lambda: kf(logits, out, iters, eps)),
        "bwd kernel fn (launch)": (False, lambda: kb(dout, logits, dl, iters, eps)),
        "torch.empty_like": (False, lambda: torch.empty_like(logits)),
        "registry alone (entry stubbed, grad mode)": (True, registry_only),
        "entry fwd (no grad)": (False, lambda: real_entry(logits, backend="cutile", **params)),
        "registry fwd (no grad)": (False, lambda: op(logits, **params)),
        "entry fwd (grad: autograd.Function)": (True, lambda: real_entry(leaf, backend="cutile", **params)),
        "entry fwd + autograd bwd": (True, step(lambda x: real_entry(x, backend="cutile", **params))),
        "registry fwd + autograd bwd": (True, step(lambda x: op(x, **params))),
    }
    for name, (grad, fn) in steps.items():
        with torch.enable_grad() if grad else torch.no_grad():
            print(f"{name:<45} {per_call_us(fn, n=2000):8.1f} us/call (host)", flush=True)
    for name in ("entry fwd + autograd bwd", "registry fwd + autograd bwd"):
        fn = steps[name][1]
        e = do_bench(fn, warmup=25, rep=200, return_mode="median")
        g = do_bench_cudagraph(fn, rep=100, return_mode="median")
        print(f"{name:<45} do_bench {e * 1e3:.1f} us, graph {g * 1e3:.1f} us (T={T} n={n} iters={iters})",
              flush=True)
    print(cprofile_top(steps["registry fwd + autograd bwd"][1], 2000, keys=("tottime",)))


if __name__ == "__main__":
    main()
