"""tk-bench: JSON records, shape overrides, failing checks (wrong or unwritten kernel
results, wrong gradients, a family whose cases() raises), peers, plot, comparison rules,
the warm-up that keeps first-call costs out of the timings."""
import json
import os
import subprocess
import sys

import pytest
import torch

import tilekernels.mhc.bench as mhc_bench
from registry import kernels as kernel_table
from tilekernels.mhc import reference as ref
from tools import _common as C
from tools import bench
from tools._measure import Timer, WarmUp, compare, warm_up


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    """tk-bench runs the CP collectives' rows in this process on a world-size-1 default
    process group it creates and keeps (tilekernels/cp/bench.py, so repeated rows reuse it);
    a test here must not hand that group to the tests after it (they check the no-group
    refusals), so each test tears down a default group it brought up."""
    import torch.distributed as dist

    was_up = dist.is_available() and dist.is_initialized()
    yield
    if not was_up and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

OP = "mhc_h_aggregate"
KEYS = {"op", "family", "variant", "pass", "backend", "shapes", "dtype", "ms", "gb_s", "tflop_s",
        "pct_of_ceiling", "ceiling", "rel_err", "ok", "status", "device", "torch", "git_commit", "date",
        "eager_ms", "compile_ms", "speedup_vs_eager", "speedup_vs_compile", "bytes", "flops"}


def case():
    return next(c for c in mhc_bench.cases(C.default_device().type) if c.op == OP)


def run(tmp_path, *argv):
    path = tmp_path / "out.json"
    rc = bench.main([*argv, "--reps", "2", "--json", str(path)])
    return rc, json.loads(path.read_text())


def test_json_records(tmp_path, capsys):
    rc, recs = run(tmp_path, "--op", OP)
    out = capsys.readouterr().out
    assert rc == 0, out
    c = case()
    assert [r["pass"] for r in recs] == ["fwd", "bwd", "fwd+bwd"]
    for r in recs:
        assert KEYS <= set(r), KEYS - set(r)
        if r["ms"] is None:  # a derived bwd row lost to timing noise
            continue
        assert r["op"] == OP and r["family"] == "mhc" and r["shapes"] == c.dims and r["dtype"] == "bfloat16"
        assert r["backend"] in ("torch", "cutile", "cute")
        assert r["ok"] is True and r["status"] == "PASS"
        assert 0 < r["rel_err"] < 1e-2
        assert r["ms"] > 0 and r["gb_s"] > 0 and r["pct_of_ceiling"] > 0
        assert r["ceiling"]["kind"] == "bandwidth" and r["ceiling"]["value"] > 0 and r["ceiling"]["source"]
        assert r["device"] == C.device_label(C.default_device()) and r["torch"] == torch.__version__
        assert r["git_commit"] and r["date"]
        if r["backend"] == "torch":  # peers only for non-torch backends unless --compare
            assert r["eager_ms"] is None and r["compile_ms"] is None
    fwd, bwd, fb = recs
    assert fwd["bytes"] == c.bytes_fwd(c.dims) and fwd["flops"] == c.flops_fwd(c.dims)
    assert fb["bytes"] == c.bytes_fwd(c.dims) + c.bytes_bwd(c.dims)
    assert bwd["derived"] is True and bwd["bytes"] == c.bytes_bwd(c.dims)
    if fb["ms"] > fwd["ms"]:
        assert bwd["ms"] == pytest.approx(fb["ms"] - fwd["ms"])
    else:
        assert bwd["ms"] is None and "noise" in bwd["notes"][0]
    assert fwd["gb_s"] == pytest.approx(fwd["bytes"] / fwd["ms"] / 1e6)
    assert fwd["pct_of_ceiling"] == pytest.approx(100 * fwd["gb_s"] / fwd["ceiling"]["value"], rel=1e-2)
    # the table is printed last, with a header row and one row per record
    assert "rel_err" in out and out.count("PASS") == 3 and "bwd (derived)" in out


def test_shape_override_and_fwd_only(tmp_path, capsys):
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd", "--shape", "T=7,C=33")
    assert rc == 0
    assert [r["pass"] for r in recs] == ["fwd"]
    dims = dict(case().dims, T=7, C=33)
    assert recs[0]["shapes"] == dims and recs[0]["bytes"] == case().bytes_fwd(dims)


