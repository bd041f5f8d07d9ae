"""CuTe DSL kernels for mhc_h_aggregate, fwd and bwd (SIMT, Hopper sm_90a; compiles for sm_100a).

out[t,c] = sum_i h_pre[t,i] x[t,i,c]

x [T, n, C] bf16 or fp32 and h_pre [T, n] bf16 or fp32, contiguous; out [T, C] in x's dtype; fp32
math. The backward (dout [T, C]) writes dx [T, n, C] = h_pre[t,i] dout[t,c] in x's dtype and
dh_pre [T, n] = sum_c x[t,i,c] dout[t,c] (fp32 sums, h_pre's dtype); deterministic (fixed-order
sums, no atomics, no scratch).

Both kernels stream at the copy bandwidth's rate, so they follow the mapping that brought
mhc_h_post_bda's CuTe DSL kernels there (tilekernels/mhc/cute_post_bda.py, whose device helpers
they share): a "chunk" is V adjacent channels, one 16-byte access for n <= 4 (8 bytes above, as
there), so C % V == 0 (the spec's C % 8 == 0); a thread takes the same V channels of all n
streams of one token.

* fwd, 1-D grid of T * FCHG CTAs of NT threads: token t's FCHG CTAs are adjacent (what runs at once
  covers a few contiguous stretches of memory), one chunk a thread: n vector loads of x, h_pre[t]
  (scalar loads, the warp's broadcast), n * V FMAs, one vector store.
* bwd, one streaming pass, grid (G,) over tokens t = g, g+G, ...: G = T (CPS 0, the heuristic: one token a
  CTA, the hardware handing them out) or persistent G = min(T, SMs * CPS): a CTA of NTB threads takes a whole
  token (thread tid its chunks k * NTB + tid, k < KC), reads
  dout and x once, writes dx from registers and sums the n dh_pre partials over the warp by
  butterfly shuffles and over the warps through shared memory (one barrier a token).

Why not the cuTile kernels (tilekernels/mhc/cutile_aggregate.py): their backward read 95.4% of the
copy bandwidth (H200, T=32768, n=4, C=7168; h200-tk-bench-mhc.txt) and the op's fwd+bwd target is
the copy floor; h_post_bda's backward in this form read 98.9%. Measured numbers: the mHC ledger
(benchmarks/results/nvidia-h200-mhc-cutile.md).

Tails: chunks past CH = C / V are masked; T = 0 launches nothing. 64-bit row offsets. Importing
this module needs ``cutlass`` but no GPU.
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
from tilekernels._glue import aligned16, kernel

from .cute_post_bda import _aligned, _cta_sums_store, _esz, _load_f32, _pick_threads, _ptr, _rows, _sms, _store, _vec

_NAME = "mhc.cute_aggregate"


@dataclasses.dataclass(frozen=True)
class AggCuteCfg:
    """Launch config of both kernels (compile key, with the dtypes).

    n, C: static problem dims; V: elements per vector access; NT: fwd threads a CTA (one chunk
    each); NTB, KC: bwd threads a CTA (one token at a time) and chunks a thread; CPS: bwd CTAs an SM
    walking tokens (grid = min(T, SMs * CPS), at launch only: the compiled code is the same), 0: one token a
    CTA (grid T); MINB: bwd CTAs an SM asked of ptxas (0: no bound); UNR: bwd chunk loop, 0 unrolled at trace
    time, else a loop unrolled UNR times; FMINB: the fwd's CTAs an SM asked of ptxas."""

    n: int
    C: int
    V: int
    NT: int
    NTB: int
    KC: int
    CPS: int = 2
    MINB: int = 2
    UNR: int = 0
    FMINB: int = 0

    def __post_init__(self):
        if self.C % self.V or self.NT % 32 or self.NTB % 32 or not 32 <= self.NT <= 1024 or not 32 <= self.NTB <= 1024:
            raise ValueError(f"AggCuteCfg: C % V == 0 and thread counts multiples of 32 in [32, 1024]: {self}")
        if self.KC * self.NTB < self.CH:
            raise ValueError(f"AggCuteCfg: KC * NTB must cover the {self.CH} chunks: {self}")
        if self.CPS < 0 or self.MINB < 0 or self.UNR < 0:
            raise ValueError(f"AggCuteCfg: CPS, MINB, UNR >= 0: {self}")

    @property
    def CH(self) -> int:
        return self.C // self.V

    @property
    def FCHG(self) -> int:
        """fwd CTAs a token."""
        return -(-self.CH // self.NT)

    @classmethod
    @functools.lru_cache(maxsize=512)
    def heuristic(cls, n: int, C: int, act_bytes: int) -> "AggCuteCfg":
        """16-byte vectors for n <= 4, 8-byte above (h_post_bda's rule: n rows of V fp32 values at
        once); fwd up to 128 threads a CTA, one chunk each; bwd 32..256 threads a token with the
        fewest idle chunk slots, then nearest 224 (C = 7168 bf16: 224 x 4), ptxas bound to 2 CTAs an SM
        (MINB), the chunk loop unrolled at trace time up to 4 chunks a thread (ptxas hoists the chunks' loads;
        at 8, fp32 n = 4, it spills: a loop there). H200, T=32768, n=4, C=7168, with 2 persistent CTAs an SM
        (h_post_bda's measured best): bwd 1.020 ms unrolled, 1.027-1.031 as a loop; 3 or 4 CTAs an SM slower
        (benchmarks/results/h200-mhc-cute-aggregate.txt). One token a CTA (CPS 0) instead of 2 persistent
        CTAs an SM walking tokens: bwd 0.994 / 0.993 ms (fp32 / bf16 h) against 1.020 (session 20; grids 528, 1056,
        4096: 1.016, 1.013, 1.011): the hardware's block scheduler keeps the tokens in flight together."""
        V = (16 if n <= 4 else 8) // act_bytes
        ch = C // V
        ntb, kc = _pick_threads(ch, 224)
        return cls(n=n, C=C, V=V, NT=min(128, 32 * -(-ch // 32)), NTB=ntb, KC=kc, UNR=0 if kc <= 4 else 1, CPS=0)


# ------------------------------------------------------------------ kernels

@cute.jit
def _load_h(cfg: cutlass.Constexpr, h_ptr, t, h: cute.Tensor):
    """h [n] fp32 = h_pre[t] (scalar loads: a warp's are one broadcast; vector loads measured no
    faster)."""
    p = _vec(h_ptr, Int64(t) * cfg.n, cfg.n)
    for i in cutlass.range_constexpr(cfg.n):
        h[i] = p[i].to(Float32)


def _tile(rows: int, V: int):
    return cute.make_rmem_tensor(cute.make_layout((rows, V), stride=(V, 1)), Float32)


@cute.kernel
def _fwd_kernel(cfg: cutlass.Constexpr, mX: cute.Tensor, h_ptr: cute.Pointer, mO: cute.Tensor):
    n, V = cfg.n, cfg.V
    tid, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    t = bx // cfg.FCHG
    q = (bx % cfg.FCHG) * cfg.NT + tid
    if q < cfg.CH:
        h = cute.make_rmem_tensor((n,), Float32)
        _load_h(cfg, h_ptr, t, h)
        xs, o = _tile(n, V), _tile(1, V)
        _load_f32(_rows(mX, Int64(t) * n, n, V, q), xs, n, V)
        for e in cutlass.range_constexpr(V):
            a = h[0] * xs[0, e]
            for i in cutlass.range_constexpr(1, n):
                a = a + h[i] * xs[i, e]
            o[0, e] = a
        _store(o, _rows(mO, Int64(t), 1, V, q), 1)


@cute.jit
def _fwd_host(cfg: cutlass.Constexpr, x: cute.Pointer, h: cute.Pointer, out: cute.Pointer, T: Int32,
              stream: CU.cuda.CUstream):
    n, C = cfg.n, cfg.C
    k = _fwd_kernel(cfg, cute.make_tensor(x, cute.make_layout((T * n, C), stride=(C, 1))), h,
                    cute.make_tensor(out, cute.make_layout((T, C), stride=(C, 1))))
    CU.launch_bounded(k, cfg.FMINB, grid=(T * cfg.FCHG, 1, 1), block=(cfg.NT, 1, 1), stream=stream)


@cute.jit
def _bwd_chunk(cfg: cutlass.Constexpr, q, t, rows, mD, mX, mDX, h, acc, d, xs, dx):
    """Chunk q of token t: dx = h dout stored, the n dh partials added into ``acc``."""
    n, V = cfg.n, cfg.V
    if q < cfg.CH:
        _load_f32(_rows(mD, Int64(t), 1, V, q), d, 1, V)
        _load_f32(_rows(mX, rows, n, V, q), xs, n, V)
        for i in cutlass.range_constexpr(n):
            for e in cutlass.range_constexpr(V):
                acc[i] = acc[i] + xs[i, e] * d[0, e]
                dx[i, e] = h[i] * d[0, e]
        _store(dx, _rows(mDX, rows, n, V, q), n)


@cute.kernel
def _bwd_kernel(cfg: cutlass.Constexpr, mD: cute.Tensor, mX: cute.Tensor, h_ptr: cute.Pointer, mDX: cute.Tensor,
                dh_ptr: cute.Pointer, T: Int32):
    n, V, NT, KC = cfg.n, cfg.V, cfg.NTB, cfg.KC
    tid, _, _ = cute.arch.thread_idx()
    g, _, _ = cute.arch.block_idx()
    G, _, _ = cute.arch.grid_dim()
    smem = SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout((2, NT // 32, n), stride=(NT // 32 * n, n, 1)), 16)
    h = cute.make_rmem_tensor((n,), Float32)
    acc = cute.make_rmem_tensor((n,), Float32)
    d, xs, dx = _tile(1, V), _tile(n, V), _tile(n, V)
    for t in cutlass.range(g, T, G, unroll=1):
        _load_h(cfg, h_ptr, t, h)
        for i in cutlass.range_constexpr(n):
            acc[i] = Float32(0.0)
        rows = Int64(t) * n
        if cutlass.const_expr(cfg.UNR == 0):
            for k in cutlass.range_constexpr(KC):
                _bwd_chunk(cfg, k * NT + tid, t, rows, mD, mX, mDX, h, acc, d, xs, dx)
        else:
            for k in cutlass.range(KC, unroll=cfg.UNR):
                _bwd_chunk(cfg, k * NT + tid, t, rows, mD, mX, mDX, h, acc, d, xs, dx)
        _cta_sums_store(acc, red, (t // G) % 2, tid, t, dh_ptr, dh_ptr, n, n, NT)


@cute.jit
def _bwd_host(cfg: cutlass.Constexpr, dout: cute.Pointer, x: cute.Pointer, h: cute.Pointer, dx: cute.Pointer,
              dh: cute.Pointer, T: Int32, G: Int32, stream: CU.cuda.CUstream):
    n, C = cfg.n, cfg.C
    big = cute.make_layout((T * n, C), stride=(C, 1))
    k = _bwd_kernel(cfg, cute.make_tensor(dout, cute.make_layout((T, C), stride=(C, 1))), cute.make_tensor(x, big), h,
                    cute.make_tensor(dx, big), dh, T)
    CU.launch_bounded(k, cfg.MINB, grid=(G, 1, 1), block=(cfg.NTB, 1, 1), stream=stream)


# ------------------------------------------------------------------ launches

@functools.lru_cache(maxsize=256)
def fwd_launch(cfg: AggCuteCfg, adt: torch.dtype, hdt: torch.dtype) -> CU.Launch:
    """run args (x, h_pre, out, T)."""
    a = _ptr(adt, cfg.V)
    return CU.Launch(f"{_NAME}.fwd", _fwd_host, cfg, (a, _ptr(hdt, 1), a, CU.Scalar(Int32)))


@functools.lru_cache(maxsize=256)
def bwd_launch(cfg: AggCuteCfg, adt: torch.dtype, hdt: torch.dtype) -> CU.Launch:
    """run args (dout, x, h_pre, dx, dh_pre, T, G)."""
    a = _ptr(adt, cfg.V)
    h = _ptr(hdt, 1)
    return CU.Launch(f"{_NAME}.bwd", _bwd_host, cfg, (a, a, h, a, h, CU.Scalar(Int32), CU.Scalar(Int32)))


def config(x: torch.Tensor) -> AggCuteCfg:
    _, n, C = x.shape
    return AggCuteCfg.heuristic(n, C, x.element_size())


@kernel("mhc_h_aggregate", "cute", "fwd")
def fwd_into(x, h_pre, out, cfg: AggCuteCfg | None = None):
    """out [T, C] = h_aggregate(x, h_pre), destination-passing (the registry's fwd signature)."""
    T = x.shape[0]
    if T == 0:
        return
    cfg = cfg or config(x)
    x = aligned16(x)
    dst = out if _aligned(out) else torch.empty_like(out)
    fwd_launch(cfg, x.dtype, h_pre.dtype).run(x, h_pre, dst, T)
    if dst is not out:
        out.copy_(dst)


@kernel("mhc_h_aggregate", "cute", "bwd")
def bwd_into(dout, x, h_pre, dx, dh_pre, cfg: AggCuteCfg | None = None, grid: int | None = None):
    """dx [T, n, C] and dh_pre [T, n], destination-passing (the registry's bwd signature); ``grid``
    overrides the CTA count (tests: a token loop of several tokens a CTA; results do not depend on it)."""
    T = x.shape[0]
    if T == 0:
        return
    cfg = cfg or config(x)
    dout, x = aligned16(dout), aligned16(x)
    dst = dx if _aligned(dx) else torch.empty_like(dx)
    G = min(T, grid or (T if cfg.CPS == 0 else _sms(x.device) * cfg.CPS))
    bwd_launch(cfg, x.dtype, h_pre.dtype).run(dout, x, h_pre, dst, dh_pre, T, G)
    if dst is not dx:
        dx.copy_(dst)


def representative_launches(n: int = 4, C: int = 7168, adt=torch.bfloat16, hdt=torch.float32) -> dict[str, CU.Launch]:
    """Both launches at one static shape (what the CPU compile test exports)."""
    cfg = AggCuteCfg.heuristic(n, C, _esz(adt))
    return {"fwd": fwd_launch(cfg, adt, hdt), "bwd": bwd_launch(cfg, adt, hdt)}
