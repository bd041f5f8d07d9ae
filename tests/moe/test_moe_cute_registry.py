"""The CuTe DSL MoE backend as users reach it: through ``registry.get(op)(...)`` and autograd.

CPU part: the cute backend's declared limits show up, with reasons, in ``explain``.
GPU part (H100/H200): ``auto`` picks cute for bf16 MXFP8 calls; grouped_linear and
grouped_mlp_mxfp8 forward and backward match the float64 reference of the same MXFP8
recipe (outputs poisoned with NaN first, fresh random inputs, ragged m_splits with zeros
and sizes that are not tile multiples); m_splits on the GPU: the whole MLP fwd+bwd is
captured in a CUDA graph under ``set_sync_debug_mode("error")`` and replays equal eager.

Tolerances (tilekernels.testing): bf16 outputs < 1e-2. The MXFP8 operands are identical
in both paths (quantizing a bf16 tensor in fp32 or float64 gives the same bytes), products
are exact, so the GEMMs differ only by fp32 summation order and the final bf16 rounding;
in the MLP, h / dA are fp32 here and float64 in the reference, so a few quantized
intermediates may round to the neighbouring e4m3 value (one e4m3 step, 2^-3 relative, on
rare elements), far inside the bf16 tolerance norm-wise.
"""
from __future__ import annotations

import pytest
import torch

import registry
from mxfp8_gemm_helpers import prequant_weight
from tilekernels._glue import poisoned
from tilekernels.moe import reference as ref
from tilekernels.testing import assert_close, assert_one_rounding

BF = torch.bfloat16
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _why(op, *args, **kw) -> str:
    rows = {b: (ok, why) for b, ok, why in registry.get(op).explain(*args, **kw)}
    ok, why = rows["cute"]
    assert not ok
    return why


def test_cute_limits_are_explained():
    meta = torch.device("meta")
    x, w = torch.empty(64, 64, device=meta), torch.empty(2, 64, 64, device=meta)
    m = torch.tensor([32, 32])
    if _declared("grouped_linear"):
        # bf16 precision: torch._grouped_mm's 16-byte rows; mxfp8: the dgrad's blocks of 32 along N
        x60, w60 = torch.empty(64, 60, dtype=BF, device=meta), torch.empty(2, 64, 60, dtype=BF, device=meta)
        assert "K and N multiples of 8" in _why("grouped_linear", x60, w60, m)
        w40 = torch.empty(2, 40, 64, dtype=BF, device=meta)
        assert "K and N multiples of 8" not in _why("grouped_linear", x.to(BF), w40, m, precision="mxfp8")
        assert "columnwise weight blocks run along N" in _why("grouped_linear", x.to(BF), w40, m, precision="mxfp8")
        assert "cute supports x in ['bfloat16'], got float32" in _why("grouped_linear", x, w, m, precision="mxfp8")
    assert "cute supports x in ['bfloat16', 'float32'], got float64" in _why(
        "mxfp8_quantize", torch.empty(64, 64, dtype=torch.float64, device=meta))
    h, p = torch.empty(64, 512, device=meta, dtype=torch.float64), torch.empty(64, device=meta, dtype=torch.float64)
    assert "cute supports h in ['bfloat16', 'float32'], got float64" in _why("scaled_swiglu", h, p)
    # the dequantize kernel writes bf16 or fp32: float64 out (the spec allows it) is the torch reference's. Declared as
    # a backend dtype limit on the output, the registry never checked it and chose cute (a CPU audit's find)
    d8, sc = torch.empty(64, 64, dtype=torch.float8_e4m3fn, device=meta), torch.empty(64, 2, dtype=torch.uint8,
                                                                                      device=meta)
    assert "the kernel writes bf16 or fp32" in _why("mxfp8_dequantize", d8, sc, out_dtype="float64")
    for ok_dtype in ("bfloat16", "float32"):   # refused on the meta device only
        assert "the kernel writes" not in _why("mxfp8_dequantize", d8, sc, out_dtype=ok_dtype)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(32, 32), (96, 160), (4128, 7168), (0, 64)])
