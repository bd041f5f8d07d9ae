"""cuTile backward of gdn_pre_gated, second design: a lean dpre pass, dconv_weight in the dx pass.

Same results as ``cutile_pre_gated_bwd`` (``reference.pre_gated_bwd`` is the truth; that module's doc
has the math, layouts and views, which this one shares): dmixed, dconv_weight, dA_log, ddt_bias.

Why a second design: the first one's dpre pass (2.78 ms of its 3.26 at the Qwen3-Next shape on the
H200) computes the dconv_weight partial beside dpre: the W tap tiles of x and a [W, tokens, c] fp32
accumulator stay live in registers (128 a thread, 25% occupancy, ~100 instructions an element,
latency-bound by ncu). Here the partial moves to the dx pass, which already holds the W look-ahead
tiles of dpre that the partial needs: with s = W-1-j,
  dx[t]          = sum_j w[:, j] * dpre[t + s]          over t + s < end(t),
  dconv_w[:, j]  = sum_t dpre[t] * x[t - s] = sum_t dpre[t + s] * x[t]  over the same (t, s),
so the masked look-ahead tile a_s = dpre[t + s] feeds both (one FMA each), and the partial needs one
more load, x's own tile (no shift). The dpre pass is then the forward's conv + SiLU plus the l2norm
backward: no partial, no taps kept, larger token tiles at higher occupancy. Cost: the partial is
summed from the dpre scratch (fp32; cfg.SD keeps it in dmixed's dtype, an extra rounding: 42% of
dconv_weight's elements off the once-rounded value) and the dx pass reads x
(+16 KB a token at the headline shape; ideal traffic of the two passes ~120 KB a token against 82 KB
for a fused one).

Launches (``bwd2_launches``; PreGatedBwd2Cfg names the fields; widths W > WMAX use the first design):
  gdn_pre_bwd_seq  THD only: every token's sequence start and end (the first design's kernel).
  gdn_pre_bwd2_dpre grid (row blocks, 2*Hk + Hv + Hv/HBZ + 1 units): block (r, u) does NTB token tiles of
                   TT rows of unit u; q/k head u < 2*Hk: conv (taps as tile loads of shifted views, as the
                   forward), SiLU, the R repeats' grads summed, l2norm backward, dpre -> scratch; v head:
                   conv, SiLU, dpre -> scratch; z heads: dz = gz; gates: db, da -> dmixed, the block's sums
                   of gg*g and da -> pg [P', 2, HVP]. Token tile 0 is a launch of its own (taps gathered).
                   SX (16-bit I/O only): sigmoid(pre) = (1 + tanh(pre/2))/2 with the MUFU tanh.
  gdn_pre_bwd2_dx  grid (cdiv(NT, TB*NTX), 2*Hk + Hv): block (r, u) does NTX token tiles of TB rows of head u:
                   the W look-ahead tiles of dpre (tile i of the views dpre[s:]), masked by the sequence end
                   only in tiles that hold one, dx -> dmixed, and the dconv_weight partial (DWA: products
                   summed per token over the block's tiles, reduced over the tokens once; else reduced per
                   tile) -> pw [P, C, WW]. A tile that holds a sequence start also adds the products
                   dpre[t] * 0 of the taps that reach into the zero padding before it (0, or NaN for a
                   non-finite dpre: the reference forms them, so NaN reaches every tap of dconv_weight).
  gdn_pre_bwd_red  the first design's reduction: pw and pg summed TG rows at a time in row order
                   (deterministic: no float atomics, the same order every call).

Measured on the H200 (session 8; Qwen3-Next Hk=16, Hv=32, dk=dv=128, W=4, bf16, 32768 tokens; triton do_bench
median; benchmarks/probes/gdn_pre_bwd_time.py and run16/C/gpu1.py; % of the ideal traffic of a fused backward,
82,368 B a token with repeat_qk, at 4.27 TB/s). At this heuristic (dpre TT32 OCC4; dx + partials TB8 NTX32 LB),
one run beside the first design's default: BSHD repeat_qk 2.061 ms (30.7%) against 3.247 (19.5%), THD
2.192 against 3.336, BSHD without repeat_qk 1.995 against 3.088; per launch (BSHD rep) dpre 0.889 ms (the
first design's 2.772), dx + partials 1.084 (its dx alone 0.420), reduction 0.056; rel. errors vs the fp32
reference: dmixed 1.4e-3, dconv_weight 2.5e-3 (the first design 2e-5 to 5e-5: it sums fp32 dpre).
cuobjdump (sm_90, export_cubin): dpre 128 registers, no stack, 30 KB shared (the first design's 128 + 32 B
stack, 85 KB shared). Sweep (BSHD rep, whole backward / dx launch, ms; earlier runs of this kernel):
  TB16 NTX4 DWA, statically unrolled tiles (spills, STACK 216-272): 3.2 dx 2.2 at OCC_B2;
  TB16 NTX1 (no spills, a partial row a tile: 268 MB of partials): 4.31 / 3.20;
  TB8 NTX16 2.257 / 1.281; TB8 NTX32 2.149 / 1.176; TB8 NTX16 LB 2.185 / 1.208; TB16 NTX8 OCC_B2 2.876 / 1.900;
  SPLIT (the first design's dx, 0.42, then the partials alone) TB8 NTX16 2.472 (partials 1.084), NTX32 2.385
  (0.998); dpre TT16 OCC_A8 0.864 (but twice the gate partial rows: reduction 0.101); SX off: dpre 0.934.
So the partials are now the cost: ~1 ms for ~32 KB a token of DRAM reads (dpre and x) is latency-bound, like the
first design's dpre pass was: the per-tap products need W + 1 tile loads an iteration and the compiler keeps
only ~TB8 x 128 elements a tap in registers without spilling (64-128 registers a thread, 4 warps a block).

Compile key: PreGatedBwd2Cfg (from Hk, Hv, dk, dv, W, repeat_qk only) + dtypes + THD; NT, B, T, N are
dynamic. Importing this module needs ``cuda.tile`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import cuda.tile as ct

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

from . import cutile_pre_gated_bwd as b1
from .cutile_pre_gated import WMAX, check_heads, seq_end, shifted

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
APPROX = ct.RoundingMode.APPROX


@dataclasses.dataclass(frozen=True)
class PreGatedBwd2Cfg(b1.BwdShapeCfg):
    """Launch config of the second backward = compile key (with the argument dtypes and THD); the
    head shape and the shared sequence-bound / reduction knobs come from the first design's
    BwdShapeCfg (W <= WMAX here)."""
    TT: int = 32  # dpre pass: tokens per tile (power of two, >= W)
    NTB: int = 1  # dpre pass: token tiles per block
    HBZ: int = 4  # dpre pass: z heads per block (a power of two dividing Hv)
    TB: int = 8   # dx pass: tokens per tile (power of two)
    NTX: int = 32  # dx pass: token tiles per block (a loop: fewer dconv_weight partial rows)
    DWA: bool = True  # dx pass: partial products summed elementwise over the block's tiles, reduced once
    SX: bool = True   # dpre pass, 16-bit I/O: sigmoid through the MUFU tanh (fp32 I/O: exp + rcp always)
    LT: bool = True   # dpre pass: tile loads may go through TMA
    LB: bool = True   # dx pass: tile loads may go through TMA
    GS: bool = True   # dpre pass: q/k grads as R loads summed (else one [TT, 1, RP, dk] load)
    SD: bool = False  # dpre scratch in dmixed's dtype (True: an extra bf16 rounding; False: fp32, OPS.md)
    OCC_A: int = 4    # dpre pass occupancy hint (0: the compiler's choice)
    OCC_B: int = 4    # dx pass occupancy hint
    SPLIT: bool = False  # dx (the first design's dx kernel) and the dconv_weight partials as two launches
    TBX: int = 32     # SPLIT: tokens a block of the dx launch
    OCC_X: int = 4    # SPLIT: occupancy hint of the dx launch

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool) -> "PreGatedBwd2Cfg":
        check_heads(Hk, Hv, W, "gdn_pre_gated cutile bwd2")
        if W > WMAX:
            raise ValueError(f"gdn_pre_gated cutile bwd2: W={W} > WMAX={WMAX} (the first design gathers those)")
        DK, DV = next_pow2(dk), next_pow2(dv)
        # ~4K fp32 elements a dpre tile (TT32 at dk=128, as the forward's FT32), ~1K a dx tile (TB8 at dk=128:
        # the W look-ahead tiles, x and the W partial accumulators stay in registers over the NTX-tile loop)
        TT = max(next_pow2(W), min(128, 4096 // max(DK, DV)))
        TB = max(next_pow2(W), min(128, 1024 // max(DK, DV)))
        return cls(**cls.shape(Hk, Hv, dk, dv, W, repeat_qk), TT=TT, TB=TB, HBZ=math.gcd(Hv, 4))


def bwd2_cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg=None) -> PreGatedBwd2Cfg:
    """The heuristic's config (``cfg`` None), or ``cfg`` checked against the problem."""
    return b1.checked_cfg(PreGatedBwd2Cfg, "cutile bwd2", Hk, Hv, dk, dv, W, repeat_qk, cfg,
                          lambda c, R: c.TB >= W and W <= WMAX)


