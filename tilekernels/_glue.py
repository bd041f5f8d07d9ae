"""Launch glue the families share: the eager/traced pass runner and output
allocation (with test poisoning). The kernel table itself lives in
:mod:`registry.kernels` (re-exported here); imports run one way, specs <-
registry <- families, so nothing here is imported by the registry."""
from __future__ import annotations

from typing import Callable, Optional

from registry.kernels import get_kernel, has_kernel, kernel  # noqa: F401 (families import them from here)


def run_pass(custom_op: Callable, op: str, pass_: str, *args, backend: str, via_op: Optional[bool] = None) -> None:
    """Run ``op``'s ``pass_`` kernel of ``backend`` on ``args`` (the custom op's
    arguments without ``backend``): through the custom op while torch.compile or
    torch.export traces, or while a dispatch mode is active (make_fx, FlopCounterMode,
    selective checkpointing: they must see the op; a generated op's eager fwd pass under a mode
    takes its functional op instead, see ``_opgen._Gen.forward``), directly otherwise (plain
    eager calls skip the dispatcher's per-call cost: measured ~12 us per call on
    the H200 host, against a ~10 us Sinkhorn kernel). ``via_op``: the caller's answer where it
    already has one (the generated ops' passes: a torch.func transform's wrapped tensors also
    need the dispatcher, which unwraps them), so it is not asked twice."""
    import torch

    if via_op is None:
        via_op = torch.compiler.is_compiling() or bool(torch._C._len_torch_dispatch_stack())
    if via_op:
        custom_op(*args, backend)
    else:
        run_kernel(get_kernel(op, backend, pass_), args)


def run_kernel(fn: Callable, args) -> None:
    """``fn(*args)`` (a kernel) with autocast off (the eager path and every custom op's body). An op's
    precision is its spec's: under a caller's ``torch.autocast`` the torch reference's and the
    glue's fp32 / float64 matmuls would otherwise run in bf16 (measured on the CPU: fp32 outputs
    off by 1e-3, grouped_mlp_mxfp8 by 1.4e-2). One C call when autocast is off."""
    import torch

    if not torch._C._is_any_autocast_enabled():
        fn(*args)
        return
    # the enabled flags themselves (C calls; a torch.autocast(enabled=False) context costs ~3 us a pass)
    on = [dev for dev in ("cpu", "cuda") if torch.is_autocast_enabled(dev)]
    for dev in on:
        torch.set_autocast_enabled(dev, False)
    try:
        fn(*args)
    finally:
        for dev in on:
            torch.set_autocast_enabled(dev, True)


# --------------------------------------------------------------------------
# Output allocation. Every allocating wrapper gets its outputs from `empty`, so
# tests can switch on poisoning (NaN floats, 0x7f.. integers): an element a
# kernel forgets to write then fails the comparison instead of passing by luck.
import contextlib  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402



def env_flag(name: str, default: bool) -> bool:
    """An on / off switch read from the environment (the project's one convention): unset gives
    ``default``; "" and "0" are off, any other value on."""
    v = os.environ.get(name)
    return default if v is None else v not in ("", "0")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """A named choice read from the environment; a value outside ``choices`` is an error that
    names the variable (never silently the default)."""
    v = os.environ.get(name, default)
    if v not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {v!r}")
    return v


_POISON = [env_flag("TILEKERNELS_POISON", False), "nan"]


@contextlib.contextmanager
def poisoned(on: bool = True, kind: str = "nan"):
    """Within the block, outputs are allocated filled with NaN / a sentinel (``kind`` "nan": NaN, e4m3's NaN 0x7F,
    0xFF for uint8 (an E8M0 NaN scale), True, the int max), or with finite sentinels (``kind`` "finite": -1234.5,
    e4m3 byte 0x2A, uint8 0x55, False, the int min). NaN poison fails an unwritten element whose right value is
    finite; a test whose right values include NaN (a non-finite MXFP8 block, a NaN that must propagate) runs under
    the finite kind too, where an unwritten element cannot pass as the NaN it should hold."""
    if kind not in ("nan", "finite"):
        raise ValueError(f"poison kind must be 'nan' or 'finite', got {kind!r}")
    old = list(_POISON)
    _POISON[:] = [on, kind]
    try:
        yield
    finally:
        _POISON[:] = old


