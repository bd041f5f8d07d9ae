"""cuTile mHC kernels vs the float64 torch reference, on a CUDA device.

Each kernel is called destination-passing on fresh random inputs, with its
outputs NaN-poisoned first (conftest), and compared with
``tilekernels.mhc.reference`` run on float64 upcasts, within
``tilekernels.testing``'s tolerance for the output's dtype. Skipped without
CUDA. ``benchmarks/mhc_cutile_check.py`` imports the case lists and runners.
"""
from __future__ import annotations

import pytest
import torch

from tilekernels._glue import empty
from tilekernels.testing import assert_close, assert_one_rounding, upcast

from mhc_helpers import gpu_cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BF, F32 = torch.bfloat16, torch.float32


def _grid(base, **vary):
    """base case, then each listed value of each dim with the others at base."""
    out = [dict(base)]
    for k, vals in vary.items():
        for v in vals:
            c = dict(base, **{k: v})
            if c not in out:
                out.append(c)
    return out


# n, C, T values of issue 3 (C=100: not a multiple of 64, nor of 8) and h / bias variants;
# the headline shape (T=32768, n=4, C=7168) once per h dtype.
_BASE = dict(T=1000, n=4, C=2560, h=F32, bias=True, act=BF)
CASES = _grid(_BASE, n=[1, 2, 3, 8], C=[64, 4096, 7168, 100], T=[1, 3], h=[BF], bias=[False],
              act=[F32]) + [dict(_BASE, T=32768, C=7168, h=BF), dict(_BASE, T=32768, C=7168),
                            # odd T and n with bf16 h: where occupancy hints on the h_post_bda
                            # dres/dx kernel once produced NaN with a transposed bf16 h_res load
                            # (now: h_res rows, staged to fp32, at occupancy 2)
                            dict(_BASE, T=37, n=3, h=BF)]
SK_CASES = _grid(dict(T=1000, n=4, iters=20), n=[1, 2, 3, 8], T=[1, 3, 32768], iters=[3])
PR_CASES = _grid(dict(M=1000, n=4, C=512), n=[1, 2, 3, 8], C=[100, 7168], M=[1, 3]) + \
    [dict(M=32768, n=4, C=7168)]
# mhc_pre: every n, the C values, T edges; iters 3 and 20; alphas != 1 so a
# section mix-up shows
PRE_CASES = _grid(dict(T=1000, n=4, C=2560, iters=20), n=[1, 2, 3, 8], C=[64, 4096, 100],
                  T=[1, 3], iters=[3]) + [dict(T=32768, n=4, C=7168, iters=20)]
PRE_PARAMS = dict(alpha_pre=0.7, alpha_post=1.3, alpha_res=0.4)


def _k(op, pass_, backend="cutile"):
    import importlib

    from tilekernels._glue import get_kernel

    # (importing a backend's module registers its kernels; the cute ones this file's runners take: mhc_pre's)
    importlib.import_module("tilekernels.mhc." + {"cutile": "cutile_kernels", "cute": "cute_pre"}[backend])
    return get_kernel(op, backend, pass_)


