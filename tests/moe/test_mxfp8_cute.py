"""CuTe DSL MXFP8 quantize / dequantize kernels (tilekernels.moe.cute_quantize).

CPU (CI): every kernel variant (quantize rowwise / columnwise / both on the
shared-memory, register and pipelined kernels, dequantize rowwise / columnwise,
x bf16 and fp32) compiles for sm_90a through the same launch code the GPU path
uses (fake arguments, explicit arch), without spilling, with 16-byte loads
(pipelined kernel: 16-byte cp.async only) and 8-byte (fp32 pipelined: 4-byte)
rowwise data stores; launch configs depend on static dims only, and a new R
reuses the compiled kernel. Skipped where ``cutlass`` is not installed.

GPU (``-m gpu``; skipped without CUDA): bit-exact against the torch reference
(tilekernels.moe.mxfp8) on fresh random inputs: randn scaled by random powers of
two per row and per 32-column group, with zero blocks (rowwise and columnwise),
NaN, +-Inf, values near the format limits, fp32 / bf16 subnormals and exact scale
boundaries (448 * 2^k and its neighbours). Outputs are poisoned twice with
different bytes, so an element a kernel never writes fails one of the runs.
"""
from __future__ import annotations

import ctypes
import math
import re

import pytest
import torch

cutlass = pytest.importorskip("cutlass")

from tilekernels import _cute as C  # noqa: E402
from tilekernels.moe import cute_quantize as Q  # noqa: E402
from tilekernels.moe import cute_quantize_pipe as P  # noqa: E402
from tilekernels.moe.cute_quantize_pipe import SMEM_MAX, PipeCfg  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
AXES = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


# ---------------------------------------------------------------------- CPU: compile

def test_every_variant_compiles_for_sm90a():
    launches = Q.representative_launches(K=7168)
    assert len(launches) == 28
    for name, ln in launches.items():
        art = ln.export("sm_90a")
        assert art.cubin[:4] == b"\x7fELF", name
        assert ".target sm_90a" in art.ptx, name
        assert "cvt.rn.satfinite.e4m3x2.f32" in art.ptx or "dequantize" in name, name
        assert ".ftz" not in art.ptx, f"{name}: flush-to-zero would break subnormal exactness"
        res = list(C.cubin_resources(art.cubin).values())
        assert len(res) == 1 and res[0]["regs"] <= 255, (name, res)
        assert res[0].get("frame", 0) == 0, f"{name}: spills ({res})"
        loads = set(re.findall(r"ld\.global\.[a-z0-9.]+", art.ptx))
        if isinstance(ln.cfg, PipeCfg):
            # x only through 16-byte cp.async (one per chunk and issue site: the prologue's
            # stages - 1 and the loop's; persistent: a full-strip and a partial-strip path
            # each), data stores 8 (bf16) / 4 (fp32) bytes a lane
            assert not loads, (name, loads)
            cps = re.findall(r"cp\.async\.cg\.shared\.global(?:\.[a-z0-9]+)*\s*\[[^]]*\],\s*\[[^]]*\],\s*16", art.ptx)
            per_site = 2 * ln.cfg.elt * ln.cfg.nbt    # 16-byte chunks a lane copies per tile
            sites = ln.cfg.stages * (2 if ln.cfg.ctas else 1)
            assert per_site <= len(cps) <= sites * per_site and len(cps) % per_site == 0, (name, len(cps))
            want = "st.global.v2.b32" if ln.cfg.elt == 2 else "st.global.b32"
            assert want in art.ptx and "st.global.v4" not in art.ptx, name
        elif name.startswith("quantize"):
            # x is read in vec-element loads (16, 8 or 4 bytes), none narrower
            width = 16 if ln.cfg.smem else ln.cfg.vec * (2 if name.endswith("bfloat16") else 4)
            want = {16: "ld.global.v4.b32", 8: "ld.global.v2.b32", 4: "ld.global.b32"}[width]
            assert loads == {want}, (name, loads)
            if ln.cfg.smem and ln.cfg.row:  # rowwise data: 8 bytes per lane, lanes along the row
                assert "st.global.v2.b32" in art.ptx and "st.global.v4.b32" not in art.ptx, name


