"""Op objects: validate, choose a backend, explain the choice, call.

``registry.get(name)`` returns an :class:`Op`. ``op(*tensors, backend="auto",
**params)`` binds and checks everything against the spec first, then runs the
first backend (in spec order) whose requirements hold; ``backend=`` forces one.
``op.explain(...)`` gives, per backend, ``(ok, reason)``.

The hot path (design):

* **No host sync.** Validation reads tensor metadata only. Rules on tensor
  values run on the host for CPU tensors and as device-side tensor ops feeding
  an async assert otherwise (see :mod:`registry.validate`); an op whose spec
  names ``host_values`` (the CP collectives: their send sizes come from
  cu_seqlens by design) copies those tensors to the host once per call and
  hands the kernels that copy.
* **Validated-call cache.** A call whose tensors have the same metadata (shape,
  strides, dtype, device, requires_grad) and the same plain params as one
  validated before, under the same grad mode and TILEKERNELS_STRICT, passes the
  same metadata checks and gets the same backend; it skips bind + choose and
  re-runs only the value rules (every call: values can change under the same
  metadata) and, for ops with in-place inputs, the check that those share no
  memory with another argument (pointers can change too). Machine facts
  (toolchains, SM, registered kernels) are taken as fixed for the process:
  ``clear_caches()`` forgets them. In front of it, a
  per-op inline cache of recent call patterns checks the tensors' metadata in
  C++ (torch's TensorGuards, :mod:`registry.guards`) instead of building the
  Python key: a repeated call costs a few microseconds, not one per tensor.
* **torch.compile.** While TorchDynamo traces, the call skips the cache and runs
  the whole validation as traced Python: metadata rules become guards, value
  rules become graph ops, machine facts are trace-time constants
  (``_machine``), and the entry's custom ops land in the graph.
* **CUDA graphs.** Nothing on the path allocates per call beyond the outputs or
  reads the device, so capture through ``registry.get(name)`` works; the value
  checks are captured too and run again at every replay.
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable, Optional

import torch

from specs import all_specs
from specs.schema import Backend, OpSpec

from . import capabilities as caps
from .errors import BackendUnavailable, SpecError
from .guards import HIT, MEMO, QUICK, RUN, CallGuards, value_memo, values_unchanged
from .kernels import has_kernel
from .transforms import func_transforms
from .validate import (Bound, _resolver, bind, check_values, dtype_name, failing_constraint, precompile,
                       recheck_overlap, values_read)

log = logging.getLogger("tilekernels")
_warned: set[tuple[str, str]] = set()


def _import_attr(path: str) -> Callable:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


# os.environ.get costs ~1.2 us a call (it encodes the key); the mapping's own dict, read
# directly, ~0.05 us and still sees monkeypatch.setenv / os.environ updates.
_ENV = getattr(os.environ, "_data", None)
_STRICT_KEY = os.environ.encodekey("TILEKERNELS_STRICT") if hasattr(os.environ, "encodekey") else None
_FALSE = {"", "0", "false", "False", b"", b"0", b"false", b"False"}


def strict() -> bool:
    if _ENV is not None and _STRICT_KEY is not None:
        return _ENV.get(_STRICT_KEY, b"0") not in _FALSE
    return os.environ.get("TILEKERNELS_STRICT", "0") not in _FALSE


def _requirement(req: str) -> Optional[str]:
    """Why a runtime requirement of a backend does not hold (None: it holds)."""
    if req == "distributed":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return "torch.distributed is not initialized (a collective needs a process group)"
        return None
    return f"unknown requirement {req!r}"  # pragma: no cover - the schema lists the known ones


def machine_reasons(b: Backend, device, sm: int | None = None) -> tuple[list[str], int | None]:
    """What this machine lacks for backend ``b`` on ``device`` (a CUDA device and
    the SM range for GPU backends, the toolchains, runtime requirements such as an
    initialised process group), and the device's SM (``sm`` overrides it)."""
    why: list[str] = []
    if b.name != "torch":
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
    for req in getattr(b, "requires", ()):
        r = _requirement(req)
        if r:
            why.append(r)
    return why, sm


_BACKENDS: dict[int, Backend] = {}  # id -> Backend (the specs live for the process)


