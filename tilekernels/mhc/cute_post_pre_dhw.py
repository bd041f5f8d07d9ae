"""CuTe DSL pass of mhc_post_pre's backward (Hopper sm_90a): mhc_pre's dh_pre and its whole dweight from one read of
the saved out from DRAM, its CTAs in step through a device-wide exchange.

With out [T, n, C] (the new streams, bf16), dlayer_in [T, C] (bf16) and dproj [T, N] (fp32, N = n*n + 2n, columns
pre | post | res):

    dh_pre[t, i]  = sum_c dlayer_in[t, c] * out[t, i, c]                       (fp32, [T, n])
    dproj[t, i]   = dh_pre[t, i] * s (1 - s) * r[t] * alpha_pre, s = sigmoid(r[t] proj[t, i] alpha_pre + hbias[i])
    dweight[j, :] = sum_t dproj[t, j] * out[t, :]                              (bf16, [N, n*C])

Only dproj's n pre columns depend on dh_pre: its post and res columns are computed before this pass (mhc_pre's mix
with dh_pre read as 0, into ``dproj0`` [T, NPAD]); the pre columns come from dh_pre here (the mix runs again after
the pass, with dh_pre). Before, the dh_pre pass and the dweight pass read out once each (H200, T=32768, n=4, C=7168:
534 + 442 us). Here a CTA owns a 64-channel slice of every stream (S = cdiv(C, 64) CTAs, all resident: S <= the SM
count, checked by the caller) and walks the token groups of 64:

* P step (consumers, group k): the slice's partial dh_pre [64 tokens, n] from the out and dlayer_in tiles, stored to
  a ring of R partial slots in global memory, each float with its group's tag (one 8-byte relaxed store: value,
  k + 1), so a reader tells a partial of group k from an older one in the slot without any reset;
* reducers (warpgroup 3, groups in turn; CTA s reduces tokens s, s + S, ..): load the S partials of their token until
  every tag is the group's, sum them in a fixed order (lane-strided, then a butterfly: deterministic), store dh_pre
  and the token's dproj pre values (tagged, release stores) into ``dpp``;
* fetchers (warps 1-3, groups in turn): load a group's 64 x 4 dpp values until every tag is set, fence (acquire),
  put them in a shared-memory slot and arrive on its mbarrier;
* product step (consumers, group g = k - LAG): the out tiles of g again (TMA, from L2: read LAG groups earlier) and
  dproj0's rows, [hi | lo] of the group's dproj (the fetched pre columns, dproj0's post / res: bf16 hi and lo as
  in cute_proj_rms, products exact, fp32 sums), dweight += [hi | lo]^T @ out (wgmma m64 n64, k = 64 tokens). The
  CTA owns its slice's dweight columns over every token and stores them at the end: no partials, no reduction.

LAG groups between a group's P step and its product step cover the exchange's latency without holding out in shared
memory (the first version kept it there: its lag of at most 4 groups stalled every group, 2.5-4.3 ms for this pass
at the shape above; the mHC ledger, session 24). The slot a P step overwrites was read by its reducers before:
their dpp release, the fetcher's acquire and the consumers' mbarrier wait order it (R > LAG).

CTA = 4 warpgroups (512 threads): warp 0 the TMA producer (ring P: out, one [64 ch, 64 tok] box a stream, and
dlayer_in, for the P step; ring M: out again and dproj0's rows, for the product step), warps 1-3 the fetchers,
warpgroups 1 and 2 the consumers (warpgroup c takes streams c and c + 2), warpgroup 3 the reducers. Every wait on
another CTA traps after ~2**24 polls instead of hanging.

Tails: TMA zero-fills tokens past T and channels past C (partials and products 0); tokens past T store nothing and
are not fetched (0); dweight columns past C are not stored.

Status (off by default: cute_post_pre.FUSE_DHW): correct (float64 tests, bitwise deterministic, memcheck 0 errors,
racecheck 0 hazards; initcheck not run yet) and slower. H200, T=32768, n=4, C=7168: this pass 4.0 ms at the default
config (3.1-8.3 across the configs tried) against the two passes' 534 + 447 us. The same rings and products without
the exchange (SKEL) take 1.49 ms: 112 CTAs with two 2-stage rings keep too few bytes in flight. Each group's
exchange (S partial stores, a reducer's poll, its release, a fetcher's poll and fence) costs several loaded L2 round
trips. Numbers and the earlier design: the mHC ledger, session 24, and benchmarks/results/h200-mhc-post-pre-dhw.txt.

Constraints: n <= 4, N <= 32, C % 8 == 0, bf16 out / dlayer_in, fp32 dproj0 / proj / r / hbias, contiguous. Compile
key: PostPreDhwCuteCfg (n, C, N, NPAD and the ring depths); T is a runtime scalar. Importing this module needs
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
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as CU

from .cute_post_pre_dhdw import SliceCfg, slice_mma, slice_tma_atoms, store_slice_rows
from .cute_proj_rms import _smem_tensor

_NAME = "mhc.cute_post_pre_dhw"
THREADS = 512
SIDE_REGS, CONSUMER_REGS = 56, 200   # warpgroups 0 and 3 / 1 and 2 (2 * 128 * 56 + 256 * 200 = 65536)
BM = 64        # tokens a group (the wgmma k of the dweight products: 4 x 16)
CW = 64        # channels of each stream a CTA owns
NP = 32        # dproj columns padded: hi rows 0..NP-1, lo rows NP..2NP-1 of the 64-row operand
NQ = 4         # partial / dpp values a token (n padded)
FETCHERS = 3   # warps 1..3
REDUCERS = 4   # warpgroup 3
SMEM_LIMIT = 225 * 1024
SPIN_LIMIT = 1 << 24


@dataclasses.dataclass(frozen=True)
class PostPreDhwCuteCfg(SliceCfg):
    """Launch config = compile key. n, C, N: static dims; NPAD: dproj0's row width (mhc_pre's padded N, 16 or 32);
    SP / SM: ring P / ring M stages; LAG: groups between a group's P step and its product step; R: partial slots
    (> LAG); FS: fetched slots (a multiple of FETCHERS: each fetcher owns its slots)."""

    n: int
    C: int
    N: int
    NPAD: int
    SP: int = 2
    SM: int = 2
    LAG: int = 8
    R: int = 10
    FS: int = 6
    # probe only: the rings and products without the exchange (no waits on other CTAs; wrong dweight)
    SKEL: bool = False

    def __post_init__(self):
        self.check("dhw", self.LAG >= 1 and self.SP >= 2 and self.SM >= 2 and self.R >= self.LAG + 1
                   and self.FS % FETCHERS == 0 and self.FS > 0,
                   f"LAG >= 1, SP >= 2, SM >= 2, R > LAG, FS a multiple of {FETCHERS}")

    @property
    def tiles(self) -> int:
        """[64 ch, 64 tok] bf16 tiles: ring P's (n out + dlayer_in a stage), then ring M's (n out a stage)."""
        return (self.n + 1) * self.SP + self.n * self.SM

    @property
    def smem_bytes(self) -> int:
        return (self.tiles * CW * BM * 2 + self.SM * BM * self.NPAD * 4 + 2 * 64 * BM * 2 + self.FS * BM * NQ * 4
                + 2 * (self.SP + self.SM + self.FS) * 8 + 4 * 1024)

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, n: int, C: int, N: int, NPAD: int) -> "PostPreDhwCuteCfg":
        """Rings P and M of 2 stages, LAG 8 (the out tiles of ~8 groups, 8 x 3.7 MB at n=4, C=7168, stay in L2
        between their two reads), 6 fetched slots (a fetch may start 6 groups before its product step)."""
        return cls(n=n, C=C, N=N, NPAD=NPAD)


def scratch_words(cfg: PostPreDhwCuteCfg, T: int) -> tuple[int, int]:
    """int64 words of the partial slots [R, S, 64, 4] and of dpp [cdiv(T, 64) * 64, 4] (tagged values; zeroed before
    each launch: tag 0 is never a group's)."""
    return cfg.R * cfg.S * BM * NQ, -(-T // BM) * BM * NQ


# ------------------------------------------------------------------ helpers


@dsl_user_op
def _nanosleep(ns, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [Int32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;", "r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def _trap(*, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], "trap;", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


def _pack(v, tag) -> Int64:
    """(tag << 32) | bits(v): a tagged fp32 value, stored with one 8-byte (single-copy atomic) store."""
    return (Int64(tag) << 32) | (Int64(CU.f32_bits(v)) & Int64(0xFFFFFFFF))


def _tag(w) -> Int32:
    return Int32(w >> 32)


@cute.jit
def _spin(k: Int32) -> Int32:
    """One more poll of a wait on another CTA: a short sleep, a trap past SPIN_LIMIT (a missing write is a bug: an
    error beats a hang)."""
    _nanosleep(32)
    if k > SPIN_LIMIT:
        _trap()
    return k + 1


def _put_hi_lo(sHw, col, tok, x) -> None:
    """Row col (hi) and NP + col (lo) of token tok's [hi | lo] column: bf16(x) and bf16(x - hi)."""
    hi = BFloat16(x)
    sHw[col, tok] = hi
    sHw[NP + col, tok] = BFloat16(x - hi.to(Float32))


@cute.jit
def _slice_dh_half(sT: cute.Tensor, o_slot: Int32, l_slot: Int32, t: Int32, hh: Int32, pv: cute.Tensor,
                  lv: cute.Tensor) -> Float32:
    """sum over channel half hh (32 of the tile's 64) of out * dlayer_in at token t: the out tile sT[.., o_slot] and
    the dlayer_in tile sT[.., l_slot] (16-byte shared-memory loads into pv / lv)."""
    ot = cute.logical_divide(sT[None, None, o_slot], (cute.make_layout(8), None))
    lt = cute.logical_divide(sT[None, None, l_slot], (cute.make_layout(8), None))
    v = Float32(0.0)
    for q in cutlass.range_constexpr(4):
        cute.autovec_copy(ot[(None, hh * 4 + q), t], pv)
        cute.autovec_copy(lt[(None, hh * 4 + q), t], lv)
        for e in cutlass.range_constexpr(8):
            v = v + pv[e].to(Float32) * lv[e].to(Float32)
    return v


def _layouts(cfg):
    """(sT, sH): [CW ch, BM tok] channel-major tiles (the dweight wgmma's N-major B: ring P stage a, slot i < n out
    stream i, slot n dlayer_in at a*(n+1) + i; ring M stage b, stream i at (n+1)*SP + b*n + i); [hi | lo] as the
    wgmma's M-major A [64 rows, BM tok] x 2 (one a consumer warpgroup)."""
    mn = LayoutEnum.COL_MAJOR
    sT = sm90_utils.make_smem_layout_a(mn, (CW, 16, BM), BFloat16, cfg.tiles)
    sH = sm90_utils.make_smem_layout_a(mn, (64, 16, BM), BFloat16, 2)
    return sT, sH


# ------------------------------------------------------------------ kernel


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_o: cute.CopyAtom, mO: cute.Tensor, tma_l: cute.CopyAtom, mL: cute.Tensor,
            tma_d: cute.CopyAtom, mD: cute.Tensor, proj: cute.Pointer, r: cute.Pointer, hb: cute.Pointer,
            dpre: cute.Pointer, part: cute.Pointer, dpp: cute.Pointer, dw: cute.Pointer, T: Int32, a_pre: Float32):
    n, C, N, SP, SMr, LAG, R, FS, NPD = cfg.n, cfg.C, cfg.N, cfg.SP, cfg.SM, cfg.LAG, cfg.R, cfg.FS, cfg.NPAD
    S = cfg.S
    MB = (n + 1) * SP   # ring M's first tile
    tidx, _, _ = cute.arch.thread_idx()
    s, _, _ = cute.arch.block_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    lane = cute.arch.lane_idx()
    G = (T + BM - 1) // BM
    if warp == 0:
        CU.prefetch_tma(tma_o, tma_l, tma_d)

    smem = cutlass.memory.SmemAllocator()
    sT_l, sH_l = _layouts(cfg)
    sT_raw, sT = _smem_tensor(smem, sT_l)
    _, sH = _smem_tensor(smem, sH_l)
    sD = smem.allocate_tensor(Float32, cute.make_layout((NPD, BM, SMr), stride=(1, NPD, NPD * BM)),
                              byte_alignment=128)
    sF = smem.allocate_tensor(Float32, cute.make_layout((BM * NQ, FS)), byte_alignment=16)
    fbar = smem.allocate_array(Int64, 2 * FS, byte_alignment=8)   # full[f], then empty[f]
    pipe_p = CU.tma_pipeline(smem, SP, (n + 1) * CW * BM * 2, 8)
    pipe_m = CU.tma_pipeline(smem, SMr, n * CW * BM * 2 + BM * NPD * 4, 8)
    if tidx == 0:
        for f in cutlass.range_constexpr(FS):   # every lane of the fetcher / thread of the consumers arrives: each
            cute.arch.mbarrier_init(fbar + f, 32)     # releases its own shared-memory accesses (racecheck clean)
            cute.arch.mbarrier_init(fbar + FS + f, 256)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()
    tTs, tOg = CU.tma_tiles(tma_o, sT, mO, (CW, BM))
    _, tLg = CU.tma_tiles(tma_l, sT, mL, (CW, BM))
    tDs, tDg = CU.tma_tiles(tma_d, sD, mD, (NPD, BM))
    p64, d64 = part, dpp

    if wg == 0:
        cute.arch.setmaxregister_decrease(SIDE_REGS)
        if warp == 0:
            # ---- producer: ring P for group k, then ring M for group k - LAG
            pp_ = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, SP)
            pm = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, SMr)
            for k in cutlass.range(G + LAG, unroll=1):
                if k < G:
                    pipe_p.producer_acquire(pp_)
                    bar = pipe_p.producer_get_barrier(pp_)
                    for i in cutlass.range_constexpr(n):
                        cute.copy(tma_o, tOg[None, s, k, i], tTs[None, pp_.index * (n + 1) + i], tma_bar_ptr=bar)
                    cute.copy(tma_l, tLg[None, s, k], tTs[None, pp_.index * (n + 1) + n], tma_bar_ptr=bar)
                    pipe_p.producer_commit(pp_)
                    pp_.advance()
                if k >= LAG:
                    g = k - LAG
                    pipe_m.producer_acquire(pm)
                    bar = pipe_m.producer_get_barrier(pm)
                    for i in cutlass.range_constexpr(n):
                        cute.copy(tma_o, tOg[None, s, g, i], tTs[None, MB + pm.index * n + i], tma_bar_ptr=bar)
                    cute.copy(tma_d, tDg[None, 0, g], tDs[None, pm.index], tma_bar_ptr=bar)
                    pipe_m.producer_commit(pm)
                    pm.advance()
        elif const_expr(not cfg.SKEL):
            # ---- fetcher warp w takes groups w-1, w-1+3, ...: the 64 x 4 dpp values of a group (lane: 8 of them,
            # its 2 tokens') once every tag is set (loaded before the slot is free: the wait overlaps the loads),
            # then into slot g % FS (FS a multiple of 3: the warp's own slots)
            vals = cute.make_rmem_tensor((8,), Float32)
            for g in cutlass.range(warp - 1, G, FETCHERS, unroll=1):
                ok = Int32(0)
                k = Int32(0)
                while ok == 0:
                    good = cutlass.Boolean(True)
                    for e in cutlass.range_constexpr(8):
                        idx = lane * 8 + e
                        tg = g * BM + idx // NQ
                        v = Float32(0.0)
                        if tg < T:
                            w_ = cute.arch.load(d64 + g * BM * NQ + idx, Int64, sem="relaxed", scope="gpu")
                            good = good & (_tag(w_) == 1)
                            v = CU.bits_f32(Int32(w_))
                        vals[e] = v
                    ok = Int32(cute.arch.vote_all_sync(good))
                    if ok == 0:
                        k = _spin(k)
                cute.arch.fence_acq_rel_gpu()
                f = g % FS
                cute.arch.mbarrier_wait(fbar + FS + f, ((g // FS) % 2) ^ 1)
                for e in cutlass.range_constexpr(8):
                    sF[lane * 8 + e, f] = vals[e]
                cute.arch.mbarrier_arrive(fbar + f)
    elif wg == 3:
        cute.arch.setmaxregister_decrease(SIDE_REGS)
        if s < BM and not cfg.SKEL:
            # ---- reducer warp wr takes groups wr, wr + REDUCERS, ...; tokens s, s + S, .. of each
            wr = warp - 12
            NL = (S + 31) // 32
            vals = cute.make_rmem_tensor((NL * NQ,), Float32)
            acc = cute.make_rmem_tensor((NQ,), Float32)
            for g in cutlass.range(wr, G, REDUCERS, unroll=1):
                slot = g % R
                for t in cutlass.range(s, BM, S, unroll=1):
                    tg = g * BM + t
                    ok = Int32(0)
                    k = Int32(0)
                    while ok == 0:
                        good = cutlass.Boolean(True)
                        for q in cutlass.range_constexpr(NL):
                            src = lane + 32 * q
                            for e in cutlass.range_constexpr(NQ):
                                v = Float32(0.0)
                                if src < S:
                                    w_ = cute.arch.load(p64 + ((slot * S + src) * BM + t) * NQ + e, Int64,
                                                        sem="relaxed", scope="gpu")
                                    good = good & (_tag(w_) == g + 1)
                                    v = CU.bits_f32(Int32(w_))
                                vals[q * NQ + e] = v
                        ok = Int32(cute.arch.vote_all_sync(good))
                        if ok == 0:
                            k = _spin(k)
                    for e in cutlass.range_constexpr(NQ):
                        a = Float32(0.0)
                        for q in cutlass.range_constexpr(NL):
                            a = a + vals[q * NQ + e]
                        for sh in cutlass.range_constexpr(5):
                            a = a + cute.arch.shuffle_sync_bfly(a, offset=16 >> sh)
                        acc[e] = a
                    if lane < NQ and tg < T:
                        d = acc[0]
                        for e in cutlass.range_constexpr(1, NQ):
                            if lane == e:
                                d = acc[e]
                        x = Float32(0.0)
                        if lane < n:
                            rr = cute.arch.load(r + tg, Float32)
                            h = rr * cute.arch.load(proj + tg * N + lane, Float32) * a_pre + cute.arch.load(
                                hb + lane, Float32)
                            sg = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-h, fastmath=True))
                            cute.arch.store(dpre + tg * n + lane, d)
                            x = d * sg * (Float32(1.0) - sg) * rr * a_pre
                        cute.arch.store(d64 + tg * NQ + lane, _pack(x, 1), sem="release", scope="gpu")
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS)
        wc = wg - 1
        ct = tidx - 128 * wg

        mma, tA, tB, cAcc, acc0, acc1 = slice_mma(sT, sH, ct)
        NSW = (n - wc + 1) // 2          # streams of this warpgroup: wc, wc + 2 (< n)
        accs = (acc0, acc1)
        sHw = sH[None, None, wc]

        # the P step's thread map: token pair tp (tokens tp, tp + 32), slot kk of this warpgroup (stream wc + 2 kk),
        # channel half hh (4 chunks of 8)
        hh = ct % 2
        kk = (ct // 2) % 2
        tp = ct // 4
        si = wc + 2 * kk
        pv = cute.make_rmem_tensor((8,), BFloat16)
        lv = cute.make_rmem_tensor((8,), BFloat16)
        # the HL step's: token ct // 2, columns (ct % 2) * 16 .. of [0, NP)
        tok = ct // 2
        j0 = (ct % 2) * 16

        rp = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SP)
        rm = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SMr)
        for k in cutlass.range(G + LAG, unroll=1):
            if k < G:
                # ---- P step: this warpgroup's streams' partial dh_pre of group k over the CTA's 64 channels
                pipe_p.consumer_wait(rp)
                slot = k % R
                for half in cutlass.range_constexpr(2):
                    t = tp + 32 * half
                    v = Float32(0.0)
                    if si < n:
                        v = _slice_dh_half(sT, rp.index * (n + 1) + si, rp.index * (n + 1) + n, t, hh, pv, lv)
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=1)
                    if hh == 0:
                        cute.arch.store(p64 + ((slot * S + s) * BM + t) * NQ + si, _pack(v, k + 1), sem="relaxed",
                                        scope="gpu")
                CU.release_read_stage(pipe_p, rp)
                rp.advance()
            if k >= LAG:
                g = k - LAG
                # ---- product step of group g: its out tiles and dproj0 rows (ring M), its fetched pre columns
                f = g % FS
                pipe_m.consumer_wait(rm)
                if const_expr(not cfg.SKEL):
                    cute.arch.mbarrier_wait(fbar + f, (g // FS) % 2)
                for j in cutlass.range_constexpr(16):
                    col = j0 + j
                    x = Float32(0.0)
                    if col < n:
                        x = sF[tok * NQ + col, f]
                    elif col < N:
                        x = sD[col, tok, rm.index]
                    _put_hi_lo(sHw, col, tok, x)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=2 + wc, number_of_threads=128)
                warpgroup.fence()
                for q in cutlass.range_constexpr(2):
                    if q < NSW:
                        i = wc + 2 * q
                        for kb in cutlass.range_constexpr(BM // 16):
                            if const_expr(kb == 0):
                                mma.set(warpgroup.Field.ACCUMULATE, g != 0)
                            else:
                                mma.set(warpgroup.Field.ACCUMULATE, True)
                            cute.gemm(mma, accs[q], tA[None, None, kb, wc], tB[None, None, kb, MB + rm.index * n + i],
                                      accs[q])
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                CU.release_read_stage(pipe_m, rm)
                rm.advance()
                if const_expr(not cfg.SKEL):
                    cute.arch.mbarrier_arrive(fbar + FS + f)
                # the next group's [hi | lo] overwrites sHw: every warp of the warpgroup past its wgmma first
                cute.arch.barrier(barrier_id=2 + wc, number_of_threads=128)

        # ---- dweight columns of this CTA's slice: hi + lo rows through shared memory (ring P's tiles: consumed by
        # both warpgroups once the barrier below passes), bf16 stores
        cute.arch.barrier(barrier_id=1, number_of_threads=256)
        scr = cute.make_tensor(cute.recast_ptr(sT_raw.iterator + wc * (64 * (CW + 1) * 4), dtype=Float32),
                               cute.make_layout((64, CW), stride=(CW + 1, 1)))
        wrow = cute.make_tensor(dw, cute.make_layout((N, n * C), stride=(n * C, 1)))

        def put(j, col, v):
            wrow[j, col] = BFloat16(v)

        for q in cutlass.range_constexpr(2):
            if q < NSW:
                store_slice_rows(accs[q], cAcc, scr, ct, s * CW + ct % CW, wc + 2 * q, C, N, 2 + wc, put)


@cute.jit
def _host(cfg: cutlass.Constexpr, out: cute.Pointer, dli: cute.Pointer, dproj0: cute.Pointer, proj: cute.Pointer,
          r: cute.Pointer, hb: cute.Pointer, dpre: cute.Pointer, part: cute.Pointer, dpp: cute.Pointer,
          dw: cute.Pointer, T: Int32, a_pre: Float32, stream: CU.cuda.CUstream):
    _kernel(cfg, *slice_tma_atoms(cfg, _layouts(cfg)[0], out, dli, dproj0, T), proj, r, hb, dpre, part, dpp, dw, T,
            a_pre).launch(
        grid=(cfg.S, 1, 1), block=(THREADS, 1, 1), stream=stream, min_blocks_per_mp=1, preferred_smem_carveout=100)


# ------------------------------------------------------------------ Python entry points


@functools.lru_cache(maxsize=256)
def launch(cfg: PostPreDhwCuteCfg) -> CU.Launch:
    """run args (out [T, n, C] bf16, dlayer_in [T, C] bf16, dproj0 [T, NPAD] (post / res columns), proj [T, N],
    r [T], hbias [N], dh_pre [T, n] (out), partial slots and dpp (int64 [scratch_words], zeroed), dweight [N, n C]
    bf16 (out), T, alpha_pre); fp32 but the int64 scratch, contiguous."""
    bf, f4 = CU.Ptr(torch.bfloat16, 16), CU.Ptr(torch.float32, 4)
    i8 = CU.Ptr(torch.int64, 16)
    sig = (bf, bf, CU.Ptr(torch.float32, 16), f4, f4, f4, f4, i8, i8, CU.Ptr(torch.bfloat16, 2), CU.Scalar(Int32),
           CU.Scalar(Float32))
    return CU.Launch(f"{_NAME}.dhw", _host, cfg, sig)


def representative_launches(n: int = 4, C: int = 7168) -> dict[str, CU.Launch]:
    """The pass at one static shape (what the CPU compile test exports)."""
    N = n * n + 2 * n
    return {"dhw": launch(PostPreDhwCuteCfg.heuristic(n, C, N, 32 if N > 16 else 16))}
