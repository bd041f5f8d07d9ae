"""Probe: does the TMA descriptor's L2 promotion move a streaming kernel's DRAM rate (H200)?

Why: our streaming kernels sit a few percent under a copy's rate and the gap is in their memory pattern, not their
math (gdn_decode's ring: the pattern alone 275 us at B=256 fp32 against a 261 us copy of the same bytes; its bf16
tiles of 128-byte row pieces 161.5 against 142.9 with 256-byte pieces; mhc_proj_rms's backward skeleton 87-90% of
copy; benchmarks/results/gdn.md, nvidia-h200-mhc-cutile.md). One knob of that pattern was never tried: the
descriptor's L2 promotion (how much L2 fetches from DRAM for each request TMA makes: none, 64, 128 or 256 bytes).
CuTe DSL's ``make_tiled_tma_atom`` picks it itself (CUTLASS C++ asks 128 B, DeepGEMM 256 B). This kernel is the
ring's memory pattern with a descriptor built by hand
(``cutlass.experimental.cuda.create_tensor_map_tiled_from_view``), so the promotion is a config field.

The pattern: a row-major matrix X [ROWS, COLS] of 4-byte words (any dtype, seen as bytes) cut into [BR rows, BC
words] tiles; tile id = row block * NCB + column block (NCB = COLS / BC). An item is GROUP consecutive tile ids;
persistent CTAs take items g, g + grid, ... (gdn_decode's (row, key head) items: GROUP 4 = 2 heads x 2 column
blocks of [128 rows, 64 fp32]). NS > 1 (GROUP == NCB: an item is a row band) walks a band's tiles channel-major
over NS streams, as mhc_post_pre's passes do ([64 tokens, 64 bf16 channels] of each of n streams per chunk).
One producer warp (one elected lane) issues a TMA load per tile into a STAGES-deep ring
(``_cute.tma_pipeline``); CONSUMERS threads wait for a stage, read it in 16-byte vectors (thread t: vectors t,
t + CONSUMERS, ..), release it and, with STORE, store the vectors back in place (st.global.v4), as the ring's
consumers store the new state. Results are the input unchanged (the tests check that: every word rewritten).
Not a library kernel: benchmarks/probes only.

Session 36 added two fields: SPLIT (sibling items of a band, item r taking chunks r, r + SPLIT, ..: the walk of
mhc_post_pre's passes) and IL (a tile's two halves landing as IL-row groups from one 4-D box: whether two adjacent
128-byte boxes stream like one 256-byte box).

Run on the GPU: ``python benchmarks/probes/tma_promo_probe.py [--wide | --il] [name filters]`` (cute bundle; --wide:
session 27's tile shapes, ``_wide_cases``; --il: session 36's, ``_il_cases``); prints a table of us and % of the
bytes' copy time measured in the same run (torch copy_ and an in-place mul_ of the same buffer).
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64
from cutlass._mlir import ir
from cutlass.experimental import primitives as prims
from cutlass.experimental.cuda import TensorMap, TensorMapL2Promotion, create_tensor_map_tiled_from_view
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as CU

_NAME = "probes.tma_promo"
SMEM_CTA = 227 * 1024


@dataclasses.dataclass(frozen=True)
class StreamCfg:
    """Compile key. COLS, BR, BC in 4-byte words; PROMO: the descriptor's L2 promotion (0 none, 1 64 B, 2 128 B,
    3 256 B); STORE: consumers store each tile back in place; CPS: CTAs an SM."""

    COLS: int
    BR: int
    BC: int
    GROUP: int
    NS: int = 1
    STAGES: int = 2
    CONSUMERS: int = 256
    CPS: int = 2
    PROMO: int = 2
    STORE: bool = True
    PAIR: bool = False  # consumers store tiles j, j + 1 of an item together (their rows' pieces side by side)
    FENCE: bool = False  # fence.proxy.async before a consumer warp releases a stage
    LDG: int = 0  # 1: no TMA, consumers load each tile from global themselves (16-byte loads); 2: two tiles at once
    CTAS: int = 0  # the grid (0: SMs x CPS, persistent; items: one item a CTA)
    SPLIT: int = 1  # NS > 1: SPLIT sibling items a band, item r taking chunks r, r + SPLIT, .. of every stream (as
    # mhc_post_pre's backward pass's sibling CTAs do)
    IL: int = 0  # > 0: a tile's two BC/2-word halves land as IL-row groups, [BR/IL][2][IL][BC/2] in shared memory
    # (a 4-D box: each IL-row group of the left half, then of the right half); the request order of one
    # [BR, BC] box for IL 1, of two [BR, BC/2] boxes in turn for IL = BR
    DOWN: bool = False  # tile ids column-block-major (an item walks down the rows of one column block, as a CTA
    # of mhc_proj_rms's backward walks its channel slice's row tiles)

    def __post_init__(self):
        bad = []
        if self.COLS % self.BC or not 1 <= self.BR <= 256 or not 4 <= self.BC <= 256 or self.BC % 4:
            bad.append("BC | COLS, BR <= 256, BC a multiple of 4 words (16 bytes) <= 256")
        if self.vectors % self.CONSUMERS or self.CONSUMERS % 32 or self.CONSUMERS % (self.BC // 4):
            bad.append("whole warps of consumers dividing the tile's 16-byte vectors")
        if self.NS > 1 and (self.GROUP != self.NCB or self.NCB % self.NS):
            bad.append("NS > 1: GROUP == NCB, NS | NCB")
        if self.PROMO not in (0, 1, 2, 3) or self.STAGES < 2:
            bad.append("PROMO in 0..3, STAGES >= 2")
        if self.PAIR and (self.GROUP % 2 or self.NS > 1 or self.STAGES < 2):
            bad.append("PAIR: GROUP even, NS 1")
        if self.LDG not in (0, 1, 2) or self.GROUP % max(1, self.LDG):
            bad.append("LDG in 0, 1, 2 dividing GROUP")
        if self.SPLIT > 1 and (self.NS == 1 or (self.NCB // self.NS) % self.SPLIT or self.LDG):
            bad.append("SPLIT > 1: NS > 1, SPLIT | chunks a stream, a TMA ring")
        if self.IL and (self.BR % self.IL or self.BC % 8 or self.LDG or self.PAIR):
            bad.append("IL: IL | BR, 8 | BC, a TMA ring without PAIR")
        if self.smem_bytes > SMEM_CTA:
            bad.append(f"{self.smem_bytes} bytes of shared memory <= {SMEM_CTA}")
        if bad:
            raise ValueError(f"tma_promo probe: config {self} needs " + "; ".join(bad))

    @property
    def NCB(self) -> int:
        return self.COLS // self.BC

    @property
    def item_tiles(self) -> int:
        return self.GROUP // self.SPLIT

    @property
    def tile_bytes(self) -> int:
        return self.BR * self.BC * 4

    @property
    def vectors(self) -> int:
        return self.tile_bytes // 16

    @property
    def stage_words(self) -> int:
        return CU.cdiv(self.tile_bytes, 1024) * 1024 // 4

    @property
    def smem_bytes(self) -> int:
        return 0 if self.LDG else self.STAGES * self.stage_words * 4 + 16 * self.STAGES + 2048


def _tile(cfg, item, j, items):
    """(row block, column block) of tile j of an item (traced inline): row-major tile ids (DOWN: column-block-major),
    or with NS > 1 a band's tiles channel-major over NS streams."""
    if cutlass.const_expr(cfg.SPLIT > 1):
        r = item % cfg.SPLIT
        j = (j // cfg.NS * cfg.SPLIT + r) * cfg.NS + j % cfg.NS
        item = item // cfg.SPLIT
    tid = item * cfg.GROUP + j
    rb = tid // cfg.NCB
    cb = tid - rb * cfg.NCB
    if cutlass.const_expr(cfg.DOWN):
        nrb = items * cfg.GROUP // cfg.NCB
        cb = tid // nrb
        rb = tid - cb * nrb
    if cutlass.const_expr(cfg.NS > 1):
        cb = (j % cfg.NS) * (cfg.NCB // cfg.NS) + j // cfg.NS
    return rb, cb


@cute.kernel
def _stream_kernel(cfg: cutlass.Constexpr, desc: cutlass.GridConstant[TensorMap], x: cute.Pointer, items: Int32):
    NT = cfg.CONSUMERS
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    nctas, _, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

    if cutlass.const_expr(cfg.LDG > 0):
        if warp < NT // 32:
            _ldg_consumer(cfg, x, items, tidx, bid, nctas)
    else:
        _ring_stream(cfg, desc.get_ptr(), x, items, tidx, bid, nctas, warp)


@cute.jit
def _ring_stream(cfg: cutlass.Constexpr, dptr, x: cute.Pointer, items: Int32, tidx: Int32, bid: Int32, nctas: Int32,
                 warp: Int32):
    """The ring: one producer warp's TMA loads, the consumers' ld.shared, release, stores."""
    S, NT, BR, BC, GROUP = cfg.STAGES, cfg.CONSUMERS, cfg.BR, cfg.BC, cfg.GROUP
    VPR = BC // 4
    smem = SmemAllocator()
    ring = smem.allocate_tensor(Int32, cute.make_layout(S * cfg.stage_words), byte_alignment=1024)
    pipe = CU.tma_pipeline(smem, S, cfg.tile_bytes, NT // 32)

    if warp == NT // 32:
        if prims.elect_sync():
            prims.prefetch_tensormap(dptr)
        pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, S)
        for item in cutlass.range(bid, items, nctas, unroll=1):
            for j in cutlass.range(cfg.item_tiles, unroll=1):
                rb, cb = _tile(cfg, item, j, items)
                pipe.producer_acquire(pst)
                if prims.elect_sync():
                    dst = ring.iterator + pst.index * cfg.stage_words
                    if cutlass.const_expr(cfg.IL == 1):
                        prims.cp_async_bulk_tensor_shared_cta_global(
                            dst, dptr, [0, cb * 2, rb * BR], pipe.producer_get_barrier(pst))
                    elif cutlass.const_expr(cfg.IL > 0):
                        prims.cp_async_bulk_tensor_shared_cta_global(
                            dst, dptr, [0, 0, cb * 2, rb * (BR // cfg.IL)], pipe.producer_get_barrier(pst))
                    else:
                        prims.cp_async_bulk_tensor_shared_cta_global(
                            dst, dptr, [cb * BC, rb * BR], pipe.producer_get_barrier(pst))
                pst.advance()
        pipe.producer_tail(pst)
    else:
        cst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        vt = ir.VectorType.get([4], Int32.mlir_type)
        P = 2 if cfg.PAIR else 1
        for item in cutlass.range(bid, items, nctas, unroll=1):
            for jj in cutlass.range(cfg.item_tiles // P, unroll=1):
                held = []
                for u in cutlass.range_constexpr(P):
                    j = jj * P + u
                    rb, cb = _tile(cfg, item, j, items)
                    pipe.consumer_wait(cst)
                    base = ring.iterator + cst.index * cfg.stage_words
                    vals = []
                    for q in cutlass.range_constexpr(cfg.vectors // NT):
                        vals.append(cute.arch.load(base + (tidx + q * NT) * 4, vt))
                    CU.release_read_stage(pipe, cst, cfg.FENCE)
                    cst.advance()
                    held.append((rb, cb, vals))
                if cutlass.const_expr(cfg.STORE):
                    for rb, cb, vals in held:
                        g0 = Int64(rb * BR) * cfg.COLS + cb * BC
                        for q in cutlass.range_constexpr(cfg.vectors // NT):
                            v = tidx + q * NT
                            if cutlass.const_expr(cfg.IL > 0):
                                r, w = _il_place(cfg, v)
                                cute.arch.store(x + (g0 + Int64(r) * cfg.COLS + w), vals[q])
                            else:
                                r = v // VPR
                                cute.arch.store(x + (g0 + Int64(r) * cfg.COLS + (v - r * VPR) * 4), vals[q])


@cute.jit
def _il_place(cfg: cutlass.Constexpr, v):
    """(row in the tile, word in the row) of the stage's 16-byte vector v when the tile lies IL-interleaved:
    [BR/IL groups][2 halves][IL rows][BC/2 words]."""
    VH = cfg.BC // 8  # vectors a half row
    line = v // VH
    half = (line // cfg.IL) % 2
    r = (line // (2 * cfg.IL)) * cfg.IL + line % cfg.IL
    return r, half * (cfg.BC // 2) + (v - line * VH) * 4


@cute.jit
def _ldg_consumer(cfg: cutlass.Constexpr, x: cute.Pointer, items: Int32, tidx: Int32, bid: Int32, nctas: Int32):
    """LDG probe: each consumer thread loads its 16-byte vectors of LDG tiles from global, then stores them back."""
    BR, BC, GROUP, NT = cfg.BR, cfg.BC, cfg.GROUP, cfg.CONSUMERS
    VPR = BC // 4
    vt = ir.VectorType.get([4], Int32.mlir_type)
    P = cfg.LDG
    for item in cutlass.range(bid, items, nctas, unroll=1):
        for jj in cutlass.range(GROUP // P, unroll=1):
            held = []
            for u in cutlass.range_constexpr(P):
                j = jj * P + u
                rb, cb = _tile(cfg, item, j, items)
                g0 = Int64(rb * BR) * cfg.COLS + cb * BC
                p0 = x + (g0 + Int64(tidx // VPR) * cfg.COLS + (tidx % VPR) * 4)  # rows NT // VPR apart a q
                held.append((p0, [cute.arch.load(p0 + q * (NT // VPR) * cfg.COLS, vt)
                                  for q in range(cfg.vectors // NT)]))
            for p0, vals in held:
                for q in cutlass.range_constexpr(cfg.vectors // NT):
                    cute.arch.store(p0 + q * (NT // VPR) * cfg.COLS, vals[q])


@cute.jit
def _stream_host(cfg: cutlass.Constexpr, x: cute.Pointer, rows: Int32, items: Int32, ctas: Int32,
                 stream: CU.cuda.CUstream):
    if cutlass.const_expr(cfg.IL > 0):
        # (word of a half, row of a group, half-column block, row group): box (BC/2, IL, 2, BR/IL)
        H, G = cfg.BC // 2, cfg.IL
        if cutlass.const_expr(G == 1):  # a unit row-group dim would repeat a stride: (word, half block, row)
            mX = cute.make_tensor(x, cute.make_layout((H, cfg.COLS // H, rows), stride=(1, H, cfg.COLS)))
            desc = create_tensor_map_tiled_from_view(mX, (H, 2, cfg.BR), l2_promotion=TensorMapL2Promotion(cfg.PROMO))
        else:
            mX = cute.make_tensor(x, cute.make_layout((H, G, cfg.COLS // H, rows // G),
                                                      stride=(1, cfg.COLS, H, G * cfg.COLS)))
            desc = create_tensor_map_tiled_from_view(mX, (H, G, 2, cfg.BR // G), stride_order=(0, 1, 2, 3),
                                                     l2_promotion=TensorMapL2Promotion(cfg.PROMO))
    else:
        mX = cute.make_tensor(x, cute.make_layout((cfg.COLS, rows), stride=(1, cfg.COLS)))
        desc = create_tensor_map_tiled_from_view(mX, (cfg.BC, cfg.BR),
                                                 l2_promotion=TensorMapL2Promotion(cfg.PROMO))
    _stream_kernel(cfg, desc, x, items).launch(grid=[ctas, 1, 1], block=[cfg.CONSUMERS + 32, 1, 1], stream=stream,
                                              min_blocks_per_mp=cfg.CPS, preferred_smem_carveout=100)


@functools.lru_cache(maxsize=64)
def launch(cfg: StreamCfg) -> CU.Launch:
    return CU.Launch(f"{_NAME}.stream", _stream_host, cfg,
                     (CU.Ptr(torch.int32, 16), CU.Scalar(Int32), CU.Scalar(Int32), CU.Scalar(Int32)))


def run(cfg: StreamCfg, x: torch.Tensor, ctas: int | None = None) -> None:
    """Stream x ([rows, COLS] int32 view of the buffer) through the ring once."""
    rows = x.shape[0]
    tiles = rows // cfg.BR * cfg.NCB
    items = tiles // cfg.GROUP * cfg.SPLIT
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    launch(cfg).run(x, rows, items, min(items, ctas or cfg.CTAS or sms * cfg.CPS))


# ------------------------------------------------------------------ the GPU run

def _cases():
    """(name, cfg, rows): gdn_decode's fp32 state at B=256 (Qwen3-Next: 256 x 32 heads x [128, 128] fp32 = 128
    words a row) and mhc_post_pre's streams (T=32768, n=4, C=7168 bf16: 14336 words a row). A tile's row piece
    is BC words: 32 = 128 bytes, 64 = 256, 128 = 512. These are call 6's cases (the grid: persistent CTAs
    against one item a CTA); calls 1, 2 and 5 ran other lists (promotion, piece widths, PAIR, LDG), their rows
    and configs in benchmarks/results/h200-tma-stream-probe.txt."""
    gdn = dict(COLS=128, BR=128, BC=64, GROUP=4, PROMO=0, FENCE=True)
    G = 256 * 32 * 128
    out = []
    for ctas in (0, 256, 132, 4096):
        out.append((f"gdn TMA ring ctas {ctas or 264}", StreamCfg(**gdn, CTAS=ctas), G))
        out.append((f"gdn LDG1 c512 ctas {ctas or 264}", StreamCfg(**gdn, LDG=1, CONSUMERS=512, CTAS=ctas), G))
    out.append(("gdn LDG1 c512 cps4 ctas 4096", StreamCfg(**gdn, LDG=1, CONSUMERS=512, CPS=4, CTAS=4096), G))
    out.append(("gdn LDG1 c128 cps8 ctas 4096", StreamCfg(**gdn, LDG=1, CONSUMERS=128, CPS=8, CTAS=4096), G))
    out.append(("gdn [128,128w] LDG1 c512 cps4 ctas 8192", StreamCfg(**{**gdn, "BC": 128, "GROUP": 1}, LDG=1,
                                                                    CONSUMERS=512, CPS=4, CTAS=8192), G))
    return out


def _wide_cases():
    """(name, cfg, rows) of session 27's question: does a stream of [T, K] row-major bf16 (mhc_proj_rms's x at
    T=32768, K=28672: 14336 words a row) move faster in tiles of fewer rows and longer row pieces (1 KB: the TMA
    box's limit of 256 elements) than in proj_rms's backward's [64 tokens, 256 channels] (512-byte pieces)? DOWN:
    a CTA walks row tiles down one column block, as proj_rms's CTAs walk their channel slice."""
    base = dict(COLS=14336, FENCE=True, CPS=1, PROMO=2)
    R = 32768
    return [
        ("wide [64,128w] DOWN g8 st3", StreamCfg(**base, BR=64, BC=128, GROUP=8, STAGES=3, DOWN=True), R),
        ("wide [64,128w] rows g8 st3", StreamCfg(**base, BR=64, BC=128, GROUP=8, STAGES=3), R),
        ("wide [32,256w] DOWN g16 st3", StreamCfg(**base, BR=32, BC=256, GROUP=16, STAGES=3, DOWN=True), R),
        ("wide [16,256w] DOWN g32 st6", StreamCfg(**base, BR=16, BC=256, GROUP=32, STAGES=6, DOWN=True), R),
        ("wide [16,256w] rows g8 st6", StreamCfg(**base, BR=16, BC=256, GROUP=8, STAGES=6), R),
        ("wide [8,256w] DOWN g64 st12", StreamCfg(**base, BR=8, BC=256, GROUP=64, STAGES=12, DOWN=True), R),
        ("wide [4,256w] rows g8 st24", StreamCfg(**base, BR=4, BC=256, GROUP=8, STAGES=24), R),
        ("wide [16,256w] DOWN g32 st6 cps2", StreamCfg(**{**base, "CPS": 2}, BR=16, BC=256, GROUP=32, STAGES=6,
                                                         DOWN=True), R),
        ("wide [16,256w] LDG1 c256 cps2 DOWN", StreamCfg(**{**base, "CPS": 2}, BR=16, BC=256, GROUP=32, LDG=1,
                                                           DOWN=True), R),
        ("wide [64,128w] LDG1 c256 cps2 DOWN", StreamCfg(**{**base, "CPS": 2}, BR=64, BC=128, GROUP=8, LDG=1,
                                                           DOWN=True), R),
        ("wide [64,128w] DOWN g8 st3 (again)", StreamCfg(**base, BR=64, BC=128, GROUP=8, STAGES=3, DOWN=True), R),
    ]


def _il_cases():
    """(name, cfg, rows) of session 36's question: mhc_post_pre's backward pass streams [64 tokens, 64 channels]
    bf16 tiles (128-byte row pieces), which session 20 measured at 79% of copy in place against 92% for 256-byte
    pieces ([64, 64w]). Its tiles are wgmma operands in 128-byte swizzle atoms of 8 rows, so a 256-byte piece can
    only arrive as two 128-byte halves. IL g: one 4-D box loads both halves, g rows of the left, g of the right,
    in turn (IL 8 keeps every 8-row atom whole: a layout the wgmma descriptors can still walk). Does the request
    order of IL 8 stream as the 256-byte box (IL 1) or as two boxes (IL 64)?"""
    mhc = dict(COLS=14336, BR=64, NS=4, CONSUMERS=128, PROMO=0, FENCE=True)
    R = 32768
    p64 = dict(BC=64, GROUP=14336 // 64, STAGES=6)
    return [
        ("mhc [64,32w] 128B", StreamCfg(**mhc, BC=32, GROUP=14336 // 32, STAGES=8), R),
        ("mhc [64,64w] 256B", StreamCfg(**mhc, **p64), R),
        ("mhc [64,64w] IL1", StreamCfg(**mhc, **p64, IL=1), R),
        ("mhc [64,64w] IL8", StreamCfg(**mhc, **p64, IL=8), R),
        ("mhc [64,64w] IL16", StreamCfg(**mhc, **p64, IL=16), R),
        ("mhc [64,64w] IL64", StreamCfg(**mhc, **p64, IL=64), R),
        ("mhc [64,32w] 128B (again)", StreamCfg(**mhc, BC=32, GROUP=14336 // 32, STAGES=8), R),
        ("mhc [64,64w] IL8 (again)", StreamCfg(**mhc, **p64, IL=8), R),
        ("mhc [64,64w] 256B (again)", StreamCfg(**mhc, **p64), R),
    ] + _split_cases()


def _split_cases():
    """The backward pass's walk: one CTA an SM (big stages), one item a CTA, SPLIT 4 siblings a 64- or 32-token band.
    [32 tokens, 256-byte pieces] is the tile a pass with wgmma M over channels would stream (N = 32 tokens)."""
    b = dict(COLS=14336, NS=4, CONSUMERS=256, PROMO=0, FENCE=True, CPS=1, CTAS=1 << 30)
    R = 32768
    t128 = dict(BR=64, BC=32, GROUP=14336 // 32, STAGES=16)
    t256 = dict(BR=32, BC=64, GROUP=14336 // 64, STAGES=16)
    return [
        ("sib [64,32w] 128B S4", StreamCfg(**b, **t128, SPLIT=4), R),
        ("sib [32,64w] 256B S4", StreamCfg(**b, **t256, SPLIT=4), R),
        ("sib [64,32w] 128B S1", StreamCfg(**b, **t128), R),
        ("sib [32,64w] 256B S1", StreamCfg(**b, **t256), R),
        ("sib [64,32w] 128B S4 (again)", StreamCfg(**b, **t128, SPLIT=4), R),
        ("sib [32,64w] 256B S4 (again)", StreamCfg(**b, **t256, SPLIT=4), R),
        ("sib [32,32w] 128B S4", StreamCfg(**b, BR=32, BC=32, GROUP=14336 // 32, STAGES=32, SPLIT=4), R),
        ("sib [32,64w] IL8 S4", StreamCfg(**b, **t256, SPLIT=4, IL=8), R),
        ("sib [32,64w] IL16 S4", StreamCfg(**b, **t256, SPLIT=4, IL=16), R),
        ("sib [32,64w] IL32 S4", StreamCfg(**b, **t256, SPLIT=4, IL=32), R),
        ("sib [32,64w] IL1 S4", StreamCfg(**b, **t256, SPLIT=4, IL=1), R),
        ("sib [32,64w] IL16 S4 (again)", StreamCfg(**b, **t256, SPLIT=4, IL=16), R),
    ]


def sass_dump(out: str) -> None:
    """Cubins of the first case and of gdn_decode's ring at its fp32 heuristic, for nvdisasm on the GPU host
    (does ptxas keep the stage's shared loads before the consumers' release?)."""
    import os

    from tilekernels.gdn import cute_decode_ring as R

    name, cfg, _ = _cases()[0]
    with open(os.path.join(out, "probe.cubin"), "wb") as fh:
        fh.write(launch(cfg).export("sm_90a").cubin)
    rc = R.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4, True)
    ln = R._launch(rc, torch.bfloat16, torch.bfloat16, torch.float32)
    with open(os.path.join(out, "ring.cubin"), "wb") as fh:
        fh.write(ln.export("sm_90a").cubin)


def main(argv=None) -> int:
    import json
    import os

    if argv and "--sass" in argv:
        sass_dump(os.environ["OUT"])
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # benchmarks/
    from _gpu import bench   # do_bench's median (the rows up to session 36 were do_bench's default mean)

    wide = bool(argv and "--wide" in argv)
    il = bool(argv and "--il" in argv)
    argv = [a for a in (argv or []) if a not in ("--wide", "--il")]
    only = set(argv[1:]) if len(argv) > 1 else None
    rows_done = []
    bufs = {}
    for name, cfg, rows in (_wide_cases() if wide else _il_cases() if il else _cases()):
        if only and not any(o in name for o in only):
            continue
        n = rows * cfg.COLS
        if n not in bufs:
            bufs.clear()
            torch.cuda.empty_cache()
            x = torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=torch.int32, device="cuda")
            y = torch.empty_like(x)
            f = x.view(torch.float32)
            t_copy = bench(lambda: y.copy_(x)) * 1e3
            t_mul = bench(lambda: f.mul_(1.0)) * 1e3
            bufs[n] = (x, y, t_copy, t_mul)
            rows_done.append(dict(name=f"copy_ {n * 4 / 1e9:.2f} GB", us=t_copy, pct=100.0))
            rows_done.append(dict(name=f"mul_(1) in place {n * 4 / 1e9:.2f} GB", us=t_mul, pct=100 * t_copy / t_mul))
        x, y, t_copy, _ = bufs[n]
        xv = x.view(rows, cfg.COLS)
        ref = xv.clone() if cfg.STORE else None
        try:
            run(cfg, xv)
            torch.cuda.synchronize()
            ok = "ok"
            if ref is not None and not torch.equal(ref, xv):
                bad = (ref != xv).nonzero()
                r0, c0 = (int(v) for v in bad[0])
                ok = (f"CHANGED {bad.shape[0]} words, first [{r0}, {c0}] (tile {r0 // cfg.BR}, {c0 // cfg.BC}), "
                      f"rows {int(bad[:, 0].min())}..{int(bad[:, 0].max())}")
            del ref
            t = bench(lambda: run(cfg, xv)) * 1e3
        except Exception as e:  # noqa: BLE001  (a probe: report and go on)
            rows_done.append(dict(name=name, us=float("nan"), pct=float("nan"), ok=f"error {type(e).__name__}: {e}"))
            continue
        bytes_ = n * 4 * (2 if cfg.STORE else 1)
        pct = 100 * t_copy * bytes_ / (2 * n * 4) / t
        rows_done.append(dict(name=name, us=t, pct=pct, ok=ok, cfg=dataclasses.asdict(cfg)))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tma_promo_probe.json"), "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows_done), fh, indent=1)
    print(f"{'case':<32} {'us':>9} {'%copy':>7}  check")
    for r in rows_done:
        print(f"{r['name']:<32} {r['us']:9.2f} {r['pct']:7.1f}  {r.get('ok', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
