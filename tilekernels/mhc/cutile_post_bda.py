"""cuTile kernels for mhc_h_post_bda (fwd + bwd).

out[t,i,c] = sum_j h_res[t,i,j] * residual[t,j,c] + h_post[t,i] * (x[t,c] + bias[c])

h_res [T, n, n] and h_post [T, n] bf16/fp32; residual [T, n, C], x [T, C]
bf16 or fp32 (same dtype) and bias [C] in x's dtype, optional; all
contiguous; fp32 accumulation. n is padded to NP = next_pow2(n) in
registers, C tails are masked.

fwd: grid (T/TT, CSPLIT), block (b, s) does C tiles s, s+CSPLIT, ... (CSPLIT=1:
     one block per token tile streams all of C).
bwd (deterministic; no atomics), n <= 4: one streaming pass, mhc_pb_bwd_one, grid
     (G, C chunks of KC tiles of TC_D): block (g, s) walks token tiles g, g+G, ... over
     its chunk, reads dout, residual and x once, writes dresidual and dx, sums dx into
     its fp32 dbias partial, and writes dh partials (each over TC_D / PW adjacent
     channels of the chunk, so no block-wide reduction); mhc_pb_dh_reduce and
     mhc_pb_dbias sum the partials in a fixed order, as programmatic dependent launches
     (each waits for the kernel before it first); the dh partials are summed as flat
     [chunks, rows, PW] and dbias over 16 x 256 tiles, the fastest layouts measured.
     n = 8 (and ONE=False): two streaming kernels. mhc_pb_bwd_dres, grid (G, C/TC_D):
     block (g, c) walks token tiles g, g+G, ... at one C tile, writes dresidual and
     dx and one fp32 dbias partial per token group; mhc_pb_bwd_dh, grid (T/TT_H,):
     one block per token tile streams all of C and writes dh_res and dh_post from
     fp32 register accumulators. Tried and dropped as slower: one fused kernel with
     tensor-core dh partials (cuTile 1.7 lowers such small mma without tensor cores),
     the dh kernel also writing dresidual / dx, one-pass tiles under 1024 channels.
Measured times and the sweeps behind these choices: benchmarks/results/nvidia-h200-mhc-cutile.md.
"""
from __future__ import annotations

