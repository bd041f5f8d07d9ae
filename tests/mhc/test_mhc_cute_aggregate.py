"""CuTe DSL mhc_h_aggregate, fwd and bwd (tilekernels/mhc/cute_aggregate.py).

CPU (CI): the launches compile for sm_90a (and sm_100a) from fake arguments with 16-byte (n <= 4)
or 8-byte (n > 4) vector accesses and no register spills; the A/B configs the timing script
measures compile; the config (static n, C, element size) plus the dtypes are the compile key, T is a
runtime scalar; the registry explains the backend's limits. GPU (marked ``gpu``): out, dx and dh_pre
against the float64 reference (tilekernels.testing tolerances by the output's dtype), outputs
NaN-poisoned, fresh random inputs; n = 1..8, T = 0, 1, odd, C a multiple of 8 but not of 64 (and
8 itself), fp32 / bf16 x and h_pre; bwd grids of 1, 5 and 36 CTAs (the persistent token loop, the
smem buffers' parity), unaligned views, the A/B configs (bitwise equal to the default: the sums'
order does not depend on them but on NTB), two calls and a CUDA-graph replay bitwise equal, and the
registry's ``backend="cute"`` through autograd.
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
from tilekernels.mhc import cute_aggregate as ca  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, upcast  # noqa: E402

from mhc_helpers import gpu_cases, on_gpu  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32

# (n, C, x dtype, h_pre dtype)
COMPILE_VARIANTS = [(n, 7168, BF, F32) for n in (1, 2, 3, 4, 5, 8)] + [
    (4, 7168, F32, F32), (4, 7168, BF, BF), (8, 7168, F32, BF), (3, 1000, BF, F32), (6, 8, F32, BF)]
# the timing script's variants (benchmarks/probes/mhc_cute_aggregate_time.py): 2 persistent CTAs an SM walking tokens
# (the default before session 20's one token a CTA; cps3, cps3unr1 and nt448c1 are persistent too, so against
# today's default they change the grid as well), the chunk loop as a loop
# (unrolled 1 / 2 times), 3 CTAs an SM (unrolled or not), 448 threads x 2 chunks at one CTA an SM, no
# register bound; the fwd with ptxas asked for 16 CTAs an SM. (Measured and dropped, code at c4dc12b:
# 4 CTAs an SM, the next token's first chunk prefetched before the dh reduction, vector h_pre loads.)
AB_CONFIGS = {"cps2": dict(CPS=2), "unr1": dict(UNR=1), "unr2": dict(UNR=2), "cps3": dict(CPS=3, MINB=3),
              "cps3unr1": dict(CPS=3, MINB=3, UNR=1), "nt448c1": dict(NTB=448, KC=2, CPS=1, MINB=1),
              "minb0": dict(MINB=0), "fminb16": dict(FMINB=16)}
FWD_AB = ("fminb16",)   # the configs timed on the fwd kernel


def _vid(v):
    n, C, a, h = v
    return f"n{n}-C{C}-{str(a)[6:]}-h{str(h)[6:]}"


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("v", COMPILE_VARIANTS, ids=[_vid(v) for v in COMPILE_VARIANTS])
def test_launches_compile_for_sm90a(v):
    n, C, a, h = v
    for name, ln in ca.representative_launches(n, C, a, h).items():
        art = ln.export("sm_90a")
        res = list(cubin_resources(art.cubin).values())
        assert len(res) == 1 and res[0]["frame"] == 0, f"{name}: register spills or a local array: {res}"
        vb = ln.cfg.V * a.itemsize
        assert vb == (16 if n <= 4 else 8)
        widths = {int(k) * int(b) // 8 for k, b in re.findall(r"ld\.global\S*\.v(\d)\.[bfu](\d+)", art.ptx)}
        assert max(widths, default=0) == vb, f"{name}: vector loads of {widths} bytes, want {vb}"


def test_compiles_for_sm100a():
    """Not run on Blackwell (the spec's cute backend is sm_90 only), but the kernels compile."""
    for ln in ca.representative_launches().values():
        assert ln.export("sm_100a").cubin[:4] == b"\x7fELF"


def test_ab_configs_compile():
    base = ca.AggCuteCfg.heuristic(4, 7168, 2)
    for name, kw in AB_CONFIGS.items():
        cfg = dataclasses.replace(base, **kw)
        ln = (ca.fwd_launch if name in FWD_AB else ca.bwd_launch)(cfg, BF, F32)
        assert len(cubin_resources(ln.export("sm_90a").cubin)) == 1


def test_config_is_the_compile_key():
    """Static dims and dtypes only: T (and the bwd grid) are runtime scalars."""
    keys = {ln.key("sm_90a") for v in COMPILE_VARIANTS for ln in ca.representative_launches(*v).values()}
    assert len(keys) == 2 * len(COMPILE_VARIANTS)
    cfg = ca.AggCuteCfg.heuristic(4, 7168, 2)
    assert (cfg.V, cfg.NT, cfg.FCHG, cfg.NTB, cfg.KC, cfg.CPS, cfg.MINB, cfg.UNR) == (8, 128, 7, 224, 4, 0, 2, 0)
    assert ca.AggCuteCfg.heuristic(4, 7168, 4).UNR == 1   # 8 chunks a thread: a loop (unrolled, ptxas spills)
    assert ca.AggCuteCfg.heuristic(8, 7168, 2).V == 4 and ca.AggCuteCfg.heuristic(4, 7168, 4).V == 4
    small = ca.AggCuteCfg.heuristic(6, 8, 4)
    assert (small.V, small.NT, small.FCHG, small.NTB, small.KC) == (2, 32, 1, 32, 1)
    for bad in (dict(KC=3), dict(NT=48), dict(CPS=-1), dict(V=3), dict(UNR=-1)):
        with pytest.raises(ValueError):
            dataclasses.replace(cfg, **bad)


def test_grid_bound_of_the_spec_covers_every_config():
    """The spec's fwd-grid constraint, T * (C // 256 + 1) < 2**31, bounds the launch's T * FCHG CTAs:
    FCHG <= C // 256 + 1 for every n, dtype and C (fp32 at n > 4 has the narrowest chunks, V = 2)."""
    for n in range(1, 9):
        for esz in (2, 4):
            for C in (8, 64, 256, 1000, 1024, 4096, 7168, 16384, 65536, 2 ** 20):
                cfg = ca.AggCuteCfg.heuristic(n, C, esz)
                assert cfg.FCHG <= C // 256 + 1, (n, esz, C, cfg.FCHG)


def test_limits_are_explained():
    def why(x, h):
        rows = {b: (ok, w) for b, ok, w in registry.get("mhc_h_aggregate").explain(x, h)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    assert "C % 8 == 0" in why(torch.randn(3, 4, 100).to(BF), torch.rand(3, 4))
    assert "cute supports x in ['bfloat16', 'float32'], got float64" in why(torch.randn(3, 4, 8).double(),
                                                                           torch.rand(3, 4).double())
    assert "needs a CUDA device" in why(torch.randn(3, 4, 8).to(BF), torch.rand(3, 4))


# ------------------------------------------------------------------ GPU


def make_case(T, n, C, x=BF, h=F32):
    """x, h_pre and dout on the GPU, fresh random."""
    return ((torch.randn(T, n, C, device="cuda").to(x), torch.randn(T, n, device="cuda").to(h)),
            torch.randn(T, C, device="cuda").to(x))


def run_case(ins, dout, cfg=None, grid=None):
    """The cute kernels (poisoned outputs) against the float64 reference; returns the results."""
    x, h = ins
    out = empty((x.shape[0], x.shape[2]), x.dtype, x.device)
    ca.fwd_into(x, h, out, cfg=cfg)
    dx, dh = empty(x.shape, x.dtype, x.device), empty(h.shape, h.dtype, h.device)
    ca.bwd_into(dout, x, h, dx, dh, cfg=cfg, grid=grid)
    assert_close(out, ref.h_aggregate(upcast(x), upcast(h)), what="out")
    wdx, wdh = ref.h_aggregate_bwd(upcast(dout), upcast(x), upcast(h))
    assert_close(dx, wdx, what="dx")
    assert_close(dh, wdh, what="dh_pre")
    return out, dx, dh


GPU_CASES = [
    dict(T=1000, n=4, C=2560), dict(T=1, n=4, C=7168), dict(T=37, n=1, C=104), dict(T=3, n=2, C=7168),
    dict(T=37, n=3, C=1000), dict(T=5, n=5, C=7168), dict(T=37, n=8, C=2560), dict(T=1000, n=6, C=8),
    dict(T=1000, n=4, C=2560, x=F32), dict(T=37, n=8, C=1000, x=F32, h=BF), dict(T=1000, n=4, C=2560, h=BF),
    dict(T=37, n=7, C=104, x=F32), dict(T=37, n=4, C=16384), dict(T=700, n=4, C=7168, x=F32),
    dict(T=32768, n=4, C=7168), dict(T=32768, n=4, C=7168, h=BF),
]


@pytest.mark.parametrize("c", gpu_cases(GPU_CASES))
@on_gpu
def test_against_float64(c):
    run_case(*make_case(**c))


@pytest.mark.parametrize("grid", [1, 5, 36])
@on_gpu
def test_bwd_grids(grid):
    """Fewer CTAs than tokens (each CTA walks many tokens: the parity buffers)."""
    run_case(*make_case(37, 3, 1000), grid=grid)
    run_case(*make_case(37, 4, 7168, h=BF), grid=grid)


@pytest.mark.parametrize("name", list(AB_CONFIGS))
@on_gpu
def test_ab_configs(name):
    cfg = dataclasses.replace(ca.AggCuteCfg.heuristic(4, 7168, 2), **AB_CONFIGS[name])
    ins, dout = make_case(1000, 4, 7168)
    got = run_case(ins, dout, cfg=cfg)
    if cfg.NTB == ca.AggCuteCfg.heuristic(4, 7168, 2).NTB:   # same sums' order: bitwise equal
        for a, b in zip(got, run_case(ins, dout)):
            assert_close(a, b, kind="exact")
    run_case(*make_case(37, 4, 7168), cfg=cfg, grid=5)


@on_gpu
def test_empty_and_unaligned():
    (x, h), dout = make_case(0, 4, 64)
    out = empty((0, 64), x.dtype, x.device)
    ca.fwd_into(x, h, out)
    ca.bwd_into(dout, x, h, empty(x.shape, x.dtype, x.device), empty(h.shape, h.dtype, h.device))

    def off(t, k=4):   # a view k elements past a 16-byte boundary (the kernels take aligned copies)
        base = torch.empty(t.numel() + k, dtype=t.dtype, device=t.device)
        v = base[k:].view(t.shape)
        v.copy_(t)
        return v

    (x, h), dout = make_case(37, 4, 1000)
    ins = (off(x), off(h, 1))
    assert ins[0].data_ptr() % 16 and ins[1].data_ptr() % 8
    run_case(ins, off(dout))
    # unaligned outputs: written through aligned temporaries
    x, h = ins
    out, dx, dh = off(empty((37, 1000), x.dtype, x.device)), off(empty(x.shape, x.dtype, x.device)), off(
        empty(h.shape, h.dtype, h.device), 1)
    ca.fwd_into(x, h, out)
    ca.bwd_into(dout, x, h, dx, dh)
    assert_close(out, ref.h_aggregate(upcast(x), upcast(h)), what="out")
    wdx, wdh = ref.h_aggregate_bwd(upcast(dout), upcast(x), upcast(h))
    assert_close(dx, wdx, what="dx")
    assert_close(dh, wdh, what="dh_pre")


@on_gpu
def test_backward_is_deterministic_and_graph_safe():
    (x, h), dout = make_case(4096, 4, 7168)
    dx, dh = torch.empty_like(x), torch.empty_like(h)
    runs = []
    for _ in range(2):
        dx.fill_(float("nan"))
        dh.fill_(float("nan"))
        ca.bwd_into(dout, x, h, dx, dh)
        runs.append((dx.clone(), dh.clone()))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ca.bwd_into(dout, x, h, dx, dh)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ca.bwd_into(dout, x, h, dx, dh)
    dx.fill_(float("nan"))
    dh.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    runs.append((dx.clone(), dh.clone()))
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert_close(b, a, kind="exact")


@pytest.mark.parametrize("h", [F32, BF], ids=["f32h", "bf16h"])
@on_gpu
def test_registry_autograd(h):
    """registry.get(op)(..., backend="cute") forward and autograd backward against float64; the
    registry's default picks cute here (CuTe DSL present, no cuTile needed)."""
    op = registry.get("mhc_h_aggregate")
    (x, hp), dout = make_case(300, 4, 2560, h=h)
    assert op.choose(op.bind(x, hp)) == "cute"
    leaves = [x.clone().requires_grad_(), hp.clone().requires_grad_()]
    out = op(*leaves, backend="cute")
    out.backward(dout)
    assert_close(out.detach(), ref.h_aggregate(upcast(x), upcast(hp)), what="out")
    for name, leaf, w in zip(("dx", "dh_pre"), leaves, ref.h_aggregate_bwd(upcast(dout), upcast(x), upcast(hp))):
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype
        assert_close(leaf.grad, w, what=name)
