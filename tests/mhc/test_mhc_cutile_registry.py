"""The cuTile backend as users reach it: through registry.get(op)(...) and autograd.

CPU part: every limit the specs declare for the cutile backend shows up, with
its reason, in ``explain`` (meta tensors stand in for inputs too big to make).
GPU part: ``auto`` picks cutile for production dtypes, forward and autograd
backward match the float64 reference with poisoned outputs, and a call outside
the backend's limits falls back to torch with the reason logged.
"""
from __future__ import annotations

import logging

import pytest
import torch

import registry
from tilekernels.mhc import reference as ref
from tilekernels.testing import assert_close, upcast

BF, F32 = torch.bfloat16, torch.float32
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _why(op, *args, **kw) -> str:
    rows = {b: (ok, why) for b, ok, why in registry.get(op).explain(*args, **kw)}
    ok, why = rows["cutile"]
    assert not ok
    return why


def _inputs(op, T, n, C, device, act=BF, h=F32, bias=True):
    r = lambda *s, dt=act: torch.randn(*s, device=device).to(dt)  # noqa: E731
    if op == "mhc_h_aggregate":
        return (r(T, n, C), r(T, n, dt=h)), {}
    if op == "mhc_h_post_bda":
        return (torch.softmax(r(T, n, n, dt=F32), -1).to(h), r(T, n, C), r(T, n, dt=h), r(T, C),
                r(C) if bias else None), {}
    if op == "mhc_sinkhorn":
        return (r(T, n, n, dt=F32),), {"iters": 20, "eps": 1e-6}
    if op == "mhc_proj_rms":
        return (r(T, n * C), r(n * n + 2 * n, n * C) / (n * C) ** 0.5), {"eps": 1e-6}
    if op == "mhc_pre":
        return (r(T, n, C), r(n * n + 2 * n, n * C) / (n * C) ** 0.5, r(n * n + 2 * n, dt=F32)), \
            {"alpha_pre": 0.7, "alpha_post": 1.3, "alpha_res": 0.4, "iters": 20}
    raise KeyError(op)


OPS = ["mhc_h_aggregate", "mhc_h_post_bda", "mhc_sinkhorn", "mhc_proj_rms", "mhc_pre"]


def test_declared_limits_are_explained():
    meta = torch.device("meta")
    # dtypes the kernels do not take (float64 is the torch backend's reference mode)
    a, _ = _inputs("mhc_h_aggregate", 3, 4, 8, "cpu", act=torch.float64, h=torch.float64)
    assert "cutile supports x in ['bfloat16', 'float32'], got float64" in _why("mhc_h_aggregate", *a)
    a, _ = _inputs("mhc_proj_rms", 3, 4, 8, "cpu", act=F32)
    assert "cutile supports x in ['bfloat16'], got float32" in _why("mhc_proj_rms", *a)
    a, _ = _inputs("mhc_h_post_bda", 3, 4, 8, "cpu")
    a = a[:4] + (a[4].float(),)
    assert "the kernel reads bias in x's dtype" in _why("mhc_h_post_bda", *a)
    # the backward unrolls iters
    a, _ = _inputs("mhc_sinkhorn", 3, 4, 8, "cpu")
    assert "'iters <= 64' fails with iters=65" in _why("mhc_sinkhorn", *a, iters=65)
    # int32 indexing and one-tile projection width: sizes only meta tensors can afford here
    x = torch.empty(2**20, 8, 256, dtype=BF, device=meta)
    assert "2**31" in _why("mhc_h_aggregate", x, torch.empty(2**20, 8, device=meta))
    # the Sinkhorn backward's scratch [iters, 2n, T]: 2**24 tokens fit T*n*n, not 40*n*T
    lg = torch.empty(2**24, 4, 4, device=meta)
    assert "the Sinkhorn backward's scratch" in _why("mhc_sinkhorn", lg, iters=20)
    w = torch.empty(200, 64, dtype=BF, device=meta)
    assert "'N <= 128' fails with N=200" in _why("mhc_proj_rms", torch.empty(4, 64, dtype=BF, device=meta), w)
    # h_post_bda's one-pass backward (n <= 4): its dh partials [1, T, n, n, 8] outgrow T*n*C at C < 8n; 2**24
    # tokens at n=4, C=8 fit T*n*C, not 8*T*n*n; n=5 takes the two-pass backward (no such partials)
    pb = lambda T, n, C: (torch.empty(T, n, n, device=meta), torch.empty(T, n, C, dtype=BF, device=meta),  # noqa: E731
                          torch.empty(T, n, device=meta), torch.empty(T, C, dtype=BF, device=meta), None)
    assert "one-pass backward" in _why("mhc_h_post_bda", *pb(2**24, 4, 8))
    assert "needs a CUDA device" in _why("mhc_h_post_bda", *pb(2**24 - 1, 4, 8))
    assert "needs a CUDA device" in _why("mhc_h_post_bda", *pb(2**24, 5, 8))
    # mhc_pre: bf16 activations only (the projection runs on bf16 tensor cores), iters <= 64
    a, p = _inputs("mhc_pre", 3, 4, 8, "cpu", act=F32)
    assert "cutile supports x in ['bfloat16'], got float32" in _why("mhc_pre", *a, **p)
    a, p = _inputs("mhc_pre", 3, 4, 8, "cpu")
    assert "'iters <= 64' fails with iters=65" in _why("mhc_pre", *a, **dict(p, iters=65))
    # its Sinkhorn backward's scratch: 2**21 tokens of [8, 64] fit T*n*C, not 2*64*n*T
    x = torch.empty(2**21, 8, 64, dtype=BF, device=meta)
    w = torch.empty(80, 512, dtype=BF, device=meta)
    b = torch.empty(80, device=meta)
    assert "the Sinkhorn backward's scratch" in _why("mhc_pre", x, w, b, **dict(p, iters=64))
    # the backward's per-token scratch (dproj [T, 24] at n=4) at C=1 and iters=1: 2**26 tokens fit T*n*C and
    # 2*iters*n*T, not 2*24*T
    x = torch.empty(2**26, 4, 1, dtype=BF, device=meta)
    w, b = torch.empty(24, 4, dtype=BF, device=meta), torch.empty(24, device=meta)
    assert "per-token fp32 scratch" in _why("mhc_pre", x, w, b, **dict(p, iters=1))
    x = torch.empty(2**25 - 2**21, 4, 1, dtype=BF, device=meta)
    assert "needs a CUDA device" in _why("mhc_pre", x, w, b, **dict(p, iters=1))
    # and on this machine the device itself
    a, _ = _inputs("mhc_h_aggregate", 3, 4, 8, "cpu")
    assert "needs a CUDA device" in _why("mhc_h_aggregate", *a)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("T,n,C", [(1, 1, 64), (37, 3, 100), (1000, 4, 7168), (257, 8, 2560)])
