"""The ``kernel="predq"`` MXFP8 grouped GEMMs (tilekernels/moe/gemm_predq.py) and the cute
backend's choice between them and the mainloop-dequant kernel (cute_kernels.gemm_choice).

CPU (CI): which path a GEMM takes and why (bf16 out on sm_90 -> predq; an fp32 fwd / dgrad
out on sm_90 -> predq through cute_gemm_bf16 unless ``PREDQ_FP32_DEFAULT`` is off; an fp32
wgrad out, another device, or ``kernel="dq"`` -> dq), and, with the kernels replaced by
recorders on meta tensors, which path each of the fused MLP's six GEMMs and grouped_linear's
three take.

GPU (``gpu`` marker, sm_90): outputs poisoned with NaN, against float64 of the dequantized
operands (the GEMM helpers of test_grouped_gemm_cute.py, its runner swapped for predq):
ragged and zero-sized groups, odd sizes, M = 32, M = 0, one group, 128 groups, one expert
taking all tokens, N / K not tile multiples, bf16 and (fwd / dgrad) fp32 outputs; a 0xFF scale gives NaN exactly where the
reference has it; CUDA-graph replay after new device group sizes equals eager bitwise, with
no host sync; the dequantized operands equal the torch dequantization bitwise; the fused MLP
fwd+bwd through both paths against the float64 reference.

Tolerance (bf16 out, 1e-2 norm-wise): the operands are exactly the dequantized MXFP8 values
(e4m3 x 2^k fits bf16), their products are exact in the fp32 accumulators, so the output
differs from float64 only by fp32 summation (~K * 2^-24 relative, worst case) and the final
bf16 rounding (2^-9 relative per element), far below 1e-2.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tilekernels.moe import cute_kernels as ck
from tilekernels.moe import gemm_predq as pq

BF, F32 = torch.bfloat16, torch.float32


# ====================================================================== CPU: dispatch


@pytest.fixture
def sm90(monkeypatch):
    """A CUDA device of capability (9, 0) as far as the path choice can tell."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch, "_grouped_mm", getattr(torch, "_grouped_mm", None) or (lambda *a, **k: None),
                        raising=False)
    old = ck.set_gemm_kernel("auto")
    yield
    ck.set_gemm_kernel(old)


def test_choice_bf16_out_on_sm90_is_predq(sm90, monkeypatch):
    k, why = ck.gemm_choice(BF, torch.device("cuda"))
    assert (k == "predq") == ck.PREDQ_DEFAULT, why
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    assert ck.gemm_choice(BF, torch.device("cuda")) == ("predq", pq.supported(BF, torch.device("cuda"))[1])
    ck.set_gemm_kernel("predq")
    assert ck.gemm_choice(BF, torch.device("cuda"))[0] == "predq"


@pytest.mark.parametrize("kernel", ["auto", "predq"])
def test_choice_falls_back_to_dq_with_the_reason(sm90, monkeypatch, kernel):
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    ck.set_gemm_kernel(kernel)
    k, why = ck.gemm_choice(F32, torch.device("cuda"), "wgrad")
    assert k == "dq" and "an fp32 wgrad output" in why
    k, why = ck.gemm_choice(torch.float16, torch.device("cuda"))
    assert k == "dq" and "bf16 or fp32 outputs only" in why
    k, why = ck.gemm_choice(BF, torch.device("cpu"))
    assert k == "dq" and "needs a CUDA device, got cpu" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (10, 0))
    k, why = ck.gemm_choice(BF, torch.device("cuda"))
    assert k == "dq" and "device is sm_100" in why
    monkeypatch.delattr(torch, "_grouped_mm")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    k, why = ck.gemm_choice(BF, torch.device("cuda"))
    assert k == "dq" and "has no _grouped_mm" in why


@pytest.mark.parametrize("variant", ["fwd", "dgrad"])
def test_choice_fp32_out_fwd_dgrad_takes_the_bf16_kernel(sm90, monkeypatch, variant):
    """fp32 outputs of fwd / dgrad: predq (dequantize + cute_gemm_bf16) under auto when both
    defaults are on; PREDQ_FP32_DEFAULT off gives dq under auto but not under "predq"; "dq"
    always wins."""
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    cuda = torch.device("cuda")
    monkeypatch.setattr(ck, "PREDQ_FP32_DEFAULT", True)
    k, why = ck.gemm_choice(F32, cuda, variant)
    assert k == "predq" and "cute_gemm_bf16" in why
    monkeypatch.setattr(ck, "PREDQ_FP32_DEFAULT", False)
    k, why = ck.gemm_choice(F32, cuda, variant)
    assert k == "dq" and "PREDQ_FP32_DEFAULT off" in why
    assert ck.gemm_choice(BF, cuda, variant)[0] == "predq"
    ck.set_gemm_kernel("predq")
    assert ck.gemm_choice(F32, cuda, variant)[0] == "predq"
    ck.set_gemm_kernel("dq")
    assert ck.gemm_choice(F32, cuda, variant) == ("dq", "kernel='dq' selected")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (10, 0))
    ck.set_gemm_kernel("auto")
    monkeypatch.setattr(ck, "PREDQ_FP32_DEFAULT", True)
    k, why = ck.gemm_choice(F32, cuda, variant)
    assert k == "dq" and "device is sm_100" in why


