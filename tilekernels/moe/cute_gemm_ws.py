"""Warp-specialized variant of the CuTe DSL MXFP8 grouped GEMM (design (a), ``GemmCfg.kernel == "ws"``).

Same math, operands, variants (fwd / dgrad / wgrad), device tile scheduler and dequant as
``cute_grouped_gemm.py`` (whose module docstring describes them); what changes is who does
what inside a CTA:

* CTA = 3 warpgroups (384 threads; 4 with ``producers=2``), one CTA per SM (``bufs`` x 48
  KiB of bf16 stages).
  - warpgroup 0, the **producer**: loads the e4m3 bytes + E8M0 scales of a k-tile straight
    from global memory into registers (16-byte vector loads, issued one k-tile ahead),
    dequantizes them to bf16 (cute_gemm_dequant.py) and stores them into stage ``s`` of a
    ``bufs``-deep ring of 128B-swizzled bf16 operand tiles (A ``tile_m x 64``, B
    ``tile_n x 64``). Its 128 threads each play two of the 256 "virtual threads" of the
    copy layouts of ``cute_grouped_gemm.copy_tv_spec`` (thread t does the chunks of t and
    t + 128), so the layouts, loads and dequant are the two-warpgroup kernel's.
  - warpgroups 1 and 2, the **consumers**: each owns 64 rows of the tile and only waits for
    a full stage, issues its four ``m64 n256 k16`` bf16 wgmmas (fp32 accumulators, both
    operands from shared memory), keeps one k-tile of wgmmas in flight and releases the
    stage of the previous k-tile once ``wait_group(1)`` says its wgmmas retired; then the
    register epilogue (``cute_grouped_gemm.epilogue_regs``).
* Synchronization: an mbarrier pipeline (``cutlass.pipeline.PipelineAsync``), no CTA
  barrier in the mainloop. full[s]: 4 arrivals (lane 0 of each producer warp, after every
  lane fenced its generic-proxy stores for the async proxy and the warp synced); empty[s]:
  8 arrivals (lane 0 of each consumer warp, after its wgmmas reading s retired).
* Persistent (``persistent=True``, what the tests and benchmark use): ``sms`` CTAs walk the exact tile list
  (bid, bid + grid, ...). The producer runs ahead into the next tile while the consumers
  store the previous tile's accumulators, so the epilogue overlaps the next tile's loads
  and dequant (up to ``bufs`` stages of it); the tensor cores idle only for the epilogue.
* ``ws_regs = (producer, consumer)``: ``setmaxnreg`` per role (p * producers + 2 c <= 512;
  the launch bound is 168 a thread with one producer warpgroup). ``None`` keeps the launch
  bound for all (the consumer needs ~128 for the accumulators plus addressing, the producer
  ~110; ptxas: 157-162 registers, no spills).
* ``producers = 2``: two producer warpgroups (512 threads), each thread one virtual thread.
  At 512 threads the launch bound is 128 registers a thread, and ptxas (CUDA 13.x, through
  CuTe DSL 4.8.1) allocates the whole kernel at that bound whatever ``setmaxnreg`` says
  ("Insufficient registers (128) ... register target of 154" for the m64n256 consumer), so
  only ``tile_n = 128`` (64 accumulator registers) compiles with it.
* ``early_loads=False``: the next k-tile's loads go after the stage's commit instead of
  between the dequant of this k-tile's operands (in case the proxy fence waited for loads
  in flight; measured: the late loads are 0-5% slower, so it does not).

Budget per k-tile (128 x 256 x 64): the wgmmas take ~1250 cycles at the bf16 rate; the
producer dequantizes 24576 elements (~6 integer + 2 bf16x2 ops per 4: ~1150 integer warp
instructions, ~580 cycles of the SM's integer pipes at full occupancy) plus 96 warp-wide
16-byte smem stores and 48 warp-wide 16-byte loads. Shared-memory traffic equals the bf16
GEMM's (48 KiB of stores + 80 KiB of wgmma reads per k-tile).

Measured (H200, 2026-11-24, benchmarks/moe_gemm_check.py --sweep-set ws, the issue's G=8
and G=32 GEMMs): correct (bitwise equal to the two-warpgroup kernel; every GPU test passes)
but SLOWER: 354-408 TFLOP/s at ``bufs=3`` (the best ws config; ``bufs=4`` 353-404,
non-persistent 337-406, two producers at tile_n 128 300-351) against 402-481 for the
two-warpgroup kernel. A k-tile takes ~2450 cycles (1250 x 773 / 395): the single producer
warp per SM sub-partition is the bound; its dependent integer chains and loads are
latency-bound at one warp per scheduler (estimate: ~460 instructions a thread per k-tile
in those ~2450 cycles, ~0.2 a cycle; not profiled), where the
two-warpgroup kernel has two dequantizing warps per scheduler. So the kernel is not the
default anywhere (``GemmCfg.kernel = "dq"``); it selects with ``kernel="ws"``.

Not supported here (the config asserts): the staged epilogue (``epi_smem``), two CTAs per SM.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import BFloat16, Int32, Int64, Uint8, Uint32, const_expr
from cutlass.cute.nvgpu import warpgroup

from tilekernels import _cute as C

from .cute_gemm_dequant import BLOCK, chunks, dequant_operand
from .cute_gemm_sched import schedule, views
from .cute_grouped_gemm import (_copy_tv, _load_operand, bf16_mma, epilogue_regs, launch_gemm, m_tile_count,
                                operand_smem)

CONSUMER_WGS = 2
CONSUMER_WARPS = 8


def ws_threads(cfg) -> int:
    """Threads of a CTA: the producer warpgroups and the 2 consumer warpgroups."""
    return 128 * (cfg.producers + CONSUMER_WGS)


def smem_bytes(tile_m: int, tile_n: int, tile_k: int, bufs: int) -> int:
    """Dynamic shared memory of the ws kernel: the bf16 stages and the 2 x bufs mbarriers."""
    return bufs * (tile_m + tile_n) * tile_k * 2 + 2 * bufs * 8 + 1024


@cute.kernel
def ws_kernel(cfg: cutlass.Constexpr, mA: cute.Tensor, mAS: cute.Tensor, mB: cute.Tensor,
              mBS: cute.Tensor, mC: cute.Tensor, mOff: cute.Tensor, M: Int32):
    BN, NB = cfg.tile_n, cfg.bufs
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    wg = cute.arch.make_warp_uniform(tidx // 128)
    lane = cute.arch.lane_idx()
    n_tiles = (cfg.nc + BN - 1) // BN

    # ---------------- shared memory: NB bf16 stages per operand (wgmma layouts) + mbarriers
    smem = cutlass.memory.SmemAllocator()
    _, sA, sB = operand_smem(cfg, smem)
    bars = smem.allocate_array(Int64, 2 * NB, byte_alignment=8)
    pipe = pipeline.PipelineAsync.create(
        num_stages=NB,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * cfg.producers),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_WARPS),
        barrier_storage=bars)

    # ---------------- the tiles of this CTA (only valid ones: no per-tile branch needed)
    # non-persistent: tile bidx of a bound (ragged m: cdiv(M, BM) + G m-tiles), skipped if
    # past the last tile; persistent: tiles bidx, bidx + grid, ... of the exact count
    m_tiles = m_tile_count(cfg, mOff, M)
    sched_m = m_tiles if const_expr(cfg.variant != "wgrad") else Int32(0)
    if const_expr(cfg.persistent):
        total = m_tiles * n_tiles
        step = gdim
    else:
        g0, _, _, _, _, _, _, _ = schedule(cfg, mOff, M, bidx, sched_m)
        total = cutlass.select_(g0 < cfg.G, bidx + 1, bidx)
        step = Int32(1)

    if wg < cfg.producers:
        _producer(cfg, pipe, sA, sB, mA, mAS, mB, mBS, mC, mOff, M, bidx, total, step, sched_m, tidx, lane)
    else:
        _consumer(cfg, pipe, sA, sB, mA, mAS, mB, mBS, mC, mOff, M, bidx, total, step, sched_m, tidx, lane)


@cute.jit
def _producer(cfg: cutlass.Constexpr, pipe, sA: cute.Tensor, sB: cute.Tensor, mA: cute.Tensor, mAS: cute.Tensor,
              mB: cute.Tensor, mBS: cute.Tensor, mC: cute.Tensor, mOff: cute.Tensor, M: Int32, bidx: Int32,
              total: Int32, step: Int32, sched_m: Int32, tidx: Int32, lane: Int32):
    """Warpgroups 0 .. producers-1: gmem e4m3 -> registers -> bf16 -> the smem stage, one
    k-tile ahead; each thread plays PV = 2 / producers virtual threads of the copy layouts."""
    BM, BN, BK, NB = cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.bufs
    PV = 2 // cfg.producers
    # ================= producer: gmem e4m3 -> registers -> bf16 -> smem stage
    if const_expr(cfg.ws_regs is not None):
        cute.arch.setmaxregister_decrease(cfg.ws_regs[0])
    atom_g2r = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint8, num_bits_per_copy=128)
    atom_r2s = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
    tvA, tilerA = _copy_tv(cfg.a_kmajor, BM, BK)
    tvB, tilerB = _copy_tv(cfg.b_kmajor, BN, BK)
    cpA = cute.make_tiled_copy(atom_g2r, tvA, tilerA)
    cpB = cute.make_tiled_copy(atom_g2r, tvB, tilerB)
    r2s_A = cute.make_tiled_copy(atom_r2s, tvA, tilerA)
    r2s_B = cute.make_tiled_copy(atom_r2s, tvB, tilerB)
    nA = BM * BK // 256
    nB = BN * BK // 256
    nAS, tAS = (chunks(True, BM, BK), Uint32) if const_expr(cfg.a_kmajor) else (16, Uint8)
    nBS, tBS = (chunks(True, BN, BK), Uint32) if const_expr(cfg.b_kmajor) else (16, Uint8)
    # per virtual thread v (this thread's index + 128 v): copy slices, coordinates, bytes
    thrA, thrB, tAc, tBc, tAs, tBs, rA, rB, rAS, rBS = [], [], [], [], [], [], [], [], [], []
    for v in cutlass.range_constexpr(PV):
        vt = tidx + 128 * cfg.producers * v
        thrA.append(cpA.get_slice(vt))
        thrB.append(cpB.get_slice(vt))
        tAc.append(thrA[v].partition_S(cute.make_identity_tensor((BM, BK))))
        tBc.append(thrB[v].partition_S(cute.make_identity_tensor((BN, BK))))
        tAs.append(r2s_A.get_slice(vt).partition_D(sA))
        tBs.append(r2s_B.get_slice(vt).partition_D(sB))
        rA.append(cute.make_rmem_tensor((nA,), Uint8))
        rB.append(cute.make_rmem_tensor((nB,), Uint8))
        rAS.append(cute.make_rmem_tensor((nAS,), tAS))
        rBS.append(cute.make_rmem_tensor((nBS,), tBS))
    oA = cute.make_rmem_tensor((nA,), BFloat16)
    oB = cute.make_rmem_tensor((nB,), BFloat16)
    oAv = cute.make_tensor(oA.iterator, cute.make_layout(tAs[0][None, None, None, 0].shape))
    oBv = cute.make_tensor(oB.iterator, cute.make_layout(tBs[0][None, None, None, 0].shape))

    pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, NB)
    for t in cutlass.range(bidx, total, step, unroll=1):
        g, m0, m_lim, n0, n_lim, k0, kb_lim, nk = schedule(cfg, mOff, M, t, sched_m)
        gA, gAS, gB, gBS, _ = views(cfg, mA, mAS, mB, mBS, mC, g, m0, n0, k0)
        for v in cutlass.range_constexpr(PV):
            _load_operand(cfg, cfg.a_kmajor, BM, thrA[v], atom_g2r, atom_g2r, tAc[v], gA, gAS,
                          Int32(0), m_lim, kb_lim, rA[v], rAS[v])
            _load_operand(cfg, cfg.b_kmajor, BN, thrB[v], atom_g2r, atom_g2r, tBc[v], gB, gBS,
                          Int32(0), n_lim, kb_lim, rB[v], rBS[v])
        for kt in cutlass.range(nk, unroll=1):
            pipe.producer_acquire(pst)
            buf = pst.index
            for v in cutlass.range_constexpr(PV):
                # dequantize k-tile kt into stage buf; early_loads: then load kt + 1 into the
                # same registers (predicated off past the k range) before the proxy fence,
                # else after the commit (in case the fence waits for loads in flight)
                dequant_operand(cfg, cfg.a_kmajor, BM, tAc[v], kt, kb_lim, rA[v], rAS[v], oA)
                cute.copy(r2s_A, oAv, tAs[v][None, None, None, buf])
                if const_expr(cfg.early_loads):
                    _load_operand(cfg, cfg.a_kmajor, BM, thrA[v], atom_g2r, atom_g2r, tAc[v], gA, gAS,
                                  kt + 1, m_lim, kb_lim, rA[v], rAS[v])
                dequant_operand(cfg, cfg.b_kmajor, BN, tBc[v], kt, kb_lim, rB[v], rBS[v], oB)
                cute.copy(r2s_B, oBv, tBs[v][None, None, None, buf])
                if const_expr(cfg.early_loads):
                    _load_operand(cfg, cfg.b_kmajor, BN, thrB[v], atom_g2r, atom_g2r, tBc[v], gB, gBS,
                                  kt + 1, n_lim, kb_lim, rB[v], rBS[v])
            # every lane's generic stores -> visible to the wgmmas (async proxy), then
            # one arrival per warp
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if lane == 0:
                pipe.producer_commit(pst)
            if const_expr(not cfg.early_loads):
                for v in cutlass.range_constexpr(PV):
                    _load_operand(cfg, cfg.a_kmajor, BM, thrA[v], atom_g2r, atom_g2r, tAc[v], gA, gAS,
                                  kt + 1, m_lim, kb_lim, rA[v], rAS[v])
                    _load_operand(cfg, cfg.b_kmajor, BN, thrB[v], atom_g2r, atom_g2r, tBc[v], gB, gBS,
                                  kt + 1, n_lim, kb_lim, rB[v], rBS[v])
            pst.advance()


@cute.jit
def _consumer(cfg: cutlass.Constexpr, pipe, sA: cute.Tensor, sB: cute.Tensor, mA: cute.Tensor, mAS: cute.Tensor,
              mB: cute.Tensor, mBS: cute.Tensor, mC: cute.Tensor, mOff: cute.Tensor, M: Int32, bidx: Int32,
              total: Int32, step: Int32, sched_m: Int32, tidx: Int32, lane: Int32):
    """Warpgroups 1, 2: wgmmas on full stages, stage release, register epilogue."""
    BM, BN, BK, NB = cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.bufs
    wg = cute.arch.make_warp_uniform(tidx // 128)
    # ================= consumers: wgmma on full stages, epilogue from registers
    if const_expr(cfg.ws_regs is not None):
        cute.arch.setmaxregister_increase(cfg.ws_regs[1])
    ct = tidx - 128 * cfg.producers
    wc = wg - cfg.producers
    tiled_mma, thr_mma_c, tCrA, tCrB, tCcC, acc = bf16_mma(cfg, sA, sB, wc, ct)
    atom_st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mC.element_type,
                                  num_bits_per_copy=2 * mC.element_type.width)
    d_c = cute.logical_divide(tCcC, cute.make_layout(2))
    pair = cute.make_rmem_tensor((2,), mC.element_type)

    cst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, NB)
    for t in cutlass.range(bidx, total, step, unroll=1):
        g, m0, m_lim, n0, n_lim, k0, kb_lim, nk = schedule(cfg, mOff, M, t, sched_m)
        _, _, _, _, gC = views(cfg, mA, mAS, mB, mBS, mC, g, m0, n0, k0)
        acc.fill(0.0)
        for kt in cutlass.range(nk, unroll=1):
            pipe.consumer_wait(cst)
            buf = cst.index
            warpgroup.fence()
            for kb in cutlass.range_constexpr(BK // 16):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, buf], tCrB[None, None, kb, buf], acc)
            warpgroup.commit_group()
            # the previous k-tile's wgmmas have retired: release its stage
            warpgroup.wait_group(1)
            if kt > 0 and lane == 0:
                pipe.sync_object_empty.arrive((buf + NB - 1) % NB, pipe.consumer_mask)
            cst.advance()
        warpgroup.wait_group(0)
        if lane == 0:
            pipe.sync_object_empty.arrive((cst.index + NB - 1) % NB, pipe.consumer_mask)
        d_a = cute.logical_divide(acc, cute.make_layout(2))
        epilogue_regs(thr_mma_c, d_a, d_c, pair, atom_st, gC, BM, BN, m_lim, n_lim)


@cute.jit
def ws_host(cfg: cutlass.Constexpr, a: cute.Pointer, a_s: cute.Pointer, b: cute.Pointer,
            b_s: cute.Pointer, offs: cute.Pointer, out: cute.Pointer, M: Int32,
            stream: C.cuda.CUstream):
    launch_gemm(ws_kernel, cfg, a, a_s, b, b_s, offs, out, M, stream, ws_threads(cfg), 1)


__all__ = ["ws_kernel", "ws_host", "smem_bytes", "ws_threads", "BLOCK"]
