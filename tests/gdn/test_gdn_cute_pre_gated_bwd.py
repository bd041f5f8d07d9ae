"""CuTe DSL gdn_pre_gated backward (tilekernels/gdn/cute_pre_gated_bwd.py, the cute backend's bwd) and the torch
model of its decomposition (cute_pre_gated_bwd_model.py).

CPU (CI): the model against ``reference.pre_gated_bwd`` in float64 (every grad at the float64 tolerance):
BSHD and THD with sequences of 0, 1, W-1, W, odd and long lengths, starts on and next to span edges, T=1,
no tokens, W 1 .. 4, Hv/Hk 1, 2, 4, dk != dv, odd dims, spans of 4, 32 and 128 tokens; each span's
partial row is the reference's weight grads of that span's tokens alone. That checks the index logic the
kernel mirrors (spans, halo rows, the start counter, the window zeroing, the dx sums emitted W-1 rows late,
the partial rows and their reduction). Every variant (BSHD/THD, repeat_qk on/off, bf16/fp32, W 1 .. 6, dk
!= dv, Hv/Hk 1, 2, 4, odd sizes, 16-byte and narrower vectors) and the probe's launch-config variants
compile for sm_90a from fake arguments (``Launch.export``) without register spills; the config is the
compile key (NT, T, the cu_seqlens entries runtime scalars).

GPU (marked ``gpu``, skipped without CUDA; first run on an H200 in session 12): ``pre_gated_bwd_into`` into NaN-poisoned
outputs against ``reference.pre_gated_bwd`` in float64 on upcasts of the same inputs, then the same call
again bitwise equal (the reduction's order is fixed). Tolerances (tilekernels.testing, by the checked
output's dtype): bf16 dmixed and dconv_weight 1e-2 (fp32 math from bf16 inputs, each output rounded once;
no scratch: dpre stays fp32 in registers); fp32 outputs 1e-5 (fp32 sums over W taps, dk channels and the
tokens; the SiLU's ex2.approx / rcp.approx and the rsqrt.approx a few ulp each).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from specs.schema import EPS_MIN
from tilekernels.gdn import bench as mk
from tilekernels.gdn import reference as ref
from tilekernels.gdn.cute_pre_gated_bwd_model import cdiv, model_bwd
from tilekernels.testing import assert_close
from gdn_pre_helpers import check_nan_at_sequence_edges, edge_cases  # noqa: E402

try:
    from tilekernels._cute import cubin_resources
    from tilekernels.gdn import cute_pre_gated_bwd as cb
except ImportError:  # no CuTe DSL here: the model tests still run
    cb = None

needs_cute = pytest.mark.skipif(cb is None, reason="needs cutlass (the CuTe DSL)")
BF, F32, F64 = torch.bfloat16, torch.float32, torch.float64
QWEN = dict(Hk=16, Hv=32, dk=128, dv=128, W=4)
GRADS = ("dmixed", "dconv_weight", "dA_log", "ddt_bias")


def _sid(s):
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s)


def _problem(shape, lengths, dtype=F64, repeat_qk=True, device="cpu"):
    """(grads, mixed, conv_weight, A_log, dt_bias, cu_seqlens|None): BSHD when lengths is (B, T), THD when it is
    a list of sequence lengths; grads random in the outputs' shapes (gg fp32 unless float64)."""
    h = (shape["Hk"], shape["Hv"], shape["dk"], shape["dv"])
    w, A, dt = mk.weights(*h, shape["W"], dtype=dtype, device=device)
    if dtype == F64:
        A, dt = A.double(), dt.double()
    if isinstance(lengths, tuple):
        x, cu = mk.mixed(lengths, *h, dtype=dtype, device=device), None
    else:
        cu = mk.cu_seqlens(lengths, device=device)
        x = mk.mixed((int(sum(lengths)),), *h, dtype=dtype, device=device)
    lead = x.shape[:-1]
    Hk, Hv, dk, dv = h
    Hq = Hv if repeat_qk else Hk
    gdt = F64 if dtype == F64 else F32
    shapes = [((*lead, Hq, dk), dtype), ((*lead, Hq, dk), dtype), ((*lead, Hv, dv), dtype), ((*lead, Hv, dv), dtype),
              ((*lead, Hv), gdt), ((*lead, Hv), dtype)]
    grads = [torch.randn(s, device=device).to(d) for s, d in shapes]
    return grads, x, w, A, dt, cu


def _ref(grads, x, w, A, dt, cu, shape, repeat_qk, eps=1e-6):
    return ref.pre_gated_bwd(*[g.double() for g in grads], x.double(), w.double(), A.double(), dt.double(), cu,
                             Hk=shape["Hk"], dk=shape["dk"], dv=shape["dv"], repeat_qk=repeat_qk, eps=eps)


