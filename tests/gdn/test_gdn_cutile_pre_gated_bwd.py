"""cuTile gdn_pre_gated backward: cutile_pre_gated_bwd.py (the first design, PreGatedBwdCfg; the default for
W > WMAX) and cutile_pre_gated_bwd2.py (the second, PreGatedBwd2Cfg; the default for W <= WMAX).

CPU (CI): every variant (BSHD/THD, repeat_qk on/off, bf16/fp32, odd dk, dv, W > WMAX) and launch
config variants compile to cubins for sm_90 and sm_100 through the launch builder the GPU path
uses (``meta`` tensors, ``export_cubin``); the config is the compile key (from Hk, Hv, dk, dv, W,
repeat_qk only, never from B, T or N).

GPU (marked ``gpu``, skipped without CUDA): ``pre_gated_bwd_into`` on fresh random grads and
inputs (conftest seeds), outputs NaN-poisoned first, against ``reference.pre_gated_bwd`` run in
float64 on upcasts of the same inputs; then the same call again must be bitwise equal (the
reductions are fixed-order). Tolerances (tilekernels.testing, by the checked output's dtype):
  bf16 dmixed 1e-2: fp32 math from bf16 inputs, rounded once; dx also goes through the dpre
    scratch in bf16 (one more 2^-9 rounding of each of the W terms: norm-wise ~2^-9, 5x under);
  bf16 dconv_weight 1e-2: fp32 sums over tokens, rounded once; the first design sums fp32 dpre (registers,
    not the scratch; with DWA summed per token over a block's tiles first, then over its tokens: another
    order of the same fp32 sums), the second the bf16 dpre scratch (each term ~2^-9 relative, norm-wise
    ~2^-9: 4x under; measured 2.6e-3 at 32768 tokens);
  fp32 dmixed, dconv_weight (fp32 mixed: the scratch is fp32), dA_log, ddt_bias 1e-5: the
    reference's math in fp32 (W-tap conv, dk-long norm, sums over <= a few thousand tokens:
    reassociation ~1e-7); the sigmoid's APPROX exp and reciprocal are ~2 ulp each, far below.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

ct = pytest.importorskip("cuda.tile")

from tilekernels.gdn import bench as mk  # noqa: E402
from tilekernels.gdn import cutile_pre_gated as cp  # noqa: E402
from tilekernels.gdn import cutile_pre_gated_bwd as cb  # noqa: E402
from tilekernels.gdn import cutile_pre_gated_bwd2 as c2  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, assert_cubins  # noqa: E402
from gdn_pre_helpers import check_nan_at_sequence_edges, edge_cases  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
ARCHS = ("sm_90", "sm_100")
QWEN = dict(Hk=16, Hv=32, dk=128, dv=128, W=4)
GRADS = ("dmixed", "dconv_weight", "dA_log", "ddt_bias")

# (shape, thd, repeat_qk, mixed dtype): every compile-time switch at least once
COMPILE_VARIANTS = [
    (QWEN, False, True, BF),
    (QWEN, True, False, BF),
    (dict(Hk=1, Hv=4, dk=48, dv=40, W=3), True, True, F32),
    (dict(Hk=2, Hv=4, dk=16, dv=24, W=6), False, True, BF),  # W > WMAX: every tap gathered
]
# launch-config variants over the heuristic's (QWEN, THD, repeat_qk): compiled in CI, run on the GPU
# (the heuristic's dpre: XS DWA NTB4; OLD: the session-6 default, taps loaded twice, one tile a block; XT: taps
# as separate tiles; XS without DWA: the partial summed over each tile's tokens)
OLD = dict(XS=False, DWA=False, NTB=1, OCC_A=4)
# SD: the bf16 dpre scratch, the default before session 74 (an extra rounding: test_gdn_pre_gated's one-rounding test)
CFG_VARIANTS = [dict(SD=True), dict(NTB=3, TT=32, TB=32), dict(LT=True, LB=True, OCC_B=8),
                dict(GS=False, DWS=False, XS=False, DWA=False), dict(NTB=2, OCC_A=2, TG=64, BC=64), OLD,
                dict(XS=False, DWA=False, XT=True), dict(DWA=False, NTB=1)]


def _vid(v):
    s, thd, rep, dt = v
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + \
        f"-{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}-{str(dt)[6:]}"


def _launches(v, B=2, T=256, cfg=None):
    s, thd, rep, dt = v
    return cb.representative_launches(**s, B=B, T=T, dtype=dt, thd=thd, repeat_qk=rep, cfg=cfg)["gdn_pre_gated.bwd"]


def _cfg(over, shape=QWEN, rep=True):
    base = cb.PreGatedBwdCfg.heuristic(shape["Hk"], shape["Hv"], shape["dk"], shape["dv"], shape["W"], rep)
    return dataclasses.replace(base, **over)


def _cfg2(over, shape=QWEN, rep=True):
    base = c2.PreGatedBwd2Cfg.heuristic(shape["Hk"], shape["Hv"], shape["dk"], shape["dv"], shape["W"], rep)
    return dataclasses.replace(base, **over)


# the second design's (cutile_pre_gated_bwd2, the default for W <= WMAX) launch-config variants over its
# heuristic's (TT32 OCC4 dpre; dx + partials at TB8 NTX32 with TMA loads): the partials per tile (DWA off),
# one tile a dx block, plain loads, the exp+rcp sigmoid, smaller dpre tiles at occupancy 8, two dpre tiles a
# block, dx and the partials as two launches (SPLIT)
CFG2_VARIANTS = [dict(DWA=False, NTX=4), dict(NTX=1, TB=16), dict(LB=False), dict(SX=False), dict(TT=16, OCC_A=8),
                 dict(NTB=2, SD=False), dict(SPLIT=True, NTX=16)]


# ------------------------------------------------------------------ CPU (CI)


def test_every_variant_compiles_for_sm90_and_sm100():
    """At the default (cfg None), and for W <= WMAX at the other design's heuristic too (both stay runnable)."""
    jobs = []
    for v in COMPILE_VARIANTS:
        s, _, rep, _ = v
        for j, ln in enumerate(_launches(v)):
            jobs += [(f"{_vid(v)}[{j}]", ln, arch) for arch in ARCHS]
        if s["W"] <= cp.WMAX:
            other = _cfg({}, s, rep) if cb.V2 else _cfg2({}, s, rep)
            for j, ln in enumerate(_launches(v, cfg=other)):
                if ln.kernel not in (cb.gdn_pre_bwd_seq, cb.gdn_pre_bwd_red):  # compiled above
                    jobs += [(f"{_vid(v)} {type(other).__name__}[{j}]", ln, arch) for arch in ARCHS]
    assert_cubins(jobs)


