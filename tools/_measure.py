"""tk-bench's measuring pieces: timers, per-device ceilings, output comparison.

Timing: first a warm-up that runs until the call's time is stable (``warm_up``:
the first call, where compiles, lazy initialisation and first allocations happen,
then short windows of calls until two consecutive windows' median per-call times
agree within 15%, for at most about 2 s; a call that never settles is timed anyway
and its record says so). Then on CUDA ``triton.testing.do_bench`` (median) when
triton imports, else the median of ``reps`` CUDA-event-timed calls; on CPU the
median of ``reps`` ``time.perf_counter`` intervals (default 10, down to 3 for
calls slower than 30 ms, judged by the settled per-call time).

Ceilings (what %-of-ceiling divides by), per device:
  * H200: copy 4.27 TB/s, dense bf16 773 TFLOP/s, measured on the project's H200;
  * H100 SXM: 3.0 TB/s and 750 TFLOP/s, table values (source "table"): the copy near what an H100 lease measured
    (3.018 TB/s, the mHC ledger's session 52), the bf16 figure an estimate under the datasheet's dense 989, not
    measured here (a reader of H100 %-of-ceiling should know it);
  * any other GPU: measured once here, a large device-to-device copy (read +
    write bytes) and a bf16 8192^3 matmul;
  * CPU: measured once, a copy of a 256 MiB tensor into a preallocated one
    (read + write bytes; a fresh clone would time page faults) with the run's
    intra-op threads (tk-bench: one unless --threads); no
    compute ceiling, so compute-bound CPU rows have no percentage.
A case is compute-bound when it counts flops and flops/bytes > 100.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from tilekernels.testing import exact_mismatches, rel_err, tolerance

COMPUTE_BOUND_INTENSITY = 100.0  # flops per byte above which the TFLOP/s ceiling applies
CPU_BUDGET_S = 0.3  # CPU timing: default reps shrink (10 -> 3) so one measurement takes about this
WARMUP_TOL = 0.15  # warm-up ends when two consecutive windows' median per-call times agree this well
WARMUP_WINDOW_S = 0.02  # one warm-up window: as many calls as take about this long (3 to 100)
WARMUP_MAX_S = 2.0  # warm-up budget after the first call (at least two windows run)

# name test -> (copy GB/s, bf16 TFLOP/s, source)
_TABLE = [
    (lambda n: "H200" in n and "NVL" not in n, 4270.0, 773.0, "measured on the project's H200"),
    (lambda n: "H100" in n and "PCIe" not in n and "NVL" not in n, 3000.0, 750.0, "table (H100 SXM; bf16 estimated)"),
]


# ------------------------------------------------------------------ timing


@dataclass(frozen=True)
class WarmUp:
    """What ``warm_up`` did: calls made (the first included), seconds spent, the first
    call's and the last window's median per-call ms, and whether two windows agreed."""
    calls: int
    seconds: float
    first_ms: float
    per_call_ms: float
    settled: bool


def warm_up(fn: Callable[[], Any], sync: Callable[[], Any] = lambda: None, *,
            clock: Callable[[], float] = time.perf_counter, tol: float = WARMUP_TOL,
            window_s: float = WARMUP_WINDOW_S, max_s: float = WARMUP_MAX_S,
            max_windows: int = 50) -> WarmUp:
    """Call ``fn`` until its time per call is stable: once (compiles, lazy initialisation,
    first allocations), then windows of calls sized to about ``window_s`` (at least 3 calls,
    sized from the last estimate), until the median per-call times of two consecutive windows agree within
    ``tol`` (relative), or until ``max_s`` seconds (but at least two windows) or
    ``max_windows`` windows have passed (then ``settled`` is False). ``sync()`` runs after every call (CUDA: the
    device finishes the call's work before the clock is read)."""
    t0 = clock()
    fn()
    sync()
    first = clock() - t0
    calls, per, prev, windows = 1, first, None, 0
    start = clock()
    while True:
        n = max(3, min(100, int(window_s / per) if per > 0 else 100))
        ts = []
        for _ in range(n):
            a = clock()
            fn()
            sync()
            ts.append(clock() - a)
        calls, windows = calls + n, windows + 1
        per = statistics.median(ts)
        if prev is not None and abs(per - prev) <= tol * min(per, prev):
            settled = True
            break
        if windows >= max_windows or (windows >= 2 and clock() - start >= max_s):
            settled = False
            break
        prev = per
    return WarmUp(calls, clock() - t0, first * 1e3, per * 1e3, settled)


class Timer:
    """``timer(fn) -> ms`` (median), as described in the module docstring. ``last_warmup``
    holds the warm-up of the last call (``Runner`` notes a timing that never settled)."""

    def __init__(self, device: torch.device, reps: Optional[int] = None,
                 warmup_max_s: float = WARMUP_MAX_S, clock: Callable[[], float] = time.perf_counter):
        self.device = device
        self.reps = reps
        self.warmup_max_s = warmup_max_s
        self.clock = clock  # CPU timing's clock (tests pass a fake one)
        self.last_warmup: Optional[WarmUp] = None
        self.method = "perf_counter"
        self._do_bench = None
        if device.type == "cuda":
            try:
                from triton.testing import do_bench

                self._do_bench = do_bench
                self.method = "triton.testing.do_bench (median)"
            except Exception:  # noqa: BLE001 - no triton: CUDA events
                self.method = "CUDA events (median)"
        else:
            self.method = "time.perf_counter (median)"

    def warm_up(self, fn: Callable[[], Any]) -> WarmUp:
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self.last_warmup = warm_up(fn, sync, clock=self.clock, max_s=self.warmup_max_s)
        return self.last_warmup

    def __call__(self, fn: Callable[[], Any]) -> float:
        self.warm_up(fn)
        return self.measure(fn)

    def measure(self, fn: Callable[[], Any]) -> float:
        """The timed part alone (call ``warm_up`` first; ``__call__`` does both)."""
        if self.device.type != "cuda":
            # default: 10 reps, fewer (>= 3) for slow calls so a CPU run stays short
            w = self.last_warmup
            per_call = max(w.per_call_ms / 1e3 if w else 0.0, 1e-9)
            reps = self.reps or max(3, min(10, int(CPU_BUDGET_S / per_call)))
            ts = []
            for _ in range(reps):
                t0 = self.clock()
                fn()
                ts.append(self.clock() - t0)
            return statistics.median(ts) * 1e3
        if self._do_bench is not None:
            return float(self._do_bench(fn, warmup=25, rep=100, return_mode="median"))
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.reps or 50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    def graph(self, fn: Callable[[], Any]) -> Optional[float]:
        """Median ms of ``fn`` captured once in a CUDA graph and replayed: the GPU time
        without Python/launch overhead (what a CUDA-graphed training step sees).
        None off CUDA, without triton, or when ``fn`` cannot be captured."""
        if self.device.type != "cuda":
            return None
        try:
            from triton.testing import do_bench_cudagraph

            fn()  # compile / allocate outside the capture
            torch.cuda.synchronize()
            return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))
        except Exception:  # noqa: BLE001 - not capturable: reported as n/a
            torch.cuda.synchronize()
            return None


