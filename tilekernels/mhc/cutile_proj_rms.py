"""cuTile kernels for mhc_proj_rms (fwd + bwd).

x [M, K] bf16, weight [N, K] bf16 (N = n*n + 2n, small), contiguous.
fwd: proj [M, N] fp32 = x @ weight^T;  r [M] fp32 = 1 / (||x|| / sqrt(K) + eps)
bwd: dx = dproj @ weight + dr * dr/dx,  dr/dx = -r^2 * x / (K * rms),
     rms = ||x|| / sqrt(K) = 1/r - eps (from the saved r: no second pass over x);
     dweight = dproj^T @ x.

N is padded to NPAD = max(16, next_pow2(N)) for the tensor-core products. The
fp32 dproj enters them as a bf16 pair (hi + lo, hi = bf16(dproj),
lo = bf16(dproj - hi)): ~16 mantissa bits, the products exact, fp32 sums.

fwd: grid (M/TM_F,), each block loops over K.
bwd: grid (K/TK, GM); block (k, g) loops over row tiles g, g+GM, ... at one
     K tile, writes dx, and leaves a fp32 dweight partial per group (the same
     kernel, with x seen as [M, n, C] and the h_aggregate term added, is
     mhc_pre's dx pass: cutile_pre);
     ``mhc_pr_reduce`` sums the GM partials in order (deterministic), launched as a
     programmatic dependent launch. H200 (M=32768, n=4, K=28672), with the dweight tile
     accumulated transposed (DWT, see ProjRmsCfg.heuristic): bwd + reduction 1.05-1.07 ms,
     fwd 0.44 (128-row tiles). Slower there (sweeps in benchmarks/results/, code removed):
     x load latency hints, loads or stores without TMA, row tiles of 32 or 128 in the bwd,
     8 worker warps, next-row-tile loads one step ahead.
"""
from __future__ import annotations

import dataclasses
import functools

import cuda.tile as ct
import torch

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ

from .reference import ZERO_ROW

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def proj_tile(x, w, pid, eps, NPAD: ConstInt, TM: ConstInt, TK: ConstInt):
    """(proj [TM, NPAD], r [TM]), fp32, of row tile ``pid`` of x [M, K] and w [N, K]."""
    nkt = ct.num_tiles(x, axis=1, shape=(TM, TK))
    acc = ct.zeros((TM, NPAD), dtype=ct.float32)
    comp = ct.zeros((TM, NPAD), dtype=ct.float32)
    ss = ct.zeros((TM, TK), dtype=ct.float32)
    for k in range(nkt):
        xt = ct.load(x, index=(pid, k), shape=(TM, TK), padding_mode=PAD_ZERO)
        wt = ct.load(w, index=(0, k), shape=(NPAD, TK), padding_mode=PAD_ZERO)
        # One K tile per tensor-core accumulation; the tiles are summed with
        # Kahan compensation (one MMA accumulation chain over K = 28672 measured
        # 3.3e-5 relative error against the float64 reference).
        y = ct.mma(xt, ct.transpose(wt), ct.zeros((TM, NPAD), dtype=ct.float32)) - comp
        tot = acc + y
        comp = (tot - acc) - y
        acc = tot
        xf = xt.astype(ct.float32)
        ss = ss + xf * xf
    kf = ct.astype(x.shape[1], ct.float32)
    return acc, 1.0 / (ct.sqrt(ct.sum(ss, axis=1) / kf) + eps)


@ct.kernel
def mhc_pr_fwd(x, w, proj, r, eps: float, NPAD: ConstInt, TM: ConstInt, TK: ConstInt):
    pid = ct.bid(0)
    acc, rr = proj_tile(x, w, pid, eps, NPAD, TM, TK)
    ct.store(proj, index=(pid, 0), tile=acc)
    ct.store(r, index=(pid,), tile=rr)


