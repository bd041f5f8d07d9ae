"""mhc_pre's aggregate term in cute_proj_rms's backward where AGG_IL does not apply (n in (1, 3), or C % 8 != 0):
the consumer warpgroups' own loads of dlayer_in [M, C] bf16 and h_pre^T [n, M] fp32.

With C % 128 == 0 (AGG_SM) a warpgroup's 128 channels lie in one stream: its dlayer_in tile [64, 128] is read by
16-byte loads before the stage wait (``_agg_tile_loads``) and passed to the accumulator's threads through a padded
shared tile (``_agg_tile_store``, rows of DLW words: conflict-free 4-byte reads); else each thread loads the words
of its own accumulator column pairs (``_agg_loads`` before the wait where a half lies in one stream, ``_agg_word`` /
``_agg_hp`` in the epilogue otherwise). Device functions only (called from cute_proj_rms._bwd_kernel); importing
this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import vector

HALF = 128  # channels a consumer warpgroup owns


@cute.jit
def _agg_word(dl: cute.Pointer, tok: Int32, k: Int32, M: Int32, K: cutlass.Constexpr, C: cutlass.Constexpr) -> Int32:
    """dlayer_in [M, C] bf16's two values at (tok, k % C .. + 1) as one 32-bit word (low half first), 0 past M or
    K (k even, C even: 4-byte aligned)."""
    v = Int32(0)
    if tok < M:
        if k < K:
            v = cute.arch.load(cute.recast_ptr(dl + (Int64(tok) * C + k % C), dtype=Int32), Int32)
    return v


@cute.jit
def _agg_hp(hp: cute.Pointer, tok: Int32, k: Int32, M: Int32, K: cutlass.Constexpr, C: cutlass.Constexpr) -> Float32:
    """h_pre^T [n, M] fp32 at (k // C, tok), 0 past M or K."""
    v = Float32(0.0)
    if tok < M:
        if k < K:
            v = cute.arch.load(hp + (Int64(k // C) * M + tok), Float32)
    return v


@cute.jit
def _agg_loads(dl: cute.Pointer, hp: cute.Pointer, dlr: cute.Tensor, hpr: cute.Tensor, cDX: cute.Tensor, row0: Int32,
               c0: Int32, M: Int32, K: cutlass.Constexpr, C: cutlass.Constexpr):
    """The aggregate term's operands for this thread's dx accumulator pairs of the row tile at row0, where the
    warpgroup's channels c0 .. c0 + HALF lie in one stream (C % HALF == 0): dlr [pairs] = _agg_word's, hpr [2] =
    h_pre at the rows t0 and t0 + 8 the pairs alternate between. Issued before the tile's stage is waited for: their
    latency hides behind the wait and the wgmmas (other C: loaded in the epilogue, latency exposed, registers
    spared)."""
    t0, cc0 = cDX[0]
    base = dl + (Int64(row0 + t0) * C + c0 % C + cc0)   # the pairs' offsets from it fold into immediates
    for q in cutlass.range_constexpr(cute.size(dlr)):
        t_, c_ = cDX[2 * q]
        dlr[q] = Int32(0)
        if row0 + t_ < M:
            if c0 < K:   # (C % HALF == 0: the whole half is below K)
                dlr[q] = cute.arch.load(cute.recast_ptr(base + ((t_ - t0) * C + (c_ - cc0)), dtype=Int32), Int32)
    _agg_hp_rows(hp, hpr, cDX, row0, c0, M, K, C)


@cute.jit
def _agg_hp_rows(hp: cute.Pointer, hpr: cute.Tensor, cDX: cute.Tensor, row0: Int32, c0: Int32, M: Int32,
                 K: cutlass.Constexpr, C: cutlass.Constexpr):
    """hpr [2] = h_pre^T at (c0 // C, the accumulator rows t0 and t0 + 8 of the tile at row0)."""
    for q in cutlass.range_constexpr(2):
        t_, _ = cDX[2 * q]
        hpr[q] = _agg_hp(hp, row0 + t_, c0, M, K, C)


_V4 = 4   # 32-bit words a 16-byte access
DLW = (HALF + 8) // 2   # AGG_SM: 32-bit words a padded dlayer_in row in shared memory


@cute.jit
def _agg_tile_loads(dl: cute.Pointer, dlv: cute.Tensor, ct: Int32, row0: Int32, c0: Int32, M: Int32,
                    K: cutlass.Constexpr, C: cutlass.Constexpr):
    """AGG_SM: the warpgroup's dlayer_in tile [BM, HALF] (rows row0 .., channels c0 % C .. of one stream) by 16-byte
    loads, 8 a thread into dlv [32] Int32: chunk ct + 128 j is row ct // 16 + 8 j, channels 8 (ct % 16) ..; a warp's
    32 chunks are two whole 256-byte row pieces. 0 past M or K."""
    vt = ir.VectorType.get([_V4], Int32.mlir_type)
    r0 = ct // 16
    base = dl + (Int64(row0 + r0) * C + c0 % C + (ct % 16) * 8)
    for j in cutlass.range_constexpr(8):
        for e in cutlass.range_constexpr(_V4):
            dlv[_V4 * j + e] = Int32(0)
        if row0 + r0 + 8 * j < M:
            if c0 < K:
                v = cute.arch.load(cute.recast_ptr(base + j * 8 * C, dtype=Int32), vt)
                for e in cutlass.range_constexpr(_V4):
                    dlv[_V4 * j + e] = Int32(vector.extract(v, dynamic_position=[], static_position=[e]))


@cute.jit
def _agg_tile_store(dlv: cute.Tensor, sdl: cute.Tensor, ct: Int32):
    """AGG_SM: _agg_tile_loads' words into the warpgroup's shared tile sdl [BM * DLW] Int32 (16-byte stores; a
    quarter warp's eight are one 128-byte row piece: no bank conflicts)."""
    vt = ir.VectorType.get([_V4], Int32.mlir_type)
    off = (ct // 16) * DLW + (ct % 16) * _V4
    for j in cutlass.range_constexpr(8):
        w = vector.from_elements(vt, [dlv[_V4 * j + e].ir_value() for e in range(_V4)])
        cute.arch.store(sdl.iterator + (off + 8 * j * DLW), w)