@pytest.mark.parametrize("dtype", [BF, torch.float32])
@pytest.mark.parametrize("axis", ["rowwise", "columnwise", "both"])
def test_quantize_dequantize_through_registry(shape, dtype, axis):
    """auto picks cute; bytes equal the torch path's (bitwise), outputs poisoned first; the
    dequantized values equal the torch dequantization bitwise."""
    _skip_without_gpu()
    x = (torch.randn(*shape, device="cuda") * torch.exp2(torch.randint(-20, 20, (shape[0], 1), device="cuda"))
         ).to(dtype)
    q, dq = registry.get("mxfp8_quantize"), registry.get("mxfp8_dequantize")
    assert q.choose(q.bind(x, axis=axis)) == "cute"
    with poisoned():
        got = q(x, axis=axis)
    want = ref.mxfp8_quantize(x, axis)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, "exact", what=f"mxfp8_quantize[{axis}] output {i}")
    one = "rowwise" if axis == "both" else axis
    d, sc = got[:2]
    for out_dtype in ("bfloat16", "float32"):
        assert dq.choose(dq.bind(d, sc, axis=one, out_dtype=out_dtype)) == "cute"
        with poisoned():
            v = dq(d, sc, axis=one, out_dtype=out_dtype)
        assert_close(v, ref.mxfp8_dequantize(d, sc, one, out_dtype), "exact", what=f"dequantize[{one}]")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("s", [None, 32])
@pytest.mark.parametrize("dtype", [BF, torch.float32])
@pytest.mark.parametrize("MF", [(1, 32), (37, 96), (4096, 2048)])
def test_scaled_swiglu_through_registry(s, dtype, MF):
    """fwd and autograd bwd against the float64 reference (bf16: < 1e-2, one rounding of the
    output; fp32: < 1e-5, fp32 math of the same formula), outputs poisoned first."""
    _skip_without_gpu()
    M, F = MF
    h = torch.randn(M, 2 * F, device="cuda").to(dtype).requires_grad_()
    p = torch.rand(M, device="cuda").requires_grad_()
    op = registry.get("scaled_swiglu")
    assert op.choose(op.bind(h, p, glu_interleave_size=s)) == "cute"
    with poisoned():
        out = op(h, p, glu_interleave_size=s)
        dout = torch.randn_like(out)
        dh, dp = torch.autograd.grad(out, (h, p), dout)
    hd, pd = h.detach().double().requires_grad_(), p.detach().double().requires_grad_()
    want = ref.scaled_swiglu(hd, pd, s)
    dhr, dpr = torch.autograd.grad(want, (hd, pd), dout.double())
    assert_close(out, want, dtype, what="out")
    assert_close(dh, dhr, dtype, what="dh")
    assert_close(dp, dpr, torch.float32 if dtype == torch.float32 else BF, what="dprobs")


def _make(splits, K, N, device, grad=False):
    M, G = sum(splits), len(splits)
    x = torch.randn(M, K, device=device).to(BF).requires_grad_(grad)
    w = (torch.randn(G, N, K, device=device) / K ** 0.5).to(BF).requires_grad_(grad)
    return x, w, torch.tensor(splits, dtype=torch.int64, device=device)


