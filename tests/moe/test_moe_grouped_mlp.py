"""grouped_mlp_mxfp8: forward and backward against a hand-written per-expert float64 loop that
quantizes exactly the operands of TE's MXFP8 recipe; equality with the composition of the three
ops it is defined by; float64 gradcheck with quantization off."""
import pytest
import torch

import registry
from tilekernels.testing import assert_close

OP = registry.get("grouped_mlp_mxfp8")
QUANT = registry.get("mxfp8_quantize")
DEQUANT = registry.get("mxfp8_dequantize")
S = 32  # the fused MLP's glu_interleave_size


def mx(t, axis):
    d, s = QUANT(t.detach().contiguous(), axis=axis)
    return DEQUANT(d, s, axis=axis, out_dtype="float64")


def swiglu32(h, probs):
    """silu(gate) * linear * probs with [gate 32 | linear 32] blocks, by column index."""
    j = torch.arange(h.shape[1])
    gate = (j // S) % 2 == 0
    return torch.nn.functional.silu(h[:, j[gate]]) * h[:, j[~gate]] * probs[:, None]


def groups(m_splits):
    start = 0
    for g, m in enumerate(m_splits):
        yield g, slice(start, start + m)
        start += m


def make(m_splits, H=256, F=256, dtype=torch.bfloat16, grad=False):
    M, G = sum(m_splits), len(m_splits)
    x = torch.randn(M, H).to(dtype)
    probs = torch.rand(M).to(torch.float64 if dtype == torch.float64 else torch.float32)
    w1 = (torch.randn(G, 2 * F, H) / H ** 0.5).to(dtype)
    w2 = (torch.randn(G, H, F) / F ** 0.5).to(dtype)
    ts = [t.requires_grad_(grad) for t in (x, probs, w1, w2)]
    return ts, torch.tensor(m_splits, dtype=torch.int64)


def loop_forward(x, probs, m_splits, w1, w2, quantize=True):
    q = mx if quantize else (lambda t, axis: t.detach().double())
    y = torch.zeros(x.shape, dtype=torch.float64)
    for g, r in groups(m_splits):
        h = q(x[r], "rowwise") @ q(w1[g], "rowwise").t()
        a = swiglu32(h, probs[r].detach().double())
        y[r] = q(a, "rowwise") @ q(w2[g], "rowwise").t()
    return y


def loop_backward(dy, x, probs, m_splits, w1, w2):
    """Per expert: FC2 dgrad/wgrad, dSwiGLU by autograd of the index formula, FC1 dgrad/wgrad."""
    M, H = x.shape
    dx, dp = torch.zeros(M, H, dtype=torch.float64), torch.zeros(M, dtype=torch.float64)
    dw1, dw2 = torch.zeros(w1.shape, dtype=torch.float64), torch.zeros(w2.shape, dtype=torch.float64)
    for g, r in groups(m_splits):
        if r.stop == r.start:
            continue
        h = (mx(x[r], "rowwise") @ mx(w1[g], "rowwise").t()).requires_grad_()
        p = probs[r].detach().double().requires_grad_()
        a = swiglu32(h, p)
        da = mx(dy[r], "rowwise") @ mx(w2[g], "columnwise")
        dw2[g] = mx(dy[r], "columnwise").t() @ mx(a, "columnwise")
        a.backward(da)
        dx[r] = mx(h.grad, "rowwise") @ mx(w1[g], "columnwise")
        dw1[g] = mx(h.grad, "columnwise").t() @ mx(x[r], "columnwise")
        dp[r] = p.grad
    return dx, dp, dw1, dw2


def as_dtype(ts, dtype, grad=False):
    """bf16-valued inputs in ``dtype`` (float64: reference mode, compared at float64 tolerance,
    which tells apart any change in what gets quantized); probs follow (fp32 / float64)."""
    out = []
    for t in ts:
        t = t.detach().to(torch.float64 if dtype == torch.float64 else t.dtype)
        out.append(t.requires_grad_(grad))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("m_splits", [[70, 0, 100, 31], [200], [0, 0]])
def test_forward_matches_loop(m_splits, dtype):
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, dtype)
    y = OP(x, probs, ms, w1, w2)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, loop_forward(x, probs, m_splits, w1, w2), what="y")


def test_quantize_off_matches_unquantized_loop():
    (x, probs, w1, w2), ms = make([50, 0, 46])
    exact = loop_forward(x, probs, [50, 0, 46], w1, w2, quantize=False)
    y = OP(x, probs, ms, w1, w2, quantize=False)
    assert_close(y, exact, what="y (quantize=False)")
    # and MXFP8 is a genuinely different (coarser) result
    err = (OP(x, probs, ms, w1, w2).double() - exact).norm() / exact.norm()
    assert 1e-3 < err < 0.15


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("m_splits", [[64, 0, 96, 32], [0, 128]])
def test_backward_matches_recipe_loop(m_splits, dtype):
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, dtype, grad=True)
    y = OP(x, probs, ms, w1, w2)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dp, dw1, dw2 = loop_backward(dy, x, probs, m_splits, w1, w2)
    assert_close(x.grad, dx, what="dx")
    assert probs.grad.dtype == probs.dtype
    assert_close(probs.grad, dp, what="dprobs")
    assert_close(w1.grad, dw1, what="dfc1")
    assert_close(w2.grad, dw2, what="dfc2")


def test_equals_composition_of_ops_float64():
    """OPS.md: y = grouped_linear(scaled_swiglu(grouped_linear(x, fc1), probs, s=32), fc2), all MXFP8;
    in float64 (no output rounding) the composed ops and the fused op agree, gradients included."""
    GL, SS = registry.get("grouped_linear"), registry.get("scaled_swiglu")
    (x, probs, w1, w2), ms = make([32, 64, 0], dtype=torch.float64, grad=True)
    y = OP(x, probs, ms, w1, w2)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, probs, w1, w2), dy)
    y2 = GL(SS(GL(x, w1, ms, precision="mxfp8"), probs, glu_interleave_size=S), w2, ms, precision="mxfp8")
    grads2 = torch.autograd.grad(y2, (x, probs, w1, w2), dy)
    assert_close(y, y2, what="y")
    for name, a, b in zip(("dx", "dprobs", "dfc1", "dfc2"), grads, grads2):
        assert_close(a, b, what=name)


def test_gradcheck_float64_quantization_off():
    (x, probs, w1, w2), ms = make([3, 0, 4], dtype=torch.float64, grad=True)
    assert torch.autograd.gradcheck(lambda a, p, b, c: OP(a, p, ms, b, c, quantize=False),
                                    (x, probs, w1, w2), fast_mode=True)


def test_reference_autograd_is_the_recipe():
    """tk-bench differentiates the reference by autograd on float64 upcasts: with quantization it
    must give the recipe's straight-through gradients, i.e. the op's."""
    (x, probs, w1, w2), ms = make([32, 0, 64], grad=True)
    y = OP(x, probs, ms, w1, w2)
    dy = torch.randn_like(y)
    y.backward(dy)
    ups = [t.detach().double().requires_grad_() for t in (x, probs, w1, w2)]
    yr = OP.reference(ups[0], ups[1], ms, ups[2], ups[3])
    yr.backward(dy.double())
    assert_close(y, yr.detach(), what="y")
    for name, a, b in zip(("dx", "dprobs", "dfc1", "dfc2"), (x, probs, w1, w2), ups):
        assert_close(a.grad, b.grad, what=name)