@torch.compiler.assume_constant_result
def _machine(op: str, backend_id: int, device: str, need: tuple) -> tuple:
    """(reasons, sm) for the machine part of ``backend_status``: device, SM,
    toolchains, runtime requirements, the backend module and its kernels. Under
    torch.compile this runs once at trace time and its result is a constant."""
    b = _BACKENDS[backend_id]
    why, sm = machine_reasons(b, torch.device(device))
    if why or b.name == "torch":  # the torch backend is the spec's own entry: nothing to import
        return tuple(why), sm
    try:
        importlib.import_module(b.module)
    except Exception as e:  # noqa: BLE001
        return (f"cannot import {b.module} ({type(e).__name__}: {e})",), sm
    for p in need:
        if not has_kernel(op, b.name, p):
            return (f"{b.module} registers no {p} kernel for {op}",), sm
    return (), sm


def backend_status(bound: Bound, b: Backend) -> tuple[bool, str]:
    """Whether backend ``b`` can run this validated call, and why (not).

    Every unmet requirement is listed (dtypes, the backend's own limits, passes,
    device, SM, toolchain, runtime requirements), for the torch backend too, so
    ``explain`` tells the whole story. While torch.compile / export traces, a backend the
    machine cannot run is refused with the machine's reasons only (its limits would become
    guards on the batch dims); the choice is the same, the fallback message shorter.
    """
    op = bound.spec.name
    need = ("fwd", "bwd") if bound.spec.differentiable and bound.requires_grad else ("fwd",)
    if torch.compiler.is_compiling():
        # traced: a backend this machine cannot run is out before its limits are evaluated, since
        # each limit on a batch dim would become a guard (torch.export would then ask for a bound
        # on T that only an unusable backend needs); eager calls list every reason (explain)
        machine, sm = _machine(op, id(b), str(bound.device), need)
        if machine:
            return False, "; ".join(machine)
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
    if not torch.compiler.is_compiling():
        _BACKENDS.setdefault(id(b), b)
    machine, sm = _machine(op, id(b), str(bound.device), need)
    why += list(machine)
    if why:
        return False, "; ".join(why)
    if b.name == "torch":
        return True, torch_reason(b) + (" (fwd+bwd)" if "bwd" in need else "")
    return True, f"{b.name}: requirements hold (sm_{sm}, passes {'+'.join(need)})"


def torch_label(b: Backend) -> str:
    """What explain and the fallback log call an op's torch backend: the reference, or its own torch code."""
    return "torch reference" if b.runs_reference else "torch backend (its own torch code, not the reference)"


def torch_reason(b: Backend) -> str:
    """Why the torch backend ``b`` can run a call (explain's text; tk-probe's without inputs)."""
    return f"{torch_label(b)}: runs on any device" + (" with a torch.distributed process group" if b.requires else "")


@torch.compiler.assume_constant_result
def _fallback(op: str, why: str, strict_mode: bool, label: str) -> bool:
    """Log (once per reason) or, in strict mode, refuse a fallback to torch."""
    if strict_mode:
        raise BackendUnavailable(op, "backend", "a GPU backend (TILEKERNELS_STRICT=1)",
                                 f"fallback to torch because {why}")
    if (op, why) not in _warned:
        _warned.add((op, why))
        log.warning("%s: falling back to the %s: %s", op, label, why)
    return True


