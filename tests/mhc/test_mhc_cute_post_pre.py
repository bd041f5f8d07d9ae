"""mhc_post_pre's ``cute`` backend: the CuTe DSL one-pass backward (tilekernels/mhc/cute_post_pre_bwd.py).

CPU (CI): the split planes' host sum; the pass compiles for sm_90a from fake arguments (n = 1..4, bias or None,
C with a chunk tail) with no register spills, its wgmma shape (m64 n(32 n), three dproj terms), TMA loads and stores; the permuted
weight copy puts weight[:, i*C + c] where the kernel's accumulator column for stream i, channel c reads it;
the config limits; explain names the backend's limits.
GPU (marked ``gpu``): fwd + bwd against the float64 oracle through test_mhc_post_pre.run_cutile (its
tolerance table: bf16 results 1e-2, fp32 dh_res / dh_post / dhbias 1e-5, as the cuTile designs that keep the
fp32 d_total out of memory), outputs poisoned: n = 1..4, T = 1, 65 (one past a row tile), 1001, 0, C with a
partial last chunk (C % 64 != 0), the headline C = 7168, fp32 and bf16 h, bias or None; two runs bitwise equal;
the same results as the cuTile backend's default design and as the two ops called in sequence.
The FUSE_DHW pass (cute_post_pre_dhw, off by default): CPU, it compiles for n = 1..4 (C = 8448: 132 CTAs) with its
exchange's memory operations, and its config limits; GPU, the float64 checks with it on, two runs bitwise equal and
neither the dh_pre pass nor the dweight pass in its backward's kernels.
SPLIT_DW (the default where it applies: cute_post_pre_dhdw's slices pass for dh_pre's partials and dweight's post / res
rows, the backward pass's DWPRE pre rows): CPU, both kernels compile (the pre rows' wgmma m64 n8 beside the pass's own)
and DWPRE's limits; GPU, every GPU case above runs it, the float64 checks with it off (the dh_pre and dweight passes),
two runs bitwise equal and its kernel list (no dh_pre pass, no dweight pass).
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cutlass")
pytest.importorskip("cuda.tile")

import registry  # noqa: E402
from tilekernels._cute import cubin_resources, setmaxnreg_budget, unfenced_releases  # noqa: E402
from tilekernels.mhc import cute_post_pre_bwd as K  # noqa: E402
from tilekernels.mhc import cute_post_pre_dhdw as DD  # noqa: E402
from tilekernels.mhc import cute_post_pre_dhw as D  # noqa: E402
from tilekernels.testing import assert_close, probe_module  # noqa: E402

from mhc_helpers import BF16, F32, case_id, kernel_names, on_gpu, rand, skip_if_unprofiled  # noqa: E402
from test_mhc_post_pre import IN_NAMES, PARAMS, inputs, run_cutile  # noqa: E402

OP = registry.get("mhc_post_pre")


# ------------------------------------------------------------------ CPU (CI)

COMPILE = [(4, 7168, True, 32), (4, 7168, False, 32), (3, 200, True, 32), (2, 104, True, 32), (1, 64, False, 32),
           (4, 7168, True, 16)]


@pytest.mark.parametrize("n,C,bias,CW", COMPILE, ids=[f"n{n}-C{c}-bias{b}-CW{w}" for n, c, b, w in COMPILE])
def test_pass_compiles_for_sm90a(n, C, bias, CW):
    cfg = K.PostPreBwdCuteCfg.heuristic(n, C, n * n + 2 * n, bias, CW)
    art = K.launch(cfg).export("sm_90a")
    res = [v for k, v in cubin_resources(art.cubin).items() if "kernel" in k]
    assert len(res) == 1 and res[0]["frame"] == 0, f"register spills or a local array: {res}"
    need, have = setmaxnreg_budget(art)
    unfenced = unfenced_releases(art.ptx)
    assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
    assert 0 < need <= have, (need, have)
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)
    assert set(mmas) == {f"m64n{CW * n}k16"} and len(mmas) == 3 * cfg.NP // 16, mmas
    d = "3d" if n > 1 else "2d"   # (the stream mode is a batch mode of the TMA tensor; extent 1 drops it)
    assert f"cp.async.bulk.tensor.{d}.shared::cta.global" in art.ptx    # dout / residual
    assert f"cp.async.bulk.tensor.{d}.global.shared::cta" in art.ptx    # dresidual stores
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in art.ptx      # dx stores


DHW_COMPILE = [(4, 7168), (4, 8448), (3, 200), (2, 104), (1, 64)]


@pytest.mark.parametrize("n,C", DHW_COMPILE, ids=[f"n{n}-C{c}" for n, c in DHW_COMPILE])
def test_dhw_pass_compiles_for_sm90a(n, C):
    """cute_post_pre_dhw (FUSE_DHW): no spills, the setmaxnreg budget of 4 warpgroups (two at the side registers),
    every ring release fenced, the dweight wgmma m64 n64, and the exchange's memory operations: tagged relaxed 8-byte
    stores and loads of the partials, release stores of dpp, the fetchers' acquire fence, the trap of a stuck wait."""
    N = n * n + 2 * n
    cfg = D.PostPreDhwCuteCfg.heuristic(n, C, N, 32 if N > 16 else 16)
    art = D.launch(cfg).export("sm_90a")
    res = [v for k, v in cubin_resources(art.cubin).items() if "kernel" in k]
    assert len(res) == 1 and res[0]["frame"] == 0, f"register spills or a local array: {res}"
    need, have = setmaxnreg_budget(art, 256)
    assert 0 < need <= have, (need, have)
    assert not unfenced_releases(art.ptx)
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)) == {"m64n64k16"}
    for op in ("st.relaxed.gpu.global.b64", "ld.relaxed.gpu.global", "st.release.gpu.global.b64", "fence.acq_rel.gpu",
               "trap;", "nanosleep"):
        assert op in art.ptx, op


