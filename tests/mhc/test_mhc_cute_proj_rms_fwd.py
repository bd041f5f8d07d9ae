"""CuTe DSL mhc_proj_rms forward (tilekernels/mhc/cute_proj_rms_fwd.py).

CPU (CI): the launch compiles for sm_90a from fake arguments for N = 3, 8, 24 (NP = 16 / 32) and K
a multiple of 64, not one (200), and the headline 28672, into one kernel with no register spills,
with the design's instructions in its PTX (TMA bulk tensor loads, m64 nNP k16 wgmmas, setmaxnreg,
16-byte shared loads for the sum of squares, the evict-first hint), also for the config's
alternatives (BK = 64, one CTA an SM, no hint); the config (static N, K) is the compile key; the
Python checks refuse bad inputs with a ValueError naming the tensor. GPU (marked ``gpu``): proj and
r against the float64 reference (tilekernels.testing tolerances: fp32, 1e-5), outputs NaN-poisoned,
fresh random inputs; M = 1, 7, 129, 1000 (M tails, one and several CTAs), K = 64, 200, 7168 (one
k-tile, a K tail, many), N = 3, 8, 24 (odd N: scalar stores; N < NP: zero-filled weight rows); the
headline K = 28672 (the accuracy bar the Kahan step is for), the alternative configs, an all-zero
row, M = 0, two calls bitwise equal, one compiled kernel for every M.
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels._cute import cubin_resources, record_compile_keys, setmaxnreg_budget, unfenced_releases  # noqa: E402
from tilekernels.mhc import cute_proj_rms_fwd as pr  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, tolerance, upcast  # noqa: E402

from mhc_helpers import on_gpu  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
COMPILE_N = (3, 8, 24)
COMPILE_K = (64, 200, 7168, 28672)


# ------------------------------------------------------------------ CPU (CI)


# the config fields' alternatives (measured in the module docstring)
ALT_CFGS = {"bk64": dict(BK=64), "ctas1": dict(ctas=1), "bk64ctas1": dict(BK=64, ctas=1),
            "evict": dict(evict_first=True)}


def _check_export(ln, N):
    art = ln.export("sm_90a")
    assert art.cubin[:4] == b"\x7fELF"
    res = list(cubin_resources(art.cubin).items())
    kern = [v for k, v in res if k.startswith("kernel")]
    assert len(kern) == 1 and kern[0]["frame"] == 0, f"register spills or a local array: {res}"
    assert kern[0]["regs"] <= 65536 // (384 * ln.cfg.ctas) // 8 * 8, f"the launch bound's registers: {kern}"
    need, have = setmaxnreg_budget(art)
    unfenced = unfenced_releases(art.ptx)
    assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
    assert 0 < need <= have, (need, have)
    NP, atoms = ln.cfg.NP, ln.cfg.BK // 64
    assert NP == (16 if N <= 16 else 32)
    ptx = art.ptx
    wg = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)
    assert set(wg) == {f"m64n{NP}k16"} and len(wg) == ln.cfg.BK // 16
    # x and weight, one box per 64-wide swizzle atom
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", ptx)) == 2 * atoms
    assert ("0x12f0000000000000" in ptx.lower() or str(pr.EVICT_FIRST) in ptx) == ln.cfg.evict_first
    assert "setmaxnreg.dec" in ptx and "setmaxnreg.inc" in ptx
    # the sum of squares: 4 16-byte chunks a swizzle atom and k-tile
    assert len(re.findall(r"ld\.shared\.v4", ptx)) == 4 * atoms
    # the 8-byte pair epilogue for even N, 4-byte stores for odd N
    assert ("st.global.v2" in ptx) == (N % 2 == 0)


@pytest.mark.parametrize("K", COMPILE_K)
@pytest.mark.parametrize("N", COMPILE_N)
def test_compiles_for_sm90a(N, K):
    _check_export(pr.representative_launch(N, K), N)


@pytest.mark.parametrize("name", list(ALT_CFGS))
@pytest.mark.parametrize("N", (3, 24))
def test_alternative_configs_compile(N, name):
    cfg = pr.ProjRmsFwdCuteCfg.heuristic(N, 7168, **ALT_CFGS[name])
    _check_export(pr.fwd_launch(N, 7168, cfg), N)


def test_config_is_the_compile_key():
    """Static N, K only (M and eps are runtime scalars); the ring fits two CTAs an SM."""
    keys = {pr.fwd_launch(N, K).key("sm_90a") for N in COMPILE_N for K in COMPILE_K}
    assert len(keys) == len(COMPILE_N) * len(COMPILE_K)
    for N in range(1, 33):
        for kw in [{}, *ALT_CFGS.values()]:
            cfg = pr.ProjRmsFwdCuteCfg.heuristic(N, 28672, **kw)
            assert cfg.NP == (16 if N <= 16 else 32) and cfg.stages >= 2
            # each CTA: its ring, 1 KiB of alignment and the barriers, 1 KiB the system reserves
            assert cfg.ctas * (cfg.stages * cfg.stage_bytes + 3072) <= 228 * 1024
    c24, c8 = pr.ProjRmsFwdCuteCfg.heuristic(24, 28672), pr.ProjRmsFwdCuteCfg.heuristic(8, 28672)
    assert (c24.NP, c24.BK, c24.ctas, c24.stages, c24.evict_first) == (32, 128, 2, 2, False)
    assert (c8.NP, c8.BK, c8.ctas, c8.stages) == (16, 128, 2, 3)
    for bad in (dict(N=33, K=64, NP=32, stages=2), dict(N=24, K=64, NP=16, stages=2),
                dict(N=8, K=60, NP=16, stages=2), dict(N=8, K=64, NP=16, stages=1),
                dict(N=8, K=64, NP=32, stages=3), dict(N=8, K=64, NP=16, stages=2, BK=32),
                dict(N=8, K=64, NP=16, stages=2, ctas=3), dict(N=8, K=64, NP=16, stages=2, BM=64)):
        with pytest.raises(ValueError):
            pr.ProjRmsFwdCuteCfg(**bad)


def _outs(M, N, device="cpu"):
    return torch.empty(M, N, dtype=F32, device=device), torch.empty(M, dtype=F32, device=device)


@pytest.mark.parametrize("case", ["x dtype", "w dtype", "x strided", "K % 8", "N > 32", "w K", "device",
                                  "proj shape", "r dtype", "unaligned"])
def test_refuses_bad_inputs(case):
    M, N, K = 5, 24, 64
    x, w = torch.randn(M, K).to(BF), torch.randn(N, K).to(BF)
    proj, r = _outs(M, N)
    want = {"x dtype": "x expected dtype", "w dtype": "weight expected dtype",
            "x strided": "x expected a contiguous", "K % 8": "K % 8 == 0", "N > 32": "N <= 32",
            "w K": "weight expected shape", "device": "weight expected device", "proj shape": "proj expected shape",
            "r dtype": "r expected dtype", "unaligned": "x expected a 16-byte"}[case]
    if case == "x dtype":
        x = x.float()
    elif case == "w dtype":
        w = w.half()
    elif case == "x strided":
        x = torch.randn(K, M).to(BF).t()
    elif case == "K % 8":
        x, w = torch.randn(M, 60).to(BF), torch.randn(N, 60).to(BF)
    elif case == "N > 32":
        w = torch.randn(33, K).to(BF)
        proj, r = _outs(M, 33)
    elif case == "w K":
        w = torch.randn(N, 2 * K).to(BF)
    elif case == "device":
        w = torch.empty(N, K, dtype=BF, device="meta")
    elif case == "proj shape":
        proj = torch.empty(M, N + 1, dtype=F32)
    elif case == "r dtype":
        r = r.double()
    elif case == "unaligned":
        x = torch.randn(M * K + 1).to(BF)[1:].view(M, K)
    with pytest.raises(ValueError, match="mhc_proj_rms fwd") as e:
        pr.fwd_into(x, w, proj, r, 1e-6)
    assert want in str(e.value), str(e.value)


def test_empty_launches_nothing():
    """M = 0: nothing to do (not even a device check or a compile)."""
    x, w = torch.empty(0, 64, dtype=BF), torch.randn(8, 64).to(BF)
    proj, r = _outs(0, 8)
    pr.fwd_into(x, w, proj, r, 1e-6)


# ------------------------------------------------------------------ GPU


def run_case(M, N, K, eps=1e-6, x=None, w=None, cfg=None):
    """The kernel (NaN-poisoned outputs) against the float64 reference; returns (proj, r)."""
    x = torch.randn(M, K, device="cuda").to(BF) if x is None else x
    w = torch.randn(N, K, device="cuda").to(BF) if w is None else w
    proj = torch.full((M, N), float("nan"), dtype=F32, device="cuda")
    r = torch.full((M,), float("nan"), dtype=F32, device="cuda")
    pr.fwd_into(x, w, proj, r, eps, cfg=cfg)
    wp, wr = ref.proj_rms(upcast(x), upcast(w), eps)
    assert_close(proj, wp, what="proj")
    assert_close(r, wr, what="r")
    return proj, r


@pytest.mark.parametrize("N", COMPILE_N)
@pytest.mark.parametrize("K", (64, 200, 7168))
@pytest.mark.parametrize("M", (1, 7, 129, 1000))
@on_gpu
def test_against_float64(M, K, N):
    run_case(M, N, K)


@pytest.mark.parametrize("N", (3, 24))
@on_gpu
def test_headline_k(N):
    """K = 28672: one fp32 accumulation chain measured 3.3e-5; the Kahan-summed tiles must pass 1e-5."""
    run_case(300, N, 28672)


@pytest.mark.parametrize("name", list(ALT_CFGS))
@pytest.mark.parametrize("M, N, K", [(129, 3, 200), (1000, 24, 7168), (300, 24, 28672)])
@on_gpu
def test_alternative_configs(M, N, K, name):
    run_case(M, N, K, cfg=pr.ProjRmsFwdCuteCfg.heuristic(N, K, **ALT_CFGS[name]))


@on_gpu
def test_zero_row_scale_and_eps():
    M, N, K = 129, 24, 7168
    x = (torch.randn(M, K, device="cuda") * 30).to(BF)
    x[5] = 0
    x[128] = 0
    _, r = run_case(M, N, K, eps=1e-3, x=x)
    # a zero row's r = rsqrt(0 + eps) = 1e3 in fp32: one rounding of eps and of the rsqrt, under the fp32 entry
    assert abs(r[5].item() - 1e3) / 1e3 < tolerance("float32") and abs(r[128].item() - 1e3) / 1e3 < tolerance("float32")


@on_gpu
def test_empty_and_deterministic():
    x, w = torch.empty(0, 64, dtype=BF, device="cuda"), torch.randn(8, 64, device="cuda").to(BF)
    pr.fwd_into(x, w, *_outs(0, 8, "cuda"), 1e-6)
    x, w = torch.randn(1000, 7168, device="cuda").to(BF), torch.randn(24, 7168, device="cuda").to(BF)
    a = run_case(1000, 24, 7168, x=x, w=w)
    b = run_case(1000, 24, 7168, x=x, w=w)
    for u, v in zip(a, b):
        assert_close(u, v, kind="exact")


@on_gpu
def test_one_kernel_for_every_m():
    w = torch.randn(24, 200, device="cuda").to(BF)
    with record_compile_keys() as keys:
        run_case(7, 24, 200, w=w)
        before = set(keys)
        for M in (1, 129, 1000):
            run_case(M, 24, 200, w=w)
        assert keys == before and any(k[0] == "mhc.cute_proj_rms_fwd.fwd" for k in before)
