"""C-level guards in front of the validated-call cache (the registry's hot path).

The validated-call cache (``Op._checked`` in :mod:`registry.core`) is keyed by a Python
tuple of every tensor's metadata (shape, strides, dtype, device, requires_grad) plus the
plain params: building and hashing that tuple costs about 1 us per tensor on the host
(gdn_decode's 7 tensors: ~6 us of the registry's ~10). This module puts a small inline
cache in front of it: per op, the last few call *patterns* (argument types, keyword names,
values and types, backend, grad mode, strict mode), each with a torch
``TensorGuards`` object, the check TorchDynamo itself runs on every compiled-frame call,
which compares dispatch keys, dtype, device index, requires_grad, sizes and strides of
all tensors in C++ (~0.1 us per tensor). A pattern whose guard passes is a call the slow
key would also have found, so it gets that key's cached result; anything else (no match,
a tensor subclass, a non-scalar keyword, a float zero whose sign the slow key tells
apart, a torch without TensorGuards) takes the slow key as before.

``TensorGuards`` is a private torch API: :func:`available` probes it once (it must refuse
a changed shape, stride, dtype and requires_grad) and the cache stays off if the probe
fails, so a torch that changes it only loses the speed, never correctness.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # noqa: BLE001 - an older/newer torch without it: the slow key only
    _TensorGuards = None

_PLAIN_SCALARS = frozenset((int, float, bool, str, type(None)))
_TENSOR_TYPES = frozenset((torch.Tensor, torch.nn.Parameter))
_NONE = type(None)
_PATTERNS = 8  # per op: call patterns kept (replaced round robin)
_STATE: list[bool] = []  # the probe's verdict, once


def _make(tensors: list) -> Any:
    return _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                         dynamic_dims_strides=[list(t.stride()) for t in tensors])


def _probe() -> bool:
    if _TensorGuards is None:
        return False
    try:
        a, b = torch.zeros(2, 3), torch.zeros(3, dtype=torch.int64)
        g = _make([a, b])
        changed = [
            (torch.zeros(2, 4), b),                          # shape
            (torch.zeros(3, 2).t(), b),                      # strides
            (torch.zeros(2, 3, dtype=torch.float64), b),     # dtype
            (torch.zeros(2, 3, requires_grad=True), b),      # requires_grad
            (a, torch.zeros(3, dtype=torch.int32)),          # the second tensor's dtype
        ]
        return bool(g.check(a, b)) and bool(g.check(torch.ones(2, 3), b.clone())) and \
            not any(g.check(*c) for c in changed)
    except Exception:  # noqa: BLE001
        return False


def available() -> bool:
    """Whether this torch's TensorGuards behaves as the cache needs (probed once)."""
    if not _STATE:
        _STATE.append(_probe())
    return _STATE[0]


def _kw_key(kwargs: dict) -> Optional[tuple]:
    """(names, values, types) of plain keyword params, () without any; None if one is not plain."""
    if not kwargs:
        return ()
    vals = tuple(kwargs.values())
    types = tuple(map(type, vals))
    if not _PLAIN_SCALARS.issuperset(types):
        return None
    return (tuple(kwargs), vals, types)


# a pattern's slots: the cached result, the value-rule memo, its prepared call, and that call again where a
# matching call may go to it directly (Op.__call__'s quick path; None otherwise)
HIT, MEMO, RUN, QUICK = 5, 6, 7, 8


def host_values(t: torch.Tensor) -> Any:
    """A CPU tensor's values as bytes (~1 us for the few thousand int32 of a cu_seqlens); None
    for any other device. A CPU tensor can be written without bumping its version counter (a
    numpy view, ``.data``, as serving loops refill their pinned index buffers each step), so
    the value caches compare its bytes, not only its version: its rules are cheap to re-check
    and its values are what a kernel indexes with. A GPU tensor's values cannot be read
    without a sync: there the version counter is all the caches see."""
    if t.device.type != "cpu":
        return None
    return t.detach().numpy().tobytes()


