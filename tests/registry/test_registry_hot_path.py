"""The registry as the fast path: no host sync, torch.compile and CUDA graphs
through ``registry.get(name)(...)``.

CPU part: no value rule of any shipped spec reads a non-CPU tensor on the host
(every value rule is exercised with host reads forbidden and the tensors
treated as device tensors: the rules then run as tensor ops into an async
assert, which refuses bad values with a message naming op, tensor and rule),
and a compiled registry call validates at trace time.

GPU part (every op but the CP collectives, on the small tk-bench shapes):
under ``torch.cuda.set_sync_debug_mode("error")``, an eager call, a CUDA-graph
capture of the forward and of forward+backward and their replays (on fresh
inputs copied into the captured tensors) equal eager results bitwise, and
``torch.compile(fullgraph=True)`` of the registry call equals eager, forward alone and forward +
backward (ops with gradients).

Both (the GPU part where a device is lent): compiled calls keep batch dims dynamic (one graph for
3 sizes), ``torch.export`` takes the batch dim as a ``Dim``, and ``torch.autocast`` leaves every
result bitwise unchanged.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import registry
import registry.exprs as E  # (where the host reads of tensor values live)
import registry.validate as V
from registry import SpecError
from specs import all_specs

from registry_gpu_helpers import (CASES, COLLECTIVES, DEVICES, IDS, _outs, autocast_check, batch_sizes, compiled_fwd_bwd_check,
                                  export_check, fake_mode_check, misaligned_inputs_check, nan_propagation_check,
                                  varying_batch_compile_check)
from tilekernels.testing import assert_close

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ---------------------------------------------------------------- CPU: value rules never read device data


@contextlib.contextmanager
def _as_device_tensors(monkeypatch):
    """Every tensor counts as a device tensor, and a host read of tensor values fails."""
    monkeypatch.setattr(V, "_on_host", lambda t: t is None)

    def no_host_read(t):
        raise AssertionError("a value rule read tensor data on the host")
    monkeypatch.setattr(E, "_host_values", no_host_read)
    asserts = []
    real = torch._assert_async
    monkeypatch.setattr(torch, "_assert_async", lambda t, msg: asserts.append(msg) or real(t, msg))
    registry.clear_caches()
    yield asserts
    registry.clear_caches()


def test_every_value_rule_is_lowered_to_the_device(monkeypatch):
    value_ops = [s.name for s in all_specs() if V.split_rules(s)[1] and s.name not in COLLECTIVES]
    assert set(value_ops) >= {"grouped_linear", "grouped_mlp_mxfp8", "gdn_pre_gated", "gdn_decode"}
    with _as_device_tensors(monkeypatch) as asserts:
        for case in CASES:
            if case.op not in value_ops:
                continue
            op = registry.get(case.op)
            args, params = case.make(case.dims, torch.device("cpu"))
            names = [t.name for t in op.spec.inputs]
            read = {n for c in V.split_rules(op.spec)[1] for n in V.value_tensors(c.expr, names)}
            given = any(n in read and a is not None for n, a in zip(names, args))
            n = len(asserts)
            op(*args, **params)
            op(*args, **params)  # the very same, unmodified tensors: checks already queued
            assert len(asserts) == n + (1 if given else 0), case.op
            if given:  # a new tensor object, or an in-place write (version bump): checked again
                i = next(i for i, (nm, a) in enumerate(zip(names, args)) if nm in read and a is not None)
                op(*args[:i], args[i].clone(), *args[i + 1:], **params)
                args[i].add_(0)
                op(*args, **params)
                assert len(asserts) == n + 3, case.op
                assert asserts[-1].startswith(f"{case.op}: tensor ")


def test_device_checks_refuse_bad_values(monkeypatch):
    from tilekernels.gdn import bench as gb

    with _as_device_tensors(monkeypatch):
        op = registry.get("grouped_linear")
        x, w = torch.randn(64, 32), torch.randn(2, 8, 32)
        op(x, w, torch.tensor([32, 32]))
        with pytest.raises(RuntimeError, match=r"grouped_linear: tensor m_splits: a value rule failed on the device: .*add up to the token"):
            op(x, w, torch.tensor([32, 40]))
        m, w32 = torch.tensor([16, 48]), torch.randn(2, 32, 32)  # mxfp8 wgrad needs multiples of 32
        with torch.no_grad():
            op(x, w32, m, precision="mxfp8")
        with pytest.raises(RuntimeError, match=r"grouped_linear: tensor m_splits: .*all_div\(values\(m_splits\), 32\)"):
            op(x, w32.requires_grad_(), m, precision="mxfp8")  # same tensor: the gated rule now applies
        d = dict(Hk=2, Hv=4, dk=8, dv=8, W=4, B=3, N=4)
        (mixed, conv, cw, A, dt, ssm, idx), p = gb._decode_make(d, torch.device("cpu"))
        dec = registry.get("gdn_decode")
        dec(mixed, conv, cw, A, dt, ssm, torch.tensor([2, -1, 0], dtype=torch.int32), **p)
        for bad in ([1, 1, 0], [0, 1, 4], [0, -2, 1]):
            snap = (conv.clone(), ssm.clone())
            with pytest.raises(RuntimeError, match=r"gdn_decode: tensor state_indices: .*state_indices"):
                dec(mixed, conv, cw, A, dt, ssm, torch.tensor(bad, dtype=torch.int32), **p)
            assert torch.equal(conv, snap[0]) and torch.equal(ssm, snap[1])  # refused before any write


def test_cp_value_rules_on_the_device_hold_for_int32_cu_seqlens(monkeypatch):
    """thd_cp_a2a_perm takes a CUDA cu_seqlens too (test_cp_cutile_pack's world-1 child); its rules then
    run as tensor ops. ``max(values(cu_seqlens)) < 2**60`` on int32 values once compared with 2**60 cast to
    int32 (0) and refused every call on the GPU (session 66). Both index dtypes, lowered as on a GPU;
    a bad cu_seqlens is still refused there."""
    from tilekernels.cp import bench as cb

    with _as_device_tensors(monkeypatch) as asserts:
        op = registry.get("thd_cp_a2a_perm")
        for dt in (torch.int32, torch.int64):
            cu = cb.cu_seqlens(512, 7, 4, "cpu").to(dt)
            n = len(asserts)
            tp = op(cu, cp=2, total_tokens=512)[0]
            assert len(asserts) == n + 1 and torch.equal(tp.sort().values, torch.arange(512))
            for bad in ((cu - 1), cu.flip(0), cu + torch.arange(8, dtype=dt)):
                with pytest.raises(RuntimeError, match=r"thd_cp_a2a_perm: tensor cu_seqlens: a value rule failed"):
                    op(bad, cp=2)


def test_meta_tensor_values_are_a_spec_error():
    op = registry.get("grouped_linear")
    meta = torch.device("meta")
    with pytest.raises(SpecError, match="grouped_linear: tensor m_splits: expected a tensor with data"):
        op(torch.randn(64, 32), torch.randn(2, 8, 32), torch.empty(2, dtype=torch.int64, device=meta))


def test_compiled_registry_call_validates_at_trace_time():
    op = registry.get("mhc_h_aggregate")
    f = torch.compile(lambda x, h: op(x, h), fullgraph=True)
    x, h = torch.randn(5, 4, 16), torch.rand(5, 4)
    assert torch.equal(f(x, h), op(x, h))
    x, h = torch.randn(9, 4, 16), torch.rand(9, 4)  # a new T: dynamic, same graph family
    assert torch.equal(f(x, h), op(x, h))
    with pytest.raises(Exception, match=r"SpecError"):  # fullgraph: refused while tracing
        f(torch.randn(9, 4, 16), torch.rand(9, 3))
    g0 = torch.compile(lambda x, h: op(x, h))  # otherwise the refused frame runs eagerly: the message
    with pytest.raises(SpecError, match=r"mhc_h_aggregate: tensor h_pre: expected shape \[T, n\]"):
        g0(torch.randn(9, 4, 16), torch.rand(9, 3))
    gl = registry.get("grouped_linear")
    g = torch.compile(lambda x, w, m: gl(x, w, m), fullgraph=True)
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(2, 8, 32, requires_grad=True)
    y = g(x, w, torch.tensor([32, 32]))
    y.backward(torch.ones_like(y))
    assert x.grad is not None and w.grad is not None
    with pytest.raises(RuntimeError, match="grouped_linear: tensor m_splits"):  # value rule in the graph
        g(x, w, torch.tensor([16, 32]))
    # traced: one assert a rule, so the refusal names the rule that failed (the sum; min holds)
    with pytest.raises(RuntimeError, match=r"grouped_linear: tensor m_splits: value rule "
                                           r"'sum\(values\(m_splits\)\) == M' failed"):
        g(x, w, torch.tensor([16, 32]))


def test_cache_hit_does_no_validation_work(monkeypatch):
    """A repeated call evaluates no spec expression, binds nothing and asks no backend
    (its cost is measured by benchmarks/host_overhead.py; timing asserts flake on CI)."""
    op = registry.get("mhc_h_post_bda")
    args = (torch.softmax(torch.randn(3, 4, 4), -1), torch.randn(3, 4, 8), torch.rand(3, 4), torch.randn(3, 8),
            torch.randn(8))
    op(*args)
    work = []
    for mod, name in ((V, "evaluate"), (registry.core, "bind"), (registry.core, "backend_status")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name, **k: work.append(_n) or _r(*a, **k))
    out = op(*args)
    assert work == [] and torch.equal(out, op.entry(*args, backend="torch"))
    op(*args[:4], args[4].clone())
    assert work == []  # new data, same metadata: still a hit


def test_host_value_rules_are_not_rechecked_for_the_same_tensor(monkeypatch):
    """A CPU m_splits passed again unmodified is not re-checked (one per step for every layer;
    only its bytes are compared, ``guards.host_values``); an in-place write (version bump) or
    another tensor is checked again, and refused if bad."""
    registry.clear_caches()
    op = registry.get("grouped_linear")
    x, w, m = torch.randn(64, 32), torch.randn(2, 8, 32), torch.tensor([32, 32])
    op(x, w, m)
    reads = []
    real = E._host_values
    monkeypatch.setattr(E, "_host_values", lambda t: reads.append(1) or real(t))
    op(x, w, m)
    assert reads == []
    m[1] = 40  # in place: version bump
    with pytest.raises(SpecError, match="m_splits must add up to the token count M"):
        op(x, w, m)
    assert reads
    with pytest.raises(SpecError, match="m_splits must add up to the token count M"):
        op(x, w, m)  # a refused tensor is never remembered as checked
    registry.clear_caches()


# ---------------------------------------------------------------- GPU: sync-free, graphs, compile


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_graph_through_registry(case):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", f"import registry_gpu_helpers as h; h.graph_check(h.CASES[{CASES.index(case)}])"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{case.op}: graph check failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compile_through_registry(case):
    torch._dynamo.reset()
    dev = torch.device("cuda")
    op = registry.get(case.op)
    args, params = case.make(case.dims, dev)
    if case.op == "gdn_decode":  # in place: compare on copies
        eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    else:
        eager_args = args
    f = torch.compile(lambda *a: op(*a, **params), fullgraph=True)
    got, want = _outs(f(*args)), _outs(op(*eager_args, **params))
    for a, b in zip(got, want):  # the suite's tolerance table; e4m3 and integers bitwise
        assert a.dtype == b.dtype and a.shape == b.shape
        exact = not a.is_floating_point() or a.element_size() == 1
        assert_close(a, b, "exact" if exact else None, what=f"{case.op}: compiled vs eager")


GRAD_CASES = [c for c in CASES if c.grad_inputs]


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", GRAD_CASES, ids=[i for c, i in zip(CASES, IDS) if c.grad_inputs])
def test_compile_fwd_bwd_through_registry(case):
    """Forward and backward of the compiled registry call (the custom ops, their GPU kernels) equal eager."""
    compiled_fwd_bwd_check(case)


# ---------------------------------------------------------------- drop-in checks, on the CPU and (owed) on a GPU

# DEVICES (registry_gpu_helpers): the CPU runs go through the torch backend, the cuda runs through the GPU backends.


@pytest.mark.parametrize("dynamic", [None, True], ids=["auto-dynamic", "dynamic"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compile_keeps_batch_dims_dynamic(case, device, dynamic):
    """A compiled model calls an op at a new T / M / B every step (THD packing, MoE routing,
    continuous batching). Its validation is traced (shapes become guards), so anything in it that
    reads a batch size as a plain int would specialize it: one graph per size, until dynamo's
    recompile limit sends the frame back to eager. So 3 sizes take 2 graphs (the first size
    specialized, then one dynamic graph) or 1 with ``dynamic=True`` (float params are then
    SymFloats too), each call equal to eager (on a GPU: the GPU backends' custom ops, and the
    registry's backend choice traced with symbolic sizes)."""
    graphs = varying_batch_compile_check(case, device, dynamic)
    assert graphs == (1 if dynamic else 2), (f"{case.op}: {graphs} graphs for 3 {batch_sizes(case)[0]} sizes "
                                             f"(dynamic={dynamic}): a batch dim was specialized")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compile_reduce_overhead_gpu(case):
    """torch.compile(mode="reduce-overhead") (Inductor records CUDA graphs around the kernels; gdn_decode's
    in-place states make it skip them) at 3 batch sizes, each call equal to eager."""
    graphs = varying_batch_compile_check(case, "cuda", None, mode="reduce-overhead")
    assert graphs == 2, f"{case.op}: {graphs} graphs"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_export_keeps_batch_dims_dynamic(case):
    """torch.export (what a serving stack ships): the batch dim exported as a Dim needs no bound
    (no backend limit this machine cannot run is traced, no [B - 1] intermediate in a value rule
    asks for B >= 3), and the program equals eager at other sizes. CPU: the torch backend."""
    export_check(case, "cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_autocast_leaves_results_unchanged(case, device):
    """Under torch.autocast(device, bfloat16), forward and backward, every result is bitwise the call
    without it (before the fix the torch backend's fp32 outputs moved by ~1e-3 on the CPU,
    grouped_mlp_mxfp8's by 1.4e-2), and the caller's autocast state is as it was."""
    autocast_check(case, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_misaligned_inputs(case, device):
    """A contiguous view one element into its allocation (a slice x[1:] of a flat buffer) is a valid
    input: every tensor input in turn, forward and backward, equal to the aligned call. The point is
    the cuda run, whose kernels load 16-byte vectors and TMA boxes; it prints the inputs that sent a
    call to another backend (correct either way)."""
    moved = misaligned_inputs_check(case, device)
    if moved:
        print(f"{case.op}: misaligned {moved} ran another backend than the aligned call")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fake_tensor_mode(case, device):
    """Shape propagation under FakeTensorMode, forward and backward, value-rule tensors included (they
    had been read on the host: a data-dependent error)."""
    fake_mode_check(case, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_nan_reaches_what_depends_on_it(case, device):
    """The backend's kernels against the reference function under autograd (CPU: the torch backend's
    written-out backwards; cuda: the GPU backends)."""
    nan_propagation_check(case, device)
