"""CuTe DSL mhc_sinkhorn (SIMT, Hopper sm_90a; no wgmma or TMA, so it compiles for sm_100a too): the op's forward
and backward, a thread a token.

logits [T, n, n] fp32, contiguous ->

    fwd: out = M_ITERS, M_0 = exp(logits - rowmax(logits)); each step M /= rowsum(M) + eps, then M /= colsum(M) + eps
    bwd: dlogits [T, n, n] fp32 = the exact gradient of those steps for dout [T, n, n] fp32

(``reference.sinkhorn`` / ``sinkhorn_bwd``). The forward is ``SinkFwdCuteCfg``'s kernel below: a CTA stages its TT
tokens' rows [TT, n*n] through shared memory (coalesced loads and stores, every load issued before the first
store), and each of its first TT threads runs one token's steps in registers in the cuTile entries kernel's order
(cutile_sinkhorn.mhc_sk_fwd: the same sums, approximate reciprocals). The backward is cute_sk_bwd's kernel with
LOGITS (the logits rows in place of mhc_pre's projection): the forward rerun with each step's 2n sums kept in shared
memory, then walked back (no global scratch, unlike the cuTile entries backward's [iters, 2n, T]).

Why a second backend: at issue 15's shape (T = 32768, n = 4, 20 steps) the kernels take ~10-25 us, so an eager
fwd+bwd through the registry is host time: a CuTe DSL launch packs its pointers into per-thread ctypes slots
(``_cute.Launch.run``'s fast path), where a cuTile launch builds its argument list through DLPack each call, and the
backward needs no scratch buffer. Measured numbers: the mHC ledger (benchmarks/results/nvidia-h200-mhc-cutile.md).

Limits (the spec's cute backend): fp32; n <= 7 (at n = 8 the backward's 2 n^2 live values spill); the CTA's shared
memory within 48 KB (the backward's step sums [iters * 2n, 32 tokens] with the staged rows: 2 iters n + 3 n^2 + 3 <=
384, so n = 4 takes up to 41 steps, n = 7 up to 16); sm_90a / sm_100a. Tokens past T load clamped addresses and store
nothing; T = 0 launches nothing. Compile key: the config (n, ITERS, APPROX, TT, NT); T is a runtime scalar.
Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as CU
from tilekernels._glue import kernel

from . import cute_sk_bwd as SB
from .cute_post_bda import _ptr
from .cute_pp_mix import _exp_rowmax, _scale_line
from .cute_pre_rest import TokenCtaCfg, _cta_tokens, _load_rows, _rows_smem, _stage_out, _store_rows, smem16

_NAME = "mhc.cute_sinkhorn"
MAX_N = 7   # n = 8: the backward spills (255 registers and a local frame)


@dataclasses.dataclass(frozen=True)
class SinkFwdCuteCfg(TokenCtaCfg):
    """Forward launch config (compile key). n: streams; ITERS: steps; APPROX: approximate reciprocals (rcp.approx, as
    the cuTile kernels' div.approx); TT: tokens a CTA (its first TT threads take one each); NT: threads a CTA (all
    load and store the rows). The CTA limits (TT, NT, 48 KB of shared memory) are the token kernels' (TokenCtaCfg)."""

    n: int
    ITERS: int
    APPROX: bool = True
    TT: int = 128
    NT: int = 128

    def __post_init__(self):
        self._check_cta(not (1 <= self.n <= 8 and self.ITERS >= 0), ", n in 1..8, ITERS >= 0")

    @property
    def smem_bytes(self) -> int:
        """The staged rows [TT, n*n + 1] fp32 (logits in, out written over them)."""
        return smem16([self.TT * (self.n * self.n + 1) * 4])


