"""Shared CuTe DSL (``nvidia-cutlass-dsl`` 4.8.1, ``import cutlass.cute``) launch and compile helpers.

The CuTe DSL counterpart of ``_cutile.py``. Every CuTe DSL backend module builds
its launches the same way:

* A ``@cute.jit`` **host function** ``fn(cfg, *args, stream)`` whose first
  parameter is ``cfg: cutlass.Constexpr`` (the launch config) and whose last is
  ``stream: cuda.CUstream``; in between come the runtime arguments described by
  **arg specs** (:class:`Ptr`, :class:`Tensor`, :class:`Scalar`). The host
  function builds layouts, picks the grid and launches its ``@cute.kernel``.
* A frozen dataclass **launch config** per kernel family (tile sizes, static
  dims such as K, thread counts) with a ``heuristic(...)`` classmethod taking
  the problem's static dims only (never M, R or T). It reaches the host function
  as a ``Constexpr``, so it is traced into the kernel and is part of the key.
* A :class:`Launch` ``(name, fn, cfg, sig)``: ``sig`` is the tuple of arg specs,
  which fixes dtypes, static dims and alignments. The **compile key** is
  ``(name, host fn, sig, cfg, ptxas options, arch)`` (:meth:`Launch.key`). Batch dims (M, R, T) are
  runtime scalars (:class:`Scalar`) or dynamic tensor modes (``None`` in
  :class:`Tensor`), so a new M reuses the compiled kernel. Compiled kernels live
  in ``_COMPILED`` (this module's cache, not CuTe's); inside
  ``record_compile_keys()`` each :meth:`Launch.run` adds its key to
  ``COMPILE_KEYS`` so tests can check reuse.
* One compile path for both uses: :meth:`Launch.compile` always compiles from
  **fake** arguments built from ``sig`` (``make_ptr(dtype, 0)``,
  ``make_fake_compact_tensor`` with ``cute.sym_int`` dynamic modes,
  ``make_fake_stream``) with an explicit ``cute.GPUArch``; no GPU or driver is
  touched. On a GPU, :meth:`Launch.run` compiles for the tensors' device arch
  (``sm_90a`` on an H100/H200) and calls the result with the **real** arguments
  built from the same specs; :meth:`Launch.export` compiles for any arch
  (``sm_90a``, ``sm_100a``) and returns the PTX text and cubin bytes (CI).

How 4.8.1 picks the target arch: ``cute.compile[cute.GPUArch("sm_90a")](...)``
sets it per compile (what this module always does); without it CuTe falls back
to ``CUTE_DSL_ARCH`` (read when ``cutlass`` is imported) and then to probing the
driver. So ``CUTE_DSL_ARCH`` is not needed here; :func:`device_arch` honours it
only as an override of the detected GPU's arch.

Runtime arguments: :class:`Ptr` (``make_ptr`` of ``data_ptr()``, ~1 us; the host
function builds the layout from static dims and :class:`Scalar` batch dims) is
the cheap default for contiguous tensors; :class:`Tensor` (``from_dlpack`` with
``assumed_align`` and ``mark_compact_shape_dynamic`` on its ``None`` modes, ~6 us)
gives the host function a ready ``cute.Tensor`` (e.g. for TMA descriptors).
fp8 tensors: torch ``float8_e4m3fn`` maps to ``cutlass.Float8E4M3FN``; a
:class:`Ptr` only takes the address, so dtype views are free either way
(``from_dlpack`` of ``float8_e4m3fn`` also works in 4.8.1).

The stream is torch's current stream on the tensors' device. 4.8.1 loads a
compiled kernel as a context-free ``cudaLibrary`` and launches it in the current
context, so :meth:`Launch.run` makes the tensors' device current when it is not.
Per call, :meth:`Launch.run` writes the argument values into a per-thread
argument buffer with one ``struct.pack_into`` (:func:`_packer`) and calls the
executor directly (~2 us instead of the DSL's ~30 us of per-call marshalling);
:meth:`Launch.fast_path` checks, per compiled kernel, that the DSL marshals those
arguments as one C pointer each. The array of the slots' addresses that the
compiled host function reads is built once per thread and executor
(:func:`_prepacked`; the DSL's ``run_compiled_program`` rebuilds it on every
call), so a launch is the pack and one ctypes call.

Importing this module needs ``cutlass`` and ``cuda.bindings`` but no GPU and no
driver.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
import tempfile
import threading
from typing import Any, Callable

import torch

from tilekernels._glue import COMPILE_KEYS, _RECORD_KEYS, record_compile_keys  # noqa: F401 (re-exported)

import cutlass
import cutlass.cute as cute
from cuda.bindings import driver as cuda  # noqa: F401  (re-exported: host functions annotate `stream: cuda.CUstream`)
from cutlass._mlir.dialects import llvm
from cutlass._mlir.extras import types as _mlir_types
from cutlass.base_dsl.compiler import DumpDir, PtxasOptions
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.cute.runtime import from_dlpack, make_fake_compact_tensor, make_fake_stream, make_ptr

__all__ = [
    "COMPILE_KEYS", "record_compile_keys", "cute_dtype", "device_arch", "cdiv",
    "Ptr", "Tensor", "Scalar", "Launch", "Artifacts", "clear_cache", "cuda", "cubin_resources", "f32_bits", "bits_f32",
]

_DTYPES = {
    torch.bfloat16: cutlass.BFloat16,
    torch.float16: cutlass.Float16,
    torch.float32: cutlass.Float32,
    torch.float64: cutlass.Float64,
    torch.float8_e4m3fn: cutlass.Float8E4M3FN,
    torch.float8_e5m2: cutlass.Float8E5M2,
    torch.uint8: cutlass.Uint8,
    torch.int8: cutlass.Int8,
    torch.int16: cutlass.Int16,
    torch.int32: cutlass.Int32,
    torch.int64: cutlass.Int64,
}

# the recorded compile keys are shared with every GPU launcher (tilekernels/_glue.py)
# Launch.key -> compiled function (CuTe's JitCompiledFunction)
_COMPILED: dict[tuple, Any] = {}
# (Launch.key, device index) -> executor (compiled.to(index): the loaded library)
_EXECUTORS: dict[tuple, Any] = {}
_LOCK = threading.RLock()  # one compile at a time (the DSL's MLIR context is process-global)


def clear_cache() -> None:
    """Forget every compiled kernel and the recorded keys (Launch objects that already ran
    keep their own executors)."""
    with _LOCK:
        _COMPILED.clear()
        _EXECUTORS.clear()
        COMPILE_KEYS.clear()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cute_dtype(dtype: torch.dtype):
    """The ``cutlass`` numeric type of a torch dtype (``float8_e4m3fn`` -> ``Float8E4M3FN``)."""
    return _DTYPES[dtype]


_ARCH_OF_DEVICE: dict[int, str] = {}


def device_arch(device: torch.device | int | None = None) -> str:
    """Compile target for a CUDA device: ``sm_<major><minor>a`` from its compute
    capability (``sm_90a`` on H100/H200: wgmma, TMA and setmaxnreg need the ``a``
    target), unless ``CUTE_DSL_ARCH`` is set, which wins. Needs a GPU unless the
    variable is set."""
    env = os.environ.get("CUTE_DSL_ARCH")
    if env:
        return env
    idx = device.index if isinstance(device, torch.device) else device
    idx = torch.cuda.current_device() if idx is None else idx
    arch = _ARCH_OF_DEVICE.get(idx)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(idx)
        arch = _ARCH_OF_DEVICE[idx] = f"sm_{major}{minor}a"
    return arch


_CTYPES = {
    cutlass.Int32: ctypes.c_int32, cutlass.Int64: ctypes.c_int64, cutlass.Uint32: ctypes.c_uint32,
    cutlass.Uint64: ctypes.c_uint64, cutlass.Float32: ctypes.c_float, cutlass.Float64: ctypes.c_double,
}

# ------------------------------------------------------------------ argument specs
# Each spec is a frozen (hashable) dataclass: part of the compile key. ``fake()``
# gives the compile-time stand-in, ``real(value)`` the runtime argument.

@dataclasses.dataclass(frozen=True)
class Ptr:
    """A contiguous tensor passed as a typed global-memory pointer (its address only).

    The host function receives a ``cute.Pointer`` and builds the layout itself,
    e.g. ``cute.make_tensor(p, cute.make_layout((R, K), stride=(K, 1)))`` with
    ``K`` static (from cfg) and ``R`` a :class:`Scalar`. ``align`` is the byte
    alignment the compiler may assume (16 enables 128-bit accesses; torch's
    allocations are 256-byte aligned, a view's offset may not be: the caller
    checks). ``dtype`` is the element type the kernel sees, whatever the torch
    tensor's dtype is (e.g. ``torch.uint8`` for fp8 data read as bytes)."""

    dtype: torch.dtype
    align: int = 16

    def fake(self):
        return make_ptr(cute_dtype(self.dtype), 0, cute.AddressSpace.gmem, assumed_align=self.align)

    def real(self, t: torch.Tensor | None):
        """``None`` gives a null pointer: for an output the config switches off."""
        return make_ptr(cute_dtype(self.dtype), 0 if t is None else t.data_ptr(),
                        cute.AddressSpace.gmem, assumed_align=self.align)

    # fast path (Launch.run): the value the compiled function reads for this argument
    ctype = ctypes.c_void_p

    @staticmethod
    def raw(t: torch.Tensor | None) -> int:
        return 0 if t is None else t.data_ptr()


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A row-major contiguous tensor passed as a ``cute.Tensor`` (via DLPack).

    ``shape`` has an int per static mode and ``None`` per dynamic (batch) mode;
    static modes must match the runtime tensor. The runtime tensor's dtype must
    be ``dtype`` (DLPack carries it)."""

    dtype: torch.dtype
    shape: tuple
    align: int = 16

    def fake(self):
        shape = tuple(cute.sym_int() if d is None else d for d in self.shape)
        order = tuple(range(len(shape) - 1, -1, -1))  # mode 0 outermost (0 = innermost here)
        return make_fake_compact_tensor(cute_dtype(self.dtype), shape, stride_order=order,
                                        assumed_align=self.align)

    ctype = None  # no fast path: DLPack descriptors go through the DSL's own marshalling

    def real(self, t: torch.Tensor):
        ct = from_dlpack(t, assumed_align=self.align)
        order = tuple(range(t.dim()))  # torch's dim_order of a row-major tensor
        for mode, d in enumerate(self.shape):
            if d is None:
                ct = ct.mark_compact_shape_dynamic(mode=mode, stride_order=order)
        return ct


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A runtime scalar (batch dim, offset, fp32 factor) of ``type`` (``cutlass.Int32``,
    ``Int64``, ``Float32``, ...). Pass a Python number at run time."""

    type: Any = cutlass.Int32

    def fake(self):
        return self.type(0)

    def real(self, v):
        return v

    @property
    def ctype(self):
        return _CTYPES.get(self.type)

    @staticmethod
    def raw(v):
        return v


