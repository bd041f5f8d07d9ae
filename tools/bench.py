"""tk-bench: run every registered op on this machine's default shapes, check it, time it.

For each bench case (``tilekernels.<family>.bench.cases(device_type)``: small
shapes on CPU, the OPS.md headline shapes on a GPU) and each pass:

* correctness: the op (registry, backend ``auto`` or ``--backend``) against
  its reference run on float64 upcasts of the same inputs, with the tolerance
  of each output's dtype (``tilekernels.testing``; integer/fp8 outputs exact).
  fwd+bwd also compares the gradients of the case's ``grad_inputs`` under one
  random upstream gradient, the reference differentiated by autograd in float64.
  In-place (``inout``) inputs are compared after the call too.
* time: the spec's entry with the chosen backend (validation done once,
  outside the timed region), warmed up until its time per call is stable (the
  first call's compile and lazy initialisation never reach the timed region);
  see ``tools._measure`` for the timers. A CPU run uses one intra-op thread
  unless ``--threads`` says otherwise: on a shared host, torch's default (one
  thread per core) makes small ops wait on threads whose cores other processes
  hold, and rows read tens of times slow.
  fwd+bwd = forward + backward with a fixed upstream gradient (grads cleared
  between reps); "bwd" rows are derived as fwd+bwd - fwd.
* throughput from the case's hand-counted bytes/flops: GB/s, TFLOP/s and the
  percentage of the device ceiling (``tools._measure``).
* peers: torch eager (the op with ``backend="torch"``) and
  ``torch.compile(reference)``. By default only where the chosen backend is
  not torch (a peer of the torch reference is itself, and compiling every
  reference costs minutes of GPU time); ``--compare`` adds them for every
  row, ``--no-compare`` drops them everywhere. Failures show as n/a.

Logs go to stderr, the table to stdout, last (stderr too with ``--json -``). Exit status 1 when any check
fails or any case errors, 2 on bad arguments, else 0.
"""
from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from tilekernels._glue import poisoned

from . import _common as C
from ._measure import Ceilings, Timer, compare, flatten, throughput

log = logging.getLogger("tools.bench")
CPU_THREADS = 1  # intra-op threads of a CPU run unless --threads says otherwise (see --help)
PASSES = {"fwd": ["fwd"], "fwdbwd": ["fwd+bwd"], "fwd+bwd": ["fwd+bwd"], "all": ["fwd", "fwd+bwd"]}


class Skip(Exception):
    """This pass cannot run here (forced backend missing/unusable); not a failure."""


# ------------------------------------------------------------------ setup