def test_pipe_config_from_static_dims(monkeypatch):
    """The pipelined kernel serves the rowwise output at K % 32 == 0 and aligned pointers
    (as _PIPE lists); its config depends on K, dtype, the axes and the SM count only (a
    persistent grid of one CTA an SM for the pairs in PERSISTENT); bad configs raise."""
    for dt in (BF, F32):
        for row, col in ((True, False), (True, True)):
            cfg = Q.quant_launch(dt, 7168, row, col).cfg
            assert isinstance(cfg, PipeCfg) == ((dt, row, col) in Q._PIPE)
            assert Q.quant_launch(dt, 7168, row, col, False).cfg.vec == 1       # unaligned
            if isinstance(cfg, PipeCfg):
                assert cfg.ctas == (132 if (cfg.elt, col) in P.PERSISTENT else 0)
    monkeypatch.setattr(P, "PERSISTENT", frozenset())
    c = PipeCfg.heuristic(32, BF, True, True)
    assert (c.warps, c.grid_x, c.nbt, c.ctas) == (1, 1, 1, 0) and hash(c) == hash(PipeCfg.heuristic(32, BF, True, True))
    monkeypatch.setattr(P, "PERSISTENT", frozenset({(2, True), (4, False), (4, True)}))
    for dt, col in ((BF, True), (F32, False), (F32, True)):
        c = PipeCfg.heuristic(7168, dt, True, col, sms=114)
        assert (c.warps, c.stages, c.grid_x, c.ctas, c.nbt * c.elt) == (8, 2, 1, 114, 8)
    assert PipeCfg.heuristic(7168, BF, True, False, sms=114).ctas == 0
    for bad in (dict(K=48), dict(row=False), dict(stages=1), dict(elt=8), dict(warps=32, stages=8),
                dict(nbt=3), dict(nbt=4), dict(K=96, nbt=2), dict(ctas=-1), dict(ctas=4, grid_x=2),
                dict(ctas=4, min_blocks=2)):
        with pytest.raises(ValueError):
            PipeCfg(**{**dict(K=64, row=True, col=True, elt=4), **bad})


def test_compiles_for_sm100a():
    art = Q.quant_launch(BF, 7168, True, True).export("sm_100a")
    assert art.cubin[:4] == b"\x7fELF" and ".target sm_100a" in art.ptx


def test_odd_shapes_compile():
    """K a multiple of 16 bytes: the shared-memory kernel; otherwise (columnwise, any K) the
    register kernel with the widest vector dividing K; misaligned pointers: vec = 1."""
    assert Q.quant_launch(F32, 100, False, True).cfg.smem
    for K, vec in ((100, 4), (98, 2), (97, 1)):
        ln = Q.quant_launch(BF, K, False, True)
        assert not ln.cfg.smem and ln.cfg.vec == vec
        assert ln.export("sm_90a").cubin[:4] == b"\x7fELF"
    for row, col in AXES.values():
        ln = Q.quant_launch(F32, 64, row, col, False)
        assert not ln.cfg.smem and ln.cfg.vec == 1
        assert ln.export("sm_90a").cubin[:4] == b"\x7fELF"


def test_fast_path_marshals_like_the_dsl():
    """Launch.run's own argument slots hold exactly what the DSL's marshalling would pass
    (one C pointer per argument: data address, R, stream handle)."""
    ln = Q.quant_launch(BF, 256, True, True)
    c = ln.compile("sm_90a")
    assert ln.fast_path(c)
    x = torch.empty(64, 256, dtype=BF)
    u = torch.empty(64, 256, dtype=torch.uint8)
    vals = (x, u, None, u, u, 64)
    reals, st = [s.real(v) for s, v in zip(ln.sig, vals)], C.cuda.CUstream(1234)
    exe, _ = c.generate_execution_args(*reals, st)
    assert len(exe) == len(ln.sig) + 1
    for s, v, a in zip((*ln.sig, None), (*vals, 1234), exe):
        ct = s.ctype if s is not None else ctypes.c_void_p
        got = ct.from_address(a.value if isinstance(a, ctypes.c_void_p) else int(a)).value
        assert (got or 0) == (s.raw(v) if s is not None else v), (s, got)


