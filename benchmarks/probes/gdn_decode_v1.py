"""The first gdn_decode cuTile kernel (grid (B, Hk), commit 5ca8322), kept verbatim for the
A/B in ``benchmarks/gdn_decode_check.py`` (tag ``v1``): not registered with the registry.

What one launch does (specs/gdn.py, ``DECODE``; ``reference.decode`` is the truth):
conv-state shift + depthwise conv (width W) + SiLU of the new token over q|k|v, l2norm of
q and k, key head kh = h // R for value head h (R = Hv/Hk), beta = sigmoid(b),
g = -exp(A_log) * softplus(a + dt_bias), then per value head the gated delta rule on the
state, in place: S = S*exp(g); u = beta*(v - S^T k); S = S + k u^T; o = S^T (scale*q).
Everything in fp32 registers; the state is read once and written once (fp32 or bf16,
rounded once); o is rounded once to mixed's dtype.

Grid (B, Hk): block (b, kh) owns row b's key head kh, i.e. the conv channels of q and k of
that key head, of the v channels of its R value heads, and their R states [dk, dv]. Why not
one block per (row, value head) or per dv slice: the old conv window of a key head's q/k
channels is read by every block that needs q or k, and the conv state must be shifted in
place in the same launch, so a block that shifts it while a sibling block still reads it
would hand the sibling a shifted window (a race no launch order fixes). With one owner per
(row, key head) the window is read and written by the same block, no scratch memory, no
atomics, no inter-block ordering: the launch is graph-capturable and allocates nothing.
Within the block the R*NV state tiles [DK, BV] (NV = ceil(dv / BV)) are streamed one after
the other; with PF the next tile's load is issued before the current tile is computed (a
statically unrolled loop), so two tiles are in flight.

Continuous batching: with state_indices (HAS_IDX) row b uses slot state_indices[b]; a slot
of -1 writes zeros to o's row (what the reference returns) and reads/writes no state.
Without state_indices row b uses slot b.

Layout: the kernel gets strided views of the caller's tensors (no copies), all with a
contiguous last dim: mixed's q|k as [B, 2, Hk, dk], v as [B, Hv, dv], b|a as [B, 2, Hv];
conv_state's q|k as [N, 2, Hk, dk, W-1], v as [N, Hv, dv, W-1]; conv_weight's q|k as
[2, Hk, dk, W], v as [Hv, dv, W]. dk, dv, W-1, W are padded to powers of two in registers
(zero padding on loads, stores drop the padding), so any dk, dv >= 1 and W >= 2 work.

Backend limits (for the spec's cutile Backend entry): SM 9.0 / 10.x; mixed (and so
conv_state and o) bf16 or fp32; conv_weight bf16 or fp32; A_log, dt_bias fp32; ssm_state
fp32 or bf16 (no float64: the torch backend covers reference mode); W >= 2; contiguous
tensors (as the spec asks); int32 indexing: every tensor < 2**31 elements
(N*Hv*dk*dv < 2**31: N < 4096 slots at Qwen3-Next shapes). Compile key: DecodeCfg (from
Hk, Hv, dk, dv, W only) + dtypes + HAS_IDX; B and N are dynamic array shapes.
Importing this module needs ``cuda.tile`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


# ------------------------------------------------------------------ device helpers


def _col(t, j: ConstInt, C: ConstInt):
    """Column j of a [C, X] tile as [C]."""
    return ct.reshape(ct.extract(t, (0, j), shape=(C, 1)), (C,))


def _conv_step(x, old, w, C: ConstInt, W: ConstInt, WP: ConstInt):
    """One causal-conv step of C channels.

    x [C] the new input (conv_state's dtype), old [C, WP] the last W-1 inputs oldest first
    (columns >= W-1 are padding), w [C, WW] the taps (tap W-1 is the current token).
    Returns (silu(conv) [C] fp32, new window [C, WP] in old's dtype: old shifted left by one,
    x appended at column W-2).
    """
    xf = x.astype(ct.float32)
    wf = w.astype(ct.float32)
    of = old.astype(ct.float32)
    pre = _col(of, 0, C) * _col(wf, 0, C)
    for j in ct.static_iter(range(1, W - 1)):
        pre = pre + _col(of, j, C) * _col(wf, j, C)
    pre = pre + xf * _col(wf, W - 1, C)
    y = pre / (1.0 + ct.exp(-pre))
    new = ct.zeros((C, WP), dtype=old.dtype)
    for j in ct.static_iter(range(W - 2)):
        new = ct.insert(new, (0, j), ct.extract(old, (0, j + 1), shape=(C, 1)))
    new = ct.insert(new, (0, W - 2), ct.reshape(x, (C, 1)))
    return y, new


def _qk(mqk, cqk, wqk, b, slot, kh, which: ConstInt, eps, DK: ConstInt, W: ConstInt, WP: ConstInt,
        WW: ConstInt):
    """l2-normed q (which=0) or k (which=1) of key head kh [DK] fp32 (padding 0); shifts
    that conv window in place."""
    x = ct.reshape(ct.load(mqk, index=(b, which, kh, 0), shape=(1, 1, 1, DK), padding_mode=PAD_ZERO), (DK,))
    old = ct.reshape(ct.load(cqk, index=(slot, which, kh, 0, 0), shape=(1, 1, 1, DK, WP),
                             padding_mode=PAD_ZERO), (DK, WP))
    w = ct.reshape(ct.load(wqk, index=(which, kh, 0, 0), shape=(1, 1, DK, WW), padding_mode=PAD_ZERO),
                   (DK, WW))
    y, new = _conv_step(x, old, w, DK, W, WP)
    ct.store(cqk, index=(slot, which, kh, 0, 0), tile=ct.reshape(new, (1, 1, 1, DK, WP)))
    return y * ct.rsqrt(ct.sum(y * y, axis=0, keepdims=True) + eps)


def _load_state(S, slot, h, jv, DK: ConstInt, BV: ConstInt, TMA: ConstBool):
    return ct.reshape(ct.load(S, index=(slot, h, 0, jv), shape=(1, 1, DK, BV), padding_mode=PAD_ZERO,
                              allow_tma=TMA), (DK, BV)).astype(ct.float32)


def _head_tile(St, mv, mba, cv, wv, A_log, dt_bias, S, o, b, slot, h, jv, k2, q2,
               BV: ConstInt, DK: ConstInt, W: ConstInt, WP: ConstInt, WW: ConstInt, TMA: ConstBool):
    """Value head h, columns [jv*BV, (jv+1)*BV) of row b: v's conv step, the gates, the
    delta rule on the loaded state tile St [DK, BV] fp32, stores of S, o and v's window."""
    xv = ct.reshape(ct.load(mv, index=(b, h, jv), shape=(1, 1, BV), padding_mode=PAD_ZERO), (BV,))
    oldv = ct.reshape(ct.load(cv, index=(slot, h, jv, 0), shape=(1, 1, BV, WP), padding_mode=PAD_ZERO),
                      (BV, WP))
    wvt = ct.reshape(ct.load(wv, index=(h, jv, 0), shape=(1, BV, WW), padding_mode=PAD_ZERO), (BV, WW))
    v, newv = _conv_step(xv, oldv, wvt, BV, W, WP)
    ct.store(cv, index=(slot, h, jv, 0), tile=ct.reshape(newv, (1, 1, BV, WP)))
    # gates (fp32): beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias) (torch's
    # softplus: x above 20 passes through)
    bt = ct.load(mba, index=(b, 0, h), shape=(1, 1, 1)).astype(ct.float32)
    at = ct.load(mba, index=(b, 1, h), shape=(1, 1, 1)).astype(ct.float32)
    al = ct.load(A_log, index=(h,), shape=(1,)).astype(ct.float32)
    dtb = ct.load(dt_bias, index=(h,), shape=(1,)).astype(ct.float32)
    beta = ct.reshape(1.0 / (1.0 + ct.exp(-bt)), (1, 1))
    xa = ct.reshape(at, (1, 1)) + ct.reshape(dtb, (1, 1))
    sp = ct.where(xa > 20.0, xa, ct.log(1.0 + ct.exp(ct.minimum(xa, 20.0))))
    decay = ct.exp(-ct.exp(ct.reshape(al, (1, 1))) * sp)
    # delta rule on the tile
    St = St * decay
    kS = ct.sum(St * k2, axis=0, keepdims=True)                  # [1, BV] = (S^T k) slice
    u = beta * (ct.reshape(v, (1, BV)) - kS)
    St = St + k2 * u
    ov = ct.sum(St * q2, axis=0)                                 # [BV] = (S^T scale q) slice
    ct.store(S, index=(slot, h, 0, jv), tile=ct.reshape(St, (1, 1, DK, BV)).astype(S.dtype), allow_tma=TMA)
    ct.store(o, index=(b, h, jv), tile=ct.reshape(ov, (1, 1, BV)).astype(o.dtype))


@ct.kernel
def gdn_decode_fwd(mqk, mv, mba, cqk, cv, wqk, wv, A_log, dt_bias, S, idx, o, eps: float, scale: float,
                   R: ConstInt, W: ConstInt, DK: ConstInt, BV: ConstInt, NV: ConstInt, WP: ConstInt,
                   WW: ConstInt, PF: ConstBool, TMA: ConstBool, HAS_IDX: ConstBool):
    """Block (b, kh): row b, key head kh, its R value heads (see the module doc)."""
    b = ct.bid(0)
    kh = ct.bid(1)
    NT = R * NV
    if HAS_IDX:
        slot = ct.load(idx, index=(b,), shape=())
    else:
        slot = b
    if slot >= 0:
        q = _qk(mqk, cqk, wqk, b, slot, kh, 0, eps, DK, W, WP, WW)
        k = _qk(mqk, cqk, wqk, b, slot, kh, 1, eps, DK, W, WP, WW)
        k2 = ct.reshape(k, (DK, 1))
        q2 = ct.reshape(q * scale, (DK, 1))
        if PF:  # unrolled; tile t+1's load is issued before tile t is computed
            nxt = _load_state(S, slot, kh * R, 0, DK, BV, TMA)
            for t in ct.static_iter(range(NT)):
                cur = nxt
                if t + 1 < NT:
                    nxt = _load_state(S, slot, kh * R + (t + 1) // NV, (t + 1) % NV, DK, BV, TMA)
                _head_tile(cur, mv, mba, cv, wv, A_log, dt_bias, S, o, b, slot, kh * R + t // NV, t % NV,
                           k2, q2, BV, DK, W, WP, WW, TMA)
        else:
            for t in range(NT):
                h = kh * R + t // NV
                jv = t % NV
                _head_tile(_load_state(S, slot, h, jv, DK, BV, TMA), mv, mba, cv, wv, A_log, dt_bias, S, o,
                           b, slot, h, jv, k2, q2, BV, DK, W, WP, WW, TMA)
    else:  # padded row: o = 0, no state touched
        for t in range(NT):
            ct.store(o, index=(b, kh * R + t // NV, t % NV), tile=ct.zeros((1, 1, BV), dtype=o.dtype))


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class DecodeCfg:
    """Launch config = compile key (with the argument dtypes and HAS_IDX)."""
    R: int        # value heads per key head (Hv // Hk)
    W: int        # conv width
    DK: int       # dk padded to a power of two
    BV: int       # state columns per tile (power of two)
    NV: int       # tiles along dv: ceil(dv / BV)
    WP: int       # W - 1 padded to a power of two (conv window in registers)
    WW: int       # W padded to a power of two (conv taps in registers)
    PF: bool      # unrolled loop, next state tile prefetched
    TMA: bool = True  # state tiles may move through TMA (False: plain loads/stores to registers)
    OCC: int = 0  # occupancy hint (0: compiler's choice)

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int) -> "DecodeCfg":
        if W < 2:
            raise ValueError(f"gdn_decode cutile: conv width W={W} < 2 is not supported")
        if Hv % Hk:
            raise ValueError(f"gdn_decode cutile: Hv={Hv} is not a multiple of Hk={Hk}")
        DK, DV = next_pow2(dk), next_pow2(dv)
        # ~8K fp32 state elements (32 KiB) per tile. Compiled for sm_90 at Qwen3-Next shapes
        # (tileiras 13.5), occupancy 2 gives 256 threads, 128 registers, no local memory and
        # ~90 KB shared memory (2 blocks per SM, so one block's prologue overlaps the other's
        # stream); without the hint the compiler takes ~205 KB (one block per SM).
        # PF off: on the H200 (Qwen3-Next shapes, fp32 state, graph-replayed) the prefetching
        # unrolled loop took 599 us at B=256 against 446 us without it, and 19.9 vs 19.3 us at
        # B=1 (benchmarks/results/gdn.md).
        BV = min(DV, max(16, 8192 // DK))
        NV = cdiv(dv, BV)
        R = Hv // Hk
        return cls(R=R, W=W, DK=DK, BV=BV, NV=NV, WP=next_pow2(W - 1), WW=next_pow2(W),
                   PF=False, OCC=2)

    def with_tile(self, dv: int, BV: int, **changes) -> "DecodeCfg":
        """The same problem at another BV (sweeps): NV follows."""
        return dataclasses.replace(self, BV=BV, NV=cdiv(dv, BV), **changes)


def _views(mixed, conv_state, conv_weight, Hk: int, Hv: int, dk: int, dv: int):
    """Strided views (no copies) of the sections the kernel reads (see the module doc)."""
    B, N, W = mixed.shape[0], conv_state.shape[0], conv_weight.shape[1]
    QK, V = 2 * Hk * dk, Hv * dv
    mqk = mixed[:, :QK].view(B, 2, Hk, dk)
    mv = mixed[:, QK:QK + V].view(B, Hv, dv)
    mba = mixed[:, QK + 2 * V:].view(B, 2, Hv)
    cqk = conv_state[:, :QK].view(N, 2, Hk, dk, W - 1)
    cv = conv_state[:, QK:].view(N, Hv, dv, W - 1)
    wqk = conv_weight[:QK].view(2, Hk, dk, W)
    wv = conv_weight[QK:].view(Hv, dv, W)
    return mqk, mv, mba, cqk, cv, wqk, wv


def decode_launch(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o,
                  Hk: int = 16, eps: float = 1e-6, scale: float | None = None,
                  cfg: DecodeCfg | None = None) -> Launch:
    """The one launch of a decode step (argument order as the registry's fwd kernel)."""
    B = mixed.shape[0]
    _, Hv, dk, dv = ssm_state.shape
    W = conv_weight.shape[1]
    cfg = cfg or DecodeCfg.heuristic(Hk, Hv, dk, dv, W)
    if cfg.R * Hk != Hv or cfg.W != W or cfg.DK < dk or cfg.BV * cfg.NV < dv:
        raise ValueError(f"gdn_decode cutile: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, "
                         f"dv={dv}, W={W}")
    scale = float(dk ** -0.5 if scale is None else scale)
    mqk, mv, mba, cqk, cv, wqk, wv = _views(mixed, conv_state, conv_weight, Hk, Hv, dk, dv)
    has_idx = state_indices is not None
    # without state_indices the load is dead code; A_log stands in for the argument
    idx = state_indices if has_idx else A_log
    return Launch(gdn_decode_fwd, (B, Hk, 1),
                  (mqk, mv, mba, cqk, cv, wqk, wv, A_log, dt_bias, ssm_state, idx, o, float(eps), scale,
                   cfg.R, cfg.W, cfg.DK, cfg.BV, cfg.NV, cfg.WP, cfg.WW, cfg.PF, cfg.TMA, has_idx),
                  cfg, occ(cfg.OCC))


def decode_into(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o,
                Hk: int, eps: float, scale: float | None):
    """gdn_decode fwd, destination-passing (the registry's kernel signature: inputs, outputs,
    params in spec order). o [B, Hv, dv] is written; conv_state and ssm_state in place."""
    if mixed.shape[0] == 0:
        return
    decode_launch(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o,
                  Hk, eps, scale).run()


# (not registered: the registry's kernel is tilekernels/gdn/cutile_decode.py)


def representative_launches(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                            B: int = 256, N: int = 256, dtype=torch.bfloat16, state_dtype=torch.float32,
                            with_indices: bool = True, cfg: DecodeCfg | None = None) -> dict:
    """The launch at one problem size, on ``meta`` tensors: what the CI compile test exports
    to cubins (sm_90, sm_100) without a GPU."""
    meta = torch.device("meta")
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    mixed = torch.empty(B, D, dtype=dtype, device=meta)
    conv = torch.empty(N, C, W - 1, dtype=dtype, device=meta)
    w = torch.empty(C, W, dtype=dtype, device=meta)
    A = torch.empty(Hv, dtype=torch.float32, device=meta)
    dt = torch.empty(Hv, dtype=torch.float32, device=meta)
    S = torch.empty(N, Hv, dk, dv, dtype=state_dtype, device=meta)
    idx = torch.empty(B, dtype=torch.int32, device=meta) if with_indices else None
    o = torch.empty(B, Hv, dv, dtype=dtype, device=meta)
    return {"gdn_decode.fwd": [decode_launch(mixed, conv, w, A, dt, S, idx, o, Hk, 1e-6, None, cfg=cfg)]}
