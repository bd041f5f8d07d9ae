"""The GPU backwards with an RMS norm (mhc_proj_rms, mhc_pre, mhc_post_pre) on all-zero rows at small eps.

The kernels recover a row's rms = 1/r - eps from the saved r; an all-zero row must get an RMS term of 0
(reference.ZERO_ROW says why a recovered rms up to eps * 2**-20 counts as zero). The eps values here are ones whose
fp32 round trip fl(1/fl(1/eps)) lands an ulp above eps: the kernels' former test (rms <= 0) let such a zero row
through, and -dr r^2 / (K rms) overflowed (r^2 alone past fp32 for eps under ~5e-20; with dr scaled up as a loss
scale does, the quotient for eps up to ~1e-10): inf * 0 = NaN in that row's dx. Every GPU backend the registry lists
for the call, against the float64 torch reference (mhc_post_pre: against the torch backend in the same dtypes, the
bf16 tolerance, as tests/mhc/test_mhc_post_pre.py's cross-check: its float64 out is not rounded where the op's is).

Measured with the former test (session 68, H100): test_proj_rms_zero_rows failed at all five eps on both the cute
and the cutile backend. In mhc_pre and mhc_post_pre a zero row's proj is 0, so its dr is exactly 0 and the term stays
(-0 * r) * r = -0 even there: those two tests passed with the former test too. They stay as guards of the zero row's
finite RMS term (a kernel forming r * r first would give inf * 0 at the smallest eps)."""
from __future__ import annotations

import pytest
import torch

import registry
from mhc_helpers import BF16, F64, on_gpu, rand
from tilekernels.testing import assert_close, upcast

GPU_BACKENDS = ("cute", "cutile")
ZERO = [0, 5, 66]   # zero rows of 67: the first, one inside the first row tile, the last (a tail tile)


def _ulp_above(lo: float, hi: float, count: int) -> list[float]:
    """fp32 eps in [lo, hi] whose fp32 1/(1/eps) rounds above eps, about evenly spread on a log scale."""
    found = []
    for v in torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(hi)), 20001, dtype=F64):
        e = v.float()
        if (1 / (1 / e)) > e and (not found or e.item() > found[-1] * (hi / lo) ** (1 / count)):
            found.append(e.item())
    assert len(found) >= count, found
    return found[:count]


EPS = _ulp_above(1e-24, 2e-20, 2) + _ulp_above(1e-13, 1e-10, 3)


def _usable(op, args, params) -> list:
    """The GPU backends the registry lists as usable for the call with a gradient (every test here runs the
    backward)."""
    args = [None if t is None else t.detach().requires_grad_() for t in args]
    return [b for b, usable, _ in op.explain(*args, **params) if usable and b in GPU_BACKENDS]


def _backends(op, args, params):
    """:func:`_usable`'s backends; none: a skip."""
    ok = _usable(op, args, params)
    if not ok:
        pytest.skip(f"no GPU backend of {op.name} takes this call")
    return ok


def _loss_scaled_backends(op, args, params, eps):
    """At the GPU backends' least eps (2**-80) with a gradient: those usable (none: a skip); below it the registry
    must list none of them, and its own choice (the torch backend) runs: the gradients' finiteness is the check."""
    if eps >= 2.0 ** -80:
        return _backends(op, args, params)
    assert not _usable(op, args, params), op.name
    return ["auto"]


def _grads(op, args, cots, params, backend):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in args]
    outs = op(*leaves, **params, backend=backend)
    torch.autograd.backward(outs, cots)
    return [None if t is None else t.grad for t in leaves]


@on_gpu
@pytest.mark.parametrize("eps", EPS)
def test_proj_rms_zero_rows(eps):
    op = registry.get("mhc_proj_rms")
    x, w = rand(67, 512, dtype=BF16).cuda(), rand(24, 512, dtype=BF16, scale=512 ** -0.5).cuda()
    x[ZERO] = 0
    cots = [rand(67, 24).cuda(), rand(67).cuda() * 1e4]   # dproj; dr as a loss scale leaves it
    want = _grads(op, [upcast(x), upcast(w)], [upcast(c) for c in cots], dict(eps=eps), "torch")
    for b in _backends(op, [x, w], dict(eps=eps)):
        dx, dw = _grads(op, [x, w], cots, dict(eps=eps), b)
        assert torch.isfinite(dx).all() and torch.isfinite(dw).all(), b
        assert_close(dx[ZERO], want[0][ZERO], what=f"{b}: dx of the zero rows")
        assert_close(dx, want[0], what=f"{b}: dx")
        assert_close(dw, want[1], what=f"{b}: dweight")


PRE_PARAMS = dict(alpha_pre=0.7, alpha_post=1.3, alpha_res=0.4, iters=20)


def _pre_case(scale: float):
    """mhc_pre's inputs (T 67, n 4, C 128; the ZERO tokens all zero) and cotangents, those scaled by ``scale``."""
    n, C = 4, 128
    args = [rand(67, n, C, dtype=BF16).cuda(), rand(24, n * C, dtype=BF16, scale=(n * C) ** -0.5).cuda(),
            rand(24).cuda()]
    args[0][ZERO] = 0
    return args, [rand(67, C, dtype=BF16).cuda() * scale, rand(67, n).cuda() * scale, rand(67, n, n).cuda() * scale]