def test_dhw_config_limits():
    cfg = D.PostPreDhwCuteCfg.heuristic(4, 7168, 24, 32)
    assert cfg.S == 112 and cfg.smem_bytes <= D.SMEM_LIMIT and cfg.R > cfg.LAG
    assert D.PostPreDhwCuteCfg.heuristic(4, 8448, 24, 32).S == 132
    with pytest.raises(ValueError, match="R > LAG"):
        D.PostPreDhwCuteCfg(n=4, C=64, N=24, NPAD=32, LAG=8, R=8)
    with pytest.raises(ValueError, match="multiple of 3"):
        D.PostPreDhwCuteCfg(n=2, C=64, N=8, NPAD=16, FS=4)
    with pytest.raises(ValueError, match="shared memory"):
        D.PostPreDhwCuteCfg(n=4, C=64, N=24, NPAD=32, SP=3, FS=6)
    assert D.scratch_words(cfg, 65) == (cfg.R * 112 * 64 * 4, 128 * 4)


DHDW_COMPILE = [(4, 7168), (3, 200), (2, 104), (1, 64)]


@pytest.mark.parametrize("n,C", DHDW_COMPILE, ids=[f"n{n}-C{c}" for n, c in DHDW_COMPILE])
def test_split_dw_kernels_compile_for_sm90a(n, C):
    """SPLIT_DW's kernels: cute_post_pre_dhdw (no spills, the setmaxnreg budget of its two side warpgroups (producer,
    dh partials) and two consumers, fenced releases, the dweight wgmma
    m64 n64 over k = 64 tokens a stream, TMA loads only) and the backward pass with DWPRE (its own wgmma m64 n(32 n)
    plus the pre rows' m64 n8: 4 k-steps for each of a warpgroup's up to 2 streams)."""
    N = n * n + 2 * n
    cfg = DD.PostPreDhdwCuteCfg.heuristic(n, C, N, 32 if N > 16 else 16)
    kq = K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(n, C, N, n % 2 == 0))   # (bias for even n, none for odd)
    arts = (DD.launch(cfg).export("sm_90a"), K.launch(kq).export("sm_90a"))
    for art, side in zip(arts, (256, 128)):
        res = [v for k, v in cubin_resources(art.cubin).items() if "kernel" in k]
        assert len(res) == 1 and res[0]["frame"] == 0, f"register spills or a local array: {res}"
        need, have = setmaxnreg_budget(art, side)
        assert 0 < need <= have, (need, have)
        assert not unfenced_releases(art.ptx)
    mma = r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16"
    mm = re.findall(mma, arts[0].ptx)
    assert set(mm) == {"m64n64k16"} and len(mm) == 8, mm   # the code of a warpgroup's up to 2 streams x 4 k-steps
    assert "cp.async.bulk.tensor" in arts[0].ptx and ".global.shared::cta" not in arts[0].ptx   # TMA loads, no stores
    mm = re.findall(mma, arts[1].ptx)
    assert mm.count("m64n8k16") == 8 and mm.count(f"m64n{32 * n}k16") == 3 * kq.NP // 16, mm