def _rand(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


ONCE = ("out", "layer_in")  # forward outputs the ops define as fp32 math rounded once to the activation dtype


def _check(got: dict, want: dict) -> dict:
    """assert_close each output against the float64 reference; returns rel errors. The ONCE outputs in bf16 (4096
    elements or more: a 1% bound needs a few) are also the float64 value rounded once, elementwise (session 56's
    assert_one_rounding: 0-0.006% of the elements off on the CPU's torch backend; not yet run on these kernels)."""
    errs = {}
    for name, t in got.items():
        errs[name] = assert_close(t, want[name], kind=t.dtype, what=name)
        if name in ONCE and t.dtype == BF and t.numel() >= 4096:
            assert_one_rounding(t, want[name], what=name)
    return errs


def run_h_aggregate(c):
    from tilekernels.mhc import reference as ref

    T, n, C = c["T"], c["n"], c["C"]
    x, h = _rand(T, n, C, dtype=c["act"]), _rand(T, n, dtype=c["h"])
    out = empty((T, C), x.dtype, x.device)
    _k("mhc_h_aggregate", "fwd")(x, h, out)
    dout = _rand(T, C, dtype=c["act"])
    dx, dh = empty(x.shape, x.dtype, x.device), empty(h.shape, h.dtype, h.device)
    _k("mhc_h_aggregate", "bwd")(dout, x, h, dx, dh)
    x64, h64, d64 = upcast(x), upcast(h), upcast(dout)
    gx, gh = ref.h_aggregate_bwd(d64, x64, h64)
    return _check({"out": out, "dx": dx, "dh_pre": dh},
                  {"out": ref.h_aggregate(x64, h64), "dx": gx, "dh_pre": gh})


def run_h_post_bda(c):
    from tilekernels.mhc import reference as ref

    T, n, C, act = c["T"], c["n"], c["C"], c["act"]
    hr, hp = _rand(T, n, n, dtype=c["h"], scale=0.5), _rand(T, n, dtype=c["h"])
    res, x = _rand(T, n, C, dtype=act), _rand(T, C, dtype=act)
    b = _rand(C, dtype=act) if c["bias"] else None
    out = empty(res.shape, res.dtype, res.device)
    dout = _rand(T, n, C, dtype=act)
    grads = [empty(t.shape, t.dtype, t.device) if t is not None else None for t in (hr, res, hp, x, b)]
    _k("mhc_h_post_bda", "fwd")(hr, res, hp, x, b, out)
    _k("mhc_h_post_bda", "bwd")(dout, hr, res, hp, x, b, *grads)
    up = [upcast(t) if t is not None else None for t in (hr, res, hp, x, b)]
    want = ref.h_post_bda_bwd(upcast(dout), *up)
    names = ("dh_res", "dresidual", "dh_post", "dx", "dbias")
    got = {k: g for k, g in zip(names, grads) if g is not None}
    return _check({"out": out, **got},
                  {"out": ref.h_post_bda(*up), **{k: w for k, w in zip(names, want) if w is not None}})


def run_sinkhorn(c):
    from tilekernels.mhc import reference as ref

    T, n, iters, eps = c["T"], c["n"], c["iters"], 1e-6
    lg = _rand(T, n, n, dtype=F32, scale=2.0)
    out = empty(lg.shape, F32, lg.device)
    _k("mhc_sinkhorn", "fwd")(lg, out, iters, eps)
    dout = _rand(T, n, n, dtype=F32)
    dl = empty(lg.shape, F32, lg.device)
    _k("mhc_sinkhorn", "bwd")(dout, lg, dl, iters, eps)
    l64 = upcast(lg)
    return _check({"out": out, "dlogits": dl},
                  {"out": ref.sinkhorn(l64, iters, eps), "dlogits": ref.sinkhorn_bwd(upcast(dout), l64, iters, eps)})


def run_proj_rms(c):
    from tilekernels.mhc import reference as ref

    M, n, C, eps = c["M"], c["n"], c["C"], 1e-6
    K, N = n * C, n * n + 2 * n
    x, w = _rand(M, K), _rand(N, K, scale=0.05)
    proj, r = empty((M, N), F32, x.device), empty((M,), F32, x.device)
    _k("mhc_proj_rms", "fwd")(x, w, proj, r, eps)
    dproj, dr = _rand(M, N, dtype=F32), _rand(M, dtype=F32)
    dx, dw = empty(x.shape, x.dtype, x.device), empty(w.shape, w.dtype, w.device)
    _k("mhc_proj_rms", "bwd")(dproj, dr, x, w, r, dx, dw, eps)
    x64, w64 = upcast(x), upcast(w)
    p64, r64 = ref.proj_rms(x64, w64, eps)
    gx, gw = ref.proj_rms_bwd(upcast(dproj), upcast(dr), x64, w64, r64, eps)
    return _check({"proj": proj, "r": r, "dx": dx, "dweight": dw},
                  {"proj": p64, "r": r64, "dx": gx, "dweight": gw})


def run_pre(c, backend="cutile"):
    """mhc_pre's fwd and bwd kernels of ``backend`` (cutile; cute: tilekernels.mhc.cute_pre) against float64."""
    from tilekernels.mhc import reference as ref

    T, n, C, iters, eps = c["T"], c["n"], c["C"], c["iters"], 1e-6
    N = n * n + 2 * n
    x, w, b = _rand(T, n, C), _rand(N, n * C, scale=(n * C) ** -0.5), _rand(N, dtype=F32)
    params = (PRE_PARAMS["alpha_pre"], PRE_PARAMS["alpha_post"], PRE_PARAMS["alpha_res"], iters, eps, eps)
    outs = [empty(s, dt, x.device) for s, dt in (((T, C), BF), ((T, n), F32), ((T, n, n), F32),
                                                  ((T, N), F32), ((T,), F32))]
    _k("mhc_pre", "fwd", backend)(x, w, b, *outs, *params)
    dli, dhp, dhr = _rand(T, C), _rand(T, n, dtype=F32), _rand(T, n, n, dtype=F32)
    grads = [empty(t.shape, t.dtype, t.device) for t in (x, w, b)]
    _k("mhc_pre", "bwd", backend)(dli, dhp, dhr, x, w, b, outs[3], outs[4], *grads, *params)
    x64, w64, b64 = upcast(x), upcast(w), upcast(b)
    p64, r64 = ref.proj_rms(x64.reshape(T, n * C), w64, eps)
    want = ref.mhc_pre(x64, w64, b64, *params)
    gwant = ref.mhc_pre_bwd(upcast(dli), upcast(dhp), upcast(dhr), x64, w64, b64, p64, r64, *params)
    names = ("layer_in", "h_post", "h_res", "proj", "r", "dx", "dweight", "dbias")
    return _check(dict(zip(names, (*outs, *grads))), dict(zip(names, (*want, p64, r64, *gwant))))


RUNNERS = {"mhc_h_aggregate": (run_h_aggregate, CASES), "mhc_h_post_bda": (run_h_post_bda, CASES),
           "mhc_sinkhorn": (run_sinkhorn, SK_CASES), "mhc_proj_rms": (run_proj_rms, PR_CASES),
           "mhc_pre": (run_pre, PRE_CASES)}


@pytest.mark.parametrize("c", gpu_cases([c for c in CASES if c["bias"]]))
def test_h_aggregate(c):
    run_h_aggregate(c)


@pytest.mark.parametrize("c", gpu_cases(CASES))
def test_h_post_bda(c):
    run_h_post_bda(c)


def _pin_heuristic(monkeypatch, cfg_cls, **design):
    """Make ``cfg_cls.heuristic`` pick the given design keyword(s) for every launch."""
    orig = cfg_cls.heuristic
    monkeypatch.setattr(cfg_cls, "heuristic", classmethod(lambda cls, *a, **k: orig(*a, **{**k, **design})))


# the two-pass backward (what n = 8 uses) at the n <= 4 shapes where the one-pass one is the default
TWO_PASS_CASES = [dict(_BASE, T=37, n=3, h=BF), dict(_BASE, C=100, bias=False), dict(_BASE, T=1, n=1),
                  dict(_BASE, T=32768, C=7168, h=BF)]


@pytest.mark.parametrize("one", [False, True], ids=["two_pass", "one_pass"])
@pytest.mark.parametrize("c", gpu_cases(TWO_PASS_CASES))
def test_h_post_bda_backward_either_design(c, one, monkeypatch):
    from tilekernels.mhc import cutile_post_bda as pb

    _pin_heuristic(monkeypatch, pb.PostBdaCfg, one=one)
    run_h_post_bda(c)


@pytest.mark.parametrize("c", gpu_cases(SK_CASES))
def test_sinkhorn(c):
    run_sinkhorn(c)


# both Sinkhorn backward designs (entries: the default; the padded tile: an option)
SK_DESIGN_CASES = [dict(T=1000, n=4, iters=20), dict(T=3, n=3, iters=3), dict(T=1, n=1, iters=20),
                   dict(T=32768, n=4, iters=20), dict(T=37, n=8, iters=3)]


@pytest.mark.parametrize("entries", [False, True], ids=["tile", "entries"])
@pytest.mark.parametrize("c", gpu_cases(SK_DESIGN_CASES))
def test_sinkhorn_backward_either_design(c, entries, monkeypatch):
    from tilekernels.mhc import cutile_sinkhorn as sk

    _pin_heuristic(monkeypatch, sk.SinkhornCfg, entries=entries)
    run_sinkhorn(c)


@pytest.mark.parametrize("c", gpu_cases(PR_CASES))
def test_proj_rms(c):
    run_proj_rms(c)


@pytest.mark.parametrize("c", gpu_cases(PRE_CASES))
def test_pre(c):
    run_pre(c)


# mhc_pre's bwd mix designs: one kernel with the padded-tile or the entries Sinkhorn backward (entries: n > 4), or
# split in two (the entries Sinkhorn backward alone, then the elementwise rest: n <= 4); T=130 and 1000 leave a
# partial last token tile in the split's kernels (128 tokens a block)
PRE_MIX_CASES = [dict(T=37, n=3, C=100, iters=3), dict(T=1000, n=4, C=256, iters=20),
                 dict(T=1, n=1, C=64, iters=20), dict(T=300, n=8, C=64, iters=3), dict(T=130, n=2, C=96, iters=20)]
MIX_DESIGNS = {"tile": dict(mix_entries=False), "entries": dict(mix_entries=True), "split": dict(mix_split=True)}


@pytest.mark.parametrize("design", list(MIX_DESIGNS))
@pytest.mark.parametrize("c", gpu_cases(PRE_MIX_CASES))
def test_pre_backward_either_mix(c, design, monkeypatch):
    from tilekernels.mhc import cutile_pre as pre

    _pin_heuristic(monkeypatch, pre.PreCfg, **MIX_DESIGNS[design])
    run_pre(c)


# AggCfg.REV / REV_B (session 43's probe fields: the aggregate's token tiles last to first, for the L2 reuse after
# the kernel before it): T=1000 and 37 leave a partial tile, T=1 one tile
REV_CASES = [dict(T=1000, n=4, C=2560), dict(T=37, n=3, C=100), dict(T=1, n=1, C=64)]


@pytest.mark.parametrize("c", REV_CASES, ids=[f"T{c['T']}-n{c['n']}-C{c['C']}" for c in REV_CASES])
def test_aggregate_reversed_tiles_bitwise_the_default(c):
    """Every tile computes what it did in grid order, so out, dx and dh_pre (also mhc_pre's dh_pre-only pass) are
    bitwise the default's, and within the float64 tolerance."""
    import dataclasses

    from tilekernels.mhc import cutile_aggregate as agg
    from tilekernels.mhc import reference as ref

    T, n, C = c["T"], c["n"], c["C"]
    x, h, d = _rand(T, n, C), _rand(T, n, dtype=F32), _rand(T, C)
    base = agg.AggCfg.heuristic(T, n, C)
    got = []
    for cfg in (base, dataclasses.replace(base, REV=True, REV_B=True)):
        out, dx = empty((T, C), BF, x.device), empty(x.shape, BF, x.device)
        dh, dh2 = empty((T, n), F32, x.device), empty((T, n), F32, x.device)
        agg.fwd_launch(x, h, out, cfg).run()
        agg.bwd_launch(d, x, h, dx, dh, cfg).run()
        agg.bwd_launch(d, x, None, None, dh2, cfg).run()   # mhc_pre's dh_pre-only pass
        got.append((out, dx, dh, dh2))
    for a, b in zip(*got):
        assert_close(b, a, kind="exact")
    x64, h64 = upcast(x), upcast(h)
    gx, gh = ref.h_aggregate_bwd(upcast(d), x64, h64)
    out, dx, dh, dh2 = got[1]
    _check({"out": out, "dx": dx, "dh_pre": dh, "dh_pre only": dh2},
           {"out": ref.h_aggregate(x64, h64), "dx": gx, "dh_pre": gh, "dh_pre only": gh})


def _bwd_args(op, T, n, C):
    """(inputs, outputs) of ``op``'s destination-passing backward on fresh random data."""
    N = n * n + 2 * n
    if op == "mhc_h_post_bda":
        ins = (_rand(T, n, C), _rand(T, n, n, dtype=F32), _rand(T, n, C), _rand(T, n, dtype=F32), _rand(T, C),
               _rand(C))
        outs = [empty(t.shape, t.dtype, t.device) for t in ins[1:]]
        return ins, outs
    if op == "mhc_proj_rms":
        x, w = _rand(T, n * C), _rand(N, n * C, scale=0.05)
        ins = (_rand(T, N, dtype=F32), _rand(T, dtype=F32), x, w, _rand(T, dtype=F32).abs() + 0.5)
        return ins, [empty(x.shape, x.dtype, x.device), empty(w.shape, w.dtype, w.device), 1e-6]
    x, w, b = _rand(T, n, C), _rand(N, n * C, scale=(n * C) ** -0.5), _rand(N, dtype=F32)
    ins = (_rand(T, C), _rand(T, n, dtype=F32), _rand(T, n, n, dtype=F32), x, w, b, _rand(T, N, dtype=F32),
           _rand(T, dtype=F32).abs() + 0.5)
    return ins, [empty(t.shape, t.dtype, t.device) for t in (x, w, b)] + [0.7, 1.3, 0.4, 20, 1e-6, 1e-6]


@pytest.mark.parametrize("op", ["mhc_h_post_bda", "mhc_proj_rms", "mhc_pre"])
def test_backward_is_deterministic_and_graph_safe(op):
    """The backwards reduce fp32 partials in a fixed order (no atomics), with the reductions
    launched as programmatic dependent launches: two eager calls and one CUDA-graph replay
    on the same inputs give bitwise-equal gradients (a reduction that read its partials
    before the kernel writing them finished would differ, or be NaN: outputs are poisoned)."""
    ins, outs = _bwd_args(op, 4096, 4, 7168 if op != "mhc_pre" else 2560)
    grads = [t for t in outs if isinstance(t, torch.Tensor)]
    fn = _k(op, "bwd")
    runs = []
    for _ in range(2):
        for t in grads:
            t.fill_(float("nan"))
        fn(*ins, *outs)
        runs.append([t.clone() for t in grads])
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*ins, *outs)  # warm-up on the capture stream
        with torch.cuda.graph(g, stream=side):
            fn(*ins, *outs)
    torch.cuda.current_stream().wait_stream(side)
    for t in grads:
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    runs.append([t.clone() for t in grads])
    for i, first in enumerate(runs[0]):
        assert torch.isfinite(first.float()).all(), f"{op}: gradient {i} not finite"
        for r in runs[1:]:
            assert torch.equal(first, r[i]), f"{op}: gradient {i} differs between runs"


