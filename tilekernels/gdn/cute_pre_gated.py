"""CuTe DSL forward of gdn_pre_gated (SIMT, Hopper sm_90a): one streaming pass over mixed.

What it computes (specs/gdn.py, ``PRE_GATED``; ``reference.pre_gated`` is the truth), as the cuTile
forward (tilekernels/gdn/cutile_pre_gated.py) does: y = silu(causal depthwise conv (width W) over the
tokens of mixed's q|k|v channels), never reading across a sequence boundary (zero history); q, k =
l2norm over dk of their heads of y (x * rsqrt(sum x^2 + eps)), optionally repeated to Hv heads
(repeat_interleave: value head h reads key head h // R, R = Hv/Hk); v = its slice of y; z = its
slice of mixed; beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias); optionally the final
conv state [N, C, W-1]. fp32 math, every output rounded once to its dtype. The backward is
cute_pre_gated_bwd.py (imported at the end of this module, which registers it): the spec's cute backend
has both passes.

Why another forward: the cuTile one reads each row of q|k|v W times (one TMA tap tile per tap,
from L2) and reaches ~77% of copy bandwidth with repeat_qk. Here a thread owns VEC adjacent
channels (one 16-byte vector: 8 bf16 / 4 fp32) of the conv section and walks a run of L tokens,
keeping its last W-1 conv inputs in registers: each row is read once, plus W-1 halo rows a run.

Layout: raw pointers to the caller's contiguous tensors (BSHD [B, T, D] seen as packed tokens
[NT, D], NT = B*T; THD [NT, D] with cu_seqlens [N+1] int32 on the device), 64-bit row offsets.
One 1-D grid: CTA ``run * UNITS + u`` (units fastest, so the CTAs running at once read whole rows)
owns tokens run*L .. run*L+L-1 and unit u, one of
  * QK: HPC whole q or k heads (LP lanes a head, LP = the power of two >= dk/VEC, at most 32; NV
    vectors a lane where dk/VEC > 32); the conv + SiLU of its vectors, the sum of squares over the
    head by butterfly shuffles among the head's LP lanes, the rsqrt, and R (= Hv/Hk with
    repeat_qk, else 1) vector stores of the normed vector;
  * V: THREADS vectors of v (conv + SiLU, one store);
  * Z: THREADS vectors of z (a copy);
  * G: the gates of the run's L tokens x Hv heads (scalar: b, a are 2*Hv values of a row).
Conv units take the rows in batches of U: with 16-byte vectors (CA, the heuristic's) through a
cp.async ring of S stages in shared memory (thread-private slots: each thread reads back only what
it copied, so ``cp.async.wait_group`` orders it, no barrier; S-1 batches in flight without holding
registers), else in registers (batch b+1's loads issued before batch b is computed). The W-1 halo
rows are plain vector loads. With return_conv_state, N * SB more CTAs after the runs' copy the last
W-1 conv inputs of each sequence (zero-padded before its start) into conv_state.

Sequence starts: at a start row the window is zeroed before the row enters it (a CTA-uniform
branch). BSHD: the next start (a multiple of T) is kept as a counter. THD: a small first launch
(``_starts_kernel``, one thread a run: binary search of cu_seqlens on the device, no host sync)
writes each run's starts as a 64-bit mask of its L + W - 1 rows (halo first), so L + W - 1 <= 64.

Vector width: VEC = the most elements in 16 bytes that divide dk, dv and D, and whose bytes
divide the addresses of mixed and of the q, k, v, z outputs (``PreCfg.heuristic``); anything
else runs narrower vectors (down to 1), as do wide convs (the taps and window of 2*W*VEC fp32 values
kept within WIN_REGS registers), so every dk, dv >= 1 and W in 1 .. MAX_W work.

Measured (H200, Qwen3-Next, bf16, 32768 tokens; benchmarks/results/h200-gdn-cute-pre-gated.txt, session
10): the heuristic's config (VEC 8, L 32, U 4, CA with S 4, 128 threads, 114 registers) through the
registry, BSHD rep / norep, THD rep / norep 0.494 / 0.422 / 0.499 / 0.430 ms (89.7 / 89.9 / 88.8 / 88.4%
of copy) against FLA + torch 1.728 / 1.188 / 2.142 / 1.593 in the same run and the cuTile forward's
0.573 / 0.515 / 0.560 / 0.514 (session 7). Sweep (BSHD / THD with repeat_qk): registers instead of CA
0.498 / 0.536, the same at U 8 0.521 / 0.562, U8 S3 0.507 / 0.511, S6 0.492 / 0.496 (not the default:
within the run-to-run spread), L16, 256 threads, S3, U2 S8 within 1% of the default.

Backend limits (for the spec's cute Backend entry): SM 9.0; mixed bf16 or fp32; conv_weight bf16
or fp32; A_log, dt_bias fp32; W <= MAX_W (the start mask); rows (NT) int32, element offsets 64-bit.
Compile key: PreCfg (from Hk, Hv, dk, dv, W, repeat_qk, THD, conv state, the element size and the
pointers' alignment, which fix VEC and CA) + the dtypes; NT, T, N are runtime scalars.
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

from tilekernels._cute import BoundLaunch, Launch, Ptr, Scalar, cdiv, cuda
from tilekernels._glue import kernel, on_device
from tilekernels.gdn.ops import pre_gated_fwd_runner

MASK_BITS = 64  # THD: a run's start mask covers its L + W - 1 rows
L_DEFAULT = 32  # tokens a run (the heuristic's L)
U_DEFAULT = 4   # rows a load batch (the heuristic's U)
THREADS = 128   # threads a CTA (the heuristic's)
MAX_W = MASK_BITS - L_DEFAULT + 1  # 33: the widest conv the default run length's mask covers
LOG2E = 1.4426950408889634
STAGES = 4  # CA: the heuristic's stages of U rows
CA_DEFAULT = True  # the heuristic's CA where vectors are 16 bytes
WIN_REGS = 80  # the most fp32 registers a thread's taps and conv window take (2 * W * VEC)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# ------------------------------------------------------------------ launch config


@dataclasses.dataclass(frozen=True)
class HeadGeometry:
    """The fields the forward's and the backward's (cute_pre_gated_bwd.BwdCfg) configs share, the
    problem's static dims (Hk, Hv, dk, dv, W; REP: repeat_qk; THD: cu_seqlens given), and the sizes
    both derive from them and their own VEC and THREADS: the q|k|v|z|b|a row and the unit split (QK
    heads of LP lanes, v and z vectors, the gates)."""

    Hk: int
    Hv: int
    dk: int
    dv: int
    W: int
    REP: bool
    THD: bool

    @property
    def R(self) -> int:
        return self.Hv // self.Hk if self.REP else 1

    @property
    def D(self) -> int:
        return 2 * self.Hk * self.dk + 2 * self.Hv * self.dv + 2 * self.Hv

    @property
    def C(self) -> int:
        return 2 * self.Hk * self.dk + self.Hv * self.dv

    @property
    def LH(self) -> int:
        """Vectors a q/k head."""
        return self.dk // self.VEC

    @property
    def LP(self) -> int:
        """Lanes a q/k head (a power of two, at most a warp)."""
        return min(32, _next_pow2(self.LH))

    @property
    def NV(self) -> int:
        """Vectors a q/k lane."""
        return cdiv(self.LH, self.LP)

    @property
    def HPC(self) -> int:
        """q/k heads a CTA."""
        return self.THREADS // self.LP

    @property
    def NVV(self) -> int:
        """Vectors of v (and of z) a token."""
        return self.Hv * self.dv // self.VEC

    @property
    def units(self) -> tuple[int, int, int, int]:
        """CTAs a run of tokens: (QK, V, Z, G)."""
        return (cdiv(2 * self.Hk, self.HPC), cdiv(self.NVV, self.THREADS), cdiv(self.NVV, self.THREADS), 1)

    @property
    def UNITS(self) -> int:
        return sum(self.units)


@dataclasses.dataclass(frozen=True)
class PreCfg(HeadGeometry):
    """Launch config = compile key (with the dtypes).

    Hk, Hv, dk, dv, W: the problem's static dims; REP: repeat_qk; THD: cu_seqlens given (start
    masks from the first launch); STATE: write the final conv state; VEC: elements a vector (one
    load / store); L: tokens a run; U: rows a load batch; THREADS: threads a CTA."""

    STATE: bool
    VEC: int
    ELT: int = 2  # bytes an element of mixed (2: bf16, 4: fp32)
    L: int = L_DEFAULT
    U: int = U_DEFAULT
    THREADS: int = THREADS
    CA: bool = False  # conv rows through a cp.async ring in shared memory (16-byte vectors only)
    S: int = STAGES   # CA: stages of U rows (S - 1 in flight while one is computed)

    def __post_init__(self):
        if (self.Hv % self.Hk or self.W < 1 or self.L + self.W - 1 > MASK_BITS or self.L % self.U
                or self.L % (2 * self.U) or self.VEC not in (1, 2, 4, 8)
                or self.dk % self.VEC or self.dv % self.VEC or self.D % self.VEC
                or self.THREADS % 32 or self.THREADS % self.LP or self.THREADS > 1024
                or (self.CA and (self.S < 2 or self.VEC * self.ELT != 16 or self.S > self.L // self.U))):
            raise ValueError(f"gdn_pre_gated cute: config {self}: needs Hv % Hk == 0, 1 <= W, L + W - 1 <= "
                             f"{MASK_BITS}, 2U | L, VEC in 1, 2, 4, 8 dividing dk, dv and D, whole warps, "
                             f"CA only with 16-byte vectors and 2 <= S <= L / U")

    @property
    def SB(self) -> int:
        """Conv-state CTAs a sequence."""
        return cdiv(self.C // self.VEC, self.THREADS)

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def heuristic(cls, Hk: int, Hv: int, dk: int, dv: int, W: int, repeat_qk: bool, thd: bool, state: bool,
                  elt: int = 2, align: int = 16) -> "PreCfg":
        """From the static dims, the element size and the alignment (bytes) of the pointers only.
        VEC: the most elements in min(16, align) bytes dividing dk, dv and D (16-byte vectors at
        Qwen3-Next shapes: bf16 8, fp32 4) whose W taps and W-1 window values (fp32 registers)
        stay within WIN_REGS (wide convs take narrower vectors instead of spilling)."""
        if Hv % Hk:
            raise ValueError(f"gdn_pre_gated cute: Hv={Hv} is not a multiple of Hk={Hk}")
        if not 1 <= W <= MAX_W:
            raise ValueError(f"gdn_pre_gated cute: conv width W={W} outside 1 .. {MAX_W}")
        D = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
        vec = max(1, min(16, align) // elt)
        while vec > 1 and (dk % vec or dv % vec or D % vec or 2 * W * vec > WIN_REGS):
            vec //= 2
        return cls(Hk=Hk, Hv=Hv, dk=dk, dv=dv, W=W, REP=bool(repeat_qk), THD=bool(thd), STATE=bool(state), VEC=vec,
                   ELT=elt, CA=CA_DEFAULT and vec * elt == 16)


# ------------------------------------------------------------------ device helpers


def _words(dt, VEC: int) -> tuple[int, int]:
    """(words a vector, elements a word) of VEC elements of ``dt`` held in registers: 32-bit words
    (bf16 pairs, fp32) where a vector has 4 bytes or more, else one element (bf16, VEC 1)."""
    if VEC * (dt.width // 8) >= 4:
        return VEC * (dt.width // 8) // 4, 4 // (dt.width // 8)
    return 1, 1


def _ldw(ptr, off, VEC: int, buf):
    """buf[i] = word i of the VEC elements at element offset ``off`` of ptr (one vector load where
    a vector has more than one word); see :func:`_words`."""
    NW, EPW = _words(ptr.dtype, VEC)
    if VEC * (ptr.dtype.width // 8) < 4:
        buf[0] = cute.make_tensor(ptr + off, cute.make_layout(1))[0]
        return
    wp = cute.recast_ptr(ptr, dtype=Int32) + off // EPW
    if NW == 1:
        buf[0] = cute.make_tensor(wp, cute.make_layout(1))[0]
    else:
        v = cute.arch.load(wp, ir.VectorType.get([NW], Int32.mlir_type))
        for i in range(NW):
            buf[i] = Int32(vector.extract(v, dynamic_position=[], static_position=[i]))


def _elem(dt, w, i: int):
    """Element i of a register word ``w`` (see :func:`_words`) as fp32: bf16 halves by shifts."""
    if dt.width == 16 and w.dtype == Int32:
        return (w << 16).bitcast(Float32) if i == 0 else (w & Int32(-65536)).bitcast(Float32)
    if w.dtype == Int32:
        return w.bitcast(Float32)
    return w.to(Float32)


def _stv(ptr, off, vals, VEC: int):
    """ptr[off + e] = vals[e] rounded to ptr's dtype, e < VEC: one vector store (VEC > 1)."""
    if VEC == 1:
        cute.make_tensor(ptr + off, cute.make_layout(1))[0] = ptr.dtype(vals[0])
    else:
        w = vector.from_elements(ir.VectorType.get([VEC], ptr.dtype.mlir_type),
                                 [ptr.dtype(x).ir_value() for x in vals])
        cute.arch.store(ptr + off, w)


