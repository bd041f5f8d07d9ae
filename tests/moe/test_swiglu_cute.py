"""CuTe DSL SwiGLU kernels (tilekernels/moe/cute_swiglu.py).

CPU (CI): every kernel variant compiles ahead of time for sm_90a from fake arguments through the
same Launch objects the GPU path runs (PTX with 16-byte vector loads and an ELF cubin); the launch
config is the compile key and a new M reuses it.

GPU (marked ``gpu``, skipped without CUDA), fresh random inputs, outputs poisoned before each call
(NaN for floats, 0xA5 data bytes, 0xFE scale bytes: an E8M0 value fp32 inputs never produce):

* plain scaled_swiglu fwd/bwd vs the torch reference on float64 upcasts, within the tolerance
  table (bf16 outputs 1e-2: one bf16 rounding of the output; fp32 outputs 1e-5: fp32 math of a
  few operations plus, for dprobs, a reassociated fp32 sum over F);
* the fused SwiGLU + MXFP8 kernels bit for bit against ``mxfp8.quantize`` of the kernel's own fp32
  ``a`` / ``dh`` (the plain kernels at fp32, s = 32, which share the device math), and dprobs
  against float64;
* separately, bitwise agreement of the fp32 math with torch's own fp32 ops on the GPU (sigmoid
  included) and of the quantized outputs with quantizing the fp32 torch reference: if only these
  fail, the kernels are right but their sigmoid differs from torch's in the last bit;
* a NaN in h gives NaN where it lands and an all-NaN MXFP8 block (scale 0xFF, data 0x7F);
* the fused kernels' bf16 outputs (QuantCfg.bf16) equal dequantize_into of their MXFP8 outputs bit
  for bit (zero rows, subnormals, NaN / Inf blocks), dprobs unchanged.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels import _cute  # noqa: E402
from tilekernels.moe import cute_swiglu as cs  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402
from tilekernels.moe import reference as ref  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

ARCH = "sm_90a"
BF, F32, U8 = torch.bfloat16, torch.float32, torch.uint8


def gpu(fn):
    """Marks a GPU test: ``gpu`` marker, skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(fn))


# ============================================================================ CPU: compile


def _variants():
    """(name, Launch) of every kernel variant: the representative set at F = 2048 and F = 96 (row
    tails inside a warp, 3 MXFP8 blocks), plus plain kernels whose interleave narrows the vector
    (s = 8 fp32 / s = 1 / s = 3)."""
    out = dict(cs.representative_launches(2048))
    out.update({f"{k}/F96": v for k, v in cs.representative_launches(96).items()})
    for F, s, dt in ((2048, 8, "float32"), (96, 1, "bfloat16"), (96, 3, "float32")):
        for bwd in (False, True):
            cfg = cs.SwigluCfg.heuristic(F, s, dt, bwd=bwd)
            out[f"swiglu_{'bwd' if bwd else 'fwd'}/{dt}/s={s}/F{F}"] = cs.swiglu_launch(cfg, bwd)
    return out


