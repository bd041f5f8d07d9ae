"""CuTe DSL main kernel of mhc_post_pre's one-pass backward (Hopper sm_90a): d_total stays in registers.

Per token t, stream i, channel c (fp32), the gradient entering h_post_bda's backward is

    d_total[t,i,c] = dproj[t] @ weight[:, i, c] + coef[t] * out[t,i,c] + h_pre[t,i] * dlayer_in[t,c] + dout[t,i,c]

(mhc_pre's d(out) plus the incoming dout, summed in this order as cutile_post_pre_bwd.mhc_pp_bwd_one does;
coef = mhc_pre's RMS term -dr r^2 / (n C rms)), and h_post_bda's backward consumes it at once:

    dresidual[t,j,c] = sum_i h_res[t,i,j] d_total     dx[t,c] = sum_i h_post[t,i] d_total
    dh_res[t,i,j]    = sum_c d_total * residual[t,j,c]   dh_post[t,i] = sum_c d_total * (x + bias)[t,c]
    dbias[c]         = sum_t dx[t,c]

``out`` is recomputed from residual, x, bias and h (the forward's fp32 arithmetic, rounded to bf16: the
value mhc_pre read), so the pass reads dout, residual, x and dlayer_in and writes dresidual and dx:
3s + 3x bytes (s = one [T, n, C] stream). The fp32 d_total never reaches memory, so h_post_bda's fp32 dh
sums see no bf16 rounding of it (tests/mhc/test_mhc_post_pre.py's fp32 tolerance).

Why CuTe DSL: the cuTile one-pass kernel (mhc_pp_bwd_one) ran this pass at 1.1-1.6 TB/s (its per-row
sums over [16, n, TK] tiles); here a CTA owns 64 tokens over every SPLIT-th chunk of C, so the dh sums stay in
registers for the CTA's life (SPLIT partials a token, not one per C tile), and TMA streams the tiles.

CTA = 64 tokens (the wgmma M), 3 warpgroups (384 threads), walking C in chunks of 64 channels; SPLIT CTAs a row tile
(adjacent in launch order, so they run together): CTA r takes chunks r, r + SPLIT, ..., so the siblings stream
adjacent pieces (128 bytes with CW 32) of the same rows at about the same time (DRAM locality: H200, T=32768, n=4,
C=7168, this pass 1924 us at SPLIT 4 against 2003 unsplit, the mHC ledger, session 22); each writes its dh sums to
plane r of a scratch [SPLIT, T, ...] that cute_post_pre sums with torch.sum (deterministic; with SPLIT 1 the pass
stores dh itself):

* warp 0 (producer, 40 registers): per chunk, TMA loads into a STAGES-deep ring: dout and residual
  ([64 ch x 64 tok] channel-major, one box a stream), x and dlayer_in (one box each), bias, and the
  chunk's weight columns (both warpgroups' [NW, NP] B operands, from ``permuted_weight``'s copy). A
  stage released by the consumers holds the chunk's dresidual (in place of residual) and dx (in place of
  x); the producer stores them by TMA before it loads the stage again, and the last ones after its loop.
* warpgroups 1, 2 (consumers): warpgroup wc owns channels wc*32 .. wc*32 + 31 of each chunk, of every
  stream. Its wgmma m64 nNW (NW = 32 n) takes the chunk's weight columns ordered (8-channel block cb,
  stream i, 8 channels), so accumulator column 8 (cb n + i) + cc is stream i, channel cb*8 + cc: each
  thread holds, for its 2 tokens and 8 channels, every stream, and h_post_bda's stream mixing needs no
  exchange. dproj enters as three bf16 terms (hi, mid, lo: products exact, fp32 sums; as DP3 in the
  cuTile kernels, so d_total keeps fp32's precision), [64, NP] each, built once per CTA.
  Epilogue per (token, channel): out recomputed, d_total, dresidual and dx written in place over the
  stage (bf16), dh sums in registers, dbias summed over the warp's 16 tokens by shuffles, then over the
  warpgroup's 4 warps in warp order through shared memory (``sPB``, two buffers by chunk parity: one named
  barrier of the warpgroup a chunk); one dbias partial per row tile and chunk (``p_bias`` [row tiles, C],
  reduced in a fixed order by a cuTile kernel; a row a warp instead made the partials 4x larger: at T=32768,
  C=7168 58.7 MB written here and read by the reduction, 23 us of it, the mHC ledger, session 23; sPB's 2 KB cost
  n = 3 at C = 7168 its third stage, not measured). At the end warpgroup 1's dh sums go through shared memory to
  warpgroup 0's threads of the same tokens, which store dh_res [T, n, n] and dh_post [T, n] (fp32: WG0's + WG1's,
  in that order; with SPLIT > 1 into the CTA's plane). Deterministic, no atomics.

With DWPRE (cute_post_pre.SPLIT_DW) the pass also forms mhc_pre's dweight pre rows, whose dproj columns need dh_pre
and so could not come from the slices pass before it (cute_post_pre_dhdw): each thread writes the out it recomputed
(bf16, the value mhc_pre read) over the dout it read, both warpgroups meet at a named barrier, and each issues
D [64 ch, 8] = out^T @ Q (wgmma m64 n8, k = 64 tokens; A the dout slot as it lies, M-major; B ``sQ``: dproj's pre
columns as hi and mid bf16 terms, interleaved, so a thread's column pair 2j, 2j + 1 sums to pre column j) for
streams wc and wc + 2, before the stage is released. The row tile's partial goes to p_pre[row tile, j, i C + c] (fp32,
one writer each, summed in row-tile order after the pass). CW must be 32 (the chunk's 64 channels are the wgmma M).

Tails: TMA zero-fills loads past T and C (those d_total are 0: the weight copy is zero there too) and
clips the stores; partial stores skip channels past C and tokens past T.

Constraints (the spec's cute backend): n <= 4 (N = n*n + 2n <= 24, NP <= 32), bf16 dout / residual / x
/ dlayer_in / bias / weight, C % 8 == 0 (16-byte TMA row strides), fp32 h (bf16 h is staged to fp32
first, as the cuTile one-pass backward does), sm_90a; 256 T < 2**31 (the int32 offsets of the split planes, this
pass's and the forward pass's). Compile key: PostPreBwdCuteCfg (n, C, N and the
tiling, HAS_BIAS); T is a runtime scalar (the grid). Importing this module needs ``cutlass`` but no GPU.
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
from .reference import ZERO_ROW

_NAME = "mhc.cute_post_pre_bwd"
THREADS = 384
PRODUCER_REGS, CONSUMER_REGS = 40, 232
BM = 64    # tokens a CTA (the wgmma M)
TERMS = 3  # bf16 terms of dproj
SMEM_LIMIT = 225 * 1024  # of the 227 KiB a CTA may have
SPLIT_DEFAULT = 4        # CTAs a row tile (each takes every 4th chunk): the heuristic's


@dataclasses.dataclass(frozen=True)
class PostPreBwdCuteCfg:
    """Launch config = compile key (with the dtypes, all fixed). n, C, N: static dims; NP: N padded (16 or
    32, the wgmma k of each dproj term); STAGES: the ring; HAS_BIAS."""

    n: int
    C: int
    N: int
    NP: int = 32
    STAGES: int = 2
    HAS_BIAS: bool = True
    CW: int = 32   # channels of a chunk a consumer warpgroup owns (of every stream); a chunk is 2*CW
    SPLIT: int = 1  # CTAs a row tile: CTA (r, m) takes chunks r, r + SPLIT, ... and writes dh plane r
    DWPRE: bool = False  # also mhc_pre's dweight pre rows from the recomputed out: partials [row tiles, n, n C]
    # probe only, wrong results (benchmarks/probes/post_pre_pass_ab.py, power_probe.py: what leaving FFMAs out returns
    # under the board's power cap); cumulative, of the 72 FFMAs a (token, channel) at n = 4: 1 dh_res's sums (16),
    # 2 dh_post's (4), 3 dresidual's mixing (16: dresidual = d_total of its stream), 4 out's recompute (20: out =
    # residual of its stream). The heuristic never sets it; cute_post_pre refuses it.
    CUT: int = 0

    def __post_init__(self):
        if not 0 <= self.CUT <= 4:
            raise ValueError(f"mhc_post_pre cute bwd: CUT {self.CUT} (a probe's level) must be in 0..4")
        if not (1 <= self.n <= 4 and self.N == self.n * self.n + 2 * self.n and self.N <= self.NP
                and self.NP in (16, 32) and self.C % 8 == 0 and self.C > 0 and self.STAGES >= 2
                and self.CW in (16, 32) and 1 <= self.SPLIT <= self.nch and (self.CW == 32 or not self.DWPRE)):
            raise ValueError(f"mhc_post_pre cute bwd: config {self}: needs n <= 4, N = n*n + 2n <= NP in (16, 32), "
                             f"C % 8 == 0, STAGES >= 2, CW 16 or 32 (32 with DWPRE: the wgmma's M), "
                             f"1 <= SPLIT <= chunks")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"mhc_post_pre cute bwd: config {self} needs {self.smem_bytes} bytes of shared memory")

    @property
    def NW(self) -> int:
        """The consumer wgmma's N: CW channels x n streams."""
        return self.CW * self.n

    @property
    def CC(self) -> int:
        """Channels a chunk."""
        return 2 * self.CW

    @property
    def nch(self) -> int:
        return -(-self.C // self.CC)

    @property
    def tiles(self) -> int:
        """[64 ch x 64 tok] bf16 tiles a stage: dout and residual per stream, x, dlayer_in."""
        return 2 * self.n + 2

    @property
    def stage_bytes(self) -> int:
        return self.tiles * self.CC * BM * 2 + 2 * self.NW * self.NP * 2 + (self.CC * 2 if self.HAS_BIAS else 0)

    @property
    def smem_bytes(self) -> int:
        # the allocations (each 1024-aligned: sT, sW, sH, sB, sD, sPB, then the barriers)
        return (self.STAGES * (self.stage_bytes + 128) + TERMS * BM * self.NP * 2 + 2 * self.STAGES * 8 + 5 * 1024
                + BM * self.ND * 4 + (self.pb_bytes + 1024 if self.HAS_BIAS else 0) + (2048 if self.DWPRE else 0))

    @property
    def pb_bytes(self) -> int:
        """sPB: the dbias sums of each consumer warpgroup's 4 warps, [CW, 4 warps, 2 warpgroups, 2 parities] fp32."""
        return self.CW * 4 * 2 * 2 * 4

    @property
    def ND(self) -> int:
        """dh values a token: dh_post's n, then dh_res's n*n."""
        return self.n + self.n * self.n

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, n: int, C: int, N: int, has_bias: bool, CW: int = 32) -> "PostPreBwdCuteCfg":
        """Static dims only: NP the smallest of 16, 32 holding N; as many stages (<= 4) as fit; SPLIT = 4 CTAs a row
        tile (fewer when C has fewer chunks): sibling CTAs stream adjacent chunks of the same rows (H200, T=32768,
        n=4, C=7168: the pass 1891 us against 1962 unsplit, 1905 with 2; the mHC ledger, session 22)."""
        base = cls(n=n, C=C, N=N, NP=16 if N <= 16 else 32, STAGES=2, HAS_BIAS=has_bias, CW=CW)
        st = 2
        while st < 4 and _fits(base, st + 1):
            st += 1
        return dataclasses.replace(base, STAGES=st, SPLIT=min(SPLIT_DEFAULT, base.nch))


