"""CuTe DSL forward pass of mhc_post_pre that keeps a row tile's new streams on chip (Hopper sm_90a): out, mhc_pre's
projection partials and layer_in in one pass, so the aggregate's second read of out goes away (``cute_post_pre.
RESIDENT``; issue 15).

Why: the fused forward (cute_post_pre_fwd) writes out and the projection's partials, then the epilogue forms h_pre
and cuTile's aggregate reads out again for layer_in: 9 + 5 units of [T, C] bf16 moved (H200, T=32768, n=4, C=7168:
~1111 + ~530 us). layer_in needs h_pre, h_pre needs the whole row's projection, so layer_in cannot be formed while
out streams past. Here a cluster of CL CTAs holds a 16-token row tile's out in shared memory (CTA r its 64-channel
chunks r, r + CL, ..: 14 chunks x n streams x [16 tok, 64 ch] = 112 KiB at C = 7168, n = 4, CL = 8), exchanges the
row's sums and forms layer_in from shared memory: 10 units instead of 14 (session 39's probe of the pattern, since
retired: `git show 9a892f6:benchmarks/probes/post_pre_fwd_resident.py`; times in the mHC ledger).

Measured (H200, T=32768, n=4, C=7168, bf16, fp32 h, bias; session 40, the mHC ledger): correct, but slower than the
two passes it replaces, so RESIDENT is off: this pass 2048-2065 us against 1661 (fused pass 1123 + aggregate 538) in
the same run; mhc_post_pre fwd+bwd 4.77-4.88 ms against 4.38-4.60. benchmarks/probes/post_pre_res_cut.py's CUT
rows put the cost in the per-tile exchange (the cluster's lock step and the remote sums: 1707 us without it) and
in the out math (1915 with every stream formed as stream 0: the session-39 probe's 1377 us had let the compiler
hoist it, n times fewer FMAs, checked in its PTX); both off 1529, still above what the strict 20% needs (~1490).

Per token t, stream i, channel c (fp32, rounded once):

    out[t,i,c]    = h_post[t,i] (x[t,c] + bias[c]) + sum_j h_res[t,i,j] residual[t,j,c]          (bf16, stored)
    p_proj[r,t,:] = sum over (i, c of rank r) of out[t,i,c] weight[:, i*C + c]   (fp32, of the rounded out, Kahan
    p_ss[r,t]     = sum over (i, c of rank r) of out[t,i,c]^2                     per chunk)
    proj_pre, ss  = sum over r = 0 .. CL-1, in order, of the ranks' p_proj[r, t, :n], p_ss[r, t]
    h_pre[t,i]    = sigmoid(proj_pre[i] / (sqrt(ss / (n C)) + rms_eps) * alpha_pre + hbias[i])
    layer_in[t,c] = sum_i h_pre[t,i] out[t,i,c]                                                  (bf16)

p_proj [CL, T, NPAD] (NPAD = N rounded up to 4; columns N.. written 0) and p_ss [CL, T] are the planes cute_pp_mix
then sums in the same order into proj, r, h_post and h_res (its h_pre equals the one used here: same sums, same
formula).

Roles (384 threads, one CTA an SM; persistent: the grid's clusters walk the row tiles m = cluster, + clusters, ..):
* warp 0 (producer): per (tile, chunk) TMA loads of the n residual tiles and x ([64 ch, 16 tok], channels
  contiguous, SW128), the weight's n boxes [24 rows, 64 ch] (the rows of wgmma A tiles stacked 3 KiB apart: rows
  24..63 of an A tile read the next box, their products land in accumulator rows never stored) and the bias's
  [64] into a STAGES-deep ring running ahead across tiles.
* warpgroups 1, 2 (out): thread t forms all n streams of 4 channels (8-byte accesses) of token (t % 128) // 8 from
  the stage into the tile's out buffer, its squares summed; the chunk's out tiles leave by TMA at once; warpgroup wc
  then runs the projection's wgmmas m64 n16 (A the weight, B the out buffer's tiles) of its streams wc, wc + 2 and
  Kahan-adds them; the stage is released. (Session 40 measured a ping-pong variant, each warpgroup a chunk in turn:
  the same time; removed after review found it skipped ring phases: a warpgroup waiting on a stage two rounds on.)
  After the tile's last chunk: the partials to p_proj / p_ss and (pre columns and squares) to a small exchange
  buffer (two, by tile parity), a cluster-scope release arrive on each peer's mbarrier, the wait for the peers'
  arrives and an acquire fence; then 16 (n + 1) threads each sum one field of one token over the CL ranks' buffers
  (ld.shared::cluster, in rank order) into sH, and every thread forms its token's h_pre and layer_in (over stream
  0's slots of the buffer, once the out stores have read them), stored by TMA. The token's h of the next tile are
  loaded before the exchange (their latency behind it).

Constraints: 1 <= n <= 4 (N = n*n + 2n <= 24), C % 8 == 0 and at least CL chunks of 64 channels, bf16 streams /
bias / weight, fp32 h (bf16 h staged first), the out buffer and a ring of >= 3 stages within 227 KiB of shared
memory (``PostPreResCuteCfg.heuristic`` returns None otherwise: the op runs the two-pass forward). Compile key:
PostPreResCuteCfg; T is a runtime scalar, the grid from the device's active-cluster count.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, const_expr
from cutlass._mlir.dialects.nvvm import MemScopeKind
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as CU

from .cute_post_pre_bwd import bias_ring
from .cute_post_pre_fwd import load_h, stream_wgmmas
from .cute_proj_rms import _smem_tensor
from .cute_proj_rms_fwd import _kahan

_NAME = "mhc.cute_post_pre_res"
THREADS = 384
PRODUCER_REGS, CONSUMER_REGS = 40, 232
BMT = 16          # tokens a row tile (the projection's wgmma N)
CC = 64           # channels a chunk
TE = CC * BMT     # elements a tile
VT = TE // 8      # 16-byte vectors a tile
WROWS = 24        # the weight rows a box loads (N <= 24)
SMEM_LIMIT = 227 * 1024
CL_DEFAULT = 8
BAR_CONS = 1      # named barrier of the 256 out threads


@dataclasses.dataclass(frozen=True)
class PostPreResCuteCfg:
    """Launch config = compile key (with the dtypes). n, C, N static; CL: CTAs a cluster (each takes every CL-th
    chunk of a row tile); STAGES: the load ring; HAS_BIAS."""

    n: int
    C: int
    N: int
    CL: int = CL_DEFAULT
    STAGES: int = 5
    HAS_BIAS: bool = True
    CUT: int = 0   # probe only, wrong results (the op refuses it): bit 1 no exchange (no lock, own partials),
    #                bit 2 the out math hoisted (every stream formed as stream 0: n times fewer FMAs)
    def __post_init__(self):
        if not (1 <= self.n <= 4 and self.N == self.n * self.n + 2 * self.n and self.C % 8 == 0 and self.C > 0
                and 2 <= self.CL <= 8 and self.nch >= self.CL and self.STAGES >= 2):
            raise ValueError(f"mhc_post_pre cute resident fwd: config {self}: needs 1 <= n <= 4, N = n*n + 2n, "
                             f"C % 8 == 0, 2 <= CL <= 8 with at least CL chunks of {CC} channels, STAGES >= 2")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"mhc_post_pre cute resident fwd: config {self} needs {self.smem_bytes} bytes of "
                             f"shared memory (> {SMEM_LIMIT})")

    @property
    def nch(self) -> int:
        return -(-self.C // CC)

    @property
    def nk(self) -> int:
        """Chunks of the CTA with the most (rank 0): the out buffer's depth."""
        return -(-self.nch // self.CL)

    @property
    def NPAD(self) -> int:
        """p_proj's row length (cute_pp_mix reads 16-byte pieces)."""
        return -(-self.N // 4) * 4

    @property
    def w_bytes(self) -> int:
        """Weight bytes a stage: n boxes [24 rows, 64 ch]."""
        return self.n * WROWS * CC * 2

    @property
    def stage_bytes(self) -> int:
        """TMA bytes a stage: the n residual tiles, x, the weight boxes, the bias."""
        return (self.n + 1) * TE * 2 + self.w_bytes + (CC * 2 if self.HAS_BIAS else 0)

    @property
    def out_bytes(self) -> int:
        return self.nk * self.n * TE * 2

    @property
    def smem_bytes(self) -> int:
        """Ring, weight boxes, out buffer (at least 5 KiB: the last A tile reads 5 KiB past the boxes), bias ring,
        wg 1's sums, squares, the exchange buffers and the row's sums, barriers, and 1 KiB for alignment."""
        small = (self.STAGES * 128 if self.HAS_BIAS else 0) + WROWS * BMT * 4 + 2 * BMT * 4 + 3 * BMT * 8 * 4 + \
            (2 * self.STAGES + 2) * 8
        return ((self.n + 1) * TE * 2 + self.w_bytes) * self.STAGES + max(self.out_bytes, 5120) + small + 1024

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, n: int, C: int, N: int, has_bias: bool) -> "PostPreResCuteCfg | None":
        """CL 8 and the most stages (<= 5, >= 3) that fit; None where none does or C has fewer than 8 chunks (the
        two-pass forward runs). H200, T=32768, n=4, C=7168: the probe's pattern 1377 us at 5 stages, 1459 at 4."""
        if not (1 <= n <= 4 and N == n * n + 2 * n and C % 8 == 0 and -(-C // CC) >= CL_DEFAULT):
            return None
        for st in (5, 4, 3):
            try:
                return cls(n=n, C=C, N=N, STAGES=st, HAS_BIAS=has_bias)
            except ValueError:   # more shared memory than an SM has
                continue
        return None


def _tile_layout(count: int):
    """Residual / x / out / layer_in tiles [64 ch, 16 tok], channels contiguous (SW128: a token's 128 bytes a row,
    16-byte piece p of row r holding channels 8 (p ^ (r % 8)) ..), ``count`` of them."""
    return sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (CC, BMT, BMT), BFloat16, count)


def _a_one():
    """One wgmma A tile [64 rows, 64 ch] K-major (SW128), its stage mode dropped."""
    return cute.slice_(sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, BMT, CC), BFloat16, 1),
                       (None, None, 0))


