"""CuTe DSL pass of mhc_post_pre's backward (Hopper sm_90a): mhc_pre's dh_pre partials and the post / res rows of its
dweight from one read of the saved out (the SPLIT_DW backward; cute_post_pre).

With out [T, n, C] (bf16), dlayer_in [T, C] (bf16) and dproj0 [T, NPAD] (fp32: mhc_pre's dproj with dh_pre read as 0,
whose post and res columns n .. N-1 are already dproj's; N = n*n + 2n, columns pre | post | res):

    p_dh[s, t, i]   = sum over the 64 channels c of slice s of dlayer_in[t, c] * out[t, i, c]    (fp32 [S, T, n])
    p_dw[g, j, :]   = sum over row group g's tokens of dproj0[t, j] * out[t, :]  for j >= n, 0 for j < n
                                                                                    (fp32 [GM, N, n C])

dh_pre = sum_s p_dh (in slice order, after the pass); dproj's pre columns follow from it (mhc_pre's mix) and the
backward pass (cute_post_pre_bwd with DWPRE) adds dweight's pre rows from the out it recomputes. Before, the dh_pre
pass and the dweight pass read out once each; this pass reads it once for both (dh_pre pass's bytes, s + x).

CTA (s, g) owns the 64-channel slice s of every stream and the row tiles g, g + GM, .. of 64 tokens; 4 warpgroups:
warp 0 the TMA producer (a stage: the n out tiles [64 ch, 64 tok] channel-major, one box a stream, the dlayer_in tile
and the tile's dproj0 rows); warpgroups 1 and 2 the dweight consumers (warpgroup c takes streams c and c + 2): per tile
[hi | lo] of the post / res columns (bf16 hi = bf16(v), lo = bf16(v - hi): products exact, fp32 sums, as
cute_proj_rms; 16-byte shared-memory accesses, the columns fixed at compile time) as the wgmma's M-major A [64 rows,
64 tok], then dweight += [hi | lo]^T @ out (wgmma m64 n64, k = 64 tokens, B = the out tile as it landed); warpgroup 3
the slice's dh partials of every stream from the same stage (CUDA cores: a thread a token and channel half, dlayer_in
loaded once for the n streams), so the two chains overlap instead of taking turns in one warpgroup (the consumers
were the bound: scalar [hi | lo] stores and in-line partials doubled this pass's time; the mHC ledger, session 25).
At the end the hi and lo rows are summed through shared memory into p_dw[g]. Deterministic: no atomics, every partial
written once.

Tails: TMA zero-fills tokens past T and channels past C (their products and partials are 0); tokens past T store no
partial; dweight columns past C are not stored.

Constraints: n <= 4, N <= NPAD in (16, 32), C % 8 == 0, bf16 out / dlayer_in, fp32 dproj0, contiguous; S T n and
GM N n C below 2**31. Compile key: PostPreDhdwCuteCfg (n, C, N, NPAD, STAGES); T and GM are runtime (the grid).
Importing this module needs ``cutlass`` but no GPU.
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
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as CU

from .cute_proj_rms import _smem_tensor

_NAME = "mhc.cute_post_pre_dhdw"
THREADS = 512
SIDE_REGS, CONSUMER_REGS = 64, 192   # warpgroups 0 and 3 / 1 and 2 (2 * 128 * 64 + 256 * 192 = 65536)
BM = 64        # tokens a tile (the wgmma k: 4 x 16)
CW = 64        # channels of each stream a CTA owns
NP = 32        # [hi | lo] rows: hi 0..NP-1, lo NP..2NP-1
SMEM_LIMIT = 225 * 1024
GM_DEFAULT = 7  # row groups: 112 slices x 7 = 784 CTAs at C=7168, 5.94 waves of 132 (as cute_proj_rms's)


class SliceCfg:
    """What the configs of a slices pass share (this one's and cute_post_pre_dhw's; fields n, C, N, NPAD and a
    ``smem_bytes``): the static dims it takes, its CTAs a row group, its shared-memory check."""

    def check(self, name: str, ok: bool, needs: str) -> None:
        """Raise unless n <= 4, N = n*n + 2n <= NPAD in (16, 32), C % 8 == 0, ``ok`` (the config's own limits, said
        by ``needs``) and the shared memory fits."""
        n, C, N, NPAD = self.n, self.C, self.N, self.NPAD
        if not (1 <= n <= 4 and N == n * n + 2 * n and N <= NPAD <= NP and NPAD in (16, 32) and C % 8 == 0 and C > 0
                and ok):
            raise ValueError(f"mhc_post_pre cute {name}: config {self}: needs n <= 4, N = n*n + 2n <= NPAD in "
                             f"(16, 32), C % 8 == 0, {needs}")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"mhc_post_pre cute {name}: config {self} needs {self.smem_bytes} bytes of shared memory")

    @property
    def S(self) -> int:
        """64-channel slices (the grid's x)."""
        return -(-self.C // CW)


@dataclasses.dataclass(frozen=True)
class PostPreDhdwCuteCfg(SliceCfg):
    """Launch config = compile key. n, C, N: static dims; NPAD: dproj0's row width (16 or 32); STAGES: the ring."""

    n: int
    C: int
    N: int
    NPAD: int
    STAGES: int = 4
    # probe only (benchmarks/probes/dhdw_probe.py; wrong results): bit 1 skips the dh partials, 2 the wgmmas, 4 the
    # [hi | lo] build
    SKIP: int = 0

    def __post_init__(self):
        self.check("dhdw", self.STAGES >= 2, "STAGES >= 2")

    @property
    def tiles(self) -> int:
        """[64 ch, 64 tok] bf16 tiles a stage: n out, then dlayer_in."""
        return self.n + 1

    @property
    def smem_bytes(self) -> int:
        return (self.STAGES * (self.tiles * CW * BM * 2 + BM * self.NPAD * 4) + 2 * 64 * BM * 2
                + 2 * self.STAGES * 8 + 4 * 1024)

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, n: int, C: int, N: int, NPAD: int) -> "PostPreDhdwCuteCfg":
        """As many stages (<= 4) as fit: one CTA an SM, ~160 KB of loads in flight at n = 4."""
        st = 4
        while st > 2 and cls(n, C, N, NPAD, 2).smem_bytes + (st - 2) * (
                (n + 1) * CW * BM * 2 + BM * NPAD * 4 + 16) > SMEM_LIMIT:
            st -= 1
        return cls(n=n, C=C, N=N, NPAD=NPAD, STAGES=st)


def row_groups(T: int) -> int:
    """GM: the grid's y (at most one row tile a group)."""
    return max(1, min(GM_DEFAULT, -(-T // BM)))


def _layouts(cfg):
    """(sT, sH): the stage tiles [CW ch, BM tok] channel-major (the wgmma's N-major B; stage a, slot i < n out stream
    i, slot n dlayer_in, at a * tiles + slot); [hi | lo] as the wgmma's M-major A [64 rows, BM tok] x 2 (one a
    consumer warpgroup)."""
    mn = LayoutEnum.COL_MAJOR
    sT = sm90_utils.make_smem_layout_a(mn, (CW, 16, BM), BFloat16, cfg.tiles * cfg.STAGES)
    sH = sm90_utils.make_smem_layout_a(mn, (64, 16, BM), BFloat16, 2)
    return sT, sH


# ------------------------------------------------------------------ slice helpers (this pass's and cute_post_pre_dhw's)


def slice_mma(sT, sH, ct):
    """(mma, A fragments, B fragments, the thread's accumulator coordinates, two accumulators): dweight rows
    [hi | lo] (64) x one stream's 64 channels += [hi | lo] @ out-tile (wgmma m64 n64; A = sH M-major, B = sT's tiles
    N-major as they landed)."""
    mma = sm90_utils.make_trivial_tiled_mma(
        BFloat16, BFloat16, LayoutEnum.COL_MAJOR.sm90_mma_major_mode(),
        LayoutEnum.COL_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(64, CW))
    thr = mma.get_slice(0)
    cAcc = mma.get_slice(ct).partition_C(cute.make_identity_tensor((64, CW)))
    return (mma, mma.make_fragment_A(thr.partition_A(sH)), mma.make_fragment_B(thr.partition_B(sT)), cAcc,
            cute.make_rmem_tensor(cAcc.shape, Float32), cute.make_rmem_tensor(cAcc.shape, Float32))


@cute.jit
def store_slice_rows(acc: cute.Tensor, cAcc: cute.Tensor, scr: cute.Tensor, ct: Int32, c: Int32, i: Int32,
                     C: cutlass.Constexpr, N: cutlass.Constexpr, bar_id: Int32, put: cutlass.Constexpr) -> None:
    """A consumer warpgroup's dweight rows of stream i at its slice's channel c = s * 64 + ct % 64: the accumulator's hi
    and lo rows summed through ``scr`` [64, 64 (+1)] fp32 (shared memory), then put(j, i C + c, value) for rows j of N
    (two rows a thread in turn; channels past C skipped); the warpgroup's named barrier around it."""
    for e in cutlass.range_constexpr(cute.size(acc)):
        j_, c_ = cAcc[e]
        scr[j_, c_] = acc[e]
    cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)
    if c < C:
        for j in cutlass.range(ct // CW, N, 128 // CW, unroll=1):
            put(j, i * C + c, scr[j, ct % CW] + scr[NP + j, ct % CW])
    cute.arch.barrier(barrier_id=bar_id, number_of_threads=128)


@cute.jit
def _build_hl(sDs: cute.Tensor, sHv: cute.Tensor, hv: cute.Tensor, hb: cute.Tensor, tok: Int32,
              h0: cutlass.Constexpr, n: cutlass.Constexpr, N: cutlass.Constexpr, NPD: cutlass.Constexpr) -> None:
    """[hi | lo] rows h0 .. h0 + 15 and NP + h0 .. of token tok (sHv: the warpgroup's [hi | lo] in 8-element pieces)
    from its dproj0 row in the stage (sDs [NPD, BM]); 16-byte loads and stores, the columns known at compile time
    (pre columns and padding 0). hv [16] fp32, hb [32] bf16: scratch registers."""
    if const_expr(h0 < NPD):
        sDv = cute.logical_divide(sDs, (cute.make_layout(4), None))
        for k in cutlass.range_constexpr(4):
            cute.autovec_copy(sDv[(None, h0 // 4 + k), tok], cute.make_tensor(hv.iterator + 4 * k, cute.make_layout(4)))
    for jj in cutlass.range_constexpr(16):
        x = Float32(0.0)
        if const_expr(n <= h0 + jj < N):
            x = hv[jj]
        hi = BFloat16(x)
        hb[jj] = hi
        hb[16 + jj] = BFloat16(x - hi.to(Float32))
    for q in cutlass.range_constexpr(2):
        cute.autovec_copy(cute.make_tensor(hb.iterator + 8 * q, cute.make_layout(8)),
                          sHv[(None, (h0 + 8 * q) // 8), tok])
        cute.autovec_copy(cute.make_tensor(hb.iterator + 16 + 8 * q, cute.make_layout(8)),
                          sHv[(None, (NP + h0 + 8 * q) // 8), tok])


@cute.jit
def _dh_token(sT: cute.Tensor, base: Int32, t: Int32, hh: Int32, lv: cute.Tensor, pv: cute.Tensor, dv: cute.Tensor,
              n: cutlass.Constexpr) -> None:
    """dv[i] = sum over the tile's 64 channels of out[t, i, c] * dlayer_in[t, c] for i < n (tiles base + i, base + n),
    the thread's channel half hh (32) summed with its partner lane's (hh ^ 1) by a shuffle; 16-byte shared-memory
    loads (lv [32], pv [8]: scratch registers)."""
    lt = cute.logical_divide(sT[None, None, base + n], (cute.make_layout(8), None))
    for q in cutlass.range_constexpr(4):
        cute.autovec_copy(lt[(None, hh * 4 + q), t], cute.make_tensor(lv.iterator + 8 * q, cute.make_layout(8)))
    for i in cutlass.range_constexpr(n):
        ot = cute.logical_divide(sT[None, None, base + i], (cute.make_layout(8), None))
        v = Float32(0.0)
        for q in cutlass.range_constexpr(4):
            cute.autovec_copy(ot[(None, hh * 4 + q), t], pv)
            for e in cutlass.range_constexpr(8):
                v = v + pv[e].to(Float32) * lv[8 * q + e].to(Float32)
        dv[i] = v + cute.arch.shuffle_sync_bfly(v, offset=1)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_o: cute.CopyAtom, mO: cute.Tensor, tma_l: cute.CopyAtom, mL: cute.Tensor,
            tma_d: cute.CopyAtom, mD: cute.Tensor, p_dh: cute.Pointer, p_dw: cute.Pointer, T: Int32):
    n, C, N, ST, NT, NPD = cfg.n, cfg.C, cfg.N, cfg.STAGES, cfg.tiles, cfg.NPAD
    S = cfg.S
    tidx, _, _ = cute.arch.thread_idx()
    s, g0, _ = cute.arch.block_idx()
    _, GMe, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    G = (T + BM - 1) // BM
    if warp == 0:
        CU.prefetch_tma(tma_o, tma_l, tma_d)

    smem = cutlass.memory.SmemAllocator()
    sT_l, sH_l = _layouts(cfg)
    sT_raw, sT = _smem_tensor(smem, sT_l)
    _, sH = _smem_tensor(smem, sH_l)
    sD = smem.allocate_tensor(Float32, cute.make_layout((NPD, BM, ST), stride=(1, NPD, NPD * BM)),
                              byte_alignment=128)
    pipe = CU.tma_pipeline(smem, ST, NT * CW * BM * 2 + BM * NPD * 4, 12)
    tTs, tOg = CU.tma_tiles(tma_o, sT, mO, (CW, BM))
    _, tLg = CU.tma_tiles(tma_l, sT, mL, (CW, BM))
    tDs, tDg = CU.tma_tiles(tma_d, sD, mD, (NPD, BM))

    if wg == 0:
        cute.arch.setmaxregister_decrease(SIDE_REGS)
        if warp == 0:
            pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, ST)
            for m in cutlass.range(g0, G, GMe, unroll=1):
                pipe.producer_acquire(pst)
                bar = pipe.producer_get_barrier(pst)
                for i in cutlass.range_constexpr(n):
                    cute.copy(tma_o, tOg[None, s, m, i], tTs[None, pst.index * NT + i], tma_bar_ptr=bar)
                cute.copy(tma_l, tLg[None, s, m], tTs[None, pst.index * NT + n], tma_bar_ptr=bar)
                cute.copy(tma_d, tDg[None, 0, m], tDs[None, pst.index], tma_bar_ptr=bar)
                pipe.producer_commit(pst)
                pst.advance()
    elif wg == 3:
        # ---- the slice's dh partials of every stream: thread (token ct // 2, channel half ct % 2); dlayer_in's 32
        # channels loaded once, each stream's out against them, the halves summed by a shuffle; the token's n values
        # stored together
        cute.arch.setmaxregister_decrease(SIDE_REGS)
        ct = tidx - 384
        t = ct // 2
        hh = ct % 2
        lv = cute.make_rmem_tensor((32,), BFloat16)
        pv = cute.make_rmem_tensor((8,), BFloat16)
        dv = cute.make_rmem_tensor((n,), Float32)
        gdh = cute.make_tensor(p_dh + s * T * n, cute.make_layout((T, n), stride=(n, 1)))
        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, ST)
        for m in cutlass.range(g0, G, GMe, unroll=1):
            pipe.consumer_wait(rst)
            st = rst.index
            if const_expr(not cfg.SKIP & 1):
                _dh_token(sT, st * NT, t, hh, lv, pv, dv, n)
                tg = m * BM + t
                if hh == 0 and tg < T:
                    cute.autovec_copy(dv, gdh[tg, None])
            CU.release_read_stage(pipe, rst)
            rst.advance()
        cute.arch.barrier(barrier_id=1, number_of_threads=384)   # every stage read: the consumers' scratch is free
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS)
        wc = wg - 1
        ct = tidx - 128 * wg
        bar_wg = 2 + wc

        mma, tA, tB, cAcc, acc0, acc1 = slice_mma(sT, sH, ct)
        accs = (acc0, acc1)
        NSW = (n - wc + 1) // 2          # this warpgroup's streams: wc, wc + 2 (< n)
        sHw = sH[None, None, wc]

        # the [hi | lo] map: token ct // 2, columns (ct % 2) * 16 .. 16 of [0, NP), read and written 16 bytes at a time
        tok = ct // 2
        hv = cute.make_rmem_tensor((16,), Float32)
        hb = cute.make_rmem_tensor((32,), BFloat16)   # hi 0..15, lo 16..31
        sHv = cute.logical_divide(sHw, (cute.make_layout(8), None))

        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, ST)
        for m in cutlass.range(g0, G, GMe, unroll=1):
            pipe.consumer_wait(rst)
            st = rst.index
            if const_expr(not cfg.SKIP & 4):
                sDs = sD[None, None, st]
                if ct % 2 == 0:
                    _build_hl(sDs, sHv, hv, hb, tok, 0, n, N, NPD)
                else:
                    _build_hl(sDs, sHv, hv, hb, tok, 16, n, N, NPD)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=bar_wg, number_of_threads=128)
            warpgroup.fence()
            for q in cutlass.range_constexpr(2):
                if q < NSW and not cfg.SKIP & 2:
                    i = wc + 2 * q
                    for kb in cutlass.range_constexpr(BM // 16):
                        if const_expr(kb == 0):
                            mma.set(warpgroup.Field.ACCUMULATE, m != g0)   # the CTA's first tile starts from 0
                        else:
                            mma.set(warpgroup.Field.ACCUMULATE, True)
                        cute.gemm(mma, accs[q], tA[None, None, kb, wc], tB[None, None, kb, st * NT + i], accs[q])
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            CU.release_read_stage(pipe, rst)
            rst.advance()
            # the next tile's [hi | lo] overwrites sHw: every warp of the warpgroup past its wgmma first
            cute.arch.barrier(barrier_id=bar_wg, number_of_threads=128)

        # ---- this CTA's dweight partial: hi + lo rows through shared memory (the ring's tiles: every load landed
        # and was consumed by all three warpgroups once the barrier passes), fp32 stores into plane g0
        cute.arch.barrier(barrier_id=1, number_of_threads=384)
        scr = cute.make_tensor(cute.recast_ptr(sT_raw.iterator + wc * (64 * (CW + 1) * 4), dtype=Float32),
                               cute.make_layout((64, CW), stride=(CW + 1, 1)))
        pd = cute.make_tensor(p_dw + g0 * N * n * C, cute.make_layout((N, n * C), stride=(n * C, 1)))

        def put(j, col, v):
            pd[j, col] = v

        for q in cutlass.range_constexpr(2):
            if q < NSW:
                store_slice_rows(accs[q], cAcc, scr, ct, s * CW + ct % CW, wc + 2 * q, C, N, bar_wg, put)


def slice_tma_atoms(cfg, sT_l, out, dli, dproj0, T):
    """(called from a ``@cute.jit`` host function) The TMA loads of a slices pass (this one's, cute_post_pre_dhw's):
    (atom, tensor) of out [T, n, C] seen (C, T, n) channel-major with the stream a mode, of dlayer_in [T, C] seen
    (C, T), both in [CW, BM] tiles of sT_l's layout, and of dproj0 [T, NPAD] in [NPAD, BM] boxes."""
    n, C, NPD = cfg.n, cfg.C, cfg.NPAD
    mO = cute.make_tensor(out, cute.make_layout((C, T, n), stride=(1, n * C, C)))
    mL = cute.make_tensor(dli, cute.make_layout((C, T), stride=(1, C)))
    mD = cute.make_tensor(dproj0, cute.make_layout((NPD, T), stride=(1, NPD)))
    one = cute.slice_(sT_l, (None, None, 0))
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    return (*cpasync.make_tiled_tma_atom(g2s, mO, one, (CW, BM)), *cpasync.make_tiled_tma_atom(g2s, mL, one, (CW, BM)),
            *cpasync.make_tiled_tma_atom(g2s, mD, cute.make_layout((NPD, BM), stride=(1, NPD)), (NPD, BM)))


@cute.jit
def _host(cfg: cutlass.Constexpr, out: cute.Pointer, dli: cute.Pointer, dproj0: cute.Pointer, p_dh: cute.Pointer,
          p_dw: cute.Pointer, T: Int32, GMe: Int32, stream: CU.cuda.CUstream):
    _kernel(cfg, *slice_tma_atoms(cfg, _layouts(cfg)[0], out, dli, dproj0, T), p_dh, p_dw, T).launch(
        grid=(cfg.S, GMe, 1), block=(THREADS, 1, 1), stream=stream, min_blocks_per_mp=1, preferred_smem_carveout=100)


# ------------------------------------------------------------------ Python entry points


@functools.lru_cache(maxsize=256)
def launch(cfg: PostPreDhdwCuteCfg) -> CU.Launch:
    """run args (out [T, n, C] bf16, dlayer_in [T, C] bf16, dproj0 [T, NPAD] fp32, p_dh [S, T, n] fp32 (out),
    p_dw [>= GM, N, n C] fp32 (out: planes 0 .. GM-1), T, GM); contiguous."""
    bf, f4 = CU.Ptr(torch.bfloat16, 16), CU.Ptr(torch.float32, 4)
    sig = (bf, bf, CU.Ptr(torch.float32, 16), f4, f4, CU.Scalar(Int32), CU.Scalar(Int32))
    return CU.Launch(f"{_NAME}.dhdw", _host, cfg, sig)


def representative_launches(n: int = 4, C: int = 7168) -> dict[str, CU.Launch]:
    """The pass at one static shape (what the CPU compile test exports)."""
    N = n * n + 2 * n
    return {"dhdw": launch(PostPreDhdwCuteCfg.heuristic(n, C, N, 32 if N > 16 else 16))}