def test_wrong_forward_result_fails(tmp_path, capsys, monkeypatch):
    def wrong(x, h_pre, out):
        out.copy_(ref.h_aggregate(x, h_pre) * 1.05)

    monkeypatch.setitem(kernel_table._KERNELS, (OP, "torch", "fwd"), wrong)
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd")
    out = capsys.readouterr().out
    assert rc == 1
    assert recs[0]["ok"] is False and recs[0]["status"] == "FAIL" and recs[0]["rel_err"] > 1e-2
    assert "FAIL" in out and "1 failed" in out


def test_unwritten_output_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(kernel_table._KERNELS, (OP, "torch", "fwd"), lambda x, h_pre, out: None)
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd")
    assert rc == 1 and recs[0]["status"] == "FAIL" and recs[0]["rel_err"] is None  # inf -> null


def test_wrong_gradient_fails_fwdbwd_only(tmp_path, capsys, monkeypatch):
    good = kernel_table._KERNELS[(OP, "torch", "bwd")]

    def wrong(dout, x, h_pre, dx, dh_pre):
        good(dout, x, h_pre, dx, dh_pre)
        dh_pre.mul_(-1)

    monkeypatch.setitem(kernel_table._KERNELS, (OP, "torch", "bwd"), wrong)
    rc, recs = run(tmp_path, "--op", OP)
    assert rc == 1
    status = {r["pass"]: r["status"] for r in recs}
    assert status == {"fwd": "PASS", "bwd": "FAIL", "fwd+bwd": "FAIL"}
    fb = next(r for r in recs if r["pass"] == "fwd+bwd")
    assert any(n.startswith("dh_pre:") for n in fb["notes"])


def test_cases_that_raise_are_a_failed_row(tmp_path, capsys, monkeypatch):
    def boom(device_type):
        raise RuntimeError("no cases today")

    monkeypatch.setattr(mhc_bench, "cases", boom)
    rc, recs = run(tmp_path, "--family", "mhc", "--pass", "fwd")
    out = capsys.readouterr().out
    assert rc == 1
    err = [r for r in recs if r["status"] == "ERROR"]
    assert err and err[0]["op"] == "<mhc>" and "no cases today" in err[0]["error"]
    assert "<mhc>" in out and "ERROR" in out


def test_make_that_raises_is_a_failed_row_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    import dataclasses

    good = case()

    def bad_make(d, device):
        raise ValueError("cannot build inputs")

    monkeypatch.setattr(mhc_bench, "cases", lambda dt: [dataclasses.replace(good, make=bad_make, variant="broken"),
                                                        good])
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd")
    assert rc == 1
    assert [(r["variant"], r["status"]) for r in recs] == [("broken", "ERROR"), ("", "PASS")]


def test_forced_backend_unavailable_is_skipped(tmp_path, capsys):
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd", "--backend", "cute")
    out = capsys.readouterr().out
    assert rc == 0 and recs == []  # SKIP rows are not measurements
    assert "SKIP" in out


def test_peers_with_compare(tmp_path, capsys, monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda f: compiled.append(f) or f)
    rc, recs = run(tmp_path, "--op", OP, "--compare")
    assert rc == 0
    assert compiled and all(f is ref.h_aggregate for f in compiled)
    for r in recs:
        if r["derived"]:  # differences of noisy timings; may be None
            continue
        assert r["eager_ms"] > 0 and r["compile_ms"] > 0
        assert r["speedup_vs_eager"] == pytest.approx(r["eager_ms"] / r["ms"])
    assert "vs compile" in capsys.readouterr().out


def test_failing_compile_peer_is_na(tmp_path, capsys, monkeypatch):
    def broken(f):
        def g(*a, **k):
            raise RuntimeError("inductor unavailable")
        return g

    monkeypatch.setattr(torch, "compile", broken)
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd", "--compare")
    assert rc == 0 and recs[0]["compile_ms"] is None and recs[0]["speedup_vs_compile"] is None
    assert "n/a" in capsys.readouterr().out