import dataclasses
import functools

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
def mhc_pb_bwd_one(dout, hres, hpost, res, x, bias, dres, dx, p_bias, p_dhr, p_dhp,
                   NP: ConstInt, TT: ConstInt, TC: ConstInt, KC: ConstInt, KCP: ConstInt, PW: ConstInt,
                   HAS_BIAS: ConstBool):
    """The whole backward in one streaming pass (dout, residual, x read once). Block (g, s)
    walks token tiles g, g+G, ... over the KC C tiles of chunk s (unrolled): writes dres and
    dx, accumulates dout * residual and dout * (x + bias) elementwise over the chunk and
    reduces them once per token tile into chunk s's dh partials p_dhr [chunks, T, n, n],
    p_dhp [chunks, T, n]; sums dx over its tokens into its dbias partial p_bias[g, chunk]."""
    g = ct.bid(0)
    s = ct.bid(1)
    ntt = ct.num_tiles(dx, axis=0, shape=(TT, TC))
    kid = ct.reshape(ct.arange(KCP, dtype=ct.int32), (KCP, 1))  # KCP = next_pow2(KC)
    dbias = ct.zeros((KCP, TC), dtype=ct.float32)
    for t in range(g, ntt, ct.num_blocks(0)):
        hr = ct.load(hres, index=(t, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
        hp = ct.reshape(ct.load(hpost, index=(t, 0), shape=(TT, NP), padding_mode=PAD_ZERO).astype(ct.float32),
                        (TT, NP, 1))
        ah = ct.zeros((TT, NP, NP, TC), dtype=ct.float32)
        ap = ct.zeros((TT, NP, TC), dtype=ct.float32)
        for k in ct.static_iter(range(KC)):
            c = s * KC + k
            go = ct.load(dout, index=(t, 0, c), shape=(TT, NP, TC), padding_mode=PAD_ZERO).astype(ct.float32)
            gx = ct.sum(hp * go, axis=1)
            ct.store(dx, index=(t, c), tile=gx.astype(dx.dtype))
            ct.store(dres, index=(t, 0, c), tile=_dres_rows(hr, go, NP, TT, TC).astype(dres.dtype))
            r = ct.load(res, index=(t, 0, c), shape=(TT, NP, TC), padding_mode=PAD_ZERO).astype(ct.float32)
            xb = ct.load(x, index=(t, c), shape=(TT, TC), padding_mode=PAD_ZERO).astype(ct.float32)
            if HAS_BIAS:
                xb = xb + ct.reshape(ct.load(bias, index=(c,), shape=(TC,), padding_mode=PAD_ZERO)
                                     .astype(ct.float32), (1, TC))
                dbias = dbias + ct.where(kid == k, ct.sum(gx, axis=0, keepdims=True), 0.0)
            ah = ah + ct.reshape(go, (TT, NP, 1, TC)) * ct.reshape(r, (TT, 1, NP, TC))
            ap = ap + go * ct.reshape(xb, (TT, 1, TC))
        # reduced over runs of TC / PW adjacent channels only (one warp's share: no block-wide
        # reduction); the PW partials are summed by mhc_pb_dh_reduce
        ct.store(p_dhr, index=(s, t, 0, 0, 0), tile=ct.reshape(
            ct.sum(ct.reshape(ah, (TT, NP, NP, PW, TC // PW)), axis=4), (1, TT, NP, NP, PW)))
        ct.store(p_dhp, index=(s, t, 0, 0), tile=ct.reshape(
            ct.sum(ct.reshape(ap, (TT, NP, PW, TC // PW)), axis=3), (1, TT, NP, PW)))
    if HAS_BIAS:
        for k in ct.static_iter(range(KC)):
            ct.store(p_bias, index=(g, s * KC + k), tile=ct.extract(dbias, (k, 0), shape=(1, TC)))


def _sum_parts(p, out, b, TR: ConstInt, PW: ConstInt, NCH: ConstInt):
    """out[b*TR : (b+1)*TR] = sum over k < NCH (in order), then over the PW partials, of
    p [NCH, rows, PW] (the NCH loads unrolled: all in flight at once)."""
    acc = ct.zeros((1, TR, PW), dtype=ct.float32)
    for k in ct.static_iter(range(NCH)):
        acc += ct.load(p, index=(k, b, 0), shape=(1, TR, PW), padding_mode=PAD_ZERO)
    ct.store(out, index=(b,), tile=ct.reshape(ct.sum(acc, axis=2), (TR,)).astype(out.dtype))


@ct.kernel
def mhc_pb_dh_reduce(p_dhr, p_dhp, dhres, dhpost, TR: ConstInt, PW: ConstInt, NCH: ConstInt, PDL: ConstBool):
    """dh_res, dh_post (flat: [T*n*n], [T*n]) = sums of the one-pass backward's chunk partials
    p_dhr [chunks, T*n*n, PW], p_dhp [chunks, T*n, PW] (fixed order). The first blocks do
    dh_res, the rest dh_post, TR outputs each."""
    if PDL:  # launched while the kernel before finishes: its writes are visible after this
        ct.grid_dependency_control_wait()
    b = ct.bid(0)
    nbr = ct.num_tiles(dhres, axis=0, shape=(TR,))
    if b < nbr:
        _sum_parts(p_dhr, dhres, b, TR, PW, NCH)
    else:
        _sum_parts(p_dhp, dhpost, b - nbr, TR, PW, NCH)


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
def mhc_pb_dbias(p_bias, dbias, RB: ConstInt, TB: ConstInt, PDL: ConstBool):
    """dbias[c] = sum over the token groups of the fp32 partials p_bias [groups, >= C] (fixed
    order: group g into row g % RB of an accumulator, those RB rows summed at the end)."""
    if PDL:
        ct.grid_dependency_control_wait()
    cb = ct.bid(0)
    ab = ct.zeros((RB, TB), dtype=ct.float32)
    for gi in range(ct.num_tiles(p_bias, axis=0, shape=(RB, TB))):
        ab += ct.load(p_bias, index=(gi, cb), shape=(RB, TB), padding_mode=PAD_ZERO)
    ct.store(dbias, index=(cb,), tile=ct.sum(ab, axis=0).astype(dbias.dtype))


@ct.kernel
def mhc_pb_h32(hres, hpost, hres32, hpost32, NP: ConstInt, TT: ConstInt):
    """h_res, h_post -> fp32 copies (bf16 h: the streaming kernels run faster on fp32 h)."""
    t = ct.bid(0)
    ct.store(hres32, index=(t, 0, 0), tile=ct.load(hres, index=(t, 0, 0), shape=(TT, NP, NP),
                                                    padding_mode=PAD_ZERO).astype(ct.float32))
    ct.store(hpost32, index=(t, 0), tile=ct.load(hpost, index=(t, 0), shape=(TT, NP),
                                                 padding_mode=PAD_ZERO).astype(ct.float32))


def _h32(h_res, h_post, cfg, force: bool = False) -> tuple:
    """([staging launch] or [], h_res, h_post as the streaming kernels read them)."""
    if not (cfg.H32 or force) or (h_res.dtype == torch.float32 and h_post.dtype == torch.float32):
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
    TT_D: int      # bwd dres/dx kernel (or the one-pass kernel): tokens per tile
    TC_D: int      # bwd dres/dx kernel (or the one-pass kernel): channels per tile
    G: int         # bwd dres/dx / one-pass kernel: token-tile groups (grid only; one dbias partial each)
    TT_H: int      # bwd dh kernel: tokens per tile
    TC_H: int      # bwd dh kernel: channels per tile
    OCC: int = 0   # occupancy hints (0: compiler's choice): fwd, dres/dx, dh
    OCC_D: int = 0
    OCC_H: int = 0
    TB: int = 256   # dbias reduction: channels per block (x RB token groups per load)
    RB: int = 16
    ROWS: bool = True  # dres/dx kernel: h_res rows as loaded (False: a transposed load)
    H32: bool = True   # bf16 h: stage fp32 copies of h_res / h_post first (mhc_pb_h32)
    ONE: bool = False  # bwd in one streaming pass (mhc_pb_bwd_one with TT_D, TC_D, G, OCC_D and KC)
    KC: int = 2        # one-pass bwd: C tiles per block (dh reduced once per KC tiles)
    TR: int = 1024     # one-pass dh partial reduction: outputs (token x entry) per block
    PW: int = 8        # one-pass: dh partials per C tile (each sums TC_D / PW adjacent channels)
    PDL: bool = True   # the partial reductions as programmatic dependent launches

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, T: int, n: int, C: int, one: bool | None = None) -> "PostBdaCfg":
        """one: force the one-pass (True) or two-pass (False) backward; None: by n."""
        # The fastest configs of the H200 sweeps at T=32768, n=4, C=7168 (numbers in
        # benchmarks/results/nvidia-h200-mhc-cutile.md): fwd at 2x1024. bwd in one pass for
        # n <= 4: one token x 1024 channels per tile, two C tiles per block before the dh
        # reduction (with four, registers spill), G=128, dh partials per 128 channels (PW=8).
        # n = 8 would need 64K fp32 dh accumulators per 1024-channel tile: two passes, dres/dx
        # at 4x1024, h_res in row form at occupancy 2; dh at 4x128 (NP*NP*TT*TC = 8K fp32
        # accumulators), occupancy 2.
        NP = next_pow2(n)
        TC = min(1024, next_pow2(C))
        TT = max(1, min(16, 8192 // (NP * TC)))
        TC_H = min(128, next_pow2(C))
        one = NP <= 4 if one is None else one
        return cls(NP=NP, TT=TT, TC=TC, CSPLIT=1,
                   TT_D=1 if one else max(1, min(16, 16384 // (NP * TC))), TC_D=TC, G=128 if one else 64,
                   TT_H=max(1, min(16, 8192 // (NP * NP * TC_H))), TC_H=TC_H, OCC=4, OCC_D=2, OCC_H=2,
                   TB=min(256, next_pow2(C)), ROWS=True, ONE=one, KC=2, PW=8 if TC >= 8 else 1)


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
    # the one-pass kernel always reads fp32 h: reading bf16 h tiles of one token ([1, 4, 4] bf16,
    # 32 bytes) it gave wrong gradients on the H200 (max rel. error 0.6 over the five at T=32768, n=4)
    stage, h_res, h_post = _h32(h_res, h_post, cfg, force=cfg.ONE)
    ng = min(cfg.G, cdiv(T, cfg.TT_D))
    dev = x.device
    if cfg.ONE:
        if cfg.PW not in (1, 8) or cfg.TC_D % cfg.PW:
            # PW=16 gave wrong dh_post (rel. error 1e-2..4e-2) on the H200 with cuTile 1.7 at
            # n=4, C >= 4096, for a reason not found; 1 and 8 pass every GPU test
            raise ValueError(f"mhc_h_post_bda cutile bwd: PW must be 1 or 8 and divide TC_D, got PW={cfg.PW}, "
                             f"TC_D={cfg.TC_D}")
        nch = cdiv(C, cfg.TC_D * cfg.KC)
        p_bias = torch.empty((ng, nch * cfg.KC * cfg.TC_D) if has_bias else (1, 1), dtype=torch.float32, device=dev)
        # dh partials per C chunk (every element written before it is read)
        p_dhr = torch.empty((nch, T, n, n, cfg.PW), dtype=torch.float32, device=dev)
        p_dhp = torch.empty((nch, T, n, cfg.PW), dtype=torch.float32, device=dev)
        out = stage + [Launch(mhc_pb_bwd_one, (ng, nch),
                              (dout, h_res, h_post, residual, x, bias if has_bias else x, dresidual, dx, p_bias,
                               p_dhr, p_dhp, cfg.NP, cfg.TT_D, cfg.TC_D, cfg.KC, next_pow2(cfg.KC), cfg.PW,
                               has_bias), cfg, occ(cfg.OCC_D)),
                       Launch(mhc_pb_dh_reduce, (cdiv(T * n * n, cfg.TR) + cdiv(T * n, cfg.TR),),
                              (p_dhr.view(nch, T * n * n, cfg.PW), p_dhp.view(nch, T * n, cfg.PW),
                               dh_res.view(T * n * n), dh_post.view(T * n), cfg.TR, cfg.PW, nch, cfg.PDL),
                              cfg, pdl=cfg.PDL)]
    else:
        # fp32 dbias partials, one row per token group (every element written before it is read)
        p_bias = torch.empty((ng, C) if has_bias else (1, 1), dtype=torch.float32, device=dev)
        out = stage + [Launch(mhc_pb_bwd_dres, (ng, cdiv(C, cfg.TC_D)),
                              (dout, h_res, h_post, dresidual, dx, p_bias, cfg.NP, cfg.TT_D, cfg.TC_D, has_bias,
                               cfg.ROWS), cfg, occ(cfg.OCC_D)),
                       Launch(mhc_pb_bwd_dh, (cdiv(T, cfg.TT_H),),
                              (dout, residual, x, bias if has_bias else x, dh_res, dh_post,
                               cfg.NP, cfg.TT_H, cfg.TC_H, has_bias), cfg, occ(cfg.OCC_H))]
    if has_bias:
        out.append(Launch(mhc_pb_dbias, (cdiv(C, cfg.TB),), (p_bias, dbias, cfg.RB, cfg.TB, cfg.PDL), cfg,
                          pdl=cfg.PDL))
    return out
