#!/usr/bin/env python3
"""Device host: where the host time of one eager mHC call goes (registry op forward +
autograd backward) at a small T, where the GPU work is tiny and the host sets the pace.
Prints per-call host microseconds of each layer, then cProfile's top functions.
    source .gpu-cutile/env.sh && python3 benchmarks/probes/host_profile.py [--T 1024] [--gap]
    ... host_profile.py --sinkhorn [--T 32768]   (issue 15: where eager sinkhorn fwd+bwd's time goes,
        with a fresh and with a reused backward scratch)
    ... host_profile.py --sinkhorn-ab [--T 32768]   (the sinkhorn's cute and cutile backends side by side, with
        torch's own autograd floor measured the same two ways: host us a call and do_bench)
    ... [--src DIR]   (the library from another checkout: a before / after in alternating processes)
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

# benchmarks/probes/ -> benchmarks/ (for _host) and the repository root (for tilekernels); --src DIR (parsed here,
# before the library is imported): the library from another checkout's tree instead (before / after in two processes)
_BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else os.path.dirname(_BENCH)
sys.path[:0] = [_SRC, _BENCH]

import torch  # noqa: E402

import registry  # noqa: E402
from tilekernels._glue import get_kernel, workspace_reuse  # noqa: E402
from _host import cprofile_top, per_call_us  # noqa: E402
from _host import general_path as _host_general_path  # noqa: E402


class Null(torch.autograd.Function):
    """autograd's own floor: one node, no allocation, no kernel."""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class NullAlloc(torch.autograd.Function):
    """one node, allocating its output and its input grad (as the generated op does)."""
    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g)


def _fwd_bwd_step(leaf, dout, f):
    """A step of issue 15's harness: the leaf's grad set to None, f(leaf) backpropagated with the same dout."""
    def run():
        leaf.grad = None
        torch.autograd.backward(f(leaf), dout)
    return run