@cute.kernel
def _fwd_kernel(cfg: cutlass.Constexpr, logits: cute.Pointer, out: cute.Pointer, eps: Float32, T: Int32):
    n, TT, NT = cfg.n, cfg.TT, cfg.NT
    nn = n * n
    tid, b, t, rows, row0, tc = _cta_tokens(TT, T)
    smem = SmemAllocator()
    sL = _rows_smem(smem, TT, nn)
    buf = cute.make_rmem_tensor((-(-nn * TT // NT),), Float32)
    _load_rows(logits, row0 * nn, rows * nn, buf, nn, TT, tid, NT)
    _store_rows(buf, rows * nn, sL, 0, nn, TT, tid, NT)
    cute.arch.sync_threads()
    if tid < TT and t < T:
        M = cute.make_rmem_tensor((nn,), Float32)
        for j in cutlass.range_constexpr(nn):
            M[j] = sL[tid, j]
        _exp_rowmax(M, n)
        for _ in cutlass.range(cfg.ITERS, unroll=1):
            for i in cutlass.range_constexpr(n):
                _scale_line(M, n, i, True, eps, cfg.APPROX)
            for k in cutlass.range_constexpr(n):
                _scale_line(M, n, k, False, eps, cfg.APPROX)
        for j in cutlass.range_constexpr(nn):   # (a thread rewrites only its own row)
            sL[tid, j] = M[j]
    cute.arch.sync_threads()
    _stage_out(out, row0 * nn, rows * nn, sL, 0, nn, TT, tid, NT)


@cute.jit
def _fwd_host(cfg: cutlass.Constexpr, logits: cute.Pointer, out: cute.Pointer, eps: Float32, T: Int32,
              stream: CU.cuda.CUstream):
    _fwd_kernel(cfg, logits, out, eps, T).launch(grid=(cute.ceil_div(T, cfg.TT), 1, 1), block=(cfg.NT, 1, 1),
                                                 stream=stream)


@functools.lru_cache(maxsize=256)
def fwd_launch(cfg: SinkFwdCuteCfg) -> CU.Launch:
    """run args (logits [T, n, n] fp32, out [T, n, n] fp32, eps, T >= 1)."""
    f = _ptr(torch.float32, 1)
    return CU.Launch(f"{_NAME}.fwd", _fwd_host, cfg, (f, f, CU.Scalar(Float32), CU.Scalar(Int32)))


@functools.lru_cache(maxsize=256)
def bwd_cfg(n: int, iters: int) -> SB.SkBwdCuteCfg:
    """cute_sk_bwd's config for the op's backward (LOGITS, NP = n: dlogits unpadded; approximate reciprocals)."""
    return SB.SkBwdCuteCfg(n=n, NP=n, ITERS=iters, LOGITS=True)


@functools.lru_cache(maxsize=256)
def _fwd_for(n: int, iters: int) -> CU.Launch:
    return fwd_launch(SinkFwdCuteCfg(n=n, ITERS=iters))


@functools.lru_cache(maxsize=256)
def _bwd_for(n: int, iters: int) -> CU.Launch:
    return SB.launch(bwd_cfg(n, iters), torch.float32)


def fits(n: int, iters: int) -> bool:
    """Whether the backend takes (n, iters): n <= 7 and both kernels' configs fit (what the spec's constraints say,
    checked here by building the configs; tests compare the two)."""
    if not 1 <= n <= MAX_N:
        return False
    try:
        SinkFwdCuteCfg(n=n, ITERS=iters)
        bwd_cfg(n, iters)
    except ValueError:
        return False
    return True


@kernel("mhc_sinkhorn", "cute", "fwd")
def fwd_into(logits, out, iters: int, eps: float) -> None:
    """out [T, n, n] fp32 = Sinkhorn(logits), destination-passing (the registry's fwd signature; contiguous tensors,
    validated by the spec)."""
    T, n = logits.shape[0], logits.shape[1]
    if T:
        _fwd_for(n, int(iters)).run(logits, out, float(eps), T)


@kernel("mhc_sinkhorn", "cute", "bwd")
def bwd_into(dout, logits, dlogits, iters: int, eps: float) -> None:
    """dlogits [T, n, n] fp32 for dout [T, n, n] fp32, contiguous (the registry's bwd signature; the generated
    wrapper hands over contiguous grads): cute_sk_bwd's kernel with the
    logits rows (r, bias and a_res are not read: the logits stand in for their pointers)."""
    T, n = logits.shape[0], logits.shape[1]
    if T:
        _bwd_for(n, int(iters)).run(logits, logits, logits, dout, dlogits, 1.0, float(eps), T)


def representative_launches(n: int = 4, iters: int = 20) -> dict[str, CU.Launch]:
    """Both launches at one static shape, and IEEE reciprocals (what the CPU compile test exports)."""
    return {"fwd": fwd_launch(SinkFwdCuteCfg(n=n, ITERS=iters)), "bwd": SB.launch(bwd_cfg(n, iters), torch.float32),
            "fwd_ieee": fwd_launch(SinkFwdCuteCfg(n=n, ITERS=iters, APPROX=False))}
