"""cute_sk_bwd: the CuTe DSL kernel for the Sinkhorn backward of mhc_pre's split backward mix (mhc_post_pre's cute
backend runs it). CPU: it compiles for sm_90a and sm_100a without spills, two barriers; its config limits. GPU:
dlres against the float64 reference's Sinkhorn backward of the res logits (recomputed from proj, r, bias) on fresh
random inputs (outputs NaN-poisoned first), at token counts on both sides of the 32-token CTA (0, 1, 31, 32, 33,
1000), n = 1..4, dh_res fp32 and bf16, 0 / 1 / 20 steps, approximate and IEEE reciprocals, the padded entries 0; the
cuTile kernel it stands in for agrees; two runs bitwise equal. The whole op with it (and without it, CUTE_SK off):
test_mhc_cute_post_pre.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels._cute import no_spill_kernel  # noqa: E402
from tilekernels._glue import next_pow2  # noqa: E402
from tilekernels.mhc import cute_sk_bwd as K  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

from mhc_helpers import BF16, F32, F64, on_gpu  # noqa: E402

A_RES, SK_EPS = 0.45, 1e-6


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_compiles_without_spills(n, arch):
    launches = {**K.representative_launches(n), "sk_iters0": K.launch(K.SkBwdCuteCfg(n, next_pow2(n), 0), torch.float32)}
    for name, ln in launches.items():
        art = ln.export(arch)
        no_spill_kernel(art.cubin, name, "kernel")
        # barriers: after the rows are staged in, before dlres is staged out
        assert art.ptx.count("bar.sync") == 2, name
        assert ("rcp.approx" in art.ptx) == (ln.cfg.APPROX and ln.cfg.ITERS > 0), name


def test_config_limits():
    K.SkBwdCuteCfg(4, 4, 20)
    K.SkBwdCuteCfg(3, 4, 0, APPROX=False, TT=64, NT=64)
    assert K.SkBwdCuteCfg(4, 4, 20).smem_bytes == 32 * (25 + 17 + 17) * 4 + 20 * 8 * 32 * 4
    for bad in (dict(n=4, NP=2, ITERS=20), dict(n=4, NP=4, ITERS=-1), dict(n=4, NP=4, ITERS=20, TT=48),
                dict(n=4, NP=4, ITERS=20, NT=2048), dict(n=4, NP=4, ITERS=20, TT=64, NT=96),
                dict(n=4, NP=4, ITERS=60)):   # 60 steps' sums: 61 KB of shared memory
        with pytest.raises(ValueError, match="SkBwdCuteCfg"):
            K.SkBwdCuteCfg(**bad)


def _inputs(T: int, n: int, hdt):
    """(proj [T, N], r [T], bias [N], dh_res [T, n, n]): fresh random, logits of unit scale."""
    N = n * n + 2 * n
    return (torch.randn(T, N, device="cuda"), torch.rand(T, device="cuda") + 0.5, torch.randn(N, device="cuda") * 0.5,
            torch.randn(T, n, n, device="cuda").to(hdt))


def _want(proj, r, bias, dh_res, iters: int):
    """float64 dlogits of the Sinkhorn of the res logits r proj a_res + bias."""
    T, n = dh_res.shape[:2]
    lg = r.to(F64)[:, None] * proj.to(F64)[:, 2 * n:] * A_RES + bias.to(F64)[2 * n:]
    return ref.sinkhorn_bwd(dh_res.to(F64), lg.view(T, n, n), iters, SK_EPS)


def _run(ins, dlres, iters: int, approx: bool = True):
    proj, r, bias, dh_res = ins
    n = dh_res.shape[1]
    K.run_sk(proj, r, bias, dh_res, dlres, None, 0.7, 1.3, A_RES, SK_EPS, n, next_pow2(n), 0, 0, iters, approx, 0)


CASES = [(1, 4), (31, 4), (32, 4), (33, 4), (1000, 4), (333, 3), (130, 2), (37, 1), (0, 4)]


@on_gpu
@pytest.mark.parametrize("iters,approx", [(20, True), (20, False), (1, True), (0, True)],
                         ids=["it20", "it20-ieee", "it1", "it0"])
@pytest.mark.parametrize("hdt", [F32, BF16], ids=["dhres_f32", "dhres_bf16"])
@pytest.mark.parametrize("T,n", CASES, ids=[f"T{t}-n{n}" for t, n in CASES])
def test_matches_float64(T, n, hdt, iters, approx):
    """fp32 dlres: 2 * iters normalisation steps forward and back (sums of n terms, approximate (2 ulp) or IEEE
    reciprocals) and exp: within the fp32 tolerance (1e-5) of float64 (the cuTile kernel's walk, measured at ~3e-7 on
    its CPU simulation)."""
    ins = _inputs(T, n, hdt)
    NP = next_pow2(n)
    dlres = torch.full((T, NP, NP), float("nan"), device="cuda")
    _run(ins, dlres, iters, approx)
    torch.cuda.synchronize()
    assert not torch.isnan(dlres).any(), f"{torch.isnan(dlres).sum().item()} elements not written"
    assert_close(dlres[:, :n, :n], _want(*ins, iters), kind=F32, what="dlres")
    pad = torch.ones(NP, NP, dtype=torch.bool, device="cuda")
    pad[:n, :n] = False
    assert torch.equal(dlres[:, pad], torch.zeros_like(dlres[:, pad])), "padded entries not 0"


@on_gpu
def test_equals_cutile_sk_and_is_deterministic():
    """The cuTile kernel it replaces (cutile_pre.mhc_pre_bwd_sk, its global scratch) on the same inputs: within fp32's
    tolerance (other exp and reciprocal codes); two runs of this one bitwise equal."""
    pytest.importorskip("cuda.tile")
    from tilekernels._cutile import Launch, cdiv
    from tilekernels.mhc import cutile_pre as pre

    T, n, iters, TT = 1000, 4, 20, 128
    ins = _inputs(T, n, F32)
    want = torch.full((T, 4, 4), float("nan"), device="cuda")
    scratch = torch.empty((iters, 2 * n, T), device="cuda")
    Launch(pre.mhc_pre_bwd_sk, (cdiv(T, TT),), (*ins, want, scratch, 0.7, 1.3, A_RES, SK_EPS, n, 4, 32, TT, iters, 1,
                                               1), None).run()
    runs = []
    for _ in range(2):
        out = torch.full((T, 4, 4), float("nan"), device="cuda")
        _run(ins, out, iters)
        runs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(runs[0], runs[1]), "two runs differ"
    assert_close(runs[0][:, :n, :n], want[:, :n, :n], kind=F32, what="dlres")
