"""CuTe DSL kernel for the Sinkhorn backward of mhc_pre's split backward mix (SIMT, Hopper sm_90a; compiles for
sm_100a): what cutile_pre.mhc_pre_bwd_sk computes, a thread a token. mhc_post_pre's cute backend runs it (CUTE_SK);
so does mhc_pre's cute backend (cute_pre); its cutile backend keeps the cuTile kernel.

Per token t (the res logits of h: L[i][k] = r[t] proj[t, 2n + i n + k] a_res + bias[2n + i n + k], i, k < n):

    M_0 = exp(L - rowmax(L)); for s = 1 .. ITERS: R_s = M_{s-1} / rs_s, M_s = R_s / cs_s
        (rs_s = rowsum(M_{s-1}) + eps, cs_s = colsum(R_s) + eps: kept, 2n values a step)
    g = dh_res[t]; for s = ITERS .. 1 (M_s rebuilt backwards by multiplying the sums back in):
        g = (g - colsum(g * M_s)) / cs_s;  R_s = M_s * cs_s
        g = (g - rowsum(g * R_s)) / rs_s;  M_{s-1} = R_s * rs_s
    dlres[t, i, k] = g M_0 - [k is row i's first maximal entry] * rowsum(g M_0)     (entries past n: 0)

proj [T, N] fp32, r [T] fp32, bias [N] fp32, dh_res [T, n, n] fp32 or bf16 -> dlres [T, NP, NP] fp32 (NP = n padded
to a power of two; the padded entries 0), all contiguous. The divides: approximate reciprocals with APPROX (the
cuTile kernel's div.approx), else IEEE-rounded.

Why: the cuTile kernel keeps the 2n sums a step in a global scratch [ITERS, 2n, T] (21 MB at T=32768, n=4) and ran
~26 us; here they stay in shared memory ([ITERS * 2n, TT], a token a column: conflict-free), and the rows of proj and
dh_res come in (NT threads, every load issued before the first store) and dlres leaves staged through shared memory,
coalesced. Measured times: the mHC ledger (benchmarks/results/nvidia-h200-mhc-cutile.md).

Tokens past T (the last CTA) load clamped addresses and store nothing. Compile key: SkBwdCuteCfg and dh_res's dtype;
T is runtime. Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as CU

from .cute_post_bda import _ptr
from .cute_pp_mix import _at, _exp_rowmax, _recip, _scale_line
from .cute_pre_rest import TokenCtaCfg, _cta_tokens, _load_rows, _rows_smem, _stage_out, _store_rows, smem16

_NAME = "mhc.cute_sk_bwd"


@dataclasses.dataclass(frozen=True)
class SkBwdCuteCfg(TokenCtaCfg):
    """Launch config (compile key, with dh_res's dtype). n: streams; NP: n padded to a power of two (dlres's rows);
    ITERS: Sinkhorn steps; APPROX: approximate reciprocals; TT: tokens a CTA (its first TT threads take one each);
    NT: threads a CTA (all load the rows and store dlres); LOGITS: the mhc_sinkhorn op's backward (cute_sinkhorn): the
    first pointer holds the logits themselves, rows [T, n*n] (r, bias and a_res unused), and dlres is dlogits
    (NP = n)."""

    n: int
    NP: int
    ITERS: int
    APPROX: bool = True
    TT: int = 32
    NT: int = 128
    LOGITS: bool = False

    @property
    def W(self) -> int:
        """The first input's row: the projection's N columns, or (LOGITS) the n*n logits."""
        return self.n * self.n if self.LOGITS else self.N

    def __post_init__(self):
        if not (self.n >= 1 and self.NP >= self.n and self.ITERS >= 0) or (self.LOGITS and self.NP != self.n):
            raise ValueError(f"SkBwdCuteCfg: n >= 1, NP >= n (LOGITS: NP == n, dlogits unpadded), ITERS >= 0: {self}")
        self._check_cta()

    @property
    def smem_bytes(self) -> int:
        """The staged rows of proj, dh_res and dlres (W + 1 floats a row), the step sums [ITERS * 2n, TT] (one step's
        room at ITERS = 0: a shared tensor has no empty shape)."""
        rows = [self.TT * (w + 1) * 4 for w in (self.W, self.n * self.n, self.NP * self.NP)]
        return smem16(rows + [max(self.ITERS, 1) * 2 * self.n * self.TT * 4])


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, proj: cute.Pointer, r: cute.Pointer, bias: cute.Pointer, dhres: cute.Pointer,
            dlres: cute.Pointer, a_res: Float32, eps: Float32, T: Int32):
    n, N, NP, TT, NT = cfg.n, cfg.W, cfg.NP, cfg.TT, cfg.NT
    nn = n * n
    tid, b, t, rows, row0, tc = _cta_tokens(TT, T)
    smem = SmemAllocator()
    sP, sG, sD = _rows_smem(smem, TT, N), _rows_smem(smem, TT, nn), _rows_smem(smem, TT, NP * NP)
    sums = smem.allocate_tensor(Float32, cute.make_layout((max(cfg.ITERS, 1) * 2 * n, TT), stride=(TT, 1)), 16)
    # every load first (the rows of proj and dh_res, r, the res bias), then the rows into shared memory
    bP = cute.make_rmem_tensor((-(-N * TT // NT),), Float32)
    bG = cute.make_rmem_tensor((-(-nn * TT // NT),), Float32)
    _load_rows(proj, row0 * N, rows * N, bP, N, TT, tid, NT)
    _load_rows(dhres, row0 * nn, rows * nn, bG, nn, TT, tid, NT)
    rr = Float32(1.0)
    bv = cute.make_rmem_tensor((nn,), Float32)
    if const_expr(not cfg.LOGITS):
        rr = cute.arch.load(r + tc, Float32)
        for j in cutlass.range_constexpr(nn):
            bv[j] = cute.arch.load(bias + (2 * n + j), Float32)
    _store_rows(bP, rows * N, sP, 0, N, TT, tid, NT)
    _store_rows(bG, rows * nn, sG, 0, nn, TT, tid, NT)
    cute.arch.sync_threads()
    if tid < TT and t < T:
        M = cute.make_rmem_tensor((nn,), Float32)
        g = cute.make_rmem_tensor((nn,), Float32)
        _m0(M, sP, tid, rr, a_res, bv, cfg.LOGITS, n)
        for j in cutlass.range_constexpr(nn):
            g[j] = sG[tid, j]
        # forward: the steps' sums kept (step s at rows s * 2n .. s * 2n + 2n - 1 of ``sums``)
        for s in cutlass.range(cfg.ITERS, unroll=1):
            for i in cutlass.range_constexpr(n):
                sums[s * (2 * n) + i, tid] = _scale_line(M, n, i, True, eps, cfg.APPROX)
            for k in cutlass.range_constexpr(n):
                sums[s * (2 * n) + n + k, tid] = _scale_line(M, n, k, False, eps, cfg.APPROX)
        # backward: the steps walked back, M rebuilt from the kept sums (the column step, then the row step)
        for q in cutlass.range(cfg.ITERS, unroll=1):
            s = cfg.ITERS - 1 - q
            for k in cutlass.range_constexpr(n):
                _unscale_line(g, M, n, k, False, sums[s * (2 * n) + n + k, tid], cfg.APPROX)
            for i in cutlass.range_constexpr(n):
                _unscale_line(g, M, n, i, True, sums[s * (2 * n) + i, tid], cfg.APPROX)
        # through M_0 = exp(L - rowmax(L)): the logits again from the staged row (not live through the loops)
        _m0(M, sP, tid, rr, a_res, bv, cfg.LOGITS, n)
        for i in cutlass.range_constexpr(n):
            m = _logit(sP, tid, rr, a_res, bv, cfg.LOGITS, n, i, 0)
            for k in cutlass.range_constexpr(1, n):
                m = cute.arch.fmax(m, _logit(sP, tid, rr, a_res, bv, cfg.LOGITS, n, i, k))
            srow = g[i * n] * M[i * n]
            for k in cutlass.range_constexpr(1, n):
                srow = srow + g[i * n + k] * M[i * n + k]
            taken = Int32(0)   # 1 once the row's first maximal entry is passed
            for k in cutlass.range_constexpr(n):
                gm = g[i * n + k] * M[i * n + k]
                first = (_logit(sP, tid, rr, a_res, bv, cfg.LOGITS, n, i, k) == m) & (taken == 0)
                sD[tid, i * NP + k] = Float32(cutlass.select_(first, gm - srow, gm))
                taken = Int32(cutlass.select_(first, Int32(1), taken))
            for k in cutlass.range_constexpr(n, NP):
                sD[tid, i * NP + k] = Float32(0.0)
        for e in cutlass.range_constexpr(n * NP, NP * NP):
            sD[tid, e] = Float32(0.0)
    cute.arch.sync_threads()
    _stage_out(dlres, row0 * (NP * NP), rows * (NP * NP), sD, 0, NP * NP, TT, tid, NT)


@cute.jit
def _logit(sP: cute.Tensor, tid, rr: Float32, a_res: Float32, bv: cute.Tensor, logits: cutlass.Constexpr,
           n: cutlass.Constexpr, i: cutlass.Constexpr, k: cutlass.Constexpr) -> Float32:
    """L[i][k] of the thread's token: r proj[2n + i n + k] a_res + bias[2n + i n + k] (mhc_pre's h, res section), or
    (logits) the staged row's entry i n + k."""
    v = Float32(0.0)
    if const_expr(logits):
        v = sP[tid, i * n + k]
    else:
        v = rr * sP[tid, 2 * n + i * n + k] * a_res + bv[i * n + k]
    return v