def _zero_heads(x, shape):
    """Zero the input channels of q head 0 and of the last k head at every token: their conv output and y are
    then exactly 0 (no conv bias), the l2norm's sum y^2 is 0 and s = rsqrt(eps)."""
    Hk, dk = shape["Hk"], shape["dk"]
    x[..., :dk] = 0
    x[..., (2 * Hk - 1) * dk:2 * Hk * dk] = 0
    return x


# l2norm eps under which the former s^3 form overflowed fp32 on a zero head (s = rsqrt(eps), s^3 > 2**128 for
# eps < 2**-85.3; inf * sum(dn y) = inf * 0 = NaN): one just under that, and the spec's minimum 2**-126
TINY_EPS = [1e-26, EPS_MIN]

# ------------------------------------------------------------------ CPU: the decomposition (torch model)

MODEL_SHAPES = [dict(Hk=2, Hv=4, dk=8, dv=6, W=4),   # R=2, dk != dv
                dict(Hk=1, Hv=4, dk=6, dv=5, W=3),   # R=4, odd dims
                dict(Hk=2, Hv=2, dk=4, dv=4, W=2),   # R=1
                dict(Hk=2, Hv=2, dk=4, dv=4, W=1)]   # no window
# BSHD (B, T) or THD lengths: empty, 1, W-1, W, odd, one long; starts on and next to 32-token span edges;
# T=1; no tokens at all
MODEL_LAYOUTS = [(2, 70), (1, 1), (3, 5), [0, 1, 3, 4, 7, 0, 130, 2, 5], [1], [0, 2, 0],
                 [32, 31, 1, 30, 34, 64, 2, 0, 33], (2, 0), [0, 0]]


def _lid(lay):
    return f"bshd{lay[0]}x{lay[1]}" if isinstance(lay, tuple) else "thd" + "-".join(map(str, lay))[:24]


@pytest.mark.parametrize("L", [4, 32])
@pytest.mark.parametrize("repeat_qk", [True, False], ids=["rep", "norep"])
@pytest.mark.parametrize("layout", MODEL_LAYOUTS, ids=_lid)
@pytest.mark.parametrize("shape", MODEL_SHAPES, ids=_sid)
def test_model_matches_float64_reference(shape, layout, repeat_qk, L):
    grads, x, w, A, dt, cu = _problem(shape, layout, repeat_qk=repeat_qk)
    p = dict(Hk=shape["Hk"], dk=shape["dk"], dv=shape["dv"], repeat_qk=repeat_qk)
    got = model_bwd(*grads, x, w, A, dt, cu, L=L, **p)
    NT = x.numel() // x.shape[-1]
    C, W, Hv = w.shape[0], shape["W"], shape["Hv"]
    assert got[4].shape == (cdiv(NT, L), W * C + 2 * Hv)
    if NT == 0:  # no spans: zero weight grads
        assert all(bool((g == 0).all()) for g in got[1:4]) and got[0].shape == x.shape
        return
    for name, o, r in zip(GRADS, got[:4], _ref(grads, x, w, A, dt, cu, shape, repeat_qk)):
        assert_close(o, r, kind="float64", what=name)