def _parse_shape(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        for kv in filter(None, (s.strip() for s in item.split(","))):
            k, sep, v = kv.partition("=")
            if not sep or not k.strip() or not v.strip().lstrip("-").isdigit():
                raise ValueError(f"--shape wants k=v[,k=v...] with integer v, got {kv!r}")
            out[k.strip()] = int(v)
    return out


def _choose(op, bound, backend: str) -> str:
    from registry import BackendUnavailable, SpecError

    names = [b.name for b in op.spec.backends]
    if backend != "auto" and backend not in names:
        raise Skip(f"{op.name} has no {backend} backend (has {names})")
    try:
        return op.choose(bound, backend)
    except BackendUnavailable as e:
        if backend != "auto":
            raise Skip(str(e)) from None
        raise
    except SpecError:
        raise


def _drop() -> None:
    """Free what the last check left (float64 references can be large on a GPU)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- passes


class Runner:
    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        self.timer = Timer(device, reps=args.reps)
        self.ceilings = Ceilings(device, self.timer, C.device_label(device))
        self.compare = args.compare  # None: peers only for non-torch backends

    def _upcast_inputs(self, spec, args, params, grad_names=()):
        from tilekernels.testing import upcast

        def up(name, t):
            if not isinstance(t, torch.Tensor):
                return t
            u = upcast(t)
            if u is t or u.data_ptr() == t.data_ptr():
                u = t.detach().clone()  # never alias what the op may write in place
            return u.requires_grad_(True) if name in grad_names and u.is_floating_point() else u

        return C.with_inputs(spec, args, params, up)

    def _inout(self, spec, args, params, rargs, rparams):
        names = [t.name for t in spec.inputs if t.role == "inout"]
        got = [C.input_tensor(spec, args, params, n) for n in names]
        want = [C.input_tensor(spec, rargs, rparams, n) for n in names]
        return got, want, [f"{n} (in place)" for n in names]

    def _peer(self, what: str, fn) -> Optional[float]:
        try:
            return self.timer(fn)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            log.info("    %s: n/a (%s: %s)", what, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            return None

    def _check_fwd(self, op, args, params, backend: str, oracle=None, exact: bool = False
                   ) -> tuple[float, bool, list[str]]:
        """Forward result (and in-place inputs) vs the float64 reference (``oracle``: the
        case's own float64 oracle instead of ``op.reference``; it also gets the op's results)."""
        spec = op.spec
        rargs, rparams = self._upcast_inputs(spec, args, params)
        with poisoned(True):  # an output element the kernel never writes is NaN, so it fails
            outs = flatten(op(*args, backend=backend, **params))
        refs = flatten(oracle(outs, *rargs, **rparams) if oracle else op.reference(*rargs, **rparams))
        got, want, names = self._inout(spec, args, params, rargs, rparams)
        return compare(outs + got, refs + want, _out_names(spec, outs) + names, exact)

    def _check_fwdbwd(self, op, args, params, largs, lparams, leaves, backend: str, oracle=None,
                      exact: bool = False):
        """Forward results and input gradients vs float64 reference autograd, under one
        random upstream gradient; returns (rel_err, ok, notes, differentiable result indices, grads)."""
        spec = op.spec
        with torch.enable_grad():
            with poisoned(True):
                outs = flatten(op(*largs, backend=backend, **lparams))
            diff = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
            if not diff:
                raise RuntimeError("no output requires grad: nothing to differentiate")
            grads = [torch.randn_like(outs[i]) for i in diff]
            with poisoned(True):
                torch.autograd.backward([outs[i] for i in diff], grads)
            rargs, rparams = self._upcast_inputs(spec, args, params, [n for n, _ in leaves])
            routs = flatten(oracle([o.detach() if isinstance(o, torch.Tensor) else o for o in outs], *rargs,
                                   **rparams) if oracle else op.reference(*rargs, **rparams))
            rleaves = [C.input_tensor(spec, rargs, rparams, n) for n, _ in leaves]
            bad = [i for i in diff if i >= len(routs) or not getattr(routs[i], "requires_grad", False)]
            if bad:
                raise RuntimeError(f"reference results {bad} do not depend on {[n for n, _ in leaves]} "
                                   "under autograd")
            torch.autograd.backward([routs[i] for i in diff], [g.detach().to(torch.float64) for g in grads])

        def detached(xs):
            return [x.detach() if isinstance(x, torch.Tensor) else x for x in xs]

        err, ok, notes = compare(detached(outs) + [t.grad for _, t in leaves],
                                 detached(routs) + [t.grad for t in rleaves],
                                 _out_names(spec, outs) + [f"d{n}" for n, _ in leaves], exact)
        return err, ok, notes, diff, grads

    def _peers(self, rec: dict, op, ours: float, eager, with_compiled) -> None:
        """Peer timings: torch eager (``eager()`` gives the step) and ``torch.compile(op.reference)``
        (``with_compiled(compiled_reference)`` gives the step); a failure is n/a."""
        if self.compare is False or (self.compare is None and rec["backend"] == "torch"):
            return
        rec["eager_ms"] = ours if rec["backend"] == "torch" else self._peer("torch eager", eager())
        try:
            step = with_compiled(torch.compile(op.reference))
        except Exception as e:  # noqa: BLE001
            log.info("    torch.compile(reference): n/a (%s: %s)", type(e).__name__, e)
            rec["compile_ms"] = None
            return
        rec["compile_ms"] = self._peer("torch.compile(reference)", step)

    def _named_peers(self, rec: dict, case, args, params, step_of=None) -> None:
        """Time the case's named peers (``BenchCase.peers``) for this pass into
        ``rec["peers"]`` (name -> ms, None when n/a); ``step_of(call)`` makes a fwd+bwd step
        of a peer's call (None: the fwd pass, the call itself is the step)."""
        if self.compare is False:
            return
        mine = [p for p in getattr(case, "peers", ()) if self.device.type in p.devices
                and (step_of is None or p.backward)]
        if not mine:
            return
        rec["peers"] = {}
        for p in mine:
            try:
                call = p.prepare(args, params)
            except Exception as e:  # noqa: BLE001 - a peer that cannot run is n/a, not fatal
                first = str(e).splitlines()[0][:200] if str(e) else ""
                log.info("    %s: n/a (%s: %s)", p.name, type(e).__name__, first)
                rec["peers"][p.name] = None
                continue
            rec["peers"][p.name] = self._peer(p.name, call if step_of is None else step_of(call))
            _drop()

    def _time(self, step, notes: list) -> float:
        """``self.timer(step)``: a warm-up until the time per call is stable (a step that
        never settles is noted in the record), then the timed calls. On CUDA it also counts
        the caching allocator's device allocations (cudaMalloc) made while timing (after
        the warm-up): a steady-state step should make none, and each one can stall the
        host and so the measurement (noted in the record)."""
        cuda = self.device.type == "cuda"
        w = self.timer.warm_up(step)
        if not w.settled:
            notes.append(f"time per call not settled after {w.calls} warm-up calls ({w.seconds:.1f} s)")
        before = torch.cuda.memory_stats(self.device).get("num_device_alloc", 0) if cuda else 0
        ms = self.timer.measure(step)
        if cuda:
            n = torch.cuda.memory_stats(self.device).get("num_device_alloc", 0) - before
            if n:
                notes.append(f"{n} cudaMalloc while timing")
        return ms

    def _graph(self, backend: str, step) -> Optional[float]:
        """CUDA-graph replay time of our step (GPU backends only; see Timer.graph)."""
        return None if backend == "torch" else self.timer.graph(step)

    def fwd(self, op, case, args, params) -> dict[str, Any]:
        bound = op.bind(*args, **params)
        backend = _choose(op, bound, self.args.backend)
        err, ok, notes = self._check_fwd(op, args, params, backend, case.oracle, case.exact)
        _drop()

        def run(b):
            return lambda: op.entry(*bound.args(), backend=b, **bound.params)

        ms = self._time(run(backend), notes)
        rec = {"backend": backend, "ms": ms, "graph_ms": self._graph(backend, run(backend)),
               "rel_err": err, "ok": ok, "notes": notes}
        self._peers(rec, op, ms, lambda: run("torch"), lambda cref: lambda: cref(*args, **params))
        self._named_peers(rec, case, args, params)
        return rec

    def fwdbwd(self, op, case, args, params) -> dict[str, Any]:
        gnames = tuple(case.grad_inputs)

        def leaf(name, t):
            if name in gnames and isinstance(t, torch.Tensor):
                return t.detach().requires_grad_(True)
            return t

        largs, lparams = C.with_inputs(op.spec, args, params, leaf)
        leaves = [(n, C.input_tensor(op.spec, largs, lparams, n)) for n in gnames]
        leaves = [(n, t) for n, t in leaves if t is not None]
        with torch.enable_grad():
            bound = op.bind(*largs, **lparams)
            backend = _choose(op, bound, self.args.backend)
        err, ok, notes, diff, grads = self._check_fwdbwd(op, args, params, largs, lparams, leaves, backend,
                                                         case.oracle, case.exact)
        _drop()

        def run(call):
            def step():
                for _, t in leaves:
                    t.grad = None
                res = flatten(call())
                torch.autograd.backward([res[i] for i in diff], grads)
            return step

        def entry(b):
            return run(lambda: op.entry(*bound.args(), backend=b, **bound.params))

        with torch.enable_grad():
            ms = self._time(entry(backend), notes)
            rec = {"backend": backend, "ms": ms, "graph_ms": self._graph(backend, entry(backend)),
                   "rel_err": err, "ok": ok, "notes": notes}
            self._peers(rec, op, ms, lambda: entry("torch"), lambda cref: run(lambda: cref(*largs, **lparams)))
            self._named_peers(rec, case, largs, lparams, run)
        for _, t in leaves:
            t.grad = None
        return rec


def _out_names(spec, outs: list) -> list[str]:
    names = [t.name for t in spec.outputs]
    return (names + [f"result {i}" for i in range(len(names), len(outs))])[:len(outs)]


# ---------------------------------------------------------------- records


def _counts(case, dims, pass_) -> tuple[Optional[int], Optional[int]]:
    def total(fwd, bwd):
        if pass_ == "fwd":
            return fwd(dims) if fwd else None
        if pass_ == "bwd":
            return bwd(dims) if bwd else None
        return fwd(dims) + bwd(dims) if fwd and bwd else None

    return total(case.bytes_fwd, case.bytes_bwd), total(case.flops_fwd, case.flops_bwd)


def _finish(rec: dict, case, dims, runner: Runner) -> dict:
    by, fl = _counts(case, dims, rec["pass"]) if case is not None else (None, None)
    rec.update(throughput(by, fl, rec.get("ms"), runner.ceilings))
    ms = rec.get("ms")
    for peer in ("eager", "compile"):
        p = rec.get(f"{peer}_ms")
        rec[f"speedup_vs_{peer}"] = p / ms if p and ms else None
    if "peers" in rec:
        rec["speedup_vs_peers"] = {n: (p / ms if p and ms else None) for n, p in rec["peers"].items()}
    return rec


def _status(rec: dict) -> str:
    if rec.get("status"):
        return rec["status"]
    return "PASS" if rec.get("ok") else "FAIL"


def run_case(case, runner: Runner, overrides: dict[str, int], meta: dict) -> list[dict]:
    import registry

    op = registry.get(case.op)
    dims = dict(case.dims)
    dims.update({k: v for k, v in overrides.items() if k in dims})
    base = dict(meta, op=case.op, family=op.spec.family, variant=case.variant, shapes=dims, dtype=case.dtype,
                derived=False)
    passes = [p for p in PASSES[runner.args.pass_]
              if p == "fwd" or (op.spec.differentiable and case.grad_inputs)]
    try:
        args, params = case.make(dict(dims), runner.device)
    except Exception as e:  # noqa: BLE001
        return [dict(base, **{"pass": passes[0] if passes else "fwd"}, status="ERROR", ok=False,
                     error=f"make() failed: {type(e).__name__}: {e}")]
    out = []
    for p in passes:
        rec = dict(base, **{"pass": p})
        try:
            rec.update((runner.fwd if p == "fwd" else runner.fwdbwd)(op, case, args, params))
            rec["status"] = _status(rec)
        except Skip as e:
            rec.update(status="SKIP", ok=None, error=str(e))
        except Exception as e:  # noqa: BLE001 - one broken op never stops the run
            rec.update(status="ERROR", ok=False, error=f"{type(e).__name__}: {e}")
        log.info("  %s %s%s: %s", case.op, p, f" [{case.variant}]" if case.variant else "",
                 _logline(rec))
        out.append(_finish(rec, case, dims, runner))
    by_pass = {r["pass"]: r for r in out}
    f, fb = by_pass.get("fwd"), by_pass.get("fwd+bwd")
    if f and fb and f.get("ms") and fb.get("ms") and f.get("backend") == fb.get("backend"):
        def diff(key):  # None when noise makes fwd+bwd look no slower than fwd
            a, b = f.get(key), fb.get(key)
            return b - a if a and b and b > a else None

        rec = dict(base, **{"pass": "bwd"}, derived=True, backend=fb["backend"], ms=diff("ms"),
                   graph_ms=diff("graph_ms"), rel_err=fb["rel_err"], ok=fb["ok"], status=fb["status"],
                   notes=["fwd+bwd - fwd" if diff("ms") else "fwd+bwd - fwd <= 0 (timing noise)"]
                   + [n for n in fb.get("notes") or [] if not fb["ok"]])  # (a failure's reasons stay)
        for peer in ("eager", "compile"):
            if f.get(f"{peer}_ms") is not None or fb.get(f"{peer}_ms") is not None:
                rec[f"{peer}_ms"] = diff(f"{peer}_ms")
        both = set(f.get("peers") or {}) & set(fb.get("peers") or {})
        if both:  # a peer timed in both passes: its backward derived the same way as ours
            rec["peers"] = {n: (fb["peers"][n] - f["peers"][n] if f["peers"][n] and fb["peers"][n]
                                and fb["peers"][n] > f["peers"][n] else None) for n in sorted(both)}
        out.insert(out.index(fb), _finish(rec, case, dims, runner))
    del args, params
    _drop()
    return out


def _logline(rec: dict) -> str:
    s = rec["status"]
    if s in ("ERROR", "SKIP"):
        return f"{s}: {rec.get('error')}"
    notes = "; ".join(rec.get("notes") or [])
    return (f"{rec['backend']}, {C.fmt_num(rec.get('ms'))} ms, rel_err {C.fmt_num(rec.get('rel_err'))} {s}"
            + (f" ({notes})" if notes else ""))


# ------------------------------------------------------------------ output


def _pass_label(rec: dict) -> str:
    return "bwd (derived)" if rec.get("derived") else rec["pass"]


def table(records: list[dict]) -> str:
    peers = any(r.get("eager_ms") or r.get("compile_ms") for r in records)
    graphs = any(r.get("graph_ms") for r in records)
    headers = ["op", "variant", "pass", "backend", "shape", "ms"] + (["graph ms"] if graphs else [])
    headers += ["throughput", "%ceil", "rel_err"]
    named = any(r.get("peers") for r in records)
    headers += ["vs eager", "vs compile"] if peers else []
    headers += ["vs named peers (their ms / ours)"] if named else []
    headers.append("result")
    rows = []
    for r in records:
        if r.get("bound") == "compute" and r.get("tflop_s") is not None:
            thr = f"{C.fmt_num(r['tflop_s'])} TFLOP/s"
        elif r.get("gb_s") is not None:
            thr = f"{C.fmt_num(r['gb_s'])} GB/s"
        else:
            thr = "-"
        pct = r.get("pct_of_ceiling")
        row = [r["op"], r.get("variant") or "-", _pass_label(r), r.get("backend") or "-",
               C.fmt_dims(r.get("shapes") or {}) or "-", C.fmt_num(r.get("ms"))]
        row += [C.fmt_num(r.get("graph_ms")) if r.get("graph_ms") else "-"] if graphs else []
        row += [thr,
               f"{pct:.1f}%" if pct is not None else "-", C.fmt_num(r.get("rel_err"), 2)]
        if peers:
            row += [f"{r['speedup_vs_eager']:.2f}x" if r.get("speedup_vs_eager") else
                    ("n/a" if "eager_ms" in r else "-"),
                    f"{r['speedup_vs_compile']:.2f}x" if r.get("speedup_vs_compile") else
                    ("n/a" if "compile_ms" in r else "-")]
        if named:
            sp = r.get("speedup_vs_peers") or {}
            row.append(", ".join(f"{n} {sp[n]:.2f}x" if sp.get(n) else f"{n} n/a" for n in sp) or "-")
        row.append(r["status"])
        rows.append(row)
    return C.format_table(headers, rows)


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.get("pct_of_ceiling") is not None]
    labels = [f"{r['op']}{' [' + r['variant'] + ']' if r.get('variant') else ''} {_pass_label(r)}"
              for r in rows]
    vals = [r["pct_of_ceiling"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.4 * max(len(rows), 1) + 1.5))
    ax.barh(range(len(rows)), vals, color=["tab:green" if r["status"] == "PASS" else "tab:red" for r in rows])
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("% of device ceiling (bandwidth or bf16 compute)")
    dev = records[0]["device"] if records else ""
    ax.set_title(f"tk-bench on {dev}" if rows else f"tk-bench on {dev}: no row has a ceiling")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.1f}%", va="center", fontsize=8)
    fig.tight_layout()
    Path(path).absolute().parent.mkdir(parents=True, exist_ok=True)  # (checked writable up front)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------------- main