def _f64(*ts):
    return [t.detach().double().requires_grad_(t.requires_grad) for t in ts]


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("splits", [[0, 1, 31, 130, 0], [200], [0, 0], [7, 0, 300, 33]])
@pytest.mark.parametrize("KN", [(256, 96), (160, 512)])
@pytest.mark.parametrize("m_device", ["cpu", "cuda"])
def test_grouped_linear_forward(splits, KN, m_device):
    _skip_without_gemm()
    K, N = KN
    x, w, m = _make(splits, K, N, "cuda")
    m = m.to(m_device)
    op = registry.get("grouped_linear")
    assert op.choose(op.bind(x, w, m, precision="mxfp8")) == "cute"
    with torch.no_grad(), poisoned():
        y = op(x, w, m, precision="mxfp8")
    want = ref.grouped_linear(*_f64(x, w), m.cpu(), "mxfp8")
    assert_close(y, want, BF, what="grouped_linear[cute] y")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("splits", [[0, 32, 96, 0, 160], [64], [32, 0]])
def test_grouped_linear_backward(splits):
    _skip_without_gemm()
    x, w, m = _make(splits, 256, 96, "cuda", grad=True)
    op = registry.get("grouped_linear")
    with poisoned():
        y = op(x, w, m, precision="mxfp8")
        dy = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    xd, wd = _f64(x, w)
    yr = ref.grouped_linear(xd, wd, m.cpu(), "mxfp8")
    dxr, dwr = torch.autograd.grad(yr, (xd, wd), dy.double())
    assert_close(y, yr, BF, what="y")
    assert_close(dx, dxr, BF, what="dx")
    assert_close(dw, dwr, BF, what="dweight")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("splits", [[0, 1, 31, 130, 0], [200], [0, 0], [7, 0, 300, 33], [32], [(g * 7) % 5 for g in range(128)]])
@pytest.mark.parametrize("KN", [(256, 96), (168, 520)])
def test_grouped_linear_bf16_forward_backward(splits, KN):
    """precision bf16 (no quantization) on the cute backend (torch._grouped_mm): auto picks it; y, dx
    and dweight against the float64 reference of bf16 operands (fp32 accumulation, one bf16 rounding
    of each output: the bf16 tolerance), any group sizes (zeros, odd, 128 groups, M = 0), m_splits on
    the GPU, outputs poisoned; an empty group's dweight rows are zeros."""
    _skip_without_gemm()
    K, N = KN
    x, w, m = _make(splits, K, N, "cuda", grad=True)
    op = registry.get("grouped_linear")
    assert op.choose(op.bind(x, w, m)) == "cute"
    with poisoned():
        y = op(x, w, m)
        dy = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    xd, wd = _f64(x, w)
    yr = ref.grouped_linear(xd, wd, m.cpu(), "bf16")
    assert_close(y, yr, BF, what="y")
    if sum(splits):
        dxr, dwr = torch.autograd.grad(yr, (xd, wd), dy.double())
        assert_close(dx, dxr, BF, what="dx")
        assert_close(dw, dwr, BF, what="dweight")
    else:  # no tokens (the reference's empty output has no graph): dx empty, dweight zeros
        assert dx.shape == x.shape and dw.shape == w.shape
    empty = [g for g, n in enumerate(splits) if n == 0]
    assert not dw[empty].any(), "an empty group's dweight must be zeros"


@cuda
@pytest.mark.gpu
def test_grouped_linear_bf16_unaligned_views():
    """x and weight as contiguous views 2 bytes past a 16-byte boundary (torch._grouped_mm's operands
    must be aligned: the backend copies such a view first): the same results as aligned copies."""
    _skip_without_gemm()
    splits, K, N = [5, 0, 40, 19], 72, 48
    M, G = sum(splits), len(splits)
    bx = torch.randn(M * K + 1, device="cuda").to(BF)
    bw = (torch.randn(G * N * K + 1, device="cuda") / K ** 0.5).to(BF)
    x, w = bx[1:].view(M, K).requires_grad_(), bw[1:].view(G, N, K).requires_grad_()
    assert x.data_ptr() % 16 and w.data_ptr() % 16
    m = torch.tensor(splits, device="cuda")
    op = registry.get("grouped_linear")
    assert op.choose(op.bind(x, w, m)) == "cute"
    xa, wa = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with poisoned():
        y = op(x, w, m)
        dy = torch.randn_like(y)
        got = torch.autograd.grad(y, (x, w), dy)
        ya = op(xa, wa, m)
        want = torch.autograd.grad(ya, (xa, wa), dy)
    assert_close(y, ya, "exact", what="y")
    for name, g, r in zip(("dx", "dweight"), got, want):
        assert_close(g, r, "exact", what=name)