# ------------------------------------------------------------------ device helpers


def _sig(x, SX: ConstBool):
    """sigmoid(x): (1 + tanh(x/2)) / 2 with the MUFU tanh.approx (SX; ~2^-11 absolute) or the APPROX exp
    and reciprocal (~2 ulp each)."""
    if SX:
        return 0.5 + 0.5 * ct.tanh(0.5 * x, rounding_mode=APPROX)
    return b1._sigmoid(x)


def _pre(src, sh, wt, seq, sst, i, u, NT, C: ConstInt, TT: ConstInt, W: ConstInt, CH: ConstInt, THD: ConstBool,
         GA: ConstBool, LT: ConstBool):
    """[TT, C] fp32 pre = conv(x) of token tile i, head u (per-tap masks only in tiles that hold a
    sequence's first W-1 rows, and in the gathering launch)."""
    t0 = i * TT
    rows = t0 + ct.arange(TT, dtype=ct.int32)
    st = b1._starts(seq, sst, rows, i, t0, TT, W, CH, THD)
    if GA:
        inner = False
    else:
        inner = ct.min(rows - st) >= W - 1
    return b1._conv(src, sh, wt, rows, st, inner, i, u, NT, C, TT, W, GA, LT)


def _silu_grad(dy, pre, SX: ConstBool):
    sg = _sig(pre, SX)
    return dy * sg * (1.0 + pre * (1.0 - sg))


