"""CuTe DSL gdn_pre_gated forward (tilekernels/gdn/cute_pre_gated.py).

CPU (CI): every config the heuristic returns for the test shapes (BSHD / THD, repeat_qk on / off,
conv state on / off, bf16 / fp32, 16-byte vectors and the narrower ones of odd dims or unaligned
addresses, W 1 .. 33, more than a warp of vectors a head) compiles for sm_90a from fake arguments
(``Launch.export``) without register spills (Qwen3-Next's also for sm_100a); the config is the compile key (NT, T, N are runtime
scalars); the spec declares the backend (fwd + bwd) ahead of cutile.

GPU (marked ``gpu``, skipped without CUDA): against ``reference.pre_gated`` in float64 on upcasts
of the same inputs, outputs NaN-poisoned first, fresh random inputs each run. Tolerances
(tilekernels.testing, by the checked output's dtype): bf16 outputs 1e-2 (fp32 math from the same
inputs, rounded once); fp32 outputs (g; everything with fp32 mixed) 1e-5 (the SiLU's ex2.approx
and rcp.approx and the rsqrt.approx of the l2norm are a few ulp of fp32 each, the sums over W taps
and dk channels fp32 reassociations: far below 1e-5); conv_state exact (a copy of inputs).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("cutlass")

import registry  # noqa: E402
from registry.core import backend_status  # noqa: E402
from tilekernels._cute import cubin_resources  # noqa: E402
from tilekernels.gdn import bench as mk  # noqa: E402
from tilekernels.gdn import cute_pre_gated as cp  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402
from gdn_pre_helpers import (LAYOUTS, QWEN, SHAPE_IDS, SHAPES, THD_LENGTHS,  # noqa: E402
                             nan_outputs as _outs, problem as _problem, ref64 as _ref64)

BF, F32 = torch.bfloat16, torch.float32
NAMES = ("q", "k", "v", "z", "g", "beta")

# (shape, thd, repeat_qk, state, dtype, pointer alignment in bytes): every compile-time switch
COMPILE_VARIANTS = [(s, thd, rep, st, BF, 16) for s in SHAPES for thd, rep, st in ((True, True, True),
                                                                                   (False, False, False))]
COMPILE_VARIANTS += [
    (QWEN, True, True, True, F32, 16),                        # fp32: VEC 4
    (QWEN, False, True, True, BF, 4),                         # 4-byte aligned: VEC 2
    (QWEN, True, False, True, BF, 2),                         # 2-byte aligned: VEC 1
    (dict(Hk=2, Hv=2, dk=5, dv=7, W=3), True, True, True, BF, 16),    # odd dims: VEC 1
    (dict(Hk=2, Hv=2, dk=16, dv=24, W=1), False, False, True, BF, 16),  # W=1: no window, no state
    (dict(Hk=2, Hv=4, dk=16, dv=24, W=6), True, True, True, BF, 16),  # wider than the cuTile taps
    (dict(Hk=1, Hv=2, dk=8, dv=8, W=33), True, True, True, F32, 16),  # the widest (64-bit mask)
    (dict(Hk=1, Hv=4, dk=512, dv=64, W=4), False, True, False, BF, 16),  # 64 vectors a head: 2 a lane
]

# launch-config variants the timing probe sweeps (benchmarks/probes/gdn_cute_pre.py): same results
CFG_VARIANTS = [dict(CA=False), dict(CA=False, U=8), dict(S=3), dict(S=6), dict(U=2, S=8), dict(U=8, S=3),
                dict(VEC=4, CA=False, U=8), dict(L=16), dict(THREADS=256), dict(THREADS=64)]


def _vid(v):
    s, thd, rep, st, dt, al = v
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + \
        f"-{'thd' if thd else 'bshd'}-{'rep' if rep else 'norep'}-{'state' if st else 'nostate'}-{str(dt)[6:]}-a{al}"


def _launches(v, cfg=None):
    s, thd, rep, st, dt, al = v
    return cp.representative_launches(**s, dtype=dt, thd=thd, repeat_qk=rep, state=st, align=al, cfg=cfg)


def _fwd_res(ln):
    art = ln.export("sm_90a")
    res = [r for n, r in cubin_resources(art.cubin).items() if "kernel" in n and "slowpath" not in n]
    assert len(res) == 1, res
    return art, res[0]


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("v", COMPILE_VARIANTS, ids=[_vid(v) for v in COMPILE_VARIANTS])
def test_every_variant_compiles_for_sm90a(v):
    lns = _launches(v)
    assert len(lns) == (2 if v[1] else 1)
    for ln in lns:
        art, res = _fwd_res(ln)
        assert res["frame"] == 0, f"{ln.cfg}: register spills or a local array: {res}"
    s, elt = v[0], 4 if v[4] == F32 else 2
    vec = max(1, min(16, v[5]) // elt)  # the most elements in the aligned bytes dividing dk, dv and D
    while vec > 1 and (any(n % vec for n in (s["dk"], s["dv"], mk.d_model(s["Hk"], s["Hv"], s["dk"], s["dv"])))
                       or 2 * s["W"] * vec > cp.WIN_REGS):  # wide convs: narrower vectors, no spills
        vec //= 2
    cfg = lns[-1].cfg
    assert cfg.VEC == vec
    if cfg.VEC * elt == 16:
        assert "ld.global.v4" in art.ptx and "st.global.v4" in art.ptx
    assert ("cp.async.cg.shared.global" in art.ptx) == cfg.CA == (cfg.VEC * elt == 16)


SM100_VARIANTS = [(QWEN, True, True, True, BF, 16), (QWEN, False, False, False, BF, 16), (QWEN, True, True, True, F32, 16)]


@pytest.mark.parametrize("v", SM100_VARIANTS, ids=[_vid(v) for v in SM100_VARIANTS])
def test_compiles_for_sm100a(v):
    """Issue 12: CI compiles every kernel for sm_90 and sm_100. Not run on Blackwell (the spec's
    cute backend is sm_90 only), but the forward's launches (THD's starts pass and the main kernel)
    compile for sm_100a too, without spills."""
    for ln in _launches(v):
        art = ln.export("sm_100a")
        assert art.cubin[:4] == b"\x7fELF" and "sm_100a" in art.ptx
        res = [r for n, r in cubin_resources(art.cubin).items() if "kernel" in n and "slowpath" not in n]
        assert len(res) == 1 and res[0]["frame"] == 0, res


@pytest.mark.parametrize("over", CFG_VARIANTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_config_variants_compile_for_sm90a(over):
    cfg = dataclasses.replace(cp.PreCfg.heuristic(16, 32, 128, 128, 4, True, True, True), **over)
    _, res = _fwd_res(_launches(COMPILE_VARIANTS[0], cfg=cfg)[1])
    assert res["frame"] == 0, res


def _meta_problem(lead, thd_n=None, Hk=16, Hv=32, dk=128, dv=128, W=4, dtype=BF, rep=True, state=True):
    m = torch.device("meta")
    D, C, Hq = mk.d_model(Hk, Hv, dk, dv), ref.conv_dim(Hk, Hv, dk, dv), Hv if rep else Hk

    def e(*s, dt=dtype):
        return torch.empty(*s, dtype=dt, device=m)

    N = thd_n if thd_n is not None else lead[0]
    cu = e(N + 1, dt=torch.int32) if thd_n is not None else None
    return (e(*lead, D), e(C, W), e(Hv, dt=F32), e(Hv, dt=F32), cu, e(*lead, Hq, dk), e(*lead, Hq, dk),
            e(*lead, Hv, dv), e(*lead, Hv, dv), e(*lead, Hv, dt=F32), e(*lead, Hv), e(N, C, W - 1) if state else None)


def test_config_is_the_compile_key():
    """From (Hk, Hv, dk, dv, W, repeat_qk, THD, state, element size, alignment) only: B, T, N are
    runtime scalars and the grid's."""
    keys = {_launches(v)[-1].key("sm_90a") for v in COMPILE_VARIANTS}
    assert len(keys) == len(COMPILE_VARIANTS)
    bshd = [cp.fwd_launches(*_meta_problem((B, T)), 16, 128, 128, True) for B, T in ((1, 1), (4, 8192), (3, 5))]
    assert len({lns[-1].launch.key("sm_90a") for lns in bshd}) == 1 and all(len(x) == 1 for x in bshd)
    assert [lns[-1].values[-4:-1] for lns in bshd] == [(1, 1, 1), (32768, 8192, 4), (15, 5, 3)]
    thd = [cp.fwd_launches(*_meta_problem((NT,), N), 16, 128, 128, True) for NT, N in ((1, 1), (32768, 116))]
    assert len({lns[-1].launch.key("sm_90a") for lns in thd}) == 1 and all(len(x) == 2 for x in thd)
    assert thd[1][0].values[2:] == (32768, 117) and thd[1][0].values[1].shape == (1024,)
    cfg = thd[1][-1].cfg
    assert (cfg.VEC, cfg.LP, cfg.NV, cfg.HPC, cfg.units, cfg.R) == (8, 16, 1, 8, (4, 4, 4, 1), 2)
    assert cp.PreCfg.heuristic(16, 32, 128, 128, 4, True, True, True, 2, 16) is cfg  # cached
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.L = 8


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="W=34"):
        cp.PreCfg.heuristic(16, 32, 128, 128, 34, True, True, True)
    with pytest.raises(ValueError, match="Hv=6 is not a multiple of Hk=4"):
        cp.PreCfg.heuristic(4, 6, 16, 16, 4, True, False, False)
    with pytest.raises(ValueError, match="dividing dk"):
        dataclasses.replace(cp.PreCfg.heuristic(16, 32, 128, 128, 4, True, True, True), VEC=8, dk=12)
    with pytest.raises(ValueError, match="does not fit"):
        cp.fwd_launches(*_meta_problem((2, 8)), 16, 128, 128, True,
                        cfg=cp.PreCfg.heuristic(16, 32, 128, 128, 4, True, True, True))
    # the registry refuses W > 33 for this backend (and names it)
    op = registry.get("gdn_pre_gated")
    Hk, Hv, dk, dv, W = 1, 2, 8, 8, 34
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W)
    ok, why = {n: (o, r) for n, o, r in op.explain(mk.mixed((1, 3), Hk, Hv, dk, dv), w, A, dt, Hk=Hk, dk=dk,
                                                      dv=dv)}["cute"]
    assert not ok and "W <= 33" in why


