"""The generated autograd wrapper (tilekernels/_opgen.py), on the CPU (torch backends), for every
generated differentiable op of the families' CPU bench cases; and ``torch.library.opcheck`` of every
generated custom op (forward and backward).

A call that records no graph (grad mode off, inference mode, or no input that requires grad) runs
the fwd pass without the op's autograd.Function (whose machinery is most of a small op's host
cost) and returns what the Function returns: the same tensors, bit for bit (the torch reference
is deterministic on the CPU), none with a grad_fn. A call that records a graph goes through the
Function. Forward-mode AD and a second backward through the first one still refuse, as they did
when every call went through the Function."""
from __future__ import annotations

import contextlib
import importlib

import pytest
import torch
import torch.autograd.forward_ad as fwad

import registry
from registry_gpu_helpers import DEVICES
from specs import all_specs

_FAMILIES = ("mhc", "moe", "gdn", "cp")
_DIFF = {s.name for s in all_specs() if s.differentiable}


def _cases(with_grads: bool = True):
    """The generated ops' CPU bench cases (``with_grads``: the differentiable ones that take gradients)."""
    out = []
    for fam in _FAMILIES:
        for c in importlib.import_module(f"tilekernels.{fam}.bench").cases("cpu"):
            if hasattr(registry.get(c.op).entry, "gen") and (not with_grads or c.op in _DIFF and c.grad_inputs):
                out.append(pytest.param(c, id=f"{c.op}-{c.variant}" if c.variant else c.op))
    return out


CASES = _cases()


def _results(r) -> list:
    return list(r) if isinstance(r, tuple) else [r]


def _counted(monkeypatch, op) -> list:
    """Calls of the op's autograd.Functions' forwards, counted: the general one and the one a prepared call (a
    registry guard pattern seen before, in this test or an earlier one) applies."""
    calls = []
    for fn in (op.entry.gen.fn, op.entry.gen.fn_prepared):
        def forward(ctx, *args, real=fn.forward):
            calls.append(1)
            return real(ctx, *args)

        monkeypatch.setattr(fn, "forward", staticmethod(forward))
    return calls


def _inputs(case, requires_grad: bool, device: str = "cpu"):
    # the same values for every call of one test, fresh each run: back to the seed conftest gave this
    # test (the run's TK_SEED with the test's id)
    torch.manual_seed(torch.initial_seed())
    args, params = case.make(case.dims, torch.device(device))
    names = [t.name for t in registry.get(case.op).spec.inputs]
    args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    if requires_grad:
        for n, a in zip(names, args):
            if n in case.grad_inputs and a is not None:
                a.requires_grad_()
    return args, params


def test_cases_cover_the_generated_differentiable_ops():
    """Every generated differentiable op is here (so no op's wrapper goes untested by this file)."""
    assert {p.values[0].op for p in CASES} == {n for n in _DIFF if hasattr(registry.get(n).entry, "gen")}
    assert {"mhc_sinkhorn", "mhc_pre", "gdn_pre_gated", "grouped_mlp_mxfp8"} <= {p.values[0].op for p in CASES}


@pytest.mark.parametrize("case", CASES)
def test_calls_without_a_graph_skip_the_function_with_the_same_results(case, monkeypatch):
    op = registry.get(case.op)
    calls = _counted(monkeypatch, op)
    args, params = _inputs(case, requires_grad=True)
    graph = _results(op(*args, **params))
    assert calls == [1], "a call that records a graph goes through the Function"
    assert any(t.grad_fn is not None for t in graph)
    want = [t.detach() for t in graph]
    plain, _ = _inputs(case, requires_grad=False)
    for how in ("grad mode, no input requires grad", "no_grad", "inference_mode"):
        ctx = {"no_grad": torch.no_grad(), "inference_mode": torch.inference_mode()}.get(how)
        a = plain if how != "no_grad" else args  # under no_grad: even inputs that require grad
        if ctx is None:
            got = _results(op(*a, **params))
        else:
            with ctx:
                got = _results(op(*a, **params))
        assert calls == [1], f"{how}: the Function ran"
        assert len(got) == len(want), how
        for g, w in zip(got, want):
            assert g.grad_fn is None and not g.requires_grad, how
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), how


