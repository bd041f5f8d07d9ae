"""The dequant instruction sequences of the CuTe DSL MXFP8 grouped GEMM
(tilekernels/moe/cute_gemm_dequant.py), run through a small PTX interpreter (IEEE
round-to-nearest-even arithmetic in Python floats), equal mxfp8.dequantize (rounded to bf16)
for every (data byte, scale byte) pair: the general path, the fast path (scales <= 2^7) and
its guard, per-chunk and per-element scales, and the hardware-convert path. CPU only."""
from __future__ import annotations

import math
import struct

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels.moe import cute_gemm_dequant as gg  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402


# A tiny interpreter for exactly the PTX instructions the dequant sequences use, with
# IEEE round-to-nearest-even arithmetic in Python floats.


def _bf16_bits(v: float) -> int:
    """float -> bf16 bits, round to nearest even (subnormals, overflow to Inf, NaN)."""
    if math.isnan(v):
        return 0x7FC0
    sign = 0x8000 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if math.isinf(a):
        return sign | 0x7F80
    if a == 0:
        return sign
    m, e = math.frexp(a)                      # a = m * 2^e, m in [0.5, 1)
    q = 2.0 ** (e - 1 - 7) if a >= 2.0 ** -126 else 2.0 ** -133
    r = round(a / q) * q                      # round() on floats: ties to even
    if r >= 2.0 ** 128:
        return sign | 0x7F80
    return sign | (struct.unpack("<I", struct.pack("<f", r))[0] >> 16)


def _bf16_val(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (b & 0xFFFF) << 16))[0]


def _f32_val(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def _f32_bits(v: float) -> int:
    """float64 -> fp32 bits, round to nearest even (overflow to Inf)."""
    if math.isnan(v):
        return 0x7FC00000
    return int(torch.tensor([v], dtype=torch.float64).to(torch.float32).view(torch.int32)[0]) & 0xFFFFFFFF


def _f16_val(b: int) -> float:
    return struct.unpack("<e", struct.pack("<H", b & 0xFFFF))[0]


def _e4m3_val(b: int) -> float:
    return float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)[0])


def _lanes(x):
    return x & 0xFFFF, (x >> 16) & 0xFFFF


def _join(lo, hi):
    return (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)


def _bf16x2(fn, *xs):
    lo = _bf16_bits(fn(*[_bf16_val(_lanes(x)[0]) for x in xs]))
    hi = _bf16_bits(fn(*[_bf16_val(_lanes(x)[1]) for x in xs]))
    return _join(lo, hi)


def _prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _fma(a, b, c):
    return a * b + c   # exact in float64 here (products of <= 11-bit significands), one rounding after


