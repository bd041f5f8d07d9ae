"""CuTe DSL MXFP8 grouped GEMM (tilekernels/moe/cute_grouped_gemm.py).

CPU (CI, no GPU): every variant (fwd / dgrad / wgrad x bf16 / fp32 out) compiles for sm_90a
from fake arguments through the launch code the GPU path uses (config = compile key, M
dynamic), the other configs compile, and the per-thread copy layouts cover a tile once (the
dequant instruction sequences are checked in test_grouped_gemm_cute_dequant.py).

GPU (``gpu`` marker): against a float64 reference of the same MXFP8 math (operands
dequantized by mxfp8.py, matmul in float64), outputs poisoned with NaN first: ragged groups
(zeros, 1, 31, odd sizes, one huge group, G = 1, M = 0; wgrad multiples of 32), N / K tails,
int32 / int64 offsets, a 0xFF scale giving NaN exactly in the rows / columns it feeds, a new M
reusing the compiled kernel, and CUDA-graph capture.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels import _cute as C  # noqa: E402
from tilekernels.moe import cute_gemm_dequant as dq  # noqa: E402
from tilekernels.moe import cute_grouped_gemm as gg  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402
from tilekernels.testing import rel_err, tolerance  # noqa: E402
from mxfp8_gemm_helpers import _dq_cols, _dq_rows, _offsets, _q_cols, _q_rows, _rand_rows  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
OUTS = {"bf16": BF, "f32": F32}


# ====================================================================== CPU: compile


@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_compiles_for_sm90a(variant, out):
    """Every variant compiles (fake tensors, no GPU) through the launch code ``run`` uses;
    the config is part of the compile key and M is not (a runtime scalar)."""
    G, N, K = 4, 4096, 7168
    ln = gg.gemm_launch(variant, G, N, K, OUTS[out], torch.int64)
    assert ln.cfg == gg.GemmCfg.heuristic(variant, G, N, K, OUTS[out])
    key = ln.key("sm_90a")
    assert key[0] == f"moe.cute_grouped_gemm.{variant}" and key[-1] == "sm_90a"
    assert ln.sig in key and ln.cfg in key
    assert ln.sig[-1] == C.Scalar(cutlass_int32())  # M: dynamic
    art = ln.export("sm_90a")
    ptx = art.ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in ptx
    assert "mul.rn.bf16x2" in ptx and "fma.rn.bf16x2" in ptx
    assert len(art.cubin) > 0
    # a different M reuses the compiled kernel: same Launch, same key, same compiled object
    c1 = ln.compile("sm_90a")
    assert gg.gemm_launch(variant, G, N, K, OUTS[out], torch.int64) is ln
    assert ln.compile("sm_90a") is c1
    assert C._COMPILED[key] is c1


OTHER_CFGS = {  # the non-default configs the GPU tests check and the benchmark sweeps
    "tile_n128": dict(tile_n=128),
    "t128x2": dict(tile_n=128, ctas_per_sm=2),
    "cvt_hw": dict(cvt="hw"),
    "persistent": dict(persistent=True),
    "late_loads": dict(early_loads=False),
    "persistent_late": dict(persistent=True, early_loads=False),
    "epi_smem": dict(epi_smem=True),
    "epi_regs": dict(epi_smem=False),   # wgrad's default is the staged epilogue
    "persistent_epi_smem": dict(persistent=True, epi_smem=True),
    "t128x2_epi_smem": dict(tile_n=128, ctas_per_sm=2, epi_smem=True),
}


@pytest.mark.parametrize("cfg_name", list(OTHER_CFGS))
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_other_configs_compile(variant, cfg_name):
    """The non-default configs compile too, with tails (N, K not tile multiples) and int32
    offsets."""
    cfg_kw = OTHER_CFGS[cfg_name]
    G, N, K = 3, 352, 224
    cfg = gg.GemmCfg.heuristic(variant, G, N, K, BF, **cfg_kw)
    ln = gg.gemm_launch(variant, G, N, K, BF, torch.int32, cfg)
    assert "wgmma.mma_async" in ln.export("sm_90a").ptx


@pytest.mark.parametrize("bmn", [128, 256])
@pytest.mark.parametrize("kmajor", [True, False])
def test_copy_layout_covers_tile_once(kmajor, bmn):
    """The per-thread copy layout is a bijection onto the (bmn, 64) tile (each element loaded
    and stored exactly once) and each thread's rows of an mn-major chunk share one MX block
    (one set of 16 scales)."""
    import itertools

    shape, stride, tiler = gg.copy_tv_spec(kmajor, bmn, 64)

    def flat(sh, st):
        if isinstance(sh, int):
            return [(sh, st)]
        return [m for a, b in zip(sh, st) for m in flat(a, b)]

    def offsets(sh, st):
        modes = flat(sh, st)
        return [sum(c * s for c, (_, s) in zip(cs, modes))
                for cs in itertools.product(*[range(n) for n, _ in modes])]

    T, V = offsets(shape[0], stride[0]), offsets(shape[1], stride[1])
    assert len(T) == gg.THREADS
    rows, cols = tiler
    assert sorted(t + v for t in T for v in V) == list(range(rows * cols))
    for t in T:
        blocks = {((t + v) // rows) // gg.BLOCK for v in V}
        assert len(blocks) == 1, (t, blocks)


def test_heuristic_uses_static_dims_only():
    import inspect

    params = inspect.signature(gg.GemmCfg.heuristic).parameters
    assert "M" not in params and "m" not in params
    assert gg.GemmCfg.heuristic("fwd", 8, 4096, 7168).tile_n == 256


def cutlass_int32():
    import cutlass

    return cutlass.Int32


# ====================================================================== GPU
# float64 reference of the same MXFP8 math; outputs poisoned with NaN first.

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda"


def _groups(splits):
    start = 0
    for g, m in enumerate(splits):
        yield g, slice(start, start + m)
        start += m


def make_fwd(splits, N, K):
    M, G = sum(splits), len(splits)
    xd, xs = _q_rows(_rand_rows(M, K))
    wd, ws = _q_rows(_rand_rows(G * N, K) / K ** 0.5)
    return dict(a=(xd, xs), b=(wd.view(G, N, K), ws.view(G, N, K // 32)), M=M, N=N, K=K, G=G)


def ref_fwd(p, splits):
    G, N, K = p["G"], p["N"], p["K"]
    A = _dq_rows(*p["a"])
    W = _dq_rows(p["b"][0].reshape(G * N, K), p["b"][1].reshape(G * N, K // 32)).view(G, N, K)
    out = torch.zeros(p["M"], N, dtype=torch.float64, device=DEV)
    for g, r in _groups(splits):
        if r.stop > r.start:
            out[r] = A[r] @ W[g].t()
    return out


def make_dgrad(splits, N, K):
    M, G = sum(splits), len(splits)
    dd, ds = _q_rows(_rand_rows(M, N))
    w = _rand_rows(G * N, K) / N ** 0.5
    wd, ws = _q_cols(w)   # blocks along N inside each expert (N % 32 == 0)
    return dict(a=(dd, ds), b=(wd.view(G, N, K), ws.view(G, N // 32, K)), M=M, N=N, K=K, G=G)


def ref_dgrad(p, splits):
    G, N, K = p["G"], p["N"], p["K"]
    A = _dq_rows(*p["a"])
    W = _dq_cols(p["b"][0].reshape(G * N, K), p["b"][1].reshape(G * N // 32, K)).view(G, N, K)
    out = torch.zeros(p["M"], K, dtype=torch.float64, device=DEV)
    for g, r in _groups(splits):
        if r.stop > r.start:
            out[r] = A[r] @ W[g]
    return out


def make_wgrad(splits, N, K):
    M, G = sum(splits), len(splits)
    dyd, dys = _q_cols(_rand_rows(M, N, spread=6))
    xd, xs = _q_cols(_rand_rows(M, K, spread=6))
    return dict(a=(dyd, dys), b=(xd, xs), M=M, N=N, K=K, G=G)


def ref_wgrad(p, splits):
    G, N, K = p["G"], p["N"], p["K"]
    DY = _dq_cols(*p["a"])
    X = _dq_cols(*p["b"])
    out = torch.zeros(G, N, K, dtype=torch.float64, device=DEV)
    for g, r in _groups(splits):
        if r.stop > r.start:
            out[g] = DY[r].t() @ X[r]
    return out


MAKE = {"fwd": make_fwd, "dgrad": make_dgrad, "wgrad": make_wgrad}
REF = {"fwd": ref_fwd, "dgrad": ref_dgrad, "wgrad": ref_wgrad}


def out_shape(variant, p):
    return {"fwd": (p["M"], p["N"]), "dgrad": (p["M"], p["K"]), "wgrad": (p["G"], p["N"], p["K"])}[variant]


def run_variant(variant, p, offsets, out, cfg=None):
    fn = {"fwd": gg.gemm_fwd_into, "dgrad": gg.gemm_dgrad_into, "wgrad": gg.gemm_wgrad_into}[variant]
    fn(*p["a"], *p["b"], offsets, out, cfg=cfg)


def diagnose(variant, out, ref, splits, cfg=None) -> str:
    """What is wrong, to read off a failing GPU run: per-group errors, unwritten (NaN poison)
    entries, NaN mismatches, the worst entries and whether the bad rows / columns line up
    with tile boundaries."""
    cfg = cfg or "heuristic"
    o, r = out.double(), ref
    lines = [f"{variant} out {tuple(out.shape)} {out.dtype} splits={splits} cfg={cfg}"]
    on, rn = torch.isnan(o), torch.isnan(r)
    lines.append(f"NaN: out {int(on.sum())}, ref {int(rn.sum())}, out-only {int((on & ~rn).sum())}, "
                 f"ref-only {int((rn & ~on).sum())}")
    tol = 1e-2 if out.dtype == BF else 1e-5
    # an entry is bad if off by more than tol x its row's largest |ref| (rows differ in scale)
    r2d = r.reshape(-1, r.shape[-1])
    rowmax = torch.where(torch.isnan(r2d), 0.0, r2d.abs()).amax(dim=1, keepdim=True).clamp_min(1e-30)
    bad = ((o - r).abs().reshape(r2d.shape) > tol * rowmax).reshape(r.shape) | (on != rn)
    if variant == "wgrad":
        for g, rr in _groups(splits):
            e = rel_err(out[g], ref[g])
            lines.append(f"  group {g} (m_g={rr.stop - rr.start}): rel err {e:.3e}, bad {int(bad[g].sum())}")
        bad2 = bad.reshape(-1, bad.shape[-1])
    else:
        for g, rr in _groups(splits):
            if rr.stop > rr.start:
                e = rel_err(out[rr], ref[rr])
                lines.append(f"  group {g} rows {rr.start}:{rr.stop}: rel err {e:.3e}, "
                             f"bad {int(bad[rr].sum())}")
        bad2 = bad
    if bad2.any():
        br = bad2.any(1).nonzero().flatten()
        bc = bad2.any(0).nonzero().flatten()
        lines.append(f"  bad rows ({len(br)}): {br[:12].tolist()} ... rows % tile_m: "
                     f"{sorted(set((br % 128).tolist()))[:16]}")
        lines.append(f"  bad cols ({len(bc)}): {bc[:12].tolist()} ... cols % tile_n: "
                     f"{sorted(set((bc % 256).tolist()))[:16]}")
        idx = bad2.nonzero()[:6].tolist()
        o2, r2 = o.reshape(bad2.shape), r.reshape(bad2.shape)
        lines.append("  e.g. " + ", ".join(f"[{i},{j}] got {o2[i, j].item():.6g} want {r2[i, j].item():.6g}"
                                           for i, j in idx))
    return "\n".join(lines)


def check_against_ref(variant, p, splits, out_dtype=BF, offs_dtype=torch.int64, cfg=None):
    offsets = _offsets(splits, offs_dtype)
    out = torch.full(out_shape(variant, p), float("nan"), dtype=out_dtype, device=DEV)
    run_variant(variant, p, offsets, out, cfg)
    torch.cuda.synchronize()
    ref = REF[variant](p, splits)
    err = rel_err(out, ref)
    assert err <= tolerance(out_dtype), f"rel err {err:.3e}\n" + diagnose(variant, out, ref, splits, cfg)
    return err


SPLITS_M = [
    [37, 0, 100, 63],           # zeros, odd sizes
    [0, 1, 31, 0, 517, 129],    # 1, 31, odd, empty groups
    [300],                      # G = 1
    [5, 3000, 7],               # one huge group
    [0, 0, 0],                  # M = 0
]
SPLITS_K = [                    # wgrad: multiples of 32
    [32, 0, 96, 320],
    [0, 0],                     # M = 0: zeros
    [1024],                     # G = 1
    [32, 2016, 0, 64, 32],
]
DIMS = [(352, 224), (512, 256)]  # (N, K): tails (K % 64 == 32, N % 256 != 0) and tile multiples


@gpu
@needs_cuda
@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d[0]}K{d[1]}")
@pytest.mark.parametrize("splits", SPLITS_M, ids=str)
@pytest.mark.parametrize("variant", ["fwd", "dgrad"])
def test_ragged_m_matches_reference(variant, splits, dims, out):
    N, K = dims
    p = MAKE[variant](splits, N, K)
    check_against_ref(variant, p, splits, OUTS[out])


@gpu
@needs_cuda
@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d[0]}K{d[1]}")
@pytest.mark.parametrize("splits", SPLITS_K, ids=str)
def test_wgrad_matches_reference(splits, dims, out):
    N, K = dims
    p = make_wgrad(splits, N, K)
    check_against_ref("wgrad", p, splits, OUTS[out])


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_int32_offsets(variant):
    splits = [64, 0, 160, 96] if variant == "wgrad" else [70, 0, 130, 55]
    p = MAKE[variant](splits, 288, 320)
    check_against_ref(variant, p, splits, BF, torch.int32)


@gpu
@needs_cuda
@pytest.mark.parametrize("cfg_name", list(OTHER_CFGS) + ["raster1", "bufs4", "persistent_2sm"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_other_configs(variant, cfg_name):
    """Every config gives the reference's result (fp32 out), ragged groups and tails; the
    persistent ones also with fewer CTAs than tiles (``sms=2``: each CTA runs many tiles)."""
    cfg_kw = {**OTHER_CFGS, "raster1": dict(raster=1), "bufs4": dict(bufs=4),
              "persistent_2sm": dict(persistent=True, sms=2)}[cfg_name]
    splits = [96, 0, 224, 1024, 0] if variant == "wgrad" else [100, 0, 257, 1000, 0]
    N, K = 352, 480
    p = MAKE[variant](splits, N, K)
    cfg = gg.GemmCfg.heuristic(variant, len(splits), N, K, BF, **cfg_kw)
    check_against_ref(variant, p, splits, F32, cfg=cfg)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", [0, 1, 2])
@pytest.mark.parametrize("variant", ["fwd", "wgrad"])
def test_persistent_edge_cases(variant, case):
    """Persistent CTAs with no tile at all (M = 0) or fewer tiles than CTAs."""
    splits = ([[0, 0, 0], [32, 0, 0], [0, 0, 1920]] if variant == "wgrad"
              else [[0, 0, 0], [5, 0, 0], [0, 0, 300]])[case]
    p = MAKE[variant](splits, 256, 224)
    cfg = gg.GemmCfg.heuristic(variant, len(splits), 256, 224, BF, persistent=True)
    check_against_ref(variant, p, splits, BF, cfg=cfg)


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_large_scales_take_the_general_path(variant):
    """Rows scaled by up to 2^40: scale bytes well above 2^7 (the fast path's limit) mixed
    with small ones, so threads take both dequant paths inside one GEMM."""
    splits = [64, 160, 0, 96] if variant == "wgrad" else [50, 170, 0, 99]
    N, K = 288, 352
    p = MAKE[variant](splits, N, K)
    # rebuild the operands from data with huge magnitudes
    M, G = sum(splits), len(splits)
    big = lambda R, C: torch.randn(R, C, device=DEV) * torch.exp2(  # noqa: E731
        torch.randint(0, 41, (R, 1), device=DEV).float())
    if variant == "fwd":
        p["a"] = _q_rows(big(M, K))
        wd, ws = _q_rows(big(G * N, K))
        p["b"] = (wd.view(G, N, K), ws.view(G, N, K // 32))
    elif variant == "dgrad":
        p["a"] = _q_rows(big(M, N))
        wd, ws = _q_cols(big(G * N, K))
        p["b"] = (wd.view(G, N, K), ws.view(G, N // 32, K))
    else:
        p["a"] = _q_cols(big(M, N))
        p["b"] = _q_cols(big(M, K))
    e_max = max(int(p["a"][1].max()), int(p["b"][1].max()))
    assert e_max > dq.FAST_MAX_E, e_max
    check_against_ref(variant, p, splits, F32)


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_headline_like_shape(variant):
    """Larger problem, uneven groups, fp32 out (products exact: only summation order differs)."""
    if variant == "wgrad":
        splits = [512, 1536, 0, 2048, 32, 4064]
    else:
        splits = [1000, 3000, 0, 2048, 1, 2143]
    p = MAKE[variant](splits, 2048, 7168 if variant == "fwd" else 4096)
    check_against_ref(variant, p, splits, F32)


# ---------------------------------------------------------------- NaN scales


@gpu
@needs_cuda
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_nan_scale_feeds_exactly_its_rows_or_cols(variant, operand):
    """One 0xFF scale (E8M0 NaN) makes its whole 32-block NaN: NaN must reach exactly the
    outputs that block feeds (zero data included) and nothing else."""
    check_nan_scale(variant, operand)


def check_nan_scale(variant, operand, cfg_of=None):
    """The NaN-scale check for one kernel: ``cfg_of(G, N, K)`` gives its GemmCfg (None: the
    heuristic's); tests/moe/test_grouped_gemm_cute_ws.py runs it for the ws kernel."""
    splits = [64, 96, 0, 160] if variant == "wgrad" else [40, 77, 0, 150]
    N, K = 288, 256
    p = MAKE[variant](splits, N, K)
    d, s = p[operand]
    s = s.clone()
    d = d.clone()
    flat = s.view(-1)
    # a block in the middle of the second group's data; zero its data too (0 * NaN must be NaN)
    if variant == "fwd":
        idx = (splits[0] + 5) * (K // 32) + 3 if operand == "a" else (1 * N + 17) * (K // 32) + 2
    elif variant == "dgrad":
        idx = (splits[0] + 5) * (N // 32) + 2 if operand == "a" else (1 * (N // 32) + 2) * K + 33
    else:
        idx = (splits[0] // 32 + 1) * (N if operand == "a" else K) + 45
    flat[idx] = 0xFF
    if (variant, operand) in (("fwd", "a"), ("dgrad", "a"), ("fwd", "b")):
        # rowwise blocks: zero the block's data as well (0 * NaN must still be NaN)
        kb_per_row = (K if variant == "fwd" else N) // 32
        row, kb = divmod(idx, kb_per_row)
        d.view(-1, kb_per_row * 32)[row, kb * 32:(kb + 1) * 32] = 0
    p = dict(p)
    p[operand] = (d, s)
    ref = REF[variant](p, splits)
    offsets = _offsets(splits)
    out = torch.full(out_shape(variant, p), 0.0, dtype=BF, device=DEV)
    run_variant(variant, p, offsets, out, cfg_of(len(splits), N, K) if cfg_of else None)
    torch.cuda.synchronize()
    want = torch.isnan(ref)
    got = torch.isnan(out)
    assert want.any(), "test setup: the 0xFF scale should feed some outputs"
    assert torch.equal(got, want), (f"NaN pattern differs: got {int(got.sum())} NaNs, want {int(want.sum())}\n"
                                   + diagnose(variant, out, ref, splits))
    err = rel_err(out[~want].float(), ref[~want])
    assert err <= tolerance(BF), f"finite part: rel err {err:.3e}"


# ---------------------------------------------------------------- exact dequant probe


def _pattern_rows(R, C, e_of_row):
    """uint8 data [R, C], every byte in every row (a shifted permutation), and rowwise scales
    [R, C/32] = e_of_row(r)."""
    d = (torch.arange(C, device=DEV)[None, :] + 7 * torch.arange(R, device=DEV)[:, None]) % 256
    d = d.to(torch.uint8)
    s = torch.tensor([e_of_row(r) for r in range(R)], dtype=torch.uint8, device=DEV)[:, None]
    return d, s.expand(R, C // 32).contiguous()


def _identity_mx(n):
    """MXFP8 identity [n, n]: data 1.0 (0x38) on the diagonal, scale 2^0 (127)."""
    d = torch.zeros(n, n, dtype=torch.uint8, device=DEV)
    d.fill_diagonal_(0x38)
    return d, torch.full((n, n // 32), 127, dtype=torch.uint8, device=DEV)


def _expected_dequant(d, s_rows):
    """bf16-rounded exact dequant (what the kernel multiplies), as fp32; NaN bytes with a
    finite scale read as +-480 * scale (cvt="bits", documented)."""
    v = mx.dequantize_rowwise(d.view(torch.float8_e4m3fn), s_rows, torch.float32)
    nan_byte = (d & 0x7F) == 0x7F
    e = s_rows.repeat_interleave(32, dim=1).to(torch.int64)
    alt = torch.where(d >= 0x80, -480.0, 480.0).to(torch.float64) * torch.exp2((e - 127).double())
    v = torch.where(nan_byte & (e != 255), alt.float(), v)
    return v.to(torch.bfloat16).float()


def _compare_exact(got, want, what):
    """Bitwise for |want| >= 2^-126; values below bf16's normal range may round (flush)."""
    tiny = want.abs() < 2.0 ** -126
    nan_ok = torch.isnan(got) == torch.isnan(want)
    same = (got == want) | (torch.isnan(got) & torch.isnan(want)) | (tiny & ((got - want).abs() <= 2.0 ** -126))
    ok = same & nan_ok
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:8].tolist()
        msg = ", ".join(f"[{i},{j}] got {got[i, j].item()!r} want {want[i, j].item()!r}" for i, j in bad)
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.numel()} entries differ: {msg}")


# every scale byte with finite products (e <= 245 keeps 480 * 2^(e-127) finite in bf16), the
# NaN scale, and filler up to 256 rows (dims stay multiples of 32)
E_ROWS = list(range(246)) + [255] + [127] * 9


@gpu
@needs_cuda
@pytest.mark.parametrize("cvt", ["bits", "hw"])
@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_dequant_exact_through_identity(variant, side, cvt):
    """One operand is the MXFP8 identity: the fp32 output is then exactly the other operand's
    bf16 dequant, for every data byte under every scale byte (incl. 0: 2^-127, 255: NaN)."""
    R, n = len(E_ROWS), 256
    e_of_row = lambda r: E_ROWS[r]  # noqa: E731
    d, s = _pattern_rows(R, n, e_of_row)          # [R, n]: row r uses scale E_ROWS[r]
    want = _expected_dequant(d, s)
    if cvt == "hw":
        # NaN data bytes are NaN on this path: one would poison its whole row through the
        # identity's zeros (NaN * 0), so the pattern skips them (0x7F -> 0x7E, 0xFF -> 0xFE)
        d = torch.where((d & 0x7F) == 0x7F, d - 1, d)
        want = mx.dequantize_rowwise(d.view(torch.float8_e4m3fn), s, torch.float32).to(torch.bfloat16).float()
    idd, ids = _identity_mx(n)
    cfg = gg.GemmCfg.heuristic(variant, 1, n, n, F32, cvt=cvt)
    off = _offsets([R] if variant != "wgrad" else [n])
    if variant == "fwd":
        if side == "a":     # y = P . I^T
            out = torch.full((R, n), float("nan"), device=DEV)
            gg.gemm_fwd_into(d, s, idd.view(1, n, n), ids.view(1, n, n // 32), off, out, cfg=cfg)
            got = out
        else:               # y[m, n] = I[m] . P[n]: out = P^T  (rows of P are B's rows)
            out = torch.full((n, R), float("nan"), device=DEV)
            cfg = gg.GemmCfg.heuristic(variant, 1, R, n, F32, cvt=cvt)
            gg.gemm_fwd_into(idd, ids, d.view(1, R, n), s.view(1, R, n // 32), _offsets([n]), out, cfg=cfg)
            got = out.t()
    elif variant == "dgrad":
        if side == "a":     # dX = P . I   (I columnwise: blocks along N; identity scales 127)
            out = torch.full((R, n), float("nan"), device=DEV)
            ids_col = torch.full((1, n // 32, n), 127, dtype=torch.uint8, device=DEV)
            gg.gemm_dgrad_into(d, s, idd.view(1, n, n), ids_col, off, out, cfg=cfg)
            got = out
        else:               # dX[m, k] = sum_n I[m, n] W[n, k] = W[m, k]: W = P^T (columnwise scales)
            W = d.t().contiguous()                      # [n, R]: W[k_red, out col]
            Ws = s[:, :1].t().expand(n // 32, R).contiguous()   # scale of column c = E_ROWS[c]
            out = torch.full((n, R), float("nan"), device=DEV)
            cfg = gg.GemmCfg.heuristic(variant, 1, n, R, F32, cvt=cvt)
            gg.gemm_dgrad_into(idd, ids, W.view(1, n, R), Ws.view(1, n // 32, R), _offsets([n]), out, cfg=cfg)
            got = out.t()
    else:
        # wgrad: dW = DY^T X over n tokens; one operand the identity [n tokens, n], the other P^T
        P = d.t().contiguous()                          # [n tokens, R]
        Ps = s[:, :1].t().expand(n // 32, R).contiguous()   # columnwise scales: col c -> E_ROWS[c]
        Is = torch.full((n // 32, n), 127, dtype=torch.uint8, device=DEV)
        if side == "a":     # dW[r, k] = sum_t P[t, r] I[t, k] = P[k, r] = d[r, k]
            out = torch.full((1, R, n), float("nan"), device=DEV)
            cfg = gg.GemmCfg.heuristic(variant, 1, R, n, F32, cvt=cvt)
            gg.gemm_wgrad_into(P, Ps, idd, Is, off, out, cfg=cfg)
            got = out[0]
        else:               # dW[m, r] = sum_t I[t, m] P[t, r] = P[m, r] = d[r, m]
            out = torch.full((1, n, R), float("nan"), device=DEV)
            cfg = gg.GemmCfg.heuristic(variant, 1, n, R, F32, cvt=cvt)
            gg.gemm_wgrad_into(idd, Is, P, Ps, off, out, cfg=cfg)
            got = out[0].t()
    torch.cuda.synchronize()
    _compare_exact(got, want, f"{variant} side {side} cvt {cvt}")


# ---------------------------------------------------------------- compile reuse, CUDA graphs


@gpu
@needs_cuda
def test_new_m_reuses_compiled_kernel():
    N, K = 256, 416
    with C.record_compile_keys() as keys:
        keys.clear()
        check_against_ref("fwd", make_fwd([10, 20], N, K), [10, 20], BF)
        n_compiled = len(C._COMPILED)
        for splits in ([300, 1], [0, 0], [77, 1000]):   # new M each call
            check_against_ref("fwd", make_fwd(splits, N, K), splits, BF)
        assert len(C._COMPILED) == n_compiled
        fwd_keys = [k for k in keys if k[0] == "moe.cute_grouped_gemm.fwd"]
        assert len(fwd_keys) == 1, fwd_keys


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", gg.VARIANTS)
def test_cuda_graph_capture_with_new_group_sizes(variant):
    """The grid depends on M, N, K, G only: a captured call replays correctly after the
    group sizes (offsets on the device) change, with no host sync."""
    check_graph_replay(variant)


def check_graph_replay(variant, cfg_of=None):
    """Captured with one set of group sizes, replayed after the device offsets changed: equal
    to an eager call with the new sizes (bitwise: same k order) and to the reference.
    ``cfg_of(G, N, K)``: the kernel's GemmCfg (None: the heuristic's)."""
    if variant == "wgrad":
        s1, s2 = [64, 0, 192, 256], [0, 320, 32, 160]
    else:
        s1, s2 = [50, 0, 200, 262], [300, 12, 0, 200]
    N, K = 288, 256
    p = MAKE[variant](s1, N, K)
    cfg = cfg_of(len(s1), N, K) if cfg_of else None
    offsets = _offsets(s1)
    out = torch.full(out_shape(variant, p), float("nan"), dtype=BF, device=DEV)
    run_variant(variant, p, offsets, out, cfg)      # compile + load outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run_variant(variant, p, offsets, out, cfg)
    offsets.copy_(_offsets(s2))
    out.fill_(float("nan"))
    g.replay()
    eager = torch.full_like(out, float("nan"))
    run_variant(variant, p, _offsets(s2), eager, cfg)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16)), "graph replay differs from eager"
    ref = REF[variant](p, s2)
    err = rel_err(out, ref)
    assert err <= tolerance(BF), f"rel err {err:.3e}\n" + diagnose(variant, out, ref, s2)
