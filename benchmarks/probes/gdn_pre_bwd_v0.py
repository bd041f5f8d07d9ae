"""A/B baseline (benchmarks only): the gdn_pre_gated backward at 9601adc, verbatim but for its
imports (absolute) and its registration (dropped: the registry keeps tilekernels.gdn.cutile_pre_gated_bwd).

cuTile backward of gdn_pre_gated: dmixed, dconv_weight, dA_log, ddt_bias in three launches.

Layouts, views and the sequence-bound helpers are the forward's (``cutile_pre_gated``).
The backward of the conv needs, for dx[t], dpre at rows t .. t+W-1, and dpre of a row needs
the whole conv window of that row and the l2norm of its head: so dpre goes through an fp32
scratch [NT, C] between two passes (8 bytes a channel more than the ideal traffic, which
reads the output grads and mixed once and writes dmixed once).

  gdn_pre_bwd_a   grid (cdiv(NT, TT), 2*Hk + 2*Hv + 1), the forward's units. q/k/v heads:
                  recompute pre = conv(x) (row-gathered taps, masked by the sequence start),
                  y = silu(pre); q/k: the grads of the R repeats summed, then the l2norm
                  backward dy = s*(dn - n*sum(dn*n)); dpre = dy * silu'(pre) -> scratch; the
                  tile's dconv_weight partial sum_t dpre[t] * x[t-s] (masked) -> fp32
                  partials [tiles, C, WW]. z heads: dz = gz copied into dmixed. Gates:
                  db = gbeta*beta*(1-beta), da = gg * (-exp(A_log)) * sigmoid(a + dt_bias)
                  into dmixed; the tile's partial sums of gg*g (dA_log) and da (ddt_bias).
  gdn_pre_bwd_dx  grid (cdiv(NT, TT), 2*Hk + Hv): dx[t] = sum_s w[:, W-1-s] * dpre[t+s] over
                  the taps that stay inside t's sequence (t + s < end of t's sequence); tap s
                  is tile i of the view dpre[s:] (tile-aligned there).
  Taps of x in gdn_pre_bwd_a are the forward's (shifted views, row gathers in tile 0).
  gdn_pre_bwd_red grid (cdiv(C, BC) + 1,): dconv_weight, dA_log, ddt_bias = the partials
                  summed over the tiles in a fixed order (deterministic, no float atomics).
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, occ

from tilekernels.gdn.cutile_pre_gated import (PreGatedCfg, _cfg, conv_pre, gate_tiles, row_tile, seq_arg, seq_end,
                               seq_start, shifted, softplus, tap, tap_rows, views, weight_tile)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _gsum(gx, i, kh, R: ConstInt, REP: ConstBool, C: ConstInt, TT: ConstInt):
    """[TT, C] fp32: the gradient of key head kh, summed over its R repeats when REP."""
    if REP:
        acc = ct.zeros((TT, C), dtype=ct.float32)
        for r in ct.static_iter(range(R)):
            acc = acc + ct.reshape(ct.load(gx, index=(i, kh * R + r, 0), shape=(TT, 1, C),
                                           padding_mode=PAD_ZERO), (TT, C)).astype(ct.float32)
        return acc
    else:
        return ct.reshape(ct.load(gx, index=(i, kh, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO,
                               allow_tma=False),
                          (TT, C)).astype(ct.float32)


def _dw_partial(src, sh, dpre, rows, st, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, WW: ConstInt,
                TAPV: ConstBool):
    """[C, WW] fp32: column j = sum over the tile's rows of dpre[t] * x[t - (W-1-j)] (masked)."""
    p = ct.zeros((C, WW), dtype=ct.float32)
    for s in ct.static_iter(range(W)):
        ok = ct.reshape(rows - s >= st, (TT, 1))
        xs = ct.where(ok, tap_rows(src, sh, rows, i, u, NT, s, C, TT, TAPV), 0.0)
        p = ct.insert(p, (0, W - 1 - s), ct.reshape(ct.sum(dpre * xs, axis=0), (C, 1)))
    return p


def _silu_bwd(dy, pre):
    sg = 1.0 / (1.0 + ct.exp(-pre))
    return dy * sg * (1.0 + pre * (1.0 - sg))