def test_spec_declares_the_backend_ahead_of_cutile():
    """cute comes first with both passes (its bwd: cute_pre_gated_bwd.py, registered by importing this
    module), so a call that needs a gradient takes it too."""
    from registry.kernels import has_kernel
    from specs.gdn import PRE_GATED

    names = [b.name for b in PRE_GATED.backends]
    assert names[:2] == ["cute", "cutile"]
    b = PRE_GATED.backend("cute")
    assert b.module == cp.__name__ and b.passes == ["fwd", "bwd"] and b.toolchain == ["cute"]
    assert has_kernel("gdn_pre_gated", "cute", "fwd") and has_kernel("gdn_pre_gated", "cute", "bwd")
    op = registry.get("gdn_pre_gated")
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    w, A, dt = mk.weights(*(s[n] for n in ("Hk", "Hv", "dk", "dv", "W")))
    x = mk.mixed((2, 5), s["Hk"], s["Hv"], s["dk"], s["dv"]).requires_grad_()
    _, why = backend_status(op.bind(x, w, A, dt, Hk=2, dk=64, dv=32), b)
    assert "no bwd kernel" not in why


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _compare(got, cs, want, state, dtype):
    for name, o, r in zip(NAMES, got, want):
        assert_close(o, r, kind=o.dtype, what=name)
    if state:
        assert_close(cs, want[6].to(dtype), kind="exact", what="conv_state")


