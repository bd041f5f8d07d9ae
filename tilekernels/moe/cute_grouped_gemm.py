"""CuTe DSL MXFP8 grouped GEMM for Hopper (sm_90a): dequantize to bf16 in the mainloop, bf16 wgmma.

One kernel, three compile-time variants (the MXFP8 recipe of ``reference.py``), all in the
canonical form ``C[m, n] = sum_k A[m, k] * B[n, k]`` with both operands e4m3 + E8M0 scales
(uint8, one per 32 elements along k):

======  =====================  ==================  ==================  ============
variant  C                     A (m, k)            B (n, k)            ragged
======  =====================  ==================  ==================  ============
fwd     y [M, N]               x [M, K] k-major    W[g] [N, K] k-major  m (rows)
dgrad   dX [M, K]              dY [M, N] k-major   W[g] [N, K] n-major  m (rows)
wgrad   dW[g] [N, K]           dY [M, N] m-major   X [M, K] n-major     k (tokens)
======  =====================  ==================  ==================  ============

Design ("design (a)"; Hopper has no block-scaled MMA):

* CTA = 2 warpgroups (256 threads), tile ``tile_m x tile_n x 64`` (128 x 256 by default);
  each warpgroup owns 64 rows and issues ``m64 n256 k16`` bf16 wgmmas (fp32 accumulators)
  reading both operands from shared memory (SS).
* Every thread loads its share of the next k-tile's e4m3 bytes straight from global memory
  into registers (16-byte vector loads, one k-tile ahead), with the matching scale bytes.
  It then dequantizes them to bf16 (exact: e4m3 x 2^k is a bf16 unless it falls below
  bf16's normal range, where it rounds) and stores them into a 128B-swizzled bf16 tile
  (``bufs`` = 3 rotating buffers), fences the async proxy, one CTA barrier, and issues the
  wgmmas of that tile asynchronously, keeping one k-tile of wgmmas in flight
  (``wait_group(1)``): the dequant of tile k+1 runs on the CUDA cores while the tensor
  cores work on tile k. Three buffers make one barrier per k-tile enough (the buffer
  written at k was last read by the wgmmas of k-3, which every warpgroup has retired
  before the barrier of k-1). Shared-memory traffic per k-tile equals the plain bf16
  GEMM's (bf16 stores + wgmma reads, no fp8 staging); the extra cost is ALU work (about 2
  instructions per element on the fast path) and registers (~240 per thread: one CTA per SM).
  ``early_loads=False`` issues the next k-tile's loads after the wgmma issue instead of
  before the dequant (if the proxy fence waits for loads in flight, that is cheaper).
* Dequant (cute_gemm_dequant.py): bit manipulation per 4 bytes (byte permute with sign
  replication, shift, mask: e4m3(b) * 2^-120 exactly, subnormals included) and bf16x2 math;
  for scales <= 2^7 (the common case) one multiply by 2^(e-7), else multiply by 2^120 and
  fma(v, s, s - s) with s = 2^(e-127) (e = 0: 2^-127; e = 255: s = +Inf, s - s = NaN, so a
  0xFF scale makes the whole block NaN whatever its data, zeros included). ``cvt="hw"``
  uses the hardware e4m3 -> f16 conversion and fp32 math instead (exact, slower). Known
  difference: with ``cvt="bits"`` an e4m3 NaN data byte (0x7F / 0xFF) inside a block with a
  finite scale reads as +-480 * scale, not NaN (the quantizer never writes one: a
  non-finite block gets the 0xFF scale).
* Tile scheduler (cute_gemm_sched.py; on the device, no host sync; the grid depends on
  host-known M, N, K, G only, so a call can be captured in a CUDA graph):
  - fwd / dgrad (ragged m): grid = (cdiv(M, tile_m) + G) * cdiv(Nc, tile_n) CTAs, a bound on
    sum_g cdiv(m_g, tile_m) m-tiles times the n-tiles, rasterized in bands of ``raster``
    m-tiles. Each CTA finds the group holding its m-tile with a warp-wide prefix sum over
    the per-group tile counts from ``offsets`` (32 groups per round); CTAs past the last tile
    exit. Rows past the group's end are neither loaded nor stored.
  - wgrad (ragged k): grid = G * cdiv(N, tile_m) * cdiv(K, tile_n); a CTA reduces over the
    tokens ``offsets[g]:offsets[g+1]`` of its group (m_g % 32 == 0, so 32-blocks never
    straddle groups); a 32-block past the group's end contributes exactly zero (masked in
    the dequant, whatever its bytes or scale); an empty group writes zeros.
  - ``persistent=True``: ``sms`` CTAs walk the exact tile list (bid, bid + grid, ...), the
    next tile's first k-tile loads in flight during the epilogue.
* Epilogue: accumulators converted to the output dtype and stored straight from registers
  (2-element vectors), masked by the group's rows and the N / K extents; ``epi_smem=True``
  stages the tile in shared memory (over the operand buffers) and writes 16-byte coalesced
  rows instead.
* ``kernel="ws"`` selects the warp-specialized variant (cute_gemm_ws.py: a producer
  warpgroup dequantizes into an mbarrier ring, two consumer warpgroups only issue wgmmas);
  measured 6-18% slower than this kernel on the H200, so not a default.
* Config defaults are the simplest structure (but wgrad uses the staged epilogue, measured
  faster there); ``benchmarks/moe_gemm_check.py`` sweeps the
  alternatives (persistent, staged epilogue, late loads, 128 x 128 tiles with two CTAs per
  SM, hardware convert) so the heuristic can be set from measurements.

Constraints (checked by the registry, not here): N % 32 == 0 and K % 32 == 0 (the MX
block; every operand row is then 16-byte aligned); contiguous row-major tensors with
16-byte aligned bases; wgrad: every m_g % 32 == 0; offsets int32 or int64, cumulative
[G + 1] with offsets[0] == 0 and offsets[G] == M. N and K need not be tile multiples (tails
are masked). M < 2^31.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Uint8, Uint32, const_expr
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as C

from .cute_gemm_dequant import BLOCK, THREADS, chunks, dequant_operand
from .cute_gemm_sched import find_group, schedule, views

VARIANTS = ("fwd", "dgrad", "wgrad")
OUT_DTYPES = (torch.bfloat16, torch.float32)


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class GemmCfg:
    """Launch config of one grouped GEMM variant; the compile key with the arg specs.

    ``G, N, K`` are the op's static dims (weights ``[G, N, K]``); the token count M is a
    runtime scalar. ``tile_m x tile_n`` is the CTA output tile in canonical (m, n):
    fwd (M, N), dgrad (M, K), wgrad (N, K)."""

    variant: str
    G: int
    N: int
    K: int
    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    bufs: int = 3
    raster: int = 8
    cvt: str = "bits"
    persistent: bool = False
    sms: int = 132          # persistent: CTAs per wave (SMs x ctas_per_sm)
    ctas_per_sm: int = 1    # launch bound: 2 caps registers at 128 (tile_n = 128 only)
    early_loads: bool = True
    epi_smem: bool = False  # staged epilogue: 16-byte coalesced stores
    # "dq": this module's kernel (2 warpgroups load, dequantize and issue wgmmas);
    # "ws": the warp-specialized one of cute_gemm_ws.py (a producer warpgroup loads and
    # dequantizes into a ``bufs``-stage mbarrier ring, 2 consumer warpgroups issue wgmmas)
    kernel: str = "dq"
    ws_regs: tuple | None = None  # "ws": setmaxnreg (producer, consumer), p * producers + 2 c <= 512
    producers: int = 1            # "ws": producer warpgroups (1: 168 registers a thread; 2: 128)

    def __post_init__(self):
        # what the kernel is written for (2 warpgroups of m64 wgmmas, 4 threads per 64-wide k row,
        # 3+ rotating buffers); anything else would compile into a wrong kernel
        assert self.variant in VARIANTS, self.variant
        assert self.tile_m == 2 * 64 and self.tile_k == 64 and self.tile_n in (128, 256), self
        assert self.bufs >= 3 and self.cvt in ("bits", "hw") and self.ctas_per_sm in (1, 2), self
        assert self.G >= 1 and self.N % BLOCK == 0 and self.K % BLOCK == 0, self
        assert self.kernel in ("dq", "ws"), self
        if self.kernel == "ws":
            # 3 warpgroups, bufs bf16 stages of 48 KiB (tile_n 256) in one SM's 227 KiB
            assert self.ctas_per_sm == 1 and not self.epi_smem, self
            assert (self.tile_m + self.tile_n) * self.tile_k * 2 * self.bufs <= 220 * 1024, self
            # 2 producers: 512 threads, 128 registers a thread unless ws_regs (tile_n 128 fits)
            assert self.producers in (1, 2), self
            if self.ws_regs is not None:
                p, c = self.ws_regs
                cap = 512 // (self.producers + 2) // 8 * 8     # registers a thread at launch
                assert p % 8 == 0 and c % 8 == 0 and 24 <= p <= cap <= c <= 256, self
                assert p * self.producers + 2 * c <= 512, self

    @classmethod
    def heuristic(cls, variant: str, G: int, N: int, K: int, out_dtype: torch.dtype = torch.bfloat16,
                  **overrides) -> "GemmCfg":
        """From static dims only (never M)."""
        nc = N if variant == "fwd" else K
        # wgrad: the staged epilogue (its tiles have few k-tiles per output byte; measured on
        # H200: +14% on G=32 x 1024 tokens, +1-2% at 4096 tokens); fwd / dgrad: registers
        kw = dict(tile_n=256 if (nc % 256 == 0 or nc > 512) else 128, epi_smem=variant == "wgrad")
        kw.update(overrides)
        return cls(variant=variant, G=G, N=N, K=K, **kw)

    # canonical dims: (Nc, Kc) static extents; Kc is None for wgrad (tokens: dynamic)
    @property
    def nc(self) -> int:
        return self.N if self.variant == "fwd" else self.K

    @property
    def kc(self):
        return {"fwd": self.K, "dgrad": self.N, "wgrad": None}[self.variant]

    @property
    def mc(self):
        return self.N if self.variant == "wgrad" else None

    @property
    def a_kmajor(self) -> bool:
        return self.variant != "wgrad"

    @property
    def b_kmajor(self) -> bool:
        return self.variant == "fwd"


# ------------------------------------------------------------------ device helpers: operands


def copy_tv_spec(kmajor: bool, bmn: int, bk: int):
    """(shape, stride, tiler) of the thread-value layout of one operand tile (bmn, bk) over
    THREADS threads, in the tile's column-major index m + bmn * k (plain Python: the CPU test
    checks it is a bijection and keeps each thread's rows in one MX block). Each thread moves
    16-byte chunks along the contiguous dim.

    k-major: 4 threads per row (64 k), 64 rows per step. mn-major: a thread takes 16
    consecutive mn in R = bmn * bk / 4096 rows of one MX block (one set of 16 scales serves
    them), the rows 32 / R apart; in each quarter-warp 4 threads cover one 64-wide swizzle atom
    row and the other 4 the next k row, so the 16-byte bf16 stores hit 8 distinct bank groups
    and the global loads are 64-byte runs."""
    if kmajor:
        assert bk == 64, "k-major copies assume tile_k == 64"
        rows = THREADS // 4
        return ((4, rows), 16), ((16 * rows, 1), rows), (rows, bk)
    r = bmn * bk // (THREADS * 16)
    chunks_m = bmn // 16                # 16-wide chunks along mn
    groups_k = THREADS // chunks_m      # k-row groups (each R rows)
    per_blk = BLOCK // r                # k-row groups per MX block
    assert chunks_m % 4 == 0 and per_blk % 2 == 0 and groups_k % per_blk == 0
    shape = ((4, 2, chunks_m // 4, per_blk // 2, groups_k // per_blk), (16, r))
    stride = ((16, bmn, 64, 2 * bmn, BLOCK * bmn), (1, per_blk * bmn))
    return shape, stride, (bmn, bk)


def _copy_tv(kmajor: bool, bmn: int, bk: int):
    shape, stride, tiler = copy_tv_spec(kmajor, bmn, bk)
    return cute.make_layout(shape, stride=stride), tiler


@cute.jit
def _load_operand(cfg: cutlass.Constexpr, kmajor: cutlass.Constexpr, bmn: cutlass.Constexpr,
                  thr_g2r, atom_g2r, atom_s16, tXc: cute.Tensor, gX: cute.Tensor, gXS: cute.Tensor,
                  kt: Int32, mn_lim: Int32, kb_lim: Int32, rX: cute.Tensor, rXS: cute.Tensor):
    """Predicated 16-byte loads of this thread's chunks of k-tile ``kt`` (data and scales)
    into registers. A chunk is loaded iff its rows are inside the operand (``mn_lim``) and
    its 32-block inside the k range (``kb_lim``); skipped chunks keep stale bytes (their
    rows are never stored; out-of-range k blocks are zeroed by the dequant)."""
    BK = cfg.tile_k
    KBT = BK // BLOCK
    tXg = thr_g2r.partition_S(cute.local_tile(gX, (bmn, BK), (0, kt)))
    rXv = cute.make_tensor(rX.iterator, cute.make_layout(tXg.shape))
    nv = cute.size(tXg, mode=[0, 1])
    pred = cute.make_rmem_tensor(cute.make_layout((nv, cute.size(tXg, mode=[1]), cute.size(tXg, mode=[2]))),
                                 cutlass.Boolean)
    for v in cutlass.range_constexpr(nv):
        for i in cutlass.range_constexpr(cute.size(tXg, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(tXg, mode=[2])):
                crd = tXc[((0, v), i, j)]
                pred[v, i, j] = (crd[0] < mn_lim) and ((kt * BK + crd[1]) // BLOCK < kb_lim)
    cute.copy(atom_g2r, tXg, rXv, pred=pred)
    if const_expr(kmajor):
        # one scale byte per chunk: (row, k block)
        for i in cutlass.range_constexpr(cute.size(tXg, mode=[1])):
            crd = tXc[((0, 0), i, 0)]
            if pred[0, i, 0]:
                rXS[i] = Uint32(gXS[crd[0], kt * KBT + crd[1] // BLOCK])
    else:
        # 16 scale bytes per chunk: (16 consecutive mn, one k block), a 16-byte load
        crd = tXc[((0, 0), 0, 0)]
        src = cute.local_tile(gXS, (16, 1), (crd[0] // 16, kt * KBT + crd[1] // BLOCK))
        if pred[0, 0, 0]:
            cute.copy(atom_s16, src, cute.make_tensor(rXS.iterator, cute.make_layout((16, 1))))


# ------------------------------------------------------------------ kernel


EPI_PAD = 8   # staged epilogue row padding (elements): conflict-free pair stores, 16-byte rows


@cute.jit
def epilogue_regs(thr_mma, d_a: cute.Tensor, d_c: cute.Tensor, pair: cute.Tensor, atom_st, gC: cute.Tensor,
                  BM: cutlass.Constexpr, BN: cutlass.Constexpr, m_lim: Int32, n_lim: Int32):
    """Accumulators (``d_a``: the fp32 accumulator split in pairs, ``d_c``: their coordinates)
    -> global straight from registers, 2-element vectors in gC's dtype, masked by rows (group
    end) and columns (N tail). Shared with the fp8 GEMM (cute_gemm_fp8.py)."""
    tCgC = thr_mma.partition_C(cute.local_tile(gC, (BM, BN), (0, 0)))
    d_g = cute.logical_divide(tCgC, cute.make_layout(2))
    for i in cutlass.range_constexpr(cute.size(d_a, mode=[1])):
        crd = d_c[0, i]
        if crd[0] < m_lim and crd[1] < n_lim:
            pair.store(d_a[None, i].load().to(gC.element_type))
            cute.copy(atom_st, pair, d_g[None, i])


@cute.jit
def _epilogue_smem(cfg: cutlass.Constexpr, thr_mma, d_a: cute.Tensor, pair: cute.Tensor, atom_st,
                   sbuf: cute.Tensor, gC: cute.Tensor, m_lim: Int32, n_lim: Int32, tidx: Int32):
    """Accumulators -> a padded row-major tile in shared memory (over the operand buffers) ->
    16-byte coalesced global stores, masked by rows (group end) and 16-byte column chunks."""
    BM, BN = cfg.tile_m, cfg.tile_n
    out_t = gC.element_type
    vec = 128 // out_t.width
    cpr = BN // vec                     # 16-byte chunks per row
    sC = cute.make_tensor(cute.recast_ptr(sbuf.iterator, dtype=out_t),
                          cute.make_layout((BM, BN), stride=(BN + EPI_PAD, 1)))
    # both warpgroups' wgmmas (which read the operand buffers) have retired
    cute.arch.sync_threads()
    d_s = cute.logical_divide(thr_mma.partition_C(sC), cute.make_layout(2))
    for i in cutlass.range_constexpr(cute.size(d_a, mode=[1])):
        pair.store(d_a[None, i].load().to(out_t))
        cute.copy(atom_st, pair, d_s[None, i])
    cute.arch.sync_threads()
    atom16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), out_t, num_bits_per_copy=128)
    frag = cute.make_rmem_tensor((vec,), out_t)
    for it in cutlass.range_constexpr(BM * cpr // THREADS):
        idx = tidx + it * THREADS
        r = idx // cpr
        cc = idx - r * cpr
        if r < m_lim and cc * vec < n_lim:
            cute.copy(atom16, cute.local_tile(sC[r, None], (vec,), (cc,)), frag)
            cute.copy(atom16, frag, cute.local_tile(gC[r, None], (vec,), (cc,)))


def _majors(cfg):
    """The A and B smem/wgmma major modes (k-major operands: ROW_MAJOR)."""
    return (LayoutEnum.ROW_MAJOR if cfg.a_kmajor else LayoutEnum.COL_MAJOR,
            LayoutEnum.ROW_MAJOR if cfg.b_kmajor else LayoutEnum.COL_MAJOR)


def operand_smem(cfg, smem, min_bytes: int = 0):
    """(sbuf, sA, sB): the bufs-deep 128B-swizzled bf16 operand buffers (wgmma layouts) in one
    1024-aligned allocation of at least ``min_bytes`` (the staged epilogue reuses it); shared
    with the warp-specialized kernel (cute_gemm_ws.py)."""
    a_lay, b_lay = _majors(cfg)
    tile = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
    sA_l = sm90_utils.make_smem_layout_a(a_lay, tile, BFloat16, cfg.bufs)
    sB_l = sm90_utils.make_smem_layout_b(b_lay, tile, BFloat16, cfg.bufs)
    a_bytes = cute.cosize(sA_l) * 2
    b_bytes = cute.cosize(sB_l) * 2
    sbuf = smem.allocate_tensor(Uint8, cute.make_layout(max(a_bytes + b_bytes, min_bytes)), byte_alignment=1024)
    sA = cute.make_tensor(cute.recast_ptr(sbuf.iterator, sA_l.inner, dtype=BFloat16), sA_l.outer)
    sB = cute.make_tensor(cute.recast_ptr(sbuf.iterator + a_bytes, sB_l.inner, dtype=BFloat16), sB_l.outer)
    return sbuf, sA, sB


def bf16_mma(cfg, sA, sB, wg, t):
    """The bf16 wgmma of both kernels: 2 warpgroups x (m64, n=tile_n, k16), operands from smem,
    fp32 accumulators. wg: the warpgroup among the MMA ones, t: the thread among their 256.
    Operands are sliced per warpgroup (every thread of a warpgroup sees the same smem
    descriptors); accumulators per thread (partition_C depends on the thread index inside the
    warpgroup: slicing it by the warpgroup would give all 128 threads thread 0's (m, n)
    coordinates). -> (tiled_mma, thr_mma_c, tCrA, tCrB, tCcC, acc), ACCUMULATE set."""
    a_lay, b_lay = _majors(cfg)
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        BFloat16, BFloat16, a_lay.sm90_mma_major_mode(), b_lay.sm90_mma_major_mode(),
        Float32, (cfg.tile_m // 64, 1, 1), tiler_mn=(64, cfg.tile_n))
    thr_mma = tiled_mma.get_slice(wg * 128)
    thr_mma_c = tiled_mma.get_slice(t)
    tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
    tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
    tCcC = thr_mma_c.partition_C(cute.make_identity_tensor((cfg.tile_m, cfg.tile_n)))
    acc = cute.make_rmem_tensor(tCcC.shape, Float32)
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
    return tiled_mma, thr_mma_c, tCrA, tCrB, tCcC, acc


def m_tile_count(cfg, mOff, M):
    """m-tiles of a launch: persistent, the exact sum_g cdiv(m_g, tile_m) from the device
    offsets; else the bound cdiv(M, tile_m) + G (ragged m); wgrad: G * cdiv(N, tile_m)."""
    BM = cfg.tile_m
    if const_expr(cfg.variant != "wgrad"):
        if const_expr(cfg.persistent):
            _, _, _, _, m_tiles = find_group(mOff, Int32(0), cfg.G, BM)
        else:
            m_tiles = (M + BM - 1) // BM + cfg.G
    else:
        m_tiles = Int32((cfg.N + BM - 1) // BM) * cfg.G
    return m_tiles


@cute.kernel
def _gemm_kernel(cfg: cutlass.Constexpr, mA: cute.Tensor, mAS: cute.Tensor, mB: cute.Tensor,
                 mBS: cute.Tensor, mC: cute.Tensor, mOff: cute.Tensor, M: Int32):
    BM, BN, BK, NB = cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.bufs
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    n_tiles = (cfg.nc + BN - 1) // BN

    # ---------------- shared memory: NB bf16 buffers per operand (wgmma layouts), one buffer
    # that the staged epilogue (epi_smem) reuses
    c_bytes = BM * (BN + EPI_PAD) * (mC.element_type.width // 8) if const_expr(cfg.epi_smem) else 0
    smem = cutlass.memory.SmemAllocator()
    sbuf, sA, sB = operand_smem(cfg, smem, c_bytes)

    # ---------------- MMA: 2 warpgroups x (m64, n=BN, k16) bf16 wgmma, fp32 accumulators
    wg = cute.arch.make_warp_uniform(tidx // 128)
    tiled_mma, thr_mma_c, tCrA, tCrB, tCcC, acc = bf16_mma(cfg, sA, sB, wg, tidx)

    # ---------------- per-thread copies: gmem -> registers (e4m3), registers -> smem (bf16)
    atom_g2r = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint8, num_bits_per_copy=128)
    atom_r2s = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
    tvA, tilerA = _copy_tv(cfg.a_kmajor, BM, BK)
    tvB, tilerB = _copy_tv(cfg.b_kmajor, BN, BK)
    g2r_A = cute.make_tiled_copy(atom_g2r, tvA, tilerA).get_slice(tidx)
    g2r_B = cute.make_tiled_copy(atom_g2r, tvB, tilerB).get_slice(tidx)
    r2s_A = cute.make_tiled_copy(atom_r2s, tvA, tilerA)
    r2s_B = cute.make_tiled_copy(atom_r2s, tvB, tilerB)
    tAs = r2s_A.get_slice(tidx).partition_D(sA)
    tBs = r2s_B.get_slice(tidx).partition_D(sB)
    tAc = g2r_A.partition_S(cute.make_identity_tensor((BM, BK)))
    tBc = g2r_B.partition_S(cute.make_identity_tensor((BN, BK)))

    nA = BM * BK // THREADS
    nB = BN * BK // THREADS
    # scales: k-major, one byte per chunk held in a Uint32; mn-major, 16 bytes per chunk
    nAS, tAS = (chunks(True, BM, BK), Uint32) if const_expr(cfg.a_kmajor) else (16, Uint8)
    nBS, tBS = (chunks(True, BN, BK), Uint32) if const_expr(cfg.b_kmajor) else (16, Uint8)
    rA = cute.make_rmem_tensor((nA,), Uint8)
    rAn = cute.make_rmem_tensor((nA,), Uint8)
    rB = cute.make_rmem_tensor((nB,), Uint8)
    rBn = cute.make_rmem_tensor((nB,), Uint8)
    rAS = cute.make_rmem_tensor((nAS,), tAS)
    rASn = cute.make_rmem_tensor((nAS,), tAS)
    rBS = cute.make_rmem_tensor((nBS,), tBS)
    rBSn = cute.make_rmem_tensor((nBS,), tBS)
    oA = cute.make_rmem_tensor((nA,), BFloat16)
    oB = cute.make_rmem_tensor((nB,), BFloat16)
    oAv = cute.make_tensor(oA.iterator, cute.make_layout(tAs[None, None, None, 0].shape))
    oBv = cute.make_tensor(oB.iterator, cute.make_layout(tBs[None, None, None, 0].shape))
    atom_st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mC.element_type,
                                  num_bits_per_copy=2 * mC.element_type.width)
    d_c = cute.logical_divide(tCcC, cute.make_layout(2))

    # ---------------- the tiles of this CTA
    # non-persistent: tile = block id over a bound (ragged m: cdiv(M, BM) + G m-tiles), CTAs
    # without a tile exit; persistent: tiles bidx, bidx + grid, ... of the exact count
    m_tiles = m_tile_count(cfg, mOff, M)
    if const_expr(cfg.persistent):
        total = m_tiles * n_tiles
        step = gdim
    else:
        total = cutlass.min(bidx + 1, m_tiles * n_tiles)
        step = Int32(1)
    sched_m = m_tiles if const_expr(cfg.variant != "wgrad") else Int32(0)

    # first tile's schedule and first k-tile (predicated off if there is none)
    g, m0, m_lim, n0, n_lim, k0, kb_lim, nk = schedule(cfg, mOff, M, bidx, sched_m)
    live0 = (bidx < total) and (g < cfg.G)
    gA0, gAS0, gB0, gBS0, _ = views(cfg, mA, mAS, mB, mBS, mC, g, m0, n0, k0)
    _load_operand(cfg, cfg.a_kmajor, BM, g2r_A, atom_g2r, atom_g2r, tAc, gA0, gAS0, Int32(0),
                  cutlass.select_(live0, m_lim, 0), kb_lim, rA, rAS)
    _load_operand(cfg, cfg.b_kmajor, BN, g2r_B, atom_g2r, atom_g2r, tBc, gB0, gBS0, Int32(0),
                  cutlass.select_(live0, n_lim, 0), kb_lim, rB, rBS)

    for t in cutlass.range(bidx, total, step, unroll=1):
        gA, gAS, gB, gBS, gC = views(cfg, mA, mAS, mB, mBS, mC, g, m0, n0, k0)
        if g < cfg.G:
            # every warpgroup has retired the previous tile's wgmmas before any smem store
            cute.arch.sync_threads()
            acc.fill(0.0)
            # ---------------- mainloop
            for kt in cutlass.range(nk, unroll=1):
                # next k-tile's bytes (predicated off past the end of the k range); "early":
                # before this tile's dequant (latency hidden by a whole iteration), else after
                # the wgmma issue (not in flight at this iteration's proxy fence)
                if const_expr(cfg.early_loads):
                    _load_operand(cfg, cfg.a_kmajor, BM, g2r_A, atom_g2r, atom_g2r, tAc, gA, gAS,
                                  kt + 1, m_lim, kb_lim, rAn, rASn)
                    _load_operand(cfg, cfg.b_kmajor, BN, g2r_B, atom_g2r, atom_g2r, tBc, gB, gBS,
                                  kt + 1, n_lim, kb_lim, rBn, rBSn)
                # this k-tile: dequantize into buffer kt % NB (last read by the wgmmas of
                # kt - NB, retired by every warpgroup before the barrier of kt - 1)
                dequant_operand(cfg, cfg.a_kmajor, BM, tAc, kt, kb_lim, rA, rAS, oA)
                dequant_operand(cfg, cfg.b_kmajor, BN, tBc, kt, kb_lim, rB, rBS, oB)
                buf = kt % NB
                cute.copy(r2s_A, oAv, tAs[None, None, None, buf])
                cute.copy(r2s_B, oBv, tBs[None, None, None, buf])
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_threads()
                warpgroup.fence()
                for kb in cutlass.range_constexpr(BK // 16):
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb, buf], tCrB[None, None, kb, buf], acc)
                warpgroup.commit_group()
                if const_expr(not cfg.early_loads):
                    _load_operand(cfg, cfg.a_kmajor, BM, g2r_A, atom_g2r, atom_g2r, tAc, gA, gAS,
                                  kt + 1, m_lim, kb_lim, rAn, rASn)
                    _load_operand(cfg, cfg.b_kmajor, BN, g2r_B, atom_g2r, atom_g2r, tBc, gB, gBS,
                                  kt + 1, n_lim, kb_lim, rBn, rBSn)
                warpgroup.wait_group(1)
                rA.store(rAn.load())
                rB.store(rBn.load())
                rAS.store(rASn.load())
                rBS.store(rBSn.load())
            warpgroup.wait_group(0)

        # ---------------- next tile: schedule and first k-tile in flight during the epilogue
        m_lim_c = m_lim
        n_lim_c = n_lim
        g_c = g
        if const_expr(cfg.persistent):
            tn = t + step
            g, m0, m_lim, n0, n_lim, k0, kb_lim, nk = schedule(
                cfg, mOff, M, cutlass.min(tn, total - 1), sched_m)
            live = tn < total
            gAn, gASn, gBn, gBSn, _ = views(cfg, mA, mAS, mB, mBS, mC, g, m0, n0, k0)
            _load_operand(cfg, cfg.a_kmajor, BM, g2r_A, atom_g2r, atom_g2r, tAc, gAn, gASn, Int32(0),
                          cutlass.select_(live, m_lim, 0), kb_lim, rA, rAS)
            _load_operand(cfg, cfg.b_kmajor, BN, g2r_B, atom_g2r, atom_g2r, tBc, gBn, gBSn, Int32(0),
                          cutlass.select_(live, n_lim, 0), kb_lim, rB, rBS)

        # ---------------- epilogue
        if g_c < cfg.G:
            d_a = cute.logical_divide(acc, cute.make_layout(2))
            pair = cute.make_rmem_tensor((2,), mC.element_type)
            if const_expr(cfg.epi_smem):
                _epilogue_smem(cfg, thr_mma_c, d_a, pair, atom_st, sbuf, gC, m_lim_c, n_lim_c, tidx)
            else:
                epilogue_regs(thr_mma_c, d_a, d_c, pair, atom_st, gC, BM, BN, m_lim_c, n_lim_c)


# ------------------------------------------------------------------ host function


@cute.jit
def operand_tensors(cfg: cutlass.Constexpr, a: cute.Pointer, a_s: cute.Pointer, b: cute.Pointer,
                    b_s: cute.Pointer, offs: cute.Pointer, out: cute.Pointer, M: Int32):
    """The variant's global tensors (canonical A [m, k], B [n, k] views with their scales, C,
    offsets) from the raw pointers; shared with the warp-specialized kernel's host."""
    G, N, K = cfg.G, cfg.N, cfg.K
    if const_expr(cfg.variant == "fwd"):
        mA = cute.make_tensor(a, cute.make_layout((M, K), stride=(K, 1)))
        mAS = cute.make_tensor(a_s, cute.make_layout((M, K // BLOCK), stride=(K // BLOCK, 1)))
        mB = cute.make_tensor(b, cute.make_layout((G * N, K), stride=(K, 1)))
        mBS = cute.make_tensor(b_s, cute.make_layout((G * N, K // BLOCK), stride=(K // BLOCK, 1)))
        mC = cute.make_tensor(out, cute.make_layout((M, N), stride=(N, 1)))
    elif const_expr(cfg.variant == "dgrad"):
        mA = cute.make_tensor(a, cute.make_layout((M, N), stride=(N, 1)))
        mAS = cute.make_tensor(a_s, cute.make_layout((M, N // BLOCK), stride=(N // BLOCK, 1)))
        mB = cute.make_tensor(b, cute.make_layout((K, G * N), stride=(1, K)))
        mBS = cute.make_tensor(b_s, cute.make_layout((K, G * (N // BLOCK)), stride=(1, K)))
        mC = cute.make_tensor(out, cute.make_layout((M, K), stride=(K, 1)))
    else:
        mA = cute.make_tensor(a, cute.make_layout((N, M), stride=(1, N)))
        mAS = cute.make_tensor(a_s, cute.make_layout((N, M // BLOCK), stride=(1, N)))
        mB = cute.make_tensor(b, cute.make_layout((K, M), stride=(1, K)))
        mBS = cute.make_tensor(b_s, cute.make_layout((K, M // BLOCK), stride=(1, K)))
        mC = cute.make_tensor(out, cute.make_layout((G * N, K), stride=(K, 1)))
    mOff = cute.make_tensor(offs, cute.make_layout(G + 1))
    return mA, mAS, mB, mBS, mC, mOff


@cute.jit
def grid_size(cfg: cutlass.Constexpr, M: Int32):
    """CTAs of a launch: the tile bound (ragged m: cdiv(M, tile_m) + G m-tiles), at most
    ``sms`` if persistent."""
    BM, BN = cfg.tile_m, cfg.tile_n
    n_tiles = (cfg.nc + BN - 1) // BN
    if const_expr(cfg.variant == "wgrad"):
        grid_x = cfg.G * ((cfg.N + BM - 1) // BM) * n_tiles
    else:
        grid_x = ((M + BM - 1) // BM + cfg.G) * n_tiles
    if const_expr(cfg.persistent):
        grid_x = cutlass.min(grid_x, cfg.sms)
    return grid_x


def launch_gemm(kernel, cfg, a, a_s, b, b_s, offs, out, M, stream, threads: int, min_blocks: int) -> None:
    """Launch a grouped-GEMM ``kernel`` (called from a ``@cute.jit`` host; every GEMM kernel
    takes the operand_tensors views): grid_size CTAs of ``threads`` threads, .minnctapersm
    ``min_blocks``, the whole carveout as shared memory."""
    mA, mAS, mB, mBS, mC, mOff = operand_tensors(cfg, a, a_s, b, b_s, offs, out, M)
    kernel(cfg, mA, mAS, mB, mBS, mC, mOff, M).launch(
        grid=(grid_size(cfg, M), 1, 1), block=(threads, 1, 1), stream=stream,
        min_blocks_per_mp=min_blocks, preferred_smem_carveout=100)


@cute.jit
def _gemm_host(cfg: cutlass.Constexpr, a: cute.Pointer, a_s: cute.Pointer, b: cute.Pointer,
               b_s: cute.Pointer, offs: cute.Pointer, out: cute.Pointer, M: Int32,
               stream: C.cuda.CUstream):
    launch_gemm(_gemm_kernel, cfg, a, a_s, b, b_s, offs, out, M, stream, THREADS, cfg.ctas_per_sm)


# ------------------------------------------------------------------ Python entry points


@functools.lru_cache(maxsize=None)
def gemm_launch(variant: str, G: int, N: int, K: int, out_dtype: torch.dtype,
                offs_dtype: torch.dtype = torch.int64, cfg: GemmCfg | None = None) -> C.Launch:
    """The launch of one variant at static dims (G, N, K) (weights [G, N, K]); M is dynamic."""
    cfg = cfg if cfg is not None else GemmCfg.heuristic(variant, G, N, K, out_dtype)
    u8 = C.Ptr(torch.uint8)
    sig = (u8, u8, u8, u8, C.Ptr(offs_dtype, align=offs_dtype.itemsize), C.Ptr(out_dtype),
           C.Scalar(Int32))
    if cfg.kernel == "ws":
        from .cute_gemm_ws import ws_host

        return C.Launch(f"moe.cute_grouped_gemm.{variant}", ws_host, cfg, sig)
    return C.Launch(f"moe.cute_grouped_gemm.{variant}", _gemm_host, cfg, sig)


def gemm_fwd_into(a_data, a_scales, b_data, b_scales, offsets, out, cfg: GemmCfg | None = None) -> None:
    """out [M, N] = per group g (rows offsets[g]:offsets[g+1]) MX(a) . MX(b[g])^T.

    a_data [M, K] e4m3, a_scales [M, K/32] uint8 (rowwise); b_data [G, N, K] e4m3,
    b_scales [G, N, K/32]; offsets [G+1] int32/int64 on the device; out bf16/fp32 [M, N]."""
    M, K = a_data.shape
    G, N, _ = b_data.shape
    gemm_launch("fwd", G, N, K, out.dtype, offsets.dtype, cfg).run(
        a_data, a_scales, b_data, b_scales, offsets, out, M)


def gemm_dgrad_into(dy_data, dy_scales, w_data, w_scales, offsets, out, cfg: GemmCfg | None = None) -> None:
    """out [M, K] = per group MX(dy) . MX(w[g]) (reduction over N).

    dy_data [M, N] e4m3, dy_scales [M, N/32] (rowwise); w_data [G, N, K] e4m3,
    w_scales [G, N/32, K] (columnwise along N); out bf16/fp32 [M, K]."""
    M, N = dy_data.shape
    G, _, K = w_data.shape
    gemm_launch("dgrad", G, N, K, out.dtype, offsets.dtype, cfg).run(
        dy_data, dy_scales, w_data, w_scales, offsets, out, M)


def gemm_wgrad_into(dy_data, dy_scales, x_data, x_scales, offsets, out, cfg: GemmCfg | None = None) -> None:
    """out [G, N, K]: out[g] = MX(dy_g)^T . MX(x_g) over the group's tokens (zeros if empty).

    dy_data [M, N] e4m3, dy_scales [M/32, N] (columnwise); x_data [M, K] e4m3, x_scales
    [M/32, K] (columnwise); every group size % 32 == 0; out bf16/fp32 [G, N, K]."""
    M, N = dy_data.shape
    K = x_data.shape[1]
    G = out.shape[0]
    gemm_launch("wgrad", G, N, K, out.dtype, offsets.dtype, cfg).run(
        dy_data, dy_scales, x_data, x_scales, offsets, out, M)