# ------------------------------------------------------------------ launches

@dataclasses.dataclass
class Artifacts:
    """What :meth:`Launch.export` returns: the compiled object and its PTX / cubin."""

    arch: str
    compiled: Any
    ptx: str
    cubin: bytes


@dsl_user_op
def f32_bits(x, *, loc=None, ip=None) -> cutlass.Int32:
    """The bits of an fp32 value as an int32 (a bitcast; called from a ``@cute.kernel`` / ``@cute.jit``)."""
    return cutlass.Int32(llvm.bitcast(_mlir_types.i32(), cutlass.Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def bits_f32(i, *, loc=None, ip=None) -> cutlass.Float32:
    """The fp32 value of an int32's bits (a bitcast; called from a ``@cute.kernel`` / ``@cute.jit``)."""
    return cutlass.Float32(llvm.bitcast(_mlir_types.f32(), cutlass.Int32(i).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def _cluster_addr(sptr, rank, loc, ip):
    """The shared::cluster address (an addrspace(3) pointer: ld / st with ``ss="cluster"``) of the local smem pointer
    ``sptr``'s place in the shared memory of the cluster's CTA ``rank`` (mapa)."""
    from cutlass._mlir import ir
    from cutlass._mlir.dialects import nvvm

    dptr = nvvm.mapa(llvm.PointerType.get(7), sptr.to_llvm_ptr(loc=loc, ip=ip),
                     cutlass.Int32(rank).ir_value(loc=loc, ip=ip), loc=loc, ip=ip)
    addr = llvm.ptrtoint(ir.IntegerType.get_signless(32), dptr, loc=loc, ip=ip)
    return llvm.inttoptr(llvm.PointerType.get(3), addr, loc=loc, ip=ip)


@dsl_user_op
def st_cluster_f32(sptr, rank, val, *, loc=None, ip=None) -> None:
    """st.shared::cluster of the fp32 ``val`` at ``sptr``'s place in the shared memory of the cluster's CTA
    ``rank`` (called from a ``@cute.kernel``; the caller orders it: fences, barriers)."""
    cute.arch.store(_cluster_addr(sptr, rank, loc, ip), cutlass.Float32(val), ss="cluster", loc=loc, ip=ip)


@dsl_user_op
def ld_cluster_f32(sptr, rank, *, loc=None, ip=None) -> cutlass.Float32:
    """ld.shared::cluster of the fp32 at ``sptr``'s place in the shared memory of the cluster's CTA ``rank``
    (called from a ``@cute.kernel``; the caller orders it: fences, barriers)."""
    return cute.arch.load(_cluster_addr(sptr, rank, loc, ip), cutlass.Float32, ss="cluster", loc=loc, ip=ip)


def cluster_lock(smem, size: int):
    """(called from a ``@cute.kernel`` by every thread, before the roles split) A cluster lock step's two mbarriers
    in ``smem`` (a SmemAllocator), each completed by the ``size`` - 1 peers' arrivals; returns their pointer. Step k
    uses barrier k % 2 with phase (k // 2) % 2: a peer's arrival for step k + 2 cannot land before this CTA's wait for
    step k (the peer first needs this CTA's arrival for k + 1). Ends with a cluster barrier, so every CTA has its
    barriers before any remote arrive."""
    bars = smem.allocate_array(cutlass.Int64, 2, byte_alignment=8)
    _cluster_lock_init(bars, size)
    return bars


@cute.jit
def _cluster_lock_init(bars: cute.Pointer, size: cutlass.Constexpr) -> None:
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        cute.arch.mbarrier_init(bars, size - 1)
        cute.arch.mbarrier_init(bars + 1, size - 1)
    cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive_relaxed()
    cute.arch.cluster_wait()


def launch_bounded(kernel, min_blocks: int, **launch) -> None:
    """``kernel.launch(**launch)`` (called from a ``@cute.jit`` host function); ``min_blocks`` > 0
    becomes the kernel's .minnctapersm (ptxas caps the registers for that many CTAs an SM). The
    carveout (-1: the driver's default) is given with it because the DSL otherwise asks the driver
    for the SM's shared memory at compile time (no CPU compile)."""
    if cutlass.const_expr(min_blocks > 0):
        kernel.launch(**launch, min_blocks_per_mp=min_blocks, preferred_smem_carveout=-1)
    else:
        kernel.launch(**launch)


def launch_strips(cfg, kernel, rows, stream) -> None:
    """Launch a kernel over 32-row strips (called from a ``@cute.jit`` host function): grid
    (cdiv(rows, 32), cfg.grid_x), 32 * cfg.warps threads, ``cfg.min_blocks`` CTAs an SM
    (:func:`launch_bounded`)."""
    launch_bounded(kernel, cfg.min_blocks, grid=[cute.ceil_div(rows, 32), cfg.grid_x, 1],
                   block=[32 * cfg.warps, 1, 1], stream=stream)


def prefetch_tma(*atoms) -> None:
    """Prefetch the TMA descriptors of ``atoms`` (called by one warp of a ``@cute.kernel``)."""
    from cutlass.cute.nvgpu import cpasync

    for a in atoms:
        cpasync.prefetch_descriptor(a)


def tma_tiles(atom, s, g, tiler, coord=None):
    """(smem view, gmem view) of a one-CTA TMA atom (called from a ``@cute.kernel``): ``s`` the shared-memory
    buffers (a tile's modes first, then the buffer index), ``g`` the global tensor cut into ``tiler`` tiles
    (``cute.local_tile`` at ``coord``, every mode free by default); index the results as
    ``gview[None, tile coords...]`` / ``sview[None, buffer]``."""
    from cutlass.cute.nvgpu import cpasync

    tiles = cute.local_tile(g, tiler, coord if coord is not None else (None,) * cute.rank(g))
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2), cute.group_modes(tiles, 0, 2))


def tma_pipeline(smem, stages: int, tx_count: int, consumer_warps: int):
    """A CTA's TMA ring of ``stages`` (called from a ``@cute.kernel``): its full / empty mbarrier pairs
    allocated in ``smem`` (a SmemAllocator), one producer thread arriving with ``tx_count`` bytes a
    stage, one release per consumer warp, no cluster (``cutlass.pipeline.PipelineTmaAsync``)."""
    import cutlass.pipeline as pipeline

    bars = smem.allocate_array(cutlass.Int64, 2 * stages, byte_alignment=8)
    return pipeline.PipelineTmaAsync.create(
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps),
        tx_count=tx_count, barrier_storage=bars, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))


