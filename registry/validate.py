"""Bind a call's arguments to an op spec and check every rule, before any launch.

``bind(spec, args, kwargs)`` returns a :class:`Bound` (tensors by name, params
with defaults, the layout, every dim's value) or raises :class:`SpecError`
naming op, tensor/param, expected and got.

Rules come in two kinds (:func:`split_rules` tells them apart statically):

* **metadata rules** (dtypes, ranks, shapes, strides, devices, params, and
  constraints over dims and params) are plain Python over tensor metadata. The
  registry remembers a call that passed them (``core``); under torch.compile
  they are traced, so each becomes a guard.
* **value rules** read tensor data (``values(t)``, ``seqlens(t)``). They never
  copy a GPU tensor to the host: where every tensor such a rule reads is a CPU
  tensor (m_splits, cu_seqlens passed on the CPU, as Megatron and Transformer
  Engine take them) it is evaluated on the host and raises SpecError; otherwise
  (a GPU tensor, or any tensor while torch.compile traces) the same expression
  is evaluated as tensor ops on the tensor's device and all of a call's value
  rules feed one ``torch._assert_async`` whose message names op, tensor and
  rules, so the call never waits for the GPU and can be captured in a CUDA
  graph (the check is then replayed with the graph). A ``meta`` tensor has no
  values: a rule that reads one raises SpecError.

Expressions are compiled once into Python functions (``registry.exprs``), which
keeps per-call validation cheap and lets TorchDynamo trace it.
"""
from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch._subclasses.fake_tensor as _fake_tensor  # (imported by torch itself)

from specs import expr as _expr
from specs.schema import Constraint, OpSpec, TensorSpec

from .errors import SpecError
from .guards import host_values

from .exprs import (  # noqa: F401 (dtype_name, reads_values: imported from here by other modules)
    _DEVICE_ENV, GRAD_DTYPE_NAMES, GRAD_DTYPES, _compiling, _fn, _is_t, _tk_not, _tk_or, constraint_env,
    dtype_name, evaluate, reads_values, value_tensors,
)


def _split(spec: OpSpec) -> tuple[list[Constraint], list[Constraint]]:
    tensors = {t.name for t in spec.inputs}
    meta, vals = [], []
    for c in spec.constraints:
        reads = reads_values(c.expr, tensors) or (c.when is not None and reads_values(c.when, tensors))
        (vals if reads else meta).append(c)
    return meta, vals


def split_rules(spec: OpSpec) -> tuple[list[Constraint], list[Constraint]]:
    """(metadata constraints, value constraints) of an op."""
    return _split(spec)


def precompile(spec: OpSpec) -> tuple[list[Constraint], list[Constraint]]:
    """Compile every expression of ``spec`` (shapes, layouts, constraints in host and
    device form, backend limits) and return its rule split, so that a call, and
    TorchDynamo tracing one, only looks compiled functions up."""
    meta, vals = _split(spec)
    names = {t.name for t in spec.inputs}
    for t in spec.inputs + spec.outputs:
        for shape in t.all_shapes():
            for d in shape:
                if isinstance(d, str):
                    _fn(d)
    exprs = list(spec.layouts.values())
    for c in list(spec.constraints) + [c for b in spec.backends for c in b.constraints]:
        exprs += [c.expr] + ([c.when] if c.when else [])
    for e in exprs:
        _fn(e)
    for c in vals:
        _plan(c, tuple(names))
        for e in (c.expr, c.when):
            if e:
                _fn(e, device=True)
                value_tensors(e, names)
                reads_values(e, names)
    return meta, vals


# ---------------------------------------------------------------- Bound


