"""CuTe DSL MXFP8 grouped GEMM for Hopper (sm_90a), design (b): fp8 wgmma per 32-wide K block,
promoted into fp32 with the two blocks' E8M0 scales. A probe (issue 11): not wired into the
registry; ``benchmarks/moe_fp8_probe.py`` measures it beside design (a) (cute_grouped_gemm.py).

Forward layout only: ``y [M, N] = per group g (rows offsets[g]:offsets[g+1]) MX(x) . MX(W[g])^T``
with x ``[M, K]`` e4m3 (rowwise scales ``[M, K/32]`` uint8), W ``[G, N, K]`` e4m3 (scales
``[G, N, K/32]``), fp32 accumulation, bf16 (or fp32) out ``[M, N]``; all contiguous row-major.

Design:

* CTA = 2 warpgroups (256 threads), output tile ``128 x tile_n`` (tile_n 64 / 128), k-tile 128
  (four 32-blocks: one 128-byte swizzle row of e4m3). Each warpgroup owns 64 rows.
* Operands stay e4m3 in shared memory: ``stages`` 128B-swizzled k-major buffers filled by
  ``cp.async`` 16-byte copies issued by all threads (predicated by the group's rows / the
  weight's N), ``stages - 1`` k-tiles in flight; one CTA barrier per k-tile. (No TMA /
  producer warp: the per-thread copies predicate ragged rows exactly and keep the probe small;
  the copy issue is ~8 instructions per thread per k-tile.)
* Per 32-block kb: one ``wgmma m64 n{tile_n} k32`` e4m3 x e4m3 -> fp32 into a temporary
  accumulator with scale-d = 0 (no zeroing), then ``acc += tmp * (sa[row, kb] * sb[col, kb])``
  (an FMUL for the power-of-two product and an FFMA per element). ``tmp_bufs = 2`` ping-pongs
  two temporaries so the wgmma of block kb + 1 runs on the tensor cores while the CUDA cores
  promote block kb (``wait_group(1)``); ``tmp_bufs = 1`` serializes inside a warpgroup (the
  other warpgroup still overlaps). ``carry=True`` moves the last block's promotion into the
  next k-tile, after that k-tile's first wgmma is issued (the tensor cores see no bubble at the
  k-tile boundary and its barrier; copies run ``stages - 2`` k-tiles ahead, three scale tables).
  ptxas serializes that variant (SASS: ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after every QGMMA; a
  wgmma in flight across the loop back-edge, the barrier and the copy branches), so it is not
  faster; the default keeps its pipeline inside one k-tile (3 waits ``0x1``, one ``0x0``).
* Measurement-only modes (wrong results on purpose, never a default; the probe uses them to
  split the cost): ``p128`` promotes once per 128 with the k-tile's first block's scales
  (DeepGEMM's granularity), ``col_only`` promotes per 32 with one FFMA per element (the column
  scale alone: what a free scale product would leave), ``acc_only`` accumulates in the wgmma
  and ignores the scales (the pipeline without promotion).
* Scales: each thread loads one 4-byte word (the four k-blocks of one row of A or B) of the
  next k-tile from global memory, decodes it to four fp32 powers of two (``e << 23``; e = 0:
  2^-127 = 0x00400000; e = 255: NaN, so a 0xFF block makes its outputs NaN whatever its data)
  and stores them in a double-buffered fp32 table in shared memory; B's table is stored in the
  order a thread reads its accumulator columns (``8 j + 2 t + p`` -> ``t * (tile_n/4 + 4) + 2 j + p``,
  padded: one broadcast-free 16-byte read per 4 columns, no bank conflicts).
* Exactness: e4m3 x e4m3 products and their k32 sums are exact in the wgmma's fp32 (up to its
  accumulation order), the scale product is an exact power of two unless it leaves fp32's range
  (|e_a + e_b - 254| > 126: flushed / Inf, beyond any practical data), so the result equals the
  float64 reference of the dequantized operands up to fp32 summation order.
* Tile scheduler: ``cute_gemm_sched.schedule`` (the device group search of design (a), no host
  sync, grid from host-known M, N, K, G only: graph-capturable).
* Epilogue: accumulators -> output dtype, 2-element stores straight from registers, masked by
  the group's rows and N.

Measured (H200, benchmarks/moe_fp8_probe.py): 317-361 TFLOP/s at the issue's shapes, below
design (a) (403-430) and torch's bf16 grouped GEMM (678-743). The promotion is issue-bound:
an FMUL + FFMA per accumulator element per 32-block is 2 instructions per 64 flops, i.e.
1024 flops per warp instruction, a ceiling of ~1070 TFLOP/s at 4 warp-instructions per SM
clock even with every other instruction free and the tensor cores fully overlapped.

Constraints (of this probe; the entry does not check them): K % 128 == 0, N % 32 == 0,
16-byte aligned bases, offsets int32 / int64 cumulative [G + 1] on the device.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float8E4M3FN, Float32, Int32, Uint32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as C

from . import cute_grouped_gemm as gg
from .cute_gemm_sched import schedule, views

BLOCK = 32            # MX block (elements per scale)
THREADS = 256         # 2 consumer warpgroups
TILE_K = 128          # one 128-byte swizzle row of e4m3: 4 MX blocks
KB = TILE_K // BLOCK  # 32-blocks per k-tile
OUT_DTYPES = (torch.bfloat16, torch.float32)


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class Fp8GemmCfg:
    """Launch config of the design (b) forward grouped GEMM; the compile key with the arg specs.

    ``G, N, K`` are static (weights ``[G, N, K]``); M is a runtime scalar. The field names
    ``tile_m / tile_n / tile_k / raster`` and the properties ``variant / nc / kc`` are what
    ``cute_gemm_sched.schedule`` reads."""

    G: int
    N: int
    K: int
    tile_n: int = 128
    stages: int = 4
    tmp_bufs: int = 2
    raster: int = 8
    ctas_per_sm: int = 1    # launch bound: 2 caps registers at 128 (tile_n = 64)
    # "mx32": the MXFP8 semantics (promotion per 32-block). Measurement-only modes (wrong
    # results, never a default): "p128" promotes once per 128 with the k-tile's first block's
    # scales (DeepGEMM's granularity), "acc_only" accumulates in the wgmma and ignores the scales
    # (the pipeline without promotion): what the promotion costs
    mode: str = "mx32"
    # carry the last 32-block's promotion into the next k-tile (its first wgmma in flight
    # meanwhile): no tensor-core bubble at k-tile boundaries; stages - 2 k-tiles in flight
    carry: bool = False
    tile_m: int = 128
    tile_k: int = TILE_K

    def __post_init__(self):
        # what the kernel is written for: 2 warpgroups of m64 wgmmas, one scale word per thread
        assert self.tile_m == 128 and self.tile_k == TILE_K and self.tile_n in (64, 128), self
        assert self.stages >= 2 and self.tmp_bufs in (1, 2) and self.ctas_per_sm in (1, 2), self
        assert self.mode in ("mx32", "p128", "acc_only", "col_only"), self
        assert not self.carry or (self.stages >= 3 and self.tmp_bufs == 2 and self.mode != "p128"), self
        assert self.G >= 1 and self.N % BLOCK == 0 and self.K % TILE_K == 0, self

    @classmethod
    def heuristic(cls, G: int, N: int, K: int, **overrides) -> "Fp8GemmCfg":
        """From static dims only (never M)."""
        return cls(G=G, N=N, K=K, **overrides)

    variant = "fwd"

    @property
    def nc(self) -> int:
        return self.N

    @property
    def kc(self) -> int:
        return self.K

    @property
    def sb_pitch(self) -> int:
        """Row pitch (floats) of the permuted B-scale table: tile_n / 4 columns + 4 pad."""
        return self.tile_n // 4 + 4

    @property
    def ahead(self) -> int:
        """k-tiles whose copies are in flight while one is computed."""
        return self.stages - 2 if self.carry else self.stages - 1

    @property
    def tables(self) -> int:
        """Scale tables (k-tiles whose scales are live at once)."""
        return 3 if self.carry else 2

    @property
    def scale_floats(self) -> int:
        """fp32 entries of one scale table buffer: KB x (A rows + 4 x B pitch)."""
        return KB * (self.tile_m + 4 * self.sb_pitch)


def sb_slot(c: int, tile_n: int) -> int:
    """Slot of accumulator column ``c`` (= 8 j + 2 t + p) in a B-scale table row (plain Python
    mirror of the kernel's index map; the CPU test checks it is a bijection into the padded
    row)."""
    j, r = divmod(c, 8)
    t, p = divmod(r, 2)
    return t * (tile_n // 4 + 4) + 2 * j + p


# ------------------------------------------------------------------ device helpers


@cute.jit
def _load_scale_words(cfg: cutlass.Constexpr, gAS: cute.Tensor, gBS: cute.Tensor, kt: Int32,
                      m_lim: Int32, n_lim: Int32, nk: Int32, tidx: Int32, rS: cute.Tensor):
    """This thread's scale word(s) of k-tile ``kt``: thread i < tile_m takes A row i, the next
    tile_n threads B rows. Rows outside the group / N and k-tiles past the end read 127s
    (finite, never stored)."""
    BM, BN = cfg.tile_m, cfg.tile_n
    for c in cutlass.range_constexpr((BM + BN + THREADS - 1) // THREADS):
        i = tidx + c * THREADS
        rS[c] = Uint32(0x7F7F7F7F)
        if kt < nk:
            if i < BM:
                if i < m_lim:
                    rS[c] = gAS[i, kt]
            elif i < BM + BN:
                if i - BM < n_lim:
                    rS[c] = gBS[i - BM, kt]


@cute.jit
def _store_scale_words(cfg: cutlass.Constexpr, sSw: cute.Tensor, buf: Int32, tidx: Int32,
                       rS: cute.Tensor):
    """Decode this thread's scale word(s) (4 E8M0 bytes, k-blocks 0..3) to fp32 bit patterns
    and store them in table ``buf``: A row r at ``[kb, r]``, B column c at its permuted slot."""
    BM, BN = cfg.tile_m, cfg.tile_n
    P = cfg.sb_pitch
    for c in cutlass.range_constexpr((BM + BN + THREADS - 1) // THREADS):
        i = tidx + c * THREADS
        if i < BM + BN:
            w = rS[c]
            slot = i
            if i >= BM:
                col = i - BM
                j = col // 8
                r = col - j * 8
                t = r // 2
                slot = BM + t * P + 2 * j + (r - 2 * t)
            for kb in cutlass.range_constexpr(KB):
                e = (w >> (8 * kb)) & Uint32(0xFF)
                bits = cutlass.select_(e == Uint32(0), Uint32(0x00400000), e << 23)
                bits = cutlass.select_(e == Uint32(0xFF), Uint32(0x7FC00000), bits)
                sSw[slot, kb, buf] = bits


@cute.jit
def _promote(cfg: cutlass.Constexpr, acc: cute.Tensor, tmp: cute.Tensor, sS: cute.Tensor,
             buf: Int32, kb: cutlass.Constexpr, row0: Int32, t4: Int32, rSB: cute.Tensor):
    """acc += tmp * (sa[row] * sb[col]) for 32-block ``kb``: this thread's 2 rows (row0,
    row0 + 8) and tile_n / 4 columns (8 j + 2 t4 + p; fragment index p + 2 h + 4 j)."""
    BM, BN = cfg.tile_m, cfg.tile_n
    NCOL = BN // 4
    base = BM + t4 * cfg.sb_pitch
    for q in cutlass.range_constexpr(NCOL):
        rSB[q] = sS[base + q, kb, buf]
    sa0 = sS[row0, kb, buf]
    sa1 = sS[row0 + 8, kb, buf]
    for j in cutlass.range_constexpr(BN // 8):
        for p in cutlass.range_constexpr(2):
            sb = rSB[2 * j + p]
            v0 = p + 4 * j
            v1 = p + 2 + 4 * j
            if const_expr(cfg.mode == "col_only"):
                acc[v0] = tmp[v0] * sb + acc[v0]
                acc[v1] = tmp[v1] * sb + acc[v1]
            else:
                acc[v0] = tmp[v0] * (sa0 * sb) + acc[v0]
                acc[v1] = tmp[v1] * (sa1 * sb) + acc[v1]


# ------------------------------------------------------------------ kernel


@cute.kernel
def _fp8_kernel(cfg: cutlass.Constexpr, mA: cute.Tensor, mAS: cute.Tensor, mB: cute.Tensor,
                mBS: cute.Tensor, mC: cute.Tensor, mOff: cute.Tensor, M: Int32):
    BM, BN, BK, S = cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.stages
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n_tiles = (cfg.nc + BN - 1) // BN

    # ---------------- shared memory: S e4m3 stages per operand (wgmma layouts) + scale tables
    sA_l = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (BM, BN, BK), Float8E4M3FN, S)
    sB_l = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (BM, BN, BK), Float8E4M3FN, S)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(Float8E4M3FN, sA_l.outer, byte_alignment=1024, swizzle=sA_l.inner)
    sB = smem.allocate_tensor(Float8E4M3FN, sB_l.outer, byte_alignment=1024, swizzle=sB_l.inner)
    s_lay = cute.make_layout((BM + 4 * cfg.sb_pitch, KB, cfg.tables))
    sS = smem.allocate_tensor(Float32, s_lay, byte_alignment=16)
    sSw = cute.make_tensor(cute.recast_ptr(sS.iterator, dtype=Uint32), s_lay)

    # ---------------- MMA: 2 warpgroups x (m64, n=BN, k32) e4m3 wgmma, fp32
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        Float8E4M3FN, Float8E4M3FN, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
        LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), Float32, (BM // 64, 1, 1), tiler_mn=(64, BN))
    wg = cute.arch.make_warp_uniform(tidx // 128)
    thr_mma = tiled_mma.get_slice(wg * 128)
    thr_mma_c = tiled_mma.get_slice(tidx)
    tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
    tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
    tCcC = thr_mma_c.partition_C(cute.make_identity_tensor((BM, BN)))
    acc = cute.make_rmem_tensor(tCcC.shape, Float32)
    tmp0 = cute.make_rmem_tensor(tCcC.shape, Float32)
    tmp1 = cute.make_rmem_tensor(tCcC.shape, Float32) if const_expr(cfg.tmp_bufs == 2) else tmp0
    tiled_mma.set(warpgroup.Field.ACCUMULATE, False)   # every wgmma starts its temporary
    lane = tidx % 128
    row0 = wg * 64 + (lane // 32) * 16 + (lane % 32) // 4
    t4 = lane % 4
    rSB = cute.make_rmem_tensor((BN // 4,), Float32)

    # ---------------- cp.async copies: 8 threads x 16 bytes per 128-byte k row, 32 rows per step
    atom_cp = cute.make_copy_atom(cpasync.CopyG2SOp(cute.nvgpu.LoadCacheMode.GLOBAL), Float8E4M3FN,
                                  num_bits_per_copy=128)
    g2s = cute.make_tiled_copy_tv(atom_cp, cute.make_ordered_layout((THREADS // 8, 8), order=(1, 0)),
                                  cute.make_layout((1, 16)))
    thr_cp = g2s.get_slice(tidx)
    tAs = thr_cp.partition_D(sA)
    tBs = thr_cp.partition_D(sB)
    tAc = thr_cp.partition_S(cute.make_identity_tensor((BM, BK)))
    tBc = thr_cp.partition_S(cute.make_identity_tensor((BN, BK)))
    pA = cute.make_rmem_tensor(cute.make_layout((cute.size(tAc, mode=[1]),)), cutlass.Boolean)
    pB = cute.make_rmem_tensor(cute.make_layout((cute.size(tBc, mode=[1]),)), cutlass.Boolean)
    rS = cute.make_rmem_tensor(((BM + BN + THREADS - 1) // THREADS,), Uint32)

    m_tiles = (M + BM - 1) // BM + cfg.G
    g, m0, m_lim, n0, n_lim, _, _, nk = schedule(cfg, mOff, M, bidx, m_tiles)
    if bidx < m_tiles * n_tiles and g < cfg.G:
        gA, gAS, gB, gBS, gC = views(cfg, mA, mAS, mB, mBS, mC, g, m0, n0, Int32(0))
        for i in cutlass.range_constexpr(cute.size(pA)):
            pA[i] = tAc[0, i, 0][0] < m_lim
        for i in cutlass.range_constexpr(cute.size(pB)):
            pB[i] = tBc[0, i, 0][0] < n_lim

        # ---------------- prologue: S - 1 k-tiles in flight, scales of k-tile 0 in table 0
        for s in cutlass.range_constexpr(cfg.ahead):
            if s < nk:
                tAg = thr_cp.partition_S(cute.local_tile(gA, (BM, BK), (0, s)))
                tBg = thr_cp.partition_S(cute.local_tile(gB, (BN, BK), (0, s)))
                for i in cutlass.range_constexpr(cute.size(pA)):
                    if pA[i]:
                        cute.copy(atom_cp, tAg[None, i, 0], tAs[None, i, 0, s])
                for i in cutlass.range_constexpr(cute.size(pB)):
                    if pB[i]:
                        cute.copy(atom_cp, tBg[None, i, 0], tBs[None, i, 0, s])
            cute.arch.cp_async_commit_group()
        _load_scale_words(cfg, gAS, gBS, Int32(0), m_lim, n_lim, nk, tidx, rS)
        _store_scale_words(cfg, sSw, Int32(0), tidx, rS)
        acc.fill(0.0)
        if const_expr(cfg.carry and cfg.mode != "acc_only"):
            # k-tile "-1": its carried promotion adds 0 * 1.0
            tmp1.fill(0.0)
            for c in cutlass.range_constexpr(cute.size(rS)):
                rS[c] = Uint32(0x7F7F7F7F)
            _store_scale_words(cfg, sSw, Int32(2), tidx, rS)

        # ---------------- mainloop: one barrier per k-tile
        for kt in cutlass.range(nk, unroll=1):
            stage = kt % S
            sbuf = kt % cfg.tables
            cute.arch.cp_async_wait_group(cfg.ahead - 1)   # this thread's copies of k-tile kt landed
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()                  # everyone's, and k-tile kt - 1 is consumed
            # refill the stage k-tile kt - 1 (carry: kt - 2) used with k-tile kt + ahead
            kn = kt + cfg.ahead
            if kn < nk:
                sn = kn % S
                tAg = thr_cp.partition_S(cute.local_tile(gA, (BM, BK), (0, kn)))
                tBg = thr_cp.partition_S(cute.local_tile(gB, (BN, BK), (0, kn)))
                for i in cutlass.range_constexpr(cute.size(pA)):
                    if pA[i]:
                        cute.copy(atom_cp, tAg[None, i, 0], tAs[None, i, 0, sn])
                for i in cutlass.range_constexpr(cute.size(pB)):
                    if pB[i]:
                        cute.copy(atom_cp, tBg[None, i, 0], tBs[None, i, 0, sn])
            cute.arch.cp_async_commit_group()
            _load_scale_words(cfg, gAS, gBS, kt + 1, m_lim, n_lim, nk, tidx, rS)
            if const_expr(cfg.mode == "acc_only"):
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(KB):
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb, stage], tCrB[None, None, kb, stage], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1 if const_expr(cfg.carry) else 0)
            if const_expr(cfg.mode == "p128"):
                warpgroup.fence()
                for kb in cutlass.range_constexpr(KB):
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, kb > 0)
                    cute.gemm(tiled_mma, tmp0, tCrA[None, None, kb, stage], tCrB[None, None, kb, stage], tmp0)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                _promote(cfg, acc, tmp0, sS, sbuf, 0, row0, t4, rSB)
            # per 32-block: wgmma into a temporary, promote the previous block meanwhile
            for kb in cutlass.range_constexpr(KB if const_expr(cfg.mode in ("mx32", "col_only") and cfg.carry) else 0):
                tmp = tmp0 if const_expr(kb % 2 == 0) else tmp1
                prev = tmp1 if const_expr(kb % 2 == 0) else tmp0
                warpgroup.fence()
                cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, stage], tCrB[None, None, kb, stage], tmp)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                if const_expr(kb == 0):     # the previous k-tile's last block
                    _promote(cfg, acc, prev, sS, (kt + 2) % 3, KB - 1, row0, t4, rSB)
                else:
                    _promote(cfg, acc, prev, sS, sbuf, kb - 1, row0, t4, rSB)
            for kb in cutlass.range_constexpr(KB if const_expr(cfg.mode in ("mx32", "col_only") and not cfg.carry)
                                              else 0):
                tmp = tmp0 if const_expr(kb % 2 == 0) else tmp1
                warpgroup.fence()
                cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, stage], tCrB[None, None, kb, stage], tmp)
                warpgroup.commit_group()
                if const_expr(cfg.tmp_bufs == 2):
                    if const_expr(kb > 0):
                        warpgroup.wait_group(1)
                        prev = tmp1 if const_expr(kb % 2 == 0) else tmp0
                        _promote(cfg, acc, prev, sS, sbuf, kb - 1, row0, t4, rSB)
                else:
                    warpgroup.wait_group(0)
                    _promote(cfg, acc, tmp0, sS, sbuf, kb, row0, t4, rSB)
            if const_expr(cfg.tmp_bufs == 2 and cfg.mode in ("mx32", "col_only") and not cfg.carry):
                warpgroup.wait_group(0)
                _promote(cfg, acc, tmp1 if const_expr((KB - 1) % 2 == 1) else tmp0, sS, sbuf, KB - 1,
                         row0, t4, rSB)
            # next k-tile's scales into table (kt + 1) % tables (last read at k-tile kt - 1,
            # carry: kt - 2, whose last block was promoted in k-tile kt - 1)
            _store_scale_words(cfg, sSw, (kt + 1) % cfg.tables, tidx, rS)
        cute.arch.cp_async_wait_group(0)
        if const_expr(cfg.carry):
            warpgroup.wait_group(0)
            if const_expr(cfg.mode != "acc_only"):
                _promote(cfg, acc, tmp1, sS, (nk - 1) % 3, KB - 1, row0, t4, rSB)

        # ---------------- epilogue: registers -> global, 2-element vectors, masked
        atom_st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mC.element_type,
                                      num_bits_per_copy=2 * mC.element_type.width)
        d_a = cute.logical_divide(acc, cute.make_layout(2))
        d_c = cute.logical_divide(tCcC, cute.make_layout(2))
        pair = cute.make_rmem_tensor((2,), mC.element_type)
        gg.epilogue_regs(thr_mma_c, d_a, d_c, pair, atom_st, gC, BM, BN, m_lim, n_lim)


# ------------------------------------------------------------------ host function


@cute.jit
def _fp8_host(cfg: cutlass.Constexpr, a: cute.Pointer, a_s: cute.Pointer, b: cute.Pointer,
              b_s: cute.Pointer, offs: cute.Pointer, out: cute.Pointer, M: Int32,
              stream: C.cuda.CUstream):
    G, N, K = cfg.G, cfg.N, cfg.K
    KW = K // TILE_K      # scale words (4 E8M0 bytes) per row
    mA = cute.make_tensor(a, cute.make_layout((M, K), stride=(K, 1)))
    mAS = cute.make_tensor(cute.recast_ptr(a_s, dtype=Uint32), cute.make_layout((M, KW), stride=(KW, 1)))
    mB = cute.make_tensor(b, cute.make_layout((G * N, K), stride=(K, 1)))
    mBS = cute.make_tensor(cute.recast_ptr(b_s, dtype=Uint32), cute.make_layout((G * N, KW), stride=(KW, 1)))
    mC = cute.make_tensor(out, cute.make_layout((M, N), stride=(N, 1)))
    mOff = cute.make_tensor(offs, cute.make_layout(G + 1))
    grid_x = ((M + cfg.tile_m - 1) // cfg.tile_m + G) * ((N + cfg.tile_n - 1) // cfg.tile_n)
    _fp8_kernel(cfg, mA, mAS, mB, mBS, mC, mOff, M).launch(
        grid=(grid_x, 1, 1), block=(THREADS, 1, 1), stream=stream,
        min_blocks_per_mp=cfg.ctas_per_sm, preferred_smem_carveout=100)


# ------------------------------------------------------------------ Python entry points


def smem_bytes(cfg: Fp8GemmCfg) -> int:
    """Shared memory of one CTA (operand stages + the two scale tables)."""
    return cfg.stages * (cfg.tile_m + cfg.tile_n) * TILE_K + cfg.tables * cfg.scale_floats * 4


@functools.lru_cache(maxsize=None)
def gemm_fp8_launch(G: int, N: int, K: int, out_dtype: torch.dtype = torch.bfloat16,
                    offs_dtype: torch.dtype = torch.int64, cfg: Fp8GemmCfg | None = None) -> C.Launch:
    """The launch at static dims (G, N, K) (weights [G, N, K]); M is dynamic."""
    cfg = cfg if cfg is not None else Fp8GemmCfg.heuristic(G, N, K)
    assert (cfg.G, cfg.N, cfg.K) == (G, N, K) and out_dtype in OUT_DTYPES, (cfg, out_dtype)
    f8, u8 = C.Ptr(torch.float8_e4m3fn), C.Ptr(torch.uint8)
    sig = (f8, u8, f8, u8, C.Ptr(offs_dtype, align=offs_dtype.itemsize), C.Ptr(out_dtype),
           C.Scalar(Int32))
    return C.Launch("moe.cute_gemm_fp8.fwd", _fp8_host, cfg, sig)


def gemm_fp8_fwd_into(a_data, a_scales, b_data, b_scales, offsets, out, cfg: Fp8GemmCfg | None = None) -> None:
    """out [M, N] = per group g (rows offsets[g]:offsets[g+1]) MX(a) . MX(b[g])^T (design (b)).

    a_data [M, K] e4m3 (or its uint8 view), a_scales [M, K/32] uint8 (rowwise); b_data
    [G, N, K] e4m3, b_scales [G, N, K/32] uint8; offsets [G+1] int32/int64 on the device;
    out bf16/fp32 [M, N]. K % 128 == 0, N % 32 == 0, all contiguous."""
    M, K = a_data.shape
    G, N, _ = b_data.shape
    gemm_fp8_launch(G, N, K, out.dtype, offsets.dtype, cfg).run(
        a_data, a_scales, b_data, b_scales, offsets, out, M)