def test_split_dw_config_limits():
    cfg = DD.PostPreDhdwCuteCfg.heuristic(4, 7168, 24, 32)
    assert cfg.S == 112 and cfg.STAGES == 4
    assert [DD.row_groups(t) for t in (1, 64, 65, 32768)] == [1, 1, 2, 7]
    kq = K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(4, 7168, 24, True))
    assert kq.DWPRE and kq.STAGES == 2
    # with_dwpre (the backward's config for SPLIT_DW): the most stages that fit beside sQ, none at CW 16
    for n, C, N in [(4, 7168, 24), (2, 7168, 8), (3, 200, 15), (1, 64, 3)]:
        base = K.PostPreBwdCuteCfg.heuristic(n, C, N, True)
        q = K.with_dwpre(base)
        assert q.DWPRE and q.STAGES <= base.STAGES
        assert q.STAGES == base.STAGES or dataclasses.replace(q, STAGES=q.STAGES + 1, DWPRE=False).smem_bytes + 2048 > \
            K.SMEM_LIMIT
    assert K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(2, 7168, 8, True)).STAGES == 3
    assert K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(4, 7168, 24, True, 16)) is None
    with pytest.raises(ValueError, match="32 with DWPRE"):
        K.PostPreBwdCuteCfg(n=4, C=7168, N=24, CW=16, DWPRE=True)
    with pytest.raises(ValueError, match="n <= 4"):
        DD.PostPreDhdwCuteCfg(n=5, C=64, N=35, NPAD=32)


@pytest.mark.parametrize("split", [1, 3])
def test_split_configs_compile_for_sm90a(split):
    """Both passes with SPLIT CTAs a row tile other than the heuristics' (forward 8, backward 4; 1: one CTA over all
    of C; 3 does not divide C=7168's 112 chunks): no spills, every stage release fenced."""
    from tilekernels.mhc import cute_post_pre_fwd as F

    b = dataclasses.replace(K.PostPreBwdCuteCfg.heuristic(4, 7168, 24, True), SPLIT=split)
    f = dataclasses.replace(F.PostPreFwdCuteCfg.heuristic(4, 7168, 24, 32, True), SPLIT=split)
    for art in (K.launch(b).export("sm_90a"), F.launch(f).export("sm_90a")):
        res = [v for k, v in cubin_resources(art.cubin).items() if "kernel" in k]
        assert len(res) == 1 and res[0]["frame"] == 0, res
        assert not unfenced_releases(art.ptx)


@pytest.mark.parametrize("planes", [None, 1, 2, 4])
@pytest.mark.parametrize("dst", ["f32", "bf16", "strided"])
def test_split_planes_sum_into_dh(planes, dst):
    """cute_post_pre._planes_into (the backward pass's dh planes into dh_res / dh_post): the planes' sum, whatever
    dh's dtype and strides; the same bits on a second call; a plain copy when the pass wrote dh's shape itself."""
    from tilekernels.mhc.cute_post_pre import _planes_into

    shape = (37, 3, 3)
    p = rand(*((planes,) if planes else ()), *shape, dtype=F32)
    want = (p.double().sum(0) if planes else p.double())
    outs = []
    for _ in range(2):
        if dst == "strided":
            out = torch.full((3, 3, 37), float("nan")).permute(2, 0, 1)
        else:
            out = torch.full(shape, float("nan"), dtype=BF16 if dst == "bf16" else F32)
        _planes_into(p, out)
        outs.append(out.clone())
    assert torch.equal(outs[0], outs[1])
    assert_close(outs[0].double(), want, kind="bfloat16" if dst == "bf16" else "float32", what="dh")


def test_dweight_stand_in_is_row_major():
    """cute_proj_rms.row_major (the dweight its reductions and SPLIT_DW / FUSE_DHW's write): dweight itself when
    contiguous and 8-byte aligned, else a fresh row-major tensor of its shape (a permuted view's strides would scramble
    the kernels' [N, n C] rows)."""
    from tilekernels.mhc.cute_proj_rms import row_major as _row_major

    w = torch.empty(24, 512, dtype=BF16)
    assert _row_major(w) is w
    for v in (torch.empty(512, 24, dtype=BF16).t(), torch.empty(24 * 512 + 1, dtype=BF16)[1:].view(24, 512)):
        sb = _row_major(v)
        assert sb is not v and sb.shape == v.shape and sb.dtype == v.dtype and sb.stride() == (512, 1)


FWD_COMPILE = [(4, 7168, True), (4, 7168, False), (3, 200, True), (1, 64, False), (2, 104, True)]