@dataclass
class Bound:
    """A validated call: what dispatch and the kernels are given."""
    spec: OpSpec
    tensors: dict[str, Optional[torch.Tensor]]
    params: dict[str, Any]
    dims: dict[str, int]
    layout: Optional[str]
    device: torch.device
    _env: Optional[dict] = field(default=None, repr=False)

    @property
    def requires_grad(self) -> bool:
        return torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in self.tensors.values())

    def args(self) -> list[Any]:
        """Positional tensors in spec order (inputs only)."""
        return [self.tensors[t.name] for t in self.spec.inputs]

    def env(self) -> dict[str, Any]:
        """Names constraint expressions see (built once per call, shared by the op's
        and every backend's checks)."""
        if self._env is None:
            self._env = constraint_env(self.tensors, self.params, self.dims, self.requires_grad)
        return self._env


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _named_params(spec: OpSpec, entry: str, params: dict, given: set, dims: dict, bound_by: dict) -> str:
    """'Hk=16 (default), dk=128 (default), Hv=4 (A_log's dim 0)' for the params and the dims bound from other
    tensors that a shape entry names: a wrong size in any of them shows, not only in the tensor blamed."""
    names = _expr.names(entry)
    used = [p for p in spec.params if p.name in names]
    out = [f"{p.name}={params.get(p.name)!r}" + ("" if p.name in given else " (default)") for p in used]
    out += [f"{d}={dims[d]} ({bound_by[d][0]}'s dim {bound_by[d][1]})" for d in dims
            if d in names and d in bound_by and d not in params]
    return ", ".join(out)


def _dim_what(name: str, bound_by: dict) -> str:
    """A dim error's subject: the dim and the tensor dim it was bound from."""
    return f"dim {name} (tensor {bound_by[name][0]}'s dim {bound_by[name][1]})" if name in bound_by else f"dim {name}"