def release_read_stage(pipe, state, fence: bool = True) -> None:
    """A consumer warp's release of a TMA ring stage it read (called from a ``@cute.kernel``, by every lane of the
    warp): ``fence.proxy.async.shared::cta`` first, so its ld.shared of the stage are done before the producer's TMA
    (an async-proxy write) refills it (the arrive alone does not order them: :func:`unfenced_releases`), then the
    warp's lanes converge and its elected lane arrives. ``fence`` False: only the memory-pattern probes."""
    if fence:  # a Python bool: decided at trace time
        cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.sync_warp()
    pipe.consumer_release(state)


@cute.jit
def ring_producer(pipe: cutlass.Constexpr, stages: cutlass.Constexpr, items: cutlass.Int32, load: cutlass.Constexpr,
                  store: cutlass.Constexpr) -> None:
    """One producer warp's loop over a TMA ring whose released stages hold results to store (called from a
    ``@cute.kernel``): item k (0 .. items-1) is loaded by ``load(stage, k, bar)`` into the next free stage; a
    stage that comes back holds item k - stages's results, which lane 0 stores first by ``store(stage, item)``
    (TMA stores waited until they have read the stage), and the last min(stages, items) once released after
    the loop; then lane 0 waits for the stores to complete. ``pipe``: :func:`tma_pipeline`'s."""
    import cutlass.pipeline as pipeline

    pst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
    sst = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)  # one round behind
    for _ in cutlass.range_constexpr(stages):
        sst.advance()
    lane0 = cute.arch.lane_idx() == 0
    for k in cutlass.range(items, unroll=1):
        pipe.producer_acquire(pst)
        if k >= stages:
            if lane0:
                store(sst.index, k - stages)
            sst.advance()
        load(pst.index, k, pipe.producer_get_barrier(pst))
        pipe.producer_commit(pst)
        pst.advance()
    for q in cutlass.range(cutlass.max(items - stages, 0), items, unroll=1):
        pipe.sync_object_empty.wait(sst.index, sst.phase)
        if lane0:
            store(sst.index, q)
        sst.advance()
    if lane0:
        cute.arch.cp_async_bulk_wait_group(0, read=False)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One CuTe DSL kernel at one config: ``fn(cfg, *args, stream)`` with ``args``
    described by ``sig``.

    Build it once per static problem (e.g. behind ``functools.lru_cache`` on the
    static dims): :meth:`run` then costs a few lookups, one ``struct.pack_into`` of
    the arguments and the launch. ``name`` names the kernel in the key (use
    ``"<module>.<kernel>"``).

    Example (a host function over a [R, K] tensor with K static)::

        @cute.jit
        def _host(cfg: cutlass.Constexpr, x: cute.Pointer, y: cute.Pointer,
                  R: cutlass.Int32, stream: cuda.CUstream):
            lay = cute.make_layout((R, cfg.K), stride=(cfg.K, 1))
            _kernel(cfg, cute.make_tensor(x, lay), cute.make_tensor(y, lay)).launch(
                grid=(cute.ceil_div(R, 32), 1, 1), block=(128, 1, 1), stream=stream)

        ln = Launch("moe.mine.kernel", _host, MyCfg.heuristic(K),
                    (Ptr(torch.bfloat16), Ptr(torch.uint8), Scalar(cutlass.Int32)))
        ln.run(x, y, x.shape[0])        # GPU; ln.export("sm_90a") on a CPU
    """

    name: str
    fn: Callable
    cfg: Any
    sig: tuple
    # extra ptxas options (e.g. "-O3"); part of the key. Note: ptxas ignores --maxrregcount
    # for CuTe kernels (they carry .reqntid), and launch(min_blocks_per_mp=...) queries the
    # driver at compile time, so neither caps registers in a CPU compile
    ptxas: str = ""
    # per-device executors and per-thread argument slots of this instance (not copied by
    # dataclasses.replace: a replaced cfg is another kernel)
    _executors: dict = dataclasses.field(default_factory=dict, init=False, compare=False, hash=False,
                                         repr=False)

    def key(self, arch: str) -> tuple:
        # the host function's qualified name too: two host functions given one ``name`` (as
        # cute_quantize's pipelined and plain quantize are) never share a compiled kernel
        # (a callable with no qualified name, e.g. a partial: its repr)
        fn = getattr(self.fn, "__wrapped__", self.fn)
        host = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
        return (self.name, host, self.sig, self.cfg, self.ptxas, arch)

    def fake_args(self) -> tuple:
        return tuple(s.fake() for s in self.sig)

    def compile(self, arch: str, *options) -> Any:
        """The compiled function for ``arch`` (cached on the key; ``options`` such as
        ``cute.KeepPTX()`` bypass the cache). Needs no GPU."""
        key = self.key(arch)
        if not options:
            c = _COMPILED.get(key)
            if c is not None:
                return c
        with _LOCK:
            if not options and key in _COMPILED:
                return _COMPILED[key]
            opts = (cute.GPUArch(arch), *options)
            if self.ptxas:
                opts = (*opts, PtxasOptions(self.ptxas))
            c = cute.compile[opts](self.fn, self.cfg, *self.fake_args(), make_fake_stream())
            if not options:
                _COMPILED[key] = c
            return c

    def export(self, arch: str) -> Artifacts:
        """Compile for ``arch`` ahead of time (no GPU) and return PTX and cubin."""
        with tempfile.TemporaryDirectory(prefix="tk_cute_") as d:
            c = self.compile(arch, cute.KeepPTX(), cute.KeepCUBIN(), DumpDir(d))
            art = c.artifacts
            return Artifacts(arch, c, art.PTX, art.CUBIN)

    def _executor(self, index: int):
        ex = self._executors.get(index)
        if ex is None:
            k = (self.key(device_arch(index)), index)
            ex = _EXECUTORS.get(k)
            if ex is None:
                ex = _EXECUTORS[k] = self.compile(k[0][-1]).to(index)
            self._executors[index] = ex
        return ex

    def fast_path(self, compiled) -> bool:
        """Whether :meth:`run` may marshal the arguments itself: every spec has a ctype and
        the compiled function takes exactly one C pointer per argument (checked on the
        fake arguments, so a DSL that marshals differently falls back to its own path)."""
        if any(s.ctype is None for s in self.sig):
            return False
        exe, _ = compiled.generate_execution_args(*self.fake_args(), make_fake_stream())
        return len(exe) == len(self.sig) + 1

    def _slots(self, index: int, ex):
        """Per thread: the argument buffer (one 8-byte slot an argument and the stream, each where the compiled
        function reads it), the slots' addresses, :func:`_prepacked`'s call of executor ``ex`` over them and the
        packer that writes a call's values into the buffer (:func:`_packer`); None without the fast path."""
        tls = self._executors.get("tls")
        if tls is None:
            tls = self._executors.setdefault("tls", threading.local())
        slots = getattr(tls, "slots", None)
        if slots is None:
            slots = tls.slots = {}
        sl = slots.get(index, False)
        if sl is False:
            sl = None
            if self.fast_path(self.compile(device_arch(index))):
                buf = ctypes.create_string_buffer(8 * (len(self.sig) + 1))
                addrs = [ctypes.addressof(buf) + 8 * i for i in range(len(self.sig) + 1)]
                sl = (buf, addrs, _prepacked(ex, addrs), _packer(self.sig, buf))
            slots[index] = sl
        return sl

    def run(self, *values) -> None:
        """Launch on the current torch stream of the first tensor argument's device.
        ``values`` line up with ``sig``. No checks: the registry validated the call.

        Fast path (all specs :class:`Ptr` / :class:`Scalar`): one ``struct.pack_into`` writes the argument
        values and the stream into this thread's argument buffer, which the executor reads (~1 us on the
        development CPU for eight arguments), instead of the DSL's per-call marshalling (~30 us for six)."""
        t = values[0]
        if type(t) is not torch.Tensor:
            t = next(v for v in values if isinstance(v, torch.Tensor))
        index = t.get_device()
        if index < 0:
            raise ValueError(f"{self.name}: launched with a tensor on {t.device}, not on a CUDA device")
        if _RECORD_KEYS[0]:
            COMPILE_KEYS.add(self.key(device_arch(index)))
        if index != torch._C._cuda_getDevice():
            with torch.cuda.device(index):  # the launch goes to the current context
                return self.run(*values)
        try:
            sl = self._executors["tls"].slots[index]
        except (KeyError, AttributeError):
            sl = self._slots(index, self._executor(index))
        if sl is not None:
            stream = torch._C._cuda_getCurrentRawStream(index)
            try:
                sl[3](stream, *values)
            except (struct.error, OverflowError):  # a value its C type cannot hold: converted as ctypes does
                _store(self.sig, sl[1], stream, values)
            packed = sl[2]
            if packed is None:
                self._executor(index).run_compiled_program(sl[1])
                return
            _call_prepacked(self.name, packed)
        else:
            ex = self._executor(index)
            stream = torch._C._cuda_getCurrentRawStream(index)
            ex(*[s.real(v) for s, v in zip(self.sig, values)], cuda.CUstream(stream))


