"""The CuTe DSL bf16-operand grouped GEMM (tilekernels/moe/cute_gemm_bf16.py): TMA + wgmma,
fp32 or bf16 output, fwd and dgrad (ragged m) and wgrad (ragged reduction over each group's
tokens, every group a multiple of 32).

CPU (CI): every config the heuristic can return (fwd / dgrad / wgrad x tile_n 256 / 128) compiles for
sm_90a with fake arguments, for both output dtypes, with TMA loads and wgmmas in the PTX and no
register spills; the heuristic reads static dims only.

GPU (``gpu`` marker, sm_90): outputs poisoned with NaN, against float64 of the same bf16
operands: ragged groups including zero-sized ones, M = 32, one expert, 128 experts, one expert
taking all tokens, groups and N / K not tile multiples, int32 offsets; CUDA-graph replay after
the device group sizes changed equals eager bitwise (and the reference); another tile / stage /
CTA-count config (tile_n 128, 3 stages, 17 persistent CTAs) agrees with the reference. wgrad:
the same against float64 of a_g^T . b_g per group, an empty group (and M = 0) all zeros.

Tolerance: fp32 out meets fp32's 1e-5 (bf16 x bf16 products are exact in fp32, only the
summation order differs from float64); bf16 out meets bf16's 1e-2.
"""
from __future__ import annotations

import pytest
import torch

from tilekernels.moe import cute_gemm_bf16 as kb
from tilekernels.testing import assert_close

BF, F32 = torch.bfloat16, torch.float32

# (variant, G, N, K): one shape per heuristic config (the output dim decides tile_n)
HEUR_SHAPES = [("fwd", 8, 4096, 7168), ("fwd", 4, 128, 256), ("dgrad", 8, 7168, 2048), ("dgrad", 4, 256, 96),
               ("wgrad", 32, 3072, 4096), ("wgrad", 4, 96, 128)]
RAGGED_M = ("fwd", "dgrad")


# ====================================================================== CPU


@pytest.mark.parametrize("variant,G,N,K", HEUR_SHAPES)
def test_heuristic_configs_compile_for_sm90a(variant, G, N, K):
    from tilekernels._cute import cubin_resources, setmaxnreg_budget, unfenced_releases

    cfg = kb.Bf16GemmCfg.heuristic(variant, G, N, K)
    nc = N if variant == "fwd" else K
    assert cfg.tile_n == (256 if nc > 128 else 128)
    assert (cfg.tile_k, cfg.stages) == ((32, 8) if variant == "wgrad" else (64, 4))
    for out in (F32, BF):
        art = kb.gemm_launch(variant, G, N, K, out, torch.int64, cfg).export("sm_90a")
        assert "wgmma.mma_async" in art.ptx and "cp.async.bulk.tensor" in art.ptx
        assert "setmaxnreg" in art.ptx
        res = cubin_resources(art.cubin)
        assert res and all(r.get("frame", 0) == 0 for r in res.values()), res
        need, have = setmaxnreg_budget(art)
        unfenced = unfenced_releases(art.ptx)
        assert not unfenced, f"stages released after ld.shared, unfenced: PTX lines {unfenced}"
        assert 0 < need <= have, (need, have)


def test_heuristic_uses_static_dims_only():
    import inspect

    assert "M" not in inspect.signature(kb.Bf16GemmCfg.heuristic).parameters
    with pytest.raises(AssertionError):
        kb.Bf16GemmCfg("fwd", 1, 64, 64, tile_n=192)
    with pytest.raises(AssertionError):
        kb.Bf16GemmCfg("fwd", 1, 64, 64, stages=5)   # 5 x 48 KiB > one SM's shared memory


def test_supported_reasons():
    ok, why = kb.supported("bogus", 8, 64, 64, F32, torch.device("cuda"))
    assert not ok and "wgrad" in why
    ok, why = kb.supported("fwd", 8, 64, 68, F32, torch.device("cuda"))
    assert not ok and "multiples of 8" in why
    ok, why = kb.supported("fwd", 8, 64, 64, F32, torch.device("cpu"))
    assert not ok and "CUDA" in why