def fwd_bwd(op, leaves, dout):
    for t in leaves:
        t.grad = None
    torch.autograd.backward(op(*leaves), dout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--gap", action="store_true", help="do_bench vs CUDA-graph times of each layer (T=32768)")
    ap.add_argument("--sinkhorn", action="store_true", help="mhc_sinkhorn's layers instead (n=4)")
    ap.add_argument("--sinkhorn-ab", action="store_true", help="mhc_sinkhorn's backends side by side (n=4)")
    ap.add_argument("--rounds", type=int, default=3, help="--sinkhorn-ab's interleaved rounds")
    ap.add_argument("--backends", default="cute,cutile", help="--sinkhorn-ab's backends (cute alone: no cuTile needed)")
    ap.add_argument("--src", help="import the library from this checkout's tree (tilekernels/, registry/, specs/)")
    a = ap.parse_args()
    if a.sinkhorn:
        return sinkhorn(a.T)
    if a.sinkhorn_ab:
        return sinkhorn_ab(a.T, rounds=a.rounds, backends=tuple(a.backends.split(",")))
    from tilekernels._cutile import run_all
    from tilekernels.mhc import cutile_post_bda as pb

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
    """mhc_sinkhorn eager fwd+bwd (issue 15's <= 0.08 ms target) in two modes: ``fresh`` (a
    new backward scratch per call) and ``reused`` (the per-stream ``workspace``: the default).
    Host us per call of each layer (queued back to back, one sync; the launch
    steps also at T=256, where the GPU work cannot set the pace), do_bench / CUDA-graph us of
    the full step, the breakdown, and cProfile of the registry step. Every fwd+bwd step sets
    grads to None and backpropagates the same pre-made dout."""
    from triton.testing import do_bench, do_bench_cudagraph

    from tilekernels._glue import empty
    from tilekernels.mhc import cutile_sinkhorn as sk

    logits = torch.randn(T, n, n, device="cuda")
    small = torch.randn(256, n, n, device="cuda")
    small_out = torch.empty_like(small)
    dout = torch.randn(T, n, n, device="cuda")
    out, dl = torch.empty_like(logits), torch.empty_like(logits)
    op = registry.get("mhc_sinkhorn")
    leaf = logits.clone().requires_grad_()
    kf, kb = get_kernel("mhc_sinkhorn", "cutile", "fwd"), get_kernel("mhc_sinkhorn", "cutile", "bwd")
    params = dict(iters=iters, eps=eps)
    with torch.no_grad():
        chosen = op.choose(op.bind(logits, **params))
    print("registry default:", chosen, "(the rows named entry run cutile)")

    step = functools.partial(_fwd_bwd_step, leaf, dout)

    stub = lambda *a, **k: None  # noqa: E731
    real_entry = op.entry

    def registry_only():
        op._entry = stub
        try:
            op(leaf, **params)
        finally:
            op._entry = real_entry

    steps = {
        "registry alone (entry stubbed, grad mode)": (True, registry_only),
        "fwd Launch build only (no run)": (False, lambda: sk.fwd_launch(logits, out, iters, eps)),
        "bwd Launch build only (incl. scratch)": (False, lambda: sk.bwd_launch(dout, logits, dl, iters, eps)),
        "fwd kernel fn (build + launch)": (False, lambda: kf(logits, out, iters, eps)),
        "fwd kernel fn at T=256 (host-bound)": (False, lambda: kf(small, small_out, iters, eps)),
        "bwd kernel fn at T=256 (host-bound)": (False, lambda: kb(small, small, small_out, iters, eps)),
        "bwd kernel fn (build + scratch + launch)": (False, lambda: kb(dout, logits, dl, iters, eps)),
        "alloc: _glue.empty x2 (out, dlogits)": (False, lambda: (empty(logits.shape, logits.dtype, logits.device),
                                                                 empty(logits.shape, logits.dtype, logits.device))),
        "autograd floor: Null Function fwd+bwd": (True, step(Null.apply)),
        "autograd + 2 allocs: NullAlloc fwd+bwd": (True, step(NullAlloc.apply)),
        "entry fwd (no grad)": (False, lambda: real_entry(logits, backend="cutile", **params)),
        "entry fwd (grad: autograd.Function)": (True, lambda: real_entry(leaf, backend="cutile", **params)),
        "entry fwd + autograd bwd": (True, step(lambda x: real_entry(x, backend="cutile", **params))),
        "registry fwd + autograd bwd": (True, step(lambda x: op(x, **params))),
    }
    res: dict = {}
    modes = ("fresh", "reused")
    for mode in modes:
        with workspace_reuse(mode == "reused"):
            with torch.no_grad():  # each mode's results against the first mode's, bitwise
                kf(logits, out, iters, eps)
                kb(dout, logits, dl, iters, eps)
                torch.cuda.synchronize()
                got = (out.clone(), dl.clone())
            ref_out = res.setdefault("ref", got)
            same = all(torch.equal(g, r) for g, r in zip(got, ref_out))
            print(f"[{mode}] fwd + bwd outputs bitwise equal to the fresh-scratch run's: {same}", flush=True)
            for name, (grad, fn) in steps.items():
                with torch.enable_grad() if grad else torch.no_grad():
                    us = res[mode, name] = per_call_us(fn, n=2000)
                print(f"[{mode}] {name:<45} {us:8.1f} us/call (host)", flush=True)
            for name in ("entry fwd + autograd bwd", "registry fwd + autograd bwd"):
                fn = steps[name][1]
                e = res[mode, "do_bench " + name] = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
                g = res[mode, "graph " + name] = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
                print(f"[{mode}] {name:<45} do_bench {e:.1f} us, graph {g:.1f} us (T={T} n={n} iters={iters})",
                      flush=True)
    print(cprofile_top(steps["registry fwd + autograd bwd"][1], 2000, keys=("tottime",)))
    # the breakdown of one eager registry fwd+bwd (host us): launches = the two kernel fns;
    # autograd + generated wrapper = the rest
    print(f"\nsinkhorn eager fwd+bwd host breakdown (us/call; T={T} n={n} iters={iters})")
    print(f"{'part':<52}" + "".join(f" {m:>8}" for m in modes))
    for mode_rows in (
        ("registry (validate + cached dispatch)", lambda m: res[m, "registry alone (entry stubbed, grad mode)"]),
        ("fwd launch (Launch build + run)", lambda m: res[m, "fwd kernel fn (build + launch)"]),
        ("  same at T=256 (host-bound)", lambda m: res[m, "fwd kernel fn at T=256 (host-bound)"]),
        ("bwd launch (Launch build + scratch + run)", lambda m: res[m, "bwd kernel fn (build + scratch + launch)"]),
        ("  same at T=256 (host-bound)", lambda m: res[m, "bwd kernel fn at T=256 (host-bound)"]),
        ("alloc (out, dlogits)", lambda m: res[m, "alloc: _glue.empty x2 (out, dlogits)"]),
        ("autograd + generated wrapper (rest)", lambda m: res[m, "registry fwd + autograd bwd"]
         - res[m, "registry alone (entry stubbed, grad mode)"] - res[m, "fwd kernel fn (build + launch)"]
         - res[m, "bwd kernel fn (build + scratch + launch)"] - res[m, "alloc: _glue.empty x2 (out, dlogits)"]),
        ("  of which torch's floor (NullAlloc fwd+bwd)", lambda m: res[m, "autograd + 2 allocs: NullAlloc fwd+bwd"]
         - res[m, "alloc: _glue.empty x2 (out, dlogits)"]),
        ("total host: registry fwd + autograd bwd", lambda m: res[m, "registry fwd + autograd bwd"]),
        ("do_bench median (GPU events)", lambda m: res[m, "do_bench registry fwd + autograd bwd"]),
        ("CUDA-graph replay (the kernels)", lambda m: res[m, "graph registry fwd + autograd bwd"]),
    ):
        name, f = mode_rows
        print(f"{name:<52}" + "".join(f" {f(m):8.1f}" for m in modes))


def sinkhorn_ab(T: int, n: int = 4, iters: int = 20, eps: float = 1e-6, rounds: int = 3,
                backends: tuple = ("cute", "cutile")) -> None:
    """mhc_sinkhorn eager fwd + autograd bwd through the registry with each backend (``backend=``) and by default,
    beside torch's floor (a Function that does nothing, and one that allocates its output and input grad): every row
    measured both ways, host us a call (queued back to back, one sync) and do_bench's median (GPU events around each
    call after its L2 flush), in ``rounds`` interleaved rounds (medians printed); the kernels' CUDA-graph time too.
    Every step sets the leaf's grad to None and backpropagates the same pre-made dout."""
    import statistics

    from triton.testing import do_bench, do_bench_cudagraph

    logits = torch.randn(T, n, n, device="cuda")
    dout = torch.randn(T, n, n, device="cuda")
    op = registry.get("mhc_sinkhorn")
    leaf = logits.clone().requires_grad_()
    params = dict(iters=iters, eps=eps)
    with torch.no_grad():
        print("registry default:", op.choose(op.bind(logits, **params)), "| library:", os.path.dirname(registry.__file__))

    step = functools.partial(_fwd_bwd_step, leaf, dout)
    rows = {"torch floor: Null fwd+bwd": step(Null.apply), "torch floor: NullAlloc fwd+bwd": step(NullAlloc.apply)}
    for b in backends:
        kf, kb = get_kernel("mhc_sinkhorn", b, "fwd"), get_kernel("mhc_sinkhorn", b, "bwd")
        out, dl = torch.empty_like(logits), torch.empty_like(logits)
        rows[f"{b}: fwd kernel fn"] = (lambda kf=kf, out=out: kf(logits, out, iters, eps))
        rows[f"{b}: bwd kernel fn"] = (lambda kb=kb, dl=dl: kb(dout, logits, dl, iters, eps))
        rows[f"{b}: registry fwd + autograd bwd"] = step(lambda x, b=b: op(x, backend=b, **params))
    rows["default: registry fwd + autograd bwd"] = step(lambda x: op(x, **params))
    rows["general path: registry fwd + autograd bwd"] = step(lambda x: op(x, **params))
    with torch.no_grad():   # the backends' outputs agree (fp32 tolerance) before anything is timed
        outs = {}
        for b in ("cute", "cutile") if len(backends) > 1 else ():
            o, d = torch.empty_like(logits), torch.empty_like(logits)
            get_kernel("mhc_sinkhorn", b, "fwd")(logits, o, iters, eps)
            get_kernel("mhc_sinkhorn", b, "bwd")(dout, logits, d, iters, eps)
            outs[b] = (o, d)
        if outs:
            rel = [((outs["cute"][i] - outs["cutile"][i]).norm() / outs["cutile"][i].norm()).item() for i in (0, 1)]
            print(f"cute vs cutile: out rel {rel[0]:.2e}, dlogits rel {rel[1]:.2e}")
    # "general path": the default backend's calls without the guard pattern's Prepared call (_host.general_path)
    general_path = functools.partial(_host_general_path, op)

    host, bench = {k: [] for k in rows}, {k: [] for k in rows}
    for rnd in range(rounds):
        for name in (list(rows) if rnd % 2 == 0 else list(rows)[::-1]):
            fn = rows[name]
            general_path(name.startswith("general path"))
            with torch.enable_grad() if "fwd+bwd" in name or "autograd" in name else torch.no_grad():
                host[name].append(per_call_us(fn, n=1000))
                bench[name].append(do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3)
    graph = {}
    for name in [k for k in rows if "registry" in k]:
        general_path(name.startswith("general path"))
        with torch.enable_grad():
            graph[name] = do_bench_cudagraph(rows[name], rep=100, return_mode="median") * 1e3
    print(f"\nmhc_sinkhorn eager (T={T} n={n} iters={iters}; medians of {rounds} rounds; us)")
    print(f"{'row':<42} {'host/call':>10} {'do_bench':>10} {'graph':>8}")
    for name in rows:
        g = f"{graph[name]:8.1f}" if name in graph else f"{'':>8}"
        print(f"{name:<42} {statistics.median(host[name]):10.1f} {statistics.median(bench[name]):10.1f} {g}")


if __name__ == "__main__":
    main()
