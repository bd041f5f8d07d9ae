"""A small, safe expression language for spec constraints and dim expressions.

Expressions are Python syntax restricted to: integer/float/bool/None literals,
names (dims, params, and the helper functions below), arithmetic
(+ - * // % / **), comparisons (chained too), ``and``/``or``/``not``,
conditional expressions, and calls of whitelisted helpers. Nothing else parses
(no ``<<``/``>>``, no attributes, subscripts, lambdas, comprehensions).

Values are bounded, so no expression can hang or allocate without limit:
``int ** int`` needs an exponent in [0, 64], an int result of ``**`` or ``*``
must have |result| <= 2**256, and a repeated str/tuple at most 2**16 items
(:func:`bounded_pow`, :func:`bounded_mul`); a float ``**`` that overflows or
has a complex result is refused. Constant sub-expressions are evaluated when
parsed, so ``9 ** 9 ** 9`` or ``1 // 0`` never parses, nor a division by a
constant zero (``C % 0``).

Examples: ``"H % 256 == 0"``, ``"n*n + 2*n"``, ``"Hv % Hk == 0"``,
``"all_div(seqlens(cu_seqlens), 2*cp)"``.
"""
from __future__ import annotations

import ast
import copy
import functools
import operator
from typing import Any, Mapping

INT_BOUND = 2**256
MAX_INT_EXPONENT = 64
SEQ_BOUND = 2**16


class ExprError(ValueError):
    """An expression that does not parse, or names something unknown."""


class BoundError(ExprError):
    """An operation whose result the language refuses to compute (too large, overflow)."""


def _fmt(v: Any) -> str:
    return f"<an int of {v.bit_length()} bits>" if isinstance(v, int) and v.bit_length() > 256 else repr(v)


def bounded_pow(a: Any, b: Any) -> Any:
    """``a ** b``. int ** int needs 0 <= b <= 64 and |result| <= 2**256 (refused from the
    operands' sizes before computing anything); other numbers use Python's ``**``, refused
    when it overflows or the result is complex. Tensors etc. pass through to ``**``."""
    if isinstance(a, int) and isinstance(b, int):
        if not 0 <= b <= MAX_INT_EXPONENT:
            raise BoundError(f"{_fmt(a)} ** {_fmt(b)}: an int exponent must be in [0, {MAX_INT_EXPONENT}] "
                             "(write a float exponent otherwise)")
        # |a| ** b >= 2 ** ((bits(a) - 1) * b): refuse before computing
        r = 2 * INT_BOUND if (abs(a).bit_length() - 1) * b > 256 else a**b
        if -INT_BOUND <= r <= INT_BOUND:
            return r
        raise BoundError(f"{_fmt(a)} ** {_fmt(b)}: |result| exceeds 2**256")
    try:
        r = a**b
    except OverflowError:
        raise BoundError(f"{_fmt(a)} ** {_fmt(b)}: overflows") from None
    if isinstance(r, complex):
        raise BoundError(f"{_fmt(a)} ** {_fmt(b)}: the result is complex")
    return r


def bounded_mul(a: Any, b: Any) -> Any:
    """``a * b``. An int product needs |result| <= 2**256 (refused from the operands' bit
    lengths before multiplying), a repeated str/tuple/list at most 2**16 items; anything
    else (floats, tensors) is Python's ``*``."""
    if isinstance(a, int) and isinstance(b, int):
        # |a * b| >= 2 ** (bits(a) + bits(b) - 2): refuse before multiplying
        r = 2 * INT_BOUND if a.bit_length() + b.bit_length() > 258 else a * b
        if -INT_BOUND <= r <= INT_BOUND:
            return r
        raise BoundError(f"{_fmt(a)} * {_fmt(b)}: |result| exceeds 2**256")
    seq, n = (a, b) if isinstance(a, (str, tuple, list)) else (b, a)
    if isinstance(seq, (str, tuple, list)) and isinstance(n, int) and len(seq) * n > SEQ_BOUND:
        raise BoundError(f"repeating a {type(seq).__name__} of {len(seq)} {_fmt(n)} times: "
                         f"more than {SEQ_BOUND} items")
    return a * b


_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: bounded_mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: operator.truediv,
    ast.Pow: bounded_pow,
}
_CMPOPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_DIVS = (ast.Div, ast.FloorDiv, ast.Mod)