def _w_box():
    """The TMA box of a weight load: an A tile's first 24 rows (the boxes sit 3 KiB = 1536 elements apart)."""
    return cute.make_composed_layout(_a_one().inner, 0, cute.make_layout(((8, 3), CC), stride=((CC, 512), 1)))


def cluster_walk(nch: int, CL: int, bmt: int, T: Int32):
    """(called while a kernel is traced) This CTA's place in a persistent grid of CL-CTA clusters walking the row tiles
    of bmt tokens: (rank in the cluster, cluster index, clusters, its tiles m = cluster, + clusters, .., its 64-channel
    chunks rank, rank + CL, .. of nch)."""
    bid, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    rank, cid, ncl = bid % CL, bid // CL, gdim // CL
    ntile = ((T + bmt - 1) // bmt - cid + ncl - 1) // ncl
    return rank, cid, ncl, ntile, (nch - rank + CL - 1) // CL


@cute.jit
def _xlock(bars: cute.Pointer, j: Int32, rank: Int32, size: cutlass.Constexpr) -> None:
    """Tile j's exchange (one warp, every lane): lane 0 arrives on each peer's lock barrier j % 2 with cluster-scope
    release semantics (cumulative: the CTA's exchange buffer, written by other threads before the caller's barrier);
    the warp waits for the peers' arrivals, then fences (cluster acquire) before anyone (after the caller's next
    barrier) reads a peer's buffer. The caller picks a warp with no global stores in flight (the fence would wait
    for them). Barrier j % 2: a peer's arrival for tile j + 2 needs this CTA's for j + 1."""
    if cute.arch.lane_idx() == 0:
        for q in cutlass.range_constexpr(1, size):
            cute.arch.mbarrier_arrive(bars + (j % 2), (rank + q) % size, scope=MemScopeKind.CLUSTER)
    cute.arch.mbarrier_wait(bars + (j % 2), (j // 2) % 2)
    cute.arch.fence_acq_rel_cluster()


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_res: cute.CopyAtom, mRes: cute.Tensor, tma_x: cute.CopyAtom,
            mX: cute.Tensor, tma_out: cute.CopyAtom, mOut: cute.Tensor, tma_li: cute.CopyAtom, mLI: cute.Tensor,
            tma_w: cute.CopyAtom, mW: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, hres: cute.Pointer,
            hpost: cute.Pointer, hbias: cute.Pointer, p_proj: cute.Pointer, p_ss: cute.Pointer, T: Int32,
            rms_eps: Float32, a_pre: Float32):
    n, N, S, CL, NPAD = cfg.n, cfg.N, cfg.STAGES, cfg.CL, cfg.NPAD
    KT = n + 1   # ring tiles a stage: the n residual tiles, then x
    tidx, _, _ = cute.arch.thread_idx()
    rank, cid, ncl, ntile, nk = cluster_walk(cfg.nch, CL, BMT, T)
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    if warp == 0:
        CU.prefetch_tma(tma_res, tma_x, tma_out, tma_li, tma_w)
        if const_expr(cfg.HAS_BIAS):
            CU.prefetch_tma(tma_b)
    smem = cutlass.memory.SmemAllocator()
    ring_raw, sRing = _smem_tensor(smem, _tile_layout(KT * S))
    # the weight boxes before the out buffer: the last A tile's rows 24..63 read 5 KiB past them
    w_raw = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(S * cfg.w_bytes), byte_alignment=1024)
    sW = cute.make_tensor(cute.recast_ptr(w_raw.iterator, _a_one().inner, dtype=BFloat16),
                          cute.make_layout(((8, 3), CC, n * S), stride=((CC, 512), 1, WROWS * CC)))
    out_raw, sOutT = _smem_tensor(smem, _tile_layout(n * cfg.nk))
    if const_expr(cfg.out_bytes < 5120):
        smem.allocate_tensor(cutlass.Uint8, cute.make_layout(5120 - cfg.out_bytes), byte_alignment=128)
    sB = bias_ring(smem, CC, S) if const_expr(cfg.HAS_BIAS) else None
    sP = smem.allocate_tensor(Float32, cute.make_layout((WROWS, BMT), stride=(BMT, 1)), 16)    # wg 1's sums
    sSS = smem.allocate_tensor(Float32, cute.make_layout((2, BMT), stride=(BMT, 1)), 16)       # squares a half
    sX = smem.allocate_tensor(Float32, cute.make_layout((2, BMT, 8), stride=(BMT * 8, 8, 1)), 16)   # exchange
    sH = smem.allocate_tensor(Float32, cute.make_layout((BMT, 8), stride=(8, 1)), 16)   # the row's sums
    pipe = CU.tma_pipeline(smem, S, cfg.stage_bytes, 8)
    bars = CU.cluster_lock(smem, CL)   # the exchange's lock, by tile parity
    tRs, tRg = CU.tma_tiles(tma_res, sRing, mRes, (CC, BMT))
    _, tXg = CU.tma_tiles(tma_x, sRing, mX, (CC, BMT))
    tOs, tOg = CU.tma_tiles(tma_out, sOutT, mOut, (CC, BMT))
    _, tLg = CU.tma_tiles(tma_li, sOutT, mLI, (CC, BMT))
    ring = cute.make_tensor(cute.recast_ptr(ring_raw.iterator, dtype=BFloat16), cute.make_layout(KT * S * TE))
    outb = cute.make_tensor(cute.recast_ptr(out_raw.iterator, dtype=BFloat16), cute.make_layout(n * cfg.nk * TE))

    if wg == 0:
        cute.arch.setmaxregister_decrease(PRODUCER_REGS)
        if warp == 0:
            tWs, tWg = CU.tma_tiles(tma_w, sW, mW, (WROWS, CC))
            tBs = tBg = None
            if const_expr(cfg.HAS_BIAS):
                tBs, tBg = CU.tma_tiles(tma_b, sB, mB, (CC, 1), (None, 0))
            pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, S)
            for it in cutlass.range(ntile * nk, unroll=1):
                j = it // nk
                m = cid + j * ncl
                ch = rank + (it - j * nk) * CL
                pipe.producer_acquire(pst)
                bar = pipe.producer_get_barrier(pst)
                for i in cutlass.range_constexpr(n):
                    cute.copy(tma_res, tRg[None, ch, m, i], tRs[None, pst.index * KT + i], tma_bar_ptr=bar)
                cute.copy(tma_x, tXg[None, ch, m], tRs[None, pst.index * KT + n], tma_bar_ptr=bar)
                for i in cutlass.range_constexpr(n):
                    cute.copy(tma_w, tWg[None, 0, ch, i], tWs[None, pst.index * n + i], tma_bar_ptr=bar)
                if const_expr(cfg.HAS_BIAS):
                    cute.copy(tma_b, tBg[None, ch], tBs[None, pst.index], tma_bar_ptr=bar)
                pipe.producer_commit(pst)
                pst.advance()
            pipe.producer_tail(pst)
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS)
        t = tidx - 128
        wc = wg - 1
        ct_ = tidx - 128 * wg
        sync = functools.partial(cute.arch.barrier, barrier_id=BAR_CONS, number_of_threads=256)
        tok = (t % VT) // 8                 # this thread's token in the tile (16-byte piece t % VT of every tile)
        e = (t % VT) * 8 + (t // VT) * 4    # its 4 channels' element offset in every tile (half t // VT of the piece)
        lc = ((t % 8) ^ (tok % 8)) * 8 + (t // VT) * 4   # their first channel in the chunk (the SW128 swizzle)
        gHr = cute.make_tensor(hres, cute.make_layout((T, n, n), stride=(n * n, n, 1)))
        gHp = cute.make_tensor(hpost, cute.make_layout((T, n), stride=(n, 1)))
        gP = cute.make_tensor(p_proj, cute.make_layout((CL, T, NPAD), stride=(T * NPAD, NPAD, 1)))
        gS = cute.make_tensor(p_ss, cute.make_layout((CL, T), stride=(T, 1)))
        hr = cute.make_rmem_tensor(cute.make_layout(n * n), Float32)
        hp = cute.make_rmem_tensor(cute.make_layout(n), Float32)
        hrn = cute.make_rmem_tensor(cute.make_layout(n * n), Float32)
        hpn = cute.make_rmem_tensor(cute.make_layout(n), Float32)
        hb = cute.make_rmem_tensor(cute.make_layout(n), Float32)
        for i in cutlass.range_constexpr(n):
            hb[i] = cute.arch.load(hbias + i, Float32)
        load_h(hr, hp, gHr, gHp, cid * BMT + tok, T, n)
        rv = cute.make_rmem_tensor(cute.make_layout((n, 4), stride=(4, 1)), BFloat16)
        xv = cute.make_rmem_tensor(cute.make_layout(4), BFloat16)
        bv = cute.make_rmem_tensor(cute.make_layout(4), BFloat16)
        ov = cute.make_rmem_tensor(cute.make_layout(4), BFloat16)
        v8 = cute.make_rmem_tensor(cute.make_layout(8), BFloat16)
        acc8 = cute.make_rmem_tensor(cute.make_layout(8), Float32)
        xb = cute.make_rmem_tensor(cute.make_layout(4), Float32)
        hpre = cute.make_rmem_tensor(cute.make_layout(n), Float32)
        pre = cute.make_rmem_tensor(cute.make_layout(n + 1), Float32)   # the row's pre sums, then its squares
        rk = cute.make_rmem_tensor(cute.make_layout(CL), Float32)        # one field of the CL ranks' partials
        # the projection: wgmma m64 n16, A the weight boxes, B the out buffer's tiles [16 tok, 64 ch] K-major
        mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(64, BMT))
        a1 = _a_one()
        sWa = cute.make_tensor(cute.recast_ptr(w_raw.iterator, a1.inner, dtype=BFloat16),
                               cute.make_layout(((8, 8), (CC, 1), n * S), stride=((CC, 512), (1, 0), WROWS * CC)))
        sOb = cute.make_tensor(cute.recast_ptr(out_raw.iterator, a1.inner, dtype=BFloat16),
                               cute.make_layout(((8, 2), (CC, 1), n * cfg.nk), stride=((CC, 512), (1, 0), TE)))
        thr0 = mma.get_slice(0)
        tA = mma.make_fragment_A(thr0.partition_A(sWa))
        tB = mma.make_fragment_B(thr0.partition_B(sOb))
        cAcc = mma.get_slice(ct_).partition_C(cute.make_identity_tensor((64, BMT)))
        pacc = cute.make_rmem_tensor(cAcc.shape, Float32)
        tot = cute.make_rmem_tensor(cAcc.shape, Float32)
        comp = cute.make_rmem_tensor(cAcc.shape, Float32)
        tot.fill(0.0)
        comp.fill(0.0)
        ss = Float32(0.0)
        ssc = Float32(0.0)
        kf = Float32(n * cfg.C)
        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        for j in cutlass.range(ntile, unroll=1):
            m = cid + j * ncl
            par = j % 2
            for k in cutlass.range(nk, unroll=1):
                ch = rank + k * CL
                pipe.consumer_wait(rst)
                st = rst.index
                for i in cutlass.range_constexpr(n):
                    cute.autovec_copy(cute.make_tensor(ring.iterator + (st * KT + i) * TE + e, cute.make_layout(4)),
                                      rv[i, None])
                cute.autovec_copy(cute.make_tensor(ring.iterator + (st * KT + n) * TE + e, cute.make_layout(4)), xv)
                if const_expr(cfg.HAS_BIAS):
                    cute.autovec_copy(cute.make_tensor(sB.iterator + st * 64 + lc, cute.make_layout(4)), bv)
                    for w_ in cutlass.range_constexpr(4):
                        xb[w_] = xv[w_].to(Float32) + bv[w_].to(Float32)
                else:
                    for w_ in cutlass.range_constexpr(4):
                        xb[w_] = xv[w_].to(Float32)
                sc = Float32(0.0)
                for i in cutlass.range_constexpr(n):
                    for w_ in cutlass.range_constexpr(4):
                        i_h = 0 if cfg.CUT & 2 else i   # CUT 2: every stream formed as stream 0 (hoisted)
                        o = hp[i_h] * xb[w_]
                        for jj in cutlass.range_constexpr(n):
                            o = o + hr[i_h * n + jj] * rv[jj, w_].to(Float32)
                        ov[w_] = BFloat16(o)
                        f_ = ov[w_].to(Float32)   # the rounded value's square (what mhc_pre sees)
                        sc = sc + f_ * f_
                    cute.autovec_copy(ov, cute.make_tensor(outb.iterator + (k * n + i) * TE + e, cute.make_layout(4)))
                y_ = sc - ssc
                t_s = ss + y_
                ssc = (t_s - ss) - y_
                ss = t_s
                cute.arch.fence_proxy("async.shared", space="cta")
                sync()   # the chunk's out tiles written (and visible to the async proxy)
                if t == 0:
                    for i in cutlass.range_constexpr(n):
                        cute.copy(tma_out, tOs[None, k * n + i], tOg[None, ch, m, i])
                    cute.arch.cp_async_bulk_commit_group()
                stream_wgmmas(mma, pacc, tA, tB, st, k, wc, n)
                if const_expr(n > 1):   # warpgroup wc's streams wc, wc + 2, .. (n = 1: warpgroup 0's alone)
                    _kahan(tot, comp, pacc)
                else:
                    if wc == 0:
                        _kahan(tot, comp, pacc)
                CU.release_read_stage(pipe, rst)
                rst.advance()
            # ---- the tile's partials: p_proj / p_ss (this rank's planes) and the exchange buffer (pre, squares)
            load_h(hrn, hpn, gHr, gHp, (m + ncl) * BMT + tok, T, n)   # the next tile's h, behind the exchange
            if const_expr(n > 1):   # warpgroup 1 has products
                if wc == 1:
                    for e2 in cutlass.range_constexpr(cute.size(tot)):
                        j_, tk_ = cAcc[e2]
                        if j_ < WROWS:
                            sP[j_, tk_] = tot[e2]
            sv = ss
            for sh in cutlass.range_constexpr(3):   # the token's 8 threads of this half (adjacent lanes)
                sv = sv + cute.arch.shuffle_sync_bfly(sv, offset=1 << sh)
            if t % 8 == 0:
                sSS[t // VT, tok] = sv
            sync()
            if wc == 0:
                for e2 in cutlass.range_constexpr(cute.size(tot)):
                    j_, tk_ = cAcc[e2]
                    g_ = m * BMT + tk_
                    if j_ < NPAD:
                        v = tot[e2]
                        if const_expr(n > 1):
                            v = v + sP[j_, tk_]
                        if j_ >= N:
                            v = Float32(0.0)
                        if g_ < T:
                            gP[rank, g_, j_] = v
                        if j_ < n:
                            sX[par, tk_, j_] = v
            if t < BMT:
                v2 = sSS[0, t] + sSS[1, t]
                if m * BMT + t < T:
                    gS[rank, m * BMT + t] = v2
                sX[par, t, n] = v2
            tot.fill(0.0)
            comp.fill(0.0)
            ss = Float32(0.0)
            ssc = Float32(0.0)
            sync()   # the exchange buffer written
            if const_expr(not (cfg.CUT & 1)):
                if t >= VT + 32 and t < VT + 64:   # warpgroup 1's second warp: no global or bulk stores of its own
                    _xlock(bars, j, rank, CL)
            if t == 0:   # out's stores have read the slots layer_in overwrites
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            sync()
            # ---- the row's sums: thread (f, tk), f <= n, sums field f (pre column f, then the squares) of token tk
            # over the CL ranks in rank order (cute_pp_mix's order; all CL loads in flight at once) into sH; then
            # each thread forms its token's h_pre
            if t < BMT * (n + 1):
                f_ = t // BMT
                tk2 = t - f_ * BMT
                src = sX.iterator + par * (BMT * 8) + tk2 * 8 + f_
                for r_ in cutlass.range_constexpr(CL):
                    if const_expr(cfg.CUT & 1):   # CUT 1: no exchange (this CTA's own partials, CL times)
                        rk[r_] = cute.arch.load(src, Float32)
                    else:
                        rk[r_] = CU.ld_cluster_f32(src, r_)
                a_ = rk[0]
                for r_ in cutlass.range_constexpr(1, CL):
                    a_ = a_ + rk[r_]
                sH[tk2, f_] = a_
            sync()
            for i in cutlass.range_constexpr(n + 1):
                pre[i] = sH[tok, i]
            rr = Float32(1.0) / (cute.math.sqrt(pre[n] / kf) + rms_eps)
            for i in cutlass.range_constexpr(n):
                h_ = rr * pre[i] * a_pre + hb[i]
                hpre[i] = Float32(1.0) / (Float32(1.0) + cute.math.exp(-h_))
            # ---- layer_in = sum_i h_pre_i out_i over this CTA's chunks, into stream 0's slots, then stored
            for q in cutlass.range_constexpr((cfg.nk * VT + 255) // 256):
                v_ = t + q * 256
                k2 = v_ // VT
                e8 = (v_ - k2 * VT) * 8
                if k2 < nk:
                    for i in cutlass.range_constexpr(n):
                        cute.autovec_copy(cute.make_tensor(outb.iterator + (k2 * n + i) * TE + e8,
                                                           cute.make_layout(8)), v8)
                        for w_ in cutlass.range_constexpr(8):
                            if const_expr(i == 0):
                                acc8[w_] = hpre[i] * v8[w_].to(Float32)
                            else:
                                acc8[w_] = acc8[w_] + hpre[i] * v8[w_].to(Float32)
                    for w_ in cutlass.range_constexpr(8):
                        v8[w_] = BFloat16(acc8[w_])
                    cute.autovec_copy(v8, cute.make_tensor(outb.iterator + (k2 * n) * TE + e8, cute.make_layout(8)))
            cute.arch.fence_proxy("async.shared", space="cta")
            sync()
            if t == 0:
                for k3 in cutlass.range(nk, unroll=1):
                    cute.copy(tma_li, tOs[None, k3 * n], tLg[None, rank + k3 * CL, m])
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)   # the buffer is the next tile's
            sync()
            for i in cutlass.range_constexpr(n):
                hp[i] = hpn[i]
                for jj in cutlass.range_constexpr(n):
                    hr[i * n + jj] = hrn[i * n + jj]
        if t == 0:   # the thread that issued every bulk store
            cute.arch.cp_async_bulk_wait_group(0, read=False)
    cute.arch.cluster_arrive()   # no CTA leaves while a peer may still read its exchange buffer or arrive
    cute.arch.cluster_wait()


@cute.jit
def _host(cfg: cutlass.Constexpr, res: cute.Pointer, x: cute.Pointer, bias: cute.Pointer, w: cute.Pointer,
          hres: cute.Pointer, hpost: cute.Pointer, hbias: cute.Pointer, out: cute.Pointer, li: cute.Pointer,
          p_proj: cute.Pointer, p_ss: cute.Pointer, T: Int32, ctas: Int32, rms_eps: Float32, a_pre: Float32,
          stream: CU.cuda.CUstream):
    n, C, N = cfg.n, cfg.C, cfg.N

    def streams(p):
        return cute.make_tensor(p, cute.make_layout((C, T, n), stride=(1, n * C, C)))

    def plain(p):
        return cute.make_tensor(p, cute.make_layout((C, T), stride=(1, C)))

    one = cute.slice_(_tile_layout(1), (None, None, 0))
    g2s, s2g = cpasync.CopyBulkTensorTileG2SOp(), cpasync.CopyBulkTensorTileS2GOp()
    tma_res, tRes = cpasync.make_tiled_tma_atom(g2s, streams(res), one, (CC, BMT))
    tma_out, tOut = cpasync.make_tiled_tma_atom(s2g, streams(out), one, (CC, BMT))
    tma_x, tX = cpasync.make_tiled_tma_atom(g2s, plain(x), one, (CC, BMT))
    tma_li, tLI = cpasync.make_tiled_tma_atom(s2g, plain(li), one, (CC, BMT))
    mW = cute.make_tensor(w, cute.make_layout((N, C, n), stride=(n * C, 1, C)))   # weight [N, n C] as (N, C, n)
    tma_w, tW = cpasync.make_tiled_tma_atom(g2s, mW, _w_box(), (WROWS, CC))
    mB = cute.make_tensor(bias, cute.make_layout((C, 1), stride=(1, C)))
    tma_b, tB = cpasync.make_tiled_tma_atom(g2s, mB, cute.make_layout((CC, 1)), (CC, 1))
    _kernel(cfg, tma_res, tRes, tma_x, tX, tma_out, tOut, tma_li, tLI, tma_w, tW, tma_b, tB, hres, hpost, hbias,
            p_proj, p_ss, T, rms_eps, a_pre).launch(
        grid=(ctas, 1, 1), block=(THREADS, 1, 1), cluster=(cfg.CL, 1, 1), stream=stream, min_blocks_per_mp=1,
        preferred_smem_carveout=100)


@functools.lru_cache(maxsize=256)
def launch(cfg: PostPreResCuteCfg) -> CU.Launch:
    """run args (residual [T, n, C], x [T, C], bias [C] (x when None), weight [N, n C], all bf16 16-byte aligned;
    h_res [T, n, n], h_post [T, n], hbias [N] fp32 contiguous; out [T, n, C], layer_in [T, C] bf16 16-byte aligned;
    p_proj [CL, T, NPAD], p_ss [CL, T] fp32; T, CTAs (CL x clusters), rms_eps, alpha_pre)."""
    bf, f4 = CU.Ptr(torch.bfloat16, 16), CU.Ptr(torch.float32, 4)
    return CU.Launch(f"{_NAME}.fwd", _host, cfg, (bf, bf, bf, bf, f4, f4, f4, bf, bf, f4, f4, CU.Scalar(Int32),
                                                  CU.Scalar(Int32), CU.Scalar(Float32), CU.Scalar(Float32)))


@functools.lru_cache(maxsize=8)
def max_clusters(device_index: int, cl: int) -> int:
    """Clusters of ``cl`` one-CTA-an-SM CTAs the device runs at once (the persistent grid; H200, CL 8: 15, where
    16 would run as two waves: the mHC ledger, session 39)."""
    from cutlass.utils import HardwareInfo

    torch.cuda.init()   # the driver calls below need an initialized context
    return max(1, int(HardwareInfo(device_index).get_max_active_clusters(cl)))


# Clusters in the persistent grid: 0, the device's active-cluster count (max_clusters); else this many (a probe's knob).
CLUSTERS = 0


def ctas(cfg: PostPreResCuteCfg, T: int, device: torch.device) -> int:
    """The grid: CL x min(row tiles, the clusters the device runs at once, or CLUSTERS)."""
    ncl = CLUSTERS or max_clusters(device.index if device.index is not None else torch.cuda.current_device(), cfg.CL)
    return cfg.CL * min(-(-T // BMT), ncl)


def representative_launches(n: int = 4, C: int = 7168) -> dict[str, CU.Launch]:
    """The kernel at one static shape, with and without bias (what the CPU compile test exports)."""
    N = n * n + 2 * n
    return {f"res_bias{b}": launch(PostPreResCuteCfg.heuristic(n, C, N, b)) for b in (True, False)}