def test_named_peers(tmp_path, capsys, monkeypatch):
    """A case's named peers are timed in the same harness: a backward peer in fwd and fwd+bwd
    (its derived bwd too, on the same leaves, backpropagating the same grad outputs), a
    fwd-only peer in fwd only, a peer that fails is n/a; the table has their ratios."""
    import dataclasses

    from tilekernels.benchcase import Peer

    seen = []

    def like_ours(args, params):
        def call():
            out = ref.h_aggregate(*args, **params)
            seen.append(any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))
            return out
        return call

    def broken(args, params):
        raise ImportError("peer package not installed")

    peers = (Peer("twin", like_ours, devices=("cpu", "cuda")),
             Peer("fwd only", like_ours, backward=False, devices=("cpu", "cuda")),
             Peer("absent", broken, devices=("cpu", "cuda")),
             Peer("elsewhere", like_ours, devices=("xpu",)))
    good = case()
    monkeypatch.setattr(mhc_bench, "cases", lambda dt: [dataclasses.replace(good, peers=peers)])
    rc, recs = run(tmp_path, "--op", OP)
    out = capsys.readouterr().out
    assert rc == 0, out
    by = {r["pass"]: r for r in recs}
    assert set(by["fwd"]["peers"]) == {"twin", "fwd only", "absent"}
    assert set(by["fwd+bwd"]["peers"]) == {"twin", "absent"}
    assert by["fwd"]["peers"]["twin"] > 0 and by["fwd+bwd"]["peers"]["twin"] > 0
    assert by["fwd"]["peers"]["absent"] is None and by["fwd"]["speedup_vs_peers"]["absent"] is None
    assert by["fwd"]["speedup_vs_peers"]["twin"] == pytest.approx(by["fwd"]["peers"]["twin"] / by["fwd"]["ms"])
    assert set(by["bwd"].get("peers", {})) == {"twin", "absent"}
    assert True in seen and False in seen  # fwd+bwd steps got the leaves, fwd steps did not
    assert "vs named peers" in out and "absent n/a" in out and "twin " in out
    rc, recs = run(tmp_path, "--op", OP, "--no-compare")
    assert rc == 0 and all("peers" not in r for r in recs)


