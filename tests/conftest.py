"""Shared test setup: outputs are poisoned (NaN / sentinel) in every test, and
every test gets fresh random inputs (seeded from the test's id per run, so a
failure can be replayed with TK_SEED)."""
from __future__ import annotations

import gc
import os
import random
import tempfile
import zlib

import pytest
import torch

from tilekernels._glue import poisoned

_RUN_SEED = int(os.environ.get("TK_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"tilekernels: TK_SEED={_RUN_SEED} (set TK_SEED to replay)"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The seed again at the end, where -q (which drops the header) still prints it, so a
    CI log's failure can be replayed."""
    terminalreporter.write_line(f"tilekernels: TK_SEED={_RUN_SEED} (set TK_SEED to replay)")


@pytest.fixture(autouse=True)
def _fresh_seed_and_poison(request):
    torch.manual_seed(_RUN_SEED ^ zlib.crc32(request.node.nodeid.encode()))
    with poisoned(True):
        yield


BIG_GPU_LOCK = os.path.join(tempfile.gettempdir(), "tilekernels-big-gpu-test.lock")


@pytest.fixture(autouse=True)
def _one_big_gpu_test_at_a_time(request):
    """Tests marked ``big_gpu`` (headline shapes with float64 references: up to ~50 GB of GPU
    memory a process) hold an exclusive lock on one file for their run, so under pytest-xdist
    (``-n N``, any ``--dist``) or concurrent pytest runs on one host only one runs at a time; the
    caching allocator's blocks are returned before the lock is released. Without it, plain ``-n 8``
    put several on one H200 at once and ran it out of memory (session 35). An ``xdist_group`` does
    not do this: ``--dist loadgroup`` must be asked for, and with pytest 9.2 / pytest-xdist 3.8 it
    groups nothing (xdist tags the group on ``item._nodeid``, which pytest 9.2's nodeid ignores)."""
    if request.node.get_closest_marker("big_gpu") is None:
        yield
        return
    import fcntl

    with open(BIG_GPU_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            fcntl.flock(f, fcntl.LOCK_UN)


CACHE_KEEP = 1 << 30   # bytes of cached GPU memory a test process may keep past a test


def release_cached_gpu_memory(keep: int = CACHE_KEEP) -> bool:
    """Return the caching allocator's unused blocks to the driver when it holds more than ``keep``
    bytes (True if it did). The big_gpu lock keeps two headline tests apart, but not the other
    workers' caches: on an 80 GB H100 (-n 12), the eleven other xdist workers held 1.1-7.6 GiB each
    (blocks of tests they had run before) and mhc_pre's T = 32768 float64 test ran out of memory asking
    for 7 GiB more than its 37.6 (session 59, gpu_suite.sh BC; it passed alone)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    if torch.cuda.memory_reserved() <= keep:
        return False
    torch.cuda.empty_cache()
    return True


@pytest.fixture(autouse=True)
def _return_cached_gpu_memory():
    """After every test (see ``release_cached_gpu_memory``); nothing happens on a CPU host."""
    yield
    release_cached_gpu_memory()


@pytest.fixture(autouse=True)
def _end_a_process_group_the_test_made():
    """tk-bench's cp cases (and the tools that run them in-process) make a world-size-1 default process group for
    the process; a test that made a gloo one ends it, so the next test sees the process as it would alone (tests/cp's
    refusals without a group failed after tests/registry or tests/tools). An NCCL group (the GPU cases') is left as
    before: its teardown can hang (test_cp_cutile_pack guards it with a thread), and no GPU run has tried this."""
    import torch.distributed as dist

    before = dist.is_available() and dist.is_initialized()
    yield
    if not before and dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


@pytest.fixture
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------------------
# Constraint coverage: every op-level constraint of every shipped spec must be
# refused by at least one test. Recorded while the suite runs; checked at the
# end of a run that collected the whole suite (a -k / single-file run skips it).
import registry.validate as _validate  # noqa: E402

_REFUSED: set[tuple[str, str]] = set()
_orig_check = _validate.check_constraints


def _recording_check(op, constraints, env, what):
    for c in constraints:  # one at a time, so the refusing constraint is known exactly
        try:
            _orig_check(op, [c], env, what)
        except _validate.SpecError:
            _REFUSED.add((op, c.expr))
            raise


_validate.check_constraints = _recording_check


def pytest_sessionfinish(session, exitstatus):
    from specs import all_specs

    full = not session.config.getoption("keyword") and not session.config.args[1:] \
        and all(a.rstrip("/").endswith("tests") or a == "." for a in session.config.args)
    if not full or exitstatus != 0 or session.testscollected < 100:
        return
    missing = [(s.name, c.expr) for s in all_specs() for c in s.constraints
               if (s.name, c.expr) not in _REFUSED]
    if missing:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = "\n".join(f"  {op}: {expr}" for op, expr in missing)
        tr.write_line(f"\nspec constraints no test refuses ({len(missing)}):\n{lines}", red=True)
        session.exitstatus = 1
