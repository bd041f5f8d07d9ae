"""The five cuTile mHC ops, fwd+bwd, at the small odd shapes that compute-sanitizer runs
(benchmarks/mhc_gpu_session.sh, parts initcheck and racecheck): n=6 C=96 T=37 and
n=3 C=100 T=5, each checked against the float64 reference. Plus the check that
initcheck cannot make: every dweight partial that mhc_pr_reduce reads is written by
mhc_pr_bwd (its TMA store is invisible to initcheck, so a NaN fill stands in for it).
Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from test_mhc_cutile_gpu import (F32, PRE_PARAMS, _rand, run_h_aggregate, run_h_post_bda, run_pre,
                                 run_proj_rms, run_sinkhorn)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPES = [dict(T=37, n=6, C=96), dict(T=5, n=3, C=100)]
_ID = [f"T{s['T']}-n{s['n']}-C{s['C']}" for s in SHAPES]


@pytest.mark.parametrize("s", SHAPES, ids=_ID)
def test_five_ops_fwd_bwd(s):
    T, n, C = s["T"], s["n"], s["C"]
    run_h_aggregate(dict(s, h=F32, bias=True, act=torch.bfloat16))
    run_h_post_bda(dict(s, h=F32, bias=True, act=torch.bfloat16))
    run_sinkhorn(dict(T=T, n=n, iters=20))
    run_proj_rms(dict(M=T, n=n, C=C))
    run_pre(dict(s, iters=20))


@pytest.mark.parametrize("op", ["proj_rms", "pre"])
@pytest.mark.parametrize("s", SHAPES, ids=_ID)
def test_dweight_partials_fully_written(s, op):
    """p_dw [GM, N, G, Cg] NaN-filled before the bwd: after it no NaN is left, so the reduction
    reads only written partials (and dweight is finite)."""
    from tilekernels.mhc import cutile_pre as pre
    from tilekernels.mhc import cutile_proj_rms as pr

    T, n, C = s["T"], s["n"], s["C"]
    N, K = n * n + 2 * n, n * C
    x, w, r = _rand(T, K), _rand(N, K, scale=0.05), _rand(T, dtype=F32).abs() + 0.5
    dw = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
    if op == "proj_rms":
        ls = pr.bwd_launches(_rand(T, N, dtype=F32), _rand(T, dtype=F32), x, w, r, torch.empty_like(x), dw, 1e-6)
    else:
        grads = (torch.empty(T, n, C, dtype=x.dtype, device="cuda"), dw, torch.empty(N, dtype=F32, device="cuda"))
        ls = pre.bwd_launches(_rand(T, C), _rand(T, n, dtype=F32), _rand(T, n, n, dtype=F32), x.view(T, n, C), w,
                              _rand(N, dtype=F32), _rand(T, N, dtype=F32), r, *grads, *PRE_PARAMS.values(),
                              20, 1e-6, 1e-6)
    p_dw = next(ln for ln in ls if ln.kernel._pyfunc.__name__ == "mhc_pr_bwd").args[6]
    p_dw.fill_(float("nan"))
    for ln in ls:
        ln.run()
    torch.cuda.synchronize()
    assert not torch.isnan(p_dw).any(), f"{torch.isnan(p_dw).sum().item()} partials never written"
    assert torch.isfinite(dw.float()).all()
