#!/usr/bin/env python3
"""Probe: the memory pattern alone of mhc_post_pre's backward pass (cute_post_pre_bwd), as it is and with the
chunk's tiles cut the other way (H200).

Why: that pass moves 7.05 GB in ~1960 us (84% of copy) at T=32768, n=4, C=7168, and session 36's stream probe
(`tma_promo_probe.py --il sib`) put its walk of [64 tokens, 64 channels] tiles (128-byte row pieces) at 86.8% of
copy against 93.9% for [32 tokens, 128 channels] tiles loaded as two [32, 64] boxes side by side (wgmma-compatible:
each box a standard 128-byte-swizzled tile). That probe reads and writes one matrix in place; this one is the
pass's own traffic, so the two numbers say how far a pass with the other tiles could go before any rewrite:

* per chunk a stage holds, for each of the n streams, dout and residual, then x and dlayer_in, as TMA boxes from
  four tensors (the pass's views: [T, n, C] seen (C, T, n), [T, C] seen (C, T)), plus the weight B tiles of both
  consumer warpgroups (L2-resident, as the pass's); a stage that comes back is stored by TMA into dresidual (from
  the residual slots) and dx (from x's) before it is loaded again (``_cute.ring_producer``, as the pass);
* SPLIT sibling CTAs a row tile of BMT tokens, CTA r taking chunks r, r + SPLIT, ...; one CTA an SM (the pass's
  shared memory); the consumers (2 warpgroups) only wait for each stage and release it: no math, so the stores
  carry the residual back unchanged.

Configs: BMT 64, H 1 (the pass today: [64 ch, 64 tok] boxes, 64-channel chunks); BMT 32, H 2 (chunks of 128
channels as two [64 ch, 32 tok] boxes per tensor and stream: the layout a pass with M = (half, token) rows would
stream); BMT 32, H 1 (32-token tiles of 128-byte pieces, padded to one CTA an SM); LOCK L (session 37): the
siblings in thread-block clusters of L whose producers issue each chunk's loads together (lock mbarriers, remote
arrives). Not a library kernel.

Run on the GPU: ``python benchmarks/probes/post_pre_bwd_skeleton.py`` (cute bundle); prints us and % of the
bytes' copy time measured in the same run; JSON to $OUT.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.tensor_utils import LayoutEnum

from tilekernels import _cute as CU
from tilekernels.mhc.cute_proj_rms import _smem_tensor

_NAME = "probes.post_pre_bwd_skeleton"


@dataclasses.dataclass(frozen=True)
class SkelCfg:
    """Compile key. BMT tokens a CTA; H boxes of 64 channels a chunk (a chunk is 64 H channels); NPK the weight
    tiles' k rows (the pass: 32 = N padded; 48 with H 2: both halves' 24 rows); PAD_KB shared memory added
    (one CTA an SM for the small configs)."""

    n: int = 4
    C: int = 7168
    BMT: int = 64
    H: int = 1
    STAGES: int = 2
    SPLIT: int = 4
    NPK: int = 32
    PAD_KB: int = 0
    FWD: bool = False  # the fused forward pass's traffic instead (cute_post_pre_fwd): residual and x loaded, out
    # stored (from the residual slots, into the dresidual tensor): 3s + x bytes, SPLIT 8 there
    # LOCK (session 37): 0, or a cluster of LOCK sibling CTAs (LOCK | SPLIT) whose producers issue each chunk's loads
    # together: before its loads of step k a producer arrives on every peer's lock barrier and waits for all of
    # theirs, so the siblings' adjacent 128-byte pieces reach DRAM at about the same time (what H2's two boxes do
    # within one CTA), the consumers and tiles unchanged
    LOCK: int = 0

    def __post_init__(self):
        if self.LOCK and (self.LOCK not in (2, 4, 8) or self.SPLIT % self.LOCK):
            raise ValueError(f"skeleton: LOCK {self.LOCK} must be 2, 4 or 8 and divide SPLIT {self.SPLIT}")

    @property
    def CC(self) -> int:
        return 64 * self.H

    @property
    def nch(self) -> int:
        return -(-self.C // self.CC)

    @property
    def kinds(self) -> int:
        """tile kinds a stage: dout and residual a stream, x, dlayer_in (FWD: residual a stream, x; slot kinds
        keep the backward's numbering, so FWD's residual slot i is n + i)."""
        return 2 * self.n + 2

    @property
    def stage_bytes(self) -> int:
        """bytes a stage's loads bring (the ring's transaction count): FWD loads n + 1 of the kinds."""
        loaded = self.n + 1 if self.FWD else self.kinds
        return loaded * self.H * 64 * self.BMT * 2 + 2 * 128 * self.NPK * 2


def _layouts(cfg):
    mn = LayoutEnum.COL_MAJOR
    sT = sm90_utils.make_smem_layout_a(mn, (64, 16, cfg.BMT), BFloat16, cfg.kinds * cfg.H * cfg.STAGES)
    sW = sm90_utils.make_smem_layout_b(mn, (64, 128, cfg.NPK), BFloat16, 2 * cfg.STAGES)
    return sT, sW


# ---- the sibling lock (LOCK; session 37, measured here, in the passes and in proj_rms's backward at 5f278ea, and
# reverted there: the passes run at the board's power cap, so the faster pattern bought no time)


@cute.jit
def _lock_step(bars: cute.Pointer, k: Int32, rank: Int32, size: cutlass.Constexpr) -> None:
    """A producer warp's step k (every lane): lane 0 arrives on each peer's barrier k % 2, then the warp waits until
    every peer has arrived on its own."""
    if cute.arch.lane_idx() == 0:
        for q in cutlass.range_constexpr(1, size):
            cute.arch.mbarrier_arrive(bars + (k % 2), (rank + q) % size)
    cute.arch.mbarrier_wait(bars + (k % 2), (k // 2) % 2)


@cute.kernel
def _kernel(cfg: cutlass.Constexpr, tma_dout: cute.CopyAtom, mDout: cute.Tensor, tma_res: cute.CopyAtom,
            mRes: cute.Tensor, tma_dres: cute.CopyAtom, mDres: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
            tma_dg: cute.CopyAtom, mDg: cute.Tensor, tma_dx: cute.CopyAtom, mDx: cute.Tensor,
            tma_w: cute.CopyAtom, mW: cute.Tensor):
    n, S, SP, H, BMT = cfg.n, cfg.STAGES, cfg.SPLIT, cfg.H, cfg.BMT
    KT = cfg.kinds * H   # tiles a stage: slot (kind, h) -> kind * H + h
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    m = bid // SP
    r_ = bid - m * SP
    nk = (cfg.nch - r_ + SP - 1) // SP
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = cute.arch.make_warp_uniform(tidx // 128)
    if warp == 0:
        CU.prefetch_tma(tma_dout, tma_res, tma_dres, tma_x, tma_dg, tma_dx, tma_w)
    smem = cutlass.memory.SmemAllocator()
    sT_l, sW_l = _layouts(cfg)
    _, sT = _smem_tensor(smem, sT_l)
    _, sW = _smem_tensor(smem, sW_l)
    if cutlass.const_expr(cfg.PAD_KB > 0):
        smem.allocate_tensor(cutlass.Uint8, cute.make_layout(cfg.PAD_KB * 1024), byte_alignment=1024)
    pipe = CU.tma_pipeline(smem, S, cfg.stage_bytes, 8)
    L = cfg.LOCK
    if cutlass.const_expr(L > 0):
        sL = CU.cluster_lock(smem, L)   # the lock's two mbarriers (shared with mhc's resident forward pass)
        rank = r_ % L   # the cluster's CTAs: adjacent r; the steps all take: its last CTA's chunk count
        nlock = (cfg.nch - (r_ - rank + L - 1) + SP - 1) // SP
    tDs, tDg = CU.tma_tiles(tma_dout, sT, mDout, (64, BMT))
    _, tRg = CU.tma_tiles(tma_res, sT, mRes, (64, BMT))
    _, tSg = CU.tma_tiles(tma_dres, sT, mDres, (64, BMT))
    _, tXg = CU.tma_tiles(tma_x, sT, mX, (64, BMT))
    _, tGg = CU.tma_tiles(tma_dg, sT, mDg, (64, BMT))
    _, tOg = CU.tma_tiles(tma_dx, sT, mDx, (64, BMT))
    tWs, tWg = CU.tma_tiles(tma_w, sW, mW, (128, cfg.NPK))

    if wg == 0:
        cute.arch.setmaxregister_decrease(40)
        if warp == 0:
            def load(st, k, bar):
                ch = r_ + k * SP
                base = st * KT
                if cutlass.const_expr(L > 0):
                    if k < nlock:
                        _lock_step(sL, k, rank, L)
                for i in cutlass.range_constexpr(n):
                    if cutlass.const_expr(not cfg.FWD):
                        for h in cutlass.range_constexpr(H):
                            cute.copy(tma_dout, tDg[None, ch * H + h, m, i], tDs[None, base + i * H + h],
                                      tma_bar_ptr=bar)
                    for h in cutlass.range_constexpr(H):
                        cute.copy(tma_res, tRg[None, ch * H + h, m, i], tDs[None, base + (n + i) * H + h],
                                  tma_bar_ptr=bar)
                for h in cutlass.range_constexpr(H):
                    cute.copy(tma_x, tXg[None, ch * H + h, m], tDs[None, base + 2 * n * H + h], tma_bar_ptr=bar)
                if cutlass.const_expr(not cfg.FWD):
                    for h in cutlass.range_constexpr(H):
                        cute.copy(tma_dg, tGg[None, ch * H + h, m], tDs[None, base + (2 * n + 1) * H + h],
                                  tma_bar_ptr=bar)
                for w_ in cutlass.range_constexpr(2):
                    cute.copy(tma_w, tWg[None, 2 * ch + w_, 0], tWs[None, w_ * S + st], tma_bar_ptr=bar)

            def store(st, k):
                ch = r_ + k * SP
                base = st * KT
                for j in cutlass.range_constexpr(n):
                    for h in cutlass.range_constexpr(H):
                        cute.copy(tma_dres, tDs[None, base + (n + j) * H + h], tSg[None, ch * H + h, m, j])
                if cutlass.const_expr(not cfg.FWD):
                    for h in cutlass.range_constexpr(H):
                        cute.copy(tma_dx, tDs[None, base + 2 * n * H + h], tOg[None, ch * H + h, m])
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)

            CU.ring_producer(pipe, S, nk, load, store)
    else:
        cute.arch.setmaxregister_increase(232)
        rst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        for _ in cutlass.range(nk, unroll=1):
            pipe.consumer_wait(rst)
            CU.release_read_stage(pipe, rst)
            rst.advance()
    if cutlass.const_expr(L > 0):   # no CTA leaves while a peer may still arrive on its barriers
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()


@cute.jit
def _host(cfg: cutlass.Constexpr, dout: cute.Pointer, res: cute.Pointer, x: cute.Pointer, dg: cute.Pointer,
          wp: cute.Pointer, dres: cute.Pointer, dx: cute.Pointer, T: Int32, stream: CU.cuda.CUstream):
    n, C = cfg.n, cfg.C

    def streams(p):
        return cute.make_tensor(p, cute.make_layout((C, T, n), stride=(1, n * C, C)))

    def plain(p):
        return cute.make_tensor(p, cute.make_layout((C, T), stride=(1, C)))

    sT_l, sW_l = _layouts(cfg)
    one = cute.slice_(sT_l, (None, None, 0))
    g2s, s2g = cpasync.CopyBulkTensorTileG2SOp(), cpasync.CopyBulkTensorTileS2GOp()
    tma_dout, tDout = cpasync.make_tiled_tma_atom(g2s, streams(dout), one, (64, cfg.BMT))
    tma_res, tRes = cpasync.make_tiled_tma_atom(g2s, streams(res), one, (64, cfg.BMT))
    tma_dres, tDres = cpasync.make_tiled_tma_atom(s2g, streams(dres), one, (64, cfg.BMT))
    tma_x, tX = cpasync.make_tiled_tma_atom(g2s, plain(x), one, (64, cfg.BMT))
    tma_dg, tDg = cpasync.make_tiled_tma_atom(g2s, plain(dg), one, (64, cfg.BMT))
    tma_dx, tDx = cpasync.make_tiled_tma_atom(s2g, plain(dx), one, (64, cfg.BMT))
    Q = cfg.nch * 2 * 128
    mW = cute.make_tensor(wp, cute.make_layout((Q, cfg.NPK), stride=(1, Q)))
    tma_w, tW = cpasync.make_tiled_tma_atom(g2s, mW, cute.slice_(sW_l, (None, None, 0)), (128, cfg.NPK))
    _kernel(cfg, tma_dout, tDout, tma_res, tRes, tma_dres, tDres, tma_x, tX, tma_dg, tDg, tma_dx, tDx,
            tma_w, tW).launch(grid=(cfg.SPLIT * ((T + cfg.BMT - 1) // cfg.BMT), 1, 1), block=(384, 1, 1),
                              cluster=(max(cfg.LOCK, 1), 1, 1), stream=stream, min_blocks_per_mp=1,
                              preferred_smem_carveout=100)


@functools.lru_cache(maxsize=16)
def launch(cfg: SkelCfg) -> CU.Launch:
    """run args (dout, residual, x, dlayer_in, weight [NPK, nch * 256], dresidual, dx, T)."""
    bf = CU.Ptr(torch.bfloat16, 16)
    return CU.Launch(f"{_NAME}.pass", _host, cfg, (bf, bf, bf, bf, bf, bf, bf, CU.Scalar(Int32)))


def cases():
    return [
        ("[64 tok, 64 ch] (the pass)", SkelCfg()),
        ("[64 tok, 64 ch] LOCK 2", SkelCfg(LOCK=2)),
        ("[64 tok, 64 ch] LOCK 4", SkelCfg(LOCK=4)),
        ("[32 tok, 2 x 64 ch] H2", SkelCfg(BMT=32, H=2, NPK=48)),
        ("[32 tok, 64 ch] padded", SkelCfg(BMT=32, PAD_KB=100)),
        ("[64 tok, 64 ch] (again)", SkelCfg()),
        ("[64 tok, 64 ch] LOCK 2 (again)", SkelCfg(LOCK=2)),
        ("[64 tok, 64 ch] LOCK 4 (again)", SkelCfg(LOCK=4)),
        ("[32 tok, 2 x 64 ch] H2 (again)", SkelCfg(BMT=32, H=2, NPK=48)),
        ("[64 tok, 64 ch] SPLIT 1", SkelCfg(SPLIT=1)),
        ("[64 tok, 64 ch] SPLIT 8 LOCK 8", SkelCfg(SPLIT=8, LOCK=8)),
        ("[32 tok, 2 x 64 ch] H2 SPLIT 2", SkelCfg(BMT=32, H=2, NPK=48, SPLIT=2)),
        ("FWD [64 tok, 64 ch] SPLIT 8", SkelCfg(FWD=True, SPLIT=8)),
        ("FWD [64 tok, 64 ch] SPLIT 8 LOCK 2", SkelCfg(FWD=True, SPLIT=8, LOCK=2)),
        ("FWD [64 tok, 64 ch] SPLIT 8 LOCK 4", SkelCfg(FWD=True, SPLIT=8, LOCK=4)),
        ("FWD [64 tok, 64 ch] SPLIT 8 LOCK 8", SkelCfg(FWD=True, SPLIT=8, LOCK=8)),
        ("FWD [32 tok, 2 x 64 ch] H2 SPLIT 8", SkelCfg(FWD=True, SPLIT=8, BMT=32, H=2, NPK=48)),
        ("FWD [32 tok, 2 x 64 ch] H2 SPLIT 4", SkelCfg(FWD=True, SPLIT=4, BMT=32, H=2, NPK=48)),
        ("FWD [64 tok, 64 ch] SPLIT 8 (again)", SkelCfg(FWD=True, SPLIT=8)),
        ("FWD [64 tok, 64 ch] SPLIT 8 LOCK 2 (again)", SkelCfg(FWD=True, SPLIT=8, LOCK=2)),
        ("FWD [64 tok, 64 ch] SPLIT 8 LOCK 4 (again)", SkelCfg(FWD=True, SPLIT=8, LOCK=4)),
    ]


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # benchmarks/
    from _gpu import bench, device_env   # do_bench's median (session 36's rows: do_bench's default mean)

    T, n, C = 32768, 4, 7168
    bf = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    dout = torch.randn(T, n, C, device="cuda", dtype=bf, generator=g)
    res = torch.randn(T, n, C, device="cuda", dtype=bf, generator=g)
    x = torch.randn(T, C, device="cuda", dtype=bf, generator=g)
    dg = torch.randn(T, C, device="cuda", dtype=bf, generator=g)
    dres = torch.empty_like(res)
    dx = torch.empty_like(x)
    nbytes = 2 * (dout.numel() + res.numel() + x.numel() + dg.numel()) + 2 * (dres.numel() + dx.numel())
    big = torch.empty(res.numel(), dtype=bf, device="cuda")
    t_copy = bench(lambda: big.copy_(res.view(-1))) * 1e3   # 2 x 1.88 GB
    copy_rate = 2 * 2 * res.numel() / t_copy   # bytes / us
    rows = []
    only = [a for a in (argv or [])[1:]]
    for name, cfg in cases():
        if only and not any(o in name for o in only):
            continue
        try:
            w = torch.randn(cfg.NPK, cfg.nch * 256, device="cuda", dtype=bf, generator=g)
            ln = launch(cfg)
            dres.fill_(float("nan"))
            dx.fill_(float("nan"))
            ln.run(dout, res, x, dg, w, dres, dx, T)
            torch.cuda.synchronize()
            ok = "ok" if torch.equal(dres, res) and (cfg.FWD or torch.equal(dx, x)) else "WRONG (stores != loads)"
            t = bench(lambda: ln.run(dout, res, x, dg, w, dres, dx, T)) * 1e3
            nb = 2 * (2 * res.numel() + x.numel()) if cfg.FWD else nbytes
            rows.append(dict(name=name, us=t, pct=100 * nb / t / copy_rate, ok=ok, bytes=nb,
                             cfg=dataclasses.asdict(cfg)))
        except Exception as e:  # noqa: BLE001  (a probe: report and go on)
            rows.append(dict(name=name, us=float("nan"), pct=float("nan"), ok=f"error {type(e).__name__}: {e}"))
    report("post_pre_bwd_skeleton", dict(env=device_env(), T=T, n=n, C=C, bytes=nbytes, copy_us_1p88GB=t_copy),
           rows, f"bytes {nbytes / 1e9:.2f} GB; copy rate {copy_rate / 1e6:.3f} TB/s ({t_copy:.1f} us for 2 x 1.88 GB)")
    return 0


def report(name: str, meta: dict, rows: list[dict], first: str) -> None:
    """A traffic probe's rows: ``name``.json under $OUT (``meta`` and the rows), then ``first`` and a table of case,
    us, % of copy and check."""
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"{name}.json"), "w") as fh:
            json.dump(dict(meta, rows=rows), fh, indent=1)
    width = max([len(r["name"]) for r in rows] + [4]) + 2
    print(first)
    print(f"{'case':<{width}} {'us':>9} {'%copy':>7}  check")
    for r in rows:
        print(f"{r['name']:<{width}} {r['us']:9.1f} {r['pct']:7.1f}  {r['ok']}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
