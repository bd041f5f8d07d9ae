"""What the GPU check scripts in benchmarks/ share (GPU host: triton is there, not in CI).

``bench``: median ms of ``triton.testing.do_bench`` (25 ms warm-up; do_bench's own first
call primes compiles). ``log_error``: an exception's traceback printed and kept in a
script's error list (the scripts go on after a failed case and report it in their JSON).
``device_env``: what a record says about the machine. ``copy_gb_s``: the measured
device-to-device copy bandwidth (read + write bytes), beside the 4.27 TB/s H200 ceiling.
``probe_record``: a probe's JSON record with both.
"""
from __future__ import annotations

import traceback

import torch


def bench(fn, rep: int = 200) -> float:
    """Median milliseconds of ``fn`` over about ``rep`` ms of calls."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def log_error(errors: list, what: str, limit: int = 8) -> str:
    """Print and append ``what: <traceback of the exception being handled>``; returns it."""
    msg = f"{what}: {traceback.format_exc(limit=limit)}"
    print("ERROR", msg, flush=True)
    errors.append(msg)
    return msg


def device_env() -> dict:
    """Device name, SMs, L2 size and the versions of torch, triton and the DSLs present."""
    import triton

    p = torch.cuda.get_device_properties(0)
    env = {"device": p.name, "sms": p.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "l2_mb": p.L2_cache_size / 2**20}
    try:
        import cutlass
        env["cutlass_dsl"] = getattr(cutlass, "__version__", "?")
    except Exception:  # noqa: BLE001 - the cuTile bundle has no CuTe DSL
        pass
    try:
        import cuda.tile as ct
        env["cuda_tile"] = ct.__version__
    except Exception:  # noqa: BLE001 - the CuTe DSL bundle has no cuTile
        pass
    return env


def copy_gb_s(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy of ``nbytes`` (uint8), read + write bytes per second, in GB/s."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    return 2 * nbytes / ms / 1e6


def probe_record(**fields) -> dict:
    """A probe's JSON record: the device (``device_env``), the given fields, empty ``rows`` and
    ``errors``, and the copy rate measured now (``copy_gb_s``, printed: the %-of-copy base)."""
    res = {"env": device_env(), **fields, "rows": [], "errors": []}
    res["copy_gb_s"] = copy_gb_s()
    print(f"copy {res['copy_gb_s']:.0f} GB/s", flush=True)
    return res


def save_probe_record(name: str, rows: list, **fields) -> dict:
    """probe_record(**fields) with ``rows``, written to $OUT/``name``.json when $OUT is set (else only returned)."""
    import json
    import os

    rec = probe_record(**fields)
    rec["rows"] = rows
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"{name}.json"), "w") as fh:
            json.dump(rec, fh, indent=1)
    return rec


def wait_for(path: str | None, max_s: float) -> None:
    """Block until ``path`` exists (another job's "GPU work done" mark) or ``max_s`` pass, so
    timings start on a quiet GPU; prints how long it waited. No-op without a path."""
    if not path:
        return
    import os
    import time

    t0 = time.perf_counter()
    while not os.path.exists(path) and time.perf_counter() - t0 < max_s:
        time.sleep(0.5)
    print(f"waited {time.perf_counter() - t0:.0f} s for {path}", flush=True)