def _argparser() -> argparse.ArgumentParser:
    from specs import FAMILIES

    ap = argparse.ArgumentParser(prog="tk-bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=FAMILIES, help="only these families (repeatable)")
    ap.add_argument("--op", action="append", default=[], help="only these ops (repeatable or comma list)")
    ap.add_argument("--shape", action="append", default=[], metavar="k=v,k=v",
                    help="override dims of the selected cases (e.g. T=4096,C=1024)")
    ap.add_argument("--pass", dest="pass_", choices=sorted(PASSES), default="all",
                    help="fwd, fwdbwd (forward+backward) or all (default; bwd rows derived)")
    ap.add_argument("--backend", default="auto", choices=["auto", "torch", "cutile", "cute"],
                    help="force one backend (cases it cannot run are SKIP rows)")
    ap.add_argument("--threads", type=int, default=None, metavar="N",
                    help="torch's intra-op CPU threads for the run; 0: torch's default (one per core). "
                         "Default: 1 on a CPU run (multi-threaded small ops on a shared host stall on "
                         "preempted threads and read tens of times slow), torch's on a GPU run")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions after the warm-up (CPU: 10, "
                                                           "3 for slow calls; CUDA events: 50; triton "
                                                           "do_bench picks its own)")
    cmp = ap.add_mutually_exclusive_group()
    cmp.add_argument("--compare", dest="compare", action="store_true", default=None,
                     help="time torch eager and torch.compile(reference) peers for every row "
                          "(default: only rows whose backend is not torch)")
    cmp.add_argument("--no-compare", dest="compare", action="store_false", help="no peers")
    ap.add_argument("--json", metavar="PATH", help="write one JSON record per measurement ('-' = stdout)")
    ap.add_argument("--plot", metavar="PNG", help="bar chart of %%-of-ceiling (needs the `plot` extra)")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    import registry
    from specs import FAMILIES

    ap = _argparser()
    args = ap.parse_args(argv)
    C.setup_logging()
    try:
        overrides = _parse_shape(args.shape)
    except ValueError as e:
        ap.error(str(e))
    ops = [o for item in args.op for o in (s.strip() for s in item.split(",")) if o]
    unknown = [o for o in ops if o not in registry.names()]
    if unknown:
        ap.error(f"unknown op(s) {unknown}; registered: {', '.join(registry.names())}")
    if args.reps is not None and args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.threads is not None and args.threads < 0:
        ap.error("--threads must be >= 0")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("tk-bench: --plot needs matplotlib: pip install 'tilekernels[plot]'", file=sys.stderr)
            return 2
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        why = C.unwritable(path) if path and path != "-" else None
        if why:
            ap.error(f"{flag} {path}: {why}")
    families = list(args.family or FAMILIES)
    if ops:
        families = [f for f in families if f in {registry.get(o).spec.family for o in ops}]
        if not families:  # (an empty list would mean every family below)
            ap.error(f"--op {ops}: none is in --family {args.family}")
    device = C.default_device()
    threads = args.threads if args.threads is not None else (CPU_THREADS if device.type == "cpu" else 0)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(args, ap, device, ops, overrides, families)
    finally:  # an in-process caller (the tests) gets its own setting back
        torch.set_num_threads(before)


def _run(args, ap, device: torch.device, ops: list[str], overrides: dict[str, int], families: list[str]) -> int:
    import registry

    runner = Runner(args, device)
    meta = {"device": C.device_label(device), "device_info": C.device_info(device),
            "torch": torch.__version__, "git_commit": C.git_commit(), "date": C.now_iso(),
            "timer": runner.timer.method}
    log.info("tk-bench on %s (%s), torch %s, commit %s, timer %s, peers %s",
             meta["device"], device, meta["torch"], C.short_commit(meta["git_commit"]), runner.timer.method,
             {True: "on", False: "off", None: "for non-torch backends"}[runner.compare])
    info = meta["device_info"]
    if (device.type == "cpu" and info["threads"] > 1
            and info.get("load_avg_1min", 0) >= (info.get("cpu_count") or 1) - 0.5):
        log.info("  note: the host is busy (load average %s on %s CPUs): with %s intra-op threads a CPU "
                 "timing can read many times slow (each parallel op waits for a thread that another "
                 "process holds the core of); an idle host or --threads 1 (the default) is steadier",
                 info["load_avg_1min"], info["cpu_count"], info["threads"])

    records: list[dict] = []
    selected = []  # (family, case)
    for fc in C.family_cases(device.type, families):
        if fc.error:
            log.info("  family %s: ERROR %s", fc.family, fc.error)
            records.append(dict(meta, op=f"<{fc.family}>", family=fc.family, variant="cases()", shapes={},
                                dtype=None, status="ERROR", ok=False, error=fc.error, **{"pass": "-"}))
        selected += [(fc.family, c) for c in fc.cases if not ops or c.op in ops]
    known_dims = {d for _, c in selected for d in c.dims}
    bad_keys = sorted(set(overrides) - known_dims)
    if bad_keys and selected:
        ap.error(f"--shape {bad_keys}: no selected case has such a dim (their dims: {sorted(known_dims)})")
    for fam, case in selected:
        try:
            records += run_case(case, runner, overrides, meta)
        except Exception as e:  # noqa: BLE001 - e.g. a case naming an unregistered op
            records.append(dict(meta, op=case.op, family=fam, variant=case.variant, shapes=dict(case.dims),
                                dtype=case.dtype, status="ERROR", ok=False, error=f"{type(e).__name__}: {e}",
                                **{"pass": "-"}))
    broken = {r["family"] for r in records if r["op"].startswith("<")}
    seen_ops = {c.op for _, c in selected}
    no_case = [name for name in (ops or registry.names())
               if name not in seen_ops and registry.get(name).spec.family in set(families) - broken]
    for r in records:
        r.setdefault("backend", None)
        for k in ("ms", "graph_ms", "rel_err", "eager_ms", "compile_ms", "error"):
            r.setdefault(k, None)
        r.setdefault("notes", [])
        r.setdefault("derived", False)
        if "gb_s" not in r:
            _finish(r, None, {}, runner)

    if args.json:
        measured = [r for r in records if r["status"] != "SKIP"]
        C.write_json(measured, args.json)
        log.info("wrote %d record(s) to %s", len(measured), args.json)
    if args.plot:
        plot(records, args.plot)
        log.info("wrote %s", args.plot)
    ceils = [f"{k} {C.fmt_num(c['value'])} {c['unit']} ({c['source']})"
             for k, c in {r["ceiling"]["kind"]: r["ceiling"] for r in records if r.get("ceiling")}.items()]
    failed = [r for r in records if r["status"] in ("FAIL", "ERROR")]
    lines = [f"tk-bench: {meta['device']}, torch {meta['torch']}, commit {C.short_commit(meta['git_commit'])}"
             + (f"; ceilings: {'; '.join(ceils)}" if ceils else ""), table(records)]
    if no_case:
        lines.append(f"no bench case (not run): {', '.join(no_case)}")
    no_pass = sorted({c.op for _, c in selected} - {r["op"] for r in records})
    if no_pass:
        lines.append(f"no {args.pass_} pass (not differentiable, not run): {', '.join(no_pass)}")
    lines.append(f"{len(records)} row(s): {len(failed)} failed" + (
        " (" + ", ".join(f"{r['op']} {r['pass']}" for r in failed) + ")" if failed else ""))
    print("\n".join(lines), file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    if ops and not records:  # every op asked for by name ran nothing
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
