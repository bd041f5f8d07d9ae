#!/usr/bin/env python3
"""GPU check of one of mhc_post_pre's backward designs for mhc_pre's dh_pre and dweight (--flag: FUSE_DHW, the one
pass of cute_post_pre_dhw; SPLIT_DW, cute_post_pre_dhdw's slices pass plus the backward pass's pre rows) against the
dh_pre pass and the dweight pass (both flags off), at the shapes given: every output and gradient of the cute backend
both ways (relative L2 difference; the designs sum dh_pre and dweight in other orders, so not bitwise), two runs with
the flag bitwise equal (fixed-order sums), then the backward's time both ways (do_bench median of
torch.autograd.backward on one forward's graph, retain_graph).

    (call 1) source .gpu-cutile/env.sh
    (call 2) source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site PATH=/tmp/tk-cutile/cu13/bin:$PATH
             unset CUDA_HOME CUDA_PATH; python3 benchmarks/probes/post_pre_dhw_check.py [--flag SPLIT_DW] [--shapes T:n:C,..] [--out $OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:1:64,65:4:200,1001:3:520,300:2:7168,37:4:8448,5:2:8512,4096:4:7168,32768:4:7168")
    ap.add_argument("--time", default="32768:4:7168")
    ap.add_argument("--flag", default="SPLIT_DW", choices=("FUSE_DHW", "SPLIT_DW"))
    ap.add_argument("--out")
    o = ap.parse_args()
    import registry
    from tilekernels.mhc import cute_post_pre as cpp
    from mhc_post_pre_check import PARAMS, make

    op = registry.get("mhc_post_pre")
    torch.manual_seed(0)
    names = ["out", "layer_in", "h_post_next", "h_res_next", "dh_res", "dresidual", "dh_post", "dx", "dweight",
             "dhbias", "dbias"]

    def use(on):
        cpp.FUSE_DHW = cpp.SPLIT_DW = False
        setattr(cpp, o.flag, on)

    def run(args, cots, fuse):
        use(fuse)
        leaves = [t.clone().requires_grad_() for t in args]
        outs = op(*leaves, **PARAMS, backend="cute")
        torch.autograd.backward(outs, cots)
        torch.cuda.synchronize()
        return [x.detach() for x in outs] + [t.grad for t in leaves]

    rows = []
    for sh in o.shapes.split(","):
        T, n, C = map(int, sh.split(":"))
        args, cots = make(T, n, C, "cuda")
        args = [t.detach() for t in args]
        a = run(args, cots, True)
        b = run(args, cots, True)
        ref = run(args, cots, False)
        same = all(torch.equal(x, y) for x, y in zip(a, b))
        diffs = {}
        for nm, x, y in zip(names, a, ref):
            x, y = x.double(), y.double()
            diffs[nm] = float((x - y).norm() / y.norm().clamp_min(1e-30)) if y.numel() else 0.0
        bad = [k for k, v in diffs.items() if not v < 2e-3]
        row = dict(shape=sh, deterministic=same, worst=max(diffs.values()), bad=bad, diffs=diffs)
        rows.append(row)
        print(f"{sh:>14}  deterministic={same}  worst={row['worst']:.2e}  dweight={diffs['dweight']:.2e}  "
              f"dh_res={diffs['dh_res']:.2e}  dhbias={diffs['dhbias']:.2e}  {'BAD ' + str(bad) if bad else 'ok'}",
              flush=True)
    import triton.testing as tt

    T, n, C = map(int, o.time.split(":"))
    leaves, _ = make(T, n, C, "cuda")
    times = {}
    for fuse in (True, False, True, False):
        use(fuse)
        outs = op(*leaves, **PARAMS, backend="cute")
        cots = [torch.randn_like(x, dtype=torch.float32).to(x.dtype) for x in outs]

        def step():
            for t in leaves:
                t.grad = None
            torch.autograd.backward(outs, cots, retain_graph=True)

        ms = tt.do_bench(step, warmup=5, rep=60, return_mode="median")
        times.setdefault(str(fuse), []).append(ms)
        print(f"bwd {o.flag}={fuse}: {ms:.4f} ms", flush=True)
    use(False)
    if o.out:
        with open(os.path.join(o.out, f"{o.flag.lower()}_check.json"), "w") as f:
            json.dump(dict(rows=rows, bwd_ms=times, device=torch.cuda.get_device_name()), f, indent=1)
    ok = all(r["deterministic"] and not r["bad"] for r in rows)
    print("ALL OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
