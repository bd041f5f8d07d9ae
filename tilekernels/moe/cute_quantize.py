"""CuTe DSL kernels for MXFP8 quantize / dequantize (Hopper sm_90a; compiles for sm_100a too).

Bit-exact to :mod:`tilekernels.moe.mxfp8` (the torch reference), for x bf16 or fp32
(float64 stays on torch):

* scale exponent from the amax's fp32 bits, no log2: with ``amax`` bits
  ``(E, m)`` (biased exponent field, 23-bit mantissa), ``ceil(log2(amax/448))``
  is ``E - 135 + (m > 0x600000)`` (448 = 1.75 * 2^8); biased and clamped to the
  E8M0 range that is ``e = max(E - 8 + (m > 0x600000), 0)`` -- the clamp at 2^127
  never binds for fp32 (e <= 247), fp32 subnormal and zero amax give e = 0;
* amax is an integer max of ``bits & 0x7FFFFFFF`` (ordered like |x| for every
  value, NaN above Inf), so ``amax >= 0x7F800000`` flags a block holding NaN or
  +-Inf: scale byte 0xFF and every data byte 0x7F;
* data = ``cvt.rn.satfinite.e4m3x2.f32`` of ``x * 2^(127-e)`` in fp32 (the
  reference's product, IEEE round-to-nearest, no flush-to-zero; the power of two
  is built from bits), round-to-nearest-even into e4m3 with its subnormals.

Layouts (all row-major, contiguous): x [R, K]; rowwise data [R, K] with scales
[R, K/32] (blocks of 32 along K, needs K % 32 == 0, any R), columnwise data [R, K]
with scales [R/32, K] (blocks of 32 along R, needs R % 32 == 0, any K). fp8
outputs may be float8_e4m3fn or uint8 tensors: only their addresses are passed.
One call writes one axis or both from a single read of x.

Three quantize kernels. The rowwise output at K % 32 == 0 with 16-byte aligned pointers (the
normal case, rowwise only or both axes) goes to the per-warp cp.async pipeline of
:mod:`tilekernels.moe.cute_quantize_pipe` (:class:`PipeCfg`) where ``_PIPE`` says it was
measured faster; the rest (columnwise only, other K, unaligned views) to one launch config
(:class:`QuantCfg`) choosing:

* shared memory (``smem``; K a multiple of 16 bytes of x and 16-byte aligned
  pointers, the normal case; rowwise only skips the staging, ``direct``, and loads each
  lane's chunks straight into registers): a CTA of ``threads`` stages a 32 x (threads * vec)
  tile of x with coalesced 16-byte loads into shared memory (rows padded by 16
  bytes: conflict-free). Rowwise: a warp takes one tile row at a time, each lane 8
  consecutive elements (4 lanes per block, amax joined by 2 butterfly shuffles), so a
  warp instruction stores threads * vec / 8 * 8 contiguous e4m3 bytes of one row.
  (The first version gave each thread a whole 32-element block, consecutive lanes on
  consecutive rows: every 16-byte store and every scale byte of a warp instruction
  went to a different row, 32 sectors per instruction; rowwise ran at 42% of copy.)
  Columnwise: each thread takes ``vec`` whole columns down the 32 rows. 48-80 registers.
* registers (fallback: other K, unaligned pointers): each thread keeps ``vec``
  columns of all 32 rows in registers; rowwise amax by butterfly shuffles across
  the 32 / vec lanes of a block, columnwise per thread.

Tails: rows past R (rowwise) and column chunks past K are masked. R == 0 or
K == 0 launches nothing. Offsets are 64-bit at the CTA level (R * K may exceed
2^31). The dequantize kernel (any axis, into bf16 or fp32) reads 8 data bytes
per thread and row and writes 16 / 32 bytes.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16

from tilekernels import _cute as C
from tilekernels._glue import sm_count

from .cute_quantize_pipe import PipeCfg, _pipe_host, pipe_sig

BLOCK = 32
_NAME = "moe.cute_quantize"


def _elt(dtype: torch.dtype) -> int:
    return 4 if dtype == torch.float32 else 2


@dataclasses.dataclass(frozen=True)
class QuantCfg:
    """Launch config of the quantize kernel (the compile key with the arg dtypes).

    K: columns (static); row / col: which outputs; smem: the shared-memory kernel
    (tile 32 x threads * vec; vec = columns per thread in the columnwise pass) or the
    register kernel (vec = columns per thread, halved until it divides K, 1 for
    unaligned pointers); threads: CTA size; direct (rowwise only, smem kernel's thread
    mapping): each lane loads its 8-element chunks straight from global memory into registers
    (no staging, no barrier; nothing else needs the tile)."""

    K: int
    row: bool
    col: bool
    vec: int
    threads: int
    smem: bool = False
    direct: bool = False

    def __post_init__(self):
        if self.direct and (self.col or not self.smem):
            raise ValueError(f"QuantCfg: direct loads are for the rowwise-only smem mapping: {self}")

    @classmethod
    def heuristic(cls, K: int, dtype: torch.dtype, row: bool, col: bool, aligned: bool = True) -> "QuantCfg":
        if aligned and K % (16 // _elt(dtype)) == 0:
            # shared-memory kernel: 128 threads, tile 32 x 256, 2 columns per thread; rowwise
            # only: the same thread mapping without the staging (direct loads)
            return cls(K=K, row=row, col=col, vec=2, threads=128, smem=True, direct=row and not col)
        # register kernel (K not a multiple of 16 bytes, or unaligned pointers): the
        # 32 x vec tile lives in registers (ptxas gives each element about one register),
        # so fewer columns when it must stay there for the columnwise pass; 16-byte loads
        # for rowwise only (cubin registers at K=7168, sm_90a: bf16 172 / 128 / 133, fp32
        # 165 / 80 / 141 for rowwise / columnwise / both)
        vec = {(True, False): 16, (False, True): 8, (True, True): 4}[(row, col)] // _elt(dtype)
        vec = max(vec, 2) if aligned else 1
        while K % vec:
            vec //= 2
        # enough threads to cover K once (at least a warp), at most 128
        threads = max(32, min(128, 1 << max(0, (C.cdiv(K, vec) - 1).bit_length())))
        return cls(K=K, row=row, col=col, vec=vec, threads=threads)


@dataclasses.dataclass(frozen=True)
class DequantCfg:
    """Launch config of the dequantize kernel: K static, rowwise or columnwise scales,
    vec data bytes per thread and row, threads per CTA (a CTA covers 32 rows)."""

    K: int
    rowwise: bool
    vec: int
    threads: int

    @classmethod
    def heuristic(cls, K: int, rowwise: bool, aligned: bool = True) -> "DequantCfg":
        vec = 8 if aligned else 1
        while K % vec:
            vec //= 2
        threads = max(32, min(128, 1 << max(0, (C.cdiv(K, vec) - 1).bit_length())))
        return cls(K=K, rowwise=rowwise, vec=vec, threads=threads)


# ------------------------------------------------------------------ device helpers

@cute.jit
def _e8m0(am: Int32) -> Int32:
    """Biased E8M0 exponent from the amax's fp32 bits (sign cleared); 255 if NaN/Inf."""
    up = Int32(cutlass.select_((am & 0x7FFFFF) > 0x600000, 1, 0))
    e = cutlass.max((am >> 23) - 8 + up, 0)
    return Int32(cutlass.select_(am >= 0x7F800000, 255, e))


