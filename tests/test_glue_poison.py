"""Output poisoning and the environment switches of ``tilekernels._glue`` (pinned by a mutation audit).

Every test relies on poisoning: an output element a kernel forgets to write must fail the comparison, never pass
by luck. So each dtype's poison must be a value no correct result is compared equal to by accident (NaN where the
dtype has one), the finite kind a finite sentinel other than zero, and the switch must come back as it was."""
from __future__ import annotations

import pytest
import torch

from tilekernels import _glue
from tilekernels._glue import empty, env_choice, env_flag, poisoned


def _bits(t: torch.Tensor) -> set:
    return set(t.view(torch.uint8).flatten().tolist())


def test_nan_poison_of_every_output_dtype():
    """Under the default (NaN) kind: floats NaN, e4m3 its NaN byte 0x7F, uint8 0xFF (an E8M0 NaN scale), bool True,
    ints their max: what ``empty`` hands a kernel (conftest turns poisoning on for every test)."""
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        assert torch.isnan(empty((3, 5), dt, "cpu")).all(), dt
    assert _bits(empty((4,), torch.float8_e4m3fn, "cpu")) == {0x7F}
    assert torch.isnan(empty((4,), torch.float8_e4m3fn, "cpu").float()).all()
    assert empty((4,), torch.uint8, "cpu").tolist() == [0xFF] * 4
    assert empty((4,), torch.bool, "cpu").all()
    for dt in (torch.int32, torch.int64):
        assert empty((4,), dt, "cpu").tolist() == [torch.iinfo(dt).max] * 4, dt


def test_finite_poison_is_a_nonzero_sentinel():
    """The finite kind (for tests whose right values include NaN) fills finite sentinels that are not zero, the
    value a kernel that skipped an element most plausibly leaves: -1234.5, e4m3 byte 0x2A, uint8 0x55, False, the
    int min."""
    with poisoned(True, "finite"):
        assert empty((2, 3), torch.float32, "cpu").eq(-1234.5).all()
        assert _bits(empty((4,), torch.float8_e4m3fn, "cpu")) == {0x2A}
        assert empty((4,), torch.uint8, "cpu").tolist() == [0x55] * 4
        assert not empty((4,), torch.bool, "cpu").any()
        assert empty((4,), torch.int32, "cpu").tolist() == [torch.iinfo(torch.int32).min] * 4


def test_poisoned_restores_the_previous_setting():
    """``poisoned`` is a context: after the block (also when it raises) the previous switch and kind are back, so
    one test's finite kind or poisoning off does not leak into the next."""
    before = list(_glue._POISON)
    with pytest.raises(RuntimeError):
        with poisoned(False, "finite"):
            assert _glue._POISON == [False, "finite"]
            raise RuntimeError
    assert _glue._POISON == before
    with pytest.raises(ValueError, match="poison kind must be 'nan' or 'finite', got 'zero'"):
        with poisoned(True, "zero"):
            pass
    assert _glue._POISON == before


def test_env_switches(monkeypatch):
    """The project's one convention for on / off switches: unset gives the default, "" and "0" are off, anything
    else on; a named choice outside its choices raises naming the variable, never falls back silently."""
    monkeypatch.delenv("TK_TEST_FLAG", raising=False)
    assert env_flag("TK_TEST_FLAG", True) is True and env_flag("TK_TEST_FLAG", False) is False
    for v, on in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("TK_TEST_FLAG", v)
        assert env_flag("TK_TEST_FLAG", not on) is on, v
    monkeypatch.setenv("TK_TEST_CHOICE", "b")
    assert env_choice("TK_TEST_CHOICE", "a", ("a", "b")) == "b"
    monkeypatch.setenv("TK_TEST_CHOICE", "c")
    with pytest.raises(ValueError, match=r"TK_TEST_CHOICE must be one of \('a', 'b'\), got 'c'"):
        env_choice("TK_TEST_CHOICE", "a", ("a", "b"))
