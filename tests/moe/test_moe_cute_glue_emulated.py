"""The cute backend's grouped_mlp_mxfp8 glue (tilekernels/moe/cute_kernels.py) run on the CPU.

Which operand each of the fused MLP's GEMMs gets, quantized along which axis, from which
buffer, and which GEMMs run at all (no wgrad for a pre-quantized weight) is decided in
Python, in ``_mlp_fwd`` / ``_mlp_bwd`` and the helpers they call. Here every CuTe DSL
building block they launch (quantize, dequantize, qdq, the SwiGLU + MXFP8 passes, the
grouped GEMMs) is replaced by a torch stand-in with the same contract, each of them tested
against those kernels on the GPU by its own file, so the glue computes real numbers on CPU
tensors and is compared with the torch reference: along each GEMM route the backend can take
(the mainloop-dequant kernel "dq"; predq on MXFP8 operands; predq on qdq'd bf16 operands; the
same with the SwiGLU passes writing bf16) and for bf16 master weights, pre-quantized ones
and one of each.

Tolerance "exact": the stand-ins compute the reference's quantized operand values and the same
fp32 products in the same torch calls, so every output is bitwise the reference's.

Weight operands: quantizing an MXFP8 value again along the other axis moves it only where a
block's scale pushes it into e4m3's subnormal range (MXFP8 rounds to 4 significant bits whatever
the power-of-two scale), so with plain Gaussian weights a skipped or misplaced requantization
can leave every output bit unchanged. So the stand-in GEMM records each fwd / dgrad weight
operand and the test compares it with the weight's value quantized along K / N; and
fc2_weight's rows span 2^-8..2^8 (dy's columns the inverse), so that the FC2 dgrad's weight
axis shows in dx too (~5% norm-wise; ``test_check_sees_a_skipped_requantization``).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mxfp8_gemm_helpers import prequant_weight
from tilekernels.moe import cute_kernels as ck
from tilekernels.moe import mxfp8 as mx
from tilekernels.moe import reference as ref
from tilekernels.testing import assert_close, rel_err

BF, F32 = torch.bfloat16, torch.float32
S = ref.MLP_GLU_INTERLEAVE


def _fq(t: torch.Tensor, axis: str) -> torch.Tensor:
    """The fp32 MXFP8 value of t along ``axis``."""
    return (mx.fq_columnwise if axis == "columnwise" else mx.fq_rowwise)(t.float(), F32)


def _put(t: torch.Tensor, data, scales, axis: str) -> None:
    """Write t's MXFP8 along ``axis`` into (data, scales), or its bf16 value into data when
    scales is None (the kernels' bf16-output mode)."""
    if data is None:
        return
    if scales is None:
        data.copy_(_fq(t, axis).to(BF))
        return
    d, s = mx.quantize(t.float(), axis)
    data.copy_(d)
    scales.copy_(s)


def _quantize_into(x, rd, rs, cd, cs_):
    _put(x, rd, rs, "rowwise")
    _put(x, cd, cs_, "columnwise")


def _dequantize_into(data, scales, out, axis):
    out.copy_(mx.dequantize(data, scales, axis, F32))


WEIGHT_OPERANDS: list = []  # (variant, weight operand's fp32 value) of every fwd / dgrad GEMM


def _bf16_gemm_into(variant, a, b, off, out):
    """pq.bf16_gemm_into's contract in fp32 on the operands' values, per group; records the
    weight operand of fwd / dgrad (b [G, N, K]) for the operand check."""
    if variant != "wgrad":
        WEIGHT_OPERANDS.append((variant, b.float().clone()))
    ends = off.tolist()
    for g in range(len(ends) - 1):
        r = slice(ends[g], ends[g + 1])
        if variant == "wgrad":
            out[g] = (a[r].float().t() @ b[r].float()).to(out.dtype)
        elif r.stop > r.start:
            w = b[g].float()
            out[r] = (a[r].float() @ (w.t() if variant == "fwd" else w)).to(out.dtype)


def _swiglu_quant_fwd_into(h, probs, a_data, a_scales):
    _put(ref.swiglu_fwd(h, probs, S), a_data, a_scales, "rowwise")


def _swiglu_quant_bwd_into(da, h, probs, dh_rd, dh_rs, dh_cd, dh_cs, dprobs, a_cd=None, a_cs=None):
    dh, dp = ref.swiglu_bwd(da, h, probs, S)
    dprobs.copy_(dp)
    _put(dh, dh_rd, dh_rs, "rowwise")
    _put(dh, dh_cd, dh_cs, "columnwise")
    _put(ref.swiglu_fwd(h, probs, S), a_cd, a_cs, "columnwise")


ROUTES = {  # name: (GEMM kernel, QDQ, QDQ_OUT)
    "dq": ("dq", False, False),
    "predq-mxfp8": ("predq", False, False),
    "predq-qdq": ("predq", True, False),
    "predq-qdq-out": ("predq", True, True),
}


@pytest.fixture
def emulated(monkeypatch):
    """The building blocks replaced by their torch stand-ins; returns a route setter."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(ck.pq, "supported", lambda dt, dev, v="fwd": (dt == BF or v != "wgrad", "emulated"))
    monkeypatch.setattr(ck.pq, "WGRAD_GEMM", "cute")
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    monkeypatch.setattr(ck, "PREDQ_FP32_DEFAULT", True)
    monkeypatch.setattr(ck.cq, "quantize_into", _quantize_into)
    monkeypatch.setattr(ck.cq, "dequantize_into", _dequantize_into)
    monkeypatch.setattr(ck.pq, "bf16_gemm_into", _bf16_gemm_into)
    monkeypatch.setattr(ck, "_qdq", lambda t, axis: _fq(t, axis).to(BF))
    monkeypatch.setattr(ck, "_qdq_both", lambda t: (_fq(t, "rowwise").to(BF), _fq(t, "columnwise").to(BF)))
    monkeypatch.setattr(ck.cs, "swiglu_quant_fwd_into", _swiglu_quant_fwd_into)
    monkeypatch.setattr(ck.cs, "swiglu_quant_bwd_into", _swiglu_quant_bwd_into)
    # the dq kernels' contract is the predq functions' (dequantize the operands, multiply)
    monkeypatch.setattr(ck, "_gemm", lambda: SimpleNamespace(**{f"gemm_{v}_into": ck.pq.INTO[v]
                                                                  for v in ck.pq.VARIANTS}))
    old = ck.set_gemm_kernel("auto")
    WEIGHT_OPERANDS.clear()

    def route(name):
        kernel, qdq, qdq_out = ROUTES[name]
        ck.set_gemm_kernel(kernel)
        monkeypatch.setattr(ck, "QDQ", qdq)
        monkeypatch.setattr(ck, "QDQ_OUT", qdq_out)

    yield route
    ck.set_gemm_kernel(old)


def _inputs(m_splits, H=256, F=256):
    """Inputs plus dy, with a wide range along fc2_weight's N (H): row n of fc2_weight scaled by
    2^r_n, column n of dy by 2^-r_n (r_n in [-8, 8]), so the FC2 dgrad's terms dy[m, n] W[n, k]
    stay alike while its columnwise weight blocks (32 rows n, scales set by their largest row)
    put the small rows' values into e4m3's subnormal range: whether the weight is quantized
    along N or along K then shows in da's bits."""
    M, G = sum(m_splits), len(m_splits)
    x = torch.randn(M, H).to(BF)
    probs = torch.rand(M) + 0.1
    r = torch.exp2(torch.randint(-8, 9, (H,)).float())
    w1 = (torch.randn(G, 2 * F, H) / H ** 0.5).to(BF)
    w2 = (torch.randn(G, H, F) / F ** 0.5 * r[None, :, None]).to(BF)
    dy = (torch.randn(M, H) / r).to(BF)
    return x, probs, torch.tensor(m_splits), w1, w2, dy


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("which", ["none", "both", "fc1", "fc2"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_mlp_glue_matches_reference(emulated, route, which):
    """Forward (y, h) and backward (dx, dprobs, dfc1, dfc2) of the cute kernels' glue against the
    reference; outputs NaN-poisoned; a pre-quantized weight's gradient slot is None and stays so."""
    emulated(route)
    m_splits = [64, 0, 96, 32]
    x, probs, ms, w1, w2, dy = _inputs(m_splits)
    M, H, F, G = x.shape[0], x.shape[1], w2.shape[2], len(m_splits)
    p1, p2 = which in ("both", "fc1"), which in ("both", "fc2")
    d1, s1 = prequant_weight(w1) if p1 else (w1, None)
    d2, s2 = prequant_weight(w2) if p2 else (w2, None)
    y, h = _nan(M, H, dtype=BF), _nan(M, 2 * F, dtype=F32)
    ck._mlp_fwd(x, probs, ms, d1, d2, s1, s2, y, h, True)
    y_ref, h_ref = ref.grouped_mlp_mxfp8_fwd(x, probs, ms, d1, d2, True, s1, s2)
    assert_close(h, h_ref, "exact", what="h")
    assert_close(y, y_ref, "exact", what="y")

    dx, dprobs = _nan(M, H, dtype=BF), _nan(M, dtype=F32)
    dfc1 = None if p1 else _nan(G, 2 * F, H, dtype=BF)
    dfc2 = None if p2 else _nan(G, H, F, dtype=BF)
    ck._mlp_bwd(dy, x, probs, ms, d1, d2, s1, s2, h, dx, dprobs, dfc1, dfc2, True)
    want = ref.grouped_mlp_mxfp8_bwd(dy, x, probs, ms, d1, d2, h, True, s1, s2)
    assert_close(dx, want[0], "exact", what="dx")
    assert_close(dprobs, want[1], "exact", what="dprobs")
    for got, exp, name in ((dfc1, want[2], "dfc1"), (dfc2, want[3], "dfc2")):
        assert (got is None) == (exp is None), name
        if got is not None:
            assert_close(got, exp, "exact", what=name)

    # every weight operand directly (a slip in a requantization can hide in the outputs when few
    # values sit near a block's subnormal range, as with fc1's plain Gaussian rows here)
    assert _weight_operand_slips((d1, s1), (d2, s2)) == []


def _weight_operand_slips(*weights) -> list:
    """The fwd / dgrad GEMMs (recorded) whose weight operand is not the weight's value quantized
    along K (fwd) or along N (dgrad); each weight (data or master, scales or None) must appear
    once in each."""
    want = {}
    for w, sc in weights:
        v = ref.weight_value(w, sc, F32).float()
        G, N, K = v.shape
        for variant, axis in (("fwd", "rowwise"), ("dgrad", "columnwise")):
            want[(variant, tuple(v.shape))] = _fq(v.reshape(G * N, K), axis).reshape(G, N, K)
    seen = sorted((variant, tuple(b.shape)) for variant, b in WEIGHT_OPERANDS)
    assert seen == sorted(want), seen
    return [(variant, tuple(b.shape)) for variant, b in WEIGHT_OPERANDS
            if not torch.equal(b, want[(variant, tuple(b.shape))])]


@pytest.mark.parametrize("weight", ["fc1", "fc2"])
def test_check_sees_a_skipped_requantization(emulated, monkeypatch, weight):
    """The checks above fail on the slip most likely here: a pre-quantized weight fed to its dgrad
    as it is, without the columnwise requantization along N (a columnwise qdq that returns its
    input, for that weight only). The operand check names the GEMM; for fc2, whose rows span
    2^-8..2^8, dx also misses the reference by more than the bf16 tolerance."""
    emulated("predq-qdq-out")
    x, probs, ms, w1, w2, dy = _inputs([64, 0, 32])
    if weight == "fc1":  # fc1's rows (its N) over 2^-8..2^8 too: with alike rows the columnwise requantization
        # can give back the very bits it got (CI met such a seed), and then no check can see it skipped
        w1 = (w1.float() * torch.exp2(torch.randint(-8, 9, (w1.shape[1],)).float())[None, :, None]).to(BF)
    (d1, s1), (d2, s2) = prequant_weight(w1), prequant_weight(w2)
    h = ref.grouped_mlp_mxfp8_fwd(x, probs, ms, d1, d2, True, s1, s2)[1]
    want = ref.grouped_mlp_mxfp8_bwd(dy, x, probs, ms, d1, d2, h, True, s1, s2)[0]
    rows = (d1 if weight == "fc1" else d2).shape[0] * (d1 if weight == "fc1" else d2).shape[1]
    qdq = ck._qdq
    monkeypatch.setattr(ck, "_qdq", lambda t, axis: t.to(BF) if axis == "columnwise" and t.shape[0] == rows
                        else qdq(t, axis))
    y, hh = _nan(*x.shape, dtype=BF), _nan(*h.shape, dtype=F32)
    ck._mlp_fwd(x, probs, ms, d1, d2, s1, s2, y, hh, True)
    dx, dprobs = _nan(*x.shape, dtype=BF), _nan(x.shape[0], dtype=F32)
    ck._mlp_bwd(dy, x, probs, ms, d1, d2, s1, s2, h, dx, dprobs, None, None, True)
    assert _weight_operand_slips((d1, s1), (d2, s2)) == [("dgrad", tuple((d1 if weight == "fc1" else d2).shape))]
    if weight == "fc2":
        assert rel_err(dx, want) > 1e-2