def test_launch_config_is_the_compile_key(monkeypatch):
    """Configs come from static dims only; quantize_into for two R picks one launch whose
    key has no R, and compiling it again is a cache hit."""
    assert Q.QuantCfg.heuristic(7168, BF, True, True) == Q.QuantCfg.heuristic(7168, BF, True, True)
    hash(Q.QuantCfg.heuristic(7168, F32, True, False))
    hash(Q.DequantCfg.heuristic(7168, False))
    calls = []
    monkeypatch.setattr(C.Launch, "run", lambda self, *v: calls.append((self, v)))
    for R in (64, 4128):
        x = torch.empty(R, 256, dtype=BF, device="meta")
        u8 = torch.empty(R, 256, dtype=torch.uint8, device="meta")
        Q.quantize_into(x, u8, torch.empty(R, 8, dtype=torch.uint8, device="meta"),
                        u8, torch.empty(R // 32, 256, dtype=torch.uint8, device="meta"))
    (l1, v1), (l2, v2) = calls
    assert l1 is l2 and v1[-1] == 64 and v2[-1] == 4128
    host = f"{l1.fn.__module__}.{l1.fn.__qualname__}"
    assert l1.key("sm_90a") == ("moe.cute_quantize.quantize", host, l1.sig, l1.cfg, "", "sm_90a")
    c = l1.compile("sm_90a")
    n = len(C._COMPILED)
    assert l1.compile("sm_90a") is c and len(C._COMPILED) == n
    # R == 0 launches nothing
    calls.clear()
    x0 = torch.empty(0, 256, dtype=BF, device="meta")
    Q.quantize_into(x0, torch.empty(0, 256, dtype=torch.uint8, device="meta"),
                    torch.empty(0, 8, dtype=torch.uint8, device="meta"), None, None)
    assert calls == []


# ---------------------------------------------------------------------- GPU: bit-exact

def _special_values(dtype):
    f = torch.finfo(dtype)
    vals = [0.0, -0.0, f.max, -f.max, f.tiny, f.tiny / 2, f.tiny / 8, 1e-40, -1e-41, 1e-45,
            448.0, 224.0, 1.0, 0.5]
    for k in (-120, -9, -1, 0, 1, 9, 100):
        v = torch.tensor(448 * 2.0 ** k, dtype=torch.float32).to(dtype)
        vals += [v.item(), torch.nextafter(v.float(), torch.tensor(math.inf)).item(),
                 torch.nextafter(v.float(), torch.tensor(0.0)).item()]
    return torch.tensor(vals, dtype=torch.float32).to(dtype)


def make_input(R: int, K: int, dtype, device, specials: bool = True) -> torch.Tensor:
    """randn * 2^(row exponent + 32-column-group exponent), then (specials) zero row blocks,
    zero column blocks, NaN / +-Inf, and edge values at random positions."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    er = torch.randint(-30, 30, (R, 1), generator=g)
    ec = torch.randint(-30, 30, (1, (K + 31) // 32), generator=g).repeat_interleave(32, 1)[:, :K]
    x = torch.randn(R, K, generator=g, dtype=torch.float64) * torch.exp2((er + ec).double())
    x = x.to(dtype)
    if specials and R and K:
        n = R * K
        flat = x.view(-1)
        sv = _special_values(dtype)
        idx = torch.randint(0, n, (max(1, n // 500),), generator=g)
        flat[idx] = sv[torch.randint(0, len(sv), (len(idx),), generator=g)]
        for v in (math.nan, math.inf, -math.inf):
            flat[torch.randint(0, n, (max(1, n // 20000),), generator=g)] = v
        if K >= 32:  # a zero rowwise block
            r, j = torch.randint(0, R, ()).item(), torch.randint(0, K // 32, ()).item()
            x[r, 32 * j:32 * j + 32] = 0
        if R >= 32:  # a zero columnwise block, and one made of subnormals only
            i, k = torch.randint(0, R // 32, ()).item(), torch.randint(0, K, ()).item()
            x[32 * i:32 * i + 32, k] = 0
            k2 = torch.randint(0, K, ()).item()
            x[32 * i:32 * i + 32, k2] = torch.finfo(dtype).tiny * torch.rand(32, generator=g).to(dtype) / 4
    return x.to(device)


def _u8(t):
    return t.view(torch.uint8)


def _outs(R, K, axis, device, data_byte, scale_byte):
    row, col = AXES[axis]
    e8 = torch.float8_e4m3fn

    def full(shape, dt, b):
        return torch.full(shape, b, dtype=torch.uint8, device=device).view(dt)
    return (full((R, K), e8, data_byte) if row else None, full((R, K // 32), torch.uint8, scale_byte) if row else None,
            full((R, K), e8, data_byte) if col else None,
            full((R // 32, K), torch.uint8, scale_byte) if col else None)


def check_quantize(x: torch.Tensor, axis: str) -> None:
    R, K = x.shape
    want = {"rowwise": lambda q: (*q, None, None), "columnwise": lambda q: (None, None, *q),
            "both": lambda q: q}[axis](mx.quantize(x, axis))
    for data_byte, scale_byte in ((0x55, 0xAA), (0x2A, 0x11)):
        outs = _outs(R, K, axis, x.device, data_byte, scale_byte)
        Q.quantize_into(x, *outs)
        torch.cuda.synchronize()
        for name, got, w in zip(("row_data", "row_scales", "col_data", "col_scales"), outs, want):
            if got is None:
                assert w is None
                continue
            assert torch.equal(_u8(got).cpu(), _u8(w).cpu()), \
                f"{axis} {tuple(x.shape)} {x.dtype}: {name} differs at " \
                f"{(_u8(got).cpu() != _u8(w).cpu()).nonzero()[:5].tolist()}"


# three K values (K is static: each is a compile): regime edges and the headline width
SHAPES = [(32, 32), (96, 160), (33, 160), (1, 32), (64, 7168), (4128, 7168)]


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("axis", list(AXES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quantize_bit_exact(shape, axis, dtype):
    R, K = shape
    if AXES[axis][1] and R % 32:
        pytest.skip("columnwise needs R % 32 == 0")
    check_quantize(make_input(R, K, dtype, "cuda"), axis)


CFGS = [(True, 2, 128), (True, 1, 64), (True, 2, 64), (True, 4, 64), (True, 4, 128), (True, 1, 256), (False, 1, 128), (False, 2, 128),
        (False, 4, 64), (False, 8, 128)]


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("axis,direct", [("both", False), ("rowwise", False), ("rowwise", True)])
@pytest.mark.parametrize("smem,vec,threads", CFGS)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_config_bit_exact(smem, vec, threads, axis, direct, dtype):
    """Configs the heuristic does not pick (what benchmarks/moe_cute_check.py --sweep
    times) are exact too, on a shape with a partial column tile and a partial row tile;
    rowwise only: the staged and the direct-load variants of the shared-memory mapping."""
    import dataclasses

    elt = 2 if dtype == BF else 4
    if vec * elt > 16 or (smem and 32 * (threads * vec + 16 // elt) * elt > 48 * 1024):
        pytest.skip("not a valid config")
    if axis == "rowwise" and not smem:
        pytest.skip("rowwise configs: the shared-memory mapping (the register kernel's run in 'both')")
    R, K = 96 if axis == "both" else 77, 800
    row, col = AXES[axis]
    cfg = dataclasses.replace(Q.QuantCfg.heuristic(K, dtype, row, col), smem=smem, vec=vec, threads=threads,
                              direct=smem and not col and direct)
    check_launch(Q.launch_for(cfg, dtype), R, K, axis, dtype)


PIPE_CFGS = [(1, 8, 2, 1, 0, 4), (1, 8, 3, 2, 0, 4), (1, 4, 2, 3, 8, 2), (1, 3, 2, 1, 0, 4), (1, 1, 3, 1, 0, 1),
             (2, 8, 2, 1, 0, 4), (2, 4, 3, 2, 0, 8), (4, 4, 2, 1, 0, 4), (4, 8, 3, 2, 0, 2), (4, 3, 2, 1, 0, 16),
             (4, 8, 2, 2, 0, 4), (4, 8, 2, 1, 0, 4), (8, 2, 2, 1, 0, 4)]


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("axis", ["rowwise", "both"])
@pytest.mark.parametrize("nbt,warps,stages,grid_x,min_blocks,unroll", PIPE_CFGS)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pipe_config_bit_exact(nbt, warps, stages, grid_x, min_blocks, unroll, axis, dtype):
    """Pipelined-kernel configs the heuristic does not pick (the sweep's), exact on K = 800
    (nbt 1: 25 column blocks) or 768 (24 blocks: 24 / nbt tiles), so warps with 0..n tiles
    and partial last strides, and a partial row strip (rowwise); K = 32 * nbt: one tile, idle
    warps."""
    row, col = AXES[axis]
    elt = 2 if dtype == BF else 4
    if nbt * elt * 2 > 32 or warps * stages * 32 * 32 * nbt * elt > SMEM_MAX:
        pytest.skip("not a valid config (over 32 lanes a tile row, or over 227 KB of buffers)")
    for R, K in ((96 if col else 77, 800 if nbt == 1 else 768), (64 if col else 33, 32 * nbt)):
        cfg = PipeCfg(K=K, row=row, col=col, elt=elt, warps=warps, stages=stages,
                      grid_x=grid_x, min_blocks=min_blocks, nbt=nbt, unroll=unroll)
        check_launch(Q.launch_for(cfg, dtype), R, K, axis, dtype)


# (nbt, warps, stages, ctas): persistent grids of 1..5 CTAs (warps walk tiles of several strips,
# the last stride partial), 14 warps (224 KB of buffers), and 132 CTAs (fewer launched: R small)
PERSIST_CFGS = [(4, 8, 2, 1), (4, 8, 2, 2), (4, 7, 2, 5), (4, 14, 2, 3), (2, 8, 2, 3), (2, 7, 3, 2), (1, 3, 2, 4),
                (8, 4, 2, 3), (4, 4, 3, 132), (2, 14, 2, 1)]


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("axis", ["rowwise", "both"])
@pytest.mark.parametrize("nbt,warps,stages,ctas", PERSIST_CFGS)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pipe_persistent_bit_exact(nbt, warps, stages, ctas, axis, dtype):
    """The pipelined kernel on a persistent grid: tile g = strip * NT + column tile, so shapes
    with several strips (R = 77: a partial last strip, rowwise; 96 / 160 both), K = 768 / 800
    (24 / 25 column blocks: 24 / nbt tiles a strip) or 32 * nbt (one tile a strip), and R = 1."""
    row, col = AXES[axis]
    elt = 2 if dtype == BF else 4
    if nbt * elt * 2 > 32 or warps * stages * 32 * 32 * nbt * elt > SMEM_MAX:
        pytest.skip("not a valid config (over 32 lanes a tile row, or over 227 KB of buffers)")
    shapes = [(96 if col else 77, 800 if nbt == 1 else 768), (160 if col else 65, 32 * nbt)]
    for R, K in shapes + ([] if col else [(1, 32 * nbt)]):
        cfg = PipeCfg(K=K, row=row, col=col, elt=elt, warps=warps, stages=stages, nbt=nbt, ctas=ctas)
        check_launch(Q.launch_for(cfg, dtype), R, K, axis, dtype)


def check_launch(ln, R, K, axis, dtype):
    """One launch on fresh inputs (with specials), poisoned outputs, against the torch path."""
    x = make_input(R, K, dtype, "cuda")
    want = {"rowwise": lambda q: (*q, None, None), "columnwise": lambda q: (None, None, *q),
            "both": lambda q: q}[axis](mx.quantize(x, axis))
    outs = _outs(R, K, axis, "cuda", 0x55, 0xAA)
    ln.run(x, *outs, R)
    torch.cuda.synchronize()
    for got, w in zip(outs, want):
        assert (got is None) == (w is None)
        if got is not None:
            assert torch.equal(_u8(got).cpu(), _u8(w).cpu()), ln.cfg


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("K", [100, 98, 97, 8, 1])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_columnwise_any_K(K, dtype):
    check_quantize(make_input(64, K, dtype, "cuda"), "columnwise")


@pytest.mark.parametrize("axis", list(AXES))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_misaligned_pointers_and_side_stream(axis):
    """A contiguous view at a 2-byte offset takes the vec = 1 kernel; a side stream is honoured."""
    R, K = 64, 256
    buf = make_input(R * K + 1, 1, BF, "cuda").view(-1)
    x = buf[1:].view(R, K)
    assert x.data_ptr() % 16
    check_quantize(x, axis)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        check_quantize(make_input(R, K, F32, "cuda"), axis)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_empty_and_compile_reuse():
    x = torch.empty(0, 64, dtype=BF, device="cuda")
    Q.quantize_into(x, *_outs(0, 64, "rowwise", "cuda", 0x55, 0xAA))   # no launch, no error
    C.COMPILE_KEYS.clear()
    with C.record_compile_keys() as keys:
        for R in (64, 96, 4128):
            check_quantize(make_input(R, 256, BF, "cuda"), "both")
    assert len(keys) == 1, keys


def _nan_aware_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    an, bn = torch.isnan(a), torch.isnan(b)
    return torch.equal(an, bn) and torch.equal(_bits(a[~an]), _bits(b[~bn]))


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


@pytest.mark.parametrize("out_dtype", [BF, F32])
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
@pytest.mark.parametrize("shape", [(32, 32), (96, 160), (33, 160), (4128, 7168), (64, 100)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dequantize_bit_exact(shape, axis, out_dtype):
    """Bitwise the reference, into an output pre-filled with NaN and again with a finite sentinel: the inputs' NaN
    blocks (if any) must be written NaN, which a NaN pre-fill alone cannot tell from unwritten (session 56)."""
    R, K = shape
    if (axis == "rowwise" and K % 32) or (axis == "columnwise" and R % 32):
        pytest.skip("blocks of 32 along the axis")
    x = make_input(R, K, F32, "cuda")
    data, scales = mx.quantize(x, axis)
    want = mx.dequantize(data, scales, axis, out_dtype)
    for fill in (math.nan, -1234.5):
        out = torch.full((R, K), fill, dtype=out_dtype, device="cuda")
        Q.dequantize_into(data, scales, out, axis)
        assert _nan_aware_equal(out.cpu(), want.cpu()), \
            (fill, (out.cpu() != want.cpu()).nonzero()[:5].tolist())
