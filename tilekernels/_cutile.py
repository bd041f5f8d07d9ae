"""Shared cuTile (``cuda.tile``) launch and compile helpers.

Every cuTile backend module builds its launches the same way:

* a frozen dataclass **launch config** per kernel family (tile sizes, padded
  static dims, occupancy hints, grid splits) with a ``heuristic(...)``
  constructor from the problem's static dims (n, C, K; never T or M). Its
  fields feed the kernel's ``ct.Constant`` parameters and compiler hints, so
  ``(kernel, argument dtypes, config)`` is the **compile key** (``Launch.key``):
  batch dims (T, M) stay dynamic array shapes. cuTile's own dispatcher caches
  the compiled kernels; besides this key it specializes only on what it infers
  from the arguments (seen on the H200: 16-byte base alignment, strides, and
  the innermost dim's divisibility by 16 -- C, not T). Inside
  ``record_compile_keys()``, ``Launch.run`` records each key in ``COMPILE_KEYS``
  so tests can check that a new T reuses it;
* a ``Launch`` record (kernel, grid, args) that ``run()`` sends to the current
  torch stream of its tensors' device (a raw stream handle), and that
  ``export_cubin()`` compiles ahead of time with the same arguments given as
  ``torch.device("meta")`` tensors. CI (no GPU) compiles every kernel through
  that path for sm_90 and sm_100.

Importing this module needs ``cuda.tile`` but no GPU and no driver.
"""
from __future__ import annotations

import dataclasses
import io
import math
from typing import Any, Sequence

import torch

from tilekernels._glue import (COMPILE_KEYS, _RECORD_KEYS, _WORKSPACES, WORKSPACE_REUSE, _raw_stream,  # noqa: F401
                               env_flag, may_keep, next_pow2, record_compile_keys, sm_count, workspace,
                               workspace_reuse)  # (re-exported; the workspaces serve CuTe DSL kernels too)

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint, export_kernel)

PAD_ZERO = ct.PaddingMode.ZERO

_DTYPES = {
    torch.bfloat16: ct.bfloat16,
    torch.float16: ct.float16,
    torch.float32: ct.float32,
    torch.float64: ct.float64,
    torch.int32: ct.int32,
}

# the recorded compile keys are shared with every GPU launcher (tilekernels/_glue.py)


def pow2_floor(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n).bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def ct_dtype(dtype: torch.dtype):
    return _DTYPES[dtype]


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel`` over ``grid`` with ``args`` (tensors,
    Python floats for dynamic fp32 scalars, and the config's constants)."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    cfg: Any = None
    hints: tuple = ()  # compiler hints, e.g. (("occupancy", 4),): part of the key
    # programmatic dependent launch: the kernel may be scheduled while the one before it in
    # the stream finishes, so it must start with ``ct.grid_dependency_control_wait()``
    pdl: bool = False

    def compiled_kernel(self):
        return hinted(self.kernel, self.hints)

    def key(self) -> tuple:
        # tensors by dtype, fp32 scalars by type (dynamic), ints/bools by value (constants)
        dts = tuple(str(a.dtype) if isinstance(a, torch.Tensor) else
                    "float" if isinstance(a, float) else a for a in self.args)
        return (self.kernel._pyfunc.__name__, dts, self.cfg, self.hints)

    def run(self) -> None:
        """Launch on the current stream of the arguments' device (not of the current
        device: the two differ when a caller's tensors live on another GPU), passed to
        cuTile as the raw stream handle (``torch.cuda.current_stream(device)`` cost
        ~19 us per launch on the H200 host)."""
        if any(g == 0 for g in self.grid):
            return
        if _RECORD_KEYS[0]:
            COMPILE_KEYS.add(self.key())
        dev = next(a.device for a in self.args if isinstance(a, torch.Tensor))
        if dev.type != "cuda":   # as _cute's Launch.run: a named error, not a torch internal's AttributeError
            raise ValueError(f"{self.kernel._pyfunc.__name__}: launched with a tensor on {dev}, not on a CUDA device")
        ct.launch(_raw_stream(dev.index), self.grid, self.compiled_kernel(), self.args,
                  programmatic_dependent_launch=self.pdl)

    # ---- ahead-of-time compilation (CI: no GPU needed) ----
    def signature(self) -> KernelSignature:
        return KernelSignature([_constraint(a) for a in self.args],
                               CallingConvention.cutile_python_v1())

    def export_cubin(self, gpu_code: str) -> bytes:
        buf = io.BytesIO()
        export_kernel(self.compiled_kernel(), [self.signature()], buf, gpu_code=gpu_code,
                      output_format="cubin")
        return buf.getvalue()


_HINTED: dict = {}


def hinted(kernel, hints: tuple):
    """``kernel`` with compiler hints (occupancy, ...); one kernel object (and
    so one JIT cache) per distinct hint set."""
    if not hints:
        return kernel
    key = (kernel, hints)
    if key not in _HINTED:
        _HINTED[key] = kernel.replace_hints(**dict(hints))
    return _HINTED[key]


def occ(n: int | None) -> tuple:
    """Launch hints for an occupancy target (None: the compiler's choice)."""
    return (("occupancy", n),) if n else ()


def run_all(launches: Sequence[Launch]) -> None:
    for ln in launches:
        ln.run()


def _divisor(x: int, cap: int = 16) -> int:
    """Largest power of two <= cap dividing x (0 counts as divisible)."""
    return cap if x == 0 else math.gcd(int(x), cap)


def _constraint(a):
    """What cuTile may assume about one launch argument when compiling ahead
    of time: contiguous rows, 16-byte aligned base, no aliasing, strides
    divisible as in the example. Dynamic fp32 scalars; ints/bools constant."""
    if isinstance(a, torch.Tensor):
        elt = a.element_size()
        strides = a.stride()
        return ArrayConstraint(
            ct_dtype(a.dtype), a.dim(),
            index_dtype=ct.int32,
            stride_lower_bound_incl=0,
            alias_groups=(),
            may_alias_internally=False,
            stride_constant=tuple([None] * (a.dim() - 1) + [1]) if a.dim() else (),
            stride_divisible_by=tuple(_divisor(s, max(1, 16 // elt)) for s in strides[:-1]) + (1,)
            if a.dim() else (),
            shape_divisible_by=tuple(_divisor(d) for d in a.shape),
            base_addr_divisible_by=16,
        )
    if isinstance(a, float):
        return ScalarConstraint(ct.float32)
    if isinstance(a, (bool, int)):
        return a
    raise TypeError(f"cannot describe launch argument {a!r}")
