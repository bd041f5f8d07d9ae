"""cuTile kernels for the fused mhc_pre (fwd + bwd).

x [T, n, C] bf16, weight [N = n*n + 2n, n*C] bf16, bias [N] fp32, contiguous.
h = r * proj * alpha + bias (columns pre | post | res), h_pre = sigmoid(pre),
h_post = 2 sigmoid(post), h_res = sinkhorn(res), layer_in = sum_i h_pre[:, i] x[:, i].

fwd, two passes over x (h_pre needs the whole K reduction before x can be mixed):
  mhc_pre_fwd    proj_rms's row-tile loop (cutile_proj_rms.proj_tile) and, in the
                 same block, the epilogue on the [TM, N] tile in registers: the
                 mix, both sigmoids and the ``iters`` Sinkhorn rounds (entries layout,
                 approximate divides as cutile_sinkhorn's). Writes proj, r (saved for
                 the bwd), h_post, h_res and an fp32 h_pre scratch [T, n].
  mhc_agg_fwd    (cutile_aggregate) layer_in from x and that h_pre.
bwd, two passes over x (the parts one after another make three, plus an add):
  mhc_agg_bwd    (cutile_aggregate, without dx) dh_pre = sum_c dlayer_in * x, fp32 [T, n].
  the mix     per token tile: the sigmoid derivatives and the Sinkhorn backward
                 (recomputed) give dh [T, N]; writes dproj = dh * r * alpha,
                 dr = sum_N dh * proj * alpha, h_pre transposed [n, T] (fp32 scratch)
                 and one dbias partial per tile. n <= 4 (MIX_SPLIT): two kernels,
                 mhc_pre_bwd_sk (the entries Sinkhorn backward alone, sk_bwd_walk, 128
                 tokens a block, its [iters, 2n, T] fp32 scratch; launched before the
                 dh_pre pass, which it does not need) writing the res logits' gradient,
                 then mhc_pre_bwd_rest (elementwise); n > 4: one kernel,
                 mhc_pre_bwd_mix_e (the same entries backward inside). The padded-tile
                 one-kernel mix (mhc_pre_bwd_mix, cutile_sinkhorn.sk_bwd_tile) is an
                 option. (The mix is not folded into the dh_pre pass's blocks: the
                 latency-bound Sinkhorn chain stalled the stream; nor run beside it on
                 another stream: 7 of its 87 us hid, the mHC ledger, session 23.)
  mhc_pr_bwd     (cutile_proj_rms, AGG) dx = dproj @ weight + dr * dr/dx
                 + h_pre * dlayer_in in one pass over x, with x seen as [T, n, C];
                 fp32 dweight partials per row group.
  mhc_pr_reduce, mhc_pre_dbias  dweight and dbias from their partials in a fixed
                 order (deterministic).
Measured times (H200) against the parts run in turn, and the sweeps behind these
choices: benchmarks/results/nvidia-h200-mhc-cutile.md. mhc_pre's cute backend
(cute_pre.py) runs this forward and this backward's head with CuTe DSL kernels for
the split mix and the dx pass.
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

from . import cutile_aggregate as agg
from . import cutile_proj_rms as pr
from .cutile_sinkhorn import (assemble, init_entries, sk_bwd_through_exp, sk_bwd_tile, sk_bwd_walk,
                              sk_fwd_entries, to_entries)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _mix(pj, rr, bias, a_pre, a_post, a_res, NS: ConstInt, NPAD: ConstInt, TM: ConstInt):
    """(h, alpha), [TM, NPAD] fp32: h = r * proj * alpha + bias (padded columns: 0)."""
    b = ct.reshape(ct.load(bias, index=(0,), shape=(NPAD,), padding_mode=PAD_ZERO), (1, NPAD))
    cols = ct.reshape(ct.arange(NPAD, dtype=ct.int32), (1, NPAD))
    is_pre = (cols < NS).astype(ct.float32)
    is_post = ((cols >= NS) & (cols < 2 * NS)).astype(ct.float32)
    alpha = is_pre * a_pre + is_post * a_post + (1.0 - is_pre - is_post) * a_res  # exact per section
    return ct.reshape(rr, (TM, 1)) * pj * alpha + b.astype(ct.float32), alpha


def _col(t, c: ConstInt, TM: ConstInt):
    """Column c of a [TM, W] tile as a [TM] tile."""
    return ct.reshape(ct.extract(t, (0, c), shape=(TM, 1)), (TM,))


def _cols(t, start: ConstInt, NS: ConstInt, NP: ConstInt, TM: ConstInt):
    """Columns start .. start+NS-1 of a [TM, W] tile as a [TM, NP] tile (zero padded)."""
    out = ct.zeros((TM, NP), dtype=ct.float32)
    for i in ct.static_iter(range(NS)):
        out = ct.insert(out, (0, i), ct.extract(t, (0, start + i), shape=(TM, 1)))
    return out


@ct.kernel
def mhc_pre_fwd(x, w, bias, proj, r, hpre, hpost, hres, rms_eps: float, a_pre: float,
                a_post: float, a_res: float, sk_eps: float, NS: ConstInt, NP: ConstInt,
                NPAD: ConstInt, TM: ConstInt, TK: ConstInt, ITERS: ConstInt, APPROX: ConstInt):
    pid = ct.bid(0)
    pj, rr = pr.proj_tile(x, w, pid, rms_eps, NPAD, TM, TK)
    ct.store(proj, index=(pid, 0), tile=pj)
    ct.store(r, index=(pid,), tile=rr)
    h, _alpha = _mix(pj, rr, bias, a_pre, a_post, a_res, NS, NPAD, TM)
    sg = 1.0 / (1.0 + ct.exp(-h))
    ct.store(hpre, index=(pid, 0), tile=_cols(sg, 0, NS, NP, TM))
    ct.store(hpost, index=(pid, 0), tile=(2.0 * _cols(sg, NS, NS, NP, TM)).astype(hpost.dtype))
    M = sk_fwd_entries(_res_entries(h, NS, TM), sk_eps, NS, ITERS, APPROX)
    ct.store(hres, index=(pid, 0, 0), tile=assemble(M, NS, NP, TM).astype(hres.dtype))


def _up(dpre, dhpost, t, NS: ConstInt, NP: ConstInt, NPAD: ConstInt, TT: ConstInt):
    """[TT, NPAD] incoming gradient of the pre | post activations (res columns 0)."""
    dpt = ct.load(dpre, index=(t, 0), shape=(TT, NP), padding_mode=PAD_ZERO)
    dhp = ct.load(dhpost, index=(t, 0), shape=(TT, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    up = ct.zeros((TT, NPAD), dtype=ct.float32)
    for i in ct.static_iter(range(NS)):
        up = ct.insert(up, (0, i), ct.extract(dpt, (0, i), shape=(TT, 1)))
        up = ct.insert(up, (0, NS + i), 2.0 * ct.extract(dhp, (0, i), shape=(TT, 1)))
    return up


def _res_entries(h, NS: ConstInt, TM: ConstInt):
    """The Sinkhorn logits (res columns of h [TM, W]) as entries lg[i][j] of [TM] tiles."""
    lg = ()
    for i in ct.static_iter(range(NS)):
        row = ()
        for j in ct.static_iter(range(NS)):
            row += (_col(h, 2 * NS + i * NS + j, TM),)
        lg += (row,)
    return lg


def _mix_store(dh, pj, rr, alpha, sg, t, dproj, dr, p_db, hpre_t, NS: ConstInt, NP: ConstInt,
               TT: ConstInt):
    # rows past T: every load is zero-padded, so their dh is 0 (and the stores drop them)
    ct.store(dproj, index=(t, 0), tile=dh * ct.reshape(rr, (TT, 1)) * alpha)
    ct.store(dr, index=(t,), tile=ct.sum(dh * pj * alpha, axis=1))
    ct.store(p_db, index=(t, 0), tile=ct.sum(dh, axis=0, keepdims=True))
    ct.store(hpre_t, index=(0, t), tile=ct.transpose(_cols(sg, 0, NS, NP, TT)))


def _h(proj, r, bias, t, a_pre, a_post, a_res, NS: ConstInt, NPAD: ConstInt, TT: ConstInt):
    """(proj tile, r tile, h, alpha) of token tile t."""
    pj = ct.load(proj, index=(t, 0), shape=(TT, NPAD), padding_mode=PAD_ZERO)
    rr = ct.load(r, index=(t,), shape=(TT,), padding_mode=PAD_ZERO)
    h, alpha = _mix(pj, rr, bias, a_pre, a_post, a_res, NS, NPAD, TT)
    return pj, rr, h, alpha


@ct.kernel
def mhc_pre_bwd_mix(dpre, proj, r, bias, dhpost, dhres, dproj, dr, hpre_t, p_db, a_pre: float,
                    a_post: float, a_res: float, sk_eps: float, NS: ConstInt, NP: ConstInt,
                    NPAD: ConstInt, TT: ConstInt, ITERS: ConstInt):
    """dh [TT, N] of one token tile from dh_pre (the aggregation's), dh_post, dh_res;
    also h_pre, transposed ([n, T]), for the dx pass. Sinkhorn backward: the padded
    tile (cutile_sinkhorn.sk_bwd_tile)."""
    t = ct.bid(0)
    pj, rr, h, alpha = _h(proj, r, bias, t, a_pre, a_post, a_res, NS, NPAD, TT)
    sg = 1.0 / (1.0 + ct.exp(-h))
    lg = ct.zeros((TT, NP, NP), dtype=ct.float32)
    for i in ct.static_iter(range(NS)):
        for j in ct.static_iter(range(NS)):
            lg = ct.insert(lg, (0, i, j), ct.reshape(_col(h, 2 * NS + i * NS + j, TT), (TT, 1, 1)))
    dh = _up(dpre, dhpost, t, NS, NP, NPAD, TT) * sg * (1.0 - sg)
    gres = ct.load(dhres, index=(t, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    dl = sk_bwd_tile(gres, lg, sk_eps, NS, NP, ITERS)
    for i in ct.static_iter(range(NS)):
        for j in ct.static_iter(range(NS)):
            dh = ct.insert(dh, (0, 2 * NS + i * NS + j),
                           ct.reshape(ct.extract(dl, (0, i, j), shape=(TT, 1, 1)), (TT, 1)))
    _mix_store(dh, pj, rr, alpha, sg, t, dproj, dr, p_db, hpre_t, NS, NP, TT)


def _sk_walk(proj, r, bias, dhres, scratch, t, a_pre, a_post, a_res, sk_eps, NS: ConstInt, NP: ConstInt,
             NPAD: ConstInt, TT: ConstInt, ITERS: ConstInt, APPROX: ConstInt, PF: ConstInt):
    """Token tile t's entries Sinkhorn backward walk (cutile_sinkhorn.sk_bwd_walk, ``scratch`` [ITERS, 2n, T])
    from the res logits of h, recomputed from proj, r, bias, and dh_res. h is not returned: the callers read
    proj again after the walk, so it is not live through the loops."""
    _pj, _rr, h, _alpha = _h(proj, r, bias, t, a_pre, a_post, a_res, NS, NPAD, TT)
    M0, _m = init_entries(_res_entries(h, NS, TT), NS)
    gres = ct.load(dhres, index=(t, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO).astype(ct.float32)
    return sk_bwd_walk(M0, to_entries(gres, NS, TT), scratch, sk_eps, NS, TT, ITERS, APPROX, PF)


@ct.kernel
def mhc_pre_bwd_mix_e(dpre, proj, r, bias, dhpost, dhres, dproj, dr, hpre_t, p_db, scratch,
                      a_pre: float, a_post: float, a_res: float, sk_eps: float, NS: ConstInt,
                      NP: ConstInt, NPAD: ConstInt, TT: ConstInt, ITERS: ConstInt,
                      APPROX: ConstInt, PF: ConstInt):
    """mhc_pre_bwd_mix with the entries-layout Sinkhorn backward (cutile_sinkhorn
    sk_bwd_walk; ``scratch`` [ITERS, 2n, T] fp32). The walk runs first, from the
    res columns of h only; proj and r are read again after it, so h is not live
    through the loops."""
    t = ct.bid(0)
    g = _sk_walk(proj, r, bias, dhres, scratch, t, a_pre, a_post, a_res, sk_eps, NS, NP, NPAD, TT, ITERS, APPROX, PF)
    pj, rr, h, alpha = _h(proj, r, bias, t, a_pre, a_post, a_res, NS, NPAD, TT)
    sg = 1.0 / (1.0 + ct.exp(-h))
    dh = _up(dpre, dhpost, t, NS, NP, NPAD, TT) * sg * (1.0 - sg)
    dl = sk_bwd_through_exp(g, _res_entries(h, NS, TT), NS, TT)
    # rows past T read zero sums from the scratch (its loads pad with 0), so their dl is
    # NaN: zero it, or the dbias partial (a sum over the tile's rows) takes it in
    live = (t * TT + ct.arange(TT, dtype=ct.int32)) < proj.shape[0]
    for i in ct.static_iter(range(NS)):
        for j in ct.static_iter(range(NS)):
            dh = ct.insert(dh, (0, 2 * NS + i * NS + j), ct.reshape(ct.where(live, dl[i][j], 0.0), (TT, 1)))
    _mix_store(dh, pj, rr, alpha, sg, t, dproj, dr, p_db, hpre_t, NS, NP, TT)


@ct.kernel
def mhc_pre_bwd_sk(proj, r, bias, dhres, dlres, scratch, a_pre: float, a_post: float, a_res: float, sk_eps: float,
                   NS: ConstInt, NP: ConstInt, NPAD: ConstInt, TT: ConstInt, ITERS: ConstInt, APPROX: ConstInt,
                   PF: ConstInt):
    """The split mix's first kernel (MIX_SPLIT): the Sinkhorn backward alone, in the entries layout
    (cutile_sinkhorn.sk_bwd_walk, TT tokens a block, ``scratch`` [ITERS, 2n, T] fp32), from the res logits of h
    (recomputed from proj, r, bias; read again after the walk, as mhc_pre_bwd_mix_e does, so h is not live
    through its loops) and dh_res: dlres [T, NP, NP] fp32, the res logits' gradient (padded entries 0; the
    store drops rows past T). Nothing else is live, which is what keeps it as fast as the Sinkhorn op's own
    backward; the rest of the mix is elementwise (mhc_pre_bwd_rest)."""
    t = ct.bid(0)
    g = _sk_walk(proj, r, bias, dhres, scratch, t, a_pre, a_post, a_res, sk_eps, NS, NP, NPAD, TT, ITERS, APPROX, PF)
    _pj, _rr, h, _alpha = _h(proj, r, bias, t, a_pre, a_post, a_res, NS, NPAD, TT)
    dl = sk_bwd_through_exp(g, _res_entries(h, NS, TT), NS, TT)
    ct.store(dlres, index=(t, 0, 0), tile=assemble(dl, NS, NP, TT))


@ct.kernel
def mhc_pre_bwd_rest(dpre, proj, r, bias, dhpost, dlres, dproj, dr, hpre_t, p_db, a_pre: float, a_post: float,
                     a_res: float, NS: ConstInt, NP: ConstInt, NPAD: ConstInt, TT: ConstInt):
    """The split mix's second kernel: mhc_pre_bwd_mix with the res columns of dh read from dlres
    (mhc_pre_bwd_sk's) instead of computed: the sigmoid derivatives of pre and post, then dproj, dr, h_pre^T and
    one dbias partial per TT-token tile (elementwise per token; rows past T read zeros and are not stored)."""
    t = ct.bid(0)
    pj, rr, h, alpha = _h(proj, r, bias, t, a_pre, a_post, a_res, NS, NPAD, TT)
    sg = 1.0 / (1.0 + ct.exp(-h))
    dh = _up(dpre, dhpost, t, NS, NP, NPAD, TT) * sg * (1.0 - sg)
    dl = ct.load(dlres, index=(t, 0, 0), shape=(TT, NP, NP), padding_mode=PAD_ZERO)
    for i in ct.static_iter(range(NS)):
        for j in ct.static_iter(range(NS)):
            dh = ct.insert(dh, (0, 2 * NS + i * NS + j),
                           ct.reshape(ct.extract(dl, (0, i, j), shape=(TT, 1, 1)), (TT, 1)))
    _mix_store(dh, pj, rr, alpha, sg, t, dproj, dr, p_db, hpre_t, NS, NP, TT)


MIX_KERNELS = (mhc_pre_bwd_mix, mhc_pre_bwd_mix_e, mhc_pre_bwd_rest)  # whichever writes dproj, dr, h_pre^T (args 6:9)


@ct.kernel
def mhc_pre_dbias(p_db, dbias, NPAD: ConstInt, TG: ConstInt, PDL: ConstBool):
    """dbias = the per-tile partials [G, NPAD] summed in a fixed order (one block)."""
    if PDL:  # launched while the kernel before finishes: its writes are visible after this
        ct.grid_dependency_control_wait()
    acc = ct.zeros((1, NPAD), dtype=ct.float32)
    for g in range(ct.num_tiles(p_db, axis=0, shape=(TG, NPAD))):
        acc += ct.sum(ct.load(p_db, index=(g, 0), shape=(TG, NPAD), padding_mode=PAD_ZERO), axis=0,
                      keepdims=True)
    ct.store(dbias, index=(0,), tile=ct.reshape(acc, (NPAD,)))


@dataclasses.dataclass(frozen=True)
class PreCfg:
    """Launch config = compile key (with the dtypes) of the mhc_pre kernels."""
    pr: pr.ProjRmsCfg   # proj tile loop (fwd) and the dx/dweight pass (bwd)
    agg: agg.AggCfg     # layer_in pass (fwd)
    NS: int             # n
    NP: int             # n padded to a power of two
    TT: int             # bwd mix: tokens per block
    ITERS: int
    TG: int = 256       # dbias reduction: partial rows per step
    OCC_F: int = 0      # occupancy hints (0: compiler's choice)
    OCC_M: int = 0
    MIX_ENTRIES: bool = True  # bwd mix: the entries Sinkhorn backward (else the padded tile)
    # bwd mix split in two kernels (wins over MIX_ENTRIES): the entries Sinkhorn backward alone (mhc_pre_bwd_sk, TT
    # tokens a block), then the elementwise rest (mhc_pre_bwd_rest, TT_R tokens a block)
    MIX_SPLIT: bool = False
    TT_R: int = 128
    APPROX: int = 1     # approximate divides in the Sinkhorn steps (cutile_sinkhorn)
    PF: int = 1         # entries backward: each step's sums loaded one step ahead
    PDL: bool = True    # the dbias reduction as a programmatic dependent launch

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, T: int, n: int, C: int, iters: int, mix_entries: bool | None = None,
                  mix_split: bool | None = None) -> "PreCfg":
        """The bwd mix's design: ``mix_entries`` True / False picks the one-kernel mix with the entries / the
        padded-tile Sinkhorn backward; else ``mix_split`` (None: n <= 4) the split mix (the entries Sinkhorn
        backward in a kernel of its own, then the elementwise rest: H200, T=32768, n=4, 59 us against 86 as one
        kernel with the padded tile; the mHC ledger, session 23), else the one-kernel entries mix (n > 4, where it is
        several times faster than the padded tile; at n = 4 its 128-token tile needed 210 KB of shared memory:
        benchmarks/probes/pre_mix_probe.py)."""
        NP = next_pow2(n)
        base = dict(pr=pr.ProjRmsCfg.heuristic(T, n * n + 2 * n, C, pre=True), agg=agg.AggCfg.heuristic(T, n, C),
                    NS=n, NP=NP, ITERS=iters)
        if mix_entries is None and (mix_split if mix_split is not None else n <= 4):
            return cls(**base, TT=128, MIX_SPLIT=True)
        if mix_entries if mix_entries is not None else n > 4:
            return cls(**base, TT=128)
        # the padded-tile Sinkhorn backward's: 8 tokens at n = 4, occupancy 8
        return cls(**base, TT=max(1, 128 // (NP * NP)), OCC_M=8, MIX_ENTRIES=False)


def _cfg(x, iters, cfg):
    T, n, C = x.shape
    cfg = cfg or PreCfg.heuristic(T, n, C, iters)
    if cfg.ITERS != iters or cfg.NS != n:
        raise ValueError(f"mhc_pre: launch config for iters={cfg.ITERS}, n={cfg.NS}; the call has "
                         f"iters={iters}, n={n}")
    return cfg


def fwd_launches(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre, alpha_post,
                 alpha_res, iters, rms_eps, sinkhorn_eps, cfg: PreCfg | None = None) -> list[Launch]:
    T, n, C = x.shape
    cfg = _cfg(x, iters, cfg)
    p = cfg.pr
    h_pre = torch.empty((T, n), dtype=torch.float32, device=x.device)
    first = Launch(mhc_pre_fwd, (cdiv(T, p.TM),),
                   (x.view(T, n * C), weight, bias, proj, r, h_pre, h_post, h_res, float(rms_eps),
                    float(alpha_pre), float(alpha_post), float(alpha_res), float(sinkhorn_eps),
                    n, cfg.NP, p.NPAD, p.TM, p.TK, cfg.ITERS, cfg.APPROX), cfg, occ(cfg.OCC_F))
    return [first, agg.fwd_launch(x, h_pre, layer_in, cfg.agg)]


def bwd_launches(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias,
                 alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps,
                 cfg: PreCfg | None = None) -> list[Launch]:
    T, n, C = x.shape
    N = weight.shape[0]
    cfg = _cfg(x, iters, cfg)
    NPAD = cfg.pr.NPAD
    dev = x.device
    nt = cdiv(T, cfg.TT_R if cfg.MIX_SPLIT else cfg.TT)   # token tiles of the kernel writing p_db
    dpre = torch.empty((T, n), dtype=torch.float32, device=dev)
    dproj = torch.empty((T, N), dtype=torch.float32, device=dev)
    dr = torch.empty((T,), dtype=torch.float32, device=dev)
    p_db = torch.empty((nt, NPAD), dtype=torch.float32, device=dev)
    hpre_t = torch.empty((n, T), dtype=torch.float32, device=dev)
    dh_pre = agg.bwd_launch(dlayer_in, x, None, None, dpre, cfg.agg)
    head = (dpre, proj, r, bias, dh_post, dh_res, dproj, dr, hpre_t, p_db)
    scal = (float(alpha_pre), float(alpha_post), float(alpha_res), float(sinkhorn_eps), n, cfg.NP, NPAD,
            cfg.TT, cfg.ITERS)
    if cfg.MIX_SPLIT:
        scratch = torch.empty((cfg.ITERS, 2 * n, T), dtype=torch.float32, device=dev)
        dlres = torch.empty((T, cfg.NP, cfg.NP), dtype=torch.float32, device=dev)
        a3 = (float(alpha_pre), float(alpha_post), float(alpha_res))
        sk = Launch(mhc_pre_bwd_sk, (cdiv(T, cfg.TT),), (proj, r, bias, dh_res, dlres, scratch, *a3,
                                                         float(sinkhorn_eps), n, cfg.NP, NPAD, cfg.TT, cfg.ITERS,
                                                         cfg.APPROX, cfg.PF), cfg, occ(cfg.OCC_M))
        rest = Launch(mhc_pre_bwd_rest, (nt,), (dpre, proj, r, bias, dh_post, dlres, dproj, dr, hpre_t, p_db, *a3,
                                                n, cfg.NP, NPAD, cfg.TT_R), cfg)
        mixes = [sk, dh_pre, rest]   # the Sinkhorn backward needs nothing from the dh_pre pass
    elif cfg.MIX_ENTRIES:
        scratch = torch.empty((cfg.ITERS, 2 * n, T), dtype=torch.float32, device=dev)
        mixes = [dh_pre, Launch(mhc_pre_bwd_mix_e, (nt,), (*head, scratch, *scal, cfg.APPROX, cfg.PF), cfg,
                                occ(cfg.OCC_M))]
    else:
        mixes = [dh_pre, Launch(mhc_pre_bwd_mix, (nt,), (*head, *scal), cfg, occ(cfg.OCC_M))]
    # dx None: the caller forms dx and dweight itself (mhc_post_pre's one-pass designs): no dx pass
    dxw = [] if dx is None else pr.bwd_launches(dproj, dr, x.view(T, n * C), weight, r, dx.view(T, n * C), dweight,
                                                rms_eps, cfg.pr, groups=n, agg=(dlayer_in, hpre_t))
    red_b = Launch(mhc_pre_dbias, (1,), (p_db, dbias, NPAD, cfg.TG, cfg.PDL), cfg, pdl=cfg.PDL)
    return [*mixes, *dxw, red_b]