def check_fwd(x, w, A, dt, cu, shape, repeat_qk, state, cfg=None):
    """The cute fwd (explicit cfg: its launches) into NaN-filled outputs against float64."""
    outs, cs = _outs(x, cu, shape, repeat_qk, state)
    args = (x, w, A, dt, cu, *outs, cs, shape["Hk"], shape["dk"], shape["dv"], repeat_qk, 1e-6)
    if cfg is None:
        cp.pre_gated_fwd_into(*args, state)
    else:
        for ln in cp.fwd_launches(*args, cfg=cfg):
            ln.run()
    _compare(outs, cs, _ref64(x, w, A, dt, cu, shape, repeat_qk, state), state, x.dtype)
    return outs, cs


# empty, 1, W-1, W, odd, one long (over several runs of 32 tokens), starts on and next to run edges
THD_EDGES = [32, 31, 1, 30, 34, 64, 2, 0, 33]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("repeat_qk,state", [(True, True), (False, False)], ids=["rep-state", "norep-nostate"])
@pytest.mark.parametrize("layout", [lay for lay, _ in LAYOUTS] + [THD_EDGES],
                         ids=[i for _, i in LAYOUTS] + ["thd-edges"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_fwd_matches_float64_reference(shape, layout, repeat_qk, state):
    check_fwd(*_problem(shape, layout), shape, repeat_qk, state)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 33), THD_LENGTHS], ids=["bshd", "thd"])