@ct.kernel
def gdn_pre_bwd_a(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mba, seq, wqk, wv, A_log, dt_bias, gq, gk, gv, gz, gg, gbeta, dz, dba, dpqk, dpv,
                  pwqk, pwv, pg, eps: float, HK: ConstInt, HV: ConstInt, R: ConstInt, REP: ConstBool,
                  W: ConstInt, DK: ConstInt, DV: ConstInt, HVP: ConstInt, TT: ConstInt, WW: ConstInt,
                  CH: ConstInt, THD: ConstBool, TAPV: ConstBool):
    """Block (i, u): token tile i, unit u (module doc)."""
    i = ct.bid(0)
    u = ct.bid(1)
    NT = mqk.shape[0]
    HK2 = 2 * HK
    t0 = i * TT
    rows = t0 + ct.arange(TT, dtype=ct.int32)
    if u < HK2:
        st = seq_start(seq, rows, t0, TT, W, CH, THD)
        pre = conv_pre(mqk, (mqk1, mqk2, mqk3), weight_tile(wqk, u, DK, WW), rows, st, i, u, NT, DK, TT, W,
                       TAPV)
        y = pre / (1.0 + ct.exp(-pre))
        s = ct.rsqrt(ct.sum(y * y, axis=1, keepdims=True) + eps)
        n = y * s
        kh = u % HK
        if u < HK:
            dn = _gsum(gq, i, kh, R, REP, DK, TT)
        else:
            dn = _gsum(gk, i, kh, R, REP, DK, TT)
        dy = s * (dn - n * ct.sum(dn * n, axis=1, keepdims=True))
        dpre = _silu_bwd(dy, pre)
        ct.store(dpqk, index=(i, u, 0), tile=ct.reshape(dpre, (TT, 1, DK)))
        p = _dw_partial(mqk, (mqk1, mqk2, mqk3), dpre, rows, st, i, u, NT, DK, TT, W, WW, TAPV)
        ct.store(pwqk, index=(i, u, 0, 0), tile=ct.reshape(p, (1, 1, DK, WW)))
    elif u < HK2 + HV:
        h = u - HK2
        st = seq_start(seq, rows, t0, TT, W, CH, THD)
        pre = conv_pre(mv, (mv1, mv2, mv3), weight_tile(wv, h, DV, WW), rows, st, i, h, NT, DV, TT, W, TAPV)
        dy = ct.reshape(ct.load(gv, index=(i, h, 0), shape=(TT, 1, DV), padding_mode=PAD_ZERO),
                        (TT, DV)).astype(ct.float32)
        dpre = _silu_bwd(dy, pre)
        ct.store(dpv, index=(i, h, 0), tile=ct.reshape(dpre, (TT, 1, DV)))
        p = _dw_partial(mv, (mv1, mv2, mv3), dpre, rows, st, i, h, NT, DV, TT, W, WW, TAPV)
        ct.store(pwv, index=(i, h, 0, 0), tile=ct.reshape(p, (1, 1, DV, WW)))
    elif u < HK2 + 2 * HV:
        h = u - HK2 - HV
        ct.store(dz, index=(i, h, 0), tile=ct.load(gz, index=(i, h, 0), shape=(TT, 1, DV),
                                                   padding_mode=PAD_ZERO).astype(dz.dtype))
    else:
        b, x, nA = gate_tiles(mba, A_log, dt_bias, i, TT, HVP)
        beta = 1.0 / (1.0 + ct.exp(-b))
        gb = ct.load(gbeta, index=(i, 0), shape=(TT, HVP), padding_mode=PAD_ZERO).astype(ct.float32)
        gt = ct.load(gg, index=(i, 0), shape=(TT, HVP), padding_mode=PAD_ZERO).astype(ct.float32)
        db = gb * beta * (1.0 - beta)
        da = gt * nA / (1.0 + ct.exp(-x))
        ct.store(dba, index=(i, 0, 0), tile=ct.reshape(db, (TT, 1, HVP)).astype(dba.dtype))
        ct.store(dba, index=(i, 1, 0), tile=ct.reshape(da, (TT, 1, HVP)).astype(dba.dtype))
        # rows past NT read zero grads, so they add nothing to the partials
        ct.store(pg, index=(i, 0, 0), tile=ct.reshape(ct.sum(gt * nA * softplus(x), axis=0), (1, 1, HVP)))
        ct.store(pg, index=(i, 1, 0), tile=ct.reshape(ct.sum(da, axis=0), (1, 1, HVP)))