def test_config_variants_compile():
    """The GPU-tested config variants compile too (sm_90: the same kernels as above, other constants)."""
    jobs = []
    for over in CFG_VARIANTS:
        for j, ln in enumerate(_launches(COMPILE_VARIANTS[0], cfg=_cfg(over))):
            if ln.kernel in (cb.gdn_pre_bwd_dpre, cb.gdn_pre_bwd_dx):
                jobs.append((f"{over}[{j}]", ln, "sm_90"))
    for over in CFG2_VARIANTS:
        for j, ln in enumerate(_launches(COMPILE_VARIANTS[0], cfg=_cfg2(over))):
            if ln.kernel in (c2.gdn_pre_bwd2_dpre, c2.gdn_pre_bwd2_dx):
                jobs.append((f"v2 {over}[{j}]", ln, "sm_90"))
    assert_cubins(jobs)


def test_launch_config_is_the_compile_key():
    """The config comes from (Hk, Hv, dk, dv, W, repeat_qk); B, T, N only change grids. A PreGatedBwd2Cfg runs
    the second design (cutile_pre_gated_bwd2), a PreGatedBwdCfg the first; without a cfg, W <= WMAX runs the
    second if cb.V2, else the first."""
    v = COMPILE_VARIANTS[0]
    cfg2 = c2.PreGatedBwd2Cfg.heuristic(16, 32, 128, 128, 4, True)
    small2, big2 = _launches(v, B=1, T=1, cfg=cfg2), _launches(v, B=4, T=8192, cfg=cfg2)
    assert [a.key() for a in small2] == [b.key() for b in big2]
    assert big2[0].cfg is cfg2 and cfg2 is c2.PreGatedBwd2Cfg.heuristic(16, 32, 128, 128, 4, True)  # cached
    assert (cfg2.R, cfg2.RP, cfg2.TT, cfg2.TB, cfg2.NTX, cfg2.HBZ, cfg2.DWA, cfg2.LB, cfg2.SPLIT) == \
        (2, 2, 32, 8, 32, 4, True, True, False)
    units = 2 * 16 + 32 + 32 // cfg2.HBZ + 1
    nt, nx = 4 * 8192 // cfg2.TT, 4 * 8192 // (cfg2.TB * cfg2.NTX)
    assert [ln.kernel for ln in big2] == [c2.gdn_pre_bwd2_dpre, c2.gdn_pre_bwd2_dpre, c2.gdn_pre_bwd2_dx,
                                          cb.gdn_pre_bwd_red]
    assert [ln.grid for ln in big2] == [(1, units, 1), (nt - 1, units, 1), (nx, 2 * 16 + 32, 1),
                                        (-(-(2 * 16 * 128 + 32 * 128) // cfg2.BC) + 1, 1, 1)]
    assert small2[1].grid[0] == 0  # T=1: one token tile, no main dpre launch (Launch.run skips an empty grid)
    split = _launches(v, B=4, T=8192, cfg=_cfg2(dict(SPLIT=True)))
    assert [ln.kernel for ln in split][2:4] == [cb.gdn_pre_bwd_dx, c2.gdn_pre_bwd2_dx]
    thd2 = _launches(COMPILE_VARIANTS[1], B=4, T=8192, cfg=_cfg2({}, QWEN, False))
    assert [ln.kernel for ln in thd2][:2] == [cb.gdn_pre_bwd_seq, c2.gdn_pre_bwd2_dpre]
    with pytest.raises(ValueError, match="W=6 > WMAX"):
        c2.PreGatedBwd2Cfg.heuristic(2, 4, 16, 24, 6, True)
    # the first design
    cfg = cb.PreGatedBwdCfg.heuristic(16, 32, 128, 128, 4, True)
    small, big = _launches(v, B=1, T=1, cfg=cfg), _launches(v, B=4, T=8192, cfg=cfg)
    assert [a.key() for a in small] == [b.key() for b in big]
    assert big[0].cfg is cfg and cfg is cb.PreGatedBwdCfg.heuristic(16, 32, 128, 128, 4, True)  # cached
    assert (cfg.R, cfg.RP, cfg.TT, cfg.HBZ, cfg.TAPV) == (2, 2, 16, 4, True)
    assert (cfg.XS, cfg.DWA, cfg.NTB, cfg.OCC_A) == (True, True, 4, 2)
    units = 2 * 16 + 32 + 32 // cfg.HBZ + 1
    nt = 4 * 8192 // cfg.TT
    assert [ln.grid for ln in big] == [(1, units, 1), (-(-(nt - 1) // cfg.NTB), units, 1),
                                       (4 * 8192 // cfg.TB, 2 * 16 + 32, 1), (-(-(2 * 16 * 128 + 32 * 128) // cfg.BC) + 1, 1, 1)]
    # T=1: one token tile, no main dpre launch (its grid is empty and Launch.run skips it)
    assert small[1].grid[0] == 0
    thd = _launches(COMPILE_VARIANTS[1], B=4, T=8192, cfg=_cfg({}, QWEN, False))  # THD: the sequence bounds first
    assert thd[0].kernel is cb.gdn_pre_bwd_seq and thd[0].grid == (4 * 8192 // thd[0].cfg.PT, 1, 1)
    # the default
    dflt = cfg2 if cb.V2 else cfg
    assert [ln.key() for ln in _launches(v, B=4, T=8192)] == [ln.key() for ln in (big2 if cb.V2 else big)]
    assert cb.PreGatedBwdCfg.heuristic(16, 32, 128, 128, 4, False).R == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.TT = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg2.TB = 8
    odd = cb.PreGatedBwdCfg.heuristic(1, 4, 48, 40, 3, True)
    assert (odd.DK, odd.DV, odd.WW, odd.R, odd.RP) == (64, 64, 4, 4, 4) and odd.TT >= 3
    wide = cb.PreGatedBwdCfg.heuristic(2, 4, 16, 24, 6, True)
    assert not wide.TAPV and len(_launches(COMPILE_VARIANTS[3])) == 3  # one gathering dpre launch
    assert not (wide.XS or wide.DWA or wide.XT)  # W > WMAX: the per-tap path
    # the forward module's representative launches include the backward at its own heuristic
    assert cp.representative_launches(B=1, T=1)["gdn_pre_gated.bwd"][0].cfg is dflt
    with pytest.raises(TypeError, match="PreGatedBwdCfg"):
        cb.bwd_cfg(16, 32, 128, 128, 4, True, cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, True))
    with pytest.raises(TypeError, match="PreGatedBwd2Cfg"):
        c2.bwd2_cfg(16, 32, 128, 128, 4, True, cfg)


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="Hv=6 is not a multiple of Hk=4"):
        cb.PreGatedBwdCfg.heuristic(4, 6, 16, 16, 4, True)
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[0], cfg=_cfg(dict(DK=64)))  # dk > DK
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[1], cfg=_cfg(dict()))  # a repeat_qk config for a call without
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[0], cfg=_cfg(dict(XS=False)))  # DWA needs XS
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[0], cfg=_cfg(dict(XT=True)))  # XT excludes XS
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[1], cfg=_cfg2(dict()))  # v2: a repeat_qk config for a call without
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[0], cfg=_cfg2(dict(TB=2)))  # v2: dx tiles shorter than W


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _problem(shape, lengths, dtype=BF, repeat_qk=True):
    """(grads, mixed, conv_weight, A_log, dt_bias, cu_seqlens|None): BSHD when lengths is (B, T),
    THD when it is a list of sequence lengths; grads random in the outputs' shapes and dtypes."""
    h = (shape["Hk"], shape["Hv"], shape["dk"], shape["dv"])
    w, A, dt = mk.weights(*h, shape["W"], dtype=dtype, device="cuda")
    if isinstance(lengths, tuple):
        x, cu = mk.mixed(lengths, *h, dtype=dtype, device="cuda"), None
    else:
        cu = mk.cu_seqlens(lengths, device="cuda")
        x = mk.mixed((int(sum(lengths)),), *h, dtype=dtype, device="cuda")
    lead = x.shape[:-1]
    Hk, Hv, dk, dv = h
    Hq = Hv if repeat_qk else Hk
    shapes = [((*lead, Hq, dk), dtype), ((*lead, Hq, dk), dtype), ((*lead, Hv, dv), dtype), ((*lead, Hv, dv), dtype),
              ((*lead, Hv), F32), ((*lead, Hv), dtype)]
    grads = [torch.randn(s, device="cuda").to(d) for s, d in shapes]
    return grads, x, w, A, dt, cu