def test_choice_dq_selected_and_auto_default_off(sm90, monkeypatch):
    ck.set_gemm_kernel("dq")
    assert ck.gemm_choice(BF, torch.device("cuda")) == ("dq", "kernel='dq' selected")
    ck.set_gemm_kernel("auto")
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", False)
    assert ck.gemm_choice(BF, torch.device("cuda"))[0] == "dq"
    with pytest.raises(ValueError, match="kernel must be one of"):
        ck.set_gemm_kernel("ws")


@pytest.fixture
def recorded(sm90, monkeypatch):
    """Every kernel the MoE cute entry points launch replaced by a recorder; (variant, kernel,
    out dtype) of each GEMM in call order."""
    calls = []
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    monkeypatch.setattr(ck, "QDQ", False)   # (the qdq operand path: test_qdq_cute.py)
    monkeypatch.setattr(ck.pq, "supported", lambda dt, dev, v="fwd": (dt == BF or v != "wgrad", "test"))
    for v in pq.VARIANTS:
        monkeypatch.setitem(ck.pq.INTO, v, lambda *a, v=v: calls.append((v, "predq", a[-1].dtype)))
    dq = SimpleNamespace(**{f"gemm_{v}_into": (lambda *a, v=v: calls.append((v, "dq", a[-1].dtype)))
                            for v in pq.VARIANTS})
    monkeypatch.setattr(ck, "_gemm", lambda: dq)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    for mod, name in ((ck.cq, "quantize_into"), (ck.cs, "swiglu_quant_fwd_into"), (ck.cs, "swiglu_quant_bwd_into")):
        monkeypatch.setattr(mod, name, lambda *a: None)
    return calls


@pytest.mark.parametrize("tokens", [32, 4096])
def test_wgrad_choice_follows_tokens_per_expert(sm90, monkeypatch, tokens):
    """auto: wgrad takes predq from WGRAD_MIN_TOKENS tokens per expert up (its [G, N, K] output
    copy is paid per call); an explicit "predq" ignores the rule; fwd/dgrad never look at it;
    with WGRAD_GEMM = "cute" (no copy) wgrad takes predq at any tokens."""
    monkeypatch.setattr(ck, "PREDQ_DEFAULT", True)
    monkeypatch.setattr(pq, "WGRAD_GEMM", "torch")
    cuda = torch.device("cuda")
    k, why = ck.gemm_choice(BF, cuda, "wgrad", tokens)
    assert k == ("predq" if tokens >= pq.WGRAD_MIN_TOKENS else "dq"), why
    monkeypatch.setattr(pq, "WGRAD_GEMM", "cute")
    assert ck.gemm_choice(BF, cuda, "wgrad", tokens)[0] == "predq"
    monkeypatch.setattr(pq, "WGRAD_GEMM", "torch")
    assert ck.gemm_choice(BF, cuda, "fwd", tokens)[0] == ck.gemm_choice(BF, cuda, "dgrad", tokens)[0] == "predq"
    ck.set_gemm_kernel("predq")
    assert ck.gemm_choice(BF, cuda, "wgrad", tokens)[0] == "predq"


