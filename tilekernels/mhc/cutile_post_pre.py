"""cuTile kernels for mhc_post_pre, the mHC layer boundary (fwd + bwd).

out = h_post_bda(h_res, residual, h_post, x, bias), then (layer_in, h_post_next,
h_res_next) = mhc_pre(out, weight, hbias, ...).

h_res [T, n, n] and h_post [T, n] bf16/fp32; residual [T, n, C], x [T, C] bf16 and bias
[C] bf16 (optional); weight [N = n*n + 2n, n*C] bf16, hbias [N] fp32; all contiguous.
out, layer_in bf16; h_post_next [T, n], h_res_next [T, n, n] fp32. The projection
proj [T, N] and r [T] (fp32 scratch) are saved for the backward, as mhc_pre's.

fwd, two designs (PostPreCfg.FUSE_FWD; the heuristic picks the composition, measured faster):
  FUSE_FWD=True, two passes over the new streams instead of three:
  mhc_pp_fwd   per tile of TM tokens, loops over C in TK-wide tiles: forms out (as
               cutile_post_bda.mhc_pb_fwd: fp32 sums of h_res x residual + h_post x
               (x + bias)), rounds it to bf16 and stores it, and while the bf16 tile is in
               registers adds its n [TM, TK] slices times the matching weight columns to
               the [TM, N] projection (tensor cores, fp32 accumulation, the products
               Kahan-summed as cutile_proj_rms.proj_tile does) and its squares to the RMS
               sum. The block owns its tokens' whole reduction (no atomics: deterministic).
               Then mhc_pre's epilogue on the [TM, N] tile in registers (the mix, both
               sigmoids, the Sinkhorn rounds), as cutile_pre.mhc_pre_fwd.
               CS > 1 splits C over CS blocks per token tile instead (mhc_pp_fwd_part: fp32
               partials [CS, T, N], [CS, T]; mhc_pp_mix sums them in a fixed order and runs
               the epilogue).
  mhc_agg_fwd  (cutile_aggregate) layer_in = sum_i h_pre[:, i] out[:, i], the one pass
               over out that must wait for h_pre (it needs the whole n*C reduction).
  FUSE_FWD=False: the composition, cutile_post_bda's fwd then cutile_pre's (out read twice).
  H200, T=32768, n=4, C=7168, fp32 h, fwd with layer_in: composition 2.04 ms; fused, CS=1:
  TM x TK = 64 x 32 2.41 ms, 32 x 64 4.09, 16 x 128 8.31, 128 x 16 5.42 (CS=8); CS=4 / 8 / 16
  at 64 x 32: 3.16 / 3.20 / 3.24; occupancy 2: 2.93. The fused kernel moves 4.23 GB in
  ~1.87 ms (2.3 TB/s) against the parts' 1.05 + 0.44 ms: its inner step (n dependent
  tensor-core products of a [64, 32] tile, each Kahan-summed into the [64, 32] projection)
  costs more than the pass over out it saves. Next: one Kahan update per C tile (the n
  products chained in the MMA accumulator first, 4n x 32 = 128 products as proj_tile's),
  larger TK.
bwd: the gradient entering h_post_bda's backward is d_total = dout + d(out) of mhc_pre,
  summed in fp32 and kept in fp32 ([T, n, C] scratch): h_post_bda's fp32 dh_res / dh_post
  are sums over C of d_total, so a bf16 d_total would cost them ~2^-9 relative accuracy
  (the separate ops, whose autograd sums d(out) in bf16, are 2e-3 off float64 there).
  mhc_agg_bwd and the mix (cutile_pre: for n <= 4 mhc_pre_bwd_sk before the pass, mhc_pre_bwd_rest after it):
               dh_pre, then dh [T, N], dproj, dr, h_pre^T.
  mhc_pp_bwd_dx (FUSE_BWD, the default) is cutile_proj_rms.mhc_pr_bwd's mhc_pre pass (dx =
               dproj @ weight + dr * dr/dx + h_pre * dlayer_in, fp32 dweight partials) with
               the incoming dout added before the store: d_total written once, in fp32.
               FUSE_BWD=False: mhc_pr_bwd writes mhc_pre's d(out), then d_total += dout.
  then cutile_post_bda's backward with d_total as its dout; the dweight, dhbias and dbias
  reductions of the parts (fixed order: deterministic).
  H200 (same shape), bwd = fwd+bwd - fwd: FUSE_BWD 5.6-5.7 ms, FUSE_BWD=False 8.3; the
  separate ops 5.18 (their bf16 d(out) moves half the bytes of the fp32 d_total).
  Two designs that keep the fp32 d_total out of memory (cutile_post_pre_bwd; n <= 4; correct,
  slower, non-default): ONE_BWD, one streaming pass forming d_total per [16, n, 64] tile in
  registers (bwd 7.92-7.95 ms; its main kernel alone 6.67 ms for ~7.6 GB), and DH_DX, h_post_bda's
  dh sums in mhc_pre's dx pass with d_total stored in bf16 for the dresidual / dx kernel (bwd
  7.47 ms; mhc_pp_bwd_dxh 5.67 ms against mhc_pp_bwd_dx's 2.32). The per-row sums over C of
  d_total times the residual tiles cost more in cuTile than the fp32 round trip they save.
Measured times (H200): benchmarks/mhc_post_pre_check.py, benchmarks/results/.
The registry's first choice on sm_90a is the ``cute`` backend (cute_post_pre.py): these kernels' forward
and mhc_pre's backward head, then ONE_BWD's design as one CuTe DSL pass (64 tokens a CTA over every SPLIT-th chunk
of C).
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

from . import cutile_aggregate as agg
from . import cutile_post_bda as pb
from . import cutile_post_pre_bwd as ppb
from . import cutile_pre as pre
from . import cutile_proj_rms as pr
from .cutile_sinkhorn import assemble, sk_fwd_entries

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _out_proj(hres, res, hpost, x, bias, w, out, pid, k0, kstep, NS: ConstInt, NP: ConstInt, NPAD: ConstInt,
              TM: ConstInt, TK: ConstInt, HAS_BIAS: ConstBool):
    """Token tile ``pid`` over the C tiles k0, k0 + kstep, ...: out (stored, rounded to out's
    dtype) and, from those rounded values (what mhc_pre would read back), the partial
    projection [TM, NPAD] (Kahan-summed tensor-core products) and sum of squares [TM]."""
    nkt = ct.num_tiles(x, axis=1, shape=(TM, TK))
    hr = ct.load(hres, index=(pid, 0, 0), shape=(TM, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    hp = ct.reshape(ct.load(hpost, index=(pid, 0), shape=(TM, NP), padding_mode=PAD_ZERO).astype(ct.float32),
                    (TM, NP, 1))
    acc = ct.zeros((TM, NPAD), dtype=ct.float32)
    comp = ct.zeros((TM, NPAD), dtype=ct.float32)
    ss = ct.zeros((TM, TK), dtype=ct.float32)
    for k in range(k0, nkt, kstep):
        rt = ct.load(res, index=(pid, 0, k), shape=(TM, NP, TK), padding_mode=PAD_ZERO).astype(ct.float32)
        xb = ct.load(x, index=(pid, k), shape=(TM, TK), padding_mode=PAD_ZERO).astype(ct.float32)
        if HAS_BIAS:
            xb = xb + ct.reshape(ct.load(bias, index=(k,), shape=(TK,), padding_mode=PAD_ZERO)
                                 .astype(ct.float32), (1, TK))
        o = hp * ct.reshape(xb, (TM, 1, TK))
        for j in ct.static_iter(range(NP)):
            o = o + ct.extract(hr, (0, 0, j), shape=(TM, NP, 1)) * ct.extract(rt, (0, j, 0), shape=(TM, 1, TK))
        ob = o.astype(out.dtype)
        ct.store(out, index=(pid, 0, k), tile=ob)
        for i in ct.static_iter(range(NS)):
            oi = ct.reshape(ct.extract(ob, (0, i, 0), shape=(TM, 1, TK)), (TM, TK))
            wt = ct.reshape(ct.load(w, index=(0, i, k), shape=(NPAD, 1, TK), padding_mode=PAD_ZERO), (NPAD, TK))
            y = ct.mma(oi, ct.transpose(wt), ct.zeros((TM, NPAD), dtype=ct.float32)) - comp
            tot = acc + y
            comp = (tot - acc) - y
            acc = tot
        of = ob.astype(ct.float32)
        ss = ss + ct.sum(of * of, axis=1)
    return acc, ct.sum(ss, axis=1)


def _epilogue(acc, sumsq, pid, kf, hb, proj, r, hpre, hpost_n, hres_n, rms_eps, a_pre, a_post, a_res, sk_eps,
              NS: ConstInt, NP: ConstInt, NPAD: ConstInt, TM: ConstInt, ITERS: ConstInt, APPROX: ConstInt):
    """r from the sum of squares, then mhc_pre's epilogue on the [TM, NPAD] projection
    (cutile_pre.mhc_pre_fwd's, on the same helpers): proj, r, h_pre, h_post_next, h_res_next."""
    rr = 1.0 / (ct.sqrt(sumsq / kf) + rms_eps)
    ct.store(proj, index=(pid, 0), tile=acc)
    ct.store(r, index=(pid,), tile=rr)
    h, _alpha = pre._mix(acc, rr, hb, a_pre, a_post, a_res, NS, NPAD, TM)
    sg = 1.0 / (1.0 + ct.exp(-h))
    ct.store(hpre, index=(pid, 0), tile=pre._cols(sg, 0, NS, NP, TM))
    ct.store(hpost_n, index=(pid, 0), tile=(2.0 * pre._cols(sg, NS, NS, NP, TM)).astype(hpost_n.dtype))
    M = sk_fwd_entries(pre._res_entries(h, NS, TM), sk_eps, NS, ITERS, APPROX)
    ct.store(hres_n, index=(pid, 0, 0), tile=assemble(M, NS, NP, TM).astype(hres_n.dtype))


@ct.kernel
def mhc_pp_fwd(hres, res, hpost, x, bias, w, hb, out, proj, r, hpre, hpost_n, hres_n,
               rms_eps: float, a_pre: float, a_post: float, a_res: float, sk_eps: float,
               NS: ConstInt, NP: ConstInt, NPAD: ConstInt, TM: ConstInt, TK: ConstInt,
               ITERS: ConstInt, APPROX: ConstInt, HAS_BIAS: ConstBool):
    """CS = 1: one block per TM tokens streams all of C, then the epilogue.
    w is the weight seen as [N, n, C]; res, out [T, n, C]; x [T, C]."""
    pid = ct.bid(0)
    acc, sumsq = _out_proj(hres, res, hpost, x, bias, w, out, pid, 0, 1, NS, NP, NPAD, TM, TK, HAS_BIAS)
    _epilogue(acc, sumsq, pid, ct.astype(x.shape[1] * NS, ct.float32), hb, proj, r, hpre, hpost_n, hres_n,
              rms_eps, a_pre, a_post, a_res, sk_eps, NS, NP, NPAD, TM, ITERS, APPROX)


@ct.kernel
def mhc_pp_fwd_part(hres, res, hpost, x, bias, w, out, p_proj, p_ss, NS: ConstInt, NP: ConstInt,
                    NPAD: ConstInt, TM: ConstInt, TK: ConstInt, HAS_BIAS: ConstBool):
    """CS > 1: block (b, s) does C tiles s, s + CS, ... of token tile b and stores its partial
    projection p_proj [CS, T, NPAD] and sum of squares p_ss [CS, T] (fp32)."""
    pid = ct.bid(0)
    s = ct.bid(1)
    acc, sumsq = _out_proj(hres, res, hpost, x, bias, w, out, pid, s, ct.num_blocks(1), NS, NP, NPAD, TM, TK,
                           HAS_BIAS)
    ct.store(p_proj, index=(s, pid, 0), tile=ct.reshape(acc, (1, TM, NPAD)))
    ct.store(p_ss, index=(s, pid), tile=ct.reshape(sumsq, (1, TM)))


@ct.kernel
def mhc_pp_mix(p_proj, p_ss, hb, proj, r, hpre, hpost_n, hres_n, kf: float, rms_eps: float, a_pre: float,
               a_post: float, a_res: float, sk_eps: float, NS: ConstInt, NP: ConstInt, NPAD: ConstInt,
               TM: ConstInt, CS: ConstInt, ITERS: ConstInt, APPROX: ConstInt, PDL: ConstBool):
    """The CS partials of TM tokens summed in a fixed order (deterministic), then the epilogue
    (kf: n*C as a float, the RMS norm's count)."""
    if PDL:  # launched while mhc_pp_fwd_part finishes: its partials are visible after this
        ct.grid_dependency_control_wait()
    pid = ct.bid(0)
    acc = ct.zeros((TM, NPAD), dtype=ct.float32)
    sumsq = ct.zeros((TM,), dtype=ct.float32)
    for s in ct.static_iter(range(CS)):
        acc = acc + ct.reshape(ct.load(p_proj, index=(s, pid, 0), shape=(1, TM, NPAD), padding_mode=PAD_ZERO),
                               (TM, NPAD))
        sumsq = sumsq + ct.reshape(ct.load(p_ss, index=(s, pid), shape=(1, TM), padding_mode=PAD_ZERO), (TM,))
    _epilogue(acc, sumsq, pid, kf, hb, proj, r, hpre, hpost_n, hres_n, rms_eps, a_pre,
              a_post, a_res, sk_eps, NS, NP, NPAD, TM, ITERS, APPROX)


@ct.kernel
def mhc_pp_bwd_dx(dproj, dr, x, w, r, dx, p_dw, dout, dagg, hpre_t, eps: float,
                  NPAD: ConstInt, TM: ConstInt, TK: ConstInt, AGG: ConstBool, DWT: ConstBool, P3: ConstBool):
    """cutile_proj_rms.mhc_pr_bwd's mhc_pre pass (same grid, views, partials and DWT choice;
    AGG must be True) with the incoming dout [rows, G, Cg] added to dx before the store:
    dx = d_total = dout + mhc_pre's d(out)."""
    grp, cj, gm, kf, ntm, wt, dw = pr.bwd_dx_setup(x, w, NPAD, TM, TK, DWT)
    for m in range(gm, ntm, ct.num_blocks(1)):
        _gx, dw = ppb.d_total_tile(dproj, dr, x, r, dx, dout, dagg, hpre_t, wt, dw, grp, cj, m, kf, eps, NPAD, TM,
                                   TK, DWT, P3)
    if DWT:
        dw = ct.transpose(dw)
    ct.store(p_dw, index=(gm, 0, grp, cj), tile=ct.reshape(dw, (1, NPAD, 1, TK)))


@dataclasses.dataclass(frozen=True)
class PostPreCfg:
    """Launch config = compile key (with the dtypes and HAS_BIAS) of the mhc_post_pre kernels."""
    pb: pb.PostBdaCfg   # h_post_bda's kernels (the composition's fwd, the bwd)
    pre: pre.PreCfg     # mhc_pre's kernels (the epilogue constants, layer_in, the bwd)
    TM: int             # fused fwd: tokens per block (the tensor-core M)
    TK: int             # fused fwd: channels per step
    CS: int = 1         # fused fwd: blocks along C per token tile (> 1: partials + mhc_pp_mix)
    TE: int = 64        # fused fwd, CS > 1: tokens per block of the epilogue kernel
    OCC_F: int = 0      # fused fwd occupancy hint (0: compiler's choice)
    PDL: bool = True    # the epilogue kernel as a programmatic dependent launch
    FUSE_FWD: bool = False  # the fused forward (mhc_pp_fwd); False: the parts' kernels (faster today)
    FUSE_BWD: bool = True   # mhc_pp_bwd_dx (d_total in one pass); False: mhc_pr_bwd, then a torch add
    DP3: bool = True    # the fused backwards' dproj @ w with dproj as 3 bf16 terms (fp32 d_total; False: 2)
    # Two backward designs that keep the fp32 d_total out of memory (cutile_post_pre_bwd; n <= 4;
    # slower on the H200, so off; the defaults below are their fastest measured configs). Either
    # replaces the FUSE_BWD path; ONE_BWD wins when both are set.
    ONE_BWD: bool = False  # one streaming pass, d_total only in registers (mhc_pp_bwd_one)
    TM_B: int = 16      # tokens per tile (tensor-core M)
    TK_B: int = 64      # channels per C tile (the weight tile is [NPAD, n * TK_B])
    KC_B: int = 1       # C tiles per block (dh summed over them before the partial store)
    G_B: int = 128      # row groups (grid; one dbias / dweight partial each)
    DW_B: bool = False  # dweight in the same pass (needs KC_B = 1); False: mhc_pp_bwd_dw from out
    RECOMP: bool = True  # recompute out from residual, x, h (False: read the saved out)
    OCC_B: int = 2
    DH_DX: bool = False  # dh in mhc_pre's dx pass (mhc_pp_bwd_dxh), d_total stored in bf16 for
    TK_X: int = 64       # h_post_bda's dresidual / dx kernel; its C tile (64 x 64 tiles)
    OCC_X: int = 2

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, T: int, n: int, C: int, iters: int) -> "PostPreCfg":
        """From n, C, iters (T only reaches the parts' heuristics, which ignore it for tiles).
        The composed forward (faster than the fused one on the H200, see the module doc) and
        the fused backward. The fused forward's config, for FUSE_FWD=True: TM x NP x TK = 8K
        fp32 elements per [TM, n, TK] tile (as the h_post_bda fwd's 2 x 4 x 1024) with TM = 64
        rows for the tensor cores and one block per token tile (CS=1): the fastest measured."""
        NP = next_pow2(n)
        TK = max(16, min(128 // NP, next_pow2(C)))
        # bwd: the d_total design (FUSE_BWD; ONE_BWD and DH_DX measured slower, see the module doc)
        return cls(pb=pb.PostBdaCfg.heuristic(T, n, C), pre=pre.PreCfg.heuristic(T, n, C, iters), TM=64, TK=TK)


def _cfg(residual, iters, cfg):
    T, n, C = residual.shape
    cfg = cfg or PostPreCfg.heuristic(T, n, C, iters)
    if cfg.pre.ITERS != iters or cfg.pre.NS != n:
        raise ValueError(f"mhc_post_pre: launch config for iters={cfg.pre.ITERS}, n={cfg.pre.NS}; the call has "
                         f"iters={iters}, n={n}")
    return cfg


def fwd_launches(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next, h_res_next,
                 proj, r, alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps,
                 cfg: PostPreCfg | None = None) -> list[Launch]:
    """The forward's launches (outputs and scratch given, every element written)."""
    T, n, C = residual.shape
    cfg = _cfg(residual, iters, cfg)
    pre_params = (alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)
    if not cfg.FUSE_FWD:
        return [*pb.fwd_launches(h_res, residual, h_post, x, bias, out, cfg.pb),
                *pre.fwd_launches(out, weight, hbias, layer_in, h_post_next, h_res_next, proj, r, *pre_params,
                                  cfg=cfg.pre)]
    has_bias = bias is not None
    stage, h_res, h_post = pb._h32(h_res, h_post, cfg.pb)  # bf16 h: fp32 copies (as h_post_bda's fwd)
    h_pre = torch.empty((T, n), dtype=torch.float32, device=x.device)
    p = cfg.pre
    streams = (h_res, residual, h_post, x, bias if has_bias else x, weight.view(-1, n, C))
    scal = (float(rms_eps), float(alpha_pre), float(alpha_post), float(alpha_res), float(sinkhorn_eps))
    outs = (proj, r, h_pre, h_post_next, h_res_next)
    if cfg.CS == 1:
        fused = [Launch(mhc_pp_fwd, (cdiv(T, cfg.TM),),
                        (*streams, hbias, out, *outs, *scal, n, p.NP, p.pr.NPAD, cfg.TM, cfg.TK, p.ITERS, p.APPROX,
                         has_bias), cfg, occ(cfg.OCC_F))]
    else:
        # partials per C split (every element written before mhc_pp_mix reads it)
        p_proj = torch.empty((cfg.CS, T, p.pr.NPAD), dtype=torch.float32, device=x.device)
        p_ss = torch.empty((cfg.CS, T), dtype=torch.float32, device=x.device)
        cs = min(cfg.CS, cdiv(C, cfg.TK))
        if cs < cfg.CS:  # fewer C tiles than splits: the idle splits' partials are zeros
            p_proj[cs:].zero_()
            p_ss[cs:].zero_()
        fused = [Launch(mhc_pp_fwd_part, (cdiv(T, cfg.TM), cs),
                        (*streams, out, p_proj, p_ss, n, p.NP, p.pr.NPAD, cfg.TM, cfg.TK, has_bias), cfg,
                        occ(cfg.OCC_F)),
                 Launch(mhc_pp_mix, (cdiv(T, cfg.TE),),
                        (p_proj, p_ss, hbias, *outs, float(n * C), *scal, n, p.NP, p.pr.NPAD, cfg.TE, cfg.CS, p.ITERS,
                         p.APPROX, cfg.PDL), cfg, pdl=cfg.PDL)]
    return stage + fused + [agg.fwd_launch(out, h_pre, layer_in, p.agg)]


def bwd_launches(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias, bias,
                 out, proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, alpha_pre, alpha_post,
                 alpha_res, iters, rms_eps, sinkhorn_eps, cfg: PostPreCfg | None = None) -> list[Launch]:
    """The backward's launches, plus (FUSE_BWD=False) one torch add between them: a list of
    Launch records and callables, run in order by :func:`run`."""
    T, n, C = residual.shape
    cfg = _cfg(residual, iters, cfg)
    pre_params = (alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)
    if cfg.ONE_BWD or cfg.DH_DX:
        if cfg.pre.NP > 4:  # (ONE_BWD's weight tile and dweight accumulator, NPAD = 128, spill)
            raise ValueError(f"mhc_post_pre: the ONE_BWD / DH_DX backward designs are for n <= 4, got n={n}")
        # mhc_pre's head without its dx pass (dx None)
        head = pre.bwd_launches(dlayer_in, dh_post_next, dh_res_next, out, weight, hbias, proj, r, None, dweight,
                                dhbias, *pre_params, cfg=cfg.pre)
        tail = ppb.one_pass_launches if cfg.ONE_BWD else ppb.dh_in_dx_launches
        return head + tail(head, dout, dlayer_in, h_res, residual, h_post, x, weight, bias, out, r, dh_res, dresidual,
                           dh_post, dx, dweight, dbias, rms_eps, cfg)
    d_total = torch.empty((T, n, C), dtype=torch.float32, device=residual.device)
    head = pre.bwd_launches(dlayer_in, dh_post_next, dh_res_next, out, weight, hbias, proj, r, d_total, dweight,
                            dhbias, alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps, cfg=cfg.pre)
    tail = pb.bwd_launches(d_total, h_res, residual, h_post, x, bias, dh_res, dresidual, dh_post, dx, dbias,
                           cfg.pb)
    if not cfg.FUSE_BWD:
        return [*head, functools.partial(d_total.add_, dout), *tail]
    # head = [the mix's Sinkhorn kernel (split mix), dh_pre pass, mix, mhc_pr_bwd (the dx pass), mhc_pr_reduce,
    # dbias reduction]: found by kernel, not position
    i = next(k for k, ln in enumerate(head) if ln.kernel is pr.mhc_pr_bwd)
    a = head[i].args  # (dproj, dr, x, w, r, dx, p_dw, dagg, hpre_t, eps, NPAD, TM, TK, AGG, DWT)
    if not a[13]:
        raise ValueError("mhc_post_pre: the fused dx pass needs mhc_pre's dx launch (AGG=True)")
    dxp = dataclasses.replace(head[i], kernel=mhc_pp_bwd_dx, args=(*a[:7], dout.view(a[5].shape), *a[7:], cfg.DP3))
    return [*head[:i], dxp, *head[i + 1:], *tail]


def run(steps) -> None:
    """Run launches (and the composition's torch add) in order."""
    for s in steps:
        s.run() if isinstance(s, Launch) else s()


_FWD = (mhc_pp_fwd, mhc_pp_fwd_part, mhc_pp_mix)
_BWD = (mhc_pp_bwd_dx, pb.mhc_pb_bwd_one, pb.mhc_pb_bwd_dres, pb.mhc_pb_bwd_dh, ppb.mhc_pp_bwd_one, ppb.mhc_pp_bwd_dw,
        ppb.mhc_pp_bwd_dxh)


def representative_launches(n: int = 4, C: int = 7168, T: int = 32768, hdtype=None, iters: int = 20):
    """The fused forward (both designs) and the backward designs' own kernels (d_total, DH_DX, ONE_BWD with
    dweight from out and in the same pass) on ``meta`` tensors (the CI compile test exports them for sm_90
    and sm_100); the parts' kernels are compiled by their own tests (cutile_kernels.representative_launches),
    except the h_post_bda backward kernels on this op's d_total (fp32; bf16 for DH_DX)."""
    meta = torch.device("meta")
    bf, f32 = torch.bfloat16, torch.float32
    hd = hdtype or f32

    def e(*shape, dtype=bf):
        return torch.empty(*shape, dtype=dtype, device=meta)

    N = n * n + 2 * n
    ins = (e(T, n, n, dtype=hd), e(T, n, C), e(T, n, dtype=hd), e(T, C), e(N, n * C), e(N, dtype=f32))
    outs = (e(T, n, C), e(T, C), e(T, n, dtype=f32), e(T, n, n, dtype=f32), e(T, N, dtype=f32), e(T, dtype=f32))
    params = (1.0, 1.0, 1.0, iters, 1e-6, 1e-6)
    grads_out = (e(T, n, C), e(T, C), e(T, n, dtype=f32), e(T, n, n, dtype=f32))
    dins = (ins[0], ins[1], ins[2], ins[3], ins[4], ins[5])
    res = {}
    one = dataclasses.replace(PostPreCfg.heuristic(T, n, C, iters), FUSE_FWD=True)
    split = dataclasses.replace(one, CS=8)
    bwds = {"": dataclasses.replace(one, ONE_BWD=False, DH_DX=False), ".dhdx": dataclasses.replace(one, DH_DX=True),
            ".one": dataclasses.replace(one, ONE_BWD=True),
            ".one.dwin": dataclasses.replace(one, ONE_BWD=True, DW_B=True, TK_B=32, G_B=8)}
    for b, tag in ((e(C), ""), (None, ".nobias")):
        res[f"mhc_post_pre.fwd{tag}"] = [ln for ln in fwd_launches(*ins, b, *outs, *params, cfg=one)
                                         if ln.kernel in _FWD]
        res[f"mhc_post_pre.fwd{tag}.split"] = [ln for ln in fwd_launches(*ins, b, *outs, *params, cfg=split)
                                               if ln.kernel in _FWD]
        for bt, bc in bwds.items():
            bwd = bwd_launches(*grads_out, *ins, b, outs[0], outs[4], outs[5], *dins, b, *params, cfg=bc)
            res[f"mhc_post_pre.bwd{bt}{tag}"] = [ln for ln in bwd if ln.kernel in _BWD]
    return res
