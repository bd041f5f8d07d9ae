"""cuTile kernels for mhc_sinkhorn (fwd + bwd).

logits [T, n, n] fp32 -> out [T, n, n] fp32:
    M = exp(logits - rowmax(logits))
    repeat iters: M /= (rowsum(M) + eps);  M /= (colsum(M) + eps)

fwd: "entries" layout -- each of the n*n matrix entries is its own [TT] tile
     over tokens, so a token's whole matrix sits in one thread and the row /
     column sums are plain adds (no cross-thread reductions); only the n*n
     real entries exist, no padding.
bwd (two designs; SinkhornCfg.heuristic(entries=...) picks, entries by default).
     Both recompute the forward in the kernel and walk the steps back:
         y = x / (s + eps), s = sum(x)  =>  dx = (dy - sum(dy * y)) / (s + eps)
     then go through exp(logits - rowmax): dlogits = g*M0, minus sum(g*M0) at
     each row's first maximal entry (the max's subgradient, as the reference).
  * entries (mhc_sk_bwd_entries): the forward's layout, the steps as a loop.
     Each step's rowsum + eps and colsum + eps (2n values per token) go to a
     global scratch [iters, 2n, T] fp32 that the same block reads back
     (L2-resident), one step ahead of their use; walking back, each earlier
     iterate is rebuilt from the later one by multiplying those sums back in.
     Only the iterate and its gradient stay live (2 n^2 values per thread; the
     logits are read again at the end), so n = 8 fits in registers too.
  * tile (mhc_sk_bwd, kept as an option and for comparison): one block holds TT
     tokens' [NP, NP] matrices (n padded to NP = next_pow2(n), padded entries
     forced to 0), keeps every iterate on chip (the loop is unrolled at compile
     time: ``iters`` is a compile-time constant) and writes nothing but dlogits.
     (The entries layout unrolled the same way took tileiras > 10 minutes to
     compile.) Slower than the entries backward at every n measured.
Divides: the entries kernels use the hardware's approximate divide (div.approx.f32,
within 2 ulp; SinkhornCfg.APPROX) -- the IEEE-rounded one adds a range check and a
slow-path call per divide, which made both kernels slower, while the outputs' errors
against float64 stay where they were.
The entries backward's scratch is a per-stream ``workspace`` (tilekernels/_glue.py),
reused between eager calls.
Measured times (H200) and the sweeps behind these choices:
benchmarks/results/nvidia-h200-mhc-cutile.md (probe: benchmarks/probes/sinkhorn_probe.py).
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ, workspace

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

def to_entries(tile, N: ConstInt, TT: ConstInt):
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


def _inv(v, N: ConstInt, APPROX: ConstInt = 0):
    """1 / v[i], IEEE-rounded or (APPROX) the hardware's approximate divide."""
    out = ()
    for i in ct.static_iter(range(N)):
        if APPROX:
            out += (ct.truediv(1.0, v[i], rounding_mode=ct.RoundingMode.APPROX),)
        else:
            out += (1.0 / v[i],)
    return out


def _recip(v, eps, N: ConstInt, APPROX: ConstInt = 0):
    """1 / (v[i] + eps)."""
    return _inv(_add_eps(v, eps, N), N, APPROX)


def init_entries(lg, N: ConstInt):
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


def sk_fwd_entries(lg, eps, N: ConstInt, ITERS: ConstInt, APPROX: ConstInt = 0):
    """Sinkhorn of logits given as entries (nested tuples lg[i][j] of [TT] tiles)."""
    M, _m = init_entries(lg, N)
    for _ in range(ITERS):
        M = _scale_rows(M, _recip(_row_sums(M, N), eps, N, APPROX), N)
        M = _scale_cols(M, _recip(_col_sums(M, N), eps, N, APPROX), N)
    return M


