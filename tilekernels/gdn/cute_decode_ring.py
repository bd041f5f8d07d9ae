"""CuTe DSL kernel for gdn_decode with a TMA ring (Hopper sm_90a): the state streamed through shared memory.

Same op, math and results as tilekernels/gdn/cute_decode.py (read its docstring first; specs/gdn.py
``DECODE``, ``reference.decode`` the truth): per row b and value head h the conv step + SiLU of the
token's q|k|v channels, l2norm of q and k, beta = sigmoid(b), alpha = exp(g), then in place
S = alpha S; u = beta (v - S^T k); S = S + k u^T; o = S^T (scale q). fp32 math, the state read once
and written once (rounded once to its dtype), o rounded once to mixed's dtype.

Why: the register kernel (cute_decode) loads its [dk, BV] state slice straight into registers, so
the bytes in flight are what the resident threads can hold; Nsight at B=256 fp32 shows DRAM ~74%
busy, the warps stalled on the loads' scoreboards (H200, Qwen3-Next: 42.4 / 303 us at B = 32 / 256,
a plain copy of the same bytes 34.6 / 262 us). Here one producer warp keeps STAGES state tiles in
flight per CTA by TMA, running ahead of the math across heads and rows.

Work split: a work item is (row b, key head kh): item = b * Hk + kh; CTA g takes items g, g + grid,
g + 2 grid, ... with grid = B * Hk where the heuristic puts 2 CTAs on an SM (ITEM_GRID: one item a CTA, the
hardware handing out the rest; the fp32 state at Qwen3-Next) and min(B * Hk, SMs * CPS) persistent CTAs where one
CTA has the SM (the bf16 state, dk 256). An item covers the R = Hv/Hk
value heads hv = kh R .. kh R + R - 1 and all their columns, so its CTA alone owns the conv windows
of the key head's q|k channels and of those heads' v channels (reads the old window, writes the
shifted one itself): no clusters, no cross-CTA sync, Hv/Hk unbounded.

Tiles and the ring: a tile is [dk rows, BV columns] of one value head's state (NCB = ceil(dv / BV)
tiles a head, R * NCB an item, in order (head, column block)), loaded by TMA (one box (BV, dk)) from
the state seen as a 2-D row-major tensor [N * Hv * dk rows, dv columns] into stage k of a STAGES-deep
shared-memory ring ([dk, BV] row-major a stage, stages 128-byte aligned). Columns past dv in the
last tile are out of the tensor's bounds: TMA writes zeros there (and counts their bytes), the
kernel stores nothing there. Barriers: cutlass.pipeline.PipelineTmaAsync (``_cute.tma_pipeline``):
a full mbarrier a stage (the producer's arrive with the tile's bytes + TMA's transaction bytes) and
an empty one (one arrive per consumer warp). A consumer warp fences (fence.proxy.async.shared::cta) before
it releases a stage: ptxas issues the release without waiting for the warp's ld.shared of the stage, and the
refill is an async-proxy write the release does not order against, so without the fence the loads could
read the next tile (H200, session 20: the memory-pattern probe, SKELETON 2, rewrote whole tile rows in 10 of
10 runs at B=256 unfenced, none fenced; ``_cute.unfenced_releases`` checks the PTX in the compile tests).

Threads: CONSUMERS threads (warps 0 .. CONSUMERS/32 - 1) + one producer warp (the last).
* Producer warp: walks the CTA's items; for a row with slot >= 0 (slot = state_indices[b], or b)
  it issues, per tile, wait empty -> arrive with the tile's bytes on full -> TMA load, so it runs
  up to STAGES tiles ahead of the consumers (HBM busy while they run an item's prologue).
* Consumers, per item: a row with slot -1 writes zeros to o[b, kh R .. kh R + R - 1, :] and nothing
  else (the producer skipped it too). Otherwise the prologue: named barrier (the previous item's
  readers of the shared buffers are done); conv step + SiLU of the key head's 2 dk q|k channels and
  of the item's R dv v channels (threads t, t + CONSUMERS, ..; each window read and the shifted one
  written by the same thread), gates of the R heads, barrier, |q|^2, |k|^2, q.k (warp butterfly, one
  exchange between warps): cute_decode's helpers, the same fp32 op order. Then per tile: wait full,
  read the stage into registers in cute_decode's thread mapping (G = BV / VEC column groups, KS =
  CONSUMERS / G row parts; thread t takes columns j0 = VEC (t % G) .. j0 + VEC - 1 of rows
  p, p + KS, .. (p = t // G): one VEC-wide ld.shared a row; every 128 bytes a warp reads at once are
  contiguous, so no bank conflicts), __syncwarp and release the stage (lane 0 of each warp arrives on its
  empty barrier: the producer refills it while the consumers reduce and store), then
  cute_decode._delta_tile: h = alpha S, h^T k and h^T q' per column (per thread, butterfly over a
  warp's row parts, the warps' partials through shared memory in a fixed order: two exchange
  buffers alternating by tile, so one consumer barrier a tile), u, o, and S_new = h + k u^T stored
  in place from registers with VEC-wide st.global.

Results: the math is the register kernel's helpers in the same order; with the same thread mapping (a
config with its BV, VEC and KS) o and the state are expected bitwise equal to cute_decode's, and at the
heuristic's (KS 16 at Qwen3-Next: twice the register kernel's row parts) the dk-sums split differently,
so they agree within fp32 rounding.

Measured (H200, Qwen3-Next, CUDA-graph replay; benchmarks/results/gdn.md, h200-gdn-decode-cute.txt): the register
kernel / this one at the heuristic's config, us (session 18): fp32 B=4 6.5 / 6.6, B=8 9.6 / 7.3; bf16 B=4 4.8 / 5.0,
B=8 6.3 / 5.7, B=32 20.7 / 15.9, B=256 208 / 154. Hence cute_decode's dispatch (RING_FROM): this kernel from
B * Hk >= 128 items. fp32 with one item a CTA (session 20): B=32 42.3 / 38.0, B=256 301 / 279-280 (persistent CTAs
289); the memory pattern alone (tiles loaded and stored back, no prologue or math) 270 us at B=256, a copy of the
same bytes 261.

Layout: raw pointers to the caller's contiguous tensors: mixed [B, D], conv_state [N, C, W-1],
conv_weight [C, W], A_log, dt_bias [Hv] fp32, ssm_state [N, Hv, dk, dv] (16-byte aligned, TMA),
state_indices [B] int32, o [B, Hv, dv]. Offsets 64-bit except inside a slot (Hv dk dv < 2^31).

Backend limits (beyond them ``ring_config`` is None and cute_decode's kernel runs): dk <= 256 and BV <= 256 (TMA
box dims), dv * element size a multiple of 16 bytes (the TMA row stride), ssm_state 16-byte aligned,
N * Hv * dk < 2^31 (TMA row coordinate), fp32 or bf16 state, W >= 2, Hv % Hk == 0, the ring and the
buffers within shared memory. Compile key: DecodeRingCfg (static dims, element size, tiling,
has_idx) + dtypes; B and N are runtime scalars, except that ``ring_config`` picks 3 stages from STAGES3_FROM
items (a second compiled config: a CUDA graph captured at such a B compiles it first unless a call at that B
came before). Run by the cute backend's fwd kernel
(``cute_decode.decode_fwd``) where the grid is large enough (``cute_decode.RING_FROM``) and its limits hold.
Importing this module needs ``cutlass`` but no GPU.
"""
from __future__ import annotations  # noqa: I001 (torch before cutlass, as in every CuTe DSL module here)