def test_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--op", "no_such_op"])
    assert e.value.code == 2 and "unknown op" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(["--shape", "T=abc"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        bench.main(["--op", OP, "--shape", "Q=3"])
    assert e.value.code == 2 and "no selected case has such a dim" in capsys.readouterr().err


def test_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert bench.main(["--op", OP, "--plot", str(tmp_path / "p.png")]) == 2
    assert "pip install 'tilekernels[plot]'" in capsys.readouterr().err


def test_unwritable_json_path_is_refused_before_the_run(tmp_path, capsys):
    # it was written after every row had run: a traceback, exit 1 and no table for a run whose checks all passed
    afile = tmp_path / "afile"
    afile.write_text("")
    for path in (afile / "x.json", tmp_path):  # under a file; a directory
        with pytest.raises(SystemExit) as e:
            bench.main(["--op", OP, "--pass", "fwd", "--reps", "1", "--json", str(path)])
        out = capsys.readouterr()
        assert e.value.code == 2 and f"--json {path}" in out.err and "tk-bench:" not in out.out, out
    assert C.unwritable(str(tmp_path / "new" / "dir" / "x.json")) is None  # missing folders are made
    assert not (tmp_path / "new").exists()


def test_plot_makes_its_folder(tmp_path, capsys, monkeypatch):
    # the up-front check lets a missing folder through (it is made); the plot's savefig did not make it: a
    # FileNotFoundError after the whole run (a review's find). A stand-in matplotlib: the CI has none.
    import types

    class Fig:
        def tight_layout(self):
            pass

        def savefig(self, path, dpi=None):
            with open(path, "wb") as f:
                f.write(b"\x89PNG")

    class Ax:
        def __getattr__(self, name):
            return lambda *a, **k: None

    plt = types.ModuleType("matplotlib.pyplot")
    plt.subplots = lambda **k: (Fig(), Ax())
    plt.close = lambda *a: None
    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda *a: None
    mpl.pyplot = plt
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    p = tmp_path / "new" / "dir" / "p.png"
    assert bench.main(["--op", OP, "--pass", "fwd", "--reps", "1", "--plot", str(p)]) == 0
    assert p.read_bytes() == b"\x89PNG"
    link = tmp_path / "dangling.json"
    link.symlink_to(tmp_path / "missing" / "x.json")
    assert "symlink to a missing file" in C.unwritable(str(link))


def test_cp_shape_that_cannot_be_run_as_given_is_a_failed_row(tmp_path, capsys):
    # T=4100 with cp=4 was rounded down to 4096 tokens and recorded as T=4100 (bytes too), status PASS
    rc, recs = run(tmp_path, "--op", "thd_cp_a2a_perm", "--shape", "T=4100,cp=4")
    assert rc == 1 and [r["status"] for r in recs] == ["ERROR"], recs
    assert "T=4100 must be a multiple of 8" in recs[0]["error"]


def test_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    p = tmp_path / "p.png"
    assert bench.main(["--op", OP, "--pass", "fwd", "--reps", "1", "--plot", str(p)]) == 0
    assert p.read_bytes()[:4] == b"\x89PNG"


def test_compare_rules():
    f = torch.randn(4, 5)
    ok = compare([f.bfloat16()], [f.double()], ["y"])
    assert ok[1] is True and 0 < ok[0] < 1e-2
    assert compare([f], [f.double() * 1.001], ["y"])[1] is False  # fp32 tolerance 1e-5
    i = torch.arange(6)
    assert compare([i, None], [i.clone(), None], ["idx", "opt"]) == (0.0, True, [])
    j = i.clone()
    j[3] = 4
    err, good, notes = compare([j], [i], ["idx"])
    assert good is False and "exact" in notes[0]
    q = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn)
    assert compare([q], [q.clone()], ["data"])[1] is True
    assert compare([f], [f.double(), f.double()], ["y"])[1] is False
    # exact (an op that only moves elements): two swapped bf16 elements are inside bf16's tolerance, not bitwise
    b = torch.randn(4096, 32).bfloat16()
    b[3, 5], b[40, 5] = 1.0, -1.0
    s = b.clone()
    s[[3, 40], 5] = s[[40, 3], 5]  # rel_err sqrt(8) / ~362: ~8e-3
    assert compare([s], [b.double()], ["out"])[1] is True
    err, good, notes = compare([s], [b.double()], ["out"], exact=True)
    assert good is False and 0 < err < 1 and "exact" in notes[0]
    assert compare([b], [b.double()], ["out"], exact=True) == (0.0, True, [])
    # a move that loses a zero's sign: rel_err 0, and still not bitwise (float64 reference or same dtype)
    z = b.clone()
    z[7, 7] = -0.0
    zz = z.clone()
    zz[7, 7] = 0.0
    assert compare([zz], [z.double()], ["out"], exact=True)[1] is False
    assert compare([zz], [z], ["out"], exact=True)[1] is False
    # a NaN in the reference only: rel_err NaN stays the worst (max() dropped it for 0.0), whatever comes after
    w = f.double().clone()
    w[0, 0] = float("nan")
    err, good, _ = compare([f, f], [w, f.double()], ["a", "b"])
    assert good is False and err != err


def test_moving_ops_are_checked_bitwise(tmp_path, capsys, monkeypatch):
    """thd_cp_to_hp's bench case is exact: a forward that swaps two elements of one feature column (rel_err ~4e-3,
    under bf16's 1e-2) fails, and so does the same swap in the backward (its fwd row still passes); the derived bwd
    row keeps the failure's reason."""
    import tilekernels.cp.ops  # noqa: F401 (registers the torch kernels)

    op = "thd_cp_to_hp"

    def swapping(kernel):
        def wrong(x, plan, group, out):
            kernel(x, plan, group, out)
            j = int((out[5] != out[900]).nonzero()[0])   # (column 7 held two equal bf16 values ~0.1% of runs: no swap)
            out[[5, 900], j] = out[[900, 5], j].clone()
        return wrong

    for p, want in (("fwd", {"fwd": "FAIL", "bwd": "FAIL", "fwd+bwd": "FAIL"}),
                    ("bwd", {"fwd": "PASS", "bwd": "FAIL", "fwd+bwd": "FAIL"})):
        with monkeypatch.context() as m:
            m.setitem(kernel_table._KERNELS, (op, "torch", p), swapping(kernel_table._KERNELS[(op, "torch", p)]))
            rc, recs = run(tmp_path, "--op", op)
        assert rc == 1 and {r["pass"]: r["status"] for r in recs} == want
        assert all(r["rel_err"] < 1e-2 for r in recs if r["status"] == "FAIL")
        assert any("exact" in n for n in next(r for r in recs if r["pass"] == "bwd")["notes"])


def test_selections_that_run_nothing_are_an_error(capsys):
    """--op outside --family is a usage error (an empty family list meant every family); a named op with no pass
    under --pass runs nothing, says so, and exits 2."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--op", "thd_cp_a2a_perm", "--family", "mhc"])
    assert e.value.code == 2 and "none is in --family" in capsys.readouterr().err
    assert bench.main(["--op", "thd_cp_a2a_perm", "--pass", "fwd+bwd", "--reps", "1"]) == 2
    assert "no fwd+bwd pass (not differentiable, not run): thd_cp_a2a_perm" in capsys.readouterr().out


def test_cli_subprocess():
    env = dict(os.environ, PYTHONPATH=str(C.REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tools.bench", "--op", OP, "--pass", "fwd", "--reps", "1"],
                       cwd=C.REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout.splitlines()[-2] and "tk-bench on" in p.stderr


# ------------------------------------------------------------------ warm-up


class FakeClock:
    """A clock that only the timed callables move: timings become exact."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def costly(clock: FakeClock, costs_s):
    """A callable whose k-th call takes ``costs_s(k)`` seconds (k from 1) on ``clock``."""
    calls = [0]

    def fn():
        calls[0] += 1
        clock.t += costs_s(calls[0])

    return fn, calls


@pytest.mark.parametrize("slow_calls", [1, 3, 5])
def test_slow_first_calls_stay_out_of_the_timing(slow_calls):
    # a compile / lazy initialisation that lasts several calls: 50 ms each, then 1 ms.
    # (Two fixed warm-up calls timed 5 slow calls at ~25 ms: the reps were sized from them.)
    clock = FakeClock()
    fn, calls = costly(clock, lambda k: 0.05 if k <= slow_calls else 0.001)
    timer = Timer(torch.device("cpu"), clock=clock)
    assert timer(fn) == pytest.approx(1.0)
    w = timer.last_warmup
    assert w.settled and w.first_ms == pytest.approx(50.0) and w.per_call_ms == pytest.approx(1.0)
    assert w.calls > slow_calls and calls[0] > w.calls  # timed calls came after the warm-up


def test_warm_up_waits_for_a_decaying_time():
    clock = FakeClock()
    fn, _ = costly(clock, lambda k: 0.001 + 0.2 * 0.5 ** k)  # 100 ms, 50 ms, ... -> 1 ms
    timer = Timer(torch.device("cpu"), reps=5, clock=clock)
    assert timer(fn) == pytest.approx(1.0, rel=0.05)
    assert timer.last_warmup.settled


def test_warm_up_that_never_settles_is_capped_and_reported():
    clock = FakeClock()
    fn, calls = costly(clock, lambda k: 0.001 * 1.3 ** min(k, 60))  # keeps getting slower
    w = warm_up(fn, clock=clock, max_s=2.0)
    assert not w.settled and w.seconds < 20 and w.calls == calls[0]


def test_warm_up_syncs_after_every_call():
    # on CUDA the sync is torch.cuda.synchronize: the first launch (and its compile) is
    # finished inside the warm-up, before do_bench or the CUDA events start
    clock, syncs = FakeClock(), []
    fn, calls = costly(clock, lambda k: 0.5 if k == 1 else 0.002)
    w = warm_up(fn, lambda: syncs.append(calls[0]), clock=clock)
    assert w.settled and syncs == list(range(1, w.calls + 1))


def test_unsettled_timing_is_noted_in_the_record(tmp_path, capsys, monkeypatch):
    def unsettled(self, fn):
        fn()
        self.last_warmup = WarmUp(calls=1, seconds=0.1, first_ms=100.0, per_call_ms=100.0, settled=False)
        return self.last_warmup

    monkeypatch.setattr(Timer, "warm_up", unsettled)
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd")
    assert rc == 0 and recs[0]["status"] == "PASS"
    assert any("not settled" in n for n in recs[0]["notes"])


def test_threads_option(tmp_path, capsys):
    # a CPU run defaults to one intra-op thread, --threads N sets N; either way main() gives the
    # caller its own setting back
    before = torch.get_num_threads()
    cpu = C.default_device().type == "cpu"
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd")
    assert rc == 0 and torch.get_num_threads() == before
    if cpu:
        assert recs[0]["device_info"]["threads"] == 1
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd", "--threads", "2")
    assert rc == 0 and torch.get_num_threads() == before
    if cpu:
        assert recs[0]["device_info"]["threads"] == 2
    with pytest.raises(SystemExit) as e:
        bench.main(["--threads", "-1"])
    assert e.value.code == 2


def test_case_oracle_replaces_the_reference(tmp_path, capsys, monkeypatch):
    """mhc_post_pre's case brings its own float64 oracle (its pre step reads ``out`` rounded to
    bf16, by definition): with it every result and gradient passes at its dtype's tolerance;
    with the plain float64 reference instead, the fp32 results derived from the rounded ``out``
    fail the fp32 tolerance, so the oracle is what the check needs, not a loosening."""
    import dataclasses

    pp = next(c for c in mhc_bench.cases("cpu") if c.op == "mhc_post_pre")
    assert pp.oracle is not None
    rc, recs = run(tmp_path, "--op", "mhc_post_pre", "--shape", "T=9,C=40")
    assert rc == 0 and {r["status"] for r in recs} == {"PASS"}
    monkeypatch.setattr(mhc_bench, "cases", lambda dt: [dataclasses.replace(pp, oracle=None)])
    rc, recs = run(tmp_path, "--op", "mhc_post_pre", "--shape", "T=9,C=40", "--pass", "fwd")
    assert rc == 1 and recs[0]["status"] == "FAIL"
    assert any(n.startswith(("h_post_next:", "h_res_next:")) for n in recs[0]["notes"])


def test_commit_marks_a_tree_that_differs_from_head(tmp_path, monkeypatch):
    """The records' commit must not claim a tree it was not run on: an edited checkout (or a GPU
    host's copy beside a stale .git) gets "-dirty"; $TILEKERNELS_COMMIT wins over both."""
    monkeypatch.delenv("TILEKERNELS_COMMIT", raising=False)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.txt").write_text("a\n")
    subprocess.run(git + ["-C", str(tmp_path), "add", "f.txt"], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-q", "-m", "x"], check=True)
    clean = C.git_commit(tmp_path)
    assert len(clean) == 40 and "-dirty" not in clean
    (tmp_path / "f.txt").write_text("b\n")
    assert C.git_commit(tmp_path) == clean + "-dirty"
    assert C.short_commit(clean + "-dirty") == clean[:12] + "-dirty" and C.short_commit(clean) == clean[:12]
    monkeypatch.setenv("TILEKERNELS_COMMIT", "abc")
    assert C.git_commit(tmp_path) == "abc"


def test_cp_group_is_destroyed_at_exit(tmp_path):
    """tk-bench's world-size-1 group (made for the CP collectives) is destroyed at exit and its file store's folder
    removed: an NCCL group left alive warned at exit on the GPU (session 57, H100). Gloo here, the same exit hook."""
    code = ("import json, os, tempfile, torch, torch.distributed as dist\n"
            "from tilekernels.cp import bench\n"
            "bench._single_process_group(torch.device('cpu'))\n"
            "assert dist.is_initialized()\n"
            "print(json.dumps(os.listdir(tempfile.gettempdir())))\n")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    made = [n for n in json.loads(p.stdout.strip().splitlines()[-1]) if n.startswith("tk-bench-cp-")]
    assert len(made) == 1, p.stdout
    assert not (tmp_path / made[0]).exists()  # removed by the exit hook
    assert "destroy_process_group() was not called" not in p.stderr