def run_bwd(grads, x, w, A, dt, cu, shape, repeat_qk, cfg=None):
    dx, dw = _nan(*x.shape, dtype=x.dtype), _nan(*w.shape, dtype=w.dtype)
    dA, ddt = _nan(*A.shape, dtype=A.dtype), _nan(*dt.shape, dtype=dt.dtype)
    cb.pre_gated_bwd_into(*grads, x, w, A, dt, cu, dx, dw, dA, ddt, shape["Hk"], shape["dk"], shape["dv"], repeat_qk,
                          1e-6, False, cfg=cfg)
    return dx, dw, dA, ddt


def check_bwd(shape, layout, repeat_qk, dtype=BF, cfg=None):
    grads, x, w, A, dt, cu = _problem(shape, layout, dtype, repeat_qk)
    got = run_bwd(grads, x, w, A, dt, cu, shape, repeat_qk, cfg)
    want = ref.pre_gated_bwd(*[g.double() for g in grads], x.double(), w.double(), A.double(), dt.double(), cu,
                             Hk=shape["Hk"], dk=shape["dk"], dv=shape["dv"], repeat_qk=repeat_qk)
    for name, o, r in zip(GRADS, got, want):
        assert_close(o, r, kind=o.dtype, what=name)
    again = run_bwd(grads, x, w, A, dt, cu, shape, repeat_qk, cfg)
    for name, a, b in zip(GRADS, got, again):
        assert torch.equal(a, b), f"{name}: two runs differ (the reductions must be deterministic)"


