"""cuTile kernels of mhc_post_pre's one-pass backward: d_total never leaves registers.

The gradient entering h_post_bda's backward is, per token t, stream i, channel c (fp32),
  d_total[t,i,c] = dout[t,i,c] + (dproj[t] @ weight[:, i, c]) + coef[t] * out[t,i,c]
                   + h_pre[t,i] * dlayer_in[t,c],      coef = mhc_pre's RMS term (-dr r^2 / (K rms)),
and h_post_bda's backward consumes it at once: dresidual[t,j,c] = sum_i h_res[t,i,j] d_total,
dx[t,c] = sum_i h_post[t,i] d_total, dh_res[t,i,j] = sum_c d_total[t,i,c] residual[t,j,c],
dh_post[t,i] = sum_c d_total[t,i,c] (x + bias)[t,c], dbias[c] = sum_t dx. mhc_pre's
dweight[N, i, c] = sum_t dproj[t,N] out[t,i,c].

dout, residual [T, n, C], x, dlayer_in [T, C] bf16; h_res [T, n, n], h_post [T, n] fp32 (bf16 h
is staged to fp32 first, as h_post_bda's one-pass backward); dproj [T, N], dr [T], r [T] and
h_pre transposed [n, T] fp32 (mhc_pre's bwd mix, cutile_pre); weight seen as [N, n, C] bf16.

mhc_pp_bwd_one  grid (G row groups, C chunks of KC tiles of TK channels). Block (g, s) walks
     row tiles g, g+G, ... (TM tokens: the tensor cores' M) over chunk s: per C tile it
     recomputes out from residual, x, h (the forward's arithmetic, rounded to bf16: what the
     op stored; RECOMP=False reads the saved out instead), forms d_total [TM, n, TK] in
     registers (dproj as bf16 hi + lo against the [NPAD, n*TK] weight tile on the tensor
     cores, as cutile_proj_rms.bwd_dx_tile), writes dresidual and dx, sums dx into its dbias
     partial, and reduces d_total * residual, d_total * (x + bias) over the tile's channels
     into the row tile's dh sums ([TM, n, n], [TM, n]), stored once per chunk (partials
     [chunks, T, n, n], [chunks, T, n]). DW (KC = 1): also dweight += dproj^T @ out in an fp32
     tensor-core accumulator held across the block's row tiles (one [N, n, TK] partial per row
     group); the weight tile is then loaded once per block.
mhc_pp_bwd_dw   (DW=False) dweight partials from the saved out in a pass of their own.
The partials are summed in a fixed order (cutile_post_bda.mhc_pb_dbias for dh and dbias,
cutile_proj_rms.mhc_pr_reduce for dweight): deterministic, no atomics.
mhc_pp_bwd_dxh  (DH_DX, cutile_post_pre.PostPreCfg) the other way to keep the fp32 d_total out of
     memory: the dh sums in mhc_pre's dx pass (per stream, from the fp32 d_total in registers),
     d_total stored in bf16 for h_post_bda's dresidual / dx kernel, which are bf16 results.

Ideal traffic, T=32768, n=4, C=7168, bf16 (GB; s = one [T, n, C] stream, 1.879; x = [T, C], 0.470):
  d_total design (default): dh_pre pass s + x, dx pass 4s + x (d_total written in fp32), h_post_bda
    one-pass on the fp32 d_total 4s + 2x: 18.79 (the separate ops move the same 18.79, with a bf16
    d(out) and autograd's add).
  ONE_BWD: dh_pre pass 2.35, this pass 3s + 3x = 7.05, dh partials 0.59 (TK 64), dweight from out
    s (DW_B False): 11.9 GB; DW_B: 10.6 (partials at TK 32: 1.17).
  DH_DX: dh_pre pass 2.35, dxh 4s + 2x + 0.29 = 8.75, dresidual / dx 2s + x = 4.23, partial reads
    0.29: 15.6 GB.
H200 (torch.profiler, per fwd+bwd step; session 9's benchmarks/results/h200-mhc-post-pre.txt, in git history at
78cfed9): the d_total
design's dx pass 2.32 ms and h_post_bda backward 2.64 ms; mhc_pp_bwd_one 6.67 ms (DW_B False,
16 x 64) and 8.69 (DW_B, 16 x 32); mhc_pp_bwd_dxh 5.67 ms + mhc_pb_bwd_dres 1.11. Both designs
lose (bwd 7.9 / 7.5 ms against 5.6): the per-row sums over a tile's channels (d_total times each
residual stream, d_total times x + bias) and the [16, n, TK] tile granularity that the tensor-core
terms and the registers allow run at 1.1-1.6 TB/s. Non-default (ONE_BWD / DH_DX False).
"""
from __future__ import annotations

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

