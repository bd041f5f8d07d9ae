"""mhc_post_pre (the fused mHC layer boundary) against h_post_bda + mhc_pre called in turn.

One harness for both (as issue 15's table): inputs made once, every floating input a leaf
that requires grad; each fwd+bwd step sets the leaves' grads to None and backpropagates the
same pre-made grad outputs (out, layer_in, h_post_next, h_res_next) through the registry;
``triton.testing.do_bench`` median. Also the design steps of the fused op (each a launch
config of tilekernels.mhc.cutile_post_pre: composed fwd/bwd, fused fwd only, both fused) and
fused-forward configs (tile, C splits, occupancy; forward only), so the table says what each
step saves.

Default shape: T=32768, n=4, C=7168, bf16 streams, fp32 h (as mhc_pre produces it), bf16 bias.
Bytes are counted by hand (``op_bytes``): the op's minimum, every input read once and every
output written once; % of the H200 copy ceiling 4.27 TB/s.

  source .gpu-cutile/env.sh && python3 benchmarks/mhc_post_pre_check.py [--T 32768 --n 4 --C 7168]
      [--bwd: the backward designs (d_total, DH_DX, ONE_BWD) instead of the forward sweep] [--hbf16]
Writes $OUT/mhc_post_pre_check.json (when OUT is set) and prints a short table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import registry  # noqa: E402
from tilekernels.mhc import cutile_post_pre as pp  # noqa: E402
from tilekernels.mhc.bench import _post_pre_bytes  # noqa: E402
from tilekernels.testing import rel_err  # noqa: E402

CEIL = 4.27e12  # H200 device-to-device copy, bytes read + written per second
PARAMS = dict(alpha_pre=0.7, alpha_post=1.3, alpha_res=0.4, iters=20)


def op_bytes(T, n, C, h_in=4):
    """(fwd, bwd) minimum bytes: bf16 streams [T, n, C], x / layer_in [T, C], h of h_in bytes an element (fp32
    h_*_next), bf16 weight (counted once, in the tk-bench case: tilekernels/mhc/bench.py)."""
    return _post_pre_bytes(dict(T=T, n=n, C=C), h_in)


def make(T, n, C, dev, h=torch.float32):
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dtype)

    bf, N = torch.bfloat16, n * n + 2 * n
    args = [torch.softmax(r(T, n, n), -1).to(h), r(T, n, C, dtype=bf), (r(T, n).sigmoid() * 2).to(h), r(T, C, dtype=bf),
            r(N, n * C, dtype=bf, scale=(n * C) ** -0.5), r(N), r(C, dtype=bf)]
    cots = [r(T, n, C, dtype=bf), r(T, C, dtype=bf), r(T, n), r(T, n, n)]
    return [a.requires_grad_() for a in args], cots


def fused(args, backend="auto"):
    return registry.get("mhc_post_pre")(*args, **PARAMS, backend=backend)


def fused_cutile(args):
    return fused(args, "cutile")


def separate(args):
    out = registry.get("mhc_h_post_bda")(*args[:4], args[6])
    return (out, *registry.get("mhc_pre")(out, args[4], args[5], **PARAMS))


def timings(fn, args, cots, fwd_only=False):
    from triton.testing import do_bench

    def fwd():
        with torch.no_grad():
            fn(args)

    def step():
        for a in args:
            a.grad = None
        torch.autograd.backward(fn(args), cots)

    f = do_bench(fwd, warmup=50, rep=300, return_mode="median")
    return f, None if fwd_only else do_bench(step, warmup=50, rep=600, return_mode="median")


class design:
    """Within the block, the cuTile backend of mhc_post_pre runs with these config changes."""

    def __init__(self, **changes):
        self.changes = changes

    def __enter__(self):
        self.orig = pp.PostPreCfg.__dict__["heuristic"]
        inner, ch = self.orig.__func__.__wrapped__, self.changes
        pp.PostPreCfg.heuristic = classmethod(lambda cls, *a: dataclasses.replace(inner(cls, *a), **ch))

    def __exit__(self, *exc):
        pp.PostPreCfg.heuristic = self.orig


def check(args, cots):
    """Fused (the registry's choice) vs separate at this shape: outputs and gradients, rel. errors."""
    errs = {}
    for a in args:
        a.grad = None
    o1 = fused(args)
    torch.autograd.backward(o1, cots)
    g1 = [a.grad for a in args]
    for a in args:
        a.grad = None
    o2 = separate(args)
    torch.autograd.backward(o2, cots)
    for name, u, v in zip(("out", "layer_in", "h_post_next", "h_res_next"), o1, o2):
        errs[name] = rel_err(u.detach().float(), v.detach().float())
    for name, u, a in zip(("h_res", "residual", "h_post", "x", "weight", "hbias", "bias"), g1, args):
        errs["d" + name] = rel_err(u.float(), a.grad.float())
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--quick", action="store_true", help="only the op and the separate ops")
    ap.add_argument("--hbf16", action="store_true", help="bf16 h_res / h_post (default fp32)")
    ap.add_argument("--bwd", action="store_true", help="backward designs instead of the forward sweep")
    o = ap.parse_args()
    T, n, C = o.T, o.n, o.C
    hd = torch.bfloat16 if o.hbf16 else torch.float32
    args, cots = make(T, n, C, "cuda", hd)
    fb, bb = op_bytes(T, n, C, 2 if o.hbf16 else 4)
    rows = []

    def row(name, fn, fwd_only=False, **changes):
        with design(**changes):
            f, st = timings(fn, args, cots, fwd_only)
        r = dict(name=name, changes=changes, fwd_ms=f, fwd_pct=100 * fb / (f * 1e-3) / CEIL)
        if st is not None:
            r.update(step_ms=st, bwd_ms=st - f, step_pct=100 * (fb + bb) / (st * 1e-3) / CEIL)
        rows.append(r)
        print(f"{name:34s} fwd {f:7.3f} ms" + ("" if st is None else f"  fwd+bwd {st:7.3f} ms"), flush=True)

    errs = check(args, cots)
    print("fused vs separate, rel. errors:", {k: f"{v:.2e}" for k, v in errs.items()}, flush=True)
    row("h_post_bda + mhc_pre (separate)", separate)
    row(f"mhc_post_pre (registry: {registry.get('mhc_post_pre').choose(registry.get('mhc_post_pre').bind(*args, **PARAMS))})",
        fused)
    row("mhc_post_pre (cutile, default)", fused_cutile)
    if o.bwd:  # the backward designs (cutile_post_pre_bwd) against the d_total one
        row("  bwd: d_total in fp32 (mhc_pp_bwd_dx)", fused_cutile, ONE_BWD=False, DH_DX=False)
        for ch in (dict(TK_X=64, OCC_X=2), dict(TK_X=128, OCC_X=1), dict(TK_X=256, OCC_X=2)):
            row("  bwd: dh in dx pass " + " ".join(f"{k}={v}" for k, v in ch.items()), fused_cutile, DH_DX=True, **ch)
        row("  bwd: one-pass (dweight from out)", fused_cutile, ONE_BWD=True)
    elif not o.quick:
        row("  fused fwd + fused bwd", fused_cutile, FUSE_FWD=True)
        row("  composed fwd + composed bwd", fused_cutile, FUSE_FWD=False, FUSE_BWD=False, ONE_BWD=False, DH_DX=False)
        np_ = 1 << (n - 1).bit_length()
        for ch in (dict(CS=4), dict(CS=8), dict(OCC_F=2), dict(TM=128, TK=64 // np_), dict(TM=32, TK=256 // np_)):
            ch = dict(FUSE_FWD=True, **ch)
            row("  fwd " + " ".join(f"{k}={v}" for k, v in ch.items()), fused_cutile, fwd_only=True, **ch)
    rec = dict(device=torch.cuda.get_device_name(), T=T, n=n, C=C,
               dtypes=f"bf16 streams, {'bf16' if o.hbf16 else 'fp32'} h, bf16 bias",
               params=PARAMS, bytes_fwd=fb, bytes_bwd=bb, ceiling_Bps=CEIL, floor_fwd_ms=fb / CEIL * 1e3,
               floor_step_ms=(fb + bb) / CEIL * 1e3, rel_err_fused_vs_separate=errs, rows=rows)
    if os.environ.get("OUT"):
        tag = ("-hbf16" if o.hbf16 else "") + ("-bwd" if o.bwd else "")
        with open(os.path.join(os.environ["OUT"], f"mhc_post_pre_check{tag}.json"), "w") as f:
            json.dump(rec, f, indent=1)
    base = rows[0]["step_ms"]
    print(f"\nmhc_post_pre, {rec['device']}, T={T} n={n} C={C}, {rec['dtypes']}; do_bench median")
    print(f"bytes (minimum, by hand): fwd {fb / 1e9:.2f} GB, bwd {bb / 1e9:.2f} GB; copy floor fwd "
          f"{rec['floor_fwd_ms']:.3f} ms, fwd+bwd {rec['floor_step_ms']:.3f} ms at 4.27 TB/s")
    print(f"{'variant':34s} {'fwd ms':>8s} {'%ceil':>6s} {'fwd+bwd':>8s} {'%ceil':>6s} {'vs sep':>7s}")
    for r in rows:
        tail = f"{r['step_ms']:8.3f} {r['step_pct']:6.1f} {100 * (1 - r['step_ms'] / base):6.1f}%" \
            if "step_ms" in r else f"{'-':>8s} {'-':>6s} {'-':>7s}"
        print(f"{r['name']:34s} {r['fwd_ms']:8.3f} {r['fwd_pct']:6.1f} {tail}")


if __name__ == "__main__":
    main()
