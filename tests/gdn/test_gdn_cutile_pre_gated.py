"""cuTile gdn_pre_gated (tilekernels/gdn/cutile_pre_gated.py, cutile_pre_gated_bwd.py).

CPU (CI): every variant (BSHD/THD, repeat_qk on/off, conv state on/off, bf16/fp32, odd dk,
dv, W) compiles to a cubin for sm_90 and sm_100 through the same launch builders the GPU
path uses (``meta`` tensors, ``export_cubin``); the launch config is the compile key (built
from Hk, Hv, dk, dv, W, repeat_qk only, never from B, T or N).

GPU (marked ``gpu``, skipped without CUDA): the kernels called directly against
``reference.pre_gated`` / ``pre_gated_bwd`` run in float64 on upcasts of the same inputs,
outputs NaN-poisoned first, fresh random inputs each run (conftest). Tolerances
(tilekernels.testing, by the dtype of the checked output):
  bf16 outputs and grads 1e-2: fp32 math from the same bf16 inputs, rounded once (2^-9 per
    element); the grads of conv_weight are fp32 sums over tokens, rounded once; with SX (16-bit
    outputs only) the SiLU's MUFU tanh.approx adds at most ~2^-11 |x|/2 an element, below that
    rounding (norm-wise ~1e-4 measured, far under 1e-2);
  fp32 outputs (g; everything with fp32 mixed) and dA_log, ddt_bias 1e-5: the reference's
    math in fp32 (a W-tap conv, a dk-long norm, sums over <= a few thousand tokens, each
    term exact to ~1e-7 relative: reassociation stays far below 1e-5; the forward's SiLU uses the
    APPROX exp and reciprocal, ~2 ulp each, also far below it);
  conv_state exact: it is a copy of inputs.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

ct = pytest.importorskip("cuda.tile")

from tilekernels.gdn import cutile_pre_gated as cp  # noqa: E402
from tilekernels.gdn import cutile_pre_gated_bwd as cb  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import assert_cubins, assert_close  # noqa: E402
from gdn_pre_helpers import (LAYOUTS, QWEN, SHAPE_IDS, SHAPES, THD_LENGTHS,  # noqa: E402
                             nan as _nan, nan_outputs as _outs, problem as _problem, ref64 as _ref64)

BF, F32, F64 = torch.bfloat16, torch.float32, torch.float64
ARCHS = ("sm_90", "sm_100")
NAMES = ("q", "k", "v", "z", "g", "beta")

# (shape, thd, repeat_qk, conv state, mixed dtype): every compile-time switch at least once
COMPILE_VARIANTS = [
    (QWEN, False, True, True, BF),
    (QWEN, True, False, False, BF),
    (dict(Hk=1, Hv=4, dk=48, dv=40, W=3), True, True, True, F32),
    (dict(Hk=2, Hv=4, dk=16, dv=24, W=6), False, True, True, BF),  # W > WMAX: every tile gathers
]


def _vid(v):
    s, thd, rep, state, dt = v
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + \
        f"-{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}-{'state' if state else 'nostate'}-{str(dt)[6:]}"


def _launches(v, B=2, T=256, cfg=None):
    s, thd, rep, state, dt = v
    return cp.representative_launches(**s, B=B, T=T, dtype=dt, thd=thd, repeat_qk=rep, state=state, cfg=cfg)


# ------------------------------------------------------------------ CPU (CI)


def test_every_variant_compiles_for_sm90_and_sm100():
    jobs = []
    for v in COMPILE_VARIANTS:
        for name, lns in _launches(v).items():
            for j, ln in enumerate(lns):
                jobs += [(f"{_vid(v)}/{name}[{j}]", ln, arch) for arch in ARCHS]
    assert_cubins(jobs)


def test_fwd_switches_compile_for_sm90_and_sm100():
    """The forward's optional switches in one config (tiles inside the arrays without bounds checks CB,
    the num_worker_warps hint NW, the z copy in ZC-head steps): its main launch compiles for both archs."""
    cfg = dataclasses.replace(cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, True), FT=32, OCC=4, CB=True, NW=8,
                              HBZ=16, ZC=2)
    ln = _launches(COMPILE_VARIANTS[0], cfg=cfg)["gdn_pre_gated.fwd"][-1]
    assert ln.hints == (("occupancy", 4), ("num_worker_warps", 8)) and ln.args[-5:-2] == (False, True, 2)
    assert_cubins([(f"switches/{arch}", ln, arch) for arch in ARCHS])


def test_fwd_thd_switches_compile_for_sm90_and_sm100():
    """The session-7 switches in one config (per-tap masks on every THD tile MA, the head launch's own
    occupancy OCCH, the tanh SiLU SX): both launches compile for both archs; MA reaches the kernel only in
    THD (BSHD tiles keep the unmasked inner-tile branch), SX only with 16-bit outputs (fp32 keeps the
    exp + reciprocal SiLU and its 1e-5 tolerance)."""
    cfg = dataclasses.replace(cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, False), MA=True, OCCH=2, SX=True)
    lns = _launches(COMPILE_VARIANTS[1], cfg=cfg)["gdn_pre_gated.fwd"]
    assert lns[0].hints == (("occupancy", 2),) and lns[1].hints == (("occupancy", cfg.OCC),)
    assert lns[1].args[-2:] == (True, True)
    bshd = _launches((QWEN, False, False, False, BF), cfg=cfg)["gdn_pre_gated.fwd"]
    assert bshd[1].args[-2:] == (False, True)
    f32 = _launches((QWEN, True, False, False, F32), cfg=cfg)["gdn_pre_gated.fwd"]
    assert f32[1].args[-2:] == (True, False)
    assert_cubins([(f"thd-switches[{j}]/{arch}", ln, arch) for j, ln in enumerate(lns) for arch in ARCHS])


def test_launch_config_is_the_compile_key():
    """The config comes from (Hk, Hv, dk, dv, W, repeat_qk); B, T, N are dynamic: one key."""
    v = COMPILE_VARIANTS[0]
    small, big = _launches(v, B=1, T=1), _launches(v, B=4, T=8192)
    for name in small:
        assert [a.key() for a in small[name]] == [b.key() for b in big[name]], name
    fwd_s, fwd_b = small["gdn_pre_gated.fwd"], big["gdn_pre_gated.fwd"]
    cfg = cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, True)
    assert fwd_s[0].cfg is cfg and cfg is cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, True)  # cached
    # 1-D grids of (row, unit) blocks, units = head groups of q|k, v, z + the gates; launch 0: token
    # tile 0 + one row per sequence (conv state), launch 1: tiles 1.. (none when there is one tile)
    units = 32 // cfg.HB + 32 // cfg.HBV + 32 // cfg.HBZ + 1
    assert [ln.grid for ln in fwd_s] == [((1 + 1) * units, 1, 1), (0, 1, 1)]
    assert [ln.grid for ln in fwd_b] == [((1 + 4) * units, 1, 1), ((4 * 8192 // cfg.FT - 1) * units, 1, 1)]
    thd = _launches(COMPILE_VARIANTS[1], B=4, T=8192)["gdn_pre_gated.fwd"]  # THD: + sequence-start rows
    c1 = thd[0].cfg
    u1 = 32 // c1.HB + 32 // c1.HBV + 32 // c1.HBZ + 1
    assert thd[0].grid == ((1 + -(-(4 * 8192 // c1.PT) // u1)) * u1, 1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.FT = 8
    keys = {_launches(v)["gdn_pre_gated.fwd"][0].key() for v in COMPILE_VARIANTS}
    assert len(keys) == len(COMPILE_VARIANTS)
    odd = cp.PreGatedCfg.heuristic(1, 4, 48, 40, 3, True)
    assert (odd.DK, odd.DV, odd.WP, odd.WW, odd.R) == (64, 64, 2, 4, 4) and odd.FT >= 3


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="Hv=6 is not a multiple of Hk=4"):
        cp.PreGatedCfg.heuristic(4, 6, 16, 16, 4, True)
    with pytest.raises(ValueError, match="does not fit"):
        _launches(COMPILE_VARIANTS[0], cfg=cp.PreGatedCfg.heuristic(16, 32, 64, 128, 4, True))  # dk > DK


def test_refuses_configs_that_hang():
    """Configs that never finished on the H200 (a hung kernel stalls the whole GPU) are refused when
    built, naming the reason; their neighbours without TMA stores / the warps hint are accepted."""
    base = cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, True)
    for over in (dict(FT=16, HB=4, HBV=4, HBZ=8, OCC=2, ST=True), dict(FT=16, HB=4, OCC=2, ST=True),
                 dict(FT=16, HBV=4, OCC=2, ST=True), dict(FT=64, OCC=2, NW=8)):
        with pytest.raises(ValueError, match="hang on the H200"):
            dataclasses.replace(base, **over)
    with pytest.raises(ValueError, match="not shown to finish"):
        dataclasses.replace(base, FT=16, HBZ=8, ST=True)
    for over in (dict(FT=16, HB=4, HBV=4, HBZ=8, OCC=2), dict(FT=16, OCC=8, ST=True), dict(FT=32, OCC=4, NW=8),
                 dict(FT=64, OCC=2)):
        dataclasses.replace(base, **over)


def test_spec_declares_the_backend():
    from specs.gdn import PRE_GATED

    b = next(b for b in PRE_GATED.backends if b.name == "cutile")
    assert b.module == cp.__name__ and b.passes == ["fwd", "bwd"] and b.sm == (90, 100)
    assert b.dtypes["mixed"] == ["bfloat16", "float32"]
    assert cp.BWD_MODULE == cb.__name__


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_fwd(x, w, A, dt, cu, shape, repeat_qk, state):
    """The cutile fwd into NaN-filled outputs: (q, k, v, z, g, beta, conv_state|None)."""
    outs, cs = _outs(x, cu, shape, repeat_qk, state)
    cp.pre_gated_fwd_into(x, w, A, dt, cu, *outs, cs, shape["Hk"], shape["dk"], shape["dv"], repeat_qk, 1e-6, state)
    return (*outs, cs)


def check_fwd(x, w, A, dt, cu, shape, repeat_qk, state):
    got = run_fwd(x, w, A, dt, cu, shape, repeat_qk, state)
    want = _ref64(x, w, A, dt, cu, shape, repeat_qk, state)
    for name, o, r in zip(NAMES, got, want):
        assert_close(o, r, kind=o.dtype, what=name)
    if state:
        assert_close(got[6], want[6].to(x.dtype), kind="exact", what="conv_state")
    return got




@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("repeat_qk,state", [(True, True), (False, False)], ids=["rep-state", "norep-nostate"])
@pytest.mark.parametrize("layout", [lay for lay, _ in LAYOUTS], ids=[i for _, i in LAYOUTS])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_fwd_matches_float64_reference(shape, layout, repeat_qk, state):
    check_fwd(*_problem(shape, layout), shape, repeat_qk, state)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 33), THD_LENGTHS], ids=["bshd", "thd"])
def test_fwd_g_at_very_negative_gate_inputs(layout):
    """a + dt_bias in [-20, -8] (dt_bias -12, a in [-8, 4]): softplus is e^x there, and g's fp32 tolerance (1e-5)
    holds only if log1p(e^x) keeps e^x's low bits (the former log(1 + e^x) gave ~2e-4 at -8 and g = 0 from -17)."""
    shape = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    x, w, A, dt, cu = _problem(shape, layout, dtype=F32)
    x[..., -shape["Hv"]:] = torch.rand_like(x[..., -shape["Hv"]:]) * 12 - 8
    dt.fill_(-12.0)
    check_fwd(x, w, A, dt, cu, shape, True, False)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 33), THD_LENGTHS], ids=["bshd", "thd"])