# struct codes of the fast path's argument slots (8 bytes each, little-endian as the GPU hosts are; "x": padding)
_CODES = {ctypes.c_void_p: "Q", ctypes.c_int32: "i4x", ctypes.c_uint32: "I4x", ctypes.c_int64: "q",
          ctypes.c_uint64: "Q", ctypes.c_float: "f4x", ctypes.c_double: "d"}


def _store(sig: tuple, addrs: list, stream: int, values: tuple) -> None:
    """The argument slots written one ctypes store each: what :func:`_packer`'s pack does, but with ctypes'
    conversions where a value does not fit its C type (an int wrapped, a float past float32's range stored as
    inf), as every launch stored them before the pack (a rare path: :meth:`Launch.run` takes it on the pack's
    error)."""
    if len(values) != len(sig):
        raise TypeError(f"{len(sig)} launch arguments expected, got {len(values)}")
    for s, a, v in zip(sig, addrs, values):
        s.ctype.from_address(a).value = s.raw(v)
    ctypes.c_void_p.from_address(addrs[-1]).value = stream


def _packer(sig: tuple, buf) -> Callable:
    """``pack(stream, *values)``: one ``struct.pack_into`` of the values of ``sig`` (a tensor's address, 0 for
    None; a scalar as its C type) and the stream into ``buf``, each at its 8-byte slot. Generated per signature so
    a call does no per-argument Python loop (the ctypes stores it replaces cost ~0.14 us an argument)."""
    fmt = "<" + "".join(_CODES[s.ctype] for s in sig) + "Q"
    names = [f"a{i}" for i in range(len(sig))]
    vals = [f"(0 if {a} is None else {a}.data_ptr())" if isinstance(s, Ptr) else a for a, s in zip(names, sig)]
    src = f"def pack(stream, {', '.join(names)}):\n    _pk(_buf, 0, {', '.join(vals)}, stream)\n"
    g = {"_pk": struct.Struct(fmt).pack_into, "_buf": buf}
    exec(compile(src, "<tilekernels._cute packer>", "exec"), g)  # noqa: S102 - our own source
    return g["pack"]