def bwd_dx_setup(x, w, NPAD: ConstInt, TM: ConstInt, TK: ConstInt, DWT: ConstBool):
    """mhc_pr_bwd's block setup (shared with mhc_post_pre's dx kernel): block (b, gm), b = c * G
    + g, its group g, column tile c, first row tile gm, K as fp32, the row-tile count, its weight
    tile [NPAD, TK] and the zeroed dweight accumulator ([NPAD, TK]; DWT: transposed, [TK, NPAD]:
    M = TK rows for the tensor cores' warpgroup MMA instead of M = NPAD)."""
    grp = ct.bid(0) % x.shape[1]
    cj = ct.bid(0) // x.shape[1]
    gm = ct.bid(1)
    kf = ct.astype(x.shape[1] * x.shape[2], ct.float32)
    ntm = ct.num_tiles(x, axis=0, shape=(TM, 1, TK))
    wt = ct.reshape(ct.load(w, index=(0, grp, cj), shape=(NPAD, 1, TK), padding_mode=PAD_ZERO), (NPAD, TK))
    dw = ct.zeros((TK, NPAD) if DWT else (NPAD, TK), dtype=ct.float32)
    return grp, cj, gm, kf, ntm, wt, dw


def bwd_dx_tile(dproj, dr, x, r, wt, grp, cj, m, kf, eps, NPAD: ConstInt, TM: ConstInt, TK: ConstInt,
                P3: ConstBool):
    """Row tile m of proj_rms's dx in fp32: dproj @ w (dproj split into bf16 hi + lo for the
    tensor cores) + the rms term; also returns hi, lo and the x tile for the dweight update.
    P3: a third bf16 term lo2 = bf16(dproj - hi - lo) (~24 mantissa bits, fp32's): for callers
    whose dx feeds fp32 results (mhc_post_pre's d_total); a bf16 dx needs only hi + lo."""
    gp = ct.load(dproj, index=(m, 0), shape=(TM, NPAD), padding_mode=PAD_ZERO)
    hi = gp.astype(ct.bfloat16)
    rest = gp - hi.astype(ct.float32)
    lo = rest.astype(ct.bfloat16)
    xt = ct.reshape(ct.load(x, index=(m, grp, cj), shape=(TM, 1, TK), padding_mode=PAD_ZERO), (TM, TK))
    rr = ct.reshape(ct.load(r, index=(m,), shape=(TM,), padding_mode=PAD_ZERO), (TM, 1))
    gr = ct.reshape(ct.load(dr, index=(m,), shape=(TM,), padding_mode=PAD_ZERO), (TM, 1))
    rms = 1.0 / rr - eps
    coef = ct.where(rms <= eps * ZERO_ROW, gr * 0.0, -gr * rr * rr / (kf * rms))  # a zero row (reference.ZERO_ROW): 0
    gx = ct.mma(hi, wt, ct.zeros((TM, TK), dtype=ct.float32))
    gx = ct.mma(lo, wt, gx)
    if P3:
        gx = ct.mma((rest - lo.astype(ct.float32)).astype(ct.bfloat16), wt, gx)
    gx = gx + coef * xt.astype(ct.float32)
    return gx, hi, lo, xt


def bwd_dw_acc(dw, xt, hi, lo, DWT: ConstBool):
    """dweight += dproj^T @ x for one row tile (hi and lo parts), in the accumulator's layout."""
    if DWT:
        dw = ct.mma(ct.transpose(xt), hi, dw)
        dw = ct.mma(ct.transpose(xt), lo, dw)
    else:
        dw = ct.mma(ct.transpose(hi), xt, dw)
        dw = ct.mma(ct.transpose(lo), xt, dw)
    return dw