def _prepared(op):
    """The Prepared calls the op's guard patterns hold (registry/guards.py's RUN slot)."""
    from registry.guards import RUN
    from tilekernels._opgen import Prepared

    return [e[RUN] for e in op._guards._entries if isinstance(e[RUN], Prepared)]


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_prepared_call_matches_the_general_path(case, device, named):
    """A call whose metadata the registry's guard pattern has seen runs the op's Prepared call (plan, params and
    gradient metadata worked out once; ``FnP``), the fourth on through the registry's quick path where the pattern
    allows it (``named``: the backend "auto" picks, named, so no fallback keeps it from the CPU's calls): its
    outputs and input gradients are bit for bit those of the general path (the first call, through the entry), with
    the same grad outputs; no_grad calls of the same op also take a Prepared call and match. Bitwise: the same
    inputs through the same kernels (the torch reference on the CPU, the registry's GPU backends on cuda:
    deterministic, their own tests say so)."""
    from registry.guards import QUICK

    op = registry.get(case.op)
    op._guards.clear()
    op._checked.clear()
    args, params = _inputs(case, requires_grad=False, device=device)
    if named:
        params = dict(params, backend=op.choose(op.bind(*args, **params)))
    got = []
    for _ in range(4):  # validated, then the pattern made, then its Prepared call built, then (quick) called
        args, _ = _inputs(case, requires_grad=True, device=device)
        outs = _results(op(*args, **params))
        diff = [o for o in outs if o.requires_grad]
        gen = torch.Generator().manual_seed(1)  # (not the global seed: _inputs replays that)
        gouts = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in diff]
        torch.autograd.backward(diff, gouts)
        got.append(([o.detach() for o in outs], [a.grad for a in args if isinstance(a, torch.Tensor)
                                                 and a.requires_grad], [type(o.grad_fn).__name__ for o in diff]))
    assert any(p.autograd for p in _prepared(op)), "the third call built no Prepared call"
    if named and op._quick:
        assert any(e[QUICK] is not None for e in op._guards._entries), "the fourth call had no quick path"
    for later in got[2:]:
        assert all(n.endswith("PreparedBackward") for n in later[2]) and not any(
            n.endswith("PreparedBackward") for n in got[0][2]), (got[0][2], later[2])
        for a, b in zip(got[0][0] + got[0][1], later[0] + later[1]):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    plain, _ = _inputs(case, requires_grad=False, device=device)
    with torch.no_grad():
        ng = [_results(op(*plain, **params)) for _ in range(4)]
    assert any(not p.autograd for p in _prepared(op))
    for later in ng[2:]:
        for a, b in zip(got[0][0], later):
            assert b.grad_fn is None and torch.equal(a, b)


@contextlib.contextmanager
def _sinkhorn_prepared_under_dual():
    """mhc_sinkhorn with fresh guards, called until its Prepared call is built, inside a forward-AD level (left
    open for the with-block): yields (op, x)."""
    op = registry.get("mhc_sinkhorn")
    op._guards.clear()
    op._checked.clear()
    x = torch.randn(7, 4, 4)
    with fwad.dual_level():
        for _ in range(3):
            op(x)
        assert _prepared(op), "no Prepared call built under the dual level"
        yield op, x