def _prepacked(ex, addrs: list):
    """(host function, packed argument array, result slot or None) for executor ``ex`` over the slot addresses
    ``addrs``: the array CuTe DSL 4.8.1's ``run_compiled_program`` packs on every call (the arguments' addresses, then
    its CUDA-result slot and the kernel pointers), built once. None where ``ex`` does not have that layout (another
    DSL version): :meth:`Launch.run` then calls ``run_compiled_program``."""
    try:
        capi, n_extra, has_res, kptrs = ex.capi_func, ex._num_extra_args, ex._has_cuda_result, ex._kernel_ptrs
        # the host function writes its CUDA result where the array points: a slot of this thread's own (the DSL's
        # one slot an executor would let two threads' launches overwrite each other's error)
        res = type(ex.cuda_result)() if has_res else None
    except AttributeError:
        return None
    extra = ([ctypes.addressof(res)] if has_res else []) + list(kptrs or ())
    if n_extra != len(extra):
        return None
    arr = (ctypes.c_void_p * (len(addrs) + n_extra))()
    for i, a in enumerate(list(addrs) + extra):
        arr[i] = a if type(a) is not ctypes.c_void_p else a.value
    return capi, arr, res


def _call_prepacked(name: str, packed) -> None:
    """One launch through :func:`_prepacked`'s array; a nonzero CUDA result raises (as the DSL's call does)."""
    capi, arr, res = packed
    capi(arr)
    if res is not None and res.value:
        code = res.value
        try:
            from cuda.bindings import runtime as _rt
            what = _rt.cudaGetErrorName(_rt.cudaError_t(code))[1].decode()
        except Exception:  # (an unknown code: the number alone)
            what = "unknown"
        raise RuntimeError(f"{name}: the kernel launch returned CUDA error {code} ({what})")


