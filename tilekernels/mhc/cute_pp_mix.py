"""CuTe DSL kernel for mhc_post_pre's forward epilogue (SIMT, Hopper sm_90a; compiles for sm_100a): what
cutile_post_pre.mhc_pp_mix computes, a thread a token. mhc_post_pre's cute forward runs it after its fused pass
(cute_post_pre_fwd), which leaves the projection and the sum of squares as SPLIT partial planes.

Per token t (columns j < N = n*n + 2n in the order pre | post | res; alpha_j = a_pre, a_post, a_res by section):

    proj[t, j] = sum over s = 0 .. SPLIT-1, in order, of p_proj[s, t, j]
    ss         = sum over s, in order, of p_ss[s, t]
    r[t]       = 1 / (sqrt(ss / kf) + rms_eps)                      (kf = n * C)
    h_j        = r[t] * proj[t, j] * alpha_j + hbias[j]
    h_pre[t, i]     = sigmoid(h_i),  h_post[t, i] = 2 sigmoid(h_{n+i})          (i < n)
    h_res[t]   = Sinkhorn of the logits L[i][k] = h_{2n + i n + k}: M = exp(L - rowmax(L)), then ITERS times
                 M /= rowsum(M) + sk_eps, M /= colsum(M) + sk_eps  (APPROX: the reciprocals approximate, as the
                 cuTile kernel's div.approx; else IEEE-rounded)

p_proj [SPLIT, T, NPAD] fp32, p_ss [SPLIT, T] fp32, hbias [N] fp32 -> proj [T, N], r [T], h_pre [T, n], h_post
[T, n], h_res [T, n, n], all fp32 and contiguous. The plane sums are the cuTile kernel's (the same adds in the same
order): proj and r are bitwise its values.

Why: the cuTile kernel ran at ~3x its traffic's floor (~36 MB at T=32768, n=4: ~8.5 us); the CTA's rows of every
plane are read with 16-byte loads (a warp's adjacent) and summed in registers, then staged through shared memory
(rows NPAD + 1 floats apart: a thread reading its token's row meets no bank conflict), and the outputs leave
staged the same way, so every global access is coalesced. Measured times: the mHC ledger
(benchmarks/results/nvidia-h200-mhc-cutile.md).

Tokens past T (the last CTA) load clamped addresses and store nothing. Compile key: PpMixCuteCfg; T is runtime.
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

from .cute_post_bda import _ptr
from .cute_pre_rest import TokenCtaCfg, _alpha, _cta_tokens, _rows_smem, _stage_out, smem16

_NAME = "mhc.cute_pp_mix"


@dataclasses.dataclass(frozen=True)
class PpMixCuteCfg(TokenCtaCfg):
    """Launch config (compile key). n: streams; NPAD: the planes' row length (a multiple of 4, >= N); SPLIT: planes;
    ITERS: Sinkhorn iterations; APPROX: approximate reciprocals in the Sinkhorn steps; TT: tokens a CTA (its first
    TT threads take one each); NT: threads a CTA (all load the planes and store the staged outputs: fewer loads a
    thread, so all of them are in flight at once)."""

    n: int
    NPAD: int
    SPLIT: int
    ITERS: int
    APPROX: bool = True
    TT: int = 128
    NT: int = 512

    def __post_init__(self):
        if not (self.n >= 1 and self.NPAD >= self.N and self.NPAD % 4 == 0 and self.SPLIT >= 1 and self.ITERS >= 0):
            raise ValueError(f"PpMixCuteCfg: n >= 1, NPAD >= N = n*n + 2n and a multiple of 4, SPLIT >= 1, "
                             f"ITERS >= 0: {self}")
        self._check_cta((self.TT * self.Q) % self.NT != 0, ", dividing the CTA's TT * NPAD / 4 16-byte pieces a plane")

    @classmethod
    def heuristic(cls, n: int, NPAD: int, SPLIT: int, ITERS: int, APPROX: bool = True) -> "PpMixCuteCfg":
        """128 tokens a CTA; 512 threads (n = 4: two 16-byte loads a thread a plane, all 16 in flight at once; fewer
        where they do not divide the CTA's 16-byte pieces, e.g. NPAD 24: 256), 128 for n = 1 (at 256 or 512 threads
        ptxas gives that kernel an 8-byte stack frame)."""
        q = cls.TT * NPAD // 4   # the 16-byte pieces of a CTA's rows of a plane: NT divides them
        return cls(n=n, NPAD=NPAD, SPLIT=SPLIT, ITERS=ITERS, APPROX=APPROX,
                   NT=128 if n == 1 else next(nt for nt in (512, 256, 128) if q % nt == 0))

    @property
    def Q(self) -> int:
        """16-byte pieces a row of a plane."""
        return self.NPAD // 4

    @property
    def smem_bytes(self) -> int:
        """The summed rows [TT, NPAD + 1] and the outputs' rows [TT, N + 1] (16-byte aligned allocations)."""
        return smem16(self.TT * (w + 1) * 4 for w in (self.NPAD, self.N))