@cute.jit
def _m0(M: cute.Tensor, sP: cute.Tensor, tid, rr: Float32, a_res: Float32, bv: cute.Tensor,
        logits: cutlass.Constexpr, n: cutlass.Constexpr):
    """M = exp(L - rowmax(L)) (M [n*n], row-major)."""
    for j in cutlass.range_constexpr(n * n):
        M[j] = _logit(sP, tid, rr, a_res, bv, logits, n, j // n, j % n)
    _exp_rowmax(M, n)


@cute.jit
def _unscale_line(g: cute.Tensor, M: cute.Tensor, n: cutlass.Constexpr, line: cutlass.Constexpr,
                  by_row: cutlass.Constexpr, w: Float32, approx: cutlass.Constexpr):
    """One Sinkhorn normalisation of row (by_row) or column ``line`` walked back, w = the line's kept sum + eps: the
    gradient g = (g - sum(g * M)) / w along the line (M the step's result), then M *= w (the iterate before it)."""
    v = g[_at(n, line, 0, by_row)] * M[_at(n, line, 0, by_row)]
    for p in cutlass.range_constexpr(1, n):
        v = v + g[_at(n, line, p, by_row)] * M[_at(n, line, p, by_row)]
    d = _recip(w, approx)
    for p in cutlass.range_constexpr(n):
        e = _at(n, line, p, by_row)
        g[e] = (g[e] - v) * d
        M[e] = M[e] * w


@cute.jit
def _host(cfg: cutlass.Constexpr, proj: cute.Pointer, r: cute.Pointer, bias: cute.Pointer, dhres: cute.Pointer,
          dlres: cute.Pointer, a_res: Float32, eps: Float32, T: Int32, stream: CU.cuda.CUstream):
    k = _kernel(cfg, proj, r, bias, dhres, dlres, a_res, eps, T)
    k.launch(grid=(cute.ceil_div(T, cfg.TT), 1, 1), block=(cfg.NT, 1, 1), stream=stream)


@functools.lru_cache(maxsize=256)
def launch(cfg: SkBwdCuteCfg, hdt: torch.dtype) -> CU.Launch:
    """run args (proj, r, bias, dh_res, dlres, a_res, sk_eps, T): the module docstring's tensors, T >= 1."""
    f = _ptr(torch.float32, 1)
    sig = (f, f, f, _ptr(hdt, 1), f, CU.Scalar(Float32), CU.Scalar(Float32), CU.Scalar(Int32))
    return CU.Launch(f"{_NAME}.sk", _host, cfg, sig)


@functools.lru_cache(maxsize=256)
def _launch_for(n: int, NP: int, ITERS: int, APPROX: bool, hdt: torch.dtype) -> CU.Launch:
    """launch() of a call's static dims (cached: the config's checks run once per shape)."""
    return launch(SkBwdCuteCfg(n=n, NP=NP, ITERS=ITERS, APPROX=APPROX), hdt)


@functools.lru_cache(maxsize=64)
def serves(n: int, NP: int, ITERS: int) -> bool:
    """Whether this kernel's config for a split mix's (n, NP, ITERS) is valid: its step sums grow with ITERS and
    pass 48 KB of shared memory from ITERS = 41 at n = 4 (57 at n = 3), which mhc_pre's iters <= 64 allows; the
    callers keep the cuTile kernel there (cute_post_pre._sk_step)."""
    try:
        SkBwdCuteCfg(n=n, NP=NP, ITERS=ITERS)
    except ValueError:
        return False
    return True


def run_sk(proj, r, bias, dh_res, dlres, scratch, a_pre: float, a_post: float, a_res: float, sk_eps: float, n: int,
           NP: int, NPAD: int, TT: int, ITERS: int, APPROX: int, PF: int) -> None:
    """cutile_pre.mhc_pre_bwd_sk's arguments (its Launch record's args; the scratch, a_pre, a_post and the cuTile
    tiling unused), run by this kernel. Nothing runs at T = 0."""
    T = proj.shape[0]
    if T == 0:
        return
    _launch_for(n, NP, ITERS, bool(APPROX), dh_res.dtype).run(proj, r, bias.contiguous(), dh_res.contiguous(), dlres,
                                                              float(a_res), float(sk_eps), T)


def representative_launches(n: int = 4) -> dict[str, CU.Launch]:
    """mhc_post_pre's config at one static shape, and IEEE reciprocals with bf16 dh_res (the CPU compile test)."""
    NP = 1 << (n - 1).bit_length()
    return {"sk": launch(SkBwdCuteCfg(n, NP, 20), torch.float32),
            "sk_ieee_bf16": launch(SkBwdCuteCfg(n, NP, 20, APPROX=False), torch.bfloat16)}
