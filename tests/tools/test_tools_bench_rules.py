"""tk-bench's checking and arithmetic where the end-to-end CPU rows cannot see it (each test here failed on a
mutation of tools/bench.py or tools/_measure.py that the rest of the suite let through): in-place (inout) inputs are
compared, a missing or non-tensor result fails, an unwritten gradient reads NaN, the derived bwd row's and the peers'
arithmetic, throughput units, the timer's median and --reps, repeated --shape flags."""
import dataclasses
import json
import types

import pytest
import torch

import registry
import tilekernels.gdn.bench as gdn_bench
import tilekernels.mhc.bench as mhc_bench
from registry import kernels as kernel_table
from tilekernels.gdn import reference as gref
from tools import _common as C
from tools import bench
from tools._measure import Ceiling, Timer, compare, throughput

OP = "mhc_h_aggregate"


def run(tmp_path, *argv):
    path = tmp_path / "out.json"
    rc = bench.main([*argv, "--reps", "1", "--json", str(path)])
    return rc, json.loads(path.read_text())


def _stale_decode(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o, Hk, eps, scale):
    """gdn_decode's right ``o`` from the states as they were, the states never updated (a kernel that forgets its
    in-place writes)."""
    o.copy_(gref.decode(mixed, conv_state.clone(), conv_weight, A_log, dt_bias, ssm_state.clone(), state_indices,
                        Hk=Hk, eps=eps, scale=scale))


@pytest.mark.parametrize("state", [None, torch.float64])
def test_in_place_state_not_updated_fails(tmp_path, capsys, monkeypatch, state):
    """gdn_decode's conv_state / ssm_state are inout: a kernel whose ``o`` is right but whose states are not updated
    fails both rows. A float64 state (which ``upcast`` returns as the same storage) is cloned for the reference:
    sharing it, the reference's update landed in the op's tensor and the comparison read one tensor twice."""
    monkeypatch.setitem(kernel_table._KERNELS, ("gdn_decode", "torch", "fwd"), _stale_decode)
    if state is not None:
        good = gdn_bench.cases("cpu")
        op = registry.get("gdn_decode")

        def wide(d, device, make=good[2].make):
            args, params = make(d, device)
            return C.with_inputs(op.spec, args, params,
                                 lambda n, t: t.to(state) if n == "ssm_state" else t)

        monkeypatch.setattr(gdn_bench, "cases", lambda dt: [dataclasses.replace(good[2], make=wide)])
    rc, recs = run(tmp_path, "--op", "gdn_decode", "--pass", "fwd")
    assert rc == 1 and recs and all(r["status"] == "FAIL" for r in recs), recs
    for r in recs:
        assert any(n.startswith("ssm_state (in place):") for n in r["notes"]), r["notes"]
        assert any(n.startswith("conv_state (in place):") for n in r["notes"]), r["notes"]
        assert not any(n.startswith("o:") for n in r["notes"]), r["notes"]


def test_compare_missing_and_non_tensor_results():
    """A result the op leaves None where the reference has a tensor (or the reverse) fails, as does a non-tensor
    result that differs from the reference's; equal ones pass."""
    t = torch.randn(3, 4)
    assert compare([None], [t.double()], ["y"])[1] is False
    assert compare([t], [None], ["y"])[1] is False
    assert compare([3, "a"], [3, "a"], ["n", "s"]) == (0.0, True, [])
    err, ok, notes = compare([3], [4], ["n"])
    assert ok is False and notes == ["n: int vs reference int"]


def test_unwritten_gradient_is_nan(tmp_path, capsys, monkeypatch):
    """The check's backward runs poisoned as its forward does (the CLI's default is unpoisoned; the tests' conftest
    poisons everything, so it is turned off here): a gradient the kernel never writes is NaN (rel_err inf, null in
    JSON), not whatever the allocator handed out."""
    from tilekernels import _glue

    good = kernel_table._KERNELS[(OP, "torch", "bwd")]
    seen = []

    def half(dout, x, h_pre, dx, dh_pre):
        seen.append(bool(dh_pre.isnan().all()))
        good(dout, x, h_pre, dx, torch.empty_like(dh_pre))

    monkeypatch.setitem(kernel_table._KERNELS, (OP, "torch", "bwd"), half)
    with _glue.poisoned(False):
        rc, recs = run(tmp_path, "--op", OP, "--pass", "fwdbwd")
    assert rc == 1 and [r["status"] for r in recs] == ["FAIL"]
    assert seen[0] is True   # the check's call (the timed calls after it are not poisoned)
    assert recs[0]["rel_err"] is None and any(n.startswith("dh_pre: rel_err inf") for n in recs[0]["notes"])


