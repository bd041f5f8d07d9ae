"""Host-side cost of one mHC sinkhorn forward through each layer of the stack.

Sinkhorn's kernel runs ~14 us at T=32768, n=4, so eager timings of the op are
set by Python: this splits that cost into its layers (cuTile launch, the
kernel-table lookup, the custom op, the autograd.Function, the registry's
validation). Each row: mean host microseconds per call over N calls (queued
back to back, one synchronize at the end), then the CUDA-graph replay time of
the same call. Usage (GPU host): python3 benchmarks/host_overhead.py [--json PATH]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

import registry
from tilekernels._glue import get_kernel
from tilekernels.mhc import ops
from tilekernels.mhc import cutile_sinkhorn as sk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _host import per_call_us  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    from triton.testing import do_bench_cudagraph

    T, n = 32768, 4
    logits = torch.randn(T, n, n, device="cuda")
    out = torch.empty_like(logits)
    launch = sk.fwd_launch(logits, out, 20, 1e-6)
    kern = get_kernel("mhc_sinkhorn", "cutile", "fwd")
    op = registry.get("mhc_sinkhorn")
    steps = {
        "Launch.run (prebuilt)": launch.run,
        "kernel-table fn (builds the launch)": lambda: kern(logits, out, 20, 1e-6),
        "custom op tilekernels::mhc_sinkhorn_fwd": lambda: ops._sinkhorn_fwd(logits, out, 20, 1e-6, "cutile"),
        "entry (autograd.Function + alloc)": lambda: ops.sinkhorn(logits, iters=20, eps=1e-6, backend="cutile"),
        "registry op (validate + choose + entry)": lambda: op(logits, iters=20, eps=1e-6),
    }
    # the backward: its launch carries an occupancy hint (a separate cuTile kernel object)
    dout, dl = torch.randn_like(logits), torch.empty_like(logits)
    blaunch = sk.bwd_launch(dout, logits, dl, 20, 1e-6)
    blaunch0 = sk.bwd_launch(dout, logits, dl, 20, 1e-6, cfg=dataclasses.replace(blaunch.cfg, OCC_BWD=0))
    kb = get_kernel("mhc_sinkhorn", "cutile", "bwd")
    lg = logits.clone().requires_grad_()
    steps.update({
        "bwd Launch.run (prebuilt, occupancy hint)": blaunch.run,
        "bwd Launch.run (prebuilt, no hint)": blaunch0.run,
        "bwd kernel-table fn": lambda: kb(dout, logits, dl, 20, 1e-6),
        "bwd custom op": lambda: ops._sinkhorn_bwd(dout, logits, dl, 20, 1e-6, "cutile"),
        "registry op fwd + autograd bwd": lambda: torch.autograd.backward(op(lg, iters=20, eps=1e-6), dout),
    })
    rows = []
    for name, fn in steps.items():
        host = per_call_us(fn)
        graph = float(do_bench_cudagraph(fn, rep=100, return_mode="median")) * 1e3
        rows.append({"layer": name, "host_us_per_call": round(host, 1), "graph_us": round(graph, 1)})
    w = max(len(r["layer"]) for r in rows)
    print(f"{'layer':<{w}}  host us/call  graph us  (H200? {torch.cuda.get_device_name()})")
    for r in rows:
        print(f"{r['layer']:<{w}}  {r['host_us_per_call']:>12}  {r['graph_us']:>8}")
    for r in thread_probe():
        rows.append(r)
        print(f"{r['layer']:<{w}}  {r['host_us_per_call']:>12}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "T": T, "n": n, "rows": rows}, f, indent=1)



def thread_probe() -> list[dict]:
    """Is a cuTile launch slower from a thread that has no current CUDA context (as
    autograd's device thread may be)? Per-call host us of the Sinkhorn bwd launch in
    the main thread, in a fresh thread, and in a fresh thread after cuCtxSetCurrent;
    and the autograd engine's own cost on CUDA (an identity autograd.Function)."""
    import threading

    from cuda.bindings import driver as cu

    T, n = 32768, 4
    logits = torch.randn(T, n, n, device="cuda")
    dout, dl = torch.randn_like(logits), torch.empty_like(logits)
    ln = sk.bwd_launch(dout, logits, dl, 20, 1e-6)
    _, ctx = cu.cuCtxGetCurrent()
    rows = [{"layer": "bwd launch, main thread", "host_us_per_call": round(per_call_us(ln.run, 300), 1)}]

    def in_thread(name, set_ctx):
        res = {}

        def body():
            if set_ctx:
                cu.cuCtxSetCurrent(ctx)
            res["us"] = per_call_us(ln.run, 300)

        th = threading.Thread(target=body)
        th.start()
        th.join()
        rows.append({"layer": name, "host_us_per_call": round(res["us"], 1)})

    in_thread("bwd launch, fresh thread", False)
    in_thread("bwd launch, fresh thread + cuCtxSetCurrent", True)

    class Id(torch.autograd.Function):
        @staticmethod
        def forward(ctx_, x):
            return x.clone()

        @staticmethod
        def backward(ctx_, g):
            return g

    x = torch.randn(16, device="cuda", requires_grad=True)
    g = torch.randn(16, device="cuda")
    rows.append({"layer": "identity autograd.Function fwd+bwd (CUDA)",
                 "host_us_per_call": round(per_call_us(lambda: torch.autograd.backward(Id.apply(x), g), 500), 1)})
    return rows


if __name__ == "__main__":
    main()