import dataclasses
import functools

import torch

import cutlass
from cutlass import Float32, Int32, Int64, cute, pipeline
from cutlass.cute.nvgpu import cpasync
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as CU
from tilekernels._glue import launch_into, sm_count

from .cute_decode import (
    VEC_BYTES,
    _conv_step,
    _delta_tile,
    _row_kq,
    _st_state,
    _gate_math,
    _gates,
    _ld_state,
    _put_window,
    _qk_norms,
    _shifted,
    _silu_conv,
    _vec,
)

_NAME = "gdn.cute_decode_ring"
SMEM_CTA = 227 * 1024  # shared memory one CTA may have (H100 / H200)
SMEM_SM = 228 * 1024  # shared memory of an SM, 1 KiB of it reserved a resident CTA
RING_BYTES = 200 * 1024  # the heuristic's ring, all CTAs of an SM together
MAX_STAGES = 16
RING_VALUES = 32  # fp32 state values a consumer thread holds (the heuristic's KS): 128 bytes, bf16 64 values
ROW_BYTES = 256  # the heuristic's tile row: at least this many bytes of a state row (BV columns)
BAR_CONSUMERS = 1  # named barrier of the consumer warps (0 is __syncthreads)
# one item a CTA (ITEM_GRID) with 3 stages from this many items (B * Hk): the producer has 3 of an item's tiles in
# flight from the start. H200, graph-replayed, Qwen3-Next fp32, us, 2 / 3 stages (session 20, calls 8-9): B=32
# 38.02-38.04 / 38.60, B=64 73.02 / 73.49, B=128 142.42 / 142.07, B=256 279.45-279.89 / 278.53-279.02. B is a host
# value: a CUDA graph captures the one kernel its B takes.
STAGES3_FROM = 2048


