"""CuTe DSL fused forward pass of mhc_post_pre (Hopper sm_90a): h_post_bda's out and mhc_pre's projection in one
read of the streams: mhc_post_pre's cute forward (``cute_post_pre.FUSE_FWD``, default since session 17). H200,
T=32768, n=4, C=7168, bf16: this pass 1115 us (out and the partials: 4.23 GB of streams, 89% of the 4.27 TB/s
copy) where the composition's h_post_bda forward and mhc_pre projection take 978 + 460 us.

Per token t, stream i, channel c (fp32, rounded once):

    out[t,i,c]  = sum_j h_res[t,i,j] residual[t,j,c] + h_post[t,i] (x[t,c] + bias[c])    (bf16, stored)
    p_proj[r,t,:] = sum over (i, c of split r) of out[t,i,c] weight[:, i*C + c]   (fp32, the rounded out, Kahan
    p_ss[r,t]     = sum over (i, c of split r) of out[t,i,c]^2                    per chunk)

which cutile_post_pre.mhc_pp_mix (its C-split design's epilogue: the SPLIT planes summed in order) turns into mhc_pre's
proj, r, h_pre, h_post and h_res; cutile_aggregate's forward then reads out once more for layer_in. The composition
reads the new streams twice after writing them (mhc_pre's projection pass and its aggregate); this pass folds the
projection into the write: the forward moves 3s + 2x instead of 4s + 2x (s = one [T, n, C] stream).

CTA = 64 tokens (the wgmma M) over C in chunks of 64 channels, 3 warpgroups (384 threads), as cute_post_pre_bwd's
pass, SPLIT CTAs a row tile as there: CTA r takes chunks r, r + SPLIT, ... and writes plane r of p_proj [SPLIT, T, NPAD]
and p_ss [SPLIT, T], which mhc_pp_mix sums in plane order (H200, T=32768, n=4, C=7168: this pass 1115 us at SPLIT 8
against 1226 unsplit, the mHC ledger, session 22):

* warp 0 (producer): per chunk, TMA loads of the residual tiles ([64 tok x 64 ch], channel-contiguous rows, the
  wgmma's K-major A layout; one box a stream), x, bias and the weight's [NP, 64] K-major B tiles (one a stream;
  rows past N read as zeros) into a STAGES-deep ring. A stage released by the consumers holds the chunk's out (in
  place of the residual tiles): the producer stores it by TMA before it loads the stage again.
* warpgroups 1, 2 (consumers): thread k (0..255) takes token k // 4 and channel pairs 2*(k % 4 + 4q), q = 0..7,
  of every stream: out from the stage's residual, x and bias and the token's h (registers, loaded once), written
  in place as bf16, its squares summed per token. Then (all 256 threads' tiles written: a named barrier)
  warpgroup wc runs the projection's wgmmas m64 nNP of its streams i (i % 2 == wc), 4 k-steps each, into a
  per-chunk accumulator that is Kahan-added to its running sum; the stage is released once they retired.
  At the end: warpgroup 1's sums added to warpgroup 0's through shared memory, p_proj and p_ss stored.

Constraints: those of cute_post_pre_bwd's pass (n <= 4, C % 8 == 0, bf16 streams / bias / weight, fp32 h: bf16 h
staged first), sm_90a; SPLIT * T * NPAD < 2**31 (the planes' int32 offsets: the spec's 256 T < 2**31). Compile key:
PostPreFwdCuteCfg; T is a runtime scalar (the grid).
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

from .cute_post_pre_bwd import bias_ring
from .cute_proj_rms import _smem_tensor
from .cute_proj_rms_fwd import _kahan

_NAME = "mhc.cute_post_pre_fwd"
THREADS = 384
PRODUCER_REGS, CONSUMER_REGS = 40, 232
BM = 64   # tokens a CTA
CC = 64   # channels a chunk
SMEM_LIMIT = 225 * 1024
SPLIT_DEFAULT = 8   # CTAs a row tile (each takes every 8th chunk): the heuristic's


@dataclasses.dataclass(frozen=True)
class PostPreFwdCuteCfg:
    """Launch config = compile key (with the dtypes). n, C, N static; NP: the projection's wgmma N (16 or 32);
    NPAD: p_proj's row width (cuTile mhc_pp_mix's); STAGES: the ring; HAS_BIAS."""

    n: int
    C: int
    N: int
    NPAD: int
    NP: int = 32
    STAGES: int = 3
    HAS_BIAS: bool = True
    SPLIT: int = 1   # CTAs a row tile: CTA (r, m) takes chunks r, r + SPLIT, ... and writes partials plane r

    def __post_init__(self):
        if not (1 <= self.n <= 4 and self.N == self.n * self.n + 2 * self.n and self.N <= self.NP
                and self.NP in (16, 32) and self.NPAD >= self.N and self.C % 8 == 0 and self.C > 0
                and self.STAGES >= 2 and 1 <= self.SPLIT <= self.nch):
            raise ValueError(f"mhc_post_pre cute fwd: config {self}: needs n <= 4, N = n*n + 2n <= NP in (16, 32), "
                             f"NPAD >= N, C % 8 == 0, STAGES >= 2, 1 <= SPLIT <= chunks")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"mhc_post_pre cute fwd: config {self} needs {self.smem_bytes} bytes of shared memory")

    @property
    def nch(self) -> int:
        return -(-self.C // CC)

    @property
    def stage_bytes(self) -> int:
        """TMA bytes a stage: residual per stream, x, the weight tiles per stream, bias."""
        return (self.n + 1) * BM * CC * 2 + self.n * self.NP * CC * 2 + (CC * 2 if self.HAS_BIAS else 0)

    @property
    def smem_bytes(self) -> int:
        return self.STAGES * (self.stage_bytes + 128) + BM * (self.NP + 1) * 4 + 2 * self.STAGES * 8 + 5 * 1024

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, n: int, C: int, N: int, NPAD: int, has_bias: bool) -> "PostPreFwdCuteCfg":
        """Static dims only: NP the smallest of 16, 32 holding N; as many stages (<= 4) as fit; SPLIT 8 (fewer when C
        has fewer chunks; H200, T=32768, n=4, C=7168: this pass 1115 us at 8 against 1162 at 4 and 1226 unsplit)."""
        base = cls(n=n, C=C, N=N, NPAD=NPAD, NP=16 if N <= 16 else 32, STAGES=2, HAS_BIAS=has_bias)
        st = 2
        while st < 4 and base.smem_bytes + (st - 1) * (base.stage_bytes + 144) <= SMEM_LIMIT:
            st += 1
        return dataclasses.replace(base, STAGES=st, SPLIT=min(SPLIT_DEFAULT, base.nch))


def _layouts(cfg):
    """(sO, sX, sW): residual / out tiles [BM tok, CC ch] (K-major A: channels contiguous) x n*STAGES (index
    stage*n + i), x tiles the same x STAGES, the weight's B tiles [NP, CC] K-major x n*STAGES."""
    km = LayoutEnum.ROW_MAJOR
    sO = sm90_utils.make_smem_layout_a(km, (BM, cfg.NP, CC), BFloat16, cfg.n * cfg.STAGES)
    sX = sm90_utils.make_smem_layout_a(km, (BM, cfg.NP, CC), BFloat16, cfg.STAGES)
    sW = sm90_utils.make_smem_layout_b(km, (BM, cfg.NP, CC), BFloat16, cfg.n * cfg.STAGES)
    return sO, sX, sW


