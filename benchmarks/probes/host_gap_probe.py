#!/usr/bin/env python3
"""How much of issue 15's fwd+bwd times is host latency? (mhc_post_pre and the two ops it fuses, H200)

Issue 15's harness times each step with triton's do_bench: per rep it zeroes a 256 MB buffer (the L2 flush), records
the start event, calls the step, records the end event, with no synchronization between reps. Where the host falls
behind the GPU (a slow prologue before the step's first kernel, or a step whose host time exceeds its GPU time) the
GPU idles inside the timed window and the gap counts. This probe times every row three ways in the same process:

  do_bench       the issue's harness (median ms)
  hidden         the same loop, but a GPU spin (torch.cuda._sleep, --sleep-us long) enqueued between the flush and the
                 start event: the host enqueues the step while the GPU spins, so a host prologue shorter than the
                 spin no longer counts (median ms over --reps)
  host fwd / step  host milliseconds from the call to its return with the GPU idle before (synchronized first):
                 the forward alone, and the forward plus torch.autograd.backward

Rows: cute (mhc_post_pre through the registry, its default backend), h_post_bda and mhc_pre (each alone, the
variants probe's "apart" rows). T=32768, n=4, C=7168, fp32 h, bf16 streams.

    (call 1) source .gpu-cutile/env.sh
    (call 2) source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site PATH=/tmp/tk-cutile/cu13/bin:$PATH
             unset CUDA_HOME CUDA_PATH; python3 benchmarks/probes/host_gap_probe.py [--rounds 2] [--out $OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402


def _step(fn, args, cots):
    def step():
        for a in args:
            a.grad = None
        torch.autograd.backward(fn(args), cots)
    return step


def _hidden_ms(step, sleep_us: float, reps: int) -> float:
    """do_bench's loop with a GPU spin between the flush and the start event."""
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    cycles = int(sleep_us * 1e-6 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    for _ in range(5):
        step()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        flush.zero_()
        torch.cuda._sleep(cycles)
        s.record()
        step()
        e.record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in ev)
    return ts[reps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sleep-us", type=float, default=2000.0)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out")
    o = ap.parse_args()
    from triton.testing import do_bench

    from mhc_post_pre_check import fused, make
    from mhc_post_pre_variants import _apart, _host_ms

    args, cots = make(o.T, 4, 7168, "cuda")
    apart = _apart(args, cots)
    rows = {"cute": (lambda a: fused(a), args, cots), **apart}
    res = []
    for rnd in range(o.rounds):
        for name, (fn, a_, c_) in rows.items():
            step = _step(fn, a_, c_)
            db = do_bench(step, warmup=50, rep=300, return_mode="median")
            hid = _hidden_ms(step, o.sleep_us, o.reps)
            hf, hs = _host_ms(fn, a_, c_)
            res.append(dict(round=rnd, row=name, do_bench_ms=db, hidden_ms=hid, host_fwd_ms=hf, host_step_ms=hs))
            print(f"round {rnd} {name:10s} do_bench {db:.4f}  hidden {hid:.4f}  gap {db - hid:+.4f}  "
                  f"host fwd {hf:.3f} step {hs:.3f}", flush=True)
    if o.out:
        with open(os.path.join(o.out, "host_gap_probe.json"), "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), T=o.T, sleep_us=o.sleep_us, rows=res), fh, indent=1)
    print(f"\n{'round':>5} {'row':10s} {'do_bench':>9} {'hidden':>9} {'gap':>8} {'host fwd':>9} {'host step':>9}")
    for r in res:
        print(f"{r['round']:5d} {r['row']:10s} {r['do_bench_ms']:9.4f} {r['hidden_ms']:9.4f} "
              f"{r['do_bench_ms'] - r['hidden_ms']:+8.4f} {r['host_fwd_ms']:9.3f} {r['host_step_ms']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
