"""The one-pass MXFP8 quantize-dequantize kernel (tilekernels.moe.cute_qdq) and the fused MLP's
path through it (cute_kernels.QDQ, QDQ_OUT).

CPU (CI): every variant (rowwise / columnwise, x bf16 / fp32, 128- and 64-thread configs)
compiles for sm_90a through the GPU path's launch code, without spills or flush-to-zero,
with 16-byte loads (8-byte ones in the both-axes variant); configs depend on static dims; with QDQ on and the kernels replaced
by recorders on meta tensors, which operands of the MLP's and grouped_linear's GEMMs go
through qdq and which GEMMs still take the quantized operands.

GPU (``-m gpu``): bitwise equal (NaN positions equal, every other bit equal) to
``dequantize_into(quantize_into(x))`` of ``cute_quantize`` and to the torch reference's
dequantized MXFP8, on inputs with zero blocks, NaN / +-Inf, subnormals and scale boundaries
(test_mxfp8_cute's ``make_input``), odd R, R = 1, the fallback (misaligned views, K not a
multiple of 8), R = 0; the fused MLP and grouped_linear fwd+bwd with QDQ on equal the QDQ-off
path bitwise (the GEMMs get the same bf16 operands), outputs poisoned.
"""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

cutlass = pytest.importorskip("cutlass")

from tilekernels import _cute as C  # noqa: E402
from tilekernels.moe import cute_kernels as ck  # noqa: E402
from tilekernels.moe import cute_qdq as Q  # noqa: E402
from tilekernels.moe import cute_quantize as cq  # noqa: E402
from tilekernels.moe import gemm_predq as pq  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32


# ---------------------------------------------------------------------- CPU: compile, configs

def test_every_variant_compiles_for_sm90a():
    launches = Q.representative_launches(K=4096)
    assert len(launches) == 10
    for name, ln in launches.items():
        art = ln.export("sm_90a")
        assert art.cubin[:4] == b"\x7fELF" and ".target sm_90a" in art.ptx, name
        assert "cvt.rn.satfinite.e4m3x2.f32" in art.ptx and "cvt.rn.f16x2.e4m3x2" in art.ptx, name
        assert ".ftz" not in art.ptx, f"{name}: flush-to-zero would break subnormal exactness"
        res = list(C.cubin_resources(art.cubin).values())
        assert len(res) == 1 and res[0]["regs"] <= 255 and res[0].get("frame", 0) == 0, (name, res)
        both = ".both." in name   # half-width vectors (8-byte loads): 32 rows of 16 bytes would spill
        assert set(re.findall(r"ld\.global\.[a-z0-9.]+", art.ptx)) == {f"ld.global.v{2 if both else 4}.b32"}, name
        want = {(False, True): "st.global.v4.b32", (False, False): "st.global.v2.b32",
                (True, True): "st.global.v2.b32", (True, False): "st.global.b32"}[both, name.endswith("bfloat16")]
        assert set(re.findall(r"st\.global\.[a-z0-9.]+", art.ptx)) == {want}, name


def test_compiles_for_sm100a():
    assert Q.qdq_launch(BF, 7168, True).export("sm_100a").cubin[:4] == b"\x7fELF"


def test_config_from_static_dims():
    c = Q.QdqCfg.heuristic(4096, BF, True)
    assert (c.vec, c.threads, c.rows) == (8, 128, 16)
    c = Q.QdqCfg.heuristic(1536, BF, False)          # 192 chunks: 3 x 64 threads, no idle lane
    assert (c.vec, c.threads, c.rows) == (8, 64, 32)
    assert Q.QdqCfg.heuristic(160, F32, True).threads == 64 and Q.QdqCfg.heuristic(160, F32, True).vec == 4
    with pytest.raises(ValueError):
        Q.QdqCfg(K=256, rowwise=False, vec=8, threads=128, rows=16)
    with pytest.raises(ValueError):
        Q.QdqCfg(K=48, rowwise=True, vec=8, threads=128, rows=16)
    assert Q.qdq_launch(BF, 4096, True) is Q.qdq_launch(BF, 4096, True)


