"""Host-time helpers shared by the host-cost drivers (device host; needs a GPU)."""
from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Callable

import torch


def per_call_us(fn: Callable[[], object], n: int = 2000, warmup: int = 20) -> float:
    """Mean host microseconds per call over n calls queued back to back (one sync at the end)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def cprofile_top(fn: Callable[[], object], calls: int, keys=("tottime",), top: int = 28) -> str:
    """cProfile of ``calls`` calls of fn: the ``top`` functions by each sort key, as text."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    out = []
    for key in keys:
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(top)
        out.append(s.getvalue())
    return "\n".join(out)


def general_path(op, on: bool) -> None:
    """Switch registry op ``op``'s eager calls to the general path (``on``) or back: without the guard pattern's
    Prepared call (session 63), as every call ran before it. ``prepared()`` answers False while on; the op's
    patterns are cleared on each switch, so the next calls rebuild them. For A/B rows in one process."""
    gen = op.entry.gen
    if on != ("prepared" in gen.__dict__):
        if on:
            gen.prepared = lambda *a: False
        else:
            del gen.prepared
        op._guards.clear()
