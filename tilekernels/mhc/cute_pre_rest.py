"""CuTe DSL kernel for the elementwise rest of mhc_pre's split backward mix (SIMT, Hopper sm_90a; compiles for
sm_100a): what cutile_pre.mhc_pre_bwd_rest computes, one thread a token. Used by mhc_post_pre's cute backend
(cute_post_pre), which runs the rest twice a step (SPLIT_DW: first with dh_pre read as 0 for dproj's post / res
columns, then with dh_pre), and by mhc_pre's cute backend (cute_pre, once); its cutile backend keeps the cuTile
kernel.

Per token t (columns j < N = n*n + 2n in the order pre | post | res; alpha_j = a_pre, a_post, a_res by section):

    h_j     = r[t] * proj[t, j] * alpha_j + bias[j]
    sg_j    = sigmoid(h_j)                                  (j < 2n)
    dh_j    = dpre[t, j] * sg_j (1 - sg_j)                  (j < n)
            = 2 dhpost[t, j - n] * sg_j (1 - sg_j)          (n <= j < 2n)
            = dlres[t, i, k]                                (j = 2n + i n + k: mhc_pre_bwd_sk's res-logit gradient)
    dproj[t, j] = dh_j * r[t] * alpha_j  (columns N .. LDP-1 of a padded row: 0)
    dr[t]       = sum_j dh_j * proj[t, j] * alpha_j
    hpre_t[i, t] = sg_i  (i < n)
    p_db[b, j]  = sum over the TT tokens of CTA b of dh_j (columns N .. NPAD-1: 0)

dpre [T, n] fp32, proj [T, N] fp32, r [T] fp32, bias [N] fp32, dhpost [T, n] fp32 or bf16, dlres [T, NP, NP] fp32
(NP = n padded to a power of two), dproj [T, LDP] fp32 (LDP = N, or NPAD for the padded dproj0), dr [T] fp32,
hpre_t [n, T] fp32, p_db [cdiv(T, TT), NPAD] fp32; all contiguous. DPROJ_ONLY (the first of the two runs): dpre is
not read (taken as 0) and only dproj is written.

Why: the cuTile kernel assembles its [TT, NPAD] tiles column by column and ran several times its traffic's floor;
mhc_post_pre runs the rest twice a step. A CTA stages its TT rows of proj, dlres, dpre and dhpost through shared
memory (contiguous, so a warp's accesses are adjacent; NT = 4 TT threads load them, so each has few loads and all are
in flight at once; rows W + 1 floats apart, so a thread reading its row meets no bank conflict), a thread then takes
a token, and dproj leaves the same way; read and written straight from the
threads (a warp's accesses 4 N bytes apart) the rows cost several times more. Measured times: the mHC ledger
(benchmarks/results/nvidia-h200-mhc-cutile.md, session 29).

Deterministic: p_db sums over the warp by butterfly shuffles, then over the warps in order through shared memory
(cute_post_bda's CTA sums).
Tokens past T (the last CTA) load nothing and add 0. Compile key: PreRestCuteCfg and dhpost's dtype; T is runtime.
Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as CU
from tilekernels._glue import next_pow2

from .cute_post_bda import _cta_sums_store, _ptr, _vec

_NAME = "mhc.cute_pre_rest"


def smem16(sizes) -> int:
    """Bytes of shared memory of allocations of these sizes, each 16-byte aligned."""
    return sum(-(-b // 16) * 16 for b in sizes)


class TokenCtaCfg:
    """What the configs of the SIMT token kernels here (cute_pre_rest, cute_pp_mix, cute_sk_bwd) share: n streams
    (N = n*n + 2n projection columns), a CTA of NT threads over TT tokens, rows staged in at most 48 KB of shared
    memory (``smem_bytes``)."""

    @property
    def N(self) -> int:
        return self.n * self.n + 2 * self.n

    def _check_cta(self, extra_bad: bool = False, extra: str = "") -> None:
        name = type(self).__name__
        if self.TT % 32 or not 32 <= self.TT <= self.NT <= 1024 or self.NT % self.TT or extra_bad:
            raise ValueError(f"{name}: TT a multiple of 32, TT <= NT <= 1024, NT a multiple of TT{extra}: {self}")
        if self.smem_bytes > 48 * 1024:
            raise ValueError(f"{name}: {self.smem_bytes} bytes of shared memory, more than 48 KB: {self}")


@dataclasses.dataclass(frozen=True)
class PreRestCuteCfg(TokenCtaCfg):
    """Launch config (compile key, with dhpost's dtype). n: streams; NP: n padded to a power of two (dlres's rows);
    NPAD: p_db's row length (mhc_pre's padded projection width); LDP: dproj's row stride (N or NPAD); TT: tokens a
    CTA (the p_db tile: the caller's cdiv(T, TT) rows; its first TT threads take one each); NT: threads a CTA (all
    load the rows and store dproj: fewer loads a thread, all in flight at once); DPROJ_ONLY: dh_pre taken as 0, dproj
    alone written."""

    n: int
    NP: int
    NPAD: int
    LDP: int
    TT: int = 128
    DPROJ_ONLY: bool = False
    NT: int = 512

    def __post_init__(self):
        if not (self.n >= 1 and self.NP >= self.n and self.NPAD >= self.N and self.LDP in (self.N, self.NPAD)):
            raise ValueError(f"PreRestCuteCfg: NP >= n, NPAD >= N = n*n + 2n, LDP N or NPAD: {self}")
        self._check_cta(self.NPAD > self.TT, ", TT at least NPAD")

    @property
    def smem_bytes(self) -> int:
        """The staged rows (proj, dlres, dpre | dhpost, dproj; W + 1 floats a row) and the p_db sums' buffers, with
        each allocation's 16-byte alignment."""
        tiles = [self.TT * (w + 1) * 4 for w in (self.N, self.NP * self.NP, 2 * self.n, self.LDP)]
        return smem16(tiles + [2 * self.NT // 32 * self.NPAD * 4])


def _alpha(j: int, n: int, a_pre, a_post, a_res):
    """alpha of column j (its section fixed at trace time)."""
    return a_pre if j < n else (a_post if j < 2 * n else a_res)


@cute.jit
def _load_rows(src: cute.Pointer, base, cnt, buf: cute.Tensor, W: cutlass.Constexpr, TT: cutlass.Constexpr, tid,
               NT: cutlass.Constexpr = 0):
    """buf[k] = src[base + e] (as fp32), e = k * NT + tid clamped to cnt - 1 (cnt >= 1): the loads of the CTA's
    contiguous rows [TT, W] of a row-major source by NT threads (0: TT; buf holds ceil(W TT / NT)), unconditional (a
    warp's accesses adjacent), so every array's loads are in flight before the first store to shared memory
    (``_store_rows``)."""
    nt = NT if NT else TT
    for k in cutlass.range_constexpr(-(-W * TT // nt)):
        e = cutlass.min(k * nt + tid, cnt - 1)
        buf[k] = _vec(src, base + e, 1)[0].to(Float32)


@cute.jit
def _store_rows(buf: cute.Tensor, cnt, sm: cute.Tensor, c0: cutlass.Constexpr, W: cutlass.Constexpr,
                TT: cutlass.Constexpr, tid, NT: cutlass.Constexpr = 0):
    """sm[e // W, c0 + e % W] = buf[k] for e = k * NT + tid < cnt (``_load_rows``'s values in place)."""
    nt = NT if NT else TT
    for k in cutlass.range_constexpr(-(-W * TT // nt)):
        e = k * nt + tid
        if e < cnt:
            sm[e // W, c0 + e % W] = buf[k]


@cute.jit
def _stage_out(dst: cute.Pointer, base, cnt, sm: cute.Tensor, c0: cutlass.Constexpr, W: cutlass.Constexpr,
               TT: cutlass.Constexpr, tid, NT: cutlass.Constexpr = 0):
    """dst[base + e] = sm[e // W, c0 + e % W] for e < cnt: columns c0 .. c0 + W - 1 of the TT staged rows, coalesced
    (as _load_rows), by NT threads (0: TT)."""
    nt = NT if NT else TT
    for k in cutlass.range_constexpr(-(-W * TT // nt)):
        e = k * nt + tid
        if e < cnt:
            cute.arch.store(dst + (base + e), sm[e // W, c0 + e % W])


def _cta_tokens(TT: int, T):
    """(tid, b, t, rows, row0, tc) of a token kernel's thread (traced inline): its thread and CTA index, its token
    b * TT + tid, the CTA's token count (TT but in the last CTA), its first token (64-bit), and tc, the token (64-bit,
    clamped to T - 1) whose per-token values the thread loads: threads past TT (NT > TT) repeat the first TT's
    addresses, so their loads fetch nothing the CTA does not read anyway."""
    tid, _, _ = cute.arch.thread_idx()
    b, _, _ = cute.arch.block_idx()
    return (tid, b, b * TT + tid, cutlass.min(T - b * TT, TT), Int64(b) * TT,
            Int64(cutlass.min(b * TT + tid % TT, T - 1)))


def _rows_smem(smem, TT: int, W: int):
    """[TT, W] fp32 shared tile, rows W + 1 apart (odd: a thread a row reads conflict-free)."""
    return smem.allocate_tensor(Float32, cute.make_layout((TT, W), stride=(W + 1, 1)), 16)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, dpre: cute.Pointer, proj: cute.Pointer, r: cute.Pointer, bias: cute.Pointer,
            dhpost: cute.Pointer, dlres: cute.Pointer, dproj: cute.Pointer, dr: cute.Pointer, hpre_t: cute.Pointer,
            p_db: cute.Pointer, a_pre: Float32, a_post: Float32, a_res: Float32, T: Int32):
    n, N, NP, NPAD, LDP, TT, NT = cfg.n, cfg.N, cfg.NP, cfg.NPAD, cfg.LDP, cfg.TT, cfg.NT
    NL = NP * NP
    tid, b, t, rows, row0, tc = _cta_tokens(TT, T)
    smem = SmemAllocator()
    sP, sL, sU, sD = (_rows_smem(smem, TT, w) for w in (N, NL, 2 * n, LDP))
    red = smem.allocate_tensor(Float32, cute.make_layout((2, NT // 32, NPAD), stride=(NT // 32 * NPAD, NPAD, 1)), 16)
    # r, bias and the CTA's rows of proj, dlres, dpre and dhpost: every load issued first (no global store or
    # shared-memory store in between to order them), then the rows into shared memory, then a thread a token
    bP = cute.make_rmem_tensor((N,), Float32)
    bL = cute.make_rmem_tensor((NL,), Float32)
    bU = cute.make_rmem_tensor((n,), Float32)
    bH = cute.make_rmem_tensor((n,), Float32)
    _load_rows(proj, row0 * N, rows * N, bP, N, TT, tid, NT)
    _load_rows(dlres, row0 * NL, rows * NL, bL, NL, TT, tid, NT)
    if cutlass.const_expr(not cfg.DPROJ_ONLY):
        _load_rows(dpre, row0 * n, rows * n, bU, n, TT, tid, NT)
    _load_rows(dhpost, row0 * n, rows * n, bH, n, TT, tid, NT)
    rr = cute.arch.load(r + tc, Float32)
    bv = cute.make_rmem_tensor((N,), Float32)
    for j in cutlass.range_constexpr(N):
        bv[j] = cute.arch.load(bias + j, Float32)
    _store_rows(bP, rows * N, sP, 0, N, TT, tid, NT)
    _store_rows(bL, rows * NL, sL, 0, NL, TT, tid, NT)
    if cutlass.const_expr(not cfg.DPROJ_ONLY):
        _store_rows(bU, rows * n, sU, 0, n, TT, tid, NT)
    _store_rows(bH, rows * n, sU, n, n, TT, tid, NT)
    cute.arch.sync_threads()
    dh = cute.make_rmem_tensor((NPAD,), Float32)
    sgp = cute.make_rmem_tensor((n,), Float32)
    for j in cutlass.range_constexpr(NPAD):
        dh[j] = Float32(0.0)
    if tid < TT and t < T:
        t64 = Int64(t)
        s = Float32(0.0)
        for j in cutlass.range_constexpr(N):
            al = _alpha(j, n, a_pre, a_post, a_res)
            d = Float32(0.0)
            pj = sP[tid, j]
            if cutlass.const_expr(j >= 2 * n):
                k = j - 2 * n
                d = sL[tid, (k // n) * NP + k % n]
            elif cutlass.const_expr(j >= n or not cfg.DPROJ_ONLY):
                h = rr * pj * al + bv[j]
                sg = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-h, fastmath=True))
                if cutlass.const_expr(j < n):
                    sgp[j] = sg
                    d = sU[tid, j] * sg * (Float32(1.0) - sg)
                else:
                    d = Float32(2.0) * sU[tid, j] * sg * (Float32(1.0) - sg)
            dh[j] = d
            sD[tid, j] = d * rr * al
            s = s + d * pj * al
        for j in cutlass.range_constexpr(N, LDP):
            sD[tid, j] = Float32(0.0)
        if cutlass.const_expr(not cfg.DPROJ_ONLY):
            cute.arch.store(dr + t64, s)
            for j in cutlass.range_constexpr(n):
                cute.arch.store(hpre_t + (Int64(j) * T + t64), sgp[j])
    cute.arch.sync_threads()
    _stage_out(dproj, row0 * LDP, rows * LDP, sD, 0, LDP, TT, tid, NT)
    if cutlass.const_expr(not cfg.DPROJ_ONLY):   # p_db[b] = the CTA's sums (columns N .. NPAD-1: sums of 0)
        _cta_sums_store(dh, red, 0, tid, b, p_db, p_db, NPAD, NPAD, NT)   # threads past TT add zeros


@cute.jit
def _host(cfg: cutlass.Constexpr, dpre: cute.Pointer, proj: cute.Pointer, r: cute.Pointer, bias: cute.Pointer,
          dhpost: cute.Pointer, dlres: cute.Pointer, dproj: cute.Pointer, dr: cute.Pointer, hpre_t: cute.Pointer,
          p_db: cute.Pointer, a_pre: Float32, a_post: Float32, a_res: Float32, T: Int32, stream: CU.cuda.CUstream):
    k = _kernel(cfg, dpre, proj, r, bias, dhpost, dlres, dproj, dr, hpre_t, p_db, a_pre, a_post, a_res, T)
    k.launch(grid=(cute.ceil_div(T, cfg.TT), 1, 1), block=(cfg.NT, 1, 1), stream=stream)


@functools.lru_cache(maxsize=256)
def launch(cfg: PreRestCuteCfg, hdt: torch.dtype) -> CU.Launch:
    """run args (dpre, proj, r, bias, dhpost, dlres, dproj, dr, hpre_t, p_db, a_pre, a_post, a_res, T): the
    tensors contiguous, as the module docstring's (dpre, dr, hpre_t, p_db may be None with DPROJ_ONLY); T >= 1."""
    f = _ptr(torch.float32, 1)
    sig = (f, f, f, f, _ptr(hdt, 1), f, f, f, f, f,
           CU.Scalar(Float32), CU.Scalar(Float32), CU.Scalar(Float32), CU.Scalar(Int32))
    return CU.Launch(f"{_NAME}.rest", _host, cfg, sig)


@functools.lru_cache(maxsize=256)
def _launch_for(n: int, NP: int, NPAD: int, LDP: int, TT: int, dproj_only: bool, hdt: torch.dtype) -> CU.Launch:
    """launch() of a call's static dims (cached: the config's checks run once per shape, not per backward)."""
    return launch(PreRestCuteCfg(n=n, NP=NP, NPAD=NPAD, LDP=LDP, TT=TT, DPROJ_ONLY=dproj_only), hdt)


def run_rest(dpre, proj, r, bias, dhpost, dlres, dproj, dr, hpre_t, p_db, a_pre: float, a_post: float, a_res: float,
             n: int, NP: int, NPAD: int, TT: int, dproj_only: bool = False) -> None:
    """cutile_pre.mhc_pre_bwd_rest's arguments (its Launch record's args), run by this kernel; ``dproj_only``: the
    first of mhc_post_pre's two runs (dh_pre 0, dproj alone written). Nothing runs at T = 0."""
    T = proj.shape[0]
    if T == 0:
        return
    bias, dhpost = bias.contiguous(), dhpost.contiguous()
    outs = (None,) * 3 if dproj_only else (dr, hpre_t, p_db)
    _launch_for(n, NP, NPAD, dproj.shape[1], TT, dproj_only, dhpost.dtype).run(
        None if dproj_only else dpre, proj, r, bias, dhpost, dlres, dproj, *outs, float(a_pre), float(a_post),
        float(a_res), T)


def representative_launches(n: int = 4) -> dict[str, CU.Launch]:
    """Both variants at one static shape (what the CPU compile test exports)."""
    N = n * n + 2 * n
    npad = max(16, next_pow2(N))   # mhc_pre's padded projection width (cutile_proj_rms)
    return {"rest": launch(PreRestCuteCfg(n, next_pow2(n), npad, N), torch.float32),
            "rest0": launch(PreRestCuteCfg(n, next_pow2(n), npad, npad, DPROJ_ONLY=True), torch.float32)}
