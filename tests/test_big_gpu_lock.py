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
