"""mhc_sinkhorn: forward vs a plain float64 loop, doubly-stochastic sums, exact
gradients (explicit formula vs autograd, gradcheck), torch.compile."""
import pytest
import torch

import registry
from mhc_helpers import F32, F64, grads_vs_float64, loop64, rand
from tilekernels.mhc import reference as ref
from tilekernels.mhc import sinkhorn
from tilekernels.testing import assert_close, tolerance, upcast

OP = registry.get("mhc_sinkhorn")




@pytest.mark.parametrize("T,n", [(1, 1), (5, 2), (3, 4), (7, 8), (0, 4)])
@pytest.mark.parametrize("iters", [1, 20])
def test_forward_matches_loop(T, n, iters):
    logits = rand(T, n, n, scale=2.0)
    out = OP(logits, iters=iters)
    assert out.dtype == F32 and out.shape == (T, n, n)
    assert_close(out, loop64(logits, iters), what="H_res")


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_doubly_stochastic(n):
    out = OP(rand(9, n, n), iters=100).double()
    # after the final column step every column sums to c / (c + eps) = 1 - O(eps) plus fp32 rounding: the table's
    # fp32 entry; rows converge, which is no rounding bound but the algorithm's (100 rounds: worst row error over
    # 1e6 random n=2 draws ~6e-4), so 1e-3 here
    assert (out.sum(dim=-2) - 1).abs().max() < tolerance("float32")
    assert (out.sum(dim=-1) - 1).abs().max() < 1e-3
    assert (out >= 0).all()


def test_float64_mode_and_eps():
    logits = rand(4, 3, 3, dtype=F64)
    out = OP(logits, iters=5, eps=0.1)
    assert out.dtype == F64
    assert_close(out, loop64(logits, 5, 0.1))
    # eps matters: a large eps keeps column sums visibly below 1
    assert (out.sum(dim=-2) < 0.99).all()


@pytest.mark.parametrize("T,n", [(6, 4), (3, 8), (2, 1), (0, 2)])
def test_grad_matches_float64_autograd(T, n):
    grads_vs_float64(lambda x, **p: OP(x, **p), lambda x, **p: loop64(x, **p), [rand(T, n, n)], ["logits"],
                     iters=20, eps=1e-6)


@pytest.mark.parametrize("eps", [1e-6, 0.3])
def test_explicit_bwd_equals_autograd_float64(eps):
    # a large eps makes the row-max term of the exact gradient visible (it is O(eps))
    logits = rand(5, 4, 4, dtype=F64, scale=3.0).requires_grad_()
    g = rand(5, 4, 4, dtype=F64)
    (expect,) = torch.autograd.grad(ref.sinkhorn(logits, 7, eps), logits, g)
    got = ref.sinkhorn_bwd(g, logits.detach(), 7, eps)
    assert_close(got, expect)


@pytest.mark.parametrize("iters,eps", [(20, 1e-6), (3, 0.2)])
def test_gradcheck_float64(iters, eps):
    logits = rand(3, 3, 3, dtype=F64, scale=2.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: OP(x, iters=iters, eps=eps), (logits,))


def test_torch_compile_fullgraph():
    logits = rand(6, 4, 4).requires_grad_()
    f = torch.compile(sinkhorn, fullgraph=True, backend="aot_eager")
    y = f(logits, iters=10, eps=1e-6)
    assert_close(y, loop64(logits.detach(), 10))
    g = rand(6, 4, 4)
    y.backward(g)
    expect = ref.sinkhorn_bwd(upcast(g), upcast(logits), 10, 1e-6)
    assert_close(logits.grad, expect, what="dlogits")


def test_float64_grad_is_float64():
    """float64 logits (reference mode): dlogits through the op must be float64-accurate (table: float64 1e-12, the
    same math as autograd through the loop, summation order aside). gradcheck's tolerances (1e-3 relative) let a
    backward that returned fp32 into the float64 gradient pass every other test."""
    logits = rand(6, 4, 4, dtype=F64, scale=2.0)
    grads_vs_float64(lambda x, **p: OP(x, **p), lambda x, **p: loop64(x, **p), [logits], ["logits"],
                     iters=20, eps=1e-6)
