"""The kernel table every backend registers into.

A backend module registers destination-passing implementations with
``@kernel(op, backend, "fwd"|"bwd")``. Modules are imported lazily, by the name
the op's spec gives (``Backend.module``), so a missing toolchain never breaks
``import registry`` or ``import tilekernels``, and the registry never imports a
family package by itself (imports run one way: specs <- registry <- families).
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

_KERNELS: dict[tuple[str, str, str], Callable] = {}
_SKIPS: dict[tuple[str, str], frozenset] = {}


def kernel(op: str, backend: str, pass_: str = "fwd", skips: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Register ``fn`` as ``op``'s ``pass_`` implementation for ``backend``. ``skips`` (bwd only):
    inputs whose gradient this kernel takes as None and then does not compute (a frozen weight's
    wgrad GEMM); the op's declaration must list them as skippable (its custom op's schema)."""
    if pass_ not in ("fwd", "bwd"):
        raise ValueError(f"pass must be 'fwd' or 'bwd', got {pass_!r}")
    if skips and pass_ != "bwd":
        raise ValueError(f"{op}/{backend}: only a bwd kernel skips gradients")

    def deco(fn: Callable) -> Callable:
        key = (op, backend, pass_)
        if key in _KERNELS and _KERNELS[key] is not fn:
            raise RuntimeError(f"kernel {key} registered twice")
        _KERNELS[key] = fn
        if skips:
            _SKIPS[(op, backend)] = frozenset(skips)
        return fn

    return deco


def skipped_grads(op: str, backend: str) -> frozenset:
    """Inputs whose gradient ``backend``'s bwd kernel of ``op`` skips when autograd does not need it
    (registered with the kernel; loaded with it)."""
    get_kernel(op, backend, "bwd")
    return _SKIPS.get((op, backend), frozenset())


@functools.lru_cache(maxsize=None)
def _modules() -> dict[tuple[str, str], str]:
    from specs import all_specs

    return {(s.name, b.name): b.module for s in all_specs() for b in s.backends}


def _load(op: str, backend: str) -> None:
    importlib.import_module(_modules()[(op, backend)])


def has_kernel(op: str, backend: str, pass_: str) -> bool:
    if (op, backend, pass_) not in _KERNELS:
        try:
            _load(op, backend)
        except (KeyError, ImportError):
            return False
    return (op, backend, pass_) in _KERNELS


def get_kernel(op: str, backend: str, pass_: str) -> Callable:
    fn = _KERNELS.get((op, backend, pass_))
    if fn is not None:
        return fn
    _load(op, backend)
    try:
        return _KERNELS[(op, backend, pass_)]
    except KeyError:
        raise NotImplementedError(f"{op}: backend {backend!r} has no {pass_} kernel") from None