@cute.jit
def _inv_scale(e: Int32) -> Float32:
    """2^(127 - e) as fp32 (always normal for e <= 253; garbage for 255, never used)."""
    return ((254 - e) << 23).bitcast(Float32)


@cute.jit
def _e4m3x2(a: Float32, b: Float32) -> Uint16:
    """Two fp32 -> two e4m3 bytes (a in the low byte), RNE, saturating."""
    return cute.arch.inline_ptx("cvt.rn.satfinite.e4m3x2.f32 {$w0}, {$r1}, {$r0};",
                                write_only_types=[Uint16], read_only_args=[a, b])


@cute.jit
def _from_e4m3x2(v: Uint16):
    """Two e4m3 bytes (low byte first) -> two fp32 (exact, through f16x2)."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 h; .reg .b16 lo, hi; cvt.rn.f16x2.e4m3x2 h, {$r0}; mov.b32 {lo, hi}, h; "
        "cvt.f32.f16 {$w0}, lo; cvt.f32.f16 {$w1}, hi; }",
        write_only_types=[Float32, Float32], read_only_args=[v])


@cute.jit
def _store_bytes(ob: cute.Tensor, dst: cute.Tensor, V: cutlass.Constexpr):
    """Store the first V bytes of the Uint16 register tensor ``ob`` to ``dst`` [V] (vectorized)."""
    if cutlass.const_expr(V == 1):
        dst[0] = Uint8(ob[0] & 0xFF)
    else:
        cute.autovec_copy(cute.recast_tensor(ob, Uint8), dst)


@cute.jit
def _rows(m: cute.Tensor, row0, V: cutlass.Constexpr, cidx):
    """[32, V] window of the row-major [R, K] tensor ``m`` at rows row0.., columns cidx*V..
    (64-bit row offset: R * K may exceed 2^31)."""
    return cute.local_tile(cute.domain_offset((Int64(row0), 0), m), (BLOCK, V), (0, cidx))


# ------------------------------------------------------------------ quantize kernel

@cute.jit
def _abs_bits_max(xrow: cute.Tensor, V: cutlass.Constexpr) -> Int32:
    """max_c |xrow[c]| as fp32 bits (an integer max: ordered like the values, NaN above Inf),
    computed on the native bits so no fp32 copy of the tile stays live."""
    am = Int32(0)
    if cutlass.const_expr(xrow.element_type.width == 16):
        bits = xrow.load().bitcast(Uint16)
        for c in cutlass.range_constexpr(V):
            am = cutlass.max(am, Int32(bits[c]) & 0x7FFF)
        am = am << 16
    else:
        bits = xrow.load().bitcast(Int32)
        for c in cutlass.range_constexpr(V):
            am = cutlass.max(am, bits[c] & 0x7FFFFFFF)
    return am


@cute.jit
def _col_amax(am: cute.Tensor, xrow: cute.Tensor, V: cutlass.Constexpr):
    """am[c] = max(am[c], |xrow[c]| as fp32 bits), c < V: one row of the columnwise amax
    (integer max on the native bits, ordered like |x|, NaN above Inf)."""
    if cutlass.const_expr(xrow.element_type.width == 16):
        bits = xrow.load().bitcast(Uint16)
        for c in cutlass.range_constexpr(V):
            am[c] = cutlass.max(am[c], (Int32(bits[c]) & 0x7FFF) << 16)
    else:
        bits = xrow.load().bitcast(Int32)
        for c in cutlass.range_constexpr(V):
            am[c] = cutlass.max(am[c], bits[c] & 0x7FFFFFFF)


@cute.jit
def _col_scales(am: cute.Tensor, es: cute.Tensor, cinv: cute.Tensor, cmask: cute.Tensor,
                V: cutlass.Constexpr, NP: cutlass.Constexpr):
    """From the V columns' amax: their E8M0 bytes es, the inverse scales cinv, and cmask
    (per byte pair, 0xFF where the column's block holds NaN/Inf: its data bytes become 0x7F)."""
    for c in cutlass.range_constexpr(NP):
        cmask[c] = Int32(0)
    for c in cutlass.range_constexpr(V):
        ec = _e8m0(am[c])
        es[c] = Uint8(ec)
        cinv[c] = _inv_scale(ec)
        cmask[c // 2] = cmask[c // 2] | Int32(cutlass.select_(ec == 255, 0xFF << (8 * (c % 2)), 0))


@cute.jit
def _load_block(src: cute.Tensor, xr: cute.Tensor, ok, row0, R, ROWS: cutlass.Constexpr, V: cutlass.Constexpr):
    """xr [ROWS, V] = the window ``src``'s rows (row0 + r < R and ``ok``; zeros otherwise), in its
    own dtype, every load issued before any use (all in flight together)."""
    for r in cutlass.range_constexpr(ROWS):
        if ok and row0 + r < R:
            cute.autovec_copy(src[r, None], xr[r, None])
        else:
            for c in cutlass.range_constexpr(V):
                xr[r, c] = xr.element_type(0)


@cute.jit
def _col_block_scales(xr: cute.Tensor, es: cute.Tensor, cinv: cute.Tensor, cmask: cute.Tensor,
                      ROWS: cutlass.Constexpr, V: cutlass.Constexpr, NP: cutlass.Constexpr):
    """The columnwise E8M0 bytes, inverse scales and NaN masks (:func:`_col_scales`) of the V
    columns of a whole block xr [ROWS = 32, V] in registers (amax down every column first)."""
    am = cute.make_rmem_tensor((V,), Int32)
    for c in cutlass.range_constexpr(V):
        am[c] = Int32(0)
    for r in cutlass.range_constexpr(ROWS):
        _col_amax(am, xr[r, None], V)
    _col_scales(am, es, cinv, cmask, V, NP)


@cute.jit
def _pack(vc, inv: cute.Tensor, ob: cute.Tensor, V: cutlass.Constexpr):
    """ob (Uint16 pairs) = e4m3 bytes of vc[c] * inv[c], c < V."""
    if cutlass.const_expr(V == 1):
        ob[0] = _e4m3x2(vc[0] * inv[0], Float32(0.0))
    else:
        for c in cutlass.range_constexpr(V // 2):
            ob[c] = _e4m3x2(vc[2 * c] * inv[2 * c], vc[2 * c + 1] * inv[2 * c + 1])


@cute.kernel
def _quant_kernel(cfg: cutlass.Constexpr, mX: cute.Tensor, mRD: cute.Tensor, mRS: cute.Tensor,
                  mCD: cute.Tensor, mCS: cute.Tensor, R: Int32):
    V = cfg.vec
    NP = cutlass.max(V // 2, 1)             # e4m3 byte pairs per thread and row
    tidx, _, _ = cute.arch.thread_idx()
    by, bx, _ = cute.arch.block_idx()      # x: row tile (grid.y caps at 65535), y: column tile
    cidx = bx * cfg.threads + tidx          # which vec-column chunk
    col0 = cidx * V
    row0 = by * BLOCK
    col_ok = col0 < cfg.K

    # phase 1: the x tile [32, V] into registers in its own dtype (zeros outside), and the
    # columnwise amax of each of the thread's V columns
    tX = _rows(mX, row0, V, cidx)
    xr = cute.make_rmem_tensor(cute.make_layout((BLOCK, V), stride=(V, 1)), mX.element_type)
    _load_block(tX, xr, col_ok, row0, R, BLOCK, V)
    cinv = cute.make_rmem_tensor((V,), Float32)
    cmask = cute.make_rmem_tensor(cute.make_layout((NP,), stride=(1,)), Int32)  # 0xFF: NaN column byte
    if cutlass.const_expr(cfg.col):
        # R % 32 == 0 here (spec): every row of the tile exists
        es = cute.make_rmem_tensor((V,), Uint8)
        _col_block_scales(xr, es, cinv, cmask, BLOCK, V, NP)
        if col_ok:
            tCS = cute.local_tile(cute.domain_offset((Int64(by), 0), mCS), (1, V), (0, cidx))
            cute.autovec_copy(es, tCS[0, None])

    # phase 2, row by row: rowwise amax (shuffles across the 32 / V lanes of a block), one
    # fp32 conversion of the row, its rowwise and columnwise e4m3 bytes, the stores
    lanes = BLOCK // V
    tRD = _rows(mRD, row0, V, cidx)
    tCD = _rows(mCD, row0, V, cidx)
    gRS = cute.domain_offset((Int64(row0), 0), mRS)
    rinv = cute.make_rmem_tensor((V,), Float32)
    ob = cute.make_rmem_tensor(cute.make_layout((NP,), stride=(1,)), Uint16)
    for r in cutlass.range_constexpr(BLOCK):
        vc = xr[r, None].load().to(Float32)
        if cutlass.const_expr(cfg.row):
            am_r = _abs_bits_max(xr[r, None], V)
            off = 1
            while off < lanes:              # unrolled at trace time
                am_r = cutlass.max(am_r, cute.arch.shuffle_sync_bfly(am_r, offset=off))
                off *= 2
            e = _e8m0(am_r)
            s = _inv_scale(e)
            for c in cutlass.range_constexpr(V):
                rinv[c] = s
            _pack(vc, rinv, ob, V)
            if e == 255:
                for c in cutlass.range_constexpr(NP):
                    ob[c] = Uint16(0x7F7F)
            if col_ok and row0 + r < R:
                _store_bytes(ob, tRD[r, None], V)
                if tidx % lanes == 0:
                    gRS[r, col0 // BLOCK] = Uint8(e)
        if cutlass.const_expr(cfg.col):
            _pack(vc, cinv, ob, V)
            for c in cutlass.range_constexpr(NP):
                ob[c] = Uint16((Int32(ob[c]) & ~cmask[c]) | (cmask[c] & 0x7F7F))
            if col_ok:
                _store_bytes(ob, tCD[r, None], V)


@cute.kernel
def _quant_smem_kernel(cfg: cutlass.Constexpr, mX: cute.Tensor, mRD: cute.Tensor, mRS: cute.Tensor,
                       mCD: cute.Tensor, mCS: cute.Tensor, R: Int32):
    """Shared-memory variant: the CTA stages a 32 x BK tile of x (16-byte loads, rows
    padded by 16 bytes), then each thread quantizes whole rowwise blocks (32 contiguous
    elements read from one row) and whole columnwise blocks (cpt columns down the 32 rows).
    No shuffles, one scale per 32 elements per thread. Needs K % (16 / elt) == 0."""
    dt = mX.element_type
    NT = cfg.threads
    BK = cfg.threads * cfg.vec              # tile columns; vec = columns per thread (col phase)
    VL = 16 // (dt.width // 8)              # elements per 16-byte chunk
    CPR = BK // VL                          # chunks per tile row
    NL = BLOCK * CPR // NT                  # chunk loads per thread
    CPT = cfg.vec
    tidx, _, _ = cute.arch.thread_idx()
    by, bx, _ = cute.arch.block_idx()
    row0 = by * BLOCK
    colb = bx * BK
    sX = None
    if cutlass.const_expr(not cfg.direct):
        smem = cutlass.memory.SmemAllocator()
        sX = smem.allocate_tensor(dt, cute.make_layout((BLOCK, BK), stride=(BK + VL, 1)), 16)
    gX = cute.domain_offset((Int64(row0), 0), mX)   # (column offsets as tile indices keep alignment)

    # stage: every load first (registers), then the shared-memory stores
    buf = cute.make_rmem_tensor(cute.make_layout((NL, VL), stride=(VL, 1)), dt)
    for i in cutlass.range_constexpr(0 if cfg.direct else NL):
        l = i * NT + tidx
        r = l // CPR
        ch = l % CPR
        if row0 + r < R and colb + ch * VL < cfg.K:
            cute.autovec_copy(cute.local_tile(gX, (1, VL), (r, bx * CPR + ch))[0, None], buf[i, None])
        else:
            for c in cutlass.range_constexpr(VL):
                buf[i, c] = dt(0)
    for i in cutlass.range_constexpr(0 if cfg.direct else NL):
        l = i * NT + tidx
        cute.autovec_copy(buf[i, None], cute.local_tile(sX, (1, VL), (l // CPR, l % CPR))[0, None])
    if cutlass.const_expr(not cfg.direct):
        cute.arch.sync_threads()

    if cutlass.const_expr(cfg.row):
        # unit u = i * NT + tidx: tile row u // LPR, 8-element chunk u % LPR. Consecutive lanes
        # take consecutive chunks of one row, so a warp instruction reads a contiguous smem row
        # (conflict-free) and stores LPR * 8 contiguous e4m3 bytes (coalesced); the 4 lanes of a
        # 32-element block join their amax by 2 butterfly shuffles (aligned groups of 4 lanes,
        # every lane takes part: rows past R are zeros and only their stores are masked)
        EPL = 8                             # elements per lane and unit
        LPR = BK // EPL                     # lanes per tile row (a multiple of 4)
        gRD = cute.domain_offset((Int64(row0), 0), mRD)
        gRS = cute.domain_offset((Int64(row0), 0), mRS)
        jb = bx * (BK // BLOCK)
        NU = BLOCK * LPR // NT              # units per thread
        xb = cute.make_rmem_tensor(cute.make_layout((EPL,), stride=(1,)), dt)
        ob = cute.make_rmem_tensor(cute.make_layout((EPL // 2,), stride=(1,)), Uint16)
        if cutlass.const_expr(cfg.direct):
            # every unit's chunk from global memory first (zeros past R / K), then the math
            xr = cute.make_rmem_tensor(cute.make_layout((NU, EPL), stride=(EPL, 1)), dt)
            for i in cutlass.range_constexpr(NU):
                u = i * NT + tidx
                if row0 + u // LPR < R and colb + (u % LPR) * EPL < cfg.K:
                    cute.autovec_copy(cute.local_tile(gX, (1, EPL), (u // LPR, bx * LPR + u % LPR))[0, None],
                                      xr[i, None])
                else:
                    for c in cutlass.range_constexpr(EPL):
                        xr[i, c] = dt(0)
        for i in cutlass.range_constexpr(NU):
            u = i * NT + tidx
            r = u // LPR
            ch = u % LPR
            if cutlass.const_expr(cfg.direct):
                cute.autovec_copy(xr[i, None], xb)
            else:
                cute.autovec_copy(cute.local_tile(sX, (1, EPL), (r, ch))[0, None], xb)
            am = _abs_bits_max(xb, EPL)
            am = cutlass.max(am, cute.arch.shuffle_sync_bfly(am, offset=1))
            am = cutlass.max(am, cute.arch.shuffle_sync_bfly(am, offset=2))
            e = _e8m0(am)
            inv = _inv_scale(e)
            vr = xb.load().to(Float32)
            for c in cutlass.range_constexpr(EPL // 2):
                ob[c] = _e4m3x2(vr[2 * c] * inv, vr[2 * c + 1] * inv)
            if e == 255:
                for c in cutlass.range_constexpr(EPL // 2):
                    ob[c] = Uint16(0x7F7F)
            if row0 + r < R and colb + ch * EPL < cfg.K:
                cute.autovec_copy(cute.recast_tensor(ob, Uint8),
                                  cute.local_tile(gRD, (1, EPL), (r, bx * LPR + ch))[0, None])
                if ch % 4 == 0:
                    gRS[r, jb + ch // 4] = Uint8(e)

    if cutlass.const_expr(cfg.col):
        # thread tidx owns tile columns [tidx * cpt, +cpt) down all 32 rows (R % 32 == 0)
        c0 = tidx * CPT
        col_ok = colb + c0 < cfg.K
        am = cute.make_rmem_tensor(cute.make_layout((CPT,), stride=(1,)), Int32)
        for c in cutlass.range_constexpr(CPT):
            am[c] = Int32(0)
        for r in cutlass.range_constexpr(BLOCK):
            _col_amax(am, cute.local_tile(sX, (1, CPT), (r, tidx))[0, None], CPT)
        es = cute.make_rmem_tensor(cute.make_layout((CPT,), stride=(1,)), Uint8)
        cinv = cute.make_rmem_tensor(cute.make_layout((CPT,), stride=(1,)), Float32)
        NPc = cutlass.max(CPT // 2, 1)
        cmask = cute.make_rmem_tensor(cute.make_layout((NPc,), stride=(1,)), Int32)
        _col_scales(am, es, cinv, cmask, CPT, NPc)
        gCD = cute.domain_offset((Int64(row0), 0), mCD)
        cg = bx * NT + tidx
        oc = cute.make_rmem_tensor(cute.make_layout((NPc,), stride=(1,)), Uint16)
        if col_ok:
            gCS = cute.domain_offset((Int64(by), 0), mCS)
            cute.autovec_copy(es, cute.local_tile(gCS, (1, CPT), (0, cg))[0, None])
            for r in cutlass.range_constexpr(BLOCK):
                vcc = cute.local_tile(sX, (1, CPT), (r, tidx))[0, None].load().to(Float32)
                _pack(vcc, cinv, oc, CPT)
                for c in cutlass.range_constexpr(NPc):
                    oc[c] = Uint16((Int32(oc[c]) & ~cmask[c]) | (cmask[c] & 0x7F7F))
                _store_bytes(oc, cute.local_tile(gCD, (1, CPT), (r, cg))[0, None], CPT)


@cute.jit
def _quant_host(cfg: cutlass.Constexpr, x: cute.Pointer, rd: cute.Pointer, rs: cute.Pointer,
                cd: cute.Pointer, cs: cute.Pointer, R: Int32, stream: C.cuda.CUstream):
    K = cfg.K
    lay = cute.make_layout((R, K), stride=(K, 1))
    mX = cute.make_tensor(x, lay)
    mRD = cute.make_tensor(rd, lay)
    KB = max(K // BLOCK, 1)  # columnwise-only calls allow K < 32: the (unused) rowwise view stays non-empty
    mRS = cute.make_tensor(rs, cute.make_layout((R, KB), stride=(KB, 1)))
    mCD = cute.make_tensor(cd, lay)
    mCS = cute.make_tensor(cs, cute.make_layout((R // BLOCK, K), stride=(K, 1)))
    grid = (cute.ceil_div(R, BLOCK), C.cdiv(K, cfg.threads * cfg.vec), 1)
    if cutlass.const_expr(cfg.smem):
        _quant_smem_kernel(cfg, mX, mRD, mRS, mCD, mCS, R).launch(grid=grid, block=(cfg.threads, 1, 1),
                                                                   stream=stream)
    else:
        _quant_kernel(cfg, mX, mRD, mRS, mCD, mCS, R).launch(grid=grid, block=(cfg.threads, 1, 1),
                                                              stream=stream)


# ------------------------------------------------------------------ dequantize kernel

@cute.kernel
def _dequant_kernel(cfg: cutlass.Constexpr, mD: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor, R: Int32):
    V = cfg.vec
    tidx, _, _ = cute.arch.thread_idx()
    by, bx, _ = cute.arch.block_idx()      # x: row tile (grid.y caps at 65535), y: column tile
    cidx = bx * cfg.threads + tidx
    col0 = cidx * V
    row0 = by * BLOCK
    if col0 < cfg.K:
        tD = _rows(mD, row0, V, cidx)
        tO = _rows(mO, row0, V, cidx)
        sc = cute.make_rmem_tensor((V,), Float32)
        if cutlass.const_expr(not cfg.rowwise):   # scales [R/32, K]: one per column, shared by the tile
            sb = cute.make_rmem_tensor((V,), Uint8)
            tS = cute.local_tile(cute.domain_offset((Int64(by), 0), mS), (1, V), (0, cidx))
            cute.autovec_copy(tS[0, None], sb)
            for c in cutlass.range_constexpr(V):
                sc[c] = _scale(Int32(sb[c]) & 0xFF)  # (the conversion sign-extends)
        db = cute.make_rmem_tensor(cute.make_layout((cutlass.max(V // 2, 1),), stride=(1,)), Uint16)
        ov = cute.make_rmem_tensor((V,), Float32)
        gS = cute.domain_offset((Int64(row0), 0), mS)
        for r in cutlass.range_constexpr(BLOCK):
            if row0 + r < R:
                if cutlass.const_expr(cfg.rowwise):
                    s = _scale(Int32(gS[r, col0 // BLOCK]) & 0xFF)
                    for c in cutlass.range_constexpr(V):
                        sc[c] = s
                if cutlass.const_expr(V == 1):
                    db[0] = Uint16(Int32(tD[r, 0]) & 0xFF)
                else:
                    cute.autovec_copy(tD[r, None], cute.recast_tensor(db, Uint8))
                for c in cutlass.range_constexpr(cutlass.max(V // 2, 1)):
                    a, b = _from_e4m3x2(db[c])
                    ov[2 * c] = a * sc[2 * c]
                    if cutlass.const_expr(V > 1):
                        ov[2 * c + 1] = b * sc[2 * c + 1]
                _store_out(ov, tO[r, None])


@cute.jit
def _scale(e: Int32) -> Float32:
    """2^(e-127) as fp32 (e = 0 gives the subnormal 2^-127); canonical NaN for e = 255."""
    bits = Int32(cutlass.select_(e == 0, 0x00400000, e << 23))
    return Int32(cutlass.select_(e == 255, 0x7FC00000, bits)).bitcast(Float32)


@cute.jit
def _store_out(ov: cute.Tensor, dst: cute.Tensor):
    """fp32 registers -> dst's dtype (RNE), vectorized store."""
    o = cute.make_rmem_tensor_like(dst)
    o.store(ov.load().to(dst.element_type))
    cute.autovec_copy(o, dst)


@cute.jit
def _dequant_host(cfg: cutlass.Constexpr, d: cute.Pointer, s: cute.Pointer, o: cute.Pointer, R: Int32,
                  stream: C.cuda.CUstream):
    K = cfg.K
    lay = cute.make_layout((R, K), stride=(K, 1))
    mD = cute.make_tensor(d, lay)
    mO = cute.make_tensor(o, lay)
    if cutlass.const_expr(cfg.rowwise):
        mS = cute.make_tensor(s, cute.make_layout((R, K // BLOCK), stride=(K // BLOCK, 1)))
    else:
        mS = cute.make_tensor(s, cute.make_layout((R // BLOCK, K), stride=(K, 1)))
    grid = (cute.ceil_div(R, BLOCK), C.cdiv(K, cfg.threads * cfg.vec), 1)
    _dequant_kernel(cfg, mD, mS, mO, R).launch(grid=grid, block=(cfg.threads, 1, 1), stream=stream)


# ------------------------------------------------------------------ launches and entry points

_U8 = C.Ptr(torch.uint8)


# (x dtype, row, col) served by the pipelined kernel when K % 32 == 0 and the pointers are
# 16-byte aligned. H200, R = 32768, K = 7168, same inputs (benchmarks/moe_cute_check.py --sweep),
# % of copy, shared-memory kernel -> pipelined: bf16 rowwise 84.2 -> 90.5, bf16 both 76.5 ->
# 84.5, fp32 both 78.4 -> 84.9. fp32 rowwise: shared-memory kernel 90.9, pipelined one CTA per
# strip 81.7, on the persistent grid 94.3 (benchmarks/probes/mxfp8_quant_persist.py): it joins
# here together with its entry in cute_quantize_pipe.PERSISTENT
_PIPE = {(torch.bfloat16, True, False), (torch.bfloat16, True, True),
         (torch.float32, True, False), (torch.float32, True, True)}


def quant_cfg(dtype: torch.dtype, K: int, row: bool, col: bool, aligned: bool = True,
              sms: int = 132) -> QuantCfg | PipeCfg:
    """The launch config quantize_into uses (static dims, pointer alignment and the device's
    SM count only)."""
    if aligned and K % BLOCK == 0 and (dtype, row, col) in _PIPE:
        return PipeCfg.heuristic(K, dtype, row, col, sms)
    return QuantCfg.heuristic(K, dtype, row, col, aligned)


@functools.lru_cache(maxsize=None)
def quant_launch(dtype: torch.dtype, K: int, row: bool, col: bool, aligned: bool = True,
                 sms: int = 132) -> C.Launch:
    """The quantize :class:`~tilekernels._cute.Launch` for x of ``dtype`` with K columns on a
    device of ``sms`` multiprocessors (132: H100 / H200 SXM).

    Args of ``run``: (x, row_data, row_scales, col_data, col_scales, R); absent
    outputs are ``None`` (null pointers the config never touches)."""
    return launch_for(quant_cfg(dtype, K, row, col, aligned, sms), dtype)


@functools.lru_cache(maxsize=None)
def launch_for(cfg: QuantCfg | PipeCfg, dtype: torch.dtype) -> C.Launch:
    """The quantize launch of an explicit config (either kernel; what sweeps and tests use)."""
    if isinstance(cfg, PipeCfg):
        return C.Launch(f"{_NAME}.quantize", _pipe_host, cfg, pipe_sig(dtype))
    return C.Launch(f"{_NAME}.quantize", _quant_host, cfg, quant_sig(cfg, dtype))


def quant_sig(cfg: QuantCfg, dtype: torch.dtype) -> tuple:
    """Arg specs of the :class:`QuantCfg` launch: x, row data, row scales, col data, col scales,
    R, with the alignments the config's accesses need."""
    v = cfg.vec
    x_align, rd_align = (16, 16) if cfg.smem else (v * _elt(dtype), v)
    return (C.Ptr(dtype, x_align), C.Ptr(torch.uint8, rd_align), C.Ptr(torch.uint8, 1),
            C.Ptr(torch.uint8, v), C.Ptr(torch.uint8, v), C.Scalar())


@functools.lru_cache(maxsize=None)
def dequant_launch(dtype: torch.dtype, K: int, rowwise: bool, aligned: bool = True) -> C.Launch:
    """The dequantize launch into ``dtype`` (bf16/fp32); run args (data, scales, out, R)."""
    cfg = DequantCfg.heuristic(K, rowwise, aligned)
    sig = (C.Ptr(torch.uint8, cfg.vec), C.Ptr(torch.uint8, 1 if rowwise else cfg.vec),
           C.Ptr(dtype, cfg.vec * _elt(dtype)), C.Scalar())
    return C.Launch(f"{_NAME}.dequantize", _dequant_host, cfg, sig)


def _aligned(*ts) -> bool:
    """All base addresses 16-byte aligned (torch's allocations are; an offset view may not be)."""
    a = 0
    for t in ts:
        if t is not None:
            a |= t.data_ptr()
    return a & 15 == 0


def quantize_into(x: torch.Tensor, row_data: torch.Tensor | None, row_scales: torch.Tensor | None,
                  col_data: torch.Tensor | None, col_scales: torch.Tensor | None) -> None:
    """MXFP8-quantize x [R, K] (bf16 or fp32, contiguous, on a CUDA device) into the given
    outputs, on the current stream, in one pass over x.

    row_data [R, K] e4m3 (float8_e4m3fn or uint8) and row_scales [R, K/32] uint8: blocks
    along K (needs K % 32 == 0); col_data [R, K] and col_scales [R/32, K]: blocks along R
    (needs R % 32 == 0). Pass None for an axis not wanted (both outputs of an axis
    together). Nothing is validated (the registry did) and nothing is allocated."""
    R, K = x.shape
    if R == 0 or K == 0:
        return
    row = row_data is not None
    col = col_data is not None
    ln = quant_launch(x.dtype, K, row, col, _aligned(x, row_data, col_data, col_scales), sm_count(x.device))
    ln.run(x, row_data, row_scales, col_data, col_scales, R)


def dequantize_into(data: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, axis: str) -> None:
    """out [R, K] (bf16 or fp32) = data [R, K] e4m3 * 2^(scales - 127), on the current stream.

    axis 'rowwise': scales [R, K/32]; 'columnwise': scales [R/32, K]. A 0xFF scale gives
    NaN for its whole block. Exact in fp32; bf16 rounds to nearest even (exact unless
    below bf16's normal range). Nothing is validated or allocated."""
    R, K = data.shape
    if R == 0 or K == 0:
        return
    rowwise = axis == "rowwise"
    ln = dequant_launch(out.dtype, K, rowwise, _aligned(data, out, None if rowwise else scales))
    ln.run(data, scales, out, R)


def representative_launches(K: int = 7168) -> dict[str, C.Launch]:
    """Every kernel variant at one K (what the CPU compile test exports): the defaults and,
    for each axis with the rowwise output, the shared-memory kernel (direct loads for
    rowwise, and the staged rowwise mapping) and the pipelined kernel at 2 and 3 stages and on
    the persistent grid (132 CTAs) and one CTA per strip, whichever the default is."""
    out = {}
    for dt in (torch.bfloat16, torch.float32):
        n = str(dt).removeprefix("torch.")
        for axis, (row, col) in {"rowwise": (True, False), "columnwise": (False, True),
                                 "both": (True, True)}.items():
            out[f"quantize.{axis}.{n}"] = quant_launch(dt, K, row, col)
            if row:
                pipe = PipeCfg.heuristic(K, dt, row, col)
                out[f"quantize.{axis}_smem.{n}"] = launch_for(QuantCfg.heuristic(K, dt, row, col), dt)
                out[f"quantize.{axis}_pipe.{n}"] = launch_for(pipe, dt)
                out[f"quantize.{axis}_pipe3.{n}"] = launch_for(dataclasses.replace(pipe, stages=3), dt)
                other = (dataclasses.replace(pipe, ctas=0, grid_x=max(1, K // 32 // pipe.nbt // 32))
                         if pipe.ctas else dataclasses.replace(pipe, grid_x=1, min_blocks=0, ctas=132))
                out[f"quantize.{axis}_{'strips' if pipe.ctas else 'persist'}.{n}"] = launch_for(other, dt)
        staged = dataclasses.replace(QuantCfg.heuristic(K, dt, True, False), direct=False)
        out[f"quantize.rowwise_staged.{n}"] = launch_for(staged, dt)
        for axis in ("rowwise", "columnwise"):
            out[f"dequantize.{axis}.{n}"] = dequant_launch(dt, K, axis == "rowwise")
    return out