@pytest.mark.parametrize("layout", [(2, 37), [0, 1, 3, 4, 7, 0, 40, 2, 5]], ids=["bshd", "thd"])
def test_model_partial_rows_are_the_spans_own_grads(layout):
    """Partial row p = the reference's dconv_weight, dA_log, ddt_bias with every output grad zeroed outside
    span p's tokens (dpre of the span's rows only: the halo rows after it add nothing to it)."""
    s, L = MODEL_SHAPES[0], 8
    grads, x, w, A, dt, cu = _problem(s, layout)
    part = model_bwd(*grads, x, w, A, dt, cu, Hk=2, dk=8, dv=6, repeat_qk=True, L=L)[4]
    lead = x.shape[:-1]
    tok = torch.arange(x.numel() // x.shape[-1]).reshape(lead)
    C, W = w.shape
    for p in range(part.shape[0]):
        m = (tok // L == p)
        gp = [g * m.reshape(*lead, *[1] * (g.dim() - len(lead))) for g in grads]
        _, dw, dA, ddt = _ref(gp, x, w, A, dt, cu, s, True)
        want = torch.cat([dw.T.reshape(-1), dA, ddt])
        assert_close(part[p], want, kind="float64", what=f"partial row {p}")


@pytest.mark.parametrize("eps", TINY_EPS)
@pytest.mark.parametrize("layout", [(2, 37), [0, 1, 3, 4, 7, 0, 40, 2, 5]], ids=["bshd", "thd"])
def test_model_zero_heads_at_tiny_eps_fp32(layout, eps):
    """In fp32 (the kernel's math), zero q / k heads at an eps whose s^3 overflows: the gradients are finite and
    match the float64 reference, whose zero-head dy is s * dn (the term with sum(dn y) = 0 drops out). The model
    forms s^2 sum(dn y) as (s * sum) * s, as the kernel; with s ** 3 first it gave NaN in dmixed here."""
    s = MODEL_SHAPES[0]
    grads, x, w, A, dt, cu = _problem(s, layout, F32)
    _zero_heads(x, s)
    got = model_bwd(*grads, x, w, A, dt, cu, Hk=2, dk=8, dv=6, repeat_qk=True, eps=eps, L=8)
    for name, o, r in zip(GRADS, got[:4], _ref(grads, x, w, A, dt, cu, s, True, eps)):
        assert torch.isfinite(o).all(), name
        assert_close(o, r, kind=F32, what=name)


@edge_cases
def test_model_nan_gradient_at_sequence_edges(shape, repeat_qk, layout):
    """The decomposition's NaN pattern for a NaN gradient at a sequence edge is the reference's: the x window's
    zeros at a start still multiply dpre (every tap), and the dx scatter selects rather than multiplies by its
    liveness mask, so the NaN stays out of the earlier sequence's dx (the kernel selects; the model multiplied
    by a 0/1 mask until session 50, which this test caught)."""
    grads, x, w, A, dt, cu = _problem(shape, layout, F64, repeat_qk)
    check_nan_at_sequence_edges(
        lambda g, xb: model_bwd(*g, xb, w, A, dt, cu, Hk=shape["Hk"], dk=shape["dk"], dv=shape["dv"], repeat_qk=repeat_qk,
                            L=4)[:4], grads, x, w, A, dt, cu, layout, shape, repeat_qk)


def test_model_at_qwen_heads():
    """Qwen3-Next heads (dk = dv = 128, R = 2) over a THD batch with a long sequence, spans of 32."""
    grads, x, w, A, dt, cu = _problem(QWEN, [5, 0, 70, 3, 1])
    got = model_bwd(*grads, x, w, A, dt, cu, Hk=16, dk=128, dv=128, repeat_qk=True, L=32)
    for name, o, r in zip(GRADS, got[:4], _ref(grads, x, w, A, dt, cu, QWEN, True)):
        assert_close(o, r, kind="float64", what=name)


# ------------------------------------------------------------------ CPU: compiles for sm_90a (CI)

# (shape, thd, repeat_qk, dtype, pointer alignment): every compile-time switch at least once
COMPILE_VARIANTS = [
    (QWEN, False, True, BF, 16), (QWEN, True, True, BF, 16), (QWEN, True, False, BF, 16),
    (QWEN, False, False, BF, 16),
    (QWEN, True, True, F32, 16),                                   # fp32: VEC 4
    (QWEN, False, True, BF, 4),                                    # 4-byte aligned: VEC 2, registers
    (QWEN, True, False, BF, 2),                                    # 2-byte aligned: VEC 1
    (dict(Hk=2, Hv=4, dk=64, dv=32, W=3), True, True, BF, 16),     # R=2, dk != dv
    (dict(Hk=4, Hv=4, dk=32, dv=64, W=2), False, True, BF, 16),    # R=1
    (dict(Hk=1, Hv=4, dk=48, dv=40, W=4), True, True, BF, 16),     # R=4, 6 vectors a head (8 lanes)
    (dict(Hk=2, Hv=2, dk=5, dv=7, W=3), True, True, BF, 16),       # odd dims: VEC 1
    (dict(Hk=2, Hv=2, dk=16, dv=24, W=1), False, False, BF, 16),   # W=1: no window
    (dict(Hk=2, Hv=4, dk=16, dv=24, W=6), True, True, F32, 16),    # wider conv: narrower vectors
]
# launch-config variants the timing probe sweeps (benchmarks/probes/gdn_cute_pre_bwd.py)
# (over the heuristic's config, which asks for 3 CTAs an SM: the variants with more registers a CTA ask for none)
CFG_VARIANTS = [dict(CA=False, MINB=0), dict(U=4, S=3), dict(S=6), dict(U=1, S=8), dict(L=64), dict(L=256),
                dict(THREADS=64), dict(THREADS=256, MINB=0), dict(VEC=4), dict(VEC=4, U=4), dict(VEC=4, CA=False),
                dict(MINB=0)]
# the partials' reduction (RG row groups, RV columns a thread, RU unroll): the default RG 32, RV 4, RU 8 since
# session 57; the first default (RG 8, RV 1, RU 4: 4-byte loads), 16 row groups, and 4-byte loads at 32 groups
RED_VARIANTS = [dict(RG=8, RV=1, RU=4), dict(RG=16), dict(RV=1)]


def _vid(v):
    s, thd, rep, dt, al = v
    return _sid(s) + f"-{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}-{str(dt)[6:]}-a{al}"


def _launches(v, cfg=None):
    s, thd, rep, dt, al = v
    return cb.representative_launches(**s, dtype=dt, thd=thd, repeat_qk=rep, align=al, cfg=cfg)


def _export(ln):
    art = ln.export("sm_90a")
    res = [r for n, r in cubin_resources(art.cubin).items() if "kernel" in n and "slowpath" not in n]
    assert len(res) == 1, res
    return art, res[0]


@needs_cute
@pytest.mark.parametrize("v", COMPILE_VARIANTS, ids=[_vid(v) for v in COMPILE_VARIANTS])
def test_every_variant_compiles_for_sm90a(v):
    main, red = _launches(v)
    art, res = _export(main)
    assert res["frame"] == 0, f"{main.cfg}: register spills or a local array: {res}"
    assert _export(red)[1]["frame"] == 0
    cfg, elt = main.cfg, 4 if v[3] == F32 else 2
    assert cfg.CA == (cfg.VEC * elt == 16) and ("cp.async.cg.shared.global" in art.ptx) == cfg.CA
    if cfg.VEC * elt == 16:
        assert "st.global.v4" in art.ptx  # dx vectors and the partial row
    if v[0] is QWEN:
        assert cfg.VEC == min(16, v[4]) // elt  # 16-byte vectors where aligned (8 bf16, 4 fp32)


SM100_VARIANTS = [(QWEN, False, True, BF, 16), (QWEN, True, True, BF, 16), (QWEN, True, False, F32, 16)]


@needs_cute
@pytest.mark.parametrize("v", SM100_VARIANTS, ids=[_vid(v) for v in SM100_VARIANTS])
def test_compiles_for_sm100a(v):
    """Issue 12: CI compiles every kernel for sm_90 and sm_100. Not run on Blackwell (the spec's
    cute backend is sm_90 only), but both launches (main pass and the partials' reduction)
    compile for sm_100a, without spills."""
    for ln in _launches(v):
        art = ln.export("sm_100a")
        assert art.cubin[:4] == b"\x7fELF" and "sm_100a" in art.ptx
        res = [r for n, r in cubin_resources(art.cubin).items() if "kernel" in n and "slowpath" not in n]
        assert len(res) == 1 and res[0]["frame"] == 0, res


@needs_cute
@pytest.mark.parametrize("over", CFG_VARIANTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_config_variants_compile_for_sm90a(over):
    cfg = dataclasses.replace(cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True), **over)
    art, res = _export(_launches(COMPILE_VARIANTS[1], cfg=cfg)[0])
    assert res["frame"] == 0, res
    if cfg.CA:  # 16-byte vectors through cp.async.cg, 8-byte ones (VEC 4 of bf16) through cp.async.ca
        assert f"cp.async.{'cg' if cfg.SW == 4 else 'ca'}.shared.global" in art.ptx


@needs_cute
@pytest.mark.parametrize("over", RED_VARIANTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_reduction_variants_compile(over):
    """The reduction at RG / RV / RU: no local frame, 16-byte loads where RV = 4, the block and grid it asks for."""
    cfg = dataclasses.replace(cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True), **over)
    red = _launches(COMPILE_VARIANTS[1], cfg=cfg)[1]
    art, res = _export(red)
    assert res["frame"] == 0, res
    assert ("ld.global.v4" in art.ptx) == (cfg.RV == 4)
    assert f".reqntid {32 * cfg.RG}, 1, 1" in art.ptx
    assert cfg.RCTAS == -(-cfg.NCOL // (32 * cfg.RV))


def test_reduction_fields_refused():
    base = cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True)
    for bad in (dict(RG=0), dict(RG=33), dict(RV=2), dict(RU=0)):
        with pytest.raises(ValueError, match="RG in 1..32"):
            dataclasses.replace(base, **bad)


def _meta_problem(lead, thd_n=None, Hk=16, Hv=32, dk=128, dv=128, W=4, dtype=BF, rep=True):
    m = torch.device("meta")
    D, C, Hq = mk.d_model(Hk, Hv, dk, dv), ref.conv_dim(Hk, Hv, dk, dv), Hv if rep else Hk

    def e(*s, dt=dtype):
        return torch.empty(*s, dtype=dt, device=m)

    cu = e(thd_n + 1, dt=torch.int32) if thd_n is not None else None
    grads = (e(*lead, Hq, dk), e(*lead, Hq, dk), e(*lead, Hv, dv), e(*lead, Hv, dv), e(*lead, Hv, dt=F32),
             e(*lead, Hv))
    return (*grads, e(*lead, D), e(C, W), e(Hv, dt=F32), e(Hv, dt=F32), cu, e(*lead, D), e(C, W), e(Hv, dt=F32),
            e(Hv, dt=F32))


@needs_cute
def test_config_is_the_compile_key():
    """From (Hk, Hv, dk, dv, W, repeat_qk, THD, element size, alignment) only: NT, T and the cu_seqlens
    entries are runtime scalars, P = cdiv(NT, L) partial rows, the grids from NT."""
    bshd = [cb.bwd_launches(*_meta_problem((B, T)), 16, 128, 128, True) for B, T in ((1, 1), (4, 8192), (3, 5))]
    assert len({tuple(ln.launch.key("sm_90a") for ln in lns) for lns in bshd}) == 1
    cfg = bshd[1][0].cfg
    assert (cfg.VEC, cfg.LP, cfg.NV, cfg.HPC, cfg.units, cfg.R, cfg.CA, cfg.L) == (8, 16, 1, 8, (4, 4, 4, 1), 2, True,
                                                                                   128)
    assert [lns[0].values[-4:-1] for lns in bshd] == [(1, 1, 2), (32768, 8192, 5), (15, 5, 4)]  # NT, T, B + 1
    assert bshd[1][0].grid == (256 * 13,) and bshd[1][1].values[-1] == 256
    assert bshd[1][0].values[12].shape == (256, cfg.PS) and cfg.PS == 4 * 8192 + 64
    thd = [cb.bwd_launches(*_meta_problem((NT,), N), 16, 128, 128, True) for NT, N in ((1, 1), (32768, 116))]
    assert len({tuple(ln.launch.key("sm_90a") for ln in lns) for lns in thd}) == 1
    assert thd[1][0].values[-4:-1] == (32768, 1, 117)
    assert cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True, 2, 16) == thd[1][0].cfg
    assert cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True, 2, 16) is cb.BwdCfg.heuristic(16, 32, 128, 128, 4,
                                                                                             True, True, 2, 16)
    assert cb.BwdCfg.heuristic(16, 32, 128, 128, 6, True, True).VEC == 4  # (4W-2) * VEC <= STATE_REGS
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.L = 8


