"""tilekernels._cute.Launch.run's launch path without a GPU: the argument array it builds once (``_prepacked``) is the
one CuTe DSL's ``run_compiled_program`` packs on every call (the DSL's own method run on a stand-in executor with the
same attributes), with and without a CUDA-result slot and kernel pointers, but for the result slot: each thread's
array has its own; an executor of another layout gets None (run() then goes through the DSL's call); a nonzero CUDA
result raises, naming the kernel and the error. The GPU suites launch every CuTe DSL kernel through it (and
test_mhc_cute_sinkhorn.py checks that a real executor takes this path)."""
from __future__ import annotations

import ctypes
import threading

import pytest

pytest.importorskip("cutlass")

from cutlass.base_dsl.jit_executor import JitExecutor  # noqa: E402

from tilekernels._cute import _call_prepacked, _prepacked  # noqa: E402


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
