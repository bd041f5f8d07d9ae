"""Fast launch path for cuTile kernels: compile once, launch through the driver.

``ct.launch`` converts every argument on every call (a DLPack capsule per tensor, the
constraint inference its JIT cache is keyed by): ~11 us per launch on the H200 host,
against a ~10 us Sinkhorn kernel. Here a kernel is compiled once per **fast key** (which
the caller builds from what it knows of its arguments) and launched with the driver's
``cuLaunchKernel`` from a pre-sized parameter buffer that each call only repacks.

* **Compile.** ``FastLaunch.export_cubin(arch)`` on the first call's arguments: the same
  ``KernelSignature`` (``Launch.signature``: 16-byte aligned bases, unit innermost stride,
  each shape / stride divisibility as in the example) the CPU compile test exports. The
  caller's ``fast_key`` must fix that signature: every argument list with the same key
  must give the same ``signature()`` (``check_signatures()`` verifies it per call; the
  tests turn it on). Kernels with cluster (``num_ctas``) hints and PDL launches are not
  handled (they keep ``ct.launch``).
* **Parameter ABI** (cuTile's ``cutile_python_v1`` calling convention, as its compiler
  lays it out): per dynamic argument in order, an array of rank d is its base pointer
  (8 bytes, 8-aligned) then its d shape and d stride values as int32 (elements, strides
  given even where they are compile-time constants); a float is an fp32 scalar;
  ``ct.Constant`` ints / bools are compiled in and absent. At load, this layout is checked
  against the cubin's own ``.nv.info`` ``EIATTR_KPARAM_INFO`` records (ordinal, offset,
  size of every parameter) and its ``EIATTR_CBANK_PARAM_SIZE``; the block size is the
  cubin's ``EIATTR_REQNTID``. Any mismatch or missing record refuses the fast path for
  that key (logged once; ``ct.launch`` runs it).
* **Launch.** ``cuLibraryLoadData`` + ``cuLibraryGetKernel`` (context-independent
  handle, the loader ``ct.launch`` uses too), ``cuLaunchKernel`` with ``kernelParams``
  pointing into the buffer (called through ``ctypes.PyDLL``: the GIL is held from
  repack to launch, so threads cannot interleave on one buffer). The driver copies the
  parameters at the call, so graph capture records them as they were. No dynamic shared
  memory (cuTile 1.7's compile returns no dynamic-shared-memory size, and ``ct.launch``
  then passes 0 too).
* **Per call** (checked, else ``ct.launch`` runs the call): the tensors are on torch's
  current device and every base pointer is 16-byte aligned.
Status (H200): the fast launches are correct -- bitwise equal to ``ct.launch``'s outputs
for the Sinkhorn forward and the entries backward at (T, n) = (1, 1), (3, 3), (37, 8),
(1000, 4), the tile backward at (1, 1), (3, 3); fast fwd + bwd at T = 32768 inside the
registry's autograd path -- but not faster: on a quiet host after the GPU tests
(benchmarks/results/h200-sinkhorn-host.txt) a forward launch took 15.5 us against 9.2 us
through ``ct.launch``, and 19.3 us with block (1, 1, 1) as ``ct.launch`` passes it, so the
block shape is not the reason; the packing itself is ~3 us in Python. Where the rest goes
(ctypes' PyDLL call, the driver entry, argument checks) is not measured. So the fast
launch is **off by default** (``ENABLED``; ``TILEKERNELS_CUTILE_FAST=1`` turns it on).
(Kernel scratch buffers are ``tilekernels._cutile.workspace``: the Sinkhorn fwd+bwd's
do_bench read 165 us with a fresh scratch and 143 with the reused one in that run.)

Kernels whose cubin describes its parameters with ``EIATTR`` 0x45 records instead of
KPARAM_INFO (seen: the padded-tile Sinkhorn backward at n >= 4, parameter block 496
bytes for 100 bytes of arguments) are refused (``ct.launch`` runs them): by cuTile's
launcher source (its "hoisted tensor maps"), the rest of such a block holds TMA
descriptors the launcher encodes on the host (inferred, not measured).

Importing this module needs ``cuda.tile`` but no GPU and no driver.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import struct
from typing import Any

import torch

from tilekernels._cutile import Launch, _raw_stream
from tilekernels._glue import _RECORD_KEYS, COMPILE_KEYS

log = logging.getLogger("tilekernels")

ENABLED = [os.environ.get("TILEKERNELS_CUTILE_FAST", "0") not in ("", "0")]
# launch with the cubin's REQNTID block (True) or (1, 1, 1) as ct.launch does (False)
BLOCK_FROM_CUBIN = [True]
_CHECK = [os.environ.get("TILEKERNELS_CUTILE_FAST_CHECK", "0") not in ("", "0")]


@contextlib.contextmanager
def enabled(on: bool = True):
    """Within the block, FastLaunch.run takes the fast path (on) or ``ct.launch`` (off)."""
    old, ENABLED[0] = ENABLED[0], on
    try:
        yield
    finally:
        ENABLED[0] = old


@contextlib.contextmanager
def check_signatures(on: bool = True):
    """Within the block, every fast launch checks that its arguments' ``signature()``
    is the one its kernel was compiled for (the fast key's contract; slow: tests only)."""
    old, _CHECK[0] = _CHECK[0], on
    try:
        yield
    finally:
        _CHECK[0] = old


# ------------------------------------------------------------------ cubin reading

EIATTR_REQNTID = 0x10
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_PARAM_INFO_EXT = 0x45  # KPARAM_INFO's layout; seen with host-encoded TMA descriptors


@dataclasses.dataclass(frozen=True)
class CubinInfo:
    """What a launch needs from a one-kernel cubin: its symbol, the parameters as
    (offset, size) in ordinal order, the parameter block's size and the block shape."""
    symbol: str
    params: tuple[tuple[int, int], ...]
    param_bytes: int | None
    block: tuple[int, int, int] | None


def _sections(b: bytes) -> dict[str, tuple[tuple, bytes]]:
    """ELF64 section headers and contents by name."""
    if b[:4] != b"\x7fELF" or b[4] != 2:
        raise ValueError("not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name = b[names + h[0]: b.index(b"\0", names + h[0])].decode()
        out[name] = (h, b[h[4]: h[4] + h[5]] if h[1] != 8 else b"")  # 8: SHT_NOBITS
    return out


def _nv_info(d: bytes) -> list[tuple[int, Any]]:
    """(attribute, value) records of an ``.nv.info`` section: EIFMT_SVAL carries bytes,
    EIFMT_HVAL a 16-bit value, EIFMT_NVAL nothing."""
    out, i = [], 0
    while i + 2 <= len(d):
        fmt, attr = d[i], d[i + 1]
        if fmt == 4:    # EIFMT_SVAL: u16 size, then the data
            size, = struct.unpack_from("<H", d, i + 2)
            out.append((attr, d[i + 4: i + 4 + size]))
            i += 4 + size
        elif fmt == 3:  # EIFMT_HVAL
            out.append((attr, struct.unpack_from("<H", d, i + 2)[0]))
            i += 4
        elif fmt == 2:  # EIFMT_BVAL
            out.append((attr, d[i + 2]))
            i += 4
        else:           # EIFMT_NVAL
            out.append((attr, None))
            i += 2
    return out


def cubin_info(cubin: bytes) -> CubinInfo:
    """Parse a one-kernel cubin's symbol table and ``.nv.info.<symbol>`` records."""
    secs = _sections(cubin)
    symtab, strtab = secs[".symtab"][1], secs[".strtab"][1]
    funcs = []
    for off in range(0, len(symtab), 24):
        st_name, st_info = struct.unpack_from("<IB", symtab, off)
        if st_info & 0xF == 2 and st_info >> 4 == 1:  # STT_FUNC, STB_GLOBAL
            funcs.append(strtab[st_name: strtab.index(b"\0", st_name)].decode())
    if len(funcs) != 1:
        raise ValueError(f"expected one kernel in the cubin, found {funcs}")
    sym = funcs[0]
    kparams, nbytes, block = {}, None, None
    for attr, v in _nv_info(secs[f".nv.info.{sym}"][1]):
        if attr == EIATTR_KPARAM_INFO:
            _index, ordinal, offset, flags = struct.unpack("<IHHI", v)
            kparams[ordinal] = (offset, (flags >> 18) & 0x3FFF)
        elif attr == EIATTR_PARAM_INFO_EXT:
            raise ValueError(f"{sym}: parameters described by EIATTR 0x45 (a block extended by "
                             "host-encoded tensor maps): not handled")
        elif attr == EIATTR_CBANK_PARAM_SIZE:
            nbytes = v
        elif attr == EIATTR_REQNTID:
            block = tuple(struct.unpack("<III", v))
    if sorted(kparams) != list(range(len(kparams))):
        raise ValueError(f"{sym}: parameter ordinals {sorted(kparams)} are not 0..n-1")
    return CubinInfo(sym, tuple(kparams[i] for i in range(len(kparams))), nbytes, block)


# ------------------------------------------------------------------ parameter ABI

def abi_layout(args) -> tuple[list[tuple[int, int]], str]:
    """``cutile_python_v1``'s parameter block for launch arguments ``args`` (see the
    module doc): the (offset, size) of every parameter in order, and the ``struct``
    format (little-endian, explicit padding) that packs them."""
    params, fmt, off = [], "<", 0

    def put(code: str, size: int):
        nonlocal fmt, off
        pad = -off % size
        fmt += "x" * pad
        off += pad
        params.append((off, size))
        fmt += code
        off += size

    for a in args:
        if isinstance(a, torch.Tensor):
            put("Q", 8)
            for _ in range(2 * a.dim()):
                put("i", 4)
        elif isinstance(a, float):
            put("f", 4)
        elif not isinstance(a, (bool, int)):  # ints / bools: ct.Constant, compiled in
            raise TypeError(f"no fast-path ABI for argument {a!r}")
    return params, fmt


def _packer(args, fmt: str):
    """``pack(args, buf) -> bool``: the dynamic arguments packed into ``buf``; False
    (nothing packed) when a tensor's base is not 16-byte aligned. Generated per
    signature, so a call runs no loop over the arguments."""
    tens = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    lines = [f"    t{i} = a[{i}]; p{i} = t{i}.data_ptr()" for i in tens]
    lines.append(f"    if ({' | '.join(f'p{i}' for i in tens) or '0'}) & 15:\n        return False")
    vals = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            vals.append(f"p{i}, *t{i}.shape, *t{i}.stride()")
        elif isinstance(a, float):
            vals.append(f"a[{i}]")
    src = ("def pack(a, buf):\n" + "\n".join(lines) +
           f"\n    _pack_into(buf, 0, {', '.join(vals)})\n    return True\n")
    g = {"_pack_into": struct.Struct(fmt).pack_into}
    exec(compile(src, "<cutile fast packer>", "exec"), g)  # noqa: S102 - our own source
    return g["pack"]


# ------------------------------------------------------------------ the driver

_CUDA: list = []


def _driver():
    """libcuda through ctypes.PyDLL (the GIL stays held during the calls)."""
    if not _CUDA:
        lib = ctypes.PyDLL("libcuda.so.1")
        vp, u = ctypes.c_void_p, ctypes.c_uint
        lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuLibraryLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p, vp, vp, u, vp, vp, u]
        lib.cuLibraryLoadData.restype = ctypes.c_int
        lib.cuLibraryGetKernel.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuLibraryGetKernel.restype = ctypes.c_int
        lib.cuStreamGetCtx.argtypes = [vp, ctypes.POINTER(vp)]
        lib.cuCtxSetCurrent.argtypes = [vp]
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _CUDA.append(lib)
    return _CUDA[0]


def _check(rc: int, what: str) -> None:
    if rc:
        s = ctypes.c_char_p()
        _driver().cuGetErrorString(rc, ctypes.byref(s))
        raise RuntimeError(f"{what} failed: CUDA error {rc} ({(s.value or b'?').decode()})")


CUDA_ERROR_INVALID_CONTEXT = 201


class FastKernel:
    """One compiled kernel (one signature), launched through ``cuLaunchKernel``."""

    def __init__(self, cubin: bytes, args, name: str = ""):
        info = cubin_info(cubin)
        params, fmt = abi_layout(args)
        if [tuple(p) for p in info.params] != params:
            raise ValueError(f"{name}: the cubin's parameters {info.params} are not "
                             f"cutile_python_v1's {params}")
        size = struct.calcsize(fmt)
        if info.param_bytes is not None and info.param_bytes != size:
            raise ValueError(f"{name}: the cubin's parameter block is {info.param_bytes} bytes, not {size}")
        if info.block is None:
            raise ValueError(f"{name}: the cubin has no required block size (EIATTR_REQNTID)")
        self.name, self.info, self.cubin = name, info, cubin
        self.block = info.block
        self.buf = ctypes.create_string_buffer(max(size, 8))
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * max(len(params), 1))(*[base + o for o, _ in params])
        self.pack = _packer(args, fmt)
        self.first_tensor = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        self.handle = None  # CUkernel, loaded at the first launch

    def load(self) -> None:
        lib, vp = _driver(), ctypes.c_void_p
        library, kern = vp(), vp()
        _check(lib.cuLibraryLoadData(ctypes.byref(library), self.cubin, None, None, 0, None, None, 0),
               f"cuLibraryLoadData({self.name})")
        _check(lib.cuLibraryGetKernel(ctypes.byref(kern), library, self.info.symbol.encode()),
               f"cuLibraryGetKernel({self.name})")
        self.library, self.handle = library, kern.value

    def launch(self, grid: tuple, args) -> bool:
        """Launch on the tensors' device's current torch stream; False (nothing launched)
        when the call does not qualify (not torch's current device, unaligned base)."""
        dev = args[self.first_tensor].get_device()
        if dev != torch._C._cuda_getDevice() or not self.pack(args, self.buf):
            return False
        if self.handle is None:
            self.load()
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = self.block if BLOCK_FROM_CUBIN[0] else (1, 1, 1)
        stream = _raw_stream(dev)
        lib = _CUDA[0]
        rc = lib.cuLaunchKernel(self.handle, g[0], g[1], g[2], b[0], b[1], b[2], 0, stream, self.params, None)
        if rc == CUDA_ERROR_INVALID_CONTEXT:  # a thread with no current context: take the stream's
            ctx = ctypes.c_void_p()
            _check(lib.cuStreamGetCtx(ctypes.c_void_p(stream), ctypes.byref(ctx)), "cuStreamGetCtx")
            _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            rc = lib.cuLaunchKernel(self.handle, g[0], g[1], g[2], b[0], b[1], b[2], 0, stream, self.params, None)
        _check(rc, f"cuLaunchKernel({self.name})")
        return True