def _ahead(dp, sh, rows, i, u, NT, s: ConstInt, C: ConstInt, TT: ConstInt, TAPV: ConstBool):
    """[TT, C] fp32 rows t + s of dp's head u (rows past NT: 0): tile i of dp (s = 0) or of the
    view sh[s-1] = dp[s:] (TAPV; a tile that would start past the view's end reads zeros),
    else gathered."""
    if s == 0:
        t = ct.reshape(ct.load(dp, index=(i, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO,
                               allow_tma=False), (TT, C))
    else:
        if TAPV:
            if i * TT + s < NT:
                t = ct.reshape(ct.load(sh[s - 1], index=(i, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO,
                               allow_tma=False),
                               (TT, C))
            else:
                t = ct.zeros((TT, C), dtype=ct.float32)
        else:
            t = row_tile(dp, rows + s, u, NT, C, TT)
    return t


def _dx_tile(dp, sh, wt, rows, en, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, TAPV: ConstBool):
    acc = ct.zeros((TT, C), dtype=ct.float32)
    for s in ct.static_iter(range(W)):
        ok = ct.reshape(rows + s < en, (TT, 1))
        acc = acc + ct.where(ok, _ahead(dp, sh, rows, i, u, NT, s, C, TT, TAPV), 0.0) * tap(wt, W - 1 - s, C)
    return acc


@ct.kernel
def gdn_pre_bwd_dx(dpqk, dpqk1, dpqk2, dpqk3, dpv, dpv1, dpv2, dpv3, seq, wqk, wv, dqk, dvv, HK: ConstInt,
                   W: ConstInt, DK: ConstInt, DV: ConstInt, TT: ConstInt, WW: ConstInt, CH: ConstInt,
                   THD: ConstBool, TAPV: ConstBool):
    """Block (i, u): dx of token tile i, q/k head u < 2*HK or v head u - 2*HK."""
    i = ct.bid(0)
    u = ct.bid(1)
    NT = dpqk.shape[0]
    t0 = i * TT
    rows = t0 + ct.arange(TT, dtype=ct.int32)
    en = seq_end(seq, rows, t0, TT, W, CH, THD)
    if u < 2 * HK:
        dx = _dx_tile(dpqk, (dpqk1, dpqk2, dpqk3), weight_tile(wqk, u, DK, WW), rows, en, i, u, NT, DK, TT, W,
                      TAPV)
        ct.store(dqk, index=(i, u, 0), tile=ct.reshape(dx, (TT, 1, DK)).astype(dqk.dtype))
    else:
        h = u - 2 * HK
        dx = _dx_tile(dpv, (dpv1, dpv2, dpv3), weight_tile(wv, h, DV, WW), rows, en, i, h, NT, DV, TT, W, TAPV)
        ct.store(dvv, index=(i, h, 0), tile=ct.reshape(dx, (TT, 1, DV)).astype(dvv.dtype))


@ct.kernel
def gdn_pre_bwd_red(pw, pg, dw, dA, ddt, NCB: ConstInt, BC: ConstInt, WW: ConstInt, HVP: ConstInt,
                    TG: ConstInt):
    """Block j < NCB: dconv_weight rows [j*BC, (j+1)*BC); block NCB: dA_log and ddt_bias.
    Partials summed TG tiles at a time, in tile order (the same order every call)."""
    j = ct.bid(0)
    ntiles = pw.shape[0]
    if j < NCB:
        acc = ct.zeros((BC, WW), dtype=ct.float32)
        for c in range(ct.cdiv(ntiles, TG)):
            acc = acc + ct.sum(ct.load(pw, index=(c, j, 0), shape=(TG, BC, WW), padding_mode=PAD_ZERO), axis=0)
        ct.store(dw, index=(j, 0), tile=acc.astype(dw.dtype))
    else:
        acc = ct.zeros((2, HVP), dtype=ct.float32)
        for c in range(ct.cdiv(ntiles, TG)):
            acc = acc + ct.sum(ct.load(pg, index=(c, 0, 0), shape=(TG, 2, HVP), padding_mode=PAD_ZERO), axis=0)
        ct.store(dA, index=(0,), tile=ct.reshape(ct.extract(acc, (0, 0), shape=(1, HVP)), (HVP,)).astype(dA.dtype))
        ct.store(ddt, index=(0,), tile=ct.reshape(ct.extract(acc, (1, 0), shape=(1, HVP)), (HVP,)).astype(ddt.dtype))


def bwd_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                 dmixed, dconv_weight, dA_log, ddt_bias, Hk: int = 16, dk: int = 128, dv: int = 128,
                 repeat_qk: bool = True, eps: float = 1e-6, cfg: PreGatedCfg | None = None) -> list[Launch]:
    """The three backward launches (argument order as the registry's bwd kernel); allocates
    the fp32 dpre scratch [NT, C] and the partials [tiles, C, WW], [tiles, 2, HVP]."""
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    cfg = _cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg)
    x, mqk, mv, _mz, mba, wqk, wv = views(mixed, conv_weight, Hk, Hv, dk, dv)
    _dx, dqk, dvv, dz, dba, _, _ = views(dmixed, conv_weight, Hk, Hv, dk, dv)
    NT, dev = x.shape[0], x.device
    QK, C = 2 * Hk * dk, 2 * Hk * dk + Hv * dv
    seq, thd = seq_arg(mixed, cu_seqlens)
    nt = cdiv(NT, cfg.TT)
    dp = torch.empty((NT, C), dtype=torch.float32, device=dev)
    pw = torch.empty((nt, C, cfg.WW), dtype=torch.float32, device=dev)
    pg = torch.empty((nt, 2, cfg.HVP), dtype=torch.float32, device=dev)
    dpqk, dpv = dp[:, :QK].view(NT, 2 * Hk, dk), dp[:, QK:].view(NT, Hv, dv)
    pwqk, pwv = pw[:, :QK].view(nt, 2 * Hk, dk, cfg.WW), pw[:, QK:].view(nt, Hv, dv, cfg.WW)
    grads = [t.contiguous().view(NT, *t.shape[-2:]) for t in (gq, gk, gv, gz)]
    grads += [t.contiguous().view(NT, Hv) for t in (gg, gbeta)]
    a = Launch(gdn_pre_bwd_a, (nt, 2 * Hk + 2 * Hv + 1, 1),
               (mqk, *shifted(mqk, cfg.TT), mv, *shifted(mv, cfg.TT), mba, seq, wqk, wv, A_log, dt_bias, *grads, dz, dba, dpqk, dpv, pwqk, pwv, pg,
                float(eps), Hk, Hv, cfg.R, cfg.REP, W, cfg.DK, cfg.DV, cfg.HVP, cfg.TT, cfg.WW, cfg.CH, thd,
                cfg.TAPV), cfg, occ(cfg.OCC_B))
    b = Launch(gdn_pre_bwd_dx, (nt, 2 * Hk + Hv, 1),
               (dpqk, *shifted(dpqk, 0), dpv, *shifted(dpv, 0), seq, wqk, wv, dqk, dvv, Hk, W, cfg.DK, cfg.DV, cfg.TT,
                cfg.WW, cfg.CH, thd, cfg.TAPV), cfg, occ(cfg.OCC_B))
    ncb = cdiv(C, cfg.BC)
    r = Launch(gdn_pre_bwd_red, (ncb + 1, 1, 1), (pw, pg, dconv_weight, dA_log, ddt_bias, ncb, cfg.BC, cfg.WW,
                                                  cfg.HVP, cfg.TG), cfg, ())
    return [a, b, r]


def pre_gated_bwd_into(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                       dmixed, dconv_weight, dA_log, ddt_bias, Hk: int, dk: int, dv: int, repeat_qk: bool,
                       eps: float, return_conv_state: bool):
    """gdn_pre_gated bwd, destination-passing (the registry's kernel signature)."""
    if mixed.numel() == 0:
        dconv_weight.zero_()
        dA_log.zero_()
        ddt_bias.zero_()
        return
    for ln in bwd_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                           dmixed, dconv_weight, dA_log, ddt_bias, Hk, dk, dv, repeat_qk, eps):
        ln.run()