from . import cutile_post_bda as pb
from . import cutile_pre as pre
from . import cutile_proj_rms as pr
from .reference import ZERO_ROW

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _w_tile(w, c, NP: ConstInt, NPAD: ConstInt, TK: ConstInt):
    """Weight columns of C tile c for every stream, [NPAD, NP * TK] (w seen as [N, n, C])."""
    return ct.reshape(ct.load(w, index=(0, 0, c), shape=(NPAD, NP, TK), padding_mode=PAD_ZERO), (NPAD, NP * TK))


@ct.kernel
def mhc_pp_bwd_one(dout, dagg, hpre_t, dproj, dr, r, w, hres, hpost, res, x, bias, out, dres, dx,
                   p_dw, p_bias, p_dhr, p_dhp, eps: float, NP: ConstInt, NPAD: ConstInt, TM: ConstInt,
                   TK: ConstInt, KC: ConstInt, KCP: ConstInt, HAS_BIAS: ConstBool, DW: ConstBool,
                   RECOMP: ConstBool, P3: ConstBool):
    """See the module doc. dout, res, out, dres [T, n, C]; x, dagg, dx [T, C]; p_dw [G, N, n, C],
    p_bias [G, >= C], p_dhr [chunks, T, n, n], p_dhp [chunks, T, n] (fp32)."""
    g = ct.bid(0)
    s = ct.bid(1)
    ntm = ct.num_tiles(dx, axis=0, shape=(TM, TK))
    kf = ct.astype(res.shape[1] * res.shape[2], ct.float32)
    ii = ct.reshape(ct.arange(NP, dtype=ct.int32), (1, NP, 1))
    kid = ct.reshape(ct.arange(KCP, dtype=ct.int32), (KCP, 1))
    dbias = ct.zeros((KCP, TK), dtype=ct.float32)
    if DW:  # KC == 1: the block's one weight tile and its dweight accumulator
        wt0 = _w_tile(w, s, NP, NPAD, TK)
        dw = ct.zeros((NPAD, NP * TK), dtype=ct.float32)
    for m in range(g, ntm, ct.num_blocks(0)):
        gp = ct.load(dproj, index=(m, 0), shape=(TM, NPAD), padding_mode=PAD_ZERO)
        hi = gp.astype(ct.bfloat16)
        rest = gp - hi.astype(ct.float32)
        lo = rest.astype(ct.bfloat16)
        lo2 = (rest - lo.astype(ct.float32)).astype(ct.bfloat16)  # the third term (used with P3)
        rr = ct.load(r, index=(m,), shape=(TM,), padding_mode=PAD_ZERO)
        gr = ct.load(dr, index=(m,), shape=(TM,), padding_mode=PAD_ZERO)
        rms = 1.0 / rr - eps
        # a zero row (reference.ZERO_ROW): 0, NaN for a NaN dr; a NaN row stays NaN
        coef = ct.reshape(ct.where(rms <= eps * ZERO_ROW, gr * 0.0, -gr * rr * rr / (kf * rms)), (TM, 1, 1))
        hr = ct.load(hres, index=(m, 0, 0), shape=(TM, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
        hp = ct.reshape(ct.load(hpost, index=(m, 0), shape=(TM, NP), padding_mode=PAD_ZERO).astype(ct.float32),
                        (TM, NP, 1))
        hq = ct.reshape(ct.transpose(ct.load(hpre_t, index=(0, m), shape=(NP, TM), padding_mode=PAD_ZERO)),
                        (TM, NP, 1))
        ah = ct.zeros((TM, NP, NP), dtype=ct.float32)
        ap = ct.zeros((TM, NP), dtype=ct.float32)
        for k in ct.static_iter(range(KC)):
            c = s * KC + k
            rt = ct.load(res, index=(m, 0, c), shape=(TM, NP, TK), padding_mode=PAD_ZERO).astype(ct.float32)
            xb = ct.load(x, index=(m, c), shape=(TM, TK), padding_mode=PAD_ZERO).astype(ct.float32)
            if HAS_BIAS:
                xb = xb + ct.reshape(ct.load(bias, index=(c,), shape=(TK,), padding_mode=PAD_ZERO)
                                     .astype(ct.float32), (1, TK))
            xb = ct.reshape(xb, (TM, 1, TK))
            if RECOMP:  # out as the forward (cutile_post_bda.mhc_pb_fwd) computed and rounded it
                o = hp * xb
                for j in ct.static_iter(range(NP)):
                    o = o + ct.extract(hr, (0, 0, j), shape=(TM, NP, 1)) * ct.extract(rt, (0, j, 0),
                                                                                     shape=(TM, 1, TK))
                ob = o.astype(res.dtype)
            else:
                ob = ct.load(out, index=(m, 0, c), shape=(TM, NP, TK), padding_mode=PAD_ZERO)
            wt = wt0 if DW else _w_tile(w, c, NP, NPAD, TK)
            ob2 = ct.reshape(ob, (TM, NP * TK))
            gx = ct.mma(lo, wt, ct.mma(hi, wt, ct.zeros((TM, NP * TK), dtype=ct.float32)))
            if P3:  # dproj's third bf16 term (d_total_tile's P3)
                gx = ct.mma(lo2, wt, gx)
            ga = ct.reshape(ct.load(dagg, index=(m, c), shape=(TM, TK), padding_mode=PAD_ZERO).astype(ct.float32),
                            (TM, 1, TK))
            go = ct.load(dout, index=(m, 0, c), shape=(TM, NP, TK), padding_mode=PAD_ZERO).astype(ct.float32)
            # d_total, fp32, summed in mhc_pp_bwd_dx's order
            dt = ct.reshape(gx, (TM, NP, TK)) + coef * ob.astype(ct.float32) + hq * ga + go
            gxx = ct.sum(hp * dt, axis=1)
            ct.store(dx, index=(m, c), tile=gxx.astype(dx.dtype))
            ct.store(dres, index=(m, 0, c), tile=pb._dres_rows(hr, dt, NP, TM, TK).astype(dres.dtype))
            if HAS_BIAS:
                dbias = dbias + ct.where(kid == k, ct.sum(gxx, axis=0, keepdims=True), 0.0)
            ap = ap + ct.sum(dt * xb, axis=2)
            for i in ct.static_iter(range(NP)):
                row = ct.sum(ct.extract(dt, (0, i, 0), shape=(TM, 1, TK)) * rt, axis=2)
                ah = ah + ct.where(ii == i, ct.reshape(row, (TM, 1, NP)), 0.0)
            if DW:
                dw = ct.mma(ct.transpose(hi), ob2, dw)
                dw = ct.mma(ct.transpose(lo), ob2, dw)
        ct.store(p_dhr, index=(s, m, 0, 0), tile=ct.reshape(ah, (1, TM, NP, NP)))
        ct.store(p_dhp, index=(s, m, 0), tile=ct.reshape(ap, (1, TM, NP)))
    if HAS_BIAS:
        for k in ct.static_iter(range(KC)):
            ct.store(p_bias, index=(g, s * KC + k), tile=ct.extract(dbias, (k, 0), shape=(1, TK)))
    if DW:
        ct.store(p_dw, index=(g, 0, 0, s), tile=ct.reshape(dw, (1, NPAD, NP, TK)))


def dbias_launch(p_bias, dbias, cfg) -> Launch:
    """dbias = the fp32 partials p_bias [groups, >= C] summed in a fixed order (cutile_post_bda.mhc_pb_dbias)."""
    q = cfg.pb
    return Launch(pb.mhc_pb_dbias, (cdiv(dbias.shape[0], q.TB),), (p_bias, dbias, q.RB, q.TB, q.PDL), cfg, pdl=q.PDL)


def dweight_reduce_launch(p_w, dweight, cfg) -> Launch:
    """dweight = the fp32 partials p_w [groups, N, n*C] summed in a fixed order (cutile_proj_rms.mhc_pr_reduce)."""
    p = cfg.pre
    return Launch(pr.mhc_pr_reduce, (cdiv(p_w.shape[2], p.pr.TK_RED),), (p_w, dweight, p.pr.NPAD, p.pr.TK_RED,
                                                                         p_w.shape[0], p.pr.PDL), cfg, pdl=p.pr.PDL)


def dweight_launches(dproj, out, dweight, cfg) -> tuple[list[Launch], list[Launch]]:
    """mhc_pre's dweight from the saved out [T, n, C] in a pass of its own (mhc_pp_bwd_dw, mhc_pre's
    dx-pass row groups, 128-column tiles), then its fixed-order reduction: ([pass], [reduction])."""
    T, n, C = out.shape
    N = dproj.shape[1]
    w = cfg.pre.pr
    NPAD = w.NPAD
    gw, tkw = min(w.GM, cdiv(T, w.TM)), 128
    p_w = torch.empty((gw, N, n * C), dtype=torch.float32, device=out.device)
    dws = [Launch(mhc_pp_bwd_dw, (cdiv(n * C, tkw), gw), (dproj, out.view(T, n * C), p_w, NPAD, w.TM, tkw,
                                                          NPAD == 32), cfg, occ(2))]
    return dws, [dweight_reduce_launch(p_w, dweight, cfg)]


@ct.kernel
def mhc_pp_bwd_dw(dproj, out, p_dw, NPAD: ConstInt, TM: ConstInt, TK: ConstInt, DWT: ConstBool):
    """dweight partials from the saved out [T, n*C]: block (c, g) sums dproj^T @ out over row
    tiles g, g+GM, ... at column tile c into p_dw [GM, N, n*C] (fp32; dproj as bf16 hi + lo)."""
    cj = ct.bid(0)
    gm = ct.bid(1)
    dw = ct.zeros((TK, NPAD) if DWT else (NPAD, TK), dtype=ct.float32)
    for m in range(gm, ct.num_tiles(out, axis=0, shape=(TM, TK)), ct.num_blocks(1)):
        gp = ct.load(dproj, index=(m, 0), shape=(TM, NPAD), padding_mode=PAD_ZERO)
        hi = gp.astype(ct.bfloat16)
        lo = (gp - hi.astype(ct.float32)).astype(ct.bfloat16)
        ot = ct.load(out, index=(m, cj), shape=(TM, TK), padding_mode=PAD_ZERO)
        dw = pr.bwd_dw_acc(dw, ot, hi, lo, DWT)
    if DWT:
        dw = ct.transpose(dw)
    ct.store(p_dw, index=(gm, 0, cj), tile=ct.reshape(dw, (1, NPAD, TK)))


def d_total_tile(dproj, dr, x, r, dx, dout, dagg, hpre_t, wt, dw, grp, cj, m, kf, eps, NPAD: ConstInt,
                 TM: ConstInt, TK: ConstInt, DWT: ConstBool, P3: ConstBool):
    """Row tile m of stream grp, C tile cj of mhc_pre's dx pass (cutile_proj_rms.mhc_pr_bwd, AGG)
    with the incoming dout added: d_total = dout + mhc_pre's d(out) [TM, TK] fp32, stored to dx
    in its dtype; returns it and the dweight accumulator updated with this tile. P3: dproj as
    three bf16 terms (cutile_proj_rms.bwd_dx_tile), so the fp32 dh sums downstream see fp32's
    precision (two terms, ~16 bits, put single-token dh_post errors up to 4.3e-5)."""
    gx, hi, lo, xt = pr.bwd_dx_tile(dproj, dr, x, r, wt, grp, cj, m, kf, eps, NPAD, TM, TK, P3)
    # racecheck's write-write reports on this load at T % 4 != 0 are mhc_pr_bwd's benign
    # pattern (see its comment): the [1, TM] tile is staged twice with the same bytes
    hpre = ct.reshape(ct.load(hpre_t, index=(grp, m), shape=(1, TM), padding_mode=PAD_ZERO), (TM, 1))
    ga = ct.load(dagg, index=(m, cj), shape=(TM, TK), padding_mode=PAD_ZERO)
    go = ct.reshape(ct.load(dout, index=(m, grp, cj), shape=(TM, 1, TK), padding_mode=PAD_ZERO), (TM, TK))
    gx = gx + hpre * ga.astype(ct.float32) + go.astype(ct.float32)
    ct.store(dx, index=(m, grp, cj), tile=ct.reshape(gx.astype(dx.dtype), (TM, 1, TK)))
    return gx, pr.bwd_dw_acc(dw, xt, hi, lo, DWT)


@ct.kernel
def mhc_pp_bwd_dxh(dproj, dr, x, w, r, dx, p_dw, dout, dagg, hpre_t, res, xs, bias, p_dhr, p_dhp, eps: float,
                   NP: ConstInt, NPAD: ConstInt, TM: ConstInt, TK: ConstInt, DWT: ConstBool, HAS_BIAS: ConstBool,
                   P3: ConstBool):
    """cutile_post_pre.mhc_pp_bwd_dx (x: out [T, n, C]; block (c * n + g, gm): stream g, C tile c,
    row tiles gm, gm + GM, ...) with d_total stored in dx's dtype (bf16), and, from the fp32
    d_total of stream g, its rows of h_post_bda's dh partials over the tile's TK channels:
    p_dhr[c, t, g, j] = sum d_total * residual[t, j], p_dhp[c, t, g] = sum d_total * (x + bias)."""
    grp, cj, gm, kf, ntm, wt, dw = pr.bwd_dx_setup(x, w, NPAD, TM, TK, DWT)
    jj = ct.reshape(ct.arange(NP, dtype=ct.int32), (1, NP))
    for m in range(gm, ntm, ct.num_blocks(1)):
        gx, dw = d_total_tile(dproj, dr, x, r, dx, dout, dagg, hpre_t, wt, dw, grp, cj, m, kf, eps, NPAD, TM, TK, DWT,
                              P3)
        xb = ct.load(xs, index=(m, cj), shape=(TM, TK), padding_mode=PAD_ZERO).astype(ct.float32)
        if HAS_BIAS:
            xb = xb + ct.reshape(ct.load(bias, index=(cj,), shape=(TK,), padding_mode=PAD_ZERO)
                                 .astype(ct.float32), (1, TK))
        hrow = ct.zeros((TM, NP), dtype=ct.float32)
        for j in ct.static_iter(range(NP)):
            rj = ct.reshape(ct.load(res, index=(m, j, cj), shape=(TM, 1, TK), padding_mode=PAD_ZERO),
                            (TM, TK)).astype(ct.float32)
            hrow = hrow + ct.where(jj == j, ct.sum(gx * rj, axis=1, keepdims=True), 0.0)
        ct.store(p_dhr, index=(cj, m, grp, 0), tile=ct.reshape(hrow, (1, TM, 1, NP)))
        ct.store(p_dhp, index=(cj, m, grp), tile=ct.reshape(ct.sum(gx * xb, axis=1), (1, TM, 1)))
    if DWT:
        dw = ct.transpose(dw)
    ct.store(p_dw, index=(gm, 0, grp, cj), tile=ct.reshape(dw, (1, NPAD, 1, TK)))


def _dh_reductions(p_dhr, p_dhp, dh_res, dh_post, cfg) -> list[Launch]:
    """dh_res, dh_post = the chunk partials p_dhr [chunks, T, n, n], p_dhp [chunks, T, n] summed
    in a fixed order (cutile_post_bda.mhc_pb_dbias over the flat [chunks, T*n*n], [chunks, T*n])."""
    q, nch = cfg.pb, p_dhr.shape[0]
    return [Launch(pb.mhc_pb_dbias, (cdiv(o.numel(), q.TB),), (pp.view(nch, -1), o.view(-1), q.RB, q.TB, q.PDL),
                   cfg, pdl=q.PDL) for pp, o in ((p_dhr, dh_res), (p_dhp, dh_post))]


def dh_in_dx_launches(head, dout, dlayer_in, h_res, residual, h_post, x, weight, bias, out, r, dh_res, dresidual,
                      dh_post, dx, dweight, dbias, rms_eps, cfg) -> list[Launch]:
    """The DH_DX backward after mhc_pre's ``head`` (as one_pass_launches'): mhc_pp_bwd_dxh
    (d_total in fp32 in registers: h_post_bda's dh partials; stored in bf16), then h_post_bda's
    dresidual / dx kernel (cutile_post_bda.mhc_pb_bwd_dres) on that bf16 d_total, then the
    fixed-order reductions. Only dresidual, dx and dbias (bf16 results) see the bf16 d_total."""
    T, n, C = residual.shape
    N = weight.shape[0]
    mix = next(ln for ln in head if ln.kernel in pre.MIX_KERNELS)
    dproj, dr, hpre_t = mix.args[6:9]
    p, TK = cfg.pre.pr, cfg.TK_X
    has_bias = bias is not None
    dev = residual.device
    f32 = torch.float32
    gm = min(p.GM, cdiv(T, p.TM))
    nct = cdiv(C, TK)
    d_total = torch.empty((T, n, C), dtype=residual.dtype, device=dev)
    p_dw = torch.empty((gm, N, n, C), dtype=f32, device=dev)
    p_dhr = torch.empty((nct, T, n, n), dtype=f32, device=dev)
    p_dhp = torch.empty((nct, T, n), dtype=f32, device=dev)
    dxh = Launch(mhc_pp_bwd_dxh, (n * nct, gm),
                 (dproj, dr, out, weight.view(N, n, C), r, d_total, p_dw, dout, dlayer_in, hpre_t, residual, x,
                  bias if has_bias else x, p_dhr, p_dhp, float(rms_eps), cfg.pre.NP, p.NPAD, p.TM, TK, p.DWT,
                  has_bias, cfg.DP3), cfg, occ(cfg.OCC_X))
    red_w = Launch(pr.mhc_pr_reduce, (cdiv(n * C, p.TK_RED),), (p_dw.view(gm, N, n * C), dweight, p.NPAD, p.TK_RED,
                                                                  gm, p.PDL), cfg, pdl=p.PDL)
    q = pb.PostBdaCfg.heuristic(T, n, C, one=False)  # its two-pass design's dresidual / dx kernel
    stage, h_res, h_post = pb._h32(h_res, h_post, q, force=True)
    ng = min(q.G, cdiv(T, q.TT_D))
    p_bias = torch.empty((ng, C) if has_bias else (1, 1), dtype=f32, device=dev)
    dres = Launch(pb.mhc_pb_bwd_dres, (ng, cdiv(C, q.TC_D)),
                  (d_total, h_res, h_post, dresidual, dx, p_bias, q.NP, q.TT_D, q.TC_D, has_bias, q.ROWS), cfg,
                  occ(q.OCC_D))
    out_l = [dxh, red_w, *stage, dres, *_dh_reductions(p_dhr, p_dhp, dh_res, dh_post, cfg)]
    if has_bias:
        out_l.append(Launch(pb.mhc_pb_dbias, (cdiv(C, q.TB),), (p_bias, dbias, q.RB, q.TB, q.PDL), cfg, pdl=q.PDL))
    return out_l


def one_pass_launches(head, dout, dlayer_in, h_res, residual, h_post, x, weight, bias, out, r, dh_res, dresidual,
                      dh_post, dx, dweight, dbias, rms_eps, cfg) -> list[Launch]:
    """The one-pass backward's launches after mhc_pre's ``head`` (cutile_pre.bwd_launches' list
    without its dx pass: the dh_pre pass, the bwd mix, the hbias reduction), whose mix supplies
    dproj, dr and h_pre transposed. cfg: a cutile_post_pre.PostPreCfg (TM_B, TK_B, KC_B, G_B,
    DW_B, RECOMP, OCC_B; pb for the reductions' tiles)."""
    T, n, C = residual.shape
    N = weight.shape[0]
    mix = next(ln for ln in head if ln.kernel in pre.MIX_KERNELS)
    dproj, dr, hpre_t = mix.args[6:9]
    p = cfg.pre
    NP, NPAD, TK, KC = p.NP, p.pr.NPAD, cfg.TK_B, cfg.KC_B
    if cfg.DW_B and KC != 1:
        raise ValueError(f"mhc_post_pre one-pass bwd: DW_B needs KC_B = 1, got {KC}")
    has_bias = bias is not None
    stage, h_res, h_post = pb._h32(h_res, h_post, cfg.pb, force=True)
    dev = residual.device
    ng = min(cfg.G_B, cdiv(T, cfg.TM_B))
    nch = cdiv(C, TK * KC)
    f32 = torch.float32
    # partials (every element written before it is read)
    p_bias = torch.empty((ng, nch * KC * TK) if has_bias else (1, 1), dtype=f32, device=dev)
    p_dhr = torch.empty((nch, T, n, n), dtype=f32, device=dev)
    p_dhp = torch.empty((nch, T, n), dtype=f32, device=dev)
    p_dw = torch.empty((ng, N, n, C) if cfg.DW_B else (1, 1, 1, 1), dtype=f32, device=dev)
    one = Launch(mhc_pp_bwd_one, (ng, nch),
                 (dout, dlayer_in, hpre_t, dproj, dr, r, weight.view(N, n, C), h_res, h_post, residual, x,
                  bias if has_bias else x, out, dresidual, dx, p_dw, p_bias, p_dhr, p_dhp, float(rms_eps), NP, NPAD,
                  cfg.TM_B, TK, KC, next_pow2(KC), has_bias, cfg.DW_B, cfg.RECOMP, cfg.DP3), cfg, occ(cfg.OCC_B))
    red = _dh_reductions(p_dhr, p_dhp, dh_res, dh_post, cfg)
    if has_bias:
        red.append(dbias_launch(p_bias, dbias, cfg))
    if cfg.DW_B:
        dws, red_w = [], [dweight_reduce_launch(p_dw.view(ng, N, n * C), dweight, cfg)]
    else:
        dws, red_w = dweight_launches(dproj, out, dweight, cfg)
    red += red_w
    return stage + [one] + dws + red