@pytest.mark.parametrize("n,C,bias", FWD_COMPILE, ids=[f"n{n}-C{c}-bias{b}" for n, c, b in FWD_COMPILE])
def test_fused_forward_compiles_for_sm90a(n, C, bias):
    """cute_post_pre_fwd (FUSE_FWD, the default forward): no spills, the projection's wgmma (m64 nNP, 4 k-steps a stream, the
    code of one warpgroup's streams), TMA loads and stores of the streams."""
    from tilekernels.mhc import cute_post_pre_fwd as F

    N = n * n + 2 * n
    cfg = F.PostPreFwdCuteCfg.heuristic(n, C, N, max(16, 1 << (N - 1).bit_length()), bias)
    art = F.launch(cfg).export("sm_90a")
    res = [v for k, v in cubin_resources(art.cubin).items() if "kernel" in k]
    assert len(res) == 1 and res[0]["frame"] == 0, res
    need, have = setmaxnreg_budget(art)
    unfenced = unfenced_releases(art.ptx)
    assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
    assert 0 < need <= have, (need, have)
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", art.ptx)
    assert set(mmas) == {f"m64n{cfg.NP}k16"} and len(mmas) == 4 * ((n + 1) // 2), mmas
    d = "3d" if n > 1 else "2d"
    assert f"cp.async.bulk.tensor.{d}.shared::cta.global" in art.ptx
    assert f"cp.async.bulk.tensor.{d}.global.shared::cta" in art.ptx


def test_pass_skeleton_probe_compiles():
    """benchmarks/probes/post_pre_bwd_skeleton.py (session 36: the passes' traffic alone, as cut today and as H2;
    session 37: siblings locked, LOCK): each layout compiles with its TMA loads and stores, fenced releases and the
    setmaxnreg budget; FWD's ring counts only the bytes it loads (a larger count would never complete its stages)."""
    P = probe_module("post_pre_bwd_skeleton")
    for cfg in (P.SkelCfg(), P.SkelCfg(BMT=32, H=2, NPK=48), P.SkelCfg(FWD=True, SPLIT=8, BMT=32, H=2, NPK=48),
                P.SkelCfg(LOCK=2)):
        art = P.launch(cfg).export("sm_90a")
        assert "cp.async.bulk.tensor.3d.shared::cta.global" in art.ptx
        assert "cp.async.bulk.tensor.3d.global.shared::cta" in art.ptx
        assert not unfenced_releases(art.ptx)
        need, have = setmaxnreg_budget(art)
        assert 0 < need <= have
    # LOCK (session 37): each producer arrives on its peers' lock barriers (remote mbarrier arrives), and the kernel
    # ends in a cluster barrier; LOCK must divide SPLIT
    for lock in (2, 4):
        ptx = P.launch(P.SkelCfg(LOCK=lock)).export("sm_90a").ptx
        assert len([ln for ln in ptx.splitlines() if "mbarrier.arrive" in ln and "shared::cluster" in ln]) == lock - 1
        assert "barrier.cluster.wait" in ptx
    with pytest.raises(ValueError, match="LOCK"):
        P.SkelCfg(SPLIT=3, LOCK=2)
    assert P.SkelCfg(FWD=True).stage_bytes == 5 * 64 * 64 * 2 + 2 * 128 * 32 * 2
    assert P.SkelCfg().stage_bytes == 10 * 64 * 64 * 2 + 2 * 128 * 32 * 2


def test_setmaxnreg_budget_flags_a_hang():
    """setmaxnreg_budget (the compile tests' guard): the fused forward's roles fit its launch allocation (40 x 128 +
    232 x 256 = 168 x 384); consumers asking 240 would not (setmaxnreg.inc would wait forever on the GPU)."""
    import types

    from tilekernels.mhc import cute_post_pre_fwd as F

    art = F.representative_launches()["fwd_biasTrue"].export("sm_90a")
    assert setmaxnreg_budget(art) == (40 * 128 + 232 * 256, 168 * 384)
    bad = types.SimpleNamespace(ptx=re.sub(r"(setmaxnreg\.inc\.sync\.aligned\.u32\s+)232", r"\g<1>240", art.ptx),
                                cubin=art.cubin)
    need, have = setmaxnreg_budget(bad)
    assert need > have
    # roles given explicitly (kernels with more than two): the same sum, and a role the PTX does not have is refused
    assert setmaxnreg_budget(art, roles={40: 128, 232: 256}) == setmaxnreg_budget(art)
    with pytest.raises(ValueError, match="not the roles"):
        setmaxnreg_budget(art, roles={40: 128, 240: 256})


def test_config_limits():
    with pytest.raises(ValueError, match="n <= 4"):
        K.PostPreBwdCuteCfg(n=5, C=64, N=35)
    with pytest.raises(ValueError, match="C % 8"):
        K.PostPreBwdCuteCfg(n=4, C=100, N=24)
    cfg = K.PostPreBwdCuteCfg.heuristic(4, 7168, 24, True)
    assert (cfg.NP, cfg.STAGES, cfg.NW, cfg.SPLIT) == (32, 2, 128, 4) and cfg.smem_bytes <= K.SMEM_LIMIT
    assert K.PostPreBwdCuteCfg.heuristic(1, 64, 3, False).STAGES == 4
    # SPLIT CTAs a row tile, at most one a chunk (C=104: 2 chunks of 64; C=64: 1)
    assert [K.PostPreBwdCuteCfg.heuristic(2, c, 8, True).SPLIT for c in (64, 104, 200)] == [1, 2, 4]
    with pytest.raises(ValueError, match="SPLIT <= chunks"):
        K.PostPreBwdCuteCfg(n=2, C=104, N=8, SPLIT=3)
    from tilekernels.mhc import cute_post_pre_fwd as F

    assert F.PostPreFwdCuteCfg.heuristic(4, 7168, 24, 32, True).SPLIT == 8
    assert F.PostPreFwdCuteCfg.heuristic(2, 104, 8, 16, True).SPLIT == 2
    with pytest.raises(ValueError, match="SPLIT <= chunks"):
        F.PostPreFwdCuteCfg(n=2, C=104, N=8, NPAD=16, SPLIT=3)
    # the spec's "256 * T < 2**31" bounds the planes' int32 offsets (SPLIT * T * plane width) at the heuristics' SPLIT
    # for every admitted n (the forward's NPAD <= 32, the backward's n*n <= 16)
    assert F.SPLIT_DEFAULT * 32 <= 256 and K.SPLIT_DEFAULT * 16 <= 256


@pytest.mark.parametrize("n,C,CW", [(4, 96, 32), (3, 200, 32), (1, 64, 32), (4, 104, 16)])
def test_permuted_weight_matches_the_accumulator_columns(n, C, CW):
    cfg = K.PostPreBwdCuteCfg.heuristic(n, C, n * n + 2 * n, True, CW)
    w = rand(cfg.N, n * C, dtype=BF16)
    wp = K.permuted_weight(w, cfg)
    assert wp.shape == (cfg.NP, cfg.nch * 2 * cfg.NW)
    assert not wp[cfg.N:].any()
    for ch in range(cfg.nch):
        for wc in range(2):
            for cb in range(cfg.CW // 8):
                for i in range(n):
                    for cc in range(8):
                        col = (ch * 2 + wc) * cfg.NW + 8 * (cb * n + i) + cc
                        c = ch * cfg.CC + wc * cfg.CW + cb * 8 + cc
                        want = w[:, i * C + c] if c < C else torch.zeros(cfg.N, dtype=BF16)
                        assert torch.equal(wp[:cfg.N, col], want), (ch, wc, cb, i, cc)


def test_limits_are_explained():
    def why(**kw):
        c = dict(T=3, n=4, C=64, h=F32, bias=True)
        c.update(kw)
        args = inputs(c["T"], c["n"], c["C"], h=c["h"], bias=c["bias"])
        rows = {b: (ok, w_) for b, ok, w_ in OP.explain(*args, **PARAMS)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    assert "n <= 4" in why(n=5)
    assert "C % 8 == 0" in why(C=100)
    assert "needs a CUDA device" in why()


# ------------------------------------------------------------------ GPU

GPU_CASES = [dict(T=1001, n=4, C=2560, h=F32, bias=True), dict(T=65, n=4, C=7168, h=BF16, bias=True),
             dict(T=37, n=3, C=200, h=BF16, bias=True), dict(T=1, n=1, C=64, h=F32, bias=False),
             dict(T=3, n=2, C=104, h=BF16, bias=True), dict(T=130, n=2, C=7168, h=F32, bias=False),
             dict(T=0, n=4, C=64, h=F32, bias=True), dict(T=300, n=4, C=520, h=F32, bias=False),
             # chunks == stages and stages + 1 (n <= 2 rings have 4 stages): the stores after the loop
             dict(T=70, n=2, C=256, h=F32, bias=True), dict(T=9, n=1, C=320, h=BF16, bias=True)]


@on_gpu
@pytest.mark.parametrize("c", GPU_CASES, ids=case_id)
def test_cute_matches_float64(c, monkeypatch):
    """The default backward (SPLIT_DW where it applies: checked to have run for T > 0)."""
    from tilekernels.mhc import cute_post_pre as cpp

    assert OP.choose(OP.bind(*inputs(2, c["n"], c["C"], h=c["h"], bias=c["bias"], device="cuda"), **PARAMS)) == "cute"
    used = []
    orig = cpp._split_dw
    monkeypatch.setattr(cpp, "_split_dw", lambda *a: used.append(orig(*a)) or used[-1])
    run_cutile(c, backend="cute")
    assert c["T"] == 0 or any(u is not None for u in used), "SPLIT_DW did not apply"


@on_gpu
@pytest.mark.parametrize("c,iters", [(dict(T=129, n=4, C=256, h=F32, bias=True), 41),
                                     (dict(T=37, n=3, C=200, h=BF16, bias=True), 64)])
def test_cute_many_iters(c, iters, monkeypatch):
    """Iters past what the CuTe DSL Sinkhorn backward's shared memory holds (n = 4 from 41, n = 3 from 57): the
    backward keeps cuTile's Sinkhorn kernel (cute_post_pre._sk_step; it raised there before) and is checked whole."""
    monkeypatch.setitem(PARAMS, "iters", iters)
    run_cutile(c, backend="cute")


@on_gpu
@pytest.mark.parametrize("c", [dict(T=130, n=4, C=200, h=F32, bias=True), dict(T=5, n=3, C=96, h=BF16, bias=True)],
                         ids=case_id)
def test_cute_chunks_of_32_channels(c, monkeypatch):
    """CW = 16 (the sweep's 32-channel chunks, measured slower): the same checks."""
    orig = K.PostPreBwdCuteCfg.heuristic
    monkeypatch.setattr(K.PostPreBwdCuteCfg, "heuristic", lambda n, C, N, hb, CW=32: orig(n, C, N, hb, 16))
    run_cutile(c, backend="cute")


@on_gpu
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("c", [dict(T=130, n=4, C=520, h=F32, bias=True), dict(T=65, n=3, C=200, h=BF16, bias=False)],
                         ids=case_id)
def test_cute_split_configs_match_float64(c, split, monkeypatch):
    """Both passes with SPLIT CTAs a row tile other than the heuristics' (forward 8, backward 4): 1, one CTA over
    all of C; 3, siblings with equal (C=520's 9 chunks: 3 / 3 / 3) and unequal (C=200's 4: 2 / 1 / 1) chunk counts.
    The same float64 checks (scratch planes are not zeroed: a plane a sibling did not write fails them)."""
    from tilekernels.mhc import cute_post_pre_fwd as F

    kb, fb = K.PostPreBwdCuteCfg.heuristic, F.PostPreFwdCuteCfg.heuristic

    def bwd(n, C, N, hb, CW=32):
        cfg = kb(n, C, N, hb, CW)
        return dataclasses.replace(cfg, SPLIT=min(split, cfg.nch))

    def fwd(*a):
        cfg = fb(*a)
        return dataclasses.replace(cfg, SPLIT=min(split, cfg.nch))

    monkeypatch.setattr(K.PostPreBwdCuteCfg, "heuristic", bwd)
    monkeypatch.setattr(F.PostPreFwdCuteCfg, "heuristic", fwd)
    run_cutile(c, backend="cute")


@on_gpu
@pytest.mark.parametrize("c", [GPU_CASES[0], GPU_CASES[2], GPU_CASES[3], GPU_CASES[4], GPU_CASES[7],
                               dict(T=65, n=4, C=7168, h=F32, bias=True)], ids=case_id)
def test_cute_composed_forward_matches_float64(c, monkeypatch):
    """FUSE_FWD off (the composed forward: cute_post_bda's, then mhc_pre's cuTile forward; the default runs the
    fused cute_post_pre_fwd pass, which every other GPU test here takes): the same float64 checks."""
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, "FUSE_FWD", False)
    run_cutile(c, backend="cute")


@on_gpu
@pytest.mark.parametrize("c", [GPU_CASES[0], GPU_CASES[2], GPU_CASES[3], GPU_CASES[7], dict(T=65, n=4, C=7168, h=F32,
                                                                                          bias=True)], ids=case_id)
def test_cute_without_split_dw_matches_float64(c, monkeypatch):
    """SPLIT_DW off (the dh_pre pass, then the dweight pass: a third read of out; every other GPU test here runs the
    default, SPLIT_DW): the same float64 checks."""
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, "SPLIT_DW", False)
    run_cutile(c, backend="cute")


@on_gpu
def test_cute_split_dw_is_deterministic_and_drops_the_dweight_pass():
    """Two runs bitwise equal (every partial written once and summed in a fixed order), and the default backward runs
    the slices pass and the backward pass with DWPRE, but neither the dh_pre pass nor the dweight pass (a
    torch.profiler kernel list)."""
    names = _twice_bitwise_equal()
    assert "PostPreDhdwCuteCfg" in names and "DWPRETrue" in names, names
    assert "mhc_agg_bwd" not in names and "DW_ONLYTrue" not in names
    # the mix's rest twice, as cute_pre_rest's kernel (CUTE_REST): dproj0 alone, then every output
    assert "DPROJ_ONLYTrue" in names and "DPROJ_ONLYFalse" in names and "mhc_pre_bwd_rest" not in names, names
    # the mix's Sinkhorn backward as cute_sk_bwd's kernel (CUTE_SK)
    assert "SkBwdCuteCfg" in names and "mhc_pre_bwd_sk" not in names, names


# the mix's kernels, each a CuTe DSL kernel by default: (cute_post_pre's switch, the cuTile kernel it stands in for,
# the CuTe DSL kernel's config name)
MIX_SWITCHES = [("CUTE_SK", "mhc_pre_bwd_sk", "SkBwdCuteCfg"), ("CUTE_REST", "mhc_pre_bwd_rest", "PreRestCuteCfg")]


@on_gpu
@pytest.mark.parametrize("flag,cutile,cute", MIX_SWITCHES, ids=[m[0] for m in MIX_SWITCHES])
@pytest.mark.parametrize("c", [GPU_CASES[0], GPU_CASES[2], dict(T=129, n=4, C=7168, h=BF16, bias=True)], ids=case_id)
def test_cute_with_cutile_mix_kernel_matches_float64(c, flag, cutile, cute, monkeypatch):
    """One of the mix's CuTe DSL kernels switched off (CUTE_SK: the Sinkhorn backward as cuTile's mhc_pre_bwd_sk;
    CUTE_REST: the rest as cuTile's mhc_pre_bwd_rest; mhc_pre's own kernels; every other GPU test here runs the CuTe
    ones): the same float64 checks, and the kernel list has the cuTile kernel and not the CuTe one."""
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, flag, False)
    run_cutile(c, backend="cute")
    names = _twice_bitwise_equal(T=c["T"], n=c["n"], C=c["C"])
    assert cutile in names and cute not in names, names


