"""CuTe DSL backward of gdn_pre_gated (SIMT, Hopper sm_90a): one streaming pass, then a small reduction.

Registered as the ``cute`` backend's bwd (``pre_gated_bwd_into``), so a call that needs gradients takes the
CuTe DSL forward and this backward. Written without a GPU (session 11); its index logic is the one of
``cute_pre_gated_bwd_model.model_bwd``, a torch model of the same decomposition tested against
``reference.pre_gated_bwd`` in float64 on the CPU; first run on an H200 in session 12 (GPU tests and
timings: benchmarks/results/h200-gdn-cute-pre-bwd.txt).

What it computes (``reference.pre_gated_bwd`` is the truth; cutile_pre_gated_bwd.py has the same math):
the forward recomputed, pre = conv(x) over q|k|v, y = silu(pre); q/k: the R repeats' grads summed,
dn, then the l2norm backward dy = s*(dn - y*(s*sum(dn*y))*s) (s = rsqrt(sum y^2 + eps) over the head);
v: dy = gv; dpre = dy * silu'(pre); dx[t] = sum_s w[:, W-1-s] * dpre[t+s] over the taps in t's
sequence; dconv_weight[:, j] = sum_t dpre[t] * x[t-(W-1-j)]; dz = gz; db = gbeta*beta*(1-beta);
da = gg*(-exp(A_log))*sigmoid(a + dt_bias); dA_log = sum_t gg*g, ddt_bias = sum_t da. fp32 math,
every output rounded once to its dtype.

Why another backward: the cuTile one (cutile_pre_gated_bwd2) takes two passes through a dpre scratch
[NT, C] (cuTile cannot shift a tile's rows in registers): ~120 KB a token of traffic, 2.06 ms at the
Qwen3-Next shape (30.6% of the fused ideal). Here, as in the CuTe DSL forward (cute_pre_gated.py,
whose unit split, vectors, cp.async ring and helpers this module reuses), a thread owns VEC adjacent
channels (one 16-byte vector) and walks a span of L tokens FORWARD in time, one row at a time:
  * x window: its last W-1 conv inputs (zeroed at a sequence start), so pre and the dconv_weight
    products dpre[t] * x[t-(W-1-j)] need only the current row;
  * dx pending sums (scatter form): acc[k] = the part of dx[t-W+1+k] summed so far; row t adds
    w[k] * dpre[t] to row t-W+1+k's sum where no sequence starts in (t-W+1+k, t], i.e. where
    d >= W-1-k, d = min(rows since the last start, W-1) (one uniform counter a CTA), and emits
    dx[t-W+1], which is then complete. So a row's dx is stored W-1 rows after it is read;
  * the walk covers rows t0-(W-1) .. t0+L+W-2: W-1 halo rows before (x only, plain loads) and W-1
    after the span (x, grads: their dpre completes the span's last dx, they add no dconv_weight):
    (2(W-1))/L rows read twice, nothing written twice;
  * the dconv_weight partial sums of its channels (W*VEC fp32 registers) -> one partial row a span.
Sequence starts: the S starts (THD: cu_seqlens; BSHD: jn * T, S = B + 1); a CTA finds its first (THD by a
binary search of cu_seqlens, overlapping the ring's first loads) and advances at each start (a CTA-uniform
branch; several at once for empty sequences). No mask launch, so L is not bounded by a mask's 64 bits.

Launches (``bwd_launches``):
  main  1-D grid, CTA ``span * UNITS + u`` (units fastest, as the forward): unit u is
        QK (HPC whole q/k heads, LP lanes a head: conv, SiLU, the R grads summed, the two head sums
        by butterfly shuffles, dpre, dx, partial), V (THREADS vectors of v: the same without the
        l2norm), Z (THREADS vectors: dz = gz) or G (the span's gates: db, da, and its per-head sums of
        gg*g and da, reduced over the CTA in shared memory in a fixed order). Rows come in batches of U
        through a cp.async ring of S stages (CA, 16- or 8-byte vectors: x then the R grads (QK) or gv (V),
        thread-private slots as the forward's), else through registers (U rows a batch). Partial rows
        part [P, PS] fp32, P = spans: W*C dconv_weight columns (tap-major: column j*C + c), then Hv of
        dA_log, Hv of ddt_bias (PS: padded to 4).
  red   dconv_weight, dA_log, ddt_bias = the P partial rows summed in a fixed order (CTA: 32 x RV columns
        x RG row groups; group g sums rows g, g+RG, ... in turn, then group 0 the RG sums in turn):
        deterministic, no float atomics. Default RG 32, RV 4 (16-byte loads), RU 8: the fastest variant timed
        (a quarter less reduction time than the first default RG 8, RV 1, RU 4 on an H100; gdn.md, session 57).

Traffic (bytes a token, Qwen3-Next Hk=16, Hv=32, dk=dv=128, W=4, bf16, repeat_qk, L=128): reads x 16,384
(only q|k|v of mixed: z is not read), gq + gk 16,384, gv 8,192, gz 8,192, b|a 128, gg 128, gbeta 64;
writes dmixed 24,704: 74,176. Halo rows: 3 x 16,384 (before) + 3 x 40,960 (after) over 128 tokens = 1,344.
Partials 131,328 B a span written and read again: 2,052. Total ~77,570 B a token, 94% of the
82,368 of the issue's ideal count (which reads all of mixed; 74,176 is this kernel's floor).
At 4.27 TB/s: 0.60 ms at 32768 tokens if it streams at copy speed (0.79 ms is issue 12's bar).

Heuristic (H200, Qwen3-Next bf16, 32768 tokens; benchmarks/results/h200-gdn-cute-pre-bwd.txt): VEC 8, L 128,
U 2, a cp.async ring of S 4 (48 KB), 128 threads, MINB 3 (3 CTAs an SM: ptxas holds 168 registers, no spill) and,
BSHD, its starts walked as THD's (a counter took 195 registers, 2 CTAs an SM: 0.944 ms against 0.697). Main launch +
reduction BSHD / THD with repeat_qk 0.697 / 0.704 ms (90.6 / 89.8% of issue 12's ideal traffic; the cuTile backward
2.081 / 2.214 in the same session), without 0.660 / 0.664. Heads of more than 32 vectors (dk > 256 in bf16) keep
(4W-2)*dk/32 fp32 values a thread and spill.

Backend limits: SM 9.0; mixed, the grads of q, k, v, z, beta and dmixed one dtype (bf16 or fp32), gg,
A_log, dt_bias fp32; conv_weight bf16 or fp32; Hv % Hk == 0; rows (NT) int32, offsets 64-bit.
Compile key: BwdCfg (from Hk, Hv, dk, dv, W, repeat_qk, THD, the element size and the pointers'
alignment) + the dtypes; NT, T and the number of cu_seqlens entries are runtime scalars.
Importing this module needs ``cutlass`` but no GPU.
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
from cutlass.cute.nvgpu import cpasync
from cutlass.memory.smem import SmemAllocator

from tilekernels._cute import BoundLaunch, Launch, Ptr, Scalar, cdiv, cuda, launch_bounded
from tilekernels._glue import kernel, on_device
from tilekernels.gdn.cute_pre_gated import (LOG2E, HeadGeometry, _align, _elem, _elt, _ldw, _load_rows, _load_taps,
                                            _lower_bound, _next_pow2, _shift_in, _softplus, _stv, _thread_vectors,
                                            _wdt, _words, _zero_window, copy_z_rows, ring_buffer)

L_DEFAULT = 128  # tokens a span (a CTA's walk)
U_DEFAULT = 2    # rows a load batch
S_DEFAULT = 4    # CA: stages of U rows in the ring
THREADS = 128    # threads a CTA
STATE_REGS = 112  # the most fp32 registers a thread's taps, x window, dx sums and partial take ((4W-2) * VEC * NV)
RED_GROUPS = 32  # red: row groups a CTA (32 x RV columns each; BwdCfg.RG)
SMEM_MAX = 232448     # bytes of shared memory a CTA may take on sm_90 (227 KB): configs above it are refused
SMEM_BUDGET = 100 * 1024  # the heuristic's ring budget: at least two CTAs an SM (wide R takes fewer stages)
SMEM_SM = 233472      # shared memory of an sm_90 SM (228 KB; each CTA also takes 1 KB the runtime reserves)
MINB_DEFAULT = 3      # CTAs an SM the heuristic asks for where they fit (128 threads: a 168-register cap)
BIG = 2 ** 31 - 1  # "no further start"


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class BwdCfg(HeadGeometry):
    """Launch config = compile key (with the dtypes).

    Hk, Hv, dk, dv, W: the static dims; REP: repeat_qk (the grads of q, k have Hv heads, R a key
    head); THD: cu_seqlens given; VEC: elements a vector; ELT: bytes an element of mixed; L: tokens a
    span; U: rows a load batch; THREADS: threads a CTA; MINB: CTAs an SM the launch asks for (0: none);
    CA: rows through a cp.async ring of S stages
    (8- or 16-byte vectors; the heuristic's with 16, in stages that fit SMEM_BUDGET)."""

    VEC: int
    ELT: int = 2
    L: int = L_DEFAULT
    U: int = U_DEFAULT
    THREADS: int = THREADS
    CA: bool = False
    S: int = S_DEFAULT
    MINB: int = 0  # > 0: the main launch asks for MINB CTAs an SM (ptxas then caps the registers); 0: no bound
    # the reduction of the [P, PS] partial rows: RG row groups a CTA (32 * RG threads), RV adjacent columns a thread
    # (1: 4-byte loads; 4: 16-byte loads, PS being a multiple of 4), its row loop unrolled RU times
    RG: int = RED_GROUPS
    RV: int = 4
    RU: int = 8

    def __post_init__(self):
        if (self.Hv % self.Hk or self.W < 1 or self.L < 1 or self.U < 1 or self.VEC not in (1, 2, 4, 8)
                or self.dk % self.VEC or self.dv % self.VEC or self.D % self.VEC
                or self.THREADS % 32 or self.THREADS % self.LP or self.THREADS > 1024 or self.MINB < 0
                or (self.CA and (self.S < 2 or self.VEC * self.ELT not in (8, 16) or self.S > self.NB))
                or self.smem_bytes() > SMEM_MAX or not 1 <= self.RG <= 32 or self.RV not in (1, 4) or self.RU < 1):
            raise ValueError(f"gdn_pre_gated cute bwd: config {self}: needs Hv % Hk == 0, W >= 1, VEC in 1, 2, 4, 8 "
                             f"dividing dk, dv and D, whole warps, CA only with 8- or 16-byte vectors and "
                             f"2 <= S <= cdiv(L + W - 1, U), shared memory {self.smem_bytes()} <= {SMEM_MAX} bytes, "
                             f"RG in 1..32, RV in 1, 4, RU >= 1")

    @property
    def NB(self) -> int:
        """Load batches a span: its L rows and the W-1 after it."""
        return cdiv(self.L + self.W - 1, self.U)

    @property
    def NSLOT(self) -> int:
        """Ring slots a thread a row: QK x and the R grads of each of its NV vectors (V: x and gv)."""
        return max(self.NV * (1 + self.R), 2)

    @property
    def SW(self) -> int:
        """CA: 32-bit words a ring slot (a vector: 4 of 16 bytes, through cp.async.cg; 2 of 8, cp.async.ca)."""
        return max(1, self.VEC * self.ELT // 4)

    @property
    def PS(self) -> int:
        """Partial row stride (fp32): W*C dconv_weight columns, 2*Hv gate columns, padded to 4."""
        return cdiv(self.W * self.C + 2 * self.Hv, 4) * 4

    @property
    def NCOL(self) -> int:
        return self.W * self.C + 2 * self.Hv

    @property
    def RCTAS(self) -> int:
        """The reduction's CTAs (32 * RV columns each)."""
        return cdiv(self.NCOL, 32 * self.RV)

    def smem_bytes(self) -> int:
        ring = 4 * self.SW * self.THREADS * self.NSLOT * self.U * self.S if self.CA else 16
        return ring + 8 * self.THREADS

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool, thd: bool, elt: int = 2,
                  align: int = 16) -> "BwdCfg":
        """From the static dims, the element size and the pointers' alignment (bytes) only. VEC: the most
        elements in min(16, align) bytes dividing dk, dv and D whose per-thread state (taps, x window,
        dx sums, partial: (4W-2) * VEC * NV fp32) stays within STATE_REGS (wide convs and wide heads
        take narrower vectors: 8 bf16 / 4 fp32 at Qwen3-Next, W=4)."""
        if Hv % Hk:
            raise ValueError(f"gdn_pre_gated cute bwd: Hv={Hv} is not a multiple of Hk={Hk}")
        if W < 1:
            raise ValueError(f"gdn_pre_gated cute bwd: conv width W={W} < 1")
        D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
        vecs = [v for v in (8, 4, 2, 1) if v <= max(1, min(16, align) // elt) and not (dk % v or dv % v or D % v)]
        state = {v: (4 * W - 2) * v * cdiv(dk // v, min(32, _next_pow2(dk // v))) for v in vecs}
        fit = [v for v in vecs if state[v] <= STATE_REGS]
        # none fits (wide convs, heads of more than 32 vectors): the least state, then the widest
        vec = fit[0] if fit else min(vecs, key=lambda v: (state[v], -v))
        cfg = cls(Hk=Hk, Hv=Hv, dk=dk, dv=dv, W=W, REP=bool(repeat_qk), THD=bool(thd), VEC=vec, ELT=elt)
        if vec * elt != 16:
            return cfg  # the register path (the 8-byte cp.async.ca ring is a probe variant, not a default)
        # the ring: (U, S) from the default down, the first within SMEM_BUDGET (its slots grow with R:
        # x and R grads a vector); else the smallest ring if a CTA can hold it; else the register path
        rings = [(u, st) for u in (U_DEFAULT, 1) for st in range(S_DEFAULT, 1, -1)
                 if st <= cdiv(cfg.L + W - 1, u)]
        size = [(u, st, 4 * cfg.SW * cfg.THREADS * cfg.NSLOT * u * st + 8 * cfg.THREADS) for u, st in rings]
        pick = next(((u, st) for u, st, b in size if b <= SMEM_BUDGET), None)
        if pick is None and size and size[-1][2] <= SMEM_MAX:
            pick = size[-1][:2]
        if pick is None:
            return cfg
        cfg = dataclasses.replace(cfg, CA=True, U=pick[0], S=pick[1])
        # one vector a lane and room for MINB_DEFAULT rings an SM: ask for that many CTAs an SM (ptxas's
        # schedule at the 168-register cap this sets: BSHD rep 0.699 ms vs 0.735 without, THD a tie; H200)
        if cfg.NV == 1 and MINB_DEFAULT * (cfg.smem_bytes() + 1024) <= SMEM_SM:
            cfg = dataclasses.replace(cfg, MINB=MINB_DEFAULT)
        return cfg


# ------------------------------------------------------------------ device helpers


def _stf(ptr, off, vals, n: int):
    """ptr[off + e] = vals[e] (fp32) for e < n: 16-byte vector stores where n % 4 == 0 (off a multiple of 4),
    else scalar stores."""
    if n % 4 == 0:
        for q in range(n // 4):
            w = vector.from_elements(ir.VectorType.get([4], Float32.mlir_type),
                                     [Float32(vals[4 * q + i]).ir_value() for i in range(4)])
            cute.arch.store(ptr + (off + 4 * q), w)
    else:
        t = cute.make_tensor(ptr + off, cute.make_layout(n))
        for e in range(n):
            t[e] = vals[e]


@cute.jit
def _start(cfg: cutlass.Constexpr, cu: cute.Pointer, jn, T):
    """Sequence start jn: cu_seqlens[jn] (THD) or jn * T (BSHD: its B + 1 starts 0, T, .., B*T, walked as THD's
    entries; a counter form took 195 registers instead of 168 at Qwen3-Next, 2 CTAs an SM instead of 3, and
    0.944 ms instead of 0.735 on the H200: benchmarks/results/h200-gdn-cute-pre-bwd.txt)."""
    if cutlass.const_expr(cfg.THD):
        return cute.make_tensor(cu, cute.make_layout(1 << 30))[jn]
    return jn * T


@cute.jit
def _first_start(cfg: cutlass.Constexpr, cu: cute.Pointer, lo, T, S):
    """(nxt, jn): the first sequence start >= lo (BIG if none) and its index jn among the S starts."""
    lo = cutlass.max(lo, 0)
    if cutlass.const_expr(cfg.THD):
        jn = _lower_bound(cute.make_tensor(cu, cute.make_layout(1 << 30)), Int32(0), S, lo)
    else:
        jn = cutlass.min((lo + T - 1) // T, S)
    nxt = Int32(BIG)
    if jn < S:
        nxt = _start(cfg, cu, jn, T)
    return nxt, jn


@cute.jit
def _advance(cfg: cutlass.Constexpr, cu: cute.Pointer, t, nxt, jn, d, T, S):
    """At row t: (hit, nxt, jn, d): whether t starts a sequence, the next start after t (past the starts equal
    to t: THD's empty sequences), and d = min(rows since the last start, W-1)."""
    hit = t == nxt
    d = cutlass.min(d + 1, cfg.W - 1)
    if hit:
        d = Int32(0)
        while nxt == t:
            jn = jn + 1
            nxt = Int32(BIG)
            if jn < S:
                nxt = _start(cfg, cu, jn, T)
    return hit, nxt, jn, d


@cute.jit
def _slot_src(cfg: cutlass.Constexpr, QK: cutlass.Constexpr, k: cutlass.Constexpr, t, ch, gb):
    """Element offset of slot k of a vector at row t: k = 0 x in mixed, k >= 1 grad k-1 (QK: repeat
    k-1 of the vector's key head in gq / gk [NT, Hq, dk]; V: gv [NT, Hv*dv])."""
    if cutlass.const_expr(k == 0):
        return Int64(t) * cfg.D + ch
    if cutlass.const_expr(QK):
        return Int64(t) * (cfg.Hk * cfg.R * cfg.dk) + gb + (k - 1) * cfg.dk
    return Int64(t) * (cfg.Hv * cfg.dv) + gb


@cute.jit
def _issue(cfg: cutlass.Constexpr, QK: cutlass.Constexpr, atom, mixed: cute.Pointer, g1: cute.Pointer,
           g2: cute.Pointer, sbuf: cute.Tensor, rows0, st, rend, ch, gb, act, sec, tid):
    """CA: cp.async (one vector, no commit) of this thread's slots of rows rows0 .. rows0+U-1 (those before
    rend) into stage st of sbuf [SW words, THREADS, NSLOT, U, S]. sec: the grads come from g1 (True) or g2."""
    NV = cfg.NV if QK else 1
    NK = 1 + cfg.R if QK else 2
    EPW = 4 // cfg.ELT
    for r in cutlass.range_constexpr(cfg.U):
        t = rows0 + r
        for j in cutlass.range_constexpr(NV):
            if act[j] and t < rend:
                for k in cutlass.range_constexpr(NK):
                    off = cute.assume(_slot_src(cfg, QK, k, t, ch[j], gb[j]) // EPW, divby=cfg.SW)
                    dst = sbuf[(None, tid, j * NK + k, r, st)]
                    if cutlass.const_expr(k == 0):
                        cute.copy(atom, cute.make_tensor(cute.recast_ptr(mixed, dtype=Int32) + off,
                                                         cute.make_layout(cfg.SW)), dst)
                    else:
                        if sec:
                            cute.copy(atom, cute.make_tensor(cute.recast_ptr(g1, dtype=Int32) + off,
                                                             cute.make_layout(cfg.SW)), dst)
                        else:
                            cute.copy(atom, cute.make_tensor(cute.recast_ptr(g2, dtype=Int32) + off,
                                                             cute.make_layout(cfg.SW)), dst)


@cute.jit
def _load(cfg: cutlass.Constexpr, QK: cutlass.Constexpr, mixed: cute.Pointer, g1: cute.Pointer, g2: cute.Pointer,
          buf: cute.Tensor, rows0, rend, ch, gb, act, sec):
    """Registers: buf[j, k, r, :] = the words of slot k of vector j at row rows0 + r (zeros past rend)."""
    NV = cfg.NV if QK else 1
    NK = 1 + cfg.R if QK else 2
    NW, _ = _words(mixed.dtype, cfg.VEC)
    WD = _wdt(mixed.dtype, cfg.VEC)
    for r in cutlass.range_constexpr(cfg.U):
        t = rows0 + r
        for j in cutlass.range_constexpr(NV):
            for k in cutlass.range_constexpr(NK):
                for i in cutlass.range_constexpr(NW):
                    buf[j, k, r, i] = WD(0)
                if act[j] and t < rend:
                    off = _slot_src(cfg, QK, k, t, ch[j], gb[j])
                    if cutlass.const_expr(k == 0):
                        _ldw(mixed, off, cfg.VEC, buf[j, k, r, None])
                    else:
                        if sec:
                            _ldw(g1, off, cfg.VEC, buf[j, k, r, None])
                        else:
                            _ldw(g2, off, cfg.VEC, buf[j, k, r, None])


@cute.jit
def _conv_unit(cfg: cutlass.Constexpr, QK: cutlass.Constexpr, mixed: cute.Pointer, cw: cute.Pointer,
               cu: cute.Pointer, g1: cute.Pointer, g2: cute.Pointer, dmixed: cute.Pointer, part: cute.Pointer,
               sbuf: cute.Tensor, atom, uu, span, NT, T, S, eps: Float32):
    """A QK (QK True: grads g1 = gq, g2 = gk) or V (g1 = gv) unit of one span: the walk of the module
    doc over rows span*L - (W-1) .. span*L + L + W - 2, dx into dmixed, the partial into part."""
    VEC, W, L, U = cfg.VEC, cfg.W, cfg.L, cfg.U
    NV = cfg.NV if QK else 1
    NK = 1 + cfg.R if QK else 2
    WM = max(W - 1, 1)
    tid, _, _ = cute.arch.thread_idx()
    t0 = span * L
    # ---- this thread's vectors (as the forward's: ch, act), gb[j] its grad offset in a row of gq/gk (QK:
    # key head hc % Hk's R repeats) or gv (V)
    ch, act, gb, hk, _ = _thread_vectors(cfg, QK, uu, tid, NV)
    if cutlass.const_expr(QK):
        hc = cutlass.min(hk, 2 * cfg.Hk - 1)
        for j in cutlass.range_constexpr(NV):
            gb[j] = (hc % cfg.Hk) * (cfg.R * cfg.dk) + gb[j]
    sec = hk < cfg.Hk  # QK: a q head (grads from g1) or a k head (g2); V: always g1
    rend = cutlass.min(t0 + L + W - 1, NT)  # rows read: the span and the W-1 after it, within the tokens
    # ---- the ring's first S-1 batches in flight before anything else
    NB = cfg.NB
    Sg = cfg.S
    NW, EPW = _words(mixed.dtype, VEC)
    WD = _wdt(mixed.dtype, VEC)
    if cutlass.const_expr(cfg.CA):
        for st in cutlass.range_constexpr(Sg - 1):
            _issue(cfg, QK, atom, mixed, g1, g2, sbuf, t0 + st * U, st, rend, ch, gb, act, sec, tid)
            cute.arch.cp_async_commit_group()
    wt = _load_taps(cw, ch, NV, W, VEC)  # taps, fp32
    win = cute.make_rmem_tensor((NV, WM, VEC), Float32)
    acc = cute.make_rmem_tensor((NV, WM, VEC), Float32)
    dwp = cute.make_rmem_tensor((NV, W, VEC), Float32)
    _zero_window(win, NV, WM, VEC)
    _zero_window(acc, NV, WM, VEC)
    _zero_window(dwp, NV, W, VEC)
    # ---- sequence starts: the first one after the walk's first row
    base = t0 - (W - 1)
    nxt, jn = _first_start(cfg, cu, base + 1, T, S)
    d = Int32(0)
    hit = t0 < 0  # False, as a dynamic Boolean (the loops below reassign it)
    # ---- the halo before the span: rows base .. t0-1 into the x window
    if cutlass.const_expr(W > 1):
        hb = cute.make_rmem_tensor((NV, W - 1, NW), WD)
        _load_rows(cfg, mixed, hb, base, NT, ch, act, 0, W - 1)
        for s in cutlass.range_constexpr(W - 1):
            hit, nxt, jn, d = _advance(cfg, cu, base + s, nxt, jn, d, T, S)
            if hit:
                _zero_window(win, NV, WM, VEC)
            for j in cutlass.range_constexpr(NV):
                for e in cutlass.range_constexpr(VEC):
                    _shift_in(win, j, e, _elem(mixed.dtype, hb[j, s, e // EPW], e % EPW), W)
    buf = cute.make_rmem_tensor((NV, NK, U if not cfg.CA else 1, NW), WD)
    rw = cute.make_rmem_tensor((NV, NK, NW), WD)
    xs = cute.make_rmem_tensor((NV, VEC), Float32)
    ys = cute.make_rmem_tensor((NV, VEC), Float32)
    dn = cute.make_rmem_tensor((NV, VEC), Float32)
    out = cute.make_rmem_tensor((VEC,), Float32)
    tend = cutlass.min(t0 + L + W - 1, NT + W - 1)  # rows walked: past NT only to emit the last dx
    for b in cutlass.range(NB, unroll=1):
        stg = b % Sg
        if cutlass.const_expr(cfg.CA):
            if b + Sg - 1 < NB:
                _issue(cfg, QK, atom, mixed, g1, g2, sbuf, t0 + (b + Sg - 1) * U, (b + Sg - 1) % Sg, rend, ch, gb,
                       act, sec, tid)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(Sg - 1)
        else:
            _load(cfg, QK, mixed, g1, g2, buf, t0 + b * U, rend, ch, gb, act, sec)
        for r in cutlass.range_constexpr(U):
            t = t0 + b * U + r
            if t < tend:
                hit, nxt, jn, d = _advance(cfg, cu, t, nxt, jn, d, T, S)
                if hit:
                    _zero_window(win, NV, WM, VEC)
                rok = t < NT
                for j in cutlass.range_constexpr(NV):
                    for k in cutlass.range_constexpr(NK):
                        if cutlass.const_expr(cfg.CA):
                            sv = sbuf[(None, tid, j * NK + k, r, stg)].load()
                            for i in cutlass.range_constexpr(NW):
                                rw[j, k, i] = cutlass.select_(act[j] and rok, Int32(sv[i]), Int32(0))
                        else:
                            for i in cutlass.range_constexpr(NW):
                                rw[j, k, i] = buf[j, k, r, i]
                # ---- conv, SiLU and its derivative; QK: the head sums of y^2 and dn*y
                ss = Float32(0.0)
                sd = Float32(0.0)
                for j in cutlass.range_constexpr(NV):
                    for e in cutlass.range_constexpr(VEC):
                        x = _elem(mixed.dtype, rw[j, 0, e // EPW], e % EPW)
                        xs[j, e] = x
                        pre = wt[j, W - 1, e] * x
                        for s in cutlass.range_constexpr(W - 1):
                            pre = pre + wt[j, s, e] * win[j, s, e]
                        sg = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp2(pre * Float32(-LOG2E), fastmath=True))
                        dsv = sg * (Float32(1.0) + pre * (Float32(1.0) - sg))
                        g = _elem(mixed.dtype, rw[j, 1, e // EPW], e % EPW)
                        if cutlass.const_expr(QK):
                            for k in cutlass.range_constexpr(2, NK):
                                g = g + _elem(mixed.dtype, rw[j, k, e // EPW], e % EPW)
                            yv = pre * sg
                            ss = ss + yv * yv
                            sd = sd + g * yv
                            ys[j, e] = yv * dsv  # y * silu'(pre)
                        dn[j, e] = g * dsv  # dn * silu'(pre) (V: dpre)
                # ---- QK: dpre = s*(dn - y*(s*sum(dn*y))*s) * silu'(pre), the head sums by butterfly shuffles
                if cutlass.const_expr(QK):
                    for sh in cutlass.range_constexpr(cfg.LP.bit_length() - 1):
                        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << sh)
                        sd = sd + cute.arch.shuffle_sync_bfly(sd, offset=1 << sh)
                    rs = cute.math.rsqrt(ss + eps, fastmath=True)
                    # rs * (dn - ys * rs^2 sd), rs^2 sd formed as (rs * sd) * rs: each factor stays finite (|rs sd|
                    # <= |g|, |ys rs| <= 1.1), where rs^3 overflows for ss + eps < 2**-85 (a zero head at a tiny eps:
                    # inf * 0 = NaN)
                    c2 = rs * sd * rs
                    for j in cutlass.range_constexpr(NV):
                        for e in cutlass.range_constexpr(VEC):
                            dn[j, e] = rs * (dn[j, e] - ys[j, e] * c2)
                # ---- the partial (span rows before NT only: past NT the rows are zeros, whose l2norm
                # backward is 0 * rsqrt(eps), NaN at eps = 0), the x window, dx sums; emit dx[t - (W-1)]
                if t < t0 + L and rok:
                    for j in cutlass.range_constexpr(NV):
                        for e in cutlass.range_constexpr(VEC):
                            for s in cutlass.range_constexpr(W - 1):
                                dwp[j, s, e] = dwp[j, s, e] + dn[j, e] * win[j, s, e]
                            dwp[j, W - 1, e] = dwp[j, W - 1, e] + dn[j, e] * xs[j, e]
                er = t - (W - 1)
                for j in cutlass.range_constexpr(NV):
                    for e in cutlass.range_constexpr(VEC):
                        dp = dn[j, e]
                        if cutlass.const_expr(W > 1):
                            _shift_in(win, j, e, xs[j, e], W)
                            out[e] = acc[j, 0, e] + cutlass.select_(d >= W - 1, wt[j, 0, e] * dp, Float32(0.0))
                            for q in cutlass.range_constexpr(W - 2):
                                acc[j, q, e] = acc[j, q + 1, e] + cutlass.select_(d >= W - 2 - q, wt[j, q + 1, e] * dp,
                                                                                  Float32(0.0))
                            acc[j, W - 2, e] = wt[j, W - 1, e] * dp
                        else:
                            out[e] = wt[j, 0, e] * dp
                    if act[j] and er >= t0 and er < t0 + L and er < NT:
                        _stv(dmixed, Int64(er) * cfg.D + ch[j], [out[e] for e in range(VEC)], VEC)
    # ---- the span's partial row: columns s*C + c (tap-major)
    for j in cutlass.range_constexpr(NV):
        if act[j]:
            for s in cutlass.range_constexpr(W):
                _stf(part, Int64(span) * cfg.PS + s * cfg.C + ch[j], [dwp[j, s, e] for e in range(VEC)], VEC)


@cute.jit
def _gate_unit(cfg: cutlass.Constexpr, mixed: cute.Pointer, A_log: cute.Pointer, dt_bias: cute.Pointer,
               gg: cute.Pointer, gbeta: cute.Pointer, dmixed: cute.Pointer, part: cute.Pointer, red: cute.Tensor,
               span, NT):
    """The G unit of one span: db, da of its L tokens x Hv heads, and the span's per-head sums of gg*g and
    da -> its partial row. Heads in blocks of HB = min(Hv, THREADS); thread (grp, h) sums the tokens
    grp, grp + G, ... (G = THREADS // HB groups), then thread h sums the G groups in order (shared memory)."""
    L, Hv, D = cfg.L, cfg.Hv, cfg.D
    HB = min(Hv, cfg.THREADS)
    G = cfg.THREADS // HB
    tid, _, _ = cute.arch.thread_idx()
    t0 = span * L
    bo = 2 * cfg.Hk * cfg.dk + 2 * Hv * cfg.dv
    hl = tid % HB
    grp = tid // HB
    for hbk in cutlass.range(cdiv(Hv, HB), unroll=1):
        h = hbk * HB + hl
        sA = Float32(0.0)
        sD = Float32(0.0)
        if grp < G and h < Hv:
            al = cute.make_tensor(A_log, cute.make_layout(Hv))[h]
            nA = -cute.math.exp(al)
            dtb = cute.make_tensor(dt_bias, cute.make_layout(Hv))[h]
            for i in cutlass.range(cdiv(L, G), unroll=2):
                tt = grp + i * G
                t = t0 + tt
                if tt < L and t < NT:
                    row = cute.make_tensor(mixed + (Int64(t) * D + bo), cute.make_layout(2 * Hv))
                    bb = row[h].to(Float32)
                    xa = row[Hv + h].to(Float32) + dtb
                    gv = cute.make_tensor(gg + (Int64(t) * Hv + h), cute.make_layout(1))[0]
                    gb_ = cute.make_tensor(gbeta + (Int64(t) * Hv + h), cute.make_layout(1))[0].to(Float32)
                    beta = Float32(1.0) / (Float32(1.0) + cute.math.exp(-bb))
                    sa = Float32(1.0) / (Float32(1.0) + cute.math.exp(-xa))
                    sp = _softplus(xa)
                    da = gv * nA * sa
                    drow = cute.make_tensor(dmixed + (Int64(t) * D + bo), cute.make_layout(2 * Hv))
                    drow[h] = dmixed.dtype(gb_ * beta * (Float32(1.0) - beta))
                    drow[Hv + h] = dmixed.dtype(da)
                    sA = sA + gv * (nA * sp)
                    sD = sD + da
        red[0, tid] = sA
        red[1, tid] = sD
        cute.arch.sync_threads()
        if tid < HB and h < Hv:
            tA = red[0, tid]
            tD = red[1, tid]
            for q in cutlass.range_constexpr(1, G):
                tA = tA + red[0, q * HB + tid]
                tD = tD + red[1, q * HB + tid]
            prow = cute.make_tensor(part + (Int64(span) * cfg.PS + cfg.W * cfg.C), cute.make_layout(2 * Hv))
            prow[h] = tA
            prow[Hv + h] = tD
        cute.arch.sync_threads()


@cute.kernel
def _bwd_kernel(cfg: cutlass.Constexpr, mixed: cute.Pointer, cw: cute.Pointer, A_log: cute.Pointer,
                dt_bias: cute.Pointer, cu: cute.Pointer, gq: cute.Pointer, gk: cute.Pointer, gv: cute.Pointer,
                gz: cute.Pointer, gg: cute.Pointer, gbeta: cute.Pointer, dmixed: cute.Pointer, part: cute.Pointer,
                NT: Int32, T: Int32, S: Int32, eps: Float32):
    bid, _, _ = cute.arch.block_idx()
    smem = SmemAllocator()
    SW = cfg.SW
    sbuf = ring_buffer(smem, cfg, SW, cfg.NSLOT)
    red = smem.allocate_tensor(Float32, cute.make_layout((2, cfg.THREADS), stride=(cfg.THREADS, 1)), 16)
    mode = cute.nvgpu.LoadCacheMode.GLOBAL if SW == 4 else cute.nvgpu.LoadCacheMode.ALWAYS  # .cg is 16-byte only
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(mode), Int32, num_bits_per_copy=32 * SW)
    nqk, nv, nz, _ = cfg.units
    UNITS = cfg.UNITS
    spans = (NT + cfg.L - 1) // cfg.L
    if bid < spans * UNITS:
        span = bid // UNITS
        u = bid - span * UNITS
        if u < nqk:
            _conv_unit(cfg, True, mixed, cw, cu, gq, gk, dmixed, part, sbuf, atom, u, span, NT, T, S, eps)
        elif u < nqk + nv:
            _conv_unit(cfg, False, mixed, cw, cu, gv, gv, dmixed, part, sbuf, atom, u - nqk, span, NT, T, S, eps)
        elif u < nqk + nv + nz:
            # dz = gz: gz [NT, Hv*dv] -> dmixed's z section, the span's rows
            copy_z_rows(cfg, gz, cfg.Hv * cfg.dv, 0, dmixed, cfg.D, 2 * cfg.Hk * cfg.dk + cfg.Hv * cfg.dv,
                        u - nqk - nv, span * cfg.L, (cfg.L + 2 * cfg.U - 1) // (2 * cfg.U),
                        cutlass.min(NT, span * cfg.L + cfg.L))
        else:
            _gate_unit(cfg, mixed, A_log, dt_bias, gg, gbeta, dmixed, part, red, span, NT)


@cute.jit
def _bwd_host(cfg: cutlass.Constexpr, mixed: cute.Pointer, cw: cute.Pointer, A_log: cute.Pointer,
              dt_bias: cute.Pointer, cu: cute.Pointer, gq: cute.Pointer, gk: cute.Pointer, gv: cute.Pointer,
              gz: cute.Pointer, gg: cute.Pointer, gbeta: cute.Pointer, dmixed: cute.Pointer, part: cute.Pointer,
              NT: Int32, T: Int32, S: Int32, eps: Float32, stream: cuda.CUstream):
    spans = (NT + cfg.L - 1) // cfg.L
    k = _bwd_kernel(cfg, mixed, cw, A_log, dt_bias, cu, gq, gk, gv, gz, gg, gbeta, dmixed, part, NT, T, S, eps)
    launch_bounded(k, cfg.MINB, grid=[spans * cfg.UNITS, 1, 1], block=[cfg.THREADS, 1, 1], stream=stream)


@cute.kernel
def _red_kernel(cfg: cutlass.Constexpr, part: cute.Pointer, dw: cute.Pointer, dA: cute.Pointer, ddt: cute.Pointer,
                P: Int32):
    """32 * RV columns of the partial rows a CTA, RV adjacent ones a lane: group g = tid // 32 sums rows g, g + RG, ...
    in turn, then group 0 the RG sums in turn; column j*C + c -> dconv_weight[c, j], then dA_log, ddt_bias."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    RG, RV = cfg.RG, cfg.RV
    smem = SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout((RG, 32 * RV), stride=(32 * RV, 1)), 16)
    NCOL, PS, WC, C, W, Hv = cfg.NCOL, cfg.PS, cfg.W * cfg.C, cfg.C, cfg.W, cfg.Hv
    lane = tid % 32
    grp = tid // 32
    if cutlass.const_expr(RV == 1):
        col = bid * 32 + lane
        cc = cutlass.min(col, NCOL - 1)  # past the columns: a valid address, never stored
        a = Float32(0.0)
        for p in cutlass.range(grp, P, RG, unroll=cfg.RU):
            a = a + cute.make_tensor(part + (Int64(p) * PS + cc), cute.make_layout(1))[0]
        red[grp, lane] = a
        cute.arch.sync_threads()
        if grp == 0:
            for q in cutlass.range_constexpr(1, RG):
                a = a + red[q, lane]
        if grp == 0 and col < WC:
            cute.make_tensor(dw, cute.make_layout(WC))[(col % C) * W + col // C] = dw.dtype(a)
        if grp == 0 and col >= WC and col < WC + Hv:
            cute.make_tensor(dA, cute.make_layout(Hv))[col - WC] = a
        if grp == 0 and col >= WC + Hv and col < NCOL:
            cute.make_tensor(ddt, cute.make_layout(Hv))[col - WC - Hv] = a
    else:
        # rows of PS fp32 (a multiple of RV = 4): 16-byte loads, the static stride tells the compiler so
        col = (bid * 32 + lane) * RV
        mP = cute.make_tensor(part, cute.make_layout((P, PS), stride=(PS, 1)))
        q = cutlass.min(col, PS - RV) // RV  # past the columns: a valid address, never stored
        acc = cute.make_rmem_tensor((RV,), Float32)
        row = cute.make_rmem_tensor((RV,), Float32)
        for e in cutlass.range_constexpr(RV):
            acc[e] = Float32(0.0)
        for p in cutlass.range(grp, P, RG, unroll=cfg.RU):
            cute.autovec_copy(cute.local_tile(cute.domain_offset((Int64(p), 0), mP), (1, RV), (0, q))[0, None], row)
            for e in cutlass.range_constexpr(RV):
                acc[e] = acc[e] + row[e]
        for e in cutlass.range_constexpr(RV):
            red[grp, lane * RV + e] = acc[e]
        cute.arch.sync_threads()
        if grp == 0:
            for g2 in cutlass.range_constexpr(1, RG):
                for e in cutlass.range_constexpr(RV):
                    acc[e] = acc[e] + red[g2, lane * RV + e]
            for e in cutlass.range_constexpr(RV):
                ce = col + e
                if ce < WC:
                    cute.make_tensor(dw, cute.make_layout(WC))[(ce % C) * W + ce // C] = dw.dtype(acc[e])
                if ce >= WC and ce < WC + Hv:
                    cute.make_tensor(dA, cute.make_layout(Hv))[ce - WC] = acc[e]
                if ce >= WC + Hv and ce < NCOL:
                    cute.make_tensor(ddt, cute.make_layout(Hv))[ce - WC - Hv] = acc[e]


@cute.jit
def _red_host(cfg: cutlass.Constexpr, part: cute.Pointer, dw: cute.Pointer, dA: cute.Pointer, ddt: cute.Pointer,
              P: Int32, stream: cuda.CUstream):
    _red_kernel(cfg, part, dw, dA, ddt, P).launch(grid=[cfg.RCTAS, 1, 1], block=[32 * cfg.RG, 1, 1], stream=stream)


# ------------------------------------------------------------------ host side


@functools.lru_cache(maxsize=256)
def _launches(cfg: BwdCfg, mdt: torch.dtype, wdt: torch.dtype) -> tuple[Launch, Launch]:
    """(the main launch, the reduction) of a config and dtypes."""
    e, a = _elt(mdt), cfg.VEC * _elt(mdt)
    i32, f32 = Ptr(torch.int32, 4), Ptr(torch.float32, 4)
    main = Launch("gdn.cute_pre_gated_bwd.main", _bwd_host, cfg,
                  (Ptr(mdt, a), Ptr(wdt, _elt(wdt)), f32, f32, i32, Ptr(mdt, a), Ptr(mdt, a), Ptr(mdt, a), Ptr(mdt, a),
                   f32, Ptr(mdt, e), Ptr(mdt, a), Ptr(torch.float32, 16), Scalar(Int32), Scalar(Int32), Scalar(Int32),
                   Scalar(Float32)))
    red = Launch("gdn.cute_pre_gated_bwd.red", _red_host, cfg,
                 (Ptr(torch.float32, 16), Ptr(wdt, _elt(wdt)), f32, f32, Scalar(Int32)))
    return main, red


def bwd_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens, dmixed, dconv_weight,
                 dA_log, ddt_bias, Hk: int = 16, dk: int = 128, dv: int = 128, repeat_qk: bool = True,
                 eps: float = 1e-6, cfg: BwdCfg | None = None, part: torch.Tensor | None = None) -> list[BoundLaunch]:
    """The backward's launches (argument order as the registry's bwd kernel): the main pass, then the
    reduction. ``part`` [P, PS] fp32 (P = cdiv(NT, L) spans): the partial rows, a new buffer unless given.
    The grads are made contiguous (a no-op for autograd's)."""
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    thd = cu_seqlens is not None
    D = mixed.shape[-1]
    NT = mixed.numel() // D
    gq, gk, gv, gz, gg, gbeta = (t.contiguous() for t in (gq, gk, gv, gz, gg, gbeta))
    if len({t.dtype for t in (mixed, gq, gk, gv, gz, gbeta, dmixed)}) != 1 or gg.dtype != torch.float32:
        raise ValueError("gdn_pre_gated cute bwd: mixed, the grads of q, k, v, z, beta and dmixed need one dtype, "
                         "gg fp32")
    if NT == 0:
        raise ValueError("gdn_pre_gated cute bwd: no tokens (a grid of 0 CTAs); pre_gated_bwd_into writes the zero "
                         "weight grads itself")
    if dconv_weight.dtype != conv_weight.dtype or any(t.dtype != torch.float32 for t in (A_log, dt_bias, dA_log,
                                                                                          ddt_bias)):
        raise ValueError("gdn_pre_gated cute bwd: dconv_weight needs conv_weight's dtype; A_log, dt_bias and their "
                         "grads fp32")
    if thd and cu_seqlens.dtype != torch.int32:
        raise ValueError(f"gdn_pre_gated cute bwd: cu_seqlens must be int32, got {cu_seqlens.dtype}")
    align = _align(mixed, gq, gk, gv, gz, dmixed)
    if cfg is None:
        cfg = BwdCfg.heuristic(Hk, Hv, dk, dv, W, repeat_qk, thd, mixed.element_size(), align)
    if (cfg.Hk, cfg.Hv, cfg.dk, cfg.dv, cfg.W, cfg.REP, cfg.THD) != (Hk, Hv, dk, dv, W, bool(repeat_qk), thd):
        raise ValueError(f"gdn_pre_gated cute bwd: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, dv={dv}, "
                         f"W={W}, repeat_qk={repeat_qk}, THD={thd}")
    if align < cfg.VEC * mixed.element_size():
        raise ValueError(f"gdn_pre_gated cute bwd: config {cfg} needs mixed, the grads and dmixed at addresses "
                         f"that are multiples of {cfg.VEC * mixed.element_size()} bytes")
    if thd:
        cu_seqlens = on_device(cu_seqlens, mixed.device, "gdn_pre_gated bwd (cute): cu_seqlens")
    main, red = _launches(cfg, mixed.dtype, conv_weight.dtype)
    P = cdiv(NT, cfg.L)
    if part is None:
        part = torch.empty(P, cfg.PS, dtype=torch.float32, device=mixed.device)
    if thd:
        T, S, cu = 1, cu_seqlens.shape[0], cu_seqlens
    else:
        # cu never read (BSHD): a valid pointer of any dtype stands in; S: the B + 1 starts 0, T, .., B*T
        T, S, cu = mixed.shape[1], mixed.shape[0] + 1, A_log
    return [BoundLaunch(main, (mixed, conv_weight, A_log, dt_bias, cu, gq, gk, gv, gz, gg, gbeta, dmixed, part,
                               NT, T, S, float(eps)), grid=(P * cfg.UNITS,)),
            BoundLaunch(red, (part, dconv_weight, dA_log, ddt_bias, P), grid=(cfg.RCTAS,))]


def pre_gated_bwd_into(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens, dmixed,
                       dconv_weight, dA_log, ddt_bias, Hk: int, dk: int, dv: int, repeat_qk: bool, eps: float,
                       *_unused):
    """gdn_pre_gated bwd, destination-passing (the registry's kernel signature; the trailing
    return_conv_state is ignored): grads gq, gk [..., Hq, dk], gv, gz [..., Hv, dv], gg (fp32), gbeta
    [..., Hv] (any strides: made contiguous), mixed [B, T, D] or [NT, D] (+ cu_seqlens [N+1] int32)
    -> dmixed (mixed's shape and dtype), dconv_weight [C, W], dA_log, ddt_bias [Hv] fp32. No tokens:
    zero weight grads."""
    if mixed.numel() == 0:
        for t in (dconv_weight, dA_log, ddt_bias):
            t.zero_()
        return
    for ln in bwd_launches(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens, dmixed,
                           dconv_weight, dA_log, ddt_bias, Hk, dk, dv, repeat_qk, eps):
        ln.run()


kernel("gdn_pre_gated", "cute", "bwd")(pre_gated_bwd_into)


def representative_launches(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                            dtype=torch.bfloat16, wdtype=None, thd: bool = False, repeat_qk: bool = True,
                            align: int = 16, cfg: BwdCfg | None = None) -> tuple[Launch, Launch]:
    """(main, reduction) at one head shape, for the CPU compile test (``Launch.export("sm_90a")``)."""
    cfg = cfg or BwdCfg.heuristic(Hk, Hv, dk, dv, W, repeat_qk, thd, _elt(dtype), align)
    return _launches(cfg, dtype, wdtype or dtype)