def _post_pre_case(scale: float):
    """mhc_post_pre's inputs (zero residual and x rows at the ZERO tokens, no bias: zero rows of out, the pre step's
    input) and cotangents, the pre step's scaled by ``scale``."""
    T, n, C = 67, 4, 128
    N = n * n + 2 * n
    args = [torch.softmax(rand(T, n, n), -1).cuda(), rand(T, n, C, dtype=BF16).cuda(),
            (rand(T, n).sigmoid() * 2).cuda(), rand(T, C, dtype=BF16).cuda(),
            rand(N, n * C, dtype=BF16, scale=(n * C) ** -0.5).cuda(), rand(N).cuda(), None]
    args[1][ZERO] = 0
    args[3][ZERO] = 0
    return args, [rand(T, n, C, dtype=BF16).cuda(), rand(T, C, dtype=BF16).cuda() * scale,
                  rand(T, n).cuda() * scale, rand(T, n, n).cuda() * scale]


@on_gpu
@pytest.mark.parametrize("eps", EPS)
def test_pre_zero_tokens(eps):
    op = registry.get("mhc_pre")
    args, cots = _pre_case(1.0)
    params = dict(PRE_PARAMS, rms_eps=eps)
    want = _grads(op, [upcast(t) for t in args], [upcast(c) for c in cots], params, "torch")
    for b in _backends(op, args, params):
        got = _grads(op, args, cots, params, b)
        for name, g, w in zip(("x", "weight", "bias"), got, want):
            assert torch.isfinite(g).all(), f"{b}: d{name}"
            assert_close(g, w, what=f"{b}: d{name}")


@on_gpu
@pytest.mark.parametrize("eps", EPS)
def test_post_pre_zero_tokens(eps):
    """Zero residual and x rows (no bias) make zero rows of out, the pre step's input (_post_pre_case)."""
    op = registry.get("mhc_post_pre")
    args, cots = _post_pre_case(1.0)
    params = dict(PRE_PARAMS, rms_eps=eps)
    want = _grads(op, args, cots, params, "torch")
    for b in _backends(op, args, params):
        got = _grads(op, args, cots, params, b)
        for name, g, w in zip(("h_res", "residual", "h_post", "x", "weight", "hbias"), got, want):
            assert torch.isfinite(g).all(), f"{b}: d{name}"
            assert_close(g.float(), w.float(), kind="bfloat16", what=f"{b}: d{name}")


# A zero token's proj gradient is dh * alpha * r with r = 1/eps: at the spec's least eps (2**-126, r ~ 8.5e37) a
# gradient above ~4 (a loss scale) puts it past fp32, and the GPU backwards' dweight = dproj^T x got inf * 0 = NaN
# from that token (both backends, session 72, H100). They take rms_eps >= 2**-80 with a gradient (specs.mhc's
# _RMS_EPS_BWD; |dh alpha| must then pass 2**48 to overflow): cases at that least eps with cotangents scaled by 1e3
# and by 1e12, and one at 2**-126 (no GPU backend takes it: the registry's own choice, the torch backend, runs).
LOSS_SCALED = [(2.0 ** -80, 1e3), (2.0 ** -80, 1e12), (2.0 ** -126, 1e3)]


@on_gpu
@pytest.mark.parametrize("eps,scale", LOSS_SCALED)
def test_pre_zero_tokens_loss_scaled(eps, scale):
    """mhc_pre's dweight and dbias with zero tokens at tiny eps, cotangents scaled up: finite and as the float64 torch
    reference's (the zero tokens add 0 to dweight); dx of the other tokens too. The zero tokens' own dx is past fp32
    at 2**-126 (its true value ~1e41), so it is not compared."""
    op = registry.get("mhc_pre")
    args, cots = _pre_case(scale)
    params = dict(PRE_PARAMS, rms_eps=eps)
    want = _grads(op, [upcast(t) for t in args], [upcast(c) for c in cots], params, "torch")
    keep = [t for t in range(67) if t not in ZERO]
    for b in _loss_scaled_backends(op, args, params, eps):
        dx, dw, db = _grads(op, args, cots, params, b)
        assert torch.isfinite(dw).all() and torch.isfinite(db).all(), b
        assert_close(dw, want[1], what=f"{b}: dweight")
        assert_close(db, want[2], what=f"{b}: dbias")
        assert_close(dx[keep], want[0][keep], what=f"{b}: dx of the other tokens")


@on_gpu
@pytest.mark.parametrize("eps,scale", LOSS_SCALED)
def test_post_pre_zero_tokens_loss_scaled(eps, scale):
    """mhc_post_pre's dweight and dhbias as mhc_pre's above (zero out rows, the pre step's cotangents scaled up),
    against the torch backend in the same dtypes (test_post_pre_zero_tokens says why). The zero tokens' d(out) is
    past fp32 at 2**-126, so their other gradients are not compared."""
    op = registry.get("mhc_post_pre")
    args, cots = _post_pre_case(scale)
    params = dict(PRE_PARAMS, rms_eps=eps)
    want = _grads(op, args, cots, params, "torch")
    for b in _loss_scaled_backends(op, args, params, eps):
        got = _grads(op, args, cots, params, b)
        for i, name in ((4, "weight"), (5, "hbias")):
            assert torch.isfinite(got[i]).all(), f"{b}: d{name}"
            assert_close(got[i].float(), want[i].float(), kind="bfloat16", what=f"{b}: d{name}")
