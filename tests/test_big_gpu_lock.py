"""tests/conftest.py's big_gpu lock: a test marked ``big_gpu`` runs holding an exclusive lock on
one file, so pytest-xdist workers (or two pytest runs on one host) never run two at once (each
can take tens of GB of GPU memory: its float64 references at the headline shapes); and its
per-test release of cached GPU memory, so the other workers' caches leave that memory free."""
from __future__ import annotations

import fcntl

import pytest
import torch

from conftest import BIG_GPU_LOCK


@pytest.mark.big_gpu
def test_a_big_gpu_test_runs_holding_the_lock():
    """A second open file description cannot take the lock while the test runs (flock locks
    belong to the description, so this also holds inside the holding process)."""
    with open(BIG_GPU_LOCK, "a") as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_cached_gpu_memory_is_returned_past_the_limit(monkeypatch):
    """conftest's per-test release: empty_cache runs when the allocator holds more than CACHE_KEEP
    bytes, and not at or under it, nor before CUDA is initialized (so a CPU host never touches CUDA)."""
    import conftest

    calls = []
    reserved = [conftest.CACHE_KEEP + 1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: reserved[0])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    assert conftest.release_cached_gpu_memory() is True and calls == [1]
    reserved[0] = conftest.CACHE_KEEP
    assert conftest.release_cached_gpu_memory() is False and calls == [1]
    reserved[0] = conftest.CACHE_KEEP + 1
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert conftest.release_cached_gpu_memory() is False and calls == [1]
