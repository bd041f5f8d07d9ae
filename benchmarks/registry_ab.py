"""fwd and fwd+bwd GPU time of every mHC op through ``registry.get(name)`` at the
headline shapes (tk-bench's cuda cases), for comparing two checkouts in one run:

    python3 benchmarks/registry_ab.py [--src DIR] [--json PATH]

``--src DIR`` imports registry/specs/tilekernels from another checkout. fwd+bwd
steps set the leaves' grads to None and backpropagate the same pre-made grad
outputs; times are ``triton.testing.do_bench`` medians (eager calls).
"""
from __future__ import annotations

import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--src")
ap.add_argument("--json")
A = ap.parse_args()
if A.src:
    sys.path.insert(0, A.src)

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import registry  # noqa: E402
from tilekernels.mhc import bench  # noqa: E402


def main():
    dev = torch.device("cuda")
    rows = []
    for case in bench.cases("cuda"):
        op = registry.get(case.op)
        args, params = case.make(case.dims, dev)
        names = [t.name for t in op.spec.inputs]
        leaves = [a for n, a in zip(names, args) if n in case.grad_inputs and isinstance(a, torch.Tensor)]
        with torch.no_grad():
            fwd = do_bench(lambda: op(*args, **params), warmup=100, rep=400, return_mode="median")
        for t in leaves:
            t.requires_grad_(True)
        out = op(*args, **params)
        outs = list(out) if isinstance(out, tuple) else [out]
        gos = [torch.randn_like(o) for o in outs]

        def step():
            for t in leaves:
                t.grad = None
            o = op(*args, **params)
            torch.autograd.backward(list(o) if isinstance(o, tuple) else [o], gos)

        fb = do_bench(step, warmup=100, rep=400, return_mode="median")
        row = {"op": case.op + (f"[{case.variant}]" if case.variant else ""), "dims": case.dims,
               "fwd_ms": round(fwd, 4), "fwd_bwd_ms": round(fb, 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del args, leaves, out, outs, gos
        torch.cuda.empty_cache()
    if A.json:
        with open(A.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "src": A.src, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
