"""CuTe DSL mhc_h_post_bda, fwd and bwd (tilekernels/mhc/cute_post_bda.py).

CPU (CI): the launches compile for sm_90a from fake arguments (Launch.export) with 16-byte (n <= 4)
or 8-byte (n > 4) vector accesses and, at the headline configs, no register spills (and for
sm_100a); the A/B configs the timing script measures compile; the config
(static n, C, element size, bias) plus the dtypes are the compile key, T is a runtime scalar; the
registry explains the backend's limits. GPU (marked ``gpu``): every output and gradient against
the float64 reference (tilekernels.testing tolerances by the output's dtype), outputs NaN-poisoned,
fresh random inputs; n = 1..8, T = 0, 1, odd, C a multiple of 8 but not of 64, fp32 / bf16 h and
activations, bias None / x's dtype / fp32, C = 16384 (64 KB of dbias slots); bwd grids of 1, 7 and
36 CTAs (the persistent token loop, the smem buffers' parity), unaligned views, the A/B configs,
bitwise-equal gradients across two calls and a CUDA-graph replay, and the registry's
``backend="cute"`` through autograd. TK_TEST_PB_CUTE_CFG runs the file at a candidate default
(see _cfg_override).
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cutlass")

import registry  # noqa: E402
from tilekernels._cute import cubin_resources  # noqa: E402
from tilekernels._glue import empty  # noqa: E402
from tilekernels.mhc import cute_post_bda as cp  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, assert_one_rounding, upcast  # noqa: E402

from mhc_helpers import gpu_cases  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# (n, C, activations, h, bias dtype or None): every n of the headline C; fp32 activations; an
# fp32 bias on bf16 x; bf16 h; the smallest C
COMPILE_VARIANTS = [(n, 7168, BF, F32, BF) for n in (1, 3, 4, 5, 8)] + [
    (4, 7168, F32, F32, F32), (4, 7168, BF, BF, None), (4, 7168, BF, F32, F32), (5, 104, F32, BF, None),
    (4, 8, BF, F32, BF)]


def _vid(v):
    n, C, a, h, b = v
    return f"n{n}-C{C}-{str(a)[6:]}-h{str(h)[6:]}-bias{str(b)[6:] if b else 'None'}"


def _launches(v, cfg=None):
    n, C, a, h, b = v
    cfg = cfg or cp.PostBdaCuteCfg.heuristic(n, C, a.itemsize, b is not None)
    out = {"fwd": cp.fwd_launch(cfg, h, a, b or a), "bwd": cp.bwd_launch(cfg, h, a, b or a)}
    if b is not None:
        out["dbias"] = cp.dbias_launch(cfg, b)
    return out


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("v", COMPILE_VARIANTS, ids=[_vid(v) for v in COMPILE_VARIANTS])
def test_launches_compile_for_sm90a(v):
    n, C, a, h, b = v
    for name, ln in _launches(v).items():
        art = ln.export("sm_90a")
        res = list(cubin_resources(art.cubin).values())
        assert len(res) == 1, res
        if name != "dbias":
            vb = ln.cfg.V * a.itemsize  # 16 bytes for n <= 4, 8 above
            assert vb == (16 if n <= 4 else 8)
            widths = {int(k) * int(b) // 8 for k, b in re.findall(r"ld\.global\S*\.v(\d)\.[bfu](\d+)", art.ptx)}
            assert max(widths, default=0) == vb, f"{name}: vector loads of {widths} bytes, want {vb}"
        if n == 4 and C == 7168:
            # fp32 activations at 4 CTAs an SM: 128 registers and an 8-byte spill
            assert res[0]["frame"] <= (8 if a == F32 else 0), f"{name}: register spills or a local array: {res}"


def test_compiles_for_sm100a():
    """Not run on Blackwell (the spec's cute backend is sm_90 only), but the kernels compile."""
    for ln in _launches((4, 7168, BF, F32, BF)).values():
        assert ln.export("sm_100a").cubin[:4] == b"\x7fELF"


def test_ab_configs_compile():
    """The A/B configs the timing script measures, at the headline shape."""
    v = (4, 7168, BF, F32, BF)
    base = cp.PostBdaCuteCfg.heuristic(4, 7168, 2, True)
    for kw in AB_CONFIGS.values():
        cfg = dataclasses.replace(base, **kw)
        art = _launches(v, cfg)["fwd" if set(kw) <= set(FWD_FIELDS) else "bwd"].export("sm_90a")
        assert len(cubin_resources(art.cubin)) == 1
        if "PDL" in kw:   # PDL (the default): the dbias reduction waits for the bwd grid, the bwd triggers it
            for c, want in ((base, True), (cfg, False)):
                a_ = _launches(v, c)
                assert ("griddepcontrol.launch_dependents" in a_["bwd"].export("sm_90a").ptx) is want
                assert ("griddepcontrol.wait" in a_["dbias"].export("sm_90a").ptx) is want


@pytest.mark.parametrize("n", [1, 4, 6, 8])
def test_dh_sums_reduce_scatter_shuffles(n):
    """WSUM (the default): a warp's n*n + n dh sums by a reduce-scatter butterfly, at most 16 + 8 + 4 + 2 + 1 shuffles
    a group of 32 sums (21 for n = 4's 20) against the all-reduce's 5 a sum; both kernels have one other shuffle."""
    v = (n, 7168, BF, F32, BF)
    base = cp.PostBdaCuteCfg.heuristic(n, 7168, 2, True)
    nv = n * n + n
    on, off = (_launches(v, dataclasses.replace(base, WSUM=w))["bwd"].export("sm_90a").ptx.count("shfl.sync")
               for w in (True, False))
    assert off == 5 * nv + 1
    assert on <= 31 * -(-nv // 32) + 1 and (n != 4 or on == 22), (on, off)


def test_cut_probe_field_refused_and_cuts_fmas():
    """CUT 1 (post_bda_cut_probe.py's, wrong dh_res): 12 of the 16 dh_res FMAs a channel element out (96 a thread at
    V = 8, 4 chunks' loop body), the residual loads kept; bwd_into refuses any CUT before it launches."""
    v = (4, 7168, BF, F32, BF)
    base = cp.PostBdaCuteCfg.heuristic(4, 7168, 2, True)
    p0, p1 = (_launches(v, dataclasses.replace(base, CUT=c))["bwd"].export("sm_90a").ptx for c in (0, 1))
    assert p0.count("fma.rn.f32") - p1.count("fma.rn.f32") == 12 * base.V
    assert p0.count("ld.global.v4.b32") == p1.count("ld.global.v4.b32")
    t, h2, h1 = torch.zeros(2, 4, 64, dtype=BF), torch.zeros(2, 4, 4), torch.zeros(2, 4)
    cut = dataclasses.replace(cp.PostBdaCuteCfg.heuristic(4, 64, 2, False), CUT=1)
    with pytest.raises(ValueError, match="probe"):
        cp.bwd_into(t, h2, t, h1, t[:, 0], None, h2.clone(), t.clone(), h1.clone(), t[:, 0].clone(), None, cfg=cut)


# the heuristic's headline config (bwd: 224 threads x 4 chunks a token, 2 CTAs an SM, chunk loop not
# unrolled; fwd: one CTA a token) with, bwd: 448 threads x 2 chunks at one CTA an SM, 256 x 4 at two,
# the loop unrolled twice, evict-first loads / stores; fwd: evict-first loads / stores, 4 or 8 CTAs an
# SM walking the tokens (one of them evict-first too), 2 CTAs an SM of 224 threads x 4 chunks. (Run 1
# measured 128 x 7 at 4 and 3 CTAs an SM too: slower than 224 x 4 at 2; h200-mhc-cute-post-bda.txt.)
AB_CONFIGS = {"nt448c1": dict(NTB=448, KC=2, CPS=1, MINB=1), "nt256c2": dict(NTB=256, KC=4),
              "unr2": dict(UNR=2), "bstream": dict(BSTREAM=True), "fstream": dict(FSTREAM=True),
              # FCM=False: the persistent FG kernels take a 2-D grid (whatever TK_TEST_PB_CUTE_CFG sets)
              "fg4": dict(FG=4, FCM=False), "fg8": dict(FG=8, FCM=False),
              "fg8stream": dict(FG=8, FSTREAM=True, FCM=False), "fg2nt224": dict(FG=2, NT=224, KF=4, FCM=False),
              # round 2 (benchmarks/probes/mhc_cute_post_bda_fwd_sweep.py times more): loads one chunk
              # ahead, all chunks' loads first, two tokens a CTA, vector h loads, L1::no_allocate loads,
              # evict-first output stores, 12 CTAs an SM asked of ptxas, a token over 7 / 2 adjacent CTAs
              "fpf1": dict(FPF=1), "fpfall": dict(FPF=6), "ftok2hv": dict(FTOK=2, FHV=True),
              "fldnoalloc": dict(FLD="noalloc"), "fstcs": dict(FST="cs"), "fminb12": dict(FMINB=12),
              "fsplit7cm": dict(FSPLIT=7, FCM=True), "fsplit2cmhv": dict(FSPLIT=2, FCM=True, FHV=True),
              # session 14: the dbias reduction a plain launch (PDL off; the default since: PDL on, 1-2.5 us
              # faster in both runs; vector h loads in the bwd (BHV, code at c4dc12b) tied)
              "nopdl": dict(PDL=False),
              # session 30: the dh sums over a warp by an all-reduce butterfly a value (the default since: a
              # reduce-scatter, 21 shuffles a token's 20 sums at n = 4 instead of 100; bitwise the same sums)
              "allreduce": dict(WSUM=False),
              # session 43: the bwd walks the tokens last to first (the forward's last reads still in L2)
              "rev": dict(REV=True),
              # session 55: the dbias reduction's old 8 row groups (32 the default since: 9.3-9.9 us against 18.8-19.4),
              # and 2 channels a thread with its row loop unrolled 8 times
              "rg8": dict(RG=8), "dbv2u8": dict(DBV=2, DBU=8)}
# (session 20: BPF, the next token's h loaded while this one streams, tied / lost, code at df04f69; SBT, the dbias
# slots channel-plane major (conflict-free shared adds), tied, code at 05d97d1)
# what a config changes of the fwd kernel (the rest: bwd)
FWD_FIELDS = ("FG", "FSTREAM", "NT", "KF", "FPF", "FTOK", "FLD", "FST", "FHV", "FMINB", "FSPLIT", "FCM")
# knobs that hold at any shape: what the timing script may propose as a new default (and the test file
# then runs at, through TK_TEST_PB_CUTE_CFG)
GENERAL_FIELDS = ("FG", "FSTREAM", "BSTREAM", "UNR", "FPF", "FTOK", "FLD", "FST", "FHV", "FMINB", "FSPLIT", "FCM",
                  "PDL", "WSUM", "REV")


@pytest.fixture(autouse=True)
def _cfg_override(monkeypatch):
    """TK_TEST_PB_CUTE_CFG='{"FG": 8, ...}' (GENERAL_FIELDS only): every test runs the heuristic's
    configs with those fields replaced (a candidate default, before it becomes one)."""
    import json
    import os

    kw = json.loads(os.environ.get("TK_TEST_PB_CUTE_CFG") or "{}")
    assert set(kw) <= set(GENERAL_FIELDS), kw
    if kw:
        orig = cp.PostBdaCuteCfg.heuristic
        monkeypatch.setattr(cp.PostBdaCuteCfg, "heuristic",
                            classmethod(lambda cls, *a: dataclasses.replace(orig(*a), **kw)))
    yield


def test_config_is_the_compile_key():
    """Static dims and dtypes only: T (and the bwd grid) are runtime scalars."""
    keys = {ln.key("sm_90a") for v in COMPILE_VARIANTS for ln in _launches(v).values()}
    assert len(keys) == sum(len(_launches(v)) for v in COMPILE_VARIANTS)
    cfg = cp.PostBdaCuteCfg.heuristic(4, 7168, 2, True)
    assert (cfg.V, cfg.NT, cfg.KF, cfg.NTB, cfg.KC, cfg.UNR, cfg.CPS, cfg.MINB, cfg.FG) == (8, 128, 7, 224, 4, 1, 2, 2, 0)
    assert (cfg.FPF, cfg.FTOK, cfg.FLD, cfg.FST, cfg.FHV, cfg.FMINB) == (0, 1, "", "", False, 0)
    assert (cfg.FSPLIT, cfg.FCM, cfg.FKF, cfg.FCHG) == (7, True, 1, 7)
    s2 = dataclasses.replace(cfg, FSPLIT=2)
    assert (s2.FKF, s2.FCHG) == (4, 2)
    for bad in (dict(FTOK=2, FG=2), dict(FCM=True, FG=2), dict(FLD="nc"), dict(FST="wt"), dict(FTOK=0),
                dict(FSPLIT=0)):
        with pytest.raises(ValueError):
            dataclasses.replace(cfg, **bad)
    assert cp.PostBdaCuteCfg.heuristic(4, 32768, 2, True).CPS == 1  # the dbias slots: 128 KB of smem
    assert cp.PostBdaCuteCfg.heuristic(8, 7168, 2, False).CPS == 2
    f32 = cp.PostBdaCuteCfg.heuristic(4, 7168, 4, True)
    assert (f32.V, f32.NTB, f32.KC) == (4, 224, 8)
    assert cp.PostBdaCuteCfg.heuristic(8, 7168, 2, True).V == 4  # 8-byte vectors above n = 4
    small = cp.PostBdaCuteCfg.heuristic(4, 8, 2, False)
    assert (small.NT, small.KF, small.NTB, small.KC) == (32, 1, 32, 1)
    assert cp.PostBdaCuteCfg.heuristic(4, 2560, 2, True).NTB == 160  # 320 chunks: 2 a thread
    with pytest.raises(ValueError):
        dataclasses.replace(cfg, KC=3)  # 3 x 224 chunks do not cover 896


def test_limits_are_explained():
    def why(*args):
        rows = {b: (ok, w) for b, ok, w in registry.get("mhc_h_post_bda").explain(*args)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    T, n = 3, 4
    args = lambda C, dt=BF: (torch.rand(T, n, n), torch.randn(T, n, C).to(dt), torch.rand(T, n),  # noqa: E731
                             torch.randn(T, C).to(dt), None)
    assert "C % 8 == 0" in why(*args(100))
    assert "cute supports residual in ['bfloat16', 'float32'], got float64" in why(
        *[t.double() for t in args(8)[:4]], None)
    assert "needs a CUDA device" in why(*args(8))


# ------------------------------------------------------------------ GPU


def _rand(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def make_case(T, n, C, act=BF, h=F32, bias=BF):
    """Inputs (h_res, residual, h_post, x, bias) and dout on the GPU, fresh random."""
    ins = (_rand(T, n, n, dtype=h, scale=0.5), _rand(T, n, C, dtype=act), _rand(T, n, dtype=h), _rand(T, C, dtype=act),
           _rand(C, dtype=bias) if bias is not None else None)
    return ins, _rand(T, n, C, dtype=act)


def run_case(ins, dout, cfg=None, grid=None):
    """The cute kernels (poisoned outputs) against the float64 reference; returns the results."""
    hr, res, hp, x, b = ins
    out = empty(res.shape, res.dtype, res.device)
    cp.fwd_into(hr, res, hp, x, b, out, cfg=cfg)
    grads = [None if t is None else empty(t.shape, t.dtype, t.device) for t in ins]
    cp.bwd_into(dout, *ins, *grads, cfg=cfg, grid=grid)
    up = [upcast(t) for t in ins]
    out64 = ref.h_post_bda(*up)
    assert_close(out, out64, what="out")
    if out.dtype == BF and out.numel() >= 4096:  # fp32 math rounded once (session 56; CPU-measured 0-0.006% off)
        assert_one_rounding(out, out64, what="out")
    want = ref.h_post_bda_bwd(upcast(dout), *up)
    for name, g, w in zip(("dh_res", "dresidual", "dh_post", "dx", "dbias"), grads, want):
        if g is not None:
            assert_close(g, w, what=name)
    return out, grads


GPU_CASES = [
    dict(T=1000, n=4, C=2560), dict(T=1, n=4, C=7168), dict(T=37, n=1, C=104), dict(T=3, n=2, C=7168),
    dict(T=37, n=3, C=1000), dict(T=5, n=5, C=7168), dict(T=37, n=8, C=2560), dict(T=1000, n=6, C=8),
    dict(T=1000, n=4, C=2560, act=F32), dict(T=37, n=8, C=1000, act=F32, h=BF, bias=F32),
    dict(T=1000, n=4, C=2560, h=BF), dict(T=1000, n=4, C=2560, bias=None), dict(T=1000, n=4, C=2560, bias=F32),
    dict(T=37, n=5, C=104, act=F32, bias=None), dict(T=37, n=4, C=16384), dict(T=700, n=4, C=7168, act=F32),
    dict(T=32768, n=4, C=7168), dict(T=32768, n=4, C=7168, h=BF),
]


@pytest.mark.parametrize("c", gpu_cases(GPU_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_against_float64(c):
    run_case(*make_case(**c))


@pytest.mark.parametrize("grid", [1, 7, 36])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bwd_grids(grid):
    """Fewer CTAs than tokens (each CTA walks many tokens: the parity buffers, the dbias slots)."""
    run_case(*make_case(37, 3, 1000), grid=grid)
    run_case(*make_case(37, 4, 7168, bias=F32), grid=grid)


@pytest.mark.parametrize("name", list(AB_CONFIGS))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ab_configs(name):
    cfg = dataclasses.replace(cp.PostBdaCuteCfg.heuristic(4, 7168, 2, True), **AB_CONFIGS[name])
    run_case(*make_case(1000, 4, 7168), cfg=cfg)
    run_case(*make_case(37, 4, 7168), cfg=cfg, grid=5)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reduce_scatter_sums_bitwise_the_all_reduce(n):
    """WSUM on and off give bitwise-equal gradients (the same adds in the same pairs), n*n + n from 2 to 72 sums
    (groups of 32 from n = 6), against float64 too."""
    ins, dout = make_case(37, n, 1000 if n > 4 else 2560, h=BF if n == 3 else F32)
    base = cp.PostBdaCuteCfg.heuristic(n, dout.shape[2], 2, True)
    got = [run_case(ins, dout, cfg=dataclasses.replace(base, WSUM=w), grid=5)[1] for w in (True, False)]
    for a, b_ in zip(*got):
        assert_close(a, b_, kind="exact")


@pytest.mark.parametrize("T, n, C, grid", [(37, 4, 7168, 5), (1000, 3, 1000, None), (1, 4, 64, None),
                                           (6, 2, 104, 4)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reversed_walk_same_per_token_gradients(T, n, C, grid):
    """REV (tokens last to first) gives bitwise the default's per-token gradients (dh_res, dresidual, dh_post, dx:
    one token's sums never span CTAs); dbias's partials hold other tokens, so it is checked against float64 only (in
    run_case). T % grid != 0 (and the grid's default at T = 1000): CTAs with different token counts; T = 1: one CTA."""
    ins, dout = make_case(T, n, C)
    base = cp.PostBdaCuteCfg.heuristic(n, C, 2, True)
    _, g0 = run_case(ins, dout, cfg=base, grid=grid)
    _, g1 = run_case(ins, dout, cfg=dataclasses.replace(base, REV=True), grid=grid)
    for name, a, b_ in zip(("dh_res", "dresidual", "dh_post", "dx"), g0[:4], g1[:4]):
        assert_close(b_, a, kind="exact", what=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_empty_and_unaligned():
    (hr, res, hp, x, b), dout = make_case(0, 4, 64)
    out = empty(res.shape, res.dtype, res.device)
    cp.fwd_into(hr, res, hp, x, b, out)
    db = empty(b.shape, b.dtype, b.device)
    g = [empty(t.shape, t.dtype, t.device) for t in (hr, res, hp, x)]
    cp.bwd_into(dout, hr, res, hp, x, b, *g, db)
    assert torch.equal(db, torch.zeros_like(db))
    # views whose addresses are 8 bytes past a 16-byte boundary (the kernels take aligned copies)
    T, n, C = 37, 4, 1000
    (hr, res, hp, x, b), dout = make_case(T, n, C)
    def off(t, k=4):
        base = torch.empty(t.numel() + k, dtype=t.dtype, device=t.device)
        v = base[k:].view(t.shape)
        v.copy_(t)
        return v
    # h one element past a 16-byte boundary (FHV's vector h loads take aligned copies)
    ins = (off(hr, 1), off(res), off(hp, 1), off(x), off(b))
    assert all(t.data_ptr() % 16 for t in ins[1::2] + (ins[4],))
    run_case(ins, off(dout))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_backward_is_deterministic_and_graph_safe():
    ins, dout = make_case(4096, 4, 7168)
    grads = [torch.empty_like(t) for t in ins]
    runs = []
    for _ in range(2):
        for t in grads:
            t.fill_(float("nan"))
        cp.bwd_into(dout, *ins, *grads)
        runs.append([t.clone() for t in grads])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cp.bwd_into(dout, *ins, *grads)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cp.bwd_into(dout, *ins, *grads)
    for t in grads:
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    runs.append([t.clone() for t in grads])
    for r in runs[1:]:
        for a, b_ in zip(runs[0], r):
            assert_close(b_, a, kind="exact")


@pytest.mark.parametrize("h", [F32, BF], ids=["f32h", "bf16h"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_registry_autograd(h):
    """registry.get(op)(..., backend="cute") forward and autograd backward against float64."""
    op = registry.get("mhc_h_post_bda")
    ins, dout = make_case(300, 4, 2560, h=h)
    leaves = [t.detach().clone().requires_grad_() for t in ins]
    out = op(*leaves, backend="cute")
    out.backward(dout)
    up = [upcast(t) for t in ins]
    assert_close(out.detach(), ref.h_post_bda(*up), what="out")
    for name, leaf, w in zip(("dh_res", "dresidual", "dh_post", "dx", "dbias"), leaves,
                             ref.h_post_bda_bwd(upcast(dout), *up)):
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype
        assert_close(leaf.grad, w, what=name)