def test_prepared_call_keeps_nothing_of_the_call_that_built_it(monkeypatch):
    """A Prepared call holds what the guard pattern fixes, and nothing the building call had besides: built
    under a forward-AD level (where every call goes through the Function), a later plain call records no graph;
    a kernel replaced after it was built is the one that runs; allocation poisons under ``poisoned()``, so an
    output the kernel leaves unwritten is NaN, as on the general path."""
    import registry.kernels as K
    from tilekernels._glue import poisoned

    with _sinkhorn_prepared_under_dual() as (op, x):
        pass
    calls = _counted(monkeypatch, op)
    y = op(x)
    assert y.grad_fn is None and calls == []
    key = ("mhc_sinkhorn", "torch", "fwd")
    real = K._KERNELS[key]
    monkeypatch.setitem(K._KERNELS, key, lambda logits, out, iters, eps: out.fill_(3.0))
    assert torch.equal(op(x), torch.full_like(x, 3.0))
    monkeypatch.setitem(K._KERNELS, key, lambda *a: None)
    with poisoned():
        assert op(x).isnan().all()
        leaf = x.clone().requires_grad_()
        for _ in range(3):
            out = op(leaf)
        assert type(out.grad_fn).__name__.endswith("PreparedBackward") and out.isnan().all()
    monkeypatch.setitem(K._KERNELS, key, real)
    assert torch.equal(op(x), registry.get("mhc_sinkhorn").reference(x))


def test_prepared_call_refuses_a_dual_input():
    """A dual input (forward-mode AD) to a call whose metadata has a Prepared call raises as the first call does: the
    Prepared call leaves a forward-AD level to the general path (``_moded``), which refuses it (no jvp). Pinned by a
    mutation audit: a Prepared call that ran its kernel on the dual's primal passed every other test, and gave an
    output with no tangent, silently."""
    with _sinkhorn_prepared_under_dual() as (op, x):
        dual = fwad.make_dual(x.clone(), torch.randn_like(x))
        for _ in range(2):
            with pytest.raises(NotImplementedError, match="jvp"):
                op(dual)


