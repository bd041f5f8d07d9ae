"""CuTe DSL plane sums (Hopper sm_90a): dst[w] = sum over p of src[p, w], fp32, in a fixed order.

src [P, W] fp32 contiguous -> dst [W] fp32 contiguous (any view whose W elements are contiguous). mhc_post_pre's
SPLIT_DW backward sums two sets of partials this way: dh_pre's per-slice partials ([S, T, n], S = 112 at C = 7168)
and the backward pass's pre-row dweight partials ([row tiles, n, n C], 512 planes of 458 KB at T = 32768), which
torch.sum took 90 us for with the dh planes (the mHC ledger, session 25); the bytes read alone take ~70 at copy rate.

Order (deterministic, no atomics): a CTA owns VW columns per lane x 32 lanes; its RG warps each sum the planes
g, g + RG, g + 2 RG, ... in turn (four loads in flight a warp: ``unroll=4``), then warp 0 adds the RG warp sums in
warp order and stores. The grid is cdiv(W, 32 VW) CTAs of 32 RG threads: at W = 114688 (n = 4, C = 7168) 896 CTAs.

Compile key: PlanesCfg (VW: 4 when W % 4 == 0 and both pointers 16-byte aligned, else 1; RG); P and W are runtime
scalars. Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.utils import SmemAllocator

from tilekernels import _cute as CU

_NAME = "mhc.cute_planes"


@dataclasses.dataclass(frozen=True)
class PlanesCfg:
    """Launch config = compile key. VW: fp32 columns a lane (4: 16-byte loads); RG: warps a CTA."""

    VW: int = 4
    RG: int = 8

    def __post_init__(self):
        if self.VW not in (1, 2, 4) or not 1 <= self.RG <= 32:
            raise ValueError(f"mhc plane sums: config {self}: needs VW in 1, 2, 4 and 1 <= RG <= 32")

    @classmethod
    def for_(cls, src: torch.Tensor, dst: torch.Tensor, W: int) -> "PlanesCfg":
        aligned = W % 4 == 0 and src.data_ptr() % 16 == 0 and dst.data_ptr() % 16 == 0
        return cls(VW=4 if aligned else 1)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, src: cute.Pointer, dst: cute.Pointer, P: Int32, W: Int32):
    # (W % VW == 0 and both pointers VW * 4-byte aligned: PlanesCfg.for_; the offsets' divisibility is asserted to
    # the compiler so that the loads are VW-wide)
    VW, RG = cfg.VW, cfg.RG
    tid, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    lane = tid % 32
    g = tid // 32
    q = bx * 32 + lane                 # this lane's vector of VW columns
    smem = SmemAllocator()
    part = smem.allocate_tensor(Float32, cute.make_layout((RG, 32, VW), stride=(32 * VW, VW, 1)), 16)
    acc = cute.make_rmem_tensor(cute.make_layout(VW), Float32)
    row = cute.make_rmem_tensor(cute.make_layout(VW), Float32)
    acc.fill(0.0)
    if q * VW < W:
        for p in cutlass.range(g, P, RG, unroll=4):
            cute.autovec_copy(cute.make_tensor(src + cute.assume(Int64(p) * W + q * VW, divby=VW), cute.make_layout(VW)),
                              row)
            for e in cutlass.range_constexpr(VW):
                acc[e] = acc[e] + row[e]
    for e in cutlass.range_constexpr(VW):
        part[g, lane, e] = acc[e]
    cute.arch.sync_threads()
    if g == 0:
        if q * VW < W:
            for w_ in cutlass.range_constexpr(1, RG):
                for e in cutlass.range_constexpr(VW):
                    acc[e] = acc[e] + part[w_, lane, e]
            cute.autovec_copy(acc, cute.make_tensor(dst + cute.assume(q * VW, divby=VW), cute.make_layout(VW)))


@cute.jit
def _host(cfg: cutlass.Constexpr, src: cute.Pointer, dst: cute.Pointer, P: Int32, W: Int32, stream: CU.cuda.CUstream):
    _kernel(cfg, src, dst, P, W).launch(grid=(cute.ceil_div(W, 32 * cfg.VW), 1, 1), block=(32 * cfg.RG, 1, 1),
                                        stream=stream)


@functools.lru_cache(maxsize=64)
def launch(cfg: PlanesCfg) -> CU.Launch:
    """run args (src [P, W] fp32, dst [W] fp32, P, W)."""
    f4 = CU.Ptr(torch.float32, 16 if cfg.VW == 4 else 4)
    return CU.Launch(f"{_NAME}.sum", _host, cfg, (f4, f4, CU.Scalar(Int32), CU.Scalar(Int32)))


def sum_planes_into(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst = src.sum(0) in a fixed order: src [P, ...] fp32 contiguous, dst fp32 holding src[0]'s element count
    contiguously (e.g. one plane of a larger buffer). P = 0 writes zeros."""
    P = src.shape[0]
    W = src[0].numel() if P else dst.numel()
    if not (src.dtype == dst.dtype == torch.float32 and src.is_contiguous() and dst.is_contiguous()
            and dst.numel() == W and src.is_cuda and dst.device == src.device):
        raise ValueError(f"mhc plane sums: src {tuple(src.shape)} {src.dtype} -> dst {tuple(dst.shape)} {dst.dtype}: "
                         f"needs fp32, contiguous, dst of {W} elements, both on one CUDA device")
    if W == 0:
        return
    if P == 0:
        dst.zero_()
        return
    launch(PlanesCfg.for_(src, dst, W)).run(src, dst, P, W)


def representative_launches() -> dict[str, CU.Launch]:
    """Both vector widths (what the CPU compile test exports)."""
    return {"sum_vw4": launch(PlanesCfg(VW=4)), "sum_vw1": launch(PlanesCfg(VW=1))}