@functools.lru_cache(maxsize=4096)
def parse(expr: str) -> ast.Expression:
    """Parse and check ``expr``; raises ExprError for anything outside the language.

    The tree is returned as written (``**`` and ``*`` stay BinOp nodes; only the compiled
    form calls the bounded helpers), shared through the cache: do not mutate it."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse {expr!r}: {e.msg}") from None
    for node in ast.walk(tree):
        ok = isinstance(node, (
            ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp,
            ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Tuple, ast.List,
            ast.And, ast.Or, *_BINOPS, *_CMPOPS, *_UNOPS,
        ))
        if not ok:
            raise ExprError(f"{expr!r}: {type(node).__name__} is not allowed in spec expressions")
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.keywords):
            raise ExprError(f"{expr!r}: only plain calls of helper functions are allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool, str, type(None))):
            raise ExprError(f"{expr!r}: constant {node.value!r} is not allowed")
    _check_constants(tree.body, expr)
    return tree


def _constant(node: ast.AST) -> bool:
    return not any(isinstance(n, (ast.Name, ast.Call)) for n in ast.walk(node))


def _constant_value(node: ast.expr, src: str) -> Any:
    try:
        return _eval(node, {}, src)
    except (ArithmeticError, TypeError, ValueError) as e:  # BoundError is a ValueError
        raise ExprError(f"{src!r}: constant sub-expression {ast.unparse(node)!r} cannot be "
                        f"evaluated: {e}") from None


def _check_constants(node: ast.AST, src: str) -> None:
    """Evaluate every constant-only sub-expression now, so one that cannot be computed
    (``9 ** 9 ** 9``, ``1 // 0``) or a division by a constant zero (``C % 0``) is refused
    when the spec is built, not at a call."""
    if isinstance(node, ast.expr) and _constant(node):
        if not isinstance(node, ast.Constant):
            _constant_value(node, src)
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, _DIVS) and _constant(node.right) \
            and _constant_value(node.right, src) == 0:
        raise ExprError(f"{src!r}: {ast.unparse(node)!r} divides by zero")
    for child in ast.iter_child_nodes(node):
        _check_constants(child, src)


def names(expr: str) -> set[str]:
    """Every name an expression reads (dims, params and helper functions)."""
    return {n.id for n in ast.walk(parse(expr)) if isinstance(n, ast.Name)}


_HELPERS = {ast.Pow: "<bounded_pow>", ast.Mult: "<bounded_mul>"}  # not identifiers: no env name shadows them
_GLOBALS = {"__builtins__": {}, "<bounded_pow>": bounded_pow, "<bounded_mul>": bounded_mul}


class _Bounded(ast.NodeTransformer):
    """The compiled form: constant sub-expressions folded (parse computed them already),
    ``a ** b`` / ``a * b`` calls of the bounded helpers, every other operator native."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        if _constant(node):
            return ast.copy_location(ast.Constant(_eval(node, {}, "")), node)
        self.generic_visit(node)
        if type(node.op) not in _HELPERS:
            return node
        fn = ast.Name(id=_HELPERS[type(node.op)], ctx=ast.Load())
        return ast.copy_location(ast.Call(func=fn, args=[node.left, node.right], keywords=[]), node)


@functools.lru_cache(maxsize=4096)
def _code(expr: str):
    tree = ast.fix_missing_locations(_Bounded().visit(copy.deepcopy(parse(expr))))
    return compile(tree, f"<spec expression {expr!r}>", "eval")


def evaluate(expr: str, env: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` with names looked up in ``env``.

    The expression was checked by :func:`parse` (no attributes, subscripts,
    lambdas, comprehensions; calls only of plain names) and runs with no
    builtins, so only what ``env`` holds is reachable; it is compiled once and
    cached, which keeps per-call validation cheap.
    """
    try:
        return eval(_code(expr), _GLOBALS, env)  # noqa: S307 - whitelisted AST, no builtins
    except NameError as e:
        raise ExprError(f"{expr!r}: unknown name ({e})") from None
    except BoundError as e:
        raise ExprError(f"{expr!r}: {e}") from None


def evaluate_tree(expr: str, env: Mapping[str, Any]) -> Any:
    """The same as :func:`evaluate`, by walking the AST (kept as an executable
    statement of the language's semantics, bounds included; tests compare the two)."""
    try:
        return _eval(parse(expr).body, env, expr)
    except BoundError as e:
        raise ExprError(f"{expr!r}: {e}") from None


def _eval(node: ast.AST, env: Mapping[str, Any], src: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError(f"{src!r}: unknown name {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, env, src), _eval(node.right, env, src))
    if isinstance(node, ast.UnaryOp):
        return _UNOPS[type(node.op)](_eval(node.operand, env, src))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            val = True
            for v in node.values:
                val = _eval(v, env, src)
                if not val:
                    return val
            return val
        val = False
        for v in node.values:
            val = _eval(v, env, src)
            if val:
                return val
        return val
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, src)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, src)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env, src) else node.orelse, env, src)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env, src) for e in node.elts)
    if isinstance(node, ast.Call):
        fn = _eval(node.func, env, src)
        if not callable(fn):
            raise ExprError(f"{src!r}: {node.func.id!r} is not a function")
        return fn(*[_eval(a, env, src) for a in node.args])
    raise ExprError(f"{src!r}: cannot evaluate {type(node).__name__}")  # pragma: no cover