def with_dwpre(cfg: PostPreBwdCuteCfg) -> PostPreBwdCuteCfg | None:
    """cfg with DWPRE, at the most stages <= cfg's that fit beside sQ (n = 2 at C = 7168: 3 instead of 4), or None
    where DWPRE does not apply (CW 16)."""
    if cfg.CW != 32:
        return None
    try:
        q = dataclasses.replace(cfg, STAGES=2, DWPRE=True)
    except ValueError:   # (not even 2 stages fit beside sQ)
        return None
    return dataclasses.replace(q, STAGES=max(s for s in range(2, cfg.STAGES + 1) if _fits(q, s)))


def _fits(cfg: PostPreBwdCuteCfg, stages: int) -> bool:
    return dataclasses.replace(cfg, STAGES=2).smem_bytes + (stages - 2) * (cfg.stage_bytes + 144) <= SMEM_LIMIT


def permuted_weight(weight: torch.Tensor, cfg: PostPreBwdCuteCfg) -> torch.Tensor:
    """weight [N, n*C] bf16 -> [NP, nch * 2 * NW] bf16: column ((ch*2 + wc)*(CW/8) + cb)*8n + 8i + cc holds
    weight[:, i*C + c] with c = ch*2*CW + wc*CW + cb*8 + cc (zeros past C and in rows N..NP-1): the order of
    the consumers' accumulator columns."""
    n, C, N, NP, nch, CW = cfg.n, cfg.C, cfg.N, cfg.NP, cfg.nch, cfg.CW
    w = torch.zeros((NP, n, nch * cfg.CC), dtype=weight.dtype, device=weight.device)
    w[:N, :, :C] = weight.view(N, n, C)
    w = w.view(NP, n, nch, 2, CW // 8, 8).permute(0, 2, 3, 4, 1, 5)
    return w.reshape(NP, nch * 2 * cfg.NW).contiguous()


# ------------------------------------------------------------------ layouts


def _layouts(cfg):
    """(sT, sW, sH): the stage tiles [CC ch, BM tok] channel-major x tiles*STAGES (index stage*tiles +
    slot: dout i -> i, residual j -> n + j, x -> 2n, dlayer_in -> 2n + 1); the weight B operands [NW, NP]
    MN-major x 2*STAGES (index wc*STAGES + stage); dproj's terms as the A operand [BM, NP] K-major x 3; with DWPRE
    the pre columns' hi and mid terms interleaved (column 2j hi, 2j + 1 mid of pre column j; zeros past n) as the
    dweight wgmma's B operand [8, BM] K-major."""
    mn, km = LayoutEnum.COL_MAJOR, LayoutEnum.ROW_MAJOR
    sT = sm90_utils.make_smem_layout_a(mn, (cfg.CC, 16, BM), BFloat16, cfg.tiles * cfg.STAGES)
    sW = sm90_utils.make_smem_layout_b(mn, (BM, cfg.NW, cfg.NP), BFloat16, 2 * cfg.STAGES)
    sH = sm90_utils.make_smem_layout_a(km, (BM, cfg.NW, cfg.NP), BFloat16, TERMS)
    sQ = sm90_utils.make_smem_layout_b(km, (64, 8, BM), BFloat16, 1)
    return sT, sW, sH, sQ


# ------------------------------------------------------------------ kernel


@cute.jit
def _store_chunk(cfg: cutlass.Constexpr, tma_dres: cute.CopyAtom, tSs: cute.Tensor, tSg: cute.Tensor,
                 tma_dx: cute.CopyAtom, tXs: cute.Tensor, tXg: cute.Tensor, st: Int32, ch: Int32, m: Int32):
    """TMA stores of stage st (chunk ch of row tile m): dresidual from the residual slots, dx from x's; one
    bulk group, waited until read (the stage is loaded again next)."""
    base = st * cfg.tiles
    for j in cutlass.range_constexpr(cfg.n):
        cute.copy(tma_dres, tSs[None, base + cfg.n + j], tSg[None, ch, m, j])
    cute.copy(tma_dx, tXs[None, base + 2 * cfg.n], tXg[None, ch, m])
    cute.arch.cp_async_bulk_commit_group()
    cute.arch.cp_async_bulk_wait_group(0, read=True)


def bias_ring(smem, cc: int, stages: int):
    """The bias ring of both post_pre passes in ``smem``: [cc] bf16 a stage (cc <= 64), each stage's TMA destination
    128-byte aligned, i.e. 64 elements apart (64-byte stages faulted: a misaligned TMA destination, session 16)."""
    return smem.allocate_tensor(BFloat16, cute.make_layout((cc, 1, stages), stride=(1, cc, 64)), byte_alignment=128)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_dout: cute.CopyAtom, mDout: cute.Tensor, tma_res: cute.CopyAtom,
            mRes: cute.Tensor, tma_dres: cute.CopyAtom, mDres: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
            tma_dg: cute.CopyAtom, mDg: cute.Tensor, tma_dx: cute.CopyAtom, mDx: cute.Tensor,
            tma_w: cute.CopyAtom, mW: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
            dproj: cute.Pointer, dr: cute.Pointer, r: cute.Pointer, hres: cute.Pointer, hpost: cute.Pointer,
            hpre_t: cute.Pointer, p_bias: cute.Pointer, dh_res: cute.Pointer, dh_post: cute.Pointer,
            p_pre: cute.Pointer, T: Int32, eps: Float32):
    n, C, N, NP, S, NW, NT = cfg.n, cfg.C, cfg.N, cfg.NP, cfg.STAGES, cfg.NW, cfg.tiles
    CW, CC, SP = cfg.CW, cfg.CC, cfg.SPLIT
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    m = bid // SP   # the row tile; siblings r = 0 .. SP-1 of one tile are adjacent in launch order
    r_ = bid - m * SP
    nk = (cfg.nch - r_ + SP - 1) // SP   # this CTA's chunks: r_, r_ + SP, ...
    gdim, _, _ = cute.arch.grid_dim()
    ntm = gdim // SP
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    if warp == 0:
        CU.prefetch_tma(tma_dout, tma_res, tma_dres, tma_x, tma_dg, tma_dx, tma_w)
        if const_expr(cfg.HAS_BIAS):
            CU.prefetch_tma(tma_b)

    smem = cutlass.memory.SmemAllocator()
    sT_l, sW_l, sH_l, sQ_l = _layouts(cfg)
    _, sT = _smem_tensor(smem, sT_l)
    _, sW = _smem_tensor(smem, sW_l)
    _, sH = _smem_tensor(smem, sH_l)
    if const_expr(cfg.DWPRE):
        _, sQ = _smem_tensor(smem, sQ_l)
    sB = bias_ring(smem, CC, S)
    # warpgroup 1's dh sums of its tokens, for warpgroup 0 (column k: dh value k)
    sD = smem.allocate_tensor(Float32, cute.make_layout((BM, cfg.ND)), byte_alignment=16)
    if const_expr(cfg.HAS_BIAS):   # the warps' dbias sums of a chunk: [channel, warp, warpgroup, chunk parity]
        sPB = smem.allocate_tensor(Float32, cute.make_layout((CW, 4, 2, 2)), byte_alignment=16)
    pipe = CU.tma_pipeline(smem, S, cfg.stage_bytes, 8)

    # the [C, T]-like tensors tiled [CC, BM]: (tile, chunk, row tile[, stream])
    tDs, tDg = CU.tma_tiles(tma_dout, sT, mDout, (CC, BM))
    _, tRg = CU.tma_tiles(tma_res, sT, mRes, (CC, BM))
    _, tSg = CU.tma_tiles(tma_dres, sT, mDres, (CC, BM))
    _, tXg = CU.tma_tiles(tma_x, sT, mX, (CC, BM))
    _, tGg = CU.tma_tiles(tma_dg, sT, mDg, (CC, BM))
    _, tOg = CU.tma_tiles(tma_dx, sT, mDx, (CC, BM))
    tWs, tWg = CU.tma_tiles(tma_w, sW, mW, (NW, NP))
    tBs, tBg = CU.tma_tiles(tma_b, sB, mB, (CC, 1), (None, 0))

    if wg == 0:
        cute.arch.setmaxregister_decrease(PRODUCER_REGS)
        if warp == 0:
            def load(st, k, bar):
                ch = r_ + k * SP
                base = st * NT
                for i in cutlass.range_constexpr(n):
                    cute.copy(tma_dout, tDg[None, ch, m, i], tDs[None, base + i], tma_bar_ptr=bar)
                    cute.copy(tma_res, tRg[None, ch, m, i], tDs[None, base + n + i], tma_bar_ptr=bar)
                cute.copy(tma_x, tXg[None, ch, m], tDs[None, base + 2 * n], tma_bar_ptr=bar)
                cute.copy(tma_dg, tGg[None, ch, m], tDs[None, base + 2 * n + 1], tma_bar_ptr=bar)
                for w_ in cutlass.range_constexpr(2):
                    cute.copy(tma_w, tWg[None, 2 * ch + w_, 0], tWs[None, w_ * S + st], tma_bar_ptr=bar)
                if const_expr(cfg.HAS_BIAS):
                    cute.copy(tma_b, tBg[None, ch], tBs[None, st], tma_bar_ptr=bar)

            def store(st, k):   # the stage's dresidual / dx, in its residual and x slots
                _store_chunk(cfg, tma_dres, tDs, tSg, tma_dx, tDs, tOg, st, r_ + k * SP, m)

            CU.ring_producer(pipe, S, nk, load, store)
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS)
        wc = wg - 1
        cidx = tidx - 128                 # 0 .. 255 over both consumer warpgroups
        ct_ = tidx - 128 * wg
        wq = ct_ // 32                    # warp within the warpgroup
        lane = cute.arch.lane_idx()
        kf = Float32(n * C)
        t_base = m * BM

        # ---- dproj's three bf16 terms [BM, NP] (zeros past N and T): thread cidx takes token cidx // 4,
        # columns (cidx % 4) * NP/4 ..
        QC = NP // 4
        tk = cidx // 4
        gt = t_base + tk
        dp = cute.make_tensor(dproj, cute.make_layout((T, N), stride=(N, 1)))
        for q in cutlass.range_constexpr(QC):
            j = (cidx % 4) * QC + q
            v = Float32(0.0)
            if j < N and gt < T:
                v = dp[gt, j]
            hi = BFloat16(v)
            r1 = v - hi.to(Float32)
            mid = BFloat16(r1)
            lo = BFloat16(r1 - mid.to(Float32))
            sH[tk, j, 0] = hi
            sH[tk, j, 1] = mid
            sH[tk, j, 2] = lo
            if const_expr(cfg.DWPRE and q < 4 and q < QC):   # the threads cidx % 4 == 0 hold columns 0 .. 3 (j = q)
                if cidx % 4 == 0:
                    qh = BFloat16(0.0)
                    qm = BFloat16(0.0)
                    if const_expr(q < n):
                        qh = hi
                        qm = mid
                    sQ[2 * q, tk, 0] = qh
                    sQ[2 * q + 1, tk, 0] = qm
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=1, number_of_threads=256)

        mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.COL_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(BM, NW))
        thr0 = mma.get_slice(0)
        tA = mma.make_fragment_A(thr0.partition_A(sH))
        tB = mma.make_fragment_B(thr0.partition_B(sW))
        cAcc = mma.get_slice(ct_).partition_C(cute.make_identity_tensor((BM, NW)))
        acc = cute.make_rmem_tensor(cAcc.shape, Float32)
        t0 = cAcc[0][0]        # this thread's first token (local); the other is t0 + 8
        cq = cAcc[0][1]        # its first channel within each 8-channel block (0, 2, 4, 6)
        if const_expr(cfg.DWPRE):
            # dweight's pre rows of the chunk: [64 ch, 8] += out^T [64 ch, 64 tok] (the dout slot, out written over
            # it) @ the pre terms [64 tok, 8] (wgmma m64 n8, k = 64 tokens), streams wc and wc + 2
            mma_q = sm90_utils.make_trivial_tiled_mma(
                BFloat16, BFloat16, LayoutEnum.COL_MAJOR.sm90_mma_major_mode(),
                LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1), tiler_mn=(64, 8))
            thr_q = mma_q.get_slice(0)
            tQa = mma_q.make_fragment_A(thr_q.partition_A(sT))
            tQb = mma_q.make_fragment_B(thr_q.partition_B(sQ))
            cQ = mma_q.get_slice(ct_).partition_C(cute.make_identity_tensor((64, 8)))
            accq0 = cute.make_rmem_tensor(cQ.shape, Float32)
            accq1 = cute.make_rmem_tensor(cQ.shape, Float32)
            accqs = (accq0, accq1)
            NSW = (n - wc + 1) // 2
            jq = cQ[0][1] // 2   # the thread's pre column: its accumulator columns 2 jq (hi), 2 jq + 1 (mid)
            gQ = cute.make_tensor(p_pre + m * n * n * C, cute.make_layout((n, n * C), stride=(n * C, 1)))

        # ---- per-token constants of the thread's two tokens (zeros past T)
        hr = cute.make_rmem_tensor((2, n, n), Float32)
        hp = cute.make_rmem_tensor((2, n), Float32)
        hq = cute.make_rmem_tensor((2, n), Float32)
        coef = cute.make_rmem_tensor((2,), Float32)
        gHr = cute.make_tensor(hres, cute.make_layout((T, n, n), stride=(n * n, n, 1)))
        gHp = cute.make_tensor(hpost, cute.make_layout((T, n), stride=(n, 1)))
        gHq = cute.make_tensor(hpre_t, cute.make_layout((n, T), stride=(T, 1)))
        gR = cute.make_tensor(r, cute.make_layout(T))
        gDr = cute.make_tensor(dr, cute.make_layout(T))
        for h in cutlass.range_constexpr(2):
            tg = t_base + t0 + 8 * h
            ok = tg < T
            rr = Float32(1.0)
            gr = Float32(0.0)
            if ok:
                rr = gR[tg]
                gr = gDr[tg]
            rms = Float32(1.0) / rr - eps
            cf = -gr * rr * rr / (kf * rms)
            if rms <= eps * Float32(ZERO_ROW):  # a zero row (reference.ZERO_ROW): 0, NaN for a NaN dr
                cf = gr * Float32(0.0)
            coef[h] = cf
            for i in cutlass.range_constexpr(n):
                a = Float32(0.0)
                b = Float32(0.0)
                if ok:
                    a = gHp[tg, i]
                    b = gHq[i, tg]
                hp[h, i] = a
                hq[h, i] = b
                for j in cutlass.range_constexpr(n):
                    c_ = Float32(0.0)
                    if ok:
                        c_ = gHr[tg, i, j]
                    hr[h, i, j] = c_
        dhr = cute.make_rmem_tensor((2, n, n), Float32)
        dhp = cute.make_rmem_tensor((2, n), Float32)
        dhr.fill(0.0)
        dhp.fill(0.0)
        db = cute.make_rmem_tensor((CW // 8, 2), Float32)
        pair = cute.make_rmem_tensor((2,), BFloat16)
        rv = cute.make_rmem_tensor((n, 2), Float32)     # residual of the (token, channel pair), every stream
        gv = cute.make_rmem_tensor((n, 2), Float32)     # dout
        dv = cute.make_rmem_tensor((n,), Float32)       # d_total of one (token, channel)
        xv = cute.make_rmem_tensor((2,), Float32)
        av = cute.make_rmem_tensor((2,), Float32)
        bv = cute.make_rmem_tensor((2,), Float32)
        pb = cute.make_tensor(p_bias, cute.make_layout((ntm, C), stride=(C, 1)))

        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        for k_ in cutlass.range(nk, unroll=1):
            ch = r_ + k_ * SP
            pipe.consumer_wait(rst)
            st = rst.index
            warpgroup.fence()
            for term in cutlass.range_constexpr(TERMS):
                for kb in cutlass.range_constexpr(NP // 16):
                    mma.set(warpgroup.Field.ACCUMULATE, term + kb != 0)
                    cute.gemm(mma, acc, tA[None, None, kb, term], tB[None, None, kb, wc * S + st], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            base = st * NT
            db.fill(0.0)
            for h in cutlass.range_constexpr(2):
                tl = t0 + 8 * h
                for cb in cutlass.range_constexpr(CW // 8):
                    cl = wc * CW + cb * 8 + cq      # the pair's first channel within the chunk

                    def tile_pair(slot):
                        return cute.logical_divide(sT[None, None, base + slot], (cute.make_layout(2), None))[
                            (None, cl // 2), tl]

                    for i in cutlass.range_constexpr(n):
                        cute.autovec_copy(tile_pair(i), pair)
                        gv[i, 0] = pair[0].to(Float32)
                        gv[i, 1] = pair[1].to(Float32)
                        cute.autovec_copy(tile_pair(n + i), pair)
                        rv[i, 0] = pair[0].to(Float32)
                        rv[i, 1] = pair[1].to(Float32)
                    cute.autovec_copy(tile_pair(2 * n), pair)
                    xv[0] = pair[0].to(Float32)
                    xv[1] = pair[1].to(Float32)
                    cute.autovec_copy(tile_pair(2 * n + 1), pair)
                    av[0] = pair[0].to(Float32)
                    av[1] = pair[1].to(Float32)
                    if const_expr(cfg.HAS_BIAS):
                        bv[0] = sB[cl, 0, st].to(Float32)
                        bv[1] = sB[cl + 1, 0, st].to(Float32)
                    dres = cute.make_rmem_tensor((n, 2), BFloat16)
                    dxp = cute.make_rmem_tensor((2,), BFloat16)
                    ov = cute.make_rmem_tensor((n, 2), BFloat16)
                    for e in cutlass.range_constexpr(2):
                        xb = xv[e]
                        if const_expr(cfg.HAS_BIAS):
                            xb = xb + bv[e]
                        for i in cutlass.range_constexpr(n):
                            o = rv[i, e]
                            if const_expr(cfg.CUT < 4):
                                o = hp[h, i] * xb
                                for j in cutlass.range_constexpr(n):
                                    o = o + hr[h, i, j] * rv[j, e]
                            ov[i, e] = BFloat16(o)
                            ob = ov[i, e].to(Float32)
                            q = e + 2 * h + 4 * (cb * n + i)
                            dv[i] = acc[q] + coef[h] * ob + hq[h, i] * av[e] + gv[i, e]
                        gx = Float32(0.0)
                        for i in cutlass.range_constexpr(n):
                            gx = gx + hp[h, i] * dv[i]
                        dxp[e] = BFloat16(gx)
                        db[cb, e] = db[cb, e] + gx
                        for j in cutlass.range_constexpr(n):
                            s_ = dv[j]
                            if const_expr(cfg.CUT < 3):
                                s_ = Float32(0.0)
                                for i in cutlass.range_constexpr(n):
                                    s_ = s_ + hr[h, i, j] * dv[i]
                            dres[j, e] = BFloat16(s_)
                        for i in cutlass.range_constexpr(n):
                            if const_expr(cfg.CUT < 2):
                                dhp[h, i] = dhp[h, i] + dv[i] * xb
                            if const_expr(cfg.CUT < 1):
                                for j in cutlass.range_constexpr(n):
                                    dhr[h, i, j] = dhr[h, i, j] + dv[i] * rv[j, e]
                    for j in cutlass.range_constexpr(n):
                        cute.autovec_copy(dres[j, None], tile_pair(n + j))
                    cute.autovec_copy(dxp, tile_pair(2 * n))
                    if const_expr(cfg.DWPRE):   # out over the dout it was read from (this thread's pairs only)
                        for i in cutlass.range_constexpr(n):
                            cute.autovec_copy(ov[i, None], tile_pair(i))
            if const_expr(cfg.DWPRE):
                # both warpgroups' out in the dout slots (each wrote its 32 channels of every stream), then the
                # chunk's pre rows of dweight; the stage is released once the wgmma has read it
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=1, number_of_threads=256)
                warpgroup.fence()
                for q in cutlass.range_constexpr(2):
                    if q < NSW:
                        for kb in cutlass.range_constexpr(BM // 16):
                            mma_q.set(warpgroup.Field.ACCUMULATE, kb != 0)
                            cute.gemm(mma_q, accqs[q], tQa[None, None, kb, base + wc + 2 * q], tQb[None, None, kb, 0],
                                      accqs[q])
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                for q in cutlass.range_constexpr(2):
                    if q < NSW:
                        if jq < n:
                            for h in cutlass.range_constexpr(2):   # fragment rows (channels) r0, r0 + 8
                                c = ch * CC + cQ[2 * h][0]
                                if c < C:
                                    gQ[jq, (wc + 2 * q) * C + c] = accqs[q][2 * h] + accqs[q][2 * h + 1]
            CU.release_read_stage(pipe, rst)  # its stores read by TMA, its loads done before the refill
            rst.advance()
            if const_expr(cfg.HAS_BIAS):
                # the warp's 16 tokens: lanes with the same lane % 4 hold the same channels
                for cb in cutlass.range_constexpr(CW // 8):
                    for e in cutlass.range_constexpr(2):
                        v = db[cb, e]
                        for sh in cutlass.range_constexpr(3):
                            v = v + cute.arch.shuffle_sync_bfly(v, offset=4 << sh)
                        db[cb, e] = v
                # then the warpgroup's 4 warps in warp order: lane l of warp 0 sums channel l (the buffer of this
                # chunk's parity: a warp writes it again two chunks on, after the next barrier, which warp 0 reaches
                # only once it has read it)
                par = k_ % 2
                if lane < 4:
                    for cb in cutlass.range_constexpr(CW // 8):
                        sPB[cb * 8 + cq, wq, wc, par] = db[cb, 0]
                        sPB[cb * 8 + cq + 1, wq, wc, par] = db[cb, 1]
                cute.arch.barrier(barrier_id=2 + wc, number_of_threads=128)
                if wq == 0 and lane < CW:
                    v = sPB[lane, 0, wc, par]
                    for w_ in cutlass.range_constexpr(1, 4):
                        v = v + sPB[lane, w_, wc, par]
                    c = ch * CC + wc * CW + lane
                    if c < C:
                        pb[m, c] = v

        # ---- the warpgroup's dh sums over its channels: the 4 lanes of a token
        for h in cutlass.range_constexpr(2):
            for i in cutlass.range_constexpr(n):
                v = dhp[h, i]
                for sh in cutlass.range_constexpr(2):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << sh)
                dhp[h, i] = v
                for j in cutlass.range_constexpr(n):
                    v = dhr[h, i, j]
                    for sh in cutlass.range_constexpr(2):
                        v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << sh)
                    dhr[h, i, j] = v
        # warpgroup 1's sums to shared memory; warpgroup 0's threads of the same tokens add them (WG0 + WG1)
        if lane % 4 == 0 and wc == 1:
            for h in cutlass.range_constexpr(2):
                tl = t0 + 8 * h
                for i in cutlass.range_constexpr(n):
                    sD[tl, i] = dhp[h, i]
                    for j in cutlass.range_constexpr(n):
                        sD[tl, n + i * n + j] = dhr[h, i, j]
        cute.arch.barrier(barrier_id=1, number_of_threads=256)
        if lane % 4 == 0 and wc == 0:
            gDhr = cute.make_tensor(dh_res + r_ * T * n * n, cute.make_layout((T, n, n), stride=(n * n, n, 1)))
            gDhp = cute.make_tensor(dh_post + r_ * T * n, cute.make_layout((T, n), stride=(n, 1)))
            for h in cutlass.range_constexpr(2):
                tl = t0 + 8 * h
                tg = t_base + tl
                if tg < T:
                    for i in cutlass.range_constexpr(n):
                        gDhp[tg, i] = dhp[h, i] + sD[tl, i]
                        for j in cutlass.range_constexpr(n):
                            gDhr[tg, i, j] = dhr[h, i, j] + sD[tl, n + i * n + j]


@cute.jit
def _host(cfg: cutlass.Constexpr, dout: cute.Pointer, res: cute.Pointer, x: cute.Pointer, dg: cute.Pointer,
          bias: cute.Pointer, wp: cute.Pointer, dproj: cute.Pointer, dr: cute.Pointer, r: cute.Pointer,
          hres: cute.Pointer, hpost: cute.Pointer, hpre_t: cute.Pointer, dres: cute.Pointer, dx: cute.Pointer,
          p_bias: cute.Pointer, dh_res: cute.Pointer, dh_post: cute.Pointer, p_pre: cute.Pointer, T: Int32,
          eps: Float32, stream: CU.cuda.CUstream):
    n, C, CC = cfg.n, cfg.C, cfg.CC
    Q = cfg.nch * 2 * cfg.NW

    def streams(p):   # [T, n, C] seen (C, T, n): channel-major tiles, the stream a batch mode
        return cute.make_tensor(p, cute.make_layout((C, T, n), stride=(1, n * C, C)))

    def plain(p):     # [T, C] seen (C, T)
        return cute.make_tensor(p, cute.make_layout((C, T), stride=(1, C)))

    sT_l, sW_l, _, _ = _layouts(cfg)
    one = cute.slice_(sT_l, (None, None, 0))
    g2s, s2g = cpasync.CopyBulkTensorTileG2SOp(), cpasync.CopyBulkTensorTileS2GOp()
    tma_dout, tDout = cpasync.make_tiled_tma_atom(g2s, streams(dout), one, (CC, BM))
    tma_res, tRes = cpasync.make_tiled_tma_atom(g2s, streams(res), one, (CC, BM))
    tma_dres, tDres = cpasync.make_tiled_tma_atom(s2g, streams(dres), one, (CC, BM))
    tma_x, tX = cpasync.make_tiled_tma_atom(g2s, plain(x), one, (CC, BM))
    tma_dg, tDg = cpasync.make_tiled_tma_atom(g2s, plain(dg), one, (CC, BM))
    tma_dx, tDx = cpasync.make_tiled_tma_atom(s2g, plain(dx), one, (CC, BM))
    mW = cute.make_tensor(wp, cute.make_layout((Q, cfg.NP), stride=(1, Q)))
    tma_w, tW = cpasync.make_tiled_tma_atom(g2s, mW, cute.slice_(sW_l, (None, None, 0)), (cfg.NW, cfg.NP))
    mB = cute.make_tensor(bias, cute.make_layout((C, 1), stride=(1, C)))
    tma_b, tB = cpasync.make_tiled_tma_atom(g2s, mB, cute.make_layout((CC, 1)), (CC, 1))
    _kernel(cfg, tma_dout, tDout, tma_res, tRes, tma_dres, tDres, tma_x, tX, tma_dg, tDg, tma_dx, tDx, tma_w, tW,
            tma_b, tB, dproj, dr, r, hres, hpost, hpre_t, p_bias, dh_res, dh_post, p_pre, T, eps).launch(
        grid=(cfg.SPLIT * ((T + BM - 1) // BM), 1, 1), block=(THREADS, 1, 1), stream=stream, min_blocks_per_mp=1,
        preferred_smem_carveout=100)


@functools.lru_cache(maxsize=256)
def launch(cfg: PostPreBwdCuteCfg) -> CU.Launch:
    """run args (dout, residual, x, dlayer_in, bias (x when None), permuted weight, dproj, dr, r, h_res fp32,
    h_post fp32, h_pre^T [n, T] fp32, dresidual, dx, p_bias [row tiles, C], dh_res [SPLIT, T, n, n] and dh_post
    [SPLIT, T, n] (fp32, contiguous; the leading dim absent with SPLIT 1), with DWPRE dweight's pre-row partials
    [row tiles, n, n C] fp32 (out; else any fp32 stand-in, untouched), T, eps)."""
    bf, f4 = CU.Ptr(torch.bfloat16, 16), CU.Ptr(torch.float32, 4)
    sig = (bf, bf, bf, bf, bf, bf, f4, f4, f4, f4, f4, f4, bf, bf, f4, f4, f4, f4, CU.Scalar(Int32),
           CU.Scalar(Float32))
    return CU.Launch(f"{_NAME}.one", _host, cfg, sig)


def representative_launches(n: int = 4, C: int = 7168) -> dict[str, CU.Launch]:
    """The kernel at one static shape, with and without bias (what the CPU compile test exports)."""
    N = n * n + 2 * n
    return {**{f"one_bias{b}": launch(PostPreBwdCuteCfg.heuristic(n, C, N, b)) for b in (True, False)},
            "one_dwpre": launch(with_dwpre(PostPreBwdCuteCfg.heuristic(n, C, N, True)))}
