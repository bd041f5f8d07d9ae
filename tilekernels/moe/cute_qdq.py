"""CuTe DSL MXFP8 quantize-dequantize ("qdq") in one pass: x [R, K] -> bf16 [R, K] holding
exactly ``dequantize(quantize(x))`` (Hopper sm_90a; compiles for sm_100a too).

Why: on Hopper the MXFP8 GEMMs of the fused MLP run as "dequantize each operand once + a bf16
grouped GEMM" (``gemm_predq``). For an operand that is quantized only to be dequantized again
(the bf16 weights every call, x, dY), the two passes move 2 + (1 + 1/32) bytes and then
(1 + 1/32) + 2 bytes per element; this kernel moves 2 + 2 (bf16 in, bf16 out) and saves a
launch. At G=32 x 1024 tokens, H=4096, F=1536 the weights alone are 604M elements a forward.

Exactness: the values are the ones the two kernels of ``cute_quantize`` produce, by the same
instructions in the same order (their device helpers): the E8M0 exponent from the integer amax
of the block, e4m3 bytes by ``cvt.rn.satfinite.e4m3x2.f32`` of x * 2^(127-e) (a NaN/Inf block:
bytes 0x7F, scale 0xFF), then e4m3 -> f16x2 -> fp32, times 2^(e-127) in fp32 (NaN for 0xFF),
rounded to bf16 (RNE; exact unless below bf16's normal range, as in ``dequantize_into``). The
GPU test compares it bitwise with ``dequantize_into(quantize_into(x))``.

Layout and mapping (:class:`QdqCfg`): x and out row-major contiguous, K static. A CTA of
``threads`` takes a ``rows`` x (threads * vec) tile; each thread loads its ``rows`` x ``vec``
elements (16-byte loads, all issued before any math), then per row:

* rowwise (blocks of 32 along K, K % 32 == 0, any R): the 32 / vec lanes of a block join
  their amax by butterfly shuffles (every lane takes part: masked chunks are zeros);
* columnwise (blocks of 32 along R, R % 32 == 0, any K; rows = 32): each thread's vec columns
  get their amax down the 32 rows first.

Both axes at once (``QdqCfg.both``, :func:`qdq_both_into`): columnwise tiles whose rows are also
qdq'd rowwise (as above) into a second output: x read once for dY of the fused MLP.

Tails: rows past R and chunks past K are masked; R == 0 or K == 0 launches nothing; 64-bit row
offsets (R * K may exceed 2^31).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16

from tilekernels import _cute as C

from . import cute_quantize as cq
from .cute_quantize import (BLOCK, _abs_bits_max, _col_block_scales, _e4m3x2, _e8m0, _from_e4m3x2,
                            _inv_scale, _load_block, _scale, _store_out)

_NAME = "moe.cute_qdq"
IN_DTYPES = (torch.bfloat16, torch.float32)


def _vec(dtype: torch.dtype) -> int:
    """Elements in 16 bytes of x."""
    return 4 if dtype == torch.float32 else 8


def served(x: torch.Tensor, out: torch.Tensor, axis: str) -> bool:
    """Whether the qdq kernel takes this call (either ``axis``): x bf16 / fp32, contiguous, K a
    multiple of 16 bytes of x; ``out`` bf16, contiguous, x's shape (the kernel writes rows K
    elements apart); both pointers 16-byte aligned (torch's allocations and whole weights are).
    :func:`qdq_into` runs the two kernels of ``cute_quantize`` otherwise (the same values)."""
    return (x.dtype in IN_DTYPES and x.is_contiguous() and x.shape[1] % _vec(x.dtype) == 0
            and out.dtype == torch.bfloat16 and out.is_contiguous() and out.shape == x.shape
            and (x.data_ptr() | out.data_ptr()) & 15 == 0)


@dataclasses.dataclass(frozen=True)
class QdqCfg:
    """Launch config of the qdq kernel (the compile key with the input dtype).

    K: columns (static); rowwise or columnwise blocks; vec: elements per thread and row (one
    16-byte load); threads: CTA size; rows: tile rows (32 for columnwise: one block); both:
    columnwise tiles that also write the rowwise qdq to a second output (one read of x for both
    axes, e.g. dY of the fused MLP, whose dgrad takes it rowwise and its wgrad columnwise)."""

    K: int
    rowwise: bool
    vec: int
    threads: int
    rows: int
    both: bool = False

    def __post_init__(self):
        if not self.rowwise and self.rows != BLOCK:
            raise ValueError(f"QdqCfg: columnwise tiles are one block of {BLOCK} rows: {self}")
        if (self.rowwise or self.both) and (BLOCK % self.vec or self.K % BLOCK):
            raise ValueError(f"QdqCfg: rowwise needs vec | 32 and K % 32 == 0: {self}")
        if self.both and self.rowwise:
            raise ValueError(f"QdqCfg: both axes run on columnwise tiles (rowwise=False): {self}")

    @classmethod
    def heuristic(cls, K: int, dtype: torch.dtype, rowwise: bool, both: bool = False) -> "QdqCfg":
        """16-byte loads (vec 8 bf16 / 4 fp32; needs K % vec == 0 and 16-byte aligned pointers,
        see :func:`served`), 128 threads unless 64 or 32 tile K exactly (K = 1536: 3 x 64 x 8,
        no idle lanes); rowwise 16 rows a tile, columnwise (and both) 32 (the block). both:
        8-byte loads (vec 4 bf16 / 2 fp32): with 16-byte ones the 32 rows of x in registers plus
        the two axes' scales spill (255 registers + 488-1024 bytes of stack); 213 / 126 without."""
        vec = _vec(dtype) // (2 if both else 1)   # both: 8-byte loads (32 rows x 16 bytes spill)
        chunks = C.cdiv(K, vec)
        threads = next((t for t in (128, 64, 32) if chunks % t == 0),
                       max(32, min(128, 1 << max(0, (chunks - 1).bit_length()))))
        return cls(K=K, rowwise=rowwise and not both, vec=vec, threads=threads,
                   rows=16 if rowwise and not both else BLOCK, both=both)


@cute.jit
def _qdq_pairs(vc, inv: cute.Tensor, sc: cute.Tensor, mask, ob: cute.Tensor, ov: cute.Tensor,
               V: cutlass.Constexpr):
    """ov[c] = e4m3(vc[c] * inv[c]) * sc[c] in fp32, c < V (V even); ``mask`` (per byte pair,
    0xFF bytes: a NaN/Inf block) replaces those e4m3 bytes with 0x7F, as the quantize kernel
    stores them."""
    for c in cutlass.range_constexpr(V // 2):
        q = _e4m3x2(vc[2 * c] * inv[2 * c], vc[2 * c + 1] * inv[2 * c + 1])
        ob[c] = Uint16((Int32(q) & ~mask[c]) | (mask[c] & 0x7F7F))
        a, b = _from_e4m3x2(ob[c])
        ov[2 * c] = a * sc[2 * c]
        ov[2 * c + 1] = b * sc[2 * c + 1]


def _row_e8m0(xrow, V: int):
    """E8M0 of the rowwise block this thread's V elements of one row belong to: the integer amax
    joined over the block's 32 / V lanes by butterfly shuffles (trace-time helper)."""
    am = _abs_bits_max(xrow, V)
    off = 1
    while off < BLOCK // V:   # unrolled at trace time
        am = cutlass.max(am, cute.arch.shuffle_sync_bfly(am, offset=off))
        off *= 2
    return _e8m0(am)


@cute.kernel
def _qdq_kernel(cfg: cutlass.Constexpr, mX: cute.Tensor, mO: cute.Tensor, mO2: cute.Tensor, R: Int32):
    V = cfg.vec
    NP = V // 2
    ROWS = cfg.rows
    dt = mX.element_type
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()      # x: row tile (grid.y caps at 65535), y: column tile
    cidx = by * cfg.threads + tidx
    col_ok = cidx * V < cfg.K
    row0 = bx * ROWS
    tX = cute.local_tile(cute.domain_offset((Int64(row0), 0), mX), (ROWS, V), (0, cidx))
    tO = cute.local_tile(cute.domain_offset((Int64(row0), 0), mO), (ROWS, V), (0, cidx))
    tO2 = cute.local_tile(cute.domain_offset((Int64(row0), 0), mO2), (ROWS, V), (0, cidx))  # both: rowwise out

    # every load first (zeros outside), so the 16-byte loads are all in flight together
    xr = cute.make_rmem_tensor(cute.make_layout((ROWS, V), stride=(V, 1)), dt)
    _load_block(tX, xr, col_ok, row0, R, ROWS, V)

    inv = cute.make_rmem_tensor((V,), Float32)
    sc = cute.make_rmem_tensor((V,), Float32)
    mask = cute.make_rmem_tensor(cute.make_layout((NP,), stride=(1,)), Int32)
    if cutlass.const_expr(not cfg.rowwise):
        # R % 32 == 0 (columnwise): the tile is one whole block down every column
        es = cute.make_rmem_tensor((V,), Uint8)
        _col_block_scales(xr, es, inv, mask, ROWS, V, NP)
        for c in cutlass.range_constexpr(V):
            sc[c] = _scale(Int32(es[c]) & 0xFF)
    rinv, rsc, rmask = inv, sc, mask   # the rowwise scales (both: their own, the columnwise ones stay)
    if cutlass.const_expr(cfg.both):
        rinv = cute.make_rmem_tensor((V,), Float32)
        rsc = cute.make_rmem_tensor((V,), Float32)
        rmask = cute.make_rmem_tensor(cute.make_layout((NP,), stride=(1,)), Int32)
    if cutlass.const_expr(cfg.both):
        # every row's E8M0 first (their shuffles before any store; 32 ints instead of the rows'
        # fp32 values live across them)
        erow = cute.make_rmem_tensor((ROWS,), Int32)
        for r in cutlass.range_constexpr(ROWS):
            erow[r] = _row_e8m0(xr[r, None], V)
    ob = cute.make_rmem_tensor(cute.make_layout((NP,), stride=(1,)), Uint16)
    ov = cute.make_rmem_tensor((V,), Float32)
    for r in cutlass.range_constexpr(ROWS):
        if cutlass.const_expr(cfg.both):   # the columnwise values first; the rowwise ones below
            _qdq_pairs(xr[r, None].load().to(Float32), inv, sc, mask, ob, ov, V)
            if col_ok and row0 + r < R:
                _store_out(ov, tO[r, None])
        if cutlass.const_expr(cfg.rowwise or cfg.both):
            if cutlass.const_expr(cfg.both):
                e = erow[r]
            else:
                e = _row_e8m0(xr[r, None], V)
            s_inv = _inv_scale(e)
            s = _scale(e)
            m = Int32(cutlass.select_(e == 255, 0xFFFF, 0))
            for c in cutlass.range_constexpr(V):
                rinv[c] = s_inv
                rsc[c] = s
            for c in cutlass.range_constexpr(NP):
                rmask[c] = m
        _qdq_pairs(xr[r, None].load().to(Float32), rinv, rsc, rmask, ob, ov, V)
        if col_ok and row0 + r < R:
            if cutlass.const_expr(cfg.both):
                _store_out(ov, tO2[r, None])
            else:
                _store_out(ov, tO[r, None])


@cute.jit
def _qdq_host(cfg: cutlass.Constexpr, x: cute.Pointer, o: cute.Pointer, o2: cute.Pointer, R: Int32,
              stream: C.cuda.CUstream):
    lay = cute.make_layout((R, cfg.K), stride=(cfg.K, 1))
    grid = (cute.ceil_div(R, cfg.rows), C.cdiv(cfg.K, cfg.threads * cfg.vec), 1)
    _qdq_kernel(cfg, cute.make_tensor(x, lay), cute.make_tensor(o, lay), cute.make_tensor(o2, lay), R).launch(
        grid=grid, block=(cfg.threads, 1, 1), stream=stream)


@functools.lru_cache(maxsize=None)
def launch_for(cfg: QdqCfg, dtype: torch.dtype) -> C.Launch:
    """The qdq launch of an explicit config; run args (x, out, out2, R): out2 is the rowwise
    output of ``cfg.both`` (out the columnwise one), else None (never touched)."""
    elt = 4 if dtype == torch.float32 else 2
    o = C.Ptr(torch.bfloat16, cfg.vec * 2)
    return C.Launch(f"{_NAME}.qdq", _qdq_host, cfg, (C.Ptr(dtype, cfg.vec * elt), o, o, C.Scalar()))


@functools.lru_cache(maxsize=None)
def qdq_launch(dtype: torch.dtype, K: int, rowwise: bool, both: bool = False) -> C.Launch:
    """The default qdq launch for x of ``dtype`` with K columns (static dims only)."""
    return launch_for(QdqCfg.heuristic(K, dtype, rowwise, both), dtype)


def qdq_into(x: torch.Tensor, out: torch.Tensor, axis: str) -> None:
    """out [R, K] bf16 = dequantize(quantize(x, axis)) for x [R, K] bf16 / fp32 (on a CUDA
    device), on the current stream: one pass where :func:`served`, else quantize + dequantize
    (``cute_quantize``, a temporary e4m3 copy). 'rowwise' needs K % 32 == 0, 'columnwise'
    R % 32 == 0. Nothing is validated."""
    R, K = x.shape
    if R == 0 or K == 0:
        return
    if not served(x, out, axis):
        rowwise = axis == "rowwise"
        d = torch.empty(R, K, dtype=torch.uint8, device=x.device)
        s = torch.empty((R, K // BLOCK) if rowwise else (R // BLOCK, K), dtype=torch.uint8, device=x.device)
        cq.quantize_into(x.contiguous(), d if rowwise else None, s if rowwise else None,
                         None if rowwise else d, None if rowwise else s)
        cq.dequantize_into(d, s, out, axis)
        return
    qdq_launch(x.dtype, K, axis == "rowwise").run(x, out, None, R)


def qdq_both_into(x: torch.Tensor, row_out: torch.Tensor, col_out: torch.Tensor) -> None:
    """row_out / col_out [R, K] bf16 = :func:`qdq_into` of x 'rowwise' / 'columnwise' (bitwise),
    from one read of x where both calls would be :func:`served` and K % 32 == 0 (QdqCfg.both);
    else the two calls. Needs K % 32 == 0 and R % 32 == 0; nothing is validated."""
    R, K = x.shape
    if R == 0 or K == 0:
        return
    if not (K % BLOCK == 0 and served(x, row_out, "rowwise") and served(x, col_out, "columnwise")):
        qdq_into(x, row_out, "rowwise")
        qdq_into(x, col_out, "columnwise")
        return
    qdq_launch(x.dtype, K, False, True).run(x, col_out, row_out, R)


def qdq_both(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New bf16 tensors (rowwise, columnwise) of :func:`qdq_both_into`."""
    row, col = (torch.empty(x.shape, dtype=torch.bfloat16, device=x.device) for _ in range(2))
    qdq_both_into(x, row, col)
    return row, col


def qdq(x: torch.Tensor, axis: str) -> torch.Tensor:
    """A new bf16 tensor [R, K] = dequantize(quantize(x, axis)) (see :func:`qdq_into`)."""
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    qdq_into(x, out, axis)
    return out


def representative_launches(K: int = 7168) -> dict[str, C.Launch]:
    """Every variant at one K (what the CPU compile test exports): both axes (and both at once),
    bf16 and fp32 in, and the MLP's widths' thread counts (K = 1536: 64 threads)."""
    out = {}
    for dt in IN_DTYPES:
        n = str(dt).removeprefix("torch.")
        for axis in ("rowwise", "columnwise"):
            out[f"qdq.{axis}.{n}"] = qdq_launch(dt, K, axis == "rowwise")
            out[f"qdq.{axis}.K1536.{n}"] = qdq_launch(dt, 1536, axis == "rowwise")
        out[f"qdq.both.{n}"] = qdq_launch(dt, K, False, True)
    return out