def _at(n: int, line: int, p: int, by_row: bool) -> int:
    """Index in a row-major [n, n] of entry p of row ``line`` (by_row) or of column ``line``."""
    return line * n + p if by_row else p * n + line


@cute.jit
def _exp_rowmax(M: cute.Tensor, n: cutlass.Constexpr):
    """M [n*n] (row-major) = exp(M - rowmax(M)) in place: the Sinkhorn iterate M_0 from its logits."""
    for i in cutlass.range_constexpr(n):
        m = M[i * n]
        for k in cutlass.range_constexpr(1, n):
            m = cute.arch.fmax(m, M[i * n + k])
        for k in cutlass.range_constexpr(n):
            M[i * n + k] = cute.math.exp(M[i * n + k] - m)


@cute.jit
def _scale_line(M: cute.Tensor, n: cutlass.Constexpr, line: cutlass.Constexpr, by_row: cutlass.Constexpr,
                eps: Float32, approx: cutlass.Constexpr) -> Float32:
    """One Sinkhorn normalisation of row (by_row) or column ``line`` of M [n*n] in place: v = its sum (in index
    order) + eps, the line scaled by 1 / v; returns v (cute_sk_bwd keeps it for the walk back)."""
    v = M[_at(n, line, 0, by_row)]
    for p in cutlass.range_constexpr(1, n):
        v = v + M[_at(n, line, p, by_row)]
    v = v + eps
    d = _recip(v, approx)
    for p in cutlass.range_constexpr(n):
        M[_at(n, line, p, by_row)] = M[_at(n, line, p, by_row)] * d
    return v


@cute.jit
def _sinkhorn(M: cute.Tensor, n: cutlass.Constexpr, iters: cutlass.Constexpr, eps: Float32,
              approx: cutlass.Constexpr):
    """M [n*n] (row-major logits in, the Sinkhorn matrix out), the cuTile entries kernel's steps and order:
    exp(L - rowmax), then ``iters`` times rows scaled by 1 / (rowsum + eps), columns by 1 / (colsum + eps)."""
    _exp_rowmax(M, n)
    for _ in cutlass.range(iters, unroll=1):
        for i in cutlass.range_constexpr(n):
            _scale_line(M, n, i, True, eps, approx)
        for k in cutlass.range_constexpr(n):
            _scale_line(M, n, k, False, eps, approx)


