"""mHC family: spec wiring and every constraint's refusal."""
import pytest
import torch

import registry
from registry import SpecError
from specs.mhc import ITERS_MAX, SPECS
from tilekernels._glue import has_kernel

from mhc_helpers import BF16, F32, F64, rand  # noqa: F401


def test_specs_wired():
    for spec in SPECS:
        op = registry.get(spec.name)
        assert callable(op.entry) and callable(op.reference)
        assert spec.differentiable
        for p in ("fwd", "bwd"):
            assert has_kernel(spec.name, "torch", p), (spec.name, p)


# ------------------------------------------------------------------ refusals
# (op, case id, builder -> (args, kwargs), substring the message must contain)


def _sink(T=3, n=4, dtype=F32):
    return rand(T, n, n, dtype=dtype)


def _bda(T=3, n=4, C=8, h=F32, d=BF16, bias=BF16):
    return [rand(T, n, n, dtype=h), rand(T, n, C, dtype=d), rand(T, n, dtype=h), rand(T, C, dtype=d),
            None if bias is None else rand(C, dtype=bias)]


def _pr(M=3, N=24, K=16, d=BF16):
    return [rand(M, K, dtype=d), rand(N, K, dtype=d)]


def _pre(T=3, n=2, C=4, d=BF16, b=F32):
    return [rand(T, n, C, dtype=d), rand(n * n + 2 * n, n * C, dtype=d), rand(n * n + 2 * n, dtype=b)]


def _swap(args, i, t):
    args = list(args)
    args[i] = t
    return args