@on_gpu
@pytest.mark.parametrize("cute_mix", [True, False], ids=["cute_mix", "cutile_mix"])
@pytest.mark.parametrize("c", [GPU_CASES[0], GPU_CASES[2], dict(T=129, n=4, C=7168, h=BF16, bias=True)], ids=case_id)
def test_cute_forward_epilogue_matches_float64(c, cute_mix, monkeypatch):
    """The fused forward's epilogue as cute_pp_mix's CuTe DSL kernel (CUTE_MIX, the default every other GPU test here
    runs) and as cuTile's mhc_pp_mix: the float64 checks, and the forward's kernel list has the one and not the
    other."""
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, "CUTE_MIX", cute_mix)
    run_cutile(c, backend="cute")
    args = inputs(c["T"], c["n"], c["C"], h=c["h"], bias=c["bias"], device="cuda")
    names = kernel_names(lambda: OP(*args, **PARAMS, backend="cute"))
    skip_if_unprofiled(names)
    assert ("PpMixCuteCfg" in names) is cute_mix and ("mhc_pp_mix" in names) is not cute_mix, names


def _twice_bitwise_equal(T: int = 2000, n: int = 4, C: int = 7168) -> str:
    """Two fwd + bwd runs on the same inputs and grad outputs: every gradient bitwise equal; the second backward's
    kernel names (torch.profiler), space-separated."""
    args = inputs(T, n, C, device="cuda")
    cots = None
    res = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in args]
        outs = OP(*leaves, **PARAMS, backend="cute")
        if cots is None:
            cots = [rand(*o.shape, dtype=o.dtype).cuda() for o in outs]
        names = kernel_names(lambda: torch.autograd.backward(outs, cots))
        res.append([t.grad for t in leaves])
    for i, (a, b) in enumerate(zip(*res)):
        assert torch.equal(a, b), f"gradient {i} differs between runs"
    skip_if_unprofiled(names)
    return names