def _mlp_inputs(splits, H, F, device, grad):
    M, G = sum(splits), len(splits)
    x = torch.randn(M, H, device=device).to(BF).requires_grad_(grad)
    probs = torch.rand(M, device=device).requires_grad_(grad)
    w1 = (torch.randn(G, 2 * F, H, device=device) / H ** 0.5).to(BF).requires_grad_(grad)
    w2 = (torch.randn(G, H, F, device=device) / F ** 0.5).to(BF).requires_grad_(grad)
    return x, probs, torch.tensor(splits, dtype=torch.int64, device=device), w1, w2


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("splits", [[0, 32, 224, 0, 96], [256], [64, 0, 32]])
@pytest.mark.parametrize("HF", [(256, 256), (512, 768)])
def test_grouped_mlp_forward_backward(splits, HF):
    _skip_without_gemm()
    H, F = HF
    x, probs, m, w1, w2 = _mlp_inputs(splits, H, F, "cuda", grad=True)
    op = registry.get("grouped_mlp_mxfp8")
    assert op.choose(op.bind(x, probs, m, w1, w2)) == "cute"
    with poisoned():
        y = op(x, probs, m, w1, w2)
        dy = torch.randn_like(y)
        grads = torch.autograd.grad(y, (x, probs, w1, w2), dy)
    xd, pd, w1d, w2d = _f64(x, probs, w1, w2)
    yr = ref.grouped_mlp_mxfp8(xd, pd, m.cpu(), w1d, w2d)
    want = torch.autograd.grad(yr, (xd, pd, w1d, w2d), dy.double())
    assert_close(y, yr, BF, what="y")
    for name, g, r in zip(("dx", "dprobs", "dfc1", "dfc2"), grads, want):
        # dprobs is fp32 but a sum over F of products of quantized (bf16-level) operands: bf16 tolerance
        assert_close(g, r, BF, what=name)
    # h, a, dA and dh stay fp32 (OPS.md): the bf16 outputs are the float64 recipe rounded once but where an e4m3
    # value of a quantized intermediate flips (whole rows, rare): test_moe_grouped_mlp's bound, which an extra bf16
    # rounding of an intermediate (13-95% off) fails where the norm-wise tolerance above cannot see it
    for name, g, r in (("y", y, yr), ("dx", grads[0], want[0]), ("dfc1", grads[2], want[2]),
                       ("dfc2", grads[3], want[3])):
        assert_one_rounding(g, r, what=name, max_fraction=0.05, max_row_fraction=1.0)


@cuda
@pytest.mark.gpu
def test_mlp_forward_ragged_without_grad():
    """No gradients: group sizes need not be multiples of 32 (no columnwise blocks)."""
    _skip_without_gemm()
    x, probs, m, w1, w2 = _mlp_inputs([5, 0, 77, 130], 256, 256, "cuda", grad=False)
    with torch.no_grad(), poisoned():
        y = registry.get("grouped_mlp_mxfp8")(x, probs, m, w1, w2)
    yr = ref.grouped_mlp_mxfp8(*_f64(x, probs), m.cpu(), *_f64(w1, w2))
    assert_close(y, yr, BF, what="y")


