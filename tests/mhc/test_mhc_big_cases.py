"""mhc_helpers.gpu_cases: which GPU cases are marked ``big_gpu`` (run one at a time under
pytest-xdist: tests/conftest.py's lock)."""
from __future__ import annotations

from mhc_helpers import BIG_TOKENS, case_id, gpu_cases


def _big(p) -> bool:
    return any(m.name == "big_gpu" for m in p.marks)


def test_headline_token_counts_are_marked_and_the_rest_not():
    cases = [dict(T=32768, n=4, C=7168), dict(M=32768, n=4, C=7168), dict(T=BIG_TOKENS, n=1, C=8),
             dict(T=BIG_TOKENS - 1, n=4, C=7168), dict(T=4099, n=4, C=7168), dict(T=0, n=4, C=256), dict(n=2, C=64)]
    params = gpu_cases(cases)
    assert [_big(p) for p in params] == [True, True, True, False, False, False, False]
    assert [p.id for p in params] == [case_id(c) for c in cases]
    assert [p.values[0] for p in params] == cases

