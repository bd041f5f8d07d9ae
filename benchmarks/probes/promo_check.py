#!/usr/bin/env python3
"""GPU check of the L2-promotion variants (``PROMO`` in the configs of mhc_post_pre's three CuTe DSL passes: the
fused forward, the slices pass, the backward pass): their TMA loads go through descriptors of another L2 promotion
(``_cute.promoted_map``) and nothing else changes, so every output and gradient of the cute backend must be bitwise
equal to the default's. Checks that at the shapes given (tails in T and C, n = 1..4); the times come from
mhc_post_pre_variants.py (rows cute:PROMO=3, cute:FWD_PROMO=3, cute:DHDW_PROMO=3).

    (call 1) source .gpu-cutile/env.sh
    (call 2) source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site PATH=/tmp/tk-cutile/cu13/bin:$PATH
             unset CUDA_HOME CUDA_PATH; python3 benchmarks/probes/promo_check.py [--promo 3] [--shapes T:n:C,..] [--out $OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:1:64,65:4:200,1001:3:520,300:2:7168,37:4:8448,5:2:8512,4096:4:7168")
    ap.add_argument("--promo", type=int, default=3)
    ap.add_argument("--out")
    o = ap.parse_args()
    from mhc_post_pre_check import make, fused
    from mhc_post_pre_variants import _patched

    names = ["out", "layer_in", "h_post_next", "h_res_next", "dh_res", "dresidual", "dh_post", "dx", "dweight",
             "dhbias", "dbias"]
    changes = {"PROMO": o.promo, "FWD_PROMO": o.promo, "DHDW_PROMO": o.promo}

    def run(args, cots, ch):
        for a in args:
            a.grad = None
        with _patched(ch):
            outs = fused(args, "cute")
            torch.autograd.backward(outs, cots)
        torch.cuda.synchronize()
        return [t.detach().clone() for t in outs] + [a.grad.clone() for a in args]

    rows, bad = [], 0
    for spec in o.shapes.split(","):
        T, n, C = map(int, spec.split(":"))
        args, cots = make(T, n, C, "cuda")
        ref = run(args, cots, {})
        new = run(args, cots, changes)
        diff = [name for name, a, b in zip(names, ref, new) if not torch.equal(a, b)]
        nan = [name for name, a in zip(names, new) if torch.isnan(a).any()]
        ok = not diff and not nan
        bad += not ok
        rows.append(dict(shape=spec, bitwise=ok, differ=diff, nan=nan))
        print(f"{spec:>14}  PROMO={o.promo} bitwise equal to the default: {ok}  {diff or ''} {nan or ''}", flush=True)
    if o.out:
        with open(os.path.join(o.out, "promo_check.json"), "w") as f:
            json.dump(dict(promo=o.promo, rows=rows), f, indent=1)
    print(f"promo_check: {len(rows) - bad} of {len(rows)} shapes bitwise equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