class _Ceilings:
    def get(self, kind):
        return Ceiling(kind, 500.0 if kind == "bandwidth" else 1000.0, "GB/s" if kind == "bandwidth" else "TFLOP/s",
                       "test")


def test_throughput_units_and_bound():
    """GB/s = bytes / ms / 1e6, TFLOP/s = flops / ms / 1e9; above 100 flops a byte the compute ceiling applies."""
    mem = throughput(2 * 10**9, 10**9, 4.0, _Ceilings())
    assert mem["gb_s"] == pytest.approx(500.0) and mem["tflop_s"] == pytest.approx(0.25)
    assert mem["bound"] == "memory" and mem["pct_of_ceiling"] == pytest.approx(100.0)
    cmp = throughput(10**9, 10**12, 2.0, _Ceilings())
    assert cmp["tflop_s"] == pytest.approx(500.0) and cmp["bound"] == "compute"
    assert cmp["pct_of_ceiling"] == pytest.approx(50.0) and cmp["ceiling"]["kind"] == "compute"


class _StubRunner:
    """Fixed fwd / fwd+bwd records: run_case's derived bwd row and ratios, without timing noise."""

    def __init__(self, fwd, fwdbwd):
        self.args = types.SimpleNamespace(pass_="all")
        self.device, self.ceilings = torch.device("cpu"), _Ceilings()
        self._recs = {"fwd": fwd, "fwd+bwd": fwdbwd}

    def _rec(self, p):
        return dict(self._recs[p], backend="torch", graph_ms=None, notes=list(self._recs[p]["notes"]))

    def fwd(self, op, case, args, params):
        return self._rec("fwd")

    def fwdbwd(self, op, case, args, params):
        return self._rec("fwd+bwd")


def test_derived_bwd_row_and_ratios():
    """bwd = fwd+bwd - fwd for our time, the eager peer's and each named peer's (None where fwd+bwd is no slower);
    its bytes are the backward's, its status and failure notes the fwd+bwd row's; ratios are the peer's ms / ours."""
    c = next(c for c in mhc_bench.cases("cpu") if c.op == OP)
    fwd = dict(ms=1.0, eager_ms=2.0, compile_ms=4.0, rel_err=1e-3, ok=True, notes=[], peers={"p": 3.0, "q": 1.0})
    fb = dict(ms=3.0, eager_ms=7.0, compile_ms=3.0, rel_err=0.5, ok=False, notes=["dx: rel_err 5e-01 over"],
              peers={"p": 9.0, "q": 0.5})
    recs = bench.run_case(c, _StubRunner(fwd, fb), {}, {})
    f, b, fbr = recs
    assert [r["pass"] for r in recs] == ["fwd", "bwd", "fwd+bwd"] and b["derived"] is True
    assert (f["status"], b["status"], fbr["status"]) == ("PASS", "FAIL", "FAIL")
    assert b["ms"] == pytest.approx(2.0) and b["eager_ms"] == pytest.approx(5.0) and b["compile_ms"] is None
    assert b["peers"] == {"p": pytest.approx(6.0), "q": None} and "dx: rel_err 5e-01 over" in b["notes"]
    assert b["bytes"] == c.bytes_bwd(c.dims) and b["rel_err"] == 0.5
    assert fbr["bytes"] == c.bytes_fwd(c.dims) + c.bytes_bwd(c.dims) and f["bytes"] == c.bytes_fwd(c.dims)
    assert f["speedup_vs_eager"] == pytest.approx(2.0) and f["speedup_vs_compile"] == pytest.approx(4.0)
    assert b["speedup_vs_eager"] == pytest.approx(2.5) and b["speedup_vs_peers"] == {"p": pytest.approx(3.0),
                                                                                      "q": None}
    assert fbr["speedup_vs_peers"]["q"] == pytest.approx(0.5 / 3.0)
    slow = dict(fwd, ms=3.5)   # fwd+bwd no slower than fwd (noise): no derived time
    b = bench.run_case(c, _StubRunner(slow, fb), {}, {})[1]
    assert b["ms"] is None and "noise" in b["notes"][0] and b["speedup_vs_eager"] is None


def test_timer_takes_the_median_of_reps():
    """The CPU timer's result is the median of exactly ``reps`` calls, in ms: one slow call does not move it."""
    t = [0.0]
    costs = iter([0.001, 0.001, 0.050, 0.001, 0.002])

    def fn():
        t[0] += next(costs)

    timer = Timer(torch.device("cpu"), reps=5, clock=lambda: t[0])
    assert timer.measure(fn) == pytest.approx(1.0)
    with pytest.raises(StopIteration):   # all five reps were used, no more
        fn()


