#!/usr/bin/env python3
"""Probe (device host, cutile bundle): what ``ct.launch`` reads from a tensor argument, and what each way of
handing it a torch tensor costs on the host.

Why: an eager mhc_sinkhorn fwd+bwd spends 12 us in its forward launch (2 tensors) and 22-25 us in its backward
launch (4 tensors) on the H200 host (benchmarks/results/h200-sinkhorn-host.txt), while ``Tensor.__dlpack__`` is a
Python method of ~3.4 us on the CPU box. If cuTile converts each tensor through it, a wrapper whose ``__dlpack__``
calls torch's C exporter directly (or that carries a ready ``__cuda_array_interface__``) takes most of that away.

Prints: the attributes ``ct.launch`` reads from a spy wrapper (which protocol it uses, in order), host us per
launch of a small copy kernel with 2 and 4 tensor arguments passed as torch tensors and as each wrapper kind
(queued back to back, one synchronize; medians of rounds), the protocol calls alone, and whether every launch
wrote the same bytes.

    source .gpu-cutile/env.sh && python3 benchmarks/probes/cutile_launch_args.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import cuda.tile as ct

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (for _host)
from _host import per_call_us  # noqa: E402

N = 256


@ct.kernel
def copy2(a, b, T: ct.Constant[int]):
    pid = ct.bid(0)
    ct.store(b, index=(pid,), tile=ct.load(a, index=(pid,), shape=(T,)))


@ct.kernel
def copy4(a, b, c, d, T: ct.Constant[int]):
    pid = ct.bid(0)
    ct.store(b, index=(pid,), tile=ct.load(a, index=(pid,), shape=(T,)))
    ct.store(d, index=(pid,), tile=ct.load(c, index=(pid,), shape=(T,)))


class Spy:
    """Forwards DLPack and the CUDA array interface to a tensor, logging every attribute read."""

    def __init__(self, t, log):
        object.__setattr__(self, "_t", t)
        object.__setattr__(self, "_log", log)

    def __getattribute__(self, name):
        if not name.startswith("_t") and name != "_log":
            object.__getattribute__(self, "_log").append(name)
        return object.__getattribute__(self, name)

    def __dlpack__(self, *a, **k):
        return object.__getattribute__(self, "_t").__dlpack__(*a, **k)

    def __dlpack_device__(self):
        return object.__getattribute__(self, "_t").__dlpack_device__()

    @property
    def __cuda_array_interface__(self):
        return object.__getattribute__(self, "_t").__cuda_array_interface__

    def data_ptr(self):
        return object.__getattribute__(self, "_t").data_ptr()


class FastDL:
    """``__dlpack__`` through torch's C exporter (no stream handshake: the launch goes to the current stream)."""
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, *a, **k):
        return torch._C._to_dlpack(self.t)

    def __dlpack_device__(self):
        return (2, self.t.device.index)


_TYPESTR = {torch.float32: "<f4", torch.bfloat16: "<V2", torch.int32: "<i4"}


class CAI:
    """A ready ``__cuda_array_interface__`` (v3) dict built from the tensor's metadata."""
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t):
        es = t.element_size()
        self.__cuda_array_interface__ = {"data": (t.data_ptr(), False), "shape": tuple(t.shape),
                                         "strides": tuple(s * es for s in t.stride()),
                                         "typestr": _TYPESTR[t.dtype], "version": 3, "stream": None}


def median_us(fn, rounds=7):
    """Median over ``rounds`` of ``_host.per_call_us`` (host us a call, queued back to back, one sync)."""
    return statistics.median(per_call_us(fn) for _ in range(rounds))


def sinkhorn_launches(s, ways):
    """The mhc_sinkhorn fwd / bwd launches (T=256, n=4, 20 iterations) with their tensors passed each way."""
    from tilekernels.mhc import cutile_sinkhorn as sk
    lg = torch.randn(256, 4, 4, device="cuda")
    dout, out, dl = torch.randn_like(lg), torch.empty_like(lg), torch.empty_like(lg)
    fl, bl = sk.fwd_launch(lg, out, 20, 1e-6), sk.bwd_launch(dout, lg, dl, 20, 1e-6)
    ref = None
    print(f"\n{'sinkhorn launch, way':34s} {'fwd us':>13s} {'bwd us':>13s}  same bytes")
    for name, wrap in ways.items():
        def go(ln):
            args = tuple(wrap(a)[0] if isinstance(a, torch.Tensor) else a for a in ln.args)
            ct.launch(s, ln.grid, ln.compiled_kernel(), args)
        try:
            out.fill_(float("nan"))
            dl.fill_(float("nan"))
            uf, ub = median_us(lambda: go(fl)), median_us(lambda: go(bl))
            torch.cuda.synchronize()
            got = (out.clone(), dl.clone())
            ref = ref or got
            same = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            print(f"{name:34s} {uf:13.2f} {ub:13.2f}  {same}")
        except Exception as e:  # noqa: BLE001
            print(f"{name:34s} raised {type(e).__name__}: {e}")


def main():
    dev = torch.device("cuda", 0)
    s = torch.cuda.current_stream().cuda_stream
    a, c = torch.randn(N * 64, device=dev), torch.randn(N * 64, device=dev)
    b, d = torch.empty_like(a), torch.empty_like(c)

    log: list = []
    try:
        ct.launch(s, (N, 1, 1), copy2, (Spy(a, log), Spy(b, log), 64))
        torch.cuda.synchronize()
        print("spy launch ok; equal:", torch.equal(a, b))
    except Exception as e:  # noqa: BLE001
        print("spy launch raised", type(e).__name__, e)
    print("attributes ct.launch read from a wrapper (in order):", log)

    ways = {
        "torch tensors": lambda *ts: ts,
        "FastDL (torch._C._to_dlpack)": lambda *ts: tuple(FastDL(t) for t in ts),
        "CAI (ready dict)": lambda *ts: tuple(CAI(t) for t in ts),
    }
    print(f"\n{'way':34s} {'2 tensors us':>13s} {'4 tensors us':>13s}  same bytes")
    for name, wrap in ways.items():
        try:
            b.fill_(float("nan"))
            d.fill_(float("nan"))
            u2 = median_us(lambda: ct.launch(s, (N, 1, 1), copy2, (*wrap(a, b), 64)))
            u4 = median_us(lambda: ct.launch(s, (N, 1, 1), copy4, (*wrap(a, b, c, d), 64)))
            torch.cuda.synchronize()
            same = torch.equal(a, b) and torch.equal(c, d)
            print(f"{name:34s} {u2:13.2f} {u4:13.2f}  {same}")
        except Exception as e:  # noqa: BLE001
            print(f"{name:34s} raised {type(e).__name__}: {e}")
    sinkhorn_launches(s, ways)
    print("\nprotocol calls alone (us each):")
    for name, fn in {"Tensor.__dlpack__()": lambda: a.__dlpack__(),
                     "torch._C._to_dlpack(t)": lambda: torch._C._to_dlpack(a),
                     "Tensor.__cuda_array_interface__": lambda: a.__cuda_array_interface__,
                     "CAI(t)": lambda: CAI(a), "FastDL(t)": lambda: FastDL(a),
                     "t.data_ptr()": lambda: a.data_ptr()}.items():
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        print(f"  {name:34s} {(time.perf_counter() - t0) / n * 1e6:8.2f}")


if __name__ == "__main__":
    main()
