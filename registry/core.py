"""Op objects: validate, choose a backend, explain the choice, call.

``registry.get(name)`` returns an :class:`Op`. ``op(*tensors, backend="auto",
**params)`` binds and checks everything against the spec first, then runs the
first backend (in spec order) whose requirements hold; ``backend=`` forces one.
``op.explain(...)`` gives, per backend, ``(ok, reason)``.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
from typing import Any, Callable

import torch

from specs import all_specs
from specs.schema import Backend, OpSpec

from . import capabilities as caps
from .errors import BackendUnavailable, SpecError
from .validate import Bound, _check_param, bind, dtype_name, failing_constraint

log = logging.getLogger("tilekernels")
_warned: set[tuple[str, str]] = set()


def _import_attr(path: str) -> Callable:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


def strict() -> bool:
    return os.environ.get("TILEKERNELS_STRICT", "0") not in ("", "0", "false", "False")


def machine_reasons(b: Backend, device, sm: int | None = None) -> tuple[list[str], int | None]:
    """What this machine lacks for GPU backend ``b`` on ``device`` (a CUDA device,
    the SM range, the toolchains), and the device's SM (``sm`` overrides it)."""
    why: list[str] = []
    if device.type != "cuda":
        why.append(f"inputs are on {device.type}; {b.name} needs a CUDA device")
    else:
        sm = sm if sm is not None else caps.sm_of(device)
        if b.sm is not None and not (b.sm[0] <= sm <= b.sm[1]):
            why.append(f"device is sm_{sm}; {b.name} kernels need sm_{b.sm[0]}..sm_{b.sm[1]}")
    for tc in b.toolchain:
        t = caps.toolchain(tc)
        if not t.ok:
            why.append(f"toolchain {tc} unavailable: {t.reason}")
    return why, sm


def backend_status(bound: Bound, b: Backend) -> tuple[bool, str]:
    """Whether backend ``b`` can run this validated call, and why (not).

    Every unmet requirement is listed (device, SM, toolchain, dtypes, the
    backend's own limits, passes), so ``explain`` tells the whole story.
    """
    from tilekernels._glue import has_kernel

    op = bound.spec.name
    need = ["fwd", "bwd"] if bound.requires_grad else ["fwd"]
    if b.name == "torch":
        return True, "torch reference: runs on any device" + (" (fwd+bwd)" if bound.requires_grad else "")
    why: list[str] = []
    for tname, allowed in b.dtypes.items():
        v = bound.tensors.get(tname)
        if v is not None and dtype_name(v.dtype) not in allowed:
            why.append(f"{b.name} supports {tname} in {allowed}, got {dtype_name(v.dtype)}")
    bad = failing_constraint(b.constraints, bound.env())
    if bad:
        why.append(f"{b.name} limit {bad}")
    missing = [p for p in need if p not in b.passes]
    if missing:
        why.append(f"{b.name} has no {'/'.join(missing)} kernel and a gradient is needed")
    machine, sm = machine_reasons(b, bound.device)
    why += machine
    if why:
        return False, "; ".join(why)
    try:
        importlib.import_module(b.module)
    except Exception as e:  # noqa: BLE001
        return False, f"cannot import {b.module} ({type(e).__name__}: {e})"
    for p in need:
        if not has_kernel(op, b.name, p):
            return False, f"{b.module} registers no {p} kernel for {op}"
    return True, f"{b.name}: requirements hold (sm_{sm}, passes {'+'.join(need)})"