@needs_cute
def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="Hv=6 is not a multiple of Hk=4"):
        cb.BwdCfg.heuristic(4, 6, 16, 16, 4, True, False)
    with pytest.raises(ValueError, match="dividing dk"):
        dataclasses.replace(cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True), dk=12)
    with pytest.raises(ValueError, match="8- or 16-byte vectors"):
        dataclasses.replace(cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True), VEC=2)
    with pytest.raises(ValueError, match="does not fit"):
        cb.bwd_launches(*_meta_problem((2, 8)), 16, 128, 128, True, cfg=cb.BwdCfg.heuristic(16, 32, 128, 128, 4,
                                                                                            True, True))
    args = list(_meta_problem((2, 8)))
    args[4] = args[4].to(BF)  # gg in bf16
    with pytest.raises(ValueError, match="gg fp32"):
        cb.bwd_launches(*args, 16, 128, 128, True)
    with pytest.raises(ValueError, match="no tokens"):
        cb.bwd_launches(*_meta_problem((2, 0)), 16, 128, 128, True)
    args = list(_meta_problem((2, 8)))
    args[12] = args[12].to(F32)  # dconv_weight fp32, conv_weight bf16
    with pytest.raises(ValueError, match="conv_weight's dtype"):
        cb.bwd_launches(*args, 16, 128, 128, True)
    args = list(_meta_problem((64,), 3))
    args[10] = args[10].to(torch.int64)
    with pytest.raises(ValueError, match="cu_seqlens must be int32"):
        cb.bwd_launches(*args, 16, 128, 128, True)


