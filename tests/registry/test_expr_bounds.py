"""specs.expr bounds what an expression may compute (``**``, ``*``), in the compiled form,
the reference tree walker and at parse time (constant sub-expressions), while parse()
keeps returning the tree as written."""
import ast
import time

import pytest
import torch

from specs import expr as ex

EVALUATORS = [ex.evaluate, ex.evaluate_tree]


def test_bounded_pow():
    assert ex.bounded_pow(2, 64) == 2**64 and ex.bounded_pow(-2, 3) == -8 and ex.bounded_pow(7, 0) == 1
    assert ex.bounded_pow(2**4, 64) == 2**256  # the bound itself is allowed
    assert ex.bounded_pow(2, 0.5) == 2**0.5 and ex.bounded_pow(2.0, -1) == 0.5 and ex.bounded_pow(2.0, 100) == 2.0**100
    assert torch.equal(ex.bounded_pow(torch.tensor([3.0]), 2), torch.tensor([9.0]))  # tensors pass through
    with pytest.raises(ex.ExprError, match=r"^9 \*\* 387420489: an int exponent must be in \[0, 64\]"):
        ex.bounded_pow(9, 9**9)
    with pytest.raises(ex.ExprError, match=r"^2 \*\* -1: an int exponent must be in \[0, 64\]"):
        ex.bounded_pow(2, -1)
    with pytest.raises(ex.ExprError, match=r"^32 \*\* 64: \|result\| exceeds 2\*\*256$"):
        ex.bounded_pow(32, 64)
    with pytest.raises(ex.ExprError, match=r"^10.0 \*\* 400: overflows$"):
        ex.bounded_pow(10.0, 400)
    with pytest.raises(ex.ExprError, match=r"^-8 \*\* 0.5: the result is complex$"):
        ex.bounded_pow(-8, 0.5)


def test_bounded_mul():
    assert ex.bounded_mul(2**128, 2**128) == 2**256 and ex.bounded_mul(-(2**128), 2**128) == -(2**256)
    assert ex.bounded_mul(3, 2.5) == 7.5 and ex.bounded_mul(True, 3) == 3 and ex.bounded_mul((1, 2), 2) == (1, 2, 1, 2)
    assert torch.equal(ex.bounded_mul(torch.tensor([3.0]), 2), torch.tensor([6.0]))
    with pytest.raises(ex.ExprError, match=r"\* 340282366920938463463374607431768211456: \|result\| exceeds 2\*\*256$"):
        ex.bounded_mul(2**128 + 1, 2**128)
    with pytest.raises(ex.ExprError, match=r"^<an int of 4001 bits> \* 3: \|result\| exceeds 2\*\*256$"):
        ex.bounded_mul(2**4000, 3)  # refused from the bit lengths, before multiplying
    with pytest.raises(ex.ExprError, match=r"^repeating a str of 2 40000 times: more than 65536 items$"):
        ex.bounded_mul("ab", 40000)


@pytest.mark.parametrize("evaluate", EVALUATORS)
def test_unbounded_values_are_refused_fast(evaluate):
    """``9 ** 9 ** 9`` hung a call; now every bound is an ExprError naming the expression."""
    with pytest.raises(ex.ExprError, match=r"^'x \*\* 65': 1 \*\* 65: an int exponent must be in \[0, 64\]"):
        evaluate("x ** 65", {"x": 1})
    with pytest.raises(ex.ExprError, match=r"^'x \* x \* x': .*\|result\| exceeds 2\*\*256$"):
        evaluate("x * x * x", {"x": 2**100})
    with pytest.raises(ex.ExprError, match=r"^'s \* n': repeating a str of 1 10000000 times"):
        evaluate("s * n", {"s": "a", "n": 10**7})
    t0 = time.perf_counter()  # last: without the bounds this one hangs
    with pytest.raises(ex.ExprError, match=r"^'a \*\* b \*\* c > 1': 9 \*\* 387420489: an int exponent must be "
                                           r"in \[0, 64\]"):
        evaluate("a ** b ** c > 1", {"a": 9, "b": 9, "c": 9})
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("e", ["n ** 2 * k", "k * n ** n - n * 2.5", "x ** 0.5 * n", "(n * n) ** 2 > 2**31",
                               "s * n", "T * n * C < 2**31", "2 ** 64 * 2 ** 64 * n"])
def test_compiled_and_tree_evaluation_agree_within_bounds(e):
    env = {"n": 3, "k": 2**60, "x": 2.0, "s": "ab", "T": 4096, "C": 7168}
    assert ex.evaluate(e, env) == ex.evaluate_tree(e, env)


@pytest.mark.parametrize("e, env", [("n ** k", {"n": 3, "k": 200}), ("n * k * k", {"n": 3, "k": 2**128}),
                                    ("x ** k", {"x": 10.0, "k": 400})])
def test_compiled_and_tree_evaluation_refuse_alike(e, env):
    msgs = []
    for evaluate in EVALUATORS:
        with pytest.raises(ex.ExprError) as info:
            evaluate(e, env)
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1] and msgs[0].startswith(repr(e))


def test_parse_keeps_the_tree_as_written_and_only_the_compiled_form_calls_helpers():
    """A device-side evaluator walks parse(e).body: ** and * stay BinOp nodes there."""
    e = "n ** 2 * k + T // 2 < 2**31"
    assert ex.evaluate(e, {"n": 3, "k": 5, "T": 8})
    body = ex.parse(e).body
    pow_mul = [type(n.op) for n in ast.walk(body) if isinstance(n, ast.BinOp)]
    assert pow_mul.count(ast.Pow) == 2 and pow_mul.count(ast.Mult) == 1
    code = ex._code(e)
    assert {"<bounded_pow>", "<bounded_mul>"} <= set(code.co_names)
    assert 2**31 in code.co_consts  # a constant sub-expression is folded, not a helper call per evaluation


@pytest.mark.parametrize("e, what", [
    ("9 ** 9 ** 9 > 1", "9 ** 387420489: an int exponent must be in [0, 64]"),
    ("n < 2 ** 300", "2 ** 300: an int exponent must be in [0, 64]"),
    ("n < 16 ** 60 * 16 ** 60", "|result| exceeds 2**256"),
    ("x > 10.0 ** 400", "10.0 ** 400: overflows"),
    ("n if x else 'a' * 100000", "more than 65536 items"),
    ("n < 1 // 0", "division or modulo by zero"),
])
def test_parse_refuses_constant_sub_expressions_out_of_bounds(e, what):
    with pytest.raises(ex.ExprError, match="constant sub-expression") as info:
        ex.parse(e)
    assert what in str(info.value) and str(info.value).startswith(repr(e))


@pytest.mark.parametrize("e", ["C // 0", "C % 0", "C / (2 - 2)", "C // 0.0"])
def test_parse_refuses_division_by_a_constant_zero(e):
    with pytest.raises(ex.ExprError, match=r"divides by zero$"):
        ex.parse(e)


@pytest.mark.parametrize("e", ["1 << 3", "n >> 1", "n & 1", "n | 1", "n ^ 1", "~n"])
def test_shifts_and_bit_operators_stay_out_of_the_language(e):
    with pytest.raises(ex.ExprError, match="is not allowed in spec expressions"):
        ex.parse(e)