def bind(spec: OpSpec, args: tuple, kwargs: dict[str, Any], rules=None) -> Bound:
    """Validate a call; ``rules`` is the op's precompiled (metadata, value) rule split."""
    op = spec.name
    in_names = [t.name for t in spec.inputs]
    if len(args) > len(in_names):
        raise SpecError(op, "arguments", f"at most {len(in_names)} positional tensors {in_names}",
                        f"{len(args)}")
    tensors: dict[str, Any] = dict(zip(in_names, args))
    params: dict[str, Any] = {}
    pnames = {p.name for p in spec.params}
    for k, v in kwargs.items():
        if k in in_names:
            if k in tensors:
                raise SpecError(op, k, "one value", "given both positionally and by keyword")
            tensors[k] = v
        elif k in pnames:
            params[k] = v
        else:
            raise SpecError(op, k, f"one of tensors {in_names} or params {sorted(pnames)}",
                            "an unknown argument")
    given = set(params)

    # presence and type
    for t in spec.inputs:
        v = tensors.get(t.name)
        if v is None:
            if not t.optional:
                raise SpecError(op, f"tensor {t.name}", "a torch.Tensor", "nothing (it is required)")
            tensors[t.name] = None
        elif not isinstance(v, torch.Tensor):
            raise SpecError(op, f"tensor {t.name}", "a torch.Tensor", type(v).__name__)
        elif v.layout != torch.strided or v.is_nested:
            raise SpecError(op, f"tensor {t.name}", "a dense strided tensor",
                            f"layout {str(v.layout).replace('torch.', '')}" + (" (nested)" if v.is_nested else ""),
                            "the kernels index its memory by strides")
        elif not _compiling() and (v.is_neg() or v.is_conj()):  # a lazy view the kernels, reading memory, would
            # not apply (not asked while traced: dynamo cannot trace the query)
            raise SpecError(op, f"tensor {t.name}", "a tensor without a lazy negation / conjugation bit",
                            "a neg / conj view", "pass .resolve_neg() / .resolve_conj()")
        elif type(v) is not torch.Tensor and _foreign_subclass(v):
            raise SpecError(op, f"tensor {t.name}", "a plain torch.Tensor or nn.Parameter",
                            f"a {type(v).__name__} (a tensor subclass with its own dispatch)",
                            "the kernels read its memory directly: pass the local tensor, e.g. a DTensor's "
                            ".to_local()")

    # params: type, range, choices, defaults (a resolver fills a None from the others, e.g. cp
    # from the process group's size, so every rule sees it)
    for p in spec.params:
        if p.name not in params:
            if p.required:
                raise SpecError(op, f"param {p.name}", f"a {p.type}", "nothing (it is required)")
            params[p.name] = p.default
        passed = params[p.name]
        if passed is None and p.resolve:
            params[p.name] = _resolver(p.resolve)(params)
        params[p.name] = _check_param(op, p, params[p.name])
        if passed is not None and p.resolve:  # a value the resolver can derive must be that value (cp: the
            derived = _resolver(p.resolve)(params)  # group's size), checked before any rule reads it
            if derived is not None and derived != params[p.name]:
                raise SpecError(op, f"param {p.name}", f"{derived} (as resolved: {p.doc})",
                                repr(params[p.name]))

    # layout
    layout = None
    if spec.layouts:
        base = constraint_env(tensors, params, {}, False)
        matches = [name for name, cond in spec.layouts.items() if evaluate(cond, base)]
        if len(matches) != 1:
            raise SpecError(op, "layout", f"exactly one of {dict(spec.layouts)} to hold",
                            f"{matches or 'none'}")
        layout = matches[0]

    present = [t for t in spec.inputs if tensors[t.name] is not None]
    # device
    main = [t.name for t in present if t.same_device]   # the device comes from the first of these (named below)
    device = tensors[main[0]].device if main else torch.device("cpu")
    for t in present:
        v = tensors[t.name]
        if t.same_device and v.device != device:
            raise SpecError(op, f"tensor {t.name}", f"device {device} (like {main[0]})", str(v.device))

    # dtype
    for t in present:
        v = tensors[t.name]
        allowed = _allowed_dtypes(spec, t, tensors)
        if allowed is not None and dtype_name(v.dtype) not in allowed:
            raise SpecError(op, f"tensor {t.name}", f"dtype in {allowed}", dtype_name(v.dtype))
        if v.requires_grad and v.dtype not in GRAD_DTYPES and torch.is_grad_enabled():
            # torch lets a float8 tensor require grad, but no op here can give it a gradient
            # (autograd would cast one into float8): refused rather than silently left without
            raise SpecError(op, f"tensor {t.name}",
                            f"requires_grad=False ({dtype_name(v.dtype)} data gets no gradient; "
                            f"gradients flow in {sorted(GRAD_DTYPE_NAMES)})", "requires_grad=True")

    # rank, binding, then every expression
    dims: dict[str, int] = {}
    bound_by: dict[str, tuple] = {}  # dim -> (tensor, axis) it was bound from, for the dim errors
    dimspec = {d.name: d for d in spec.dims}
    for t in present:
        v = tensors[t.name]
        shape = t.shape_for(layout)
        if v.dim() != len(shape):
            raise SpecError(op, f"tensor {t.name}", f"{len(shape)} dims {_fmt_shape(shape)}",
                            f"{v.dim()} dims {list(v.shape)}")
        for axis, (d, size) in enumerate(zip(shape, v.shape)):
            if isinstance(d, str) and d in dimspec and d not in dims:
                dims[d] = size
                bound_by[d] = (t.name, axis)
    scalars = dict(dims)
    scalars.update({k: val for k, val in params.items() if isinstance(val, (int, float, bool))})
    for t in present:
        v = tensors[t.name]
        shape = t.shape_for(layout)
        for axis, (d, size) in enumerate(zip(shape, v.shape)):
            if isinstance(d, int):
                want = d
            else:
                try:
                    want = evaluate(d, scalars)
                except _expr.BoundError as e:  # sizes past any tensor's: say so, naming the tensor
                    raise SpecError(op, f"tensor {t.name}", f"shape {_fmt_shape(shape)} with dim {axis} ({d}) "
                                    "computable", f"{list(v.shape)}, the expression overflowing: {e}") from None
                except _expr.ExprError:
                    continue  # names a dim no present tensor binds: nothing to check it against
            if size != want:
                named = "" if isinstance(d, int) or _compiling() else _named_params(spec, d, params, given, dims,
                                                                                     bound_by)
                raise SpecError(op, f"tensor {t.name}",
                                f"shape {_fmt_shape(shape)} with dim {axis} ({d}) = {want}"
                                + (f" for {named}" if named else ""), f"{list(v.shape)}")
    for name, size in dims.items():
        d = dimspec.get(name)
        if d is None:
            continue
        if size < d.min or (d.max is not None and size > d.max):
            top = d.max if d.max is not None else "inf"
            raise SpecError(op, _dim_what(name, bound_by), f"{d.min} <= {name} <= {top}", size)
        if d.multiple_of > 1 and size % d.multiple_of:
            raise SpecError(op, _dim_what(name, bound_by), f"a multiple of {d.multiple_of}", size)

    # strides
    for t in present:
        v = tensors[t.name]
        if t.contiguous and not v.is_contiguous():
            raise SpecError(op, f"tensor {t.name}", "a contiguous tensor",
                            f"strides {tuple(v.stride())} for shape {tuple(v.shape)}")

    # in-place inputs overlapping another argument (here when a call pattern is first validated; its cached
    # repeats screen storages with recheck_overlap: the same metadata can come with other memory)
    if not _compiling():
        _no_overlap(op, tensors, present)

    bound = Bound(spec, tensors, params, dims, layout, device)
    meta, vals = rules if rules is not None else split_rules(spec)
    check_constraints(op, meta, bound.env(), "constraint")
    if vals:
        check_values(spec, tensors, params, dims, bound.requires_grad, vals)
    return bound