def test_auto_uses_cutile_fwd_and_autograd_bwd(op, T, n, C):
    args, params = _inputs(op, T, n, C, "cuda")
    o = registry.get(op)
    grads = [t.requires_grad_() if t is not None and t.is_floating_point() else t for t in args]
    rows = o.explain(*grads, **params)
    assert dict((b, ok) for b, ok, _ in rows)["cutile"], rows
    # h_post_bda, h_aggregate, proj_rms, sinkhorn and mhc_pre list their CuTe DSL backends first (taken where CuTe
    # DSL is installed and the shape is within their limits)
    first = ("cute", "cutile") if op in ("mhc_h_post_bda", "mhc_h_aggregate", "mhc_proj_rms", "mhc_pre",
                                         "mhc_sinkhorn") else ("cutile",)
    assert next(b for b, ok, _ in rows if ok) in first, rows
    out = o(*grads, **params)
    outs = out if isinstance(out, tuple) else (out,)
    ups = [upcast(t).requires_grad_() if t is not None else None for t in grads]
    expect = getattr(ref, op if op == "mhc_pre" else op.removeprefix("mhc_"))(*ups, **params)
    expects = expect if isinstance(expect, tuple) else (expect,)
    for got, want in zip(outs, expects):
        assert_close(got, want, what=f"{op} output")
    seeds = [torch.randn_like(g, dtype=F32).to(g.dtype) for g in outs]
    torch.autograd.backward(outs, seeds)
    torch.autograd.backward(expects, [upcast(s) for s in seeds])
    for t, u in zip(grads, ups):
        if t is not None:
            assert_close(t.grad, u.grad, what=f"{op} grad {tuple(t.shape)}")


@cuda
@pytest.mark.gpu
def test_outside_limits_falls_back_with_reason(caplog, monkeypatch):
    monkeypatch.setattr(registry.core, "_warned", set())
    args, _ = _inputs("mhc_proj_rms", 8, 4, 64, "cuda", act=F32)
    with caplog.at_level(logging.WARNING, logger="tilekernels"):
        proj, r = registry.get("mhc_proj_rms")(*args)
    assert any("cutile supports x in ['bfloat16'], got float32" in rec.getMessage() for rec in caplog.records)
    p_ref, r_ref = ref.proj_rms(*(upcast(t) for t in args))
    assert_close(proj, p_ref)
    assert_close(r, r_ref)
    monkeypatch.setenv("TILEKERNELS_STRICT", "1")
    with pytest.raises(registry.BackendUnavailable):
        registry.get("mhc_proj_rms")(*args)