def _stw(ptr, off, VEC: int, buf):
    """The VEC elements at element offset ``off`` of ptr = the register words buf (as :func:`_ldw`
    loaded them): a copy without conversion."""
    NW, EPW = _words(ptr.dtype, VEC)
    if VEC * (ptr.dtype.width // 8) < 4:
        cute.make_tensor(ptr + off, cute.make_layout(1))[0] = buf[0]
        return
    wp = cute.recast_ptr(ptr, dtype=Int32) + off // EPW
    if NW == 1:
        cute.make_tensor(wp, cute.make_layout(1))[0] = buf[0]
    else:
        cute.arch.store(wp, vector.from_elements(ir.VectorType.get([NW], Int32.mlir_type),
                                                 [buf[i].ir_value() for i in range(NW)]))


def _wdt(dt, VEC: int):
    """The register word type of VEC elements of ``dt`` (see :func:`_words`)."""
    return Int32 if VEC * (dt.width // 8) >= 4 else dt


def _silu(x):
    """x * sigmoid(x) through ex2.approx and rcp.approx (~2 ulp each; fp32's 1e-5 tolerance holds)."""
    return x * cute.arch.rcp_approx(Float32(1.0) + cute.math.exp2(x * Float32(-LOG2E), fastmath=True))


@cute.jit
def _zero_window(win: cute.Tensor, NV: cutlass.Constexpr, WM: cutlass.Constexpr, VEC: cutlass.Constexpr):
    for j in cutlass.range_constexpr(NV):
        for s in cutlass.range_constexpr(WM):
            for e in cutlass.range_constexpr(VEC):
                win[j, s, e] = Float32(0.0)


@cute.jit
def _shift_in(win: cute.Tensor, j: cutlass.Constexpr, e: cutlass.Constexpr, x, W: cutlass.Constexpr):
    """The x window of vector j, element e (its last W-1 conv inputs, oldest first): x appended."""
    for q in cutlass.range_constexpr(W - 2):
        win[j, q, e] = win[j, q + 1, e]
    win[j, W - 2, e] = x


@cute.jit
def _thread_vectors(cfg: cutlass.Constexpr, QK: cutlass.Constexpr, uu, tid, NV: cutlass.Constexpr):
    """(ch, act, vo, hk, li) of this thread in unit uu, as the forward and the backward split a row: ch[j] the
    first channel of its vector j in mixed's row, act[j] whether it is real (QK: lanes past a head's dk/VEC
    vectors and heads past 2*Hk load nothing, compute zeros and store nothing, but take part in the shuffles),
    vo[j] its offset in its head (QK) or in v (V), hk its q|k head 0 .. 2*Hk - 1 and li its lane in the head
    (QK; V: 0)."""
    ch = cute.make_rmem_tensor((NV,), Int32)
    vo = cute.make_rmem_tensor((NV,), Int32)
    act = cute.make_rmem_tensor((NV,), cutlass.Boolean)
    hk = Int32(0)
    li = Int32(0)
    if cutlass.const_expr(QK):
        li = tid % cfg.LP
        hk = uu * cfg.HPC + tid // cfg.LP
        for j in cutlass.range_constexpr(NV):
            vi = li + j * cfg.LP
            act[j] = hk < 2 * cfg.Hk and vi < cfg.LH
            ch[j] = cutlass.min(hk, 2 * cfg.Hk - 1) * cfg.dk + cutlass.min(vi, cfg.LH - 1) * cfg.VEC
            vo[j] = cutlass.min(vi, cfg.LH - 1) * cfg.VEC
    else:
        vv = uu * cfg.THREADS + tid
        act[0] = vv < cfg.NVV
        vo[0] = cutlass.min(vv, cfg.NVV - 1) * cfg.VEC
        ch[0] = 2 * cfg.Hk * cfg.dk + vo[0]
    return ch, act, vo, hk, li


@cute.jit
def _load_taps(cw: cute.Pointer, ch: cute.Tensor, NV: cutlass.Constexpr, W: cutlass.Constexpr,
               VEC: cutlass.Constexpr):
    """The conv taps of the thread's channels, fp32 [NV, W, VEC] (conv_weight [C, W] rows ch[j] + e)."""
    wt = cute.make_rmem_tensor((NV, W, VEC), Float32)
    for j in cutlass.range_constexpr(NV):
        wrow = cute.make_tensor(cw + Int64(ch[j]) * W, cute.make_layout(VEC * W))
        for e in cutlass.range_constexpr(VEC):
            for s in cutlass.range_constexpr(W):
                wt[j, s, e] = wrow[e * W + s].to(Float32)
    return wt


@cute.jit
def _softplus(x):
    """torch's softplus (threshold 20: x itself above it)."""
    sp = x
    if x <= Float32(20.0):
        sp = cute.math.log1p(cute.math.exp(x))
    return sp


@cute.jit
def _is_start(cfg: cutlass.Constexpr, t, base, mask, nxt):
    """Whether row t starts a sequence: THD, bit t - base of the run's mask; BSHD, t == nxt (the
    next multiple of T, kept by the caller)."""
    hit = t == nxt
    if cutlass.const_expr(cfg.THD):
        hit = ((mask >> Int64(t - base)) & Int64(1)) != Int64(0)
    return hit


@cute.jit
def _load_rows(cfg: cutlass.Constexpr, mixed: cute.Pointer, buf: cute.Tensor, rows0, NT, ch, act, R0: cutlass.Constexpr,
               NR: cutlass.Constexpr):
    """buf[j, R0 + r, :] = the words of mixed[rows0 + r, ch[j] : ch[j] + VEC] for r < NR (zeros for
    rows outside [0, NT) and inactive vectors)."""
    VEC, D = cfg.VEC, cfg.D
    NW, _ = _words(mixed.dtype, VEC)
    WD = _wdt(mixed.dtype, VEC)
    for r in cutlass.range_constexpr(NR):
        t = rows0 + r
        for j in cutlass.range_constexpr(cute.size(act)):
            if act[j] and t >= 0 and t < NT:
                _ldw(mixed, Int64(t) * D + ch[j], VEC, buf[j, R0 + r, None])
            else:
                for i in cutlass.range_constexpr(NW):
                    buf[j, R0 + r, i] = WD(0)


@cute.jit
def _issue(cfg: cutlass.Constexpr, atom, mw: cute.Pointer, sbuf: cute.Tensor, rows0, st, NT, ch, act, tid):
    """CA: cp.async (16 bytes each, no commit) of this thread's vectors of rows rows0 .. rows0 + U - 1
    (those before NT) into its own slots of stage st of sbuf [4 words, THREADS, NV, U, S]."""
    DW = cfg.D * cfg.ELT // 4
    EPW = 4 // cfg.ELT
    for r in cutlass.range_constexpr(cfg.U):
        t = rows0 + r
        for j in cutlass.range_constexpr(cute.size(act)):
            if act[j] and t < NT:
                off = cute.assume(Int64(t) * DW + ch[j] // EPW, divby=4)
                cute.copy(atom, cute.make_tensor(mw + off, cute.make_layout(4)), sbuf[(None, tid, j, r, st)])


@cute.jit
def _conv_unit(cfg: cutlass.Constexpr, QK: cutlass.Constexpr, mixed: cute.Pointer, cw: cute.Pointer,
               masks: cute.Pointer, o1: cute.Pointer, o2: cute.Pointer, sbuf: cute.Tensor, atom, uu, run, NT, T,
               eps: Float32):
    """A QK (QK True) or V unit of one run: conv + SiLU over the run's rows of this thread's vectors
    (NV a thread; V: 1), then (QK) the l2norm over the head and R stores into o1 (q) or o2 (k), or
    (V) one store into o1 (v)."""
    VEC, NV_, W, L, U = cfg.VEC, cfg.NV, cfg.W, cfg.L, cfg.U
    NV = NV_ if QK else 1
    WM = max(W - 1, 1)
    tid, _, _ = cute.arch.thread_idx()
    t0 = run * L
    # ---- this thread's vectors and the taps of its channels, fp32 (once)
    ch, act, _, hk, li = _thread_vectors(cfg, QK, uu, tid, NV)
    wt = _load_taps(cw, ch, NV, W, VEC)
    # ---- sequence starts of this run's rows t0 - (W-1) .. t0 + L - 1
    base = t0 - (W - 1)
    mask = Int64(0)
    nxt = Int32(0)
    if cutlass.const_expr(cfg.THD):
        mask = cute.make_tensor(masks + Int64(run), cute.make_layout(1))[0]
    else:
        first = cutlass.max(base, 0)
        nxt = ((first + T - 1) // T) * T
    NW, EPW = _words(mixed.dtype, VEC)
    WD = _wdt(mixed.dtype, VEC)
    win = cute.make_rmem_tensor((NV, WM, VEC), Float32)
    _zero_window(win, NV, WM, VEC)
    # ---- the halo: rows t0 - (W-1) .. t0 - 1 into the window (no outputs)
    if cutlass.const_expr(W > 1):
        hb = cute.make_rmem_tensor((NV, W - 1, NW), WD)
        _load_rows(cfg, mixed, hb, base, NT, ch, act, 0, W - 1)
        for s in cutlass.range_constexpr(W - 1):
            if _is_start(cfg, base + s, base, mask, nxt):
                _zero_window(win, NV, WM, VEC)
                nxt = nxt + T
            for j in cutlass.range_constexpr(NV):
                for e in cutlass.range_constexpr(VEC):
                    _shift_in(win, j, e, _elem(mixed.dtype, hb[j, s, e // EPW], e % EPW), W)
    # ---- the run's rows in batches of U: registers (batch b+1's loads issued before batch b is
    # computed) or CA, a cp.async ring of S stages in shared memory (S-1 batches in flight)
    NB = L // U
    S = cfg.S
    buf = cute.make_rmem_tensor((NV, 2 * U if not cfg.CA else 1, NW), WD)
    rw = cute.make_rmem_tensor((NV, NW), WD)
    mw = cute.recast_ptr(mixed, dtype=Int32)
    if cutlass.const_expr(cfg.CA):
        for st in cutlass.range_constexpr(S - 1):
            _issue(cfg, atom, mw, sbuf, t0 + st * U, st, NT, ch, act, tid)
            cute.arch.cp_async_commit_group()
    else:
        _load_rows(cfg, mixed, buf, t0, NT, ch, act, 0, U)
    y = cute.make_rmem_tensor((NV, VEC), Float32)
    out = cute.make_rmem_tensor((VEC,), Float32)
    Rq = cfg.R
    for b in cutlass.range(NB, unroll=1):
        stg = b % S
        if cutlass.const_expr(cfg.CA):
            if b + S - 1 < NB:
                _issue(cfg, atom, mw, sbuf, t0 + (b + S - 1) * U, (b + S - 1) % S, NT, ch, act, tid)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(S - 1)
        else:
            if b + 1 < NB:
                _load_rows(cfg, mixed, buf, t0 + (b + 1) * U, NT, ch, act, U, U)
        for r in cutlass.range_constexpr(U):
            t = t0 + b * U + r
            if t < NT:
                if _is_start(cfg, t, base, mask, nxt):
                    _zero_window(win, NV, WM, VEC)
                    nxt = nxt + T
                for j in cutlass.range_constexpr(NV):
                    if cutlass.const_expr(cfg.CA):
                        sv = sbuf[(None, tid, j, r, stg)].load()
                        for i in cutlass.range_constexpr(NW):
                            wv = Int32(sv[i])  # inactive lanes (padding of a head): zeros
                            rw[j, i] = cutlass.select_(act[j], wv, Int32(0))
                    else:
                        for i in cutlass.range_constexpr(NW):
                            rw[j, i] = buf[j, r, i]
                ss = Float32(0.0)
                for j in cutlass.range_constexpr(NV):
                    for e in cutlass.range_constexpr(VEC):
                        x = _elem(mixed.dtype, rw[j, e // EPW], e % EPW)
                        pre = wt[j, W - 1, e] * x
                        for s in cutlass.range_constexpr(W - 1):
                            pre = pre + wt[j, s, e] * win[j, s, e]
                        if cutlass.const_expr(W > 1):
                            _shift_in(win, j, e, x, W)
                        yv = _silu(pre)
                        y[j, e] = yv
                        if cutlass.const_expr(QK):
                            ss = ss + yv * yv
                if cutlass.const_expr(QK):
                    for sh in cutlass.range_constexpr(cfg.LP.bit_length() - 1):
                        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << sh)
                    rn = cute.math.rsqrt(ss + eps, fastmath=True)
                    kh = hk % cfg.Hk
                    for j in cutlass.range_constexpr(NV):
                        if act[j]:
                            for e in cutlass.range_constexpr(VEC):
                                out[e] = y[j, e] * rn
                            oo = (Int64(t) * cfg.Hk + kh) * (Rq * cfg.dk) + (ch[j] % cfg.dk)
                            if hk < cfg.Hk:
                                for rr in cutlass.range_constexpr(Rq):
                                    _stv(o1, oo + rr * cfg.dk, [out[e] for e in range(VEC)], VEC)
                            else:
                                for rr in cutlass.range_constexpr(Rq):
                                    _stv(o2, oo + rr * cfg.dk, [out[e] for e in range(VEC)], VEC)
                else:
                    if act[0]:
                        oo = Int64(t) * (cfg.Hv * cfg.dv) + (ch[0] - 2 * cfg.Hk * cfg.dk)
                        _stv(o1, oo, [y[0, e] for e in range(VEC)], VEC)
        if cutlass.const_expr(not cfg.CA) and b + 1 < NB:
            for j in cutlass.range_constexpr(NV):
                for r in cutlass.range_constexpr(U):
                    for i in cutlass.range_constexpr(NW):
                        buf[j, r, i] = buf[j, U + r, i]


@cute.jit
def copy_z_rows(cfg: cutlass.Constexpr, src: cute.Pointer, s_row: cutlass.Constexpr, s_col: cutlass.Constexpr,
                dst: cute.Pointer, d_row: cutlass.Constexpr, d_col: cutlass.Constexpr, uu, t0, nb, tend):
    """A Z unit's copy, THREADS vectors of the z section a row, 2*U rows of loads in flight: rows t0 ..
    t0 + nb*2U - 1 below tend, vector vv of a row at src[t*s_row + s_col + vv*VEC] -> dst[t*d_row + d_col +
    vv*VEC] (the forward: mixed's z section -> z; the backward, cute_pre_gated_bwd: gz -> dmixed's)."""
    VEC, U = cfg.VEC, cfg.U
    tid, _, _ = cute.arch.thread_idx()
    vv = uu * cfg.THREADS + tid
    if vv < cfg.NVV:
        NW, _ = _words(src.dtype, VEC)
        buf = cute.make_rmem_tensor((2 * U, NW), _wdt(src.dtype, VEC))
        for b in cutlass.range(nb, unroll=1):
            for r in cutlass.range_constexpr(2 * U):
                t = t0 + b * 2 * U + r
                if t < tend:
                    _ldw(src, Int64(t) * s_row + s_col + vv * VEC, VEC, buf[r, None])
            for r in cutlass.range_constexpr(2 * U):
                t = t0 + b * 2 * U + r
                if t < tend:
                    _stw(dst, Int64(t) * d_row + d_col + vv * VEC, VEC, buf[r, None])


@cute.jit
def _gate_unit(cfg: cutlass.Constexpr, mixed: cute.Pointer, A_log: cute.Pointer, dt_bias: cute.Pointer,
               g: cute.Pointer, beta: cute.Pointer, run, NT):
    """The G unit of one run: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (torch's
    threshold 20) of its L tokens x Hv heads, (token, head) pairs spread over the threads."""
    L, Hv, D = cfg.L, cfg.Hv, cfg.D
    tid, _, _ = cute.arch.thread_idx()
    t0 = run * L
    bo = 2 * cfg.Hk * cfg.dk + 2 * Hv * cfg.dv
    for i in cutlass.range(cdiv(L * Hv, cfg.THREADS), unroll=1):
        p = i * cfg.THREADS + tid
        tt = p // Hv
        h = p % Hv
        t = t0 + tt
        if tt < L and t < NT:
            row = cute.make_tensor(mixed + (Int64(t) * D + bo), cute.make_layout(2 * Hv))
            bb = row[h].to(Float32)
            xa = row[Hv + h].to(Float32) + cute.make_tensor(dt_bias, cute.make_layout(Hv))[h]
            sp = _softplus(xa)
            al = cute.make_tensor(A_log, cute.make_layout(Hv))[h]
            o = Int64(t) * Hv + h
            cute.make_tensor(g + o, cute.make_layout(1))[0] = -cute.math.exp(al) * sp
            cute.make_tensor(beta + o, cute.make_layout(1))[0] = beta.dtype(
                Float32(1.0) / (Float32(1.0) + cute.math.exp(-bb)))


@cute.jit
def _state_unit(cfg: cutlass.Constexpr, mixed: cute.Pointer, cu: cute.Pointer, cs: cute.Pointer, n, sb, T):
    """Conv-state CTA (sequence n, block sb): the last W-1 conv inputs of sequence n of THREADS
    vectors of channels, oldest first, rows before the sequence's start as zeros, into
    conv_state [N, C, W-1]."""
    VEC, W, D, C = cfg.VEC, cfg.W, cfg.D, cfg.C
    tid, _, _ = cute.arch.thread_idx()
    cv = sb * cfg.THREADS + tid
    if cv < C // VEC:
        s0 = n * T
        s1 = s0 + T
        if cutlass.const_expr(cfg.THD):
            cut = cute.make_tensor(cu, cute.make_layout(1 << 30))
            s0 = cut[n]
            s1 = cut[n + 1]
        NW, EPW = _words(mixed.dtype, VEC)
        WD = _wdt(mixed.dtype, VEC)
        buf = cute.make_rmem_tensor((W - 1, NW), WD)
        for j in cutlass.range_constexpr(W - 1):
            row = s1 - (W - 1) + j
            if row >= s0:
                _ldw(mixed, Int64(row) * D + cv * VEC, VEC, buf[j, None])
            else:
                for i in cutlass.range_constexpr(NW):
                    buf[j, i] = WD(0)
        dst = cute.make_tensor(cs + (Int64(n) * C + cv * VEC) * (W - 1), cute.make_layout(VEC * (W - 1)))
        for e in cutlass.range_constexpr(VEC):
            for j in cutlass.range_constexpr(W - 1):
                dst[e * (W - 1) + j] = cs.dtype(_elem(mixed.dtype, buf[j, e // EPW], e % EPW))


def ring_buffer(smem: SmemAllocator, cfg, SW: int, NS: int) -> cute.Tensor:
    """The cp.async ring in shared memory, [SW words, THREADS, NS slots, U rows, S stages] Int32, words
    fastest (one vector a slot), then threads; CA off: a 16-byte placeholder. The forward's slots are its
    NV vectors, the backward's (cute_pre_gated_bwd) x and the grads of each."""
    shape = (SW, cfg.THREADS, NS, cfg.U, cfg.S) if cfg.CA else (SW, 1, 1, 1, 1)
    return smem.allocate_tensor(Int32, cute.make_layout(shape, stride=(
        1, SW, SW * shape[1], SW * shape[1] * shape[2], SW * shape[1] * shape[2] * shape[3])), 16)


@cute.kernel
def _fwd_kernel(cfg: cutlass.Constexpr, mixed: cute.Pointer, cw: cute.Pointer, A_log: cute.Pointer,
                dt_bias: cute.Pointer, cu: cute.Pointer, masks: cute.Pointer, q: cute.Pointer, k: cute.Pointer,
                v: cute.Pointer, z: cute.Pointer, g: cute.Pointer, beta: cute.Pointer, cs: cute.Pointer,
                NT: Int32, T: Int32, eps: Float32):
    bid, _, _ = cute.arch.block_idx()
    smem = SmemAllocator()
    # CA: [word, thread, vector, row, stage]: thread-private 16-byte slots, consecutive threads on
    # consecutive slots (a warp's ld.shared.v4 is conflict-free); each thread reads back only what it
    # copied, so cp.async.wait_group orders it (no barrier)
    sbuf = ring_buffer(smem, cfg, 4, cfg.NV)
    # made here, once: an atom made in both conv units' branches is one IR value (the DSL caches it)
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cute.nvgpu.LoadCacheMode.GLOBAL), Int32, num_bits_per_copy=128)
    nqk, nv, nz, _ = cfg.units
    UNITS = cfg.UNITS
    runs = (NT + cfg.L - 1) // cfg.L
    if bid < runs * UNITS:
        run = bid // UNITS
        u = bid - run * UNITS
        if u < nqk:
            _conv_unit(cfg, True, mixed, cw, masks, q, k, sbuf, atom, u, run, NT, T, eps)
        elif u < nqk + nv:
            _conv_unit(cfg, False, mixed, cw, masks, v, v, sbuf, atom, u - nqk, run, NT, T, eps)
        elif u < nqk + nv + nz:
            copy_z_rows(cfg, mixed, cfg.D, 2 * cfg.Hk * cfg.dk + cfg.Hv * cfg.dv, z, cfg.Hv * cfg.dv, 0,
                        u - nqk - nv, run * cfg.L, cfg.L // (2 * cfg.U), NT)
        else:
            _gate_unit(cfg, mixed, A_log, dt_bias, g, beta, run, NT)
    else:
        if cutlass.const_expr(cfg.STATE and cfg.W > 1):
            sid = bid - runs * UNITS
            _state_unit(cfg, mixed, cu, cs, sid // cfg.SB, sid % cfg.SB, T)


@cute.jit
def _lower_bound(cut: cute.Tensor, a, n, x):
    """The first index i in [a, a + n) with cut[i] >= x (a + n if none), cut nondecreasing."""
    while n > 0:
        half = n // 2
        if cut[a + half] < x:
            a = a + half + 1
            n = n - half - 1
        else:
            n = half
    return a


@cute.kernel
def _starts_kernel(cfg: cutlass.Constexpr, cu: cute.Pointer, masks: cute.Pointer, NT: Int32, S: Int32):
    """THD: one thread a run: bit i of masks[run] says row run*L - (W-1) + i starts a sequence (a
    cu_seqlens entry; found by a binary search of cu_seqlens [S], then a walk over the entries
    inside the run's rows)."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    r = bid * cfg.THREADS + tid
    runs = (NT + cfg.L - 1) // cfg.L
    if r < runs:
        cut = cute.make_tensor(cu, cute.make_layout(1 << 30))
        lo = r * cfg.L - (cfg.W - 1)
        hi = r * cfg.L + cfg.L
        a = _lower_bound(cut, Int32(0), S, lo)
        b = _lower_bound(cut, a, S - a, hi)  # entries a .. b-1 lie in [lo, hi)
        mask = Int64(0)
        for j in cutlass.range(a, b, unroll=1):
            mask = mask | (Int64(1) << Int64(cut[j] - lo))
        cute.make_tensor(masks + Int64(r), cute.make_layout(1))[0] = mask


@cute.jit
def _fwd_host(cfg: cutlass.Constexpr, mixed: cute.Pointer, cw: cute.Pointer, A_log: cute.Pointer,
              dt_bias: cute.Pointer, cu: cute.Pointer, masks: cute.Pointer, q: cute.Pointer, k: cute.Pointer,
              v: cute.Pointer, z: cute.Pointer, g: cute.Pointer, beta: cute.Pointer, cs: cute.Pointer,
              NT: Int32, T: Int32, N: Int32, eps: Float32, stream: cuda.CUstream):
    runs = (NT + cfg.L - 1) // cfg.L
    nblk = runs * cfg.UNITS
    if cutlass.const_expr(cfg.STATE and cfg.W > 1):
        nblk = nblk + N * cfg.SB
    _fwd_kernel(cfg, mixed, cw, A_log, dt_bias, cu, masks, q, k, v, z, g, beta, cs, NT, T, eps).launch(
        grid=[nblk, 1, 1], block=[cfg.THREADS, 1, 1], stream=stream)


@cute.jit
def _starts_host(cfg: cutlass.Constexpr, cu: cute.Pointer, masks: cute.Pointer, NT: Int32, S: Int32,
                 stream: cuda.CUstream):
    runs = (NT + cfg.L - 1) // cfg.L
    _starts_kernel(cfg, cu, masks, NT, S).launch(grid=[(runs + cfg.THREADS - 1) // cfg.THREADS, 1, 1],
                                                 block=[cfg.THREADS, 1, 1], stream=stream)


# ------------------------------------------------------------------ host side


def _elt(dt: torch.dtype) -> int:
    return dt.itemsize


@functools.lru_cache(maxsize=256)
def _launches(cfg: PreCfg, mdt: torch.dtype, wdt: torch.dtype) -> tuple[Launch, Launch]:
    """(the THD start-mask launch, the forward launch) of a config and dtypes."""
    e, a = _elt(mdt), cfg.VEC * _elt(mdt)
    i32, i64, f32 = Ptr(torch.int32, 4), Ptr(torch.int64, 8), Ptr(torch.float32, 4)
    fwd = Launch("gdn.cute_pre_gated.fwd", _fwd_host, cfg,
                 (Ptr(mdt, a), Ptr(wdt, _elt(wdt)), f32, f32, i32, i64, Ptr(mdt, a), Ptr(mdt, a), Ptr(mdt, a),
                  Ptr(mdt, a), f32, Ptr(mdt, e), Ptr(mdt, e), Scalar(Int32), Scalar(Int32), Scalar(Int32),
                  Scalar(Float32)))
    starts = Launch("gdn.cute_pre_gated.starts", _starts_host, cfg, (i32, i64, Scalar(Int32), Scalar(Int32)))
    return starts, fwd


def _align(*ts) -> int:
    """The largest power of two (<= 16) dividing every tensor's address."""
    a = 16
    for t in ts:
        while t.data_ptr() % a:
            a //= 2
    return a


def fwd_launches(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
                 Hk: int = 16, dk: int = 128, dv: int = 128, repeat_qk: bool = True, eps: float = 1e-6,
                 cfg: PreCfg | None = None) -> list[BoundLaunch]:
    """The forward's launches (argument order as the registry's fwd kernel): THD, the start
    masks (one int64 a run, a new buffer) then the forward; BSHD the forward alone."""
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    thd = cu_seqlens is not None
    state = conv_state is not None and W > 1
    D = mixed.shape[-1]
    NT = mixed.numel() // D
    if cfg is None:
        cfg = PreCfg.heuristic(Hk, Hv, dk, dv, W, repeat_qk, thd, state, mixed.element_size(),
                               _align(mixed, q, k, v, z))
    if (cfg.Hk, cfg.Hv, cfg.dk, cfg.dv, cfg.W, cfg.REP, cfg.THD, cfg.STATE) != \
            (Hk, Hv, dk, dv, W, bool(repeat_qk), thd, state):
        raise ValueError(f"gdn_pre_gated cute: config {cfg} does not fit Hk={Hk}, Hv={Hv}, dk={dk}, dv={dv}, "
                         f"W={W}, repeat_qk={repeat_qk}, THD={thd}, conv state={state}")
    if _align(mixed, q, k, v, z) < cfg.VEC * mixed.element_size():
        raise ValueError(f"gdn_pre_gated cute: config {cfg} needs mixed, q, k, v, z at addresses that are "
                         f"multiples of {cfg.VEC * mixed.element_size()} bytes")
    if thd:
        cu_seqlens = on_device(cu_seqlens, mixed.device, "gdn_pre_gated (cute): cu_seqlens")
    starts, fwd = _launches(cfg, mixed.dtype, conv_weight.dtype)
    runs = cdiv(NT, cfg.L)
    out = []
    if thd:
        N = cu_seqlens.shape[0] - 1
        masks = torch.empty(runs, dtype=torch.int64, device=mixed.device)
        out.append(BoundLaunch(starts, (cu_seqlens, masks, NT, N + 1)))
        T = 1
    else:
        N, T = mixed.shape[0], mixed.shape[1]
        masks = A_log  # never read (BSHD); a valid pointer of any dtype stands in
    cu = cu_seqlens if thd else A_log
    cs = conv_state if state else beta
    out.append(BoundLaunch(fwd, (mixed, conv_weight, A_log, dt_bias, cu, masks, q, k, v, z, g, beta, cs, NT, T, N,
                                 float(eps))))
    return out


pre_gated_fwd_into = pre_gated_fwd_runner(fwd_launches)


kernel("gdn_pre_gated", "cute", "fwd")(pre_gated_fwd_into)


def representative_launches(Hk: int = 16, Hv: int = 32, dk: int = 128, dv: int = 128, W: int = 4,
                            dtype=torch.bfloat16, wdtype=None, thd: bool = False, repeat_qk: bool = True,
                            state: bool = True, align: int = 16, cfg: PreCfg | None = None) -> tuple[Launch, ...]:
    """The launches at one head shape, for the CPU compile test (``Launch.export("sm_90a")``):
    THD (start masks, forward), BSHD (forward)."""
    cfg = cfg or PreCfg.heuristic(Hk, Hv, dk, dv, W, repeat_qk, thd, state and W > 1, _elt(dtype), align)
    starts, fwd = _launches(cfg, dtype, wdtype or dtype)
    return (starts, fwd) if thd else (fwd,)


# registers the bwd kernel (that module imports this one's helpers, so it comes last)
from . import cute_pre_gated_bwd  # noqa: E402,F401