# ====================================================================== GPU

gpu = pytest.mark.gpu
needs_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 GPU")
DEV = "cuda"


def _offsets(splits, dtype=torch.int64):
    off = torch.zeros(len(splits) + 1, dtype=dtype)
    off[1:] = torch.tensor(splits).cumsum(0)
    return off.to(DEV)


def make(variant, splits, N, K, seed=0):
    """bf16 operands: a [M, Kc] (fwd: x [M, K], dgrad: dy [M, N]) and b [G, N, K]."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    M, G = sum(splits), len(splits)
    kc = K if variant == "fwd" else N
    a = torch.randn(M, kc, device=DEV, generator=gen).to(BF)
    b = (torch.randn(G, N, K, device=DEV, generator=gen) / kc ** 0.5).to(BF)
    return a, b


def reference(variant, a, b, splits):
    G, N, K = b.shape
    nc = N if variant == "fwd" else K
    out = torch.full((a.shape[0], nc), float("nan"), dtype=torch.float64, device=DEV)
    start = 0
    for g, m in enumerate(splits):
        if m:
            w = b[g].double()
            out[start:start + m] = a[start:start + m].double() @ (w.t() if variant == "fwd" else w)
        start += m
    return out


def run(variant, a, b, offsets, out, cfg=None):
    (kb.gemm_fwd_into if variant == "fwd" else kb.gemm_dgrad_into)(a, b, offsets, out, cfg)


def check(variant, splits, N, K, out_dtype=F32, offs_dtype=torch.int64, cfg=None):
    a, b = make(variant, splits, N, K)
    nc = N if variant == "fwd" else K
    out = torch.full((sum(splits), nc), float("nan"), dtype=out_dtype, device=DEV)
    run(variant, a, b, _offsets(splits, offs_dtype), out, cfg)
    torch.cuda.synchronize()
    assert_close(out, reference(variant, a, b, splits).to(out_dtype) if out_dtype == BF
                 else reference(variant, a, b, splits), kind=out_dtype, what=f"{variant} {splits} N={N} K={K}")


CASES = {
    "ragged_with_empty": ([200, 0, 77, 513, 0, 128], 320, 576),
    "M32_one_expert": ([32], 256, 512),
    "one_expert_all_tokens": ([0, 0, 1000, 0], 384, 256),
    "odd_not_tile_multiples": ([1, 129, 255, 3], 264, 200),
    "many_experts_128": ([(7 * i) % 23 for i in range(128)], 128, 256),
}


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", RAGGED_M)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64_reference(variant, case):
    splits, N, K = CASES[case]
    check(variant, splits, N, K, F32)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", RAGGED_M)
def test_bf16_output(variant):
    splits, N, K = CASES["ragged_with_empty"]
    check(variant, splits, N, K, BF)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", RAGGED_M)
def test_int32_offsets_and_tile_128(variant):
    splits, N, K = [300, 0, 45, 260], 384, 320
    check(variant, splits, N, K, F32, torch.int32)
    cfg = kb.Bf16GemmCfg(variant, len(splits), N, K, tile_n=128, stages=3, sms=17)
    check(variant, splits, N, K, F32, torch.int64, cfg)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", RAGGED_M)
def test_headline_like_shape(variant):
    """The issue's G=8 shape at a quarter of the tokens, uneven groups."""
    splits = [1500, 700, 1024, 0, 900, 1100, 800, 169]
    N, K = (4096, 7168) if variant == "fwd" else (7168, 2048)
    check(variant, splits, N, K, F32)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", RAGGED_M)
