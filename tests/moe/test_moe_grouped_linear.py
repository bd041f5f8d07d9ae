"""grouped_linear: equals a loop of dense float64 matmuls (bf16 and MXFP8 operands), the MXFP8
backward equals a hand-written per-expert implementation of TE's recipe, gradcheck, compile."""
import pytest
import torch

import registry
from tilekernels.testing import assert_close, rel_err

OP = registry.get("grouped_linear")
QUANT = registry.get("mxfp8_quantize")
DEQUANT = registry.get("mxfp8_dequantize")


def mx(t: torch.Tensor, axis: str) -> torch.Tensor:
    """float64 value of t's MXFP8 quantization (through the tested quantize/dequantize ops)."""
    d, s = QUANT(t.contiguous(), axis=axis)
    return DEQUANT(d, s, axis=axis, out_dtype="float64")


def groups(m_splits):
    start = 0
    for g, m in enumerate(m_splits):
        yield g, slice(start, start + m)
        start += m


def loop_fwd(x, w, m_splits, precision):
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64)
    for g, r in groups(m_splits):
        if precision == "mxfp8":
            # quantize this expert's own rows and weight (blocks along K)
            y[r] = mx(x[r], "rowwise") @ mx(w[g], "rowwise").t()
        else:
            y[r] = x[r].double() @ w[g].double().t()
    return y


def inputs(M, K, N, m_splits, dtype=torch.bfloat16, grad=False):
    G = len(m_splits)
    x = torch.randn(M, K).to(dtype).requires_grad_(grad)
    w = (torch.randn(G, N, K) / K ** 0.5).to(dtype).requires_grad_(grad)
    return x, w, torch.tensor(m_splits, dtype=torch.int64)


SPLITS = [
    [37, 0, 100, 63],     # zeros, odd sizes (forward only: no % 32 needed)
    [200],                # one expert
    [0, 200, 0],          # all tokens in one expert among empties
    [1, 1, 198],
    [0, 0],               # M = 0
]


@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
@pytest.mark.parametrize("m_splits", SPLITS)
def test_forward_matches_dense_loop(precision, m_splits):
    M = sum(m_splits)
    x, w, ms = inputs(M, 96, 160, m_splits)
    y = OP(x, w, ms, precision=precision)
    assert y.dtype == torch.bfloat16 and y.shape == (M, 160)
    assert_close(y, loop_fwd(x, w, m_splits, precision), what=f"y ({precision})")


def test_mxfp8_differs_from_bf16():
    """The MXFP8 path really quantizes: its error vs the unquantized product is e4m3-sized."""
    x, w, ms = inputs(64, 128, 64, [32, 32])
    exact = loop_fwd(x, w, [32, 32], "bf16")
    err = (OP(x, w, ms, precision="mxfp8").double() - exact).norm() / exact.norm()
    assert 1e-3 < err < 0.1


def test_fp32_and_float64_inputs():
    x, w, ms = inputs(70, 64, 33, [20, 50], dtype=torch.float32)
    y = OP(x, w, ms)
    assert y.dtype == torch.float32
    assert_close(y, loop_fwd(x, w, [20, 50], "bf16"))
    y64 = OP(x.double(), w.double(), ms, precision="mxfp8")
    assert y64.dtype == torch.float64
    assert_close(y64, loop_fwd(x, w, [20, 50], "mxfp8"), kind="float64")  # only summation order differs


@pytest.mark.parametrize("m_splits", [[30, 0, 47, 3], [0, 80]])
def test_bf16_backward_matches_loop_autograd(m_splits):
    M = sum(m_splits)
    x, w, ms = inputs(M, 48, 40, m_splits, grad=True)
    y = OP(x, w, ms)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    loop_fwd(x64, w64, m_splits, "bf16").backward(dy.double())
    assert_close(x.grad, x64.grad, what="dx")
    assert_close(w.grad, w64.grad, what="dweight")   # includes exact zeros for empty experts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("m_splits", [[64, 0, 96, 32], [0, 0, 128], [32]])
def test_mxfp8_backward_matches_recipe(m_splits, dtype):
    """dX_g = Q_row(dY_g) . Q_col(W_g) (blocks along N); dW_g = Q_col(dY_g)^T . Q_col(X_g) (blocks
    along the expert's tokens), straight-through; written per expert with per-expert quantization.
    float64 (bf16 values, reference mode) compares at float64 tolerance, so quantizing any operand
    along the wrong dim fails even where the bf16 tolerance could not tell. Rows of x / dy and
    columns of w get different magnitudes, so rowwise and columnwise blocks differ."""
    M, K, N = sum(m_splits), 96, 64
    x, w, ms = inputs(M, K, N, m_splits)
    x = (x.double() * torch.exp2(torch.randint(-4, 5, (M, 1)).double())).to(torch.bfloat16).to(dtype)
    w = (w.double() * torch.exp2(torch.randint(-4, 5, (1, 1, K)).double())).to(torch.bfloat16).to(dtype)
    x.requires_grad_()
    w.requires_grad_()
    y = OP(x, w, ms, precision="mxfp8")
    dy = torch.randn_like(y) * torch.exp2(torch.randint(-4, 5, (M, 1))).to(dtype)
    y.backward(dy)
    dx, dw = recipe_grads(x, w, dy, m_splits)
    assert_close(x.grad, dx, what="dx")
    assert_close(w.grad, dw, what="dweight")
    # and the recipe is not the unquantized gradient (e4m3's 3 mantissa bits: ~3e-2 norm-wise)
    plain = torch.zeros(M, K, dtype=torch.float64)
    for g, r in groups(m_splits):
        plain[r] = dy[r].double() @ w[g].detach().double()
    assert M == 0 or rel_err(x.grad, plain) > 3e-3


