"""MXFP8 quantize, rowwise or both axes, as a per-warp cp.async pipeline over 32-row tiles.

The kernel :mod:`tilekernels.moe.cute_quantize` picks for x [R, K] bf16 / fp32 (contiguous,
16-byte aligned pointers) with K % 32 == 0 when the rowwise output is wanted (rowwise only,
or rowwise and columnwise from one read of x). Bit-exact to :mod:`tilekernels.moe.mxfp8`
through the same arithmetic as the SwiGLU + MXFP8 passes (``cute_swiglu_math``): amax as an
integer max of the fp32 bits with the sign cleared (NaN above Inf above finite), the E8M0
byte from those bits, data = RNE-saturating e4m3 of ``x * 2^(127 - e)`` (an uncontracted fp32
product), NaN/Inf blocks -> scale 0xFF and data bytes 0x7F.

Why: the staged shared-memory kernel loads a 32 x 256 tile, waits at a CTA barrier, then
computes and stores it with nothing in flight; "both" reached 76-78% of copy on the H200.
Here each warp walks its own 32 x (32 * nbt) tiles of one 32-row strip and copies tile
k + stages - 1 into its own shared-memory stage with 16-byte cp.async while it computes tile
k: the bytes in flight do not live in registers and no barrier is needed (each lane reads
back only the 16-byte slots it copied itself, so ``cp.async.wait_group`` orders them). x is
moved as 32-bit words (bf16: two elements a word). The first version (nbt = 1: 32 x 32
tiles, 64 / 128 bytes of a row per warp instruction, one scale byte per row and tile, its
steps fully unrolled) ran bf16 at 55-67% of copy: wide tiles give each warp instruction
longer row segments and a row's scale bytes together; the steps run in a loop unrolled
``unroll`` times (a full unroll of 16 steps hoisted every shared-memory load: 238 registers).

Lane mapping in a tile (LPB = 16-byte chunks per 32-column block row: 4 bf16 / 8 fp32; CPR =
LPB * nbt chunks per tile row, at most 32): lane ``rg * CPR + t`` holds chunk t (8 bf16 / 4
fp32 columns) of rows ``i * (32 / CPR) + rg``, i < CPR. Rowwise amax is a butterfly over the
LPB lanes of a block row, columnwise amax a thread-local max over i and a butterfly over rg
(bf16: on packed pairs with ``max.u16x2``). Each data store is 8 (bf16) or 4 (fp32) bytes a
lane, CPR of them contiguous in a row; columnwise scale bytes go out as 8 / 4 bytes a lane.
Rows past R are clamped for loads and masked for stores (columnwise needs R % 32 == 0).
Offsets are 64-bit at the strip level.
"""
from __future__ import annotations

import dataclasses

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint8, Uint32
from cutlass._mlir.dialects import llvm
from cutlass._mlir.extras import types as T
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as C

from .cute_swiglu_math import _bfly_max, _bits_f32, _halvings, _rows, e4m3x4, e8m0_from_absbits, fmul, inv_scale

BLOCK = 32


def _elt(dtype: torch.dtype) -> int:
    return 4 if dtype == torch.float32 else 2


