"""mhc_pre's cute backend (tilekernels/mhc/cute_pre.py): cuTile's forward and dh_pre pass, the split mix's CuTe DSL
kernels and cute_proj_rms's dx pass with the aggregate term.

CPU (CI): the backward's steps in order on meta tensors (the CuTe DSL Sinkhorn backward, cuTile's dh_pre pass, the
CuTe DSL rest, the dx pass, cuTile's dbias reduction: every scratch written before it is read); the spec's limits
say why the backend is refused. GPU (marked ``gpu``): every output and gradient against the float64 reference
through test_mhc_cutile_gpu's runner (NaN-poisoned outputs, fresh random inputs; tolerances by dtype), n = 1..4, C
a multiple of 128 or not, T = 0, 1, odd, many tiles; the registry picks cute for bf16 on sm_90; two backward calls
are bitwise equal. The kernels' own files test them alone (test_mhc_cute_sk_bwd, test_mhc_cute_pre_rest,
test_mhc_cute_proj_rms's AGG cases).
"""
from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("cutlass")
pytest.importorskip("cuda.tile")

import registry  # noqa: E402
from tilekernels._cutile import Launch  # noqa: E402
from tilekernels.mhc import cute_pre as CPre  # noqa: E402
from tilekernels.mhc import cute_pre_rest as CR  # noqa: E402
from tilekernels.mhc import cute_proj_rms as cpr  # noqa: E402
from tilekernels.mhc import cute_sk_bwd as CS  # noqa: E402
from tilekernels.mhc import cutile_aggregate as agg  # noqa: E402
from tilekernels.mhc import cutile_pre as pre  # noqa: E402

from mhc_helpers import gpu_cases, on_gpu  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
PARAMS = (0.7, 1.3, 0.4, 20, 1e-6, 1e-6)


def _meta_args(T, n, C, iters=PARAMS[3]):
    e = functools.partial(torch.empty, device="meta")
    N = n * n + 2 * n
    x, w, b = e(T, n, C, dtype=BF), e(N, n * C, dtype=BF), e(N, dtype=F32)
    return (e(T, C, dtype=BF), e(T, n, dtype=F32), e(T, n, n, dtype=F32), x, w, b, e(T, N, dtype=F32),
            e(T, dtype=F32), e(T, n, C, dtype=BF), e(N, n * C, dtype=BF), e(N, dtype=F32), *PARAMS[:3], iters,
            *PARAMS[4:])


@pytest.mark.parametrize("n", [1, 3, 4])
def test_bwd_steps_in_order(n):
    steps = CPre.bwd_steps(*_meta_args(1000, n, 256))
    kinds = [s.kernel if isinstance(s, Launch) else s.func for s in steps]
    assert kinds == [CS.run_sk, agg.mhc_agg_bwd, CR.run_rest, cpr.bwd_agg_into, pre.mhc_pre_dbias], kinds
    sk, dhp, rest, dxw, dbias = steps
    dpre, dproj, dr, hpre_t, p_db = rest.args[0], rest.args[6], rest.args[7], rest.args[8], rest.args[9]
    assert dhp.args[4] is dpre                                               # dh_pre: the pass's, the rest's input
    assert rest.args[5] is sk.args[4]                                        # the res logits' gradient
    assert dxw.args[0] is dproj and dxw.args[1] is dr and dxw.args[6] is hpre_t   # the dx pass reads the rest's
    assert dbias.args[0] is p_db


