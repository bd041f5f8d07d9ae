"""How the registry evaluates spec expressions: dtype names, expressions compiled once into
Python functions (``_fn``; host form, and a device form whose and/or/not/if work on tensors),
which of them read tensor values, and the names they see (``constraint_env``: metadata and
host values; ``_DEVICE_ENV``: the same helpers as tensor ops for device-side value rules).
``registry.validate`` binds calls and checks rules with them."""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Optional

import torch

from specs import expr as _expr

from .transforms import host_tensor

_DTYPE_NAMES = {getattr(torch, n): n for n in (
    "bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "float8_e4m3fn", "float8_e5m2", "bool", "complex64", "complex128")}


def dtype_name(dt: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    return name if name is not None else str(dt).removeprefix("torch.")


# the dtypes a gradient can be carried in; an input of another dtype (float8 data, integers) gets none
GRAD_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
GRAD_DTYPE_NAMES = frozenset(dtype_name(d) for d in GRAD_DTYPES)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


# ---------------------------------------------------------------- compiled expressions

class _Bounded(ast.NodeTransformer):
    """``a ** b`` / ``a * b`` -> bounded helper calls (specs.expr bounds them, so no
    spec expression can build a huge integer); everything else stays native."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        name = {ast.Pow: "_tk_pow", ast.Mult: "_tk_mul"}.get(type(node.op))
        if name is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], []), node)


class _Device(_Bounded):
    """Value rules as tensor code: ``and``/``or``/``not``, comparisons (each through ``_fit``;
    chained ones split) and ``x if c else y`` become helper calls that also accept 0-dim bool
    tensors (Python's own would call ``bool()`` on them: a host sync). ``is`` / ``in`` stay
    native: tk-spec-lint warns where one reads tensor values."""

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        fn = "_tk_and" if isinstance(node.op, ast.And) else "_tk_or"
        out = node.values[0]
        for v in node.values[1:]:
            out = ast.Call(ast.Name(fn, ast.Load()), [out, v], [])
        return ast.copy_location(out, node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(ast.Call(ast.Name("_tk_not", ast.Load()), [node.operand], []), node)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        parts, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            fn = _CMP_HELPERS.get(type(op))  # is / in stay native (None tests, no tensors)
            parts.append(ast.Call(ast.Name(fn, ast.Load()), [left, right], []) if fn else
                         ast.Compare(left, [op], [right]))
            left = right
        if len(parts) == 1:
            return ast.copy_location(parts[0], node)
        out = parts[0]
        for p in parts[1:]:
            out = ast.Call(ast.Name("_tk_and", ast.Load()), [out, p], [])
        return ast.copy_location(out, node)

    def visit_IfExp(self, node):
        self.generic_visit(node)
        return ast.copy_location(
            ast.Call(ast.Name("_tk_if", ast.Load()), [node.test, node.body, node.orelse], []), node)


def _is_t(x) -> bool:
    return isinstance(x, torch.Tensor)


def _fit(a, b, fold: bool = False):
    """``(a, b)`` for a tensor op between an integer tensor ``a`` and ``b`` that gives the host form's
    answer (Python ints; value rules read integer tensors only). torch casts a Python int to an integer
    tensor's dtype, wrapping it: an int32 ``max(values(cu_seqlens)) < 2**60`` was False and
    ``5 == 2**32 + 5`` True, where the host form says the opposite. So an int outside ``a``'s dtype widens
    a narrow ``a`` to int64, and one outside int64 becomes +-inf (every int64 compares with +-inf as with
    the huge int). ``fold`` (comparisons): a 0-dim ``a`` (a reduction) against such an int becomes its
    dtype's extreme, a Python int that compares with it as every value of the dtype does, so the rule is
    decided without a device op (kept, or refused at once). Values in range keep the tensor as it is (no
    extra op on the decode path); while tracing, a size is symbolic, so a narrow ``a`` is widened (Inductor
    fuses the cast) rather than guarded on. Arithmetic on a tensor stays in its dtype and may wrap (int64
    too): the only such in the specs is seqlens()' difference, which wraps only past a negative value, and
    every op using it refuses one (min(values(cu_seqlens)) == 0); sum() sums in int64, which moe's rules
    bound (entries in [0, M], G M < 2**63)."""
    lim = _IINFO.get(a.dtype) if _is_t(a) else None
    if lim is None or not isinstance(b, (int, torch.SymInt)) or isinstance(b, bool):
        return a, b
    if type(b) is not int:  # a traced size (SymInt): in int64; no range test (export refuses the guard)
        return (a if a.dtype is torch.int64 else a.long()), b
    if not lim[0] <= b <= lim[1]:
        if fold and a.dim() == 0:
            return (lim[1] if b > lim[1] else lim[0]), b
        if not _I64[0] <= b <= _I64[1]:
            return a, math.inf if b > 0 else -math.inf
        return a.long(), b
    if a.dtype is not torch.int64 and _compiling():
        return a.long(), b
    return a, b


_IINFO = {d: (torch.iinfo(d).min, torch.iinfo(d).max)
          for d in (torch.int8, torch.int16, torch.int32, torch.uint8, torch.int64)}
_I64 = _IINFO[torch.int64]


def _cmp(op):
    def f(a, b):
        a, b = _fit(a, b, True)
        b, a = _fit(b, a, True)
        return op(a, b)
    return f


_CMP_HELPERS = {ast.Eq: "_tk_eq", ast.NotEq: "_tk_ne", ast.Lt: "_tk_lt", ast.LtE: "_tk_le", ast.Gt: "_tk_gt",
                ast.GtE: "_tk_ge"}
_CMPS = {name: _cmp(getattr(operator, name[4:])) for name in _CMP_HELPERS.values()}


def _tk_and(a, b):
    if not _is_t(a) and not _is_t(b):
        return a and b
    if not _is_t(a):
        return b if a else False
    if not _is_t(b):
        return a if b else False
    return torch.logical_and(a, b)


def _tk_or(a, b):
    if not _is_t(a) and not _is_t(b):
        return a or b
    if not _is_t(a):
        return True if a else b
    if not _is_t(b):
        return True if b else a
    return torch.logical_or(a, b)


def _tk_not(a):
    return torch.logical_not(a) if _is_t(a) else not a


def _tk_if(c, a, b):
    if not _is_t(c):
        return a if c else b
    return torch.where(c, a, b)


_BOUNDED_POW = getattr(_expr, "bounded_pow", operator.pow)
_BOUNDED_MUL = getattr(_expr, "bounded_mul", operator.mul)


def _tk_mul(a, b):
    """``a * b`` bounded as specs.expr says, except for two ints while torch.compile traces: a
    batch dim is then a SymInt that dynamo's isinstance calls an int, and the bound's
    ``bit_length()`` would specialize it (one graph per batch size). Such operands are sizes and
    int params, each already checked to be an int64, so their product stays below 2**128.
    Everything else (str / tuple repetition, floats) keeps the bound while tracing too."""
    if isinstance(a, int) and isinstance(b, int) and _compiling():
        return a * b
    return _BOUNDED_MUL(a, b)


def _tk_pow(a, b):
    """``a ** b``, as ``_tk_mul``: two ints while tracing skip the result's bit-length bound (an
    int64 base to an exponent in [0, 64]: a result of at most 4096 bits); the exponent's range
    stays checked (a guard, not a specialization, for a symbolic exponent)."""
    if isinstance(a, int) and isinstance(b, int) and _compiling() and 0 <= b <= _expr.MAX_INT_EXPONENT:
        return a**b
    return _BOUNDED_POW(a, b)


_GLOBALS = {
    # Only __import__: C code that torch runs from an expression's frame (a FakeTensor's ops) imports
    # through the frame's builtins. An expression never reaches it: each of its names is a lambda
    # parameter bound from the env (test_expressions_reach_no_builtins).
    "__builtins__": {"__import__": __import__},
    "_tk_pow": _tk_pow,
    "_tk_mul": _tk_mul,
    "_tk_and": _tk_and, "_tk_or": _tk_or, "_tk_not": _tk_not, "_tk_if": _tk_if,
    **_CMPS,
}
_FNS: dict[tuple[str, bool], tuple[Callable, tuple[str, ...]]] = {}


def _fn(expr: str, device: bool = False) -> tuple[Callable, tuple[str, ...]]:
    """``expr`` as a Python function of the names it reads (compiled once)."""
    hit = _FNS.get((expr, device))
    if hit is not None:
        return hit
    tree = _expr.parse(expr)
    names = tuple(sorted(_expr.names(expr)))
    body = (_Device() if device else _Bounded()).visit(
        ast.parse(ast.unparse(tree.body), mode="eval")).body  # a fresh tree: parse() caches its own
    lam = ast.Expression(ast.Lambda(
        ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in names], kwonlyargs=[], kw_defaults=[],
                      defaults=[]), body))
    ast.fix_missing_locations(lam)
    fn = eval(compile(lam, f"<spec expression {expr!r}>", "eval"), _GLOBALS)  # noqa: S307 - checked AST
    _FNS[(expr, device)] = (fn, names)
    return fn, names


def evaluate(expr: str, env: dict, device: bool = False) -> Any:
    fn, names = _fn(expr, device)
    try:
        args = [env[n] for n in names]
    except KeyError as e:
        raise _expr.ExprError(f"{expr!r}: unknown name {e.args[0]!r}") from None
    return fn(*args)


# ---------------------------------------------------------------- value rules

_VALUE_HELPERS = frozenset({"values", "seqlens"})
_TENSOR_SAFE = frozenset({"present", "ndim", "dtype", "requires_grad"})


def reads_values(expr: str, tensors) -> bool:
    """Whether an expression reads tensor data: values()/seqlens(), or any other
    helper (sum, max, any, ...) applied to a tensor itself."""
    key = (expr, tuple(sorted(tensors)))
    hit = _READS.get(key)
    if hit is None:
        hit = _READS[key] = _reads(expr, tensors)
    return hit


_READS: dict[tuple, bool] = {}
_VTS: dict[tuple, tuple] = {}


def _reads(expr: str, tensors) -> bool:
    for node in ast.walk(_expr.parse(expr).body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in _VALUE_HELPERS:
                return True
            if node.func.id not in _TENSOR_SAFE and any(
                    isinstance(a, ast.Name) and a.id in tensors for a in node.args):
                return True
    return False


def value_tensors(expr: str, tensors) -> tuple[str, ...]:
    """The tensors whose values an expression reads (in order of appearance)."""
    key = (expr, tuple(sorted(tensors)))
    hit = _VTS.get(key)
    if hit is not None:
        return hit
    out = []
    for node in ast.walk(_expr.parse(expr).body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in _TENSOR_SAFE:
            out += [a.id for a in node.args if isinstance(a, ast.Name) and a.id in tensors and a.id not in out]
    _VTS[key] = tuple(out)
    return _VTS[key]


def _host_values(t: Optional[torch.Tensor]) -> tuple:
    """A CPU tensor's integer values (the only host read of tensor data)."""
    if t is None:
        return ()
    if type(t) is torch.Tensor and torch._C._functorch.is_functorch_wrapped_tensor(t):  # torch.func's
        t = host_tensor(t)
    return tuple(t.tolist() if t.dim() == 1 else t.reshape(-1).tolist())  # int tensors: Python ints


def _dev_values(t):
    return None if t is None else t.detach().reshape(-1)


def _dev_seqlens(t):
    v = _dev_values(t)
    return v[1:] - v[:-1] if v is not None and v.numel() else v


def _reduce(name: str, builtin, tensor_fn):
    def f(xs, *more):
        if more or not _is_t(xs):
            return builtin(xs, *more)
        if xs.numel() == 0 and name in ("min", "max"):
            raise ValueError(f"{name}() of an empty tensor")
        return tensor_fn(xs)
    return f


def _all_div(xs, k):
    if not _is_t(xs):
        return all(int(x) % int(k) == 0 for x in xs)
    a, kk = _fit(xs, k)
    if isinstance(kk, float) and not isinstance(k, float):  # |k| past int64: x % k == 0 only for x == 0
        return (xs == 0).all()
    return (a % kk == 0).all()


def _nondecreasing(xs):
    if not _is_t(xs):
        return all(a <= b for a, b in zip(xs[:-1], xs[1:]))
    return (xs[1:] >= xs[:-1]).all()


def _distinct(xs, *ignore):
    if not _is_t(xs):
        kept = [x for x in xs if x not in ignore]
        return len(set(kept)) == len(kept)
    # device: sort, then equal neighbours are duplicates unless their value is ignored
    # (no sentinel constants: Inductor cannot fold a 2^62 offset into its int32 indexing)
    # Each element against its sorted predecessor through a roll (the first has none), not the
    # slices s[1:] / s[:-1]: a traced [B - 1] tensor makes torch guard B - 1 >= 2, so torch.export
    # of a decode step would refuse B = 2.
    s = torch.sort(xs).values  # the index dtype as it is (no int64 copy first)
    dup = (s == torch.roll(s, 1)) & (torch.arange(s.numel(), device=s.device) > 0)
    for i in ignore:
        a, ii = _fit(s, i)
        dup = dup & (a != ii)
    return ~dup.any()


def _first(xs):
    return xs[0] if len(xs) else None


def _last(xs):
    return xs[-1] if len(xs) else None


_BASE_ENV: dict[str, Any] = {
    "present": lambda t: t is not None,
    "ndim": lambda t: -1 if t is None else t.dim(),
    "dtype": lambda t: None if t is None else dtype_name(t.dtype),
    # these three take host tuples (host rules) or device tensors (device rules) alike
    "all_div": _all_div, "nondecreasing": _nondecreasing, "distinct": _distinct,
    "first": _first, "last": _last,
    "len": len, "sum": sum, "min": min, "max": max, "all": all, "any": any, "abs": abs,
}

_DEVICE_ENV: dict[str, Any] = dict(
    _BASE_ENV,
    values=_dev_values, seqlens=_dev_seqlens,
    len=lambda xs: xs.numel() if _is_t(xs) else len(xs),
    sum=_reduce("sum", sum, lambda t: t.sum()),
    min=_reduce("min", min, lambda t: t.amin()),
    max=_reduce("max", max, lambda t: t.amax()),
    all=_reduce("all", all, lambda t: t.all()),
    any=_reduce("any", any, lambda t: t.any()),
    abs=lambda x: x.abs() if _is_t(x) else abs(x),
)


def _host_env_values():
    memo: dict[int, tuple] = {}

    def values(t):
        if t is None:
            return ()
        v = memo.get(id(t))
        if v is None:
            v = memo[id(t)] = _host_values(t)
        return v

    def seqlens(t):
        v = values(t)
        return tuple(b - a for a, b in zip(v[:-1], v[1:]))

    return values, seqlens


def constraint_env(tensors, params, dims, requires_grad) -> dict[str, Any]:
    """Names metadata rules (and host-evaluated value rules) see. ``values`` here
    reads CPU tensors only: value rules on other tensors go to :func:`check_values`."""
    values, seqlens = _host_env_values()
    env = dict(_BASE_ENV)
    env["values"], env["seqlens"], env["requires_grad"] = values, seqlens, requires_grad
    env.update(tensors)
    env.update(params)
    env.update(dims)
    return env
