"""The mHC layer identity of OPS.md, through the registry:
x_next = h_post_bda(h_res, x_streams, h_post, F(layer_in), bias) with
(layer_in, h_post, h_res) = mhc_pre(x_streams, ...), against a hand-written
float64 composition, forward and gradients."""
import math

import pytest
import torch

import registry
from mhc_helpers import BF16, F32, F64, grads_vs_float64, rand
from mhc_helpers import loop64
from tilekernels.testing import assert_close

PRE, BDA = registry.get("mhc_pre"), registry.get("mhc_h_post_bda")
PARAMS = dict(alpha_pre=0.8, alpha_post=1.1, alpha_res=0.6, iters=20)


def branch(z):
    """F: a simple nonlinear stand-in for attention / MLP, computed in >= fp32, output in z's dtype."""
    return (torch.tanh(z.to(torch.promote_types(z.dtype, F32))) * 1.5 + 0.25).to(z.dtype)


def layer(x, weight, pre_bias, bias, **params):
    layer_in, h_post, h_res = PRE(x, weight, pre_bias, **params)
    return BDA(h_res, x, h_post, branch(layer_in), bias)


def layer64(x, weight, pre_bias, bias, alpha_pre=1.0, alpha_post=1.0, alpha_res=1.0, iters=20):
    """Every step written out in float64, loops over the streams."""
    T, n, C = x.shape
    x = x.double()
    flat = x.reshape(T, n * C)
    r = 1.0 / (torch.linalg.vector_norm(flat, dim=1) / math.sqrt(n * C) + 1e-6)
    alpha = torch.tensor([alpha_pre] * n + [alpha_post] * n + [alpha_res] * (n * n), dtype=F64)
    h = r[:, None] * (flat @ weight.double().t()) * alpha + pre_bias.double()
    h_pre, h_post = torch.sigmoid(h[:, :n]), 2 * torch.sigmoid(h[:, n:2 * n])
    h_res = loop64(h[:, 2 * n:].reshape(T, n, n), iters, 1e-6)
    layer_in = sum(h_pre[:, i, None] * x[:, i] for i in range(n))
    y = torch.tanh(layer_in) * 1.5 + 0.25 + (0 if bias is None else bias.double())
    streams = [sum(h_res[:, i, j, None] * x[:, j] for j in range(n)) + h_post[:, i, None] * y for i in range(n)]
    return torch.stack(streams, dim=1)


def inputs(T, n, C, dt, bias=True):
    return [rand(T, n, C, dtype=dt), rand(n * n + 2 * n, n * C, dtype=dt, scale=1 / math.sqrt(n * C)),
            rand(n * n + 2 * n, dtype=F64 if dt == F64 else F32), rand(C, dtype=dt) if bias else None]


@pytest.mark.parametrize("T,n,C", [(5, 4, 32), (3, 1, 7), (2, 8, 16)])
@pytest.mark.parametrize("dt", [F32, BF16])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_identity(T, n, C, dt, bias):
    args = inputs(T, n, C, dt, bias)
    out = layer(*args, **PARAMS)
    assert out.dtype == dt and out.shape == (T, n, C)
    # bf16: layer_in and F's output are rounded to bf16 inside the layer (the float64 oracle is not)
    assert_close(out, layer64(*args, **PARAMS), what="x_next")


def test_layer_grads():
    # fp32 only: in a bf16 layer the fp32 gradients (pre_bias) inherit bf16-rounded intermediate
    # gradients (dlayer_in) the float64 oracle does not have; each op's bf16 grads are tested alone
    grads_vs_float64(lambda *a: layer(*a, **PARAMS), lambda *a: layer64(*a, **PARAMS), inputs(6, 4, 12, F32),
                     ["x_streams", "weight", "pre_bias", "bias"])


def test_layer_gradcheck_float64():
    args = tuple(a.requires_grad_() for a in inputs(2, 2, 3, F64))
    assert torch.autograd.gradcheck(lambda *a: layer(*a, iters=3), args)