@pytest.fixture
def recorded(monkeypatch):
    """QDQ on, every path predq (sm_90 as far as the choice can tell), kernels replaced by
    recorders: ("qdq", shape, axis), ("dequant", axis), (variant, gemm, out dtype)."""
    calls = []
    monkeypatch.setattr(ck, "QDQ", True)
    monkeypatch.setattr(ck, "QDQ_OUT", False)
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    monkeypatch.setattr(ck.pq, "supported", lambda dt, dev, v="fwd": (dt == BF or v != "wgrad", "test"))
    old = ck.set_gemm_kernel("auto")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def qdq(t, axis):
        calls.append(("qdq", tuple(t.shape), axis))
        return torch.empty(t.shape, dtype=BF, device=t.device)

    def deq(d, s, axis):
        calls.append(("dequant", axis))
        return torch.empty(d.shape, dtype=BF, device=d.device)
    monkeypatch.setattr(ck, "_qdq", qdq)
    monkeypatch.setattr(ck, "_qdq_both", lambda t: (qdq(t, "both"), torch.empty(t.shape, dtype=BF, device=t.device)))
    monkeypatch.setattr(ck.pq, "dequant", deq)
    monkeypatch.setattr(ck.pq, "bf16_gemm_into", lambda v, a, b, off, out: calls.append((v, "bf16", out.dtype)))
    for v in pq.VARIANTS:
        monkeypatch.setitem(ck.pq.INTO, v, lambda *a, v=v: calls.append((v, "predq", a[-1].dtype)))
    dq = SimpleNamespace(**{f"gemm_{v}_into": (lambda *a, v=v: calls.append((v, "dq", a[-1].dtype)))
                            for v in pq.VARIANTS})
    monkeypatch.setattr(ck, "_gemm", lambda: dq)
    for mod, name in ((ck.cq, "quantize_into"), (ck.cs, "swiglu_quant_fwd_into"), (ck.cs, "swiglu_quant_bwd_into")):
        monkeypatch.setattr(mod, name, lambda *a: None)
    yield calls
    ck.set_gemm_kernel(old)