@dataclasses.dataclass
class BoundLaunch:
    """A :class:`Launch` with its argument values: what the registry's kernels and the timing
    scripts run and replay (``run()``); ``grid`` where the launch computes one (for records)."""

    launch: Launch
    values: tuple
    grid: tuple | None = None

    @property
    def cfg(self):
        return self.launch.cfg

    def run(self) -> None:
        self.launch.run(*self.values)


def setmaxnreg_budget(art: "Artifacts", producer_threads: int = 128,
                      roles: dict[int, int] | None = None) -> tuple[int, int]:
    """(registers a warp-specialized kernel's roles hold after their setmaxnreg, registers its CTA launched with):
    ``producer_threads`` at the ``setmaxnreg.dec`` value, the rest of the CTA (``.reqntid``) at the ``.inc`` one,
    against the cubin's registers a thread x threads. With ``roles`` ({registers: threads} of every role, for
    kernels with more than two) the setmaxnreg values in the PTX must be exactly its keys and its threads the CTA's;
    the first value is then the sum over the roles. setmaxnreg only moves registers within the CTA's launch
    allocation: a first value above the second makes ``setmaxnreg.inc`` wait forever (a hang on the GPU that no CPU
    compile shows, e.g. 40 x 128 + 112 x 512 > 96 x 640). (0, launch) for a kernel without setmaxnreg."""
    import re

    threads = int(re.search(r"\.reqntid\s+(\d+)", art.ptx).group(1))
    regs = [v["regs"] for k, v in cubin_resources(art.cubin).items() if "regs" in v and "kernel" in k]
    have = max(regs) * threads
    dec = re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", art.ptx)
    inc = re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", art.ptx)
    if roles is not None:
        found = {int(v) for v in dec + inc}
        if found != set(roles) or sum(roles.values()) != threads:
            raise ValueError(f"setmaxnreg_budget: the PTX's setmaxnreg values {sorted(found)} over {threads} threads, "
                             f"not the roles {roles}")
        return sum(r * t for r, t in roles.items()), have
    if not dec and not inc:
        return 0, have
    return max(map(int, dec)) * producer_threads + max(map(int, inc)) * (threads - producer_threads), have