def test_fwd_fp32_and_width_one(layout):
    """fp32 I/O (1e-5), and W=1 (no history: conv state of width 0)."""
    check_fwd(*_problem(dict(Hk=2, Hv=4, dk=64, dv=32, W=3), layout, dtype=F32),
              dict(Hk=2, Hv=4, dk=64, dv=32, W=3), True, True)
    s1 = dict(Hk=2, Hv=2, dk=16, dv=24, W=1)
    check_fwd(*_problem(s1, layout), s1, False, True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 70), THD_LENGTHS], ids=["bshd", "thd"])
def test_fwd_wide_conv_gathers_every_tile(layout):
    """W > WMAX: one launch, every token tile gathers its taps row by row."""
    s = dict(Hk=2, Hv=4, dk=16, dv=24, W=cp.WMAX + 2)
    check_fwd(*_problem(s, layout), s, True, True)


# Not listed: configs PreGatedCfg refuses because they never finished on the H200 (TMA stores or
# num_worker_warps with conv tiles of >= 8192 elements, e.g. FT16 HB4 HBV4 HBZ8 OCC2 ST, FT64 OCC2 NW8:
# test_refuses_configs_that_hang, benchmarks/probes/gdn_pre_fwd_hang.py).
FWD_CFGS = [dict(FT=16, HB=2, HBV=2, HBZ=8, OCC=4), dict(FT=16, HB=4, HBV=4, HBZ=8, OCC=2),
            dict(FT=32, HB=1, HBV=1, HBZ=4, OCC=4), dict(FT=32, HB=2, HBV=2, HBZ=8, OCC=2),
            dict(TF=True), dict(LT=False), dict(FT=16, OCC=8, ST=True), dict(HBZ=2), dict(FT=16, OCC=8),
            dict(FT=32, OCC=4, CB=True), dict(FT=32, OCC=4, NW=8), dict(FT=32, OCC=8, NW=8),
            dict(FT=32, OCC=4, HBZ=16, ZC=2), dict(FT=64, OCC=2), dict(MA=True, OCCH=2, SX=False),
            dict(MA=True, OCCH=2, SX=True), dict(MA=False, OCCH=0, SX=False)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("over", FWD_CFGS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_fwd_launch_config_variants(over):
    """Other head-group tilings (the benchmark's sweep), TMA loads on and off, TMA stores: same results."""
    x, w, A, dt, cu = _problem(QWEN, THD_LENGTHS + [300])
    cfg = dataclasses.replace(cp.PreGatedCfg.heuristic(16, 32, 128, 128, 4, True), **over)
    want = _ref64(x, w, A, dt, cu, QWEN, True, True)
    NT, N = x.shape[0], cu.shape[0] - 1
    outs = (_nan(NT, 32, 128, dtype=BF), _nan(NT, 32, 128, dtype=BF), _nan(NT, 32, 128, dtype=BF),
            _nan(NT, 32, 128, dtype=BF), _nan(NT, 32, dtype=F32), _nan(NT, 32, dtype=BF))
    cs = _nan(N, ref.conv_dim(16, 32, 128, 128), 3, dtype=BF)
    for ln in cp.fwd_launch(x, w, A, dt, cu, *outs, cs, 16, 128, 128, True, 1e-6, cfg=cfg):
        ln.run()
    for name, o, r in zip(NAMES, outs, want):
        assert_close(o, r, kind=o.dtype, what=name)
    assert_close(cs, want[6].to(BF), kind="exact", what="conv_state")


@pytest.mark.gpu
@needs_gpu
def test_thd_with_many_sequences_spanning_chunks():
    """More cu_seqlens entries than one scan chunk (CH=128): 300 sequences of 0..9 tokens."""
    s = dict(Hk=2, Hv=4, dk=32, dv=32, W=4)
    lengths = torch.randint(0, 10, (300,)).tolist()
    check_fwd(*_problem(s, lengths), s, True, True)


def _grads(outs):
    return [torch.randn(o.shape, device="cuda").to(o.dtype) for o in outs[:6]]


# The backward against float64 (every shape here and more, every layout): test_gdn_cutile_pre_gated_bwd.py.


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 37), [3, 0, 40, 1]], ids=["bshd", "thd"])
def test_registry_autograd_matches_torch_backend(layout):
    """registry.get(...)(..., backend="cutile") fwd + autograd bwd (fp32, so 1e-5) equals the
    float64 torch backend's outputs and gradients; cutile is usable for this call and auto picks
    a GPU backend (cute, forward-only, comes first for no-grad calls where CuTe DSL is installed)."""
    import registry

    op = registry.get("gdn_pre_gated")
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    x, w, A, dt, cu = _problem(s, layout, dtype=F32)
    p = dict(Hk=2, dk=64, dv=32, repeat_qk=True)
    rows = op.explain(x, w, A, dt, cu_seqlens=cu, **p)
    assert dict((b, ok) for b, ok, _ in rows)["cutile"], rows
    assert next(b for b, ok, _ in rows if ok) in ("cute", "cutile"), rows
    leaves = [t.clone().requires_grad_() for t in (x, w, A, dt)]
    outs = op(*leaves, cu_seqlens=cu, backend="cutile", **p)
    grads = _grads(outs)
    torch.autograd.backward(outs, grads)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, w, A, dt)]
    outs64 = op(*leaves64, cu_seqlens=cu, backend="torch", **p)
    torch.autograd.backward(outs64, [g.double() for g in grads])
    for name, o, r in zip(NAMES, outs, outs64):
        assert_close(o, r, what=name)
    for name, a, b in zip(("dmixed", "dconv_weight", "dA_log", "ddt_bias"), leaves, leaves64):
        assert_close(a.grad, b.grad, what=name)
