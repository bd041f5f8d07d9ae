#!/usr/bin/env python3
"""torch only (no tilekernels): session 12's zero-gradient finding reduced to its cause.

An autograd.Function whose forward allocates its output with torch.empty, fills it (fill_(nan), as the tests'
poisoning did) and lets a destination-passing custom op (mutates_args=("out",)) write it; its backward does the
same for dx. Compiled with torch.compile(fullgraph=True), backend inductor or aot_eager, on CUDA and CPU, with
and without the fill, with and without once_differentiable: is y right, is the gradient right, and what |dy|
does the backward custom op see? Session 13, on the device host (torch 2.11.0+cu130): with the fill, every
compiled backward's custom op saw dy = 0 (inductor and aot_eager, CUDA and CPU: AOTAutograd, not Inductor's
code); without it all were right. On the CPU box (torch 2.13.0+cpu) all 8 CPU rows are right.

    python3 benchmarks/probes/aot_fill_repro.py
"""
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

seen = {}

@torch.library.custom_op("rp::fwd", mutates_args=("out",))
def rp_fwd(x: Tensor, out: Tensor) -> None:
    out.copy_(x * 2)

@torch.library.custom_op("rp::bwd", mutates_args=("dx",))
def rp_bwd(dy: Tensor, dx: Tensor) -> None:
    seen["dy_abs_sum"] = float(dy.abs().sum())
    dx.copy_(dy * 3)

def empty(shape, dtype, device, poison):
    t = torch.empty(shape, dtype=dtype, device=device)
    if poison:
        t.fill_(float("nan"))
    return t

def make(poison, once):
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = empty(x.shape, x.dtype, x.device, poison)
            rp_fwd(x, out)
            ctx.save_for_backward(x)
            return out

        @staticmethod
        def _bwd(ctx, dy):
            (x,) = ctx.saved_tensors
            dx = empty(x.shape, x.dtype, x.device, poison)
            rp_bwd(dy.contiguous(), dx)
            return dx
    Fn.backward = staticmethod(once_differentiable(Fn._bwd)) if once else staticmethod(Fn._bwd)
    return Fn

for dev in (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]:
    for backend in ("inductor", "aot_eager"):
        for poison in (False, True):
            for once in (True, False):
                torch._dynamo.reset()
                Fn = make(poison, once)
                f = torch.compile(lambda x: Fn.apply(x), fullgraph=True, backend=backend)
                x = torch.randn(64, 32, device=dev, requires_grad=True)
                dy = torch.randn(64, 32, device=dev)
                y = f(x)
                (g,) = torch.autograd.grad(y, (x,), dy)
                ok_y = torch.allclose(y, 2 * x)
                ok_g = torch.allclose(g, 3 * dy)
                print(f"{dev:4s} {backend:9s} poison={poison!s:5s} once={once!s:5s} y ok {ok_y} grad ok {ok_g} "
                      f"kernel saw |dy| {seen.get('dy_abs_sum'):.3g} (want {float(dy.abs().sum()):.3g})", flush=True)
