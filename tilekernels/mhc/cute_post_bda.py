"""CuTe DSL kernels for mhc_h_post_bda, fwd and bwd (SIMT, Hopper sm_90a; compiles for sm_100a).

out[t,i,c] = sum_j h_res[t,i,j] residual[t,j,c] + h_post[t,i] * (x[t,c] + bias[c])

h_res [T, n, n] and h_post [T, n] bf16 or fp32; residual [T, n, C] and x [T, C] bf16 or fp32
(one dtype); bias [C] in x's dtype or fp32, optional; all contiguous; fp32 math. The backward
(dout [T, n, C]) writes dresidual [T, n, C] and dx [T, C] in the activations' dtype, dh_res
[T, n, n] and dh_post [T, n] in h's dtype (per token, reduced over C), dbias [C] in bias's dtype
(dx reduced over T in fp32); deterministic (fixed-order sums, no atomics).

Mapping (:class:`PostBdaCuteCfg`): a "chunk" is V adjacent channels (one vector access of VB
bytes: 16 for n <= 4, 8 above, where 16 would need too many registers), so C % V == 0 (the
spec's C % 8 == 0). A thread always takes the same V channels of all n streams of one token:
residual / dout rows t*n .. t*n+n-1 at those channels (n vector loads), x (and bias) at them.

* fwd, grid (T, ceil(CH / (NT * KF))), CH = C / V chunks: a CTA of NT threads takes one token,
  thread tid chunks (by * KF + k) * NT + tid, k < KF; h_res[t] and h_post[t] read once a thread
  (scalar loads, the warp's broadcast), n*n*V + n*V FMAs a chunk, n vector stores. Variants
  (fields FPF .. FCM, non-default): loads a chunk or more ahead, several tokens a CTA, vector h
  loads, load / store cache hints, a token's chunks over FSPLIT x more CTAs and, FCM, a 1-D grid
  whose adjacent CTAs take the same token's adjacent chunk groups (TE's Triton kernel's order:
  what runs at once covers a few contiguous stretches of memory, not T / 132 tokens' rows).
* bwd, one streaming pass, grid (G,) persistent over tokens t = g, g+G, ... (REV: T-1-g, T-1-g-G, ...,
  last to first: what the forward read last is still in L2 if the backward follows it): a CTA of NTB threads
  takes a whole token (thread tid its chunks k*NTB + tid, k < KC = ceil(CH / NTB)) and reads dout,
  residual and x once: dresidual[j] = sum_i h_res[t,i,j] dout[i] and dx = sum_i h_post[t,i]
  dout[i] are written from registers; the n*n + n dh partials (dout[i] * residual[j] and
  dout[i] * (x + bias) summed over the thread's channels) are summed over the warp by butterfly
  shuffles, then over the NTB/32 warps through shared memory (two buffers by turn, so one
  barrier a token) in warp order: dh_res[t], dh_post[t] written once, no scratch. dbias: each
  thread adds its fp32 dx into its own channels' slots of a [C] fp32 shared array (its slots
  only: no barrier) over all the CTA's tokens, written at the end as row g of a [G, C] fp32
  partial; a second kernel sums the G rows in a fixed order (row groups r, r+RG, ..., then the RG
  group sums in order), a programmatic dependent launch (PDL: the bwd triggers it at its start, it
  waits for the bwd grid's end; 1-2.5 us faster than a plain launch in both H200 runs of session
  14). Tokens go round-robin, so every sum's order is fixed for a given T and G (G = min(T, SMs *
  CPS)): two calls give bitwise-equal gradients.

Instruction count (bwd, n=4, bf16, per chunk of 8 channels of one token, per thread): 10 vector
loads, 5 vector stores, 80 unpacks, 320 FFMA (dres 128, dx 32, dh 160), ~20 packs, 8 shared
loads/adds/stores for dbias: ~450 instructions for 224 bytes of HBM traffic (dout, residual, x
read; dresidual, dx written), about a quarter of what the H200 issues in the time the copy
bandwidth moves them. Per token the dh reduction adds 5 * 20 shuffles + adds per thread (KC = 4
chunks at C = 7168).

Measured (H200, T=32768, n=4, C=7168, bf16 activations and bias, benchmarks/results/
h200-mhc-cute-post-bda.txt, helper H's run 2): fwd 1.030 ms (96.6% of the 4249 GB/s copy measured
in the run), bwd 1.565 / 1.576 ms with bf16 / fp32 h (98.9 / 98.3%), registry fwd+bwd 2.592 /
2.605 ms; Transformer Engine's Triton kernel in the same run (its harness, bf16 h) 0.983 / 2.901.
Tried and slower (same runs): bwd 128 threads x 7 chunks at 3 / 4 CTAs an SM (1.582 / 1.622 ms),
64 x 14 at 7 (1.826), 448 x 2 at 1 (1.691), 256 x 4 at 2 (1.721: idle chunk slots), the chunk
loop unrolled (166 registers, 3 CTAs an SM: 1.594) or unrolled twice (1.646), evict-first loads
and stores (1.666); fwd 7 CTAs a token (1.032), persistent CTAs walking the tokens at 2 / 4 / 8
an SM (1.036 at 224 threads / 1.300 / 1.125), evict-first loads and stores (1.079).
Round 2 (one H200 run, bf16 h, benchmarks/probes/mhc_cute_post_bda_fwd_sweep.py; every variant
bitwise equal to the default): default 1.032 ms; FSPLIT=7 + FCM (one chunk a thread, a token's 7
CTAs adjacent) 0.983 (registry fwd 0.981 / 0.985, fwd+bwd 2.551 / 2.561 with bf16 / fp32 h),
FSPLIT=7 without FCM 1.031 (the order is what matters), NT=32 FCM 0.987, FSPLIT=2 + FCM 1.015,
FPF=1 / 2 1.004 (121 / 147 registers), all loads first 1.149, FTOK=2 / FHV / ld.cg / st.cg
1.031-1.032, st.cs 1.035, L2::256B prefetch 1.040, FMINB=12 1.045, L1::no_allocate 1.070. The
default since (FSPLIT = KF, FCM), after its full GPU test file passed; TE in that run (the lead's)
fwd 0.980 / fwd+bwd 2.891 ms, ours 0.982 / 2.551 (bf16 h), 0.986 / 2.561 (fp32 h).

Tails: C % V == 0 (no partial vectors); chunks past CH are masked; T = 0 launches nothing (dbias
zeros). 64-bit row offsets (T * n * C may exceed 2^31). Importing this module needs ``cutlass``
but no GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import vector
from cutlass.memory.smem import SmemAllocator

from tilekernels import _cute as CU
from tilekernels._glue import aligned16, kernel

_NAME = "mhc.cute_post_bda"


def _pick_threads(chunks: int, prefer: int, cap: int = 256) -> tuple[int, int]:
    """(NT, K): NT threads (a multiple of 32, <= cap) taking K = ceil(chunks / NT) chunks each,
    with the fewest idle slots (K * NT - chunks), then the NT closest to ``prefer``."""
    best = None
    for nt in range(32, cap + 1, 32):
        k = -(-chunks // nt)
        key = (k * nt - chunks, abs(nt - prefer))
        if best is None or key < best[0]:
            best = (key, nt, k)
    return best[1], best[2]


@dataclasses.dataclass(frozen=True)
class PostBdaCuteCfg:
    """Launch config of the three kernels (compile key, with the dtypes).

    n, C: static problem dims; has_bias; V: elements per vector access; NT, KF: fwd threads a
    CTA (one token) and chunks a thread; NTB, KC: bwd threads a CTA (one token at a time) and
    chunks a thread; CPS: bwd CTAs an SM (grid = min(T, SMs * CPS), computed at launch; the
    compiled code sees it only through MINB); RG: dbias reduction row groups (RG * 32 threads a
    CTA, DBV channels a thread)."""

    n: int
    C: int
    has_bias: bool
    V: int
    NT: int
    KF: int
    NTB: int
    KC: int
    CPS: int = 4
    RG: int = 8
    DBV: int = 4   # dbias reduction: fp32 channels a thread (one DBV * 4-byte load a partial row)
    DBU: int = 4   # dbias reduction: its row loop unrolled DBU times
    UNR: int = 0   # bwd chunk loop: 0 unrolled at trace time, else a loop unrolled UNR times
    MINB: int = 0  # bwd: ptxas asked for this many CTAs an SM (caps registers; 0: no bound)
    FSTREAM: bool = False  # fwd: the activations' loads and stores evict-first (ld/st.global.cs)
    BSTREAM: bool = False  # bwd: the same
    FG: int = 0    # fwd: 0 one CTA a token (grid T); else min(T, SMs * FG) CTAs walking tokens g, g+grid, ...
    # fwd variants (round 2 A/B; the heuristic sets FSPLIT = KF and FCM, the rest stay at the round-1 kernel):
    FPF: int = 0   # fwd: chunk k + FPF's loads issued before chunk k's FMAs (FPF >= KF - 1: all loads first)
    FTOK: int = 1  # fwd: tokens a CTA (NT * FTOK threads, grid ceil(T / FTOK)); not with FG
    FLD: str = ""  # fwd activation loads: "" plain, "noalloc" (L1::no_allocate), "pf256" (L2::256B prefetch), "cg"
    FST: str = ""  # fwd output stores: "" plain, "cs" (evict-first), "cg" (L2 only)
    FHV: bool = False  # fwd: h_res[t], h_post[t] read with vector loads (h 16-byte aligned) instead of scalars
    FMINB: int = 0     # fwd: ptxas asked for this many CTAs an SM (0: no bound)
    FSPLIT: int = 1    # fwd: a token's chunks split over FSPLIT times more CTAs (FKF = ceil(KF / FSPLIT) a thread)
    FCM: bool = False  # fwd: 1-D grid, a token's CTAs adjacent (chunk groups fastest); not with FG
    WSUM: bool = True  # bwd: the dh sums over a warp by a reduce-scatter butterfly (else an all-reduce a value)
    PDL: bool = True   # bwd: the dbias reduction a programmatic dependent launch (triggered at the bwd's start,
    #                    resident beside it, it waits for the bwd grid's end and partials: griddepcontrol.wait)
    CUT: int = 0       # probe only, wrong dh_res (bwd_into refuses it): 1 dh_res's products for stream 0's row
    #                    only (4 of its n * n = 16 FMAs a channel at n = 4; residual still loaded and converted)
    REV: bool = False  # bwd: the tokens walked last to first (t = T-1-g, T-1-g-G, ...): the forward's last tokens'
    #                    residual and x, still in L2 when the backward directly follows it, are read first (the
    #                    same per-token values; dbias's partials sum other tokens: not necessarily bitwise the
    #                    default's)

    def __post_init__(self):
        if self.C % self.V or self.NT % 32 or self.NTB % 32 or self.NTB > 1024 or self.NT > 1024:
            raise ValueError(f"PostBdaCuteCfg: C % V == 0 and thread counts multiples of 32 (<= 1024): {self}")
        if self.KC * self.NTB < self.CH:
            raise ValueError(f"PostBdaCuteCfg: KC * NTB must cover the {self.CH} chunks: {self}")
        if (self.FTOK < 1 or ((self.FTOK > 1 or self.FCM) and self.FG) or self.NT * self.FTOK > 1024 or self.FPF < 0
                or self.FSPLIT < 1):
            raise ValueError(f"PostBdaCuteCfg: FTOK, FSPLIT >= 1, FTOK 1 and FCM off with FG, NT * FTOK <= 1024, "
                             f"FPF >= 0: {self}")
        if self.DBV not in (1, 2, 4) or not 1 <= self.RG <= 32 or self.DBU < 1:
            raise ValueError(f"PostBdaCuteCfg: DBV in 1, 2, 4, RG in 1..32, DBU >= 1: {self}")
        if self.FLD not in _FLD or self.FST not in ("", "cs", "cg"):
            raise ValueError(f"PostBdaCuteCfg: FLD in {sorted(_FLD)}, FST in '', 'cs', 'cg': {self}")

    @property
    def CH(self) -> int:
        return self.C // self.V

    @property
    def FKF(self) -> int:
        """fwd chunks a thread (KF split FSPLIT ways)."""
        return -(-self.KF // self.FSPLIT)

    @property
    def FCHG(self) -> int:
        """fwd CTAs (chunk groups) a token."""
        return -(-self.CH // (self.NT * self.FKF))

    @property
    def NV(self) -> int:
        return self.n * self.n + self.n

    @property
    def smem_bytes(self) -> int:
        """bwd shared memory a CTA: the dbias slots ([C] fp32, with a bias) and the dh exchange."""
        return 4 * (self.C if self.has_bias else self.V) + 4 * 2 * (self.NTB // 32) * self.NV + 64

    @classmethod
    @functools.lru_cache(maxsize=512)
    def heuristic(cls, n: int, C: int, act_bytes: int, has_bias: bool) -> "PostBdaCuteCfg":
        """16-byte vectors for n <= 4, 8-byte for n > 4 (n*V fp32 values of dout and of residual,
        h and the n*n + n dh partials live at once: n = 8 at 16 bytes would spill). fwd: up to
        128 threads x 8 chunks a token per CTA. bwd: 32..256 threads a token with the fewest idle
        chunk slots, then nearest 224 for n <= 4 (C = 7168 bf16: 224 threads x 4 chunks), 128
        above; the chunk loop not unrolled (unrolled, ptxas hoists several chunks' loads: 166
        registers at n = 4); CPS CTAs an SM (2; 3 for n = 5; fewer where the dbias slots' shared
        memory does not fit) and ptxas held to that many (MINB = CPS: the whole grid resident at
        once; n = 4 bf16: 118 registers, no spill). H200 run 1 at T=32768, n=4, C=7168 (bf16 h):
        224 x 4 at 2 an SM 1.574 ms, 128 x 7 at 3 an SM 1.582, at 4 an SM 1.622, 64 x 14 at 7 an
        SM 1.826 (fewer CTAs in flight, fewer tokens' rows open at once: faster)."""
        vb = 16 if n <= 4 else 8
        V = vb // act_bytes
        ch = C // V
        nt = min(128, 32 * -(-ch // 32))
        kf = min(8, -(-ch // nt))
        ntb, kc = _pick_threads(ch, 224 if n <= 4 else 128)
        cfg = cls(n=n, C=C, has_bias=has_bias, V=V, NT=nt, KF=kf, NTB=ntb, KC=kc, UNR=1)
        cps = max(1, min(2 if n <= 4 else 3 if n == 5 else 2, SMEM_SM // cfg.smem_bytes))
        # fwd (round 2): one chunk a thread (FSPLIT = KF), a token's CTAs adjacent on a 1-D grid (FCM):
        # 0.983 ms against 1.032 with KF chunks a thread; the split alone, CTAs not adjacent, 1.031.
        # dbias (session 55): 32 row groups (1024 threads a CTA) sum the [G, C] partials in 9.3-9.9 us against
        # 18.8-19.4 with 8; bwd_into 5.7-7.5 us faster on the H200 (mHC ledger, session 55)
        return dataclasses.replace(cfg, CPS=cps, MINB=cps, FSPLIT=kf, FCM=True, RG=32)


SMEM_SM = 227 * 1024  # shared memory an H100 / H200 SM gives its CTAs
# fwd load flavours (FLD): cute.arch.load keyword arguments
_FLD = {"": None, "noalloc": dict(level1_eviction_priority="evict_no_allocate"),
        "pf256": dict(level_prefetch_size="size_256b"), "cg": dict(cop="cg")}


# ------------------------------------------------------------------ device helpers

def _vec(ptr, off, k: int):
    """[k] view of a global pointer at element offset ``off`` (Int64)."""
    return cute.make_tensor(ptr + off, cute.make_layout(k))


def _rows(m: cute.Tensor, row0, rows: int, V: int, q):
    """[rows, V] window of the row-major [R, C] tensor ``m`` at rows row0.. (Int64: 64-bit
    offsets), columns q*V.. (static C and V: the compiler sees 16- or 8-byte alignment)."""
    return cute.local_tile(cute.domain_offset((row0, 0), m), (rows, V), (0, q))


@cute.jit
def _load_f32(src: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr, V: cutlass.Constexpr,
              stream: cutlass.Constexpr = False):
    """dst [rows, V] fp32 = src [rows, V] (global, any float dtype): one vector load a row (stream:
    ld.global.cs, evict-first: the data is read once)."""
    if cutlass.const_expr(stream):
        dt = src.element_type
        for r in cutlass.range_constexpr(rows):
            v = cute.arch.load(src[r, None].iterator, ir.VectorType.get([V], dt.mlir_type), cop="cs")
            for e in cutlass.range_constexpr(V):
                dst[r, e] = dt(vector.extract(v, dynamic_position=[], static_position=[e])).to(Float32)
    else:
        tmp = cute.make_rmem_tensor(cute.make_layout((rows, V), stride=(V, 1)), src.element_type)
        for r in cutlass.range_constexpr(rows):
            cute.autovec_copy(src[r, None], tmp[r, None])
        for r in cutlass.range_constexpr(rows):
            dst[r, None].store(tmp[r, None].load().to(Float32))


@cute.jit
def _store(src: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr, stream: cutlass.Constexpr = False,
           cop: cutlass.Constexpr = ""):
    """dst [rows, V] (global) = src [rows, V] fp32 rounded to dst's dtype (RNE), vector stores
    (stream: st.global.cs, evict-first; else cop, a store cache operator, if given)."""
    for r in cutlass.range_constexpr(rows):
        o = cute.make_rmem_tensor_like(dst[r, None])
        o.store(src[r, None].load().to(dst.element_type))
        if cutlass.const_expr(stream or cop != ""):
            dt = dst.element_type
            w = vector.from_elements(ir.VectorType.get([cute.size(o)], dt.mlir_type),
                                     [o[e].ir_value() for e in range(cute.size(o))])
            cute.arch.store(dst[r, None].iterator, w, cop="cs" if stream else cop)
        else:
            cute.autovec_copy(o, dst[r, None])


@cute.jit
def _load_raw(src: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr, V: cutlass.Constexpr,
              fld: cutlass.Constexpr):
    """dst [rows, V] (registers, src's dtype) = src [rows, V] (global): one vector load a row,
    flavour ``fld`` (_FLD: plain, L1::no_allocate, L2::256B prefetch, .cg)."""
    if cutlass.const_expr(fld == ""):
        for r in cutlass.range_constexpr(rows):
            cute.autovec_copy(src[r, None], dst[r, None])
    else:
        dt = src.element_type
        for r in cutlass.range_constexpr(rows):
            v = cute.arch.load(src[r, None].iterator, ir.VectorType.get([V], dt.mlir_type), **_FLD[fld])
            for e in cutlass.range_constexpr(V):
                dst[r, e] = dt(vector.extract(v, dynamic_position=[], static_position=[e]))


@cute.jit
def _load_h(hr_ptr, hp_ptr, t, hr: cute.Tensor, hp: cute.Tensor, n: cutlass.Constexpr):
    """hr [n*n], hp [n] fp32 = h_res[t], h_post[t] (scalar loads, a warp's are one broadcast)."""
    g = _vec(hr_ptr, Int64(t) * (n * n), n * n)
    for e in cutlass.range_constexpr(n * n):
        hr[e] = g[e].to(Float32)
    p = _vec(hp_ptr, Int64(t) * n, n)
    for e in cutlass.range_constexpr(n):
        hp[e] = p[e].to(Float32)


def _hwidth(cnt: int, nbytes: int) -> int:
    """Elements a vector load of ``cnt`` contiguous h values of ``nbytes`` bytes each takes (16,
    8 or 4 bytes whose multiple the row is; 1: scalar loads)."""
    for vb in (16, 8, 4):
        if (cnt * nbytes) % vb == 0 and vb >= 2 * nbytes:
            return vb // nbytes
    return 1


@cute.jit
def _hvec(ptr, off, dst: cute.Tensor, cnt: cutlass.Constexpr):
    """dst [cnt] fp32 = ptr[off : off + cnt] by vector loads (the row's bytes a multiple of the
    width; ptr 16-byte aligned, off a multiple of cnt)."""
    g = _vec(ptr, off, cnt)
    dt = g.element_type
    w = _hwidth(cnt, dt.width // 8)
    if cutlass.const_expr(w == 1):
        for e in cutlass.range_constexpr(cnt):
            dst[e] = g[e].to(Float32)
    else:
        for i in cutlass.range_constexpr(cnt // w):
            v = cute.arch.load(g.iterator + i * w, ir.VectorType.get([w], dt.mlir_type))
            for e in cutlass.range_constexpr(w):
                dst[i * w + e] = dt(vector.extract(v, dynamic_position=[], static_position=[e])).to(Float32)


def _bitrev5(x: int) -> int:
    """x's 5 bits reversed (the lane / slot map of ``_warp_scatter``)."""
    return int(f"{x:05b}"[::-1], 2)


def _warp_scatter(acc: cute.Tensor, v0: int, cnt: int, lane):
    """The warp's sums of acc[v0 .. v0 + cnt) (cnt <= 32) by a butterfly reduce-scatter: lane l ends with the sum
    of value v0 + bitrev5(l) (0 where that is past cnt), returned. Each level halves the values a lane carries: it
    keeps the half its lane bit selects and adds the partner's copy of that half, so the levels take 16 + 8 + 4 +
    2 + 1 shuffles at most (fewer where a pair holds no value: 21 for cnt = 20) where the all-reduce butterfly takes
    5 a value (100 for cnt = 20). Value v sits at slot bitrev5(v), so the values split evenly at every level. The
    adds are the all-reduce's (own + partner's, the same pairs at each level), so each sum is bitwise the
    all-reduce's. Plain Python at trace time (static loops, no branch on a device value)."""
    slots = [None] * 32
    for v in range(cnt):
        slots[_bitrev5(v)] = acc[v0 + v]
    half = 16
    while half:
        up = (lane & half) != 0   # this lane keeps the upper half of its slots
        nxt = [None] * half
        for p in range(half):
            lo, hi = slots[p], slots[p + half]
            if lo is not None or hi is not None:
                lo = Float32(0.0) if lo is None else lo
                hi = Float32(0.0) if hi is None else hi
                send = Float32(cutlass.select_(up, lo, hi))
                keep = Float32(cutlass.select_(up, hi, lo))
                nxt[p] = keep + cute.arch.shuffle_sync_bfly(send, offset=half)
        slots = nxt
        half //= 2
    return Float32(0.0) if slots[0] is None else slots[0]


@cute.jit
def _cta_sums_store(acc: cute.Tensor, red: cute.Tensor, par, tid, t, pa, pb, NA: cutlass.Constexpr,
                    NV: cutlass.Constexpr, NT: cutlass.Constexpr, scatter: cutlass.Constexpr = True):
    """Token t's sums over the CTA (NT threads) of the NV fp32 partials ``acc`` each thread holds:
    over the warp by butterfly shuffles, then over the NT / 32 warps in warp order through ``red``
    (shared [2, NT / 32, NV]; ``par``, the parity of the CTA's token count so far, picks the buffer: one barrier a
    token).
    Sum v goes to pa[t * NA + v] (v < NA) or else pb[t * (NV - NA) + v - NA], in the pointers'
    dtypes; thread v (v0 + v for NV > NT) writes it. Fixed order: deterministic. ``scatter``: the warp
    sums by ``_warp_scatter`` (32 values at a time; each lane stores its one sum into ``red``), else an
    all-reduce butterfly a value (lane 0 stores them all): bitwise the same sums, fewer shuffles."""
    lane = tid % 32
    warp = tid // 32
    if cutlass.const_expr(scatter):
        col = ((lane & 1) << 4) | ((lane & 2) << 2) | (lane & 4) | ((lane & 8) >> 2) | ((lane & 16) >> 4)
        for v0 in cutlass.range_constexpr(0, NV, 32):
            s = _warp_scatter(acc, v0, min(32, NV - v0), lane)
            if v0 + col < NV:
                red[par, warp, v0 + col] = s
    else:
        for v in cutlass.range_constexpr(NV):
            s = acc[v]
            for off in cutlass.range_constexpr(5):
                s = s + cute.arch.shuffle_sync_bfly(s, offset=16 >> off)
            acc[v] = s
        if lane == 0:
            for v in cutlass.range_constexpr(NV):
                red[par, warp, v] = acc[v]
    cute.arch.sync_threads()
    for v0 in cutlass.range_constexpr(0, NV, NT):  # NV may exceed NT (h_post_bda, n = 6: 42 > 32)
        v = v0 + tid
        if v < NV:
            s = red[par, 0, v]
            for w_ in cutlass.range_constexpr(1, NT // 32):
                s = s + red[par, w_, v]
            if cutlass.const_expr(NA == NV):   # one destination: no branch
                _put(pa, Int64(t) * NA + v, s)
            else:
                if v < NA:
                    _put(pa, Int64(t) * NA + v, s)
                else:
                    _put(pb, Int64(t) * (NV - NA) + (v - NA), s)


@cute.jit
def _put(ptr, off, s):
    """ptr[off] = s, rounded to the pointer's dtype."""
    o = _vec(ptr, off, 1)
    o[0] = s.to(o.element_type)


# ------------------------------------------------------------------ forward

@cute.jit
def _fwd_issue(cfg: cutlass.Constexpr, q, t, rows, mR, mX, mB, rr, xr, br):
    """Chunk q's loads (token t, all n streams, x, bias; q < CH) into raw register tiles (src dtype)."""
    n, V = cfg.n, cfg.V
    _load_raw(_rows(mR, rows, n, V, q), rr, n, V, cfg.FLD)
    _load_raw(_rows(mX, Int64(t), 1, V, q), xr, 1, V, cfg.FLD)
    if cutlass.const_expr(cfg.has_bias):
        _load_raw(_rows(mB, Int64(0), 1, V, q), br, 1, V, "")


@cute.jit
def _fwd_chunk(cfg: cutlass.Constexpr, q, rows, mO, hr, hp, rr, xr, br, r, xb, bb, o):
    """Chunk q (its loads in rr, xr, br): out = h_res r + h_post (x + bias), n vector stores."""
    n, V = cfg.n, cfg.V
    r.store(rr.load().to(Float32))
    xb.store(xr.load().to(Float32))
    if cutlass.const_expr(cfg.has_bias):
        bb.store(br.load().to(Float32))
    for e in cutlass.range_constexpr(V):
        xe = xb[0, e]
        if cutlass.const_expr(cfg.has_bias):
            xe = xe + bb[0, e]
        for i in cutlass.range_constexpr(n):
            a = hp[i] * xe
            for j in cutlass.range_constexpr(n):
                a = a + hr[i * n + j] * r[j, e]
            o[i, e] = a
    _store(o, _rows(mO, rows, n, V, q), n, cfg.FSTREAM, cfg.FST)


@cute.jit
def _fwd_token(cfg: cutlass.Constexpr, t, by, tid, hr_ptr, mR, hp_ptr, mX, mB, mO, hr, hp, r, xb, bb, o):
    """Token t's chunks (by * KF + k) * NT + tid, k < KF (= FKF): out = h_res r + h_post (x + bias).
    FPF = 0: load, compute, store one chunk at a time; FPF > 0: chunk k + FPF's loads issued
    before chunk k's FMAs and stores (FPF >= KF - 1: every load first; chunks past CH load
    nothing and store nothing)."""
    n, V, NT, KF, CH = cfg.n, cfg.V, cfg.NT, cfg.FKF, cfg.CH
    PF = min(cfg.FPF, KF - 1)
    if cutlass.const_expr(cfg.FHV):
        _hvec(hr_ptr, Int64(t) * (n * n), hr, n * n)
        _hvec(hp_ptr, Int64(t) * n, hp, n)
    else:
        _load_h(hr_ptr, hp_ptr, t, hr, hp, n)
    rows = Int64(t) * n
    lay = lambda k: cute.make_layout((k, V), stride=(V, 1))  # noqa: E731
    raw = [(cute.make_rmem_tensor(lay(n), mR.element_type), cute.make_rmem_tensor(lay(1), mX.element_type),
            cute.make_rmem_tensor(lay(1), mB.element_type)) for _ in range(PF + 1)]
    for k in cutlass.range_constexpr(PF):
        qk = (by * KF + k) * NT + tid
        if qk < CH:
            _fwd_issue(cfg, qk, t, rows, mR, mX, mB, *raw[k])
    for k in cutlass.range_constexpr(KF):
        q = (by * KF + k) * NT + tid
        if cutlass.const_expr(PF == 0):
            if q < CH:
                _fwd_issue(cfg, q, t, rows, mR, mX, mB, *raw[0])
                _fwd_chunk(cfg, q, rows, mO, hr, hp, *raw[0], r, xb, bb, o)
        else:
            if cutlass.const_expr(k + PF < KF):
                qn = (by * KF + k + PF) * NT + tid
                if qn < CH:
                    _fwd_issue(cfg, qn, t, rows, mR, mX, mB, *raw[(k + PF) % (PF + 1)])
            if q < CH:
                _fwd_chunk(cfg, q, rows, mO, hr, hp, *raw[k % (PF + 1)], r, xb, bb, o)


def _regs(n: int, V: int):
    """The per-thread register tensors of both kernels: h_res [n*n], h_post [n] and four [rows, V]
    fp32 tiles (rows n, 1, 1, n: the streams, x, bias, and the n-row result)."""
    def tile(rows):
        return cute.make_rmem_tensor(cute.make_layout((rows, V), stride=(V, 1)), Float32)
    return (cute.make_rmem_tensor((n * n,), Float32), cute.make_rmem_tensor((n,), Float32),
            tile(n), tile(1), tile(1), tile(n))


@cute.kernel
def _fwd_kernel(cfg: cutlass.Constexpr, hr_ptr: cute.Pointer, mR: cute.Tensor, hp_ptr: cute.Pointer,
                mX: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, T: Int32):
    tid, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()
    if cutlass.const_expr(cfg.FCM):   # 1-D grid: chunk group by of token (group) bx
        by = bx % cfg.FCHG
        bx = bx // cfg.FCHG
    hr, hp, r, xb, bb, o = _regs(cfg.n, cfg.V)
    if cutlass.const_expr(cfg.FG == 0 and cfg.FTOK == 1):
        _fwd_token(cfg, bx, by, tid, hr_ptr, mR, hp_ptr, mX, mB, mO, hr, hp, r, xb, bb, o)
    elif cutlass.const_expr(cfg.FG == 0):   # FTOK tokens a CTA, NT threads each
        t = bx * cfg.FTOK + tid // cfg.NT
        if t < T:
            _fwd_token(cfg, t, by, tid % cfg.NT, hr_ptr, mR, hp_ptr, mX, mB, mO, hr, hp, r, xb, bb, o)
    else:
        gx, _, _ = cute.arch.grid_dim()
        for t in cutlass.range(bx, T, gx, unroll=1):
            _fwd_token(cfg, t, by, tid, hr_ptr, mR, hp_ptr, mX, mB, mO, hr, hp, r, xb, bb, o)


@cute.jit
def _fwd_host(cfg: cutlass.Constexpr, hr: cute.Pointer, res: cute.Pointer, hp: cute.Pointer, x: cute.Pointer,
              b: cute.Pointer, out: cute.Pointer, T: Int32, G: Int32, stream: CU.cuda.CUstream):
    n, C = cfg.n, cfg.C
    big = cute.make_layout((T * n, C), stride=(C, 1))
    mX = cute.make_tensor(x, cute.make_layout((T, C), stride=(C, 1)))
    mB = cute.make_tensor(b, cute.make_layout((1, C), stride=(C, 1)))
    grid = (G * cfg.FCHG, 1, 1) if cutlass.const_expr(cfg.FCM) else (G, cfg.FCHG, 1)
    k = _fwd_kernel(cfg, hr, cute.make_tensor(res, big), hp, mX, mB, cute.make_tensor(out, big), T)
    CU.launch_bounded(k, cfg.FMINB, grid=grid, block=(cfg.NT * cfg.FTOK, 1, 1), stream=stream)


# ------------------------------------------------------------------ backward

@cute.jit
def _bwd_chunk(cfg: cutlass.Constexpr, q, t, rows, mD, mR, mX, mB, mDR, mDX, sb, hr, hp, acc, d, r, xb, bb, dr, dx):
    """One chunk (V channels of token t, all n streams) of the backward: dresidual and dx
    stored, dx added into the CTA's dbias slots ``sb``, the dh partials into ``acc``."""
    n, V, CH = cfg.n, cfg.V, cfg.CH
    if q < CH:
        _load_f32(_rows(mD, rows, n, V, q), d, n, V, cfg.BSTREAM)
        _load_f32(_rows(mR, rows, n, V, q), r, n, V, cfg.BSTREAM)
        _load_f32(_rows(mX, Int64(t), 1, V, q), xb, 1, V, cfg.BSTREAM)
        if cutlass.const_expr(cfg.has_bias):
            _load_f32(_rows(mB, Int64(0), 1, V, q), bb, 1, V)
        for e in cutlass.range_constexpr(V):
            xe = xb[0, e]
            if cutlass.const_expr(cfg.has_bias):
                xe = xe + bb[0, e]
            gx = hp[0] * d[0, e]
            for i in cutlass.range_constexpr(1, n):
                gx = gx + hp[i] * d[i, e]
            dx[0, e] = gx
            for j in cutlass.range_constexpr(n):
                a = hr[j] * d[0, e]
                for i in cutlass.range_constexpr(1, n):
                    a = a + hr[i * n + j] * d[i, e]
                dr[j, e] = a
            for i in cutlass.range_constexpr(n):
                if cutlass.const_expr(cfg.CUT != 1 or i == 0):
                    for j in cutlass.range_constexpr(n):
                        acc[i * n + j] = acc[i * n + j] + d[i, e] * r[j, e]
                acc[n * n + i] = acc[n * n + i] + d[i, e] * xe
        _store(dr, _rows(mDR, rows, n, V, q), n, cfg.BSTREAM)
        _store(dx, _rows(mDX, Int64(t), 1, V, q), 1, cfg.BSTREAM)
        if cutlass.const_expr(cfg.has_bias):
            w = _rows(sb, 0, 1, V, q)
            for e in cutlass.range_constexpr(V):
                w[0, e] = w[0, e] + dx[0, e]


@cute.kernel
def _bwd_kernel(cfg: cutlass.Constexpr, mD: cute.Tensor, hr_ptr: cute.Pointer, mR: cute.Tensor,
                hp_ptr: cute.Pointer, mX: cute.Tensor, mB: cute.Tensor, mDR: cute.Tensor, mDX: cute.Tensor,
                dhr_ptr: cute.Pointer, dhp_ptr: cute.Pointer, mPB: cute.Tensor, T: Int32):
    n, V, NT, KC, CH, NV = cfg.n, cfg.V, cfg.NTB, cfg.KC, cfg.CH, cfg.NV
    NW = NT // 32
    tid, _, _ = cute.arch.thread_idx()
    g, _, _ = cute.arch.block_idx()
    G, _, _ = cute.arch.grid_dim()
    if cutlass.const_expr(cfg.PDL and cfg.has_bias):
        cute.arch.griddepcontrol_launch_dependents()

    smem = SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout((2, NW, NV), stride=(NW * NV, NV, 1)), 16)
    sb = smem.allocate_tensor(Float32, cute.make_layout((1, cfg.C if cfg.has_bias else V), stride=(0, 1)), 16)
    if cutlass.const_expr(cfg.has_bias):
        for k in cutlass.range_constexpr(KC):
            q0 = k * NT + tid
            if q0 < CH:
                w0 = _rows(sb, 0, 1, V, q0)
                for e in cutlass.range_constexpr(V):
                    w0[0, e] = Float32(0.0)

    hr, hp, r, xb, bb, dr = _regs(n, V)
    acc = cute.make_rmem_tensor((NV,), Float32)
    d = cute.make_rmem_tensor(cute.make_layout((n, V), stride=(V, 1)), Float32)
    dx = cute.make_rmem_tensor(cute.make_layout((1, V), stride=(V, 1)), Float32)
    for t0 in cutlass.range(g, T, G, unroll=1):
        t = t0
        if cutlass.const_expr(cfg.REV):
            t = T - 1 - t0
        _load_h(hr_ptr, hp_ptr, t, hr, hp, n)
        for v in cutlass.range_constexpr(NV):
            acc[v] = Float32(0.0)
        rows = Int64(t) * n
        if cutlass.const_expr(cfg.UNR == 0):
            for k in cutlass.range_constexpr(KC):
                _bwd_chunk(cfg, k * NT + tid, t, rows, mD, mR, mX, mB, mDR, mDX, sb, hr, hp, acc, d, r, xb, bb, dr, dx)
        else:
            for k in cutlass.range(KC, unroll=cfg.UNR):
                _bwd_chunk(cfg, k * NT + tid, t, rows, mD, mR, mX, mB, mDR, mDX, sb, hr, hp, acc, d, r, xb, bb, dr, dx)
        _cta_sums_store(acc, red, (t0 // G) % 2, tid, t, dhr_ptr, dhp_ptr, n * n, NV, NT, cfg.WSUM)
    if cutlass.const_expr(cfg.has_bias):
        for k in cutlass.range_constexpr(KC):
            q1 = k * NT + tid
            if q1 < CH:
                src = _rows(sb, 0, 1, V, q1)
                cute.autovec_copy(src[0, None], _rows(mPB, Int64(g), 1, V, q1)[0, None])


@cute.jit
def _bwd_host(cfg: cutlass.Constexpr, dout: cute.Pointer, hr: cute.Pointer, res: cute.Pointer, hp: cute.Pointer,
              x: cute.Pointer, b: cute.Pointer, dres: cute.Pointer, dx: cute.Pointer, dhr: cute.Pointer,
              dhp: cute.Pointer, pb: cute.Pointer, T: Int32, G: Int32, stream: CU.cuda.CUstream):
    n, C = cfg.n, cfg.C
    big = cute.make_layout((T * n, C), stride=(C, 1))
    tc = cute.make_layout((T, C), stride=(C, 1))
    mB = cute.make_tensor(b, cute.make_layout((1, C), stride=(C, 1)))
    mPB = cute.make_tensor(pb, cute.make_layout((G, C), stride=(C, 1)))
    k = _bwd_kernel(cfg, cute.make_tensor(dout, big), hr, cute.make_tensor(res, big), hp, cute.make_tensor(x, tc),
                    mB, cute.make_tensor(dres, big), cute.make_tensor(dx, tc), dhr, dhp, mPB, T)
    CU.launch_bounded(k, cfg.MINB, grid=(G, 1, 1), block=(cfg.NTB, 1, 1), stream=stream)


# ------------------------------------------------------------------ dbias: sum of the [G, C] partials

@cute.kernel
def _dbias_kernel(cfg: cutlass.Constexpr, mPB: cute.Tensor, mOut: cute.Tensor, G: Int32):
    RG, C, DB_V = cfg.RG, cfg.C, cfg.DBV
    if cutlass.const_expr(cfg.PDL):   # the bwd grid's partials: visible after its end
        cute.arch.griddepcontrol_wait()
    tid, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    lane = tid % 32
    rg = tid // 32
    q = bx * 32 + lane
    smem = SmemAllocator()
    part = smem.allocate_tensor(Float32, cute.make_layout((RG, 32, DB_V), stride=(32 * DB_V, DB_V, 1)), 16)
    acc = cute.make_rmem_tensor(cute.make_layout((1, DB_V), stride=(DB_V, 1)), Float32)
    row = cute.make_rmem_tensor(cute.make_layout((1, DB_V), stride=(DB_V, 1)), Float32)
    for e in cutlass.range_constexpr(DB_V):
        acc[0, e] = Float32(0.0)
    if q * DB_V < C:
        for gi in cutlass.range(rg, G, RG, unroll=cfg.DBU):
            cute.autovec_copy(_rows(mPB, Int64(gi), 1, DB_V, q)[0, None], row[0, None])
            for e in cutlass.range_constexpr(DB_V):
                acc[0, e] = acc[0, e] + row[0, e]
    for e in cutlass.range_constexpr(DB_V):
        part[rg, lane, e] = acc[0, e]
    cute.arch.sync_threads()
    if rg == 0:
        if q * DB_V < C:
            for w_ in cutlass.range_constexpr(1, RG):
                for e in cutlass.range_constexpr(DB_V):
                    acc[0, e] = acc[0, e] + part[w_, lane, e]
            _store(acc, _rows(mOut, Int64(0), 1, DB_V, q), 1)


@cute.jit
def _dbias_host(cfg: cutlass.Constexpr, pb: cute.Pointer, out: cute.Pointer, G: Int32, stream: CU.cuda.CUstream):
    C = cfg.C
    mPB = cute.make_tensor(pb, cute.make_layout((G, C), stride=(C, 1)))
    mOut = cute.make_tensor(out, cute.make_layout((1, C), stride=(C, 1)))
    _dbias_kernel(cfg, mPB, mOut, G).launch(grid=(CU.cdiv(C, 32 * cfg.DBV), 1, 1), block=(32 * cfg.RG, 1, 1),
                                            stream=stream, use_pdl=cfg.PDL)


# ------------------------------------------------------------------ launches

def _esz(dt: torch.dtype) -> int:
    return dt.itemsize


def _ptr(dt: torch.dtype, elems: int) -> CU.Ptr:
    """A pointer the kernels access ``elems`` elements at a time (alignment assumed: their bytes,
    at most 16; :func:`tilekernels._glue.aligned16` makes every vector-accessed tensor 16-byte aligned)."""
    return CU.Ptr(dt, min(16, elems * _esz(dt)))


@functools.lru_cache(maxsize=256)
def fwd_launch(cfg: PostBdaCuteCfg, hdt: torch.dtype, adt: torch.dtype, bdt: torch.dtype) -> CU.Launch:
    """run args (h_res, residual, h_post, x, bias or x, out, T, grid x (ceil(T / FTOK), or the FG
    grid)); FHV: h_res and h_post 16-byte aligned."""
    h, a = (CU.Ptr(hdt, 16) if cfg.FHV else _ptr(hdt, 1)), _ptr(adt, cfg.V)
    sig = (h, a, h, a, _ptr(bdt, cfg.V if cfg.has_bias else 1), a, CU.Scalar(Int32), CU.Scalar(Int32))
    return CU.Launch(f"{_NAME}.fwd", _fwd_host, cfg, sig)


@functools.lru_cache(maxsize=256)
def bwd_launch(cfg: PostBdaCuteCfg, hdt: torch.dtype, adt: torch.dtype, bdt: torch.dtype) -> CU.Launch:
    """run args (dout, h_res, residual, h_post, x, bias or x, dresidual, dx, dh_res, dh_post,
    dbias partial [G, C] fp32 (or any pointer without bias), T, G)."""
    h, a = _ptr(hdt, 1), _ptr(adt, cfg.V)
    sig = (a, h, a, h, a, _ptr(bdt, cfg.V if cfg.has_bias else 1), a, a, h, h, _ptr(torch.float32, cfg.V),
           CU.Scalar(Int32), CU.Scalar(Int32))
    return CU.Launch(f"{_NAME}.bwd", _bwd_host, cfg, sig)


@functools.lru_cache(maxsize=256)
def dbias_launch(cfg: PostBdaCuteCfg, bdt: torch.dtype) -> CU.Launch:
    """run args (partial [G, C] fp32, dbias [C], G)."""
    return CU.Launch(f"{_NAME}.dbias", _dbias_host, cfg,
                     (_ptr(torch.float32, cfg.DBV), _ptr(bdt, cfg.DBV), CU.Scalar(Int32)))


def config(residual: torch.Tensor, has_bias: bool) -> PostBdaCuteCfg:
    _, n, C = residual.shape
    return PostBdaCuteCfg.heuristic(n, C, residual.element_size(), has_bias)


def _aligned(*ts) -> bool:
    return all(t is None or t.data_ptr() % 16 == 0 for t in ts)


_SMS: dict[int, int] = {}


def _sms(dev: torch.device) -> int:
    i = dev.index if dev.index is not None else torch.cuda.current_device()
    s = _SMS.get(i)
    if s is None:
        s = _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return s


@kernel("mhc_h_post_bda", "cute", "fwd")
def fwd_into(h_res, residual, h_post, x, bias, out, cfg: PostBdaCuteCfg | None = None):
    """out [T, n, C] = h_post_bda(...), destination-passing (the registry's fwd signature)."""
    T = residual.shape[0]
    if T == 0:
        return
    cfg = cfg or config(residual, bias is not None)
    residual, x, bias = aligned16(residual), aligned16(x), aligned16(bias)
    if cfg.FHV:
        h_res, h_post = aligned16(h_res), aligned16(h_post)
    dst = out if _aligned(out) else torch.empty_like(out)
    b = bias if bias is not None else x
    G = -(-T // cfg.FTOK) if cfg.FG == 0 else min(T, _sms(residual.device) * cfg.FG)
    fwd_launch(cfg, h_res.dtype, residual.dtype, b.dtype).run(h_res, residual, h_post, x, b, dst, T, G)
    if dst is not out:
        out.copy_(dst)


@kernel("mhc_h_post_bda", "cute", "bwd")
def bwd_into(dout, h_res, residual, h_post, x, bias, dh_res, dresidual, dh_post, dx, dbias,
             cfg: PostBdaCuteCfg | None = None, grid: int | None = None):
    """Every gradient, destination-passing (the registry's bwd signature); ``grid`` overrides
    the bwd CTA count (tests: its value changes the dbias summation order only)."""
    T = residual.shape[0]
    has_bias = bias is not None
    if T == 0:
        if dbias is not None:
            dbias.zero_()
        return
    cfg = cfg or config(residual, has_bias)
    if cfg.CUT:
        raise ValueError(f"mhc_h_post_bda cute bwd: CUT {cfg.CUT} is a probe's config (wrong dh_res)")
    dout, residual, x, bias = aligned16(dout), aligned16(residual), aligned16(x), aligned16(bias)
    dst = [t if _aligned(t) else torch.empty_like(t) for t in (dresidual, dx)]
    G = min(T, grid or _sms(residual.device) * cfg.CPS)
    pb = torch.empty((G, cfg.C) if has_bias else (1, 4), dtype=torch.float32, device=residual.device)
    b = bias if has_bias else x
    bwd_launch(cfg, h_res.dtype, residual.dtype, b.dtype).run(dout, h_res, residual, h_post, x, b, dst[0], dst[1],
                                                               dh_res, dh_post, pb, T, G)
    if has_bias:
        db = dbias if _aligned(dbias) else torch.empty_like(dbias)
        dbias_launch(cfg, dbias.dtype).run(pb, db, G)
        if db is not dbias:
            dbias.copy_(db)
    for d, s in zip((dresidual, dx), dst):
        if d is not s:
            d.copy_(s)


def representative_launches(n: int = 4, C: int = 7168, adt=torch.bfloat16, hdt=torch.float32,
                            bdt=None, has_bias: bool = True) -> dict[str, CU.Launch]:
    """The three launches at one static shape (what the CPU compile test exports)."""
    cfg = PostBdaCuteCfg.heuristic(n, C, _esz(adt), has_bias)
    bdt = bdt or adt
    out = {"fwd": fwd_launch(cfg, hdt, adt, bdt), "bwd": bwd_launch(cfg, hdt, adt, bdt)}
    if has_bias:
        out["dbias"] = dbias_launch(cfg, bdt)
    return out
