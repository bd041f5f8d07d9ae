#!/usr/bin/env python3
"""Scratch probe (device host): the split mhc_h_post_bda backward.

Checks bwd_launches (split design) against the float64 reference at several
shapes, then times it (and tile variants of the two split kernels)
at T=32768, n=4, C=7168 (bf16 activations, fp32 h, bf16 bias) with
triton.testing.do_bench (median).
    source .gpu-cutile/env.sh && python3 benchmarks/post_bda_bwd_probe.py
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from tilekernels._cutile import run_all  # noqa: E402
from tilekernels.mhc import cutile_post_bda as pb  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, rel_err, upcast  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
NAMES = ("dh_res", "dresidual", "dh_post", "dx", "dbias")


def rnd(*s, dtype=BF, scale=1.0):
    return (torch.randn(*s, device="cuda") * scale).to(dtype)


def problem(T, n, C, h, bias, act=BF):
    ins = [rnd(T, n, n, dtype=h, scale=0.5), rnd(T, n, C, dtype=act), rnd(T, n, dtype=h), rnd(T, C, dtype=act),
           rnd(C, dtype=act) if bias else None]
    grads = [torch.full(t.shape, float("nan"), dtype=t.dtype, device="cuda") if t is not None else None for t in ins]
    return rnd(T, n, C, dtype=act), ins, grads


def check(T, n, C, h, bias, act=BF, launches=pb.bwd_launches):
    dout, ins, grads = problem(T, n, C, h, bias, act)
    run_all(launches(dout, *ins, *grads))
    want = ref.h_post_bda_bwd(upcast(dout), *[upcast(t) if t is not None else None for t in ins])
    errs = {}
    for k, g, w in zip(NAMES, grads, want):
        if g is not None and g.numel():
            errs[k] = assert_close(g, w, what=k)
    return errs


def correctness():
    ok = bad = 0
    cases = [(T, n, C, h, b) for (n, C, T), (h, b) in zip(
        itertools.product((1, 3, 4, 8), (100, 2560, 7168), (1, 37)),
        itertools.cycle([(F32, True), (BF, False), (BF, True), (F32, False)]))]
    cases += [(0, 4, 100, F32, True), (37, 3, 100, F32, True, F32), (32768, 4, 7168, F32, True),
              (32768, 4, 7168, BF, False)]
    worst = {}
    for c in cases:
        try:
            e = check(*c)
            ok += 1
            for k, v in e.items():
                worst[k] = max(worst.get(k, 0.0), v)
        except Exception:
            bad += 1
            print("FAIL", c, traceback.format_exc(limit=3), flush=True)
    print(f"correctness: {ok} ok, {bad} failed of {len(cases)}; worst rel err {worst}", flush=True)


def bench(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def timing():
    T, n, C = 32768, 4, 7168
    dout, ins, grads = problem(T, n, C, F32, True)
    cfg = pb.PostBdaCfg.heuristic(T, n, C)
    src = torch.empty(T * n * C * 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    print(f"copy 1.88 GB: {ms:.3f} ms = {2 * src.numel() / ms / 1e6:.0f} GB/s", flush=True)
    fwd = pb.fwd_launches(ins[0], ins[1], ins[2], ins[3], ins[4], torch.empty_like(ins[1]))
    print(f"fwd: {bench(lambda: run_all(fwd)):.3f} ms", flush=True)
    print("bwd fused (old design, deleted; measured on H200 before the switch): 5.687 ms", flush=True)
    new = pb.bwd_launches(dout, *ins, *grads)
    print(f"bwd split (new): {bench(lambda: run_all(new)):.3f} ms  cfg={cfg}", flush=True)
    for ln in new:
        print(f"  {ln.kernel._pyfunc.__name__} grid={ln.grid}: {bench(ln.run):.3f} ms", flush=True)
    base = [g.clone() for g in grads]
    variants = [dict(OCC_D=2), dict(TT_D=4), dict(TT_D=4, OCC_D=2), dict(OCC_D=4)]
    for v in variants:
        try:
            c2 = dataclasses.replace(cfg, **v)
            ls = pb.bwd_launches(dout, *ins, *grads, cfg=c2)
            run_all(ls)
            err = max(rel_err(g.float(), b.float()) for g, b in zip(grads, base))
            which = ls[0] if any(k.endswith("_D") or k == "G" for k in v) else ls[1]
            print(f"  variant {v}: total {bench(lambda: run_all(ls)):.3f} ms, "
                  f"{which.kernel._pyfunc.__name__} {bench(which.run):.3f} ms, err vs default {err:.2e}",
                  flush=True)
        except Exception:
            print("  variant", v, "FAILED", traceback.format_exc(limit=3), flush=True)


def variant_correctness(**v):
    """bf16/fp32 h at a few shapes with heuristic fields replaced by v."""
    def launches(*a):
        T, n, C = a[2].shape
        return pb.bwd_launches(*a, cfg=dataclasses.replace(pb.PostBdaCfg.heuristic(T, n, C), **v))
    bad = []
    for c in [(37, 3, 2560, BF, False), (32768, 4, 7168, BF, True), (1000, 8, 7168, BF, True),
              (32768, 4, 7168, F32, False), (37, 1, 100, BF, True)]:
        try:
            check(*c, launches=launches)
        except Exception as e:
            bad.append((c, str(e)[:80]))
    print(f"variant {v}: {'ok' if not bad else bad}", flush=True)


if __name__ == "__main__":
    timing()
    correctness()
    for v in ({}, dict(OCC_D=2), dict(TT_D=4), dict(TT_D=4, OCC_D=2), dict(OCC_D=4)):
        variant_correctness(**v)
