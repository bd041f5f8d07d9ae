"""Design (b) MXFP8 grouped GEMM probe (tilekernels/moe/cute_gemm_fp8.py): fp8 wgmma per
32-wide K block, promoted into fp32 with the blocks' E8M0 scales.

CPU (CI, no GPU): the kernel compiles for sm_90a from fake arguments through the launch code
the GPU path uses (config = compile key, M dynamic) in every config the probe sweeps, with
the e4m3 wgmma and cp.async in the PTX and no register spills; the B-scale table's slot map is
a bijection. (No sm_100a build: wgmma is Hopper-only, and this probe is Hopper's answer to
the missing block-scaled MMA.)

GPU (``gpu`` marker): against the float64 product of the dequantized operands (mxfp8.py),
outputs poisoned with NaN first: ragged groups with zeros and odd sizes, M = 32, one group,
one group taking every token, 128 groups, M = 0, N tails, int32 / int64 offsets, a 0xFF
scale block feeding NaN to exactly its rows / columns, CUDA-graph replay with new group sizes.

Why the tolerance holds: every e4m3 x e4m3 product is exact, the scale product is an exact
power of two, so the only errors are the wgmma's sum of 32 products, the fp32 promotion sums
and the output rounding. bf16 out: one rounding (2^-9 per element) -> the bf16 bound 1e-2.
fp32 out is checked against the same 1e-2 (not fp32's 1e-5): Hopper's fp8 wgmma does not
keep a full fp32 mantissa while it sums (the reason DeepGEMM promotes at all); the test
prints the error it measures.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels import _cute as C  # noqa: E402
from tilekernels.moe import cute_gemm_fp8 as f8  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402
from tilekernels.testing import rel_err, tolerance  # noqa: E402
from mxfp8_gemm_helpers import _offsets, _q_rows, _rand_rows  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32

# the configs the probe sweeps (benchmarks/moe_fp8_probe.py); measurement-only modes included
CFGS = {
    "default": {},
    "tmp1": dict(tmp_bufs=1),
    "n64": dict(tile_n=64),
    "n64x2": dict(tile_n=64, ctas_per_sm=2),
    "stages3": dict(stages=3),
    "carry": dict(carry=True),
    "carry5": dict(carry=True, stages=5),
    "p128": dict(mode="p128"),
    "acc_only": dict(mode="acc_only"),
    "acc_only_carry": dict(mode="acc_only", carry=True),
    "col_only": dict(mode="col_only"),
    "col_only_carry": dict(mode="col_only", carry=True),
}


# ====================================================================== CPU: compile


@pytest.mark.parametrize("out", ["bf16", "f32"])
def test_compiles_for_sm90a(out):
    """The default config compiles (fake tensors, no GPU); the config is part of the compile
    key and M is not (a runtime scalar); e4m3 wgmma k32, cp.async, no spills."""
    G, N, K = 8, 4096, 7168
    dt = {"bf16": BF, "f32": F32}[out]
    ln = f8.gemm_fp8_launch(G, N, K, dt, torch.int64)
    assert ln.cfg == f8.Fp8GemmCfg.heuristic(G, N, K)
    key = ln.key("sm_90a")
    assert key[0] == "moe.cute_gemm_fp8.fwd" and ln.cfg in key and ln.sig in key
    assert ln.sig[-1] == C.Scalar(C.cutlass.Int32)
    art = ln.export("sm_90a")
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in art.ptx
    assert "cp.async.cg.shared.global" in art.ptx
    res = [r for name, r in C.cubin_resources(art.cubin).items() if "fp8_kernel" in name]
    assert len(res) == 1 and res[0]["frame"] == 0, res
    assert ln.compile("sm_90a") is ln.compile("sm_90a")
    assert f8.gemm_fp8_launch(G, N, K, dt, torch.int64) is ln


@pytest.mark.parametrize("name", [n for n in CFGS if n != "default"])
def test_sweep_configs_compile(name):
    """Every swept config compiles, with an N tail and int32 offsets, without spills."""
    G, N, K = 3, 352, 384
    cfg = f8.Fp8GemmCfg.heuristic(G, N, K, **CFGS[name])
    art = f8.gemm_fp8_launch(G, N, K, BF, torch.int32, cfg).export("sm_90a")
    assert f"m64n{cfg.tile_n}k32.f32.e4m3.e4m3" in art.ptx
    res = [r for n, r in C.cubin_resources(art.cubin).items() if "fp8_kernel" in n]
    assert res and res[0]["frame"] == 0, res
    assert f8.smem_bytes(cfg) * cfg.ctas_per_sm <= 227 * 1024


@pytest.mark.parametrize("tile_n", [64, 128])
def test_scale_table_slots_are_a_bijection(tile_n):
    """Column c of the tile goes to its own slot of the padded B-scale row, and a thread's
    (t) columns are contiguous: 16-byte reads."""
    slots = [f8.sb_slot(c, tile_n) for c in range(tile_n)]
    assert len(set(slots)) == tile_n
    pitch = tile_n // 4 + 4
    assert max(slots) < 4 * pitch
    for t in range(4):
        cols = [8 * j + 2 * t + p for j in range(tile_n // 8) for p in range(2)]
        assert [f8.sb_slot(c, tile_n) for c in cols] == list(range(t * pitch, t * pitch + tile_n // 4))


def test_config_constraints_and_heuristic():
    import inspect

    assert "M" not in inspect.signature(f8.Fp8GemmCfg.heuristic).parameters
    for bad in (dict(tile_n=256), dict(tmp_bufs=3), dict(mode="x"), dict(stages=1),
                dict(carry=True, tmp_bufs=1), dict(carry=True, stages=2), dict(carry=True, mode="p128")):
        with pytest.raises(AssertionError):
            f8.Fp8GemmCfg.heuristic(2, 256, 256, **bad)
    with pytest.raises(AssertionError):
        f8.Fp8GemmCfg.heuristic(2, 256, 224)      # K % 128 != 0


# ====================================================================== GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda"


def make(splits, N, K):
    M, G = sum(splits), len(splits)
    xd, xs = _q_rows(_rand_rows(M, K))
    wd, ws = _q_rows(_rand_rows(G * N, K) / K ** 0.5)
    return dict(a=(xd, xs), b=(wd.view(G, N, K), ws.view(G, N, K // 32)), M=M, N=N, K=K, G=G)


def reference(p, splits):
    """float64: per group, dequantized x rows times dequantized W[g]^T."""
    G, N, K = p["G"], p["N"], p["K"]
    A = mx.dequantize_rowwise(p["a"][0].view(torch.float8_e4m3fn), p["a"][1], torch.float64)
    W = mx.dequantize_rowwise(p["b"][0].reshape(G * N, K).view(torch.float8_e4m3fn),
                              p["b"][1].reshape(G * N, K // 32), torch.float64).view(G, N, K)
    out = torch.zeros(p["M"], N, dtype=torch.float64, device=DEV)
    start = 0
    for g, m in enumerate(splits):
        if m:
            out[start:start + m] = A[start:start + m] @ W[g].t()
        start += m
    return out


def run(p, offsets, out, cfg=None):
    f8.gemm_fp8_fwd_into(*p["a"], *p["b"], offsets, out, cfg=cfg)


def check(splits, N, K, out_dtype=BF, offs_dtype=torch.int64, cfg=None):
    p = make(splits, N, K)
    out = torch.full((p["M"], N), float("nan"), dtype=out_dtype, device=DEV)
    run(p, _offsets(splits, offs_dtype), out, cfg)
    torch.cuda.synchronize()
    ref = reference(p, splits)
    err = rel_err(out, ref)
    print(f"design (b) splits={splits} N={N} K={K} out={out_dtype} cfg={cfg}: rel err {err:.3e}")
    assert err <= tolerance(BF), f"rel err {err:.3e} (out {out_dtype}, cfg {cfg})"
    return err


SPLITS = [
    [37, 0, 100, 63],            # zeros, odd sizes
    [0, 1, 31, 0, 517, 129],     # 1, 31, odd, empty groups
    [32],                        # M = 32
    [300],                       # one group
    [0, 0, 2000, 0, 0, 0, 0, 0],  # G = 8, one expert takes every token
    [0, 0, 0],                   # M = 0
]
DIMS = [(352, 256), (512, 384)]  # (N, K): an N tail (352 % 128 = 96) and tile multiples


@gpu
@needs_cuda
@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d[0]}K{d[1]}")
@pytest.mark.parametrize("splits", SPLITS, ids=str)
def test_ragged_matches_reference(splits, dims, out):
    check(splits, *dims, {"bf16": BF, "f32": F32}[out])


@gpu
@needs_cuda
def test_128_groups_int32_offsets():
    splits = [int(v) for v in torch.randint(0, 70, (128,))]
    splits[5] = 0
    check(splits, 256, 256, BF, torch.int32)


@gpu
@needs_cuda
@pytest.mark.parametrize("name", ["tmp1", "n64", "n64x2", "stages3", "carry", "carry5"])
def test_sweep_configs_match_reference(name):
    splits = [0, 1, 31, 0, 517, 129]
    N, K = 352, 384
    check(splits, N, K, BF, cfg=f8.Fp8GemmCfg.heuristic(len(splits), N, K, **CFGS[name]))


@gpu
@needs_cuda
@pytest.mark.parametrize("name", ["default", "carry"])
@pytest.mark.parametrize("operand", ["a", "b"])
def test_nan_scale_feeds_exactly_its_rows_or_cols(operand, name):
    """One 0xFF scale (E8M0 NaN) with zero data: NaN in exactly the outputs its block feeds
    (its row of y for x, its column inside its group for W), nothing else."""
    splits = [40, 77, 0, 150]
    N, K = 288, 256
    p = make(splits, N, K)
    d, s = (t.clone() for t in p[operand])
    if operand == "a":
        row, kb = splits[0] + 5, 3
        s[row, kb] = 0xFF
        d[row, kb * 32:(kb + 1) * 32] = 0
    else:
        g, n, kb = 1, 17, 2
        s[g, n, kb] = 0xFF
        d[g, n, kb * 32:(kb + 1) * 32] = 0
    p = dict(p)
    p[operand] = (d, s)
    ref = reference(p, splits)
    out = torch.full((p["M"], N), 0.0, dtype=BF, device=DEV)
    run(p, _offsets(splits), out, f8.Fp8GemmCfg.heuristic(len(splits), N, K, **CFGS[name]))
    torch.cuda.synchronize()
    want, got = torch.isnan(ref), torch.isnan(out)
    assert want.any()
    assert torch.equal(got, want), f"NaN pattern: got {int(got.sum())}, want {int(want.sum())}"
    err = rel_err(out[~want].float(), ref[~want])
    assert err <= tolerance(BF), f"finite part: rel err {err:.3e}"


@gpu
@needs_cuda
def test_cuda_graph_replay_with_new_group_sizes():
    """The grid depends on M, N, K, G only: a captured call replays correctly after the device
    offsets change (no host sync), and equals an eager call bitwise."""
    s1, s2 = [50, 0, 200, 262], [300, 12, 0, 200]
    N, K = 288, 256
    p = make(s1, N, K)
    offsets = _offsets(s1)
    out = torch.full((p["M"], N), float("nan"), dtype=BF, device=DEV)
    run(p, offsets, out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(p, offsets, out)
    offsets.copy_(_offsets(s2))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = reference(p, s2)
    assert rel_err(out, ref) <= tolerance(BF)
    eager = torch.full_like(out, float("nan"))
    run(p, offsets, eager)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