def poison_(t: torch.Tensor) -> torch.Tensor:
    finite = _POISON[1] == "finite"
    if t.dtype == torch.float8_e4m3fn and finite:
        t.view(torch.uint8).fill_(0x2A)
        return t
    if t.is_floating_point():
        return t.fill_(-1234.5 if finite else float("nan"))  # e4m3fn: 0x7F, its NaN
    if t.dtype == torch.bool:
        return t.fill_(not finite)
    if t.dtype == torch.uint8:
        return t.fill_(0x55 if finite else 0xFF)
    return t.fill_(torch.iinfo(t.dtype).min if finite else torch.iinfo(t.dtype).max)


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty, poisoned when poisoning is on (tests)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    # eager only: traced into a compiled graph (torch 2.11), a fill of the fresh output before the mutating custom
    # op left the compiled backward's custom op seeing dy = 0 (session 12, benchmarks/results/h200-compile-fwd-bwd.txt;
    # reduced to torch alone in session 13: benchmarks/probes/aot_fill_repro.py, AOTAutograd with inductor and
    # aot_eager, CUDA and CPU; right on torch 2.13's CPU build). Compiled calls are tested against poisoned eager.
    if _POISON[0] and not torch.compiler.is_compiling():
        poison_(t)
    return t


def aligned16(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t``, or a copy where its address is not 16-byte aligned (vector and TMA accesses need aligned rows;
    torch's allocations are, a view's offset may not be). None passes through."""
    return t if t is None or t.data_ptr() % 16 == 0 else t.clone()


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return empty(t.shape, dtype or t.dtype, t.device)


def acc_dtype(*ts) -> torch.dtype:
    """The reference's accumulation dtype: float64 if any input is, else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


# Compile keys of GPU launches (tilekernels/_cutile.py and _cute.py record into the same set):
# inside record_compile_keys(), every Launch.run adds its key to COMPILE_KEYS (off by default:
# building a key costs ~15 us a launch), so tests can check that a new batch size reuses a kernel.
COMPILE_KEYS: set[tuple] = set()
_RECORD_KEYS = [False]


@contextlib.contextmanager
def record_compile_keys():
    """Within the block, every ``Launch.run`` adds its compile key to ``COMPILE_KEYS``."""
    old, _RECORD_KEYS[0] = _RECORD_KEYS[0], True
    try:
        yield COMPILE_KEYS
    finally:
        _RECORD_KEYS[0] = old


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (cuTile tile dims are powers of two; mhc's padded widths)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


_SMS: dict = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``, cached per device (132 for meta / CPU tensors: the H200's
    count, so CPU compile tests build the grids the H200 gets). Shared by the cuTile and CuTe
    DSL launchers (grids sized by the SM count)."""
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def may_keep(t: torch.Tensor) -> bool:
    """Whether a tensor a call just made may be kept for later calls (a cache of workspaces or constant tables):
    not made during a CUDA-graph capture, and, on CUDA, in the caching allocator's default pool (segment_pool_id
    (0, 0)), not in a graph's private pool or a ``torch.cuda.MemPool``. Inductor's CUDA graph trees
    (torch.compile mode="reduce-overhead") run each graph's warm-up eagerly, not capturing, with this thread's
    allocations routed to the graph's pool, and fail when a block there outlives the call without being an
    output (session 54: mhc_sinkhorn's cuTile backward). No query says the routing is on, so the tensor's
    segment is looked up: ``memory_snapshot`` walks every segment, so ask once per new tensor, never per call."""
    if t.device.type != "cuda":
        return True
    if torch.cuda.is_current_stream_capturing():
        return False
    ptr = t.untyped_storage().data_ptr()
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0)
    return False


def on_device(t: torch.Tensor, device: torch.device, what: str) -> torch.Tensor:
    """``t`` on ``device``: metadata a caller may keep on the host (OPS.md: m_splits, cu_seqlens)
    copied without waiting for the GPU (non_blocking: the pageable copy is staged before it
    returns). Refused inside a CUDA-graph capture, which cannot record a copy from pageable
    memory: pass it on the GPU there."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what}: a CUDA-graph capture needs it on the GPU (a CPU tensor would be copied "
                           "from pageable memory during the capture)")
    return t.to(device, non_blocking=True)


def launch_into(make_launch):
    """A destination-passing registry kernel from a launch factory: ``into(*args)`` builds
    ``make_launch(*args)`` (the op's inputs, outputs and params, positional in spec order) and runs
    it; an empty batch (first input's leading dim 0) launches nothing. One definition for the
    backends whose kernel is one launch (gdn_decode's two CuTe DSL kernels; its cuTile one adds aligned copies:
    cutile_decode.decode_into)."""
    def into(*args):
        if args[0].shape[0]:
            make_launch(*args).run()
    into.__qualname__ = into.__name__ = f"{make_launch.__name__}_into"
    return into


def needs_sm90(device: torch.device, what: str) -> str | None:
    """Why ``what`` (an sm_90-only kernel or path) cannot run on ``device``, or None when it can:
    the check every sm_90-only ``supported`` makes (asked per call, never cached, so a test's
    patched torch.cuda.get_device_capability is seen)."""
    if device.type != "cuda":
        return f"needs a CUDA device, got {device.type}"
    cap = torch.cuda.get_device_capability(device)
    return None if cap == (9, 0) else f"{what}; device is sm_{cap[0]}{cap[1]}"


def _raw_stream(index: int) -> int:
    """cudaStream_t of torch's current stream on device ``index`` (what cuTile's launch takes)."""
    return torch._C._cuda_getCurrentRawStream(index)


# Per-(tag, device, stream) kernel workspaces (``workspace``); TILEKERNELS_SCRATCH_REUSE=0 turns
# the reuse off (every call allocates).
WORKSPACE_REUSE = [env_flag("TILEKERNELS_SCRATCH_REUSE", True)]
_WORKSPACES: dict = {}
_WORKSPACES_MAX = 16


def workspace(tag: str, shape: tuple, dtype: torch.dtype, device: torch.device, zero: bool = False) -> torch.Tensor:
    """A kernel's temporary buffer [shape] (contiguous), kept between eager calls per (tag,
    device, current stream, dtype) so that a call does not allocate: grown (never shrunk) when
    a call needs more, a view of its first elements otherwise. ``zero``: zero-filled when
    allocated, and the kernels using it must leave it zero (e.g. counters reset by their last
    user). Launches on one stream are ordered, so they never share it concurrently; a dropped
    buffer goes back to torch's allocator on that stream. Inside a graph capture (and off CUDA,
    e.g. ``meta`` for the compile tests, or with the reuse off) it is a new tensor from the
    allocator -- the capture's pool -- so a graph never holds a buffer this cache may drop. A new
    buffer that ``may_keep`` refuses (Inductor's CUDA-graph warm-up routes allocations to the
    graph's pool without capturing) is handed out but not kept: that pool must not hold a block
    past the call. (So a caller whose allocations always go to a ``torch.cuda.MemPool`` gets a fresh
    buffer and one ``memory_snapshot`` walk a call: correct, not free.)"""
    alloc = torch.zeros if zero else torch.empty
    if device.type != "cuda" or not WORKSPACE_REUSE[0] or torch.cuda.is_current_stream_capturing():
        return alloc(shape, dtype=dtype, device=device)
    n = math.prod(shape)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (tag, idx, _raw_stream(idx), dtype)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < n:
        buf = alloc(max(n, 1), dtype=dtype, device=device)
        if not may_keep(buf):
            return buf[:n].view(shape)
        if len(_WORKSPACES) >= _WORKSPACES_MAX:
            _WORKSPACES.clear()
        _WORKSPACES[key] = buf
    return buf[:n].view(shape)


@contextlib.contextmanager
def workspace_reuse(on: bool = True):
    """Within the block, ``workspace()`` reuses its buffers (on) or allocates each (off)."""
    old, WORKSPACE_REUSE[0] = WORKSPACE_REUSE[0], on
    try:
        yield
    finally:
        WORKSPACE_REUSE[0] = old