@pytest.mark.parametrize("fp32_default", [True, False])
@pytest.mark.parametrize("min_tokens", [0, 10 ** 9])
def test_mlp_gemm_paths(recorded, monkeypatch, min_tokens, fp32_default):
    """FC1 fwd (h) and FC2 dgrad (dA) write fp32 accumulators: predq (cute_gemm_bf16) when
    PREDQ_FP32_DEFAULT, else dq; FC2 fwd and FC1 dgrad: predq; the wgrads predq only with
    enough tokens per expert."""
    monkeypatch.setattr(pq, "WGRAD_MIN_TOKENS", min_tokens)
    monkeypatch.setattr(pq, "WGRAD_GEMM", "torch")
    monkeypatch.setattr(ck, "PREDQ_FP32_DEFAULT", fp32_default)
    wg = "predq" if min_tokens == 0 else "dq"
    f32 = "predq" if fp32_default else "dq"
    G, H, F, M = 2, 256, 256, 64
    e = dict(device="meta")
    x, probs, m = torch.empty(M, H, dtype=BF, **e), torch.empty(M, **e), torch.tensor([32, 32])
    w1, w2 = torch.empty(G, 2 * F, H, dtype=BF, **e), torch.empty(G, H, F, dtype=BF, **e)
    y, h = torch.empty(M, H, dtype=BF, **e), torch.empty(M, 2 * F, **e)
    ck._mlp_fwd(x, probs, m, w1, w2, None, None, y, h, True)
    assert recorded == [("fwd", f32, F32), ("fwd", "predq", BF)]
    recorded.clear()
    ck._mlp_bwd(torch.empty_like(y), x, probs, m, w1, w2, None, None, h, torch.empty_like(x), torch.empty_like(probs),
                torch.empty_like(w1), torch.empty_like(w2), True)
    assert recorded == [("dgrad", f32, F32), ("wgrad", wg, BF), ("dgrad", "predq", BF), ("wgrad", wg, BF)]


def test_grouped_linear_gemm_paths(recorded, monkeypatch):
    monkeypatch.setattr(pq, "WGRAD_MIN_TOKENS", 32)
    G, N, K, M = 2, 64, 96, 64
    e = dict(device="meta")
    x, w, m = torch.empty(M, K, dtype=BF, **e), torch.empty(G, N, K, dtype=BF, **e), torch.tensor([32, 32])
    ck._grouped_linear_fwd(x, w, m, torch.empty(M, N, dtype=BF, **e), "mxfp8")
    ck._grouped_linear_bwd(torch.empty(M, N, dtype=BF, **e), x, w, m, torch.empty_like(x), torch.empty_like(w),
                           "mxfp8")
    assert recorded == [("fwd", "predq", BF), ("dgrad", "predq", BF), ("wgrad", "predq", BF)]


# ====================================================================== GPU

gpu = pytest.mark.gpu
needs_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 CUDA device")


@pytest.fixture
def tg(monkeypatch):
    """test_grouped_gemm_cute's GEMM checks, running the predq path instead of the CuTe kernel."""
    pytest.importorskip("cutlass")
    import test_grouped_gemm_cute as m

    def run(variant, p, offsets, out, cfg=None):
        # the allocator's next block of out's size holds NaN: torch._grouped_mm's result lands
        # there, so a group it skips (an empty wgrad group must come out zero) shows as NaN
        torch.full_like(out, float("nan"))
        pq.INTO[variant](*p["a"], *p["b"], offsets, out)
    monkeypatch.setattr(m, "run_variant", run)
    return m


SPLITS_M = [
    [37, 0, 100, 63],            # zeros, odd sizes
    [0, 1, 31, 0, 517, 129],     # 1, 31 (not multiples of 16), empty groups
    [32],                        # M = 32, one group
    [0, 0, 0],                   # M = 0
    [0, 0, 4096, 0, 0, 0, 0, 0],  # G = 8, one expert takes all tokens
    [(g * 7) % 5 for g in range(128)],  # 128 groups, sizes 0..4
]
SPLITS_K = [[32, 0, 96, 320], [0, 0], [1024], [0, 0, 0, 2048, 0, 0, 0, 0],
            [32 * ((g * 3) % 4) for g in range(128)]]
DIMS = [(352, 224), (512, 256)]


@gpu
@needs_sm90
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d[0]}K{d[1]}")
@pytest.mark.parametrize("splits", SPLITS_M, ids=lambda s: f"G{len(s)}-{str(s[:6])}")
@pytest.mark.parametrize("variant", ["fwd", "dgrad"])
def test_ragged_m_matches_reference(tg, variant, splits, dims):
    tg.check_against_ref(variant, tg.MAKE[variant](splits, *dims), splits, BF)


@gpu
@needs_sm90
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d[0]}K{d[1]}")
@pytest.mark.parametrize("splits", SPLITS_K, ids=lambda s: f"G{len(s)}-{str(s[:6])}")
def test_wgrad_matches_reference(tg, splits, dims):
    """Empty groups give zeros (the output was NaN-poisoned)."""
    tg.check_against_ref("wgrad", tg.make_wgrad(splits, *dims), splits, BF)


@gpu
@needs_sm90
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d[0]}K{d[1]}")
@pytest.mark.parametrize("splits", SPLITS_M, ids=lambda s: f"G{len(s)}-{str(s[:6])}")
@pytest.mark.parametrize("variant", ["fwd", "dgrad"])
def test_ragged_m_fp32_out_matches_reference(tg, variant, splits, dims):
    """fp32 outputs (dequantize + cute_gemm_bf16) meet fp32's 1e-5."""
    tg.check_against_ref(variant, tg.MAKE[variant](splits, *dims), splits, F32)


