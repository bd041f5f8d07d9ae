"""grouped_mlp_mxfp8: forward and backward against a hand-written per-expert float64 loop that
quantizes exactly the operands of TE's MXFP8 recipe; equality with the composition of the three
ops it is defined by; float64 gradcheck with quantization off."""
import pytest
import torch

import registry
from mxfp8_gemm_helpers import prequant_weight
from tilekernels.testing import assert_close, assert_one_rounding

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


def loop_backward(dy, x, probs, m_splits, w1, w2, wgrad=True):
    """Per expert: FC2 dgrad/wgrad, dSwiGLU by autograd of the index formula, FC1 dgrad/wgrad
    (wgrad False: the dgrads only, so groups need not be multiples of 32 tokens)."""
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
        if wgrad:
            dw2[g] = mx(dy[r], "columnwise").t() @ mx(a, "columnwise")
        a.backward(da)
        dx[r] = mx(h.grad, "rowwise") @ mx(w1[g], "columnwise")
        if wgrad:
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


@pytest.mark.parametrize("m_splits", [[64, 0, 96, 32], [160, 32]])
def test_bf16_outputs_rounded_once(m_splits):
    """OPS.md: h, the SwiGLU output, dA and dh stay fp32 and are quantized from fp32, never rounded to bf16 first.
    Such an extra rounding (2^-9) moves ~3% of an operand's e4m3 values by a step: over the whole tensor that is
    1.1e-2 to 1.7e-2 norm-wise, just past the bf16 tolerance above, and in one expert's rows only 5e-3 to 8e-3,
    under it; but it leaves 13-95% of y / dx / dfc1 / dfc2 off the float64 loop rounded once. Without one, the
    fp32 math moves an e4m3 value of a or dh against float64's at ~1e-5 of the elements (about one a call here),
    which shifts one row of y or dx (up to 65% of that row): so no row bound, and at most 5% of the elements
    (at most 0.43% seen over 100 seeds of each split)."""
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, torch.bfloat16, grad=True)
    y = OP(x, probs, ms, w1, w2)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dp, dw1, dw2 = loop_backward(dy, x, probs, m_splits, w1, w2)
    outs = (("y", y.detach(), loop_forward(x, probs, m_splits, w1, w2)), ("dx", x.grad, dx),
            ("dfc1", w1.grad, dw1), ("dfc2", w2.grad, dw2))
    for name, got, want in outs:
        assert_one_rounding(got, want, what=name, max_fraction=0.05, max_row_fraction=1.0)
    assert_close(probs.grad, dp, what="dprobs")


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


# ---------------------------------------------------------------- pre-quantized MXFP8 weights
# OPS.md: fc1_weight / fc2_weight are "bf16 master or pre-quantized MXFP8". A pre-quantized
# weight is e4m3 data plus its rowwise scales [G, N, K/32] (blocks along the forward's
# reduction dim, as mxfp8_quantize writes them); its value is its dequantization, which the
# forward consumes unchanged and the dgrad quantizes columnwise along N; it gets no gradient.


def prequant(w):
    """w [G, N, K] -> (e4m3 data [G, N, K], rowwise scales [G, N, K/32], float64 value): data
    and scales from the tested quantize op, the value dequantized here independently of the
    library (data * 2^(e - 127), one scale a block of 32 along K)."""
    d, s = prequant_weight(w)
    value = d.double() * torch.exp2(s.double() - 127).repeat_interleave(32, dim=-1)
    return d, s, value