class Op:
    """One registered op: ``Op(*tensors, backend="auto", **params)``."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.name = spec.name
        self._torch_label = torch_label(next(b for b in spec.backends if b.name == "torch"))  # (the fallback log)
        self._entry: Optional[Callable] = None
        self._reference: Optional[Callable] = None
        self._checked: dict = {}
        self._guards = CallGuards()  # C-level inline cache in front of _checked (registry/guards.py)
        self._in_names = [t.name for t in spec.inputs]
        self._n_in = len(self._in_names)
        self._in_place = tuple(t.name for t in spec.inputs if t.role == "inout")  # (functionalize refuses them)
        self._in_place_at = tuple(i for i, t in enumerate(spec.inputs) if t.role == "inout")
        self._param_specs = {p.name: p for p in spec.params}
        self._rules = precompile(spec)
        for b in spec.backends:
            _BACKENDS[id(b)] = b
        self._has_values = bool(self._rules[1])
        read = values_read(self._rules[1], tuple(self._in_names)) if self._has_values else ()
        self._value_idx = tuple(self._in_names.index(n) for n in read)  # inputs the value rules read
        # tensors every backend reads on the host: the spec's own, plus any every backend names
        every = set.intersection(*[set(b.host_values) for b in spec.backends]) if spec.backends else set()
        self._host_values = tuple(spec.host_values) + tuple(sorted(every - set(spec.host_values)))
        self._from_ints = tuple((i, t.name, getattr(torch, t.dtypes[0])) for i, t in enumerate(spec.inputs)
                                if t.from_ints)
        # calls of a seen metadata may go straight to the pattern's prepared call (CallGuards.lookup's quick): nothing
        # of the call's values is converted (host copies, int lists), re-checked (value rules) or overlap-checked
        self._quick = not (self._from_ints or self._host_values or self._in_place_at or self._has_values)

    def __repr__(self) -> str:
        return f"Op({self.name!r}, backends={[b.name for b in self.spec.backends]})"

    def __reduce__(self):
        # by name: pickle, copy and deepcopy (a model holding an op: torch.save of the module, EMA
        # copies, multiprocessing spawn) give the process's one Op, not a copy of its caches.
        # An Op built from a spec of its own (not registry.get's) has no name to travel by.
        if _ops().get(self.name) is not self:
            import pickle
            raise pickle.PicklingError(f"Op {self.name!r} is not the registry's op of that name: only "
                                       "ops from registry.get pickle or copy (by name)")
        return get, (self.name,)

    @property
    def entry(self) -> Callable:
        if self._entry is None:
            self._entry = _import_attr(self.spec.entry)
        return self._entry

    @property
    def reference(self) -> Callable:
        if self._reference is None:
            self._reference = _import_attr(self.spec.reference)
        return self._reference

    @property
    def forward_ops(self) -> tuple:
        """The custom ops (``OpOverload``s) that stand for this op's forward pass where torch looks:
        ``tilekernels::<op>`` (functional; an eager call under a dispatch mode such as selective
        activation checkpointing runs it) and ``tilekernels::<op>_fwd`` (destination-passing; what
        torch.compile traces; an op that updates an input in place, gdn_decode, has only the latter).
        A selective-checkpointing policy saves or recomputes the op by these::

            policy = lambda ctx, func, *a, **k: (CheckpointPolicy.MUST_SAVE if func in op.forward_ops
                                                 else CheckpointPolicy.PREFER_RECOMPUTE)

        Empty for an op whose entry is written by hand (the CP collectives)."""
        gen = getattr(self.entry, "gen", None)
        return () if gen is None else gen.forward_ops

    def bind(self, *args, **kwargs) -> Bound:
        return bind(self.spec, *self._prepare(args, kwargs), self._rules)

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
                    _fallback(self.name, "; ".join(reasons), strict(), self._torch_label)
                    if fell_back is not None:
                        fell_back.extend(reasons)
                return b.name
            reasons.append(f"{b.name}: {why}")
        raise BackendUnavailable(self.name, "backend", "a usable backend", "; ".join(reasons))

    # ---- the call path

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Tensors every backend reads on the host by design (``OpSpec.host_values``, or a
        name in every backend's ``Backend.host_values``) become host copies, once per call;
        everything else is passed through (a tensor only some backends read on the host
        stays on its device: its value rules run there, and the backend that needs it on
        the host reads it in its entry)."""
        if self._from_ints:
            args, kwargs = self._ints_to_tensors(args, kwargs)
        if not self._host_values:
            return args, kwargs
        args = list(args)
        for name in self._host_values:
            i = self._in_names.index(name)
            if i < len(args):
                if isinstance(args[i], torch.Tensor) and args[i].device.type != "cpu":
                    args[i] = args[i].cpu()
            elif isinstance(kwargs.get(name), torch.Tensor) and kwargs[name].device.type != "cpu":
                kwargs = dict(kwargs, **{name: kwargs[name].cpu()})
        return tuple(args), kwargs

    def _ints_to_tensors(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A list or tuple given for a ``from_ints`` input becomes a CPU tensor of its dtype (anything else
        is left for validation to judge)."""
        for i, name, dtype in self._from_ints:
            if i < len(args):
                if isinstance(args[i], (list, tuple)):
                    args = (*args[:i], self._int_tensor(name, args[i], dtype), *args[i + 1:])
            elif isinstance(kwargs.get(name), (list, tuple)):
                kwargs = dict(kwargs, **{name: self._int_tensor(name, kwargs[name], dtype)})
        return args, kwargs

    def _int_tensor(self, name: str, v, dtype: torch.dtype) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced: the ints may be SymInts (dynamo cannot trace hasattr on
            # them, and __index__ would specialize them); torch.tensor of them is a graph op
            if not all(isinstance(e, (int, torch.SymInt)) and not isinstance(e, bool) for e in v):
                raise SpecError(self.name, f"tensor {name}", "a torch.Tensor or a sequence of ints",
                                f"a {type(v).__name__} of other elements")
            return torch.tensor(list(v), dtype=dtype)
        if not all(hasattr(e, "__index__") and not isinstance(e, (bool, torch.Tensor)) for e in v):
            raise SpecError(self.name, f"tensor {name}", "a torch.Tensor or a sequence of ints",
                            f"a {type(v).__name__} of {sorted({type(e).__qualname__ for e in v})}")
        try:
            return torch.tensor([e.__index__() for e in v], dtype=dtype)
        except (OverflowError, RuntimeError, ValueError) as e:
            raise SpecError(self.name, f"tensor {name}", f"ints that fit {dtype}", f"{list(v)} ({e})") from None

    def __call__(self, *args, backend: str = "auto", **kwargs) -> Any:
        if self._quick and type(backend) is str and not torch.compiler.is_compiling() and \
                not torch._C._are_functorch_transforms_active():
            # a seen call's metadata (the guard pattern's prepared call, set below once the pattern has one): what
            # the path below would do for it, without redoing its steps (host cost: registry ledger, session 64)
            pattern = self._guards.lookup(args, kwargs, (backend, torch.is_grad_enabled(), strict()), quick=True)
            if pattern is not None:
                return pattern[QUICK](args)
        args, kwargs = self._prepare(args, kwargs)
        if torch.compiler.is_compiling():  # traced: validation becomes guards and graph ops
            bound = bind(self.spec, args, kwargs, self._rules)
            return self.entry(*bound.args(), backend=self.choose(bound, backend), **bound.params)
        if torch._C._are_functorch_transforms_active():  # vmap / jvp refused before validation reads a value
            func_transforms(self.name, self.spec.differentiable, in_place=self._in_place)
        if not isinstance(backend, str):  # (a list or dict would fail as a cache key, not as a SpecError)
            raise SpecError(self.name, "backend", f"'auto' or one of {[b.name for b in self.spec.backends]}",
                            f"{type(backend).__name__} {backend!r}")
        strict_mode = strict()
        mode = (backend, torch.is_grad_enabled(), strict_mode)
        pattern = self._guards.lookup(args, kwargs, mode)
        if pattern is not None:
            hit = pattern[HIT]
        else:
            key = _call_key(args, kwargs, backend, strict_mode)
            try:
                hit = self._checked.get(key) if key is not None else None
            except TypeError:  # symbolic shapes (make_fx(tracing_mode="symbolic")): validated, not cached
                key = hit = None
            if hit is None:
                bound = bind(self.spec, args, kwargs, self._rules)
                reasons: list[str] = []
                chosen = self.choose(bound, backend, reasons)
                if key is not None:
                    if len(self._checked) >= _CHECKED_MAX:
                        self._checked.clear()
                    self._checked[key] = (chosen, "; ".join(reasons), bound.params, bound.dims,
                                          len(args) <= self._n_in and not kwargs.keys() - self._param_specs.keys())
                return self.entry(*bound.args(), backend=chosen, **bound.params)
            self._guards.add(args, kwargs, mode, hit)  # seen twice: the C-level guard takes it from now on
        chosen, why, params, dims, positional = hit
        if why and (self.name, why) not in _warned:  # the same fallback as when validated: logged once
            _fallback(self.name, why, strict_mode, self._torch_label)
        if positional:  # inputs all positional (trailing optional ones left out: None)
            tensors = args if len(args) == self._n_in else (*args, *(None,) * (self._n_in - len(args)))
        else:
            tensors = self._in_order(args, kwargs)
        if self._in_place_at:  # the same metadata may come with memory that overlaps now
            recheck_overlap(self.name, self.spec.inputs, tensors, self._in_place_at)
        if self._has_values and not (pattern is not None and values_unchanged(pattern[MEMO], tensors)):
            check_values(self.spec, dict(zip(self._in_names, tensors)), params, dims,
                         mode[1] and any(t is not None and t.requires_grad for t in tensors),
                         self._rules[1])
            if pattern is not None:  # checked (or queued on the device) for these tensors
                pattern[MEMO] = value_memo(tensors, self._value_idx)
        if pattern is not None:  # the pattern fixes the metadata: the generated op's prepared call for it
            run = pattern[RUN]
            if run is None:
                gen = getattr(self.entry, "gen", None)
                run = pattern[RUN] = False if gen is None else gen.prepared(chosen, params, tensors)
                # the quick path takes a pattern whose every call would reach this line with the same run: no
                # fallback to log (or raise, strict), the tensors the arguments as given
                if run and self._quick and not why and positional and len(args) == self._n_in:
                    pattern[QUICK] = run
            if run:
                return run(tensors)
        return self.entry(*tensors, backend=chosen, **params)

    def _in_order(self, args, kwargs) -> list:
        tensors = dict(zip(self._in_names, args))
        for k, v in kwargs.items():
            if k not in tensors and k in self._in_names:
                tensors[k] = v
        return [tensors.get(n) for n in self._in_names]


def clear_caches() -> None:
    """Forget every op's validated calls (after changing what the machine offers)."""
    from .validate import _CHECKED_VALUES

    for op in _ops().values():
        op._checked.clear()
        op._guards.clear()
    _CHECKED_VALUES.clear()


_CHECKED_MAX = 1024
_PLAIN = (int, float, bool, str, type(None))
_SCALARS = frozenset(_PLAIN)


class _NoKey(Exception):
    pass


def _sig(v) -> tuple:
    if isinstance(v, torch.Tensor):
        if v.is_neg() or v.is_conj():  # (as in _call_key)
            raise _NoKey
        return (type(v), v.shape, v.stride(), v.dtype, v.device, v.requires_grad)
    if v is None:
        return None
    t = type(v)
    if t is float:  # 0.0 and -0.0 are different params (the key holds their normal form); NaN never hits
        return (t, v.hex()) if v == 0.0 else (t, v)
    if isinstance(v, _PLAIN):
        return (t, v)
    if isinstance(v, (list, tuple)) and all(isinstance(e, _PLAIN) for e in v):
        return (t, tuple(_sig(e) for e in v))
    raise _NoKey  # other objects: validated on every call


def _call_key(args, kwargs, backend, strict_mode) -> tuple | None:
    """What decides metadata validation and dispatch of a call (None: not cacheable).
    kwargs in call order: another order is another entry, validated once. Flat (one tuple,
    tensors' metadata inline; kwargs as name, signature pairs) because it is built and hashed on
    every call: ~2 us for mhc_pre's 3 tensors and 6 params."""
    key = [backend, torch.is_grad_enabled(), strict_mode]
    try:
        for a in args:
            if isinstance(a, torch.Tensor):  # (its type: a DTensor of a plain tensor's metadata is refused)
                if a.is_neg() or a.is_conj():  # a lazy view of a checked tensor's metadata: bind refuses it
                    raise _NoKey
                key += (type(a), a.shape, a.stride(), a.dtype, a.device, a.requires_grad)
            else:
                key.append(_sig(a))
        if kwargs:
            key.append(None)  # separates positional from keyword signatures
            vals = tuple(kwargs.values())
            types = tuple(map(type, vals))
            if _SCALARS.issuperset(types) and not (float in types and any(
                    t is float and not v for v, t in zip(vals, types))):
                key += (tuple(kwargs), vals, types)  # plain params: their values and types as they are
            else:  # tensors, sequences, or a float zero (0.0 and -0.0 are different params)
                for k, v in kwargs.items():
                    key += (k, _sig(v))
    except (_NoKey, RuntimeError, NotImplementedError):  # (a sparse or nested tensor has no strides: bind refuses it)
        return None
    return tuple(key)


_OPS: dict[str, Op] = {}


def _ops() -> dict[str, Op]:
    if not _OPS:
        out: dict[str, Op] = {}
        for s in all_specs():
            if s.name in out:
                raise RuntimeError(f"two specs named {s.name!r}")
            out[s.name] = Op(s)
        _OPS.update(out)
    return _OPS


def get(name: str) -> Op:
    """The op called ``name`` (its entry module and its params' resolvers are imported here, so that a call
    traced by torch.compile finds everything loaded: dynamo cannot trace an import)."""
    op = _ops().get(name)
    if op is None:
        raise SpecError("registry", "op name", f"one of {sorted(_ops())}", repr(name))
    if op._entry is None:
        op.entry  # noqa: B018 - load it now
        for p in op.spec.params:
            if p.resolve:
                _resolver(p.resolve)
    return op


def names() -> list[str]:
    return sorted(_ops())