@pytest.mark.parametrize("case", [c for c in CASES if c.values[0].op in ("mhc_sinkhorn", "gdn_pre_gated")])
def test_forward_ad_and_double_backward_still_refused(case):
    """No jvp: a dual input raises, as through the Function before, and so does a dual grad output
    (forward-mode AD through the backward: a GPU kernel reads only the primal, so the tangent would
    be lost, silently); with create_graph and grad
    outputs that require grad, the first backward's results carry a node that raises when a
    second backward reaches it (once-differentiable), also a gradient with respect to the inputs
    alone (``autograd.grad(..., inputs)``), which once_differentiable's node, hung on detached
    copies, never reached (it gave no gradient, or zeros where materialized)."""
    op = registry.get(case.op)
    args, params = _inputs(case, requires_grad=False)
    with fwad.dual_level():
        dual = [fwad.make_dual(a, torch.randn_like(a)) if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a for a in args]
        with pytest.raises(NotImplementedError, match="jvp"):
            op(*dual, **params)
    args, params = _inputs(case, requires_grad=True)
    outs = [t for t in _results(op(*args, **params)) if t.requires_grad]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    for create_graph in (False, True):
        with fwad.dual_level():
            dual = [fwad.make_dual(torch.randn_like(t), torch.randn_like(t)) for t in outs]
            with pytest.raises(NotImplementedError, match=f"^{case.op}: forward-mode AD"):
                torch.autograd.grad(outs, leaves, dual, create_graph=create_graph, retain_graph=True,
                                    allow_unused=True)
    v = [torch.randn_like(t).requires_grad_() for t in outs]
    g = torch.autograd.grad(outs, leaves, v, create_graph=True, allow_unused=True)
    g0 = next(t for t in g if t is not None)
    assert g0.requires_grad  # a grad_fn that refuses, not a plain tensor
    with pytest.raises(NotImplementedError, match=f"^{case.op}: "
                       "a gradient through the op's backward"):
        g0.sum().backward()
    g = torch.autograd.grad(outs, leaves, v, create_graph=True, allow_unused=True)
    g0 = next(t for t in g if t is not None)
    with pytest.raises(NotImplementedError, match="second order"):
        torch.autograd.grad((g0.float() ** 2).sum(), leaves, allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("case", [c for c in CASES if c.values[0].op in ("mhc_sinkhorn", "gdn_pre_gated")])
def test_double_backward_of_a_prepared_call_still_refused(case):
    """A repeated call (the third of one metadata: the registry's Prepared call, ``FnP``) refuses a second order as
    the first call does: its backward under create_graph takes Fn's recording path, whose results carry the node
    that raises. Pinned by a mutation audit: a FnP.backward that took its plain path (the kernel called directly)
    with grad mode on passed every other test, and a second backward then ran through the torch kernel's own ops
    (a GPU kernel's results have none: zeros or no gradient, silently)."""
    op = registry.get(case.op)
    op._guards.clear()
    op._checked.clear()
    for _ in range(3):
        args, params = _inputs(case, requires_grad=True)
        outs = [t for t in _results(op(*args, **params)) if t.requires_grad]
    assert all(type(o.grad_fn).__name__.endswith("PreparedBackward") for o in outs)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    v = [torch.randn_like(t).requires_grad_() for t in outs]
    g = torch.autograd.grad(outs, leaves, v, create_graph=True, allow_unused=True)
    g0 = next(t for t in g if t is not None)
    assert g0.requires_grad  # a grad_fn that refuses, not a plain tensor
    with pytest.raises(NotImplementedError, match=f"^{case.op}: a gradient through the op's backward"):
        g0.sum().backward()




@pytest.mark.parametrize("case", CASES)
def test_backward_kernels_read_contiguous_grad_outputs(case, monkeypatch):
    """The GPU backward kernels index their grad outputs as dense rows: the wrapper hands every bwd kernel
    contiguous tensors whatever autograd gives it (here every grad output a strided view, every other element of a
    wider tensor, as a slice of a fused projection's gradient is), on the general path and on a Prepared call's
    (the same guard pattern three times), and the gradients are those of contiguous grad outputs (a torch backend,
    where the values are the same either way)."""
    import registry.kernels as K

    op = registry.get(case.op)
    op._guards.clear()
    op._checked.clear()
    args, params = _inputs(case, requires_grad=True)
    op(*args, **params)   # the backend's kernels loaded
    key = (case.op, "torch", "bwd")
    real, seen = K._KERNELS[key], []

    def bwd(*a):
        seen.append([t.is_contiguous() for t in a if isinstance(t, torch.Tensor)])
        return real(*a)

    monkeypatch.setitem(K._KERNELS, key, bwd)
    grads = []
    for strided in (False, True, True, True):
        args, params = _inputs(case, requires_grad=True)
        outs = [t for t in _results(op(*args, **params)) if t.requires_grad]
        gen = torch.Generator().manual_seed(torch.initial_seed())   # the same grad outputs every time
        wide = [torch.randn(*t.shape[:-1], 2 * t.shape[-1], generator=gen).to(t.dtype) for t in outs]
        gouts = [w[..., ::2] if strided else w[..., ::2].contiguous() for w in wide]
        assert not strided or any(not g.is_contiguous() for g in gouts)
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        grads.append(torch.autograd.grad(outs, leaves, gouts, allow_unused=True))
    assert _prepared(op), "no Prepared call built"
    assert len(seen) == 4 and all(all(c) for c in seen), seen
    for g in grads[1:]:
        for a, b in zip(grads[0], g):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", _cases(with_grads=False))
def test_forward_custom_ops_pass_opcheck(case, device):
    """``torch.library.opcheck`` on each op's forward custom ops (the functional one where it exists, and
    the destination-passing ``_fwd``) with the torch backend: schema (mutations declared, no aliasing),
    fake implementation, autograd registration, AOT dispatch with static and dynamic shapes. test_schema
    is left out where a tensor is float8 data (mxfp8_quantize / mxfp8_dequantize: it computes on the outputs,
    which torch cannot do in e4m3). cuda: the backend the registry picks (there test_schema catches a kernel that
    writes into an input it does not declare, the float8 ops excepted)."""
    op = registry.get(case.op)
    gen = op.entry.gen
    args, params = case.make(case.dims, torch.device(device))
    bound = op.bind(*args, **params)
    backend = op.choose(bound)
    tensors, ps = list(bound.args()), [bound.params[p] for p in gen.params]
    made = gen.allocate(tensors, ps, tensors[0].device)
    fp8 = any(t is not None and t.element_size() == 1 and t.is_floating_point() for t in tensors + made)
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
             "test_aot_dispatch_dynamic") + (() if fp8 else ("test_schema",))

    def fresh(ts):
        return [t.clone() if isinstance(t, torch.Tensor) else t for t in ts]

    if gen.fwd_alloc_op is not None:
        torch.library.opcheck(gen.fwd_alloc_op, (*fresh(tensors), *ps, backend), test_utils=utils)
    torch.library.opcheck(gen.fwd_op, (*fresh(tensors), *fresh(made), *ps, backend), test_utils=utils)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_backward_custom_op_passes_opcheck(case, device):
    """``torch.library.opcheck`` on each differentiable op's ``_bwd`` custom op with the torch backend, on
    the arguments its autograd backward passes (grad outputs, what the forward saved, one gradient
    buffer per differentiable input): the schema's mutations are exactly the gradient buffers (a
    backward writing into a saved tensor would fail here), fake implementation, AOT dispatch. cuda:
    the backend the registry picks for a call that needs gradients."""
    op = registry.get(case.op)
    gen = op.entry.gen
    args, params = case.make(case.dims, torch.device(device))
    names = [t.name for t in op.spec.inputs]
    leaves = [a.detach().requires_grad_(n in case.grad_inputs) if isinstance(a, torch.Tensor) and
              a.is_floating_point() and a.element_size() > 1 else a for n, a in zip(names, args)]
    backend = op.choose(op.bind(*leaves, **params))
    bound = op.bind(*args, **params)
    tensors, ps = list(bound.args()), [bound.params[p] for p in gen.params]
    made = gen.forward(tensors, ps, backend)
    every = dict(zip(gen.ins + gen.outs + [s.name for s in gen.decl.scratch], tensors + made))
    grads = [torch.randn_like(every[n], dtype=torch.float32).to(every[n].dtype) for n in gen.diff_out]
    saved = [every[n] for n in gen.decl.saves]
    dins = [None if every[n] is None or every[n].element_size() == 1 else torch.empty_like(every[n])
            for n in gen.diff_in]
    fp8 = any(t is not None and t.element_size() == 1 and t.is_floating_point() for t in tensors + made)
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
             "test_aot_dispatch_dynamic") + (() if fp8 else ("test_schema",))
    torch.library.opcheck(gen.bwd_op, (*grads, *saved, *dins, *ps, backend), test_utils=utils)