def run_ptx(ptx: str, ins: list[int]) -> list[int]:
    """Interpret one of the module's PTX snippets: ``ins`` are the {$rN} bit patterns; returns
    the {$wN} bit patterns."""
    regs: dict[str, int] = {}
    outs: dict[int, int] = {}

    def val(tok):
        tok = tok.strip()
        if tok.startswith("{$r"):
            return ins[int(tok[3:-1])]
        if tok.startswith("{$w"):
            return outs[int(tok[3:-1])]
        if tok in regs:
            return regs[tok]
        return int(tok.rstrip("U"), 0)

    def put(tok, v):
        tok = tok.strip()
        if tok.startswith("{$w"):
            outs[int(tok[3:-1])] = v & 0xFFFFFFFF
        else:
            regs[tok] = v & 0xFFFFFFFF

    body = ptx.strip()
    if body.startswith("{ ") or body.startswith("{\n"):   # a scoped block, not an operand
        body = body[1:-1]
    for stmt in body.split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        # split operands at commas outside braces ("{a, b}" and "{$r0}" are one token each)
        toks, depth, cur = [], 0, ""
        for ch in rest:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                toks.append(cur)
                cur = ""
                continue
            cur += ch
        toks.append(cur)
        toks = [t.strip() for t in toks]
        d, srcs = toks[0], toks[1:]
        if op == "mov.b32" and d.startswith("{") and not d.startswith("{$"):
            names = [n.strip() for n in d[1:-1].split(",")]
            v = val(srcs[0])
            regs[names[0]], regs[names[1]] = v & 0xFFFF, (v >> 16) & 0xFFFF
            continue
        a = [val(s) for s in srcs]
        if op == "prmt.b32":
            r = _prmt(a[0], a[1], a[2])
        elif op == "shl.b32":
            r = a[0] << a[1]
        elif op == "and.b32":
            r = a[0] & a[1]
        elif op == "mov.b32":
            r = a[0]
        elif op == "add.u32":
            r = a[0] + a[1]
        elif op == "max.u32":
            r = max(a[0], a[1])
        elif op == "max.u16x2":
            r = _join(max(_lanes(a[0])[0], _lanes(a[1])[0]), max(_lanes(a[0])[1], _lanes(a[1])[1]))
        elif op == "mul.rn.bf16x2":
            r = _bf16x2(lambda x, y: x * y, *a)
        elif op == "fma.rn.bf16x2":
            r = _bf16x2(_fma, *a)
        elif op == "sub.rn.bf16x2":
            r = _bf16x2(lambda x, y: x - y, *a)
        elif op == "sub.rn.f32":
            r = _f32_bits(_f32_val(a[0]) - _f32_val(a[1]))
        elif op == "fma.rn.f32":
            r = _f32_bits(_fma(_f32_val(a[0]), _f32_val(a[1]), _f32_val(a[2])))
        elif op == "cvt.rn.f16x2.e4m3x2":
            lo, hi = _e4m3_val(a[0] & 0xFF), _e4m3_val((a[0] >> 8) & 0xFF)
            r = _join(*[struct.unpack("<H", struct.pack("<e", v))[0] for v in (lo, hi)])
        elif op == "cvt.f32.f16":
            r = _f32_bits(_f16_val(a[0]))
        elif op == "cvt.rn.bf16x2.f32":
            r = _join(_bf16_bits(_f32_val(a[1])), _bf16_bits(_f32_val(a[0])))
        else:
            raise NotImplementedError(op)
        put(d, r)
    return [outs[i] for i in sorted(outs)]


_TABLES: dict = {}


def _expected_table() -> list[list[float]]:
    """[byte][scale] -> mxfp8.dequantize of one element (fp32, exact) rounded to bf16."""
    if "exp" not in _TABLES:
        d = torch.arange(256, dtype=torch.uint8).repeat_interleave(32).view(torch.float8_e4m3fn)
        d = d.reshape(1, 256 * 32).expand(256, -1).contiguous()       # row = scale byte
        s = torch.arange(256, dtype=torch.uint8)[:, None].expand(256, 256).contiguous()
        v = mx.dequantize_rowwise(d, s, torch.float32)[:, ::32]      # [scale, byte]
        _TABLES["exp"] = v.to(torch.bfloat16).to(torch.float32).t().tolist()
    return _TABLES["exp"]


def _same(got: float, exp: float) -> bool:
    return (math.isnan(got) and math.isnan(exp)) or got == exp


def _is_nan_byte(b: int) -> bool:
    return (b & 0x7F) == 0x7F


def _check(got: float, b: int, e: int, what: str, bad: list) -> None:
    exp = _expected_table()[b][e]
    if _is_nan_byte(b) and e != 0xFF and what == "bits":
        # known, documented: NaN data with a finite scale reads as +-480 * scale
        exp = _bf16_val(_bf16_bits(math.copysign(480.0, -1.0 if b & 0x80 else 1.0) * 2.0 ** (e - 127)))
    if not _same(got, exp):
        bad.append((hex(b), e, got, exp))


def _word(bytes4) -> int:
    return sum(b << (8 * i) for i, b in enumerate(bytes4))


def _vals(lo: int, hi: int) -> list[float]:
    return [_bf16_val(x) for x in (*_lanes(lo), *_lanes(hi))]


