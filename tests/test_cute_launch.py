"""tilekernels._cute.Launch.run's launch path without a GPU: the argument array it builds once (``_prepacked``) is the
one CuTe DSL's ``run_compiled_program`` packs on every call (the DSL's own method run on a stand-in executor with the
same attributes), with and without a CUDA-result slot and kernel pointers, but for the result slot: each thread's
array has its own; an executor of another layout gets None (run() then goes through the DSL's call); a nonzero CUDA
result raises, naming the kernel and the error; the per-call packer (``_packer``) writes each value into its slot as
the C type the compiled function reads (the ctypes store it replaced), the stream last; ``Launch.run``'s fast path
runs end to end on a stand-in executor (device and stream faked), with its fallbacks. The GPU suites launch every CuTe DSL kernel through it (and
test_mhc_cute_sinkhorn.py checks that a real executor takes this path)."""
from __future__ import annotations

import ctypes
import math
import struct
import threading

import pytest

pytest.importorskip("cutlass")

from cutlass.base_dsl.jit_executor import JitExecutor  # noqa: E402

import torch  # noqa: E402

import cutlass  # noqa: E402
from tilekernels._cute import Ptr, Scalar, _call_prepacked, _packer, _prepacked, _store  # noqa: E402


def _executor(result: bool, kernels: int):
    """A JitExecutor with just the attributes its packing reads (as its __init__ sets them)."""
    ex = JitExecutor.__new__(JitExecutor)
    ex.cuda_result = ctypes.c_int32(0) if result else None
    ex._has_cuda_result = result
    ex._cuda_result_addr = ctypes.addressof(ex.cuda_result) if result else None
    ex._kernel_ptrs = [ctypes.c_void_p(0x1000 + 16 * k) for k in range(kernels)]
    ex._num_extra_args = int(result) + kernels
    ex._tls = threading.local()
    ex.capi_func = lambda arr: None
    return ex


@pytest.mark.parametrize("result,kernels", [(True, 1), (True, 0), (False, 2), (False, 0)])
def test_prepacked_is_the_dsl_packing(result, kernels):
    slots = [ctypes.c_void_p(), ctypes.c_int32(), ctypes.c_float(), ctypes.c_void_p()]
    addrs = [ctypes.addressof(o) for o in slots]
    ex = _executor(result, kernels)
    capi, arr, res = _prepacked(ex, addrs)
    want = JitExecutor._get_invoke_packed_args(ex, addrs)
    assert capi is ex.capi_func and len(arr) == len(addrs) + int(result) + kernels
    got, want = [arr[i] for i in range(len(arr))], [want[i] for i in range(len(arr))]
    if result:   # this thread's own result slot, of the DSL's type, where the DSL puts its executor's
        assert type(res) is type(ex.cuda_result) and res is not ex.cuda_result
        assert got[len(addrs)] == ctypes.addressof(res) and want[len(addrs)] == ex._cuda_result_addr
        got[len(addrs)] = want[len(addrs)] = None
    else:
        assert res is None
    assert got == want
    if result:
        assert _prepacked(ex, addrs)[2] is not res   # (another thread's slots: another result slot)


def test_prepacked_refuses_another_layout():
    ex = _executor(True, 1)
    ex._num_extra_args = 3   # a layout this code does not know
    assert _prepacked(ex, [1, 2]) is None
    del ex._kernel_ptrs
    assert _prepacked(ex, [1, 2]) is None


def test_nonzero_result_raises():
    ex = _executor(True, 1)
    slots = [ctypes.c_void_p()]
    packed = _prepacked(ex, [ctypes.addressof(o) for o in slots])
    res = packed[2]
    ex.capi_func = lambda arr: ctypes.c_int32.from_address(arr[1]).__setattr__("value", 0)
    _call_prepacked("k.ok", (ex.capi_func, packed[1], res))   # result 0: no error
    ex.capi_func = lambda arr: ctypes.c_int32.from_address(arr[1]).__setattr__("value", 719)
    with pytest.raises(RuntimeError, match=r"k\.bad: the kernel launch returned CUDA error 719 \(cudaErrorLaunchFailure\)"):
        _call_prepacked("k.bad", (ex.capi_func, packed[1], res))