@pytest.mark.parametrize("which", ["both", "fc1", "fc2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("m_splits", [[70, 0, 100, 31], [0, 0]])
def test_prequantized_forward_matches_loop(m_splits, dtype, which):
    """The loop quantizes each weight's value rowwise again (a no-op on an MXFP8 value: if the op
    skipped or doubled anything, the float64 comparison would see it)."""
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, dtype)
    d1, s1, v1 = prequant(w1)
    d2, s2, v2 = prequant(w2)
    args = (d1 if which != "fc2" else w1, d2 if which != "fc1" else w2,
            s1 if which != "fc2" else None, s2 if which != "fc1" else None)
    y = OP(x, probs, ms, *args)
    assert y.dtype == dtype and y.shape == x.shape
    want = loop_forward(x, probs, m_splits, v1 if which != "fc2" else w1, v2 if which != "fc1" else w2)
    assert_close(y, want, what=f"y ({which} pre-quantized)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("which", ["both", "fc1", "fc2"])
def test_prequantized_backward_matches_recipe_loop(which, dtype):
    """dx and dprobs flow through frozen pre-quantized weights (their values quantized columnwise
    along N for the dgrad); a master beside one still gets its wgrad; the pre-quantized one none."""
    m_splits = [64, 0, 96, 32]
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, dtype, grad=True)
    d1, s1, v1 = prequant(w1)
    d2, s2, v2 = prequant(w2)
    p1, p2 = which in ("both", "fc1"), which in ("both", "fc2")
    y = OP(x, probs, ms, d1 if p1 else w1, d2 if p2 else w2, s1 if p1 else None, s2 if p2 else None)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dp, dw1, dw2 = loop_backward(dy, x, probs, m_splits, v1 if p1 else w1, v2 if p2 else w2)
    assert_close(x.grad, dx, what="dx")
    assert_close(probs.grad, dp, what="dprobs")
    for pre, w, dw, name in ((p1, w1, dw1, "dfc1"), (p2, w2, dw2, "dfc2")):
        if pre:
            assert w.grad is None, f"{name}: the master of a pre-quantized weight was not in the call"
        else:
            assert_close(w.grad, dw, what=name)


@pytest.mark.parametrize("which", ["fc1", "fc2"])
def test_prequantized_dgrad_requantizes_along_n(which):
    """A pre-quantized weight's dgrad operand is its value quantized again columnwise, along N. Requantizing an
    MXFP8 value moves it only where a larger row in its 32-row column block pushes it into e4m3's subnormal range,
    which plain Gaussian weights (the test above) almost never do: feeding the dgrad the rowwise value as it is
    passes there. Here the weight's rows span 2^-8..2^8, so that slip changes dx far beyond float64's tolerance."""
    m_splits = [64, 0, 32]
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, torch.float64, grad=True)
    w = w1 if which == "fc1" else w2
    w = (w.detach() * torch.exp2(torch.randint(-8, 9, (w.shape[1],)).double())[None, :, None]).to(torch.bfloat16)
    w = w.double().requires_grad_()
    w1, w2 = (w, w2) if which == "fc1" else (w1, w)
    d, sc, v = prequant(w)
    args = (d, w2, sc, None) if which == "fc1" else (w1, d, None, sc)
    y = OP(x, probs, ms, *args)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dp, _, _ = loop_backward(dy, x, probs, m_splits, *((v, w2) if which == "fc1" else (w1, v)))
    assert_close(x.grad, dx, what="dx")
    assert_close(probs.grad, dp, what="dprobs")
    # the check can see it: the rowwise value (no requantization) is not the columnwise one
    G, N, K = v.shape
    assert not torch.equal(mx(v.reshape(G * N, K), "columnwise"), v.reshape(G * N, K))


def test_frozen_weights_take_any_group_sizes():
    """Both weights pre-quantized: no wgrad, so no columnwise blocks along an expert's tokens and no
    m_splits % 32 rule (dx and dprobs against the float64 loop with ragged groups); a master beside
    one still needs it, also right after the frozen call on the same m_splits (the registry's memo of
    checked values keys on the tensors' dtypes too: the rule's `when` reads them). The cute backend
    keeps M % 32 (its dSwiGLU pass quantizes dh columnwise)."""
    m_splits = [33, 0, 31, 5]
    ts, ms = make(m_splits)
    x, probs, w1, w2 = as_dtype(ts, torch.float64, grad=True)
    d1, s1, v1 = prequant(w1)
    d2, s2, v2 = prequant(w2)
    y = OP(x, probs, ms, d1, d2, s1, s2)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dp, _, _ = loop_backward(dy, x, probs, m_splits, v1, v2, wgrad=False)
    assert_close(x.grad, dx, what="dx")
    assert_close(probs.grad, dp, what="dprobs")
    assert "all_div" in _refused(x, probs, ms, d1, w2.detach().requires_grad_(), s1)
    xb, pb = x.detach().to(torch.bfloat16).requires_grad_(), probs.detach().float()
    rows = {b: (ok, why) for b, ok, why in OP.explain(xb, pb, ms, d1, d2, s1, s2)}
    assert rows["torch"][0] and "M % 32 == 0" in rows["cute"][1]


