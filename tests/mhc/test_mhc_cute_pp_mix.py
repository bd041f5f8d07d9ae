"""cute_pp_mix: the CuTe DSL kernel for mhc_post_pre's forward epilogue (the projection planes summed, then mhc_pre's
r, h_pre, h_post and Sinkhorn h_res; mhc_post_pre's cute forward runs it). CPU: it compiles for sm_90a and sm_100a
without spills, with 16-byte plane loads and two barriers; its config limits. GPU: every output against the module
docstring's formulas in float64 on fresh random inputs (outputs NaN-poisoned first), at token counts on both sides of
the 128-token CTA (0, 1, 127, 128, 129, 1000), n = 1..4, 1 / 3 / 8 planes, 0 / 1 / 20 Sinkhorn iterations, approximate
and IEEE reciprocals; proj bitwise the planes summed in order; the cuTile kernel it stands in for agrees; two runs
bitwise equal. The whole op with it (and without it, CUTE_MIX off): test_mhc_cute_post_pre.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels._cute import no_spill_kernel  # noqa: E402
from tilekernels._glue import next_pow2  # noqa: E402
from tilekernels.mhc import cute_pp_mix as M  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

from mhc_helpers import F32, F64, on_gpu  # noqa: E402

ALPHA = (0.7, 1.3, 0.45)   # a_pre, a_post, a_res: distinct, so a column in the wrong section shows
RMS_EPS, SK_EPS = 1e-6, 1e-6


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_compiles_without_spills(n, arch):
    for name, ln in M.representative_launches(n).items():
        art = ln.export(arch)
        no_spill_kernel(art.cubin, name, "kernel")
        # barriers: after the planes' sums are staged in, after the outputs are staged
        assert art.ptx.count("bar.sync") == 2, name
        cfg = ln.cfg
        assert art.ptx.count("ld.global.v4.b32") == cfg.SPLIT * cfg.TT * cfg.Q // cfg.NT, name   # 16-byte plane loads
        assert ("rcp.approx" in art.ptx) == cfg.APPROX, name


def test_config_limits():
    M.PpMixCuteCfg(4, 32, 8, 20)
    M.PpMixCuteCfg(1, 16, 1, 0, APPROX=False, TT=32, NT=128)
    assert M.PpMixCuteCfg(4, 32, 8, 20).smem_bytes == 128 * 33 * 4 + 128 * 25 * 4
    for bad in (dict(n=4, NPAD=16, SPLIT=8, ITERS=20), dict(n=4, NPAD=26, SPLIT=8, ITERS=20),
                dict(n=4, NPAD=32, SPLIT=0, ITERS=20), dict(n=4, NPAD=32, SPLIT=8, ITERS=-1),
                dict(n=4, NPAD=32, SPLIT=8, ITERS=20, TT=100), dict(n=4, NPAD=32, SPLIT=8, ITERS=20, TT=2048),
                dict(n=4, NPAD=32, SPLIT=8, ITERS=20, TT=256),
                dict(n=4, NPAD=32, SPLIT=8, ITERS=20, NT=96), dict(n=4, NPAD=32, SPLIT=8, ITERS=20, TT=64, NT=1024)):
        with pytest.raises(ValueError, match="PpMixCuteCfg"):
            M.PpMixCuteCfg(**bad)


def _inputs(T: int, n: int, S: int, C: int = 7168):
    """(p_proj [S, T, NPAD], p_ss [S, T], hbias [N], kf): fresh random; the squares' planes positive, of the size
    n*C squares of unit-scale values give (so r is near 1); the padded columns random too (never used)."""
    N = n * n + 2 * n
    npad = max(16, next_pow2(N))
    kf = float(n * C)
    return (torch.randn(S, T, npad, device="cuda"), torch.rand(S, T, device="cuda") * (2 * kf / S) + 0.1,
            torch.randn(N, device="cuda") * 0.5, kf)


def _want(p_proj, p_ss, hbias, kf, n: int, iters: int):
    """float64 (proj, r, h_pre, h_post, h_res) from the module docstring's formulas."""
    N = n * n + 2 * n
    T = p_proj.shape[1]
    proj = p_proj.to(F64).sum(0)[:, :N]
    r = 1.0 / (torch.sqrt(p_ss.to(F64).sum(0) / kf) + RMS_EPS)
    al = torch.tensor([ALPHA[0]] * n + [ALPHA[1]] * n + [ALPHA[2]] * (n * n), dtype=F64, device=proj.device)
    h = r[:, None] * proj * al + hbias.to(F64)
    sg = torch.sigmoid(h[:, :2 * n])
    return proj, r, sg[:, :n], 2 * sg[:, n:], ref.sinkhorn(h[:, 2 * n:].reshape(T, n, n), iters, SK_EPS)