REFUSALS = [
    ("mhc_sinkhorn", "n>8", lambda: ([_sink(n=9)], {}), "dim n"),
    ("mhc_sinkhorn", "n=0", lambda: ([_sink(n=0)], {}), "dim n"),
    ("mhc_sinkhorn", "not square", lambda: ([rand(3, 4, 5)], {}), "tensor logits"),
    ("mhc_sinkhorn", "bf16", lambda: ([_sink(dtype=BF16)], {}), "dtype"),
    ("mhc_sinkhorn", "rank", lambda: ([rand(4, 4)], {}), "3 dims"),
    ("mhc_sinkhorn", "iters=0", lambda: ([_sink()], {"iters": 0}), "param iters"),
    ("mhc_sinkhorn", "iters float", lambda: ([_sink()], {"iters": 2.5}), "param iters"),
    ("mhc_sinkhorn", "eps=0", lambda: ([_sink()], {"eps": 0.0}), "param eps: expected >= 1.17"),
    # positive, but 0 in the kernels' fp32 with denormals flushed (1 / eps = inf): refused as 0 is
    ("mhc_sinkhorn", "eps=1e-50", lambda: ([_sink()], {"eps": 1e-50}), "param eps: expected >= 1.17"),
    ("mhc_sinkhorn", "eps denormal", lambda: ([_sink()], {"eps": 2.0 ** -127}), "param eps"),
    ("mhc_sinkhorn", "iters past the bound", lambda: ([_sink()], {"iters": ITERS_MAX + 1}),
     f"param iters: expected <= {ITERS_MAX}"),
    ("mhc_sinkhorn", "eps<0", lambda: ([_sink()], {"eps": -1.0}), "param eps"),
    ("mhc_sinkhorn", "strides", lambda: ([_sink().transpose(1, 2)], {}), "contiguous"),
    ("mhc_h_aggregate", "f64 x, f32 h", lambda: ([rand(2, 3, 4, dtype=F64), rand(2, 3)], {}), "float64"),
    ("mhc_h_post_bda", "x dtype != residual",
     lambda: (_swap(_bda(), 3, rand(3, 8, dtype=F32)), {}), "tensor x"),
    ("mhc_h_post_bda", "bias f64 with bf16 x", lambda: (_bda(bias=F64), {}), "bias must have"),
    ("mhc_h_post_bda", "f64 residual, f32 h", lambda: (_bda(h=F32, d=F64, bias=None), {}), "float64"),
    ("mhc_h_post_bda", "f64 residual, f32 bias", lambda: (_bda(h=F64, d=F64, bias=F32), {}), "float64"),
    ("mhc_h_post_bda", "bias len", lambda: (_swap(_bda(), 4, rand(7, dtype=BF16)), {}), "tensor bias"),
    ("mhc_h_post_bda", "h_res T", lambda: (_swap(_bda(), 0, rand(2, 4, 4)), {}), "(T) = 2"),
    ("mhc_h_post_bda", "h_post n", lambda: (_swap(_bda(), 2, rand(3, 5)), {}), "tensor h_post"),
    ("mhc_h_post_bda", "n>8", lambda: (_bda(n=9), {}), "dim n"),
    ("mhc_h_post_bda", "C=0", lambda: (_bda(C=0), {}), "dim C"),
    ("mhc_h_post_bda", "fp16", lambda: (_bda(d=torch.float16, bias=None), {}), "dtype"),
    ("mhc_h_post_bda", "no x", lambda: (_bda()[:3], {}), "tensor x"),
    ("mhc_h_post_bda", "strides", lambda: (_swap(_bda(C=3), 1, rand(3, 3, 4, dtype=BF16).transpose(1, 2)), {}),
     "contiguous"),
    ("mhc_h_post_bda", "device", lambda: (_swap(_bda(), 0, rand(3, 4, 4).to("meta")), {}), "device"),
    ("mhc_proj_rms", "weight dtype", lambda: (_swap(_pr(), 1, rand(24, 16)), {}), "tensor weight"),
    ("mhc_proj_rms", "K mismatch", lambda: (_swap(_pr(), 1, rand(24, 15, dtype=BF16)), {}), "tensor weight"),
    ("mhc_proj_rms", "K=0", lambda: (_pr(K=0), {}), "dim K"),
    ("mhc_proj_rms", "eps=0", lambda: (_pr(), {"eps": 0.0}), "param eps: expected >= 1.17"),
    ("mhc_proj_rms", "eps=1e-50", lambda: (_pr(), {"eps": 1e-50}), "param eps: expected >= 1.17"),
    ("mhc_proj_rms", "strides", lambda: ([rand(16, 3, dtype=BF16).t(), rand(24, 16, dtype=BF16)], {}),
     "contiguous"),
    ("mhc_pre", "weight rows != n*n+2n", lambda: (_swap(_pre(), 1, rand(9, 8, dtype=BF16)), {}), "n*n+2*n"),
    ("mhc_pre", "weight cols != n*C", lambda: (_swap(_pre(), 1, rand(8, 7, dtype=BF16)), {}), "n*C"),
    ("mhc_pre", "bias len", lambda: (_swap(_pre(), 2, rand(7)), {}), "tensor bias"),
    ("mhc_pre", "bias bf16", lambda: (_pre(b=BF16), {}), "tensor bias"),
    ("mhc_pre", "f64 x, f32 bias", lambda: (_pre(d=F64), {}), "float64"),
    ("mhc_pre", "f32 x, f64 bias", lambda: (_pre(b=F64), {}), "float64"),
    ("mhc_pre", "weight dtype", lambda: (_swap(_pre(), 1, rand(8, 8)), {}), "tensor weight"),
    ("mhc_pre", "n>8", lambda: (_pre(n=9, C=1), {}), "dim n"),
    ("mhc_pre", "iters=0", lambda: (_pre(), {"iters": 0}), "param iters"),
    ("mhc_pre", "rms_eps=0", lambda: (_pre(), {"rms_eps": 0.0}), "param rms_eps"),
    ("mhc_pre", "sinkhorn_eps=1e-50", lambda: (_pre(), {"sinkhorn_eps": 1e-50}), "param sinkhorn_eps"),
    ("mhc_pre", "iters past the bound", lambda: (_pre(), {"iters": 2 ** 62}), "param iters"),
    ("mhc_pre", "alpha str", lambda: (_pre(), {"alpha_res": "1"}), "param alpha_res"),
    ("mhc_pre", "unknown param", lambda: (_pre(), {"eps": 1e-6}), "eps"),
]

