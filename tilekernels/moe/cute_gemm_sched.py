"""Device tile scheduler of the CuTe DSL grouped GEMM (cute_grouped_gemm.py): linear tile id
-> (group, output tile, k range) from the device ``offsets`` (no host sync), and the tile's
operand / output views."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

from .cute_gemm_dequant import BLOCK


@cute.jit
def raster(t: Int32, m_tiles: Int32, n_tiles: Int32, band: cutlass.Constexpr):
    """Linear CTA id -> (m-tile, n-tile): bands of ``band`` m-tiles, m fastest inside a band
    (the CTAs of one wave share A rows and B rows in L2)."""
    per_band = n_tiles * band
    b = t // per_band
    r = t - b * per_band
    mb0 = b * band
    h = cutlass.max(cutlass.min(m_tiles - mb0, band), 1)
    mt = mb0 + r % h
    nt = r // h
    return mt, nt


@cute.jit
def find_group(mOff: cute.Tensor, mt: Int32, G: cutlass.Constexpr, BM: cutlass.Constexpr):
    """The group of the ``mt``-th m-tile of the ragged-m order (groups in order, each cut into
    cdiv(m_g, BM) tiles): (g, its first tile, its first row, its end row, total m-tiles);
    g == G if ``mt`` is past the last tile. One warp-wide inclusive scan of the tile counts
    per 32 groups."""
    lane = cute.arch.lane_idx()
    base = Int32(0)
    g_found = Int32(G)
    tile0 = Int32(0)
    rs = Int32(0)
    re = Int32(0)
    for rnd in cutlass.range_constexpr((G + 31) // 32):
        gi = lane + rnd * 32
        ok = gi < G
        gc = cutlass.min(gi, G - 1)
        lo = Int32(mOff[gc])
        hi = Int32(mOff[gc + 1])
        cnt = cutlass.select_(ok, (hi - lo + (BM - 1)) // BM, 0)
        incl = cnt
        for d in cutlass.range_constexpr(5):
            v = cute.arch.shuffle_sync_up(incl, 1 << d)
            if lane >= (1 << d):
                incl = incl + v
        incl = incl + base
        before = cute.arch.vote_ballot_sync(ok and incl <= mt)
        c = cute.arch.popc(before)
        excl = incl - cnt
        t0 = cute.arch.shuffle_sync(excl, c)
        lo_c = cute.arch.shuffle_sync(lo, c)
        hi_c = cute.arch.shuffle_sync(hi, c)
        nvalid = min(32, G - rnd * 32)
        if g_found == G and c < nvalid:
            g_found = c + rnd * 32
            tile0 = t0
            rs = lo_c
            re = hi_c
        base = cute.arch.shuffle_sync(incl, 31)
    return g_found, tile0, rs, re, base


@cute.jit
def schedule(cfg: cutlass.Constexpr, mOff: cute.Tensor, M: Int32, t: Int32, m_tiles: Int32):
    """Tile ``t`` of the linear order -> (g, m0, m_lim, n0, n_lim, k0, kb_lim, nk): its group
    (G if none), first output row / column and how many are valid, its k range start
    (tokens, wgrad), valid 32-blocks and k-tile count. ``m_tiles`` is the m extent the
    raster uses (ragged m: a bound, or the exact count)."""
    BM, BN, BK = cfg.tile_m, cfg.tile_n, cfg.tile_k
    n_tiles = (cfg.nc + BN - 1) // BN
    if const_expr(cfg.variant != "wgrad"):
        mt, nt = raster(t, m_tiles, Int32(n_tiles), cfg.raster)
        g, tile0, row_s, row_e, _ = find_group(mOff, mt, cfg.G, BM)
        m0 = row_s + (mt - tile0) * BM
        m_lim = row_e - m0
        k0 = Int32(0)
        kb_lim = Int32(cfg.kc // BLOCK)
        nk = Int32((cfg.kc + BK - 1) // BK)
    else:
        mtg = (cfg.N + BM - 1) // BM
        per_g = mtg * n_tiles
        g = cutlass.min(t // per_g, cfg.G)
        mt, nt = raster(t - g * per_g, Int32(mtg), Int32(n_tiles), cfg.raster)
        m0 = cute.assume(mt * BM, divby=BM)
        m_lim = cfg.N - m0
        gc = cutlass.min(g, cfg.G - 1)
        k0 = Int32(mOff[gc])
        kb_lim = (Int32(mOff[gc + 1]) - k0) // BLOCK
        # at least one k-tile (all zeros for an empty group): a k-loop that may run zero times
        # makes ptxas serialize the wgmmas (accumulators read on the loop-skip path)
        nk = cutlass.max((kb_lim * BLOCK + BK - 1) // BK, 1)
    n0 = cute.assume(nt * BN, divby=BN)
    n_lim = cfg.nc - n0
    return g, m0, m_lim, n0, n_lim, k0, kb_lim, nk


@cute.jit
def views(cfg: cutlass.Constexpr, mA: cute.Tensor, mAS: cute.Tensor, mB: cute.Tensor,
           mBS: cute.Tensor, mC: cute.Tensor, g: Int32, m0: Int32, n0: Int32, k0: Int32):
    """The tile's operand and output views, coordinates relative to the tile origin (64-bit
    offsets: M * K may pass 2^31)."""
    n0 = cute.assume(n0, divby=cfg.tile_n)      # (again: a loop-carried value loses it)
    if const_expr(cfg.variant == "wgrad"):
        m0 = cute.assume(m0, divby=cfg.tile_m)
    if const_expr(cfg.variant == "fwd"):
        gA = cute.domain_offset((Int64(m0), 0), mA)
        gAS = cute.domain_offset((Int64(m0), 0), mAS)
        gB = cute.domain_offset((Int64(g) * cfg.N + n0, 0), mB)
        gBS = cute.domain_offset((Int64(g) * cfg.N + n0, 0), mBS)
        gC = cute.domain_offset((Int64(m0), n0), mC)
    elif const_expr(cfg.variant == "dgrad"):
        gA = cute.domain_offset((Int64(m0), 0), mA)
        gAS = cute.domain_offset((Int64(m0), 0), mAS)
        gB = cute.domain_offset((n0, Int64(g) * cfg.N), mB)
        gBS = cute.domain_offset((n0, Int64(g) * (cfg.N // BLOCK)), mBS)
        gC = cute.domain_offset((Int64(m0), n0), mC)
    else:
        gA = cute.domain_offset((m0, Int64(k0)), mA)
        gAS = cute.domain_offset((m0, k0 // BLOCK), mAS)
        gB = cute.domain_offset((n0, Int64(k0)), mB)
        gBS = cute.domain_offset((n0, k0 // BLOCK), mBS)
        gC = cute.domain_offset((Int64(g) * cfg.N + m0, n0), mC)
    return gA, gAS, gB, gBS, gC