def _qk_tile(mqk, sh, wt, seq, sst, g4, dst, eps, i, u, kh, NT, R: ConstInt, RP: ConstInt, W: ConstInt,
             DK: ConstInt, TT: ConstInt, CH: ConstInt, THD: ConstBool, GA: ConstBool, LT: ConstBool, GS: ConstBool,
             SX: ConstBool):
    """dpre of token tile i, q/k head u: y = silu(pre), the l2norm backward of the R repeats' summed grads
    dy = s*(dn - n*sum(dn*n)) (s = rsqrt(sum y^2 + eps), n = y*s), dpre = dy * silu'(pre) -> dst."""
    pre = _pre(mqk, sh, wt, seq, sst, i, u, NT, DK, TT, W, CH, THD, GA, LT)
    sg = _sig(pre, SX)
    y = pre * sg
    s = ct.rsqrt(ct.sum(y * y, axis=1, keepdims=True) + eps)
    n = y * s
    dn = b1._grad_sum(g4, i, kh, R, RP, DK, TT, GS, LT)
    dy = s * (dn - n * ct.sum(dn * n, axis=1, keepdims=True))
    dpre = dy * sg * (1.0 + pre * (1.0 - sg))
    ct.store(dst, index=(i, u, 0), tile=ct.reshape(dpre, (TT, 1, DK)).astype(dst.dtype), allow_tma=False)


def _v_tile(mv, sh, wt, seq, sst, gv, dst, i, h, NT, W: ConstInt, DV: ConstInt, TT: ConstInt, CH: ConstInt,
            THD: ConstBool, GA: ConstBool, LT: ConstBool, SX: ConstBool):
    """dpre of token tile i, v head h: gv * silu'(pre) -> dst."""
    pre = _pre(mv, sh, wt, seq, sst, i, h, NT, DV, TT, W, CH, THD, GA, LT)
    dy = ct.reshape(ct.load(gv, index=(i, h, 0), shape=(TT, 1, DV), padding_mode=PAD_ZERO, allow_tma=LT),
                    (TT, DV)).astype(ct.float32)
    ct.store(dst, index=(i, h, 0), tile=ct.reshape(_silu_grad(dy, pre, SX), (TT, 1, DV)).astype(dst.dtype),
             allow_tma=False)


