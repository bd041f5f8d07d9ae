"""CuTe DSL backward of mhc_proj_rms (Hopper sm_90a): TMA + warp-specialized wgmma, one pass over x.

x [M, K] bf16, weight [N, K] bf16 (N = n*n + 2n <= 32), dproj [M, N] fp32, dr [M] fp32 and r [M]
fp32 (the forward's), all contiguous ->

    dx [M, K] bf16   = dproj @ weight + coef[m] * x[m, :],  coef = -dr r^2 / (K rms), rms = 1/r - eps
    dweight [N, K]   = dproj^T @ x   (bf16, from fp32 partial sums reduced in a fixed order)

(``reference.proj_rms_bwd``; rms = ||x|| / sqrt(K) comes back from the saved r, so x is read once.)

mhc_pre's dx pass is the same kernel with the aggregate term (cfg.AGG_C = C, ``bwd_agg_into``): x is mhc_pre's
streams [M, n, C] seen as [M, K = n C], and dx[t, k] += h_pre[t, k // C] * dlayer_in[t, k % C] (dlayer_in [M, C]
bf16, h_pre^T [n, M] fp32, the mix's). With n in (2, 4) and C % 8 == 0 (AGG_IL, the default there) a CTA takes
BK / n channels of every stream: x and dx move as four [64 ch, 64 tok] TMA boxes a stage (x seen [C, M, n]), and the
row tile's dlayer_in [64 tok, BK / n] comes by TMA into the same stage, read from shared memory for all n streams (the
SMs load it once, not n times). Otherwise, with C % 128 == 0 (AGG_SM) each consumer warpgroup reads its dlayer_in
tile [64, 128] by 16-byte loads issued before the stage wait and hands it to the accumulator's threads through a
padded shared tile (one more warpgroup barrier a tile); with C % 256 == 0 the n stream slices of a channel are
adjacent in block order (CHM). Other C: each thread loads its own column pairs in the epilogue.

Why a second backend: the cuTile kernel (cutile_proj_rms.py) moves x and dx at ~85% of the copy
bandwidth and is not tensor-core bound; here the loads of x run ahead of the math in a TMA ring, the
tensor-core work is 8 wgmmas a tile, and dx leaves by TMA.

Work split: CTA (cs, g) owns the channel slice [cs*BK, cs*BK + BK) (BK = 256) and the row tiles
g, g + GM, ... of BM = 64 tokens (GM row groups = gridDim.y); it keeps that slice's dweight partial in
registers and writes it once to ``p_dw[g]`` [GM, N, K] fp32. The slice's last CTA to finish (FUSE_RED: one
atomic counter a slice) then sums its GM partials in order into dweight, so the sums are deterministic (the atomic
picks which CTA sums, never the order) and need no second launch; FUSE_RED off, ``_reduce_kernel`` does it after
the kernel (the same order and rounding).

CTA = 3 warpgroups (384 threads):

* warp 0 (the producer; its warpgroup drops to 40 registers, 24 with AGG_C but not AGG_IL) per row tile: TMA
  loads of x (two halves of the slice, [128 channels x 64 tokens] each, channel-major 128B-swizzled: the layout
  the dweight wgmma reads as its N-major B), of the tile's dproj rows (contiguous: [BM * N] fp32 in
  boxes of <= 256) and of r and dr, into a STAGES-deep mbarrier ring. It also stores dx: a stage
  released by the consumers holds its tile's dx in place of x; the producer stores it by TMA (and
  waits for the store to have read the stage) before loading the stage again, and stores the last
  tiles after its loop.
* warpgroups 1, 2 (consumers): warpgroup c owns channels [c*128, c*128 + 128) of the slice. Per tile:
  - dproj split into bf16 hi = bf16(dproj) and lo = bf16(dproj - hi) (~16 mantissa bits; every
    product exact, fp32 sums), stored as HL [64 tokens, 64] = [hi | lo] (NP = 16 or 32 >= N columns
    each, zero padded; 16-byte stores) with coef per token;
  - dx = HL @ [W; W] (wgmma m64 n128, k = 2*NP; B = the warpgroup's weight columns, loaded once) and
    dweight rows [hi | lo] x 128 channels += HL^T @ x (wgmma m64 n128, k = 64 tokens: A = HL seen
    M-major, B = the x half as it landed);
  - epilogue: dx = acc + coef * x from the stage itself (4-byte pair accesses), written back in place
    as bf16; the stage is released to the producer.
  - at the end: dweight's hi and lo rows summed through shared memory (the warpgroup's x buffers,
    once the producer's last stores have read them) into p_dw[g].
  The first wgmma of each accumulation starts from zero by its scale-d flag, not from zero-filled
  registers: those compile to register moves after wgmma.fence, which the PTX ISA leaves undefined.

Tails: TMA zero-fills loads past M and K and clips the stores (a half wholly past K stores nothing:
see ``_store_dx``); dproj / r / dr rows past M read as 0 (adding nothing to dweight); weight rows
N..NP-1 are 0. M = 0 launches nothing (dweight = 0).

Constraints (the spec's cute backend): bf16 x / weight, N <= 32, K % 8 == 0 (16-byte TMA row
strides), contiguous tensors (views not 16-byte aligned go through copies), M * N < 2**31, sm_90a.
Compile key: ProjRmsBwdCuteCfg (N, K and the tiling); M is a runtime scalar (the grid). Measured
numbers: the mHC ledger (benchmarks/results/nvidia-h200-mhc-cutile.md). Importing this module needs
``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as CU
from tilekernels._glue import aligned16, kernel, workspace

from . import cute_proj_rms_fwd as _fwd
from .reference import ZERO_ROW
from .cute_proj_rms_agg import (DLW, HALF, _agg_hp, _agg_hp_rows, _agg_loads, _agg_tile_loads, _agg_tile_store,
                                _agg_word)

_NAME = "mhc.cute_proj_rms"
THREADS = 384
PRODUCER_REGS, CONSUMER_REGS = 40, 232
AGG_REGS = (24, 240)   # AGG_C's split: the early dlayer_in loads hold 32 more registers a consumer thread
PIECE = 64  # AGG_IL: channels of one stream a TMA box (x, dx, dlayer_in) holds


@dataclasses.dataclass(frozen=True)
class ProjRmsBwdCuteCfg:
    """Launch config = compile key (with the dtypes, all fixed).

    N, K: static dims; NP: N padded (16 or 32; the hi | lo operand is 2*NP wide); BM: tokens a row
    tile; BK: channels a CTA (two consumer warpgroups of HALF); STAGES: the x ring; GM: row groups
    (dweight partials; grid = (cdiv(K, BK), min(GM, cdiv(M, BM))))."""

    N: int
    K: int
    NP: int = 32
    BM: int = 64
    BK: int = 256
    STAGES: int = 3
    GM: int = 7
    DW_ONLY: bool = False   # dweight's partials only (no dx: no r, dr loads, no dx products or stores)
    # mhc_pre's aggregate term in dx (0: none): x is mhc_pre's [M, n, C] streams seen as [M, K = n C] and
    # dx[t, k] += h_pre[t, k // C] * dlayer_in[t, k % C] with C = AGG_C (h_pre given transposed, [n, M] fp32)
    AGG_C: int = 0
    # with AGG_C % BK == 0: block x walks the slices channel-major (the n streams' slices of a channel adjacent, so
    # they run together and dlayer_in's tile comes from DRAM once, then from L2); False: stream-major (slice order).
    # H200, T=32768, n=4, C=7168: 1570 us against 1641 with per-thread loads; with AGG_SM no difference measured
    # (1402.6 / 1404.1 against 1392.1 / 1407.0 stream-major, two leases)
    CHM: bool = True
    # with AGG_C % HALF == 0: dlayer_in's tile read by 16-byte coalesced loads and passed to the accumulator's
    # threads through shared memory (rows padded to HALF + 8: conflict-free 4-byte reads; one more warpgroup barrier a
    # tile); False: each thread loads its own column pairs (4-byte loads, 8 rows a warp instruction: 1570 us against
    # 1402-1404, cuTile's pass 1424; the mHC ledger, session 31)
    AGG_SM: bool = True
    # with n = K // AGG_C in (2, 4) and AGG_C % 8 == 0 (AGG_IL, the default there): a CTA takes BK // n channels of
    # every stream (four 64-channel pieces: x and dx by TMA boxes per stream) and its dlayer_in tile [BM, BK // n]
    # comes by TMA into the stage once, for all n streams: no consumer loads, no extra barrier, dlayer_in read by the
    # SMs once instead of n times (H200, T=32768, n=4, C=7168: AGG_SM's pass read 4.16 GB from L2 into the SMs against
    # plain proj_rms's 2.27, at 54% of DRAM bandwidth against 69%: the mHC ledger, session 32)
    AGG_IL: bool = True
    # dweight's partials summed by the kernel itself: each CTA counts itself done on its slice's counter (an atomic
    # add after its partial's stores and a gpu-scope fence) and the slice's last CTA sums the slice's GM partials in
    # order into dweight (the same order and rounding as _reduce_kernel: bitwise equal), then zeroes the counter for
    # the next launch. False: the separate reduction launch after the kernel.
    FUSE_RED: bool = True

    def __post_init__(self):
        if not (1 <= self.N <= self.NP and self.NP in (16, 32) and self.BM == 64 and self.BK == 2 * HALF
                and self.K % 8 == 0 and self.K > 0 and self.STAGES >= 3 and self.GM >= 1):
            raise ValueError(f"mhc_proj_rms cute: config {self}: needs N <= NP in (16, 32), BM 64, BK {2 * HALF}, "
                             f"K % 8 == 0, STAGES >= 3 (the dweight sums reuse 3 x buffers)")
        if self.AGG_C and (self.DW_ONLY or self.AGG_C % 2 or self.K % self.AGG_C):
            raise ValueError(f"mhc_proj_rms cute: config {self}: the aggregate term needs dx (not DW_ONLY), an even "
                             f"AGG_C and K % AGG_C == 0")
        if self.smem_bytes > 225 * 1024:
            raise ValueError(f"mhc_proj_rms cute: config {self} needs {self.smem_bytes} bytes of shared memory")

    @property
    def PBOX(self) -> int:
        """dproj's TMA box (elements): the largest divisor of BM * N that is <= 256 (the box limit) and a
        multiple of 32 (each box's shared-memory destination 128-byte aligned)."""
        return max(d for d in range(32, 257, 32) if (self.BM * self.N) % d == 0)

    @property
    def smem_bytes(self) -> int:
        x = 2 * self.STAGES * HALF * self.BM * 2
        w = 2 * HALF * 64 * 2
        hl = 2 * self.BM * 64 * 2
        rows = self.STAGES * self.BM * (self.N + 2) * 4   # dproj, r, dr per stage (r, dr unused by DW_ONLY)
        dl = 2 * self.BM * (HALF + 8) * 2 if self._agg_sm else 0
        dl += self.STAGES * self.PPS * PIECE * self.BM * 2 if self._agg_il else 0
        flag = 16   # FUSE_RED's count
        return x + w + hl + rows + dl + 2 * self.BM * 4 * self.STAGES + 2 * self.STAGES * 8 + flag + 1024

    @property
    def _agg_il(self) -> bool:
        return bool(self.AGG_C and self.AGG_IL and self.K // self.AGG_C in (2, 4) and self.AGG_C % 8 == 0)

    @property
    def _agg_sm(self) -> bool:
        return bool(self.AGG_C and self.AGG_SM and self.AGG_C % HALF == 0 and not self._agg_il)

    @property
    def PPS(self) -> int:
        """AGG_IL: 64-channel pieces a stream in a CTA (4 // n); the CTA's pieces p = 0..3 are stream p // PPS,
        channels cs * 64 PPS + 64 (p % PPS) ..; warpgroup wc owns pieces 2 wc, 2 wc + 1."""
        return 4 // (self.K // self.AGG_C) if self._agg_il else 0

    @property
    def grid_x(self) -> int:
        """The backward's channel slices (gridDim.x): cdiv(K, BK), with AGG_IL cdiv(C, 64 PPS) (a CTA takes BK // n
        channels of every stream); also the number of FUSE_RED's slice counters."""
        return -(-self.AGG_C // (PIECE * self.PPS)) if self._agg_il else -(-self.K // self.BK)

    @property
    def nct(self) -> int:
        """AGG_IL: 64-channel pieces a stream (the last partly past C where C % 64 != 0)."""
        return -(-self.AGG_C // PIECE)

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, N: int, K: int) -> "ProjRmsBwdCuteCfg":
        """Static dims only: NP the smallest of 16, 32 holding N; 3 stages of 32 KiB of x (one CTA an SM;
        4 measured the same or slower); 7 row groups (K=28672: 112 slices x 7 = 784 CTAs, 5.9 waves on
        132 SMs; 5, 8, 12 and 14 measured slower)."""
        return cls(N=N, K=K, NP=16 if N <= 16 else 32)


# ------------------------------------------------------------------ layouts


def _layouts(cfg):
    """(sX, sW, sHa, sHb) layouts: x halves [HALF ch, BM tok] channel-major x 2*STAGES buffers
    (index wc * STAGES + stage); weight halves [HALF ch, NP] channel-major x 2; hi and lo per
    warpgroup (index 2 * wc + 0 / 1) as the dx A operand [BM, NP] K-major and the dweight B operand
    [NP, BM] N-major (the same bytes) x 4."""
    mn = LayoutEnum.COL_MAJOR   # MN-major operands
    km = LayoutEnum.ROW_MAJOR   # K-major
    sX = sm90_utils.make_smem_layout_a(mn, (HALF, 2 * cfg.NP, cfg.BM), BFloat16, 2 * cfg.STAGES)
    sW = sm90_utils.make_smem_layout_b(mn, (cfg.BM, HALF, 64), BFloat16, 2)
    sHa = sm90_utils.make_smem_layout_a(km, (cfg.BM, HALF, 64), BFloat16, 2)
    sHb = sm90_utils.make_smem_layout_a(mn, (64, HALF, cfg.BM), BFloat16, 2)
    return sX, sW, sHa, sHb


def _piece_layout(cfg, buffers: int):
    """AGG_IL: [PIECE ch, BM tok] channel-major buffers, each laid out as the matching half of an x buffer (an x
    half's 64-channel pieces are its first and second 8 KB: the x layout tiles its atoms along tokens first), so
    x buffer b is pieces 2 b, 2 b + 1 and the TMA boxes of one stream land in place."""
    return sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (PIECE, 2 * cfg.NP, cfg.BM), BFloat16, buffers)


def _smem_tensor(smem, layout, dtype=BFloat16):
    """(raw byte buffer, swizzled tensor) of one 1024-aligned allocation."""
    buf = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(cute.cosize(layout) * dtype.width // 8),
                               byte_alignment=1024)
    return buf, cute.make_tensor(cute.recast_ptr(buf.iterator, layout.inner, dtype=dtype), layout.outer)


# ------------------------------------------------------------------ kernels


@cute.jit
def _store_dx(tma_dx: cute.CopyAtom, tDs: cute.Tensor, tDg: cute.Tensor, st: Int32, S: cutlass.Constexpr,
              cs: Int32, m: Int32, half1):
    """TMA stores of stage st's dx halves (row tile m), one bulk-group commit, then wait until they
    have read the stage (it is loaded again next). A half wholly past K stores nothing: CuTe maps a
    tile index past a size-1 tile mode (K <= HALF) back onto tile 0, which would overwrite the first
    half's dx."""
    cute.copy(tma_dx, tDs[None, st], tDg[None, 2 * cs, m])
    if half1:
        cute.copy(tma_dx, tDs[None, S + st], tDg[None, 2 * cs + 1, m])
    cute.arch.cp_async_bulk_commit_group()
    cute.arch.cp_async_bulk_wait_group(0, read=True)


@cute.jit
def _store_dx_il(cfg: cutlass.Constexpr, tma_dx: cute.CopyAtom, tDs: cute.Tensor, tDg: cute.Tensor, st: Int32,
                 cs: Int32, m: Int32):
    """AGG_IL: _store_dx's four pieces (piece p of stage st is buffer 2 ((p // 2) S + st) + p % 2; a piece wholly
    past C, whose load was clamped onto the last channel tile, stores nothing)."""
    PPS, S = cfg.PPS, cfg.STAGES
    for p in cutlass.range_constexpr(4):
        if cs * PPS + p % PPS < cfg.nct:
            cute.copy(tma_dx, tDs[None, 2 * ((p // 2) * S + st) + p % 2], tDg[None, cs * PPS + p % PPS, m, p // PPS])
    cute.arch.cp_async_bulk_commit_group()
    cute.arch.cp_async_bulk_wait_group(0, read=True)


@cute.jit
def _col(cfg: cutlass.Constexpr, cs: Int32, c0: Int32, wc: Int32, c: Int32):
    """(column of x [M, K], whether it is below K) of the consumer warpgroup wc's column c (0 .. HALF - 1): c0 + c,
    or with AGG_IL stream p // PPS, channel 64 (cs PPS + p % PPS) + c % 64 of piece p = 2 wc + c // 64."""
    k, ok = c0 + c, c0 + c < cfg.K
    if const_expr(cfg._agg_il):
        p = 2 * wc + c // PIECE
        ch = (cs * cfg.PPS + p % cfg.PPS) * PIECE + c % PIECE
        k, ok = (p // cfg.PPS) * cfg.AGG_C + ch, ch < cfg.AGG_C
    return k, ok


@cute.kernel
def _bwd_kernel(cfg: cutlass.Constexpr, tma_x: cute.CopyAtom, mX: cute.Tensor, tma_dx: cute.CopyAtom,
                mDX: cute.Tensor, tma_p: cute.CopyAtom, mP: cute.Tensor, tma_r: cute.CopyAtom, mR: cute.Tensor,
                tma_dr: cute.CopyAtom, mDR: cute.Tensor, tma_dl: cute.CopyAtom, mDL: cute.Tensor, w: cute.Pointer,
                p_dw: cute.Pointer, dl: cute.Pointer, hp: cute.Pointer, dw: cute.Pointer, cnt: cute.Pointer, M: Int32,
                eps: Float32):
    N, K, NP, BM, S = cfg.N, cfg.K, cfg.NP, cfg.BM, cfg.STAGES
    tidx, _, _ = cute.arch.thread_idx()
    cs, g0, _ = cute.arch.block_idx()
    slot = cs   # FUSE_RED: this CTA's slice counter (the block's x, before any slice reordering)
    IL = cfg._agg_il   # (x, dx and dlayer_in by per-stream TMA pieces: tma_x / tma_dx / tma_dl are built so)
    if const_expr(cfg.AGG_C > 0 and cfg.CHM and cfg.AGG_C % cfg.BK == 0 and not IL):
        nsl = cfg.AGG_C // cfg.BK   # slices a stream
        cs = (cs % (K // cfg.AGG_C)) * nsl + cs // (K // cfg.AGG_C)
    _, GMe, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    ntm = (M + BM - 1) // BM
    if warp == 0:
        CU.prefetch_tma(tma_x, tma_dx, tma_p, tma_r, tma_dr)
        if const_expr(IL):
            CU.prefetch_tma(tma_dl)

    smem = cutlass.memory.SmemAllocator()
    sX_l, sW_l, sHa_l, sHb_l = _layouts(cfg)
    sX_raw, sX = _smem_tensor(smem, sX_l)
    _, sW = _smem_tensor(smem, sW_l)
    hl_buf = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(cute.cosize(sHa_l) * 2), byte_alignment=1024)
    sHa = cute.make_tensor(cute.recast_ptr(hl_buf.iterator, sHa_l.inner, dtype=BFloat16), sHa_l.outer)
    sHb = cute.make_tensor(cute.recast_ptr(hl_buf.iterator, sHb_l.inner, dtype=BFloat16), sHb_l.outer)
    sCoef = smem.allocate_tensor(Float32, cute.make_layout((BM, 2, S)), byte_alignment=16)
    # a stage's dproj rows [BM * N] fp32 (contiguous in memory), r and dr [BM] (index 2 * stage + 0 / 1)
    PB = cfg.PBOX
    NPB = BM * N // PB
    sP = smem.allocate_tensor(Float32, cute.make_layout((PB, 1, NPB * S)), byte_alignment=128)
    sR = smem.allocate_tensor(Float32, cute.make_layout((BM, 1, 2 * S)), byte_alignment=128)
    sFlag = smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16)   # FUSE_RED: the count seen
    DWO = cfg.DW_ONLY
    ASM = cfg._agg_sm
    if const_expr(ASM):   # dlayer_in tiles [BM, DLW] Int32 a warpgroup
        sDL = smem.allocate_tensor(Int32, cute.make_layout(2 * BM * DLW), byte_alignment=16)
    PPS = cfg.PPS
    if const_expr(IL):   # dlayer_in pieces, PPS a stage (index stage * PPS + q)
        _, sDL = _smem_tensor(smem, _piece_layout(cfg, S * PPS))
        lm = _piece_layout(cfg, 4 * S)   # the x buffers as pieces
        sX64 = cute.make_tensor(cute.recast_ptr(sX_raw.iterator, lm.inner, dtype=BFloat16), lm.outer)
    pipe = CU.tma_pipeline(smem, S, 2 * HALF * BM * 2 + BM * N * 4 + (0 if DWO else 2 * BM * 4)
                           + PPS * PIECE * BM * 2, 8)

    # x viewed [K, M] (channel-major), tiled [HALF, BM]: tile (2 * cs + c, m) is half c of row tile m
    if const_expr(IL):   # x [C, M, n] (channel-major, the stream a batch mode) in pieces [PIECE, BM]
        tXs, tXg = CU.tma_tiles(tma_x, sX64, mX, (PIECE, BM))
        tLs, tLg = CU.tma_tiles(tma_dl, sDL, mDL, (PIECE, BM))
    else:
        tXs, tXg = CU.tma_tiles(tma_x, sX, mX, (HALF, BM))
    # dproj viewed 1-D [M * N], row tile m = elements [m * BM * N, (m + 1) * BM * N); r, dr [M]
    # (1-D TMA tensors of a dynamic extent do not build in CuTe DSL 4.8.1: [L, 1] views instead)
    tPs, tPg = CU.tma_tiles(tma_p, sP, mP, (PB, 1), (None, 0))
    tRs, tRg = CU.tma_tiles(tma_r, sR, mR, (BM, 1), (None, 0))
    _, tDRg = CU.tma_tiles(tma_dr, sR, mDR, (BM, 1), (None, 0))   # (each TMA atom holds its own tensor's descriptor)
    if const_expr(IL):
        tDs, tDg = CU.tma_tiles(tma_dx, sX64, mDX, (PIECE, BM))
    else:
        tDs, tDg = CU.tma_tiles(tma_dx, sX, mDX, (HALF, BM))
    half1 = cs * (2 * HALF) + HALF < K   # the second half has channels below K
    if wg == 0:
        cute.arch.setmaxregister_decrease(AGG_REGS[0] if const_expr(cfg.AGG_C > 0 and not IL) else PRODUCER_REGS)
        if warp == 0:
            pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, S)
            # this warp also stores dx. sst walks the stages one round behind pst: the consumers'
            # release of a stage means its dx is in place; it is stored (and read) before the stage
            # is loaded again, and the last tiles' after the loop
            sst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, S)
            for _ in cutlass.range_constexpr(S):
                sst.advance()
            lane0 = cute.arch.lane_idx() == 0
            for m in cutlass.range(g0, ntm, GMe, unroll=1):
                pipe.producer_acquire(pst)
                if const_expr(not DWO):
                    if m - g0 >= S * GMe:   # the stage holds tile m - S*GMe's dx: store it first
                        if lane0:
                            if const_expr(IL):
                                _store_dx_il(cfg, tma_dx, tDs, tDg, sst.index, cs, m - S * GMe)
                            else:
                                _store_dx(tma_dx, tDs, tDg, sst.index, S, cs, m - S * GMe, half1)
                        sst.advance()
                bar = pipe.producer_get_barrier(pst)
                if const_expr(IL):   # pieces wholly past C: the last channel tile again (its dx is not stored)
                    nct = cfg.nct
                    for p in cutlass.range_constexpr(4):
                        cute.copy(tma_x, tXg[None, cutlass.min(cs * PPS + p % PPS, nct - 1), m, p // PPS],
                                  tXs[None, 2 * ((p // 2) * S + pst.index) + p % 2], tma_bar_ptr=bar)
                    for q in cutlass.range_constexpr(PPS):
                        cute.copy(tma_dl, tLg[None, cutlass.min(cs * PPS + q, nct - 1), m],
                                  tLs[None, pst.index * PPS + q], tma_bar_ptr=bar)
                else:
                    cute.copy(tma_x, tXg[None, 2 * cs, m], tXs[None, pst.index], tma_bar_ptr=bar)
                    cute.copy(tma_x, tXg[None, 2 * cs + 1, m], tXs[None, S + pst.index], tma_bar_ptr=bar)
                for q in cutlass.range_constexpr(NPB):   # TMA boxes are at most 256 elements
                    cute.copy(tma_p, tPg[None, m * NPB + q], tPs[None, pst.index * NPB + q], tma_bar_ptr=bar)
                if const_expr(not DWO):
                    cute.copy(tma_r, tRg[None, m], tRs[None, 2 * pst.index], tma_bar_ptr=bar)
                    cute.copy(tma_dr, tDRg[None, m], tRs[None, 2 * pst.index + 1], tma_bar_ptr=bar)
                pipe.producer_commit(pst)
                pst.advance()
            ntc = (ntm - g0 + GMe - 1) // GMe   # this CTA's tiles: the last min(S, ntc) are still to store
            # (DW_ONLY stores nothing; each consumer warpgroup's dweight sums reuse only its own x buffers,
            # which every load it consumed has landed in)
            if const_expr(not DWO):
                for q in cutlass.range(cutlass.max(ntc - S, 0), ntc, unroll=1):
                    pipe.sync_object_empty.wait(sst.index, sst.phase)
                    if lane0:
                        if const_expr(IL):
                            _store_dx_il(cfg, tma_dx, tDs, tDg, sst.index, cs, g0 + q * GMe)
                        else:
                            _store_dx(tma_dx, tDs, tDg, sst.index, S, cs, g0 + q * GMe, half1)
                    sst.advance()
            cute.arch.barrier(barrier_id=3, number_of_threads=32 + 256)  # stores have read: x buffers free
    else:
        cute.arch.setmaxregister_increase(AGG_REGS[1] if const_expr(cfg.AGG_C > 0 and not IL) else CONSUMER_REGS)
        wc = wg - 1
        ct = tidx - 128 * wg
        bar_id = 1 + wc
        c0 = cs * (2 * HALF) + wc * HALF  # this warpgroup's first channel
        kf = Float32(K)

        # ---- the weight columns [c0, c0 + HALF) of rows 0..NP-1 (zero past N and K), once
        sWc = sW[None, None, wc]
        wrow = cute.make_tensor(w, cute.make_layout((N, K), stride=(K, 1)))
        kc, kok = _col(cfg, cs, c0, wc, ct)   # this thread's column of x (its weight column, its dweight column)
        if const_expr(not DWO):
            for i in cutlass.range_constexpr(64):   # rows j of [W; W; 0]: hi's k-rows, then lo's (NP each)
                val = BFloat16(0.0)
                if const_expr(i < 2 * NP and i % NP < N):
                    if kok:
                        val = wrow[i % NP, kc]
                sWc[ct, i] = val

        # ---- MMAs: dx [BM tok, HALF ch] = [hi | lo] @ [W; W] (k = 2*NP); dweight rows [hi | lo] (64) x
        # [HALF ch] += [hi | lo]^T @ x-half (k = BM tokens): 4 + 4 m64 n128 k16 wgmmas a tile (NP = 32)
        mma_dx = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.COL_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(64, HALF))
        mma_dw = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, LayoutEnum.COL_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.COL_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(64, HALF))
        thr_dx = mma_dx.get_slice(0)
        thr_dw = mma_dw.get_slice(0)
        tDXa = mma_dx.make_fragment_A(thr_dx.partition_A(sHa))
        tDXb = mma_dx.make_fragment_B(thr_dx.partition_B(sWc))
        tDWa = mma_dw.make_fragment_A(thr_dw.partition_A(sHb))
        tDWb = mma_dw.make_fragment_B(thr_dw.partition_B(sX))
        cDX = mma_dx.get_slice(ct).partition_C(cute.make_identity_tensor((BM, HALF)))
        cDW = mma_dw.get_slice(ct).partition_C(cute.make_identity_tensor((64, HALF)))
        acc_dx = cute.make_rmem_tensor(cDX.shape, Float32)
        acc_dw = cute.make_rmem_tensor(cDW.shape, Float32)
        t0 = cDX[0][0]          # this thread's first accumulator row (token); the other is t0 + 8
        xpair = cute.make_rmem_tensor((2,), BFloat16)
        dlpair = cute.make_rmem_tensor((2,), BFloat16)
        AG = cfg.AGG_C
        NQ = cute.size(acc_dx) // 2   # the accumulator's column pairs
        dlr = cute.make_rmem_tensor((NQ,), Int32)   # (AGG_SM: the 16-byte loads' words)
        hpr = cute.make_rmem_tensor((4 if IL else 2,), Float32)   # (IL: [piece half h, row r] at 2 h + r)
        if const_expr(ASM):
            sdl = cute.make_tensor(sDL.iterator + wc * (BM * DLW), cute.make_layout(BM * DLW))

        # ---- per tile: thread ct takes dproj row ct // 2, columns (ct % 2) * NP/2 .. (of [0, NP))
        HC = NP // 2
        tok = ct // 2
        j0 = (ct % 2) * HC
        sHL = sHa[None, None, wc]
        hl = cute.make_rmem_tensor(cute.make_layout((2, HC), stride=(HC, 1)), BFloat16)  # this thread's hi | lo
        sHLv = cute.logical_divide(sHL, (None, cute.make_layout(8)))
        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        for m in cutlass.range(g0, ntm, GMe, unroll=1):
            if const_expr(IL):   # h_pre of the stream of piece 2 wc + h at rows t0, t0 + 8
                for i in cutlass.range_constexpr(4):
                    tk = m * BM + cDX[2 * (i % 2)][0]
                    hpr[i] = Float32(0.0)
                    if tk < M:
                        hpr[i] = cute.arch.load(hp + (Int64((2 * wc + i // 2) // PPS) * M + tk), Float32)
            elif const_expr(ASM):
                _agg_tile_loads(dl, dlr, ct, m * BM, c0, M, K, AG)
                _agg_hp_rows(hp, hpr, cDX, m * BM, c0, M, K, AG)
            elif const_expr(AG > 0 and AG % HALF == 0):
                _agg_loads(dl, hp, dlr, hpr, cDX, m * BM, c0, M, K, AG)
            pipe.consumer_wait(rst)
            st = rst.index
            # HL = [hi | lo] of the stage's dproj rows (TMA zeros past M), coef per token
            sPf = cute.make_tensor(sP[None, 0, st * NPB].iterator, cute.make_layout(BM * N))  # the stage's rows
            for j in cutlass.range_constexpr(HC):
                v = Float32(0.0)
                if j0 + j < N:
                    v = sPf[tok * N + j0 + j]
                hl[0, j] = BFloat16(v)
                hl[1, j] = BFloat16(v - hl[0, j].to(Float32))
            # hi at columns j0 .., lo at NP + j0 .. (zeros past N); columns 2*NP .. 63 (NP = 16) are
            # never written: dx reads k < 2*NP only, and dweight's rows from them are never stored
            for q in cutlass.range_constexpr(HC // 8):   # 16-byte stores (8 columns stay contiguous under the swizzle)
                cute.autovec_copy(cute.make_tensor(hl.iterator + q * 8, cute.make_layout(8)),
                                  sHLv[tok, (None, (j0 + q * 8) // 8)])
                cute.autovec_copy(cute.make_tensor(hl.iterator + HC + q * 8, cute.make_layout(8)),
                                  sHLv[tok, (None, (NP + j0 + q * 8) // 8)])
            if ct % 2 == 0 and not DWO:
                rr = sR[tok, 0, 2 * st]
                rms = cute.arch.rcp_approx(rr) - eps   # (approximate reciprocals: no slow-path call)
                cf = -sR[tok, 0, 2 * st + 1] * rr * rr * cute.arch.rcp_approx(kf * rms)
                if rms <= eps * Float32(ZERO_ROW):  # a zero row (reference.ZERO_ROW): 0, NaN for a NaN dr
                    cf = sR[tok, 0, 2 * st + 1] * Float32(0.0)
                sCoef[tok, wc, st] = cf
            if const_expr(ASM):   # once every warp has read the last tile's (the warpgroup's barrier), this one's
                cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
                _agg_tile_store(dlr, sdl, ct)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
            buf = wc * S + st
            # the first wgmma of each accumulation starts from zero by its scale-d flag, not from zeroed
            # registers (their moves land after wgmma.fence in the PTX: undefined by the ISA)
            warpgroup.fence()
            if const_expr(not DWO):
                for kb in cutlass.range_constexpr(2 * NP // 16):   # hi then lo rows of [W; W]
                    mma_dx.set(warpgroup.Field.ACCUMULATE, kb != 0)
                    cute.gemm(mma_dx, acc_dx, tDXa[None, None, kb, wc], tDXb[None, None, kb], acc_dx)
            for kb in cutlass.range_constexpr(BM // 16):
                if const_expr(kb == 0):
                    mma_dw.set(warpgroup.Field.ACCUMULATE, m != g0)   # the CTA's first tile starts from 0
                else:
                    mma_dw.set(warpgroup.Field.ACCUMULATE, True)
                cute.gemm(mma_dw, acc_dw, tDWa[None, None, kb, wc], tDWb[None, None, kb, buf], acc_dw)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            # dx = acc + coef * x, written in place over the x half (bf16; the producer stores it). The
            # wgmma accumulator holds column pairs (c, c+1) at fragment indices (2q, 2q+1), rows t0
            # and t0 + 8 alternating every 2 indices: one 4-byte smem access a pair, 2 coefs a thread; AGG_C:
            # + h_pre * dlayer_in (a pair's two bf16 from their 32-bit word: low half first)
            if const_expr(not DWO):
                sXp = cute.logical_divide(sX[None, None, buf], (cute.make_layout(2), None))
                cf = (sCoef[t0, wc, st], sCoef[t0 + 8, wc, st])
                for q in cutlass.range_constexpr(cute.size(acc_dx) // 2):
                    t_, c_ = cDX[2 * q]
                    pr = sXp[(None, c_ // 2), t_]
                    cute.autovec_copy(pr, xpair)
                    if const_expr(AG > 0):   # hv = h_pre, dv = the pair's two dlayer_in values
                        if const_expr(IL):
                            # pair q is columns 8 (q // 2) + .. (16 a piece: piece half q // 16), row t0 + 8 (q % 2)
                            h = q // 16
                            sLp = cute.logical_divide(sDL[None, None, st * PPS + (2 * wc + h) % PPS],
                                                      (cute.make_layout(2), None))
                            cute.autovec_copy(sLp[(None, (c_ - PIECE * h) // 2), t_], dlpair)
                            hv, dv = hpr[2 * h + q % 2], (dlpair[0].to(Float32), dlpair[1].to(Float32))
                        else:
                            hv, wd = hpr[q % 2], dlr[q]
                            if const_expr(ASM):
                                wd = sdl[t_ * DLW + c_ // 2]
                            elif const_expr(AG % HALF != 0):
                                hv = _agg_hp(hp, m * BM + t_, c0 + c_, M, K, AG)
                                wd = _agg_word(dl, m * BM + t_, c0 + c_, M, K, AG)
                            dv = (CU.bits_f32(wd << 16), CU.bits_f32(wd & Int32(-65536)))
                        for e in cutlass.range_constexpr(2):
                            xpair[e] = BFloat16(acc_dx[2 * q + e] + cf[q % 2] * xpair[e].to(Float32) + hv * dv[e])
                    else:
                        for e in cutlass.range_constexpr(2):
                            xpair[e] = BFloat16(acc_dx[2 * q + e] + cf[q % 2] * xpair[e].to(Float32))
                    cute.autovec_copy(xpair, pr)
                cute.arch.fence_proxy("async.shared", space="cta")
            # the producer warp stores the stage's dx once all 8 consumer warps have released it
            cute.arch.sync_warp()
            pipe.consumer_release(rst)
            rst.advance()
        cute.arch.barrier(barrier_id=3, number_of_threads=32 + 256)   # the producer's stores have read

        # ---- this CTA's dweight partial: rows j (hi) + j + NP (lo) of the [64, HALF] accumulator, summed
        # through shared memory (this warpgroup's x buffers: every stage released, every store has read
        # them; fp32 [64, HALF + 1] fits in S >= 3 of them)
        scr = cute.make_tensor(cute.recast_ptr(sX_raw.iterator + wc * S * (HALF * BM * 2), dtype=Float32),
                               cute.make_layout((64, HALF), stride=(HALF + 1, 1)))
        for i in cutlass.range_constexpr(cute.size(acc_dw)):
            j_, c_ = cDW[i]
            scr[j_, c_] = acc_dw[i]
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
        if kok:
            pd = cute.make_tensor(p_dw, cute.make_layout((GMe, N, K), stride=(N * K, K, 1)))
            for j in cutlass.range_constexpr(N):
                pd[g0, j, kc] = scr[j, ct] + scr[NP + j, ct]
        if const_expr(cfg.FUSE_RED):
            _slice_sums(N, K, p_dw, dw, cnt, sFlag, slot, GMe, kc, kok, tidx == 128)


@cute.jit
def _slice_sums(N: cutlass.Constexpr, K: cutlass.Constexpr, p_dw: cute.Pointer, dw: cute.Pointer, cnt: cute.Pointer,
                flag: cute.Tensor, slot: Int32, GMe: Int32, kc: Int32, kok, first):
    """FUSE_RED, the 256 consumer threads at the end (each has stored its column kc's partial p_dw[g0, :, kc]):
    the last CTA of the slice to count itself done sums the slice's GMe partials in order into dweight [N, K] bf16
    and zeroes the counter again. The classic last-block pattern: stores, a gpu-scope fence, a CTA barrier, one
    acq_rel atomic add; the last CTA's threads fence again before reading the other CTAs' partials."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.barrier(barrier_id=4, number_of_threads=256)
    if first:
        flag[0] = cute.arch.atomic_add(cnt + slot, Int32(1), sem="acq_rel", scope="gpu")
    cute.arch.barrier(barrier_id=4, number_of_threads=256)
    if flag[0] == GMe - 1:
        cute.arch.fence_acq_rel_gpu()
        if kok:
            acc = cute.make_rmem_tensor((N,), Float32)
            acc.fill(0.0)
            for g in cutlass.range(GMe, unroll=1):   # (N loads in flight a row group; .cg: from L2, where the
                # other CTAs' stores are, never from this SM's L1)
                for j in cutlass.range_constexpr(N):
                    acc[j] = acc[j] + cute.arch.load(p_dw + ((Int64(g) * N + j) * K + kc), Float32, cop="cg")
            out = cute.make_tensor(dw, cute.make_layout((N, K), stride=(K, 1)))
            for j in cutlass.range_constexpr(N):
                out[j, kc] = BFloat16(acc[j])
        if first:
            cute.make_tensor(cnt, cute.make_layout(slot + 1))[slot] = Int32(0)


@cute.kernel
def _reduce_kernel(p_dw: cute.Pointer, dw: cute.Pointer, NK: Int32, GMe: Int32):
    """dweight[e .. e+3] (bf16) = sum over g = 0 .. GMe-1 in order of p_dw[g, e .. e+3] (fp32),
    e = 4 * (global thread index); N*K % 4 == 0."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    e = (bidx * 128 + tidx) * 4
    if e < NK:
        src = cute.make_tensor(p_dw, cute.make_layout((4, GMe), stride=(1, NK)))
        acc = cute.make_rmem_tensor((4,), Float32)
        acc.fill(0.0)
        part = cute.make_rmem_tensor((4,), Float32)
        for g in cutlass.range(GMe, unroll=1):
            cute.autovec_copy(cute.domain_offset((e, 0), src)[None, g], part)
            for q in cutlass.range_constexpr(4):
                acc[q] = acc[q] + part[q]
        out = cute.make_rmem_tensor((4,), BFloat16)
        for q in cutlass.range_constexpr(4):
            out[q] = BFloat16(acc[q])
        cute.autovec_copy(out, cute.make_tensor(dw + e, cute.make_layout(4)))


@cute.jit
def _bwd_host(cfg: cutlass.Constexpr, x: cute.Pointer, w: cute.Pointer, dproj: cute.Pointer, dr: cute.Pointer,
              r: cute.Pointer, dx: cute.Pointer, p_dw: cute.Pointer, dl: cute.Pointer, hp: cute.Pointer,
              dw: cute.Pointer, cnt: cute.Pointer, M: Int32, GMe: Int32, eps: Float32, stream: CU.cuda.CUstream):
    K, N, BM = cfg.K, cfg.N, cfg.BM
    mX = cute.make_tensor(x, cute.make_layout((K, M), stride=(1, K)))      # channel-major view
    mDX = cute.make_tensor(dx, cute.make_layout((K, M), stride=(1, K)))
    mP = cute.make_tensor(dproj, cute.make_layout((M * N, 1), stride=(1, M * N)))
    mR = cute.make_tensor(r, cute.make_layout((M, 1), stride=(1, M)))
    mDR = cute.make_tensor(dr, cute.make_layout((M, 1), stride=(1, M)))
    sX_l = _layouts(cfg)[0]
    one = cute.slice_(sX_l, (None, None, 0))
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    s2g = cpasync.CopyBulkTensorTileS2GOp()
    if const_expr(cfg._agg_il):   # x, dx [C, M, n] and dlayer_in [C, M] channel-major, in [PIECE, BM] boxes
        C = cfg.AGG_C
        pone = cute.slice_(_piece_layout(cfg, 1), (None, None, 0))
        mX = cute.make_tensor(x, cute.make_layout((C, M, K // C), stride=(1, K, C)))
        mDX = cute.make_tensor(dx, cute.make_layout((C, M, K // C), stride=(1, K, C)))
        tma_x, tX = cpasync.make_tiled_tma_atom(g2s, mX, pone, (PIECE, BM))
        tma_dx, tDX = cpasync.make_tiled_tma_atom(s2g, mDX, pone, (PIECE, BM))
        tma_dl, tDL = cpasync.make_tiled_tma_atom(g2s, cute.make_tensor(dl, cute.make_layout((C, M), stride=(1, C))),
                                                  pone, (PIECE, BM))
    else:
        tma_x, tX = cpasync.make_tiled_tma_atom(g2s, mX, one, (HALF, BM))
        tma_dx, tDX = cpasync.make_tiled_tma_atom(s2g, mDX, one, (HALF, BM))
        tma_dl, tDL = tma_x, tX   # (unused)
    tma_p, tP = cpasync.make_tiled_tma_atom(g2s, mP, cute.make_layout((cfg.PBOX, 1)), (cfg.PBOX, 1))
    tma_r, tR = cpasync.make_tiled_tma_atom(g2s, mR, cute.make_layout((BM, 1)), (BM, 1))
    tma_dr, tDR = cpasync.make_tiled_tma_atom(g2s, mDR, cute.make_layout((BM, 1)), (BM, 1))
    _bwd_kernel(cfg, tma_x, tX, tma_dx, tDX, tma_p, tP, tma_r, tR, tma_dr, tDR, tma_dl, tDL, w, p_dw, dl, hp, dw, cnt,
                M, eps).launch(grid=(cfg.grid_x, GMe, 1), block=(THREADS, 1, 1), stream=stream, min_blocks_per_mp=1,
        preferred_smem_carveout=100)


@cute.jit
def _reduce_host(cfg: cutlass.Constexpr, p_dw: cute.Pointer, dw: cute.Pointer, GMe: Int32,
                 stream: CU.cuda.CUstream):
    NK = cfg.N * cfg.K
    _reduce_kernel(p_dw, dw, Int32(NK), GMe).launch(grid=((NK // 4 + 127) // 128, 1, 1), block=(128, 1, 1),
                                                    stream=stream)


# ------------------------------------------------------------------ Python entry points


@functools.lru_cache(maxsize=256)
def bwd_launch(cfg: ProjRmsBwdCuteCfg) -> CU.Launch:
    """run args (x, weight, dproj, dr, r, dx, p_dw [GMe, N, K] fp32, dlayer_in [M, AGG_C] bf16, h_pre^T [n, M]
    fp32, dweight [N, K] bf16, counters [>= grid x] int32 (zero), M, GMe, eps); dlayer_in and h_pre^T are read only
    with AGG_C, dweight and the counters only with FUSE_RED (stand-ins of their dtypes otherwise)."""
    bf, f32 = CU.Ptr(torch.bfloat16, 16), CU.Ptr(torch.float32, 16)
    sig = (bf, bf, f32, f32, f32, bf, f32, bf, CU.Ptr(torch.float32, 4), CU.Ptr(torch.bfloat16, 8),
           CU.Ptr(torch.int32, 4), CU.Scalar(Int32), CU.Scalar(Int32), CU.Scalar(Float32))
    return CU.Launch(f"{_NAME}.bwd", _bwd_host, cfg, sig)


@functools.lru_cache(maxsize=256)
def reduce_launch(cfg: ProjRmsBwdCuteCfg) -> CU.Launch:
    """run args (p_dw [GMe, N, K] fp32, dweight [N, K] bf16, GMe)."""
    return CU.Launch(f"{_NAME}.reduce", _reduce_host, cfg,
                     (CU.Ptr(torch.float32, 16), CU.Ptr(torch.bfloat16, 8), CU.Scalar(Int32)))


@kernel("mhc_proj_rms", "cute", "bwd")
def bwd_into(dproj, dr, x, weight, r, dx, dweight, eps: float, cfg: ProjRmsBwdCuteCfg | None = None) -> None:
    """dx [M, K] bf16 and dweight [N, K] bf16 of proj_rms, destination-passing (the registry's bwd
    signature); contiguous tensors (a view whose address is not 16-byte aligned goes through an
    aligned copy)."""
    M, K = x.shape
    N = weight.shape[0]
    if M == 0:
        dweight.zero_()
        return
    cfg = cfg or ProjRmsBwdCuteCfg.heuristic(N, K)
    x, dproj, dr, r = aligned16(x), aligned16(dproj), aligned16(dr), aligned16(r)   # TMA sources
    dst = dx if dx.data_ptr() % 16 == 0 else torch.empty_like(dx)
    _run_bwd(cfg, x, weight, dproj, dr, r, dst, x, dproj, dweight, float(eps))
    if dst is not dx:
        dx.copy_(dst)


def row_major(dweight: torch.Tensor) -> torch.Tensor:
    """dweight, or a row-major stand-in (copied into it after) where it is not contiguous or 8-byte aligned: the
    dweight reductions write [N, K] rows (a permuted view's strides would scramble them). Also mhc_post_pre's."""
    if dweight.is_contiguous() and dweight.data_ptr() % 8 == 0:
        return dweight
    return torch.empty(dweight.shape, dtype=dweight.dtype, device=dweight.device)


def _run_bwd(cfg: ProjRmsBwdCuteCfg, x, weight, dproj, dr, r, dst, dl, hp, dweight, eps: float) -> None:
    """The backward kernel on prepared operands (x [M, K] and the TMA sources 16-byte aligned, dst [M, K] aligned
    or DW_ONLY's stand-in; dl / hp the aggregate term's or stand-ins), then its dweight reduction: the partials
    [row groups, N, K] fp32, summed in order into dweight (through a scratch where dweight is not contiguous and
    8-byte aligned). The one launch sequence of bwd_into, bwd_agg_into and dweight_into. FUSE_RED: the kernel sums
    them itself, with one zeroed counter a slice (a per-stream workspace the kernel leaves zero)."""
    M, K = x.shape
    dw = row_major(dweight)
    gme = min(cfg.GM, -(-M // cfg.BM))
    if gme * cfg.N * K >= 2**31:   # the spec's 7 * N * K < 2**31 for the heuristic's GM = 7
        raise ValueError(f"{_NAME}: dweight partials [{gme}, {cfg.N}, {K}] reach 2**31 elements (int32 offsets)")
    p_dw = torch.empty((gme, cfg.N, K), dtype=torch.float32, device=x.device)
    if cfg.FUSE_RED:
        cnt = workspace("mhc_proj_rms.cute.slices", (cfg.grid_x,), torch.int32, x.device, zero=True)
        bwd_launch(cfg).run(x, weight, dproj, dr, r, dst, p_dw, dl, hp, dw, cnt, M, gme, eps)
    else:
        bwd_launch(cfg).run(x, weight, dproj, dr, r, dst, p_dw, dl, hp, dw, p_dw, M, gme, eps)
        reduce_launch(cfg).run(p_dw, dw, gme)
    if dw is not dweight:
        dweight.copy_(dw)


@functools.lru_cache(maxsize=256)
def _agg_cfg(N: int, n: int, C: int) -> ProjRmsBwdCuteCfg:
    """The heuristic config with the aggregate term (built once a shape: bwd_agg_into runs on every backward)."""
    return dataclasses.replace(ProjRmsBwdCuteCfg.heuristic(N, n * C), AGG_C=C)


def bwd_agg_into(dproj, dr, x, weight, r, dlayer_in, hpre_t, dx, dweight, eps: float,
                 cfg: ProjRmsBwdCuteCfg | None = None) -> None:
    """mhc_pre's dx pass: dx [T, n, C] bf16 = proj_rms's dx of x seen as [T, n C] + h_pre[t, i] * dlayer_in[t, c],
    and dweight [N, n C] bf16, in one read of x and of dlayer_in (the AGG_C kernel: with AGG_IL a CTA's dlayer_in
    tile serves all n streams; otherwise each stream slice loads it, mostly from L2). x [T, n, C] bf16, dlayer_in
    [T, C] bf16, hpre_t [n, T] fp32 (the mix's h_pre^T), dproj [T, N] / dr [T] / r [T] fp32; contiguous."""
    T, n, C = x.shape
    N = weight.shape[0]
    if T == 0:
        dweight.zero_()
        return
    cfg = cfg or _agg_cfg(N, n, C)
    if cfg.AGG_C != C or cfg.K != n * C or cfg.N != N:
        raise ValueError(f"mhc_proj_rms cute: config {cfg} for x of shape {tuple(x.shape)}")
    xs, dproj, dr, r = aligned16(x.contiguous().view(T, n * C)), aligned16(dproj), aligned16(dr), aligned16(r)
    dl, hp = aligned16(dlayer_in.contiguous()), hpre_t.contiguous()
    dst = dx.view(T, n * C) if dx.is_contiguous() and dx.data_ptr() % 16 == 0 else torch.empty_like(xs)
    _run_bwd(cfg, xs, weight, dproj, dr, r, dst, dl, hp, dweight, float(eps))
    if dst.data_ptr() != dx.data_ptr():
        dx.copy_(dst.view(dx.shape))


def dweight_into(dproj, x, dweight, cfg: ProjRmsBwdCuteCfg | None = None) -> None:
    """dweight [N, K] bf16 = dproj^T @ x alone (the DW_ONLY kernel: x read once, nothing else written), for
    callers that form dx elsewhere (cute_post_pre: mhc_pre's dweight from the saved out). dproj [M, N] fp32,
    x [M, K] bf16, contiguous."""
    M, K = x.shape
    N = dproj.shape[1]
    if M == 0:
        dweight.zero_()
        return
    cfg = dataclasses.replace(cfg or ProjRmsBwdCuteCfg.heuristic(N, K), DW_ONLY=True)
    x, dproj = aligned16(x), aligned16(dproj)
    # (the weight, r, dr, dx, dlayer_in and h_pre arguments are never read or written by DW_ONLY: stand-ins of the
    # right dtypes)
    _run_bwd(cfg, x, x, dproj, dproj, dproj, x, x, dproj, dweight, 0.0)


@kernel("mhc_proj_rms", "cute", "fwd")
def fwd_into(x, weight, proj, r, eps: float) -> None:
    """proj [M, N] fp32 and r [M] fp32 (the registry's fwd signature, inputs validated by the spec):
    cute_proj_rms_fwd's launch on 16-byte aligned operands."""
    _fwd.fwd_run(aligned16(x), aligned16(weight), proj, r, eps)


def representative_launches(N: int = 24, K: int = 28672) -> dict[str, CU.Launch]:
    """The backward's launches at one static shape (what the CPU compile test exports)."""
    cfg = ProjRmsBwdCuteCfg.heuristic(N, K)
    out = {"bwd": bwd_launch(cfg), "reduce": reduce_launch(cfg),
           "dweight": bwd_launch(dataclasses.replace(cfg, DW_ONLY=True))}
    n = next((n for n in range(1, 9) if n * n + 2 * n == N), 0)
    if n and K % (2 * n) == 0:   # mhc_pre's shapes: the aggregate term (C = K / n)
        out["bwd_agg"] = bwd_launch(dataclasses.replace(cfg, AGG_C=K // n))
    return out
