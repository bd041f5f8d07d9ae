"""CuTe DSL mhc_proj_rms forward for Hopper (sm_90a): TMA ring + warp-specialized wgmma.

proj [M, N] fp32 = x @ weight^T;  r [M] fp32 = 1 / (sqrt(sum_k x[m, k]^2 / K) + eps)

x [M, K] bf16 and weight [N, K] bf16, both contiguous row-major (K-major: the layout wgmma
reads from shared memory without a transpose) with 16-byte aligned bases, K % 8 == 0 (16-byte
TMA row strides), N <= 32 (N = n*n + 2n: 24 for n = 4). M is a runtime scalar; N and K are
static (the config is the compile key), so a new M reuses the kernel. proj and r are fp32,
contiguous, written in place (destination passing).

Why: the op reads x once (1.88 GB at M = 32768, K = 28672) and writes 3 MB, so it is a copy at
HBM bandwidth (half an H200 copy of x: 0.440 ms; the cuTile kernel ``mhc_pr_fwd``: 0.441). The
product has a tiny N, so the tensor cores are nearly idle; what matters is keeping enough of
x in flight per SM, which TMA bulk loads into an mbarrier ring do with one issuing thread.

Design (the Hopper standard of tilekernels/moe/cute_gemm_bf16.py, whose smem / wgmma helpers
from cute_grouped_gemm.py it reuses):

* CTA = 128 rows of x (BM), all of K, 384 threads; grid = cdiv(M, 128) (M and static dims only;
  M = 0 launches nothing). Warpgroup 0 is the producer (setmaxnreg down to 40): warp 0 issues,
  per k-tile of BK = 128 (two 128-byte swizzle atoms of bf16: two TMA boxes an operand), the
  TMA loads of the x tile [128 x BK] and the weight tile [NP x BK]
  (NP = 16 for N <= 16, else 32: weight rows N..NP-1, the K tail and the M tail are out of
  bounds of the TMA tensors, which zero-fill them) into a ``stages``-deep ring
  (``cutlass.pipeline.PipelineTmaAsync``; full barriers count the whole boxes' bytes).
* Warpgroups 1-2 (consumers, setmaxnreg up to 96) own 64 rows each. Per k-tile: BK / 16
  m64 nNP k16 wgmmas (bf16 from smem, fp32) into a fresh partial (the first with the
  accumulate flag off), and, while they run, the sum of squares of the warpgroup's 64 rows of
  the same x stage: thread t takes row t // 2 and, per swizzle atom, the four 16-byte chunks
  (t % 2) * 4 + j, read through the 128B-swizzled smem tensor (a chunk stays contiguous under
  the swizzle: 8-element vector loads; the 8 threads of a quarter warp hit 8 distinct bank
  groups). Then wait for the wgmmas, release the stage, and add the partial into the running
  total with Kahan compensation (one fp32 wgmma chain over K = 28672 measured 3.3e-5 relative
  error; the compensated sum of per-tile partials measured 1.2e-7). The tile's sum of squares
  is summed fresh per k-tile and Kahan-added too (cheap: one value a thread).
* Epilogue: the totals go straight from the accumulator fragments to proj (rows < M, cols < N;
  8-byte pairs when N is even via ``epilogue_regs``, else 4-byte stores); the two threads of
  a row combine their sums of squares by one shuffle and the even one writes r[m].
* Occupancy: 2 CTAs per SM (``ctas``), not persistent. A stage is (128 + NP) x BK x 2 bytes
  (40 KiB at NP = 32, 36 at 16); the CTAs of an SM share a 220 KiB budget (stages = 2 / 3),
  so two CTAs (768 threads, 80 registers a thread at launch: 40 + 2 x 96 <= 3 x 80) hold
  128-192 KiB of x in flight per SM, above the ~64 KiB an SM needs at the copy rate; two CTAs
  hide one CTA's start / epilogue behind the other's stream, and at M = 32768 the 256 CTAs are
  one wave on 132 SMs: nothing for a persistent tile loop to gain.
* Measured (H200, M = 32768, K = 28672, do_bench medians; the history is in the mHC ledger,
  benchmarks/results/nvidia-h200-mhc-cutile.md): N = 24 0.4405 ms without an L2 hint on x's loads
  against 0.463 with evict-first (same run); BK = 64 and ctas = 1 slower there. Small M is
  latency-bound (M = 1024: 8 CTAs); a split-K grid would help there.

Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from tilekernels import _cute as CU
from tilekernels.moe.cute_grouped_gemm import bf16_mma, epilogue_regs, operand_smem
from tilekernels.moe.cute_gemm_bf16 import _smem_layouts

_NAME = "mhc.cute_proj_rms_fwd"
THREADS = 384                   # producer warpgroup + 2 consumer warpgroups
CONSUMER_WARPS = 8
PRODUCER_REGS = 40
# consumers' setmaxnreg by CTAs an SM: 40 + 2 x C <= 3 x (the launch's 168 / 80 registers a thread)
CONSUMER_REGS = {1: 232, 2: 96}
SMEM_RING = 220 * 1024          # the rings of the CTAs on one SM (227 KiB less barriers and alignment)
EVICT_FIRST = 0x12F0000000000000   # TMA L2 cache hint (CUTLASS's CacheHintSm90::EVICT_FIRST)


@dataclasses.dataclass(frozen=True)
class ProjRmsFwdCuteCfg:
    """Launch config (the compile key, with the arg specs). N, K: static dims of weight [N, K];
    NP: the wgmma's N (the weight tile's rows); BM x BK: the x tile a k-step; stages: ring depth.
    ``tile_m / tile_n / tile_k / bufs / a_kmajor / b_kmajor`` are the names the shared
    cute_grouped_gemm helpers read."""

    N: int
    K: int
    NP: int
    stages: int
    BM: int = 128
    BK: int = 128
    ctas: int = 2               # CTAs an SM (the launch bound; their rings share SMEM_RING)
    evict_first: bool = False   # x's TMA loads with the L2 evict-first hint (H200: 0.463 ms with, 0.4405 without)

    def __post_init__(self):
        if not (1 <= self.N <= self.NP and self.NP in (16, 32)):
            raise ValueError(f"ProjRmsFwdCuteCfg: 1 <= N <= NP, NP in (16, 32): {self}")
        if self.K < 8 or self.K % 8 or self.BM != 128 or self.BK not in (64, 128) or self.ctas not in (1, 2):
            raise ValueError(f"ProjRmsFwdCuteCfg: K % 8 == 0, BM == 128, BK in (64, 128), ctas in (1, 2): {self}")
        if self.stages < 2 or self.stages * self.stage_bytes * self.ctas > SMEM_RING:
            raise ValueError(f"ProjRmsFwdCuteCfg: stages >= 2, ctas x stages x {self.stage_bytes} B <= "
                             f"{SMEM_RING}: {self}")

    @classmethod
    def heuristic(cls, N: int, K: int, BK: int = 128, ctas: int = 2, **kw) -> "ProjRmsFwdCuteCfg":
        """Static dims only: the narrowest wgmma N that covers N, the deepest ring (at most 12
        stages) the CTAs of an SM share."""
        NP = 16 if N <= 16 else 32
        return cls(N=N, K=K, NP=NP, BK=BK, ctas=ctas,
                   stages=min(12, SMEM_RING // ctas // ((128 + NP) * BK * 2)), **kw)

    @property
    def stage_bytes(self) -> int:
        return (self.BM + self.NP) * self.BK * 2

    @property
    def nk(self) -> int:
        return CU.cdiv(self.K, self.BK)

    tile_m = property(lambda s: s.BM)
    tile_n = property(lambda s: s.NP)
    tile_k = property(lambda s: s.BK)
    bufs = property(lambda s: s.stages)
    a_kmajor = property(lambda s: True)
    b_kmajor = property(lambda s: True)


# ------------------------------------------------------------------ kernel


@cute.jit
def _kahan(acc: cute.Tensor, comp: cute.Tensor, part: cute.Tensor):
    """acc += part per element with Kahan compensation (comp: the low bits acc lost)."""
    for i in cutlass.range_constexpr(cute.size(acc)):
        y = part[i] - comp[i]
        t = acc[i] + y
        comp[i] = (t - acc[i]) - y
        acc[i] = t


@cute.jit
def _row_sumsq(srow: cute.Tensor, half: Int32, frag: cute.Tensor, atom16, atoms: cutlass.Constexpr) -> Float32:
    """Sum of squares (fp32) of this thread's half of one swizzled smem row: per 64-wide swizzle
    atom a, the 16-byte chunks a * 8 + half * 4 + j, j < 4."""
    s = Float32(0.0)
    for a in cutlass.range_constexpr(atoms):
        for j in cutlass.range_constexpr(4):
            cute.copy(atom16, cute.local_tile(srow, (8,), (a * 8 + half * 4 + j,)), frag)
            v = frag.load().to(Float32)
            c = v[0] * v[0]
            for e in cutlass.range_constexpr(1, 8):
                c = c + v[e] * v[e]
            s = s + c
    return s


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_x: cute.CopyAtom, mX: cute.Tensor, tma_w: cute.CopyAtom,
            mW: cute.Tensor, mP: cute.Tensor, mR: cute.Tensor, M: Int32, eps: Float32):
    BM, NP, BK, NS = cfg.BM, cfg.NP, cfg.BK, cfg.stages
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    if warp == 0:
        CU.prefetch_tma(tma_x, tma_w)

    smem = cutlass.memory.SmemAllocator()
    _, sA, sB = operand_smem(cfg, smem)
    pipe = CU.tma_pipeline(smem, NS, cfg.stage_bytes, CONSUMER_WARPS)

    if wg == 0:
        cute.arch.setmaxregister_decrease(PRODUCER_REGS)
        if warp == 0:
            gA = cute.local_tile(mX, (BM, BK), (bidx, None))     # (BM, BK, k-tiles)
            gB = cute.local_tile(mW, (NP, BK), (0, None))        # rows N..NP-1: TMA zeros
            tAs, tAg = cpasync.tma_partition(tma_x, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                             cute.group_modes(gA, 0, 2))
            tBs, tBg = cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                             cute.group_modes(gB, 0, 2))
            pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, NS)
            for kt in cutlass.range(cfg.nk, unroll=1):
                pipe.producer_acquire(pst)
                bar = pipe.producer_get_barrier(pst)
                if const_expr(cfg.evict_first):
                    cute.copy(tma_x, tAg[None, kt], tAs[None, pst.index], tma_bar_ptr=bar,
                              cache_policy=Int64(EVICT_FIRST))
                else:
                    cute.copy(tma_x, tAg[None, kt], tAs[None, pst.index], tma_bar_ptr=bar)
                cute.copy(tma_w, tBg[None, kt], tBs[None, pst.index], tma_bar_ptr=bar)
                pipe.producer_commit(pst)
                pst.advance()
            pipe.producer_tail(pst)
    else:
        cute.arch.setmaxregister_increase(CONSUMER_REGS[cfg.ctas])
        ct = tidx - 128
        tiled_mma, thr_mma_c, tCrA, tCrB, tCcC, acc = bf16_mma(cfg, sA, sB, wg - 1, ct)
        part = cute.make_rmem_tensor(acc.layout, Float32)
        comp = cute.make_rmem_tensor(acc.layout, Float32)
        acc.fill(0.0)
        comp.fill(0.0)
        row = ct // 2            # this thread's row of the tile (sum of squares): the warpgroup's 64
        half = ct % 2
        frag = cute.make_rmem_tensor((8,), BFloat16)
        atom16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        ss = Float32(0.0)
        ssc = Float32(0.0)
        st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, NS)
        for kt in cutlass.range(cfg.nk, unroll=1):
            pipe.consumer_wait(st)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(BK // 16):
                tiled_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(tiled_mma, part, tCrA[None, None, kb, st.index], tCrB[None, None, kb, st.index], part)
            warpgroup.commit_group()
            # under the wgmmas: this row's sum of squares from the same stage
            tile_ss = _row_sumsq(sA[row, None, st.index], half, frag, atom16, BK // 64)
            warpgroup.wait_group(0)
            CU.release_read_stage(pipe, st)  # fenced: the sums' ld.shared done before TMA refills the stage
            st.advance()
            _kahan(acc, comp, part)
            y = tile_ss - ssc
            t = ss + y
            ssc = (t - ss) - y
            ss = t

        m0 = bidx * BM
        m_lim = M - m0
        # proj: a [BM, NP] view of rows m0.. (columns >= N and rows >= M masked)
        gP = cute.make_tensor(mP.iterator + cute.assume(m0 * cfg.N, divby=BM * cfg.N),
                              cute.make_layout((BM, NP), stride=(cfg.N, 1)))
        if const_expr(cfg.N % 2 == 0):
            atom_st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=64)
            pair = cute.make_rmem_tensor((2,), Float32)
            epilogue_regs(thr_mma_c, cute.logical_divide(acc, cute.make_layout(2)),
                          cute.logical_divide(tCcC, cute.make_layout(2)), pair, atom_st, gP, BM, NP, m_lim, cfg.N)
        else:
            for i in cutlass.range_constexpr(cute.size(acc)):
                crd = tCcC[i]
                if crd[0] < m_lim and crd[1] < cfg.N:
                    gP[crd] = acc[i]
        tot = ss - ssc
        tot = tot + cute.arch.shuffle_sync_bfly(tot, offset=1)
        if half == 0 and row < m_lim:
            mR[m0 + row] = Float32(1.0) / (cute.math.sqrt(tot / Float32(cfg.K)) + eps)


# ------------------------------------------------------------------ host


@cute.jit
def _host(cfg: cutlass.Constexpr, x: cute.Pointer, w: cute.Pointer, proj: cute.Pointer, r: cute.Pointer,
          M: Int32, eps: Float32, stream: CU.cuda.CUstream):
    N, K = cfg.N, cfg.K
    mX = cute.make_tensor(x, cute.make_layout((M, K), stride=(K, 1)))
    mW = cute.make_tensor(w, cute.make_layout((N, K), stride=(K, 1)))
    mP = cute.make_tensor(proj, cute.make_layout((M, N), stride=(N, 1)))
    mR = cute.make_tensor(r, cute.make_layout(M))
    _, sA_l, sB_l = _smem_layouts(cfg)
    op = cpasync.CopyBulkTensorTileG2SOp()
    tma_x, tX = cpasync.make_tiled_tma_atom(op, mX, cute.slice_(sA_l, (None, None, 0)), (cfg.BM, cfg.BK))
    tma_w, tW = cpasync.make_tiled_tma_atom(op, mW, cute.slice_(sB_l, (None, None, 0)), (cfg.NP, cfg.BK))
    # .minnctapersm 2 (ptxas: 80 registers a thread) and the largest smem carveout (two rings)
    _kernel(cfg, tma_x, tX, tma_w, tW, mP, mR, M, eps).launch(
        grid=[cute.ceil_div(M, cfg.BM), 1, 1], block=[THREADS, 1, 1], stream=stream,
        min_blocks_per_mp=cfg.ctas, preferred_smem_carveout=100)


# ------------------------------------------------------------------ Python entry points


@functools.lru_cache(maxsize=None)
def fwd_launch(N: int, K: int, cfg: ProjRmsFwdCuteCfg | None = None) -> CU.Launch:
    """The launch at static dims (N, K) of weight [N, K]; M and eps are runtime scalars."""
    cfg = cfg if cfg is not None else ProjRmsFwdCuteCfg.heuristic(N, K)
    if (cfg.N, cfg.K) != (N, K):
        raise ValueError(f"mhc_proj_rms fwd (cute): cfg for N={cfg.N}, K={cfg.K}, launch for N={N}, K={K}")
    bf, f32 = CU.Ptr(torch.bfloat16), CU.Ptr(torch.float32)
    return CU.Launch(f"{_NAME}.fwd", _host, cfg, (bf, bf, f32, f32, CU.Scalar(Int32), CU.Scalar(Float32)))


def _check(what: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple, device: torch.device) -> None:
    def bad(expected, got):
        raise ValueError(f"mhc_proj_rms fwd (cute): {what} expected {expected}, got {got}")

    if t.dtype != dtype:
        bad(f"dtype {dtype}", t.dtype)
    if tuple(t.shape) != shape:
        bad(f"shape {list(shape)}", list(t.shape))
    if t.device != device:
        bad(f"device {device} (x's)", t.device)
    if not t.is_contiguous():
        bad("a contiguous tensor", f"strides {t.stride()}")
    if t.numel() and t.data_ptr() % 16:
        bad("a 16-byte aligned base address", f"address % 16 == {t.data_ptr() % 16}")


def fwd_into(x: torch.Tensor, weight: torch.Tensor, proj: torch.Tensor, r: torch.Tensor, eps: float,
             cfg: ProjRmsFwdCuteCfg | None = None) -> None:
    """proj [M, N] fp32 = x @ weight^T, r [M] fp32 = 1 / (rms(x) + eps), destination-passing;
    x [M, K] bf16, weight [N, K] bf16 (N <= 32, K % 8 == 0), all contiguous, 16-byte aligned, on
    one device."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"mhc_proj_rms fwd (cute): x and weight expected 2-D, got {x.dim()}-D and {weight.dim()}-D")
    M, K = x.shape
    N = weight.shape[0]
    _check("x", x, torch.bfloat16, (M, K), x.device)
    _check("weight", weight, torch.bfloat16, (N, K), x.device)
    _check("proj", proj, torch.float32, (M, N), x.device)
    _check("r", r, torch.float32, (M,), x.device)
    if K % 8 or K == 0:
        raise ValueError(f"mhc_proj_rms fwd (cute): x expected K % 8 == 0 and K > 0 (16-byte TMA rows), got K={K}")
    if not 1 <= N <= 32:
        raise ValueError(f"mhc_proj_rms fwd (cute): weight expected 1 <= N <= 32 rows, got N={N}")
    if M * 32 >= 2 ** 31:
        raise ValueError(f"mhc_proj_rms fwd (cute): x expected M < 2^26 rows (32-bit offsets), got M={M}")
    if M and x.device.type != "cuda":
        raise ValueError(f"mhc_proj_rms fwd (cute): x expected a CUDA device (sm_90a), got {x.device}")
    fwd_run(x, weight, proj, r, eps, cfg)


def fwd_run(x: torch.Tensor, weight: torch.Tensor, proj: torch.Tensor, r: torch.Tensor, eps: float,
            cfg: ProjRmsFwdCuteCfg | None = None) -> None:
    """``fwd_into`` without its checks: for callers that validated already (the registry, whose spec
    states the same limits, M * N < 2**31 among them). M = 0 launches nothing."""
    M, K = x.shape
    if M:
        fwd_launch(weight.shape[0], K, cfg).run(x, weight, proj, r, M, float(eps))


def representative_launch(N: int = 24, K: int = 28672) -> CU.Launch:
    """The launch at one static shape (what the CPU compile test exports)."""
    return fwd_launch(N, K)
