"""CuTe DSL SwiGLU kernels for the MXFP8 MoE MLP (Hopper, sm_90a): memory-bound, one launch each.

Four kernels, all destination-passing (the caller allocates every output):

* :func:`swiglu_fwd_into` -- ``scaled_swiglu`` forward: ``out [M, F] = silu(gate) * linear *
  probs[:, None]`` from ``h [M, 2F]`` (bf16 or fp32), any ``glu_interleave_size`` (``None``:
  halves ``[gate | linear]``; ``s``: alternating ``[gate s | linear s]`` blocks).
* :func:`swiglu_bwd_into` -- its backward: ``dh [M, 2F]`` (dtype of ``h``) and ``dprobs [M]``
  fp32 (a per-row sum over F, reduced in a fixed order inside one CTA: deterministic).
* :func:`swiglu_quant_fwd_into` -- the fused MLP's forward piece between FC1 and FC2: from the FC1
  accumulators ``h [M, 2F]`` fp32 (``[gate 32 | linear 32]`` interleave) computes
  ``a = silu(gate) * linear * probs`` in fp32 and writes it as MXFP8 rowwise (blocks of 32 along F,
  FC2's forward operand) and optionally columnwise (blocks of 32 along tokens, FC2's wgrad operand)
  in the same pass; ``a`` itself never reaches memory.
* :func:`swiglu_quant_bwd_into` -- the backward piece between FC2 dgrad and FC1: from ``dA [M, F]``
  fp32 (FC2 dgrad accumulators), ``h`` and ``probs`` computes ``dh`` and ``dprobs`` in fp32, writes
  ``dh`` as MXFP8 rowwise (blocks along 2F, FC1 dgrad) and columnwise (blocks along tokens, FC1
  wgrad), ``dprobs`` fp32, and optionally ``a`` (recomputed from ``h``) as MXFP8 columnwise for
  FC2's wgrad. Recomputing ``a`` here costs no extra reads (``h`` is read anyway) and ~F bytes of
  writes per row, against a separate pass that would read ``h`` again (8F bytes per row) or a
  forward that stores ``a``'s columnwise copy for the whole step; so it is done here.

Both fused kernels also write bf16 instead of MXFP8 (``QuantCfg.bf16``: bf16 data tensors, no
scales): the exact values ``cute_quantize.dequantize_into`` would make of their MXFP8 output, for
the fused MLP's bf16 GEMMs on Hopper (``gemm_predq``), which would otherwise dequantize right away.

Numerics (bit-exact with the torch reference on the GPU, ``tilekernels/moe/reference.py``):
every operation is the fp32 operation torch performs, in torch's order, with explicit ``.rn``
PTX instructions so that nothing is contracted into an FMA that torch does not contract:
``a = ((g * sigmoid(g)) * linear) * probs`` and, for the backward,
``dg = ((dp * linear) * sig) * (1 + g * (1 - sig))``, ``dl = dp * (g * sig)`` with
``dp = dout * probs``. ``sigmoid`` is the instruction sequence nvcc 13 emits for torch's CUDA
sigmoid ``1 / (1 + expf(-x))`` (libdevice ``expf``: range reduction with ``fma``, ``ex2.approx``,
the ``+ 1`` fused with the final scaling, a correctly rounded reciprocal), written out as inline
PTX so it does not depend on how the DSL lowers ``exp``. bf16 inputs are widened exactly and bf16
outputs rounded once (round-to-nearest-even). ``dprobs`` sums in a fixed order that differs from
torch's (fp32 reassociation only).

MXFP8 (``tilekernels/moe/mxfp8.py``, bit-exact): per block of 32, ``amax`` is the integer max of
the fp32 magnitudes' bit patterns (so NaN > Inf > finite, and NaN propagates); the E8M0 byte is
``max(exp_field(amax) - 8 + (mantissa(amax) > 0x600000), 0)`` -- which is ``ceil(log2(amax /
448)) + 127`` clamped at 0, i.e. ``mxfp8.e8m0_from_amax`` -- and 0xFF when the block holds a NaN
or Inf, whose data bytes are then all 0x7F. Data = ``cvt.rn.satfinite.e4m3x2.f32(x * 2^(127-e))``
(the product is the same fp32 multiply the reference does; the conversion rounds to nearest
even).

Layouts: every tensor is row-major contiguous and 16-byte aligned (the quantized kernels require
it; the plain ones narrow their vector width otherwise). ``[M, 2F]`` means M rows of 2F elements.
MXFP8 data ``[M, K]`` (``float8_e4m3fn`` or ``uint8``) is row-major in both orientations; rowwise
scales are ``[M, K/32]`` and columnwise scales ``[M/32, K]`` (uint8 E8M0 bytes).

Thread mapping of the quantized kernels: ``rsplit`` warps own a tile of 32 rows x one 32-column
output block (rsplit = 2 by default: 63-122 registers, 8-warp CTAs of 4 tile groups); lane
8 * rg + t of the tile's warp rsi holds output columns 4t..4t+3 of rows rsi * 32/rsplit + 4i + rg.
Loads are 16-byte vectors (gate, linear and dA quads; a warp instruction reads 4 rows x 128
contiguous bytes), rowwise amax is a 3-step butterfly over the 8 lanes of a row, columnwise amax a
thread-local max over i, a 2-step butterfly over rg and (rsplit > 1) a max over the tile's warps
through shared memory; every data store is a 4-byte word (a warp instruction writes 4 rows x 32
contiguous bytes) and the columnwise scale bytes of a block go out as 8 lanes x 4 bytes. Rows past
M are clamped for loads and masked for stores.

Loads (``QuantCfg.stages``): the first version loaded each tile straight into registers, all
loads before any store, one tile per warp at a time. Its 128-168 registers (fwd: one warp per
tile) allowed 3 CTAs of 4 warps per SM, and a warp had nothing in flight while it computed:
43-53% of copy on the H200. Now each warp runs a cp.async pipeline over its tiles: it copies the inputs of tile
k + stages - 1 (16 bytes per lane, row step and input) into its own shared-memory stage while it computes tile k
from another, and each lane reads back only the slots it copied itself, so
``cp.async.wait_group`` orders them without a barrier. The probs of the thread's rows are loaded
once per strip.

M is a runtime argument (a new M reuses the compiled kernel); F, s, dtypes and the config are the
compile key. M = 0 launches nothing. No host sync, one kernel launch per call.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory.smem import SmemAllocator

from tilekernels._cute import Launch, Ptr, Scalar, cdiv, cuda, launch_strips

from .cute_quantize import _from_e4m3x2, _scale, _store_out  # the dequantize kernel's exact steps
from .cute_swiglu_math import (  # exact fp32 / MXFP8 device arithmetic
    _bfly_max, _bfly_sum, _halvings, _rows, absbits, e4m3x4, e8m0_from_absbits, fmul, inv_scale, quant_word,
    swiglu_bwd_elem, swiglu_fwd_elem,
)

BLOCK = 32  # MXFP8 block
_ELT = {"bfloat16": 2, "float32": 4}
_TORCH = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_CUTE = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}

# ============================================================================ configs


@dataclasses.dataclass(frozen=True)
class SwigluCfg:
    """Launch config of the plain scaled_swiglu kernels (fwd and bwd); the compile key with
    the pass. ``F`` output width, ``s`` interleave (0 = halves), ``dtype`` of h/out/dout/dh,
    ``vec`` elements per vector access, ``lanes`` lanes per row (power of two), ``warps`` per CTA,
    ``unroll`` vectors per lane loaded before any is stored."""

    F: int
    s: int
    dtype: str
    vec: int
    lanes: int
    warps: int
    unroll: int

    @property
    def rows_per_cta(self) -> int:
        return self.warps * (32 // self.lanes)

    @classmethod
    def heuristic(cls, F: int, s: Optional[int], dtype: str, align: int = 16, bwd: bool = False) -> "SwigluCfg":
        """Static dims only: 16-byte vectors narrowed until they divide F, s and the pointers'
        alignment; enough lanes per row to cover a row in one pass (up to 32)."""
        s = int(s or 0)
        elt = _ELT[dtype]
        vec = 16 // elt
        while vec > 1 and (F % vec or (s and s % vec) or align % (vec * elt)):
            vec //= 2
        nvec = F // vec
        lanes = 1
        while lanes < 32 and lanes < nvec:
            lanes *= 2
        per_lane = cdiv(nvec, lanes)
        unroll = min(per_lane, 4 if bwd else 8)
        return cls(F=F, s=s, dtype=dtype, vec=vec, lanes=lanes, warps=4, unroll=unroll)


@dataclasses.dataclass(frozen=True)
class QuantCfg:
    """Launch config of the fused SwiGLU + MXFP8 kernels (s = 32, fp32 inputs). ``F`` output width
    (F % 32 == 0), ``bwd`` which pass, ``col`` whether the optional columnwise output is written
    (fwd: ``a`` columnwise; bwd: recomputed ``a`` columnwise), ``warps`` per CTA, ``rsplit`` warps
    sharing one 32 x 32 tile by rows (1, 2 or 4: fewer values per thread, hence fewer registers
    and more resident warps, for one named barrier per tile), ``grid_x`` CTAs along F (fwd; the
    bwd reduces dprobs over the whole row inside one CTA, so 1), ``min_blocks`` resident CTAs per
    SM asked of ptxas (0: no bound), ``stages`` shared-memory buffers per warp for its tiles'
    inputs (0: plain loads into registers, the first version; s >= 2: each warp copies the inputs
    of its tile k + s - 1 with cp.async while it computes tile k, so the bytes in flight no longer
    come out of the register file). ``bf16``: every data output is bf16 holding the dequantized
    MXFP8 values (bitwise ``dequantize(quantize(.))``, no scales written): for operands whose
    consumer is a bf16 GEMM (``gemm_predq``), which would dequantize them right away."""

    F: int
    bwd: bool
    col: bool
    warps: int
    rsplit: int
    grid_x: int
    min_blocks: int = 0
    stages: int = 0
    bf16: bool = False

    def smem_bytes(self) -> int:
        """Shared memory of the cp.async buffers: per warp and stage, its rows of the tile's gate
        and linear quads (and dA's) as 16 bytes per lane and row step."""
        if self.stages == 0:
            return 0
        return self.warps * self.stages * (8 // self.rsplit) * (3 if self.bwd else 2) * 32 * 16

    def __post_init__(self):
        if self.F % BLOCK or self.rsplit not in (1, 2, 4) or self.warps % self.rsplit:
            raise ValueError(f"QuantCfg: F % 32, rsplit in (1, 2, 4) and warps % rsplit: {self}")
        if self.rsplit > 1 and self.warps // self.rsplit > 15:
            raise ValueError(f"QuantCfg: at most 15 row-split groups (named barriers 1..15): {self}")
        if self.bwd and self.grid_x != 1:
            raise ValueError(f"QuantCfg: the backward reduces dprobs inside one CTA (grid_x = 1): {self}")
        if self.stages == 1 or self.smem_bytes() > 200 * 1024:
            raise ValueError(f"QuantCfg: stages 0 or >= 2, at most 200 KB of buffers: {self}")

    @classmethod
    def heuristic(cls, F: int, bwd: bool, col: bool, bf16: bool = False) -> "QuantCfg":
        """Two warps share each 32 x 32 tile by rows (16 rows each: 63-122 registers), four such
        groups per CTA, two cp.async stages per warp (one tile in flight while it computes the
        previous one; 64 KB (fwd) / 96 KB (bwd) of buffers per 8-warp CTA). fwd: each group
        loops over ~4 blocks of its strip (grid_x CTAs along F); bwd: one CTA per strip (dprobs
        is reduced inside it). Measured on the H200 at M = 32768, F = 2048 (sweep of
        benchmarks/moe_swiglu_check.py, do_bench median): fwd 88.0% / 87.4% of copy without /
        with the columnwise output, bwd 88.1% / 85.0% without / with a's columnwise output; one
        warp per tile with 4 warps reached 80-82%, the first version (register loads) 43-60%.
        ``bf16`` outputs use the same mapping (8-byte stores instead of 4)."""
        nblk = F // BLOCK
        rsplit = 2
        groups = min(4, nblk)
        return cls(F=F, bwd=bwd, col=col, warps=groups * rsplit, rsplit=rsplit,
                   grid_x=1 if bwd else max(1, cdiv(nblk, groups * 4)), stages=2, bf16=bf16)


# ============================================================================ plain kernels


def _glu_vec_index(cfg: SwigluCfg, c):
    """Vector index (in units of cfg.vec along the 2F row) of output vector c's gate and linear."""
    nv = cfg.F // cfg.vec
    if cfg.s == 0:
        return c, c + nv
    sv = cfg.s // cfg.vec
    g = (c // sv) * (2 * sv) + c % sv
    return g, g + sv


@cute.kernel
def _swiglu_kernel(cfg: cutlass.Constexpr, bwd: cutlass.Constexpr, d_ptr: cute.Pointer,
                   h_ptr: cute.Pointer, p_ptr: cute.Pointer, o_ptr: cute.Pointer,
                   dp_ptr: cute.Pointer, M: Int32):
    """fwd: o = swiglu(h) [M, F]; bwd: o = dh [M, 2F] from d = dout [M, F], dp = dprobs [M]."""
    F, V, TC = cfg.F, cfg.vec, cfg.lanes
    RPW = 32 // TC
    nvec = F // V
    per_lane = (nvec + TC - 1) // TC
    nbatch = (per_lane + cfg.unroll - 1) // cfg.unroll
    dt = _CUTE[cfg.dtype]

    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // 32
    lane = tidx % 32
    tc = lane % TC
    row = bidx * cfg.rows_per_cta + warp * RPW + lane // TC
    rr = cutlass.min(row, M - 1)  # loads of rows past M read row M-1; their stores are masked
    hv = cute.zipped_divide(_rows(h_ptr, rr, 2 * F, 1, V), (1, V))
    ov = cute.zipped_divide(_rows(o_ptr, rr, 2 * F if bwd else F, 1, V), (1, V))
    p = cute.make_tensor(p_ptr + Int64(rr), cute.make_layout(1))[0]
    if cutlass.const_expr(bwd):
        dv = cute.zipped_divide(_rows(d_ptr, rr, F, 1, V), (1, V))
    acc = Float32(0.0)
    for kb in cutlass.range(nbatch):
        gs, ls, ds, cs = [], [], [], []
        for k in cutlass.range_constexpr(cfg.unroll):
            c = tc + TC * (kb * cfg.unroll + k)
            cc = cutlass.min(c, nvec - 1)
            gi, li = _glu_vec_index(cfg, cc)
            cs.append(c)
            gs.append(hv[(None, (0, gi))].load().to(Float32))
            ls.append(hv[(None, (0, li))].load().to(Float32))
            if cutlass.const_expr(bwd):
                ds.append(dv[(None, (0, cc))].load().to(Float32))
        for k in cutlass.range_constexpr(cfg.unroll):
            c = cs[k]
            if cutlass.const_expr(not bwd):
                o = cute.make_rmem_tensor((1, V), dt)
                for j in cutlass.range_constexpr(V):
                    o[0, j] = dt(swiglu_fwd_elem(gs[k][j], ls[k][j], p))
                if row < M:
                    if c < nvec:
                        ov[(None, (0, c))].store(o.load())
            else:
                og = cute.make_rmem_tensor((1, V), dt)
                ol = cute.make_rmem_tensor((1, V), dt)
                part = Float32(0.0)
                for j in cutlass.range_constexpr(V):
                    dg, dl, term, _a = swiglu_bwd_elem(ds[k][j], gs[k][j], ls[k][j], p)
                    og[0, j] = dt(dg)
                    ol[0, j] = dt(dl)
                    part = part + term
                acc = acc + cutlass.select_(c < nvec, part, Float32(0.0))
                if row < M:
                    if c < nvec:
                        gi, li = _glu_vec_index(cfg, c)
                        ov[(None, (0, gi))].store(og.load())
                        ov[(None, (0, li))].store(ol.load())
    if cutlass.const_expr(bwd):
        acc = _bfly_sum(acc, _halvings(TC))
        if row < M:
            if tc == 0:
                cute.make_tensor(dp_ptr + Int64(row), cute.make_layout(1))[0] = acc


@cute.jit
def _swiglu_fwd_host(cfg: cutlass.Constexpr, h: cute.Pointer, probs: cute.Pointer, out: cute.Pointer,
                     M: Int32, stream: cuda.CUstream):
    _swiglu_kernel(cfg, False, h, h, probs, out, probs, M).launch(
        grid=[cute.ceil_div(M, cfg.rows_per_cta), 1, 1], block=[32 * cfg.warps, 1, 1], stream=stream)


@cute.jit
def _swiglu_bwd_host(cfg: cutlass.Constexpr, dout: cute.Pointer, h: cute.Pointer, probs: cute.Pointer,
                     dh: cute.Pointer, dprobs: cute.Pointer, M: Int32, stream: cuda.CUstream):
    _swiglu_kernel(cfg, True, dout, h, probs, dh, dprobs, M).launch(
        grid=[cute.ceil_div(M, cfg.rows_per_cta), 1, 1], block=[32 * cfg.warps, 1, 1], stream=stream)


# ============================================================================ fused SwiGLU + MXFP8


def _issue(atom, sbuf, hv, dav, rows, b, st, t, lane, warp):
    """cp.async (16 bytes each) of this thread's input quads of 32-column block b into stage st
    of ``sbuf`` (no commit): per row step, the gate quad, the linear quad (8 quads on) and, in
    the backward (``dav``), the dA quad. Trace-time helper (straight-line code)."""
    for i, r in enumerate(rows):
        srcs = [hv[(None, (r, b * 16 + t))], hv[(None, (r, b * 16 + t + 8))]]
        if dav is not None:
            srcs.append(dav[(None, (r, b * 8 + t))])
        for k, src in enumerate(srcs):   # one 16-byte copy: the quad as the atom's value mode
            cute.copy(atom, cute.make_tensor(src.iterator, cute.make_layout(4)), sbuf[(None, lane, k, i, st, warp)])


def _data_view(ptr, row0, width: int, bf16: bool):
    """The 32-row strip of an MXFP8 data output [M, width] as 4-byte words (4 e4m3 values each)
    or, for bf16 outputs, as quads of bf16 (8 bytes: the same 4 values dequantized); both are
    indexed [row, word]."""
    if bf16:
        return cute.zipped_divide(_rows(cute.recast_ptr(ptr, dtype=cutlass.BFloat16), row0, width, BLOCK, width),
                                  (1, 4))
    return _rows(cute.recast_ptr(ptr, dtype=Uint32), row0, width // 4, BLOCK, width // 4)


def _put(view, r, wi, w, es, bf16: bool):
    """Store word ``w`` (4 e4m3 bytes, scales ``es``: E8M0 Int32 per byte) at [r, wi] of a
    :func:`_data_view`: as is, or dequantized exactly as ``cute_quantize.dequantize_into`` does
    (e4m3 -> f16x2 -> fp32, times 2^(e-127) in fp32, NaN for 0xFF, one RNE rounding to bf16)."""
    if bf16:
        ov = cute.make_rmem_tensor((4,), Float32)
        for k in range(2):
            x0, x1 = _from_e4m3x2(Uint16((w >> (16 * k)) & 0xFFFF))
            ov[2 * k] = x0 * _scale(es[2 * k])
            ov[2 * k + 1] = x1 * _scale(es[2 * k + 1])
        _store_out(ov, view[(None, (r, wi))])
    else:
        view[r, wi] = w


@cute.kernel
def _quant_kernel(cfg: cutlass.Constexpr, da_ptr: cute.Pointer, h_ptr: cute.Pointer, p_ptr: cute.Pointer,
                  rd_ptr: cute.Pointer, rs_ptr: cute.Pointer, cd_ptr: cute.Pointer, cs_ptr: cute.Pointer,
                  dprobs_ptr: cute.Pointer, ad_ptr: cute.Pointer, as_ptr: cute.Pointer, M: Int32):
    """One CTA = 32 rows x (a grid_x-th share of) the F/32 column blocks. Its warps form
    ``warps / rsplit`` groups; group gi takes blocks x*groups + gi, stepping by grid_x*groups, and
    the ``rsplit`` warps of a group split each 32 x 32 tile by rows (32/rsplit rows each), joining
    their columnwise amax through shared memory (double-buffered, one named barrier per tile).

    fwd: a -> rd/rs (rowwise data/scales of a [M, F]) and, if cfg.col, cd/cs (columnwise).
    bwd: dh -> rd/rs (rowwise, [M, 2F]) and cd/cs (columnwise), dprobs; if cfg.col, a -> ad/as
    (columnwise of a [M, F])."""
    F = cfg.F
    NB = F // BLOCK
    RS = cfg.rsplit
    G = cfg.warps // RS
    STEPS = 8 // RS  # row steps per thread: rows rsi * (32 / RS) + 4 i + rg
    bwd = cfg.bwd
    KD = 2 * F if bwd else F  # width of the quantized output (dh or a)
    want_col = bwd or cfg.col
    NQC = (2 if bwd else 1) + (1 if bwd and cfg.col else 0)  # columnwise-quantized quantities

    tidx, _, _ = cute.arch.thread_idx()
    by, bx, _ = cute.arch.block_idx()  # x: 32-row tile (up to 2^31 - 1 of them), y: share of F
    warp = tidx // 32
    lane = tidx % 32
    gi = warp // RS
    rsi = warp % RS
    t = lane % 8
    rg = lane // 8
    row0 = by * BLOCK
    valid = cutlass.min(M - row0, Int32(BLOCK))

    hv = cute.zipped_divide(_rows(h_ptr, row0, 2 * F, BLOCK, 4 * F), (1, 4))
    p_t = cute.make_tensor(p_ptr + Int64(row0), cute.make_layout(BLOCK))
    BF = cfg.bf16
    rd_t = _data_view(rd_ptr, row0, KD, BF)
    rs_t = _rows(rs_ptr, row0, KD // BLOCK, BLOCK, KD // BLOCK)
    smem = SmemAllocator()
    if cutlass.const_expr(want_col):
        cd_t = _data_view(cd_ptr, row0, KD, BF)
        cs_t = _rows(cute.recast_ptr(cs_ptr, dtype=Uint32), by, KD // 4, 1, KD // 4)
        if cutlass.const_expr(RS > 1):
            # [buffer, group, quantity, row split, column of the block] partial column amax bits
            # (row-major: the 8 writing lanes hit 8 different banks)
            xch = smem.allocate_tensor(Int32, cute.make_layout(
                (2, G, NQC, RS, BLOCK), stride=(G * NQC * RS * BLOCK, NQC * RS * BLOCK, RS * BLOCK, BLOCK, 1)), 16)
    NK = 3 if bwd else 2   # input quads per row step: gate, linear (, dA)
    dav = None
    S = cfg.stages
    if cutlass.const_expr(S > 0):
        # [quad, lane, input, step, stage, warp]: each lane reads back only the 16-byte slots it
        # copied itself (so cp.async.wait_group alone orders them, no barrier), consecutive
        # lanes on consecutive slots (conflict-free)
        sbuf = smem.allocate_tensor(Float32, cute.make_layout(
            (4, 32, NK, STEPS, S, cfg.warps),
            stride=(1, 4, 128, 128 * NK, 128 * NK * STEPS, 128 * NK * STEPS * S)), 16)
        cp_atom = cute.make_copy_atom(cpasync.CopyG2SOp(cute.nvgpu.LoadCacheMode.GLOBAL), Float32,
                                      num_bits_per_copy=128)
    if cutlass.const_expr(bwd):
        dav = cute.zipped_divide(_rows(da_ptr, row0, F, BLOCK, F), (1, 4))
        acc = cute.make_rmem_tensor(STEPS, Float32)
        for i in cutlass.range_constexpr(STEPS):
            acc[i] = Float32(0.0)
        if cutlass.const_expr(cfg.col):
            ad_t = _data_view(ad_ptr, row0, F, BF)
            as_t = _rows(cute.recast_ptr(as_ptr, dtype=Uint32), by, F // 4, 1, F // 4)

    # the rows this thread reads (rows past M read row M - 1; their stores are masked) and probs
    rows = [cutlass.min(rsi * (BLOCK // RS) + i * 4 + rg, valid - 1) for i in range(STEPS)]
    probs = [p_t[rows[i]] for i in range(STEPS)]
    first = bx * G + gi
    stride = cute.arch.grid_dim()[1] * G

    if cutlass.const_expr(S > 0):
        for st in cutlass.range_constexpr(S - 1):  # prologue: S - 1 tiles in flight
            if first + st * stride < NB:
                _issue(cp_atom, sbuf, hv, dav, rows, first + st * stride, st, t, lane, warp)
            cute.arch.cp_async_commit_group()

    it = Int32(0)
    for blk in cutlass.range(first, NB, stride):
        gvi = blk * 16 + t  # gate quad of output columns 32 blk + 4t .. +3 (linear: 8 quads on)
        if cutlass.const_expr(S > 0):
            # refill the stage read in the previous iteration (by this thread only) with tile
            # it + S - 1, then wait for tile it's copies (this thread's, all it reads)
            if blk + (S - 1) * stride < NB:
                _issue(cp_atom, sbuf, hv, dav, rows, blk + (S - 1) * stride,
                       (it + S - 1) % S, t, lane, warp)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(S - 1)
        # ---- loads + fp32 math for this warp's rows of the tile (all loads before any store)
        vals = []   # per step: [a] (fwd) or [dg, dl] (bwd), 4 values each
        avals = []  # per step: a (bwd with cfg.col)
        for i in cutlass.range_constexpr(STEPS):
            rr = rows[i]
            p = probs[i]
            if cutlass.const_expr(S > 0):
                g = sbuf[(None, lane, 0, i, it % S, warp)].load()
                lin = sbuf[(None, lane, 1, i, it % S, warp)].load()
            else:
                g = hv[(None, (rr, gvi))].load()
                lin = hv[(None, (rr, gvi + 8))].load()
            if cutlass.const_expr(not bwd):
                vals.append([[swiglu_fwd_elem(g[j], lin[j], p) for j in range(4)]])
            else:
                if cutlass.const_expr(S > 0):
                    d = sbuf[(None, lane, 2, i, it % S, warp)].load()
                else:
                    d = dav[(None, (rr, blk * 8 + t))].load()
                dg, dl, av = [], [], []
                part = Float32(0.0)
                for j in cutlass.range_constexpr(4):
                    e_dg, e_dl, e_term, e_a = swiglu_bwd_elem(d[j], g[j], lin[j], p)
                    dg.append(e_dg)
                    dl.append(e_dl)
                    av.append(e_a)
                    part = part + e_term
                acc[i] = acc[i] + part
                vals.append([dg, dl])
                avals.append(av)
        nq = len(vals[0])  # 32-column blocks of the rowwise output per tile: 1 (a) or 2 (dg, dl)
        # ---- rowwise: block amax over the 8 lanes of a row
        for i in cutlass.range_constexpr(STEPS):
            r = rsi * (BLOCK // RS) + i * 4 + rg
            es = []
            for q in cutlass.range_constexpr(nq):
                x = vals[i][q]
                m = _bfly_max(cutlass.max(*[absbits(x[j]) for j in range(4)]), (1, 2, 4))
                e = e8m0_from_absbits(m)
                w = quant_word(x[0], x[1], x[2], x[3], inv_scale(e))
                w = cutlass.select_(e == 255, Uint32(0x7F7F7F7F), w)
                es.append(e)
                if r < valid:
                    _put(rd_t, r, (nq * blk + q) * 8 + t, w, [e] * 4, BF)
            if cutlass.const_expr(not BF):
                if r < valid:
                    if t == 0:
                        for q in cutlass.range_constexpr(nq):
                            rs_t[r, nq * blk + q] = Uint8(es[q])
        # ---- columnwise: amax over 32 rows (steps in-thread, rg by butterfly, row split via smem)
        if cutlass.const_expr(want_col):
            cols = []  # (values per step, data view, scale view, word index in the row)
            for q in cutlass.range_constexpr(nq):
                cols.append(([vals[i][q] for i in range(STEPS)], cd_t, cs_t, (nq * blk + q) * 8 + t))
            if cutlass.const_expr(bwd and cfg.col):
                cols.append((avals, ad_t, as_t, blk * 8 + t))
            ms = []
            for qc in cutlass.range_constexpr(NQC):
                xs = cols[qc][0]
                for j in cutlass.range_constexpr(4):
                    m = cutlass.max(*[absbits(xs[i][j]) for i in range(STEPS)])
                    ms.append(_bfly_max(m, (8, 16)))
            if cutlass.const_expr(RS > 1):
                buf = it % 2
                if rg == 0:
                    for qc in cutlass.range_constexpr(NQC):
                        for j in cutlass.range_constexpr(4):
                            xch[buf, gi, qc, rsi, 4 * t + j] = ms[qc * 4 + j]
                for k in cutlass.range_constexpr(G):  # a static barrier id per group
                    if gi == k:
                        cute.arch.barrier(barrier_id=1 + k, number_of_threads=32 * RS)
                for qc in cutlass.range_constexpr(NQC):
                    for j in cutlass.range_constexpr(4):
                        m = xch[buf, gi, qc, 0, 4 * t + j]
                        for k in cutlass.range_constexpr(1, RS):
                            m = cutlass.max(m, xch[buf, gi, qc, k, 4 * t + j])
                        ms[qc * 4 + j] = m
            for qc in cutlass.range_constexpr(NQC):
                xs, d_t, s_t, wi = cols[qc]
                ecs = [e8m0_from_absbits(ms[qc * 4 + j]) for j in range(4)]
                invs = [inv_scale(e) for e in ecs]
                nanmask = Uint32(0)
                for j in cutlass.range_constexpr(4):
                    nanmask = nanmask | cutlass.select_(ecs[j] == 255, Uint32(0xFF << (8 * j)), Uint32(0))
                for i in cutlass.range_constexpr(STEPS):
                    r = rsi * (BLOCK // RS) + i * 4 + rg
                    w = e4m3x4(*[fmul(xs[i][j], invs[j]) for j in range(4)])
                    w = (w & ~nanmask) | (Uint32(0x7F7F7F7F) & nanmask)
                    if r < valid:
                        _put(d_t, r, wi, w, ecs, BF)
                if cutlass.const_expr(not BF):
                    if rg == 0:
                        if rsi == 0:
                            s_t[0, wi] = (Uint32(ecs[0]) | (Uint32(ecs[1]) << 8) | (Uint32(ecs[2]) << 16)
                                          | (Uint32(ecs[3]) << 24))
        it = it + 1

    if cutlass.const_expr(bwd):
        # dprobs: per-row partials (thread: its blocks in order; lanes: butterfly; groups: in order)
        red = smem.allocate_tensor(Float32, cute.make_layout((BLOCK, G), stride=(1, BLOCK)), 16)
        for i in cutlass.range_constexpr(STEPS):
            v = _bfly_sum(acc[i], (1, 2, 4))
            if t == 0:
                red[rsi * (BLOCK // RS) + i * 4 + rg, gi] = v
        cute.arch.sync_threads()
        if tidx < BLOCK:
            tot = red[tidx, 0]
            for k in cutlass.range_constexpr(1, G):
                tot = tot + red[tidx, k]
            if tidx < valid:
                cute.make_tensor(dprobs_ptr + Int64(row0), cute.make_layout(BLOCK))[tidx] = tot




@cute.jit
def _quant_fwd_host(cfg: cutlass.Constexpr, h: cute.Pointer, probs: cute.Pointer, rd: cute.Pointer,
                    rs: cute.Pointer, cd: cute.Pointer, cs: cute.Pointer, M: Int32, stream: cuda.CUstream):
    launch_strips(cfg, _quant_kernel(cfg, h, h, probs, rd, rs, cd, cs, probs, rd, rs, M), M, stream)


@cute.jit
def _quant_bwd_host(cfg: cutlass.Constexpr, da: cute.Pointer, h: cute.Pointer, probs: cute.Pointer,
                    rd: cute.Pointer, rs: cute.Pointer, cd: cute.Pointer, cs: cute.Pointer,
                    dprobs: cute.Pointer, ad: cute.Pointer, as_: cute.Pointer, M: Int32,
                    stream: cuda.CUstream):
    launch_strips(cfg, _quant_kernel(cfg, da, h, probs, rd, rs, cd, cs, dprobs, ad, as_, M), M, stream)


# ============================================================================ launches


_F32 = Ptr(torch.float32)            # 16-byte aligned fp32 tensors (h, da)
_VEC = Ptr(torch.float32, align=4)   # probs / dprobs: scalar accesses, any fp32 view
_U8 = Ptr(torch.uint8)
_M = Scalar(cutlass.Int32)


@functools.lru_cache(maxsize=None)
def swiglu_launch(cfg: SwigluCfg, bwd: bool) -> Launch:
    """The Launch of the plain kernel at ``cfg`` (args: fwd (h, probs, out, M); bwd (dout, h, probs,
    dh, dprobs, M))."""
    x = Ptr(_TORCH[cfg.dtype], align=cfg.vec * _ELT[cfg.dtype])
    if bwd:
        return Launch("moe.cute_swiglu.swiglu_bwd", _swiglu_bwd_host, cfg, (x, x, _VEC, x, _VEC, _M))
    return Launch("moe.cute_swiglu.swiglu_fwd", _swiglu_fwd_host, cfg, (x, _VEC, x, _M))


@functools.lru_cache(maxsize=None)
def quant_launch(cfg: QuantCfg) -> Launch:
    """The Launch of the fused kernel at ``cfg`` (args: fwd (h, probs, rd, rs, cd, cs, M); bwd (da, h,
    probs, dh_rd, dh_rs, dh_cd, dh_cs, dprobs, a_cd, a_cs, M)); absent optional outputs are passed
    as null pointers and never touched (cfg.col is False; every scales with cfg.bf16, whose data
    pointers point at bf16 tensors)."""
    if cfg.bwd:
        return Launch("moe.cute_swiglu.swiglu_quant_bwd", _quant_bwd_host, cfg,
                      (_F32, _F32, _VEC, _U8, _U8, _U8, _U8, _VEC, _U8, _U8, _M))
    return Launch("moe.cute_swiglu.swiglu_quant_fwd", _quant_fwd_host, cfg,
                  (_F32, _VEC, _U8, _U8, _U8, _U8, _M))


@functools.lru_cache(maxsize=None)
def _plain(F: int, s: Optional[int], dtype: torch.dtype, align: int, bwd: bool) -> Launch:
    return swiglu_launch(SwigluCfg.heuristic(F, s, str(dtype).removeprefix("torch."), align, bwd), bwd)


@functools.lru_cache(maxsize=None)
def _quant(F: int, bwd: bool, col: bool, bf16: bool = False) -> Launch:
    return quant_launch(QuantCfg.heuristic(F, bwd, col, bf16))


# ============================================================================ public API


def _align(*ts) -> int:
    a = 16
    for t in ts:
        while a > 1 and t.data_ptr() % a:
            a //= 2
    return a


def _check(name: str, t: torch.Tensor, shape: tuple, dtypes: tuple, device) -> None:
    if tuple(t.shape) != shape or t.dtype not in dtypes or not t.is_contiguous() or t.device != device:
        raise ValueError(f"{name}: expected a contiguous {shape} tensor of {'/'.join(map(str, dtypes))} on "
                         f"{device}, got {tuple(t.shape)} {t.dtype} on {t.device} (contiguous={t.is_contiguous()})")


def _glu_dims(h: torch.Tensor, s: Optional[int]) -> tuple[int, int]:
    if h.dim() != 2 or h.shape[1] % 2:
        raise ValueError(f"h: expected [M, 2F], got {tuple(h.shape)}")
    M, F2 = h.shape
    if s is not None and (s < 1 or F2 % (2 * s)):
        raise ValueError(f"glu_interleave_size {s} must divide F = {F2 // 2}")
    return M, F2 // 2


def swiglu_fwd_into(h: torch.Tensor, probs: torch.Tensor, out: torch.Tensor, s: Optional[int] = None) -> None:
    """out [M, F] = silu(gate) * linear * probs[:, None] (fp32 math, one rounding into out's dtype).

    h [M, 2F] bf16 or fp32, contiguous (gate/linear: halves for s None, [gate s | linear s] blocks
    for s); probs [M] fp32; out [M, F] like h. CUDA tensors on one device."""
    M, F = _glu_dims(h, s)
    dt = h.dtype
    if dt not in (torch.bfloat16, torch.float32):
        raise ValueError(f"h: bfloat16 or float32, got {dt}")
    _check("probs", probs, (M,), (torch.float32,), h.device)
    _check("h", h, (M, 2 * F), (dt,), h.device)
    _check("out", out, (M, F), (dt,), h.device)
    if M == 0 or F == 0:
        return
    _plain(F, s, dt, _align(h, out), False).run(h, probs, out, M)


def swiglu_bwd_into(dout: torch.Tensor, h: torch.Tensor, probs: torch.Tensor, dh: torch.Tensor,
                    dprobs: torch.Tensor, s: Optional[int] = None) -> None:
    """dh [M, 2F] (dtype of h) and dprobs [M] fp32 of :func:`swiglu_fwd_into` (reference.swiglu_bwd).

    dout [M, F] like h; dprobs[r] = sum_f dout * silu(gate) * linear, reduced in a fixed order
    (deterministic)."""
    M, F = _glu_dims(h, s)
    dt = h.dtype
    if dt not in (torch.bfloat16, torch.float32):
        raise ValueError(f"h: bfloat16 or float32, got {dt}")
    _check("h", h, (M, 2 * F), (dt,), h.device)
    _check("dout", dout, (M, F), (dt,), h.device)
    _check("probs", probs, (M,), (torch.float32,), h.device)
    _check("dh", dh, (M, 2 * F), (dt,), h.device)
    _check("dprobs", dprobs, (M,), (torch.float32,), h.device)
    if M == 0:
        return
    if F == 0:  # an empty sum (the spec has F >= 1; kept for completeness)
        dprobs.zero_()
        return
    _plain(F, s, dt, _align(h, dout, dh), True).run(dout, h, probs, dh, dprobs, M)


_FP8 = (torch.float8_e4m3fn, torch.uint8)


def _quant_dims(h: torch.Tensor) -> tuple[int, int]:
    """(M, F) of h [M, 2F] with s = 32, which also makes F a multiple of the MXFP8 block."""
    return _glu_dims(h, BLOCK)


def _check_aligned(**ts) -> None:
    for name, t in ts.items():
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: the fused SwiGLU kernels need 16-byte aligned tensors")


def _outputs(what: str, pairs, dev) -> bool:
    """Check the data / scales outputs ((name, data, scales, shape, scales shape) each; the optional
    ones are skipped when both are None); returns whether they are bf16 (then every scales is None:
    the kernel writes the dequantized values) rather than MXFP8 (e4m3 / uint8 data + uint8 scales)."""
    bf16 = pairs[0][1].dtype == torch.bfloat16
    for name, d, sc, shape, sshape in pairs:
        if bf16:
            if sc is not None:
                raise ValueError(f"{what}: bf16 outputs carry no scales ({name}_scales must be None)")
            _check(f"{name}_data", d, shape, (torch.bfloat16,), dev)
            _check_aligned(**{f"{name}_data": d})
        else:
            if (d is None) != (sc is None):
                raise ValueError(f"{what}: {name}_data and {name}_scales come together")
            _check(f"{name}_data", d, shape, _FP8, dev)
            _check(f"{name}_scales", sc, sshape, (torch.uint8,), dev)
            _check_aligned(**{f"{name}_data": d, f"{name}_scales": sc})
    return bf16


def swiglu_quant_fwd_into(h: torch.Tensor, probs: torch.Tensor, row_data: torch.Tensor,
                          row_scales: Optional[torch.Tensor], col_data: Optional[torch.Tensor] = None,
                          col_scales: Optional[torch.Tensor] = None) -> None:
    """MXFP8 of a = silu(gate) * linear * probs (fp32) with s = 32, in one pass over h.

    h [M, 2F] fp32 (FC1 accumulators, [gate 32 | linear 32]); probs [M] fp32;
    row_data [M, F] e4m3 (or uint8), row_scales [M, F/32] uint8: blocks along F (FC2 forward);
    col_data [M, F], col_scales [M/32, F] (optional, both or neither; needs M % 32 == 0): blocks
    of 32 tokens (FC2 wgrad). Bit-exact with mxfp8.quantize of this module's fp32 ``a`` (what
    :func:`swiglu_fwd_into` returns for fp32 h, s = 32), hence with mxfp8.quantize(
    reference.swiglu_fwd(h, probs, 32)) wherever the sigmoid matches torch's bit for bit.
    bf16 data tensors (scales None) receive dequantize(quantize(a)) instead, bit for bit
    (the same values, 2 bytes each, for a bf16 GEMM; no separate dequantize pass).
    """
    M, F = _quant_dims(h)
    dev = h.device
    _check("h", h, (M, 2 * F), (torch.float32,), dev)
    _check("probs", probs, (M,), (torch.float32,), dev)
    col = col_data is not None
    if col and M % BLOCK:
        raise ValueError(f"columnwise MXFP8 needs M % 32 == 0, got M = {M}")
    pairs = [("row", row_data, row_scales, (M, F), (M, F // BLOCK))]
    if col or col_scales is not None:
        pairs.append(("col", col_data, col_scales, (M, F), (M // BLOCK, F)))
    bf16 = _outputs("swiglu_quant_fwd_into", pairs, dev)
    _check_aligned(h=h)
    if M == 0:
        return
    _quant(F, False, col, bf16).run(h, probs, row_data, row_scales, col_data, col_scales, M)


def swiglu_quant_bwd_into(da: torch.Tensor, h: torch.Tensor, probs: torch.Tensor,
                          dh_row_data: torch.Tensor, dh_row_scales: Optional[torch.Tensor],
                          dh_col_data: torch.Tensor, dh_col_scales: Optional[torch.Tensor], dprobs: torch.Tensor,
                          a_col_data: Optional[torch.Tensor] = None,
                          a_col_scales: Optional[torch.Tensor] = None) -> None:
    """dSwiGLU of the fused MLP in one pass: dh quantized both ways, dprobs, optionally a columnwise.

    da [M, F] fp32 (FC2 dgrad accumulators); h [M, 2F] fp32 (saved FC1 output, s = 32); probs [M]
    fp32; M % 32 == 0 (columnwise blocks). Writes dh_row_data [M, 2F] + dh_row_scales [M, 2F/32]
    (blocks along 2F: FC1 dgrad), dh_col_data [M, 2F] + dh_col_scales [M/32, 2F] (blocks of 32
    tokens: FC1 wgrad), dprobs [M] fp32 (deterministic), and if given a_col_data [M, F] +
    a_col_scales [M/32, F]: a = swiglu(h) recomputed and quantized columnwise (FC2 wgrad).
    dh/dprobs/a are reference.swiglu_bwd / swiglu_fwd in fp32. bf16 data tensors (every scales
    None) receive dequantize(quantize(.)) of the same blocks instead, bit for bit."""
    M, F = _quant_dims(h)
    dev = h.device
    if M % BLOCK:
        raise ValueError(f"columnwise MXFP8 needs M % 32 == 0, got M = {M}")
    _check("h", h, (M, 2 * F), (torch.float32,), dev)
    _check("da", da, (M, F), (torch.float32,), dev)
    _check("probs", probs, (M,), (torch.float32,), dev)
    _check("dprobs", dprobs, (M,), (torch.float32,), dev)
    col = a_col_data is not None
    pairs = [("dh_row", dh_row_data, dh_row_scales, (M, 2 * F), (M, 2 * F // BLOCK)),
             ("dh_col", dh_col_data, dh_col_scales, (M, 2 * F), (M // BLOCK, 2 * F))]
    if col or a_col_scales is not None:
        pairs.append(("a_col", a_col_data, a_col_scales, (M, F), (M // BLOCK, F)))
    bf16 = _outputs("swiglu_quant_bwd_into", pairs, dev)
    _check_aligned(h=h, da=da)
    if M == 0:
        return
    _quant(F, True, col, bf16).run(da, h, probs, dh_row_data, dh_row_scales, dh_col_data, dh_col_scales, dprobs,
                                   a_col_data, a_col_scales, M)


# ============================================================================ for CI


def representative_launches(F: int = 2048) -> dict[str, Launch]:
    """Every kernel variant at width F (plain: bf16/fp32 x halves/s=32, fwd and bwd; fused: fwd with
    and without the columnwise output, bwd with and without a's columnwise output, each with the
    cp.async pipeline and with plain register loads, and with bf16 outputs), for the ahead-of-time
    compile test."""
    out = {}
    for dtype in ("bfloat16", "float32"):
        for s in (None, 32):
            for bwd in (False, True):
                cfg = SwigluCfg.heuristic(F, s, dtype, bwd=bwd)
                out[f"swiglu_{'bwd' if bwd else 'fwd'}/{dtype}/s={s}"] = swiglu_launch(cfg, bwd)
    for bwd in (False, True):
        for col in (False, True):
            cfg = QuantCfg.heuristic(F, bwd, col)
            out[f"swiglu_quant_{'bwd' if bwd else 'fwd'}/col={col}"] = quant_launch(cfg)
            # the register-load path (stages = 0) and a deeper pipeline stay compiled in CI
            out[f"swiglu_quant_{'bwd' if bwd else 'fwd'}/col={col}/stages=0"] = quant_launch(
                dataclasses.replace(cfg, stages=0))
            if col:
                out[f"swiglu_quant_{'bwd' if bwd else 'fwd'}/col={col}/stages=3"] = quant_launch(
                    dataclasses.replace(cfg, stages=3))
            # bf16 outputs (the dequantized values) for the bf16 GEMMs of the fused MLP
            out[f"swiglu_quant_{'bwd' if bwd else 'fwd'}/col={col}/bf16"] = quant_launch(
                QuantCfg.heuristic(F, bwd, col, bf16=True))
    return out