DHW_CASES = [dict(T=1001, n=4, C=2560, h=F32, bias=True), dict(T=37, n=3, C=200, h=BF16, bias=True),
             dict(T=1, n=1, C=64, h=F32, bias=False), dict(T=130, n=2, C=7168, h=F32, bias=False),
             dict(T=300, n=4, C=520, h=F32, bias=False), dict(T=65, n=4, C=8448, h=BF16, bias=True)]


@on_gpu
@pytest.mark.parametrize("c", DHW_CASES, ids=case_id)
def test_cute_dhw_pass_matches_float64(c, monkeypatch):
    """FUSE_DHW on (cute_post_pre_dhw: dh_pre and dweight in one pass, its CTAs through a device-wide exchange; off
    by default, measured slower): the same float64 checks, C = 8448 with 132 CTAs (one an SM of the H200), T = 1
    (one group), 1001 (a partial last group), C % 64 != 0 (a partial last slice)."""
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, "FUSE_DHW", True)
    run_cutile(c, backend="cute")


@on_gpu
def test_cute_dhw_pass_is_deterministic_and_replaces_both_passes(monkeypatch):
    """Two FUSE_DHW runs bitwise equal (the exchange sums in a fixed order whatever order the CTAs arrive in), and
    the backward runs no dh_pre pass and no dweight pass then (a torch.profiler kernel list)."""
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, "FUSE_DHW", True)
    names = _twice_bitwise_equal()
    assert "PostPreDhwCuteCfg" in names and "mhc_agg_bwd" not in names and "DW_ONLYTrue" not in names


