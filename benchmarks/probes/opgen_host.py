#!/usr/bin/env python3
"""Host microseconds of the generated op wrapper's layers (tilekernels/_opgen.py), for mhc_sinkhorn
with its kernels replaced by no-ops, so only host work is left: torch's autograd floor (a do-nothing
autograd.Function), a hand-written Function with the same allocations and kernel calls, the generated
Function, the functional entry and the registry call (with its guard pattern's Prepared call, and without it: the
general path, as before session 63); fwd+bwd steps (leaves' grads None, the same
pre-made grad output) and forward-only calls that record no graph (no_grad, inference mode, grad mode
with no input requiring grad). Rounds of the layers interleave; medians.

    python3 benchmarks/probes/opgen_host.py [--device cpu|cuda] [--src DIR] [--T 256]

``--src DIR``: import the library from another checkout (before / after on one machine). On CUDA the
backward runs on autograd's device thread, as in training; no kernel is launched, so the rows are
host time only (one synchronize a round). Record: the registry ledger (``../results/registry.md``).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cpu")
ap.add_argument("--src")
ap.add_argument("--T", type=int, default=256)
ap.add_argument("--calls", type=int, default=2000)
ap.add_argument("--rounds", type=int, default=9)
A = ap.parse_args()
if A.src:
    sys.path.insert(0, A.src)

import torch  # noqa: E402

import registry  # noqa: E402
from registry.kernels import _KERNELS, get_kernel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, for _host
from _host import general_path as _host_general_path  # noqa: E402

OP = "mhc_sinkhorn"


def noop(*_):
    return None


class Null(torch.autograd.Function):
    """torch's floor: one allocation a pass, nothing else."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g)


class Hand(torch.autograd.Function):
    """What the generated Function does for this op, written out: allocate, kernel, save."""

    @staticmethod
    def forward(ctx, x, iters, eps, backend):
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        noop(x, out, iters, eps)
        ctx.save_for_backward(x)
        ctx.p = (iters, eps)
        return out

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        d = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        noop(g, x, d, *ctx.p)
        return d, None, None, None


def main() -> None:
    dev = torch.device(A.device)
    op = registry.get(OP)
    entry = op.entry
    gen = entry.gen
    backend = "cutile" if dev.type == "cuda" else "torch"
    for p in ("fwd", "bwd"):
        get_kernel(OP, backend, p)  # the backend's module imported (its kernels registered) first,
        _KERNELS[(OP, backend, p)] = noop  # then replaced in the table
    iters, eps = op.spec.params[0].default, op.spec.params[1].default
    x = torch.randn(A.T, 4, 4, device=dev)
    leaf = x.clone().requires_grad_()
    dout = torch.randn_like(x)

    def step(f):
        def run():
            leaf.grad = None
            torch.autograd.backward(f(), dout)
        return run

    def nograd(f):
        def run():
            with torch.no_grad():
                f()
        return run

    def infer(f):
        def run():
            with torch.inference_mode():
                f()
        return run

    rows = {
        "fwd+bwd: null Function (torch's floor)": step(lambda: Null.apply(leaf)),
        "fwd+bwd: hand-written Function": step(lambda: Hand.apply(leaf, iters, eps, backend)),
        "fwd+bwd: generated Function": step(lambda: gen.fn.apply(leaf, iters, eps, backend)),
        "fwd+bwd: entry": step(lambda: entry(leaf, iters=iters, eps=eps, backend=backend)),
        "fwd+bwd: registry": step(lambda: op(leaf, backend=backend)),
        "fwd+bwd: registry, general path": step(lambda: op(leaf, backend=backend)),
        "fwd, no_grad: registry": nograd(lambda: op(x, backend=backend)),
        "fwd, inference_mode: registry": infer(lambda: op(x, backend=backend)),
        "fwd, grad mode, no input requires grad: registry": lambda: op(x, backend=backend),
        "fwd, no_grad: registry, general path": nograd(lambda: op(x, backend=backend)),
    }
    general_path = functools.partial(_host_general_path, op)  # ", general path" rows: no Prepared call
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for k, f in rows.items():
        general_path(k.endswith("general path"))
        for _ in range(300):
            f()
    sync()
    got = {k: [] for k in rows}
    for _ in range(A.rounds):
        for k, f in rows.items():
            general_path(k.endswith("general path"))
            for _ in range(3):  # (the pattern and its Prepared call rebuilt after a switch)
                f()
            sync()
            t0 = time.perf_counter()
            for _ in range(A.calls):
                f()
            sync()
            got[k].append((time.perf_counter() - t0) / A.calls * 1e6)
    print(f"# {OP} T={A.T} n=4, {dev.type} ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'host CPU'}), "
          f"torch {torch.__version__}, no-op kernels, src {A.src or 'this checkout'}")
    for k, v in got.items():
        print(f"{k:52s} {statistics.median(v):8.2f} us  (min {min(v):7.2f})")


if __name__ == "__main__":
    main()