@needs_cute
def test_registered():
    """The cute backend's bwd kernel (the spec's cute backend has both passes)."""
    from registry.kernels import has_kernel
    from specs.gdn import PRE_GATED

    assert has_kernel("gdn_pre_gated", "cute", "bwd")
    assert PRE_GATED.backend("cute").passes == ["fwd", "bwd"]


@needs_cute
@pytest.mark.parametrize("rep", [True, False], ids=["rep", "norep"])
def test_bshd_holds_thd_registers(rep):
    """BSHD's sequence starts, walked as THD's (jn * T for cu_seqlens[jn]), compile to at most the registers of
    the THD config: 168 at Qwen3-Next with the pinned CuTe DSL (3 CTAs of 128 threads an SM), no spill. (A
    counter form took 190-195, 2 CTAs an SM, and was 28% slower on the H200: removed.)"""
    _, res = _export(_launches((QWEN, False, rep, BF, 16))[0])
    _, thd = _export(_launches((QWEN, True, rep, BF, 16))[0])
    assert res["frame"] == 0 and res["regs"] <= thd["regs"] <= 168, (res, thd)


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def run_bwd(grads, x, w, A, dt, cu, shape, repeat_qk, cfg=None, poison_part=True, eps=1e-6):
    """Into NaN outputs. poison_part: through bwd_launches with NaN partial rows too (a partial column the
    main launch leaves unwritten then fails, which a stale buffer would hide); else the destination-passing
    entry (its own partial buffer; the only path for no tokens)."""
    dx, dw = _nan(*x.shape, dtype=x.dtype), _nan(*w.shape, dtype=w.dtype)
    dA, ddt = _nan(*A.shape, dtype=A.dtype), _nan(*dt.shape, dtype=dt.dtype)
    args = (*grads, x, w, A, dt, cu, dx, dw, dA, ddt, shape["Hk"], shape["dk"], shape["dv"], repeat_qk, eps)
    if x.numel() == 0 or not (poison_part or cfg is not None):
        assert cfg is None
        cb.pre_gated_bwd_into(*args, False)
    else:
        lns = cb.bwd_launches(*args, cfg=cfg)
        part = lns[0].values[12]
        part.fill_(float("nan"))
        for ln in lns:
            ln.run()
    return dx, dw, dA, ddt