@ct.kernel
def gdn_pre_bwd2_dpre(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mba, seq, sst, wqk, wv, A_log, dt_bias,
                      gq4, gk4, gv, gz, gg, gbeta, dz, dba, dpqk, dpv, pg, eps: float,
                      HK: ConstInt, HV: ConstInt, R: ConstInt, RP: ConstInt, W: ConstInt, DK: ConstInt,
                      DV: ConstInt, HVP: ConstInt, WW: ConstInt, TT: ConstInt, NTB: ConstInt, HBZ: ConstInt,
                      GS: ConstBool, SX: ConstBool, I0: ConstInt, CH: ConstInt, THD: ConstBool, GA: ConstBool,
                      ONE: ConstBool, LT: ConstBool):
    """Block (r, u): token tiles I0 + r*NTB + j (j < NTB; ONE: tile 0 only) of unit u (module doc); the
    gates unit's sums go to partial row I0 + r."""
    r, u, NT, ntl, nj = b1._dpre_block(mqk, TT, NTB, ONE)
    HK2 = 2 * HK
    if u < HK2:
        wt = b1._wtile(wqk, u, DK, WW)
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                if u < HK:
                    _qk_tile(mqk, (mqk1, mqk2, mqk3), wt, seq, sst, gq4, dpqk, eps, i, u, u, NT, R, RP, W, DK, TT,
                             CH, THD, GA, LT, GS, SX)
                else:
                    _qk_tile(mqk, (mqk1, mqk2, mqk3), wt, seq, sst, gk4, dpqk, eps, i, u, u - HK, NT, R, RP, W, DK,
                             TT, CH, THD, GA, LT, GS, SX)
    elif u < HK2 + HV:
        h = u - HK2
        wt = b1._wtile(wv, h, DV, WW)
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                _v_tile(mv, (mv1, mv2, mv3), wt, seq, sst, gv, dpv, i, h, NT, W, DV, TT, CH, THD, GA, LT, SX)
    elif u < HK2 + HV + HV // HBZ:
        h = u - HK2 - HV
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                b1.z_tile(gz, dz, i, h, TT, HBZ, DV, LT)
    else:
        nA, dtb = b1.gate_consts(A_log, dt_bias, HVP)
        sA = ct.zeros((1, HVP), dtype=ct.float32)
        sD = ct.zeros((1, HVP), dtype=ct.float32)
        for j in range(nj):
            i = I0 + r * NTB + j
            if i < ntl:
                a, d = b1.gate_tile(mba, gg, gbeta, dba, nA, dtb, i, TT, HVP, LT)
                sA = sA + a
                sD = sD + d
        b1.gate_store(pg, I0 + r, sA, sD, HVP)


def _look(dp, sh, rows, en, inner, i, u, NT, s: ConstInt, C: ConstInt, TB: ConstInt, W: ConstInt, LB: ConstBool):
    """[TB, C] fp32 dpre[t + s] of head u, zero where t + s is past t's sequence (masks only when not
    ``inner``) or s >= W."""
    if s < W:
        a = b1._ahead(dp, sh, rows, i, u, NT, s, C, TB, True, LB)
        if not inner:
            a = ct.where(ct.reshape(rows + s < en, (TB, 1)), a, 0.0)
        return a
    return ct.zeros((TB, C), dtype=ct.float32)


def _pad(p, z, s: ConstInt, W: ConstInt, DWA: ConstBool):
    """Partial of weight column W-1-s plus the [TB, C] products z (DWA: per token, else summed)."""
    if s < W:
        if DWA:
            return p + z
        return p + ct.sum(z, axis=0, keepdims=True)
    return p


def _acc(p, a, x, s: ConstInt, W: ConstInt, DWA: ConstBool):
    """Partial of weight column W-1-s plus this tile's products a * x."""
    if s < W:
        return _pad(p, a * x, s, W, DWA)
    return p


def _pads(p, a, rows, st, TB: ConstInt, W: ConstInt, DWA: ConstBool):
    """The products dconv_w[:, W-1-s] takes from the zero padding before a sequence start: dpre[st + k] * 0
    for k < s, formed at the start's row (a[k] = dpre[st + k], zero past the sequence end). Each is 0 unless
    dpre is NaN or infinite; the reference forms them, so a non-finite gradient there reaches every tap."""
    isst = ct.reshape(rows == st, (TB, 1))
    zero = ct.reshape((rows - st).astype(ct.float32), (TB, 1))  # 0 at a start: a runtime zero, not folded
    z0 = ct.where(isst, a[0] * zero, 0.0)
    z1 = z0 + ct.where(isst, a[1] * zero, 0.0)
    z2 = z1 + ct.where(isst, a[2] * zero, 0.0)
    return (p[0], _pad(p[1], z0, 1, W, DWA), _pad(p[2], z1, 2, W, DWA), _pad(p[3], z2, 3, W, DWA))


