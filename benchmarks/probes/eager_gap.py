#!/usr/bin/env python3
"""Device host: why an eager fwd+bwd step can be slower than its CUDA-graph replay.

Runs tk-bench's fwd+bwd step for one mHC op (its tk-bench inputs, registry entry, fixed
upstream grads, leaf grads cleared each step) at the headline shape: do_bench (eager) vs
do_bench_cudagraph, then 20 eager steps under torch.profiler: GPU busy time (sum of kernel durations) against
the span from the first kernel's start to the last one's end, the kernels by total time,
and the CUDA runtime calls that can stall the host or the device (malloc/free/sync).
    source .gpu-cutile/env.sh && python3 benchmarks/probes/eager_gap.py [--op mhc_h_post_bda]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

# benchmarks/probes/ -> the repository root (for tilekernels)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

import registry  # noqa: E402
from tilekernels.mhc import bench as mhc_bench  # noqa: E402


def inputs(op: str):
    """The op's tk-bench inputs at tk-bench's CUDA shape (tilekernels.mhc.bench)."""
    case = next((c for c in mhc_bench.cases("cuda") if c.op == op), None)
    if case is None:
        raise SystemExit(f"op {op}: not an mHC tk-bench case")
    args, params = case.make(case.dims, torch.device("cuda"))
    return list(args), params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="mhc_h_post_bda")
    a = ap.parse_args()
    args, params = inputs(a.op)
    leaves = [t.detach().clone().requires_grad_(True) for t in args]
    fn = registry.get(a.op)
    with torch.no_grad():
        outs = fn(*args, **params)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    grads = [torch.randn_like(o) for o in outs if o.is_floating_point()]

    def step():
        for t in leaves:
            t.grad = None
        res = fn(*leaves, **params)
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        torch.autograd.backward(res[:len(grads)], grads)

    with torch.enable_grad():
        e = do_bench(step, warmup=25, rep=100, return_mode="median")
        g = do_bench_cudagraph(step, rep=100, return_mode="median")
        print(f"{a.op}: eager {e:.3f} ms, graph {g:.3f} ms", flush=True)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
    kern = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(ev.device_time for ev in kern) / 1e3
    span = (max(ev.time_range.end for ev in kern) - min(ev.time_range.start for ev in kern)) / 1e3
    print(f"20 steps: kernels {busy:.3f} ms busy over a {span:.3f} ms span ({busy / span:.1%}); "
          f"per step {busy / 20:.3f} / {span / 20:.3f} ms", flush=True)
    tot = collections.defaultdict(lambda: [0, 0.0])
    for ev in kern:
        tot[ev.name[:60]][0] += 1
        tot[ev.name[:60]][1] += ev.device_time / 1e3
    for name, (cnt, ms) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {ms / 20:8.3f} ms/step  x{cnt / 20:4.1f}  {name}")
    rt = collections.Counter(ev.name for ev in prof.events()
                             if any(k in ev.name for k in ("Malloc", "Free", "Synchronize", "memset", "Memset")))
    print("runtime calls (20 steps):", dict(rt))


if __name__ == "__main__":
    main()
