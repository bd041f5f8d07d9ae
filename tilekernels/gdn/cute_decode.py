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
grid (Hv * NCB, B), NCB = ceil(dv / BV); BV * KS threads, thread t owns column j = t % BV of
the block and the rows i = p, p + KS, p + 2*KS, ... (p = t // BV) of S[:, j]: RPT = ceil(dk / KS)
fp32 values in registers. A warp is 32 consecutive columns of one row set, so each row of its
state loads and stores is one 128-byte (fp32) line. The columns of S are independent in the
delta rule (u_j and o_j need column j of S and all of k, q), so with
o = h^T q' + u (k . q')   (h = exp(g) S, q' = scale * q)
both dk-reductions (h^T k and h^T q') come from the loaded values at once: per-thread partial
sums over its rows, one exchange of the KS partials of every column through shared memory
(summed in a fixed order), then u, o and S_new = h + k u^T from registers. KS = 1 needs no
exchange. The state loads are issued before the prologue (their latency overlaps it).

Prologue, once per CTA: the conv step of its key head's q and k channels (2*dk, spread over the
threads), their squared norms and q.k (warp shuffles, then one exchange between warps), l2norm
and scale into shared memory (q', k broadcast to every thread), the conv step of its own BV v
channels (threads with p = 0), the gates of (b, h).

Who writes the conv state: v's channels of a column block belong to exactly one CTA, which
reads their window and writes the shifted one itself. q's and k's channels of key head kh are
read by all CL = R * NCB CTAs of (b, kh); they form one thread-block cluster (cluster dims
(CL, 1, 1); the grid's x is hv * NCB + cb, so the cluster is the key head's value heads and
column blocks): every thread arrives on the cluster barrier (release) right after its reads
of the old window, and the cluster's rank-0 CTA writes the new window after waiting on it
(acquire), at the end of the kernel. Nothing else waits, no counters, no workspace. CL = 1
(one CTA per key head) needs no barrier. Hence the backend limit R * NCB <= 8 (the portable
cluster size): the heuristic widens BV until it holds.

Continuous batching: with state_indices row b uses slot state_indices[b]; a slot of -1 writes
zeros to its o columns and reads/writes no state (every CTA of the cluster has the same row,
so they all leave before the barrier). Without state_indices row b uses slot b.

Layout: raw pointers to the caller's contiguous tensors (no views, no copies): mixed [B, D],
conv_state [N, C, W-1], conv_weight [C, W], A_log, dt_bias [Hv] fp32, ssm_state
[N, Hv, dk, dv], state_indices [B] int32, o [B, Hv, dv]; all offsets 64-bit. Any dk, dv >= 1
and W >= 2: rows past dk read row dk-1 with zero q', k weights, columns past dv read column
dv-1 and store nothing.

Measured (H200, Qwen3-Next, bf16 mixed, graph-replayed, benchmarks/results/h200-gdn-decode-cute.txt):
fp32 state 3.76 / 46.41 / 329.30 us at B = 1 / 32 / 256 (78.6% of 4.27 TB/s at B=256), bf16 state
3.54 / 26.06 / 236.92; FLA's fused_recurrent_gated_delta_rule (no conv step) 3.33 / 48.99 / 366.37
in the same run; the cuTile backend 9.43 / 68.46 / 407.43 (fp32), 10.93 / 35.93 / 314.72 (bf16)
in an earlier run on the same device kind. 72 registers a thread (7 CTAs of 128 threads an SM); the
first version kept k in registers for the update too (96 registers, 5 CTAs): 363.40 us at B=256.
What limits it (not profiled): each CTA's state loads wait on the state_indices load (slot ->
address), and only 7 x 16 KB of state loads are in flight per SM; the q|k prologue is recomputed by
every CTA of a cluster (8 at Qwen3-Next shapes: 4 KB of L2 reads each). A bf16 state moves 64-byte
rows per warp with 2-byte loads (no vector loads yet). Wider blocks (BV 64), more rows a thread
(KS 2) and ptxas held to 64 registers (MINB 8, spills) measured slower or equal.

Backend limits (for the spec's cute Backend entry): SM 9.0 (sm_90a: clusters); mixed (and so
conv_state and o) bf16 or fp32; conv_weight bf16 or fp32; A_log, dt_bias fp32; ssm_state fp32
or bf16; W >= 2; Hv/Hk <= 8 (cluster size); B < 65536 (the grid's y extent); Hv*dk*dv < 2**31
(offsets inside a slot are int32, across slots and rows 64-bit). Compile key: DecodeCfg (from Hk, Hv, dk, dv, W
and the state's element size only) + the dtypes + HAS_IDX; B is a runtime scalar (the grid).
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

from tilekernels._cute import Launch, Ptr, Scalar, cdiv, cuda
from tilekernels._glue import kernel, launch_into

MAX_CLUSTER = 8  # portable thread-block cluster size


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

    def __post_init__(self):
        if (self.W < 2 or self.BV < 1 or self.KS < 1 or self.threads > 1024 or self.threads % 32
                or self.cluster > MAX_CLUSTER):
            raise ValueError(f"gdn_decode cute: config {self}: needs W >= 2, whole warps (BV * KS a multiple "
                             f"of 32, at most 1024) and a cluster (R * NCB) of at most {MAX_CLUSTER} CTAs")

    @property
    def NCB(self) -> int:
        return cdiv(self.dv, self.BV)

    @property
    def cluster(self) -> int:
        return self.R * self.NCB

    @property
    def threads(self) -> int:
        return self.BV * self.KS

    @property
    def RPT(self) -> int:
        return cdiv(self.dk, self.KS)

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, state_bytes: int = 4,
                  has_idx: bool = True) -> "DecodeCfg":
        """From the head shape and the state's element size only (never B or N): 32 columns per
        CTA (one warp's 128-byte fp32 row; the widest cluster, so the most CTAs at small B),
        widened while the cluster R * NCB would exceed 8 (so the CTA is whole warps: the
        warp-shuffle sums need full warps); rows split so that a thread holds at most 32 state
        values (KS = ceil(dk / 32) threads per column: 128 threads, 32 values at dk = 128)."""
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
        return cls(Hk=Hk, R=R, dk=dk, dv=dv, W=W, BV=BV, KS=KS, has_idx=has_idx)


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


@cute.kernel
def _decode_kernel(cfg: cutlass.Constexpr, mixed: cute.Pointer, conv: cute.Pointer, cw: cute.Pointer,
                   A_log: cute.Pointer, dt_bias: cute.Pointer, ssm: cute.Pointer, idx: cute.Pointer,
                   o: cute.Pointer, eps: Float32, scale: Float32):
    Hk, R, dk, dv, W, BV, KS = cfg.Hk, cfg.R, cfg.dk, cfg.dv, cfg.W, cfg.BV, cfg.KS
    Hv = Hk * R
    NCB, RPT, NT, CL = cfg.NCB, cfg.RPT, cfg.threads, cfg.cluster
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    NW = cdiv(NT, 32)
    sdt = ssm.dtype
    odt = o.dtype

    t, _, _ = cute.arch.thread_idx()
    bx, b, _ = cute.arch.block_idx()
    hv = bx // NCB
    cb = bx % NCB
    kh = hv // R
    j = t % BV
    p = t // BV
    col = cb * BV + j
    colc = col
    if cutlass.const_expr(dv % BV != 0):
        colc = cutlass.min(col, dv - 1)

    slot = Int32(b)
    if cutlass.const_expr(cfg.has_idx):
        slot = _vec(idx, Int64(b), 1)[0]
    orow = _vec(o, Int64(b) * (Hv * dv) + hv * dv, dv)
    if slot < 0:  # padded row: o = 0, no state touched (the whole cluster leaves here)
        if p == 0:
            if col < dv:
                orow[col] = odt(0.0)
    else:
        smem = SmemAllocator()
        qs = smem.allocate_tensor(Float32, cute.make_layout(dk), 16)   # raw y of q, then q'
        ks = smem.allocate_tensor(Float32, cute.make_layout(dk), 16)   # raw y of k, then k
        vs = smem.allocate_tensor(Float32, cute.make_layout(BV), 16)
        red = smem.allocate_tensor(Float32, cute.make_layout((KS, BV, 2), stride=(BV, 1, KS * BV)), 16)
        wsum = smem.allocate_tensor(Float32, cute.make_layout((NW, 3), stride=(3, 1)), 16)

        # ---- the state column slice, loaded first (its latency overlaps the prologue)
        S0 = Int64(slot) * (Hv * dk * dv) + Int64(hv * dk * dv)
        st = _vec(ssm, S0, dk * dv)
        s = cute.make_rmem_tensor((RPT,), Float32)
        for r in cutlass.range_constexpr(RPT):
            i = p + KS * r
            if cutlass.const_expr(dk % KS != 0):
                i = cutlass.min(i, dk - 1)
            s[r] = st[i * dv + colc].to(Float32)

        xrow = Int64(b) * D
        crow = Int64(slot) * (C * (W - 1))
        # ---- q|k conv step of key head kh: 2*dk channels over the threads; y raw into smem
        NQK = cdiv(2 * dk, NT)
        newwin = cute.make_rmem_tensor((NQK, W), mixed.dtype)
        for c in cutlass.range_constexpr(NQK):
            ch = t + c * NT
            chc = cutlass.min(ch, 2 * dk - 1)
            which = chc // dk
            i = chc % dk
            g = which * (Hk * dk) + kh * dk + i
            xv = _vec(mixed, xrow + g, 1)
            cv = _vec(conv, crow + Int64(g) * (W - 1), W - 1)
            wv = _vec(cw, Int64(g) * W, W)
            y = _silu_conv(xv, cv, wv, W)
            for q in cutlass.range_constexpr(W - 2):
                newwin[c, q] = cv[q + 1]
            newwin[c, W - 2] = xv[0]
            if ch < 2 * dk:
                if which == 0:
                    qs[i] = y
                else:
                    ks[i] = y
        # ---- v conv step of this CTA's columns (their window is this CTA's alone)
        if p == 0:
            g = 2 * Hk * dk + hv * dv + colc
            xv = _vec(mixed, xrow + g, 1)
            cv = _vec(conv, crow + Int64(g) * (W - 1), W - 1)
            wv = _vec(cw, Int64(g) * W, W)
            vs[j] = _silu_conv(xv, cv, wv, W)
            nw = cute.make_rmem_tensor((W,), mixed.dtype)
            for q in cutlass.range_constexpr(W - 2):
                nw[q] = cv[q + 1]
            nw[W - 2] = xv[0]
            if col < dv:
                for q in cutlass.range_constexpr(W - 1):
                    cv[q] = nw[q]
        if cutlass.const_expr(CL > 1):
            cute.arch.cluster_arrive()  # release: this thread's reads of the old q|k window are done
        # ---- gates of (b, hv)
        bb = _vec(mixed, xrow + (2 * Hk * dk + 2 * Hv * dv + hv), 1)[0].to(Float32)
        aa = _vec(mixed, xrow + (2 * Hk * dk + 2 * Hv * dv + Hv + hv), 1)[0].to(Float32)
        beta = Float32(1.0) / (Float32(1.0) + cute.math.exp(-bb))
        xa = aa + _vec(dt_bias, Int64(hv), 1)[0]
        sp = xa
        if xa <= Float32(20.0):
            sp = cute.math.log1p(cute.math.exp(xa))
        alpha = cute.math.exp(-cute.math.exp(_vec(A_log, Int64(hv), 1)[0]) * sp)
        cute.arch.sync_threads()

        # ---- |q|^2, |k|^2, q.k over dk: per thread, warp butterfly, one exchange between warps
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
        cute.arch.sync_threads()
        sq = wsum[0, 0]
        sk = wsum[0, 1]
        sqk = wsum[0, 2]
        for w_ in cutlass.range_constexpr(1, NW):
            sq = sq + wsum[w_, 0]
            sk = sk + wsum[w_, 1]
            sqk = sqk + wsum[w_, 2]
        rq = cute.math.rsqrt(sq + eps)
        rk = cute.math.rsqrt(sk + eps)
        kq = sqk * rq * rk * scale  # k . q' (q' = scale * l2norm(q))

        # ---- per thread: h = alpha S, partial h^T k and h^T q' over its rows
        pk = Float32(0.0)
        pq = Float32(0.0)
        for r in cutlass.range_constexpr(RPT):
            i = p + KS * r
            ic = i
            if cutlass.const_expr(dk % KS != 0):
                ic = cutlass.min(i, dk - 1)
            kv = ks[ic] * rk
            qv = (qs[ic] * rq) * scale
            if cutlass.const_expr(dk % KS != 0):
                if i >= dk:
                    kv = Float32(0.0)
                    qv = Float32(0.0)
            h = alpha * s[r]
            s[r] = h
            pk = pk + h * kv
            pq = pq + h * qv
        if cutlass.const_expr(KS > 1):
            red[p, j, 0] = pk
            red[p, j, 1] = pq
            cute.arch.sync_threads()
            pk = red[0, j, 0]
            pq = red[0, j, 1]
            for e in cutlass.range_constexpr(1, KS):
                pk = pk + red[e, j, 0]
                pq = pq + red[e, j, 1]
        u = beta * (vs[j] - pk)
        if p == 0:
            if col < dv:
                orow[col] = odt(pq + u * kq)
        # ---- S_new = h + k u, stored in place (rounded once to the state's dtype); k is read
        # again from shared memory (the same product as above) instead of being kept in registers
        for r in cutlass.range_constexpr(RPT):
            i = p + KS * r
            if col < dv:
                if cutlass.const_expr(dk % KS != 0):
                    if i < dk:
                        st[i * dv + col] = sdt(s[r] + (ks[i] * rk) * u)
                else:
                    st[i * dv + col] = sdt(s[r] + (ks[i] * rk) * u)

        # ---- the new q|k window of (b, kh): written by the cluster's rank-0 CTA once every
        # CTA of the cluster has read the old one
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
    kw = {}
    if cutlass.const_expr(cfg.MINB > 0):
        # the carveout given with it: otherwise the DSL asks the driver at compile time (no CPU compile)
        kw = dict(min_blocks_per_mp=cfg.MINB, preferred_smem_carveout=-1)
    if cutlass.const_expr(cfg.cluster > 1):
        k.launch(grid=grid, block=[cfg.threads, 1, 1], cluster=[cfg.cluster, 1, 1], stream=stream, **kw)
    else:
        k.launch(grid=grid, block=[cfg.threads, 1, 1], stream=stream, **kw)


# ------------------------------------------------------------------ host side


@dataclasses.dataclass
class BoundLaunch:
    """A :class:`Launch` with its argument values (what the timing scripts replay): ``run()``."""

    launch: Launch
    values: tuple
    grid: tuple

    @property
    def cfg(self) -> DecodeCfg:
        return self.launch.cfg

    def run(self) -> None:
        self.launch.run(*self.values)


@functools.lru_cache(maxsize=256)
def _launch(cfg: DecodeCfg, mdt: torch.dtype, wdt: torch.dtype, sdt: torch.dtype) -> Launch:
    e = torch.tensor([], dtype=mdt).element_size()
    sig = (Ptr(mdt, e), Ptr(mdt, e), Ptr(wdt, torch.tensor([], dtype=wdt).element_size()),
           Ptr(torch.float32, 4), Ptr(torch.float32, 4), Ptr(sdt, torch.tensor([], dtype=sdt).element_size()),
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
    cfg = cfg or DecodeCfg.heuristic(Hk, Hv, dk, dv, W, ssm_state.element_size(), has_idx)
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
kernel("gdn_decode", "cute", "fwd")(decode_into)


def representative_launch(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                          dtype=torch.bfloat16, state_dtype=torch.float32, with_indices: bool = True,
                          cfg: DecodeCfg | None = None) -> Launch:
    """The launch at one head shape, for the CPU compile test (``Launch.export("sm_90a")``)."""
    cfg = cfg or DecodeCfg.heuristic(Hk, Hv, dk, dv, W, torch.tensor([], dtype=state_dtype).element_size(),
                                     with_indices)
    return _launch(cfg, dtype, dtype, state_dtype)
