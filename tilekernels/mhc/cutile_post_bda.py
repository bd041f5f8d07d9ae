"""cuTile kernels for mhc_h_post_bda (fwd + bwd).

out[t,i,c] = sum_j h_res[t,i,j] * residual[t,j,c] + h_post[t,i] * (x[t,c] + bias[c])

h_res [T, n, n] and h_post [T, n] bf16/fp32; residual [T, n, C], x [T, C]
bf16 or fp32 (same dtype) and bias [C] in x's dtype, optional; all
contiguous; fp32 accumulation. n is padded to NP = next_pow2(n) in
registers, C tails are masked.

fwd: grid (T/TT, CSPLIT), block (b, s) does C tiles s, s+CSPLIT, ... (CSPLIT=1:
     one block per token tile streams all of C; H200: 1.05 ms, 94% of copy).
bwd: two streaming kernels (deterministic; no atomics) and a small reduction.
     mhc_pb_bwd_dres, grid (G, C/TC_D): block (g, c) walks token tiles g, g+G, ...
     at one C tile, writes dresidual and dx, and sums dx over its tokens into one
     fp32 dbias partial per token group; mhc_pb_bwd_dh, grid (T/TT_H,): one block
     per token tile streams all of C (like the h_aggregate bwd) and writes dh_res
     and dh_post from fp32 register accumulators; mhc_pb_dbias sums the dbias
     partials in a fixed order. H200 (T=32768, n=4, C=7168): 2.27 ms (2.41 = 1.26
     dres/dx + 1.14 dh + 0.01 before the row-form h_res at occupancy 2); was 5.7 ms
     fused in one kernel with tensor-core dh partials; a one-pass variant (the dh
     kernel also writing dresidual and dx) measured 5.4-7.9 ms.
"""
from __future__ import annotations