def value_memo(tensors: Any, idx: tuple) -> Optional[tuple]:
    """What ``values_unchanged`` compares: the tensors at ``idx`` (those whose values the
    op's rules read) as weak references with their version counters and, for CPU tensors,
    their values (``host_values``); None while a CUDA stream captures (a graph must contain
    its own checks) or for a tensor without a version counter or readable values."""
    refs, vers, cuda = [], [], False
    try:
        for i in idx:
            t = tensors[i]
            if t is None:
                refs.append(None)
                vers.append(0)
                continue
            cuda = cuda or t.is_cuda
            refs.append(weakref.ref(t))
            vers.append((t._version, host_values(t)))
    except (AttributeError, RuntimeError, TypeError):
        return None
    if cuda and torch.cuda.is_current_stream_capturing():
        return None
    return (idx, tuple(refs), tuple(vers), cuda)


def values_unchanged(memo: Optional[tuple], tensors: Any) -> bool:
    """Whether this call reads the very same, unmodified tensors as the call that left
    ``memo`` (same objects, same version counters; the pattern already pins shapes,
    dtypes, devices, params and grad mode): its value rules then hold as they did. A
    write through torch bumps the version; a capturing stream always re-checks."""
    if memo is None:
        return False
    idx, refs, vers, cuda = memo
    for i, r, v in zip(idx, refs, vers):
        t = tensors[i]
        if r is None:
            if t is not None:
                return False
        elif r() is not t or t._version != v[0] or (v[1] is not None and host_values(t) != v[1]):
            return False
    return not (cuda and torch.cuda.is_current_stream_capturing())


class CallGuards:
    """One op's inline cache: up to 8 call patterns, each mapped to the validated-call
    cache's result for it. ``mode`` is (backend, grad enabled, strict)."""

    __slots__ = ("_entries", "_next")

    def __init__(self) -> None:
        self._entries: list[tuple] = []
        self._next = 0

    def clear(self) -> None:
        self._entries.clear()
        self._next = 0

    def lookup(self, args: tuple, kwargs: dict, mode: tuple, quick: bool = False) -> Optional[list]:
        """This call's pattern ``[..., hit, value memo, prepared call]`` (``hit``: the validated-call
        cache's result, at ``HIT``; the memo at ``MEMO``, see ``values_unchanged``; at ``RUN`` the
        caller's prepared call for this metadata, None until it builds one), or None (then the
        caller takes the slow key). ``quick``: only a pattern whose ``QUICK`` slot holds that call
        (``Op.__call__``'s quick path).
        Keyword values are compared with ``==`` after their types: patterns never hold a
        float zero (see ``add``) or NaN, so equal values are the same param."""
        if not self._entries:
            return None
        kw = _kw_key(kwargs)
        if kw is None:
            return None
        types = tuple(map(type, args))
        for e in self._entries:
            if quick and e[QUICK] is None:
                continue
            if e[0] == types and e[2] == mode and e[1] == kw:
                tpos = e[3]
                ts = args if tpos is None else [args[i] for i in tpos]
                for t in ts:  # TensorGuards aborts the process on a nested tensor (reads its sizes): ~0.05 us each
                    if t.is_nested:
                        return None
                if e[4].check(*ts):
                    return e
        return None

    def add(self, args: tuple, kwargs: dict, mode: tuple, hit: Any) -> None:
        """Remember this call's pattern (positional tensors or None, plain keyword params;
        no float zero) with the slow key's result ``hit``."""
        if not available():
            return
        kw = _kw_key(kwargs)
        if kw is None or (kw and any(t is float and not v for v, t in zip(kw[1], kw[2]))):
            return
        types = tuple(map(type, args))
        tpos = []
        for i, (a, t) in enumerate(zip(args, types)):
            if t in _TENSOR_TYPES:
                if a.layout != torch.strided or a.is_meta:
                    return
                tpos.append(i)
            elif t is not _NONE:
                return
        try:
            guard = _make([args[i] for i in tpos])
        except Exception:  # noqa: BLE001 - e.g. a tensor TensorGuards cannot describe
            return
        entry = [types, kw, mode, None if len(tpos) == len(args) else tuple(tpos), guard, hit, None, None, None]
        if len(self._entries) < _PATTERNS:
            self._entries.insert(0, entry)
        else:
            self._entries[self._next] = entry
            self._next = (self._next + 1) % _PATTERNS