# ---------------------------------------------------------------- checks


def check_constraints(op: str, constraints: list[Constraint], env: dict, what: str) -> None:
    for c in constraints:
        try:
            if c.when is not None and not evaluate(c.when, env):
                continue
            ok = evaluate(c.expr, env)
        except _expr.BoundError as e:  # values past specs.expr's bound: refused, not a crash
            raise SpecError(op, f"{what} {c.expr!r}", "it to be computable", f"an overflow: {e}",
                            c.message or None) from None
        if not ok:
            raise SpecError(op, f"{what} {c.expr!r}", "it to hold",
                            "false" if _compiling() else _describe(c.expr, env), c.message or None)


def _on_host(t) -> bool:
    """Whether a tensor's values may be read on the host without a device sync. A fake tensor
    (FakeTensorMode: shape propagation, memory estimators) has no values: its rules run as tensor
    ops, as traced ones do."""
    return t is None or (t.is_cpu and not _compiling() and (type(t) is torch.Tensor or not _is_fake(t)))


def _is_fake(t) -> bool:
    return _fake_tensor.is_fake(t)


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def _foreign_subclass(t) -> bool:
    """Whether ``t`` is a tensor subclass that handles its own dispatch (DTensor, quantized-tensor
    wrappers: the kernels would read memory it does not have, or the wrong shard) and is not one
    of torch's tracing tensors (FakeTensor, FunctionalTensor: torch.compile / export / FakeTensorMode
    see the ops as custom ops). nn.Parameter and nn.Buffer keep torch.Tensor's dispatch."""
    if type(t).__torch_dispatch__ is _PLAIN_DISPATCH:
        return False
    from torch._subclasses.functional_tensor import FunctionalTensor

    return not (_is_fake(t) or isinstance(t, FunctionalTensor))


_PLANS: dict[int, tuple] = {}  # id(constraint) -> (constraint, tensors it reads, when reads values)


def _plan(c: Constraint, names: tuple) -> tuple:
    hit = _PLANS.get(id(c))
    if hit is None or hit[0] is not c:
        used = value_tensors(c.expr, names) + (value_tensors(c.when, names) if c.when else ())
        hit = _PLANS[id(c)] = (c, tuple(dict.fromkeys(used)), c.when is not None and reads_values(c.when, names))
    return hit