def test_direct_in_place_writes_bump_the_version(monkeypatch):
    """A GPU kernel writes gdn_decode's states through raw pointers, past autograd's version counter; the eager
    direct path then bumps it, so a state saved for a backward before the step is seen as overwritten (autograd
    raises) instead of feeding that backward the new values. Emulated: a torch kernel that writes through
    ``.data``."""
    import registry.kernels as K
    from tilekernels.gdn import bench as gb
    from tilekernels.gdn import reference as gref

    op = registry.get("gdn_decode")
    c = next(c for c in gb.cases("cpu") if c.op == "gdn_decode")
    args, params = c.make(c.dims, torch.device("cpu"))
    mixed, conv_state, cw, A, dt, ssm, idx = args

    def raw_pointer_kernel(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o, Hk, eps,
                           scale):
        cs, ss = conv_state.detach().clone(), ssm_state.detach().clone()
        o.copy_(gref.decode(mixed, cs, conv_weight, A_log, dt_bias, ss, state_indices, Hk=Hk, eps=eps, scale=scale))
        conv_state.data.copy_(cs)
        ssm_state.data.copy_(ss)

    monkeypatch.setitem(K._KERNELS, ("gdn_decode", "torch", "fwd"), raw_pointer_kernel)
    state = ssm.clone()
    w = torch.tensor(2.0, requires_grad=True)
    y = (state * w).sum()  # saves state for its backward
    for _ in range(4):  # every call of one metadata: a repeated one too (an op that updates an input keeps the
        # general path, no Prepared call, whose direct kernel call bumps nothing: pinned by a mutation audit)
        before = (state._version, conv_state._version)
        op(mixed, conv_state, cw, A, dt, state, idx, **params)
        assert state._version > before[0] and conv_state._version > before[1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_one_tensor_as_two_inputs_compiles():
    """mhc_proj_rms(x, x) with x requiring grad: dynamo refuses an autograd.Function given one tensor twice, so the
    traced call passes the second as a clone; outputs and x's gradient (both uses summed) bitwise eager's."""
    op = registry.get("mhc_proj_rms")
    x0 = torch.randn(24, 256, dtype=torch.bfloat16)

    def run(fn):
        x = x0.clone().requires_grad_()
        p, r = fn(x)
        (p.float().sin().sum() + r.float().cos().sum()).backward()
        return p.detach(), r.detach(), x.grad

    torch._dynamo.reset()
    eager = run(lambda x: op(x, x))
    compiled = run(torch.compile(lambda x: op(x, x), fullgraph=True, backend="aot_eager"))
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@pytest.mark.parametrize("strict", [False, True])
def test_export_of_a_call_that_needs_grad_warns(monkeypatch, strict):
    """torch.export keeps a differentiable op's forward only (the destination-passing ``<op>_fwd``: the exported
    program's outputs carry no gradient). An export whose inputs require grad (a module's parameters, by default)
    warns, once per op, instead of dropping the gradient silently (a CPU audit, session 72); an export with nothing
    requiring grad does not."""
    import warnings

    from tilekernels import _opgen

    monkeypatch.setattr(_opgen, "_EXPORT_WARNED", set())
    op = registry.get("mhc_h_aggregate")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = torch.nn.Parameter(torch.rand(8, 4))

        def forward(self, x):
            return op(x, self.h)

    x = torch.randn(8, 4, 64)
    with pytest.warns(UserWarning, match="mhc_h_aggregate: torch.export keeps this op's forward only"):
        torch.export.export(M(), (x,), strict=strict)
    m = M().requires_grad_(False)
    monkeypatch.setattr(_opgen, "_EXPORT_WARNED", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.export.export(m, (x,), strict=strict)
        torch._dynamo.reset()
        torch.compile(M(), fullgraph=True)(x).sum().backward()   # torch.compile is no export (torch 2.11 said so)
    assert not [w for w in seen if "torch.export keeps" in str(w.message)]


_COLD_COMPILE = """
import torch
from tilekernels.gdn import bench as mk, decode, pre_gated
Hk, Hv, dk, dv, W = 2, 4, 8, 4, 4
w, A, dt = mk.weights(Hk, Hv, dk, dv, W, dtype=torch.float32)
conv, ssm = mk.decode_states(2, Hk, Hv, dk, dv, W, dtype=torch.float32)
x = mk.mixed((2,), Hk, Hv, dk, dv, dtype=torch.float32)
xp = mk.mixed((1, 5), Hk, Hv, dk, dv, dtype=torch.float32)
for fn, args in (((lambda *a: decode(*a, Hk=Hk)), (x, conv.clone(), w, A, dt, ssm.clone())),
                 ((lambda *a: pre_gated(*a, Hk=Hk, dk=dk, dv=dv)), (xp, w, A, dt))):
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(*[a.clone() for a in args])
    want = fn(*[a.clone() for a in args])
    for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, e)
print("ok")
"""


def test_compiled_entry_as_a_process_first_use():
    """torch.compile(fullgraph=True) of the GDN entries as the first thing a process does with them: the generated
    op's plan evaluates the output shapes inside the trace, and an expression first met there was built with the
    builtin compile(), which dynamo cannot trace (Unsupported; an earlier eager call or registry.get had filled the
    cache, so every in-process test passed: a CPU audit's find, session 72). A fresh interpreter; bitwise against
    the eager call run after the compiled one was traced."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _COLD_COMPILE], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_every_functional_entry_is_exported_from_its_family():
    """README: each op's functional entry is its spec's ``entry`` (``tilekernels.<family>.ops:<fn>``), also
    exported as ``tilekernels.<family>.<fn>`` (mhc_post_pre was missing there: a helper's README audit)."""
    import importlib

    import registry

    for name in registry.names():
        spec = registry.get(name).spec
        mod, _, fn = spec.entry.partition(":")
        entry = getattr(importlib.import_module(mod), fn)
        assert getattr(importlib.import_module(f"tilekernels.{spec.family}"), fn, None) is entry, name


_COLD_CP = """
import torch, registry
from tilekernels.cp.bench import _single_process_group
_single_process_group(torch.device("cpu"))
op = registry.get("thd_cp_to_hp")
x, cu = torch.randn(4, 2), torch.tensor([0, 4], dtype=torch.int32)
for kw in ({"cp": 1}, {}):
    torch._dynamo.reset()
    try:
        torch.compile(lambda x: op(x, cu, **kw), fullgraph=True, backend="eager")(x)
        raise SystemExit("traced")
    except Exception as e:
        assert "thd_cp_to_hp: torch.compile cannot trace the CP ops" in str(e), str(e)[:2000]
print("ok")
"""


def test_cp_refusal_under_compile_as_a_process_first_use():
    """A CP op traced as a process's first call is refused naming it: its param ``cp``'s resolver was imported on
    first use, inside the trace (dynamo: "marked as skipped ... import_module", no op named; a review's find, session
    73). registry.get imports the resolvers with the entry. A fresh interpreter, cp given and cp=None."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _COLD_CP], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.stdout[-2000:], p.stderr[-3000:])


_F64_OUT = sorted({s.name for s in all_specs() for t in s.outputs if isinstance(t.dtypes, list)
                   and len(t.dtypes) > 1 and "float64" in t.dtypes and s.name != "mxfp8_dequantize"})


@pytest.mark.parametrize("case", [c for c in _cases(with_grads=False) if c.values[0].op in _F64_OUT])
def test_float64_calls_get_float64_outputs(case):
    """Reference mode: an output whose dtypes are ["float32", "float64"] is allocated float64 when the op's first
    input is (the spec's rule: float64 calls run entirely in float64); float32 there would round every float64
    result the tests compare against the reference. Allocation is cached by shapes: a float32 call of the same
    shapes first must not hand its plan to the float64 one."""
    op = registry.get(case.op)
    args, params = _inputs(case, requires_grad=False)
    f64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() and a.element_size() > 1 else a
           for a in args]
    for call_args, f64_call in ((args, False), (f64, True)):
        outs = _results(op(*call_args, **params))
        if f64_call:   # (every floating output then: the float64-capable ones and those "like:" a float64 input)
            assert all(t.dtype == torch.float64 for t in outs if t.is_floating_point()), \
                (case.op, [t.dtype for t in outs])


def _pre_gated_inputs(requires_grad: bool, Hk=1, Hv=2, dk=2, dv=2, W=3, T=7):
    """A small THD call of gdn_pre_gated: inputs (cu_seqlens last, on the CPU) and params."""
    gen = torch.Generator().manual_seed(3)  # (the same values in every call of a test)
    ins = [torch.randn(T, 2 * Hk * dk + 2 * Hv * dv + 2 * Hv, generator=gen),
           torch.randn(2 * Hk * dk + Hv * dv, W, generator=gen), torch.randn(Hv, generator=gen),
           torch.randn(Hv, generator=gen)]
    ins = [t.requires_grad_(requires_grad) for t in ins]
    return ins + [torch.tensor([0, 3, T], dtype=torch.int32)], dict(Hk=Hk, dk=dk, dv=dv, return_conv_state=True)


def test_a_non_differentiable_output_is_marked_so():
    """An output the spec declares not differentiable (gdn_pre_gated's conv_state) is marked so by the op's
    autograd.Functions (``ctx.mark_non_differentiable``): with inputs that require grad it has no grad_fn and does
    not require grad on the general path (``Fn``), on a Prepared call (``FnP``) and inside torch.func.grad
    (``FnT``), while backward through the other outputs gives the reference's gradients. Unmarked, it would be a
    differentiable output of the Function: a loss built on it would backpropagate zeros, silently, instead of
    autograd's refusal."""
    op = registry.get("gdn_pre_gated")
    op._guards.clear()
    op._checked.clear()
    plain, params = _pre_gated_inputs(False)
    leaves = [t.detach().clone().requires_grad_() for t in plain[:4]]
    r = op.reference(*leaves, plain[4], **params)
    (r[0].sum() + (r[4] * r[4]).sum()).backward()
    want = [t.grad for t in leaves]
    names = []
    for _ in range(4):  # the general path, then (the pattern made, its Prepared call built) Prepared calls
        args, _ = _pre_gated_inputs(True)
        out = op(*args, **params, backend="torch")
        assert out[6].grad_fn is None and not out[6].requires_grad, type(out[6].grad_fn).__name__
        assert all(o.requires_grad for o in out[:6])
        names.append(type(out[0].grad_fn).__name__)
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.autograd.grad(out[6].sum(), args[:4], allow_unused=True)
        (out[0].sum() + (out[4] * out[4]).sum()).backward()
        for a, w in zip(args[:4], want):
            torch.testing.assert_close(a.grad, w)
    assert names[0] == "GdnPreGatedBackward" and names[-1] == "GdnPreGatedPreparedBackward", names

    seen = []

    def q_sum(mixed, *rest):
        out = op(mixed, *rest, plain[4], **params, backend="torch")
        seen.append((out[6].requires_grad, out[0].requires_grad))
        return out[0].sum() + (out[4] * out[4]).sum()

    got = torch.func.grad(q_sum, argnums=(0, 1, 2, 3))(*plain[:4])
    assert seen == [(False, True)], seen
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_non_differentiable_op_records_no_graph():
    """A non-differentiable op (no backward) runs its forward with grad mode off, whatever its inputs
    (``_Gen.call`` and ``Prepared.no_grad``): an input that requires grad gives outputs with no grad_fn that do
    not require grad, on the general path, a Prepared call and the quick path, so a loss built on them is refused
    by autograd rather than differentiated through the torch kernel's ops (which would give a gradient the op
    says it has none of, and on a GPU backend would have none). A synthetic generated op (``_tk_gen_fake``): the
    real forward-only ops have float8 / integer outputs or refuse such an input."""
    from _tk_gen_fake import NODIFF
    from registry.guards import QUICK

    op = registry.Op(NODIFF)
    x = torch.randn(3, 4, requires_grad=True)
    for i in range(4):  # the general path, the pattern made, its Prepared call built, then the quick path
        out = op(x, scale=3.0, backend="torch")
        assert out.grad_fn is None and not out.requires_grad, (i, out.grad_fn)
        assert torch.equal(out, x.detach() * 3.0)
    assert any(e[QUICK] is not None for e in op._guards._entries), "no quick path: nothing pinned there"
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
    with torch.no_grad():  # (no graph anyway)
        assert op(x, scale=3.0, backend="torch").grad_fn is None