@dataclasses.dataclass(frozen=True)
class DecodeRingCfg:
    """Launch config = compile key (with the argument dtypes).

    Hk, R (= Hv/Hk), dk, dv, W: the static dims; state_bytes: the state's element size (4 fp32,
    2 bf16); BV: state columns a tile (the TMA box is (BV, dk)); VEC: adjacent columns a thread (one
    VEC-wide smem read and global store a row); STAGES: tiles in the ring; CONSUMERS: math threads
    (whole warps; plus one producer warp); CPS: CTAs an SM (ptxas bound to that many, their rings share the
    SM's shared memory; without ITEM_GRID the grid is SMs * CPS at most); STREAM: the state's stores
    .cs (streaming); has_idx: state_indices given; PF: each consumer thread loads its conv channels' inputs
    (x, old window, taps) and its head's gate inputs of the CTA's next item into registers right after this
    item's prologue, so their dependent global loads (state_indices, then conv_state) overlap this item's tiles
    instead of stalling the next prologue; AHEAD (with PF): no PF load stalls its thread: the slot the conv windows'
    addresses need was loaded an item earlier still (two items ahead; the producer's one item ahead), the gate inputs
    stay in their dtype until used (a conversion right after the load waited for it; Nsight, B=256 fp32 without it:
    35% of the warps' stall cycles on global-load scoreboards). HOIST: the 2 RPT values of k and q' a thread's rows
    need are the same in every tile of an item: computed once after the norms (cute_decode._row_kq) instead of
    read from shared memory and scaled three times a tile. ITEM_GRID: one item a CTA (grid B * Hk) instead of
    persistent CTAs (grid SMs * CPS): same kernel, only the launch's grid differs."""

    Hk: int
    R: int
    dk: int
    dv: int
    W: int
    state_bytes: int = 4
    BV: int = 64
    VEC: int = 4
    STAGES: int = 6
    CONSUMERS: int = 128
    CPS: int = 1
    STREAM: bool = False
    has_idx: bool = True
    PF: bool = True  # the next item's prologue inputs loaded into registers before this item's tiles
    AHEAD: bool = True  # PF's slot loaded an item earlier still (no stall on it), its gate inputs kept raw
    HOIST: bool = True  # a thread's rows' k rk and q' computed once an item (registers), not read every tile
    SKELETON: int = 0  # probe only, wrong results: 1 each tile stored back unchanged (no delta rule), 2 also no
    #                    prologue
    ITEM_GRID: bool = False  # grid B * Hk (one item a CTA), else persistent (SMs * CPS)
    FENCE: bool = True  # fence.proxy.async before a consumer warp releases a stage; False: probe only (SKELETON > 0)
    PDL: bool = False  # a programmatic dependent launch: the CTAs start (shared memory, barriers) while the kernel
    #                    before them in the stream finishes, and wait for its end (griddepcontrol.wait) before any
    #                    global access; each CTA lets the next kernel launch at its start

    def __post_init__(self):
        es = self.state_bytes
        bad = []
        if self.W < 2:
            bad.append("W >= 2")
        if self.R < 1 or self.Hk < 1:
            bad.append("Hk >= 1 and Hv a multiple of Hk")
        if not 1 <= self.dk <= 256:
            bad.append("dk <= 256 (the TMA box's rows)")
        if es not in (2, 4):
            bad.append("a 2- or 4-byte state (bf16, fp32)")
        if not 1 <= self.BV <= 256 or self.BV * es % 16:
            bad.append("BV <= 256 columns of a multiple of 16 bytes (the TMA box)")
        if self.dv < 1 or self.dv * es % 16:
            bad.append("dv * element size a multiple of 16 bytes (the TMA row stride)")
        if self.VEC not in (1, 2, 4, 8) or self.BV % self.VEC or self.dv % self.VEC:
            bad.append("VEC in 1, 2, 4, 8 dividing BV and dv")
        elif self.G % 32 and 32 % self.G:
            bad.append("BV / VEC dividing or a multiple of 32")
        elif self.CONSUMERS % 32 or self.CONSUMERS % self.G or not 32 <= self.CONSUMERS <= 992:
            bad.append("CONSUMERS whole warps (<= 992), a multiple of BV / VEC")
        if self.STAGES < 2 or self.CPS < 1 or self.smem_bytes > SMEM_CTA or \
                self.CPS * (self.smem_bytes + 1024) > SMEM_SM:
            bad.append(f"STAGES >= 2, CPS >= 1, {self.smem_bytes} bytes of shared memory a CTA <= {SMEM_CTA} and "
                       f"CPS x (that + 1024) <= {SMEM_SM}")
        if not self.FENCE and not self.SKELETON:
            bad.append("FENCE (a stage released unfenced can be refilled under its readers; off only in SKELETON "
                       "probes)")
        if self.PF and self.R > self.CONSUMERS:
            bad.append("PF: Hv / Hk <= CONSUMERS (one consumer thread a value head's gates)")
        if bad:
            raise ValueError(f"gdn_decode cute ring: config {self} needs " + "; ".join(bad))

    @property
    def Hv(self) -> int:
        return self.Hk * self.R

    @property
    def G(self) -> int:
        """Column groups (threads) a row part."""
        return self.BV // self.VEC

    @property
    def KS(self) -> int:
        """Row parts (threads a column group)."""
        return self.CONSUMERS // self.G

    @property
    def PW(self) -> int:
        """Row parts a warp (their partial sums: butterfly shuffles; KS / PW warps' through smem)."""
        return max(1, 32 // self.G)

    @property
    def RPT(self) -> int:
        return CU.cdiv(self.dk, self.KS)

    @property
    def NCB(self) -> int:
        return CU.cdiv(self.dv, self.BV)

    @property
    def threads(self) -> int:
        return self.CONSUMERS + 32

    @property
    def tile_bytes(self) -> int:
        """What one TMA box writes (and the full barrier counts), columns past dv included."""
        return self.dk * self.BV * self.state_bytes

    @property
    def stage_elems(self) -> int:
        """Elements between stages (a stage 128-byte aligned)."""
        return CU.cdiv(self.tile_bytes, 128) * 128 // self.state_bytes

    @property
    def smem_bytes(self) -> int:
        """The CTA's shared memory: the ring, q|k, v (+ the last tile's columns past dv), gates, the two
        exchange buffers, the norms' partials, the mbarriers, alignment."""
        small = 2 * self.dk + self.R * self.dv + self.NCB * self.BV + 2 * self.R
        small += 2 * 2 * (self.KS // self.PW) * self.BV + 3 * (self.CONSUMERS // 32)
        return self.STAGES * self.stage_elems * self.state_bytes + 4 * small + 16 * self.STAGES + 1024 + 256

    @classmethod
    @functools.lru_cache(maxsize=256)
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, state_bytes: int = 4, has_idx: bool = True,
                  CPS: int = 2) -> DecodeRingCfg:
        """From the static dims and the state's element size only (never B or N): VEC as the register
        kernel's (16 bytes fp32, 8 bf16, halved until it divides dv); BV columns for ROW_BYTES (256) of a
        state row (fp32 64, bf16 128: a 32 KiB tile at dk 128), halved while half still covers dv (16-byte TMA
        rows); KS row parts so a thread holds at most 128 bytes of state (RING_VALUES fp32 values, twice that
        bf16; Qwen3-Next fp32: KS 16, 256 consumer threads, 8 rows of 4; bf16: KS 8, 256 threads, 16 rows of 4);
        CPS CTAs an SM (2; 1 where 2 x (CONSUMERS + 32) > 576 threads would cap ptxas below ~110 registers, or
        where a thread holds more than RING_VALUES values: bf16's 64 take ~166 registers);
        2 stages a CTA at CPS 2 (with PF, H200 call 17, us, 2 / 3 (fp32) or 6 (bf16) stages: fp32 B=32 37.85 /
        38.01, B=64 74.94 / 76.39, B=256 288.69 / 290.69; bf16 B=32 16.00 / 17.16, B=256 175.28 / 178.96), else as
        many as fit in RING_BYTES (at most MAX_STAGES), except 2 for bf16 (the config measured).
        bf16 (session 18, H200, Qwen3-Next, us at B = 32 / 256): 128 columns, 256 consumers, 1 CTA an SM, 2 stages
        15.87 / 157.63, against 15.58 / 174.46 for the fp32 layout (64 columns: 128-byte row pieces); 512 consumers
        (32 values) 21.35 / 155.11. Tiles of 128-byte row pieces stream worse: the ring's memory pattern alone (no
        math) 161.48 us at 64 columns, 142.90 at 128. fp32 at 128 columns (1 CTA, 256 / 512 consumers) 293.4 /
        294.1 us at B=256 against 288.8.
        ITEM_GRID where CPS is 2 (fp32; session 20, H200, graph-replayed, Qwen3-Next fp32, us, one item a CTA /
        persistent: B=32 38.02 / 38.43, B=64 73.02 / 75.95, B=128 142.42 / 148.54, B=256 279.45 / 288.97; the memory
        pattern alone 269.98 / 274.73 at B=256: the hardware's block scheduler keeps the CTAs' items together and
        balances the last wave); bf16 (1 CTA an SM) stays persistent (157.63 / 162.81 one item a CTA at B=256).
        Why: the consumers are the bound, not the ring (session 17, H200, graph-replayed, Qwen3-Next fp32
        B=256: 1 CTA of 128 consumers and 6 stages 345 us, 2 CTAs of 128 300, 1 of 256 315, 2 of 256 294-296,
        1 of 512 335; each item's prologue waits on dependent global loads, which more resident consumer warps
        in more CTAs overlap; benchmarks/results/gdn.md).
        Raises ValueError (naming "gdn_decode cute ring" and the limit) where the kernel cannot run."""
        if W < 2 or Hk < 1 or Hv % Hk:
            raise ValueError(f"gdn_decode cute ring: needs W >= 2 and Hv a multiple of Hk (W={W}, Hk={Hk}, Hv={Hv})")
        VEC = max(1, VEC_BYTES.get(state_bytes, state_bytes) // state_bytes)
        while dv % VEC:
            VEC //= 2
        BV = max(64, ROW_BYTES // state_bytes)
        while BV // 2 >= max(dv, VEC) and BV // 2 * state_bytes % 16 == 0:
            BV //= 2
        G = BV // VEC
        PW = max(1, 32 // G)
        values = RING_VALUES * 4 // state_bytes
        KS = CU.cdiv(CU.cdiv(dk * VEC, values), PW) * PW
        if CPS > 1 and (CPS * (G * KS + 32) > 576 or values > RING_VALUES):
            CPS = 1
        base = cls(Hk=Hk, R=Hv // Hk, dk=dk, dv=dv, W=W, state_bytes=state_bytes, BV=BV, VEC=VEC, STAGES=2,
                   CONSUMERS=G * KS, CPS=CPS, has_idx=has_idx, ITEM_GRID=CPS > 1)
        if CPS > 1 or state_bytes == 2:  # 2 stages: CPS 2 (session 17, call 17, persistent CTAs: faster than 3 / 6
            return base                  # in every cell; ring_config takes 3 from STAGES3_FROM items since session
            #                              20's one item a CTA), bf16 (session 18, as measured)
        for stages in range(min(MAX_STAGES, RING_BYTES // CPS // (base.stage_elems * state_bytes)), 2, -1):
            try:  # the most that fit beside the CTA's other buffers
                return dataclasses.replace(base, STAGES=stages)
            except ValueError:
                pass
        return base


# A/B configs beside the heuristic's (benchmarks/gdn_decode_check.py --ring-variants times them, the tests
# compile and check them): name -> (state element size it is for, or None for any; changes to the heuristic's
# config). STAGES: ring depth; BV: columns a tile; CONSUMERS: math threads; CPS: CTAs an SM (their rings share
# its shared memory); STREAM: .cs state stores.
VARIANTS = {
    "nopf": (None, {"PF": False}), "noahead": (None, {"AHEAD": False}),
    "nohoist": (None, {"HOIST": False}), "s3": (4, {"STAGES": 3}), "bv32": (None, {"BV": 32}),
    "c128": (4, {"CONSUMERS": 128}),
    "cps1": (4, {"CPS": 1, "STAGES": 6}), "stream": (None, {"STREAM": True}),
    "first": (4, {"CPS": 1, "CONSUMERS": 128, "STAGES": 6}),  # the ring's first heuristic (fp32)
    "bf16-cps1": (2, {"BV": 64, "CPS": 1, "STAGES": 12}), "bf16-s4": (2, {"STAGES": 4}), "bf16-s6": (2, {"STAGES": 6}),
    "bf16-first": (2, {"BV": 64, "CPS": 1, "CONSUMERS": 128, "STAGES": 12}),
    "bf16-s17": (2, {"BV": 64, "CONSUMERS": 256, "CPS": 2, "STAGES": 2}),  # session 17's bf16 heuristic
    "bf16-c512": (2, {"CONSUMERS": 512}),
    "persistent": (4, {"ITEM_GRID": False}),  # the fp32 grid before session 20
    "pdl": (None, {"PDL": True}),
}


def variant_cfg(name: str, Hk: int, Hv: int, dk: int, dv: int, W: int, state_bytes: int = 4,
                has_idx: bool = True) -> DecodeRingCfg | None:
    """The heuristic's config with VARIANTS[name]'s changes, or ``"KEY=V,KEY=V"`` (any DecodeRingCfg
    fields, ints or True/False); None where the variant is for the other state dtype."""
    if name in VARIANTS:
        want, ch = VARIANTS[name]
        if want not in (None, state_bytes):
            return None
    else:
        ch = {}
        for kv in name.split(","):
            k, v = kv.split("=")
            ch[k.strip()] = {"True": True, "False": False}.get(v.strip()) if v.strip() in ("True", "False") \
                else int(v)
    return dataclasses.replace(DecodeRingCfg.heuristic(Hk, Hv, dk, dv, W, state_bytes, has_idx), **ch)


# ------------------------------------------------------------------ device code


def _chan(cfg, c: int, t, kh):
    """mixed / conv_state channel of a consumer thread's conv slot ``c`` (the cdiv(2 dk, NT) q|k slots, then
    the cdiv(R dv, NT) v slots; thread t's channels t, t + NT, ..) of key head ``kh``, clamped to the last real
    channel (a slot past the count loads that one and uses nothing)."""
    NT, dk, Hk, R, dv = cfg.CONSUMERS, cfg.dk, cfg.Hk, cfg.R, cfg.dv
    NQ = CU.cdiv(2 * dk, NT)
    if c < NQ:
        ch = cutlass.min(t + c * NT, 2 * dk - 1)
        return (ch // dk) * (Hk * dk) + kh * dk + ch % dk
    return 2 * Hk * dk + kh * (R * dv) + cutlass.min(t + (c - NQ) * NT, R * dv - 1)


@cute.jit
def _item_slot(cfg: cutlass.Constexpr, idx: cute.Pointer, b, nb, held: cute.Tensor, k: cutlass.Constexpr):
    """The state slot of row b (b itself without state_indices, else state_indices[b]). AHEAD: the value in
    held[k] (loaded by the call an item before, or before the first call), and row nb's slot loaded into held[k]
    for the next call, so no branch on a slot waits for its load (producer and consumers alike)."""
    s = Int32(b)
    if cutlass.const_expr(cfg.has_idx):
        if cutlass.const_expr(cfg.AHEAD):
            s = held[k]
            held[k] = _vec(idx, Int64(nb), 1)[0]
        else:
            s = _vec(idx, Int64(b), 1)[0]
    return s


@cute.jit
def _prefetch(cfg: cutlass.Constexpr, it, t, mixed: cute.Pointer, conv: cute.Pointer, cw: cute.Pointer,
              A_log: cute.Pointer, dt_bias: cute.Pointer, idx: cute.Pointer, px: cute.Tensor, pcv: cute.Tensor,
              pw: cute.Tensor, pg: cute.Tensor, pgm: cute.Tensor, pslot: cute.Tensor, nxt, B):
    """PF: item ``it``'s prologue inputs of consumer thread t into registers: pslot[0] its slot; for a slot
    >= 0 px / pcv / pw the x, old window and taps of each of its conv slots, pg the dt_bias and A_log and pgm
    the b, a (mixed's dtype) of value head kh R + min(t, R - 1). Only this CTA touches the item's windows, so
    loading them an item early reads what the item would read. AHEAD: pslot[1] holds ``it``'s slot (loaded by
    the call an item before; the caller loads the first) and gets item ``nxt``'s (the CTA's item after ``it``;
    its row clamped to B - 1 past the end)."""
    Hk, R, dk, dv, W = cfg.Hk, cfg.R, cfg.dk, cfg.dv, cfg.W
    Hv = Hk * R
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    NC = CU.cdiv(2 * dk, cfg.CONSUMERS) + CU.cdiv(R * dv, cfg.CONSUMERS)
    b_ = it // Hk
    kh_ = it - b_ * Hk
    s_ = _item_slot(cfg, idx, b_, cutlass.min(nxt // Hk, B - 1), pslot, 1)
    pslot[0] = s_
    if s_ >= 0:
        xr = Int64(b_) * D
        cr = Int64(s_) * (C * (W - 1))
        for c in cutlass.range_constexpr(NC):
            g = _chan(cfg, c, t, kh_)
            px[c, 0] = _vec(mixed, xr + g, 1)[0]
            cv_ = _vec(conv, cr + Int64(g) * (W - 1), W - 1)
            w_ = _vec(cw, Int64(g) * W, W)
            for q in cutlass.range_constexpr(W - 1):
                pcv[c, q] = cv_[q]
            for q in cutlass.range_constexpr(W):
                pw[c, q] = w_[q]
        hv_ = kh_ * R + cutlass.min(t, R - 1)
        gb = 2 * Hk * dk + 2 * Hv * dv
        if cutlass.const_expr(cfg.AHEAD):
            pgm[0] = _vec(mixed, xr + (gb + hv_), 1)[0]
            pgm[1] = _vec(mixed, xr + (gb + Hv + hv_), 1)[0]
        else:
            pg[0] = _vec(mixed, xr + (gb + hv_), 1)[0].to(Float32)
            pg[1] = _vec(mixed, xr + (gb + Hv + hv_), 1)[0].to(Float32)
        pg[2] = _vec(dt_bias, Int64(hv_), 1)[0]
        pg[3] = _vec(A_log, Int64(hv_), 1)[0]


@cute.kernel
def _ring_kernel(cfg: cutlass.Constexpr, tma: cute.CopyAtom, mS: cute.Tensor, mixed: cute.Pointer,
                 conv: cute.Pointer, cw: cute.Pointer, A_log: cute.Pointer, dt_bias: cute.Pointer,
                 ssm: cute.Pointer, idx: cute.Pointer, o: cute.Pointer, B: Int32, eps: Float32, scale: Float32):
    Hk, R, dk, dv, W, BV, VEC, S = cfg.Hk, cfg.R, cfg.dk, cfg.dv, cfg.W, cfg.BV, cfg.VEC, cfg.STAGES
    Hv, NCB, NT, KS, RPT, G = cfg.Hv, cfg.NCB, cfg.CONSUMERS, cfg.KS, cfg.RPT, cfg.G
    KW = KS // cfg.PW
    SE = cfg.stage_elems
    D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    C = 2 * Hk * dk + Hv * dv
    TILES = R * NCB

    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    nctas, _, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    items = B * Hk

    smem = SmemAllocator()
    ring = smem.allocate_tensor(ssm.dtype, cute.make_layout((BV, dk, S), stride=(1, BV, SE)), byte_alignment=1024)
    qk = smem.allocate_tensor(Float32, cute.make_layout(2 * dk), 16)  # raw y of q | k
    qs = cute.make_tensor(qk.iterator, cute.make_layout(dk))
    ks = cute.make_tensor(qk.iterator + dk, cute.make_layout(dk))
    vs = smem.allocate_tensor(Float32, cute.make_layout(R * dv + NCB * BV), 16)  # y of the item's v channels
    gate = smem.allocate_tensor(Float32, cute.make_layout((R, 2), stride=(2, 1)), 16)  # beta, alpha a head
    red = smem.allocate_tensor(Float32, cute.make_layout(2 * KW * BV * 2), 16)  # two exchange buffers
    wsum = smem.allocate_tensor(Float32, cute.make_layout((NT // 32, 3), stride=(3, 1)), 16)
    pipe = CU.tma_pipeline(smem, S, cfg.tile_bytes, NT // 32)
    if cutlass.const_expr(cfg.PDL):  # nothing above read or wrote global memory
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()

    if warp == NT // 32:
        # ---- producer warp: every tile of the CTA's items, in the consumers' order (TMA elects a lane)
        CU.prefetch_tma(tma)
        tSs, tSg = CU.tma_tiles(tma, ring, mS, (BV, dk))  # (tile, column block, head row block)
        pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, S)
        nslot = cute.make_rmem_tensor((1,), Int32)  # AHEAD: the slot of the CTA's next item
        if cutlass.const_expr(cfg.has_idx and cfg.AHEAD):
            nslot[0] = _vec(idx, Int64(cutlass.min(bid // Hk, B - 1)), 1)[0]
        for item in cutlass.range(bid, items, nctas, unroll=1):
            b = item // Hk
            kh = item - b * Hk
            slot = _item_slot(cfg, idx, b, cutlass.min((item + nctas) // Hk, B - 1), nslot, 0)
            if slot >= 0:
                for tl in cutlass.range(TILES, unroll=1):
                    r = tl // NCB
                    pipe.producer_acquire(pst)
                    cute.copy(tma, tSg[None, tl - r * NCB, slot * Hv + kh * R + r], tSs[None, pst.index],
                              tma_bar_ptr=pipe.producer_get_barrier(pst))
                    pst.advance()
        pipe.producer_tail(pst)
    else:
        # ---- consumers
        t = tidx
        p = t // G
        j0 = (t % G) * VEC  # this thread's first column in the tile
        sync = functools.partial(cute.arch.barrier, barrier_id=BAR_CONSUMERS, number_of_threads=NT)
        cst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, S)
        NQ, NV = CU.cdiv(2 * dk, NT), CU.cdiv(R * dv, NT)  # a thread's q|k and v conv channel slots
        # PF: the item's prologue inputs, loaded an item ahead (:func:`_prefetch`)
        px = cute.make_rmem_tensor((NQ + NV, 1), mixed.dtype)
        pcv = cute.make_rmem_tensor((NQ + NV, W - 1), conv.dtype)
        pw = cute.make_rmem_tensor((NQ + NV, W), cw.dtype)
        pg = cute.make_rmem_tensor((4,), Float32)
        pgm = cute.make_rmem_tensor((2,), mixed.dtype)
        pslot = cute.make_rmem_tensor((2,), Int32)  # this item's slot; AHEAD: the next item's
        if cutlass.const_expr(cfg.PF):
            if bid < items:
                if cutlass.const_expr(cfg.has_idx and cfg.AHEAD):
                    pslot[1] = _vec(idx, Int64(bid // Hk), 1)[0]
                _prefetch(cfg, bid, t, mixed, conv, cw, A_log, dt_bias, idx, px, pcv, pw, pg, pgm, pslot,
                          bid + nctas, B)
        for item in cutlass.range(bid, items, nctas, unroll=1):
            b = item // Hk
            kh = item - b * Hk
            slot = Int32(b)
            if cutlass.const_expr(cfg.PF):
                slot = pslot[0]
            elif cutlass.const_expr(cfg.has_idx):
                slot = _vec(idx, Int64(b), 1)[0]
            obase = Int64(b) * (Hv * dv) + kh * (R * dv)
            if slot < 0:  # padded row: o = 0 for the item's heads; no state, no tiles
                for c in cutlass.range_constexpr(CU.cdiv(R * dv, NT)):
                    ch = t + c * NT
                    if ch < R * dv:
                        _vec(o, obase + ch, 1)[0] = o.dtype(0.0)
            elif cutlass.const_expr(cfg.SKELETON < 2):
                sync()  # the previous item's readers of qk, vs, gate, wsum are done
                crow = Int64(slot) * (C * (W - 1))
                if cutlass.const_expr(cfg.PF):
                    # the prefetched channels: silu(conv) into smem (_silu_conv's op order), the shifted
                    # window written back; the gates of head t
                    for c in cutlass.range_constexpr(NQ + NV):
                        ch = t + (c if c < NQ else c - NQ) * NT
                        if ch < (2 * dk if c < NQ else R * dv):
                            x_, cv_ = px[c, None], pcv[c, None]
                            y = _silu_conv(x_, cv_, pw[c, None], W)
                            _put_window(_vec(conv, crow + Int64(_chan(cfg, c, t, kh)) * (W - 1), W - 1),
                                        _shifted(x_, cv_, W), W)
                            if cutlass.const_expr(c < NQ):
                                qk[ch] = y
                            else:
                                vs[ch] = y
                    if t < R:
                        bb, aa = pg[0], pg[1]
                        if cutlass.const_expr(cfg.AHEAD):
                            bb, aa = pgm[0].to(Float32), pgm[1].to(Float32)
                        beta, alpha = _gate_math(bb, aa, pg[2], pg[3])
                        gate[t, 0] = beta
                        gate[t, 1] = alpha
                else:
                    xrow = Int64(b) * D
                    # q|k channels of key head kh, then the item's v channels: y into smem, windows shifted
                    for c in cutlass.range_constexpr(NQ):
                        ch = t + c * NT
                        if ch < 2 * dk:
                            y, cv, nw = _conv_step(mixed, conv, cw, xrow, crow,
                                                   (ch // dk) * (Hk * dk) + kh * dk + ch % dk, W)
                            _put_window(cv, nw, W)
                            qk[ch] = y
                    for c in cutlass.range_constexpr(NV):
                        ch = t + c * NT
                        if ch < R * dv:
                            y, cv, nw = _conv_step(mixed, conv, cw, xrow, crow, 2 * Hk * dk + kh * (R * dv) + ch, W)
                            _put_window(cv, nw, W)
                            vs[ch] = y
                    for c in cutlass.range_constexpr(CU.cdiv(R, NT)):
                        r = t + c * NT
                        if r < R:
                            beta, alpha = _gates(mixed, A_log, dt_bias, xrow, kh * R + r, 2 * Hk * dk + 2 * Hv * dv, Hv)
                            gate[r, 0] = beta
                            gate[r, 1] = alpha
                sync()
            if cutlass.const_expr(cfg.PF):  # the next item's inputs, in flight during this item's tiles
                if item + nctas < items:
                    _prefetch(cfg, item + nctas, t, mixed, conv, cw, A_log, dt_bias, idx, px, pcv, pw, pg, pgm,
                              pslot, item + 2 * nctas, B)
            if slot >= 0:
                rq, rk, kq = Float32(1.0), Float32(1.0), Float32(0.0)
                if cutlass.const_expr(cfg.SKELETON < 2):
                    rq, rk, kq = _qk_norms(qs, ks, wsum, t, NT, dk, eps, scale, sync)
                kqr = None
                if cutlass.const_expr(cfg.HOIST and cfg.SKELETON == 0):
                    kqr = cute.make_rmem_tensor((RPT, 2), Float32)
                    _row_kq(cfg, qs, ks, rq, rk, scale, p, kqr)
                for tl in cutlass.range(TILES, unroll=1):
                    r = tl // NCB
                    col = (tl - r * NCB) * BV + j0
                    hv = kh * R + r
                    # the stage into registers, then release it at once (the producer refills it)
                    pipe.consumer_wait(cst)
                    sp = ring.iterator + (cst.index * SE + p * BV + j0)
                    s = cute.make_rmem_tensor((RPT, VEC), Float32)
                    for rr in cutlass.range_constexpr(RPT):
                        roff = KS * rr * BV
                        if cutlass.const_expr(dk % KS != 0):  # rows past dk: row dk-1 (zero weights)
                            roff = (cutlass.min(p + KS * rr, dk - 1) - p) * BV
                        vals = _ld_state(sp, roff, VEC, False)
                        for e in cutlass.range_constexpr(VEC):
                            s[rr, e] = vals[e].to(Float32)
                    CU.release_read_stage(pipe, cst, cfg.FENCE)
                    buf = red.iterator + (cst.count % 2) * (KW * BV * 2)
                    cst.advance()
                    if cutlass.const_expr(cfg.SKELETON > 0):  # the memory pattern alone: the tile stored back
                        stp = ssm + (Int64(slot) * (Hv * dk * dv) + Int64(hv * dk * dv) + Int64(p * dv + col))
                        for rr in cutlass.range_constexpr(RPT):
                            if col < dv and p + KS * rr < dk:
                                _st_state(stp, KS * rr * dv, [s[rr, e] for e in range(VEC)], VEC, cfg.STREAM)
                    else:
                        vcol = cute.make_tensor(vs.iterator + (r * dv + col - j0), cute.make_layout(BV))
                        _delta_tile(cfg, s, qs, ks, vcol,
                                    cute.make_tensor(buf, cute.make_layout((KW, BV, 2), stride=(BV, 1, KW * BV))),
                                    _vec(o, Int64(b) * (Hv * dv) + hv * dv, dv), ssm,
                                    Int64(slot) * (Hv * dk * dv) + Int64(hv * dk * dv), rq, rk, scale, gate[r, 1],
                                    gate[r, 0], kq, p, j0, col, sync, kqr)


@cute.jit
def _ring_host(cfg: cutlass.Constexpr, mixed: cute.Pointer, conv: cute.Pointer, cw: cute.Pointer,
               A_log: cute.Pointer, dt_bias: cute.Pointer, ssm: cute.Pointer, idx: cute.Pointer, o: cute.Pointer,
               B: Int32, rows: Int32, ctas: Int32, eps: Float32, scale: Float32, stream: CU.cuda.CUstream):
    # the state as [rows = N * Hv * dk, dv] row-major, seen (dv, rows): TMA boxes (BV, dk), zeros past dv
    mS = cute.make_tensor(ssm, cute.make_layout((cfg.dv, rows), stride=(1, cfg.dv)))
    tma, tS = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mS,
                                          cute.make_layout((cfg.BV, cfg.dk), stride=(1, cfg.BV)), (cfg.BV, cfg.dk))
    _ring_kernel(cfg, tma, tS, mixed, conv, cw, A_log, dt_bias, ssm, idx, o, B, eps, scale).launch(
        grid=[ctas, 1, 1], block=[cfg.threads, 1, 1], stream=stream, min_blocks_per_mp=cfg.CPS,
        preferred_smem_carveout=100, use_pdl=cfg.PDL)


# ------------------------------------------------------------------ host side


@functools.lru_cache(maxsize=256)
def _launch(cfg: DecodeRingCfg, mdt: torch.dtype, wdt: torch.dtype, sdt: torch.dtype) -> CU.Launch:
    e = mdt.itemsize
    sig = (CU.Ptr(mdt, e), CU.Ptr(mdt, e), CU.Ptr(wdt, wdt.itemsize),
           CU.Ptr(torch.float32, 4), CU.Ptr(torch.float32, 4), CU.Ptr(sdt, 16), CU.Ptr(torch.int32, 4),
           CU.Ptr(mdt, e), CU.Scalar(Int32), CU.Scalar(Int32), CU.Scalar(Int32), CU.Scalar(Float32),
           CU.Scalar(Float32))
    return CU.Launch(f"{_NAME}.decode", _ring_host, cfg, sig)


def ring_config(mixed, conv_state, conv_weight, ssm_state, state_indices, Hk: int) -> DecodeRingCfg | None:
    """The heuristic's config for these tensors (3 stages from STAGES3_FROM items with ITEM_GRID), or None where
    the ring kernel's limits do not hold (state dtype, 16-byte aligned state, dk <= 256, 16-byte rows,
    N * Hv * dk < 2^31, shared memory)."""
    N, Hv, dk, dv = ssm_state.shape
    if ssm_state.dtype not in (torch.float32, torch.bfloat16) or ssm_state.data_ptr() % 16:
        return None
    if N * Hv * dk >= 2 ** 31 or Hv * dk * dv >= 2 ** 31:
        return None
    try:
        cfg = DecodeRingCfg.heuristic(Hk, Hv, dk, dv, conv_weight.shape[1], ssm_state.element_size(),
                                      state_indices is not None)
    except ValueError:
        return None
    return _stages3(cfg) if cfg.ITEM_GRID and mixed.shape[0] * Hk >= STAGES3_FROM else cfg


@functools.lru_cache(maxsize=256)
def _stages3(cfg: DecodeRingCfg) -> DecodeRingCfg:
    """cfg with 3 stages where they fit beside the CTA's buffers (cached: ring_config runs every decode step)."""
    if cfg.STAGES != 2:
        return cfg
    try:
        return dataclasses.replace(cfg, STAGES=3)
    except ValueError:
        return cfg


def ring_fits(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o, Hk: int, *_) -> bool:
    """Whether the ring kernel runs this call (cute_decode's dispatch; arguments as the fwd kernel's)."""
    return ring_config(mixed, conv_state, conv_weight, ssm_state, state_indices, Hk) is not None


def decode_launch(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o,
                  Hk: int = 16, eps: float = 1e-6, scale: float | None = None,
                  cfg: DecodeRingCfg | None = None, ctas: int | None = None) -> CU.BoundLaunch:
    """The one launch of a decode step (argument order as the registry's fwd kernel, cute_decode's
    ``decode_launch``); grid B * Hk (cfg.ITEM_GRID) or min(B * Hk, SMs * CPS), or ``ctas`` CTAs where given
    (tests: few CTAs, each walking many items). B = 0: an empty grid, never to be run (``decode_ring_into``
    launches nothing)."""
    B = mixed.shape[0]
    N, Hv, dk, dv = ssm_state.shape
    W = conv_weight.shape[1]
    has_idx = state_indices is not None
    if cfg is None:
        cfg = ring_config(mixed, conv_state, conv_weight, ssm_state, state_indices, Hk)
        if cfg is None:
            DecodeRingCfg.heuristic(Hk, Hv, dk, dv, W, ssm_state.element_size(), has_idx)  # raises if it cannot
            raise ValueError(f"gdn_decode cute ring: needs a 16-byte aligned fp32 or bf16 ssm_state with "
                             f"N * Hv * dk < 2^31, got {ssm_state.dtype} at address % 16 = "
                             f"{ssm_state.data_ptr() % 16}, N * Hv * dk = {N * Hv * dk}")
    if ssm_state.data_ptr() % 16:
        raise ValueError("gdn_decode cute ring: ssm_state's address must be a multiple of 16 bytes (TMA)")
    if (cfg.Hk, cfg.Hv, cfg.dk, cfg.dv, cfg.W, cfg.has_idx, cfg.state_bytes) != \
            (Hk, Hv, dk, dv, W, has_idx, ssm_state.element_size()):
        raise ValueError(f"gdn_decode cute ring: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, dv={dv}, "
                         f"W={W}, a {ssm_state.element_size()}-byte state, state_indices "
                         f"{'given' if has_idx else 'absent'}")
    scale = float(dk ** -0.5 if scale is None else scale)
    ctas = min(B * Hk, ctas or (B * Hk if cfg.ITEM_GRID else sm_count(ssm_state.device) * cfg.CPS))
    ln = _launch(cfg, mixed.dtype, conv_weight.dtype, ssm_state.dtype)
    idx = state_indices if has_idx else A_log  # never read without state_indices
    return CU.BoundLaunch(ln, (mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, idx, o, B, N * Hv * dk,
                               ctas, float(eps), scale), (ctas, 1, 1))


# gdn_decode fwd, destination-passing, the registry's signature (cute_decode.decode_into's): o [B, Hv, dv]
# written, conv_state and ssm_state updated in place; B = 0 launches nothing
decode_ring_into = launch_into(decode_launch)
ring_launch = decode_launch


def representative_launch(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                          dtype=torch.bfloat16, state_dtype=torch.float32, with_indices: bool = True,
                          cfg: DecodeRingCfg | None = None) -> CU.Launch:
    """The launch at one head shape, for the CPU compile test (``Launch.export("sm_90a")``)."""
    cfg = cfg or DecodeRingCfg.heuristic(Hk, Hv, dk, dv, W, state_dtype.itemsize,
                                         with_indices)
    return _launch(cfg, dtype, dtype, state_dtype)