def test_empty_batch_writes_zero_dbias_and_dweight():
    """T = 0: nothing to launch for the token kernels, but dbias / dweight (reduced
    over T) must still be written (as zeros)."""
    n, C = 4, 256
    hr, hp = _rand(0, n, n, dtype=F32), _rand(0, n, dtype=F32)
    res, x, b = _rand(0, n, C), _rand(0, C), _rand(C)
    grads = [empty(t.shape, t.dtype, t.device) for t in (hr, res, hp, x, b)]
    _k("mhc_h_post_bda", "bwd")(_rand(0, n, C), hr, res, hp, x, b, *grads)
    assert torch.equal(grads[-1], torch.zeros_like(b))
    x2, w = _rand(0, n * C), _rand(24, n * C)
    dx, dw = empty(x2.shape, x2.dtype, x2.device), empty(w.shape, w.dtype, w.device)
    _k("mhc_proj_rms", "bwd")(_rand(0, 24, dtype=F32), _rand(0, dtype=F32), x2, w, _rand(0, dtype=F32),
                             dx, dw, 1e-6)
    assert torch.equal(dw, torch.zeros_like(w))
    x3, b = _rand(0, n, C), _rand(24, dtype=F32)
    grads = [empty(t.shape, t.dtype, t.device) for t in (x3, w, b)]
    _k("mhc_pre", "bwd")(_rand(0, C), _rand(0, n, dtype=F32), _rand(0, n, n, dtype=F32), x3, w, b,
                         _rand(0, 24, dtype=F32), _rand(0, dtype=F32), *grads, 1.0, 1.0, 1.0, 20, 1e-6, 1e-6)
    assert torch.equal(grads[1], torch.zeros_like(w)) and torch.equal(grads[2], torch.zeros_like(b))


def test_new_batch_size_reuses_the_compile_key():
    """T is a dynamic dim: a second T gives the same (kernel, dtypes, config) keys."""
    from tilekernels._cutile import record_compile_keys

    with record_compile_keys() as keys:
        run_h_aggregate(dict(_BASE, T=517))
        before = set(keys)
        run_h_aggregate(dict(_BASE, T=1029))
        assert keys == before and before


def test_launches_go_to_the_current_torch_stream():
    """Kernels are queued on torch's current stream: on a side stream held back by a
    sleep and a NaN fill, the aggregate must come after the fill (a launch on another
    stream would run first and be overwritten by the fill)."""
    from tilekernels.mhc import reference as ref

    x, h = _rand(1000, 4, 2560), _rand(1000, 4, dtype=F32)
    out = torch.empty(1000, 2560, dtype=BF, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms: long enough for a wrongly placed launch to finish first
        out.fill_(float("nan"))
        _k("mhc_h_aggregate", "fwd")(x, h, out)
    side.synchronize()
    assert_close(out, ref.h_aggregate(upcast(x), upcast(h)), kind=BF, what="out")
