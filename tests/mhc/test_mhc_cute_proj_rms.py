"""CuTe DSL mhc_proj_rms backward (tilekernels/mhc/cute_proj_rms.py).

CPU (CI): the launches compile for sm_90a from fake arguments with no register spills, the
wgmma shapes the design names, TMA loads and stores; the config is the compile key (N, K static,
M a runtime scalar). GPU (marked ``gpu``): dx and dweight against the float64 reference
(tolerances by the output's dtype: both bf16), outputs NaN-poisoned, fresh random inputs; M = 1,
odd, one past a row tile and many tiles (row groups > 1), N = 3, 8, 15, 24, 32 (n = 1..4, and the
widest the backend takes), K from 8 (one slice, half of it past K) to 28672 with slice tails
(K % 256 != 0, the second warpgroup's half entirely past K); M = 0 gives dweight = 0; two calls
are bitwise equal (fixed-order dweight sums). AGG_C (mhc_pre's dx pass, ``bwd_agg_into``): dx gains
h_pre[t, k // C] * dlayer_in[t, k % C]; C a multiple of the 128-channel warpgroup half (its loads issued before
the tile's wait) or not (loaded in the epilogue; C = 64: a half spans two streams), against float64.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cutlass")

import registry  # noqa: E402
from tilekernels._cute import no_spill_kernel, setmaxnreg_budget, unfenced_releases  # noqa: E402
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
    no_spill_kernel(art.cubin, f"N{N} K{K}")
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
    no_spill_kernel(red.cubin, "reduce")
    # FUSE_RED (the default): one acq_rel counter add a CTA, gpu-scope fences, the last CTA's N partial loads a row
    # group from L2 (.cg) and N bf16 stores; with it off, none of them (the separate reduction launch sums)
    assert len(re.findall(r"atom\.global\.acq_rel\.add\.u32", art.ptx)) == 1 and "fence.acq_rel.gpu" in art.ptx
    assert len(re.findall(r"ld\.global\.cg\.\w+", art.ptx)) == N and len(re.findall(r"st\.global\.b16", art.ptx)) == N
    sep = cpr.bwd_launch(dataclasses.replace(cpr.ProjRmsBwdCuteCfg.heuristic(N, K), FUSE_RED=False)).export("sm_90a")
    assert "atom.global" not in sep.ptx and "fence.acq_rel.gpu" not in sep.ptx and "ld.global.cg" not in sep.ptx


@pytest.mark.parametrize("N,K", [(24, 28672), (8, 200)], ids=["N24-K28672", "N8-K200"])
def test_dweight_only_compiles_for_sm90a(N, K):
    """DW_ONLY (cute_post_pre's dweight pass): the dweight wgmmas only, TMA loads, no stores."""
    art = cpr.representative_launches(N, K)["dweight"].export("sm_90a")
    no_spill_kernel(art.cubin, f"N{N} K{K}")
    need, have = setmaxnreg_budget(art)
    unfenced = unfenced_releases(art.ptx)
    assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
    assert 0 < need <= have, (need, have)
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)
    assert mmas == ["m64n128k16"] * 4, mmas
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" not in art.ptx


# (N, K) of mhc_pre's shapes: n = 4, C = 7168 and n = 2, C = 7168 (AGG_IL: per-stream TMA pieces, dlayer_in by
# TMA); n = 2, C = 100 and n = 3, C = 1000 (per-pair loads in the epilogue); n = 1, C = 8 (one slice, mostly past K);
# n = 4, C = 64 and n = 2, C = 200 (AGG_IL, the last CTA's pieces partly or wholly past C); n = 1, C = 512 (AGG_SM)
AGG_COMPILE = [(24, 28672), (8, 14336), (8, 200), (15, 3000), (3, 8), (24, 256), (8, 400), (3, 512)]