@cute.jit
def _store_out(cfg: cutlass.Constexpr, tma_o: cute.CopyAtom, tOs: cute.Tensor, tOg: cute.Tensor, st: Int32,
               ch: Int32, m: Int32):
    """TMA stores of stage st's out tiles (chunk ch of row tile m), one bulk group, waited until read."""
    for i in cutlass.range_constexpr(cfg.n):
        cute.copy(tma_o, tOs[None, st * cfg.n + i], tOg[None, m, ch, i])
    cute.arch.cp_async_bulk_commit_group()
    cute.arch.cp_async_bulk_wait_group(0, read=True)


@cute.jit
def stream_wgmmas(mma, dst: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, a: Int32, b: Int32, wc: Int32,
                  n: cutlass.Constexpr):
    """Warpgroup wc's projection products of its streams i = wc, wc + 2, ... (4 k-steps each; A slots a * n + i,
    B slots b * n + i) into dst (the first from zero by its scale-d flag), committed and retired. Shared with the
    resident pass (cute_post_pre_res), whose weight and out slots are indexed apart."""
    warpgroup.fence()
    for s_ in cutlass.range_constexpr((n + 1) // 2):
        i = 2 * s_ + wc
        if i < n:
            for kb in cutlass.range_constexpr(CC // 16):
                mma.set(warpgroup.Field.ACCUMULATE, not (s_ == 0 and kb == 0))
                cute.gemm(mma, dst, tA[None, None, kb, a * n + i], tB[None, None, kb, b * n + i], dst)
    warpgroup.commit_group()
    warpgroup.wait_group(0)


@cute.jit
def load_h(hr: cute.Tensor, hp: cute.Tensor, gHr: cute.Tensor, gHp: cute.Tensor, g: Int32, T: Int32,
           n: cutlass.Constexpr):
    """Token g's h_res [n, n] (hr [n * n], row-major) and h_post [n] into registers (0 past T); shared with the
    resident pass (cute_post_pre_res)."""
    for i in cutlass.range_constexpr(n):
        a = Float32(0.0)
        if g < T:
            a = gHp[g, i]
        hp[i] = a
        for j in cutlass.range_constexpr(n):
            b = Float32(0.0)
            if g < T:
                b = gHr[g, i, j]
            hr[i * n + j] = b


@cute.jit
def _proj_chunk(mma, acc: cute.Tensor, tot: cute.Tensor, comp: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
                st: Int32, wc: Int32, n: cutlass.Constexpr):
    """Stage st's products (stream_wgmmas) into acc, then Kahan-added to tot (compensation comp)."""
    stream_wgmmas(mma, acc, tA, tB, st, st, wc, n)
    _kahan(tot, comp, acc)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_r: cute.CopyAtom, mR: cute.Tensor, tma_o: cute.CopyAtom, mO: cute.Tensor,
            tma_x: cute.CopyAtom, mX: cute.Tensor, tma_w: cute.CopyAtom, mW: cute.Tensor, tma_b: cute.CopyAtom,
            mB: cute.Tensor, hres: cute.Pointer, hpost: cute.Pointer, p_proj: cute.Pointer, p_ss: cute.Pointer,
            T: Int32):
    n, NP, S, SP = cfg.n, cfg.NP, cfg.STAGES, cfg.SPLIT
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    m = bid // SP   # the row tile; siblings r = 0 .. SP-1 of one tile are adjacent in launch order
    r = bid - m * SP
    nk = (cfg.nch - r + SP - 1) // SP   # this CTA's chunks: r, r + SP, ...
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    if warp == 0:
        CU.prefetch_tma(tma_r, tma_o, tma_x, tma_w)
        if const_expr(cfg.HAS_BIAS):
            CU.prefetch_tma(tma_b)

    smem = cutlass.memory.SmemAllocator()
    sO_l, sX_l, sW_l = _layouts(cfg)
    _, sO = _smem_tensor(smem, sO_l)
    _, sX = _smem_tensor(smem, sX_l)
    _, sW = _smem_tensor(smem, sW_l)
    sB = bias_ring(smem, CC, S)
    sP = smem.allocate_tensor(Float32, cute.make_layout((BM, NP), stride=(NP + 1, 1)), byte_alignment=16)
    pipe = CU.tma_pipeline(smem, S, cfg.stage_bytes, 8)

    tRs, tRg = CU.tma_tiles(tma_r, sO, mR, (BM, CC))     # (tile, row tile, chunk, stream)
    _, tOg = CU.tma_tiles(tma_o, sO, mO, (BM, CC))
    tXs, tXg = CU.tma_tiles(tma_x, sX, mX, (BM, CC))     # (tile, row tile, chunk)
    tWs, tWg = CU.tma_tiles(tma_w, sW, mW, (NP, CC))     # (tile, 0, chunk, stream)
    tBs, tBg = CU.tma_tiles(tma_b, sB, mB, (CC, 1), (None, 0))

    if wg == 0:
        cute.arch.setmaxregister_decrease(PRODUCER_REGS)
        if warp == 0:
            def load(st, k, bar):
                ch = r + k * SP
                for i in cutlass.range_constexpr(n):
                    cute.copy(tma_r, tRg[None, m, ch, i], tRs[None, st * n + i], tma_bar_ptr=bar)
                    cute.copy(tma_w, tWg[None, 0, ch, i], tWs[None, st * n + i], tma_bar_ptr=bar)
                cute.copy(tma_x, tXg[None, m, ch], tXs[None, st], tma_bar_ptr=bar)
                if const_expr(cfg.HAS_BIAS):
                    cute.copy(tma_b, tBg[None, ch], tBs[None, st], tma_bar_ptr=bar)

            def store(st, k):   # the stage's out, in its residual slots
                _store_out(cfg, tma_o, tRs, tOg, st, r + k * SP, m)

            CU.ring_producer(pipe, S, nk, load, store)
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS)
        wc = wg - 1
        cidx = tidx - 128
        ct_ = tidx - 128 * wg
        tk = cidx // 4            # this thread's token (local) in the elementwise step
        gt = m * BM + tk
        cp0 = cidx % 4            # its first channel pair; pairs cp0 + 4q, q = 0..7
        hr = cute.make_rmem_tensor((n * n,), Float32)
        hp = cute.make_rmem_tensor((n,), Float32)
        gHr = cute.make_tensor(hres, cute.make_layout((T, n, n), stride=(n * n, n, 1)))
        gHp = cute.make_tensor(hpost, cute.make_layout((T, n), stride=(n, 1)))
        load_h(hr, hp, gHr, gHp, gt, T, n)

        mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(BM, NP))
        thr0 = mma.get_slice(0)
        tA = mma.make_fragment_A(thr0.partition_A(sO))
        tB = mma.make_fragment_B(thr0.partition_B(sW))
        cAcc = mma.get_slice(ct_).partition_C(cute.make_identity_tensor((BM, NP)))
        acc = cute.make_rmem_tensor(cAcc.shape, Float32)
        tot = cute.make_rmem_tensor(cAcc.shape, Float32)
        comp = cute.make_rmem_tensor(cAcc.shape, Float32)
        tot.fill(0.0)
        comp.fill(0.0)
        ss = Float32(0.0)    # the token's squares (Kahan-summed per chunk, as the projection)
        ssc = Float32(0.0)
        rv = cute.make_rmem_tensor((n, 2), Float32)
        pair = cute.make_rmem_tensor((2,), BFloat16)
        opair = cute.make_rmem_tensor((2,), BFloat16)

        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        for _k in cutlass.range(nk, unroll=1):
            pipe.consumer_wait(rst)
            st = rst.index
            sc = Float32(0.0)
            for q in cutlass.range_constexpr(8):
                cl = 2 * (cp0 + 4 * q)

                def tile_pair(t_, buf):
                    return cute.logical_divide(t_[None, None, buf], (None, cute.make_layout(2)))[tk, (None, cl // 2)]

                for j in cutlass.range_constexpr(n):
                    cute.autovec_copy(tile_pair(sO, st * n + j), pair)
                    rv[j, 0] = pair[0].to(Float32)
                    rv[j, 1] = pair[1].to(Float32)
                cute.autovec_copy(tile_pair(sX, st), pair)
                xb0 = pair[0].to(Float32)
                xb1 = pair[1].to(Float32)
                if const_expr(cfg.HAS_BIAS):
                    xb0 = xb0 + sB[cl, 0, st].to(Float32)
                    xb1 = xb1 + sB[cl + 1, 0, st].to(Float32)
                for i in cutlass.range_constexpr(n):
                    o0 = hp[i] * xb0
                    o1 = hp[i] * xb1
                    for j in cutlass.range_constexpr(n):
                        o0 = o0 + hr[i * n + j] * rv[j, 0]
                        o1 = o1 + hr[i * n + j] * rv[j, 1]
                    opair[0] = BFloat16(o0)
                    opair[1] = BFloat16(o1)
                    f0 = opair[0].to(Float32)
                    f1 = opair[1].to(Float32)
                    sc = sc + f0 * f0 + f1 * f1
                    cute.autovec_copy(opair, tile_pair(sO, st * n + i))
            y_ = sc - ssc
            t_s = ss + y_
            ssc = (t_s - ss) - y_
            ss = t_s
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=1, number_of_threads=256)   # every out tile of the stage written
            if const_expr(n > 1):   # both warpgroups have streams
                _proj_chunk(mma, acc, tot, comp, tA, tB, st, wc, n)
            else:
                if wc == 0:
                    _proj_chunk(mma, acc, tot, comp, tA, tB, st, wc, n)
            cute.arch.sync_warp()
            pipe.consumer_release(rst)
            rst.advance()

        # ---- warpgroup 1's projection sums into warpgroup 0's (shared memory), then p_proj; p_ss per token
        if wc == 1:
            for e in cutlass.range_constexpr(cute.size(tot)):
                t_, j_ = cAcc[e]
                sP[t_, j_] = tot[e]
        cute.arch.barrier(barrier_id=1, number_of_threads=256)
        if wc == 0:
            gP = cute.make_tensor(p_proj + r * T * cfg.NPAD, cute.make_layout((T, cfg.NPAD), stride=(cfg.NPAD, 1)))
            for e in cutlass.range_constexpr(cute.size(tot)):
                t_, j_ = cAcc[e]
                g_ = m * BM + t_
                v = tot[e]
                if const_expr(n > 1):
                    v = v + sP[t_, j_]
                if g_ < T and j_ < cfg.NPAD:
                    gP[g_, j_] = v
            if const_expr(cfg.NPAD > NP):   # p_proj's padding columns
                for jj in cutlass.range_constexpr(cfg.NPAD - NP):
                    if ct_ < BM:
                        if m * BM + ct_ < T:
                            gP[m * BM + ct_, NP + jj] = Float32(0.0)
        for sh in cutlass.range_constexpr(2):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << sh)
        if cidx % 4 == 0 and gt < T:
            gS = cute.make_tensor(p_ss + r * T, cute.make_layout(T))
            gS[gt] = ss


