"""cuTile kernels for gdn_pre_gated: the fused pre-gated prep, forward (one kernel, two launches)
and the backward (``cutile_pre_gated_bwd``, its own launch config).

What the forward computes (specs/gdn.py, ``PRE_GATED``; ``reference.pre_gated`` is the truth):
y = silu(causal depthwise conv (width W) over the tokens of mixed's q|k|v channels), never
reading across a sequence boundary (zero history); q, k = l2norm over dk of their heads of y,
optionally repeated to Hv heads (repeat_interleave: value head h reads key head h // R,
R = Hv/Hk); v = its slice of y; z = its slice of mixed; beta = sigmoid(b);
g = -exp(A_log) * softplus(a + dt_bias); optionally the final conv state [N, C, W-1] (the
last W-1 conv inputs of each sequence, oldest first, zero-padded). fp32 math, every output
rounded once to its dtype.

Layout: BSHD mixed [B, T, D] is seen as packed tokens [B*T, D] (NT = B*T); THD mixed is
[NT, D] with cu_seqlens [N+1] int32 on the GPU. The kernels get strided views (no copies,
contiguous last dim) of mixed's sections: q|k as [NT, 2*Hk, dk], v and z as [NT, Hv, dv],
b|a as [NT, 2, Hv]; outputs q, k [NT, Hk, R, dk] (R = Hq/Hk: the repeats of a key head are
adjacent), v, z [NT, Hv, dv], g, beta [NT, Hv]; the conv weight as [2*Hk, dk, W] and
[Hv, dv, W]; the conv state as [N, 2*Hk, dk, W-1] and [N, Hv, dv, W-1]. dk, dv, W, R are
padded to powers of two in registers (zero-padded loads, stores drop the padding), so any
dk, dv >= 1, W >= 1 work.

Forward: one kernel, two launches, each a 1-D grid of blocks b = row * units + u (units
fastest, meant to have the blocks running at once read whole rows of mixed; not yet shown to
help: at FT16 HB2 occ4 a 2-D tile-fastest grid of the same kernel measured 1.23 ms BSHD, this
order 1.41 ms, two runs apart), units = 2*Hk/HB + Hv/HBV + Hv/HBZ + 1. Block (row, u) owns a token tile i (FT packed
tokens, which may span sequences) and unit u: a group of HB q or k heads (whole heads, so the l2norm over dk stays in
the block; HB divides Hk, so a group never straddles q and k), a group of HBV v heads, a group of HBZ z
heads (copy), or the gates (all Hv of b and a). Tiles are [FT, heads, c]: each token's group
is one contiguous run of mixed's row; the R repeats of q/k go out as R strided stores.
  main launch (rows = tiles 1 .. cdiv(NT, FT)-1): tap s of the conv reads rows t - s as one
    tile-aligned load, tile i-1 of the view mixed[FT - s:] (one view per s <= WMAX-1, passed
    as kernel arguments);
  head launch (rows = tile 0, then N conv-state rows, then THD sequence-start rows): tile 0
    gathers its tap rows (``load_advanced_indexing``, no TMA). Kept out of the main launch
    because a gather's layout conversion costs ~17 KB of shared memory per tap site in every
    block of the kernel it is compiled into; widths W > WMAX run the head launch over every
    tile (no main launch).
The re-reads of a row hit L1/L2, so DRAM sees mixed about once. Stores go straight from
registers (``allow_tma=False``: the first forward's TMA-staged stores took ~50 KB of shared
memory a block, one staging buffer per store site). A token's taps are masked by its sequence
start st[t] = max{cu_j <= t} (BSHD: (t // T) * T): tap s is read iff t - s >= st[t]. THD: the
head launch scans cu_seqlens (chunks of CH entries, only those holding a boundary near the
rows do work; no host sync) for tile 0 and for every token (stt [NT] int32, PT tokens a block);
the main launch loads its tile's [FT] starts in one load instead of scanning in every block
(that scan, serialized chunk loads per block, cost the first forward ~0.5 ms at 116
sequences). With return_conv_state, block (1 + n, u) of the head launch copies the last W-1
rows of sequence n of head group u (rows before the sequence's start as zeros).

Measured on the H200 (Qwen3-Next shapes, bf16, 32768 tokens; triton do_bench median;
benchmarks/gdn_pre_check.py --sweep): the first forward ([16 tokens x one head] blocks, a 2-D
tile-fastest grid, TMA-staged stores, a cu_seqlens scan per block; in git history at 93c235f as
benchmarks/probes/gdn_pre_fwd_v0.py) 1.64 / 1.90 ms BSHD / THD with repeat_qk (1.89 GB ideal:
27% / 23% of the 4.27 TB/s copy ceiling); this one, at the default config (FT16 HB1 HBZ4,
occupancy 8), 0.93 / 0.96 ms (47.5% / 46%). ncu of that main launch (BSHD): 924 us, DRAM 42%
of peak but SM issue 67% busy (10.8 cycles between a warp's instructions at 8 warps a scheduler):
issue-bound (~75 instructions a conv element, from issue rate x time), the IEEE divide of the SiLU (FCHK + slow-path
CALL) the largest single item. Now: TMA tile loads (LT, fewer address/bounds instructions), the
SiLU with the APPROX exp and reciprocal, no per-tap masks on tiles inside one sequence: main
launch 683 us under the same ncu settings (DRAM 57%, SM 66%; ~65% of copy for its share of the
bytes). End to end (do_bench, 46e1d99): 0.695 / 0.656 / 0.723 / 0.694 ms BSHD rep / norep / THD rep
/ norep (63.7 / 57.9 / 61.2 / 54.7% of copy); FT32 OCC4 (session 6) 0.608 / 0.575 / 0.666 / 0.632.
ncu of FT32 OCC4 (session 7, the JIT's build: 256 threads, 64 registers, 56 KB smem a block): BSHD main
launch 594 us, DRAM 65%, L2 76% (the W tap tiles are W TMA reads of the same rows from L2), issue 64%
of cycles, achieved occupancy 32% of 50%; head launch 13 us. THD: head launch 21 us (the sequence
starts), main launch 638 us: its tiles wait for their starts' load before the tap loads issue (the
unmasked-tile branch). Switches of session 7 (PreGatedCfg.heuristic has the numbers): SX, the SiLU
through one MUFU tanh (16-bit outputs), 6-16% faster in all four cases; MA, per-tap masks on every
THD tile (no branch) and OCCH 2 for the head launch, THD 3.5-4%; not yet the default (heuristic). Taps as plain
L1 loads (no TMA) ran 1.7-2x slower; a FT64 OCC2 tiling 1.3x slower. bwd: ``cutile_pre_gated_bwd``.

Configs refused (PreGatedCfg.__post_init__, ``hang_risk``): TMA stores (ST) or a num_worker_warps hint
(NW) with conv tiles of >= HANG_CONV_EL elements never finished on the H200 (the kernel spins; a hung
kernel stalls every process on the GPU), found by benchmarks/probes/gdn_pre_fwd_hang.py.

Backend limits (for the spec's cutile Backend entry): SM 9.0 / 10.x; mixed bf16 or fp32;
conv_weight bf16 or fp32; A_log, dt_bias fp32 (no float64: the torch backend covers
reference mode); int32 indexing (every tensor < 2**31 elements). Compile key: PreGatedCfg
(from Hk, Hv, dk, dv, W, repeat_qk only) + dtypes + THD + STATE; NT, B, T, N are dynamic.
Importing this module needs ``cuda.tile`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ
from tilekernels._glue import kernel, on_device
from tilekernels.gdn.ops import pre_gated_fwd_runner

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
APPROX = ct.RoundingMode.APPROX

BIG = 2 ** 31 - 1
WMAX = 4  # conv widths up to this read their taps through shifted views (kernel arguments)


# ------------------------------------------------------------------ device helpers (shared with the bwd)


def _cu_chunk(seq, c, S, CH: ConstInt):
    """Chunk c of cu_seqlens [S] as ([CH] int32 with BIG past the end, its min, its max over
    the live entries): the step of seq_start's and seq_end's scans."""
    live = (c * CH + ct.arange(CH, dtype=ct.int32)) < S
    cu = ct.where(live, ct.load(seq, index=(c,), shape=(CH,), padding_mode=PAD_ZERO), BIG)
    return cu, ct.min(cu), ct.max(ct.where(live, cu, -1))


def seq_start(seq, rows, t0, TT: ConstInt, W: ConstInt, CH: ConstInt, THD: ConstBool):
    """[TT] int32: the packed index where each row's sequence starts, exact where it is
    within W-1 rows of the row (further back only "<= t - W + 1" is guaranteed, which is all
    the conv's masks need). BSHD: seq is mixed [B, T, D]; THD: seq is cu_seqlens [S]."""
    if THD:
        S = seq.shape[0]
        st = ct.zeros((TT,), dtype=ct.int32)  # cu_0 = 0 is always a start
        r2 = ct.reshape(rows, (TT, 1))
        for c in range(ct.cdiv(S, CH)):
            cu, lo, hi = _cu_chunk(seq, c, S, CH)
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
            cu, lo, hi = _cu_chunk(seq, c, S, CH)
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


def gate_tiles(mba, A_log, dt_bias, i, TT: ConstInt, HVP: ConstInt, LT: ConstBool = True):
    """(b, a + dt_bias, -exp(A_log)) of token tile i, [TT, HVP] / [1, HVP] fp32 (LT: loads may use TMA)."""
    b = ct.reshape(ct.load(mba, index=(i, 0, 0), shape=(TT, 1, HVP), padding_mode=PAD_ZERO, allow_tma=LT),
                   (TT, HVP))
    a = ct.reshape(ct.load(mba, index=(i, 1, 0), shape=(TT, 1, HVP), padding_mode=PAD_ZERO, allow_tma=LT),
                   (TT, HVP))
    al = ct.reshape(ct.load(A_log, index=(0,), shape=(HVP,), padding_mode=PAD_ZERO, allow_tma=LT), (1, HVP))
    dtb = ct.reshape(ct.load(dt_bias, index=(0,), shape=(HVP,), padding_mode=PAD_ZERO, allow_tma=LT), (1, HVP))
    return b.astype(ct.float32), a.astype(ct.float32) + dtb.astype(ct.float32), -ct.exp(al.astype(ct.float32))


def softplus(x):
    """torch's softplus (threshold 20: above it x passes through), log1p(e^x) without a log1p.

    Under x = -3 (e = e^x < 0.05) log1p(e) is its series to e^5 (relative error < e^5 / 6 < 6e-8):
    log(1 + e) there lost e's low bits in 1 + e (relative error ~6e-8 / e: 2e-4 at x = -8, all of
    it from x = -17 on, where 1 + e == 1 and g came out 0). From -3 up, log(1 + e) >= 0.048.
    A NaN x comes out NaN whichever way the compares treat NaN (a clamp ``min(x, 20)`` in the
    other branch had turned a NaN into 20 on the H200); exp's inf above 20 is selected away."""
    e = ct.exp(x)
    series = e * (1.0 - e * (0.5 - e * (1.0 / 3.0 - e * (0.25 - e * 0.2))))
    return ct.where(x > 20.0, x, ct.where(x < -3.0, series, ct.log(1.0 + e)))


# ------------------------------------------------------------------ forward kernel (head-group tiles)


def _gweight(w3, u, HB: ConstInt, C: ConstInt, WW: ConstInt):
    """[HB, C, WW] fp32 taps of heads u*HB .. u*HB+HB-1 of w3 [heads, c, W] (padding 0)."""
    return ct.load(w3, index=(u, 0, 0), shape=(HB, C, WW), padding_mode=PAD_ZERO, allow_tma=False).astype(ct.float32)


def _gtap(wt, j: ConstInt, HB: ConstInt, C: ConstInt):
    """Tap j of a [HB, C, WW] weight tile as [1, HB, C]."""
    return ct.reshape(ct.extract(wt, (0, 0, j), shape=(HB, C, 1)), (1, HB, C))


def _grows(src, sh, rows, i, u, NT, s: ConstInt, HB: ConstInt, C: ConstInt, TT: ConstInt, GA: ConstBool,
           LT: ConstBool, UC: ConstBool = False):
    """[TT, HB, C] fp32: rows t - s of head group u (heads u*HB ..) for the tile's rows t (unmasked;
    rows before 0 read 0). Tap 0 is tile i of src; tap s > 0 is tile i-1 of the view sh[s-1] =
    src[TT - s:] (i > 0), or, in a gathering launch (GA: token tile 0, widths W > WMAX), the rows
    gathered one by one. UC: the tile lies inside every array (no bounds checks)."""
    if s == 0:
        t = ct.load(src, index=(i, u, 0), shape=(TT, HB, C), padding_mode=PAD_ZERO, allow_tma=LT, check_bounds=not UC)
    elif GA:
        rc = ct.minimum(ct.maximum(rows - s, 0), NT - 1)
        t = ct.load_advanced_indexing(src, (rc, ct.Slice(u * HB, HB), ct.Slice(0, C)), padding_mode=PAD_ZERO,
                                      allow_tma=False)
    else:
        t = ct.load(sh[s - 1], index=(i - 1, u, 0), shape=(TT, HB, C), padding_mode=PAD_ZERO, allow_tma=LT,
                    check_bounds=not UC)
    return t.astype(ct.float32)


def _silu(x, SX: ConstBool = False):
    """x * sigmoid(x) with the MUFU exp and reciprocal (APPROX: ~2 ulp each, far under the fp32
    tolerance; the IEEE divide's Newton steps and slow-path checks cost more issue slots than the
    conv itself -- the forward is issue-bound, ncu: SM 67% vs DRAM 42% at f502f3e). SX (16-bit outputs
    only; fwd_launch never sets it for fp32): h + h * tanh(h), h = x/2, with the MUFU tanh.approx (one
    MUFU op and 3 instructions a element instead of 2 and 5). tanh.approx's error (~2^-11 of |tanh|, so
    at most ~2^-11 |h| on the output) sits under bf16's own rounding (2^-8 relative) for every element
    but those near silu's zero (x << 0), whose absolute error is as small: the norm-wise error stays
    ~1e-4 (H200, Qwen3-Next, 32768 tokens: 9.7e-5 against 1.6e-5 with exp + rcp; bf16 bound 1e-2)."""
    if SX:
        h = 0.5 * x
        return h + h * ct.tanh(h, rounding_mode=APPROX)
    return x * ct.truediv(1.0, 1.0 + ct.exp(-x, rounding_mode=APPROX), rounding_mode=APPROX)


def _gconv(src, sh, wt, rows, st, i, u, NT, HB: ConstInt, C: ConstInt, TT: ConstInt, W: ConstInt,
           GA: ConstBool, LT: ConstBool, UC: ConstBool = False, MA: ConstBool = False, SX: ConstBool = False):
    """[TT, HB, C] fp32 silu(conv(x)) of head group u: sum_s w[:, W-1-s] * x[t-s] over the taps at
    or after the row's sequence start st[t], then the SiLU. A tile whose rows all have their W-1
    predecessors in their own sequence (every tile but those at a sequence start) skips the
    per-element masks (one select a tap and element fewer)."""
    pre = ct.zeros((TT, HB, C), dtype=ct.float32)
    if GA or MA:  # MA (THD): masks on every tile, no branch: the tap loads need not wait for st's load
        inner = False
    else:
        inner = ct.min(rows - st) >= W - 1
    if inner:
        for s in ct.static_iter(range(W)):
            pre = pre + _grows(src, sh, rows, i, u, NT, s, HB, C, TT, GA, LT, UC) * _gtap(wt, W - 1 - s, HB, C)
    else:
        for s in ct.static_iter(range(W)):
            ok = ct.reshape(rows - s >= st, (TT, 1, 1))
            pre = pre + ct.where(ok, _grows(src, sh, rows, i, u, NT, s, HB, C, TT, GA, LT, UC), 0.0) * \
                _gtap(wt, W - 1 - s, HB, C)
    return _silu(pre, SX)


def _gstate(seq, src, cs, n, u, NT, HB: ConstInt, C: ConstInt, W: ConstInt, WP: ConstInt, THD: ConstBool):
    """Final conv state of sequence n, head group u of src [NT, heads, c] into cs [N, heads, c, W-1]:
    the sequence's last W-1 conv inputs, oldest first, rows before its start as zeros."""
    if THD:
        start = ct.load(seq, index=(n,), shape=())
        end = ct.load(seq, index=(n + 1,), shape=())
    else:
        start = n * seq.shape[1]
        end = start + seq.shape[1]
    j = ct.arange(WP, dtype=ct.int32)
    rows = end - (W - 1) + j
    ok = ct.reshape((rows >= start) & (j < W - 1), (WP, 1, 1))
    x = ct.load_advanced_indexing(src, (ct.minimum(ct.maximum(rows, 0), NT - 1), ct.Slice(u * HB, HB),
                                        ct.Slice(0, C)), padding_mode=PAD_ZERO, allow_tma=False)
    x = ct.where(ok, x, ct.zeros((WP, HB, C), dtype=x.dtype))
    ct.store(cs, index=(n, u, 0, 0), tile=ct.reshape(ct.permute(x, (1, 2, 0)), (1, HB, C, WP)), allow_tma=False)


def _fwd_tile(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mz, mba, seq, stt, wqk, wv, A_log, dt_bias, q4, k4, v,
              z, g, beta, eps, i, u, NT, HK: ConstInt, HV: ConstInt, R: ConstInt, W: ConstInt, DK: ConstInt,
              DV: ConstInt, HVP: ConstInt, TT: ConstInt, HB: ConstInt, HBV: ConstInt, HBZ: ConstInt, WW: ConstInt,
              CH: ConstInt, THD: ConstBool, GA: ConstBool, LT: ConstBool, ST: ConstBool, UC: ConstBool,
              ZC: ConstInt, MA: ConstBool = False, SX: ConstBool = False):
    """Unit u of token tile i (gdn_pre_fwd's doc). UC: the tile lies inside every array, so its tile
    loads and stores skip the bounds checks (only with unpadded dk, dv, Hv). ZC: z heads copied per
    load/store pair (a z unit's HBZ heads in HBZ / ZC steps: fewer z blocks, registers of ZC heads)."""
    NQ = HK // HB
    NQK = 2 * NQ
    NV = HV // HBV
    NZ = HV // HBZ
    t0 = i * TT
    rows = t0 + ct.arange(TT, dtype=ct.int32)
    if u < NQK + NV:
        if THD and not GA:  # the head launch wrote every token's sequence start
            st = ct.load(stt, index=(i,), shape=(TT,), padding_mode=PAD_ZERO, allow_tma=False, check_bounds=not UC)
        else:
            st = seq_start(seq, rows, t0, TT, W, CH, THD)
        if u < NQK:  # q or k heads: conv, silu, l2norm over dk, the R repeats
            y = _gconv(mqk, (mqk1, mqk2, mqk3), _gweight(wqk, u, HB, DK, WW), rows, st, i, u, NT, HB, DK, TT,
                       W, GA, LT, UC, MA, SX)
            y = y * ct.rsqrt(ct.sum(y * y, axis=2, keepdims=True) + eps)
            out = ct.reshape(y.astype(q4.dtype), (TT, HB, 1, DK))
            for rr in ct.static_iter(range(R)):
                if u < NQ:
                    ct.store(q4, index=(i, u, rr, 0), tile=out, allow_tma=ST, check_bounds=not UC)
                else:
                    ct.store(k4, index=(i, u - NQ, rr, 0), tile=out, allow_tma=ST, check_bounds=not UC)
        else:  # v heads: conv, silu
            h = u - NQK
            y = _gconv(mv, (mv1, mv2, mv3), _gweight(wv, h, HBV, DV, WW), rows, st, i, h, NT, HBV, DV, TT, W,
                       GA, LT, UC, MA, SX)
            ct.store(v, index=(i, h, 0), tile=y.astype(v.dtype), allow_tma=ST, check_bounds=not UC)
    elif u < NQK + NV + NZ:  # z heads: copy, ZC heads at a time
        for zz in ct.static_iter(range(HBZ // ZC)):
            h = (u - NQK - NV) * (HBZ // ZC) + zz
            ct.store(z, index=(i, h, 0), tile=ct.load(mz, index=(i, h, 0), shape=(TT, ZC, DV), padding_mode=PAD_ZERO,
                                                      allow_tma=LT, check_bounds=not UC).astype(z.dtype),
                     allow_tma=ST, check_bounds=not UC)
    else:  # gates of all Hv heads
        b, x, nA = gate_tiles(mba, A_log, dt_bias, i, TT, HVP, LT)
        ct.store(beta, index=(i, 0), tile=(1.0 / (1.0 + ct.exp(-b))).astype(beta.dtype), allow_tma=ST,
                 check_bounds=not UC)
        ct.store(g, index=(i, 0), tile=(nA * softplus(x)).astype(g.dtype), allow_tma=ST, check_bounds=not UC)


@ct.kernel
def gdn_pre_fwd(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mz, mba, seq, stt, wqk, wv, A_log, dt_bias, q4, k4, v,
                z, g, beta, cqk, cv, eps: float, HK: ConstInt, HV: ConstInt, R: ConstInt, W: ConstInt,
                DK: ConstInt, DV: ConstInt, HVP: ConstInt, TT: ConstInt, HB: ConstInt, HBV: ConstInt,
                HBZ: ConstInt, WP: ConstInt, WW: ConstInt, CH: ConstInt, PT: ConstInt, THD: ConstBool,
                STATE: ConstBool, GA: ConstBool, ONE: ConstBool, LT: ConstBool, ST: ConstBool, TF: ConstBool,
                CB: ConstBool, ZC: ConstInt, MA: ConstBool, SX: ConstBool):
    """Block b = r * NU + u (1-D grid, units fastest: blocks running together read whole rows of
    mixed): unit u (a head group of q|k, of v, of z, or the gates; module doc) of token tile
    i = r + 1 (the main launch: GA off), or, gathering taps (GA), of tile i = r < ntl (ntl = 1 with
    ONE, else every tile); past those, the conv state of sequence r - ntl (STATE), then (THD) the
    per-token sequence starts stt of PT-token chunks (read by the main launch). TF: rows fastest
    instead (b = u * rows + row). CB: tiles inside the arrays skip bounds checks (``_fwd_tile``)."""
    NT = mqk.shape[0]
    ntiles = ct.cdiv(NT, TT)
    NQ = HK // HB
    NQK = 2 * NQ
    NV = HV // HBV
    NZ = HV // HBZ
    NU = NQK + NV + NZ + 1
    if TF:
        nrow = ct.num_blocks(0) // NU
        u = ct.bid(0) // nrow
        r = ct.bid(0) % nrow
    else:
        u = ct.bid(0) % NU
        r = ct.bid(0) // NU
    if GA:
        i = r
        ntl = 1 if ONE else ntiles
    else:
        i = r + 1
        ntl = ntiles
    if i < ntl:
        if CB and not GA:  # tiles inside the arrays (all but the last): no bounds checks
            if (i + 1) * TT <= NT:
                _fwd_tile(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mz, mba, seq, stt, wqk, wv, A_log, dt_bias,
                          q4, k4, v, z, g, beta, eps, i, u, NT, HK, HV, R, W, DK, DV, HVP, TT, HB, HBV, HBZ, WW,
                          CH, THD, GA, LT, ST, True, ZC, MA, SX)
            else:
                _fwd_tile(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mz, mba, seq, stt, wqk, wv, A_log, dt_bias,
                          q4, k4, v, z, g, beta, eps, i, u, NT, HK, HV, R, W, DK, DV, HVP, TT, HB, HBV, HBZ, WW,
                          CH, THD, GA, LT, ST, False, ZC, MA, SX)
        else:
            _fwd_tile(mqk, mqk1, mqk2, mqk3, mv, mv1, mv2, mv3, mz, mba, seq, stt, wqk, wv, A_log, dt_bias,
                      q4, k4, v, z, g, beta, eps, i, u, NT, HK, HV, R, W, DK, DV, HVP, TT, HB, HBV, HBZ, WW,
                      CH, THD, GA, LT, ST, False, ZC, MA, SX)
    elif GA:  # (only the head launch has rows past its tiles)
        n = i - ntl
        ns = 0
        if STATE:
            ns = cqk.shape[0]
        if n < ns:
            if u < NQK:
                _gstate(seq, mqk, cqk, n, u, NT, HB, DK, W, WP, THD)
            elif u < NQK + NV:
                _gstate(seq, mv, cv, n, u - NQK, NT, HBV, DV, W, WP, THD)
        else:
            if THD:  # per-token sequence starts of chunk p (PT tokens)
                p = (n - ns) * NU + u
                if p * PT < NT:
                    st = seq_start(seq, p * PT + ct.arange(PT, dtype=ct.int32), p * PT, PT, W, CH, THD)
                    ct.store(stt, index=(p,), tile=st, allow_tma=False)


# ------------------------------------------------------------------ launch config


def _p2div(n: int, cap: int) -> int:
    """Largest power of two <= cap (a power of two) that divides n."""
    return math.gcd(int(n), cap)


def check_heads(Hk: int, Hv: int, W: int, who: str) -> None:
    """What every gdn_pre_gated launch config (fwd and bwd) needs of the head shape."""
    if Hv % Hk:
        raise ValueError(f"{who}: Hv={Hv} is not a multiple of Hk={Hk}")
    if W < 1:
        raise ValueError(f"{who}: conv width W={W} < 1")


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
    WP: int       # W - 1 padded to a power of two (conv-state rows)
    WW: int       # W padded to a power of two (taps in registers)
    FT: int = 16  # fwd: tokens per block (power of two, >= W)
    HB: int = 1   # fwd: q/k heads per block (a power of two dividing Hk)
    HBV: int = 1  # fwd: v heads per block (a power of two dividing Hv)
    HBZ: int = 1  # fwd: z heads per block (a power of two dividing Hv)
    LT: bool = True  # fwd: tile loads may go through TMA (fewer address/bounds instructions)
    ST: bool = False  # fwd: stores may go through TMA (staged in shared memory)
    TF: bool = False  # fwd: block order token tiles fastest (default: units fastest)
    TAPV: bool = True  # taps from tile-aligned loads of shifted views (W <= WMAX); else row gathers
    CH: int = 32   # THD: cu_seqlens entries scanned per step (only chunks near the tile do work)
    PT: int = 256  # fwd THD: tokens per block of the sequence-start precompute
    OCC: int = 0   # fwd occupancy hint (0: compiler's choice)
    NW: int = 0    # fwd num_worker_warps hint (0: compiler's choice)
    CB: bool = False  # fwd: tiles inside the arrays skip bounds checks (used only with unpadded dk, dv, Hv)
    ZC: int = 0    # fwd: z heads a copy step (a divisor of HBZ; 0: all HBZ at once)
    MA: bool = False  # fwd THD: per-tap masks on every tile (no inner-tile branch waiting on the starts' load)
    OCCH: int = 0  # fwd head launch's occupancy hint (0: OCC's)
    SX: bool = False  # fwd: the SiLU through the MUFU tanh where the outputs are 16-bit (fp32 keeps exp + rcp)

    def __post_init__(self):
        if (self.ST or self.NW) and hang_risk(self):
            raise ValueError(f"gdn_pre_gated cutile: config {self}: {hang_risk(self)}")

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool) -> "PreGatedCfg":
        check_heads(Hk, Hv, W, "gdn_pre_gated cutile")
        DK, DV = next_pow2(dk), next_pow2(dv)
        # fwd: a block owns FT tokens x a group of heads (HB q/k heads, HBV v heads, HBZ z heads),
        # ~FWD_EL elements a conv tile; stores straight from registers (no shared-memory staging).
        # Swept on the H200 (Qwen3-Next, 32768 tokens, repeat_qk, 1-D unit-fastest grid; ms BSHD / THD):
        #   FT16 HB1 HBZ4 occ8 0.931 / 0.959 (64 regs, 128 threads: 8 blocks an SM; the default)
        #   FT16 HB2 HBZ8 occ4 1.405 / 1.436, the same with TMA loads (LT) 0.981 / 1.018, occ0 1.946
        #   FT32 HB1 HBZ4 occ4 1.290 / 1.182; FT32 HB2 HBZ8 occ2 2.136; FT16 HB4 HBZ8 occ2 2.366
        # (registers bound the bytes in flight: the W tap tiles and the fp32 sum live there, so small
        # tiles at high occupancy win; the same launches at W=1, no taps, took 0.698 ms at FT16 HB2.)
        # Later sweep (BSHD, the f502f3e kernel: IEEE-divide SiLU, masks on every tap): FT16 HB1 HBZ4
        # occ8 0.933, + TMA loads (LT) 0.806 (now the default, with the APPROX SiLU and unmasked inner
        # tiles), tile-fastest order (TF) 0.932, W=1 0.604. Tried and dropped: the q/k repeats as one
        # broadcast store 1.005; two token tiles a block (a loop) 1.44 / 1.29 with LT (spills); the
        # taps as exact 0/1 row-shift MMAs of two tile loads (tensor cores, bf16 only) 1.36 at occ8
        # (spills), 1.15 occ4, 1.00 occ4 + LT, 1.51 FT32 occ2 (operand layouts cost shared memory
        # and registers, and the kernel is issue-bound, not load-bound).
        # Session 5 (46e1d99 kernel, BSHD repeat_qk): default 0.692, FT32 OCC4 0.604 (73.3% of copy),
        # ST 0.682, LT0 0.744, TF 0.795, HBZ2 1.046, FT16 HB2 HBV2 HBZ8 OCC4 0.759, and W=1 (no taps) 0.698:
        # at FT16 the taps seem not to be the limit (bytes in flight, per-block costs?). FT32 OCC4 is not
        # the default until timed in the THD and no-repeat cases too. Switches since (correct on the
        # H200 in test_fwd_launch_config_variants, not yet timed): CB (tiles inside the arrays without
        # bounds checks; its unchecked body has ~3% fewer SASS instructions), NW (num_worker_warps), ZC
        # (the z copy in ZC-head steps: fewer z blocks at the registers of ZC heads). The sm_90 SASS of the
        # main launch (static counts) hints where the issue slots go: with the compiler's own warps the tap
        # tiles come out of shared memory one bf16 at a time (256 LDS.U16 at FT16, 512 at FT32; 6.8K
        # instructions at FT32 OCC4, 128 registers); with NW8 as LDS.128 (78 of them, no LDS.U16; 3.5K
        # instructions, 62 registers): the first thing to time. Timing of all in the four cases, and the
        # tests at the winner:
        # benchmarks/probes/gdn_pre_fwd_session.sh final. (Those static counts are of the CPU's export_cubin,
        # 128 threads x 128 registers; ncu shows the device's JIT build of FT32 OCC4 at 256 x 64.)
        # Session 7 (H200, one run, ms BSHD rep / norep, THD rep / norep; benchmarks/probes/gdn_pre_fwd_final.sh):
        #   FT32 OCC4 (default)        0.608 / 0.575 / 0.666 / 0.632
        #   + MA OCCH2                 0.608 / 0.574 / 0.641 / 0.610
        #   + MA OCCH2 SX              0.572 / 0.515 / 0.559 / 0.515 (77.3 / 73.7 / 79.2 / 73.7% of copy)
        #   + MA OCCH2, conv taps as plain (L1) loads: 1.05 / 1.07 / 1.31 / 1.28 (with SX 0.93-1.20)
        # MA in BSHD (run 1) cost 0.036 ms (a select a tap and element), so MA reaches THD launches only.
        # At MA OCCH2 SX: 64 of the forward GPU tests passed in that run (0 failed; the rest cut by the
        # run's limit), memcheck / racecheck clean on four small ones; the lead's final run of session 7
        # passed the whole forward GPU test file (72) at it, and it became the default (FWD_* below):
        # 0.573 / 0.515 / 0.560 / 0.514 ms there.
        HB, HBV, HBZ = _p2div(Hk, FWD_HB), _p2div(Hv, FWD_HB), _p2div(Hv, FWD_HBZ)
        FT = max(next_pow2(W), min(128, FWD_EL // (max(HB, HBV) * max(DK, DV))))
        ZC = FWD_ZC if FWD_ZC and HBZ % FWD_ZC == 0 else 0
        R = Hv // Hk
        return cls(Hk=Hk, Hv=Hv, R=R, REP=bool(repeat_qk), W=W, DK=DK, DV=DV, HVP=next_pow2(Hv),
                   WP=next_pow2(max(W - 1, 1)), WW=next_pow2(W), FT=FT, HB=HB, HBV=HBV, HBZ=HBZ, TAPV=W <= WMAX,
                   OCC=FWD_OCC, NW=FWD_NW, CB=FWD_CB, ZC=ZC, MA=FWD_MA, OCCH=FWD_OCCH, SX=FWD_SX)


# fwd defaults (see PreGatedCfg.heuristic): q/k heads a block, z heads a block, elements a conv tile
# (FT = FWD_EL / (HB * DK) tokens), occupancy hint, num_worker_warps hint, unchecked inner tiles, z heads
# a copy step, THD masks on every tile, the head launch's occupancy hint, the tanh SiLU.
# benchmarks/probes/gdn_pre_fwd_choose.py rewrites this line to a sweep's winner.
# Session 6 (same run, ms, FT16 OCC8 -> FT32 OCC4): BSHD rep 0.691 -> 0.605, BSHD norep 0.656 -> 0.573,
# THD rep 0.722 -> 0.662 (NW8 at FT32: 0.666-0.773, slower; gdn.md). Then: THD masks on every tile, the head
# launch's occupancy, the tanh SiLU (session 7: faster in all four cases; see the heuristic).
FWD_HB, FWD_HBZ, FWD_EL, FWD_OCC, FWD_NW, FWD_CB, FWD_ZC, FWD_MA, FWD_OCCH, FWD_SX = 1, 4, 4096, 4, 0, False, 0, True, 2, True

# Conv tiles of this many elements (FT * HB * DK or FT * HBV * DV) with TMA stores (ST) or a
# num_worker_warps hint (NW) never finished on the H200 (tileiras 13.5; benchmarks/probes/
# gdn_pre_fwd_hang.py): FT16 HB4 or HBV4 at OCC2 with ST hung in the main launch, FT64 HB1 OCC2 NW8
# never finished its test; the same tiles without ST / NW, and smaller tiles with them, finish.
HANG_CONV_EL = 8192
HANG_ST_Z_EL = 8192  # TMA-stored z copies above this size never ran (FT16 HBZ4 ST did): refused too


def hang_risk(cfg) -> str:
    """Why a fwd config with TMA stores (ST) or num_worker_warps (NW) is refused ("" if it is not)."""
    conv = cfg.FT * max(cfg.HB * cfg.DK, cfg.HBV * cfg.DV)
    if conv >= HANG_CONV_EL:
        return (f"conv tiles of {conv} >= {HANG_CONV_EL} elements (FT*HB*DK, FT*HBV*DV) with TMA stores (ST) or "
                f"num_worker_warps (NW) hang on the H200 (tileiras 13.5): use smaller FT/HB/HBV, or ST=False, NW=0")
    zel = cfg.FT * (cfg.ZC or cfg.HBZ) * cfg.DV
    if cfg.ST and zel > HANG_ST_Z_EL:
        return (f"TMA-stored z copies of {zel} > {HANG_ST_Z_EL} elements (FT*HBZ*DV) are not shown to finish "
                f"on the H200: use a smaller FT/HBZ, ZC, or ST=False")
    return ""


def _cfg(Hk, Hv, dk, dv, W, repeat_qk, cfg):
    cfg = cfg or PreGatedCfg.heuristic(Hk, Hv, dk, dv, W, repeat_qk)
    ok = (cfg.Hk, cfg.Hv, cfg.W, cfg.REP) == (Hk, Hv, W, bool(repeat_qk)) and cfg.DK >= dk and cfg.DV >= dv \
        and cfg.FT >= W and Hk % cfg.HB == 0 and Hv % cfg.HBV == 0 and Hv % cfg.HBZ == 0 \
        and (cfg.ZC == 0 or cfg.HBZ % cfg.ZC == 0)
    if not ok:
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
    return on_device(cu_seqlens, mixed.device, "gdn_pre_gated (cutile): cu_seqlens"), True


def fwd_launch(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
               Hk: int = 16, dk: int = 128, dv: int = 128, repeat_qk: bool = True, eps: float = 1e-6,
               cfg: PreGatedCfg | None = None) -> list[Launch]:
    """The forward launches (argument order as the registry's fwd kernel): one kernel, launched for
    token tile 0 and the conv state (taps gathered) and for tiles 1.. (taps as tile loads)."""
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
    R = q.shape[-2] // Hk  # q, k [.., Hk * R, dk] seen as [NT, Hk, R, dk]: repeat r of key head h at [:, h, r]
    q4, k4 = q.view(NT, Hk, R, dk), k.view(NT, Hk, R, dk)
    outs = (q4, k4, v.view(NT, Hv, dv), z.view(NT, Hv, dv), g.view(NT, Hv), beta.view(NT, Hv))
    units = 2 * Hk // cfg.HB + Hv // cfg.HBV + Hv // cfg.HBZ + 1
    nt = cdiv(NT, cfg.FT)
    # THD: every token's sequence start, written by the head launch for the main launch's masks
    stt = torch.empty((NT if thd and cfg.TAPV else 0,), dtype=torch.int32, device=x.device)
    npre = cdiv(cdiv(NT, cfg.PT), units) if thd and cfg.TAPV else 0
    args = (mqk, *shifted(mqk, cfg.FT), mv, *shifted(mv, cfg.FT), mz, mba, seq, stt, wqk, wv, A_log, dt_bias, *outs,
            cqk, cv, float(eps), Hk, Hv, R, W, cfg.DK, cfg.DV, cfg.HVP, cfg.FT, cfg.HB, cfg.HBV, cfg.HBZ, cfg.WP,
            cfg.WW, cfg.CH, cfg.PT, thd, state)
    cb = cfg.CB and (cfg.DK, cfg.DV, cfg.HVP) == (dk, dv, Hv)  # padded dims: the tiles pass the arrays' ends
    tail = (cfg.LT, cfg.ST, cfg.TF, cb, cfg.ZC or cfg.HBZ, cfg.MA and thd,
            cfg.SX and q.dtype != torch.float32)
    hints = occ(cfg.OCC) + ((("num_worker_warps", cfg.NW),) if cfg.NW else ())
    if not cfg.TAPV:  # every tile gathers its taps (and scans cu_seqlens)
        return [Launch(gdn_pre_fwd, ((nt + N) * units, 1, 1), args + (True, False) + tail, cfg, hints)]
    # token tile 0, the conv state and the sequence starts: taps gathered; tiles 1..: taps as tile loads
    hh = (occ(cfg.OCCH) + tuple(h for h in hints if h[0] != "occupancy")) if cfg.OCCH else hints
    return [Launch(gdn_pre_fwd, ((1 + N + npre) * units, 1, 1), args + (True, True) + tail, cfg, hh),
            Launch(gdn_pre_fwd, ((nt - 1) * units, 1, 1), args + (False, False) + tail, cfg, hints)]


pre_gated_fwd_into = pre_gated_fwd_runner(fwd_launch)


kernel("gdn_pre_gated", "cutile", "fwd")(pre_gated_fwd_into)


def representative_launches(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                            B: int = 2, T: int = 256, dtype=torch.bfloat16, thd: bool = False,
                            repeat_qk: bool = True, state: bool = True, n_seqs: int = 5,
                            cfg: PreGatedCfg | None = None) -> dict:
    """The forward and backward launches at one problem size, on ``meta`` tensors: what the
    CI compile test exports to cubins (sm_90, sm_100) without a GPU."""
    from . import cutile_pre_gated_bwd as bw

    meta = torch.device("meta")
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    Hq = Hv if repeat_qk else Hk
    lead = (B * T,) if thd else (B, T)
    N = n_seqs if thd else B

    def e(*s, dt=dtype):
        return torch.empty(*s, dtype=dt, device=meta)

    mixed, w = e(*lead, D), e(C, W)
    A, dt = e(Hv, dt=torch.float32), e(Hv, dt=torch.float32)
    cu = e(N + 1, dt=torch.int32) if thd else None
    outs = (e(*lead, Hq, dk), e(*lead, Hq, dk), e(*lead, Hv, dv), e(*lead, Hv, dv),
            e(*lead, Hv, dt=torch.float32), e(*lead, Hv))
    cs = e(N, C, W - 1) if state else None
    fwd = fwd_launch(mixed, w, A, dt, cu, *outs, cs, Hk, dk, dv, repeat_qk, 1e-6, cfg=cfg)
    bwd = bw.bwd_launches(*outs, mixed, w, A, dt, cu, e(*lead, D), e(C, W), e(Hv, dt=torch.float32),
                          e(Hv, dt=torch.float32), Hk, dk, dv, repeat_qk, 1e-6)
    return {"gdn_pre_gated.fwd": fwd, "gdn_pre_gated.bwd": bwd}


# registers the bwd kernel (that module imports this one's helpers, so it comes last)
from . import cutile_pre_gated_bwd  # noqa: E402

BWD_MODULE = cutile_pre_gated_bwd.__name__
