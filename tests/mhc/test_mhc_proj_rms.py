"""mhc_proj_rms: forward vs float64 matmul + norm, gradients through proj and r
(r used or unused), the all-zero-row convention, gradcheck, torch.compile."""
import math

import pytest
import torch

import registry
from mhc_helpers import BF16, F32, F64, grads_vs_float64, rand
from tilekernels.mhc import proj_rms
from tilekernels.mhc import reference as ref
from tilekernels.testing import assert_close, upcast

OP = registry.get("mhc_proj_rms")


def direct64(x, weight, eps=1e-6):
    """Independent formulation: float64 matmul, RMS norm as sqrt(mean(x^2))."""
    x, w = x.double(), weight.double()
    return torch.mm(x, w.t()), 1.0 / ((x * x).mean(dim=-1).sqrt() + eps)


def proj_only64(x, weight, eps=1e-6):
    return direct64(x, weight, eps)[0]


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 24, 33), (5, 8, 64), (0, 24, 16)])
@pytest.mark.parametrize("dt", [BF16, F32])
def test_forward_matches_float64(M, N, K, dt):
    x, w = rand(M, K, dtype=dt), rand(N, K, dtype=dt)
    proj, r = OP(x, w)
    assert proj.dtype == F32 and r.dtype == F32 and proj.shape == (M, N) and r.shape == (M,)
    p64, r64 = direct64(x, w)
    assert_close(proj, p64, what="proj")
    assert_close(r, r64, what="r")


def test_eps_and_float64_mode():
    x, w = rand(4, 10, dtype=F64, scale=1e-3), rand(6, 10, dtype=F64)
    proj, r = OP(x, w, eps=0.5)
    assert proj.dtype == F64 and r.dtype == F64
    assert_close(r, direct64(x, w, 0.5)[1])
    assert (r < 2.0).all()  # bounded by 1/eps


@pytest.mark.parametrize("M,N,K", [(9, 24, 32), (3, 3, 1), (1, 6, 7), (0, 4, 8)])
@pytest.mark.parametrize("dt", [BF16, F32])
def test_grads_match_float64(M, N, K, dt):
    grads_vs_float64(lambda *a, **p: OP(*a, **p), direct64, [rand(M, K, dtype=dt), rand(N, K, dtype=dt)],
                     ["x", "weight"], eps=1e-6)


def test_grads_with_r_unused():
    # autograd hands the backward zeros for the unused r
    grads_vs_float64(lambda *a: OP(*a)[0], proj_only64, [rand(6, 20), rand(5, 20)], ["x", "weight"])


def test_zero_row_gets_no_norm_gradient():
    x, w = rand(3, 8), rand(4, 8)
    x[1] = 0
    dproj, dr = rand(3, 4), rand(3)
    r = 1.0 / (torch.linalg.vector_norm(x, dim=-1) / math.sqrt(8) + 1e-6)
    dx, _ = ref.proj_rms_bwd(dproj, dr, x, w, r)
    assert torch.isfinite(dx).all()
    assert_close(dx[1], dproj[1] @ w, what="dx of the zero row")


@pytest.mark.parametrize("eps", [1e-6, 5e-20, 2.0 ** -126])
@pytest.mark.parametrize("dt", [BF16, F32])
def test_zero_row_with_tiny_eps_stays_finite(dt, eps):
    """The spec allows eps down to 2**-126, so an all-zero row's r = 1/eps reaches ~8.5e37 and r^2 overflows fp32:
    the RMS term must still give that row 0 (it gave NaN when formed as -dr r^2 * 0), and the other rows the float64
    gradient (their r stays small). The torch backend in dt against float64 autograd of the forward."""
    x, w = rand(4, 24, dtype=dt), rand(6, 24, dtype=dt)
    x[2] = 0
    dproj, dr = rand(4, 6), rand(4)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    proj, r = OP(xl, wl, eps=eps, backend="torch")
    dx, dw = torch.autograd.grad((proj, r), (xl, wl), (dproj, dr))
    x64, w64 = upcast(x).requires_grad_(), upcast(w).requires_grad_()
    p64, r64 = ref.proj_rms(x64, w64, eps=eps)
    want_dx, want_dw = torch.autograd.grad((p64, r64), (x64, w64), (dproj.double(), dr.double()))
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()
    assert_close(dx[2], dproj[2].double() @ w.double(), what="dx of the zero row")
    assert_close(dx, want_dx, what="dx")
    assert_close(dw, want_dw, what="dweight")


@pytest.mark.parametrize("case", ["nan x", "nan dr on a zero row"])
def test_nan_rows_stay_nan_in_the_written_out_backward(case):
    """The RMS term must not swallow a NaN (a loss scaler's overflow check reads the gradients): a NaN in
    a row of x, or a NaN dr on an all-zero row, makes that row of dx NaN, as autograd of the forward does,
    and leaves the other rows finite."""
    x, w = rand(3, 8, dtype=F64), rand(4, 8, dtype=F64)
    dproj, dr = rand(3, 4, dtype=F64), rand(3, dtype=F64)
    if case == "nan x":
        x[1, 5] = float("nan")
    else:
        x[1] = 0
        dr[1] = float("nan")
    xl = x.clone().requires_grad_()
    proj, r = ref.proj_rms(xl, w)
    want, = torch.autograd.grad((proj, r), xl, (dproj, dr))
    got, _ = ref.proj_rms_bwd(dproj, dr, x, w, r.detach())
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[1]).all()
    assert torch.isfinite(got[[0, 2]]).all()


def test_gradcheck_float64():
    x = rand(4, 6, dtype=F64).requires_grad_()
    w = rand(5, 6, dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: OP(a, b, eps=0.1), (x, w))


def test_torch_compile_fullgraph():
    x, w = rand(6, 32).requires_grad_(), rand(24, 32).requires_grad_()
    f = torch.compile(proj_rms, fullgraph=True, backend="aot_eager")
    proj, r = f(x, w, eps=1e-6)
    assert_close(proj, direct64(x.detach(), w.detach())[0])
    gp, gr = rand(6, 24), rand(6)
    torch.autograd.backward((proj, r), (gp, gr))
    dx, dw = ref.proj_rms_bwd(upcast(gp), upcast(gr), upcast(x), upcast(w), upcast(r))
    assert_close(x.grad, dx, what="dx")
    assert_close(w.grad, dw, what="dweight")
