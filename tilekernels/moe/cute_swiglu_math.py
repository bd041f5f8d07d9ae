"""Exact fp32 and MXFP8 device arithmetic for the CuTe DSL SwiGLU kernels (cute_swiglu.py).

Straight-line trace-time helpers (no dynamic control flow), inlined into the kernels:
torch's fp32 sigmoid as nvcc compiles it (so the SwiGLU matches torch bit for bit),
round-to-nearest fp32 products that are never contracted into an FMA, the E8M0 scale from
an amax's bits, the RNE saturating e4m3 pack, warp butterflies and 64-bit-offset row views.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass._mlir.extras import types as T
from cutlass.cutlass_dsl import dsl_user_op

from tilekernels._cute import bits_f32 as _bits_f32  # noqa: F401 (cute_quantize_pipe imports it from here)
from tilekernels._cute import f32_bits as _f32_bits
# Straight-line trace-time helpers (no dynamic control flow), inlined into the kernels.

# torch's CUDA sigmoid for fp32, ``1.f / (1.f + expf(-x))``, as nvcc 13 compiles it (libdevice
# expf inlined; the final ``ex2 * 2^j`` is contracted with ``+ 1`` into one fma; 1/x is the
# correctly rounded reciprocal). The negation of x is folded into the constants (exact).
_SIGMOID_PTX = """{
.reg .f32 t, j, f, e, s;
.reg .b32 sc;
fma.rn.f32 t, $1, 0fBBBB989D, 0f3F000000;
cvt.sat.f32.f32 t, t;
fma.rm.f32 j, t, 0f437C0000, 0f4B400001;
add.f32 f, j, 0fCB40007F;
neg.f32 f, f;
fma.rn.f32 f, $1, 0fBFB8AA3B, f;
fma.rn.f32 f, $1, 0fB2A57060, f;
mov.b32 sc, j;
shl.b32 sc, sc, 23;
mov.b32 s, sc;
ex2.approx.ftz.f32 e, f;
fma.rn.f32 e, e, s, 0f3F800000;
rcp.rn.f32 $0, e;
}"""


@dsl_user_op
def _asm_f32(asm: str, *args, loc=None, ip=None) -> Float32:
    """One fp32 result of inline PTX over fp32 operands ($0 = result, $1.. = operands)."""
    vals = [Float32(a).ir_value(loc=loc, ip=ip) for a in args]
    cons = "=f" + "".join(",f" for _ in args)
    return Float32(llvm.inline_asm(T.f32(), vals, asm, cons, loc=loc, ip=ip))


@dsl_user_op
def e4m3x4(x0, x1, x2, x3, *, loc=None, ip=None) -> Uint32:
    """Four fp32 -> four e4m3 bytes (round to nearest even, saturating), x0 in the low byte."""
    vals = [Float32(a).ir_value(loc=loc, ip=ip) for a in (x0, x1, x2, x3)]
    asm = ("{\n.reg .b16 lo, hi;\n"
           "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
           "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
           "mov.b32 $0, {lo, hi};\n}")
    return Uint32(llvm.inline_asm(T.i32(), vals, asm, "=r,f,f,f,f", loc=loc, ip=ip))


def fmul(a, b) -> Float32:
    """a * b, fp32, round to nearest, never contracted."""
    return _asm_f32("mul.rn.f32 $0, $1, $2;", a, b)


def sigmoid(x) -> Float32:
    """torch.sigmoid(x) for fp32 x, bit for bit (see _SIGMOID_PTX)."""
    return _asm_f32(_SIGMOID_PTX, x)


def swiglu_fwd_elem(g, lin, p) -> Float32:
    """a = ((g * sigmoid(g)) * lin) * p: reference.swiglu_fwd's fp32 operations in its order."""
    return fmul(fmul(fmul(g, sigmoid(g)), lin), p)


def swiglu_bwd_elem(d, g, lin, p):
    """(dg, dl, dprobs term, a) of reference.swiglu_bwd / swiglu_fwd for one element, fp32.

    dg = ((dp * lin) * sig) * (1 + g * (1 - sig)); dl = dp * silu; term = (d * silu) * lin;
    a = (silu * lin) * p, with dp = d * p and silu = g * sig."""
    sig = sigmoid(g)
    silu = fmul(g, sig)
    dp = fmul(d, p)
    one_m = _asm_f32("sub.rn.f32 $0, 0f3F800000, $1;", sig)
    t = _asm_f32("add.rn.f32 $0, 0f3F800000, $1;", fmul(g, one_m))
    dg = fmul(fmul(fmul(dp, lin), sig), t)
    dl = fmul(dp, silu)
    term = fmul(fmul(d, silu), lin)
    a = fmul(fmul(silu, lin), p)
    return dg, dl, term, a


def absbits(x) -> Int32:
    """|x| as its fp32 bit pattern: ordered like the magnitude, NaN above Inf above finite."""
    return _f32_bits(x) & 0x7FFFFFFF


def e8m0_from_absbits(m) -> Int32:
    """E8M0 byte of mxfp8.e8m0_from_amax for amax given by its bit pattern ``m``.

    amax = 1.f * 2^(b-127) has frexp exponent E = b - 126 and mantissa 1.f / 2, which is <= 0.875
    iff f <= 0x600000, so k = E - 9 (or E - 8) = b - 135 (+1) and e = k + 127 = b - 8 (+1); the
    lower clamp covers zero and subnormal amax (b = 0), the upper one cannot bind for fp32
    (b <= 254 gives e <= 247); b = 255 (Inf/NaN) gives 0xFF."""
    b = m >> 23
    e = b - 8 + cutlass.select_((m & 0x7FFFFF) > 0x600000, Int32(1), Int32(0))
    e = cutlass.max(e, Int32(0))
    return cutlass.select_(b == 255, Int32(255), e)


def inv_scale(e) -> Float32:
    """2^(127 - e) exactly (a normal fp32 for e in [0, 247]); garbage for e = 0xFF (masked)."""
    return _bits_f32((Int32(254) - e) << 23)


def quant_word(x0, x1, x2, x3, inv) -> Uint32:
    """Four values of one block (scale 1/inv) -> four e4m3 bytes."""
    return e4m3x4(fmul(x0, inv), fmul(x1, inv), fmul(x2, inv), fmul(x3, inv))


def _bfly_max(v, offsets):
    for o in offsets:
        v = cutlass.max(v, cute.arch.shuffle_sync_bfly(v, offset=o))
    return v


def _bfly_sum(v, offsets):
    for o in offsets:
        v = v + cute.arch.shuffle_sync_bfly(v, offset=o)
    return v


def _halvings(n: int) -> tuple:
    """(n/2, n/4, ..., 1): butterfly offsets reducing over n consecutive lanes."""
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return tuple(out)


def _rows(ptr, row0, ncols: int, nrows: int, divby: int):
    """Row-major [nrows, ncols] view starting at row ``row0`` (64-bit offset; ``divby`` is the
    element divisibility of the offset, which keeps the pointer's alignment known)."""
    off = cute.assume(Int64(row0) * ncols, divby=divby)
    return cute.make_tensor(ptr + off, cute.make_layout((nrows, ncols), stride=(ncols, 1)))