@ct.kernel
def mhc_pr_bwd(dproj, dr, x, w, r, dx, p_dw, dagg, hpre_t, eps: float,
               NPAD: ConstInt, TM: ConstInt, TK: ConstInt, AGG: ConstBool, DWT: ConstBool):
    """x, w, dx as [rows, G, Cg] views (proj_rms: G = 1, Cg = K; mhc_pre: G = n,
    Cg = C), p_dw [GM, N, G, Cg]. Block (b, gm), b = c * G + g, does
    column tile c of group g for row tiles gm, gm + GM, ...
    AGG (mhc_pre): dx also gets h_pre[:, g] * dagg[:, c-tile] (dagg: dlayer_in
    [rows, Cg]; hpre_t: h_pre transposed, [G, rows] fp32, so a row tile's h_pre
    is one contiguous load)."""
    # the G groups of one column tile are neighbouring blocks: they read the same dagg tiles
    grp, cj, gm, kf, ntm, wt, dw = bwd_dx_setup(x, w, NPAD, TM, TK, DWT)
    for m in range(gm, ntm, ct.num_blocks(1)):
        gx, hi, lo, xt = bwd_dx_tile(dproj, dr, x, r, wt, grp, cj, m, kf, eps, NPAD, TM, TK, False)
        if AGG:
            # racecheck reports write-write hazards here when T % 4 != 0 (no TMA: the row stride
            # is not 16-byte aligned): the [1, TM] tile goes to shared memory by cp.async in a
            # layout the 128 threads hold twice, so threads t and t + 64 write the same bytes with
            # the same value (racecheck prints equal current / incoming values). Benign.
            hpre = ct.reshape(ct.load(hpre_t, index=(grp, m), shape=(1, TM), padding_mode=PAD_ZERO), (TM, 1))
            ga = ct.load(dagg, index=(m, cj), shape=(TM, TK), padding_mode=PAD_ZERO)
            gx = gx + hpre * ga.astype(ct.float32)
        ct.store(dx, index=(m, grp, cj), tile=ct.reshape(gx.astype(dx.dtype), (TM, 1, TK)))
        dw = bwd_dw_acc(dw, xt, hi, lo, DWT)
    if DWT:
        dw = ct.transpose(dw)
    # Every block (GM <= row tiles) stores its whole clipped tile, so p_dw [GM, N, G, Cg] is
    # fully written. The store is TMA, which compute-sanitizer initcheck does not count as
    # initialization: its reports on mhc_pr_reduce's loads are false (allow_tma=False silences
    # them but cost 0.5% at n=4 on the H100; tests/mhc/test_mhc_cutile_sanitize.py checks coverage).
    ct.store(p_dw, index=(gm, 0, grp, cj), tile=ct.reshape(dw, (1, NPAD, 1, TK)))


@ct.kernel
def mhc_pr_reduce(p_dw, dw, NPAD: ConstInt, TK: ConstInt, GM: ConstInt, PDL: ConstBool):
    """dw = sum of the GM partials p_dw [GM, N, K] in order (GM, a compile-time count <= 7:
    every load issued at once; a runtime loop measured 2 us slower on the H200). The loads are
    bounds-checked (rows N..NPAD-1, columns past K: zero padding), so only written partials are read."""
    if PDL:  # launched while mhc_pr_bwd finishes: its partials are visible after this
        ct.grid_dependency_control_wait()
    kt = ct.bid(0)
    acc = ct.zeros((1, NPAD, TK), dtype=ct.float32)
    for g in ct.static_iter(range(GM)):
        acc += ct.load(p_dw, index=(g, 0, kt), shape=(1, NPAD, TK), padding_mode=PAD_ZERO)
    ct.store(dw, index=(0, kt), tile=ct.reshape(acc, (NPAD, TK)).astype(dw.dtype))


