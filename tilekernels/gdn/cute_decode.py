"""CuTe DSL kernel for gdn_decode (SIMT, Hopper sm_90a): one launch per decode step for the batch.

What one launch does (specs/gdn.py, ``DECODE``; ``reference.decode`` is the truth), as the cuTile
kernel (tilekernels/gdn/cutile_decode.py) does it: conv-state shift + depthwise conv (width W) +
SiLU of the new token over q|k|v, l2norm of q and k, key head kh = h // R for value head h
(R = Hv/Hk), beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), then per value head the
gated delta rule on the state, in place: S = S*exp(g); u = beta*(v - S^T k); S = S + k u^T;
o = S^T (scale*q). fp32 math; the state is read once and written once (fp32, or bf16 rounded
once); o is rounded once to mixed's dtype.

Shape (after FLA's fused recurrent decode, which keeps a [dk, BV] slice of the state in the
registers of a small program): one CTA per (row b, value head h, block of BV state columns),
grid (Hv * NCB, B), NCB = ceil(dv / BV); G * KS threads (G = BV / VEC column groups), thread t
owns the VEC adjacent columns j0 = VEC * (t % G) .. j0 + VEC - 1 of the block and the rows
i = p, p + KS, p + 2*KS, ... (p = t // G) of them: RPT * VEC fp32 values in registers
(RPT = ceil(dk / KS)), each row one VEC-wide vector load and store (VEC 4: 16 bytes fp32, 8 bf16).
A warp's row parts are consecutive columns of one row set (VEC 1: each row one 128-byte fp32
line; VEC 4, BV 64: 16 threads (64 columns) x 2 rows). The columns of S are independent in the delta rule
(u_j and o_j need column j of S and all of k, q), so with
o = h^T q' + u (k . q')   (h = exp(g) S, q' = scale * q)
both dk-reductions (h^T k and h^T q') come from the loaded values at once: per-thread partial
sums over its rows, butterfly shuffles over the row parts inside a warp (lanes G apart), one
exchange of the warps' partials of every column through shared memory (summed in a fixed
order), then u, o and S_new = h + k u^T from registers. The state loads are issued before the
prologue (their latency overlaps it), from one 64-bit base a thread with constant row offsets.

Prologue, once per CTA: the conv step of its key head's q and k channels (2*dk, spread over the
threads), their squared norms and q.k (warp shuffles, then one exchange between warps), l2norm
and scale into shared memory (q', k broadcast to every thread), the conv step of its own BV v
channels (one a thread), the gates of (b, h). SHARE (the heuristic's where VEC > 1): the q|k conv
step is split over the cluster instead: CTA rank r computes channels r*NCH .. (NCH = ceil(2*dk /
CL)) and stores each y into the qk buffer of every CTA of the cluster (st.shared::cluster at the
mapa address), then arrives on the cluster barrier (release); the v conv step and the gates run
before its wait (acquire), after which every CTA has all of q|k.

Who writes the conv state: v's channels of a column block belong to exactly one CTA, which
reads their window and writes the shifted one itself. q's and k's channels of key head kh are
read by all CL = R * NCB CTAs of (b, kh); they form one thread-block cluster (cluster dims
(CL, 1, 1); the grid's x is hv * NCB + cb, so the cluster is the key head's value heads and
column blocks): every thread arrives on the cluster barrier (release) right after its reads
of the old window, and the cluster's rank-0 CTA writes the new window after waiting on it
(acquire), at the end of the kernel. Nothing else waits, no counters, no workspace. CL = 1
(one CTA per key head) needs no barrier. Hence the backend limit R * NCB <= 8 (the portable
cluster size): the heuristic widens BV until it holds. SHARE: each q|k channel's window is read
by one CTA only (the one computing it), which writes the shifted window right away; the
cluster's barriers are one at the start (every CTA has started before any remote store: arrive
before the state loads, wait before the first store) and the y exchange's (no CTA exits before every
remote store into it landed).

Continuous batching: with state_indices row b uses slot state_indices[b]; a slot of -1 writes
zeros to its o columns and reads/writes no state (every CTA of the cluster has the same row,
so they all leave before the barrier). Without state_indices row b uses slot b.

Layout: raw pointers to the caller's contiguous tensors (no views, no copies): mixed [B, D],
conv_state [N, C, W-1], conv_weight [C, W], A_log, dt_bias [Hv] fp32, ssm_state
[N, Hv, dk, dv], state_indices [B] int32, o [B, Hv, dv]; all offsets 64-bit. Any dk, dv >= 1
and W >= 2: rows past dk read row dk-1 with zero q', k weights, columns past dv read column
dv-1 and store nothing.

Measured (H200, Qwen3-Next, bf16 mixed, graph-replayed; the history, sessions 8-13, is in
benchmarks/results/gdn.md and h200-gdn-decode-cute.txt): the kernel is latency-bound (Nsight Compute
at B=256, fp32: DRAM 74% of peak, mostly stalled on global-load scoreboards), so what moves it is
the state in flight per SM: 64 values a thread (BV 64, VEC 4, KS 8) beat 32 and 128; ptxas held to
5 CTAs an SM (MINB) and streaming cache hints (STREAM) win or lose by the grid's size and the
state's dtype, hence the grid regimes (GRID_REGIMES, below; session 13, two runs at B = 1 .. 256).

Backend limits (for the spec's cute Backend entry): SM 9.0 (sm_90a: clusters); mixed (and so
conv_state and o) bf16 or fp32; conv_weight bf16 or fp32; A_log, dt_bias fp32; ssm_state fp32
or bf16; W >= 2; Hv/Hk <= 8 (cluster size); B < 65536 (the grid's y extent); Hv*dk*dv < 2**31
(offsets inside a slot are int32, across slots and rows 64-bit). Compile key: DecodeCfg (from Hk, Hv, dk, dv, W,
the state's element size and whether its address is a multiple of 16 bytes: VEC > 1 needs that,
a view that is not gets VEC 1; the grid's regime: B picks one of up to four precompiled configs) +
the dtypes + HAS_IDX; B is a runtime scalar (the grid).
Alternative kernel: tilekernels/gdn/cute_decode_ring.py (CTAs over (row, key head) items, the state streamed through
a TMA ring in shared memory; same helpers, so the same fp32 op order). The registered fwd kernel
(``decode_fwd``) runs it where ``RING`` is on (env TILEKERNELS_GDN_DECODE_RING=1) and its limits hold.
Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import vector
from cutlass.memory.smem import SmemAllocator

from tilekernels._cute import BoundLaunch, Launch, Ptr, Scalar, cdiv, cuda, launch_bounded, st_cluster_f32
from tilekernels._glue import env_flag, kernel, launch_into

MAX_CLUSTER = 8  # portable thread-block cluster size
VEC_BYTES = {4: 16, 2: 8}  # the heuristic's state bytes a thread loads and stores per row, by element size
VALUES = 64  # the heuristic's most state values a thread holds (VEC > 1)
SHARE = True  # the heuristic's DecodeCfg.SHARE (VEC > 1 configs)
# The registered fwd kernel runs the TMA-ring kernel (tilekernels/gdn/cute_decode_ring.py: the state streamed
# through shared memory by a producer warp) instead of this one where the batch has at least RING_FROM[state
# element size] work items (B * Hk) and the ring's limits hold (cute_decode_ring.ring_config). From session 18's
# H200 run (Qwen3-Next, graph-replayed, us, this kernel / the ring): fp32 B=4 6.46 / 6.56, B=8 9.63 / 7.32; bf16
# B=4 4.81 / 5.02, B=8 6.32 / 5.67 (benchmarks/results/gdn.md). RING: None = by RING_FROM; env
# TILEKERNELS_GDN_DECODE_RING=1 / 0 forces the ring on / off (where its limits hold).
RING_FROM = {4: 128, 2: 128}
_RING_ENV = os.environ.get("TILEKERNELS_GDN_DECODE_RING", "")
RING: bool | None = None if _RING_ENV == "" else env_flag("TILEKERNELS_GDN_DECODE_RING", False)
# Grid regimes of the VEC > 1 configs, by the state's element size: (first grid size in CTAs, MINB, STREAM),
# ascending; a grid smaller than the first entry's takes MINB 0 and no STREAM. B is runtime, so
# decode_launch picks one of these precompiled configs by the grid (B * Hv * NCB CTAs). H200, Qwen3-Next
# (64 CTAs a row), graph-replayed, two runs (session 13, benchmarks/results/h200-gdn-decode-cute.txt), us:
#   fp32: B=8 (512 CTAs) MINB 5 9.81 / 9.59 against 10.99 / 11.02 without; B=32..128 (2048..8192) MINB 5 +
#     STREAM 42.14 / 79.29 / 154.65 against MINB 5 alone 44.02 / 81.75 / 155.82; B=256 MINB 5 alone 302.14
#     against 310.94 with STREAM; B=1..4 within 2% whichever.
#   bf16: MINB 5 never wins (B=32 21.19 against 20.86 without); STREAM from B=48 (3072 CTAs): B=48 / 64 /
#     128 / 256 38.69 / 50.45 / 98.79 / 207.24 against 41.77 / 55.03 / 107.88 / 213.74; at B=32 it loses
#     (22.04 against 20.86).
GRID_REGIMES = {4: ((512, 5, False), (2048, 5, True), (8193, 5, False)), 2: ((3072, 0, True),)}


def grid_regime(ctas: int, state_bytes: int) -> tuple[int, bool]:
    """(MINB, STREAM) of a VEC > 1 config for a grid of ``ctas`` CTAs (GRID_REGIMES)."""
    minb, stream = 0, False
    for first, m, st in GRID_REGIMES.get(state_bytes, ()):
        if ctas >= first:
            minb, stream = m, st
    return minb, stream


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class DecodeCfg:
    """Launch config = compile key (with the argument dtypes and HAS_IDX).

    Hk, R (= Hv/Hk), dk, dv, W: the problem's static dims; BV: state columns per CTA; KS:
    threads per column (row parts), so BV * KS threads per CTA and ceil(dk / KS) state values
    per thread; has_idx: state_indices given."""

    Hk: int
    R: int
    dk: int
    dv: int
    W: int
    BV: int
    KS: int
    has_idx: bool = True
    MINB: int = 0  # CTAs per SM asked of ptxas (caps registers; 0: no bound)
    VEC: int = 1  # state columns per thread: one VEC-wide load and store per row (dv % VEC == 0)
    STREAM: bool = False  # VEC > 1 only: state loads L1::no_allocate, stores .cs (streaming: touched once)
    SHARE: bool = False  # q|k conv split over the cluster's CTAs, results broadcast through distributed smem

    def __post_init__(self):
        G = self.BV // max(self.VEC, 1)
        if (self.W < 2 or self.BV < 1 or self.KS < 1 or self.threads > 1024 or self.threads % 32
                or self.cluster > MAX_CLUSTER or self.VEC not in (1, 2, 4, 8) or self.BV % self.VEC
                or self.dv % self.VEC or (G % 32 and 32 % G) or (self.STREAM and self.VEC == 1)):
            raise ValueError(f"gdn_decode cute: config {self}: needs W >= 2, whole warps (BV / VEC * KS a multiple "
                             f"of 32, at most 1024), a cluster (R * NCB) of at most {MAX_CLUSTER} CTAs, VEC in "
                             f"1, 2, 4, 8 dividing BV and dv, BV / VEC dividing or a multiple of 32, "
                             f"STREAM only with VEC > 1")

    @property
    def NCB(self) -> int:
        return cdiv(self.dv, self.BV)

    @property
    def cluster(self) -> int:
        return self.R * self.NCB

    @property
    def threads(self) -> int:
        return self.BV // self.VEC * self.KS

    @property
    def G(self) -> int:
        """Column groups (threads) per row part."""
        return self.BV // self.VEC

    @property
    def PW(self) -> int:
        """Row parts per warp (their partial sums: warp shuffles; KS / PW warps' through smem)."""
        return max(1, 32 // self.G)

    @property
    def RPT(self) -> int:
        return cdiv(self.dk, self.KS)

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, state_bytes: int = 4,
                  has_idx: bool = True, aligned: bool = True, minb: int = 0, stream: bool = False) -> "DecodeCfg":
        """From the head shape and the state's element size only (never B or N): 32 columns per
        CTA (one warp's 128-byte fp32 row; the widest cluster, so the most CTAs at small B),
        widened while the cluster R * NCB would exceed 8 (so the CTA is whole warps: the
        warp-shuffle sums need full warps); rows split so that a thread holds at most 32 state
        values (KS = ceil(dk / 32) threads per column: 128 threads, 32 values at dk = 128): the
        session-8 kernel, what a state that is not 16-byte aligned (``aligned`` False) or whose dv
        is odd gets (VEC 1).
        Otherwise each thread takes VEC adjacent columns (one vector load and store per row:
        VEC_BYTES by the state's element size, VEC 4 for fp32 and bf16; the largest power of two
        <= that dividing dv), the block doubles to 2 * BV columns where dv has them (the q|k
        prologue and the cluster's barrier shared by twice the state; half the cluster), and the
        rows are split so that a thread holds at most 64 state values (KS = ceil(dk * VEC / 64),
        rounded up to whole warps). Qwen3-Next: BV 64, VEC 4, KS 8, 128 threads, 64 values, 4
        CTAs a cluster (H200: 308 us at B=256 against 328 us for the session-8 config, fp32).
        With VEC > 1 the q|k prologue is shared by the cluster (SHARE, module constant), and
        ``minb`` / ``stream`` set MINB / STREAM: :func:`decode_launch` takes them from the grid's
        regime (:func:`grid_regime`: B is the runtime dim, each regime one precompiled config).
        VEC 1 configs ignore both."""
        if W < 2:
            raise ValueError(f"gdn_decode cute: conv width W={W} < 2 is not supported")
        if Hv % Hk:
            raise ValueError(f"gdn_decode cute: Hv={Hv} is not a multiple of Hk={Hk}")
        R = Hv // Hk
        if R > MAX_CLUSTER:
            raise ValueError(f"gdn_decode cute: Hv/Hk={R} > {MAX_CLUSTER} (one cluster per key head)")
        BV = 32  # at least one warp of columns (dv < 32: the columns past dv idle), so every
        while R * cdiv(dv, BV) > MAX_CLUSTER:
            BV *= 2
        KS = cdiv(dk, 32)
        while BV * KS > 512:  # <= 512 threads keep 128 registers a thread (very wide heads spill)
            KS -= 1
        VEC = max(1, VEC_BYTES.get(state_bytes, state_bytes) // state_bytes) if aligned else 1
        while dv % VEC:
            VEC //= 2
        if VEC == 1:
            return cls(Hk=Hk, R=R, dk=dk, dv=dv, W=W, BV=BV, KS=KS, has_idx=has_idx)
        for bv in ((2 * BV, BV) if dv >= 2 * BV else (BV,)):
            G = bv // VEC
            PW = max(1, 32 // G)  # row parts a warp holds: KS a multiple of it (whole warps)
            ks = cdiv(cdiv(dk * VEC, VALUES), PW) * PW
            if G * ks <= 512:  # <= 512 threads of <= 128 registers
                return cls(Hk=Hk, R=R, dk=dk, dv=dv, W=W, BV=bv, KS=ks, has_idx=has_idx, VEC=VEC,
                           STREAM=stream, SHARE=SHARE, MINB=minb)
        return cls(Hk=Hk, R=R, dk=dk, dv=dv, W=W, BV=BV, KS=KS, has_idx=has_idx)  # very long rows: VEC 1


# ------------------------------------------------------------------ device code


def _vec(ptr, off, n: int):
    """[n] view of a global pointer at element offset ``off`` (Int64)."""
    return cute.make_tensor(ptr + off, cute.make_layout(n))


def _silu_conv(x, conv, w, W: int):
    """silu(conv) fp32 of one conv channel: x [1] the new input, conv [W-1] its old window
    (oldest first), w [W] its taps (tap W-1 is the current token). Traced once per call site
    (a plain Python loop: unrolled)."""
    pre = conv[0].to(Float32) * w[0].to(Float32)
    for j in range(1, W - 1):
        pre = pre + conv[j].to(Float32) * w[j].to(Float32)
    pre = pre + x[0].to(Float32) * w[W - 1].to(Float32)
    return pre / (Float32(1.0) + cute.math.exp(-pre))


def _ld_state(st, off, VEC: int, stream: bool):
    """VEC consecutive state values at element offset ``off`` of ``st`` (one scalar or vector
    load; ``off`` a multiple of VEC), in the state's dtype."""
    hint = "evict_no_allocate" if stream else None
    if VEC == 1:
        return [_vec(st, off, 1)[0]]
    v = cute.arch.load(st + off, ir.VectorType.get([VEC], st.dtype.mlir_type), level1_eviction_priority=hint)
    return [st.dtype(vector.extract(v, dynamic_position=[], static_position=[e])) for e in range(VEC)]


def _st_state(st, off, vals, VEC: int, stream: bool):
    """Store VEC fp32 values rounded to the state's dtype at element offset ``off`` of ``st``."""
    cop = "cs" if stream else None
    if VEC == 1:
        _vec(st, off, 1)[0] = st.dtype(vals[0])
    else:
        w = vector.from_elements(ir.VectorType.get([VEC], st.dtype.mlir_type),
                                 [st.dtype(x).ir_value() for x in vals])
        cute.arch.store(st + off, w, cop=cop)


def _conv_step(mixed, conv, cw, xrow, crow, g, W: int):
    """One conv channel's decode step: channel ``g`` of mixed's row at ``xrow``, its window at
    conv_state row ``crow``. Returns (silu(conv) fp32, the old window [W-1] (a view of conv_state),
    the shifted window [W] in registers: its first W-1 the new window); the caller writes that
    back (:func:`_put_window`) where the window is its alone."""
    x = _vec(mixed, xrow + g, 1)
    cv = _vec(conv, crow + Int64(g) * (W - 1), W - 1)
    w = _vec(cw, Int64(g) * W, W)
    return _silu_conv(x, cv, w, W), cv, _shifted(x, cv, W)


def _shifted(x, cv, W: int):
    """The shifted window of one conv channel in registers ([W], x's dtype; its first W-1 the new window):
    the old window ``cv`` [W-1] without its oldest input, then the new input x[0]."""
    nw = cute.make_rmem_tensor((W,), x.element_type)
    for q in range(W - 2):
        nw[q] = cv[q + 1]
    nw[W - 2] = x[0]
    return nw


def _put_window(cv, nw, W: int):
    """Write the new window (the first W-1 of :func:`_conv_step`'s registers) over the old one."""
    for q in range(W - 1):
        cv[q] = nw[q]


@cute.jit
def _gates(mixed: cute.Pointer, A_log: cute.Pointer, dt_bias: cute.Pointer, xrow, hv,
           gb: cutlass.Constexpr, Hv: cutlass.Constexpr):
    """(beta, alpha) fp32 of value head ``hv`` for mixed's row at ``xrow`` (its b at column gb + hv, a
    at gb + Hv + hv): beta = sigmoid(b), alpha = exp(g), g = -exp(A_log) softplus(a + dt_bias)
    (softplus = identity above 20)."""
    bb = _vec(mixed, xrow + (gb + hv), 1)[0].to(Float32)
    aa = _vec(mixed, xrow + (gb + Hv + hv), 1)[0].to(Float32)
    return _gate_math(bb, aa, _vec(dt_bias, Int64(hv), 1)[0], _vec(A_log, Int64(hv), 1)[0])


@cute.jit
def _gate_math(bb, aa, dtb, alog):
    """(beta, alpha) fp32 from the head's b, a (fp32) and its dt_bias, A_log (:func:`_gates`' math; the
    ring kernel's prefetched prologue calls it on values loaded an item ahead)."""
    beta = Float32(1.0) / (Float32(1.0) + cute.math.exp(-bb))
    xa = aa + dtb
    sp = xa
    if xa <= Float32(20.0):
        sp = cute.math.log1p(cute.math.exp(xa))
    alpha = cute.math.exp(-cute.math.exp(alog) * sp)
    return beta, alpha


@cute.jit
def _qk_norms(qs: cute.Tensor, ks: cute.Tensor, wsum: cute.Tensor, t, NT: cutlass.Constexpr, dk: cutlass.Constexpr,
              eps, scale, sync: cutlass.Constexpr):
    """(1/|q|, 1/|k|, k . q') of the raw y of q and k in shared memory (qs, ks [dk] fp32;
    q' = scale * l2norm(q)), over the NT threads t = 0 .. NT-1 that call it: per thread channels
    t, t + NT, .., warp butterfly, the warps' sums through ``wsum`` [NT/32, 3] summed in warp order
    after ``sync()`` (a barrier of those NT threads). Every caller gets the same values."""
    sq = Float32(0.0)
    sk = Float32(0.0)
    sqk = Float32(0.0)
    for c in cutlass.range_constexpr(cdiv(dk, NT)):
        i = t + c * NT
        if i < dk:
            yq = qs[i]
            yk = ks[i]
            sq = sq + yq * yq
            sk = sk + yk * yk
            sqk = sqk + yq * yk
    sq = cute.arch.warp_reduction_sum(sq)
    sk = cute.arch.warp_reduction_sum(sk)
    sqk = cute.arch.warp_reduction_sum(sqk)
    lane = t % 32
    warp = t // 32
    if lane == 0:
        wsum[warp, 0] = sq
        wsum[warp, 1] = sk
        wsum[warp, 2] = sqk
    sync()
    sq = wsum[0, 0]
    sk = wsum[0, 1]
    sqk = wsum[0, 2]
    for w_ in cutlass.range_constexpr(1, cdiv(NT, 32)):
        sq = sq + wsum[w_, 0]
        sk = sk + wsum[w_, 1]
        sqk = sqk + wsum[w_, 2]
    rq = cute.math.rsqrt(sq + eps)
    rk = cute.math.rsqrt(sk + eps)
    kq = sqk * rq * rk * scale  # k . q' (q' = scale * l2norm(q))
    return rq, rk, kq


@cute.jit
def _row_kq1(qs: cute.Tensor, ks: cute.Tensor, rq, rk, scale, i, dk: cutlass.Constexpr, ragged: cutlass.Constexpr):
    """(k rk, q') of row i (zeros past dk where ``ragged``: dk not a multiple of the row parts)."""
    ic = cutlass.min(i, dk - 1) if ragged else i
    kv = ks[ic] * rk
    qv = (qs[ic] * rq) * scale
    if cutlass.const_expr(ragged):
        if i >= dk:
            kv = Float32(0.0)
            qv = Float32(0.0)
    return kv, qv


@cute.jit
def _row_kq(cfg: cutlass.Constexpr, qs: cute.Tensor, ks: cute.Tensor, rq, rk, scale, p, kqr: cute.Tensor):
    """kqr [RPT, 2] fp32 = (k rk, q') of the thread's rows p, p + KS, .. (:func:`_delta_tile`'s ``kqr``)."""
    for r in cutlass.range_constexpr(cfg.RPT):
        kv, qv = _row_kq1(qs, ks, rq, rk, scale, p + cfg.KS * r, cfg.dk, cfg.dk % cfg.KS != 0)
        kqr[r, 0] = kv
        kqr[r, 1] = qv


@cute.jit
def _delta_tile(cfg: cutlass.Constexpr, s: cute.Tensor, qs: cute.Tensor, ks: cute.Tensor, vs: cute.Tensor,
                red: cute.Tensor, orow: cute.Tensor, ssm: cute.Pointer, S0, rq, rk, scale, alpha, beta, kq, p, j0,
                col, sync: cutlass.Constexpr, kqr=None):
    """The delta rule on one thread's slice of one value head's state: s [RPT, VEC] fp32 holds
    S[i, col .. col+VEC-1] for its rows i = p, p + KS, .. (cfg: dk, dv, KS, VEC, RPT, G, PW, STREAM;
    G * KS threads call it, thread (p, j0 / VEC)). qs, ks [dk] the raw y of q, k (scaled here by rq,
    rk, scale); vs: v of the block's columns (vs[j0 + e]); red [KS / PW, BV, 2] fp32 the exchange
    between warps (written, ``sync()``, read); orow [dv] o's row of this head (row-part 0 writes its
    columns < dv); the slot's state at ssm + S0 ([dk, dv] row-major), written in place (columns
    < dv, rows < dk), rounded once to its dtype. Fixed-order fp32 sums: h = alpha S; h^T k and
    h^T q' per thread over its rows, butterfly over a warp's row parts, then the warps in order;
    u = beta (v - h^T k), o = h^T q' + u (k . q'), S_new = h + k u^T. ``kqr`` [RPT, 2] fp32 (or None): the
    thread's rows' k rk and q' from :func:`_row_kq`, in place of reading qs / ks here (the ring kernel's tiles
    of an item share them; the same products, so the same results)."""
    dk, dv, KS, VEC, RPT, G, PW = cfg.dk, cfg.dv, cfg.KS, cfg.VEC, cfg.RPT, cfg.G, cfg.PW
    KW = KS // PW
    odt = orow.element_type
    # ---- per thread: h = alpha S, partial h^T k and h^T q' over its rows (per column)
    pk = cute.make_rmem_tensor((VEC,), Float32)
    pq = cute.make_rmem_tensor((VEC,), Float32)
    for e in cutlass.range_constexpr(VEC):
        pk[e] = Float32(0.0)
        pq[e] = Float32(0.0)
    for r in cutlass.range_constexpr(RPT):
        if cutlass.const_expr(kqr is not None):
            kv, qv = kqr[r, 0], kqr[r, 1]
        else:
            kv, qv = _row_kq1(qs, ks, rq, rk, scale, p + KS * r, dk, dk % KS != 0)
        for e in cutlass.range_constexpr(VEC):
            h = alpha * s[r, e]
            pk[e] = pk[e] + h * kv
            pq[e] = pq[e] + h * qv
    # the KS row parts of a column: the PW of a warp by butterfly shuffles (lanes G apart),
    # then the KW warps' sums through shared memory, each summed in a fixed order
    for e in cutlass.range_constexpr(VEC):
        for sh in cutlass.range_constexpr(cfg.PW.bit_length() - 1):
            pk[e] = pk[e] + cute.arch.shuffle_sync_bfly(pk[e], offset=G << sh)
            pq[e] = pq[e] + cute.arch.shuffle_sync_bfly(pq[e], offset=G << sh)
    if cutlass.const_expr(KW > 1):
        if p % PW == 0:
            for e in cutlass.range_constexpr(VEC):
                red[p // PW, j0 + e, 0] = pk[e]
                red[p // PW, j0 + e, 1] = pq[e]
        sync()
        for e in cutlass.range_constexpr(VEC):
            pk[e] = red[0, j0 + e, 0]
            pq[e] = red[0, j0 + e, 1]
            for w_ in cutlass.range_constexpr(1, KW):
                pk[e] = pk[e] + red[w_, j0 + e, 0]
                pq[e] = pq[e] + red[w_, j0 + e, 1]
    u = cute.make_rmem_tensor((VEC,), Float32)
    for e in cutlass.range_constexpr(VEC):
        u[e] = beta * (vs[j0 + e] - pk[e])
    if p == 0:
        if col < dv:
            for e in cutlass.range_constexpr(VEC):
                orow[col + e] = odt(pq[e] + u[e] * kq)
    # ---- S_new = h + k u, stored in place (rounded once to the state's dtype); k is read
    # again from shared memory (the same product as above) instead of being kept in registers
    stp = ssm + (S0 + Int64(p * dv + col))
    for r in cutlass.range_constexpr(RPT):
        i = p + KS * r
        if col < dv:
            if cutlass.const_expr(dk % KS != 0):
                if i < dk:
                    kv = kqr[r, 0] if cutlass.const_expr(kqr is not None) else ks[i] * rk
                    _st_state(stp, KS * r * dv, [alpha * s[r, e] + kv * u[e] for e in range(VEC)], VEC, cfg.STREAM)
            else:
                kv = kqr[r, 0] if cutlass.const_expr(kqr is not None) else ks[i] * rk
                _st_state(stp, KS * r * dv, [alpha * s[r, e] + kv * u[e] for e in range(VEC)], VEC, cfg.STREAM)


@cute.kernel
def _decode_kernel(cfg: cutlass.Constexpr, mixed: cute.Pointer, conv: cute.Pointer, cw: cute.Pointer,
                   A_log: cute.Pointer, dt_bias: cute.Pointer, ssm: cute.Pointer, idx: cute.Pointer,
                   o: cute.Pointer, eps: Float32, scale: Float32):
    Hk, R, dk, dv, W, BV, KS, VEC = cfg.Hk, cfg.R, cfg.dk, cfg.dv, cfg.W, cfg.BV, cfg.KS, cfg.VEC
    Hv = Hk * R
    NCB, RPT, NT, CL = cfg.NCB, cfg.RPT, cfg.threads, cfg.cluster
    G, KW = cfg.G, cfg.KS // cfg.PW
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    NW = cdiv(NT, 32)
    odt = o.dtype

    t, _, _ = cute.arch.thread_idx()
    bx, b, _ = cute.arch.block_idx()
    hv = bx // NCB
    cb = bx % NCB
    kh = hv // R
    jg = t % G
    p = t // G
    j0 = jg * VEC  # this thread's first column in the block
    col = cb * BV + j0
    colc = col
    if cutlass.const_expr(dv % BV != 0):
        colc = cutlass.min(col, dv - VEC)

    slot = Int32(b)
    if cutlass.const_expr(cfg.has_idx):
        slot = _vec(idx, Int64(b), 1)[0]
    orow = _vec(o, Int64(b) * (Hv * dv) + hv * dv, dv)
    if slot < 0:  # padded row: o = 0, no state touched (the whole cluster leaves here)
        if p == 0:
            if col < dv:
                for e in cutlass.range_constexpr(VEC):
                    orow[col + e] = odt(0.0)
    else:
        smem = SmemAllocator()
        qk = smem.allocate_tensor(Float32, cute.make_layout(2 * dk), 16)  # raw y of q | k
        qs = cute.make_tensor(qk.iterator, cute.make_layout(dk))
        ks = cute.make_tensor(qk.iterator + dk, cute.make_layout(dk))
        vs = smem.allocate_tensor(Float32, cute.make_layout(BV), 16)
        red = smem.allocate_tensor(Float32, cute.make_layout((KW, BV, 2), stride=(BV, 1, KW * BV)), 16)
        wsum = smem.allocate_tensor(Float32, cute.make_layout((NW, 3), stride=(3, 1)), 16)
        if cutlass.const_expr(cfg.SHARE and CL > 1):
            # SHARE stores into the other CTAs' shared memory: every CTA of the cluster must have
            # started first (racecheck: "a block that might not have entered yet"). Arrive here,
            # wait just before the first remote store, so the state loads below are in flight meanwhile.
            cute.arch.cluster_arrive_relaxed()

        # ---- the state slice (RPT rows x VEC columns), loaded first (its latency overlaps the prologue)
        # one 64-bit base per thread (its row p, first column) + constant row offsets: the
        # loads and stores take immediate offsets (no 64-bit address a row)
        S0 = Int64(slot) * (Hv * dk * dv) + Int64(hv * dk * dv)
        ldp = ssm + (S0 + Int64(p * dv + colc))
        s = cute.make_rmem_tensor((RPT, VEC), Float32)
        for r in cutlass.range_constexpr(RPT):
            roff = KS * r * dv
            if cutlass.const_expr(dk % KS != 0):
                roff = (cutlass.min(p + KS * r, dk - 1) - p) * dv
            vals = _ld_state(ldp, roff, VEC, cfg.STREAM)
            for e in cutlass.range_constexpr(VEC):
                s[r, e] = vals[e].to(Float32)

        xrow = Int64(b) * D
        crow = Int64(slot) * (C * (W - 1))
        # ---- q|k conv step of key head kh; y raw into smem
        NQK = cdiv(2 * dk, NT)
        if cutlass.const_expr(cfg.SHARE):
            # the cluster's CTAs split the 2*dk channels (rank r: channels r*NCH ..): each reads
            # its channels' old windows alone, so it writes the shifted ones at once, and stores y
            # into every CTA's qk (distributed shared memory; published by the cluster barrier)
            NCH = cdiv(2 * dk, CL)
            rank = bx % CL
            if cutlass.const_expr(CL > 1):
                cute.arch.cluster_wait()  # every CTA of the cluster is running (its smem exists)
            for c in cutlass.range_constexpr(cdiv(NCH, NT)):
                lc = t + c * NT
                ch = rank * NCH + lc
                if lc < NCH and ch < 2 * dk:
                    gq = (ch // dk) * (Hk * dk) + kh * dk + ch % dk
                    yq, cvq, nwq = _conv_step(mixed, conv, cw, xrow, crow, gq, W)
                    _put_window(cvq, nwq, W)
                    if cutlass.const_expr(CL > 1):
                        for r_ in cutlass.range_constexpr(CL):
                            st_cluster_f32(qk.iterator + ch, r_, yq)
                    else:
                        qk[ch] = yq
            if cutlass.const_expr(CL > 1):
                cute.arch.cluster_arrive()  # release: this CTA's y stores into the cluster's qk
        else:
            # every CTA computes all 2*dk channels over its threads; the new windows wait in
            # registers for the cluster's rank-0 CTA to write them at the end
            newwin = cute.make_rmem_tensor((NQK, W), mixed.dtype)
            for c in cutlass.range_constexpr(NQK):
                ch = t + c * NT
                chc = cutlass.min(ch, 2 * dk - 1)
                which = chc // dk
                i = chc % dk
                g = which * (Hk * dk) + kh * dk + i
                y, _, nw = _conv_step(mixed, conv, cw, xrow, crow, g, W)
                for q in cutlass.range_constexpr(W - 1):
                    newwin[c, q] = nw[q]
                if ch < 2 * dk:
                    if which == 0:
                        qs[i] = y
                    else:
                        ks[i] = y
        # ---- v conv step of this CTA's BV columns, one a thread (their window is this CTA's alone)
        for c in cutlass.range_constexpr(cdiv(BV, NT)):
            jv = t + c * NT
            if jv < BV:
                cv_col = cb * BV + jv
                cv_colc = cv_col
                if cutlass.const_expr(dv % BV != 0):
                    cv_colc = cutlass.min(cv_col, dv - 1)
                yv, cvv, nwv = _conv_step(mixed, conv, cw, xrow, crow, 2 * Hk * dk + hv * dv + cv_colc, W)
                vs[jv] = yv
                if cv_col < dv:
                    _put_window(cvv, nwv, W)
        if cutlass.const_expr(CL > 1 and not cfg.SHARE):
            cute.arch.cluster_arrive()  # release: this thread's reads of the old q|k window are done
        # ---- gates of (b, hv)
        beta, alpha = _gates(mixed, A_log, dt_bias, xrow, hv, 2 * Hk * dk + 2 * Hv * dv, Hv)
        if cutlass.const_expr(CL > 1 and cfg.SHARE):
            cute.arch.cluster_wait()  # acquire: every CTA's y stores into this CTA's qk
        cute.arch.sync_threads()

        # ---- |q|^2, |k|^2, q.k over dk: per thread, warp butterfly, one exchange between warps
        rq, rk, kq = _qk_norms(qs, ks, wsum, t, NT, dk, eps, scale, cute.arch.sync_threads)

        # ---- the delta rule on the slice: h = alpha S, h^T k and h^T q' (per thread, warp
        # butterfly, one exchange between warps), u, o, S_new = h + k u^T stored in place
        _delta_tile(cfg, s, qs, ks, vs, red, orow, ssm, S0, rq, rk, scale, alpha, beta, kq, p, j0, col,
                    cute.arch.sync_threads)

        # ---- the new q|k window of (b, kh): written by the cluster's rank-0 CTA once every
        # CTA of the cluster has read the old one
        # (SHARE: written in the prologue by the CTA that read them)
        if cutlass.const_expr(not cfg.SHARE):
            if cutlass.const_expr(CL > 1):
                cute.arch.cluster_wait()
            if bx % CL == 0:
                for c in cutlass.range_constexpr(NQK):
                    ch = t + c * NT
                    if ch < 2 * dk:
                        which = ch // dk
                        i = ch % dk
                        g = which * (Hk * dk) + kh * dk + i
                        cv = _vec(conv, crow + Int64(g) * (W - 1), W - 1)
                        for q in cutlass.range_constexpr(W - 1):
                            cv[q] = newwin[c, q]


@cute.jit
def _decode_host(cfg: cutlass.Constexpr, mixed: cute.Pointer, conv: cute.Pointer, cw: cute.Pointer,
                 A_log: cute.Pointer, dt_bias: cute.Pointer, ssm: cute.Pointer, idx: cute.Pointer,
                 o: cute.Pointer, B: Int32, eps: Float32, scale: Float32, stream: cuda.CUstream):
    grid = [cfg.R * cfg.Hk * cfg.NCB, B, 1]
    k = _decode_kernel(cfg, mixed, conv, cw, A_log, dt_bias, ssm, idx, o, eps, scale)
    if cutlass.const_expr(cfg.cluster > 1):
        launch_bounded(k, cfg.MINB, grid=grid, block=[cfg.threads, 1, 1], cluster=[cfg.cluster, 1, 1], stream=stream)
    else:
        launch_bounded(k, cfg.MINB, grid=grid, block=[cfg.threads, 1, 1], stream=stream)


# ------------------------------------------------------------------ host side


@functools.lru_cache(maxsize=256)
def _launch(cfg: DecodeCfg, mdt: torch.dtype, wdt: torch.dtype, sdt: torch.dtype) -> Launch:
    e = mdt.itemsize
    sig = (Ptr(mdt, e), Ptr(mdt, e), Ptr(wdt, wdt.itemsize),
           Ptr(torch.float32, 4), Ptr(torch.float32, 4), Ptr(sdt, sdt.itemsize),
           Ptr(torch.int32, 4), Ptr(mdt, e), Scalar(Int32), Scalar(Float32), Scalar(Float32))
    return Launch("gdn.cute_decode.decode", _decode_host, cfg, sig)


def decode_launch(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o,
                  Hk: int = 16, eps: float = 1e-6, scale: float | None = None,
                  cfg: DecodeCfg | None = None) -> BoundLaunch:
    """The one launch of a decode step (argument order as the registry's fwd kernel)."""
    B = mixed.shape[0]
    _, Hv, dk, dv = ssm_state.shape
    W = conv_weight.shape[1]
    has_idx = state_indices is not None
    se = ssm_state.element_size()
    if cfg is None:
        aligned = ssm_state.data_ptr() % 16 == 0
        cfg = DecodeCfg.heuristic(Hk, Hv, dk, dv, W, se, has_idx, aligned)
        regime = grid_regime(B * Hv * cfg.NCB, se) if cfg.VEC > 1 else (0, False)
        if regime != (0, False):  # B is runtime: its grid's precompiled config
            cfg = DecodeCfg.heuristic(Hk, Hv, dk, dv, W, se, has_idx, aligned, *regime)
    if ssm_state.data_ptr() % (cfg.VEC * se):
        raise ValueError(f"gdn_decode cute: config {cfg} needs ssm_state's address a multiple of {cfg.VEC * se} bytes")
    if (cfg.Hk, cfg.R * cfg.Hk, cfg.dk, cfg.dv, cfg.W, cfg.has_idx) != (Hk, Hv, dk, dv, W, has_idx):
        raise ValueError(f"gdn_decode cute: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, dv={dv}, "
                         f"W={W}, state_indices {'given' if has_idx else 'absent'}")
    scale = float(dk ** -0.5 if scale is None else scale)
    ln = _launch(cfg, mixed.dtype, conv_weight.dtype, ssm_state.dtype)
    # without state_indices the pointer is never read; A_log stands in for it
    idx = state_indices if has_idx else A_log
    return BoundLaunch(ln, (mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, idx, o, B, float(eps), scale),
                       (Hv * cfg.NCB, B, 1))


# gdn_decode fwd, destination-passing (the registry's kernel signature: inputs, outputs, params in
# spec order): o [B, Hv, dv] written, conv_state and ssm_state updated in place; B = 0 launches nothing
decode_into = launch_into(decode_launch)


def use_ring(mixed, ssm_state, Hk: int) -> bool:
    """Whether the cute fwd kernel takes the ring kernel for a batch of mixed.shape[0] rows (``RING``, else
    ``RING_FROM``; B is known on the host, so a CUDA graph captures the one kernel its B takes)."""
    if RING is not None:
        return RING
    return mixed.shape[0] * Hk >= RING_FROM.get(ssm_state.element_size(), 1 << 62)


def decode_fwd(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o, Hk, eps, scale):
    """The registered cute fwd kernel (``decode_into``'s arguments): the ring kernel
    (cute_decode_ring.decode_ring_into, given the config it looked up once) where :func:`use_ring` says so and
    its limits hold, else this module's."""
    args = (mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o, Hk, eps, scale)
    if use_ring(mixed, ssm_state, Hk):
        from tilekernels.gdn import cute_decode_ring as ring

        cfg = ring.ring_config(mixed, conv_state, conv_weight, ssm_state, state_indices, Hk)
        if cfg is not None:
            ring.decode_ring_into(*args, cfg)
            return
    decode_into(*args)


kernel("gdn_decode", "cute", "fwd")(decode_fwd)


def representative_launch(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                          dtype=torch.bfloat16, state_dtype=torch.float32, with_indices: bool = True,
                          cfg: DecodeCfg | None = None, aligned: bool = True) -> Launch:
    """The launch at one head shape, for the CPU compile test (``Launch.export("sm_90a")``);
    ``aligned`` False: the heuristic's config for a state not 16-byte aligned (VEC 1)."""
    cfg = cfg or DecodeCfg.heuristic(Hk, Hv, dk, dv, W, state_dtype.itemsize,
                                     with_indices, aligned)
    return _launch(cfg, dtype, dtype, state_dtype)