def check_bwd(shape, layout, repeat_qk, dtype=BF, cfg=None, wdtype=None, eps=1e-6, zero_heads=False):
    grads, x, w, A, dt, cu = _problem(shape, layout, dtype, repeat_qk, device="cuda")
    if zero_heads:
        _zero_heads(x, shape)
    w = w.to(wdtype or w.dtype)
    got = run_bwd(grads, x, w, A, dt, cu, shape, repeat_qk, cfg, eps=eps)
    for name, o, r in zip(GRADS, got, _ref(grads, x, w, A, dt, cu, shape, repeat_qk, eps)):
        assert_close(o, r, kind=o.dtype, what=name)
    again = run_bwd(grads, x, w, A, dt, cu, shape, repeat_qk, cfg, poison_part=False, eps=eps)
    for name, a, b in zip(GRADS, got, again):
        assert torch.equal(a, b), f"{name}: two runs differ (the reduction must be deterministic)"


GPU_SHAPES = [QWEN, dict(Hk=2, Hv=4, dk=64, dv=32, W=3), dict(Hk=4, Hv=4, dk=32, dv=64, W=2),
              dict(Hk=1, Hv=4, dk=48, dv=40, W=4)]
GPU_LAYOUTS = [(2, 70), (1, 1), (3, 5), [0, 1, 3, 4, 7, 0, 130, 2, 5], [1], [0, 2, 0],
               [128, 127, 1, 126, 130, 256, 2, 0, 129]]  # the last: starts on and next to 128-token span edges


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("repeat_qk", [True, False], ids=["rep", "norep"])
@pytest.mark.parametrize("layout", GPU_LAYOUTS, ids=_lid)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=_sid)
def test_bwd_matches_float64_reference(shape, layout, repeat_qk):
    check_bwd(shape, layout, repeat_qk)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("layout", [(2, 33), [0, 1, 3, 4, 7, 0, 130, 2, 5]], ids=["bshd", "thd"])
def test_bwd_fp32_odd_and_wide(layout):
    """fp32 I/O (1e-5); odd dims (VEC 1); W=1 (no window) and W=6 (narrower vectors)."""
    check_bwd(dict(Hk=2, Hv=4, dk=64, dv=32, W=3), layout, True, dtype=F32)
    for s in (dict(Hk=2, Hv=2, dk=5, dv=7, W=3), dict(Hk=2, Hv=2, dk=16, dv=24, W=1),
              dict(Hk=2, Hv=4, dk=16, dv=24, W=6)):
        check_bwd(s, layout, True)


# paths the other GPU tests leave out (each also compiled on the CPU: test_other_paths_compile_for_sm90a)
OTHER_PATHS = [("R8", dict(Hk=1, Hv=8, dk=32, dv=16, W=4), BF, None, {}),                  # ring of 9 slots a row
               ("R16", dict(Hk=1, Hv=16, dk=32, dv=16, W=4), BF, None, {}),                 # U1 S2 ring
               ("Hv6", dict(Hk=2, Hv=6, dk=16, dv=8, W=3), BF, None, {}),                   # Hv does not divide THREADS
               ("Hv64-T32", dict(Hk=2, Hv=64, dk=16, dv=8, W=3), BF, None, dict(THREADS=32)),  # two head blocks
               ("w-fp32", dict(Hk=2, Hv=4, dk=32, dv=16, W=4), BF, F32, {}),               # conv_weight fp32
               ("NV2-fp32", dict(Hk=1, Hv=2, dk=256, dv=16, W=4), F32, None, {}),          # two vectors a lane
               ("VEC2", dict(Hk=2, Hv=4, dk=6, dv=10, W=3), BF, None, {})]                  # 4-byte vectors


def _other_cfg(s, dt, over, thd=True):
    cfg = cb.BwdCfg.heuristic(s["Hk"], s["Hv"], s["dk"], s["dv"], s["W"], True, thd, 4 if dt == F32 else 2)
    return dataclasses.replace(cfg, **over) if over else cfg