# ------------------------------------------------------------------ launches

_KERNELS: dict = {}  # (fast_key, device index) -> FastKernel, or None where refused
_ARCH: dict = {}     # device index -> "sm_XY"


def _arch(dev: int) -> str:
    if dev not in _ARCH:
        major, minor = torch.cuda.get_device_capability(dev)
        _ARCH[dev] = f"sm_{major}{minor}"
    return _ARCH[dev]


@dataclasses.dataclass(frozen=True)
class FastLaunch(Launch):
    """A :class:`Launch` whose ``run()`` takes the fast path (module doc). ``fast_key``:
    hashable, equal only for argument lists with the same ``signature()`` (it must
    cover the compile key, the dtypes and every divisibility the signature records);
    None: always ``ct.launch``."""

    fast_key: Any = None

    def run(self) -> None:
        if not ENABLED[0] or self.fast_key is None or self.pdl or 0 in self.grid:
            return Launch.run(self)
        args = self.args
        t = args[0] if isinstance(args[0], torch.Tensor) else next(a for a in args if isinstance(a, torch.Tensor))
        key = (self.fast_key, t.get_device())
        fk = _KERNELS.get(key, False)
        if fk is False:
            fk = self._build(key)
        if fk is None:
            return Launch.run(self)
        if _CHECK[0]:
            self._check_signature(fk)
        if _RECORD_KEYS[0]:
            COMPILE_KEYS.add(self.key())
        if not fk.launch(self.grid, args):
            Launch.run(self)

    def _build(self, key):
        name = self.kernel._pyfunc.__name__
        try:
            if any(h[0] == "num_ctas" for h in self.hints) or \
                    getattr(self.compiled_kernel()._compiler_options, "num_ctas", None):
                raise ValueError("cluster launches are not handled")
            fk = FastKernel(self.export_cubin(_arch(key[1])), self.args, name)
            fk.signature = self.signature()
        except Exception as e:  # noqa: BLE001 - any refusal keeps ct.launch for this key
            log.warning("cuTile fast launch refused for %s (%s): ct.launch runs it", name, e)
            fk = None
        if len(_KERNELS) > 512:
            _KERNELS.clear()
        _KERNELS[key] = fk
        return fk

    def _check_signature(self, fk: FastKernel) -> None:
        sig = self.signature()
        if sig.parameters != fk.signature.parameters:
            raise AssertionError(f"fast_key {self.fast_key!r} of {fk.name} maps arguments of "
                                 f"signature {sig} onto a kernel compiled for {fk.signature}")


def clear_caches() -> None:
    """Forget the compiled kernels."""
    _KERNELS.clear()