@cute.jit
def _host(cfg: cutlass.Constexpr, res: cute.Pointer, x: cute.Pointer, bias: cute.Pointer, w: cute.Pointer,
          hres: cute.Pointer, hpost: cute.Pointer, out: cute.Pointer, p_proj: cute.Pointer, p_ss: cute.Pointer,
          T: Int32, stream: CU.cuda.CUstream):
    n, C, N = cfg.n, cfg.C, cfg.N
    mR = cute.make_tensor(res, cute.make_layout((T, C, n), stride=(n * C, 1, C)))   # channel-contiguous rows
    mO = cute.make_tensor(out, cute.make_layout((T, C, n), stride=(n * C, 1, C)))
    mX = cute.make_tensor(x, cute.make_layout((T, C), stride=(C, 1)))
    mW = cute.make_tensor(w, cute.make_layout((N, C, n), stride=(n * C, 1, C)))
    mB = cute.make_tensor(bias, cute.make_layout((C, 1), stride=(1, C)))
    sO_l, sX_l, sW_l = _layouts(cfg)
    g2s, s2g = cpasync.CopyBulkTensorTileG2SOp(), cpasync.CopyBulkTensorTileS2GOp()
    one = cute.slice_(sO_l, (None, None, 0))
    tma_r, tR = cpasync.make_tiled_tma_atom(g2s, mR, one, (BM, CC))
    tma_o, tO = cpasync.make_tiled_tma_atom(s2g, mO, one, (BM, CC))
    tma_x, tX = cpasync.make_tiled_tma_atom(g2s, mX, cute.slice_(sX_l, (None, None, 0)), (BM, CC))
    tma_w, tW = cpasync.make_tiled_tma_atom(g2s, mW, cute.slice_(sW_l, (None, None, 0)), (cfg.NP, CC))
    tma_b, tB = cpasync.make_tiled_tma_atom(g2s, mB, cute.make_layout((CC, 1)), (CC, 1))
    _kernel(cfg, tma_r, tR, tma_o, tO, tma_x, tX, tma_w, tW, tma_b, tB, hres, hpost, p_proj, p_ss, T).launch(
        grid=(cfg.SPLIT * ((T + BM - 1) // BM), 1, 1), block=(THREADS, 1, 1), stream=stream, min_blocks_per_mp=1,
        preferred_smem_carveout=100)


@functools.lru_cache(maxsize=256)
def launch(cfg: PostPreFwdCuteCfg) -> CU.Launch:
    """run args (residual, x, bias (x when None), weight, h_res fp32, h_post fp32, out, p_proj [SPLIT, T, NPAD] fp32,
    p_ss [SPLIT, T] fp32, T)."""
    bf, f4 = CU.Ptr(torch.bfloat16, 16), CU.Ptr(torch.float32, 4)
    return CU.Launch(f"{_NAME}.fwd", _host, cfg, (bf, bf, bf, bf, f4, f4, bf, f4, f4, CU.Scalar(Int32)))


def representative_launches(n: int = 4, C: int = 7168) -> dict[str, CU.Launch]:
    """The kernel at one static shape, with and without bias (what the CPU compile test exports)."""
    N = n * n + 2 * n
    npad = 1 << (N - 1).bit_length()
    return {f"fwd_bias{b}": launch(PostPreFwdCuteCfg.heuristic(n, C, N, max(npad, 16), b)) for b in (True, False)}