def test_fwd_fp32_and_narrow_widths(layout):
    """fp32 I/O (1e-5); W=1 (no history: conv state of width 0); W=6 and 33 (the widest)."""
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    check_fwd(*_problem(s, layout, dtype=F32), s, True, True)
    for s in (dict(Hk=2, Hv=2, dk=16, dv=24, W=1), dict(Hk=2, Hv=4, dk=16, dv=24, W=6),
              dict(Hk=1, Hv=2, dk=8, dv=8, W=33)):
        check_fwd(*_problem(s, layout), s, False, True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 37), THD_LENGTHS], ids=["bshd", "thd"])
def test_fwd_narrow_vectors(layout):
    """Vectors narrower than 16 bytes: odd dk, dv (VEC 1), 64 vectors a head (2 a lane), and mixed
    at an address 2 or 4 bytes past a 16-byte boundary (the heuristic's VEC follows it)."""
    for s in (dict(Hk=2, Hv=2, dk=5, dv=7, W=3), dict(Hk=1, Hv=4, dk=512, dv=64, W=4)):
        check_fwd(*_problem(s, layout), s, True, True)
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=4)
    x, w, A, dt, cu = _problem(s, layout)
    for off in (1, 2):
        buf = torch.empty(x.numel() + 8, dtype=x.dtype, device=x.device)
        xv = buf[off:off + x.numel()].view(x.shape)
        xv.copy_(x)
        outs, cs = _outs(xv, cu, s, True, True)
        lns = cp.fwd_launches(xv, w, A, dt, cu, *outs, cs, 2, 64, 32, True, 1e-6)
        assert lns[-1].cfg.VEC == off  # 2 bytes: VEC 1, 4 bytes: VEC 2
        check_fwd(xv, w, A, dt, cu, s, True, True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("over", CFG_VARIANTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_fwd_launch_config_variants(over):
    """The timing probe's configs: same results (Qwen3-Next heads, THD, a long sequence)."""
    x, w, A, dt, cu = _problem(QWEN, THD_LENGTHS + [300])
    cfg = dataclasses.replace(cp.PreCfg.heuristic(16, 32, 128, 128, 4, True, True, True), **over)
    check_fwd(x, w, A, dt, cu, QWEN, True, True, cfg=cfg)


@pytest.mark.gpu
@needs_gpu
def test_thd_with_many_sequences():
    """300 sequences of 0..9 tokens (many starts a run, runs of only empties), a BSHD T shorter
    than the conv width, and no tokens at all (only the all-zero conv state is written)."""
    s = dict(Hk=2, Hv=4, dk=32, dv=32, W=4)
    check_fwd(*_problem(s, torch.randint(0, 10, (300,)).tolist()), s, True, True)
    check_fwd(*_problem(s, (40, 2)), s, True, True)
    check_fwd(*_problem(s, [0, 0]), s, True, True)
    check_fwd(*_problem(s, (2, 0)), s, True, True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", [(2, 37), [3, 0, 40, 1]], ids=["bshd", "thd"])
def test_registry_takes_cute_without_grad(layout):
    """registry.get(...) picks cute for a call without gradients (the float64 reference's results)
    and for one that needs them (its backward: test_gdn_cute_pre_gated_bwd.py)."""
    op = registry.get("gdn_pre_gated")
    s = dict(Hk=2, Hv=4, dk=64, dv=32, W=3)
    x, w, A, dt, cu = _problem(s, layout, dtype=F32)
    p = dict(Hk=2, dk=64, dv=32, repeat_qk=True)
    assert op.explain(x, w, A, dt, cu_seqlens=cu, **p)[0][:2] == ("cute", True)
    want = _ref64(x, w, A, dt, cu, s, True, True)
    got = op(x, w, A, dt, cu_seqlens=cu, return_conv_state=True, **p)
    _compare(got[:6], got[6], want, True, x.dtype)
    assert op.explain(x.clone().requires_grad_(), w, A, dt, cu_seqlens=cu, **p)[0][:2] == ("cute", True)
