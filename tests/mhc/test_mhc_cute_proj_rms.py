"""CuTe DSL mhc_proj_rms backward (tilekernels/mhc/cute_proj_rms.py).

CPU (CI): the launches compile for sm_90a from fake arguments with no register spills, the
wgmma shapes the design names, TMA loads and stores; the config is the compile key (N, K static,
M a runtime scalar). GPU (marked ``gpu``): dx and dweight against the float64 reference
(tolerances by the output's dtype: both bf16), outputs NaN-poisoned, fresh random inputs; M = 1,
odd, one past a row tile and many tiles (row groups > 1), N = 3, 8, 15, 24, 32 (n = 1..4, and the
widest the backend takes), K from 8 (one slice, half of it past K) to 28672 with slice tails
(K % 256 != 0, the second warpgroup's half entirely past K); M = 0 gives dweight = 0; two calls
are bitwise equal (fixed-order dweight sums).
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("cutlass")

import registry  # noqa: E402
from tilekernels._cute import cubin_resources, setmaxnreg_budget, unfenced_releases  # noqa: E402
from tilekernels.mhc import cute_proj_rms as cpr  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, upcast  # noqa: E402

from mhc_helpers import case_id, on_gpu  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32

COMPILE = [(24, 28672), (3, 8), (8, 200), (15, 7168), (32, 264), (24, 1000)]


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("N,K", COMPILE, ids=[f"N{n}-K{k}" for n, k in COMPILE])
def test_bwd_compiles_for_sm90a(N, K):
    launches = cpr.representative_launches(N, K)
    art = launches["bwd"].export("sm_90a")
    res = list(cubin_resources(art.cubin).values())
    assert len(res) == 1 and res[0]["frame"] == 0, f"register spills or a local array: {res}"
    need, have = setmaxnreg_budget(art)
    unfenced = unfenced_releases(art.ptx)
    assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
    assert 0 < need <= have, (need, have)
    NP = 16 if N <= 16 else 32
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)
    # dx: 2*NP / 16 k-steps (hi, lo) and dweight [hi | lo rows, 128 channels]: 4 k-steps of 16 tokens
    assert set(mmas) == {"m64n128k16"} and len(mmas) == 2 * NP // 16 + 4, mmas
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx      # TMA loads of x
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in art.ptx      # TMA stores of dx
    red = launches["reduce"].export("sm_90a")
    assert list(cubin_resources(red.cubin).values())[0]["frame"] == 0


@pytest.mark.parametrize("N,K", [(24, 28672), (8, 200)], ids=["N24-K28672", "N8-K200"])
def test_dweight_only_compiles_for_sm90a(N, K):
    """DW_ONLY (cute_post_pre's dweight pass): the dweight wgmmas only, TMA loads, no stores."""
    art = cpr.representative_launches(N, K)["dweight"].export("sm_90a")
    res = list(cubin_resources(art.cubin).values())
    assert len(res) == 1 and res[0]["frame"] == 0, f"register spills or a local array: {res}"
    need, have = setmaxnreg_budget(art)
    unfenced = unfenced_releases(art.ptx)
    assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
    assert 0 < need <= have, (need, have)
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)
    assert mmas == ["m64n128k16"] * 4, mmas
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" not in art.ptx


def test_config_limits():
    with pytest.raises(ValueError, match="N <= NP"):
        cpr.ProjRmsBwdCuteCfg(N=33, K=64)
    with pytest.raises(ValueError, match="K % 8"):
        cpr.ProjRmsBwdCuteCfg(N=24, K=100)
    assert cpr.ProjRmsBwdCuteCfg.heuristic(8, 64).NP == 16 and cpr.ProjRmsBwdCuteCfg.heuristic(24, 64).NP == 32
    assert cpr.ProjRmsBwdCuteCfg.heuristic(24, 28672).smem_bytes <= 225 * 1024


def test_limits_are_explained():
    def why(x, w):
        rows = {b: (ok, w_) for b, ok, w_ in registry.get("mhc_proj_rms").explain(x, w)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    assert "N <= 32" in why(torch.randn(3, 64).to(BF), torch.randn(35, 64).to(BF))   # n = 5
    assert "K % 8 == 0" in why(torch.randn(3, 100).to(BF), torch.randn(24, 100).to(BF))
    assert "got float32" in why(torch.randn(3, 64), torch.randn(24, 64))
    assert "needs a CUDA device" in why(torch.randn(3, 64).to(BF), torch.randn(24, 64).to(BF))


# ------------------------------------------------------------------ GPU

CASES = [dict(M=M, N=N, K=K) for M, N, K in [
    (1, 24, 7168), (3, 3, 8), (65, 8, 200), (1000, 24, 1000), (129, 15, 264), (4099, 24, 7168),
    (777, 32, 512), (64, 24, 28672), (2, 8, 64), (5, 24, 128), (70, 24, 136), (300, 3, 192)]]


def _inputs(M, N, K, dev="cuda"):
    x = torch.randn(M, K, device=dev).to(BF)
    w = (torch.randn(N, K, device=dev) * 0.05).to(BF)
    dproj = torch.randn(M, N, device=dev)
    dr = torch.randn(M, device=dev)
    r = ref.proj_rms(x.float(), w.float(), 1e-6)[1].float()   # the forward's r (fp32)
    return x, w, dproj, dr, r


def _bwd_checked(x, w, dproj, dr, r):
    """bwd_into on NaN-poisoned outputs, dx and dweight against the float64 reference; -> (dx, dw)."""
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(w, float("nan"))
    cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6)
    gx, gw = ref.proj_rms_bwd(upcast(dproj), upcast(dr), upcast(x), upcast(w), upcast(r), 1e-6)
    assert_close(dx, gx, what="dx")
    assert_close(dw, gw, what="dweight")
    return dx, dw