def _rule_plans(rules: list[Constraint], names: tuple) -> tuple:
    """(rules, [(rule, tensors it reads, whether its `when` reads values)], every tensor read)."""
    pk = (id(rules), names)
    got = _RULE_PLANS.get(pk)
    if got is None or got[0] is not rules:
        plans = [(c, *_plan(c, names)[1:]) for c in rules]
        got = _RULE_PLANS[pk] = (rules, plans, tuple(sorted({n for _, used, _ in plans for n in used})))
    return got


def values_read(rules: list[Constraint], names: tuple) -> tuple:
    """The input tensors whose values ``rules`` read (sorted names)."""
    return _rule_plans(rules, tuple(names))[2]


def check_values(spec: OpSpec, tensors: dict, params: dict, dims: dict, requires_grad: bool,
                 rules: Optional[list[Constraint]] = None) -> None:
    """Check an op's value rules: on the host where every tensor a rule reads is a
    CPU tensor, else as tensor ops on the device, all feeding one async assert."""
    op = spec.name
    rules = split_rules(spec)[1] if rules is None else rules
    names = tuple(tensors)
    if _compiling():  # traced: plain code (no id()-keyed caches); the checks become graph ops
        plans, read, key = [(c, *_plan(c, names)[1:]) for c in rules], (), None
    else:
        _, plans, read = _rule_plans(rules, names)
        key = _checked_key(op, read, tensors, params, dims, requires_grad)
        if key is not None and _seen_checked(key, read, tensors):
            return
    host, dev = [], []
    for c, used, when_reads in plans:
        on_host = True
        for n in used:
            t = tensors.get(n)
            if t is not None and not _on_host(t):
                if t.is_meta:
                    raise SpecError(op, f"tensor {n}", "a tensor with data (the rule "
                                    f"{c.expr!r} reads its values)", "a meta tensor")
                on_host = False
        (host if on_host else dev).append((c, used, when_reads))
    if host:
        check_constraints(op, [c for c, _, _ in host], constraint_env(tensors, params, dims, requires_grad),
                          "constraint")
    if not dev:
        if key is not None:
            _remember_checked(key, read, tensors)
        return
    env = constraint_env(tensors, params, dims, requires_grad)
    denv = dict(env)
    denv.update(_DEVICE_ENV)
    oks, what, exprs, seen = [], [], [], []
    for c, used, when_reads in dev:
        if c.when is not None and not when_reads:
            if not evaluate(c.when, env):
                continue
            ok = evaluate(c.expr, denv, device=True)
        elif c.when is not None:
            ok = _tk_or(_tk_not(evaluate(c.when, denv, device=True)), evaluate(c.expr, denv, device=True))
        else:
            ok = evaluate(c.expr, denv, device=True)
        if not _is_t(ok):
            if not ok:  # decided without the values after all
                raise SpecError(op, f"constraint {c.expr!r}", "it to hold", "false", c.message or None)
            continue
        if _compiling():  # traced: one assert a rule, so a refusal names its rule (the graph holds them all
            # anyway; eager keeps one combined assert: one launch a call)
            msg = f"{op}: tensor {', '.join(used)}: value rule {c.expr!r} failed" + (f" ({c.message})" if c.message
                                                                                    else "")
            torch._assert_async(ok, msg if len(msg) < 255 else msg[:251] + "...")
            continue
        oks.append(ok)
        what.append(f"{c.expr!r}" + (f" ({c.message})" if c.message else ""))
        exprs.append(repr(c.expr))
        seen += [n for n in used if n not in seen]
    if not oks:
        if key is not None:
            _remember_checked(key, read, tensors)
        return
    ok = oks[0]
    for o in oks[1:]:
        ok = torch.logical_and(ok, o)
    head = f"{op}: tensor {', '.join(seen)}: a value rule failed on the device: "
    msg = head + "; ".join(what)
    if len(msg) >= 255:  # CUDA takes < 255 chars: then the expressions alone (every rule named, no message text)
        msg = head + "; ".join(exprs)
    torch._assert_async(ok, msg if len(msg) < 255 else msg[:251] + "...")
    if key is not None:
        _remember_checked(key, read, tensors)


