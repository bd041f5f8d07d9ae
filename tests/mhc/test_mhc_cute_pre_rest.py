"""cute_pre_rest: the CuTe DSL kernel for the elementwise rest of mhc_pre's split backward mix (mhc_post_pre's cute
backend runs it twice a step). CPU: it compiles for sm_90a and sm_100a without spills, its config limits. GPU: every
output against the module docstring's formulas in float64 on fresh random inputs (outputs NaN-poisoned first), at
token counts on both sides of the 128-token CTA (1, 127, 128, 129, 1000, 0), n = 1..4, dh_post fp32 and bf16, dproj
[T, N] and padded [T, NPAD]; DPROJ_ONLY leaves every other output untouched; the cuTile kernel it stands in for
agrees within fp32's tolerance; two runs are bitwise equal. The whole op with it (and without it, CUTE_REST off):
test_mhc_cute_post_pre.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels._cute import no_spill_kernel  # noqa: E402
from tilekernels._glue import next_pow2  # noqa: E402
from tilekernels.mhc import cute_pre_rest as R  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

from mhc_helpers import BF16, F32, F64, on_gpu  # noqa: E402

ALPHA = (0.7, 1.3, 0.45)   # a_pre, a_post, a_res: distinct, so a column in the wrong section shows


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_compiles_without_spills(n, arch):
    for name, ln in R.representative_launches(n).items():
        art = ln.export(arch)
        no_spill_kernel(art.cubin, name, "kernel")
        # barriers: after the rows are staged in, before dproj is staged out, and (rest) in the p_db sums across warps
        assert art.ptx.count("bar.sync") == (3 if name == "rest" else 2), name
        assert ("shfl.sync.bfly" in art.ptx) == (name == "rest"), name


def test_config_limits():
    R.PreRestCuteCfg(4, 4, 32, 24)
    R.PreRestCuteCfg(4, 4, 32, 32, TT=32, DPROJ_ONLY=True)
    assert R.PreRestCuteCfg(4, 4, 32, 32).smem_bytes == 128 * (25 + 17 + 9 + 33) * 4 + 2 * 16 * 32 * 4
    for bad in (dict(n=4, NP=4, NPAD=16, LDP=24), dict(n=4, NP=2, NPAD=32, LDP=24), dict(n=4, NP=4, NPAD=32, LDP=30),
                dict(n=4, NP=4, NPAD=32, LDP=24, TT=100), dict(n=4, NP=4, NPAD=32, LDP=24, TT=16),
                dict(n=4, NP=4, NPAD=32, LDP=24, TT=2048), dict(n=4, NP=4, NPAD=32, LDP=24, TT=256),
                dict(n=4, NP=4, NPAD=32, LDP=24, NT=96)):
        with pytest.raises(ValueError, match="PreRestCuteCfg"):
            R.PreRestCuteCfg(**bad)


def _inputs(T: int, n: int, hdt, dev="cuda"):
    """(dpre, proj, r, bias, dhpost, dlres): fresh random, dlres's padded entries random too (never read)."""
    N, NP = n * n + 2 * n, next_pow2(n)
    g = lambda *s: torch.randn(*s, device=dev)   # noqa: E731
    return g(T, n), g(T, N), g(T).abs() + 0.5, g(N) * 0.5, g(T, n).to(hdt), g(T, NP, NP)