def unfenced_releases(ptx: str) -> list[int]:
    """PTX line numbers (1-based) of mbarrier arrives without expect_tx (a consumer's release of a TMA stage) that
    follow a shared-memory load (ld.shared in any form, ldmatrix) with no ``fence.proxy.async`` (of shared memory
    or of every state space) between them, scanning in text order back to the last mbarrier wait.

    Why: ptxas lets such an arrive go while the loads are still in flight (no scoreboard wait in the SASS), and the
    producer's next TMA load writes the stage through the async proxy, which the arrive's release does not order
    against: the loads can read the refilled stage. Measured on the H200 (session 20, benchmarks/probes/
    ring_war_check.py): gdn_decode's ring at its memory-pattern probe config rewrote whole tile rows with another
    tile's data in 10 of 10 runs at B=256 without the fence, 0 of 10 with it.

    A text-order heuristic for the ring kernels here (one release site a consumer loop, released before its next
    wait): a release issued after the next stage's wait (releasing the previous stage) or a fence in another role's
    code between the loads and the release in the text is not seen. Empty where every release is fenced
    (:func:`release_read_stage` fences)."""
    import re

    bad, loaded = [], False
    for i, line in enumerate(ptx.splitlines(), 1):
        if re.search(r"\bmbarrier\.(try_wait|test_wait)", line) or \
                re.search(r"\bfence\.proxy\.async(\.shared(::cta|::cluster)?)?\s*;", line):
            loaded = False
        elif re.search(r"\bld(\.\w+)*\.shared\b|\bldmatrix\b", line):
            loaded = True
        elif re.search(r"\bmbarrier\.arrive", line) and "expect_tx" not in line and loaded:
            bad.append(i)
    return bad