# Value rules already checked (host) or queued (device) for the very same, unmodified
# tensors (same objects, same version counters, same dims and params; a CPU tensor also
# the same values, compared by bytes: `guards.host_values`) are not checked again: a model
# passes one cu_seqlens / m_splits to every layer of a step. A write through torch (in
# place, out=, a custom op's mutates_args) bumps the version and brings the check back; a
# write to a GPU tensor that bypasses torch's version counter (a raw pointer, `.data`) is
# not seen. Graph captures and traces always emit the checks (a replay must check its own
# values).
_CHECKED_VALUES: dict[tuple, list] = {}
_CHECKED_VALUES_MAX = 256


_RULE_PLANS: dict[tuple, tuple] = {}  # (id(rules), input names) -> (rules, plans, names the rules read)


def _checked_key(op: str, read: tuple, tensors: dict, params: dict, dims: dict,
                 requires_grad: bool) -> Optional[tuple]:
    """What makes two calls' value checks the same (None: always check)."""
    if _compiling():
        return None
    # a rule's `when` may also ask other tensors' dtypes or presence (grouped_mlp_mxfp8's m_splits
    # rule: whether both weights are pre-quantized), so those are part of what was checked
    key = [op, requires_grad, tuple(dims.values()), tuple(params.values()),
           tuple(None if t is None else t.dtype for t in tensors.values())]
    try:
        for n in read:
            t = tensors.get(n)
            if t is None:
                key.append(None)
                continue
            if t.is_cuda and torch.cuda.is_current_stream_capturing():
                return None
            key += (id(t), t._version, host_values(t))
    except (AttributeError, RuntimeError, TypeError):  # a subclass without a version counter or numpy values
        return None
    return tuple(key)


def _seen_checked(key: tuple, read: tuple, tensors: dict) -> bool:
    try:
        refs = _CHECKED_VALUES.get(key)
    except TypeError:  # an unhashable param
        return False
    if refs is None:
        return False
    return all(r() is tensors.get(n) for n, r in refs)


def _remember_checked(key: tuple, read: tuple, tensors: dict) -> None:
    import weakref

    if len(_CHECKED_VALUES) >= _CHECKED_VALUES_MAX:
        _CHECKED_VALUES.clear()
    try:
        _CHECKED_VALUES[key] = [(n, weakref.ref(tensors[n])) for n in read if tensors.get(n) is not None]
    except TypeError:
        pass


def failing_constraint(constraints: list[Constraint], env: dict) -> Optional[str]:
    """Every constraint that fails in ``env``, described and joined by "; " (None: all hold). While traced only
    the first: each further limit evaluated on a batch dim would become one more guard."""
    bad = []
    for c in constraints:
        try:
            if c.when is not None and not evaluate(c.when, env):
                continue
            ok = evaluate(c.expr, env)
        except _expr.BoundError as e:  # past specs.expr's bound: this limit cannot hold
            bad.append(f"{c.expr!r} overflows ({e})" + (f" ({c.message})" if c.message else ""))
        else:
            if ok:
                continue
            desc = "false" if _compiling() else _describe(c.expr, env)
            bad.append(f"{c.expr!r} fails with {desc}" + (f" ({c.message})" if c.message else ""))
        if _compiling():
            break
    return "; ".join(bad) or None


