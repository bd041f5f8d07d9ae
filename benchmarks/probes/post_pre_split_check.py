#!/usr/bin/env python3
"""mhc_post_pre's cute passes with SPLIT CTAs a row tile (each takes every SPLIT-th chunk of C) against the unsplit
passes: every output and gradient of the op (cute backend) compared with the FWD_SPLIT 1, SPLIT 1 config's on the
same inputs.

What must hold: out bitwise equal always (each element is computed by the same thread code from the same operands,
whichever CTA owns its chunk); with the forward unsplit, everything but dh_res / dh_post bitwise equal too (the
backward pass's elementwise outputs and dbias partials do not depend on the split); the rest within the suite's
tolerance table (tilekernels.testing: fp32 reassociation of the per-token sums, a neighbouring bf16 rounding).

    source .gpu-cute/env.sh (+ the cuTile paths, see mhc_post_pre_variants.py)
    python3 benchmarks/probes/post_pre_split_check.py [--splits 2:2,4:4] [--shapes 32768x4x7168,37x3x200]
Prints one line per (shape, config, tensor) that is not bitwise equal, then a table.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "benchmarks", "probes")]

import torch  # noqa: E402

from mhc_post_pre_check import fused, make  # noqa: E402
from mhc_post_pre_variants import _patched  # noqa: E402

from tilekernels.testing import rel_err, tolerance  # noqa: E402

NAMES = ["out", "layer_in", "h_post_next", "h_res_next"]
GRADS = ["d_h_res", "d_residual", "d_h_post", "d_x", "d_weight", "d_hbias", "d_bias"]
ALL = set(NAMES + GRADS)


def run(args, cots, changes):
    for a in args:
        a.grad = None
    with _patched(changes):
        outs = fused(args, "cute")
        torch.autograd.backward(outs, cots)
    torch.cuda.synchronize()
    res = {k: v.detach().clone() for k, v in zip(NAMES, outs)}
    res.update({k: a.grad.clone() for k, a in zip(GRADS, args)})
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="1:2,2:1,2:2,4:4,3:3")
    ap.add_argument("--shapes", default="37x3x200,130x4x520,32768x4x7168")
    o = ap.parse_args()
    bad = 0
    rows = []
    for shp in o.shapes.split(","):
        T, n, C = map(int, shp.split("x"))
        args, cots = make(T, n, C, "cuda")
        ref = run(args, cots, {"FWD_SPLIT": "1", "SPLIT": "1"})   # the unsplit passes (not the heuristics')
        for sp in o.splits.split(","):
            fs, bs = sp.split(":")
            ch = {"FWD_SPLIT": fs, "SPLIT": bs}
            try:
                got = run(args, cots, ch)
            except Exception as e:  # noqa: BLE001 (a refused config is a result)
                print(f"{shp} split {sp}: {type(e).__name__}: {str(e)[:200]}")
                rows.append((shp, sp, "refused", "", ""))
                continue
            worst, nbits = 0.0, []
            bitwise = {"out"} if fs != "1" else ALL - {"d_h_res", "d_h_post"}
            for k, v in ref.items():
                g = got[k]
                eq = torch.equal(g, v)
                rel = rel_err(g, v)   # inf when g has NaN / Inf
                if not eq:
                    nbits.append(k)
                    print(f"{shp} split {sp}: {k:12s} not bitwise equal, rel {rel:.2e}")
                if (k in bitwise and not eq) or rel > tolerance(v.dtype):
                    bad += 1
                    print(f"  FAIL {shp} split {sp} {k}")
                worst = max(worst, rel)
            rows.append((shp, sp, "ok", f"{worst:.2e}", ",".join(nbits)))
    print(f"\n{'shape':16s} {'fwd:bwd split':>13s} {'status':>8s} {'worst rel':>10s}  not bitwise")
    for r in rows:
        print(f"{r[0]:16s} {r[1]:>13s} {r[2]:>8s} {r[3]:>10s}  {r[4]}")
    print("FAILURES", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
