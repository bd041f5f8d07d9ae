"""mhc_sinkhorn's CuTe DSL backend (tilekernels/mhc/cute_sinkhorn.py; its backward is cute_sk_bwd with LOGITS).

CPU (CI): both kernels compile for sm_90a and sm_100a without spills at every n the backend takes (1..7), at the
most steps that fit and at 1 step; LOGITS leaves cute_sk_bwd's mhc_pre kernels' PTX as it was but for the kernel
name; the spec's constraints say "takes" exactly where the configs build (``fits``), for n 1..8 and iters 1..64;
the refusals name their limit. GPU (marked ``gpu``): out and dlogits against the float64 reference (fp32 outputs:
the suite's fp32 tolerance, 1e-5; approximate reciprocals are within 2 ulp and the reference's steps are the same
sums) on fresh random logits of several scales, outputs NaN-poisoned, T on both sides of the 128- and 32-token CTAs
(1, 31, 32, 33, 127, 128, 129, 1000) and T = 0, n = 1..7, 1 / 20 / the most steps; the cuTile kernels agree within
the same tolerance; two runs bitwise equal; the registry's default and autograd through it; the launches
take _cute.Launch.run's prebuilt argument array.
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("cutlass")

import registry  # noqa: E402
from specs.expr import evaluate  # noqa: E402
from tilekernels._cute import no_spill_kernel  # noqa: E402
from tilekernels.mhc import cute_sinkhorn as S  # noqa: E402
from tilekernels.mhc import cute_sk_bwd as SB  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

from mhc_helpers import F32, F64, on_gpu  # noqa: E402

EPS = 1e-6
OP = registry.get("mhc_sinkhorn")


def _most(n: int) -> int:
    return max(i for i in range(1, 65) if S.fits(n, i))


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", range(1, 8))
def test_compiles_without_spills(n, arch):
    for iters in sorted({1, 20 if S.fits(n, 20) else 1, _most(n)}):
        launches = {"fwd": S.fwd_launch(S.SinkFwdCuteCfg(n=n, ITERS=iters)),
                    "bwd": SB.launch(S.bwd_cfg(n, iters), torch.float32)}
        for name, ln in launches.items():
            art = ln.export(arch)
            no_spill_kernel(art.cubin, f"{name} n{n} iters{iters}", "kernel")
            # the rows staged in, then out: two barriers; approximate reciprocals (the cuTile kernels' div.approx)
            assert art.ptx.count("bar.sync") == 2, (name, n, iters)
            assert "rcp.approx" in art.ptx, (name, n, iters)


def test_ieee_reciprocals_compile():
    art = S.representative_launches()["fwd_ieee"].export("sm_90a")
    no_spill_kernel(art.cubin, "fwd_ieee", "kernel")
    assert "rcp.approx" not in art.ptx and re.search(r"div\.rn\.f32|rcp\.rn\.f32", art.ptx)


def test_logits_mode_leaves_the_mhc_pre_kernel():
    """LOGITS is a trace-time switch of cute_sk_bwd: with it on the kernel loads the logits and dout rows alone (no
    r, no res bias); with it off (mhc_pre / mhc_post_pre's kernel) the projection's rows, dh_res's, r and the n*n res
    biases, as before the field (its PTX was compared by hand with the kernel before LOGITS: identical but for the
    kernel's name; the mHC ledger, session 62)."""
    for n in (1, 4):
        off = SB.launch(SB.SkBwdCuteCfg(n, 1 << (n - 1).bit_length(), 20), torch.float32).export("sm_90a").ptx
        on = SB.launch(S.bwd_cfg(n, 20), torch.float32).export("sm_90a").ptx
        loads = lambda p: len(re.findall(r"ld\.global[\w.]*\s", p))  # noqa: E731
        rows = lambda w: -(-w * 32 // 128)   # noqa: E731  (a thread's loads of the CTA's [32, w] rows, 128 threads)
        # on: the logits and dout rows alone; off: the projection's rows, dh_res's, r and the n*n res biases
        assert loads(on) == 2 * rows(n * n), loads(on)
        assert loads(off) == rows(n * n + 2 * n) + rows(n * n) + 1 + n * n, loads(off)


def test_spec_constraints_match_the_configs():
    """The spec's cute constraints (n <= 7, the shared-memory bound) hold exactly where both configs build."""
    cute = next(b for b in OP.spec.backends if b.name == "cute")
    for n in range(1, 9):
        for iters in range(1, 65):
            env = {"n": n, "iters": iters, "T": 1000, "eps": EPS}
            spec_ok = all(evaluate(c.expr, env) for c in cute.constraints)
            assert spec_ok == S.fits(n, iters), (n, iters, spec_ok)
    assert _most(4) == 41 and _most(7) == 16 and not S.fits(8, 1)


def test_config_limits():
    S.SinkFwdCuteCfg(n=4, ITERS=20)
    for bad in (dict(n=0, ITERS=1), dict(n=9, ITERS=1), dict(n=4, ITERS=-1), dict(n=4, ITERS=1, TT=48),
                dict(n=4, ITERS=1, TT=256, NT=128)):
        with pytest.raises(ValueError, match="SinkFwdCuteCfg"):
            S.SinkFwdCuteCfg(**bad)


def test_limits_are_explained():
    def why(logits, **params):
        rows = {b: (ok, w) for b, ok, w in OP.explain(logits, **params)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    assert "n <= 7" in why(torch.randn(3, 8, 8))
    assert "48 KB" in why(torch.randn(3, 4, 4), iters=42)
    assert "needs a CUDA device" in why(torch.randn(3, 4, 4))


# ------------------------------------------------------------------ GPU


def _logits(T: int, n: int, scale: float) -> torch.Tensor:
    return torch.randn(T, n, n, device="cuda") * scale


def _checked(logits, dout, iters: int):
    """fwd_into / bwd_into on NaN-poisoned outputs, against float64; -> (out, dlogits)."""
    out = torch.full_like(logits, float("nan"))
    dl = torch.full_like(logits, float("nan"))
    S.fwd_into(logits, out, iters, EPS)
    S.bwd_into(dout, logits, dl, iters, EPS)
    torch.cuda.synchronize()
    lg, go = logits.to(F64), dout.to(F64)
    assert_close(out, ref.sinkhorn(lg, iters, EPS), kind=F32, what="out")
    assert_close(dl, ref.sinkhorn_bwd(go, lg, iters, EPS), kind=F32, what="dlogits")
    return out, dl


CASES = [(1, 4), (31, 4), (32, 4), (33, 4), (127, 4), (128, 4), (129, 4), (1000, 4), (333, 3), (130, 2), (37, 1),
         (65, 5), (66, 6), (67, 7)]


@on_gpu
@pytest.mark.parametrize("steps", ["1", "20", "most"])
@pytest.mark.parametrize("scale", [1.0, 4.0], ids=["unit", "x4"])
@pytest.mark.parametrize("T,n", CASES, ids=[f"T{t}-n{n}" for t, n in CASES])
def test_matches_float64(T, n, scale, steps):
    """fp32: 2 * iters normalisation steps (sums of n terms, 2-ulp reciprocals) forward and back, and exp: within the
    fp32 tolerance (1e-5) of float64, as the cuTile kernels are; logits of scale 4 put rows' maxima far apart (the
    rowmax's subgradient at each row's first maximal entry). Two runs bitwise equal."""
    iters = {"1": 1, "20": 20, "most": _most(n)}[steps]
    if not S.fits(n, iters):
        pytest.skip(f"n={n} takes at most {_most(n)} steps")
    logits, dout = _logits(T, n, scale), torch.randn(T, n, n, device="cuda")
    out, dl = _checked(logits, dout, iters)
    out2, dl2 = torch.empty_like(out), torch.empty_like(dl)
    S.fwd_into(logits, out2, iters, EPS)
    S.bwd_into(dout, logits, dl2, iters, EPS)
    assert torch.equal(out, out2) and torch.equal(dl, dl2), "two runs differ"


@on_gpu
def test_launches_take_the_prepacked_path():
    """Both launches of a real executor go through _cute.Launch.run's prebuilt argument array (_prepacked), not the
    DSL's per-call packing (a DSL whose executor has another layout would fall back silently: this fails instead)."""
    logits = _logits(64, 4, 1.0)
    _checked(logits, torch.randn_like(logits), 20)
    idx = logits.get_device()
    for ln in (S._fwd_for(4, 20), S._bwd_for(4, 20)):
        sl = ln._slots(idx, ln._executor(idx))
        assert sl is not None and sl[2] is not None, ln.name


@on_gpu
def test_empty_and_ties():
    """T = 0 launches nothing; a row of equal logits (every entry maximal) sends the rowmax's subgradient to its first
    entry, as the reference does."""
    e = torch.empty(0, 4, 4, device="cuda")
    S.fwd_into(e, torch.empty_like(e), 20, EPS)
    S.bwd_into(e, e, torch.empty_like(e), 20, EPS)
    logits = _logits(40, 4, 1.0)
    logits[::3, 1] = 0.5
    _checked(logits, torch.randn(40, 4, 4, device="cuda"), 20)


@on_gpu
def test_agrees_with_cutile():
    """The cuTile kernels on the same inputs (their own exp and reciprocal codes): within fp32's tolerance."""
    pytest.importorskip("cuda.tile")
    from tilekernels.mhc import cutile_sinkhorn as ck

    T, n, iters = 1000, 4, 20
    logits, dout = _logits(T, n, 2.0), torch.randn(T, n, n, device="cuda")
    out, dl = _checked(logits, dout, iters)
    want_o, want_d = torch.empty_like(out), torch.empty_like(dl)
    ck.fwd_launch(logits, want_o, iters, EPS).run()
    ck.bwd_launch(dout, logits, want_d, iters, EPS).run()
    assert_close(out, want_o, kind=F32, what="out vs cutile")
    assert_close(dl, want_d, kind=F32, what="dlogits vs cutile")


@on_gpu
@pytest.mark.parametrize("T,n", [(300, 4), (7, 3)], ids=["T300-n4", "T7-n3"])
def test_registry_default_and_autograd(T, n):
    """The registry picks cute on this GPU; its fwd and autograd bwd (the generic wrapper) against float64."""
    logits = _logits(T, n, 1.0).requires_grad_()
    assert OP.choose(OP.bind(logits.detach())) == "cute"
    out = OP(logits)
    dout = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, logits, dout)
    lg = logits.detach().to(F64)
    assert_close(out, ref.sinkhorn(lg, 20, EPS), kind=F32, what="out")
    assert_close(g, ref.sinkhorn_bwd(dout.to(F64), lg, 20, EPS), kind=F32, what="dlogits")