def _describe(e: str, env: dict) -> str:
    """The values an expression saw: its names, and its helper calls (e.g. dtype(x)='float64')."""
    vals = []
    for node in ast.walk(_expr.parse(e).body):
        if isinstance(node, ast.Call) or isinstance(node, ast.Name) and not callable(env.get(node.id)):
            src = ast.unparse(node)
            try:
                v = evaluate(src, env)
            except Exception:  # noqa: BLE001 - description only
                continue
            if isinstance(v, (int, float, bool, str, type(None))):
                vals.append(f"{src}={v!r}")
            elif isinstance(v, tuple) and len(v) <= 8:
                vals.append(f"{src}={v}")
            elif isinstance(v, tuple):
                vals.append(f"{src}=({', '.join(map(str, v[:8]))}, ... {len(v)} values)")
    seen = list(dict.fromkeys(vals))
    return ", ".join(seen) or "false"


def _allowed_dtypes(spec: OpSpec, t: TensorSpec, tensors) -> Optional[list[str]]:
    if isinstance(t.dtypes, list):
        return list(t.dtypes)
    ref = tensors.get(t.dtypes[5:])
    if ref is None:
        src = next((x for x in spec.inputs if x.name == t.dtypes[5:]), None)
        return list(src.dtypes) if src is not None and isinstance(src.dtypes, list) else None
    return [dtype_name(ref.dtype)]


_PY_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


_RESOLVERS: dict[str, Callable] = {}


def _resolver(path: str) -> Callable:
    fn = _RESOLVERS.get(path)
    if fn is None:
        import importlib

        mod, _, attr = path.partition(":")
        fn = _RESOLVERS[path] = getattr(importlib.import_module(mod), attr)
    return fn


_INT64 = 1 << 63


@functools.lru_cache(maxsize=None)
def _instance_class(path: str):
    """The class an object param must be an instance of; None when it cannot be imported (a
    torch build without torch.distributed has no ProcessGroup, and no call can use one)."""
    try:
        return _resolver(path)
    except (ImportError, AttributeError):
        return None


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, past the last byte) of a strided tensor's elements."""
    lo = t.data_ptr()
    return lo, lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, past the last byte) of ``t``'s storage: the bytes any view of it can reach."""
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _no_overlap(op: str, tensors: dict, present: list) -> None:
    """An inout input (written in place, gdn_decode's states) may share no memory with another argument: the
    kernels would read what they already overwrote (eager) or a copy (compiled), so the two would disagree. Only
    tensors whose storages' byte spans meet can share bytes (views of one storage, or storages over one memory:
    ``torch.from_dlpack`` of a view, two ``torch.from_numpy`` of one array), so element extents are computed for
    those alone (~10 us for gdn_decode's 7 tensors on this CPU host, against ~32 us computing every extent); meta
    and fake tensors hold no memory."""
    inout = [t.name for t in present if t.role == "inout"]
    if not inout:
        return
    real = {t.name: tensors[t.name] for t in present
            if tensors[t.name].numel() and tensors[t.name].device.type != "meta"
            and not isinstance(tensors[t.name], _fake_tensor.FakeTensor)}
    span = {n: _span(t) for n, t in real.items()}
    for a in inout:
        if a not in real:
            continue
        for b, t in real.items():
            if b == a or span[b][0] >= span[a][1] or span[a][0] >= span[b][1] or t.device != real[a].device:
                continue
            (lo, hi), (lo_b, hi_b) = _extent(real[a]), _extent(t)
            if lo < hi_b and lo_b < hi:
                raise SpecError(op, f"tensor {a}", "memory that no other argument shares (it is written in place)",
                                f"bytes shared with {b}")


def recheck_overlap(op: str, inputs: list, tensors: list, inout_at: tuple) -> None:
    """The overlap check of a cached call (metadata validated before: the memory may be another's now). A screen
    first: an in-place input whose storage's byte span meets no other argument's cannot overlap (~2.5 us for
    gdn_decode's 7 tensors on this CPU host); only where two spans meet does the full ``_no_overlap`` run.
    ``inputs``: the spec's input specs, ``tensors`` in their order (None where left out), ``inout_at``: the in-place
    inputs' positions."""
    spans = []
    for t in tensors:   # a loop, not _span in a comprehension: this runs on every cached call (gdn_decode a token)
        if t is None:
            spans.append(None)
        else:
            s = t.untyped_storage()
            p = s.data_ptr()
            spans.append((p, p + s.nbytes()))
    for i in inout_at:
        if spans[i] is None:
            continue
        lo, hi = spans[i]
        for j, sj in enumerate(spans):
            if j != i and sj is not None and sj[0] < hi and lo < sj[1]:
                _no_overlap(op, dict(zip((t.name for t in inputs), tensors)),
                            [t for t, v in zip(inputs, tensors) if v is not None])
                return


