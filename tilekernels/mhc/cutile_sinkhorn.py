"""cuTile kernels for mhc_sinkhorn (fwd + bwd).

logits [T, n, n] fp32 -> out [T, n, n] fp32:
    M = exp(logits - rowmax(logits))
    repeat iters: M /= (rowsum(M) + eps);  M /= (colsum(M) + eps)

fwd: "entries" layout -- each of the n*n matrix entries is its own [TT] tile
     over tokens, so a token's whole matrix sits in one thread and the row /
     column sums are plain adds (no cross-thread reductions); only the n*n
     real entries exist, no padding.
bwd: one block holds TT tokens' [NP, NP] matrices (n padded to NP = next_pow2(n),
     padded entries forced to 0). It recomputes the forward in the same kernel,
     keeping every iterate on chip (the loop is unrolled at compile time:
     ``iters`` is a compile-time constant), then walks the steps back:
         y = x / (s + eps), s = sum(x)  =>  dx = (dy - sum(dy * y)) / (s + eps)
     and finally through exp(logits - rowmax): dlogits = g*M0, minus sum(g*M0)
     at each row's first maximal entry (the max's subgradient, as the
     reference). Nothing but dlogits is written to global memory. (The entries
     layout for the backward, unrolled, took tileiras > 10 minutes to compile.)
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

ConstInt = ct.Constant[int]


def _init(lg, N, NP):
    """(M0, valid mask, rowmax) for a (TT, NP, NP) logits tile."""
    ii = ct.reshape(ct.arange(NP, dtype=ct.int32), (1, NP, 1))
    jj = ct.reshape(ct.arange(NP, dtype=ct.int32), (1, 1, NP))
    valid = (ii < N) & (jj < N)
    lg = ct.where(valid, lg, -3.0e38)
    m = ct.max(lg, axis=2, keepdims=True)
    M0 = ct.where(valid, ct.exp(lg - m), 0.0)
    return M0, valid, lg, m


def sk_bwd_tile(g, lg, eps, N: ConstInt, NP: ConstInt, ITERS: ConstInt):
    """dlogits [TT, NP, NP] (padded entries 0) from dout g and logits lg, both
    [TT, NP, NP] fp32 (padded entries ignored): the forward is recomputed and
    walked back (see the module doc)."""
    M0, valid, lg, m = _init(lg, N, NP)
    # forward, keeping (row-normalised iterate, 1/(rowsum+eps), 1/(colsum+eps)) of every step
    M = M0
    saved = ()
    for _k in ct.static_iter(range(ITERS)):
        ir = 1.0 / (ct.sum(M, axis=2, keepdims=True) + eps)
        Mr = M * ir
        ic = 1.0 / (ct.sum(Mr, axis=1, keepdims=True) + eps)
        M = Mr * ic
        saved += ((Mr, ir, ic),)
    for k in ct.static_iter(range(ITERS - 1, -1, -1)):
        Mr, ir, ic = saved[k]
        Mc = Mr * ic
        g = (g - ct.sum(g * Mc, axis=1, keepdims=True)) * ic
        g = ct.where(valid, (g - ct.sum(g * Mr, axis=2, keepdims=True)) * ir, 0.0)
    gm = g * M0
    # the row max's (sub)gradient goes to the row's first maximal entry (as argmax picks)
    jj = ct.reshape(ct.arange(NP, dtype=ct.int32), (1, 1, NP))
    first = ct.min(ct.where(lg == m, jj, NP), axis=2, keepdims=True)
    return gm - ct.where(jj == first, ct.sum(gm, axis=2, keepdims=True), 0.0)


@ct.kernel
def mhc_sk_bwd(dout, logits, dlogits, eps: float, N: ConstInt, NP: ConstInt, TT: ConstInt,
               ITERS: ConstInt):
    pid = ct.bid(0)
    lg = ct.load(logits, index=(pid, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    g = ct.load(dout, index=(pid, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    ct.store(dlogits, index=(pid, 0, 0), tile=sk_bwd_tile(g, lg, eps, N, NP, ITERS).astype(dlogits.dtype))


# ---- forward, "entries" layout: nested tuples M[i][j] of [TT] tiles (see the module doc)

def _entries(tile, N: ConstInt, TT: ConstInt):
    rows = ()
    for i in ct.static_iter(range(N)):
        row = ()
        for j in ct.static_iter(range(N)):
            row += (ct.reshape(ct.extract(tile, (0, i, j), shape=(TT, 1, 1)), (TT,)),)
        rows += (row,)
    return rows


def assemble(M, N: ConstInt, NP: ConstInt, TT: ConstInt):
    out = ct.zeros((TT, NP, NP), dtype=ct.float32)
    for i in ct.static_iter(range(N)):
        for j in ct.static_iter(range(N)):
            out = ct.insert(out, (0, i, j), ct.reshape(M[i][j], (TT, 1, 1)))
    return out


def _scale_rows(M, d, N: ConstInt):
    """M[i][j] * d[i]"""
    out = ()
    for i in ct.static_iter(range(N)):
        row = ()
        for j in ct.static_iter(range(N)):
            row += (M[i][j] * d[i],)
        out += (row,)
    return out


def _scale_cols(M, d, N: ConstInt):
    """M[i][j] * d[j]"""
    out = ()
    for i in ct.static_iter(range(N)):
        row = ()
        for j in ct.static_iter(range(N)):
            row += (M[i][j] * d[j],)
        out += (row,)
    return out


def _row_sums(M, N: ConstInt):
    out = ()
    for i in ct.static_iter(range(N)):
        s = M[i][0]
        for j in ct.static_iter(range(1, N)):
            s = s + M[i][j]
        out += (s,)
    return out


def _col_sums(M, N: ConstInt):
    out = ()
    for j in ct.static_iter(range(N)):
        s = M[0][j]
        for i in ct.static_iter(range(1, N)):
            s = s + M[i][j]
        out += (s,)
    return out


def _recip(v, eps, N: ConstInt):
    out = ()
    for i in ct.static_iter(range(N)):
        out += (1.0 / (v[i] + eps),)
    return out


def _init_entries(lg, N: ConstInt):
    """(M0, per-row max) from the logits entries."""
    m = ()
    for i in ct.static_iter(range(N)):
        mi = lg[i][0]
        for j in ct.static_iter(range(1, N)):
            mi = ct.maximum(mi, lg[i][j])
        m += (mi,)
    M0 = ()
    for i in ct.static_iter(range(N)):
        row = ()
        for j in ct.static_iter(range(N)):
            row += (ct.exp(lg[i][j] - m[i]),)
        M0 += (row,)
    return M0, m


def sk_fwd_entries(lg, eps, N: ConstInt, ITERS: ConstInt):
    """Sinkhorn of logits given as entries (nested tuples lg[i][j] of [TT] tiles)."""
    M, _m = _init_entries(lg, N)
    for _ in range(ITERS):
        M = _scale_rows(M, _recip(_row_sums(M, N), eps, N), N)
        M = _scale_cols(M, _recip(_col_sums(M, N), eps, N), N)
    return M


@ct.kernel
def mhc_sk_fwd(logits, out, eps: float, N: ConstInt, NP: ConstInt, TT: ConstInt,
                       ITERS: ConstInt):
    pid = ct.bid(0)
    lg = _entries(ct.load(logits, index=(pid, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO), N, TT)
    M = sk_fwd_entries(lg, eps, N, ITERS)
    ct.store(out, index=(pid, 0, 0), tile=assemble(M, N, NP, TT).astype(out.dtype))


@dataclasses.dataclass(frozen=True)
class SinkhornCfg:
    """Launch config = compile key (with the dtypes)."""
    N: int       # n (static: the valid-entry mask)
    NP: int      # n padded to a power of two
    TT_FWD: int  # tokens per block, forward
    TT_BWD: int  # tokens per block, backward (every iterate lives in registers)
    ITERS: int
    OCC_FWD: int = 0  # occupancy hints (0: compiler's choice); the kernels are
    OCC_BWD: int = 0  # latency-bound chains, so resident blocks matter

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; saves ~10-25 us per call
    def heuristic(cls, T: int, n: int, iters: int) -> "SinkhornCfg":
        NP = next_pow2(n)
        # measured on H200 (T=32768, n=4): fwd 128 tokens/block at the compiler's
        # occupancy (0.014 ms); bwd 8 tokens/block at occupancy 8 (0.043 ms; the
        # iterates then live in 32 registers + smem)
        return cls(N=n, NP=NP, TT_FWD=128, TT_BWD=max(1, 128 // (NP * NP)),
                   ITERS=iters, OCC_FWD=0, OCC_BWD=8)


def fwd_launch(logits, out, iters: int, eps: float, cfg: SinkhornCfg | None = None) -> Launch:
    T, n, _ = logits.shape
    cfg = cfg or SinkhornCfg.heuristic(T, n, iters)
    return Launch(mhc_sk_fwd, (cdiv(T, cfg.TT_FWD),),
                  (logits, out, float(eps), cfg.N, cfg.NP, cfg.TT_FWD, cfg.ITERS), cfg, occ(cfg.OCC_FWD))


def bwd_launch(dout, logits, dlogits, iters: int, eps: float, cfg: SinkhornCfg | None = None) -> Launch:
    T, n, _ = logits.shape
    cfg = cfg or SinkhornCfg.heuristic(T, n, iters)
    return Launch(mhc_sk_bwd, (cdiv(T, cfg.TT_BWD),),
                  (dout, logits, dlogits, float(eps), cfg.N, cfg.NP, cfg.TT_BWD, cfg.ITERS), cfg,
                  occ(cfg.OCC_BWD))