@pytest.mark.parametrize("flag", ["CUTE_SK", "CUTE_REST"])
def test_bwd_steps_with_a_mix_switch_off(flag, monkeypatch):
    """cute_post_pre's switches apply here too: off, the step is cuTile's Launch record with the same arguments."""
    from tilekernels.mhc import cute_post_pre as CP

    on = CPre.bwd_steps(*_meta_args(300, 4, 256))
    monkeypatch.setattr(CP, flag, False)
    off = CPre.bwd_steps(*_meta_args(300, 4, 256))
    i, kernel = (0, pre.mhc_pre_bwd_sk) if flag == "CUTE_SK" else (2, pre.mhc_pre_bwd_rest)
    assert isinstance(off[i], Launch) and off[i].kernel is kernel
    def sig(args):
        return [(tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]

    assert sig(off[i].args) == sig(on[i].args)
    assert all(type(a) is type(b) for a, b in zip(off[:i] + off[i + 1:], on[:i] + on[i + 1:]))


@pytest.mark.parametrize("n,iters,cute", [(4, 40, True), (4, 41, False), (4, 64, False), (3, 56, True),
                                          (3, 57, False), (2, 64, True), (1, 64, True)])
def test_many_iters_keep_the_cutile_sinkhorn_backward(n, iters, cute):
    """The CuTe DSL Sinkhorn backward keeps every step's sums in shared memory: past 48 KB (n = 4 from 41 iters,
    n = 3 from 57; mhc_pre allows 64) the step stays cuTile's kernel, whose sums go to a global scratch. Before,
    the backward raised there, after its forward had run."""
    sk = CPre.bwd_steps(*_meta_args(300, n, 256, iters))[0]
    if cute:
        assert sk.func is CS.run_sk and CS.serves(n, sk.args[11], iters)
    else:
        assert isinstance(sk, Launch) and sk.kernel is pre.mhc_pre_bwd_sk and sk.args[14] == iters
        assert not CS.serves(n, sk.args[11], iters)
        with pytest.raises(ValueError, match="48 KB"):
            CS.SkBwdCuteCfg(n=n, NP=sk.args[11], ITERS=iters)


def test_limits_are_explained():
    op = registry.get("mhc_pre")

    def why(T, n, C, dt=BF):
        N = n * n + 2 * n
        x, w, b = torch.randn(T, n, C).to(dt), torch.randn(N, n * C).to(dt), torch.randn(N)
        rows = {name: (ok, w_) for name, ok, w_ in op.explain(x, w, b)}
        assert not rows["cute"][0]
        return rows["cute"][1]

    assert "n <= 4" in why(3, 5, 64)
    assert "C % 8 == 0" in why(3, 4, 100)
    assert "got float32" in why(3, 4, 64, F32)
    assert "needs a CUDA device" in why(3, 4, 64)


# ------------------------------------------------------------------ GPU

CASES = [dict(T=T, n=n, C=C, iters=it) for T, n, C, it in [
    (1000, 4, 2560, 20), (1, 4, 7168, 20), (3, 4, 64, 3), (1000, 1, 64, 20), (1000, 2, 4096, 20), (1000, 3, 2560, 3),
    (37, 3, 200, 20), (130, 2, 136, 20), (129, 4, 1000, 20), (0, 4, 256, 20), (4099, 4, 7168, 20),
    (32768, 4, 7168, 20), (129, 4, 256, 41), (37, 3, 200, 64)]]   # the last two: cuTile's Sinkhorn backward


@on_gpu
@pytest.mark.parametrize("c", gpu_cases(CASES))
def test_matches_float64(c):
    from test_mhc_cutile_gpu import run_pre

    run_pre(c, backend="cute")


@on_gpu
def test_registry_picks_cute_and_backward_is_deterministic():
    op = registry.get("mhc_pre")
    T, n, C = 700, 4, 7168
    N = n * n + 2 * n
    x = torch.randn(T, n, C, device="cuda").to(BF)
    w = (torch.randn(N, n * C, device="cuda") * (n * C) ** -0.5).to(BF)
    b = torch.randn(N, device="cuda")
    assert op.choose(op.bind(x, w, b)) == "cute"
    cots = [torch.randn(T, C, device="cuda").to(BF), torch.randn(T, n, device="cuda"),
            torch.randn(T, n, n, device="cuda")]
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        torch.autograd.backward(op(*leaves), cots)
        runs.append([t.grad for t in leaves])
    for a, b_ in zip(*runs):
        assert torch.equal(a, b_)
