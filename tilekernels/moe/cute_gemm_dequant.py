"""Dequantization of MXFP8 register fragments to bf16 for the CuTe DSL grouped GEMM
(cute_grouped_gemm.py): the PTX instruction sequences (module constants, so the CPU test
runs them through a small PTX interpreter against mxfp8.dequantize for every (byte, scale)
pair) and the per-thread dequant of one operand tile's chunks."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, Uint32, const_expr

BLOCK = 32          # MX block (elements per scale)
THREADS = 256       # 2 warpgroups per CTA


# The dequant instruction sequences (module constants: tests/moe/test_grouped_gemm_cute_dequant.py
# runs them through a small PTX interpreter against mxfp8.dequantize for every (byte, scale)).
#
# Scales: bf16 s = 2^(e-127) is the bf16 with exponent field e (same bias as E8M0): ``e << 7``;
# e = 0 (2^-127, a bf16 subnormal) is 0x0040 = max(e << 7, 0x40); e = 255 gives 0x7F80 = +Inf
# and t = s - s = NaN (finite s: t = +0), so fma(v, s, t) is NaN for the whole block.
PTX_SCALE_SCALAR = (
    "{ .reg .b32 q; shl.b32 q, {$r0}, 7; max.u32 q, q, 64; prmt.b32 {$w0}, q, 0, 0x1010;"
    " sub.rn.bf16x2 {$w1}, {$w0}, {$w0}; }")
# 4 scale bytes -> (s01, t01, s23, t23): the bf16x2 scales of bytes (0, 1) and (2, 3).
PTX_SCALE_WORD = (
    "{ .reg .b32 a, b, c; prmt.b32 a, {$r0}, 0, 0x4140; prmt.b32 b, {$r0}, 0, 0x4342;"
    " shl.b32 a, a, 7; shl.b32 b, b, 7; mov.b32 c, 0x00400040;"
    " max.u16x2 {$w0}, a, c; max.u16x2 {$w2}, b, c;"
    " sub.rn.bf16x2 {$w1}, {$w0}, {$w0}; sub.rn.bf16x2 {$w3}, {$w2}, {$w2}; }")
# 4 e4m3 bytes -> 2 bf16x2 words (bytes (0, 1) with (s0, t0), bytes (2, 3) with (s1, t1)).
# prmt with sign replication makes 16-bit lanes sext(b); << 4 and the mask leave
# sign | (b & 0x7f) << 4: the bf16 of e4m3(b) * 2^-120 (subnormals included); then * 2^120
# (exact) and one fma(v, s, t) (rounds only below bf16's normal range).
PTX_DQ_WORD = (
    "{ .reg .b32 a, b, c; prmt.b32 a, {$r0}, 0, 0x9180; prmt.b32 b, {$r0}, 0, 0xB3A2;"
    " shl.b32 a, a, 4; shl.b32 b, b, 4; and.b32 a, a, 0x87F087F0; and.b32 b, b, 0x87F087F0;"
    " mov.b32 c, 0x7B807B80; mul.rn.bf16x2 a, a, c; mul.rn.bf16x2 b, b, c;"
    " fma.rn.bf16x2 {$w0}, a, {$r1}, {$r2}; fma.rn.bf16x2 {$w1}, b, {$r3}, {$r4}; }")
# Fast path, for scales e <= 134 (2^7; the common case): 2^(e-127) * 2^120 = 2^(e-7) is a
# normal bf16 (exponent field e + 120, no special case for e = 0), so one multiply does both
# factors: 4 instructions per 2 elements instead of 5. Larger scales (and the NaN scale 255)
# take the general path above.
FAST_MAX_E = 134
PTX_SCALE_SCALAR_FAST = (
    "{ .reg .b32 q; add.u32 q, {$r0}, 120; shl.b32 q, q, 7; prmt.b32 {$w0}, q, 0, 0x1010; }")
# 4 scale bytes -> (s01', s23', lane-wise max of both): a lane >= 0x7F80 means some e >= 135.
PTX_SCALE_WORD_FAST = (
    "{ .reg .b32 a, b; prmt.b32 a, {$r0}, 0, 0x4140; prmt.b32 b, {$r0}, 0, 0x4342;"
    " add.u32 a, a, 0x00780078; add.u32 b, b, 0x00780078; shl.b32 {$w0}, a, 7; shl.b32 {$w1}, b, 7;"
    " max.u16x2 {$w2}, {$w0}, {$w1}; }")
PTX_DQ_WORD_FAST = (
    "{ .reg .b32 a, b; prmt.b32 a, {$r0}, 0, 0x9180; prmt.b32 b, {$r0}, 0, 0xB3A2;"
    " shl.b32 a, a, 4; shl.b32 b, b, 4; and.b32 a, a, 0x87F087F0; and.b32 b, b, 0x87F087F0;"
    " mul.rn.bf16x2 {$w0}, a, {$r1}; mul.rn.bf16x2 {$w1}, b, {$r2}; }")
PTX_MAX_U16X2 = "max.u16x2 {$w0}, {$r0}, {$r1};"
# cvt="hw": fp32 scale (s, s - s), then e4m3x2 -> f16x2 (hardware), f16 -> f32, fma, -> bf16x2.
PTX_SCALE_F32 = (
    "{ .reg .b32 q; shl.b32 q, {$r0}, 23; max.u32 q, q, 0x00400000; mov.b32 {$w0}, q;"
    " sub.rn.f32 {$w1}, {$w0}, {$w0}; }")
PTX_DQ_WORD_HW = (
    "{ .reg .b16 h0, h1, x0, x1, x2, x3; .reg .b32 p0, p1; .reg .f32 f0, f1, f2, f3;"
    " mov.b32 {h0, h1}, {$r0}; cvt.rn.f16x2.e4m3x2 p0, h0; cvt.rn.f16x2.e4m3x2 p1, h1;"
    " mov.b32 {x0, x1}, p0; mov.b32 {x2, x3}, p1;"
    " cvt.f32.f16 f0, x0; cvt.f32.f16 f1, x1; cvt.f32.f16 f2, x2; cvt.f32.f16 f3, x3;"
    " fma.rn.f32 f0, f0, {$r1}, {$r2}; fma.rn.f32 f1, f1, {$r3}, {$r4};"
    " fma.rn.f32 f2, f2, {$r5}, {$r6}; fma.rn.f32 f3, f3, {$r7}, {$r8};"
    " cvt.rn.bf16x2.f32 {$w0}, f1, f0; cvt.rn.bf16x2.f32 {$w1}, f3, f2; }")


@cute.jit
def _scale_scalar(e: Uint32):
    return cute.arch.inline_ptx(PTX_SCALE_SCALAR, write_only_types=[Uint32, Uint32], read_only_args=[e])


@cute.jit
def _scale_word(v: Uint32):
    return cute.arch.inline_ptx(PTX_SCALE_WORD, write_only_types=[Uint32] * 4, read_only_args=[v])


@cute.jit
def _dq_word(w: Uint32, s0: Uint32, t0: Uint32, s1: Uint32, t1: Uint32):
    return cute.arch.inline_ptx(PTX_DQ_WORD, write_only_types=[Uint32, Uint32],
                                read_only_args=[w, s0, t0, s1, t1])


@cute.jit
def _scale_scalar_fast(e: Uint32):
    return cute.arch.inline_ptx(PTX_SCALE_SCALAR_FAST, write_only_types=[Uint32], read_only_args=[e])


@cute.jit
def _scale_word_fast(v: Uint32):
    return cute.arch.inline_ptx(PTX_SCALE_WORD_FAST, write_only_types=[Uint32] * 3, read_only_args=[v])


@cute.jit
def _dq_word_fast(w: Uint32, s0: Uint32, s1: Uint32):
    return cute.arch.inline_ptx(PTX_DQ_WORD_FAST, write_only_types=[Uint32, Uint32],
                                read_only_args=[w, s0, s1])


@cute.jit
def _max_u16x2(a: Uint32, b: Uint32):
    return cute.arch.inline_ptx(PTX_MAX_U16X2, write_only_types=[Uint32], read_only_args=[a, b])


@cute.jit
def _scale_f32(e: Uint32):
    return cute.arch.inline_ptx(PTX_SCALE_F32, write_only_types=[Float32, Float32], read_only_args=[e])


@cute.jit
def _dq_word_hw(w: Uint32, s0: Float32, t0: Float32, s1: Float32, t1: Float32,
                s2: Float32, t2: Float32, s3: Float32, t3: Float32):
    return cute.arch.inline_ptx(PTX_DQ_WORD_HW, write_only_types=[Uint32, Uint32],
                                read_only_args=[w, s0, t0, s1, t1, s2, t2, s3, t3])


# ------------------------------------------------------------------ operand chunks


def rows_per_chunk(kmajor: bool, bmn: int, bk: int) -> int:
    return 1 if kmajor else bmn * bk // (THREADS * 16)


def chunks(kmajor: bool, bmn: int, bk: int) -> int:
    return bmn * bk // (THREADS * 16 * rows_per_chunk(kmajor, bmn, bk))


@cute.jit
def dequant_operand(cfg: cutlass.Constexpr, kmajor: cutlass.Constexpr, bmn: cutlass.Constexpr,
                     tXc: cute.Tensor, kt: Int32, kb_lim: Int32, rX: cute.Tensor, rXS: cute.Tensor,
                     rO: cute.Tensor):
    """Registers: e4m3 bytes + scale bytes -> bf16 (exact MXFP8 values; zero for k blocks
    outside the k range, whatever their bytes). Per chunk, the fast path (every scale
    <= 2^7, k block valid) or the general one (any scale, NaN, masking)."""
    BK = cfg.tile_k
    R = rows_per_chunk(kmajor, bmn, BK)
    nch = chunks(kmajor, bmn, BK)
    w = cute.recast_tensor(rX, Uint32)
    o = cute.recast_tensor(rO, Uint32)
    check_k = const_expr(cfg.variant == "wgrad" or cfg.kc % BK != 0)
    if const_expr(kmajor):
        # one branch per operand tile: the fast path if every chunk's scale <= 2^7 and k-valid
        fast = True
        for c in cutlass.range_constexpr(nch):
            crd = tXc[((0, 0), c, 0)]
            fast = fast and ((kt * BK + crd[1]) // BLOCK < kb_lim) and rXS[c] <= FAST_MAX_E
        if const_expr(cfg.cvt == "bits"):
            if fast:
                for c in cutlass.range_constexpr(nch):
                    sf = _scale_scalar_fast(rXS[c])
                    for q in cutlass.range_constexpr(4):
                        lo, hi = _dq_word_fast(w[c * 4 + q], sf, sf)
                        o[c * 8 + 2 * q] = lo
                        o[c * 8 + 2 * q + 1] = hi
            else:
                for c in cutlass.range_constexpr(nch):
                    crd = tXc[((0, 0), c, 0)]
                    kok = (kt * BK + crd[1]) // BLOCK < kb_lim
                    s, t = _scale_scalar(rXS[c])
                    if const_expr(check_k):
                        s = cutlass.select_(kok, s, Uint32(0))
                        t = cutlass.select_(kok, t, Uint32(0))
                    for q in cutlass.range_constexpr(4):
                        lo, hi = _dq_word(w[c * 4 + q], s, t, s, t)
                        o[c * 8 + 2 * q] = lo
                        o[c * 8 + 2 * q + 1] = hi
        else:
            for c in cutlass.range_constexpr(nch):
                crd = tXc[((0, 0), c, 0)]
                kok = (kt * BK + crd[1]) // BLOCK < kb_lim
                e = rXS[c]
                if const_expr(check_k):
                    e = cutlass.select_(kok, e, Uint32(127))
                sf, tf = _scale_f32(e)
                for q in cutlass.range_constexpr(4):
                    x = w[c * 4 + q]
                    if const_expr(check_k):
                        x = cutlass.select_(kok, x, Uint32(0))
                    lo, hi = _dq_word_hw(x, sf, tf, sf, tf, sf, tf, sf, tf)
                    o[c * 8 + 2 * q] = lo
                    o[c * 8 + 2 * q + 1] = hi
    else:
        crd = tXc[((0, 0), 0, 0)]
        kok = (kt * BK + crd[1]) // BLOCK < kb_lim
        sw = cute.recast_tensor(rXS, Uint32)
        if const_expr(cfg.cvt == "bits"):
            fs = []
            mx = None
            for q in cutlass.range_constexpr(4):
                s01, s23, m = _scale_word_fast(sw[q])
                fs.append((s01, s23))
                mx = m if q == 0 else _max_u16x2(mx, m)
            if kok and (mx & 0xFFFF) < 0x7F80 and (mx >> 16) < 0x7F80:
                for q in cutlass.range_constexpr(4):
                    for r in cutlass.range_constexpr(R):
                        lo, hi = _dq_word_fast(w[q + 4 * r], fs[q][0], fs[q][1])
                        o[2 * q + 8 * r] = lo
                        o[2 * q + 1 + 8 * r] = hi
            else:
                for q in cutlass.range_constexpr(4):
                    s0, t0, s1, t1 = _scale_word(sw[q])
                    if const_expr(check_k):
                        s0 = cutlass.select_(kok, s0, Uint32(0))
                        t0 = cutlass.select_(kok, t0, Uint32(0))
                        s1 = cutlass.select_(kok, s1, Uint32(0))
                        t1 = cutlass.select_(kok, t1, Uint32(0))
                    for r in cutlass.range_constexpr(R):
                        lo, hi = _dq_word(w[q + 4 * r], s0, t0, s1, t1)
                        o[2 * q + 8 * r] = lo
                        o[2 * q + 1 + 8 * r] = hi
        else:
            for q in cutlass.range_constexpr(4):
                sb = cute.recast_tensor(rXS, Uint8)
                sc = []
                for i in cutlass.range_constexpr(4):
                    e = Uint32(sb[4 * q + i])
                    if const_expr(check_k):
                        e = cutlass.select_(kok, e, Uint32(127))
                    sc.append(_scale_f32(e))
                for r in cutlass.range_constexpr(R):
                    x = w[q + 4 * r]
                    if const_expr(check_k):
                        x = cutlass.select_(kok, x, Uint32(0))
                    lo, hi = _dq_word_hw(x, sc[0][0], sc[0][1], sc[1][0], sc[1][1],
                                         sc[2][0], sc[2][1], sc[3][0], sc[3][1])
                    o[2 * q + 8 * r] = lo
                    o[2 * q + 1 + 8 * r] = hi
