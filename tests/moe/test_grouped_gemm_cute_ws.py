"""Warp-specialized MXFP8 grouped GEMM (tilekernels/moe/cute_gemm_ws.py, ``GemmCfg.kernel="ws"``).

CPU (CI, no GPU): every variant x out dtype x ws config compiles for sm_90a from fake
arguments through the launch code the GPU path uses; the PTX has the producer / consumer
split (mbarrier pipeline, no CTA barrier in the mainloop) and ptxas fits the 168-register
launch bound without spills.

GPU (``gpu`` marker), against the float64 reference of the same MXFP8 math (operands
dequantized by mxfp8.py) with outputs poisoned (NaN) first, as test_grouped_gemm_cute.py:
ragged groups with zeros, M = 32, one expert, 128 experts, one expert taking all tokens, N / K
tails, a 0xFF scale giving NaN in exactly the outputs its block feeds, huge scales (the
dequant's general path), fewer persistent CTAs than tiles (the stage ring wraps across
tiles), CUDA-graph replay = eager with new group sizes. Tolerance: ``tolerance(out dtype)``
of tilekernels.testing: the products of the dequantized operands are exact in fp32 and the
sums are fp32 over K <= 7168 terms (relative error ~1e-6), so the bf16 output's rounding
(2^-9 relative per entry) dominates; the bound is the one tolerance table's.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels.moe import cute_gemm_dequant as dq  # noqa: E402
from tilekernels.moe import cute_grouped_gemm as gg  # noqa: E402
from mxfp8_gemm_helpers import _offsets, _q_cols, _q_rows  # noqa: E402
from test_grouped_gemm_cute import (  # noqa: E402
    DEV, MAKE, check_against_ref, check_graph_replay, check_nan_scale, out_shape, run_variant)

BF, F32 = torch.bfloat16, torch.float32
OUTS = {"bf16": BF, "f32": F32}
WS = dict(kernel="ws", persistent=True, epi_smem=False, bufs=4)
WS_CFGS = {
    "ws": WS,
    "ws_nonpersistent": dict(WS, persistent=False),
    "ws_bufs3": dict(WS, bufs=3),
    "ws_2ctas": dict(WS, sms=2),                     # every CTA runs many tiles
    "ws_regs": dict(WS, ws_regs=(152, 176)),         # setmaxnreg per role
    "ws_tile_n128": dict(WS, tile_n=128, bufs=6),
    "ws_late": dict(WS, early_loads=False),          # next k-tile's loads after the commit
    "ws_p2_t128": dict(WS, tile_n=128, producers=2, bufs=6),   # 2 producer warpgroups
    "ws_p2_t128_late": dict(WS, tile_n=128, producers=2, bufs=6, early_loads=False),
}


def ws_cfg(variant, G, N, K, out=BF, name="ws"):
    return gg.GemmCfg.heuristic(variant, G, N, K, out, **WS_CFGS[name])


# ====================================================================== CPU: compile


@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_compiles_for_sm90a(variant, out):
    """The headline shape compiles (fake tensors): producer / consumer pipeline on mbarriers,
    bf16 wgmma m64n256k16, no spills at the 168-register launch bound."""
    G, N, K = 8, 4096, 7168
    cfg = ws_cfg(variant, G, N, K, OUTS[out])
    ln = gg.gemm_launch(variant, G, N, K, OUTS[out], torch.int64, cfg)
    assert ln.cfg is cfg or ln.cfg == cfg
    art = ln.export("sm_90a")
    ptx = art.ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in ptx
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert len(art.cubin) > 0
    from tilekernels import _cute as C

    res = list(C.cubin_resources(art.cubin).values())
    assert res and all(r["frame"] == 0 and r["regs"] <= 168 for r in res), res


@pytest.mark.parametrize("cfg_name", list(WS_CFGS))
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_configs_compile(variant, cfg_name):
    """Every ws config compiles with tails (N, K not tile multiples) and int32 offsets."""
    G, N, K = 3, 352, 224
    cfg = ws_cfg(variant, G, N, K, BF, cfg_name)
    art = gg.gemm_launch(variant, G, N, K, BF, torch.int32, cfg).export("sm_90a")
    ptx = art.ptx
    assert "wgmma.mma_async" in ptx
    if cfg_name == "ws_regs":
        flat = " ".join(ptx.split())
        assert "setmaxnreg.dec.sync.aligned.u32 152" in flat and "setmaxnreg.inc.sync.aligned.u32 176" in flat
        from tilekernels._cute import setmaxnreg_budget, unfenced_releases

        need, have = setmaxnreg_budget(art, 128 * cfg.producers)   # within the CTA's launch registers
        unfenced = unfenced_releases(art.ptx)
        assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
        assert 0 < need <= have, (need, have)


def test_ws_config_rejects_unsupported():
    with pytest.raises(AssertionError):
        gg.GemmCfg.heuristic("fwd", 2, 256, 256, BF, kernel="ws", epi_smem=True)
    with pytest.raises(AssertionError):
        gg.GemmCfg.heuristic("fwd", 2, 256, 256, BF, kernel="ws", bufs=5)       # 240 KiB of stages
    with pytest.raises(AssertionError):
        gg.GemmCfg.heuristic("fwd", 2, 256, 256, BF, kernel="ws", ws_regs=(168, 200))


# ====================================================================== GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _ragged(G, M, seed, zeros=0.3):
    """G group sizes summing to M with some empty groups (fixed seed: the cases are named)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(G, generator=gen)
    w[torch.rand(G, generator=gen) < zeros] = 0
    w[0] = w[0] + 1e-3
    s = torch.floor(w / w.sum() * M).to(torch.int64)
    s[int(torch.argmax(w))] += M - int(s.sum())
    return s.tolist()


