"""Probe: the first gdn_pre_gated cuTile forward (one [16 tokens x one head] block per unit; TMA-staged
stores), kept verbatim beside the head-group forward in tilekernels/gdn/cutile_pre_gated.py for the
old-vs-new timing of benchmarks/gdn_pre_check.py. Not registered with the registry; GPU host only.
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

BIG = 2 ** 31 - 1
WMAX = 4  # conv widths up to this read their taps through shifted views (kernel arguments)


# ------------------------------------------------------------------ device helpers (shared with the bwd)


def seq_start(seq, rows, t0, TT: ConstInt, W: ConstInt, CH: ConstInt, THD: ConstBool):
    """[TT] int32: the packed index where each row's sequence starts, exact where it is
    within W-1 rows of the row (further back only "<= t - W + 1" is guaranteed, which is all
    the conv's masks need). BSHD: seq is mixed [B, T, D]; THD: seq is cu_seqlens [S]."""
    if THD:
        S = seq.shape[0]
        st = ct.zeros((TT,), dtype=ct.int32)  # cu_0 = 0 is always a start
        r2 = ct.reshape(rows, (TT, 1))
        for c in range(ct.cdiv(S, CH)):
            live = (c * CH + ct.arange(CH, dtype=ct.int32)) < S
            cu = ct.where(live, ct.load(seq, index=(c,), shape=(CH,), padding_mode=PAD_ZERO), BIG)
            lo = ct.min(cu)
            hi = ct.max(ct.where(live, cu, -1))
            if lo <= t0 + TT - 1:
                if hi >= t0 - W + 2:
                    cand = ct.where(ct.reshape(cu, (1, CH)) <= r2, ct.reshape(cu, (1, CH)), 0)
                    st = ct.maximum(st, ct.max(cand, axis=1))
        return st
    else:
        T = seq.shape[1]
        return (rows // T) * T


def seq_end(seq, rows, t0, TT: ConstInt, W: ConstInt, CH: ConstInt, THD: ConstBool):
    """[TT] int32: the packed index one past each row's sequence, exact where it is within
    W-1 rows after the row (further on only ">= t + W" is guaranteed)."""
    if THD:
        S = seq.shape[0]
        en = ct.full((TT,), BIG, dtype=ct.int32)
        r2 = ct.reshape(rows, (TT, 1))
        for c in range(ct.cdiv(S, CH)):
            live = (c * CH + ct.arange(CH, dtype=ct.int32)) < S
            cu = ct.where(live, ct.load(seq, index=(c,), shape=(CH,), padding_mode=PAD_ZERO), BIG)
            lo = ct.min(cu)
            hi = ct.max(ct.where(live, cu, -1))
            if lo <= t0 + TT + W - 2:
                if hi >= t0 + 1:
                    cand = ct.where(ct.reshape(cu, (1, CH)) > r2, ct.reshape(cu, (1, CH)), BIG)
                    en = ct.minimum(en, ct.min(cand, axis=1))
        return en
    else:
        T = seq.shape[1]
        return (rows // T + 1) * T


def row_tile(src, rows, u, NT, C: ConstInt, TT: ConstInt):
    """[TT, C] fp32: rows ``rows`` (clamped into [0, NT); callers mask) of head u of
    src [NT, heads, c] (channels past c read 0)."""
    rc = ct.minimum(ct.maximum(rows, 0), NT - 1)
    t = ct.load_advanced_indexing(src, (rc, ct.Slice(u, 1), ct.Slice(0, C)), padding_mode=PAD_ZERO,
                                  allow_tma=False)
    return ct.reshape(t, (TT, C)).astype(ct.float32)


def tap_rows(src, sh, rows, i, u, NT, s: ConstInt, C: ConstInt, TT: ConstInt, TAPV: ConstBool):
    """[TT, C] fp32: rows t - s of head u for the tile's rows t = i*TT + r (unmasked; rows before
    0 read as 0). Tap 0 is the tile-aligned load of tile i; tap s > 0 is tile i-1 of the view
    sh[s-1] = src[TT - s:] (aligned there), for i > 0 and TAPV; tile 0 (and W > WMAX) gathers rows."""
    if s == 0:
        t = ct.reshape(ct.load(src, index=(i, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO,
                               allow_tma=False),
                       (TT, C)).astype(ct.float32)
    else:
        if TAPV:
            if i > 0:
                t = ct.reshape(ct.load(sh[s - 1], index=(i - 1, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO,
                               allow_tma=False),
                               (TT, C)).astype(ct.float32)
            else:
                t = row_tile(src, rows - s, u, NT, C, TT)
        else:
            t = row_tile(src, rows - s, u, NT, C, TT)
    return t


def tap(wt, j: ConstInt, C: ConstInt):
    """Tap j of a [C, WW] weight tile as [1, C]."""
    return ct.reshape(ct.extract(wt, (0, j), shape=(C, 1)), (1, C))


def weight_tile(w3, u, C: ConstInt, WW: ConstInt):
    """[C, WW] fp32 taps of head u of w3 [heads, c, W] (padding 0)."""
    return ct.reshape(ct.load(w3, index=(u, 0, 0), shape=(1, C, WW), padding_mode=PAD_ZERO),
                      (C, WW)).astype(ct.float32)


def conv_pre(src, sh, wt, rows, st, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, TAPV: ConstBool):
    """[TT, C] fp32 conv output before the SiLU: sum_s w[:, W-1-s] * x[t-s], taps before
    the row's sequence start read as 0."""
    pre = ct.zeros((TT, C), dtype=ct.float32)
    for s in ct.static_iter(range(W)):
        ok = ct.reshape(rows - s >= st, (TT, 1))
        pre = pre + ct.where(ok, tap_rows(src, sh, rows, i, u, NT, s, C, TT, TAPV), 0.0) * tap(wt, W - 1 - s, C)
    return pre


def gate_tiles(mba, A_log, dt_bias, i, TT: ConstInt, HVP: ConstInt):
    """(b, a + dt_bias, -exp(A_log)) of token tile i, [TT, HVP] / [1, HVP] fp32."""
    b = ct.reshape(ct.load(mba, index=(i, 0, 0), shape=(TT, 1, HVP), padding_mode=PAD_ZERO), (TT, HVP))
    a = ct.reshape(ct.load(mba, index=(i, 1, 0), shape=(TT, 1, HVP), padding_mode=PAD_ZERO), (TT, HVP))
    al = ct.reshape(ct.load(A_log, index=(0,), shape=(HVP,), padding_mode=PAD_ZERO), (1, HVP))
    dtb = ct.reshape(ct.load(dt_bias, index=(0,), shape=(HVP,), padding_mode=PAD_ZERO), (1, HVP))
    return b.astype(ct.float32), a.astype(ct.float32) + dtb.astype(ct.float32), -ct.exp(al.astype(ct.float32))


def softplus(x):
    """torch's softplus (threshold 20: above it x passes through)."""
    return ct.where(x > 20.0, x, ct.log(1.0 + ct.exp(ct.minimum(x, 20.0))))


# ------------------------------------------------------------------ forward kernel


def _state_rows(seq, mqk, mv, cqk, cv, n, u, NT, HK2: ConstInt, HV: ConstInt, DK: ConstInt,
                DV: ConstInt, W: ConstInt, WP: ConstInt, THD: ConstBool):
    """Final conv state of sequence n, unit u (a q/k or v head): its last W-1 conv inputs."""
    if THD:
        start = ct.load(seq, index=(n,), shape=())
        end = ct.load(seq, index=(n + 1,), shape=())
    else:
        start = n * seq.shape[1]
        end = start + seq.shape[1]
    j = ct.arange(WP, dtype=ct.int32)
    rows = end - (W - 1) + j
    ok = ct.reshape((rows >= start) & (j < W - 1), (WP, 1))
    if u < HK2:
        x = ct.load_advanced_indexing(mqk, (ct.minimum(ct.maximum(rows, 0), NT - 1), ct.Slice(u, 1),
                                            ct.Slice(0, DK)), padding_mode=PAD_ZERO)
        x = ct.where(ok, ct.reshape(x, (WP, DK)), ct.zeros((WP, DK), dtype=x.dtype))
        ct.store(cqk, index=(n, u, 0, 0), tile=ct.reshape(ct.transpose(x), (1, 1, DK, WP)))
    elif u < HK2 + HV:
        x = ct.load_advanced_indexing(mv, (ct.minimum(ct.maximum(rows, 0), NT - 1), ct.Slice(u - HK2, 1),
                                           ct.Slice(0, DV)), padding_mode=PAD_ZERO)
        x = ct.where(ok, ct.reshape(x, (WP, DV)), ct.zeros((WP, DV), dtype=x.dtype))
        ct.store(cv, index=(n, u - HK2, 0, 0), tile=ct.reshape(ct.transpose(x), (1, 1, DV, WP)))


@ct.kernel
def gdn_pre_fwd(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mz, mba, seq, wqk, wv, A_log, dt_bias, q, k, v, z, g, beta, cqk, cv,
                eps: float, HK: ConstInt, HV: ConstInt, R: ConstInt, REP: ConstBool, W: ConstInt,
                DK: ConstInt, DV: ConstInt, HVP: ConstInt, TT: ConstInt, WP: ConstInt, WW: ConstInt,
                CH: ConstInt, THD: ConstBool, STATE: ConstBool, TAPV: ConstBool):
    """Block (i, u): token tile i, unit u (see the module doc)."""
    i = ct.bid(0)
    u = ct.bid(1)
    NT = mqk.shape[0]
    ntiles = ct.cdiv(NT, TT)
    HK2 = 2 * HK
    if i < ntiles:
        t0 = i * TT
        rows = t0 + ct.arange(TT, dtype=ct.int32)
        if u < HK2:  # q or k head u % HK: conv, silu, l2norm, (repeat)
            st = seq_start(seq, rows, t0, TT, W, CH, THD)
            y = conv_pre(mqk, (mqk1, mqk2, mqk3), weight_tile(wqk, u, DK, WW), rows, st, i, u, NT, DK, TT, W,
                         TAPV)
            y = y / (1.0 + ct.exp(-y))
            y = y * ct.rsqrt(ct.sum(y * y, axis=1, keepdims=True) + eps)
            out = ct.reshape(y, (TT, 1, DK)).astype(q.dtype)
            kh = u % HK
            if u < HK:
                if REP:
                    for r in ct.static_iter(range(R)):
                        ct.store(q, index=(i, kh * R + r, 0), tile=out)
                else:
                    ct.store(q, index=(i, kh, 0), tile=out)
            else:
                if REP:
                    for r in ct.static_iter(range(R)):
                        ct.store(k, index=(i, kh * R + r, 0), tile=out)
                else:
                    ct.store(k, index=(i, kh, 0), tile=out)
        elif u < HK2 + HV:  # v head: conv, silu
            h = u - HK2
            st = seq_start(seq, rows, t0, TT, W, CH, THD)
            y = conv_pre(mv, (mv1, mv2, mv3), weight_tile(wv, h, DV, WW), rows, st, i, h, NT, DV, TT, W, TAPV)
            y = y / (1.0 + ct.exp(-y))
            ct.store(v, index=(i, h, 0), tile=ct.reshape(y, (TT, 1, DV)).astype(v.dtype))
        elif u < HK2 + 2 * HV:  # z head: copy
            h = u - HK2 - HV
            ct.store(z, index=(i, h, 0), tile=ct.load(mz, index=(i, h, 0), shape=(TT, 1, DV),
                                                      padding_mode=PAD_ZERO).astype(z.dtype))
        else:  # gates of all Hv heads
            b, x, nA = gate_tiles(mba, A_log, dt_bias, i, TT, HVP)
            ct.store(beta, index=(i, 0), tile=(1.0 / (1.0 + ct.exp(-b))).astype(beta.dtype))
            ct.store(g, index=(i, 0), tile=(nA * softplus(x)).astype(g.dtype))
    else:
        if STATE:
            _state_rows(seq, mqk, mv, cqk, cv, i - ntiles, u, NT, HK2, HV, DK, DV, W, WP, THD)


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class PreGatedCfg:
    """Launch config = compile key (with the argument dtypes, THD and STATE)."""
    Hk: int
    Hv: int
    R: int        # Hv // Hk
    REP: bool     # repeat_qk
    W: int        # conv width
    DK: int       # dk padded to a power of two
    DV: int       # dv padded to a power of two
    HVP: int      # Hv padded to a power of two (the gates block)
    TT: int       # tokens per block (power of two, >= W)
    WP: int       # W - 1 padded to a power of two (conv-state rows)
    WW: int       # W padded to a power of two (taps in registers)
    TAPV: bool = True  # taps from tile-aligned loads of shifted views (W <= WMAX); else row gathers
    CH: int = 32   # THD: cu_seqlens entries scanned per step (only chunks near the tile do work)
    TG: int = 64   # bwd reduction: partial rows per step
    BC: int = 64   # bwd reduction: channels per block
    OCC: int = 0   # fwd occupancy hint (0: compiler's choice)
    OCC_B: int = 0  # bwd (dpre and dx kernels) occupancy hint

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool) -> "PreGatedCfg":
        if Hv % Hk:
            raise ValueError(f"gdn_pre_gated cutile: Hv={Hv} is not a multiple of Hk={Hk}")
        if W < 1:
            raise ValueError(f"gdn_pre_gated cutile: conv width W={W} < 1")
        DK, DV = next_pow2(dk), next_pow2(dv)
        # ~2K fp32 elements per [TT, head] tile (16 tokens of a 128-wide head) and occupancy 4,
        # fwd and bwd. Swept on the H200 (Qwen3-Next, B=4, T=8192 BSHD, repeat_qk; ms):
        #   fwd  TT64: 3.75 (occ 0), 2.43 (2); TT32: 3.56 (0), 2.20 (2), 1.87 (4); TT16: 4.18 (0), 1.64 (4)
        #   bwd  TT64: 12.6 (0); TT32: 9.0 (0), 5.6 (2); TT16: 9.0 (0), 5.17 (4)
        # (larger tiles spill or take ~200 KB of shared memory without the hint: one block per SM)
        TT = max(next_pow2(W), min(128, 2048 // max(DK, DV)))
        return cls(Hk=Hk, Hv=Hv, R=Hv // Hk, REP=bool(repeat_qk), W=W, DK=DK, DV=DV, HVP=next_pow2(Hv),
                   TT=TT, WP=next_pow2(max(W - 1, 1)), WW=next_pow2(W), TAPV=W <= WMAX, OCC=4, OCC_B=4)


def _cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg):
    cfg = cfg or PreGatedCfg.heuristic(Hk, Hv, dk, dv, W, repeat_qk)
    if (cfg.Hk, cfg.Hv, cfg.W, cfg.REP) != (Hk, Hv, W, bool(repeat_qk)) or cfg.DK < dk or cfg.DV < dv \
            or cfg.TT < W:
        raise ValueError(f"gdn_pre_gated cutile: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, "
                         f"dv={dv}, W={W}, repeat_qk={repeat_qk}")
    return cfg


def views(mixed, conv_weight, Hk: int, Hv: int, dk: int, dv: int):
    """(mixed as [NT, D], q|k [NT, 2Hk, dk], v [NT, Hv, dv], z [NT, Hv, dv], b|a [NT, 2, Hv],
    conv weight q|k [2Hk, dk, W], v [Hv, dv, W]): strided views, no copies."""
    D = mixed.shape[-1]
    x = mixed.reshape(-1, D)
    NT, QK, V = x.shape[0], 2 * Hk * dk, Hv * dv
    W = conv_weight.shape[1]
    return (x, x[:, :QK].view(NT, 2 * Hk, dk), x[:, QK:QK + V].view(NT, Hv, dv),
            x[:, QK + V:QK + 2 * V].view(NT, Hv, dv), x[:, QK + 2 * V:].view(NT, 2, Hv),
            conv_weight[:QK].view(2 * Hk, dk, W), conv_weight[QK:].view(Hv, dv, W))


def shifted(t3, by: int):
    """WMAX - 1 views of t3 [NT, heads, c] shifted by s = 1 .. WMAX-1 rows: t3[by - s:] when
    by > 0 (the fwd taps: tile i-1 of t3[TT - s:] is rows i*TT - s ..), t3[s:] when by == 0
    (the bwd's look-ahead); empty where the shift runs past the end (never read then)."""
    NT = t3.shape[0]
    return tuple(t3[min(NT, by - s if by else s):] for s in range(1, WMAX))


def seq_arg(mixed, cu_seqlens):
    """What the kernels read sequence bounds from: cu_seqlens (THD, moved to mixed's device
    if the caller kept it on the host) or mixed itself as [B, T, D] (BSHD: only its shape)."""
    if cu_seqlens is None:
        return mixed, False
    if cu_seqlens.device != mixed.device:
        cu_seqlens = cu_seqlens.to(mixed.device, non_blocking=True)
    return cu_seqlens, True


def fwd_launch(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
               Hk: int = 16, dk: int = 128, dv: int = 128, repeat_qk: bool = True, eps: float = 1e-6,
               cfg: PreGatedCfg | None = None) -> Launch:
    """The one forward launch (argument order as the registry's fwd kernel)."""
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    cfg = _cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg)
    x, mqk, mv, mz, mba, wqk, wv = views(mixed, conv_weight, Hk, Hv, dk, dv)
    NT = x.shape[0]
    seq, thd = seq_arg(mixed, cu_seqlens)
    state = conv_state is not None and W > 1
    if state:
        N = conv_state.shape[0]
        QK = 2 * Hk * dk
        cqk = conv_state[:, :QK].view(N, 2 * Hk, dk, W - 1)
        cv = conv_state[:, QK:].view(N, Hv, dv, W - 1)
    else:  # dead code in the kernel; stand-ins of the right rank
        N, cqk, cv = 0, q.view(NT, -1, 1, dk)[:0], v.view(NT, -1, 1, dv)[:0]
    flat = [t.view(NT, *t.shape[-2:]) for t in (q, k, v, z)]
    g2, b2 = g.view(NT, Hv), beta.view(NT, Hv)
    grid = (cdiv(NT, cfg.TT) + N, 2 * Hk + 2 * Hv + 1, 1)
    return Launch(gdn_pre_fwd, grid,
                  (mqk, *shifted(mqk, cfg.TT), mv, *shifted(mv, cfg.TT), mz, mba, seq, wqk, wv, A_log, dt_bias, *flat, g2, b2, cqk, cv, float(eps),
                   Hk, Hv, cfg.R, cfg.REP, W, cfg.DK, cfg.DV, cfg.HVP, cfg.TT, cfg.WP, cfg.WW, cfg.CH, thd,
                   state, cfg.TAPV), cfg, occ(cfg.OCC))


def pre_gated_fwd_into(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
                       Hk: int, dk: int, dv: int, repeat_qk: bool, eps: float, return_conv_state: bool):
    """gdn_pre_gated fwd, destination-passing (the registry's kernel signature): writes
    q, k [..., Hq, dk], v, z [..., Hv, dv], g (fp32), beta [..., Hv] and, when given, the
    final conv state [N, C, W-1]."""
    if mixed.numel() == 0:  # no tokens: only the (all-zero) conv state has elements
        if conv_state is not None:
            conv_state.zero_()
        return
    fwd_launch(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
               Hk, dk, dv, repeat_qk, eps).run()