@dataclasses.dataclass(frozen=True)
class PipeCfg:
    """Launch config of the pipelined quantize kernel (the compile key with the x dtype).

    K: columns (static, a multiple of 32); row / col: which outputs (row must be set);
    elt: bytes per x element (2 bf16, 4 fp32); warps per CTA (each walks its own tiles);
    stages: cp.async buffers per warp (>= 2: stages - 1 tiles in flight while one is
    computed); grid_x: CTAs along K per 32-row strip (warp w of CTA bx takes the column
    tiles bx * warps + w, stepping by grid_x * warps); nbt: 32-column blocks per warp tile
    (wider tiles: longer contiguous row segments per warp instruction, scale bytes of a row
    together, fewer per-tile costs); unroll: steps of a lane's tile unrolled; min_blocks: resident CTAs per SM asked of ptxas
    (0: no bound; a bound caps the registers at 65536 / (32 * warps * min_blocks))."""

    K: int
    row: bool
    col: bool
    elt: int
    warps: int = 8
    stages: int = 2
    grid_x: int = 1
    nbt: int = 1
    unroll: int = 4
    min_blocks: int = 0

    def __post_init__(self):
        if self.K % BLOCK or not self.row or self.elt not in (2, 4):
            raise ValueError(f"PipeCfg: K % 32 == 0, the rowwise output and a bf16/fp32 x: {self}")
        if self.nbt not in (1, 2, 4, 8) or self.elt * 2 * self.nbt > 32 or (self.K // BLOCK) % self.nbt:
            raise ValueError(f"PipeCfg: nbt a power of two dividing K / 32, at most 32 lanes a tile row: {self}")
        if self.stages < 2 or self.warps < 1 or self.grid_x < 1 or self.smem_bytes() > 200 * 1024:
            raise ValueError(f"PipeCfg: stages >= 2, at most 200 KB of buffers: {self}")

    def smem_bytes(self) -> int:
        """Per warp and stage one 32 x (32 * nbt) tile of x."""
        return self.warps * self.stages * BLOCK * BLOCK * self.nbt * self.elt

    @classmethod
    def heuristic(cls, K: int, dtype: torch.dtype, row: bool, col: bool) -> "PipeCfg":
        """From static dims only: tiles of 256 bytes a row (nbt 4 bf16 / 2 fp32, narrower when
        K / 32 needs it), 8 warps, 2 stages, grid_x so that each warp has ~4 or more tiles of
        its strip (K = 7168: bf16 56 tiles, grid_x 1, 7 tiles a warp; fp32 112 tiles, grid_x
        3). H200, R = 32768, K = 7168, sweep of benchmarks/moe_cute_check.py (same inputs):
        bf16 rowwise 90.5% / both 84.5% of copy at this config; fp32 both 84.9%. 32 x 32 tiles
        (nbt 1) ran 58-64% (bf16), 4 warps or grid_x > 1 at bf16 78-85% / 78-79%, a third
        stage no better (83-84%)."""
        nb = K // BLOCK
        elt = _elt(dtype)
        nbt = next(n for n in (4, 2, 1) if n <= 8 // elt and nb % n == 0)
        nt = nb // nbt
        warps = max(1, min(8, nt))
        return cls(K=K, row=row, col=col, elt=elt, warps=warps, stages=2, grid_x=max(1, nt // (warps * 4)), nbt=nbt)


# ------------------------------------------------------------------ device helpers

@dsl_user_op
def _umax16x2(a, b, *, loc=None, ip=None) -> Int32:
    """Per 16-bit half unsigned max of two packed words (``max.u16x2``, sm_90+)."""
    vals = [Int32(v).ir_value(loc=loc, ip=ip) for v in (a, b)]
    return Int32(llvm.inline_asm(T.i32(), vals, "max.u16x2 $0, $1, $2;", "=r,r,r", loc=loc, ip=ip))


def _max(a, b, bf16: bool):
    """Max of two abs-bit words: per packed half (bf16 pairs) or as one int (fp32)."""
    return _umax16x2(a, b) if bf16 else cutlass.max(a, b)


def _bfly_umax16x2(v, offsets):
    for o in offsets:
        v = _umax16x2(v, cute.arch.shuffle_sync_bfly(v, offset=o))
    return v


def _values(ws, bf16: bool):
    """The fp32 values of one 16-byte chunk given as 4 words (bf16: low half first)."""
    if bf16:
        out = []
        for w in ws:
            out += [_bits_f32(w << 16), _bits_f32(w & Int32(-65536))]
        return out
    return [_bits_f32(w) for w in ws]


def _issue(atom, xv, sbuf, rows, blk, st, CPR, t, lane, warp):
    """cp.async (16 bytes each, no commit) of this lane's chunks of column block blk into stage
    st: chunk t of rows[i] into slot (lane, i). Trace-time helper (straight-line code)."""
    for i in range(CPR):
        src = xv[(None, (rows[i], blk * CPR + t))]
        cute.copy(atom, cute.make_tensor(src.iterator, cute.make_layout(4)), sbuf[(None, lane, i, st, warp)])


def _absmask(bf16: bool) -> int:
    return 0x7FFF7FFF if bf16 else 0x7FFFFFFF


# ------------------------------------------------------------------ kernel

@cute.kernel
def _pipe_kernel(cfg: cutlass.Constexpr, x_ptr: cute.Pointer, rd_ptr: cute.Pointer, rs_ptr: cute.Pointer,
                 cd_ptr: cute.Pointer, cs_ptr: cute.Pointer, R: Int32):
    K = cfg.K
    NB = K // BLOCK
    NT = NB // cfg.nbt                   # warp tiles along K
    BF = cfg.elt == 2
    W = K * cfg.elt // 4                 # words of x per row
    LPB = cfg.elt * BLOCK // 16          # lanes (16-byte chunks) per 32-column block of a row
    CPR = LPB * cfg.nbt                  # 16-byte chunks per tile row (= steps per lane)
    RPS = BLOCK // CPR                   # tile rows per step
    OW = 2 if BF else 1                  # e4m3 words per lane and step (8 / 4 bytes)
    S = cfg.stages
    tidx, _, _ = cute.arch.thread_idx()
    by, bx, _ = cute.arch.block_idx()    # x: 32-row strip, y: share of K
    warp = tidx // 32
    lane = tidx % 32
    t = lane % CPR
    rg = lane // CPR
    row0 = by * BLOCK
    valid = cutlass.min(R - row0, Int32(BLOCK))

    xv = cute.zipped_divide(_rows(cute.recast_ptr(x_ptr, dtype=Uint32), row0, W, BLOCK, W), (1, 4))
    rd_t = _rows(cute.recast_ptr(rd_ptr, dtype=Uint32), row0, K // 4, BLOCK, K // 4)
    rs_t = _rows(rs_ptr, row0, NB, BLOCK, NB)
    if cutlass.const_expr(cfg.col):
        cd_t = _rows(cute.recast_ptr(cd_ptr, dtype=Uint32), row0, K // 4, BLOCK, K // 4)
        cs_t = _rows(cute.recast_ptr(cs_ptr, dtype=Uint32), by, K // 4, 1, K // 4)
    smem = SmemAllocator()
    # [word, lane, step, stage, warp]: lane-private 16-byte slots, consecutive lanes on
    # consecutive slots (a warp's ld.shared.v4 of one step is conflict-free)
    sbuf = smem.allocate_tensor(Uint32, cute.make_layout(
        (4, 32, CPR, S, cfg.warps), stride=(1, 4, 128, 128 * CPR, 128 * CPR * S)), 16)
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cute.nvgpu.LoadCacheMode.GLOBAL), Uint32,
                               num_bits_per_copy=128)
    # rows this lane loads (rows past R read row R - 1; their stores are masked)
    rows = [cutlass.min(i * RPS + rg, valid - 1) for i in range(CPR)]

    G = cfg.warps
    first = bx * G + warp
    stride = cfg.grid_x * G
    for st in cutlass.range_constexpr(S - 1):      # prologue: S - 1 tiles in flight
        if first + st * stride < NT:
            _issue(atom, xv, sbuf, rows, first + st * stride, st, CPR, t, lane, warp)
        cute.arch.cp_async_commit_group()

    o = cute.make_rmem_tensor(cute.make_layout((OW,), stride=(1,)), Uint32)      # words to store
    cm = cute.make_rmem_tensor(cute.make_layout((4,), stride=(1,)), Int32)       # column amax words
    it = Int32(0)
    for blk in cutlass.range(first, NT, stride):  # blk: warp tile (nbt column blocks)
        if blk + (S - 1) * stride < NT:            # refill the stage read last iteration
            _issue(atom, xv, sbuf, rows, blk + (S - 1) * stride, (it + S - 1) % S, CPR, t, lane, warp)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(S - 1)
        # ---- rowwise, step by step (amax over the LPB lanes of a block row, one scale byte per
        # block row), and the columnwise amax's thread-local part (a max over the steps); steps
        # in a runtime loop unrolled cfg.unroll times (a full unroll of 16 steps hoists every
        # load: 254 registers)
        if cutlass.const_expr(cfg.col):
            for j in cutlass.range_constexpr(4):
                cm[j] = Int32(0)
        for i in cutlass.range(0, CPR, 1, unroll=cfg.unroll):
            v = sbuf[(None, lane, i, it % S, warp)].load()
            ws = [Int32(v[j]) for j in range(4)]
            am = ws[0] & _absmask(BF)
            for j in cutlass.range_constexpr(1, 4):
                am = _max(am, ws[j] & _absmask(BF), BF)
            if cutlass.const_expr(cfg.col):
                for j in cutlass.range_constexpr(4):
                    cm[j] = _max(cm[j], ws[j] & _absmask(BF), BF)
            if cutlass.const_expr(BF):
                am = cutlass.max(am & Int32(-65536), am << 16)
            am = _bfly_max(am, _halvings(LPB))
            e = e8m0_from_absbits(am)
            inv = inv_scale(e)
            xs = _values(ws, BF)
            r = i * RPS + rg
            for q in cutlass.range_constexpr(OW):
                wq = e4m3x4(*[fmul(xs[4 * q + j], inv) for j in range(4)])
                o[q] = cutlass.select_(e == 255, Uint32(0x7F7F7F7F), wq)
            if r < valid:
                cute.autovec_copy(o, cute.local_tile(rd_t, (1, OW), (r, blk * CPR + t))[0, None])
                if t % LPB == 0:
                    rs_t[r, blk * cfg.nbt + t // LPB] = Uint8(e)
        # ---- columnwise: amax down the 32 rows (steps in-thread, rg by butterfly), then the
        # chunks again from shared memory
        if cutlass.const_expr(cfg.col):
            ms = []
            for j in cutlass.range_constexpr(4):
                m = cm[j]
                offs = tuple(CPR * k for k in _halvings(RPS))
                if cutlass.const_expr(BF):
                    m = _bfly_umax16x2(m, offs)
                    ms += [m << 16, m & Int32(-65536)]
                else:
                    ms.append(_bfly_max(m, offs))
            ecs = [e8m0_from_absbits(m) for m in ms]
            invs = [inv_scale(e) for e in ecs]
            nm = []                                  # per output word: 0xFF bytes of NaN columns
            for q in cutlass.range_constexpr(OW):
                mk = Uint32(0)
                for j in cutlass.range_constexpr(4):
                    mk = mk | cutlass.select_(ecs[4 * q + j] == 255, Uint32(0xFF << (8 * j)), Uint32(0))
                nm.append(mk)
            if rg == 0:
                for q in cutlass.range_constexpr(OW):
                    o[q] = (Uint32(ecs[4 * q]) | (Uint32(ecs[4 * q + 1]) << 8) | (Uint32(ecs[4 * q + 2]) << 16)
                            | (Uint32(ecs[4 * q + 3]) << 24))
                cute.autovec_copy(o, cute.local_tile(cs_t, (1, OW), (0, blk * CPR + t))[0, None])
            for i in cutlass.range(0, CPR, 1, unroll=cfg.unroll):
                v = sbuf[(None, lane, i, it % S, warp)].load()
                xs = _values([Int32(v[j]) for j in range(4)], BF)
                for q in cutlass.range_constexpr(OW):
                    wq = e4m3x4(*[fmul(xs[4 * q + j], invs[4 * q + j]) for j in range(4)])
                    o[q] = (wq & ~nm[q]) | (Uint32(0x7F7F7F7F) & nm[q])
                cute.autovec_copy(o, cute.local_tile(cd_t, (1, OW), (i * RPS + rg, blk * CPR + t))[0, None])
        it = it + 1


@cute.jit
def _pipe_host(cfg: cutlass.Constexpr, x: cute.Pointer, rd: cute.Pointer, rs: cute.Pointer,
               cd: cute.Pointer, cs: cute.Pointer, R: Int32, stream: C.cuda.CUstream):
    C.launch_strips(cfg, _pipe_kernel(cfg, x, rd, rs, cd, cs, R), R, stream)


def pipe_sig(dtype: torch.dtype) -> tuple:
    """Arg specs: x, row data, row scales, col data, col scales (16-byte aligned but the row
    scales, written a byte at a time), R."""
    return (C.Ptr(dtype, 16), C.Ptr(torch.uint8, 16), C.Ptr(torch.uint8, 1),
            C.Ptr(torch.uint8, 16), C.Ptr(torch.uint8, 16), C.Scalar())


def pipe_launch(cfg: PipeCfg, name: str) -> C.Launch:
    dtype = torch.float32 if cfg.elt == 4 else torch.bfloat16
    return C.Launch(name, _pipe_host, cfg, pipe_sig(dtype))