@cute.jit
def _recip(v: Float32, approx: cutlass.Constexpr) -> Float32:
    """1 / v: approximate (rcp.approx) or IEEE-rounded."""
    res = Float32(0.0)
    if cutlass.const_expr(approx):
        res = cute.arch.rcp_approx(v)
    else:
        res = Float32(1.0) / v
    return res


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, p_proj: cute.Pointer, p_ss: cute.Pointer, hb: cute.Pointer, proj: cute.Pointer,
            r: cute.Pointer, hpre: cute.Pointer, hpost: cute.Pointer, hres: cute.Pointer, kf: Float32,
            rms_eps: Float32, a_pre: Float32, a_post: Float32, a_res: Float32, sk_eps: Float32, T: Int32):
    n, N, NPAD, S, TT, NT, Q = cfg.n, cfg.N, cfg.NPAD, cfg.SPLIT, cfg.TT, cfg.NT, cfg.Q
    KL = TT * Q // NT   # 16-byte loads a thread a plane (the CTA's rows [rows, NPAD] are TT * Q of them)
    tid, b, t, rows, row0, tc = _cta_tokens(TT, T)
    cnt4 = rows * Q
    smem = SmemAllocator()
    sS, sO = _rows_smem(smem, TT, NPAD), _rows_smem(smem, TT, N)
    # every load first: hbias, the squares' partials, then the planes in order, summed as they land
    bv = cute.make_rmem_tensor((N,), Float32)
    for j in cutlass.range_constexpr(N):
        bv[j] = cute.arch.load(hb + j, Float32)
    ss = cute.arch.load(p_ss + tc, Float32)
    for s in cutlass.range_constexpr(1, S):
        ss = ss + cute.arch.load(p_ss + (Int64(s) * T + tc), Float32)
    acc = cute.make_rmem_tensor((KL * 4,), Float32)
    part = cute.make_rmem_tensor((4,), Float32)
    mP = cute.make_tensor(p_proj, cute.make_layout((4, S * T * Q), stride=(1, 4)))   # 16-byte pieces (int32: the
    for s in cutlass.range_constexpr(S):                                               # spec's SPLIT T NPAD < 2^31)
        base = (s * T + b * TT) * Q
        for k in cutlass.range_constexpr(KL):
            e4 = cutlass.min(k * NT + tid, cnt4 - 1)
            cute.autovec_copy(mP[None, base + e4], part)
            for q in cutlass.range_constexpr(4):
                if cutlass.const_expr(s == 0):
                    acc[k * 4 + q] = part[q]
                else:
                    acc[k * 4 + q] = acc[k * 4 + q] + part[q]
    for k in cutlass.range_constexpr(KL):
        e4 = k * NT + tid
        if e4 < cnt4:
            for q in cutlass.range_constexpr(4):
                e = e4 * 4 + q
                sS[e // NPAD, e % NPAD] = acc[k * 4 + q]
    cute.arch.sync_threads()
    _stage_out(proj, row0 * N, rows * N, sS, 0, N, TT, tid, NT)   # proj: the sums' first N columns
    if tid < TT and t < T:
        rr = Float32(1.0) / (cute.math.sqrt(ss / kf) + rms_eps)
        cute.arch.store(r + Int64(t), rr)
        M = cute.make_rmem_tensor((n * n,), Float32)
        for j in cutlass.range_constexpr(N):
            h = rr * sS[tid, j] * _alpha(j, n, a_pre, a_post, a_res) + bv[j]
            if cutlass.const_expr(j < 2 * n):
                sg = Float32(1.0) / (Float32(1.0) + cute.math.exp(-h))
                if cutlass.const_expr(j < n):
                    sO[tid, j] = sg
                else:
                    sO[tid, j] = Float32(2.0) * sg
            else:
                M[j - 2 * n] = h
        _sinkhorn(M, n, cfg.ITERS, sk_eps, cfg.APPROX)
        for j in cutlass.range_constexpr(n * n):
            sO[tid, 2 * n + j] = M[j]
    cute.arch.sync_threads()
    _stage_out(hpre, row0 * n, rows * n, sO, 0, n, TT, tid, NT)
    _stage_out(hpost, row0 * n, rows * n, sO, n, n, TT, tid, NT)
    _stage_out(hres, row0 * (n * n), rows * (n * n), sO, 2 * n, n * n, TT, tid, NT)


@cute.jit
def _host(cfg: cutlass.Constexpr, p_proj: cute.Pointer, p_ss: cute.Pointer, hb: cute.Pointer, proj: cute.Pointer,
          r: cute.Pointer, hpre: cute.Pointer, hpost: cute.Pointer, hres: cute.Pointer, kf: Float32,
          rms_eps: Float32, a_pre: Float32, a_post: Float32, a_res: Float32, sk_eps: Float32, T: Int32,
          stream: CU.cuda.CUstream):
    k = _kernel(cfg, p_proj, p_ss, hb, proj, r, hpre, hpost, hres, kf, rms_eps, a_pre, a_post, a_res, sk_eps, T)
    k.launch(grid=(cute.ceil_div(T, cfg.TT), 1, 1), block=(cfg.NT, 1, 1), stream=stream)


@functools.lru_cache(maxsize=256)
def launch(cfg: PpMixCuteCfg) -> CU.Launch:
    """run args (p_proj, p_ss, hbias, proj, r, h_pre, h_post, h_res, kf, rms_eps, a_pre, a_post, a_res, sk_eps, T):
    the module docstring's tensors (p_proj 16-byte aligned), T >= 1."""
    f = _ptr(torch.float32, 1)
    sig = (CU.Ptr(torch.float32, 16), f, f, f, f, f, f, f) + (CU.Scalar(Float32),) * 6 + (CU.Scalar(Int32),)
    return CU.Launch(f"{_NAME}.mix", _host, cfg, sig)


@functools.lru_cache(maxsize=256)
def _launch_for(n: int, NPAD: int, SPLIT: int, ITERS: int, APPROX: bool) -> CU.Launch:
    """launch() of a call's static dims (cached: the config's checks run once per shape)."""
    return launch(PpMixCuteCfg.heuristic(n, NPAD, SPLIT, ITERS, APPROX))


def run_mix(p_proj, p_ss, hbias, proj, r, h_pre, h_post, h_res, kf: float, rms_eps: float, a_pre: float,
            a_post: float, a_res: float, sk_eps: float, iters: int, approx: bool = True) -> None:
    """cutile_post_pre.mhc_pp_mix's work on its tensors (module docstring), by this kernel; nothing runs at T = 0."""
    S, T, NPAD = p_proj.shape
    if T == 0:
        return
    n = h_pre.shape[1]
    if p_proj.data_ptr() % 16 or not p_proj.is_contiguous():
        raise ValueError("mhc.cute_pp_mix: p_proj must be contiguous and 16-byte aligned")
    _launch_for(n, NPAD, S, iters, bool(approx)).run(
        p_proj, p_ss, hbias.contiguous(), proj, r, h_pre, h_post, h_res, float(kf), float(rms_eps), float(a_pre),
        float(a_post), float(a_res), float(sk_eps), T)


def representative_launches(n: int = 4) -> dict[str, CU.Launch]:
    """mhc_post_pre's config at one static shape, and IEEE reciprocals (what the CPU compile test exports)."""
    npad = max(16, next_pow2(n * n + 2 * n))
    return {"mix": launch(PpMixCuteCfg.heuristic(n, npad, 8, 20)),
            "mix_ieee": launch(PpMixCuteCfg.heuristic(n, npad, 8, 20, APPROX=False))}