# ---------------------------------------------------------------- ceilings


@dataclass(frozen=True)
class Ceiling:
    kind: str       # "bandwidth" or "compute"
    value: float    # GB/s for bandwidth, TFLOP/s for compute
    unit: str
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "unit": self.unit, "source": self.source}


_MEASURED: dict[tuple[str, str, str], Optional[Ceiling]] = {}  # once per process


class Ceilings:
    """The device's bandwidth and compute ceilings, looked up or measured once, lazily."""

    def __init__(self, device: torch.device, timer: Timer, name: str):
        self.device, self.timer, self.name = device, timer, name
        self._row = next((r for r in _TABLE if r[0](name)), None) if device.type == "cuda" else None

    def get(self, kind: str) -> Optional[Ceiling]:
        key = (str(self.device), self.name, kind)
        if key not in _MEASURED:
            _MEASURED[key] = self._bandwidth() if kind == "bandwidth" else self._compute()
        return _MEASURED[key]

    def _bandwidth(self) -> Optional[Ceiling]:
        if self._row:
            return Ceiling("bandwidth", self._row[1], "GB/s", f"{self._row[3]} (copy)")
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            n = int(min(2**30, free // 4)) // 256 * 256
            src = torch.empty(n, dtype=torch.uint8, device=self.device).fill_(1)
            dst = torch.empty_like(src)
            ms = self.timer(lambda: dst.copy_(src))
            return Ceiling("bandwidth", 2 * n / ms / 1e6, "GB/s",
                           f"measured (device-to-device copy of {n >> 20} MiB, read+write)")
        n = 256 << 20
        src = torch.ones(n // 4, dtype=torch.float32)
        dst = torch.zeros_like(src)  # touched once, so page faults stay out of the timing
        ms = Timer(self.device, reps=5)(lambda: dst.copy_(src))
        return Ceiling("bandwidth", 2 * n / ms / 1e6, "GB/s",
                       f"measured (CPU copy of 256 MiB, read+write, {torch.get_num_threads()} thread(s))")

    def _compute(self) -> Optional[Ceiling]:
        if self._row:
            return Ceiling("compute", self._row[2], "TFLOP/s", f"{self._row[3]} (dense bf16)")
        if self.device.type != "cuda":
            return None
        k = 8192
        a = torch.randn(k, k, device=self.device, dtype=torch.bfloat16)
        b = torch.randn(k, k, device=self.device, dtype=torch.bfloat16)
        ms = self.timer(lambda: a @ b)
        return Ceiling("compute", 2 * k**3 / ms / 1e9, "TFLOP/s", f"measured (bf16 matmul {k}^3)")


def throughput(bytes_: Optional[int], flops: Optional[int], ms: Optional[float],
               ceilings: Ceilings) -> dict[str, Any]:
    """GB/s, TFLOP/s, which bound applies, and the %-of-ceiling for one measurement."""
    gb_s = bytes_ / ms / 1e6 if bytes_ and ms else None
    tflop_s = flops / ms / 1e9 if flops and ms else None
    compute = bool(flops) and (not bytes_ or flops / bytes_ > COMPUTE_BOUND_INTENSITY)
    kind = "compute" if compute else "bandwidth"
    value = tflop_s if compute else gb_s
    ceiling = ceilings.get(kind) if value is not None else None
    pct = 100.0 * value / ceiling.value if ceiling and value is not None else None
    return {"bytes": bytes_, "flops": flops, "gb_s": gb_s, "tflop_s": tflop_s,
            "bound": "compute" if compute else "memory", "pct_of_ceiling": pct,
            "ceiling": ceiling.as_dict() if ceiling else None}


# -------------------------------------------------------------- comparison


def flatten(x) -> list:
    """Op/reference results as a list (a tensor, or a tuple/list of tensors or None)."""
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _exact(t: torch.Tensor) -> bool:
    return not t.is_floating_point() or t.element_size() == 1  # ints, bool, uint8, fp8


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit on ``a``'s device (``b`` moved there, chunked: a headline GPU output is not copied to the host)."""
    return tuple(a.shape) == tuple(b.shape) and exact_mismatches(a, b) == 0


def compare(got: list, want: list, names: list[str], exact: bool = False) -> tuple[float, bool, list[str]]:
    """(worst rel_err, all within tolerance, one note per failing tensor).

    Floating outputs use the tolerance of their own dtype (tilekernels.testing);
    integer, bool, uint8 and fp8 outputs must match bit for bit ("exact"), and so must every
    output with ``exact`` (an op that only moves elements: a swapped pair is inside bf16's
    tolerance). A NaN rel_err (a NaN or inf where the other side has none) stays the worst.
    """
    worst, ok, notes = 0.0, True, []
    if len(got) != len(want):
        return math.inf, False, [f"{len(got)} results vs the reference's {len(want)}"]
    for name, g, w in zip(names, got, want):
        if g is None and w is None:
            continue
        if not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor):
            same = g == w if not (isinstance(g, torch.Tensor) or isinstance(w, torch.Tensor)) else False
            if not same:
                ok = False
                notes.append(f"{name}: {type(g).__name__} vs reference {type(w).__name__}")
            continue
        err = rel_err(g, w)
        if exact or _exact(g):
            good = _bitwise_equal(g, w)
            kind = "exact"
        else:
            kind = str(g.dtype).removeprefix("torch.")
            good = err <= tolerance(kind)
        if math.isnan(err) or err > worst:  # (max() would drop a NaN err for the 0.0 it started from)
            worst = err
        if not good:
            ok = False
            notes.append(f"{name}: rel_err {err:.3e} over the {kind} tolerance {tolerance(kind):.0e}")
    return worst, ok, notes