@dataclasses.dataclass(frozen=True)
class ProjRmsCfg:
    """Launch config = compile key (with the dtypes)."""
    NPAD: int   # N padded (>= 16 for the tensor cores)
    TM: int     # rows per tile (bwd; fwd too unless TM_F)
    TK: int     # K per tile (fwd loop step, bwd block width)
    TK_BWD: int
    GM: int     # bwd: row groups (dweight partials)
    TK_RED: int = 64  # dweight reduction K tile (448 blocks at K=28672; 256: 112 blocks)
    OCC: int = 0     # occupancy hints (0: compiler's choice)
    OCC_B: int = 2
    DWT: bool = False  # bwd: the dweight tile accumulated transposed (x^T @ dproj)
    TM_F: int = 0    # fwd rows per tile (0: TM)
    PDL: bool = True         # dweight reduction launched as a programmatic dependent launch

    @classmethod
    @functools.lru_cache(maxsize=1024)  # pure in its arguments; saves ~10-25 us per call
    def heuristic(cls, M: int, N: int, K: int, pre: bool = False) -> "ProjRmsCfg":
        """``pre``: the config of mhc_pre's dx pass (the same bwd kernel with the
        h_aggregate term; K is then C, the per-stream width)."""
        NPAD = max(16, next_pow2(N))
        # fwd (H200, M=32768; h200-mhc-sweep-fwd-2bc1177.txt at 160b993, in git history): n=8 (NPAD 128, K=32768) at
        # TK 64: 1.080 ms, at 128: 1.501; n=4 (K=28672) with 128-row tiles: 0.441 ms, 64
        # rows: 0.452, 32 rows: 0.695. mhc_pre's fwd (same TK, its own kernel) is unchanged.
        TK = min(64 if NPAD >= 64 and not pre else 128, max(16, next_pow2(K)))
        tm_f = 128 if NPAD == 32 and not pre else 0
        # bwd tile (H200, M=32768; h200-mhc-sweep-dwt-3da38b9.txt, h200-mhc-sweep-n8-n2-c608748.txt):
        #  NPAD 32 (n=4, K=28672): the dweight tile accumulated transposed (warpgroup MMA) at
        #    TK 128, 2 blocks per SM of 128 registers: 1.066 ms; [NPAD, TK] with mma.sync at
        #    TK 256: 1.100; transposed at 256: 3.2 (spills). mhc_pre's dx pass (two more
        #    loads per step) keeps the latter: its bwd 2.055 vs 2.144 ms.
        #  NPAD 128 (n=8, K=32768): transposed at TK 64: 2.73 ms; at 128: 2.95 (spills);
        #    [NPAD, TK] at 256: 22.6 (spills 4 KB), at 128: 8.6. mhc_pre n=8 bwd 24.5 -> 4.84.
        #  NPAD 16 (n=2, K=14336): [NPAD, TK] at 256: 0.542 ms; transposed at 64: 0.817, at
        #    128: 3.27 (spills).
        #  NPAD 64 (n=5, 6): not measured; as NPAD 128 (no spills in its SASS).
        # row groups: at most 7 (K=28672: 5.9 waves of blocks; GM=8 at TK 256: 6.8 waves;
        # h200-mhc-sweep-proj-rms-ebe30f2.txt, h200-mhc-check-17b371f.txt: 5 and 10 slower)
        if NPAD >= 64:
            dwt, tk_b = True, 64
        elif NPAD == 32 and not pre:
            dwt, tk_b = True, 128
        else:
            dwt, tk_b = False, 256
        # (n=1, C=7168: 7 row groups 0.417 ms, 10 groups 0.432: h200-mhc-n1-n8-447a71f.txt)
        return cls(NPAD=NPAD, TM=64, TK=TK, TK_BWD=min(tk_b, max(16, next_pow2(K))),
                   GM=max(1, min(7, cdiv(M, 64 * 16))), DWT=dwt, TM_F=tm_f)


def fwd_launch(x, weight, proj, r, eps: float, cfg: ProjRmsCfg | None = None) -> Launch:
    M, K = x.shape
    cfg = cfg or ProjRmsCfg.heuristic(M, weight.shape[0], K)
    tm = cfg.TM_F or cfg.TM
    return Launch(mhc_pr_fwd, (cdiv(M, tm),),
                  (x, weight, proj, r, float(eps), cfg.NPAD, tm, cfg.TK), cfg, occ(cfg.OCC))


def bwd_launches(dproj, dr, x, weight, r, dx, dweight, eps: float,
                 cfg: ProjRmsCfg | None = None, groups: int = 1, agg=None) -> list[Launch]:
    """proj_rms bwd (groups = 1), or mhc_pre's dx/dweight pass: groups = n (x [M, n*C]
    seen as [M, n, C]) and agg = (dlayer_in [M, C], h_pre transposed [n, M] fp32)."""
    M, K = x.shape
    G, Cg = groups, K // groups
    cfg = cfg or ProjRmsCfg.heuristic(M, weight.shape[0], K if G == 1 else Cg, pre=G > 1)
    gm = min(cfg.GM, cdiv(M, cfg.TM))
    # N rows, not NPAD: the padded rows of the dweight tiles are clipped by the store
    N = weight.shape[0]
    p_dw = torch.empty((gm, N, G, Cg), dtype=torch.float32, device=x.device)
    dagg, hpre_t = agg if agg is not None else (dr, dproj)
    bwd = Launch(mhc_pr_bwd, (G * cdiv(Cg, cfg.TK_BWD), gm),
                 (dproj, dr, x.view(M, G, Cg), weight.view(-1, G, Cg), r, dx.view(M, G, Cg), p_dw,
                  dagg, hpre_t, float(eps), cfg.NPAD, cfg.TM, cfg.TK_BWD,
                  agg is not None, cfg.DWT),
                 cfg, occ(cfg.OCC_B))
    red = Launch(mhc_pr_reduce, (cdiv(K, cfg.TK_RED),),
                 (p_dw.view(gm, N, K), dweight, cfg.NPAD, cfg.TK_RED, gm,
                  cfg.PDL), cfg, pdl=cfg.PDL)
    return [bwd, red]