@on_gpu
@pytest.mark.parametrize("c", CASES, ids=[case_id(c) for c in CASES])
def test_bwd_matches_float64(c):
    M, N, K = c["M"], c["N"], c["K"]
    x, w, dproj, dr, r = _inputs(M, N, K)
    dx, dw = _bwd_checked(x, w, dproj, dr, r)
    dx2, dw2 = torch.empty_like(dx), torch.empty_like(dw)
    cpr.bwd_into(dproj, dr, x, w, r, dx2, dw2, 1e-6)
    assert torch.equal(dx, dx2) and torch.equal(dw, dw2), "two calls differ"


@on_gpu
@pytest.mark.parametrize("M,N,K", [(130, 24, 7168), (3, 8, 264)], ids=["M130-N24-K7168", "M3-N8-K264"])
def test_bwd_rms_term(M, N, K):
    """dx dominated by the rms term coef * x (dproj tiny, dr large): at the other cases' scales it
    is ~1e-4 of dx, below the bf16 tolerance, so a wrong coef (row mapping) would pass there."""
    x, w, dproj, dr, r = _inputs(M, N, K)
    _bwd_checked(x, w, dproj * 1e-6, dr * K, r)


@on_gpu
@pytest.mark.parametrize("M,N,K", [(1, 24, 7168), (65, 8, 200), (4099, 24, 7168), (5, 24, 128), (300, 3, 192)],
                         ids=lambda v: str(v))
def test_dweight_only_matches_float64(M, N, K):
    """dweight_into (DW_ONLY: the backward without dx) against float64 dproj^T @ x, NaN-poisoned output;
    two calls bitwise equal."""
    x, _, dproj, _, _ = _inputs(M, N, K)
    dw = torch.full((N, K), float("nan"), dtype=BF, device="cuda")
    cpr.dweight_into(dproj, x, dw)
    assert_close(dw, upcast(dproj).T @ upcast(x), what="dweight")
    dw2 = torch.empty_like(dw)
    cpr.dweight_into(dproj, x, dw2)
    assert torch.equal(dw, dw2)
    if M == 1:
        cpr.dweight_into(dproj[:0], x[:0], dw2)
        assert torch.equal(dw2, torch.zeros_like(dw2))


@on_gpu
def test_bwd_empty_rows():
    x, w, dproj, dr, r = _inputs(0, 24, 512)
    dw = torch.full_like(w, float("nan"))
    cpr.bwd_into(dproj, dr, x, w, r, torch.empty_like(x), dw, 1e-6)
    assert torch.equal(dw, torch.zeros_like(dw))


@on_gpu
@pytest.mark.parametrize("M,N,K", [(300, 24, 7168), (5, 8, 264)], ids=["M300-N24-K7168", "M5-N8-K264"])
def test_registry_autograd(M, N, K):
    """registry.get("mhc_proj_rms")(..., backend="cute") forward and autograd backward (the
    registry's generic wrapper: grads of proj and r) against float64; the default picks cute."""
    op = registry.get("mhc_proj_rms")
    x = torch.randn(M, K, device="cuda").to(BF)
    w = (torch.randn(N, K, device="cuda") * 0.05).to(BF)
    assert op.choose(op.bind(x, w)) == "cute"
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    proj, r = op(*leaves, backend="cute")
    dproj, dr = torch.randn(M, N, device="cuda"), torch.randn(M, device="cuda")
    torch.autograd.backward((proj, r), (dproj, dr))
    p64, r64 = ref.proj_rms(upcast(x), upcast(w), 1e-6)
    assert_close(proj.detach(), p64, what="proj")
    assert_close(r.detach(), r64, what="r")
    gx, gw = ref.proj_rms_bwd(upcast(dproj), upcast(dr), upcast(x), upcast(w), r64, 1e-6)
    assert_close(leaves[0].grad, gx, what="dx")
    assert_close(leaves[1].grad, gw, what="dweight")


@on_gpu
def test_unaligned_views():
    """x, dx and dweight views whose addresses are not 16-byte aligned go through aligned copies."""
    M, N, K = 70, 24, 520
    xb = torch.randn(M * K + 1, device="cuda").to(BF)
    x = xb[1:].view(M, K)
    w = (torch.randn(N, K, device="cuda") * 0.05).to(BF)
    dproj, dr = torch.randn(M, N, device="cuda"), torch.randn(M, device="cuda")
    r = ref.proj_rms(x.float(), w.float(), 1e-6)[1].float()
    dxb = torch.full((M * K + 1,), float("nan"), device="cuda").to(BF)
    dwb = torch.full((N * K + 1,), float("nan"), device="cuda").to(BF)
    dx, dw = dxb[1:].view(M, K), dwb[1:].view(N, K)
    cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6)
    gx, gw = ref.proj_rms_bwd(upcast(dproj), upcast(dr), upcast(x), upcast(w), upcast(r), 1e-6)
    assert_close(dx, gx, what="dx")
    assert_close(dw, gw, what="dweight")