def _outs(T: int, n: int):
    nan = lambda *s: torch.full(s, float("nan"), device="cuda")   # noqa: E731
    return nan(T, n * n + 2 * n), nan(T), nan(T, n), nan(T, n), nan(T, n, n)


def _run(ins, outs, iters: int, approx: bool = True):
    p_proj, p_ss, hbias, kf = ins
    M.run_mix(p_proj, p_ss, hbias, *outs, kf, RMS_EPS, *ALPHA, SK_EPS, iters, approx)


CASES = [(1, 4, 8), (127, 4, 8), (128, 4, 8), (129, 4, 8), (1000, 4, 8), (333, 3, 8), (130, 2, 3), (37, 1, 1),
         (0, 4, 8)]


@on_gpu
@pytest.mark.parametrize("iters,approx", [(20, True), (20, False), (1, True), (0, True)],
                         ids=["it20", "it20-ieee", "it1", "it0"])
@pytest.mark.parametrize("T,n,S", CASES, ids=[f"T{t}-n{n}-S{s}" for t, n, s in CASES])
def test_matches_float64(T, n, S, iters, approx):
    """fp32 outputs: planes summed in fp32 (8 terms), a square root and a divide for r, the sigmoid's exp and
    reciprocal, Sinkhorn's exp and 2 * iters normalisations with approximate (2 ulp) or IEEE reciprocals: all within
    the fp32 tolerance (1e-5) of float64. proj is bitwise the planes added in order in fp32."""
    ins = _inputs(T, n, S)
    outs = _outs(T, n)
    _run(ins, outs, iters, approx)
    torch.cuda.synchronize()
    names = ("proj", "r", "h_pre", "h_post", "h_res")
    for name, got, want in zip(names, outs, _want(*ins, n, iters)):
        assert not torch.isnan(got).any(), f"{name}: {torch.isnan(got).sum().item()} elements not written"
        assert_close(got, want, kind=F32, what=name)
    seq = ins[0][0]
    for s in range(1, S):
        seq = seq + ins[0][s]
    assert torch.equal(outs[0], seq[:, :n * n + 2 * n]), "proj is not the planes summed in order"


@on_gpu
def test_equals_cutile_mix_and_is_deterministic():
    """The cuTile kernel it replaces (cutile_post_pre.mhc_pp_mix, 64 tokens a block) on the same inputs: proj bitwise
    (the same adds in the same order), the rest within fp32's tolerance (their exp, sqrt and divides are other
    codes); two runs of this one bitwise equal."""
    pytest.importorskip("cuda.tile")
    from tilekernels._cutile import Launch, cdiv
    from tilekernels.mhc import cutile_post_pre as pp

    T, n, S, iters = 1000, 4, 8, 20
    ins = _inputs(T, n, S)
    p_proj, p_ss, hbias, kf = ins
    want = _outs(T, n)
    Launch(pp.mhc_pp_mix, (cdiv(T, 64),), (p_proj, p_ss, hbias, *want, kf, RMS_EPS, *ALPHA, SK_EPS, n, 4, 32, 64, S,
                                           iters, 1, False), None).run()
    runs = []
    for _ in range(2):
        outs = _outs(T, n)
        _run(ins, outs, iters)
        runs.append(outs)
    torch.cuda.synchronize()
    assert torch.equal(runs[0][0], want[0]), "proj differs from the cuTile kernel's"
    for name, a, b, w in zip(("proj", "r", "h_pre", "h_post", "h_res"), *runs, want):
        assert torch.equal(a, b), f"{name}: two runs differ"
        assert_close(a, w, kind=F32, what=name)