def recipe_grads(x, w, dy, m_splits):
    """(dx, dw) in float64 by the MXFP8 recipe, written per expert with per-expert quantization."""
    M, K = x.shape
    dx = torch.zeros(M, K, dtype=torch.float64)
    dw = torch.zeros(w.shape, dtype=torch.float64)
    for g, r in groups(m_splits):
        if r.stop == r.start:
            continue
        dx[r] = mx(dy[r], "rowwise") @ mx(w[g].detach(), "columnwise")
        dw[g] = mx(dy[r], "columnwise").t() @ mx(x[r].detach(), "columnwise")
    return dx, dw


def test_gradcheck_float64():
    x, w, ms = inputs(7, 5, 3, [3, 0, 4], dtype=torch.float64, grad=True)
    assert torch.autograd.gradcheck(lambda a, b: OP(a, b, ms), (x, w))


def test_torch_compile_fullgraph():
    from tilekernels.moe import grouped_linear

    x, w, ms = inputs(64, 64, 32, [32, 0, 32], grad=True)
    f = torch.compile(grouped_linear, fullgraph=True, backend="aot_eager")
    y = f(x, w, ms, precision="mxfp8")
    assert_close(y, loop_fwd(x, w, [32, 0, 32], "mxfp8"))
    dy = torch.randn_like(y)
    y.backward(dy)
    xe, we = (t.detach().clone().requires_grad_() for t in (x, w))
    grouped_linear(xe, we, ms, precision="mxfp8").backward(dy)
    assert_close(x.grad, xe.grad, "exact", what="dx (compiled vs eager: the same kernels)")
    assert_close(w.grad, we.grad, "exact", what="dweight (compiled vs eager)")


@pytest.mark.parametrize("op", ["grouped_linear", "grouped_mlp_mxfp8"])
def test_torch_compile_fullgraph_with_list_splits(op):
    """m_splits as a list of ints (as Transformer Engine's GroupedLinear takes it) under fullgraph: after dynamo's
    first recompile the ints are SymInts, which the list-to-tensor step traced through hasattr (unsupported: every
    new list failed); now 4 calls with 3 distinct lists give 2 graphs and eager's results."""
    from torch._dynamo.utils import counters

    import registry

    f_op = registry.get(op)
    H, G = 256, 2
    x = torch.randn(64, H, dtype=torch.bfloat16)
    if op == "grouped_linear":
        args = (torch.randn(G, 32, H, dtype=torch.bfloat16),)

        def call(x, ms):
            return f_op(x, *args, ms, precision="mxfp8")
    else:
        probs = torch.rand(64, dtype=torch.float32)
        args = (torch.randn(G, 512, H, dtype=torch.bfloat16), torch.randn(G, H, 256, dtype=torch.bfloat16))

        def call(x, ms):
            return f_op(x, probs, ms, *args)
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(call, fullgraph=True, backend="eager")
    for ms in ([32, 32], [0, 64], [64, 0], [32, 32]):
        assert_close(f(x, ms), call(x, ms), "exact", what=f"{op} {ms}")
    assert counters["stats"]["unique_graphs"] == 2


def test_reference_autograd_is_the_recipe():
    """The reference's autograd (what tk-bench differentiates) gives the recipe's gradients: float64 upcasts of
    bf16 values against the per-expert recipe written out here (not against the op, whose torch backend runs the
    same backward function on a CPU)."""
    x, w, ms = inputs(96, 64, 32, [32, 64], grad=True)
    dy = torch.randn(96, 32, dtype=torch.bfloat16).double()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    OP.reference(x64, w64, ms, precision="mxfp8").backward(dy)
    dx, dw = recipe_grads(x64, w64, dy, [32, 64])
    assert_close(x64.grad, dx, what="dx")
    assert_close(w64.grad, dw, what="dweight")


@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_empty_tokens_backward(precision):
    """M = 0: y and dx are empty, every expert's dweight is exactly zero (outputs start poisoned)."""
    x, w, ms = inputs(0, 64, 32, [0, 0, 0], grad=True)
    y = OP(x, w, ms, precision=precision)
    y.backward(torch.randn_like(y))
    assert y.shape == (0, 32) and x.grad.shape == (0, 64)
    assert torch.equal(w.grad, torch.zeros_like(w))