def test_shape_flags_accumulate():
    """--shape may be repeated; each adds its dims."""
    assert bench._parse_shape(["T=7", "C=33,n=4"]) == {"T": 7, "C": 33, "n": 4}
    with pytest.raises(ValueError):
        bench._parse_shape(["T=7", "C"])


def test_case_without_grad_inputs_runs_forward_only(tmp_path, capsys, monkeypatch):
    """A case of a differentiable op that names no grad_inputs has nothing to differentiate: its fwd row only (not
    an ERROR row for the fwd+bwd pass)."""
    good = next(c for c in mhc_bench.cases("cpu") if c.op == OP)
    monkeypatch.setattr(mhc_bench, "cases", lambda dt: [dataclasses.replace(good, grad_inputs=())])
    rc, recs = run(tmp_path, "--op", OP)
    assert rc == 0 and [(r["pass"], r["status"]) for r in recs] == [("fwd", "PASS")]


def test_ceilings(monkeypatch):
    """The %-of-ceiling denominators: the H200 / H100 SXM table rows (bandwidth and compute not swapped; an H100 PCIe
    or NVL is not an SXM and gets no table row) and the CPU copy ceiling, which counts read + write bytes."""
    from tools import _measure

    monkeypatch.setattr(_measure, "_MEASURED", {})
    cuda = torch.device("cuda", 0)
    for name, bw, tf in (("NVIDIA H200", 4270.0, 773.0), ("NVIDIA H100 80GB HBM3", 3000.0, 750.0)):
        c = _measure.Ceilings(cuda, Timer(cuda), name)
        assert (c.get("bandwidth").value, c.get("compute").value) == (bw, tf), name
        assert c.get("bandwidth").unit == "GB/s" and c.get("compute").unit == "TFLOP/s"
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB"):
        assert _measure.Ceilings(cuda, Timer(cuda), name)._row is None, name
    cpu = torch.device("cpu")
    monkeypatch.setattr(Timer, "__call__", lambda self, fn: 4.0)   # a 4 ms copy of 256 MiB
    c = _measure.Ceilings(cpu, Timer(cpu), "cpu")
    assert c.get("bandwidth").value == pytest.approx(2 * 2**28 / 4.0 / 1e6) and c.get("compute") is None


def test_shape_override_applies_to_the_cases_that_have_the_dim(tmp_path, capsys):
    """--shape C=40 over mhc_h_aggregate (T, n, C) and mhc_sinkhorn (T, n): the sinkhorn row keeps its own dims
    (its record named a C it was never run with)."""
    rc, recs = run(tmp_path, "--op", f"{OP},mhc_sinkhorn", "--pass", "fwd", "--shape", "C=40")
    assert rc == 0
    shapes = {r["op"]: r["shapes"] for r in recs}
    assert shapes[OP]["C"] == 40 and "C" not in shapes["mhc_sinkhorn"]


def test_out_names_label_each_result():
    """Notes name each result by the spec's outputs, extra results by position, and never more names than
    results (the in-place inputs' names follow them)."""
    spec = types.SimpleNamespace(outputs=[types.SimpleNamespace(name="a"), types.SimpleNamespace(name="b")])
    assert bench._out_names(spec, [1]) == ["a"]
    assert bench._out_names(spec, [1, 2, 3]) == ["a", "b", "result 2"]


def test_fmt_num():
    """The table's numbers: a small rel_err is shown, not rounded to 0; None, 0 and non-finite values as such."""
    assert C.fmt_num(1.234e-5) == "1.23e-05" and C.fmt_num(0.0) == "0" and C.fmt_num(None) == "-"
    assert C.fmt_num(float("inf")) == "inf" and C.fmt_num(12.345) == "12.3" and C.fmt_num(123456.0) == "1.23e+05"


def test_auto_backend_that_cannot_run_is_an_error_not_a_skip(tmp_path, capsys, monkeypatch):
    """SKIP is for a backend forced with --backend that cannot run here; when ``auto`` finds no backend for a case,
    that is a failed (ERROR) row and exit status 1."""
    import registry
    from registry import BackendUnavailable

    def none_here(self, bound, backend="auto", fell_back=None):
        raise BackendUnavailable(OP, "backend", "a usable backend", "no backend here (test)")

    monkeypatch.setattr(type(registry.get(OP)), "choose", none_here)
    rc, recs = run(tmp_path, "--op", OP, "--pass", "fwd")
    assert rc == 1 and [r["status"] for r in recs] == ["ERROR"] and "no backend here" in recs[0]["error"]
