"""cuTile pack / unpack kernels of the THD context-parallel all_to_all.

Both directions of the a2a (``ops.py``) are one copy before ``all_to_all_single`` and
one after. Each copy changes exactly one of the two orders, so each is a pure
bandwidth kernel (every element read once, written once):

* **section split** ``split_sections_into``: x [Tl, D] (cp side, section-major columns)
  -> send [cp, Tl, D/cp] (block q = the columns head-parallel rank q owns: the q-th 1/cp
  of every section, in section order). Token order unchanged. Pack of cp->hp.
* **section merge** ``merge_sections_into``: its inverse, recv [cp, Tl, D/cp] ->
  out [Tl, D]. Unpack of hp->cp (and the backward of the split).
* **to rank-major** ``to_rank_major_into``: x [T, D/cp] natural packed order ->
  send [T, D/cp] rank-major zigzag order (rank 0's local tokens, then rank 1's, ...).
  Pack of hp->cp.
* **to natural** ``to_natural_into``: its inverse, recv [T, D/cp] rank-major -> out
  [T, D/cp] natural. Unpack of cp->hp (and the backward of to-rank-major).

Sections: a block owns BT consecutive rows (MBT in the merge) and one rank q (QGRID: grid
[row blocks, cp], so cp 8's few rows still make thousands of blocks; the merge's blocks
run rank fastest, QFIRST: a 1-D grid of (row block, rank) items); for every section s
it moves rank q's piece [BT, w_s/cp] in column tiles of BDs columns, BDs the largest power
of two <= BD dividing the piece's source start, destination start and width (so every
tile lies inside its piece, loads and stores are plain tile-space accesses: 16-byte
vectors / TMA where the widths allow; Qwen3-Next's q|k|v|z pieces tile at BD). A piece
narrower than 16 bytes a row (b|a: 8 bytes at cp 8) moves by an element gather and
scatter (NARROW), or (GROUP, a variant: slower for the split, no faster for the merge) all
ranks' narrow pieces of a row block as one permuted dense tile. The section widths are
compile-time constants of a kernel made per layout (``_section_kernel``); Tl is a dynamic
shape.

Why cp 8 was slow (H200, benchmarks/probes/cp_merge_align.py): at Qwen3-Next widths the
per-rank row is D/cp = 1544 bf16 = 3088 bytes, 16-byte but not 32-byte (sector) aligned.
The section kernels compile to per-thread 16-byte loads and stores (128 threads, no TMA,
whatever allow_tma says; the PTX shows it), and such loads from [16, 256] tiles of those
rows (the merge reads recv) ran at 22-27% of the copy ceiling; the same kernel on 3104- or
3072-byte rows at 82-88%; 4-row tiles 71%. The merge's fix (DYNQ): its rank q comes from a
[cp] int32 tensor on the device (arange, ``_ranks``) instead of bid(1); with tile indices
that depend on loaded data, tileiras builds the copy as a warp-specialized TMA pipeline
(384 threads, cp.async.bulk.tensor), as it does for the token kernels (whose rows come from
cu_seqlens). That reads the misaligned rows well (32-row merge tiles at cp 8) and is faster
at cp 2 and 4 too; the split, whose misaligned side is its stores, is slower that way and
keeps bid(1) (numbers in ``PackCfg.heuristic``). This relies on a compiler heuristic, not
an API: a tileiras that changes it changes the speed (never the result); the bench shows it.
The merge's remaining loss was its block order: bid-major, the blocks in flight wrote one
rank's 512-byte / 1 KiB pieces of many out rows (24 KiB apart at cp 8); rank first (QFIRST),
the cp blocks of one row block run together and write its out rows whole (cp 8 79.0 ->
86.8%, cp 4 87.3 -> 93.7, cp 2 92.3 -> 94.6).

Tokens: a block owns TBT consecutive destination rows and computes each row's source
row from cu_seqlens on the device (no index map in memory, no host read): the
sequence a position falls in is the count of cu_seqlens[1..N] entries <= it (tiles of
BK entries, any N), then the zigzag arithmetic of ``perm.py``. Each zigzag chunk is a
contiguous run of rows in both orders, so where the block's TBT source rows are one
run (RUNS: every block but the few that straddle a chunk boundary or the end) it moves
plain [TBT, TBD] tiles (default 32 rows of 1 KiB) from row srow[0] (a tiled view whose
row step is 1, VIEW; or an array slice) to its own rows (EXACT: dc // TBD full tiles, then
one tile per power of two of the remainder, e.g. 772 words = 3 x 256 + 4, not a last
256-word tile that is mostly padding); the other blocks gather rows as [TBT, TBD] tiles
(``load_advanced_indexing``: row-index tile x column slice; EGATHER: element gather). 2-byte
rows of even length move as int32 words (WORDS: half the accesses). ROWWISE (one [1, TBD]
load + store per row) is a slower variant kept for the sweep. Zero-length sequences are
never selected (their end equals their start).

Backend limits (the spec's cutile Backend): SM 9.0 / 10.x; bf16, fp16, fp32 (fp64:
the torch backend); contiguous tensors; int32 indexing (every tensor < 2**31
elements, T < 2**31 / cp); cu_seqlens int32 on x's device (ops.py converts an int64
one on the device and moves a CPU one there, once per distinct value). Compile key:
PackCfg (cp, the per-rank section widths, tile sizes; never T or N) + dtypes. Importing
this module needs ``cuda.tile`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import cuda.tile as ct
import torch
import torch.distributed as dist

from tilekernels._cutile import PAD_ZERO, Launch, cdiv, next_pow2, occ, pow2_floor, sm_count
from tilekernels._glue import empty, kernel, may_keep

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class PackCfg:
    """Launch config = compile key (with the argument dtypes) of all four kernels.

    cp; parts[s] = w_s / cp (columns of section s one hp rank owns); src[s] = section s's
    first cp-side column; dst[s] = its first column inside a rank's D/cp block; bds[s] =
    the section kernels' column tile of section s (<= BD); BT the split's rows per block,
    MBT the merge's (0: BT), MBD its column tile cap (0: BD), DYNQ its rank table; the
    token kernels' tile is ``token_tile``, EXACT its tail tiles, TOCC their occupancy hint;
    BK cu_seqlens entries per search step. The defaults come from
    ``heuristic`` (H200 sweep in its doc); the other flags are the variants the sweep and
    the tests run.
    """
    cp: int
    parts: tuple[int, ...]
    src: tuple[int, ...]
    dst: tuple[int, ...]
    bds: tuple[int, ...]
    BT: int = 8
    MBT: int = 0             # merge's rows per block (0: BT)
    BD: int = 256
    BK: int = 64
    ELT: int = 2             # element size (bytes)
    TMA: bool = True         # section tiles of >= 16 bytes a row may move through TMA
    SMALL_TMA: bool = False  # ... and the narrower ones (b|a pieces at cp 8: 8 bytes a row)
    NARROW: bool = True      # sections whose per-rank piece is < 16 bytes a row: element gather/scatter
    WORDS: bool = True       # token kernels move 4-byte words (rows of an even number of 2-byte elements)
    ROWWISE: bool = False    # token kernel: per-row [1, BD] tile load + store (else a [BT, BD] row gather)
    QGRID: bool = True       # section kernels: one block per (row block, rank) (else per row block)
    RUNS: bool = True        # token kernels: contiguous source runs as plain [TBT, TBD] tiles (else gather)
    VIEW: bool = True        # ... through an overlapping tiled view (row step 1; else an array slice)
    FLAT: bool = False       # QGRID: send / recv as [cp*Tl, dc], rank q's rows an array slice (else 3-D tiles)
    EGATHER: bool = False    # RUNS: the other blocks gather elements (ct.gather; else load_advanced_indexing)
    EXACT: bool = False      # RUNS: columns in full TBD tiles plus power-of-two tail tiles (else padded TBD tiles)
    DYNQ: bool = False       # QGRID merge: rank q read from a [cp] int32 device tensor (TMA pipeline; _section_kernel)
    MBD: int = 0             # the merge's column tile (0: BD)
    TBT: int = 0             # token kernels' rows per block (0: token_tile's default)
    TBD: int = 0             # token kernels' column tile (0: token_tile's default)
    TOCC: int = 0            # token kernels' occupancy hint (0: OCC)
    OCC: int = 0             # occupancy hint (section kernels; token kernels unless TOCC)
    PERSIST: int = 0         # QGRID merge: PERSIST blocks a SM, each looping over (row block, rank) items
    QFIRST: bool = False     # QGRID merge: a 1-D grid of (row block, rank) items, rank fastest
    GROUP: bool = False      # QGRID: narrow pieces of all ranks as one dense permuted tile (``group``), rank 0's block
    NOCHK: bool = False      # token run tiles (in bounds by construction) without bounds checks
    LAT: int = 0             # latency hint (1-10) of the token run tiles' loads and stores (0: none)

    @property
    def token_tile(self) -> tuple[int, int]:
        """(rows, columns) of the token kernels' tile: columns in the moved unit (4-byte words
        with WORDS, else elements). RUNS: TBT rows (default 32) of TBD columns (default 1 KiB);
        gather only: 32 rows of 256 bytes (the first design's tile)."""
        unit = 4 if self.WORDS else self.ELT
        if self.RUNS:
            return (self.TBT or 32, self.TBD or max(1, 1024 // unit))
        return (self.TBT or 32, self.TBD or max(1, 256 // unit))

    @property
    def dc(self) -> int:
        return sum(self.parts)

    @property
    def group(self) -> tuple[int, int, int] | None:
        """GROUP: (first section k, count g, per-rank width p) of the narrow sections moved as one
        dense tile: the g sections k.. are consecutive, narrow (p * ELT < 16 bytes), of one width
        p, g * p and cp powers of two, and their starts tile-aligned (dst[k] % (g*p) == 0,
        src[k] % (g*cp*p) == 0). Then rank q's pieces [BT, g, p] of recv / send are columns
        dst[k].. and the cp side's are [BT, g, cp, p] at src[k]..: a [cp, BT, g*p] tile and a
        [BT, g*cp*p] tile, one a permute of the other (Qwen3-Next at cp 8: b|a, [8, BT, 8] <->
        [BT, 64], 16 and 128 bytes a row instead of 8-byte element gathers). None otherwise."""
        if not (self.GROUP and self.QGRID and not self.FLAT):
            return None
        nar = [s for s, p in enumerate(self.parts) if p * self.ELT < 16]
        if not nar or nar != list(range(nar[0], nar[0] + len(nar))):
            return None
        k, g, p = nar[0], len(nar), self.parts[nar[0]]
        ok = (all(self.parts[s] == p for s in nar) and _pow2_divisor(g * p) == g * p
              and _pow2_divisor(self.cp) == self.cp and self.dst[k] % (g * p) == 0
              and self.src[k] % (g * self.cp * p) == 0)
        return (k, g, p) if ok else None

    @property
    def width(self) -> int:
        return self.dc * self.cp

    @classmethod
    @functools.lru_cache(maxsize=256)  # pure in its arguments; runs on every call's host path
    def heuristic(cls, sections: tuple[int, ...], cp: int, elt: int = 2, BT: int = 0,
                  BD: int = 0, **flags) -> "PackCfg":
        """From the section widths (full, cp side), cp and the element size only (never T or N).

        BD: 512 bytes of a row per column tile (256 bf16 / 128 fp32 columns). From the H200
        runs of benchmarks/cp_pack_check.py --sweep (Qwen3-Next sections, T = 65536, bf16; % of
        the 4.27 TB/s copy ceiling; "odd" rows: a per-rank row, D/cp * elt bytes, not 32-byte
        aligned, as cp 8's 3088 bytes; cp 2 / 4 / 8):

        * split BT = 8, per-thread loads / stores: 86.4 / 85.7 / 80.8% (16 rows: 85.6 / 84.2 /
          74.9; through the DYNQ TMA pipeline 68 / 81 / 46-61; session 6 at cp 8: rank-first
          blocks 81.2, occupancy hint 4 / 8 80.7 / 81.2, the b|a group tile 71.1, persistent
          2 a SM 51.8 and 54 at cp 2 / 4: the rank order and persistence are the merge's only);
        * merge DYNQ (TMA pipeline) in rank-first blocks (QFIRST: the cp blocks of a row block
          run together, so out's rows are written whole), 16 rows: 94.6 / 93.7% (bid-major grid
          92.3 / 87.3; persistent, PERSIST 2 blocks a SM looping over the (rows, rank) items,
          92.5 / 89.7-90.1; per-thread loads 83.0 / 80.9); odd rows 32 rows, 1 KiB column tiles
          (MBD): 86.8% at cp 8 (bid-major 79.0-79.2; persistent 2 / 4 a SM 83.8-84.0 / 84.7; 16
          rows 77.4; with the b|a group tile 86.5-86.9; the group tile alone 80.5; a latency
          hint 79.4; before: 512 B 79.1, 64 rows 77.5, per-thread loads of 4 rows 70.4, 16 rows 22);
        * token kernels 32 rows of 1 KiB (TBD) with EXACT tail tiles: 89.3 / 89.8 / 81.7% to
          natural, 91.1 / 90.4 / 81.4% to rank-major (the previous 512-byte tiles, 16 rows at
          cp 2: 84.3 / 87.9 / 78.2 and 87.5 / 88.7 / 78.8; 16 rows of 1 KiB: 87.7 / 77.5 /
          76.4); odd rows occupancy hint 2 (no hint: 74-75, 1: 79-80, 3: 78 at cp 8) and
          latency hint 8 (LAT; cp 8 to natural / to rank-major 81.7-81.9 / 81.1-81.4, without
          80.9 / 80.6-80.7, hint 4 80.9 / 80.7, 10 81.1 / 80.5, 8 with occupancy 1 78.1 / 77.2;
          at cp 2 / 4 within 0.4 either way: not used there; unchecked tiles, NOCHK: no change).

        ``flags`` set any field (sweeps and tests).
        """
        if cp < 1 or any(w <= 0 or w % cp for w in sections) or not sections:
            raise ValueError(f"cp pack cutile: sections {sections} are not positive multiples of cp={cp}")
        BD = BD or max(1, 512 // elt)
        BT = BT or 8
        parts = tuple(w // cp for w in sections)
        row = sum(parts) * elt  # bytes of one per-rank row (send / recv / the hp side)
        odd = row % 32 != 0
        flags = {"MBT": 32 if odd else 16, "DYNQ": True, "MBD": 1024 // elt if odd else 0,
                 "TOCC": 2 if odd else 0, "EXACT": True, "QFIRST": True, "LAT": 8 if odd else 0, **flags}
        src = tuple(sum(sections[:s]) for s in range(len(sections)))
        dst = tuple(sum(parts[:s]) for s in range(len(sections)))
        bds = _col_tiles(src, dst, parts, BD)
        return cls(cp=cp, parts=parts, src=src, dst=dst, bds=bds, BT=BT, BD=BD, ELT=elt, **flags)


def _col_tiles(src, dst, parts, BD) -> tuple[int, ...]:
    """Per section: the largest power of two <= BD dividing the piece's source start, destination
    start and width (its column tile in the section kernels)."""
    return tuple(min(BD, pow2_floor(_pow2_divisor(math.gcd(math.gcd(a, b), p)))) for a, b, p in zip(src, dst, parts))


def _pow2_divisor(x: int) -> int:
    """Largest power of two dividing x (x = 0: 2**30)."""
    return 1 << 30 if x == 0 else x & -x


# ------------------------------------------------------------------ section kernels


@functools.lru_cache(maxsize=64)
def _section_kernel(cfg: PackCfg, split: bool):
    """The section split (split=True: [Tl, D] -> [cp, Tl, D/cp]) or merge kernel of one
    layout. Sections are static (closure constants, unrolled); ranks and column tiles
    within a piece are loops.

    DYNQ (the merge): the block's rank q is read from a [cp] int32 device tensor (arange(cp),
    ``_ranks``) instead of taken from bid(1). Same values, but with tile indices that depend
    on loaded data tileiras (13.5) builds the copy as a warp-specialized TMA pipeline (384
    threads, cp.async.bulk.tensor loads and stores) instead of per-thread 16-byte loads and
    stores (128 threads; checked in the PTX of both). On the H200 that reads recv's
    3088-byte (16- but not 32-byte aligned) rows at cp 8 far better (benchmarks/cp_pack_check.py:
    see ``PackCfg.heuristic``) and is faster at cp 2 and 4 too; for the split (whose
    misaligned rows are the stores) it is slower everywhere, so the split never uses it.
    MBD: the merge's column tile (0: BD)."""
    CP, NS = cfg.cp, len(cfg.parts)
    parts, src, dst = cfg.parts, cfg.src, cfg.dst
    bds = cfg.bds if split or not cfg.MBD else _col_tiles(src, dst, parts, cfg.MBD)
    BT = cfg.BT if split else (cfg.MBT or cfg.BT)
    # TMA boxes need >= 16 bytes along the contiguous dim: narrower pieces use plain loads
    tma = tuple(cfg.TMA and (b * cfg.ELT >= 16 or cfg.SMALL_TMA) for b in bds)

    W = tuple(cfg.cp * p for p in parts)
    WP = tuple(next_pow2(w) for w in W)
    narrow = tuple(cfg.NARROW and p * cfg.ELT < 16 for p in parts)

    QG = cfg.QGRID
    FL = cfg.QGRID and cfg.FLAT
    DQ = QG and cfg.DYNQ and not split
    CPP = next_pow2(CP)
    PP = tuple(next_pow2(p) for p in parts)

    def narrow_piece(a, b, bt, q, s, pp):
        """Rank q's piece of section s ([BT, p_s] columns, p_s padded to pp), element-wise."""
        col = ct.arange(pp, dtype=ct.int32)
        r2 = ct.reshape(bt * BT + ct.arange(BT, dtype=ct.int32), (BT, 1))
        live = ct.reshape(col < parts[s], (1, pp))
        xc = ct.reshape(src[s] + q * parts[s] + col, (1, pp))
        bc = ct.reshape(dst[s] + col, (1, pp))
        bi = (r2, bc) if FL else (q, r2, bc)
        if split:
            ct.scatter(b, bi, ct.gather(a, (r2, xc), mask=live), mask=live)
        else:
            ct.scatter(a, (r2, xc), ct.gather(b, bi, mask=live), mask=live)

    def tiles(a, b, bt, q, s):
        """Rank q's piece of section s in [BT, bds[s]] tiles."""
        B = bds[s]
        n = parts[s] // B
        M = tma[s]
        c0 = src[s] // B + q * n          # column tile of x / out (tile-space)
        d0 = dst[s] // B                  # column tile of send / recv
        for j in range(n):
            if FL:  # b is rank q's [Tl, dc] slice
                if split:
                    t = ct.load(a, index=(bt, c0 + j), shape=(BT, B), padding_mode=PAD_ZERO, allow_tma=M)
                    ct.store(b, index=(bt, d0 + j), tile=t, allow_tma=M)
                else:
                    t = ct.load(b, index=(bt, d0 + j), shape=(BT, B), padding_mode=PAD_ZERO, allow_tma=M)
                    ct.store(a, index=(bt, c0 + j), tile=t, allow_tma=M)
            elif split:
                t = ct.load(a, index=(bt, c0 + j), shape=(BT, B), padding_mode=PAD_ZERO, allow_tma=M)
                ct.store(b, index=(q, bt, d0 + j), tile=ct.reshape(t, (1, BT, B)), allow_tma=M)
            else:
                t = ct.load(b, index=(q, bt, d0 + j), shape=(1, BT, B), padding_mode=PAD_ZERO, allow_tma=M)
                ct.store(a, index=(bt, c0 + j), tile=ct.reshape(t, (BT, B)), allow_tma=M)

    GR = cfg.group if QG else None
    PS = QG and cfg.PERSIST > 0 and not split
    QF = QG and cfg.QFIRST and not PS and not split
    # sections moved piece by piece (GROUP's narrow sections move in ``group_tile``)
    SECS = tuple(s for s in range(NS) if GR is None or not GR[0] <= s < GR[0] + GR[1])

    def rank_of(ranks, qi):
        """The block's rank: qi (its grid index), or (DQ) ranks[qi] loaded from the device."""
        if DQ:
            k = ct.arange(CPP, dtype=ct.int32)
            v = ct.load(ranks, index=(0,), shape=(CPP,), padding_mode=PAD_ZERO)
            return ct.sum(ct.where(k == qi, v, 0))
        return qi

    def group_tile(a, b, bt):
        """GROUP: the narrow sections k..k+g-1 of every rank for rows bt*BT.. as one dense tile:
        send / recv [cp, BT, g*p] at column dst[k] <-> x / out [BT, g*cp*p] at src[k] (a
        reshape to [cp, BT, g, p] / [BT, g, cp, p] and a permute; PackCfg.group)."""
        k, g, p = GR
        GP, GW = g * p, g * CP * p
        if split:
            t = ct.load(a, index=(bt, src[k] // GW), shape=(BT, GW), padding_mode=PAD_ZERO)
            t = ct.permute(ct.reshape(t, (BT, g, CP, p)), (2, 0, 1, 3))
            ct.store(b, index=(0, bt, dst[k] // GP), tile=ct.reshape(t, (CP, BT, GP)))
        else:
            t = ct.load(b, index=(0, bt, dst[k] // GP), shape=(CP, BT, GP), padding_mode=PAD_ZERO)
            t = ct.permute(ct.reshape(t, (CP, BT, g, p)), (1, 2, 0, 3))
            ct.store(a, index=(bt, src[k] // GW), tile=ct.reshape(t, (BT, GW)))

    def item(a, b, ranks, bt, qi):
        """QGRID: rank qi's pieces of rows bt*BT.. (and with GROUP, for qi = 0, every rank's
        narrow pieces of those rows)."""
        for s in ct.static_iter(SECS):
            q = rank_of(ranks, qi)
            bq = b
            if FL:
                TL = a.shape[0]
                bq = b.slice(axis=0, start=q * TL, stop=q * TL + TL)
            if narrow[s]:
                narrow_piece(a, bq, bt, q, s, PP[s])
            else:
                tiles(a, bq, bt, q, s)
        if GR is not None:
            if qi == 0:
                group_tile(a, b, bt)

    def body(a, b, ranks):
        """split: a = x [Tl, D], b = send [cp, Tl, dc]; merge: a = out, b = recv; ranks: DQ's
        [cp] rank table (else None). QGRID items (row block, rank): from the grid [row blocks,
        cp]; the merge's QFIRST: a 1-D grid, rank fastest (the cp blocks of one row block run
        together and write out's rows whole); its PERSIST: a loop over the items (rank fastest)
        with the grid's stride."""
        if PS:
            nw = ct.cdiv(a.shape[0], BT) * CP
            for w in range(ct.bid(0), nw, ct.num_blocks(0)):
                item(a, b, ranks, w // CP, w % CP)
        elif QF:
            item(a, b, ranks, ct.bid(0) // CP, ct.bid(0) % CP)
        elif QG:
            item(a, b, ranks, ct.bid(0), ct.bid(1))
        else:
            bt = ct.bid(0)
            for s in ct.static_iter(range(NS)):
                if narrow[s]:
                    # the whole section at once, element-wise: [BT, w_s] of x <-> cp pieces of
                    # p_s columns (rows past Tl fail the bounds checks: nothing moves)
                    col = ct.arange(WP[s], dtype=ct.int32)
                    rank = col // parts[s]
                    r2 = ct.reshape(bt * BT + ct.arange(BT, dtype=ct.int32), (BT, 1))
                    live = ct.reshape(col < W[s], (1, WP[s]))
                    xc = ct.reshape(src[s] + col, (1, WP[s]))
                    bq = ct.reshape(rank, (1, WP[s]))
                    bc = ct.reshape(dst[s] + col - rank * parts[s], (1, WP[s]))
                    if split:
                        ct.scatter(b, (bq, r2, bc), ct.gather(a, (r2, xc), mask=live), mask=live)
                    else:
                        ct.scatter(a, (r2, xc), ct.gather(b, (bq, r2, bc), mask=live), mask=live)
                else:
                    for q in range(CP):
                        tiles(a, b, bt, q, s)

    def cp_split_sections(x, send):
        body(x, send, None)

    def cp_merge_sections(out, recv):
        body(out, recv, None)

    def cp_merge_sections_q(out, recv, ranks):
        body(out, recv, ranks)

    return ct.kernel(cp_split_sections if split else cp_merge_sections_q if DQ else cp_merge_sections)


# ------------------------------------------------------------------ token kernel


def _seq_of(pos, cu, N1, SCALE: ConstInt, BT: ConstInt, BK: ConstInt):
    """Per position [BT] int32: the index i of the sequence with cu[i] <= pos*SCALE <
    cu[i+1] (the count of cu[1..N] entries <= pos*SCALE; zero-length sequences are
    skipped because their end equals their start)."""
    key = ct.reshape(pos * SCALE, (BT, 1))
    count = ct.zeros((BT,), dtype=ct.int32)
    for kt in range(ct.cdiv(N1, BK)):
        k = kt * BK + ct.arange(BK, dtype=ct.int32)
        v = ct.load(cu, index=(kt,), shape=(BK,), padding_mode=PAD_ZERO)
        live = ct.reshape((k >= 1) & (k < N1), (1, BK))
        hit = live & (ct.reshape(v, (1, BK)) <= key)
        count = count + ct.sum(ct.where(hit, 1, 0), axis=1).astype(ct.int32)
    return count


def _source_rows(rows, cu, T, CP: ConstInt, TO_RANK_MAJOR: ConstBool, BT: ConstInt, BK: ConstInt):
    """[BT] int32 source row of each destination row (see the module doc; perm.py's maps)."""
    N1 = cu.shape[0]
    TL = T // CP
    if TO_RANK_MAJOR:  # dst row j rank-major, source natural: token_perm[j]
        rank = rows // TL
        local = rows - rank * TL
        i = _seq_of(local, cu, N1, CP, BT, BK)
        ci = ct.gather(cu, i)
        h = (ct.gather(cu, i + 1) - ci) // (2 * CP)
        off = local - ci // CP
        second = off >= h
        chunk = ct.where(second, 2 * CP - 1 - rank, rank)
        srow = ci + chunk * h + off - ct.where(second, h, 0)
    else:  # dst row p natural, source rank-major: token_inv[p]
        i = _seq_of(rows, cu, N1, 1, BT, BK)
        ci = ct.gather(cu, i)
        h = ct.maximum((ct.gather(cu, i + 1) - ci) // (2 * CP), 1)
        off = rows - ci
        c = off // h
        first = c < CP
        rank = ct.where(first, c, 2 * CP - 1 - c)
        srow = rank * TL + ci // CP + ct.where(first, 0, h) + (off - c * h)
    return srow


@ct.kernel
def cp_token_gather(src, dst, cu, CP: ConstInt, TO_RANK_MAJOR: ConstBool, BT: ConstInt, BD: ConstInt,
                    BK: ConstInt):
    """dst [T, dc] rows bid*BT.. = src rows by the zigzag map, gathered as [BT, BD] tiles
    (``load_advanced_indexing``: row-index tile x column slice)."""
    bt = ct.bid(0)
    T = dst.shape[0]
    rows = ct.minimum(bt * BT + ct.arange(BT, dtype=ct.int32), T - 1)
    srow = _source_rows(rows, cu, T, CP, TO_RANK_MAJOR, BT, BK)
    for cj in range(ct.cdiv(dst.shape[1], BD)):
        t = ct.load_advanced_indexing(src, (srow, ct.Slice(cj * BD, BD)), padding_mode=PAD_ZERO)
        ct.store(dst, index=(bt, cj), tile=t)


def _tails(n: int) -> tuple[int, ...]:
    """Powers of two summing to n, largest first: the tail tiles of a row (EXACT)."""
    return tuple(1 << k for k in reversed(range(n.bit_length())) if n >> k & 1)


@functools.lru_cache(maxsize=32)
def _runs_kernel(tails: tuple[int, ...] = (), bd: int = 1, chk: bool = True, lat: int = 0):
    """``cp_token_runs``; with ``tails`` (EXACT: the powers of two of dc % bd, in the moved
    unit) a run block moves dc // bd full [BT, bd] tiles and then one [BT, w] tile per tail
    width w (w divides its column start, so every tile is a plain tile-space access inside
    the row) instead of a last [BT, bd] tile that is mostly padding (cp 8's 772-word rows:
    3 full 256-word tiles and a 4-word one, not a 4th tile of 256). ``chk`` / ``lat``: those
    tiles' bounds checks (NOCHK: off, they lie inside both arrays) and latency hint (LAT)."""
    pre = tuple(sum(tails[:k]) for k in range(len(tails)))
    sub = tuple(bd // w for w in tails)          # tail-width tiles per full tile
    lead = tuple(p // w for p, w in zip(pre, tails))  # tail k's tile index past the full tiles
    NT = len(tails)
    EX = NT > 0
    LT = lat or None

    def cp_token_runs(src, dst, cu, CP: ConstInt, TO_RANK_MAJOR: ConstBool, BT: ConstInt, BD: ConstInt,
                      BK: ConstInt, VIEW: ConstBool, EGATHER: ConstBool):
        """dst [T, dc] rows bid*BT.. from src: where their BT source rows are one contiguous run
        (every block but those that straddle a zigzag chunk boundary or the end), plain [BT, BD]
        tile loads at row offset srow[0] (an overlapping tiled view with a row step of 1, or an
        array slice) and tile stores; else the row gather of ``cp_token_gather``."""
        bt = ct.bid(0)
        T = dst.shape[0]
        rows = ct.minimum(bt * BT + ct.arange(BT, dtype=ct.int32), T - 1)
        srow = _source_rows(rows, cu, T, CP, TO_RANK_MAJOR, BT, BK)
        s0 = ct.min(srow)
        # clamped rows past T repeat the last row's source: never a run
        miss = ct.sum(ct.where(srow == s0 + ct.arange(BT, dtype=ct.int32), 0, 1))
        nc = ct.cdiv(dst.shape[1], BD)
        if miss == 0:
            if VIEW:
                tv = src.tiled_view((BT, BD), padding_mode=PAD_ZERO, traversal_steps=(1, BD))
                if EX:
                    nf = dst.shape[1] // BD
                    for cj in range(nf):
                        ct.store(dst, index=(bt, cj), tile=tv.load((s0, cj), check_bounds=chk, latency=LT),
                                 check_bounds=chk, latency=LT)
                    for k in ct.static_iter(range(NT)):
                        tw = src.tiled_view((BT, tails[k]), padding_mode=PAD_ZERO, traversal_steps=(1, tails[k]))
                        ci = nf * sub[k] + lead[k]
                        ct.store(dst, index=(bt, ci), tile=tw.load((s0, ci), check_bounds=chk, latency=LT),
                                 check_bounds=chk, latency=LT)
                else:
                    for cj in range(nc):
                        ct.store(dst, index=(bt, cj), tile=tv.load((s0, cj)))
            else:
                sl = src.slice(axis=0, start=s0, stop=s0 + BT)
                for cj in range(nc):
                    ct.store(dst, index=(bt, cj), tile=ct.load(sl, index=(0, cj), shape=(BT, BD),
                                                               padding_mode=PAD_ZERO))
        elif EGATHER:
            r2 = ct.reshape(srow, (BT, 1))
            for cj in range(nc):
                col = ct.reshape(cj * BD + ct.arange(BD, dtype=ct.int32), (1, BD))
                ct.store(dst, index=(bt, cj), tile=ct.gather(src, (r2, col)))
        else:
            for cj in range(nc):
                t = ct.load_advanced_indexing(src, (srow, ct.Slice(cj * BD, BD)), padding_mode=PAD_ZERO)
                ct.store(dst, index=(bt, cj), tile=t)

    return ct.kernel(cp_token_runs)


cp_token_runs = _runs_kernel()


@ct.kernel
def cp_token_rows(src, dst, cu, CP: ConstInt, TO_RANK_MAJOR: ConstBool, BT: ConstInt, BD: ConstInt,
                  BK: ConstInt):
    """The same copy row by row: one plain [1, BD] tile load at the source row (a scalar
    tile index) and one store at the destination row per row and column tile (rows past T
    are clamped to the last row: it is written again with its own value)."""
    bt = ct.bid(0)
    T = dst.shape[0]
    rows = ct.minimum(bt * BT + ct.arange(BT, dtype=ct.int32), T - 1)
    srow = _source_rows(rows, cu, T, CP, TO_RANK_MAJOR, BT, BK)
    for cj in range(ct.cdiv(dst.shape[1], BD)):
        for r in ct.static_iter(range(BT)):
            s = ct.reshape(ct.extract(srow, (r,), shape=(1,)), ())
            d = ct.reshape(ct.extract(rows, (r,), shape=(1,)), ())
            ct.store(dst, index=(d, cj), tile=ct.load(src, index=(s, cj), shape=(1, BD), padding_mode=PAD_ZERO))


# ------------------------------------------------------------------ launches


def _check(cfg: PackCfg, what: str, **shapes) -> None:
    for name, (got, want) in shapes.items():
        if got != want:
            raise ValueError(f"cp pack cutile ({what}): {name} is {got}, the config {cfg} needs {want}")


def section_launch(a, b, cfg: PackCfg, split: bool) -> Launch:
    """split: a = x [Tl, D], b = send [cp, Tl, D/cp]; merge: a = out [Tl, D], b = recv."""
    _check(cfg, "sections", width=(a.shape[1], cfg.width), cp=(b.shape[0], cfg.cp), dc=(b.shape[2], cfg.dc),
           rows=(b.shape[1], a.shape[0]))
    rows = cfg.BT if split else (cfg.MBT or cfg.BT)
    nbt = cdiv(a.shape[0], rows)
    if cfg.QGRID and cfg.PERSIST and not split:  # launch geometry only: the kernel loops over the items
        grid = (min(nbt * cfg.cp, cfg.PERSIST * sm_count(a.device)), 1, 1)
    elif cfg.QGRID and cfg.QFIRST and not split:
        grid = (nbt * cfg.cp, 1, 1)
    else:
        grid = (nbt, cfg.cp if cfg.QGRID else 1, 1)
    if cfg.QGRID and cfg.FLAT:
        b = b.view(b.shape[0] * b.shape[1], b.shape[2])
    args = (a, b, _ranks(cfg.cp, a.device)) if cfg.QGRID and cfg.DYNQ and not split else (a, b)
    return Launch(_section_kernel(cfg, split), grid, args, cfg, occ(cfg.OCC))


_RANKS: dict = {}


def _ranks(cp: int, device) -> torch.Tensor:
    """arange(cp) int32 on ``device`` (DYNQ's rank table), made once per (cp, device) by a
    device kernel (no host sync). One made where ``may_keep`` refuses it is used and not cached:
    under CUDA graph capture (captured with the launch: the graph's replays write it, outside
    them it is not valid) or in a graph's pool (Inductor's CUDA-graph warm-up)."""
    key = (cp, str(device))
    t = _RANKS.get(key)
    if t is None or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        t = torch.arange(cp, dtype=torch.int32, device=device)
        if may_keep(t):
            _RANKS[key] = t
    return t


def token_launch(src, dst, cu, cfg: PackCfg, to_rank_major: bool) -> Launch:
    """src, dst [T, D/cp]; cu [N+1] int32 on their device. With WORDS, 2-byte rows of an even
    length move as int32 words (a bit-exact copy in half the accesses)."""
    _check(cfg, "tokens", dc=(dst.shape[1], cfg.dc), src=(tuple(src.shape), tuple(dst.shape)))
    if cfg.WORDS and src.element_size() == 2 and src.shape[1] % 2 == 0:
        src, dst = src.view(torch.int32), dst.view(torch.int32)
    bt, bd = cfg.token_tile
    args = (src, dst, cu, cfg.cp, bool(to_rank_major), bt, bd, cfg.BK)
    if cfg.RUNS and not cfg.ROWWISE:
        tails = _tails(dst.shape[1] % bd) if cfg.EXACT and cfg.VIEW else ()
        chk, lat = (not cfg.NOCHK, cfg.LAT) if tails else (True, 0)
        kern, args = _runs_kernel(tails, bd if tails else 1, chk, lat), args + (cfg.VIEW, cfg.EGATHER)
    else:
        kern = cp_token_rows if cfg.ROWWISE else cp_token_gather
    return Launch(kern, (cdiv(dst.shape[0], bt), 1, 1), args, cfg, occ(cfg.TOCC or cfg.OCC))


def _cfg(sections, cp, x, cfg):
    return cfg or PackCfg.heuristic(tuple(int(w) for w in sections), int(cp), x.element_size())


def split_sections_into(x, send, sections, cfg: PackCfg | None = None) -> None:
    """Pack of cp->hp: x [Tl, D] contiguous -> send [cp, Tl, D/cp] contiguous (written)."""
    if x.shape[0]:
        section_launch(x, send, _cfg(sections, send.shape[0], x, cfg), True).run()


def merge_sections_into(recv, out, sections, cfg: PackCfg | None = None) -> None:
    """Unpack of hp->cp: recv [cp, Tl, D/cp] contiguous -> out [Tl, D] contiguous (written)."""
    if out.shape[0]:
        section_launch(out, recv, _cfg(sections, recv.shape[0], out, cfg), False).run()


def to_rank_major_into(x, cu, cp, send, sections=None, cfg: PackCfg | None = None) -> None:
    """Pack of hp->cp: x [T, D/cp] natural -> send [T, D/cp] rank-major (written).
    ``sections`` only picks the config (None: one section of width cp * D/cp)."""
    if x.shape[0]:
        token_launch(x, send, cu, _cfg(sections or (x.shape[1] * cp,), cp, x, cfg), True).run()


def to_natural_into(recv, cu, cp, out, sections=None, cfg: PackCfg | None = None) -> None:
    """Unpack of cp->hp: recv [T, D/cp] rank-major -> out [T, D/cp] natural (written)."""
    if out.shape[0]:
        token_launch(recv, out, cu, _cfg(sections or (out.shape[1] * cp,), cp, out, cfg), False).run()


# ------------------------------------------------------------------ the a2a (registry kernels)


def _to_hp_cutile(x, plan, group, out) -> None:
    """cp -> hp: x [Tl, D] -> out [cp*Tl, D/cp] (ops._Plan: cp, sections, cu int32 on x's
    device). Split kernel, one all_to_all_single, to-natural kernel."""
    cp = plan.cp
    t_local, d = x.shape
    send = empty((cp, t_local, d // cp), x.dtype, x.device)
    split_sections_into(x, send, plan.sections)
    recv = torch.empty_like(send)  # fully written by the collective
    dist.all_to_all_single(recv, send, group=group)
    to_natural_into(recv.view(cp * t_local, d // cp), plan.cu, cp, out, plan.sections)


def _to_cp_cutile(x, plan, group, out) -> None:
    """hp -> cp: x [T, D/cp] -> out [T/cp, D]. To-rank-major kernel, one
    all_to_all_single, merge kernel."""
    cp = plan.cp
    total, dc = x.shape
    send = empty((total, dc), x.dtype, x.device)
    to_rank_major_into(x, plan.cu, cp, send, plan.sections)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    merge_sections_into(recv.view(cp, total // cp, dc), out, plan.sections)


kernel("thd_cp_to_hp", "cutile", "fwd")(_to_hp_cutile)
kernel("thd_cp_to_hp", "cutile", "bwd")(_to_cp_cutile)
kernel("thd_hp_to_cp", "cutile", "fwd")(_to_cp_cutile)
kernel("thd_hp_to_cp", "cutile", "bwd")(_to_hp_cutile)


def representative_launches(sections=(2048, 2048, 4096, 4096, 32, 32), cp: int = 4, T: int = 4096,
                            N: int = 8, dtype=torch.bfloat16, cfg: PackCfg | None = None) -> dict:
    """The four launches at one problem size, on ``meta`` tensors: what the CI compile
    test exports to cubins (sm_90, sm_100) without a GPU."""
    meta = torch.device("meta")
    cfg = cfg or PackCfg.heuristic(tuple(sections), cp, dtype.itemsize)
    tl, d, dc = T // cp, cfg.width, cfg.dc
    x = torch.empty(tl, d, dtype=dtype, device=meta)
    buf = torch.empty(cp, tl, dc, dtype=dtype, device=meta)
    hp = torch.empty(T, dc, dtype=dtype, device=meta)
    hp2 = torch.empty(T, dc, dtype=dtype, device=meta)
    cu = torch.empty(N + 1, dtype=torch.int32, device=meta)
    return {
        "split": [section_launch(x, buf, cfg, True)],
        "merge": [section_launch(x, buf, cfg, False)],
        "to_rank_major": [token_launch(hp, hp2, cu, cfg, True)],
        "to_natural": [token_launch(hp, hp2, cu, cfg, False)],
    }