@pytest.mark.parametrize("N,K", AGG_COMPILE, ids=[f"N{n}-K{k}" for n, k in AGG_COMPILE])
def test_bwd_agg_compiles_for_sm90a(N, K):
    """AGG_C: no spills, the same wgmmas, and the aggregate term's loads. AGG_IL (n in (2, 4), C % 8 == 0): x, dx
    and dlayer_in by TMA (x and dx as 3-D [C, M, n] boxes, four a stage; dlayer_in 2-D boxes), h_pre's four values by
    words, no other global loads, the plain register split (40 / 232). Otherwise the producer drops to 24 registers,
    the consumers take 240: with C % 128 == 0 (AGG_SM) the tile by 8 16-byte loads a thread and h_pre's two rows; else
    a column pair's word and its h_pre (in the epilogue). The plain backward has none."""
    n = next(n for n in range(1, 9) if n * n + 2 * n == N)
    cfg = cpr._agg_cfg(N, n, K // n)
    art = cpr.representative_launches(N, K)["bwd_agg"].export("sm_90a")
    no_spill_kernel(art.cubin, f"N{N} K{K}")
    need, have = setmaxnreg_budget(art)
    assert 0 < need <= have, (need, have)
    regs = re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", art.ptx)
    assert regs == ([("dec", "40"), ("inc", "232")] if cfg._agg_il else [("dec", "24"), ("inc", "240")])
    assert not unfenced_releases(art.ptx)
    NP = 16 if N <= 16 else 32
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)
    assert set(mmas) == {"m64n128k16"} and len(mmas) == 2 * NP // 16 + 4, mmas
    words = len(re.findall(r"ld\.global\.b32", art.ptx))
    vec = len(re.findall(r"ld\.global\.v4\.b32", art.ptx))
    if cfg._agg_il:
        assert vec == 0 and words == 4, (vec, words)
        assert len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared::cta\.global", art.ptx)) >= 4
        assert len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.global\.shared::cta", art.ptx)) >= 4
        assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", art.ptx)) >= 4 // n
    elif (K // n) % 128 == 0:   # AGG_SM (the default) applies: the tile by 16-byte loads, h_pre's two rows by words
        assert vec >= 8 and 2 <= words < 32, (vec, words)
    else:                     # a word and an h_pre value a column pair
        assert vec == 0 and words >= 64, (vec, words)
    assert "ld.global.b32" not in cpr.representative_launches(N, K)["bwd"].export("sm_90a").ptx


def test_bwd_agg_pair_loads_compile_for_sm90a():
    """AGG_SM off at C % 128 == 0 (each thread's column-pair words loaded before the stage wait): no spills."""
    cfg = dataclasses.replace(cpr.ProjRmsBwdCuteCfg.heuristic(24, 28672), AGG_C=7168, AGG_SM=False, AGG_IL=False)
    art = cpr.bwd_launch(cfg).export("sm_90a")
    no_spill_kernel(art.cubin, "AGG_SM off")
    assert "ld.global.v4.b32" not in art.ptx and len(re.findall(r"ld\.global\.b32", art.ptx)) >= 34


def test_bwd_agg_shared_tile_compiles_for_sm90a():
    """AGG_SM (AGG_IL off): dlayer_in by 8 16-byte loads a thread, 8 16-byte shared stores, no spills, within shared
    memory."""
    cfg = dataclasses.replace(cpr.ProjRmsBwdCuteCfg.heuristic(24, 28672), AGG_C=7168, AGG_IL=False)
    assert cfg.smem_bytes <= 225 * 1024
    art = cpr.bwd_launch(cfg).export("sm_90a")
    no_spill_kernel(art.cubin, "AGG_SM")
    # h_pre's two rows by words
    assert len(re.findall(r"ld\.global\.v4\.b32", art.ptx)) >= 8
    assert len(re.findall(r"st\.shared(?:::cta)?\.v4\.b32", art.ptx)) >= 8
    assert 2 <= len(re.findall(r"ld\.global\.b32", art.ptx)) < 32


def _trace(fn) -> None:
    """Trace the ``@cute.jit`` fn for sm_90a (no GPU): its Python side effects record what the layouts say."""
    import cutlass.cute as cute
    cute.compile[cute.GPUArch("sm_90a")](fn)


def test_agg_il_pieces_alias_the_x_buffers():
    """AGG_IL's TMA pieces land in the x buffers the wgmma and the epilogue read: with the same swizzle, x buffer b's
    (channel c, token t) is piece buffer 2 b + c // 64's (c % 64, t) (the x layout tiles its atoms along tokens
    first). A CuTe DSL release that tiled the other way would scatter every piece on the GPU; this catches it on
    CPU."""
    import cutlass
    import cutlass.cute as cute
    cfg = cpr.ProjRmsBwdCuteCfg.heuristic(24, 28672)
    got = {}

    @cute.jit
    def probe():
        sx, pl = cpr._layouts(cfg)[0], cpr._piece_layout(cfg, 4 * cfg.STAGES)
        got["swizzles"] = (str(sx.inner), str(pl.inner))
        got["pairs"] = []
        for c in cutlass.range_constexpr(cpr.HALF):
            for t in (0, 1, 7, 8, 9, 63):
                for b in cutlass.range_constexpr(2 * cfg.STAGES):
                    got["pairs"].append((cute.crd2idx((c, t, b), sx.outer),
                                         cute.crd2idx((c % 64, t, 2 * b + c // 64), pl.outer)))

    _trace(probe)
    assert got["swizzles"][0] == got["swizzles"][1]
    assert len(got["pairs"]) == cpr.HALF * 6 * 2 * cfg.STAGES
    assert all(a == p for a, p in got["pairs"]), [ap for ap in got["pairs"] if ap[0] != ap[1]][:4]


def test_agg_il_accumulator_pairs():
    """The AGG_IL epilogue's static mapping of the dx accumulator (m64 n128): fragment pair q = (2 q, 2 q + 1) is one
    row's columns (c, c + 1), c even, in piece half q // 16, at row t0 + 8 (q % 2) (t0 = the thread's first row): what
    its dlayer_in piece, column and h_pre row indices assume, for all 128 threads."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import BFloat16, Float32
    from cutlass.tensor_utils import LayoutEnum
    got = []

    @cute.jit
    def probe():
        mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.COL_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(64, cpr.HALF))
        for ct in cutlass.range_constexpr(128):
            cdx = mma.get_slice(ct).partition_C(cute.make_identity_tensor((64, cpr.HALF)))
            for q in cutlass.range_constexpr(cute.size(cdx) // 2):
                got.append((ct, q, cdx[0][0], cdx[2 * q], cdx[2 * q + 1]))

    _trace(probe)
    assert len(got) == 128 * 32
    for ct, q, t0, (r, c), (r2, c2) in got:
        assert (r2, c2) == (r, c + 1) and c % 2 == 0, (ct, q)
        assert c // 64 == q // 16 and r == t0 + 8 * (q % 2), (ct, q, r, c)


def test_config_limits():
    with pytest.raises(ValueError, match="N <= NP"):
        cpr.ProjRmsBwdCuteCfg(N=33, K=64)
    with pytest.raises(ValueError, match="K % 8"):
        cpr.ProjRmsBwdCuteCfg(N=24, K=100)
    assert cpr.ProjRmsBwdCuteCfg.heuristic(8, 64).NP == 16 and cpr.ProjRmsBwdCuteCfg.heuristic(24, 64).NP == 32
    assert cpr.ProjRmsBwdCuteCfg.heuristic(24, 28672).smem_bytes <= 225 * 1024
    for bad in (dict(AGG_C=7), dict(AGG_C=7000), dict(AGG_C=7168, DW_ONLY=True)):
        with pytest.raises(ValueError, match="aggregate term"):
            cpr.ProjRmsBwdCuteCfg(N=24, K=28672, **bad)


def test_limits_are_explained():
    def why(x, w):
        rows = {b: (ok, w_) for b, ok, w_ in registry.get("mhc_proj_rms").explain(x, w)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    assert "N <= 32" in why(torch.randn(3, 64).to(BF), torch.randn(35, 64).to(BF))   # n = 5
    assert "K % 8 == 0" in why(torch.randn(3, 100).to(BF), torch.randn(24, 100).to(BF))
    assert "got float32" in why(torch.randn(3, 64), torch.randn(24, 64))
    assert "needs a CUDA device" in why(torch.randn(3, 64).to(BF), torch.randn(24, 64).to(BF))
    # the backward's dweight partials [7, N, K] fp32 take int32 offsets: the last K that fits at N = 24 is served,
    # the next multiple of 8 is refused by name (the kernel's offset wrapped to a negative address there)
    meta = lambda *s: torch.empty(*s, dtype=BF, device="meta")     # noqa: E731
    assert "needs a CUDA device" in why(meta(448, 12782640), meta(24, 12782640))
    assert "7 * N * K < 2**31" in why(meta(448, 12782648), meta(24, 12782648))
    cfg = cpr.ProjRmsBwdCuteCfg.heuristic(24, 12782648)
    with pytest.raises(ValueError, match=r"reach 2\*\*31"):   # the glue's own guard, before any allocation
        cpr._run_bwd(cfg, meta(448, 12782648), None, None, None, None, None, None, None, meta(24, 12782648), 1e-6)


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


def _slice_counters() -> list[torch.Tensor]:
    """The cached slice counters (per stream): at least one once a fused call ran, unless the workspace cache keeps
    nothing here (reuse off, or ``may_keep`` refusing a fresh buffer: allocations routed to a private pool)."""
    from tilekernels import _glue
    got = [t for k, t in _glue._WORKSPACES.items() if k[0] == "mhc_proj_rms.cute.slices"]
    keeps = _glue.WORKSPACE_REUSE[0] and _glue.may_keep(torch.zeros(1, device="cuda"))
    assert got or not keeps, "no slice counters cached"
    return got


@on_gpu
@pytest.mark.parametrize("M,N,K,mode", [(1, 24, 7168, "dx"), (65, 8, 200, "dx"), (4099, 24, 7168, "dx"),
                                        (777, 32, 264, "dx"), (130, 3, 8, "dx"), (300, 24, 1000, "dw"),
                                        (4099, 24, 7168, "agg"), (37, 15, 600, "agg"), (65, 24, 768, "agg_sm")],
                         ids=lambda v: str(v))
def test_fused_sums_bitwise(M, N, K, mode):
    """FUSE_RED (the kernel's last CTA of a slice sums its partials) against the separate reduction launch: dx and
    dweight bitwise equal (the same order and rounding), with 1, 2 and 7 row groups, slice tails (K 200, 264: the
    second half past K; K 8: one slice), DW_ONLY and mhc_pre's AGG_C pass (by the per-stream pieces, the per-pair
    words, and the shared tile with the channel-major slice order: AGG_IL off at C 256); the cached slice counters are
    zero after every call (the next call depends on it), also after a call on another stream (its own counters).
    Under a CUDA graph's capture the counters are a fresh zeroed buffer whose memset the graph replays: two replays
    give the same dx and dweight."""
    x, w, dproj, dr, r = _inputs(M, N, K)
    n = {"agg": next(n for n in (4, 3, 2) if K % n == 0), "agg_sm": 3, "dx": 0, "dw": 0}[mode]
    if n:
        dl = torch.randn(M, K // n, device="cuda").to(BF)
        hpre_t = torch.rand(n, M, device="cuda")
        xs = x.view(M, n, K // n)

    def call(cfg, dx, dw):
        if mode == "dw":
            cpr.dweight_into(dproj, x, dw, cfg=cfg)
        elif mode in ("agg", "agg_sm"):
            cpr.bwd_agg_into(dproj, dr, xs, w, r, dl, hpre_t, dx.view(xs.shape), dw, 1e-6, cfg=cfg)
        else:
            cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6, cfg=cfg)

    base = cpr.ProjRmsBwdCuteCfg.heuristic(N, K)
    if n:
        base = dataclasses.replace(base, AGG_C=K // n, AGG_IL=mode != "agg_sm")
        assert base._agg_sm == (mode == "agg_sm") and (mode != "agg_sm" or base.CHM)
    outs = []
    for fuse in (False, True, True):
        dx, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
        call(dataclasses.replace(base, FUSE_RED=fuse), dx, dw)
        outs.append((dx, dw))
        torch.cuda.synchronize()
        if fuse:   # (before the first fused call of a process nothing is cached yet)
            assert all(not c.any() for c in _slice_counters()), "a slice counter left nonzero"
    assert_close(outs[1][1], upcast(dproj).T @ upcast(x), what="dweight")
    for dx, dw in outs[1:]:
        assert torch.equal(dw, outs[0][1]), "dweight: fused sums differ from the reduction launch"
        if mode != "dw":
            assert torch.equal(dx, outs[0][0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dx, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
        call(base, dx, dw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(dw, outs[0][1]) and all(not c.any() for c in _slice_counters())
    if M > 1:   # (a capture of the M = 1 case adds nothing)
        gdx, gdw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
        call(base, gdx, gdw)   # warm (compiled) before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call(base, gdx, gdw)
        for _ in range(2):
            gdx.fill_(float("nan"))
            gdw.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(gdw, outs[0][1]), "dweight from a graph replay"
            if mode != "dw":
                assert torch.equal(gdx, outs[0][0]), "dx from a graph replay"


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


# mhc_pre's dx pass (AGG_C): (T, n, C); C % 128 == 0 (7168, 128, 256, 384) or not (200, 1000, 264, 136, 64: a half spans two
# streams, 8: one slice mostly past K); T = 1, odd, one past a row tile, many tiles (row groups > 1)
AGG_CASES = [dict(T=T, n=n, C=C) for T, n, C in [
    (1, 4, 7168), (65, 4, 200), (1000, 3, 1000), (129, 1, 264), (37, 2, 128), (4099, 4, 7168), (300, 4, 136),
    (5, 4, 64), (70, 1, 8), (64, 4, 256), (2000, 2, 7168),
    # C % 128 == 0 but K % 256 != 0: the last slice's second half wholly past K (AGG_SM's guards)
    (65, 3, 384), (37, 1, 128), (129, 4, 384),
    # AGG_IL (n = 2, 4): the last CTA's pieces partly past C (n = 4, C = 200 and 40; n = 2, C = 200) or wholly (n = 2,
    # C = 136, 8 and 192: loads clamped onto the last channel tile, stores skipped); T = 1500: 24 row tiles over 7 row
    # groups, so those tails also go through the in-loop stores and the ring's wrap; n = 1, C = 512 takes AGG_SM
    (129, 4, 200), (70, 2, 136), (3, 2, 8), (1500, 2, 136), (1500, 4, 200), (40, 2, 200), (33, 2, 192), (9, 4, 40),
    (66, 1, 512)]]


def _agg_inputs(T, n, C):
    N = n * n + 2 * n
    x = torch.randn(T, n, C, device="cuda").to(BF)
    w = (torch.randn(N, n * C, device="cuda") * (n * C) ** -0.5).to(BF)
    dproj, dr = torch.randn(T, N, device="cuda"), torch.randn(T, device="cuda")
    r = ref.proj_rms(x.view(T, n * C).float(), w.float(), 1e-6)[1].float()
    dl = torch.randn(T, C, device="cuda").to(BF)
    hpre_t = torch.rand(n, T, device="cuda")   # sigmoid's range
    return x, w, dproj, dr, r, dl, hpre_t


def _agg_ref(x, w, dproj, dr, r, dl, hpre_t):
    """float64 (dx [T, n, C], dweight, the aggregate term [T, n, C]) of mhc_pre's dx pass: proj_rms's backward of x
    seen as [T, n C], plus h_pre[t, i] * dlayer_in[t, c]."""
    T, n, C = x.shape
    gx, gw = ref.proj_rms_bwd(upcast(dproj), upcast(dr), upcast(x).view(T, n * C), upcast(w), upcast(r), 1e-6)
    agg = upcast(hpre_t).t()[:, :, None] * upcast(dl)[:, None, :]
    return gx.view(T, n, C) + agg, gw, agg


@on_gpu
@pytest.mark.parametrize("c", AGG_CASES, ids=[case_id(c) for c in AGG_CASES])
def test_bwd_agg_matches_float64(c):
    """bwd_agg_into: dx = proj_rms's dx + h_pre * dlayer_in and dweight against float64, NaN-poisoned outputs (bf16
    tolerance: both are bf16); the aggregate term is O(1), most of dx here, so a wrong row, stream or channel in it
    fails (the rms term coef * x is below the tolerance at these scales: test_bwd_agg_rms_term); two calls bitwise
    equal, the second's outputs NaN-poisoned too, so it is checked whole (with empty_like, initcheck flagged one
    64-byte span of them that a fill probe shows the kernel writes: the mHC ledger, session 33)."""
    T, n, C = c["T"], c["n"], c["C"]
    x, w, dproj, dr, r, dl, hpre_t = _agg_inputs(T, n, C)
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(w, float("nan"))
    cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx, dw, 1e-6)
    gx, gw, _ = _agg_ref(x, w, dproj, dr, r, dl, hpre_t)
    assert_close(dx, gx, what="dx")
    assert_close(dw, gw, what="dweight")
    dx2, dw2 = torch.full_like(dx, float("nan")), torch.full_like(dw, float("nan"))
    cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx2, dw2, 1e-6)
    assert torch.equal(dx, dx2) and torch.equal(dw, dw2), "two calls differ"


@on_gpu
def test_bwd_agg_empty_and_views():
    """T = 0 gives dweight = 0; a dlayer_in view 2 bytes past a 16-byte boundary, a non-contiguous h_pre^T and a
    transposed dweight view go through copies (the dweight scratch contiguous: the reduction writes it row-major)."""
    x, w, dproj, dr, r, dl, hpre_t = _agg_inputs(0, 4, 256)
    dw = torch.full_like(w, float("nan"))
    cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, torch.empty_like(x), dw, 1e-6)
    assert torch.equal(dw, torch.zeros_like(dw))
    T, n, C = 77, 3, 256
    x, w, dproj, dr, r, dl, hpre_t = _agg_inputs(T, n, C)
    base = torch.empty(T * C + 1, dtype=BF, device="cuda")
    dlv = base[1:].view(T, C)
    dlv.copy_(dl)
    hp_nc = hpre_t.t().contiguous().t()   # [n, T] with strides (1, n)
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(w, float("nan"))
    cpr.bwd_agg_into(dproj, dr, x, w, r, dlv, hp_nc, dx, dw, 1e-6)
    want = torch.full_like(dx, float("nan"))   # poisoned too: the equalities below then check every element
    want_w = torch.full_like(dw, float("nan"))
    cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, want, want_w, 1e-6)
    assert torch.equal(dx, want)
    dwt = torch.full((w.shape[1], w.shape[0]), float("nan"), dtype=BF, device="cuda").t()   # [N, n C], not contiguous
    cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, torch.empty_like(dx), dwt, 1e-6)
    assert torch.equal(dwt, want_w)


@on_gpu
@pytest.mark.parametrize("T,n,C", [(4099, 4, 7168), (37, 2, 128), (65, 3, 256), (1, 4, 512), (70, 2, 136),
                                   (129, 4, 200)],
                         ids=lambda v: str(v))
def test_bwd_agg_variants_bitwise(T, n, C):
    """The per-stream pieces (AGG_IL), the slice orders (CHM) and the shared-memory dlayer_in tile (AGG_SM) change who
    loads and computes what, when, not the arithmetic: dx and dweight bitwise the default's."""
    x, w, dproj, dr, r, dl, hpre_t = _agg_inputs(T, n, C)
    N = w.shape[0]
    outs = []
    for kw in ({}, dict(AGG_IL=False), dict(AGG_IL=False, CHM=False), dict(AGG_IL=False, AGG_SM=False),
               dict(AGG_IL=False, AGG_SM=False, CHM=False)):
        cfg = dataclasses.replace(cpr.ProjRmsBwdCuteCfg.heuristic(N, n * C), AGG_C=C, **kw)
        dx, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
        cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx, dw, 1e-6, cfg=cfg)
        outs.append((dx, dw))
    assert_close(outs[0][0], _agg_ref(x, w, dproj, dr, r, dl, hpre_t)[0], what="dx")
    for dx, dw in outs[1:]:
        assert torch.equal(dx, outs[0][0]) and torch.equal(dw, outs[0][1])


@on_gpu
@pytest.mark.parametrize("T,n,C", [(130, 4, 7168), (37, 3, 200), (37, 2, 136), (20, 1, 256)],
                         ids=["T130-n4-C7168", "T37-n3-C200", "T37-n2-C136", "T20-n1-C256"])
def test_bwd_agg_rms_term(T, n, C):
    """AGG_C with dx dominated by the rms term coef * x (dproj and h_pre tiny, dr large): the epilogue's coef row
    mapping is checked on the per-stream pieces (n = 4, 2), the per-pair path and the shared tile (n = 1)."""
    x, w, dproj, dr, r, dl, hpre_t = _agg_inputs(T, n, C)
    dproj, dr, hpre_t = dproj * 1e-6, dr * (n * C), hpre_t * 1e-6
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(w, float("nan"))
    cpr.bwd_agg_into(dproj, dr, x, w, r, dl, hpre_t, dx, dw, 1e-6)
    gx, _, agg = _agg_ref(x, w, dproj, dr, r, dl, hpre_t)
    assert agg.norm() < 1e-3 * (gx - agg).norm()
    assert_close(dx, gx, what="dx")