def _pp(T=3, n=2, C=4, h=F32, d=BF16, hb=F32, bias=BF16):
    """mhc_post_pre inputs: h_res, residual, h_post, x, weight, hbias, bias."""
    N = n * n + 2 * n
    return [rand(T, n, n, dtype=h), rand(T, n, C, dtype=d), rand(T, n, dtype=h), rand(T, C, dtype=d),
            rand(N, n * C, dtype=d), rand(N, dtype=hb), None if bias is None else rand(C, dtype=bias)]


REFUSALS += [
    ("mhc_post_pre", "bias f64 with bf16 x", lambda: (_pp(bias=F64), {}), "bias must have"),
    ("mhc_post_pre", "f64 residual, f32 h", lambda: (_pp(d=F64, hb=F64, bias=None), {}), "float64"),
    ("mhc_post_pre", "bf16 residual, f64 hbias", lambda: (_pp(hb=F64), {}), "float64"),
    ("mhc_post_pre", "f64 h_res, bf16 residual", lambda: (_pp(h=F64), {}), "float64"),
    ("mhc_post_pre", "weight cols != n*C", lambda: (_swap(_pp(), 4, rand(8, 7, dtype=BF16)), {}), "n*C"),
    ("mhc_post_pre", "iters=0", lambda: (_pp(), {"iters": 0}), "param iters"),
    ("mhc_post_pre", "rms_eps=0", lambda: (_pp(), {"rms_eps": 0.0}), "param rms_eps"),
    ("mhc_post_pre", "sinkhorn_eps=0", lambda: (_pp(), {"sinkhorn_eps": 0.0}), "param sinkhorn_eps"),
    ("mhc_post_pre", "rms_eps=1e-50", lambda: (_pp(), {"rms_eps": 1e-50}), "param rms_eps"),
    ("mhc_post_pre", "iters past the bound", lambda: (_pp(), {"iters": ITERS_MAX + 1}), "param iters"),
]


@pytest.mark.parametrize("name,case,build,needle", REFUSALS, ids=[f"{r[0]}:{r[1]}" for r in REFUSALS])
def test_refusals(name, case, build, needle):
    args, kwargs = build()
    with pytest.raises(SpecError) as e:
        registry.get(name)(*args, **kwargs)
    msg = str(e.value)
    assert msg.startswith(f"{name}: "), msg
    if needle:
        assert needle in msg, msg


def test_every_constraint_has_a_refusal():
    """Each op's constraints and params with a range appear in the refusal table."""
    covered = {(r[0], r[3]) for r in REFUSALS}
    for spec in SPECS:
        needles = {nd for op, nd in covered if op == spec.name and nd}
        for c in spec.constraints:
            hit = any(nd in c.expr or nd in c.message for nd in needles)
            assert hit, f"{spec.name}: no refusal test for constraint {c.expr!r}"
        for p in spec.params:
            if p.min is not None:
                assert any(p.name in nd for nd in needles), f"{spec.name}: no refusal test for param {p.name}"


@pytest.mark.parametrize("name,build", [("mhc_pre", _pre), ("mhc_post_pre", _pp)])
def test_gpu_backwards_refuse_rms_eps_below_their_least(name, build):
    """The GPU backwards form proj's gradient dh * alpha * r in fp32 (specs.mhc's _RMS_EPS_BWD): with a gradient and
    rms_eps below 2**-80 the registry lists both GPU backends as unusable and says why (on a GPU, at 2**-126 with
    cotangents scaled by 1e3, both gave dweight NaN); at 2**-80 itself, or for the forward alone, that limit refuses
    nothing; the torch backend (r applied after the products) takes every case."""
    op = registry.get(name)
    args = build()
    for grad, eps, refused in ((True, 2.0 ** -126, True), (True, 2.0 ** -81, True), (True, 2.0 ** -80, False),
                               (False, 2.0 ** -126, False)):
        args[0].requires_grad_(grad)
        rows = op.explain(*args, rms_eps=eps)
        assert {b for b, _, _ in rows} == {"cute", "cutile", "torch"}, rows
        for b, ok, why in rows:
            if b == "torch":
                assert ok, why
            else:
                assert ("'rms_eps >= 2.0**-80' fails" in why) == refused, (grad, eps, why)