@gpu
@needs_sm90
@pytest.mark.parametrize("splits", SPLITS_M[:3] + SPLITS_M[4:5], ids=lambda s: f"G{len(s)}-{str(s[:6])}")
@pytest.mark.parametrize("variant", ["fwd", "dgrad"])
def test_bf16_out_through_the_cute_gemm(tg, monkeypatch, variant, splits):
    """BF16_OUT_GEMM = "cute": bf16 outputs of fwd / dgrad on cute_gemm_bf16 (whatever the default)."""
    monkeypatch.setattr(pq, "BF16_OUT_GEMM", "cute")
    tg.check_against_ref(variant, tg.MAKE[variant](splits, *DIMS[0]), splits, BF)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", ["fwd", "dgrad"])
def test_int32_offsets(tg, variant):
    splits = [3, 0, 250, 60]
    tg.check_against_ref(variant, tg.MAKE[variant](splits, 288, 256), splits, BF, torch.int32)


@gpu
@needs_sm90
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("variant", pq.VARIANTS)
def test_nan_scale_feeds_exactly_its_rows_or_cols(tg, variant, operand):
    tg.check_nan_scale(variant, operand)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", pq.VARIANTS)
def test_cuda_graph_replay_equals_eager_without_sync(tg, variant):
    """Captured with one set of device group sizes, replayed after they changed: bitwise equal
    to eager (checked by check_graph_replay); an eager call does not sync the host."""
    tg.check_graph_replay(variant)
    p = tg.MAKE[variant]([64, 0, 96, 32], 288, 256)
    out = torch.empty(tg.out_shape(variant, p), dtype=BF, device="cuda")
    offsets = tg._offsets([64, 0, 96, 32])
    torch.cuda.set_sync_debug_mode("error")
    try:
        tg.run_variant(variant, p, offsets, out)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
@needs_sm90
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
def test_dequantized_operands_equal_the_torch_dequantization(axis):
    """The bf16 operands handed to torch._grouped_mm are bitwise the reference dequantization
    (NaN blocks included, subnormal-range values rounded the same way)."""
    from tilekernels.moe import mxfp8 as mx

    R, C = 96, 256
    x = torch.randn(R, C, device="cuda") * torch.exp2(torch.randint(-130, 130, (R, 1), device="cuda").float())
    x[5, 40] = float("nan")
    x[64 + 3, 7] = float("inf")
    d, s = (mx.quantize_rowwise if axis == "rowwise" else mx.quantize_columnwise)(x)
    got = pq.dequant(d, s, axis)
    want = (mx.dequantize_rowwise if axis == "rowwise" else mx.dequantize_columnwise)(d, s, BF)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got).any()
    fin = ~torch.isnan(want)
    assert torch.equal(got[fin].view(torch.int16), want[fin].view(torch.int16))


@gpu
@needs_sm90
@pytest.mark.parametrize("kernel", ["predq", "dq"])
def test_mlp_through_both_paths(kernel):
    """grouped_mlp_mxfp8 fwd+bwd through the registry with either GEMM path (outputs poisoned)
    against the float64 reference of the same MXFP8 recipe."""
    import registry
    from tilekernels.moe import reference as ref
    from tilekernels.testing import assert_close

    G, H, F, splits = 4, 256, 256, [64, 0, 160, 32]
    M = sum(splits)
    x = torch.randn(M, H, device="cuda").to(BF).requires_grad_()
    probs = torch.rand(M, device="cuda").requires_grad_()
    w1 = (torch.randn(G, 2 * F, H, device="cuda") / H ** 0.5).to(BF).requires_grad_()
    w2 = (torch.randn(G, H, F, device="cuda") / F ** 0.5).to(BF).requires_grad_()
    m = torch.tensor(splits, device="cuda")
    old = ck.set_gemm_kernel(kernel)
    try:
        y = registry.get("grouped_mlp_mxfp8")(x, probs, m, w1, w2)
        dy = torch.randn_like(y)
        grads = torch.autograd.grad(y, (x, probs, w1, w2), dy)
    finally:
        ck.set_gemm_kernel(old)
    leaves = [t.detach().double().requires_grad_() for t in (x, probs, w1, w2)]
    yr = ref.grouped_mlp_mxfp8(leaves[0], leaves[1], m.cpu(), leaves[2], leaves[3])
    want = torch.autograd.grad(yr, leaves, dy.double())
    assert_close(y, yr, BF, what=f"y [{kernel}]")
    for name, g, r in zip(("dx", "dprobs", "dfc1", "dfc2"), grads, want):
        assert_close(g, r, BF, what=f"{name} [{kernel}]")