def _meta_mlp(G, H, F, M):
    """Meta tensors of grouped_mlp_mxfp8 (x, probs, m_splits (two groups), w1, w2, y, h)."""
    e = dict(device="meta")
    return (torch.empty(M, H, dtype=BF, **e), torch.empty(M, **e), torch.tensor([M // 2, M // 2]),
            torch.empty(G, 2 * F, H, dtype=BF, **e), torch.empty(G, H, F, dtype=BF, **e),
            torch.empty(M, H, dtype=BF, **e), torch.empty(M, 2 * F, **e))


@pytest.mark.parametrize("min_tokens", [0, 10 ** 9])
def test_mlp_operands_through_qdq(recorded, monkeypatch, min_tokens):
    """fwd: x and W1 (rowwise), W2 (rowwise) through qdq, the SwiGLU output's MXFP8 dequantized;
    bwd: W2 and W1 columnwise through qdq, dY / dh rowwise dequantized; FC1 wgrad's x columnwise
    through qdq where the wgrad takes predq (else the quantized operands, as before); FC2's
    wgrad keeps its quantized operands (both come quantized)."""
    monkeypatch.setattr(pq, "WGRAD_MIN_TOKENS", min_tokens)
    monkeypatch.setattr(pq, "WGRAD_GEMM", "torch")
    G, H, F, M = 2, 256, 512, 64
    x, probs, m, w1, w2, y, h = _meta_mlp(G, H, F, M)
    ck._mlp_fwd(x, probs, m, w1, w2, None, None, y, h, True)
    assert recorded == [("qdq", (M, H), "rowwise"), ("qdq", (G * 2 * F, H), "rowwise"), ("fwd", "bf16", F32),
                        ("dequant", "rowwise"), ("qdq", (G * H, F), "rowwise"), ("fwd", "bf16", BF)]
    recorded.clear()
    ck._mlp_bwd(torch.empty_like(y), x, probs, m, w1, w2, None, None, h, torch.empty_like(x), torch.empty_like(probs),
                torch.empty_like(w1), torch.empty_like(w2), True)
    wg2 = [("wgrad", "predq" if min_tokens == 0 else "dq", BF)]
    wg1 = ([("dequant", "columnwise"), ("qdq", (M, H), "columnwise"), ("wgrad", "bf16", BF)] if min_tokens == 0
           else [("wgrad", "dq", BF)])
    assert recorded[:3] == [("dequant", "rowwise"), ("qdq", (G * H, F), "columnwise"), ("dgrad", "bf16", F32)]
    assert recorded[3:] == [*wg2, ("dequant", "rowwise"), ("qdq", (G * 2 * F, H), "columnwise"),
                            ("dgrad", "bf16", BF), *wg1], recorded


def test_no_weight_pass_without_tokens(recorded, monkeypatch):
    """M = 0: the forward and dgrad outputs are empty, so the weights are not qdq'd (a full
    weight read and write for nothing) and no fwd / dgrad GEMM runs; the wgrad still runs
    (it writes dW = 0)."""
    monkeypatch.setattr(pq, "WGRAD_GEMM", "cute")
    monkeypatch.setattr(ck, "QDQ_OUT", True)
    G, N, K = 2, 64, 96
    e = dict(device="meta")
    x, w, m = torch.empty(0, K, dtype=BF, **e), torch.empty(G, N, K, dtype=BF, **e), torch.tensor([0, 0])
    ck._grouped_linear_fwd(x, w, m, torch.empty(0, N, dtype=BF, **e), "mxfp8")
    assert recorded == [("qdq", (0, K), "rowwise")], recorded
    recorded.clear()
    ck._grouped_linear_bwd(torch.empty(0, N, dtype=BF, **e), x, w, m, torch.empty(0, K, dtype=BF, **e),
                           torch.empty_like(w), "mxfp8")
    assert recorded == [("qdq", (0, N), "both"), ("qdq", (0, K), "columnwise"), ("wgrad", "bf16", BF)], recorded


@pytest.mark.parametrize("wgrad", ["cute", "torch"])
def test_mlp_qdq_out_feeds_bf16_straight_to_the_gemms(recorded, monkeypatch, wgrad):
    """QDQ_OUT: no dequantize pass and no quantize of dY: the SwiGLU kernels get bf16 outputs (no
    scales), dY goes through qdq both ways (one call); the bwd takes this path only when all four GEMMs are
    predq (wgrad on torch below WGRAD_MIN_TOKENS: the dq kernel, so the quantized path)."""
    monkeypatch.setattr(ck, "QDQ_OUT", True)
    monkeypatch.setattr(pq, "WGRAD_MIN_TOKENS", 10 ** 9)
    monkeypatch.setattr(pq, "WGRAD_GEMM", wgrad)
    for name in ("swiglu_quant_fwd_into", "swiglu_quant_bwd_into"):
        monkeypatch.setattr(ck.cs, name, lambda *a, n=name: recorded.append(
            (n, tuple(str(t.dtype).removeprefix("torch.") if isinstance(t, torch.Tensor) else t for t in a[2 if "fwd" in n else 3:]))))
    G, H, F, M = 2, 256, 512, 64
    x, probs, m, w1, w2, y, h = _meta_mlp(G, H, F, M)
    ck._mlp_fwd(x, probs, m, w1, w2, None, None, y, h, True)
    assert recorded == [("qdq", (M, H), "rowwise"), ("qdq", (G * 2 * F, H), "rowwise"), ("fwd", "bf16", F32),
                        ("swiglu_quant_fwd_into", ("bfloat16", None)), ("qdq", (G * H, F), "rowwise"),
                        ("fwd", "bf16", BF)]
    recorded.clear()
    ck._mlp_bwd(torch.empty_like(y), x, probs, m, w1, w2, None, None, h, torch.empty_like(x), torch.empty_like(probs),
                torch.empty_like(w1), torch.empty_like(w2), True)
    if wgrad == "torch":
        assert ("dequant", "rowwise") in recorded and ("wgrad", "dq", BF) in recorded
        return
    assert recorded == [("qdq", (M, H), "both"), ("qdq", (G * H, F), "columnwise"),
                        ("dgrad", "bf16", F32),
                        ("swiglu_quant_bwd_into", ("bfloat16", None, "bfloat16", None, "float32", "bfloat16", None)),
                        ("wgrad", "bf16", BF), ("qdq", (G * 2 * F, H), "columnwise"), ("dgrad", "bf16", BF),
                        ("qdq", (M, H), "columnwise"), ("wgrad", "bf16", BF)], recorded


def test_qdq_off_or_dq_keeps_the_quantized_path(recorded, monkeypatch):
    """QDQ off, or kernel 'dq': no qdq call, the GEMMs get (data, scales) as before."""
    G, N, K, M = 2, 64, 96, 64
    e = dict(device="meta")
    x, w, m = torch.empty(M, K, dtype=BF, **e), torch.empty(G, N, K, dtype=BF, **e), torch.tensor([32, 32])
    ck._grouped_linear_fwd(x, w, m, torch.empty(M, N, dtype=BF, **e), "mxfp8")
    assert recorded == [("qdq", (M, K), "rowwise"), ("qdq", (G * N, K), "rowwise"), ("fwd", "bf16", BF)]
    for setup, want in ((lambda: monkeypatch.setattr(ck, "QDQ", False), "predq"),
                        (lambda: (monkeypatch.setattr(ck, "QDQ", True), ck.set_gemm_kernel("dq")), "dq")):
        setup()
        recorded.clear()
        ck._grouped_linear_fwd(x, w, m, torch.empty(M, N, dtype=BF, **e), "mxfp8")
        assert recorded == [("fwd", want, BF)]


@pytest.mark.parametrize("qdq_out", [True, False])
def test_grouped_linear_bwd_reads_dy_once(recorded, monkeypatch, qdq_out):
    """QDQ_OUT with both GEMMs predq: dY through one two-axis qdq (no quantize, no dequantize
    pass), W columnwise and x columnwise through qdq; QDQ_OUT off: dY quantized both ways (one
    pass) and each half dequantized for its GEMM, as before."""
    monkeypatch.setattr(ck, "QDQ_OUT", qdq_out)
    monkeypatch.setattr(pq, "WGRAD_GEMM", "cute")
    quant = []
    monkeypatch.setattr(ck.cq, "quantize_into", lambda *a: quant.append(tuple(t is not None for t in a[1:5])))
    G, N, K, M = 2, 64, 96, 64
    e = dict(device="meta")
    dy, x, w, m = (torch.empty(M, N, dtype=BF, **e), torch.empty(M, K, dtype=BF, **e),
                   torch.empty(G, N, K, dtype=BF, **e), torch.tensor([32, 32]))
    ck._grouped_linear_bwd(dy, x, w, m, torch.empty(M, K, dtype=BF, **e), torch.empty_like(w), "mxfp8")
    if qdq_out:
        assert quant == [] and recorded == [("qdq", (M, N), "both"), ("qdq", (G * N, K), "columnwise"),
                                            ("dgrad", "bf16", BF), ("qdq", (M, K), "columnwise"),
                                            ("wgrad", "bf16", BF)], recorded
    else:
        assert quant == [(True, True, True, True)]
        assert recorded == [("dequant", "rowwise"), ("qdq", (G * N, K), "columnwise"), ("dgrad", "bf16", BF),
                            ("dequant", "columnwise"), ("qdq", (M, K), "columnwise"), ("wgrad", "bf16", BF)], recorded


# ---------------------------------------------------------------------- GPU: bit-exact

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 CUDA device")


def _nan_aware_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    an, bn = torch.isnan(a), torch.isnan(b)
    return torch.equal(an, bn) and torch.equal(a[~an].view(torch.int16), b[~bn].view(torch.int16))


def _two_pass(x: torch.Tensor, axis: str) -> torch.Tensor:
    """dequantize_into(quantize_into(x)) of cute_quantize: what qdq must equal."""
    R, K = x.shape
    row = axis == "rowwise"
    d = torch.empty(R, K, dtype=torch.uint8, device=x.device)
    s = torch.empty((R, K // 32) if row else (R // 32, K), dtype=torch.uint8, device=x.device)
    cq.quantize_into(x, d if row else None, s if row else None, None if row else d, None if row else s)
    out = torch.empty(R, K, dtype=BF, device=x.device)
    cq.dequantize_into(d, s, out, axis)
    return out


def _check(x: torch.Tensor, axis: str, out: torch.Tensor | None = None) -> None:
    out = torch.full(x.shape, math.nan, dtype=BF, device=x.device) if out is None else out
    Q.qdq_into(x, out, axis)
    want = _two_pass(x.contiguous(), axis)
    ref = mx.dequantize(*mx.quantize(x, axis), axis, BF)
    assert _nan_aware_equal(out.cpu(), want.cpu()), \
        f"{axis} {tuple(x.shape)} {x.dtype}: differs at {(out.cpu() != want.cpu()).nonzero()[:5].tolist()}"
    assert _nan_aware_equal(out.cpu(), ref.cpu()), f"{axis} {tuple(x.shape)} {x.dtype}: differs from torch"


SHAPES = [(32, 32), (96, 160), (33, 160), (1, 32), (64, 1536), (4128, 4096)]


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@gpu
@needs_cuda
def test_qdq_bit_exact(shape, axis, dtype):
    from test_mxfp8_cute import make_input

    R, K = shape
    if axis == "columnwise" and R % 32:
        pytest.skip("columnwise needs R % 32 == 0")
    _check(make_input(R, K, dtype, "cuda"), axis)


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("shape", [(32, 32), (96, 160), (64, 1536), (4128, 4096), (0, 64)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@gpu
@needs_cuda
def test_qdq_both_bit_exact(shape, dtype):
    """qdq_both_into (one read, QdqCfg.both) gives the rowwise and columnwise qdq bit for bit, and
    equals the two-pass path; a misaligned view takes the two single-axis calls (same values)."""
    from test_mxfp8_cute import make_input

    R, K = shape
    x = make_input(R, K, dtype, "cuda") if R else torch.empty(0, K, dtype=dtype, device="cuda")
    row, col = (torch.full((R, K), float("nan"), dtype=BF, device="cuda") for _ in range(2))
    Q.qdq_both_into(x, row, col)
    for got, axis in ((row, "rowwise"), (col, "columnwise")):
        one = Q.qdq(x, axis)
        assert torch.equal(got.view(torch.int16), one.view(torch.int16)), f"{axis} {shape} {dtype}"
        if R:
            assert _nan_aware_equal(got.cpu(), _two_pass(x, axis).cpu()), f"{axis} {shape} {dtype} vs two-pass"
    if R:
        base = make_input(R, K + 8, BF, "cuda")
        v = base.view(-1)[1:1 + R * K].view(R, K)   # 2-byte aligned: not served
        r2, c2 = Q.qdq_both(v)
        assert _nan_aware_equal(r2.cpu(), _two_pass(v, "rowwise").cpu())
        assert _nan_aware_equal(c2.cpu(), _two_pass(v, "columnwise").cpu())


@gpu
@needs_cuda
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
def test_fallback_and_empty(axis):
    """A misaligned view and (columnwise) K not a multiple of 8 take quantize + dequantize (the
    same values); R = 0 launches nothing."""
    from test_mxfp8_cute import make_input

    base = make_input(64, 256 + 8, BF, "cuda")
    x = base.view(-1)[1:1 + 64 * 256].view(64, 256)          # 2-byte aligned
    assert not Q.served(x, torch.empty(64, 256, dtype=BF, device="cuda"), axis)
    _check(x, axis)
    if axis == "columnwise":
        _check(make_input(64, 100, BF, "cuda"), axis)
    out = torch.empty(0, 256, dtype=BF, device="cuda")
    Q.qdq_into(torch.empty(0, 256, dtype=BF, device="cuda"), out, axis)


def _mlp_run(qdq: bool, m, leaves, monkeypatch, qdq_out: bool = False):
    import registry

    monkeypatch.setattr(ck, "QDQ", qdq)
    monkeypatch.setattr(ck, "QDQ_OUT", qdq_out)
    x, probs, w1, w2 = leaves
    y = registry.get("grouped_mlp_mxfp8")(x, probs, m, w1, w2)
    dy = torch.ones_like(y).normal_(generator=torch.Generator("cuda").manual_seed(7))
    return (y, *torch.autograd.grad(y, (x, probs, w1, w2), dy))


@gpu
@needs_sm90
@pytest.mark.parametrize("wgrad,min_tokens", [("cute", 0), ("torch", 0), ("torch", 10 ** 9)])
def test_mlp_qdq_equals_the_two_pass_path(monkeypatch, wgrad, min_tokens):
    """grouped_mlp_mxfp8 fwd+bwd (registry, outputs poisoned) with QDQ on equals QDQ off bitwise:
    every GEMM gets the same bf16 operands; wgrad on cute_gemm_bf16, on torch._grouped_mm
    (min_tokens 0) and on dq."""
    monkeypatch.setattr(pq, "WGRAD_MIN_TOKENS", min_tokens)
    monkeypatch.setattr(pq, "WGRAD_GEMM", wgrad)
    old = ck.set_gemm_kernel("auto")
    try:
        G, H, F, splits = 4, 256, 256, [64, 0, 160, 32]
        M = sum(splits)
        leaves = (torch.randn(M, H, device="cuda").to(BF).requires_grad_(),
                  torch.rand(M, device="cuda").requires_grad_(),
                  (torch.randn(G, 2 * F, H, device="cuda") / H ** 0.5).to(BF).requires_grad_(),
                  (torch.randn(G, H, F, device="cuda") / F ** 0.5).to(BF).requires_grad_())
        m = torch.tensor(splits, device="cuda")
        off = _mlp_run(False, m, leaves, monkeypatch)
        on = _mlp_run(True, m, leaves, monkeypatch)
        out = _mlp_run(True, m, leaves, monkeypatch, qdq_out=True)
    finally:
        ck.set_gemm_kernel(old)
    for name, a, b, c in zip(("y", "dx", "dprobs", "dfc1", "dfc2"), on, off, out):
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), f"{name}: QDQ on differs from off by {(a.float() - b.float()).abs().max().item()}"
        assert torch.equal(c, b), f"{name}: QDQ_OUT differs from the two-pass path by {(c.float() - b.float()).abs().max().item()}"


@gpu
@needs_sm90
def test_grouped_linear_qdq_equals_the_two_pass_path(monkeypatch):
    import registry

    monkeypatch.setattr(pq, "WGRAD_MIN_TOKENS", 0)
    G, N, K, splits = 3, 192, 320, [96, 0, 64]
    M = sum(splits)
    x = torch.randn(M, K, device="cuda").to(BF).requires_grad_()
    w = (torch.randn(G, N, K, device="cuda") / K ** 0.5).to(BF).requires_grad_()
    m = torch.tensor(splits, device="cuda")
    dy = torch.randn(M, N, device="cuda").to(BF)
    res = []
    for q in (False, True):
        monkeypatch.setattr(ck, "QDQ", q)
        y = registry.get("grouped_linear")(x, w, m, precision="mxfp8")
        res.append((y, *torch.autograd.grad(y, (x, w), dy)))
    for name, a, b in zip(("y", "dx", "dw"), *res):
        assert torch.isfinite(a).all() and torch.equal(a, b), name