def _to32(splits):
    """wgrad splits: multiples of 32 with the same sum pattern."""
    return [32 * ((m + 31) // 32) for m in splits]


SPLITS = {
    "zeros_odd": [37, 0, 100, 63],
    "tiny": [0, 1, 31, 0, 517, 129],
    "M32": [32],
    "one_expert": [300],
    "M0": [0, 0, 0],
    "one_takes_all_of_8": [0, 0, 0, 4096, 0, 0, 0, 0],
    "experts128": _ragged(128, 9000, 0),
}


@gpu
@needs_cuda
@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("case", list(SPLITS))
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_matches_reference(variant, case, out):
    splits = SPLITS[case]
    if variant == "wgrad":
        splits = _to32(splits)
    N, K = (352, 224) if case in ("zeros_odd", "tiny", "M0") else (512, 256)
    p = MAKE[variant](splits, N, K)
    check_against_ref(variant, p, splits, OUTS[out], cfg=ws_cfg(variant, len(splits), N, K, OUTS[out]))


@gpu
@needs_cuda
@pytest.mark.parametrize("cfg_name", [n for n in WS_CFGS if n != "ws"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_other_configs(variant, cfg_name):
    """Every ws config (fp32 out): ragged groups with zeros and tails."""
    splits = [96, 0, 224, 1024, 0] if variant == "wgrad" else [100, 0, 257, 1000, 0]
    N, K = 352, 480
    p = MAKE[variant](splits, N, K)
    check_against_ref(variant, p, splits, F32, torch.int32,
                      cfg=ws_cfg(variant, len(splits), N, K, F32, cfg_name))


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_headline_like_shape(variant):
    """Larger problem, uneven groups, fp32 out, many k-tiles and tiles per CTA."""
    splits = [512, 1536, 0, 2048, 32, 4064] if variant == "wgrad" else [1000, 3000, 0, 2048, 1, 2143]
    N, K = 2048, 7168 if variant == "fwd" else 4096
    p = MAKE[variant](splits, N, K)
    check_against_ref(variant, p, splits, F32, cfg=ws_cfg(variant, len(splits), N, K, F32))


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_large_scales(variant):
    """Scale bytes far above 2^7 mixed with small ones: both dequant paths in one GEMM."""
    splits = [64, 160, 0, 96] if variant == "wgrad" else [50, 170, 0, 99]
    N, K = 288, 352
    M, G = sum(splits), len(splits)
    big = lambda R, C: torch.randn(R, C, device=DEV) * torch.exp2(  # noqa: E731
        torch.randint(0, 41, (R, 1), device=DEV).float())
    if variant == "fwd":
        wd, ws = _q_rows(big(G * N, K))
        p = dict(a=_q_rows(big(M, K)), b=(wd.view(G, N, K), ws.view(G, N, K // 32)))
    elif variant == "dgrad":
        wd, ws = _q_cols(big(G * N, K))
        p = dict(a=_q_rows(big(M, N)), b=(wd.view(G, N, K), ws.view(G, N // 32, K)))
    else:
        p = dict(a=_q_cols(big(M, N)), b=_q_cols(big(M, K)))
    p.update(M=M, N=N, K=K, G=G)
    assert max(int(p["a"][1].max()), int(p["b"][1].max())) > dq.FAST_MAX_E
    check_against_ref(variant, p, splits, F32, cfg=ws_cfg(variant, G, N, K, F32))


@gpu
@needs_cuda
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_nan_scale_feeds_exactly_its_rows_or_cols(variant, operand):
    """One 0xFF scale makes its 32-block NaN (zero data included): NaN in exactly the outputs
    that block feeds (the default kernel's check, run on the ws kernel)."""
    check_nan_scale(variant, operand, lambda G, N, K: ws_cfg(variant, G, N, K))


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_equals_two_warpgroup_kernel_bitwise(variant):
    """Same k order per output (k-tiles in order, 4 k16 wgmmas each): the ws kernel's output
    equals the default kernel's bit for bit."""
    splits = [64, 0, 512, 160] if variant == "wgrad" else [70, 0, 530, 155]
    N, K = 512, 448
    p = MAKE[variant](splits, N, K)
    off = _offsets(splits)
    o1 = torch.full(out_shape(variant, p), float("nan"), dtype=BF, device=DEV)
    o2 = o1.clone()
    run_variant(variant, p, off, o1, gg.GemmCfg.heuristic(variant, len(splits), N, K, BF, kernel="dq"))
    run_variant(variant, p, off, o2, ws_cfg(variant, len(splits), N, K))
    torch.cuda.synchronize()
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16))


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_ws_cuda_graph_replay_equals_eager(variant):
    """Captured with one set of group sizes, replayed after the device offsets changed: equal
    to an eager call with the new sizes (bitwise) and to the reference."""
    check_graph_replay(variant, lambda G, N, K: ws_cfg(variant, G, N, K))