import dataclasses

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def mhc_pb_fwd(hres, res, hpost, x, bias, out,
               NP: ConstInt, TT: ConstInt, TC: ConstInt, HAS_BIAS: ConstBool):
    pid = ct.bid(0)
    nct = ct.num_tiles(x, axis=1, shape=(TT, TC))
    hr = ct.load(hres, index=(pid, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    hp = ct.load(hpost, index=(pid, 0), shape=(TT, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    hp = ct.reshape(hp, (TT, NP, 1))
    for j in range(ct.bid(1), nct, ct.num_blocks(1)):
        r = ct.load(res, index=(pid, 0, j), shape=(TT, NP, TC), padding_mode=PAD_ZERO).astype(ct.float32)
        xb = ct.load(x, index=(pid, j), shape=(TT, TC), padding_mode=PAD_ZERO).astype(ct.float32)
        if HAS_BIAS:
            b = ct.load(bias, index=(j,), shape=(TC,), padding_mode=PAD_ZERO).astype(ct.float32)
            xb = xb + ct.reshape(b, (1, TC))
        acc = hp * ct.reshape(xb, (TT, 1, TC))
        for k in ct.static_iter(range(NP)):
            acc = acc + ct.extract(hr, (0, 0, k), shape=(TT, NP, 1)) * \
                ct.extract(r, (0, k, 0), shape=(TT, 1, TC))
        ct.store(out, index=(pid, 0, j), tile=acc.astype(out.dtype))


def _load_hres_t(hres, t, NP: ConstInt, TT: ConstInt):
    """h_res tile transposed: [t, j, i] = h_res[t, i, j] (fp32)."""
    return ct.load(hres, index=(t, 0, 0), shape=(TT, NP, NP), order=(0, 2, 1),
                   padding_mode=PAD_ZERO).astype(ct.float32)


def _dres(hrt, go, NP: ConstInt, TT: ConstInt, TC: ConstInt):
    """dres[t,j,c] = sum_i h_res[t,i,j] dout[t,i,c] (fp32), from the transposed h_res."""
    gr = ct.zeros((TT, NP, TC), dtype=ct.float32)
    for i in ct.static_iter(range(NP)):
        gr = gr + ct.extract(hrt, (0, 0, i), shape=(TT, NP, 1)) * ct.extract(go, (0, i, 0), shape=(TT, 1, TC))
    return gr


def _dres_rows(hr, go, NP: ConstInt, TT: ConstInt, TC: ConstInt):
    """The same from h_res as stored: row i of h_res, [TT, 1, NP] reshaped to [TT, NP, 1],
    is the coefficient column of dout's stream i (no transposed load)."""
    gr = ct.zeros((TT, NP, TC), dtype=ct.float32)
    for i in ct.static_iter(range(NP)):
        hi = ct.reshape(ct.extract(hr, (0, i, 0), shape=(TT, 1, NP)), (TT, NP, 1))
        gr = gr + hi * ct.extract(go, (0, i, 0), shape=(TT, 1, TC))
    return gr


@ct.kernel
def mhc_pb_bwd_dres(dout, hres, hpost, dres, dx, p_bias, NP: ConstInt, TT: ConstInt, TC: ConstInt,
                    HAS_BIAS: ConstBool, ROWS: ConstBool):
    """dres, dx; one fp32 dbias partial per token group (block (g, c) walks token tiles g, g+G, ...)."""
    g = ct.bid(0)
    c = ct.bid(1)
    ntt = ct.num_tiles(dx, axis=0, shape=(TT, TC))
    dbias = ct.zeros((1, TC), dtype=ct.float32)
    for t in range(g, ntt, ct.num_blocks(0)):
        go = ct.load(dout, index=(t, 0, c), shape=(TT, NP, TC), padding_mode=PAD_ZERO).astype(ct.float32)
        hp = ct.load(hpost, index=(t, 0), shape=(TT, NP), padding_mode=PAD_ZERO).astype(ct.float32)
        gx = ct.sum(ct.reshape(hp, (TT, NP, 1)) * go, axis=1)
        ct.store(dx, index=(t, c), tile=gx.astype(dx.dtype))
        if HAS_BIAS:
            dbias = dbias + ct.sum(gx, axis=0, keepdims=True)
        if ROWS:
            hr = ct.load(hres, index=(t, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
            gr = _dres_rows(hr, go, NP, TT, TC)
        else:
            gr = _dres(_load_hres_t(hres, t, NP, TT), go, NP, TT, TC)
        ct.store(dres, index=(t, 0, c), tile=gr.astype(dres.dtype))
    if HAS_BIAS:
        ct.store(p_bias, index=(g, c), tile=dbias)


@ct.kernel
def mhc_pb_bwd_dh(dout, res, x, bias, dhres, dhpost, NP: ConstInt, TT: ConstInt, TC: ConstInt,
                  HAS_BIAS: ConstBool):
    """dh_res, dh_post of TT tokens: one block streams all of C into elementwise fp32
    accumulators, reduced over C once at the end (no cross-block reduction)."""
    pid = ct.bid(0)
    nct = ct.num_tiles(x, axis=1, shape=(TT, TC))
    ah = ct.zeros((TT, NP, NP, TC), dtype=ct.float32)
    ap = ct.zeros((TT, NP, TC), dtype=ct.float32)
    for j in range(nct):
        go = ct.load(dout, index=(pid, 0, j), shape=(TT, NP, TC), padding_mode=PAD_ZERO).astype(ct.float32)
        r = ct.load(res, index=(pid, 0, j), shape=(TT, NP, TC), padding_mode=PAD_ZERO).astype(ct.float32)
        xb = ct.load(x, index=(pid, j), shape=(TT, TC), padding_mode=PAD_ZERO).astype(ct.float32)
        if HAS_BIAS:
            xb = xb + ct.reshape(ct.load(bias, index=(j,), shape=(TC,), padding_mode=PAD_ZERO)
                                 .astype(ct.float32), (1, TC))
        ah = ah + ct.reshape(go, (TT, NP, 1, TC)) * ct.reshape(r, (TT, 1, NP, TC))
        ap = ap + go * ct.reshape(xb, (TT, 1, TC))
    ct.store(dhres, index=(pid, 0, 0), tile=ct.sum(ah, axis=3).astype(dhres.dtype))
    ct.store(dhpost, index=(pid, 0), tile=ct.sum(ap, axis=2).astype(dhpost.dtype))


@ct.kernel
def mhc_pb_dbias(p_bias, dbias, TB: ConstInt):
    """dbias[c] = sum over the token groups of the fp32 partials (fixed order)."""
    cb = ct.bid(0)
    ab = ct.zeros((1, TB), dtype=ct.float32)
    for gi in range(p_bias.shape[0]):
        ab += ct.load(p_bias, index=(gi, cb), shape=(1, TB), padding_mode=PAD_ZERO)
    ct.store(dbias, index=(cb,), tile=ct.reshape(ab, (TB,)).astype(dbias.dtype))


@ct.kernel
def mhc_pb_h32(hres, hpost, hres32, hpost32, NP: ConstInt, TT: ConstInt):
    """h_res, h_post -> fp32 copies (bf16 h: the streaming kernels run faster on fp32 h)."""
    t = ct.bid(0)
    ct.store(hres32, index=(t, 0, 0), tile=ct.load(hres, index=(t, 0, 0), shape=(TT, NP, NP),
                                                    padding_mode=PAD_ZERO).astype(ct.float32))
    ct.store(hpost32, index=(t, 0), tile=ct.load(hpost, index=(t, 0), shape=(TT, NP),
                                                 padding_mode=PAD_ZERO).astype(ct.float32))


def _h32(h_res, h_post, cfg) -> tuple:
    """([staging launch] or [], h_res, h_post as the streaming kernels read them)."""
    if not cfg.H32 or (h_res.dtype == torch.float32 and h_post.dtype == torch.float32):
        return [], h_res, h_post
    T = h_res.shape[0]
    r32 = torch.empty(h_res.shape, dtype=torch.float32, device=h_res.device)
    p32 = torch.empty(h_post.shape, dtype=torch.float32, device=h_post.device)
    return [Launch(mhc_pb_h32, (cdiv(T, 256),), (h_res, h_post, r32, p32, cfg.NP, 256), cfg)], r32, p32


@dataclasses.dataclass(frozen=True)
class PostBdaCfg:
    """Launch config = compile key (with the dtypes and HAS_BIAS)."""
    NP: int        # n padded to a power of two
    TT: int        # fwd: tokens per tile
    TC: int        # fwd: channels per tile
    CSPLIT: int    # fwd: blocks along C, each strides over C tiles (grid only)
    TT_D: int      # bwd dres/dx kernel: tokens per tile
    TC_D: int      # bwd dres/dx kernel: channels per tile
    G: int         # bwd dres/dx kernel: token-tile groups (grid only; one dbias partial each)
    TT_H: int      # bwd dh kernel: tokens per tile
    TC_H: int      # bwd dh kernel: channels per tile
    OCC: int = 0   # occupancy hints (0: compiler's choice): fwd, dres/dx, dh
    OCC_D: int = 0
    OCC_H: int = 0
    TB: int = 1024  # dbias reduction: channels per block
    ROWS: bool = True  # dres/dx kernel: h_res rows as loaded (False: a transposed load)
    H32: bool = True   # bf16 h: stage fp32 copies of h_res / h_post first (mhc_pb_h32)

    @classmethod
    def heuristic(cls, T: int, n: int, C: int) -> "PostBdaCfg":
        # H200, T=32768, n=4, C=7168: fwd at 2x1024, dres/dx at 4x1024 (2x1024: 1.60 ms,
        # 4x1024: 1.26 ms, 2x512: 3x slower); dh at 4x128 (NP*NP*TT*TC = 8K fp32
        # accumulators), occupancy 2. dres/dx reads h_res in row form at occupancy 2
        # (bwd 2.41 -> 2.27 ms with fp32 h, 2.96 -> 2.52 with bf16 h); occupancy hints with
        # the transposed h_res load once gave NaN dresidual for bf16 h.
        NP = next_pow2(n)
        TC = min(1024, next_pow2(C))
        TT = max(1, min(16, 8192 // (NP * TC)))
        TC_H = min(128, next_pow2(C))
        return cls(NP=NP, TT=TT, TC=TC, CSPLIT=1,
                   TT_D=max(1, min(16, 16384 // (NP * TC))), TC_D=TC, G=64,
                   TT_H=max(1, min(16, 8192 // (NP * NP * TC_H))), TC_H=TC_H, OCC=4, OCC_D=2, OCC_H=2,
                   TB=min(1024, next_pow2(C)), ROWS=True)


def fwd_launches(h_res, residual, h_post, x, bias, out, cfg: PostBdaCfg | None = None) -> list[Launch]:
    T, n, C = residual.shape
    cfg = cfg or PostBdaCfg.heuristic(T, n, C)
    has_bias = bias is not None
    stage, h_res, h_post = _h32(h_res, h_post, cfg)
    return stage + [Launch(mhc_pb_fwd, (cdiv(T, cfg.TT), min(cfg.CSPLIT, cdiv(C, cfg.TC))),
                           (h_res, residual, h_post, x, bias if has_bias else x, out,
                            cfg.NP, cfg.TT, cfg.TC, has_bias), cfg, occ(cfg.OCC))]


def bwd_launches(dout, h_res, residual, h_post, x, bias, dh_res, dresidual, dh_post, dx, dbias,
                 cfg: PostBdaCfg | None = None) -> list[Launch]:
    T, n, C = residual.shape
    cfg = cfg or PostBdaCfg.heuristic(T, n, C)
    has_bias = bias is not None
    stage, h_res, h_post = _h32(h_res, h_post, cfg)
    ng = min(cfg.G, cdiv(T, cfg.TT_D))
    # fp32 dbias partials, one row per token group (every element written before it is read)
    p_bias = torch.empty((ng, C) if has_bias else (1, 1), dtype=torch.float32, device=x.device)
    out = stage + [Launch(mhc_pb_bwd_dres, (ng, cdiv(C, cfg.TC_D)),
                  (dout, h_res, h_post, dresidual, dx, p_bias, cfg.NP, cfg.TT_D, cfg.TC_D, has_bias, cfg.ROWS),
                  cfg, occ(cfg.OCC_D)),
           Launch(mhc_pb_bwd_dh, (cdiv(T, cfg.TT_H),),
                  (dout, residual, x, bias if has_bias else x, dh_res, dh_post,
                   cfg.NP, cfg.TT_H, cfg.TC_H, has_bias), cfg, occ(cfg.OCC_H))]
    if has_bias:
        out.append(Launch(mhc_pb_dbias, (cdiv(C, cfg.TB),), (p_bias, dbias, cfg.TB), cfg))
    return out
