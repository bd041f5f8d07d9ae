"""tilekernels._cute.Launch.run's launch path without a GPU: the argument array it builds once (``_prepacked``) is the
one CuTe DSL's ``run_compiled_program`` packs on every call (the DSL's own method run on a stand-in executor with the
same attributes), with and without a CUDA-result slot and kernel pointers; an executor of another layout gets None
(run() then goes through the DSL's call). The GPU suites launch every CuTe DSL kernel through it."""
from __future__ import annotations

import ctypes
import threading

import pytest

pytest.importorskip("cutlass")

from cutlass.base_dsl.jit_executor import JitExecutor  # noqa: E402

from tilekernels._cute import _prepacked  # noqa: E402


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
    assert capi is ex.capi_func and res is ex.cuda_result
    assert len(arr) == len(addrs) + int(result) + kernels
    assert [arr[i] for i in range(len(arr))] == [want[i] for i in range(len(arr))]


def test_prepacked_refuses_another_layout():
    ex = _executor(True, 1)
    ex._num_extra_args = 3   # a layout this code does not know
    assert _prepacked(ex, [1, 2]) is None
    del ex._kernel_ptrs
    assert _prepacked(ex, [1, 2]) is None