@cuda
@pytest.mark.gpu
def test_mlp_cuda_graph_with_gpu_m_splits():
    """fwd+bwd through the registry with m_splits on the GPU: captured, replayed, no host sync."""
    _skip_without_gemm()
    x, probs, m, w1, w2 = _mlp_inputs([64, 0, 96, 32], 256, 256, "cuda", grad=True)
    op = registry.get("grouped_mlp_mxfp8")
    leaves = (x, probs, w1, w2)
    dy = torch.randn(x.shape[0], 256, device="cuda").to(BF)

    def step():
        y = op(x, probs, m, w1, w2)
        return [y, *torch.autograd.grad(y, leaves, dy)]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        m.copy_(torch.tensor([32, 96, 0, 64], device="cuda"))  # new group sizes, same total
    torch.cuda.set_sync_debug_mode("error")
    try:
        g.replay()
        got = [t.clone() for t in static]
        want = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, "exact", what=f"replay vs eager, output {i}")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["auto", "auto-no-qdq", "dq"])
@pytest.mark.parametrize("which", ["both", "fc1", "fc2"])
@pytest.mark.parametrize("splits,HF", [([0, 32, 224, 0, 96], (256, 256)), ([64, 0, 32], (512, 768))])
def test_mlp_prequantized_weights_cute(splits, HF, which, gemm, monkeypatch):
    """Pre-quantized (e4m3 + rowwise scales) weights on the cute kernels (auto picks them), called
    through the entry, along the GEMM routes (predq on qdq'd bf16 operands, predq on MXFP8 ones,
    the mainloop-dequant kernel): y, dx, dprobs and a master's wgrad against the float64
    reference, outputs poisoned (the pre-quantized weight, data without requires_grad, gets no
    gradient slot). Same tolerances as the bf16-master test."""
    from tilekernels.moe import cute_kernels as ck
    from tilekernels.moe import grouped_mlp_mxfp8

    _skip_without_gemm()
    if gemm == "auto-no-qdq":
        monkeypatch.setattr(ck, "QDQ", False)
        monkeypatch.setattr(ck, "QDQ_OUT", False)
    H, F = HF
    x, probs, m, w1, w2 = _mlp_inputs(splits, H, F, "cuda", grad=True)
    p1, p2 = which in ("both", "fc1"), which in ("both", "fc2")
    d1, s1 = prequant_weight(w1) if p1 else (w1, None)
    d2, s2 = prequant_weight(w2) if p2 else (w2, None)
    leaves = [t for t, pre_ in ((x, False), (probs, False), (w1, p1), (w2, p2)) if not pre_]
    op = registry.get("grouped_mlp_mxfp8")
    assert op.choose(op.bind(x, probs, m, d1, d2, s1, s2)) == "cute"
    old = ck.set_gemm_kernel(gemm.removesuffix("-no-qdq"))
    try:
        with poisoned():
            y = grouped_mlp_mxfp8(x, probs, m, d1, d2, s1, s2)
            dy = torch.randn_like(y)
            grads = torch.autograd.grad(y, leaves, dy)
    finally:
        ck.set_gemm_kernel(old)
    xd, pd = _f64(x, probs)
    w1d = d1 if p1 else _f64(w1)[0]
    w2d = d2 if p2 else _f64(w2)[0]
    yr = ref.grouped_mlp_mxfp8(xd, pd, m.cpu(), w1d, w2d, s1, s2)
    lr = [xd, pd] + [t for t, pre_ in ((w1d, p1), (w2d, p2)) if not pre_]
    want = torch.autograd.grad(yr, lr, dy.double())
    assert_close(y, yr, BF, what="y")
    names = ["dx", "dprobs"] + [n for n, pre_ in (("dfc1", p1), ("dfc2", p2)) if not pre_]
    for name, g, r in zip(names, grads, want):
        assert_close(g, r, BF, what=name)


def _declared(op: str) -> bool:
    return any(b.name == "cute" for b in registry.get(op).spec.backends)


def _skip_without_gemm():
    _skip_without_gpu()
    if not _declared("grouped_linear"):
        pytest.skip("the cute grouped GEMM backend is not declared yet (issue 11)")


def _skip_without_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the cute MoE kernels are sm_90a")