def test_dequant_bits_scalar_scale():
    """k-major chunks: one scale per 16 elements (PTX_SCALE_SCALAR + PTX_DQ_WORD), every
    (data byte, scale byte) pair."""
    bad: list = []
    for e in range(256):
        s, t = run_ptx(gg.PTX_SCALE_SCALAR, [e])
        for j in range(64):
            bs = [4 * j + i for i in range(4)]
            for b, v in zip(bs, _vals(*run_ptx(gg.PTX_DQ_WORD, [_word(bs), s, t, s, t]))):
                _check(v, b, e, "bits", bad)
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:8]}"


def test_dequant_bits_per_element_scales():
    """mn-major chunks: one scale per element (PTX_SCALE_WORD + PTX_DQ_WORD), every pair on
    every lane."""
    bad: list = []
    for e in range(256):
        es = [(e + i) & 0xFF for i in range(4)]
        s01, t01, s23, t23 = run_ptx(gg.PTX_SCALE_WORD, [_word(es)])
        for j in range(64):
            bs = [(4 * j + 5 * i) & 0xFF for i in range(4)]
            got = _vals(*run_ptx(gg.PTX_DQ_WORD, [_word(bs), s01, t01, s23, t23]))
            for b, ei, v in zip(bs, es, got):
                _check(v, b, ei, "bits", bad)
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:8]}"


def test_dequant_hw_path():
    """cvt="hw": exact, NaN data bytes included."""
    bad: list = []
    for e in range(256):
        s, t = run_ptx(gg.PTX_SCALE_F32, [e])
        for j in range(64):
            bs = [4 * j + i for i in range(4)]
            got = _vals(*run_ptx(gg.PTX_DQ_WORD_HW, [_word(bs), s, t, s, t, s, t, s, t]))
            for b, v in zip(bs, got):
                _check(v, b, e, "hw", bad)
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:8]}"


def test_dequant_fast_path_scalar_scale():
    """Fast path (scale <= 2^7): one multiply by 2^(e-7); equal to the general path's exact
    values for every byte and every scale byte it takes (e <= FAST_MAX_E)."""
    bad: list = []
    for e in range(gg.FAST_MAX_E + 1):
        (sf,) = run_ptx(gg.PTX_SCALE_SCALAR_FAST, [e])
        for j in range(64):
            bs = [4 * j + i for i in range(4)]
            for b, v in zip(bs, _vals(*run_ptx(gg.PTX_DQ_WORD_FAST, [_word(bs), sf, sf]))):
                _check(v, b, e, "bits", bad)
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:8]}"


def test_dequant_fast_path_per_element_scales_and_guard():
    """Fast per-element scales, and the guard the kernel uses to pick the fast path: the
    lane-wise max of the scale words is < 0x7F80 exactly when every scale byte <= FAST_MAX_E."""
    bad: list = []
    for e in range(256):
        es = [(e + 3 * i) & 0xFF for i in range(4)]
        s01, s23, m = run_ptx(gg.PTX_SCALE_WORD_FAST, [_word(es)])
        guard_ok = (m & 0xFFFF) < 0x7F80 and (m >> 16) < 0x7F80
        assert guard_ok == all(x <= gg.FAST_MAX_E for x in es), (es, hex(m))
        if not guard_ok:
            continue
        for j in range(64):
            bs = [(4 * j + 5 * i) & 0xFF for i in range(4)]
            got = _vals(*run_ptx(gg.PTX_DQ_WORD_FAST, [_word(bs), s01, s23]))
            for b, ei, v in zip(bs, es, got):
                _check(v, b, ei, "bits", bad)
    # max.u16x2 accumulation across words keeps a flagged lane flagged
    (mm,) = run_ptx(gg.PTX_MAX_U16X2, [0x00007F80, 0x12340000])
    assert (mm & 0xFFFF) == 0x7F80 and (mm >> 16) == 0x1234
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:8]}"