def test_cuda_graph_replay_equals_eager(variant):
    """Captured with one set of device group sizes, replayed after they changed (same M):
    bitwise equal to an eager call with the new sizes."""
    N, K = 320, 256
    s1, s2 = [100, 0, 60, 96], [0, 200, 31, 25]
    a, b = make(variant, s1, N, K)
    nc = N if variant == "fwd" else K
    off = _offsets(s1)
    out = torch.full((sum(s1), nc), float("nan"), dtype=F32, device=DEV)
    run(variant, a, b, off, out)            # compile + load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(variant, a, b, off, out)
    off.copy_(_offsets(s2))
    out.fill_(float("nan"))
    graph.replay()
    eager = torch.full_like(out, float("nan"))
    run(variant, a, b, _offsets(s2), eager)
    torch.cuda.synchronize()
    assert_close(out, eager, kind="exact", what="graph replay")
    assert_close(out, reference(variant, a, b, s2), kind=F32)


# ---------------------------------------------------------------------- wgrad


def make_wgrad(splits, N, K, seed=0):
    """a = dY [M, N], b = x [M, K] (bf16), offsets."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    M = sum(splits)
    return (torch.randn(M, N, device=DEV, generator=gen).to(BF),
            (torch.randn(M, K, device=DEV, generator=gen) / max(M, 1) ** 0.5).to(BF))


def reference_wgrad(a, b, splits):
    out = torch.zeros(len(splits), a.shape[1], b.shape[1], dtype=torch.float64, device=DEV)
    start = 0
    for g, m in enumerate(splits):
        out[g] = a[start:start + m].double().t() @ b[start:start + m].double()
        start += m
    return out


def check_wgrad(splits, N, K, out_dtype=F32, offs_dtype=torch.int64, cfg=None):
    a, b = make_wgrad(splits, N, K)
    out = torch.full((len(splits), N, K), float("nan"), dtype=out_dtype, device=DEV)
    kb.gemm_wgrad_into(a, b, _offsets(splits, offs_dtype), out, cfg)
    torch.cuda.synchronize()
    want = reference_wgrad(a, b, splits)
    assert_close(out, want.to(out_dtype) if out_dtype == BF else want, kind=out_dtype,
                 what=f"wgrad {splits[:8]} N={N} K={K}")


WGRAD_CASES = {
    "ragged_with_empty": ([64, 0, 96, 512, 0, 32], 320, 576),   # N, K not tile multiples
    "M32_one_expert": ([32], 256, 512),
    "one_expert_all_tokens": ([0, 0, 1024, 0], 384, 256),
    "many_experts_128": ([32 * ((7 * i) % 5) for i in range(128)], 128, 256),
    "all_empty": ([0, 0, 0], 128, 128),
}


@gpu
@needs_sm90
@pytest.mark.parametrize("out_dtype", [F32, BF])
@pytest.mark.parametrize("case", list(WGRAD_CASES))
def test_wgrad_matches_float64_reference(case, out_dtype):
    splits, N, K = WGRAD_CASES[case]
    check_wgrad(splits, N, K, out_dtype)


@gpu
@needs_sm90
def test_wgrad_int32_offsets_tile_128_and_headline_like():
    splits, N, K = [320, 0, 64, 256], 384, 320
    check_wgrad(splits, N, K, BF, torch.int32)
    check_wgrad(splits, N, K, F32, cfg=kb.Bf16GemmCfg("wgrad", 4, N, K, tile_n=128, stages=3, sms=17, tile_k=32))
    check_wgrad([1504, 704, 1024, 0, 896, 1088, 800, 160], 2048, 1024, F32)


@gpu
@needs_sm90
def test_wgrad_cuda_graph_replay_equals_eager():
    N, K = 320, 256
    s1, s2 = [96, 0, 64, 96], [0, 192, 32, 32]
    a, b = make_wgrad(s1, N, K)
    off = _offsets(s1)
    out = torch.full((4, N, K), float("nan"), dtype=F32, device=DEV)
    kb.gemm_wgrad_into(a, b, off, out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kb.gemm_wgrad_into(a, b, off, out)
    off.copy_(_offsets(s2))
    out.fill_(float("nan"))
    graph.replay()
    eager = torch.full_like(out, float("nan"))
    kb.gemm_wgrad_into(a, b, _offsets(s2), eager)
    torch.cuda.synchronize()
    assert_close(out, eager, kind="exact", what="graph replay")
    assert_close(out, reference_wgrad(a, b, s2), kind=F32)