def cubin_resources(cubin: bytes) -> dict[str, dict[str, int]]:
    """Per kernel in a cubin: ``{"regs": registers per thread, "frame": stack frame bytes}``
    (the EIATTR_REGCOUNT / EIATTR_FRAME_SIZE records of its ``.nv.info`` section, what
    cuobjdump -res-usage prints; a non-zero frame means spills or a local array). Lets a
    CPU test watch register pressure without CUDA tools."""
    import struct

    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(off):
        return cubin[off:cubin.index(b"\0", off)].decode()

    names = {cstr(secs[shstrndx][4] + s[0]): s for s in secs}
    strtab, symtab = names[".strtab"][4], names[".symtab"]
    sym = [cstr(strtab + struct.unpack_from("<I", cubin, symtab[4] + 24 * j)[0])
           for j in range(symtab[5] // 24)]
    out: dict[str, dict[str, int]] = {}
    info = names.get(".nv.info")
    data = cubin[info[4]:info[4] + info[5]] if info else b""
    j = 0
    while j + 4 <= len(data):
        fmt, attr = data[j], data[j + 1]
        if fmt == 4:  # EIFMT_SVAL: u16 size, then the value
            size, = struct.unpack_from("<H", data, j + 2)
            if attr in (0x2F, 0x11) and size == 8:  # REGCOUNT, FRAME_SIZE: (symbol, value)
                idx, val = struct.unpack_from("<II", data, j + 4)
                out.setdefault(sym[idx], {})["regs" if attr == 0x2F else "frame"] = val
            j += 4 + size
        else:
            j += 4
    return out


def no_spill_kernel(cubin: bytes, what: str = "", name_has: str = "") -> dict[str, int]:
    """The resources (``cubin_resources``) of the cubin's one kernel (whose symbol contains ``name_has``), asserted
    to have no stack frame (no register spills, no local array): the CPU compile tests' check. ``what`` names the
    launch in the failure message."""
    res = [v for k, v in cubin_resources(cubin).items() if name_has in k]
    assert len(res) == 1 and res[0]["frame"] == 0, f"{what}: register spills or a local array: {res}"
    return res[0]