THD_LENGTHS = [0, 1, 3, 4, 7, 0, 130, 2, 5]  # empty, 1, W-1, W, odd, one long (over several token tiles)
LAYOUTS = [(2, 70), (1, 1), (3, 5), THD_LENGTHS, [1], [0, 2, 0]]
LAYOUT_IDS = ["bshd-2x70", "bshd-T1", "bshd-3x5", "thd-mixed", "thd-1", "thd-empties"]
CASES = [  # (shape, repeat_qk): Hv/Hk 1, 2, 4; dk != dv; non-power-of-two dk, dv; W 1..4
    (QWEN, True), (QWEN, False),
    (dict(Hk=2, Hv=4, dk=64, dv=32, W=3), True), (dict(Hk=2, Hv=4, dk=64, dv=32, W=3), False),
    (dict(Hk=4, Hv=4, dk=32, dv=64, W=2), True),
    (dict(Hk=1, Hv=4, dk=48, dv=40, W=4), True),
    (dict(Hk=2, Hv=2, dk=16, dv=24, W=1), False),
]
CASE_IDS = ["Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + ("-rep" if r else "-norep") for s, r in CASES]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape,repeat_qk", CASES, ids=CASE_IDS)
def test_bwd_matches_float64_reference(shape, repeat_qk, layout):
    check_bwd(shape, layout, repeat_qk)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 33), THD_LENGTHS], ids=["bshd", "thd"])