@on_gpu
def test_cute_equals_cutile_and_is_deterministic():
    """Two runs bitwise equal (fixed-order reductions); the cuTile backend's default design within the bf16
    tolerance for every result (each is held to float64 by the table above; they sum in different orders, so
    elements whose terms cancel differ on their terms' scale, which this direct comparison does not take)."""
    args = inputs(1030, 4, 7168, device="cuda")
    cots = None
    runs = {}
    for backend in ("cute", "cute", "cutile"):
        leaves = [t.clone().requires_grad_() for t in args]
        outs = OP(*leaves, **PARAMS, backend=backend)
        if cots is None:
            cots = [rand(*o.shape, dtype=o.dtype).cuda() for o in outs]
        torch.autograd.backward(outs, cots)
        res = [o.detach() for o in outs] + [t.grad for t in leaves]
        if backend in runs:
            for i, (a, b) in enumerate(zip(runs[backend], res)):
                assert torch.equal(a, b), f"output/gradient {i} differs between runs"
        runs[backend] = res
    for name, a, b in zip(["out", "layer_in", "h_post_next", "h_res_next"] + [f"d{n}" for n in IN_NAMES],
                          runs["cute"], runs["cutile"]):
        assert_close(a.float(), b.float(), kind="bfloat16", what=name)


