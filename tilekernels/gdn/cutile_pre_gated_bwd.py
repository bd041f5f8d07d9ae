"""cuTile backward of gdn_pre_gated: dmixed, dconv_weight, dA_log, ddt_bias.

What it computes (``reference.pre_gated_bwd`` is the truth): the forward recomputed per token
tile, pre = conv(x) over q|k|v, y = silu(pre); for q and k the grads of the R repeats summed
and the l2norm backward dy = s*(dn - n*sum(dn*n)) (s = rsqrt(sum y^2 + eps), n = y*s), for v
dy = gv; dpre = dy * silu'(pre); dx[t] = sum_s w[:, W-1-s] * dpre[t+s] over the taps inside t's
sequence; dconv_weight[:, j] = sum_t dpre[t] * x[t - (W-1-j)]; dz = gz;
db = gbeta * beta * (1 - beta); da = gg * (-exp(A_log)) * sigmoid(a + dt_bias);
dA_log = sum_t gg * g; ddt_bias = sum_t da. fp32 math, each output rounded once (dx: see below).

Layouts and views are the forward's (``cutile_pre_gated``: mixed [B, T, D] or [NT, D] as packed
tokens [NT, D] (contiguous last dim), q|k as [NT, 2*Hk, dk], v and z as [NT, Hv, dv], b|a as
[NT, 2, Hv]; conv weight [C, W] as [2*Hk, dk, W] and [Hv, dv, W]); the grads of q, k
[..., Hq, dk] are seen as [NT, Hk, R, dk] (R = Hv/Hk with repeat_qk, else 1: the repeats of a
key head are adjacent); grads are made contiguous (a no-op for autograd's).

Why two passes: dx[t] needs dpre at rows t .. t+W-1 and dpre of a row needs its whole conv
window and its head's l2norm, so a block that owns rows [t0, t0+TT) would need its own dpre
shifted by up to W-1 rows; cuTile has no register shift along a tile's rows (extracts are
tile-aligned) and no intra-block barrier to read back its own stores. So dpre goes through a
scratch [NT, C], fp32 (cfg.SD: dmixed's dtype, bf16 at the headline shape, the default until session 74:
it rounded dpre once more, which moved 23% of dmixed's elements off the fp32 math rounded once; its speed
against fp32's is unsettled: results/gdn.md) and the second pass reads it through shifted views
(tile-aligned loads of dpre[s:]).
dconv_weight's partials come from the fp32 dpre in registers, never from the scratch.

Launches (``bwd_launches``; PreGatedBwdCfg names the fields):
  gdn_pre_bwd_seq  THD only, grid (cdiv(NT, PT),): every token's sequence start and end [NT]
                   int32 (cu_seqlens scanned once per PT tokens, not once per block of the passes).
  gdn_pre_bwd_dpre grid (row blocks, 2*Hk + Hv + Hv/HBZ + 1 units): block (r, u) does NTB token
                   tiles of TT rows of unit u. q/k head u < 2*Hk, v head u - 2*Hk: dpre -> scratch,
                   and the block's dconv_weight partial -> pw [P, C, WW]. Default (W <= WMAX): XS, a
                   tile's W taps loaded once as one [WW, TT, c] tile that the conv and the partial
                   both read, and DWA, the tap products summed per token over the block's NTB tiles
                   and reduced over the tokens once (a quarter of the partial rows at NTB4); else
                   (W > WMAX, or XS off) the taps reloaded for the partial (DWS: the products stacked
                   [WW, TT, c] and reduced per tile); XT: the taps as W separate [TT, c] tiles, the
                   products summed per tap, elementwise, over the block's tiles; q/k grads: R [TT, dk]
                   loads summed (GS); z unit: dz = gz for HBZ heads; gates unit: db, da -> dmixed
                   and the block's sums of gg*g and da -> pg [P, 2, HVP]. As in the forward: token
                   tile 0 is a launch of its own (GA: its taps gathered row by row) so that the
                   main launch's taps are tile loads of shifted views (tile i-1 of x[TT-s:]; TMA
                   with LT); tiles whose rows all have their W-1 predecessors in their sequence skip
                   the per-tap masks; the sigmoid uses the APPROX exp and reciprocal; stores go from
                   registers (the first backward's 16 TMA-staged store sites cost shared memory).
  gdn_pre_bwd_dx   grid (cdiv(NT, TB), 2*Hk + Hv): dx of TB tokens of one head from W tile loads
                   of the scratch (tap s: tile i of dpre[s:]), masked by the sequence end only in
                   tiles that hold one.
  gdn_pre_bwd_red  grid (cdiv(C, BC) + 1,): dconv_weight, dA_log, ddt_bias = the P partial rows
                   summed TG at a time in row order: deterministic (no float atomics), the same
                   order every call.
Widths W > WMAX (no shifted views) gather every tap, in one dpre launch and in dx.

Measured on the H200 (Qwen3-Next Hk=16, Hv=32, dk=dv=128, W=4, bf16, 32768 tokens; triton do_bench
median; benchmarks/probes/gdn_pre_bwd_time.py; ideal traffic 82,368 B a token with repeat_qk =
2.70 GB = 0.632 ms at 4.27 TB/s): the first backward (fp32 scratch, three launches; at 9601adc,
benchmarks/probes/gdn_pre_bwd_v0.py) 5.15 ms BSHD / 5.97 ms THD (12% of ideal); this one at
NTB1 GS DWS, no TMA, dx TB16: 3.71 / 3.78 ms with repeat_qk, 3.61 / 3.66 ms without; per launch
(BSHD, repeat_qk) dpre 3.00, dx 0.51, reduction 0.19, tile 0 / THD bounds 0.013 each. The
default then takes the faster setting of each launch from the sweep (PreGatedBwdCfg.heuristic):
dpre with TMA loads 2.78 ms, dx TB32 0.42 ms, i.e. ~3.4 ms summed (18.6% of ideal; not yet timed
end to end). Still 4.3x the 0.79 ms target: the dpre pass moves ~80 KB a token in 2.8 ms
(~1 TB/s), so it is bound by instructions or latency, not bytes (no ncu profile yet); the scratch
(32 KB a token) and the partials (8 KB a token at NTB1: 2 x 268 MB) come on top.
Session 7 (same shape, one run): ncu of that dpre launch: 2.79 ms, DRAM 20% (0.96 TB/s), 857M warp
instructions, issue 0.29 a scheduler, 128 threads x 128 registers (4 blocks, 25% occupancy), per issued
instruction 5.9 cycles of long-scoreboard stalls, 2.1 mio throttle, 1.7 short scoreboard: latency-bound
at low occupancy, with ~100 instructions a q/k element. The default since (XS DWA NTB4 OCC_A2): 3.263 /
3.352 ms BSHD / THD against 3.417 / 3.454 (19.4 / 18.9% of ideal; dpre 2.78 / 2.84, the reduction 0.057
against 0.19); PreGatedBwdCfg.heuristic lists the variants measured. The dpre pass itself is unchanged
(2.78 ms): cutting it needs fewer instructions per element and more loads in flight, not fewer bytes.

Session 8: ``cutile_pre_gated_bwd2`` (second design, W <= WMAX: the dpre pass without the dconv_weight
partial, 0.889 ms; the partial in the dx pass) 2.061 / 2.192 ms BSHD / THD against this module's 3.247 / 3.336
in one run; it becomes the default with ``V2`` (below). ``bwd_launches`` runs it for a PreGatedBwd2Cfg.

Compile key: PreGatedBwdCfg (from Hk, Hv, dk, dv, W, repeat_qk only) + dtypes + THD; NT, B, T, N
are dynamic. Importing this module needs ``cuda.tile`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ, workspace
from tilekernels._glue import kernel

from .cutile_pre_gated import WMAX, check_heads, seq_arg, seq_end, seq_start, shifted, softplus, views

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
APPROX = ct.RoundingMode.APPROX

# W <= WMAX without a cfg: the second design (cutile_pre_gated_bwd2: a lean dpre pass, dconv_weight in the dx
# pass) instead of this module's launches. On since session 8's final cuTile call: the whole backward GPU test
# file passed at it (74 passed, with the forward file's registry autograd tests), memcheck / racecheck clean;
# H200, Qwen3-Next bf16, 32768 tokens: 2.064 / 2.193 / 1.997 ms BSHD rep / THD rep / BSHD norep against
# 3.251 / 3.338 / 3.088 for this module's default in the same run (benchmarks/results/h200-gdn-pre-bwd.txt,
# in git history at 6923ad4).
# False gives back the first design.
V2 = True


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class BwdShapeCfg:
    """What both backward designs' launch configs share: the padded head shape, and the knobs of
    the kernels the second design takes from the first (the THD sequence-bound pass, the
    fixed-order dconv_weight reduction). Keyword-only knobs, so each design's own fields follow."""
    Hk: int
    Hv: int
    R: int        # Hv // Hk with repeat_qk, else 1 (the grads' repeats of a key head)
    RP: int       # R padded to a power of two
    W: int        # conv width
    DK: int       # dk padded to a power of two
    DV: int       # dv padded to a power of two
    HVP: int      # Hv padded to a power of two (the gates unit)
    WW: int       # W padded to a power of two (taps in registers)
    _: dataclasses.KW_ONLY
    CH: int = 32      # THD: cu_seqlens entries scanned per step
    PT: int = 256     # THD: tokens per block of the sequence-bound pass
    TG: int = 16      # reduction: partial rows per step
    BC: int = 32      # reduction: channels per block

    @staticmethod
    def shape(Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool) -> dict:
        """The head-shape fields of a problem (R = Hv // Hk with repeat_qk, else 1; padded dims)."""
        R = Hv // Hk if repeat_qk else 1
        return dict(Hk=Hk, Hv=Hv, R=R, RP=next_pow2(R), W=W, DK=next_pow2(dk), DV=next_pow2(dv),
                    HVP=next_pow2(Hv), WW=next_pow2(W))


