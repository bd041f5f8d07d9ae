"""CuTe DSL bf16-operand grouped GEMM for Hopper (sm_90a): TMA + warp-specialized wgmma, fp32 or
bf16 output. The GEMM half of ``kernel="predq"`` for fp32 outputs (gemm_predq.py): the MXFP8
operands are dequantized once to bf16 (exact), then this kernel runs the fwd, dgrad or wgrad variant.

Canonical form ``C[m, n] = sum_k A[m, k] * B[g][n, k]`` with the m (token) dim ragged over the
groups of ``offsets`` [G+1] (cumulative, on the device; nothing read on the host):

=======  =================  ===================  ==========================  =========
variant  C                  A (m, k)             B[g] (n, k)                 reduction
=======  =================  ===================  ==========================  =========
fwd      y [M, N]           x [M, K] k-major     W [G, N, K] k-major          K
dgrad    dX [M, K]          dY [M, N] k-major    W [G, N, K] n-major (K, N)   N
wgrad    dW[g] [N, K]       dY_g^T (N, tokens)   x_g^T (K, tokens) k-major    g's tokens
                            m-major                 -> n-major
=======  =================  ===================  ==========================  =========

wgrad (``C[g][n, k] = sum over group g's tokens of dY[t, n] x[t, k]``): the output tiles are
static (G x cdiv(N, 128) x cdiv(K, tile_n)), the reduction is ragged. Both operands are read
m/n-major straight from the row-major [M, .] tensors (wgmma's transposed smem operands) in
32-token k-tiles (``tile_k = 32``, 8 stages): every group is a multiple of 32 tokens, so a
k-tile never straddles two groups; an empty group runs one k-tile read past M (TMA zeros) and
writes zeros. The bf16 dW goes straight into ``out`` (torch._grouped_mm would need a copy of
[G, N, K]).

Design (the Hopper standard):

* CTA = 3 warpgroups (384 threads), one CTA per SM, persistent: ``sms`` CTAs walk the exact
  tile list (bid, bid + grid, ...) of ``sum_g cdiv(m_g, tile_m)`` m-tiles x ``cdiv(Nc, tile_n)``
  n-tiles, found on the device by ``cute_gemm_sched.schedule`` (a warp-wide scan of the group
  tile counts, rasterized in bands of ``raster`` m-tiles). The grid depends on host-known
  dims only, so a call can be captured in a CUDA graph.
* Warp 0 (the producer; its warpgroup drops to 40 registers with ``setmaxnreg``) issues TMA
  loads of the bf16 k-tiles (``tile_m x 64`` of A, ``tile_n x 64`` of B, 128B-swizzled, the
  wgmma layouts) into a ``stages``-deep ring guarded by mbarriers
  (``cutlass.pipeline.PipelineTmaAsync``: full barriers count the TMA bytes, empty barriers
  one arrival per consumer warp). It runs ahead into the next tile while the consumers store
  the previous one.
* Warpgroups 1 and 2 (the consumers, 232 registers): each owns 64 rows of the tile and issues
  ``m64 n{tile_n} k16`` bf16 wgmmas with fp32 accumulators (operands from shared memory), one
  k-tile in flight (``wait_group(1)``) before releasing the previous stage; then the register
  epilogue (``cute_grouped_gemm.epilogue_regs``: 2-element stores in the output dtype, masked by
  the group's rows and the N tail).
* Ragged m: A is one TMA tensor [M, Kc]; a tile starts at its group's row ``offsets[g] + i *
  tile_m`` (a TMA coordinate, no alignment needed) and may read rows of the next group or past
  M (TMA zero-fills those): rows are independent in fwd / dgrad and the epilogue stores only the
  group's rows. B is one 3-D TMA tensor (n, k, g), so k and n tails read TMA zeros of that
  expert, never the next expert's rows: no tile-multiple constraint on N or K.

Measured (H200, benchmarks/results/h200-moe-gemm-bf16.txt, fp32 out, equal groups, M = 32768):
G=8 (H=7168, F=2048) FC1 fwd 693-700 TFLOP/s, FC2 fwd 609-629, FC2 dgrad 638-681, FC1 dgrad
640-665; G=32 (H=4096, F=1536) 576-674; torch._grouped_mm (bf16 out) on the same operands
644-715. What limits it: the epilogue is not overlapped with the tensor cores (the consumers
store their accumulators from registers, 8-byte stores, while the producer can only prefetch
``stages`` k-tiles), which costs most where the reduction is short (FC2 fwd, K = 2048: 32
k-tiles per 128 KiB fp32 output tile); a staged TMA-store epilogue or ping-pong consumers (one
warpgroup's epilogue under the other's mainloop) are the next steps.

Exactness: bf16 x bf16 products are exact in the fp32 accumulators; the result equals the
float64 reference of the bf16 operands up to fp32 summation order (fp32 out) and the final
rounding (bf16 out).

Constraints (``supported``): the reduction and output dims multiples of 8 (16-byte TMA strides;
the MXFP8 ops guarantee % 32), contiguous row-major tensors with 16-byte aligned bases, M <
2^31, offsets int32 / int64 cumulative [G+1] with offsets[G] == M.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import BFloat16, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from tilekernels import _cute as C
from tilekernels._glue import needs_sm90, sm_count

from .cute_gemm_sched import find_group, schedule
from .cute_grouped_gemm import _majors, bf16_mma, epilogue_regs, operand_smem

VARIANTS = ("fwd", "dgrad", "wgrad")
OUT_DTYPES = (torch.bfloat16, torch.float32)
THREADS = 384            # producer warpgroup + 2 consumer warpgroups
CONSUMER_WARPS = 8
PRODUCER_REGS, CONSUMER_REGS = 40, 232


@dataclasses.dataclass(frozen=True)
class Bf16GemmCfg:
    """Launch config of the bf16 grouped GEMM; the compile key with the arg specs.

    ``G, N, K`` are the op's static dims (weights ``[G, N, K]``); the token count M is a runtime
    scalar. ``tile_m x tile_n`` is the CTA output tile in canonical (m, n): fwd (M, N), dgrad
    (M, K). The field names ``tile_m / tile_n / tile_k / raster`` and the properties ``variant
    / nc / kc`` are what ``cute_gemm_sched.schedule`` reads; ``bufs``, ``a_kmajor`` and
    ``b_kmajor`` what ``cute_grouped_gemm.operand_smem`` / ``bf16_mma`` read."""

    variant: str
    G: int
    N: int
    K: int
    tile_n: int = 256
    stages: int = 4
    raster: int = 8
    sms: int = 132
    tile_m: int = 128
    tile_k: int = 64

    def __post_init__(self):
        # 2 consumer warpgroups of m64 wgmmas; fwd / dgrad: a k-tile is one 128-byte swizzle row
        # of bf16 (64); wgrad: 32 tokens (every group is a multiple of 32, so no k-tile straddles
        # two groups); stages x (tile_m + tile_n) x tile_k x 2 bytes in one SM's 227 KiB
        assert self.variant in VARIANTS, self
        assert self.tile_m == 128 and self.tile_n in (128, 256), self
        assert self.tile_k == (32 if self.variant == "wgrad" else 64), self
        assert self.stages >= 2 and (self.tile_m + self.tile_n) * self.tile_k * 2 * self.stages <= 220 * 1024, self
        assert self.G >= 1 and self.N % 8 == 0 and self.K % 8 == 0 and self.sms >= 1, self

    @classmethod
    def heuristic(cls, variant: str, G: int, N: int, K: int, sms: int = 132) -> "Bf16GemmCfg":
        """From static dims only (never M): 128 x 256 tiles (the largest wgmma tile two
        consumer warpgroups hold in registers), 128 x 128 for a narrow output (<= 128 columns
        would waste half a 256-wide tile), 4 stages (192 KiB: the most that fits beside nothing
        else), one CTA per SM."""
        nc = N if variant == "fwd" else K
        if variant == "wgrad":   # 32-token k-tiles, 8 stages: the same 192 KiB ring
            return cls(variant=variant, G=G, N=N, K=K, tile_n=256 if nc > 128 else 128, sms=sms, tile_k=32,
                       stages=8)
        return cls(variant=variant, G=G, N=N, K=K, tile_n=256 if nc > 128 else 128, sms=sms)

    @property
    def bufs(self) -> int:
        return self.stages

    @property
    def nc(self) -> int:
        return self.N if self.variant == "fwd" else self.K

    @property
    def kc(self) -> int:
        """The static reduction length (wgrad: the tokens, dynamic; 0)."""
        return {"fwd": self.K, "dgrad": self.N, "wgrad": 0}[self.variant]

    @property
    def a_kmajor(self) -> bool:
        return self.variant != "wgrad"

    @property
    def b_kmajor(self) -> bool:
        return self.variant == "fwd"


# ------------------------------------------------------------------ kernel


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
            mB: cute.Tensor, mC: cute.Tensor, mOff: cute.Tensor, M: Int32):
    BM, BN, BK, NS = cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.stages
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    if warp == 0:
        C.prefetch_tma(tma_a, tma_b)

    smem = cutlass.memory.SmemAllocator()
    _, sA, sB = operand_smem(cfg, smem)
    pipe = C.tma_pipeline(smem, NS, (BM + BN) * BK * 2, CONSUMER_WARPS)

    n_tiles = (cfg.nc + BN - 1) // BN
    if const_expr(cfg.variant == "wgrad"):
        m_tiles = Int32((cfg.N + BM - 1) // BM * cfg.G)
    else:
        _, _, _, _, m_tiles = find_group(mOff, Int32(0), cfg.G, BM)
    total = m_tiles * n_tiles

    if wg == 0:
        cute.arch.setmaxregister_decrease(PRODUCER_REGS)
        if warp == 0:
            pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, NS)
            for t in cutlass.range(bidx, total, gdim, unroll=1):
                g, m0, _, n0, _, k0, kb_lim, nk = schedule(cfg, mOff, M, t, m_tiles)
                if const_expr(cfg.variant == "wgrad"):
                    # tokens k0.. of group g; an empty group (one k-tile, nk >= 1) reads past M:
                    # TMA zeros, so its accumulators stay 0 and the epilogue writes zeros
                    kt0 = cutlass.select_(kb_lim == 0, M, k0)
                    gA = cute.local_tile(cute.domain_offset((m0, kt0), mA), (BM, BK), (0, None))
                    gB = cute.local_tile(cute.domain_offset((n0, kt0), mB), (BN, BK), (0, None))
                else:
                    gA = cute.local_tile(cute.domain_offset((m0, 0), mA), (BM, BK), (0, None))
                    gB = cute.local_tile(cute.domain_offset((n0, 0), mB[None, None, g]), (BN, BK), (0, None))
                tAs, tAg = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                                 cute.group_modes(gA, 0, 2))
                tBs, tBg = cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                                 cute.group_modes(gB, 0, 2))
                for kt in cutlass.range(nk, unroll=1):
                    pipe.producer_acquire(pst)
                    bar = pipe.producer_get_barrier(pst)
                    cute.copy(tma_a, tAg[None, kt], tAs[None, pst.index], tma_bar_ptr=bar)
                    cute.copy(tma_b, tBg[None, kt], tBs[None, pst.index], tma_bar_ptr=bar)
                    pipe.producer_commit(pst)
                    pst.advance()
            pipe.producer_tail(pst)
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS)
        ct = tidx - 128
        tiled_mma, thr_mma_c, tCrA, tCrB, tCcC, acc = bf16_mma(cfg, sA, sB, wg - 1, ct)
        atom_st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mC.element_type,
                                      num_bits_per_copy=2 * mC.element_type.width)
        d_c = cute.logical_divide(tCcC, cute.make_layout(2))
        pair = cute.make_rmem_tensor((2,), mC.element_type)
        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, NS)
        fst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, NS)
        for t in cutlass.range(bidx, total, gdim, unroll=1):
            g, m0, m_lim, n0, n_lim, _, _, nk = schedule(cfg, mOff, M, t, m_tiles)
            acc.fill(0.0)
            warpgroup.fence()
            # first k-tile: nothing to release yet
            pipe.consumer_wait(rst)
            for kb in cutlass.range_constexpr(BK // 16):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, rst.index], tCrB[None, None, kb, rst.index], acc)
            warpgroup.commit_group()
            rst.advance()
            for kt in cutlass.range(1, nk, unroll=1):
                pipe.consumer_wait(rst)
                for kb in cutlass.range_constexpr(BK // 16):
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb, rst.index], tCrB[None, None, kb, rst.index],
                              acc)
                warpgroup.commit_group()
                # the previous k-tile's wgmmas have retired: release its stage
                warpgroup.wait_group(1)
                pipe.consumer_release(fst)
                fst.advance()
                rst.advance()
            warpgroup.wait_group(0)
            pipe.consumer_release(fst)
            fst.advance()
            if const_expr(cfg.variant == "wgrad"):
                gC = cute.domain_offset((Int64(g) * cfg.N + m0, cute.assume(n0, divby=BN)), mC)
            else:
                gC = cute.domain_offset((Int64(m0), cute.assume(n0, divby=BN)), mC)
            d_a = cute.logical_divide(acc, cute.make_layout(2))
            epilogue_regs(thr_mma_c, d_a, d_c, pair, atom_st, gC, BM, BN, m_lim, n_lim)


# ------------------------------------------------------------------ host


@cute.jit
def _host(cfg: cutlass.Constexpr, a: cute.Pointer, b: cute.Pointer, offs: cute.Pointer, out: cute.Pointer,
          M: Int32, stream: C.cuda.CUstream):
    G, N, K = cfg.G, cfg.N, cfg.K
    if const_expr(cfg.variant == "fwd"):
        mA = cute.make_tensor(a, cute.make_layout((M, K), stride=(K, 1)))
        mB = cute.make_tensor(b, cute.make_layout((N, K, G), stride=(K, 1, N * K)))
        mC = cute.make_tensor(out, cute.make_layout((M, N), stride=(N, 1)))
    elif const_expr(cfg.variant == "wgrad"):
        # canonical (m, k) = (n, token) of dY [M, N], (n, k) = (k, token) of x [M, K]: both
        # m/n-major; C = dW viewed [G*N, K]
        mA = cute.make_tensor(a, cute.make_layout((N, M), stride=(1, N)))
        mB = cute.make_tensor(b, cute.make_layout((K, M), stride=(1, K)))
        mC = cute.make_tensor(out, cute.make_layout((G * N, K), stride=(K, 1)))
    else:
        mA = cute.make_tensor(a, cute.make_layout((M, N), stride=(N, 1)))
        mB = cute.make_tensor(b, cute.make_layout((K, N, G), stride=(1, K, N * K)))
        mC = cute.make_tensor(out, cute.make_layout((M, K), stride=(K, 1)))
    mOff = cute.make_tensor(offs, cute.make_layout(G + 1))
    _, sA_l, sB_l = _smem_layouts(cfg)
    op = cpasync.CopyBulkTensorTileG2SOp()
    tma_a, tA = cpasync.make_tiled_tma_atom(op, mA, cute.slice_(sA_l, (None, None, 0)), (cfg.tile_m, cfg.tile_k))
    tma_b, tB = cpasync.make_tiled_tma_atom(op, mB, cute.slice_(sB_l, (None, None, 0)), (cfg.tile_n, cfg.tile_k))
    # persistent grid: at most one CTA per SM, never more than the bound on the tile count
    n_tiles = (cfg.nc + cfg.tile_n - 1) // cfg.tile_n
    if const_expr(cfg.variant == "wgrad"):
        grid_x = min((N + cfg.tile_m - 1) // cfg.tile_m * G * n_tiles, cfg.sms)
    else:
        grid_x = cutlass.min(((M + cfg.tile_m - 1) // cfg.tile_m + G) * n_tiles, cfg.sms)
    _kernel(cfg, tma_a, tA, tma_b, tB, mC, mOff, M).launch(
        grid=(grid_x, 1, 1), block=(THREADS, 1, 1), stream=stream, min_blocks_per_mp=1,
        preferred_smem_carveout=100)


def _smem_layouts(cfg):
    """(None, sA layout, sB layout): the staged 128B-swizzled wgmma layouts operand_smem uses."""
    import cutlass.utils.hopper_helpers as sm90_utils

    tile = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
    a_lay, b_lay = _majors(cfg)
    return (None, sm90_utils.make_smem_layout_a(a_lay, tile, BFloat16, cfg.stages),
            sm90_utils.make_smem_layout_b(b_lay, tile, BFloat16, cfg.stages))


# ------------------------------------------------------------------ Python entry points


def supported(variant: str, G: int, N: int, K: int, out_dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """Whether this kernel computes the variant at these dims / output dtype on ``device``, and why not."""
    if variant not in VARIANTS:
        return False, f"variant {variant} (fwd / dgrad / wgrad)"
    if out_dtype not in OUT_DTYPES:
        return False, f"output dtype {out_dtype}"
    if N % 8 or K % 8:
        return False, f"N={N}, K={K} not multiples of 8 (16-byte TMA strides)"
    why = needs_sm90(device, "sm_90a TMA + wgmma kernel")
    if why:
        return False, why
    return True, "sm_90a TMA + wgmma bf16 grouped GEMM"


@functools.lru_cache(maxsize=None)
def gemm_launch(variant: str, G: int, N: int, K: int, out_dtype: torch.dtype,
                offs_dtype: torch.dtype = torch.int64, cfg: Bf16GemmCfg | None = None, sms: int = 132) -> C.Launch:
    """The launch of one variant at static dims (G, N, K) (weights [G, N, K]); M is dynamic."""
    cfg = cfg if cfg is not None else Bf16GemmCfg.heuristic(variant, G, N, K, sms)
    bf = C.Ptr(torch.bfloat16)
    sig = (bf, bf, C.Ptr(offs_dtype, align=offs_dtype.itemsize), C.Ptr(out_dtype), C.Scalar(Int32))
    return C.Launch(f"moe.cute_gemm_bf16.{variant}", _host, cfg, sig)


def _run(variant, a, b, offsets, out, cfg):
    M = a.shape[0]
    G, N, K = out.shape if variant == "wgrad" else b.shape
    if M == 0:
        if variant == "wgrad":
            out.zero_()
        return
    gemm_launch(variant, G, N, K, out.dtype, offsets.dtype, cfg, sm_count(a.device)).run(
        a, b, offsets, out, M)


def gemm_fwd_into(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
                  cfg: Bf16GemmCfg | None = None) -> None:
    """out [M, N] (fp32 / bf16) = per group g (rows offsets[g]:offsets[g+1]) a . b[g]^T;
    a [M, K] bf16, b [G, N, K] bf16, offsets [G+1] int32/int64 on the device."""
    _run("fwd", a, b, offsets, out, cfg)


def gemm_dgrad_into(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
                    cfg: Bf16GemmCfg | None = None) -> None:
    """out [M, K] (fp32 / bf16) = per group a . b[g] (reduction over N); a [M, N] bf16,
    b [G, N, K] bf16."""
    _run("dgrad", a, b, offsets, out, cfg)


def gemm_wgrad_into(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
                    cfg: Bf16GemmCfg | None = None) -> None:
    """out [G, N, K] (bf16 / fp32): out[g] = a_g^T . b_g over the group's tokens (rows
    offsets[g]:offsets[g+1], every group a multiple of 32; zeros for an empty group); a [M, N]
    bf16, b [M, K] bf16 (the columnwise-dequantized dY and x)."""
    _run("wgrad", a, b, offsets, out, cfg)