def _want(dpre, proj, r, bias, dhpost, dlres, TT: int, NPAD: int):
    """float64 (dproj [T, N], dr, hpre_t, p_db [cdiv(T, TT), NPAD]) from the module docstring's formulas."""
    dpre, proj, r, bias, dhpost, dlres = (t.to(F64) for t in (dpre, proj, r, bias, dhpost, dlres))
    T, n = dpre.shape
    N = proj.shape[1]
    al = torch.tensor([ALPHA[0]] * n + [ALPHA[1]] * n + [ALPHA[2]] * (n * n), dtype=F64, device=proj.device)
    sg = torch.sigmoid(r[:, None] * proj[:, :2 * n] * al[:2 * n] + bias[:2 * n])
    up = torch.cat([dpre, 2 * dhpost], 1)
    dh = torch.cat([up * sg * (1 - sg), dlres[:, :n, :n].reshape(T, n * n)], 1)
    nt = -(-T // TT)
    p_db = torch.zeros(nt, NPAD, dtype=F64, device=proj.device)
    pad = torch.zeros(nt * TT - T, N, dtype=F64, device=proj.device)
    p_db[:, :N] = torch.cat([dh, pad]).view(nt, TT, N).sum(1)
    return dh * r[:, None] * al, (dh * proj * al).sum(1), sg[:, :n].T, p_db


def _outs(T: int, n: int, LDP: int, NPAD: int, TT: int):
    nan = lambda *s: torch.full(s, float("nan"), device="cuda")   # noqa: E731
    return nan(T, LDP), nan(T), nan(n, T), nan(-(-T // TT), NPAD)


def _run(ins, outs, n, NPAD, TT, dproj_only=False):
    R.run_rest(*ins[:6], *outs, *ALPHA, n, next_pow2(n), NPAD, TT, dproj_only=dproj_only)


CASES = [(1, 4), (127, 4), (128, 4), (129, 4), (1000, 4), (333, 3), (130, 2), (37, 1), (0, 4)]


@on_gpu
@pytest.mark.parametrize("padded", [False, True], ids=["ldpN", "ldpNPAD"])
@pytest.mark.parametrize("hdt", [F32, BF16], ids=["dhpost_f32", "dhpost_bf16"])
@pytest.mark.parametrize("T,n", CASES, ids=[f"T{t}-n{n}" for t, n in CASES])
def test_matches_float64(T, n, hdt, padded):
    """fp32 outputs, sums of at most 24 (dr) or 128 (p_db) fp32 terms: the fp32 tolerance (1e-5); the sigmoid's
    approximate exp and reciprocal are within a few ulp."""
    N = n * n + 2 * n
    NPAD, TT = max(16, next_pow2(N)), 128
    ins = _inputs(T, n, hdt)
    outs = _outs(T, n, NPAD if padded else N, NPAD, TT)
    _run(ins, outs, n, NPAD, TT)
    torch.cuda.synchronize()
    dproj, dr, hpre_t, p_db = outs
    w = _want(*ins, TT, NPAD)
    if padded:
        assert torch.equal(dproj[:, N:], torch.zeros_like(dproj[:, N:])), "dproj0's padded columns not 0"
    for name, got, want in zip(("dproj", "dr", "hpre_t", "p_db"), (dproj[:, :N], dr, hpre_t, p_db), w):
        assert not torch.isnan(got).any(), f"{name}: {torch.isnan(got).sum().item()} elements not written"
        assert_close(got, want, kind=F32, what=name)


@on_gpu
@pytest.mark.parametrize("T,n", [(129, 4), (5, 3)], ids=["T129-n4", "T5-n3"])
def test_dproj_only_writes_dproj_alone(T, n):
    """DPROJ_ONLY (the first run of mhc_post_pre's two): dproj as with dpre = 0 (its pre columns 0), dpre not read
    (None), dr / hpre_t / p_db left as they were (NaN)."""
    N = n * n + 2 * n
    NPAD, TT = max(16, next_pow2(N)), 128
    ins = _inputs(T, n, F32)
    outs = _outs(T, n, NPAD, NPAD, TT)
    R.run_rest(None, *ins[1:6], *outs, *ALPHA, n, next_pow2(n), NPAD, TT, dproj_only=True)
    torch.cuda.synchronize()
    want = _want(torch.zeros_like(ins[0]), *ins[1:], TT, NPAD)[0]
    assert torch.equal(outs[0][:, :n], torch.zeros_like(outs[0][:, :n]))
    assert torch.equal(outs[0][:, N:], torch.zeros_like(outs[0][:, N:]))
    assert_close(outs[0][:, :N], want, kind=F32, what="dproj0")
    for name, o in zip(("dr", "hpre_t", "p_db"), outs[1:]):
        assert torch.isnan(o).all(), f"{name} written"


@on_gpu
def test_equals_cutile_rest_and_is_deterministic():
    """The cuTile kernel it replaces (cutile_pre.mhc_pre_bwd_rest, TT_R = 128) on the same inputs: within the fp32
    tolerance (different sum orders and sigmoid codes); two runs of this one bitwise equal."""
    pytest.importorskip("cuda.tile")
    from tilekernels._cutile import Launch, cdiv
    from tilekernels.mhc import cutile_pre as pre

    T, n, NPAD, TT = 1000, 4, 32, 128
    ins = _inputs(T, n, F32)
    ref = _outs(T, n, 24, NPAD, TT)
    Launch(pre.mhc_pre_bwd_rest, (cdiv(T, TT),), (*ins, *ref, *ALPHA, n, 4, NPAD, TT), None).run()
    runs = []
    for _ in range(2):
        outs = _outs(T, n, 24, NPAD, TT)
        _run(ins, outs, n, NPAD, TT)
        runs.append(outs)
    torch.cuda.synchronize()
    for name, a, b, c in zip(("dproj", "dr", "hpre_t", "p_db"), *runs, ref):
        assert torch.equal(a, b), f"{name} differs between runs"
        assert_close(a, c.double(), kind=F32, what=name)