@dataclasses.dataclass(frozen=True)
class PreGatedBwdCfg(BwdShapeCfg):
    """Launch config of the backward = compile key (with the argument dtypes and THD)."""
    TAPV: bool    # W <= WMAX: taps through shifted views; else every tap gathered
    TT: int = 16  # dpre pass: tokens per tile (power of two, >= W)
    NTB: int = 1  # dpre pass: token tiles per block (fewer partial rows; > 1 spills at TT16, see heuristic)
    HBZ: int = 4  # dpre pass: z heads per block (a power of two dividing Hv)
    TB: int = 32  # dx pass: tokens per block (power of two)
    LT: bool = True   # dpre pass: tile loads may go through TMA
    LB: bool = False  # dx pass: tile loads may go through TMA
    GS: bool = True   # dpre pass: q/k grads as R loads of [TT, dk] summed (else one [TT, 1, RP, dk] load)
    DWS: bool = True  # dpre pass: the W tap products stacked [WW, TT, c] and reduced at once (else per tap)
    SD: bool = False  # dpre scratch in dmixed's dtype (True: an extra bf16 rounding; False: fp32, OPS.md)
    XS: bool = False  # dpre pass: a tile's W taps loaded once as [WW, TT, c] for the conv and the partial
    DWA: bool = False  # dpre pass (XS): tap products summed elementwise over the block's tiles, reduced once
    XT: bool = False  # dpre pass (W <= 4): the W taps loaded once as separate [TT, c] tiles, their products
    #                   with dpre summed elementwise per tap over the block's tiles, reduced once (no stacking)
    OCC_A: int = 4    # dpre pass occupancy hint (0: the compiler's choice)
    OCC_B: int = 4    # dx pass occupancy hint

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool) -> "PreGatedBwdCfg":
        check_heads(Hk, Hv, W, "gdn_pre_gated cutile bwd")
        DK, DV = next_pow2(dk), next_pow2(dv)
        # dpre pass: ~2K fp32 elements a [tokens, head] tile (TT16 at dk=128); dx pass TB32 at occupancy 4;
        # for W <= WMAX the taps loaded once and their products summed over 4 token tiles a block (XS DWA
        # NTB4 OCC_A2): the fastest of the H200 sweeps (sessions 6-7, listed in benchmarks/results/gdn.md,
        # "Backward launch-config sweeps"), 3.263 / 3.352 ms BSHD / THD against 3.417 / 3.454.
        TT = max(next_pow2(W), min(128, 2048 // max(DK, DV)))
        x = dict(XS=True, DWA=True, NTB=4, OCC_A=2) if W <= WMAX else {}
        return cls(**cls.shape(Hk, Hv, dk, dv, W, repeat_qk), TAPV=W <= WMAX, TT=TT, HBZ=math.gcd(Hv, 4),
                   TB=max(TT, 32), **x)


def checked_cfg(cls, who: str, Hk, Hv, dk, dv, W, repeat_qk, cfg, fits):
    """cls's heuristic config (``cfg`` None), or ``cfg`` (a ``cls``) checked against the problem: the
    fields both designs share, and ``fits(cfg, R)`` for the design's own."""
    if cfg is None:
        return cls.heuristic(Hk, Hv, dk, dv, W, bool(repeat_qk))
    if not isinstance(cfg, cls):
        raise TypeError(f"gdn_pre_gated {who}: cfg must be a {cls.__name__}, got {type(cfg).__name__}")
    R = Hv // Hk if repeat_qk else 1
    ok = (cfg.Hk, cfg.Hv, cfg.W, cfg.R) == (Hk, Hv, W, R) and cfg.RP >= R and cfg.DK >= dk and cfg.DV >= dv \
        and cfg.TT >= W and Hv % cfg.HBZ == 0 and cfg.WW >= W and cfg.HVP >= Hv and fits(cfg, R)
    if not ok:
        raise ValueError(f"gdn_pre_gated {who}: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, "
                         f"dv={dv}, W={W}, repeat_qk={repeat_qk}")
    return cfg


def bwd_cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg=None) -> PreGatedBwdCfg:
    """The heuristic's config (``cfg`` None), or ``cfg`` checked against the problem."""
    return checked_cfg(PreGatedBwdCfg, "cutile bwd", Hk, Hv, dk, dv, W, repeat_qk, cfg,
                       lambda c, R: c.TAPV <= (W <= WMAX) and c.DWA <= c.XS and not (c.XT and (c.XS or W > 4)))


# ------------------------------------------------------------------ device helpers


def _xtap(src, sh, rows, i, u, NT, s: ConstInt, C: ConstInt, TT: ConstInt, GA: ConstBool, LT: ConstBool):
    """[TT, C] fp32 rows t - s of head u for the tile's rows t (unmasked; rows before 0 read row 0,
    callers mask): tap 0 is tile i of src, tap s > 0 tile i-1 of the view sh[s-1] = src[TT-s:], or
    (GA) the rows gathered."""
    if s == 0:
        t = ct.load(src, index=(i, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO, allow_tma=LT)
    elif GA:
        rc = ct.minimum(ct.maximum(rows - s, 0), NT - 1)
        t = ct.load_advanced_indexing(src, (rc, ct.Slice(u, 1), ct.Slice(0, C)), padding_mode=PAD_ZERO,
                                      allow_tma=False)
    else:
        t = ct.load(sh[s - 1], index=(i - 1, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO, allow_tma=LT)
    return ct.reshape(t, (TT, C)).astype(ct.float32)


def _dpre_block(mqk, TT: ConstInt, NTB: ConstInt, ONE: ConstBool):
    """The dpre pass's block (r, u) of both designs (grid: token-tile groups x units): r, u, the
    tokens NT, the token tiles ntl to walk and the tiles nj of a block (ONE: tile 0 only)."""
    NT = mqk.shape[0]
    return ct.bid(0), ct.bid(1), NT, 1 if ONE else ct.cdiv(NT, TT), 1 if ONE else NTB


def _wtile(w3, u, C: ConstInt, WW: ConstInt):
    """[C, WW] fp32 taps of head u of w3 [heads, c, W] (padding 0)."""
    return ct.reshape(ct.load(w3, index=(u, 0, 0), shape=(1, C, WW), padding_mode=PAD_ZERO, allow_tma=False),
                      (C, WW)).astype(ct.float32)


def _wtap(wt, j: ConstInt, C: ConstInt):
    """Tap j of a [C, WW] weight tile as [1, C]."""
    return ct.reshape(ct.extract(wt, (0, j), shape=(C, 1)), (1, C))


def _conv(src, sh, wt, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, GA: ConstBool,
          LT: ConstBool):
    """[TT, C] fp32 pre = sum_s w[:, W-1-s] * x[t-s] over the taps at or after st[t] (``inner``:
    every row's taps are, no masks)."""
    pre = ct.zeros((TT, C), dtype=ct.float32)
    if inner:
        for s in ct.static_iter(range(W)):
            pre = pre + _xtap(src, sh, rows, i, u, NT, s, C, TT, GA, LT) * _wtap(wt, W - 1 - s, C)
    else:
        for s in ct.static_iter(range(W)):
            ok = ct.reshape(rows - s >= st, (TT, 1))
            pre = pre + ct.where(ok, _xtap(src, sh, rows, i, u, NT, s, C, TT, GA, LT), 0.0) * _wtap(wt, W - 1 - s, C)
    return pre


def _dw(src, sh, dpre, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, WW: ConstInt,
        GA: ConstBool, LT: ConstBool):
    """[C, WW] fp32 partial of dconv_weight: column j = sum over the tile's rows of dpre[t] * x[t-(W-1-j)]
    (taps before st[t] masked; the taps are reloaded: L1/L2 hits)."""
    p = ct.zeros((C, WW), dtype=ct.float32)
    for s in ct.static_iter(range(W)):
        xs = _xtap(src, sh, rows, i, u, NT, s, C, TT, GA, LT)
        if not inner:
            xs = ct.where(ct.reshape(rows - s >= st, (TT, 1)), xs, 0.0)
        p = ct.insert(p, (0, W - 1 - s), ct.reshape(ct.sum(dpre * xs, axis=0), (C, 1)))
    return p


def _dwrow(src, sh, dpre, rows, st, inner, i, u, NT, j: ConstInt, C: ConstInt, TT: ConstInt, W: ConstInt,
           GA: ConstBool, LT: ConstBool):
    """[1, TT, C] fp32 dpre * x[t - (W-1-j)] (masked before st; zeros for j >= W)."""
    if j < W:
        xs = _xtap(src, sh, rows, i, u, NT, W - 1 - j, C, TT, GA, LT)
        if not inner:
            xs = ct.where(ct.reshape(rows - (W - 1 - j) >= st, (TT, 1)), xs, 0.0)
        return ct.reshape(dpre * xs, (1, TT, C))
    return ct.zeros((1, TT, C), dtype=ct.float32)


def _dw_stacked(src, sh, dpre, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, WW: ConstInt,
                GA: ConstBool, LT: ConstBool):
    """[WW, C] fp32: _dw transposed, the products of rows j = 0 .. WW-1 (tap W-1-j) stacked as [WW, TT, C]
    and summed over the tokens in one reduction (WW <= 8)."""
    a = (src, sh, dpre, rows, st, inner, i, u, NT)
    t = _dwrow(*a, 0, C, TT, W, GA, LT)
    if WW >= 2:
        t = ct.cat((t, _dwrow(*a, 1, C, TT, W, GA, LT)), axis=0)
    if WW >= 4:
        t = ct.cat((t, ct.cat((_dwrow(*a, 2, C, TT, W, GA, LT), _dwrow(*a, 3, C, TT, W, GA, LT)), axis=0)), axis=0)
    if WW >= 8:
        t = ct.cat((t, ct.cat((ct.cat((_dwrow(*a, 4, C, TT, W, GA, LT), _dwrow(*a, 5, C, TT, W, GA, LT)), axis=0),
                               ct.cat((_dwrow(*a, 6, C, TT, W, GA, LT), _dwrow(*a, 7, C, TT, W, GA, LT)), axis=0)),
                              axis=0)), axis=0)
    return ct.sum(t, axis=1)


def _grad_sum(gx4, i, kh, R: ConstInt, RP: ConstInt, C: ConstInt, TT: ConstInt, GS: ConstBool, LT: ConstBool):
    """[TT, C] fp32: the grads of key head kh's R repeats (gx4 [NT, Hk, R, c]) summed."""
    if GS:
        acc = ct.zeros((TT, C), dtype=ct.float32)
        for rr in ct.static_iter(range(R)):
            acc = acc + ct.reshape(ct.load(gx4, index=(i, kh, rr, 0), shape=(TT, 1, 1, C), padding_mode=PAD_ZERO,
                                           allow_tma=LT), (TT, C)).astype(ct.float32)
        return acc
    g4 = ct.load(gx4, index=(i, kh, 0, 0), shape=(TT, 1, RP, C), padding_mode=PAD_ZERO, allow_tma=LT)
    return ct.reshape(ct.sum(g4.astype(ct.float32), axis=2), (TT, C))


def _pzero(C: ConstInt, WW: ConstInt, DWS: ConstBool):
    """The block's zero dconv_weight partial: [WW, C] (DWS) or [C, WW]."""
    if DWS:
        return ct.zeros((WW, C), dtype=ct.float32)
    return ct.zeros((C, WW), dtype=ct.float32)


def _dwp(src, sh, dpre, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, WW: ConstInt,
         GA: ConstBool, LT: ConstBool, DWS: ConstBool):
    if DWS:
        return _dw_stacked(src, sh, dpre, rows, st, inner, i, u, NT, C, TT, W, WW, GA, LT)
    return _dw(src, sh, dpre, rows, st, inner, i, u, NT, C, TT, W, WW, GA, LT)


def _pfinal(p, C: ConstInt, WW: ConstInt, DWS: ConstBool):
    """The partial as the [1, 1, C, WW] tile of pw."""
    if DWS:
        p = ct.transpose(p)
    return ct.reshape(p, (1, 1, C, WW))


def _xrow(src, sh, rows, i, u, NT, j: ConstInt, C: ConstInt, TT: ConstInt, W: ConstInt, GA: ConstBool,
          LT: ConstBool):
    """[1, TT, C] fp32 x[t - (W-1-j)] (unmasked), zeros for j >= W."""
    if j < W:
        return ct.reshape(_xtap(src, sh, rows, i, u, NT, W - 1 - j, C, TT, GA, LT), (1, TT, C))
    return ct.zeros((1, TT, C), dtype=ct.float32)


def _xstack(src, sh, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, WW: ConstInt,
            GA: ConstBool, LT: ConstBool):
    """[WW, TT, C] fp32 (XS): row j = x[t - (W-1-j)] of head u, the tap of weight column j (zeros for
    j >= W; taps before st[t] masked unless ``inner``). Loaded once per tile: the conv and the
    dconv_weight products both read it (WW <= 8)."""
    a = (src, sh, rows, i, u, NT)
    t = _xrow(*a, 0, C, TT, W, GA, LT)
    if WW >= 2:
        t = ct.cat((t, _xrow(*a, 1, C, TT, W, GA, LT)), axis=0)
    if WW >= 4:
        t = ct.cat((t, ct.cat((_xrow(*a, 2, C, TT, W, GA, LT), _xrow(*a, 3, C, TT, W, GA, LT)), axis=0)), axis=0)
    if WW >= 8:
        t = ct.cat((t, ct.cat((ct.cat((_xrow(*a, 4, C, TT, W, GA, LT), _xrow(*a, 5, C, TT, W, GA, LT)), axis=0),
                               ct.cat((_xrow(*a, 6, C, TT, W, GA, LT), _xrow(*a, 7, C, TT, W, GA, LT)), axis=0)),
                              axis=0)), axis=0)
    if not inner:
        jj = ct.reshape(ct.arange(WW, dtype=ct.int32), (WW, 1, 1))
        ok = ct.reshape(rows, (1, TT, 1)) + jj - (W - 1) >= ct.reshape(st, (1, TT, 1))
        t = ct.where(ok, t, 0.0)
    return t


def _xt(src, sh, rows, st, inner, i, u, NT, s: ConstInt, C: ConstInt, TT: ConstInt, W: ConstInt,
        GA: ConstBool, LT: ConstBool):
    """[TT, C] fp32 (XT): tap s, x[t - s], masked before st[t] unless ``inner``; zeros for s >= W."""
    if s < W:
        t = _xtap(src, sh, rows, i, u, NT, s, C, TT, GA, LT)
        if not inner:
            t = ct.where(ct.reshape(rows - s >= st, (TT, 1)), t, 0.0)
        return t
    return ct.zeros((TT, C), dtype=ct.float32)


def _wt(wt, s: ConstInt, C: ConstInt, W: ConstInt):
    """[1, C] weight of tap s (column W-1-s), zeros for s >= W."""
    if s < W:
        return _wtap(wt, W - 1 - s, C)
    return ct.zeros((1, C), dtype=ct.float32)


def _xt4(src, sh, wt, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, GA: ConstBool,
         LT: ConstBool):
    """(XT) The taps (x[t], x[t-1], x[t-2], x[t-3]) of the tile, each loaded once, and pre = conv(x)."""
    a = (src, sh, rows, st, inner, i, u, NT)
    x = (_xt(*a, 0, C, TT, W, GA, LT), _xt(*a, 1, C, TT, W, GA, LT), _xt(*a, 2, C, TT, W, GA, LT),
         _xt(*a, 3, C, TT, W, GA, LT))
    pre = x[0] * _wt(wt, 0, C, W) + x[1] * _wt(wt, 1, C, W) + x[2] * _wt(wt, 2, C, W) + x[3] * _wt(wt, 3, C, W)
    return x, pre


def _prow(a, s: ConstInt, C: ConstInt, W: ConstInt):
    """[1, C] (XT): column W-1-s of the partial, the tokens' sum of tap s's products (zeros for s >= W)."""
    if s < W:
        return ct.sum(a[s], axis=0, keepdims=True)
    return ct.zeros((1, C), dtype=ct.float32)


def _pxt(a, C: ConstInt, W: ConstInt, WW: ConstInt):
    """[WW, C] (XT): row j = _prow(a, W-1-j) (zeros for j >= W; WW <= 4)."""
    if WW == 1:
        return _prow(a, W - 1, C, W)
    if WW == 2:
        return ct.cat((_prow(a, W - 1, C, W), _prow(a, W - 2, C, W)), axis=0)
    r0 = ct.cat((_prow(a, W - 1, C, W), _prow(a, W - 2, C, W)), axis=0)
    if W == 4:
        r1 = ct.cat((_prow(a, 1, C, W), _prow(a, 0, C, W)), axis=0)
    else:  # W == 3: row 2 is tap 0, row 3 is zero
        r1 = ct.cat((_prow(a, 0, C, W), ct.zeros((1, C), dtype=ct.float32)), axis=0)
    return ct.cat((r0, r1), axis=0)


def _pz(C: ConstInt, TT: ConstInt, WW: ConstInt, DWS: ConstBool, XS: ConstBool, DWA: ConstBool,
        XT: ConstBool):
    """The block's zero dconv_weight partial: 4 x [TT, C] (XT), [WW, TT, C] (DWA), [WW, C] (XS), else
    _pzero's."""
    if XT:
        return (ct.zeros((TT, C), dtype=ct.float32), ct.zeros((TT, C), dtype=ct.float32),
                ct.zeros((TT, C), dtype=ct.float32), ct.zeros((TT, C), dtype=ct.float32))
    if XS:
        if DWA:
            return ct.zeros((WW, TT, C), dtype=ct.float32)
        return ct.zeros((WW, C), dtype=ct.float32)
    return _pzero(C, WW, DWS)


def _pupd(pacc, X, src, sh, dpre, rows, st, inner, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt,
          WW: ConstInt, GA: ConstBool, LT: ConstBool, DWS: ConstBool, XS: ConstBool, DWA: ConstBool,
          XT: ConstBool):
    """pacc plus this tile's dconv_weight products (XS: from the stacked taps X, summed over the
    tokens per tile, or with DWA kept per token until _pout; XT: per tap, elementwise)."""
    if XT:
        return (pacc[0] + X[0] * dpre, pacc[1] + X[1] * dpre, pacc[2] + X[2] * dpre, pacc[3] + X[3] * dpre)
    if XS:
        pr = X * ct.reshape(dpre, (1, TT, C))
        if DWA:
            return pacc + pr
        return pacc + ct.sum(pr, axis=1)
    return pacc + _dwp(src, sh, dpre, rows, st, inner, i, u, NT, C, TT, W, WW, GA, LT, DWS)


def _pout(pacc, C: ConstInt, W: ConstInt, WW: ConstInt, DWS: ConstBool, XS: ConstBool, DWA: ConstBool,
          XT: ConstBool):
    """The block's partial as the [1, 1, C, WW] tile of pw."""
    if XT:
        return _pfinal(_pxt(pacc, C, W, WW), C, WW, True)
    if XS:
        if DWA:
            return _pfinal(ct.sum(pacc, axis=1), C, WW, True)
        return _pfinal(pacc, C, WW, True)
    return _pfinal(pacc, C, WW, DWS)


def _sigmoid(x):
    """1 / (1 + exp(-x)) with the MUFU exp and reciprocal (APPROX, ~2 ulp each)."""
    return ct.truediv(1.0, 1.0 + ct.exp(-x, rounding_mode=APPROX), rounding_mode=APPROX)


def z_tile(gz, dz, i, h, TT: ConstInt, HBZ: ConstInt, DV: ConstInt, LT: ConstBool):
    """dz = gz for token tile i of z heads h*HBZ .. h*HBZ+HBZ-1."""
    ct.store(dz, index=(i, h, 0), tile=ct.load(gz, index=(i, h, 0), shape=(TT, HBZ, DV), padding_mode=PAD_ZERO,
                                               allow_tma=LT).astype(dz.dtype), allow_tma=False)


def gate_consts(A_log, dt_bias, HVP: ConstInt):
    """([1, HVP] -exp(A_log), [1, HVP] dt_bias) in fp32 (padding 0)."""
    al = ct.reshape(ct.load(A_log, index=(0,), shape=(HVP,), padding_mode=PAD_ZERO, allow_tma=False), (1, HVP))
    dtb = ct.reshape(ct.load(dt_bias, index=(0,), shape=(HVP,), padding_mode=PAD_ZERO, allow_tma=False),
                     (1, HVP)).astype(ct.float32)
    return -ct.exp(al.astype(ct.float32)), dtb


def gate_tile(mba, gg, gbeta, dba, nA, dtb, i, TT: ConstInt, HVP: ConstInt, LT: ConstBool):
    """Token tile i of the gates unit: db = gbeta * beta * (1 - beta), da = gg * nA * sigmoid(a + dt_bias)
    -> dba; returns the tile's [1, HVP] sums of gg * g and of da (rows past NT read zero grads: they
    add nothing)."""
    b = ct.reshape(ct.load(mba, index=(i, 0, 0), shape=(TT, 1, HVP), padding_mode=PAD_ZERO,
                           allow_tma=LT), (TT, HVP)).astype(ct.float32)
    x = ct.reshape(ct.load(mba, index=(i, 1, 0), shape=(TT, 1, HVP), padding_mode=PAD_ZERO,
                           allow_tma=LT), (TT, HVP)).astype(ct.float32) + dtb
    gb = ct.load(gbeta, index=(i, 0), shape=(TT, HVP), padding_mode=PAD_ZERO, allow_tma=LT).astype(ct.float32)
    gt = ct.load(gg, index=(i, 0), shape=(TT, HVP), padding_mode=PAD_ZERO, allow_tma=LT).astype(ct.float32)
    beta = 1.0 / (1.0 + ct.exp(-b))
    da = gt * nA / (1.0 + ct.exp(-x))
    ct.store(dba, index=(i, 0, 0), tile=ct.reshape(gb * beta * (1.0 - beta), (TT, 1, HVP)).astype(dba.dtype),
             allow_tma=False)
    ct.store(dba, index=(i, 1, 0), tile=ct.reshape(da, (TT, 1, HVP)).astype(dba.dtype), allow_tma=False)
    return ct.sum(gt * nA * softplus(x), axis=0, keepdims=True), ct.sum(da, axis=0, keepdims=True)


def gate_store(pg, pr, sA, sD, HVP: ConstInt):
    """The block's gate sums -> partial row pr of pg [P, 2, HVP]."""
    ct.store(pg, index=(pr, 0, 0), tile=ct.reshape(sA, (1, 1, HVP)), allow_tma=False)
    ct.store(pg, index=(pr, 1, 0), tile=ct.reshape(sD, (1, 1, HVP)), allow_tma=False)


def _starts(seq, sst, rows, i, t0, TT: ConstInt, W: ConstInt, CH: ConstInt, THD: ConstBool):
    """[TT] int32 sequence start of each row (THD: precomputed by gdn_pre_bwd_seq)."""
    if THD:
        return ct.load(sst, index=(i,), shape=(TT,), padding_mode=PAD_ZERO, allow_tma=False)
    return seq_start(seq, rows, t0, TT, W, CH, THD)


# ------------------------------------------------------------------ kernels


@ct.kernel
def gdn_pre_bwd_seq(seq, sst, sen, W: ConstInt, CH: ConstInt, PT: ConstInt):
    """Block p: the sequence start and end of tokens [p*PT, (p+1)*PT) (exact within W-1 rows)."""
    p = ct.bid(0)
    t0 = p * PT
    rows = t0 + ct.arange(PT, dtype=ct.int32)
    ct.store(sst, index=(p,), tile=seq_start(seq, rows, t0, PT, W, CH, True), allow_tma=False)
    ct.store(sen, index=(p,), tile=seq_end(seq, rows, t0, PT, W, CH, True), allow_tma=False)


def _tile_pre(src, sh, wt, seq, sst, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, WW: ConstInt, CH: ConstInt,
              THD: ConstBool, GA: ConstBool, LT: ConstBool, XS: ConstBool, XT: ConstBool):
    """Token tile i of head u: its rows, their sequence starts, whether every tap stays inside
    the rows' sequences (``inner``: no masks), the stacked taps X (XS, else a placeholder),
    pre = conv(x) [TT, C] fp32 and sigmoid(pre)."""
    t0 = i * TT
    rows = t0 + ct.arange(TT, dtype=ct.int32)
    st = _starts(seq, sst, rows, i, t0, TT, W, CH, THD)
    if GA:
        inner = False
    else:
        inner = ct.min(rows - st) >= W - 1
    if XT:
        X, pre = _xt4(src, sh, wt, rows, st, inner, i, u, NT, C, TT, W, GA, LT)
    elif XS:
        X = _xstack(src, sh, rows, st, inner, i, u, NT, C, TT, W, WW, GA, LT)
        pre = ct.sum(X * ct.reshape(ct.transpose(wt), (WW, 1, C)), axis=0)
    else:
        X = ct.zeros((1, 1, 1), dtype=ct.float32)
        pre = _conv(src, sh, wt, rows, st, inner, i, u, NT, C, TT, W, GA, LT)
    return rows, st, inner, X, pre, _sigmoid(pre)


@ct.kernel
def gdn_pre_bwd_dpre(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mba, seq, sst, wqk, wv, A_log, dt_bias,
                     gq4, gk4, gv, gz, gg, gbeta, dz, dba, dpqk, dpv, pwqk, pwv, pg, eps: float,
                     HK: ConstInt, HV: ConstInt, R: ConstInt, RP: ConstInt, W: ConstInt, DK: ConstInt,
                     DV: ConstInt, HVP: ConstInt, WW: ConstInt, TT: ConstInt, NTB: ConstInt, HBZ: ConstInt,
                     GS: ConstBool, DWS: ConstBool, XS: ConstBool, DWA: ConstBool, XT: ConstBool, I0: ConstInt,
                     CH: ConstInt, THD: ConstBool, GA: ConstBool, ONE: ConstBool, LT: ConstBool):
    """Block (r, u): token tiles I0 + r*NTB + j (j < NTB; ONE: tile 0 only) of unit u (module doc);
    its partials go to row I0 + r."""
    r, u, NT, ntl, nj = _dpre_block(mqk, TT, NTB, ONE)
    HK2 = 2 * HK
    pr = I0 + r
    if u < HK2:  # q or k head u: conv, silu, l2norm bwd of the summed repeats
        wt = _wtile(wqk, u, DK, WW)
        kh = u % HK
        pacc = _pz(DK, TT, WW, DWS, XS, DWA, XT)
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                sh = (mqk1, mqk2, mqk3)
                rows, st, inner, X, pre, sg = _tile_pre(mqk, sh, wt, seq, sst, i, u, NT, DK, TT, W, WW, CH, THD, GA,
                                                        LT, XS, XT)
                y = pre * sg
                s = ct.rsqrt(ct.sum(y * y, axis=1, keepdims=True) + eps)
                n = y * s
                if u < HK:
                    dn = _grad_sum(gq4, i, kh, R, RP, DK, TT, GS, LT)
                else:
                    dn = _grad_sum(gk4, i, kh, R, RP, DK, TT, GS, LT)
                dy = s * (dn - n * ct.sum(dn * n, axis=1, keepdims=True))
                dpre = dy * sg * (1.0 + pre * (1.0 - sg))
                ct.store(dpqk, index=(i, u, 0), tile=ct.reshape(dpre, (TT, 1, DK)).astype(dpqk.dtype),
                         allow_tma=False)
                pacc = _pupd(pacc, X, mqk, sh, dpre, rows, st, inner, i, u, NT, DK, TT, W, WW, GA, LT, DWS, XS, DWA, XT)
        ct.store(pwqk, index=(pr, u, 0, 0), tile=_pout(pacc, DK, W, WW, DWS, XS, DWA, XT), allow_tma=False)
    elif u < HK2 + HV:  # v head h: conv, silu
        h = u - HK2
        wt = _wtile(wv, h, DV, WW)
        pacc = _pz(DV, TT, WW, DWS, XS, DWA, XT)
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                sh = (mv1, mv2, mv3)
                rows, st, inner, X, pre, sg = _tile_pre(mv, sh, wt, seq, sst, i, h, NT, DV, TT, W, WW, CH, THD, GA,
                                                        LT, XS, XT)
                dy = ct.reshape(ct.load(gv, index=(i, h, 0), shape=(TT, 1, DV), padding_mode=PAD_ZERO,
                                        allow_tma=LT), (TT, DV)).astype(ct.float32)
                dpre = dy * sg * (1.0 + pre * (1.0 - sg))
                ct.store(dpv, index=(i, h, 0), tile=ct.reshape(dpre, (TT, 1, DV)).astype(dpv.dtype), allow_tma=False)
                pacc = _pupd(pacc, X, mv, sh, dpre, rows, st, inner, i, h, NT, DV, TT, W, WW, GA, LT, DWS, XS, DWA, XT)
        ct.store(pwv, index=(pr, h, 0, 0), tile=_pout(pacc, DV, W, WW, DWS, XS, DWA, XT), allow_tma=False)
    elif u < HK2 + HV + HV // HBZ:  # z heads: dz = gz
        h = u - HK2 - HV
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                z_tile(gz, dz, i, h, TT, HBZ, DV, LT)
    else:  # gates of all Hv heads
        nA, dtb = gate_consts(A_log, dt_bias, HVP)
        sA = ct.zeros((1, HVP), dtype=ct.float32)
        sD = ct.zeros((1, HVP), dtype=ct.float32)
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                a, d = gate_tile(mba, gg, gbeta, dba, nA, dtb, i, TT, HVP, LT)
                sA = sA + a
                sD = sD + d
        gate_store(pg, pr, sA, sD, HVP)


def _ahead(dp, sh, rows, i, u, NT, s: ConstInt, C: ConstInt, TT: ConstInt, TAPV: ConstBool, LT: ConstBool):
    """[TT, C] fp32 dpre rows t + s of head u (rows past NT: 0): tile i of dp (s = 0) or of the view
    sh[s-1] = dp[s:] (TAPV; a tile starting past the view's end reads zeros), else gathered."""
    if s == 0:
        t = ct.reshape(ct.load(dp, index=(i, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO, allow_tma=LT), (TT, C))
    elif TAPV:
        if i * TT + s < NT:
            t = ct.reshape(ct.load(sh[s - 1], index=(i, u, 0), shape=(TT, 1, C), padding_mode=PAD_ZERO,
                                   allow_tma=LT), (TT, C))
        else:
            t = ct.zeros((TT, C), dtype=dp.dtype)
    else:
        rc = ct.minimum(rows + s, NT - 1)
        t = ct.reshape(ct.load_advanced_indexing(dp, (rc, ct.Slice(u, 1), ct.Slice(0, C)), padding_mode=PAD_ZERO,
                                                 allow_tma=False), (TT, C))
    return t.astype(ct.float32)


def _dx(dp, sh, wt, rows, en, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, TAPV: ConstBool, LT: ConstBool):
    """[TT, C] fp32 dx[t] = sum_s w[:, W-1-s] * dpre[t+s] over t + s < en[t] (no masks in a tile whose
    rows all have W-1 successors in their sequence)."""
    acc = ct.zeros((TT, C), dtype=ct.float32)
    if ct.min(en - rows) >= W:
        for s in ct.static_iter(range(W)):
            acc = acc + _ahead(dp, sh, rows, i, u, NT, s, C, TT, TAPV, LT) * _wtap(wt, W - 1 - s, C)
    else:
        for s in ct.static_iter(range(W)):
            ok = ct.reshape(rows + s < en, (TT, 1))
            acc = acc + ct.where(ok, _ahead(dp, sh, rows, i, u, NT, s, C, TT, TAPV, LT), 0.0) * _wtap(wt, W - 1 - s, C)
    return acc


@ct.kernel
def gdn_pre_bwd_dx(dpqk, dpqk1, dpqk2, dpqk3, dpv, dpv1, dpv2, dpv3, seq, sen, wqk, wv, dqk, dvv, HK: ConstInt,
                   W: ConstInt, DK: ConstInt, DV: ConstInt, TT: ConstInt, WW: ConstInt, CH: ConstInt,
                   THD: ConstBool, TAPV: ConstBool, LT: ConstBool):
    """Block (i, u): dx of token tile i, q/k head u < 2*HK or v head u - 2*HK."""
    i = ct.bid(0)
    u = ct.bid(1)
    NT = dpqk.shape[0]
    t0 = i * TT
    rows = t0 + ct.arange(TT, dtype=ct.int32)
    if THD:  # precomputed by gdn_pre_bwd_seq (rows past NT: 0, so they are masked)
        en = ct.load(sen, index=(i,), shape=(TT,), padding_mode=PAD_ZERO, allow_tma=False)
    else:
        en = seq_end(seq, rows, t0, TT, W, CH, THD)
    if u < 2 * HK:
        dx = _dx(dpqk, (dpqk1, dpqk2, dpqk3), _wtile(wqk, u, DK, WW), rows, en, i, u, NT, DK, TT, W, TAPV, LT)
        ct.store(dqk, index=(i, u, 0), tile=ct.reshape(dx, (TT, 1, DK)).astype(dqk.dtype), allow_tma=False)
    else:
        h = u - 2 * HK
        dx = _dx(dpv, (dpv1, dpv2, dpv3), _wtile(wv, h, DV, WW), rows, en, i, h, NT, DV, TT, W, TAPV, LT)
        ct.store(dvv, index=(i, h, 0), tile=ct.reshape(dx, (TT, 1, DV)).astype(dvv.dtype), allow_tma=False)


@ct.kernel
def gdn_pre_bwd_red(pw, pg, dw, dA, ddt, NCB: ConstInt, BC: ConstInt, WW: ConstInt, HVP: ConstInt, TG: ConstInt):
    """Block j < NCB: dconv_weight rows [j*BC, (j+1)*BC) from pw [P, C, WW]; block NCB: dA_log and
    ddt_bias from pg [P', 2, HVP] (P' may differ from P). The partial rows summed TG at a time, in row
    order (the same order every call)."""
    j = ct.bid(0)
    if j < NCB:
        acc = ct.zeros((BC, WW), dtype=ct.float32)
        for c in range(ct.cdiv(pw.shape[0], TG)):
            acc = acc + ct.sum(ct.load(pw, index=(c, j, 0), shape=(TG, BC, WW), padding_mode=PAD_ZERO,
                                       allow_tma=False), axis=0)
        ct.store(dw, index=(j, 0), tile=acc.astype(dw.dtype), allow_tma=False)
    else:
        acc = ct.zeros((2, HVP), dtype=ct.float32)
        for c in range(ct.cdiv(pg.shape[0], TG)):
            acc = acc + ct.sum(ct.load(pg, index=(c, 0, 0), shape=(TG, 2, HVP), padding_mode=PAD_ZERO,
                                       allow_tma=False), axis=0)
        ct.store(dA, index=(0,), tile=ct.reshape(ct.extract(acc, (0, 0), shape=(1, HVP)), (HVP,)).astype(dA.dtype),
                 allow_tma=False)
        ct.store(ddt, index=(0,), tile=ct.reshape(ct.extract(acc, (1, 0), shape=(1, HVP)), (HVP,)).astype(ddt.dtype),
                 allow_tma=False)


# ------------------------------------------------------------------ launches


def bwd_operands(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, cu_seqlens, dmixed, Hk: int, dk: int, dv: int,
                 cfg, Pw: int, Pg: int) -> tuple:
    """What both designs' launches take (module doc's layouts; ``cfg`` gives R, WW, HVP, SD): the views of mixed
    (mqk, mv, mba), of the weight (wqk, wv) and of dmixed (dqk, dvv, dz, dba); the sequence argument and THD flag;
    the scratch from the per-stream workspace cache: THD bounds sst, sen [NT] int32, dpre [NT, C] (dmixed's dtype,
    fp32 unless cfg.SD) as dpqk [NT, 2Hk, dk] and dpv [NT, Hv, dv], partials pw [Pw, C, WW] (and its q|k, v views)
    and pg [Pg, 2, HVP] fp32; the grads as the kernels read them (made contiguous)."""
    Hv = gv.shape[-2]
    _, mqk, mv, _, mba, wqk, wv = views(mixed, conv_weight, Hk, Hv, dk, dv)
    _, dqk, dvv, dz, dba, _, _ = views(dmixed, conv_weight, Hk, Hv, dk, dv)
    NT, dev = mqk.shape[0], mqk.device
    QK, C = 2 * Hk * dk, 2 * Hk * dk + Hv * dv
    seq, thd = seq_arg(mixed, cu_seqlens)
    dp = workspace("gdn_pre_bwd.dpre", (NT, C), dmixed.dtype if cfg.SD else torch.float32, dev)
    pw = workspace("gdn_pre_bwd.pw", (Pw, C, cfg.WW), torch.float32, dev)
    pg = workspace("gdn_pre_bwd.pg", (Pg, 2, cfg.HVP), torch.float32, dev)
    ntp = cdiv(NT, 4) * 4 if thd else 0  # each row 16-byte aligned
    sb = workspace("gdn_pre_bwd.seq", (2, ntp), torch.int32, dev)
    dpqk, dpv = dp[:, :QK].view(NT, 2 * Hk, dk), dp[:, QK:].view(NT, Hv, dv)
    pwqk, pwv = pw[:, :QK].view(Pw, 2 * Hk, dk, cfg.WW), pw[:, QK:].view(Pw, Hv, dv, cfg.WW)
    grads = [t.contiguous().view(NT, Hk, cfg.R, dk) for t in (gq, gk)]
    grads += [t.contiguous().view(NT, Hv, dv) for t in (gv, gz)] + [t.contiguous().view(NT, Hv) for t in (gg, gbeta)]
    return (mqk, mv, mba, wqk, wv, dqk, dvv, dz, dba, seq, thd, sb[0, :NT], sb[1, :NT], dpqk, dpv, pw, pwqk, pwv, pg,
            grads)


def bwd_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                 dmixed, dconv_weight, dA_log, ddt_bias, Hk: int = 16, dk: int = 128, dv: int = 128,
                 repeat_qk: bool = True, eps: float = 1e-6, cfg: PreGatedBwdCfg | None = None) -> list[Launch]:
    """The backward launches (argument order as the registry's bwd kernel; module doc): [THD
    sequence bounds], dpre tile 0 (taps gathered), dpre tiles 1.. (none for W > WMAX: the first
    launch gathers every tile), dx, reduction. Scratch (dpre [NT, C], partials [P, C, WW] and
    [P, 2, HVP], THD bounds [NT] x 2) from the per-stream workspace cache."""
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    if type(cfg).__name__ == "PreGatedBwd2Cfg" or (cfg is None and V2 and W <= WMAX):
        from . import cutile_pre_gated_bwd2 as b2  # the second design (imports this module)
        return b2.bwd2_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens, dmixed,
                                dconv_weight, dA_log, ddt_bias, Hk, dk, dv, repeat_qk, eps, cfg=cfg)
    cfg = bwd_cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg)
    TT = cfg.TT
    nt = cdiv(mixed.numel() // mixed.shape[-1], TT)
    rows_main = cdiv(nt - 1, cfg.NTB) if cfg.TAPV else 0
    P = 1 + rows_main if cfg.TAPV else cdiv(nt, cfg.NTB)
    (mqk, mv, mba, wqk, wv, dqk, dvv, dz, dba, seq, thd, sst, sen, dpqk, dpv, pw, pwqk, pwv, pg, grads) = bwd_operands(
        gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, cu_seqlens, dmixed, Hk, dk, dv, cfg, P, P)
    NT, C = mqk.shape[0], conv_weight.shape[0]
    units = 2 * Hk + Hv + Hv // cfg.HBZ + 1
    args = (mqk, *shifted(mqk, TT), mv, *shifted(mv, TT), mba, seq, sst, wqk, wv, A_log, dt_bias, *grads,
            dz, dba, dpqk, dpv, pwqk, pwv, pg, float(eps), Hk, Hv, cfg.R, cfg.RP, W, cfg.DK, cfg.DV, cfg.HVP, cfg.WW,
            TT, cfg.NTB, cfg.HBZ, cfg.GS, cfg.DWS, cfg.XS, cfg.DWA, cfg.XT)
    tail = (cfg.CH, thd)
    out = []
    if thd:
        out.append(Launch(gdn_pre_bwd_seq, (cdiv(NT, cfg.PT), 1, 1), (seq, sst, sen, W, cfg.CH, cfg.PT), cfg, ()))
    if cfg.TAPV:  # tile 0 (gathered taps), then tiles 1.. (tile loads of shifted views)
        out.append(Launch(gdn_pre_bwd_dpre, (1, units, 1), args + (0,) + tail + (True, True, cfg.LT), cfg,
                          occ(cfg.OCC_A)))
        out.append(Launch(gdn_pre_bwd_dpre, (rows_main, units, 1), args + (1,) + tail + (False, False, cfg.LT), cfg,
                          occ(cfg.OCC_A)))
    else:
        out.append(Launch(gdn_pre_bwd_dpre, (P, units, 1), args + (0,) + tail + (True, False, cfg.LT), cfg,
                          occ(cfg.OCC_A)))
    out.append(Launch(gdn_pre_bwd_dx, (cdiv(NT, cfg.TB), 2 * Hk + Hv, 1),
                      (dpqk, *shifted(dpqk, 0), dpv, *shifted(dpv, 0), seq, sen, wqk, wv, dqk, dvv, Hk, W, cfg.DK,
                       cfg.DV, cfg.TB, cfg.WW, cfg.CH, thd, cfg.TAPV, cfg.LB), cfg, occ(cfg.OCC_B)))
    ncb = cdiv(C, cfg.BC)
    out.append(Launch(gdn_pre_bwd_red, (ncb + 1, 1, 1), (pw, pg, dconv_weight, dA_log, ddt_bias, ncb, cfg.BC,
                                                          cfg.WW, cfg.HVP, cfg.TG), cfg, ()))
    return out


def pre_gated_bwd_into(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                       dmixed, dconv_weight, dA_log, ddt_bias, Hk: int, dk: int, dv: int, repeat_qk: bool,
                       eps: float, return_conv_state: bool, cfg: PreGatedBwdCfg | None = None):
    """gdn_pre_gated bwd, destination-passing (the registry's kernel signature): grads gq, gk
    [..., Hq, dk], gv, gz [..., Hv, dv], gg, gbeta [..., Hv] (any strides: made contiguous), mixed
    [B, T, D] or [NT, D] (+ cu_seqlens [N+1] int32) -> dmixed (mixed's shape and dtype),
    dconv_weight [C, W], dA_log, ddt_bias [Hv]. ``cfg`` (tests, benchmarks): a PreGatedBwdCfg."""
    if mixed.numel() == 0:
        dconv_weight.zero_()
        dA_log.zero_()
        ddt_bias.zero_()
        return
    for ln in bwd_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                           dmixed, dconv_weight, dA_log, ddt_bias, Hk, dk, dv, repeat_qk, eps, cfg=cfg):
        ln.run()


kernel("gdn_pre_gated", "cutile", "bwd")(pre_gated_bwd_into)


def representative_launches(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                            B: int = 2, T: int = 256, dtype=torch.bfloat16, thd: bool = False,
                            repeat_qk: bool = True, n_seqs: int = 5, cfg: PreGatedBwdCfg | None = None) -> dict:
    """The backward launches at one problem size, on ``meta`` tensors: what the CI compile test
    exports to cubins (sm_90, sm_100) without a GPU."""
    meta = torch.device("meta")
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    Hq = Hv if repeat_qk else Hk
    lead = (B * T,) if thd else (B, T)

    def e(*s, dt=dtype):
        return torch.empty(*s, dtype=dt, device=meta)

    grads = (e(*lead, Hq, dk), e(*lead, Hq, dk), e(*lead, Hv, dv), e(*lead, Hv, dv),
             e(*lead, Hv, dt=torch.float32), e(*lead, Hv))
    cu = e(n_seqs + 1, dt=torch.int32) if thd else None
    A, dt = e(Hv, dt=torch.float32), e(Hv, dt=torch.float32)
    return {"gdn_pre_gated.bwd": bwd_launches(*grads, e(*lead, D), e(C, W), A, dt, cu, e(*lead, D), e(C, W),
                                              e(Hv, dt=torch.float32), e(Hv, dt=torch.float32), Hk, dk, dv,
                                              repeat_qk, 1e-6, cfg=cfg)}
