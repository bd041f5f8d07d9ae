#!/usr/bin/env python3
"""Probe: the floor of an in-place decode step (H200; issue 12's gdn_decode B=32 <= 35 us, fp32 state). gdn_decode
updates the state in place: it reads and writes the same ~134 MB at B=32. The floor the records compare with so far
is an out-of-place copy of as many bytes (torch.neg(a, out=b): 34.0-34.6 us, the ring's memory pattern alone 35.3).
This times, graph-replayed by the same timer (gdn_decode_check.bench_graph) and in rotated order each round: the ring
kernel at its heuristic config (checked against the reference), the out-of-place copy (gdn_decode_check.copy_case),
and in place: ``a.neg_()`` over half the step's bytes (every byte read and written back where it was, as the decode
does with its state).

    source .gpu-cute/env.sh && python3 benchmarks/probes/gdn_inplace_floor.py [--b 32,256] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

import gdn_decode_check as G  # noqa: E402
from _gpu import save_probe_record  # noqa: E402


def inplace_case(B: int, rep: int) -> float:
    n = G.decode_bytes(B, **G.SHAPE) // 2 // 16 * 4
    a = torch.randn(n, device="cuda")
    want = a.clone()
    us = G.bench_graph(lambda: a.neg_(), rep=rep)
    # an even or odd number of negations ran: a is +-want exactly
    assert torch.equal(a, want) or torch.equal(a, -want)
    return us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", default="32,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=200)
    o = ap.parse_args()
    rows = {}
    kinds = ["ring", "copy", "inplace"]
    for rnd in range(o.rounds):
        for B in [int(b) for b in o.b.split(",")]:
            for kind in kinds[rnd % 3:] + kinds[:rnd % 3]:
                if kind == "ring":
                    rec = G.run_case(B, torch.float32, with_ref=False, rep=o.rep, mod=G._ring_mod())
                    assert rec["ok"], rec
                    us = rec["us"]
                elif kind == "copy":
                    us = G.copy_case(B, torch.float32, rep=o.rep)["us"]
                else:
                    us = inplace_case(B, o.rep)
                rows.setdefault((B, kind), []).append(us)
                print(f"round {rnd} B={B} {kind:8s} {us:8.2f} us", flush=True)
    out = []
    print(f"\n{'B':>4} {'row':8s} {'median us':>10s}  rounds")
    for (B, kind), v in sorted(rows.items()):
        out.append(dict(B=B, row=kind, us=statistics.median(v), rounds=v, bytes=G.decode_bytes(B, **G.SHAPE)))
        print(f"{B:4d} {kind:8s} {statistics.median(v):10.2f}  {' '.join(f'{x:.2f}' for x in v)}")
    save_probe_record("gdn_inplace_floor", out, shape=G.SHAPE, state="float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
