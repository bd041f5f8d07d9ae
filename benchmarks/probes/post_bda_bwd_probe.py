#!/usr/bin/env python3
"""Scratch probe (device host): the split mhc_h_post_bda backward.

Checks bwd_launches (split design) against the float64 reference at several
shapes, then times it (and tile variants of the two split kernels)
at T=32768, n=4, C=7168 (bf16 activations, fp32 h, bf16 bias) with
triton.testing.do_bench (median).
    source .gpu-cutile/env.sh && python3 benchmarks/probes/post_bda_bwd_probe.py
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import traceback

# benchmarks/probes/ -> the repository root (for tilekernels)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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


TWO_PASS = dict(ONE=False, TT_D=4, G=64)  # the n = 8 design, as the heuristic sets it with one=False
VARIANTS = [dict(), TWO_PASS, dict(G=64), dict(OCC_D=3, G=96), dict(KC=1, G=64)]


def timing(h=F32, variants=VARIANTS):
    """fwd and every bwd variant at the headline shape; bytes counted by hand."""
    T, n, C = 32768, 4, 7168
    dout, ins, grads = problem(T, n, C, h, True)
    cfg = pb.PostBdaCfg.heuristic(T, n, C)
    src = torch.empty(T * n * C * 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    copy_bw = 2 * src.numel() / ms / 1e6
    print(f"copy 1.88 GB: {ms:.3f} ms = {copy_bw:.0f} GB/s  (h {h})", flush=True)
    big, hb = 2 * T * n * C, T * (n * n + n) * h.itemsize
    bytes_f = hb + big + 2 * T * C + 2 * C + big
    bytes_b = big + hb + big + 2 * T * C + 2 * C + 4 * T * (n * n + n) + big + 2 * T * C + 2 * C
    fwd = pb.fwd_launches(ins[0], ins[1], ins[2], ins[3], ins[4], torch.empty_like(ins[1]))
    f_ms = bench(lambda: run_all(fwd))
    print(f"fwd: {f_ms:.3f} ms ({100 * bytes_f / f_ms / 1e6 / copy_bw:.1f}% of copy)", flush=True)
    want = ref.h_post_bda_bwd(upcast(dout), *[upcast(t) for t in ins])
    rows = []
    for v in variants:
        try:
            ls = pb.bwd_launches(dout, *ins, *grads, cfg=dataclasses.replace(cfg, **v))
            for g in grads:
                g.fill_(float("nan"))
            run_all(ls)
            err = max(rel_err(g, w) for g, w in zip(grads, want))
            b_ms = bench(lambda: run_all(ls))
            parts = " ".join(f"{ln.kernel._pyfunc.__name__}={bench(ln.run):.3f}" for ln in ls)
            rows.append((v, b_ms, f_ms + b_ms, 100 * bytes_b / b_ms / 1e6 / copy_bw, err))
            print(f"  bwd {v}: {b_ms:.3f} ms, f+b {f_ms + b_ms:.3f}, {rows[-1][3]:.1f}% of copy, "
                  f"max rel err {err:.1e} | {parts}", flush=True)
        except Exception:
            print("  variant", v, "FAILED", traceback.format_exc(limit=3), flush=True)
    print(f"\n| bwd variant (h {h}) | bwd ms | f+b ms | % copy | rel err |\n|---|---:|---:|---:|---:|")
    for v, b, fb, pc, err in rows:
        print(f"| {v} | {b:.3f} | {fb:.3f} | {pc:.1f} | {err:.1e} |")
    return rows


def variant_correctness(**v):
    """edge shapes, bf16/fp32 h and activations, with heuristic fields replaced by v."""
    def launches(*a):
        T, n, C = a[2].shape
        return pb.bwd_launches(*a, cfg=dataclasses.replace(pb.PostBdaCfg.heuristic(T, n, C), **v))
    bad, ok = [], 0
    for c in [(37, 3, 2560, BF, False), (32768, 4, 7168, BF, True), (1000, 8, 7168, BF, True),
              (32768, 4, 7168, F32, False), (37, 1, 100, BF, True), (1, 4, 100, F32, True),
              (3, 2, 64, BF, True, F32), (1000, 4, 4096, F32, True), (0, 4, 100, F32, True), (1000, 8, 100, BF, False)]:
        try:
            check(*c, launches=launches)
            ok += 1
        except Exception as e:
            bad.append((c, str(e)[:120]))
    print(f"variant {v}: {ok} ok {'' if not bad else bad}", flush=True)


if __name__ == "__main__":
    import sys
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("all", "time", "time32"):
        timing(F32)
    if which in ("all", "time"):
        timing(BF, [dict(), TWO_PASS])
    if which in ("all", "check"):
        correctness()
        for v in VARIANTS[1:2]:
            variant_correctness(**v)