def test_bwd_fp32_and_wide_conv(layout):
    """fp32 I/O (fp32 scratch: 1e-5), and W > WMAX (every tap gathered, one dpre launch)."""
    check_bwd(dict(Hk=2, Hv=4, dk=64, dv=32, W=3), layout, True, dtype=F32)
    check_bwd(dict(Hk=2, Hv=4, dk=16, dv=24, W=cp.WMAX + 2), layout, True)


@pytest.mark.gpu
@needs_gpu
def test_bwd_many_sequences_and_tokens():
    """300 sequences of 0..9 tokens (several cu_seqlens scan chunks), then 2 x 1000 BSHD tokens
    (many row blocks of the dpre launch and many partial rows in the reduction)."""
    s = dict(Hk=2, Hv=4, dk=32, dv=32, W=4)
    check_bwd(s, torch.randint(0, 10, (300,)).tolist(), True)
    check_bwd(s, (2, 1000), True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("over", CFG_VARIANTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_bwd_launch_config_variants(over):
    """Other tilings, fp32 scratch, TMA loads on, the other grad-sum and dconv_weight-partial forms (the
    session-6 path, XT, XS without DWA), loops over token tiles: same results (THD with repeat_qk: R = 2 grads
    summed)."""
    check_bwd(QWEN, THD_LENGTHS + [300], True, cfg=_cfg(over))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("over", CFG2_VARIANTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_bwd2_launch_config_variants(over):
    """The second design's other settings (CFG2_VARIANTS): same results, THD with repeat_qk and BSHD without."""
    check_bwd(QWEN, THD_LENGTHS + [300], True, cfg=_cfg2(over))
    check_bwd(dict(Hk=2, Hv=4, dk=64, dv=32, W=3), (2, 45), False, cfg=_cfg2(over, dict(Hk=2, Hv=4, dk=64, dv=32, W=3),
                                                                          False))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 70), THD_LENGTHS], ids=["bshd", "thd"])
@pytest.mark.parametrize("shape,repeat_qk", CASES, ids=CASE_IDS)
def test_other_design_matches(shape, repeat_qk, layout):
    """The design that is not the default (cb.V2) at its own heuristic: the first (PreGatedBwdCfg) or the
    second (PreGatedBwd2Cfg, W <= WMAX)."""
    h = (shape["Hk"], shape["Hv"], shape["dk"], shape["dv"], shape["W"], repeat_qk)
    cfg = cb.PreGatedBwdCfg.heuristic(*h) if cb.V2 else c2.PreGatedBwd2Cfg.heuristic(*h)
    check_bwd(shape, layout, repeat_qk, cfg=cfg)


@pytest.mark.gpu
@needs_gpu
@edge_cases
def test_nan_gradient_at_sequence_edges(shape, repeat_qk, layout):
    """The dx pass's dconv_weight partial adds the zero-padding products dpre[t] * 0 at each sequence start
    (session 50): a NaN q or v gradient in a sequence's first W-1 tokens reaches every tap, as the reference's
    (the registry's NaN test, at a random element, found them missing in session 49; helper's doc)."""
    grads, x, w, A, dt, cu = _problem(shape, layout, BF, repeat_qk)
    run = lambda g, xb: run_bwd(g, xb, w, A, dt, cu, shape, repeat_qk)  # noqa: E731
    check_nan_at_sequence_edges(run, grads, x, w, A, dt, cu, layout, shape, repeat_qk)