def test_packer_writes_each_slot_as_its_c_type():
    """Every spec kind the fast path takes, with values at their types' edges: each 8-byte slot holds what a ctypes
    slot of the spec's C type set to the value holds (Ptr: the address, 0 for None), the stream last; a value the C
    type cannot hold raises instead of wrapping (Launch.run then stores the values with ctypes' conversions:
    ``_store``, checked here too), and so does a wrong count of values."""
    sig = (Ptr(torch.float32), Ptr(torch.bfloat16), Scalar(cutlass.Int32), Scalar(cutlass.Float32),
           Scalar(cutlass.Int64), Scalar(cutlass.Uint32), Scalar(cutlass.Uint64), Scalar(cutlass.Float64))
    buf = ctypes.create_string_buffer(8 * (len(sig) + 1))
    base = ctypes.addressof(buf)
    pack = _packer(sig, buf)
    x = torch.empty(3)
    cases = [(x, None, -2**31, 1e-6, -2**63, 2**32 - 1, 2**64 - 1, 1 / 3),
             (x[1:], x, 2**31 - 1, -3.5, 2**63 - 1, 0, 7, -1e300)]
    for vals in cases:
        ctypes.memset(buf, 0x5A, len(buf))
        pack(0xDEADBEEF1234, *vals)
        for i, (s, v) in enumerate(zip(sig, vals)):
            want = s.ctype(s.raw(v)).value
            got = s.ctype.from_address(base + 8 * i).value
            assert (got or 0) == (want or 0), (i, s, v, got, want)
            size = ctypes.sizeof(s.ctype)
            assert buf.raw[8 * i + size: 8 * i + 8] == bytes(8 - size), "padding written"
        assert ctypes.c_void_p.from_address(base + 8 * len(sig)).value == 0xDEADBEEF1234
    addrs = [base + 8 * i for i in range(len(sig) + 1)]
    for bad in [(x, x, 2**31, 1.0, 0, 0, 0, 0.0), (x, x, 1, 1.0, 0, -1, 0, 0.0), (x, None, 1, 1e39, 0, 0, 0, 0.0)]:
        with pytest.raises((struct.error, OverflowError)):
            pack(0, *bad)
        _store(sig, addrs, 77, bad)   # (Launch.run's path on that error: ctypes' own conversions, as before the pack)
        for i, (s, v) in enumerate(zip(sig, bad)):
            assert (s.ctype.from_address(base + 8 * i).value or 0) == (s.ctype(s.raw(v)).value or 0), (i, v)
        assert ctypes.c_void_p.from_address(base + 8 * len(sig)).value == 77
    assert ctypes.c_int32.from_address(base + 16).value == 1 and math.isinf(ctypes.c_float.from_address(base + 24).value)
    with pytest.raises(TypeError):
        pack(0, x, x, 1)
    with pytest.raises(TypeError):
        _store(sig, addrs, 0, (x, x, 1))


class _Dev(torch.Tensor):
    """A CPU tensor that says it is on CUDA device 0 (Launch.run reads only its device index and address)."""

    def get_device(self):
        return 0


@pytest.mark.parametrize("layout", ["prepacked", "dsl"])
def test_run_fast_path_on_a_stand_in_executor(monkeypatch, layout):
    """Launch.run's fast path end to end but for the GPU: the current device and stream faked, a stand-in executor
    (the DSL's attributes, a host function that records what its argument array points at). Each call hands the
    host function the tensors' addresses, the scalars as their C types and the stream; a value the pack refuses
    goes through ``_store`` (wrapped int, float32 inf, as ctypes stored them before); another thread gets its own
    buffer; an executor of another layout ("dsl") gets ``run_compiled_program`` over the same slots."""
    from tilekernels import _cute as CU

    sig = (Ptr(torch.float32), Ptr(torch.bfloat16), Scalar(cutlass.Int32), Scalar(cutlass.Float32))
    seen = []

    def host(arr_or_addrs):
        addrs = [arr_or_addrs[i] for i in range(len(sig) + 1)]
        seen.append(([s.ctype.from_address(a).value or 0 for s, a in zip(sig, addrs)]
                     + [ctypes.c_void_p.from_address(addrs[-1]).value], tuple(addrs)))

    ex = _executor(True, 1)
    ex.capi_func = host
    if layout == "dsl":
        ex._num_extra_args = 3   # a layout _prepacked does not know: run_compiled_program instead
        ex.run_compiled_program = host
    ln = CU.Launch("test.k", lambda: None, None, sig)
    monkeypatch.setattr(CU.Launch, "_executor", lambda self, index: ex)
    monkeypatch.setattr(CU.Launch, "fast_path", lambda self, compiled: True)
    monkeypatch.setattr(CU.Launch, "compile", lambda self, arch, *o: None)
    monkeypatch.setattr(CU, "device_arch", lambda index=None: "sm_90a")
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0x5EED, raising=False)
    x = torch.Tensor._make_subclass(_Dev, torch.randn(4))
    y = torch.Tensor._make_subclass(_Dev, torch.randn(4).bfloat16())
    ln.run(x, y, 7, 0.25)
    ln.run(x, None, 2**31, 1e39)   # the pack refuses both: _store's conversions
    assert [v for v, _ in seen] == [[x.data_ptr(), y.data_ptr(), 7, 0.25, 0x5EED],
                                    [x.data_ptr(), 0, -2**31, math.inf, 0x5EED]]
    assert seen[0][1] == seen[1][1]   # one thread: one buffer
    t = threading.Thread(target=ln.run, args=(y, x, -3, -1.5))
    t.start()
    t.join()
    assert seen[2][0] == [y.data_ptr(), x.data_ptr(), -3, -1.5, 0x5EED] and seen[2][1] != seen[0][1]
    with pytest.raises(TypeError):
        ln.run(x, y, 1)


def _host_a():
    pass


def _host_b():
    pass


def test_compile_key_names_the_host_function():
    """The compile cache (``_COMPILED``) is keyed by ``Launch.key``: two host functions given one name, sig and cfg
    (cute_quantize names its pipelined and plain quantize alike) must not share a compiled kernel."""
    from tilekernels import _cute as CU

    sig = (Ptr(torch.float32), Scalar(cutlass.Int32))
    a, b = CU.Launch("test.k", _host_a, None, sig), CU.Launch("test.k", _host_b, None, sig)
    assert a.key("sm_90a") != b.key("sm_90a")
    assert a.key("sm_90a") == CU.Launch("test.k", _host_a, None, sig).key("sm_90a")
    assert f"{__name__}._host_b" in b.key("sm_90a")
    import functools   # a host callable with no qualified name (a partial) keys by its repr
    p = CU.Launch("test.k", functools.partial(_host_a), None, sig)
    assert p.key("sm_90a") != a.key("sm_90a") and p.key("sm_90a") == p.key("sm_90a")