@ct.kernel
def mhc_sk_fwd(logits, out, eps: float, N: ConstInt, NP: ConstInt, TT: ConstInt,
               ITERS: ConstInt, APPROX: ConstInt):
    pid = ct.bid(0)
    lg = to_entries(ct.load(logits, index=(pid, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO), N, TT)
    M = sk_fwd_entries(lg, eps, N, ITERS, APPROX)
    ct.store(out, index=(pid, 0, 0), tile=assemble(M, N, NP, TT).astype(out.dtype))


# ---- backward, "entries" layout with the step sums in a global scratch (see the module doc)

def _store_vec(scratch, v, k, base, N: ConstInt, TT: ConstInt):
    """scratch[k, base + i, tokens of this block] = v[i] (fp32 [TT] tiles)."""
    pid = ct.bid(0)
    for i in ct.static_iter(range(N)):
        ct.store(scratch, index=(k, base + i, pid), tile=ct.reshape(v[i], (1, 1, TT)))


def _load_vec(scratch, k, base, N: ConstInt, TT: ConstInt):
    pid = ct.bid(0)
    out = ()
    for i in ct.static_iter(range(N)):
        out += (ct.reshape(ct.load(scratch, index=(k, base + i, pid), shape=(1, 1, TT),
                                   padding_mode=PAD_ZERO), (TT,)),)
    return out


def _add_eps(v, eps, N: ConstInt):
    out = ()
    for i in ct.static_iter(range(N)):
        out += (v[i] + eps,)
    return out


def _sub_sums_rows(g, M, N: ConstInt):
    """g[i][j] - sum_j g[i][j] * M[i][j]"""
    s = _row_sums(_mul(g, M, N), N)
    return _scale_sub(g, s, N, True)


def _sub_sums_cols(g, M, N: ConstInt):
    """g[i][j] - sum_i g[i][j] * M[i][j]"""
    s = _col_sums(_mul(g, M, N), N)
    return _scale_sub(g, s, N, False)


def _mul(a, b, N: ConstInt):
    out = ()
    for i in ct.static_iter(range(N)):
        row = ()
        for j in ct.static_iter(range(N)):
            row += (a[i][j] * b[i][j],)
        out += (row,)
    return out


def _scale_sub(g, s, N: ConstInt, by_row: bool):
    out = ()
    for i in ct.static_iter(range(N)):
        row = ()
        for j in ct.static_iter(range(N)):
            row += (g[i][j] - (s[i] if by_row else s[j]),)
        out += (row,)
    return out


def _load_entries(a, N: ConstInt, NP: ConstInt, TT: ConstInt):
    return to_entries(ct.load(a, index=(ct.bid(0), 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO), N, TT)


def sk_bwd_walk(M, g, scratch, eps, N: ConstInt, TT: ConstInt, ITERS: ConstInt,
                APPROX: ConstInt, PF: ConstInt):
    """The gradient with respect to M0 (entries) of the ``ITERS`` Sinkhorn steps
    started from ``M`` = M0, given ``g`` = the gradient of their result (entries).
    The forward runs as a loop and leaves each step's rowsum + eps and colsum + eps in
    ``scratch`` [ITERS, 2N, T] fp32 (this block's tokens only, read back by the same
    block, so the traffic stays in L2). The backward walks the steps back and rebuilds
    each earlier iterate from the later one by multiplying the sums back in (M_{k-1} =
    R_k * (rowsum + eps), R_k = M_k * (colsum + eps)); on the CPU simulation this moved
    the gradient's relative error from 1.8e-7 to 2.6e-7 (n=4, fp32)."""
    for k in range(ITERS):
        rs = _add_eps(_row_sums(M, N), eps, N)
        M = _scale_rows(M, _inv(rs, N, APPROX), N)
        cs = _add_eps(_col_sums(M, N), eps, N)
        M = _scale_cols(M, _inv(cs, N, APPROX), N)
        _store_vec(scratch, rs, k, 0, N, TT)
        _store_vec(scratch, cs, k, N, N, TT)
    nxt = (_load_vec(scratch, ITERS - 1, 0, N, TT), _load_vec(scratch, ITERS - 1, N, N, TT))
    for kk in range(ITERS):
        k = ITERS - 1 - kk
        if PF:  # the step before's sums are loaded one step ahead
            rs, cs = nxt
            kn = ct.maximum(k - 1, 0)
            nxt = (_load_vec(scratch, kn, 0, N, TT), _load_vec(scratch, kn, N, N, TT))
        else:
            rs = _load_vec(scratch, k, 0, N, TT)
            cs = _load_vec(scratch, k, N, N, TT)
        # column step M_k = R_k / cs:  dR = (dM - sum_i dM * M_k) / cs
        g = _scale_cols(_sub_sums_cols(g, M, N), _inv(cs, N, APPROX), N)
        M = _scale_cols(M, cs, N)                       # R_k
        # row step R_k = M_{k-1} / rs:  dM_{k-1} = (dR - sum_j dR * R_k) / rs
        g = _scale_rows(_sub_sums_rows(g, M, N), _inv(rs, N, APPROX), N)
        M = _scale_rows(M, rs, N)                       # M_{k-1}
    return g


def sk_bwd_through_exp(g, lg, N: ConstInt, TT: ConstInt):
    """dlogits (entries) from g = dM0 through M0 = exp(lg - rowmax): g * M0, minus the
    row's sum at its first maximal entry (the max's subgradient, as the reference)."""
    M0, m = init_entries(lg, N)
    out = ()
    for i in ct.static_iter(range(N)):
        gm = ()
        for j in ct.static_iter(range(N)):
            gm += (g[i][j] * M0[i][j],)
        srow = gm[0]
        for j in ct.static_iter(range(1, N)):
            srow = srow + gm[j]
        taken = ct.zeros((TT,), dtype=ct.int32)   # 1 once the row's first max is passed
        row = ()
        for j in ct.static_iter(range(N)):
            first = (lg[i][j] == m[i]) & (taken == 0)
            taken = ct.where(first, 1, taken)
            row += (ct.where(first, gm[j] - srow, gm[j]),)
        out += (row,)
    return out


@ct.kernel
def mhc_sk_bwd_entries(dout, logits, dlogits, scratch, eps: float, N: ConstInt, NP: ConstInt,
                       TT: ConstInt, ITERS: ConstInt, APPROX: ConstInt, PF: ConstInt):
    """Entries layout: one token's whole matrix per thread (no cross-thread sums);
    see sk_bwd_walk."""
    M0, _m = init_entries(_load_entries(logits, N, NP, TT), N)
    g = sk_bwd_walk(M0, _load_entries(dout, N, NP, TT), scratch, eps, N, TT, ITERS, APPROX, PF)
    # logits read again: keeping them and M0 live through both loops cost 2 n^2 registers
    dl = sk_bwd_through_exp(g, _load_entries(logits, N, NP, TT), N, TT)
    ct.store(dlogits, index=(ct.bid(0), 0, 0), tile=assemble(dl, N, NP, TT).astype(dlogits.dtype))

@dataclasses.dataclass(frozen=True)
class SinkhornCfg:
    """Launch config = compile key (with the dtypes)."""
    N: int       # n (static: the valid-entry mask)
    NP: int      # n padded to a power of two
    TT_FWD: int  # tokens per block, forward
    TT_BWD: int  # tokens per block, backward
    ITERS: int
    OCC_FWD: int = 0  # occupancy hints (0: compiler's choice); the kernels are
    OCC_BWD: int = 0  # latency-bound chains, so resident blocks matter
    BWD_ENTRIES: bool = False  # backward in the entries layout (mhc_sk_bwd_entries)
    APPROX: int = 0   # 1: approximate divides (div.approx) in the entries kernels
    PF: int = 0       # 1: entries backward loads each step's sums one step ahead

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, T: int, n: int, iters: int, entries: bool | None = None) -> "SinkhornCfg":
        """``entries``: the backward's design (None: entries; False: the padded tile)."""
        NP = next_pow2(n)
        # the fastest configs of the H200 sweeps (iters=20; numbers in
        # benchmarks/results/nvidia-h200-mhc-cutile.md): fwd 128 tokens/block at the compiler's occupancy,
        # approximate divides. bwd: entries layout, 128 tokens/block, approximate
        # divides, each step's sums loaded one step ahead (no spills at n = 8 either).
        if entries is None or entries:
            return cls(N=n, NP=NP, TT_FWD=128, TT_BWD=128, ITERS=iters, OCC_FWD=0, OCC_BWD=0,
                       BWD_ENTRIES=True, APPROX=1, PF=1)
        # the padded-tile backward: 8 / NP^2 * 16 tokens per block at occupancy 8
        return cls(N=n, NP=NP, TT_FWD=128, TT_BWD=max(1, 128 // (NP * NP)),
                   ITERS=iters, OCC_FWD=0, OCC_BWD=8, APPROX=1)

def fwd_launch(logits, out, iters: int, eps: float, cfg: SinkhornCfg | None = None) -> Launch:
    """logits, out: [T, n, n] fp32, contiguous."""
    T, n, _ = logits.shape
    cfg = cfg or SinkhornCfg.heuristic(T, n, iters)
    return Launch(mhc_sk_fwd, (cdiv(T, cfg.TT_FWD),),
                  (logits, out, float(eps), cfg.N, cfg.NP, cfg.TT_FWD, cfg.ITERS, cfg.APPROX), cfg,
                  occ(cfg.OCC_FWD))


def bwd_launch(dout, logits, dlogits, iters: int, eps: float, cfg: SinkhornCfg | None = None) -> Launch:
    """dout, logits, dlogits: [T, n, n] fp32, contiguous. The entries backward's scratch
    [max(iters, 1), 2n, T] fp32 is a per-stream ``workspace`` (reused between eager calls,
    fresh inside a graph capture; the launch keeps it alive)."""
    T, n, _ = logits.shape
    cfg = cfg or SinkhornCfg.heuristic(T, n, iters)
    grid = (cdiv(T, cfg.TT_BWD),)
    if cfg.BWD_ENTRIES:
        buf = workspace("mhc_sinkhorn.bwd", (max(cfg.ITERS, 1), 2 * cfg.N, T), torch.float32, logits.device)
        return Launch(mhc_sk_bwd_entries, grid,
                      (dout, logits, dlogits, buf, float(eps), cfg.N, cfg.NP, cfg.TT_BWD,
                       cfg.ITERS, cfg.APPROX, cfg.PF), cfg, occ(cfg.OCC_BWD))
    return Launch(mhc_sk_bwd, grid,
                  (dout, logits, dlogits, float(eps), cfg.N, cfg.NP, cfg.TT_BWD, cfg.ITERS), cfg,
                  occ(cfg.OCC_BWD))