def _dxw(dp, sh, src, w3, seq, sst, sen, dst, pw, r, u, NT, C: ConstInt, TB: ConstInt, NTX: ConstInt, W: ConstInt,
         WW: ConstInt, CH: ConstInt, THD: ConstBool, LB: ConstBool, DWA: ConstBool, DX: ConstBool, PW: ConstBool):
    """Token tiles r*NTX .. r*NTX+NTX-1 of head u: dx -> dst (DX), the block's dconv_weight partial -> pw
    row r (PW), the padding products (``_pads``) included in tiles that hold a sequence start."""
    wt = b1._wtile(w3, u, C, WW)
    PR = TB if DWA else 1
    p = (ct.zeros((PR, C), dtype=ct.float32), ct.zeros((PR, C), dtype=ct.float32),
         ct.zeros((PR, C), dtype=ct.float32), ct.zeros((PR, C), dtype=ct.float32))
    for j in range(NTX):
        i = r * NTX + j
        t0 = i * TB
        if t0 < NT:
            rows = t0 + ct.arange(TB, dtype=ct.int32)
            if THD:  # precomputed by gdn_pre_bwd_seq (rows past NT: 0, so they are masked)
                en = ct.load(sen, index=(i,), shape=(TB,), padding_mode=PAD_ZERO, allow_tma=False)
            else:
                en = seq_end(seq, rows, t0, TB, W, CH, THD)
            inner = ct.min(en - rows) >= W
            a = (_look(dp, sh, rows, en, inner, i, u, NT, 0, C, TB, W, LB),
                 _look(dp, sh, rows, en, inner, i, u, NT, 1, C, TB, W, LB),
                 _look(dp, sh, rows, en, inner, i, u, NT, 2, C, TB, W, LB),
                 _look(dp, sh, rows, en, inner, i, u, NT, 3, C, TB, W, LB))
            if DX:
                dx = a[0] * b1._wtap(wt, W - 1, C)
                if W > 1:
                    dx = dx + a[1] * b1._wtap(wt, W - 2, C)
                if W > 2:
                    dx = dx + a[2] * b1._wtap(wt, W - 3, C)
                if W > 3:
                    dx = dx + a[3] * b1._wtap(wt, W - 4, C)
                ct.store(dst, index=(i, u, 0), tile=ct.reshape(dx, (TB, 1, C)).astype(dst.dtype), allow_tma=False)
            if PW:
                x = ct.reshape(ct.load(src, index=(i, u, 0), shape=(TB, 1, C), padding_mode=PAD_ZERO, allow_tma=LB),
                               (TB, C)).astype(ct.float32)
                p = (_acc(p[0], a[0], x, 0, W, DWA), _acc(p[1], a[1], x, 1, W, DWA), _acc(p[2], a[2], x, 2, W, DWA),
                     _acc(p[3], a[3], x, 3, W, DWA))
                st = b1._starts(seq, sst, rows, i, t0, TB, W, CH, THD)
                if ct.min(rows - st) == 0:
                    p = _pads(p, a, rows, st, TB, W, DWA)
    if PW:
        ct.store(pw, index=(r, u, 0, 0), tile=b1._pfinal(b1._pxt(p, C, W, WW), C, WW, True), allow_tma=False)


@ct.kernel
def gdn_pre_bwd2_dx(dpqk, dpqk1, dpqk2, dpqk3, dpv, dpv1, dpv2, dpv3, mqk, mv, seq, sst, sen, wqk, wv, dqk, dvv, pwqk,
                    pwv, HK: ConstInt, W: ConstInt, DK: ConstInt, DV: ConstInt, TB: ConstInt, NTX: ConstInt,
                    WW: ConstInt, CH: ConstInt, THD: ConstBool, LB: ConstBool, DWA: ConstBool, DX: ConstBool,
                    PW: ConstBool):
    """Block (r, u): dx (DX) and the dconv_weight partial (PW) of NTX token tiles, q/k head u < 2*HK or
    v head u - 2*HK (module doc)."""
    r = ct.bid(0)
    u = ct.bid(1)
    NT = dpqk.shape[0]
    if u < 2 * HK:
        _dxw(dpqk, (dpqk1, dpqk2, dpqk3), mqk, wqk, seq, sst, sen, dqk, pwqk, r, u, NT, DK, TB, NTX, W, WW, CH, THD, LB,
             DWA, DX, PW)
    else:
        _dxw(dpv, (dpv1, dpv2, dpv3), mv, wv, seq, sst, sen, dvv, pwv, r, u - 2 * HK, NT, DV, TB, NTX, W, WW, CH, THD,
             LB, DWA, DX, PW)