class Op:
    """One registered op: ``Op(*tensors, backend="auto", **params)``."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.name = spec.name

    def __repr__(self) -> str:
        return f"Op({self.name!r}, backends={[b.name for b in self.spec.backends]})"

    @functools.cached_property
    def entry(self) -> Callable:
        return _import_attr(self.spec.entry)

    @functools.cached_property
    def reference(self) -> Callable:
        return _import_attr(self.spec.reference)

    def bind(self, *args, **kwargs) -> Bound:
        return bind(self.spec, args, kwargs)

    def explain(self, *args, **kwargs) -> list[tuple[str, bool, str]]:
        """Per backend in preference order: (name, ok, reason)."""
        kwargs.pop("backend", None)
        bound = self.bind(*args, **kwargs)
        return [(b.name, *backend_status(bound, b)) for b in self.spec.backends]

    def choose(self, bound: Bound, backend: str = "auto", fell_back: list | None = None) -> str:
        """The backend for a validated call; ``fell_back`` collects the reasons when
        ``auto`` falls back to torch."""
        names = [b.name for b in self.spec.backends]
        if backend != "auto":
            if backend not in names:
                raise SpecError(self.name, "backend", f"'auto' or one of {names}", repr(backend))
            ok, why = backend_status(bound, self.spec.backend(backend))
            if not ok:
                raise BackendUnavailable(self.name, "backend", f"{backend} to be usable", why)
            return backend
        reasons = []
        for b in self.spec.backends:
            ok, why = backend_status(bound, b)
            if ok:
                if b.name == "torch" and reasons:
                    self._fallback(reasons)
                    if fell_back is not None:
                        fell_back.extend(reasons)
                return b.name
            reasons.append(f"{b.name}: {why}")
        raise BackendUnavailable(self.name, "backend", "a usable backend", "; ".join(reasons))  # pragma: no cover

    def _fallback(self, reasons: list[str]) -> None:
        why = "; ".join(reasons)
        if strict():
            raise BackendUnavailable(self.name, "backend", "a GPU backend (TILEKERNELS_STRICT=1)",
                                     f"fallback to torch because {why}")
        key = (self.name, why)
        if key not in _warned:
            _warned.add(key)
            log.warning("%s: falling back to the torch reference: %s", self.name, why)

    def __call__(self, *args, backend: str = "auto", **kwargs) -> Any:
        key = _call_key(args, kwargs, backend) if self._cacheable else None
        hit = self._checked.get(key) if key is not None else None
        if hit is None:
            bound = self.bind(*args, **kwargs)
            reasons: list[str] = []
            chosen = self.choose(bound, backend, reasons)
            if key is not None:
                if len(self._checked) >= _CHECKED_MAX:
                    self._checked.clear()
                self._checked[key] = (chosen, reasons)
            return self.entry(*bound.args(), backend=chosen, **bound.params)
        chosen, reasons = hit
        if reasons:  # the same fallback as when it was validated: logged once, as then
            self._fallback(reasons)
        return self.entry(*self._in_order(args, kwargs), backend=chosen, **self._params(kwargs))

    # ---- the validated-call cache: a call whose every input has the same metadata
    # (shape, strides, dtype, device, requires_grad) and the same plain params as
    # one validated before, under the same grad mode and TILEKERNELS_STRICT, passes
    # the same checks and gets the same backend, so it skips bind + choose (the
    # params it is given are its own, normalised as bind does). Specs with a rule
    # that reads tensor values never use it (see _reads_values). Machine facts
    # (toolchains, SM, registered kernels) are taken as fixed for the process:
    # ``clear_caches()`` forgets every cached call.
    @functools.cached_property
    def _checked(self) -> dict:
        return {}

    @functools.cached_property
    def _cacheable(self) -> bool:
        s = self.spec
        cs = list(s.constraints) + [c for b in s.backends for c in b.constraints]
        exprs = [c.expr for c in cs] + [c.when for c in cs if c.when] + list(s.layouts.values())
        tensors = {t.name for t in s.inputs}
        return not any(_reads_values(e, tensors) for e in exprs)

    @functools.cached_property
    def _in_names(self) -> list[str]:
        return [t.name for t in self.spec.inputs]

    @functools.cached_property
    def _param_specs(self) -> dict:
        return {p.name: p for p in self.spec.params}

    def _in_order(self, args, kwargs) -> list:
        tensors = dict(zip(self._in_names, args))
        for k, v in kwargs.items():
            if k not in tensors and k in self._in_names:
                tensors[k] = v
        return [tensors.get(n) for n in self._in_names]

    def _params(self, kwargs) -> dict:
        """This call's params with defaults, normalised by bind's own param check."""
        return {name: _check_param(self.name, p, kwargs.get(name, p.default))
                for name, p in self._param_specs.items()}


def clear_caches() -> None:
    """Forget every op's validated calls (after changing what the machine offers)."""
    for op in _ops().values():
        op._checked.clear()


_VALUE_HELPERS = {"values", "seqlens"}
_TENSOR_SAFE = {"present", "ndim", "dtype", "requires_grad"}


def _reads_values(expr: str, tensors: set[str]) -> bool:
    """Whether a spec expression reads tensor data: values()/seqlens(), or any other
    helper (sum, max, any, ...) applied to a tensor itself."""
    import ast

    from specs import expr as _expr

    for node in ast.walk(_expr.parse(expr).body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in _VALUE_HELPERS:
                return True
            if node.func.id not in _TENSOR_SAFE and any(
                    isinstance(a, ast.Name) and a.id in tensors for a in node.args):
                return True
    return False


_CHECKED_MAX = 1024
_PLAIN = (int, float, bool, str, type(None))


class _NoKey(Exception):
    pass


def _sig(v) -> tuple:
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.dtype, v.device, v.requires_grad)
    if isinstance(v, _PLAIN):
        return (type(v), v)
    if isinstance(v, (list, tuple)) and all(isinstance(e, _PLAIN) for e in v):
        return (type(v), tuple((type(e), e) for e in v))
    raise _NoKey  # other objects: validated on every call


def _call_key(args, kwargs, backend) -> tuple | None:
    """What decides validation and dispatch of a call (None: not cacheable)."""
    try:
        return (tuple(_sig(a) for a in args), tuple(sorted((k, _sig(v)) for k, v in kwargs.items())),
                backend, torch.is_grad_enabled(), strict())
    except _NoKey:
        return None


@functools.lru_cache(maxsize=None)
def _ops() -> dict[str, Op]:
    out: dict[str, Op] = {}
    for s in all_specs():
        if s.name in out:
            raise RuntimeError(f"two specs named {s.name!r}")
        out[s.name] = Op(s)
    return out


def get(name: str) -> Op:
    try:
        return _ops()[name]
    except KeyError:
        raise SpecError("registry", "op name", f"one of {sorted(_ops())}", repr(name)) from None


def names() -> list[str]:
    return sorted(_ops())