def test_every_variant_compiles_for_sm90a():
    for name, ln in _variants().items():
        art = ln.export(ARCH)
        assert art.cubin[:4] == b"\x7fELF", f"{name}: not an ELF cubin"
        assert ".target sm_90a" in art.ptx, name
        res = [r for r in _cute.cubin_resources(art.cubin).values() if "regs" in r]
        assert len(res) == 1 and res[0].get("frame", 0) == 0, f"{name}: spills / local memory {res}"
        if isinstance(ln.cfg, cs.QuantCfg) and ln.cfg.min_blocks:  # the occupancy the config asks for
            assert res[0]["regs"] * 32 * ln.cfg.warps * ln.cfg.min_blocks <= 65536, f"{name}: {res}"
        cfg = ln.cfg
        if isinstance(cfg, cs.QuantCfg) and cfg.stages:  # 16-byte cp.async into the warp's stages
            # one 16-byte copy per input quad and row step at each of the `stages` issue sites (the
            # prologue's stages - 1 and the loop's; ptxas may merge sites): not one per element
            cps = re.findall(r"cp\.async\.cg\.shared\.global [^;]*, 16, 16;", art.ptx)
            per_site = (8 // cfg.rsplit) * (3 if cfg.bwd else 2)
            assert per_site <= len(cps) <= cfg.stages * per_site and len(cps) % per_site == 0, (name, len(cps))
            assert "ld.global.v4" not in art.ptx, name
            continue
        wide = isinstance(cfg, cs.QuantCfg) or cfg.vec * cs._ELT[cfg.dtype] == 16
        if wide:  # 16-byte vector loads where the layout allows them
            assert "ld.global.v4" in art.ptx, f"{name}: no 16-byte vector loads"


def test_heuristics():
    c = cs.SwigluCfg.heuristic(2048, 32, "bfloat16")
    assert (c.vec, c.lanes) == (8, 32)
    assert cs.SwigluCfg.heuristic(2048, None, "float32").vec == 4
    assert cs.SwigluCfg.heuristic(96, 3, "bfloat16").vec == 1          # s = 3: scalar accesses
    assert cs.SwigluCfg.heuristic(2048, 32, "float32", align=8).vec == 2  # an 8-byte aligned view
    assert cs.SwigluCfg.heuristic(32, None, "bfloat16").lanes == 4     # 4 vectors a row: 8 rows a warp
    q = cs.QuantCfg.heuristic(2048, bwd=True, col=True)
    assert q.grid_x == 1 and q.warps % q.rsplit == 0 and q.stages == 2
    q = cs.QuantCfg.heuristic(2048, bwd=False, col=True)   # each tile group pipelines over 4 blocks
    assert q.grid_x * q.warps // q.rsplit * 4 == 2048 // 32 and q.smem_bytes() == 64 * 1024
    with pytest.raises(ValueError):
        cs.QuantCfg(2048, False, True, warps=4, rsplit=1, grid_x=4, stages=1)
    q = cs.QuantCfg.heuristic(96, bwd=False, col=False)
    assert q.grid_x * (q.warps // q.rsplit) >= 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.F = 1


def test_config_is_the_compile_key_and_m_is_dynamic(monkeypatch):
    """The public entry points build their Launch from static dims only: two M's give the very same
    Launch (same key, M passed as a runtime scalar), whose compile is cached on that key; M = 0
    launches nothing."""
    calls = []
    monkeypatch.setattr(_cute.Launch, "run", lambda self, *v: calls.append((self, v)))
    F = 96

    def fwd(M):
        h = torch.randn(M, 2 * F)
        cs.swiglu_fwd_into(h, torch.rand(M), torch.empty(M, F), 32)

    def qfwd(M):
        h = torch.randn(M, 2 * F)
        cs.swiglu_quant_fwd_into(h, torch.rand(M), torch.empty(M, F, dtype=U8), torch.empty(M, F // 32, dtype=U8),
                                 torch.empty(M, F, dtype=U8), torch.empty(M // 32, F, dtype=U8))

    def qbwd(M):
        h = torch.randn(M, 2 * F)
        e = lambda *s: torch.empty(*s, dtype=U8)  # noqa: E731
        cs.swiglu_quant_bwd_into(torch.randn(M, F), h, torch.rand(M), e(M, 2 * F), e(M, 2 * F // 32),
                                 e(M, 2 * F), e(M // 32, 2 * F), torch.empty(M), e(M, F), e(M // 32, F))

    for call, ms in ((fwd, (31, 4128)), (qfwd, (32, 4128)), (qbwd, (96, 4128))):
        calls.clear()
        for M in (*ms, 0):
            call(M)
        assert len(calls) == 2, "M = 0 must launch nothing"
        (l1, v1), (l2, v2) = calls
        assert l1 is l2 and l1.key(ARCH) == l2.key(ARCH)
        assert (v1[-1], v2[-1]) == ms  # M is the runtime scalar
        assert l1.cfg in l1.key(ARCH) and l1.sig in l1.key(ARCH)
        c = l1.compile(ARCH)
        assert l2.compile(ARCH) is c  # compiled once per key


def test_refusals():
    h = torch.randn(31, 192)
    with pytest.raises(ValueError, match="M % 32"):  # columnwise blocks need whole 32-row groups
        cs.swiglu_quant_fwd_into(h, torch.rand(31), torch.empty(31, 96, dtype=U8), torch.empty(31, 3, dtype=U8),
                                 torch.empty(31, 96, dtype=U8), torch.empty(0, 96, dtype=U8))
    with pytest.raises(ValueError, match="must divide F"):  # F % 32 != 0: no whole MXFP8 blocks
        cs.swiglu_quant_fwd_into(torch.randn(32, 96), torch.rand(32), torch.empty(32, 48, dtype=U8),
                                 torch.empty(32, 1, dtype=U8))
    with pytest.raises(ValueError, match="interleave"):
        cs.swiglu_fwd_into(torch.randn(4, 96), torch.rand(4), torch.empty(4, 48), 32)
    h, p, b = torch.randn(32, 192), torch.rand(32), lambda *s: torch.empty(*s, dtype=BF)  # noqa: E731
    with pytest.raises(ValueError, match="no scales"):  # bf16 outputs are the dequantized values
        cs.swiglu_quant_fwd_into(h, p, b(32, 96), torch.empty(32, 3, dtype=U8))
    with pytest.raises(ValueError, match="col_data"):   # one kind of output per call
        cs.swiglu_quant_fwd_into(h, p, b(32, 96), None, torch.empty(32, 96, dtype=U8), None)
    with pytest.raises(ValueError, match="no scales"):
        cs.swiglu_quant_bwd_into(torch.randn(32, 96), h, p, b(32, 192), None, b(32, 192), None, torch.empty(32),
                                 b(32, 96), torch.empty(1, 96, dtype=U8))


# ============================================================================ GPU helpers


def _rand_h(M, F2, dtype, dev, gen_scale=True):
    """Standard normal rows scaled by 2^k (k in [-8, 8]) so that blocks get many exponents."""
    h = torch.randn(M, F2, device=dev)
    if gen_scale and M:
        h = h * torch.exp2(torch.randint(-8, 9, (M, 1), device=dev).float())
    return h.to(dtype)


def _rand_probs(M, dev):
    """Router probabilities in [0, 1) with a zero row (all-zero blocks: scale byte 0) and a subnormal
    one (subnormal a: scale 0, data rounded from subnormal fp32) when M allows."""
    p = torch.rand(M, device=dev)
    if M > 2:
        p[1] = 0.0
        p[2] = 1e-39
    return p


def _nan(*shape, dtype=F32, dev="cuda"):
    return torch.full(shape, float("nan"), dtype=dtype, device=dev)


def _bytes(*shape, fill, dev="cuda"):
    return torch.full(shape, fill, dtype=U8, device=dev)


def _exact(out, expect, what):
    assert_close(out.view(U8) if out.dtype == torch.float8_e4m3fn else out,
                 expect.view(U8) if expect.dtype == torch.float8_e4m3fn else expect, "exact", what)


def _q_both(x):
    """(row_data, row_scales, col_data, col_scales) of mxfp8.quantize(x, 'both') as uint8."""
    rd, rs_, cd, cs_ = mx.quantize(x, "both")
    return rd.view(U8), rs_, cd.view(U8), cs_


MS = [0, 1, 31, 32, 96, 4128]
FS = [32, 96, 2048]


def _dprobs_scale(dout, h, s):
    """Per row, the L2 norm of dprobs' terms (dout * silu(gate) * linear, float64): assert_close's ``scale`` for
    this sum of random-sign terms. A row whose F terms cancel to a small dprobs (M = 1 has one row, so its
    relative error is that row's) is then held to what fp32 summation gives, not to 1e-5 of the cancelled value
    (session 64: M1 F32 s32 read 1.09e-5 on an H100, ref -0.023); a wrong or missing term still errs on the
    terms' scale."""
    terms = dout.double() * ref.swiglu_fwd(h.double(), torch.ones(h.shape[0], dtype=torch.float64, device=h.device), s)
    return torch.linalg.vector_norm(terms, dim=1)


# ============================================================================ GPU: plain kernels


@pytest.mark.parametrize("s", [None, 32, 8])
@pytest.mark.parametrize("F", FS)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("dtype", [BF, F32])
@gpu
def test_swiglu_fwd_vs_float64(dtype, M, F, s):
    h, p = _rand_h(M, 2 * F, dtype, "cuda"), _rand_probs(M, "cuda")
    out = _nan(M, F, dtype=dtype)
    cs.swiglu_fwd_into(h, p, out, s)
    assert_close(out, ref.swiglu_fwd(h.double(), p.double(), s), what=f"out {dtype} M{M} F{F} s{s}")


@pytest.mark.parametrize("s", [None, 32, 8])
@pytest.mark.parametrize("F", FS)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("dtype", [BF, F32])
@gpu
def test_swiglu_bwd_vs_float64(dtype, M, F, s):
    h, p = _rand_h(M, 2 * F, dtype, "cuda"), _rand_probs(M, "cuda")
    dout = _rand_h(M, F, dtype, "cuda")
    dh, dprobs = _nan(M, 2 * F, dtype=dtype), _nan(M)
    cs.swiglu_bwd_into(dout, h, p, dh, dprobs, s)
    rdh, rdp = ref.swiglu_bwd(dout.double(), h.double(), p.double(), s)
    assert_close(dh, rdh, what=f"dh {dtype} M{M} F{F} s{s}")
    assert_close(dprobs, rdp, what=f"dprobs M{M} F{F} s{s}", scale=_dprobs_scale(dout, h, s))


@pytest.mark.parametrize("s,F", [(1, 96), (3, 96), (64, 2048), (None, 3), (1, 5)])
@pytest.mark.parametrize("dtype", [BF, F32])
@gpu
def test_swiglu_other_interleaves(dtype, s, F):
    M = 37
    h, p, dout = _rand_h(M, 2 * F, dtype, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, dtype, "cuda")
    out, dh, dprobs = _nan(M, F, dtype=dtype), _nan(M, 2 * F, dtype=dtype), _nan(M)
    cs.swiglu_fwd_into(h, p, out, s)
    cs.swiglu_bwd_into(dout, h, p, dh, dprobs, s)
    assert_close(out, ref.swiglu_fwd(h.double(), p.double(), s), what="out")
    rdh, rdp = ref.swiglu_bwd(dout.double(), h.double(), p.double(), s)
    assert_close(dh, rdh, what="dh")
    assert_close(dprobs, rdp, what="dprobs", scale=_dprobs_scale(dout, h, s))


@gpu
def test_swiglu_unaligned_view():
    """A view 8 bytes into its storage: the vector width narrows, results stay right."""
    M, F = 64, 2048
    base = _rand_h(M * 2 * F + 2, 1, F32, "cuda").view(-1)
    h = base[2:].view(M, 2 * F)
    p = _rand_probs(M, "cuda")
    out = _nan(M * F + 2)[2:].view(M, F)
    cs.swiglu_fwd_into(h, p, out, 32)
    assert_close(out, ref.swiglu_fwd(h.double(), p.double(), 32), what="out")


@pytest.mark.parametrize("s", [None, 32])
@pytest.mark.parametrize("dtype", [BF, F32])
@gpu
def test_swiglu_bitwise_vs_torch(dtype, s):
    """Diagnostic: the kernels' fp32 math (torch's sigmoid sequence, torch's operation order, no
    contraction) equals torch's own fp32 ops on the GPU bit for bit (dh and out; dprobs is a sum in
    another order)."""
    M, F = 4128, 2048
    h, p, dout = _rand_h(M, 2 * F, dtype, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, dtype, "cuda")
    out, dh, dprobs = _nan(M, F, dtype=dtype), _nan(M, 2 * F, dtype=dtype), _nan(M)
    cs.swiglu_fwd_into(h, p, out, s)
    cs.swiglu_bwd_into(dout, h, p, dh, dprobs, s)
    _exact(out, ref.scaled_swiglu(h, p, s), f"out {dtype} s{s} vs torch fp32")
    _exact(dh, ref.scaled_swiglu_bwd(dout, h, p, s)[0], f"dh {dtype} s{s} vs torch fp32")


@gpu
def test_swiglu_nan():
    M, F = 64, 96
    h, p = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda")
    h[5, 70] = float("nan")  # s = 32: column 70 is gate column 6 of output block 1 -> out[5, 38]
    out = _nan(M, F)
    cs.swiglu_fwd_into(h, p, out, 32)
    nan = torch.isnan(out)
    assert nan[5, 38] and nan.sum() == 1


# ============================================================================ GPU: fused MXFP8


def _own_a(h, p):
    a = _nan(*h.shape[:1], h.shape[1] // 2)
    cs.swiglu_fwd_into(h, p, a, 32)
    return a


def _quant_fwd(h, p, col):
    M, F = h.shape[0], h.shape[1] // 2
    rd, rs_ = _bytes(M, F, fill=0xA5), _bytes(M, F // 32, fill=0xFE)
    cd = _bytes(M, F, fill=0xA5) if col else None
    cs_ = _bytes(M // 32, F, fill=0xFE) if col else None
    cs.swiglu_quant_fwd_into(h, p, rd.view(torch.float8_e4m3fn), rs_, cd, cs_)
    return rd, rs_, cd, cs_


@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("F", FS)
@pytest.mark.parametrize("M", MS)
@gpu
def test_quant_fwd_exact(M, F, col):
    if col and M % 32:
        pytest.skip("columnwise needs M % 32 == 0 (refusal tested on CPU)")
    h, p = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda")
    rd, rs_, cd, cs_ = _quant_fwd(h, p, col)
    a = _own_a(h, p)
    assert_close(a, ref.swiglu_fwd(h.double(), p.double(), 32), what="own a vs float64")
    erd, ers = mx.quantize_rowwise(a)
    _exact(rd, erd, f"row data M{M} F{F}")
    _exact(rs_, ers, f"row scales M{M} F{F}")
    if col:
        ecd, ecs = mx.quantize_columnwise(a)
        _exact(cd, ecd, f"col data M{M} F{F}")
        _exact(cs_, ecs, f"col scales M{M} F{F}")


def _quant_bwd(da, h, p, a_col):
    M, F = da.shape
    dhr, dhrs = _bytes(M, 2 * F, fill=0xA5), _bytes(M, 2 * F // 32, fill=0xFE)
    dhc, dhcs = _bytes(M, 2 * F, fill=0xA5), _bytes(M // 32, 2 * F, fill=0xFE)
    dprobs = _nan(M)
    ac = _bytes(M, F, fill=0xA5) if a_col else None
    acs = _bytes(M // 32, F, fill=0xFE) if a_col else None
    cs.swiglu_quant_bwd_into(da, h, p, dhr, dhrs, dhc, dhcs, dprobs, ac, acs)
    return dhr, dhrs, dhc, dhcs, dprobs, ac, acs


@pytest.mark.parametrize("a_col", [False, True])
@pytest.mark.parametrize("F", FS)
@pytest.mark.parametrize("M", [0, 32, 96, 4128])
@gpu
def test_quant_bwd_exact(M, F, a_col):
    h, p, da = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, F32, "cuda")
    dhr, dhrs, dhc, dhcs, dprobs, ac, acs = _quant_bwd(da, h, p, a_col)
    dh, dp_own = _nan(M, 2 * F), _nan(M)
    cs.swiglu_bwd_into(da, h, p, dh, dp_own, 32)
    rdh, rdp = ref.swiglu_bwd(da.double(), h.double(), p.double(), 32)
    assert_close(dh, rdh, what="own dh vs float64")
    assert_close(dprobs, rdp, what=f"dprobs M{M} F{F}", scale=_dprobs_scale(da, h, 32))
    erd, ers, ecd, ecs = _q_both(dh)
    _exact(dhr, erd, f"dh row data M{M} F{F}")
    _exact(dhrs, ers, f"dh row scales M{M} F{F}")
    _exact(dhc, ecd, f"dh col data M{M} F{F}")
    _exact(dhcs, ecs, f"dh col scales M{M} F{F}")
    if a_col:
        ecd, ecs = mx.quantize_columnwise(_own_a(h, p))
        _exact(ac, ecd, f"a col data M{M} F{F}")
        _exact(acs, ecs, f"a col scales M{M} F{F}")


@gpu
def test_quant_bwd_dprobs_deterministic():
    M, F = 4128, 2048
    h, p, da = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, F32, "cuda")
    first = _quant_bwd(da, h, p, True)[4]
    for _ in range(3):
        assert torch.equal(_quant_bwd(da, h, p, True)[4], first)


@gpu
def test_quant_bitwise_vs_torch_reference():
    """Diagnostic: quantizing torch's own fp32 reference gives the kernels' bytes (fails, with
    test_quant_*_exact passing, only if the sigmoid differs from torch's in the last bit)."""
    M, F = 4128, 2048
    h, p, da = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, F32, "cuda")
    rd, rs_, cd, cs_ = _quant_fwd(h, p, True)
    a = ref.swiglu_fwd(h, p, 32)
    erd, ers, ecd, ecs = _q_both(a)
    for out, exp, what in ((rd, erd, "a row data"), (rs_, ers, "a row scales"), (cd, ecd, "a col data"),
                           (cs_, ecs, "a col scales")):
        _exact(out, exp, what + " vs quantized torch fp32 reference")
    dhr, dhrs, dhc, dhcs, _, ac, acs = _quant_bwd(da, h, p, True)
    dh = ref.swiglu_bwd(da, h, p, 32)[0]
    erd, ers, ecd, ecs = _q_both(dh)
    for out, exp, what in ((dhr, erd, "dh row data"), (dhrs, ers, "dh row scales"), (dhc, ecd, "dh col data"),
                           (dhcs, ecs, "dh col scales"), (ac, _q_both(a)[2], "a col data (bwd)")):
        _exact(out, exp, what + " vs quantized torch fp32 reference")


@gpu
def test_quant_nan_and_inf_blocks():
    """A NaN in h (and an Inf) makes its rowwise and columnwise blocks NaN: scale 0xFF, data 0x7F;
    other blocks stay finite."""
    M, F = 64, 96
    h, p, da = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, F32, "cuda")
    p[:] = 0.5
    h[40, 64 + 32 + 3] = float("nan")  # linear of output block 1, column 35, row 40
    h[3, 0] = float("inf")             # gate +inf: silu = inf * sigmoid = inf -> a = +-inf (lin != 0)
    rd, rs_, cd, cs_ = _quant_fwd(h, p, True)
    assert rs_[40, 1] == 0xFF and (rd[40, 32:64] == 0x7F).all()
    assert cs_[1, 35] == 0xFF and (cd[32:64, 35] == 0x7F).all()
    assert rs_[3, 0] == 0xFF and cs_[0, 0] == 0xFF
    assert (rs_ != 0xFF).sum() == rs_.numel() - 2 and (cs_ != 0xFF).sum() == cs_.numel() - 2
    a = _own_a(h, p)
    assert torch.isnan(a[40, 35])
    for out, exp in zip((rd, rs_, cd, cs_), _q_both(a)):
        _exact(out, exp, "fwd with NaN/Inf")
    dhr, dhrs, dhc, dhcs, dprobs, ac, acs = _quant_bwd(da, h, p, True)
    assert dhrs[40, 2] == 0xFF and dhcs[1, 64 + 3] == 0xFF and acs[1, 35] == 0xFF  # dgate of column 35
    assert torch.isnan(dprobs[40]) and torch.isfinite(dprobs[:3]).all()


@gpu
@pytest.mark.parametrize("bwd", [False, True])
def test_quant_configs_agree(bwd):
    """Other launch configs (row split 1/2/4, warps looping over several blocks, register loads
    (stages 0) and 3 cp.async stages) give the default config's bytes (dprobs: to fp32
    reassociation, the group count orders its sum)."""
    M, F = 96, 256
    h, p, da = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, F32, "cuda")
    base = cs.QuantCfg.heuristic(F, bwd, True)
    if bwd:
        alts = [cs.QuantCfg(F, True, True, warps=w, rsplit=r, grid_x=1, stages=st)
                for w, r, st in ((4, 1, 2), (8, 4, 2), (8, 2, 3), (2, 2, 2), (4, 2, 0), (4, 1, 0), (4, 2, 2))]
        expect = _quant_bwd(da, h, p, True)
    else:
        alts = [cs.QuantCfg(F, False, True, warps=w, rsplit=r, grid_x=g, stages=st)
                for w, r, g, st in ((4, 2, 4, 2), (4, 4, 8, 2), (2, 1, 1, 3), (4, 1, 2, 0), (4, 1, 1, 2), (8, 2, 1, 3),
                                    (8, 2, 2, 2))]
        expect = _quant_fwd(h, p, True)
    alts = [c for c in alts if c != base]
    assert len(alts) >= 5
    for cfg in alts:
        got = [torch.full_like(x, float("nan")) if x.dtype == F32 else torch.full_like(x, 0xA5) for x in expect]
        args = (da, h, p, *got) if bwd else (h, p, *got)
        cs.quant_launch(cfg).run(*args, M)
        for g_, e_ in zip(got, expect):
            if g_.dtype == F32:
                assert_close(g_, e_, what=f"dprobs {cfg}")
            else:
                _exact(g_, e_, f"{cfg}")


@gpu
def test_new_m_reuses_the_compiled_kernel():
    """On the device: two M's record one compile key per kernel (M is a runtime argument)."""
    F = 224  # a width no other test uses
    with _cute.record_compile_keys() as keys:
        for M in (32, 4128):
            h, p = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda")
            _quant_fwd(h, p, True)
            cs.swiglu_fwd_into(h, p, _nan(M, F), 32)
        ours = {k for k in keys if k[0].startswith("moe.cute_swiglu") and k[2].F == F}
    assert len(ours) == 2, ours


@pytest.mark.parametrize("M,F", [(0, 96), (32, 32), (96, 96), (4128, 2048)])
@gpu
def test_quant_bf16_outputs_are_the_dequantized_mxfp8(M, F):
    """bf16 outputs (QuantCfg.bf16) hold bit for bit what dequantize_into makes of the MXFP8
    outputs (zero rows, subnormal a, a NaN and an Inf block included); dprobs is unchanged."""
    from tilekernels.moe import cute_quantize as cq

    h, p, da = _rand_h(M, 2 * F, F32, "cuda"), _rand_probs(M, "cuda"), _rand_h(M, F, F32, "cuda")
    if M >= 64:
        h[40, 64 + 3] = float("nan")
        h[3, 0] = float("inf")

    def deq(d, s_, axis):
        out = _nan(*d.shape, dtype=BF)
        cq.dequantize_into(d, s_, out, axis)
        return out

    def same(got, expect, what):
        assert torch.equal(got.view(torch.int16), expect.view(torch.int16)), what

    rd, rs_, cd, cs_ = _quant_fwd(h, p, True)
    outs = [_nan(M, F, dtype=BF) for _ in range(3)]
    cs.swiglu_quant_fwd_into(h, p, outs[0], None, outs[1], None)
    cs.swiglu_quant_fwd_into(h, p, outs[2], None)
    same(outs[0], deq(rd, rs_, "rowwise"), "fwd a rowwise")
    same(outs[1], deq(cd, cs_, "columnwise"), "fwd a columnwise")
    same(outs[2], outs[0], "fwd a rowwise (no columnwise output)")
    dhr, dhrs, dhc, dhcs, dprobs, ac, acs = _quant_bwd(da, h, p, True)
    got = [_nan(M, 2 * F, dtype=BF), _nan(M, 2 * F, dtype=BF), _nan(M, F, dtype=BF), _nan(M)]
    cs.swiglu_quant_bwd_into(da, h, p, got[0], None, got[1], None, got[3], got[2], None)
    same(got[0], deq(dhr, dhrs, "rowwise"), "dh rowwise")
    same(got[1], deq(dhc, dhcs, "columnwise"), "dh columnwise")
    same(got[2], deq(ac, acs, "columnwise"), "a columnwise (bwd)")
    assert torch.equal(got[3].view(torch.int32), dprobs.view(torch.int32)), "dprobs"
    if M >= 64:
        assert torch.isnan(outs[0][40, 32:64]).all() and torch.isnan(got[0][40, 64:96]).all()