# ------------------------------------------------------------------ launches


def bwd2_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                  dmixed, dconv_weight, dA_log, ddt_bias, Hk: int = 16, dk: int = 128, dv: int = 128,
                  repeat_qk: bool = True, eps: float = 1e-6, cfg: PreGatedBwd2Cfg | None = None) -> list[Launch]:
    """The launches (argument order as the registry's bwd kernel; module doc): [THD sequence bounds],
    dpre tile 0 (taps gathered), dpre tiles 1.., dx + dconv_weight partials, reduction. Scratch (dpre
    [NT, C], partials [P, C, WW] and [P', 2, HVP], THD bounds) from the per-stream workspace cache."""
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    cfg = bwd2_cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg)
    TT, TB = cfg.TT, cfg.TB
    NT = mixed.numel() // mixed.shape[-1]
    rows_main = cdiv(cdiv(NT, TT) - 1, cfg.NTB)
    Pw = cdiv(cdiv(NT, TB), cfg.NTX)
    (mqk, mv, mba, wqk, wv, dqk, dvv, dz, dba, seq, thd, sst, sen, dpqk, dpv, pw, pwqk, pwv, pg, grads) = \
        b1.bwd_operands(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, cu_seqlens, dmixed, Hk, dk, dv, cfg, Pw,
                        1 + rows_main)
    C = conv_weight.shape[0]
    units = 2 * Hk + Hv + Hv // cfg.HBZ + 1
    sx = cfg.SX and dmixed.element_size() == 2
    args = (mqk, *shifted(mqk, TT), mv, *shifted(mv, TT), mba, seq, sst, wqk, wv, A_log, dt_bias, *grads,
            dz, dba, dpqk, dpv, pg, float(eps), Hk, Hv, cfg.R, cfg.RP, W, cfg.DK, cfg.DV, cfg.HVP, cfg.WW,
            TT, cfg.NTB, cfg.HBZ, cfg.GS, sx)
    out = []
    if thd:
        out.append(Launch(b1.gdn_pre_bwd_seq, (cdiv(NT, cfg.PT), 1, 1), (seq, sst, sen, W, cfg.CH, cfg.PT), cfg, ()))
    out.append(Launch(gdn_pre_bwd2_dpre, (1, units, 1), args + (0, cfg.CH, thd, True, True, cfg.LT), cfg,
                      occ(cfg.OCC_A)))
    out.append(Launch(gdn_pre_bwd2_dpre, (rows_main, units, 1), args + (1, cfg.CH, thd, False, False, cfg.LT), cfg,
                      occ(cfg.OCC_A)))
    dxa = (dpqk, *shifted(dpqk, 0), dpv, *shifted(dpv, 0), mqk, mv, seq, sst, sen, wqk, wv, dqk, dvv, pwqk, pwv, Hk, W,
           cfg.DK, cfg.DV)
    if cfg.SPLIT:  # dx alone (the first design's dx kernel, TBX tokens a block), then the partials alone
        out.append(Launch(b1.gdn_pre_bwd_dx, (cdiv(NT, cfg.TBX), 2 * Hk + Hv, 1),
                          (dpqk, *shifted(dpqk, 0), dpv, *shifted(dpv, 0), seq, sen, wqk, wv, dqk, dvv, Hk, W, cfg.DK,
                           cfg.DV, cfg.TBX, cfg.WW, cfg.CH, thd, True, cfg.LB), cfg, occ(cfg.OCC_X)))
    out.append(Launch(gdn_pre_bwd2_dx, (Pw, 2 * Hk + Hv, 1),
                      dxa + (TB, cfg.NTX, cfg.WW, cfg.CH, thd, cfg.LB, cfg.DWA, not cfg.SPLIT, True), cfg,
                      occ(cfg.OCC_B)))
    ncb = cdiv(C, cfg.BC)
    out.append(Launch(b1.gdn_pre_bwd_red, (ncb + 1, 1, 1), (pw, pg, dconv_weight, dA_log, ddt_bias, ncb, cfg.BC,
                                                             cfg.WW, cfg.HVP, cfg.TG), cfg, ()))
    return out