def _show(v, typed: bool = False) -> str:
    """A refused param's value for the message: its repr (after its type name with ``typed``), but only its type
    while traced (dynamo cannot trace repr() of a tensor or numpy scalar passed as a param: the refusal became an
    Unsupported error about the repr instead of the SpecError)."""
    if _compiling():
        return f"a {type(v).__name__}"
    return f"{type(v).__name__} {v!r}" if typed else repr(v)


def _check_param(op: str, p, v):
    if v is None:
        if p.nullable or p.type == "object":
            return None
        raise SpecError(op, f"param {p.name}", f"a {p.type}", "None")
    if p.instance_of is not None:
        cls = _instance_class(p.instance_of)
        if cls is not None and not isinstance(v, cls):
            raise SpecError(op, f"param {p.name}", f"None or a {p.instance_of.replace(':', '.')}",
                            _show(v, True))
        return v
    if p.type in _PY_TYPES:
        ok = isinstance(v, _PY_TYPES[p.type]) and not (p.type in ("int", "float") and isinstance(v, bool))
        if not ok:
            raise SpecError(op, f"param {p.name}", f"a {p.type}", _show(v, True))
        if p.type == "float":
            try:
                v = float(v)
            except OverflowError:  # an int past the float range
                raise SpecError(op, f"param {p.name}", "a finite float", f"an int of {int(v).bit_length()} bits") \
                    from None
            # a comparison, not math.isfinite: under torch.compile(dynamic=True) a float param is a
            # SymFloat, which math.isfinite cannot trace (NaN fails both comparisons too)
            if getattr(p, "finite", True) and not -math.inf < v < math.inf:
                raise SpecError(op, f"param {p.name}", "a finite float", _show(v))
        if p.type == "int" and not -_INT64 <= v < _INT64:
            # sizes and counts the kernels take as int64 at most; larger ones would only overflow
            # the shape and constraint arithmetic (specs.expr's bound) with a less clear error
            raise SpecError(op, f"param {p.name}", "an int64 (|v| < 2**63)", f"an int of {int(v).bit_length()} bits")
    if p.type == "ints":
        if not isinstance(v, (list, tuple)) or not all(isinstance(e, int) and not isinstance(e, bool) for e in v):
            raise SpecError(op, f"param {p.name}", "a list of ints", _show(v))
        v = tuple(int(e) for e in v)
        if any(not -_INT64 <= e < _INT64 for e in v):
            raise SpecError(op, f"param {p.name}", "int64 entries (|v| < 2**63)", "an entry of more bits")
        for e in v:
            if (p.min is not None and e < p.min) or (p.max is not None and e > p.max):
                raise SpecError(op, f"param {p.name}", _entries_in(p), _show(v))
        return v
    if p.choices is not None and v not in p.choices:
        raise SpecError(op, f"param {p.name}", f"one of {p.choices}", _show(v))
    if p.min is not None and v < p.min:
        raise SpecError(op, f"param {p.name}", f">= {p.min}", v)
    if p.max is not None and v > p.max:
        raise SpecError(op, f"param {p.name}", f"<= {p.max}", v)
    return v


def _entries_in(p) -> str:
    """What an ints param's entries must be, for its refusal: "every entry in [1, 64]", or one bound alone
    ("every entry >= 1": no "[1, None]")."""
    if p.min is not None and p.max is not None:
        return f"every entry in [{p.min}, {p.max}]"
    return f"every entry >= {p.min}" if p.min is not None else f"every entry <= {p.max}"