def test_pass_ab_probe_configs():
    """benchmarks/probes/post_pre_pass_ab.py (session 37): each pass's row is the op's own config (the backward's
    with_dwpre of the heuristic) with the row's fields replaced, and a field the config lacks is refused."""
    P = probe_module("post_pre_pass_ab")
    from tilekernels.mhc import cute_post_pre_fwd as F

    b = P._cfg("bwd", {"SPLIT": 8}, 4, 7168, 24, 32)
    assert b == dataclasses.replace(K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(4, 7168, 24, True)), SPLIT=8)
    assert P._cfg("fwd", {}, 4, 7168, 24, 32) == F.PostPreFwdCuteCfg.heuristic(4, 7168, 24, 32, True)
    assert P._cfg("dhdw", {"STAGES": 3}, 4, 7168, 24, 32).STAGES == 3
    with pytest.raises(TypeError):
        P._cfg("fwd", {"LOCK": 2}, 4, 7168, 24, 32)   # the passes' LOCK was reverted (5f278ea)


def test_cut_probe_configs_compile_and_are_refused_by_the_op():
    """CUT (session 38, a probe's config: math left out, wrong results) compiles at each level with fewer fp32 FMAs
    in the PTX than the level before and the same TMA traffic; the heuristic leaves it 0, the config refuses levels
    past 4, and the op's backward refuses any CUT before it launches anything."""
    base = K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(4, 7168, 24, True))
    assert base.CUT == 0
    fmas = []
    for cut in range(5):
        art = K.launch(dataclasses.replace(base, CUT=cut)).export("sm_90a")
        assert "cp.async.bulk.tensor.3d.shared::cta.global" in art.ptx and not unfenced_releases(art.ptx)
        fmas.append(len(re.findall(r"\bfma\.rn\.f32\b", art.ptx)))
    assert all(a > b for a, b in zip(fmas, fmas[1:])), fmas
    with pytest.raises(ValueError, match="CUT 5"):
        dataclasses.replace(base, CUT=5)
    from tilekernels.mhc import cute_post_pre as CP

    import inspect

    args = dict.fromkeys(inspect.signature(CP.bwd_launches).parameters)
    args.update(residual=torch.empty(2, 4, 64), weight=torch.empty(24, 256), iters=20,
                kcfg=K.PostPreBwdCuteCfg(n=4, C=64, N=24, CUT=1))
    with pytest.raises(ValueError, match="CUT 1 is a probe"):
        CP.bwd_launches(**args)


def test_power_probe_parses_and_summarizes():
    """benchmarks/probes/power_probe.py (session 37): nvidia-smi's csv lines (a malformed one skipped) are cut into
    each workload's window, its first 0.2 s left out; the power-cap share counts the 0x4 reason bit."""
    P = probe_module("power_probe")
    lines = ["2026/12/04 08:13:10.000, 1980, 600.0, 0x0000000000000000",
             "2026/12/04 08:13:10.500, 1700, 695.0, 0x0000000000000004",
             "2026/12/04 08:13:11.000, 1500, 699.0, 0x0000000000000005",
             "not a sample",
             "2026/12/04 08:13:12.000, 1980, 120.0, 0x0000000000000000"]
    s = P.parse_smi(lines)
    assert len(s) == 4 and s[1][0] - s[0][0] == pytest.approx(0.5) and s[2][3] == 5
    w = [dict(t0=s[0][0] - 0.1, t1=s[2][0])]
    P.summarize(w, s)
    assert w[0]["samples"] == 2 and w[0]["watts"] == pytest.approx(697.0) and w[0]["mhz_min"] == 1500
    assert w[0]["capped"] == 1.0