def test_prequantized_is_the_master_of_its_value():
    """Bitwise: pre-quantized weights give the same y, dx, dprobs as bf16 masters holding their
    values (those values are normal bf16 numbers here, so the masters hold them exactly)."""
    (x, probs, w1, w2), ms = make([32, 96, 0, 64])
    d1, s1, v1 = prequant(w1)
    d2, s2, v2 = prequant(w2)
    m1, m2 = v1.to(torch.bfloat16), v2.to(torch.bfloat16)
    assert torch.equal(m1.double(), v1) and torch.equal(m2.double(), v2)
    outs = []
    for args in ((d1, d2, s1, s2), (m1, m2)):
        xi, pi = x.detach().clone().requires_grad_(), probs.detach().clone().requires_grad_()
        y = OP(xi, pi, ms, *args)
        y.backward(torch.ones_like(y))
        outs.append((y, xi.grad, pi.grad))
    for name, a, b in zip(("y", "dx", "dprobs"), *outs):
        assert torch.equal(a, b), name


def test_prequantized_quantize_off_and_gradcheck():
    """quantize=False takes the weights' values unquantized: the float64 loop, and gradcheck
    of x and probs through frozen pre-quantized weights."""
    (x, probs, w1, w2), ms = make([3, 0, 4], dtype=torch.float64, grad=True)
    d1, s1, v1 = prequant(w1)
    d2, s2, v2 = prequant(w2)
    y = OP(x, probs, ms, d1, d2, s1, s2, quantize=False)
    assert_close(y, loop_forward(x, probs, [3, 0, 4], v1, v2, quantize=False), what="y (quantize=False)")
    assert torch.autograd.gradcheck(lambda a, p: OP(a, p, ms, d1, d2, s1, s2, quantize=False), (x, probs),
                                    fast_mode=True)


def test_prequantized_torch_compile_fullgraph():
    from tilekernels.moe import grouped_mlp_mxfp8

    (x, probs, w1, w2), ms = make([32, 0, 64], grad=True)
    w1.requires_grad_(False)
    d2, s2, v2 = prequant(w2)
    f = torch.compile(grouped_mlp_mxfp8, fullgraph=True, backend="aot_eager")
    y = f(x, probs, ms, w1, d2, None, s2)
    assert_close(y, loop_forward(x, probs, [32, 0, 64], w1, v2), what="y (compiled)")
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dp, _, _ = loop_backward(dy, x, probs, [32, 0, 64], w1, v2)
    assert_close(x.grad, dx, what="dx (compiled)")
    assert_close(probs.grad, dp, what="dprobs (compiled)")


def _refused(*args, **kw) -> str:
    with pytest.raises(registry.SpecError) as e:
        OP(*args, **kw)
    return str(e.value)


def test_prequantized_refusals_name_op_tensor_expected_got():
    (x, probs, w1, w2), ms = make([32, 32])
    d1, s1, _ = prequant(w1)
    d2, s2, _ = prequant(w2)
    msg = _refused(x, probs, ms, d1, w2)                              # data without its scales
    assert "grouped_mlp_mxfp8" in msg and "fc1_weight_scales" in msg and "present(fc1_weight_scales)=False" in msg
    msg = _refused(x, probs, ms, w1, w2, None, s2)                    # scales beside a master
    assert "fc2_weight_scales" in msg and "dtype(fc2_weight)='bfloat16'" in msg
    msg = _refused(x, probs, ms, d1, w2, s1[:, :, :4].contiguous())   # scales of the wrong shape
    assert "tensor fc1_weight_scales" in msg and "H // 32" in msg and "[2, 512, 4]" in msg
    msg = _refused(x, probs, ms, d1, w2, s1.view(torch.int8))         # scales of the wrong dtype
    assert "tensor fc1_weight_scales" in msg and "uint8" in msg and "int8" in msg
    msg = _refused(x, probs, ms, w1.float(), w2)                      # a dtype no weight takes
    assert "tensor fc1_weight" in msg and "float32" in msg
    for bad in ((w1.double(), w2), (w1, w2.double())):                # a master in another dtype than x's
        name = "fc1_weight" if bad[0].dtype == torch.float64 else "fc2_weight"
        msg = _refused(x, probs, ms, *bad)
        assert f"dtype({name})='float64'" in msg and "a master in x's dtype" in msg
    msg = _refused(x, probs, ms, d1.requires_grad_(), w2, s1)         # fp8 data cannot hold a gradient
    assert "tensor fc1_weight" in msg and "requires_grad=False" in msg and "got requires_grad=True" in msg
    d1.requires_grad_(False)
    rows = {b: (ok, why) for b, ok, why in OP.explain(x, probs, ms, d1, d2, s1, s2)}
    # Pre-quantized weights are no reason to refuse cute since session 51's GPU run (18 cases, memcheck /
    # initcheck clean): on CPU inputs its one refusal is the device.
    assert rows["torch"][0] and not rows["cute"][0] and rows["cute"][1].startswith("inputs are on cpu")
    assert "pre-quantized" not in rows["cute"][1]