@needs_cute
@pytest.mark.parametrize("case", OTHER_PATHS, ids=[c[0] for c in OTHER_PATHS])
def test_other_paths_compile_for_sm90a(case):
    name, s, dt, wdt, over = case
    cfg = _other_cfg(s, dt, over)
    assert cfg.smem_bytes() <= cb.SMEM_MAX
    main, red = cb.representative_launches(**s, dtype=dt, wdtype=wdt, thd=True, cfg=cfg)
    assert _export(main)[1]["frame"] == 0 and _export(red)[1]["frame"] == 0
    if name == "NV2-fp32":
        assert (cfg.VEC, cfg.NV) == (4, 2)
    if name == "VEC2":
        assert cfg.VEC == 2


@needs_cute
def test_heuristic_fits_the_ring_in_shared_memory():
    """The ring's slots grow with R (x and R grads a vector): the heuristic takes fewer stages, then single
    rows, to stay within SMEM_BUDGET, the smallest ring where even that does not fit, and every config it
    gives a CTA can hold; a config above SMEM_MAX is refused."""
    for Hk, want in ((16, (2, 4)), (8, (2, 4)), (4, (2, 2)), (2, (1, 2)), (1, (1, 2))):
        cfg = cb.BwdCfg.heuristic(Hk, 32, 128, 128, 4, True, True)
        assert cfg.CA and (cfg.U, cfg.S) == want and cfg.smem_bytes() <= cb.SMEM_MAX, cfg
        assert cfg.smem_bytes() <= cb.SMEM_BUDGET or (cfg.U, cfg.S) == (1, 2)
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(cb.BwdCfg.heuristic(1, 32, 128, 128, 4, True, True), U=2, S=4)
    # no vector width fits STATE_REGS (W 29): the least state (VEC 4, 2 and 1 tie at dk 128), then the widest
    assert cb.BwdCfg.heuristic(16, 32, 128, 128, 29, True, False).VEC == 4


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("case", OTHER_PATHS, ids=[c[0] for c in OTHER_PATHS])
def test_bwd_other_paths(case):
    name, s, dt, wdt, over = case
    for lay in ([0, 1, 3, 4, 7, 0, 130, 2, 5], (2, 33)):
        check_bwd(s, lay, True, dtype=dt, cfg=_other_cfg(s, dt, over, isinstance(lay, list)) if over else None,
                  wdtype=wdt)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("over", CFG_VARIANTS + RED_VARIANTS + [dict(L=8), dict(L=1, U=1, CA=False)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_bwd_launch_config_variants(over):
    """The probe's configs, and spans shorter than the conv (L=1): same results (Qwen3-Next heads, THD)."""
    cfg = dataclasses.replace(cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, True), **over)
    check_bwd(QWEN, [0, 1, 3, 4, 7, 0, 300, 2, 5, 129], True, cfg=cfg)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("over", [{}] + RED_VARIANTS,
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "default")
def test_reduction_variants_column_tail(over):
    """The reduction's variants where the columns end inside a thread's vector (odd dims: NCOL = 3 * 34 + 4 = 106, PS
    108) and with one partial row (T = 1) or fewer rows than row groups: against float64, as the default."""
    s = dict(Hk=2, Hv=2, dk=5, dv=7, W=3)
    for layout in ([0, 1, 3, 4, 7, 0, 300, 2, 5], [1], (3, 5)):
        thd = isinstance(layout, list)
        cfg = dataclasses.replace(cb.BwdCfg.heuristic(**s, repeat_qk=True, thd=thd), **over)
        check_bwd(s, layout, True, cfg=cfg)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("over", [{}, dict(MINB=0), dict(VEC=4), dict(L=64)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "default")
@pytest.mark.parametrize("layout", [(3, 301), (4, 2), (1, 129), (2, 128), (5, 1)], ids=_lid)
def test_bwd_bshd_start_variants(over, layout):
    """BSHD's sequence starts at the heuristic's config and the probe's BSHD variants: T across span edges, T
    shorter than the conv, one sequence, NT a multiple of the span (128), T = 1 with several rows."""
    cfg = dataclasses.replace(cb.BwdCfg.heuristic(16, 32, 128, 128, 4, True, False), **over)
    check_bwd(QWEN, layout, True, cfg=cfg)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("layout", [(2, 37), [3, 0, 40, 1, 130]], ids=["bshd", "thd"])
@pytest.mark.parametrize("dtype", [BF, F32], ids=["bf16", "fp32"])
def test_registry_autograd_takes_cute(layout, dtype):
    """registry.get("gdn_pre_gated") with gradients: auto picks cute (fwd + this bwd); its outputs and
    gradients against the float64 torch backend's (bf16 1e-2, fp32 1e-5: as above)."""
    import registry

    op = registry.get("gdn_pre_gated")
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    p = dict(Hk=2, dk=64, dv=32, repeat_qk=True)
    _, x, w, A, dt, cu = _problem(s, layout, dtype, True, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (x, w, A, dt)]
    assert op.explain(*leaves, cu_seqlens=cu, **p)[0][:2] == ("cute", True)
    outs = op(*leaves, cu_seqlens=cu, **p)
    grads = [torch.randn(o.shape, device="cuda").to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, w, A, dt)]
    outs64 = op(*leaves64, cu_seqlens=cu, backend="torch", **p)
    torch.autograd.backward(outs64, [g.double() for g in grads])
    for o, r in zip(outs, outs64):
        assert_close(o, r, kind=o.dtype, what="fwd output")
    for name, a, b in zip(GRADS, leaves, leaves64):
        assert_close(a.grad, b.grad, kind=a.grad.dtype, what=name)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("layout", [(2, 70), [0, 1, 3, 4, 7, 0, 130, 2, 5]], ids=["bshd", "thd"])
def test_bwd_eps_zero(layout):
    """eps = 0 (the spec's minimum): the padding rows past the last token of a partial span are zeros, whose
    l2norm backward is 0 * rsqrt(0) = NaN; they must add nothing to the dconv_weight partials."""
    check_bwd(dict(Hk=2, Hv=4, dk=64, dv=32, W=3), layout, True, eps=0.0)


@pytest.mark.gpu
@needs_gpu
@needs_cute
@pytest.mark.parametrize("eps", TINY_EPS)
@pytest.mark.parametrize("dtype", [BF, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("layout", [(2, 70), [0, 1, 3, 4, 7, 0, 130, 2, 5]], ids=["bshd", "thd"])
def test_bwd_zero_heads_at_tiny_eps(layout, dtype, eps):
    """Zero q / k heads (padding-like inputs) at an eps whose rsqrt(eps)^3 overflows fp32: finite, and the float64
    reference's (the model's test says why the kernel's order keeps every factor finite)."""
    check_bwd(dict(Hk=2, Hv=4, dk=64, dv=32, W=3), layout, True, dtype=dtype, eps=eps, zero_heads=True)


@pytest.mark.gpu
@needs_gpu
@needs_cute
def test_bwd_many_sequences_and_no_tokens():
    """300 sequences of 0..9 tokens (several starts a span, empties), BSHD T shorter than the conv, and no
    tokens at all (zero weight grads)."""
    s = dict(Hk=2, Hv=4, dk=32, dv=32, W=4)
    check_bwd(s, torch.randint(0, 10, (300,)).tolist(), True)
    check_bwd(s, (40, 2), True)
    for lay in ([0, 0], (2, 0)):
        grads, x, w, A, dt, cu = _problem(s, lay, BF, True, device="cuda")
        got = run_bwd(grads, x, w, A, dt, cu, s, True)
        assert all(bool((g == 0).all()) for g in got[1:])


@pytest.mark.gpu
@needs_gpu
@needs_cute
def test_compiled_fwd_bwd_equals_eager():
    """torch.compile(fullgraph=True) of the registry call, forward and backward through the cute kernels (the
    custom ops), equals the eager call bitwise (the same kernels, a fixed-order reduction)."""
    import registry

    op = registry.get("gdn_pre_gated")
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    p = dict(Hk=2, dk=64, dv=32, repeat_qk=True)
    _, x, w, A, dt, cu = _problem(s, [3, 0, 40, 1, 130], BF, True, device="cuda")
    gouts = None
    res = []
    torch._dynamo.reset()
    for fn in (lambda *a: op(*a, **p), torch.compile(lambda *a: op(*a, **p), fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (x, w, A, dt)]
        outs = fn(*leaves, cu)
        if gouts is None:
            gouts = [torch.randn(o.shape, device="cuda").to(o.dtype) for o in outs]
        torch.autograd.backward(outs, gouts)
        res.append([o.detach() for o in outs] + [t.grad for t in leaves])
    for name, a, b in zip(NAMES_ALL, *res):
        assert torch.equal(a, b), f"{name}: compiled differs from eager"


NAMES_ALL = ("q", "k", "v", "z", "g", "beta") + GRADS


@pytest.mark.gpu
@needs_gpu
@edge_cases
def test_nan_gradient_at_sequence_edges(shape, repeat_qk, layout):
    """The kernel as its model above: the x window's zeros at a start multiply dpre (every tap of dconv_weight),
    and the dx scatter's select keeps a NaN at a start out of the earlier sequence (helper's doc)."""
    grads, x, w, A, dt, cu = _problem(shape, layout, BF, repeat_qk, device="cuda")
    run = lambda g, xb: run_bwd(g, xb, w, A, dt, cu, shape, repeat_qk)  # noqa: E731
    check_nan_at_sequence_edges(run, grads, x, w, A, dt, cu, layout, shape, repeat_qk)
