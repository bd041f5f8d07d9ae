"""tests/conftest.py's big_gpu lock: a test marked ``big_gpu`` runs holding an exclusive lock on
one file, so pytest-xdist workers (or two pytest runs on one host) never run two at once (each
can take tens of GB of GPU memory: its float64 references at the headline shapes)."""
from __future__ import annotations

import fcntl

import pytest

from conftest import BIG_GPU_LOCK


@pytest.mark.big_gpu
def test_a_big_gpu_test_runs_holding_the_lock():
    """A second open file description cannot take the lock while the test runs (flock locks
    belong to the description, so this also holds inside the holding process)."""
    with open(BIG_GPU_LOCK, "a") as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_headline_cases_of_the_cutile_gpu_file_are_marked():
    """The T = 32768 (or M = 32768) cases, and only those, carry big_gpu."""
    from tests.mhc.test_mhc_cutile_gpu import CASES, _params

    params = _params(CASES)
    big = [p for p in params if any(m.name == "big_gpu" for m in p.marks)]
    assert big and all(p.values[0]["T"] > 4096 for p in big)
    assert all(p.values[0]["T"] <= 4096 for p in params if p not in big)
