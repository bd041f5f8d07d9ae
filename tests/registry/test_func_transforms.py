"""The ops under torch.func's transforms (``registry/transforms.py`` says which they take).

* grad / vjp: the generated ops run a setup_context form of their autograd.Function. Outputs and
  gradients equal a plain call's with ``.grad`` machinery, bitwise (the same kernels run: the CPU's
  torch reference, the GPU backends on cuda), for the pre-made grad outputs of the other drop-in
  tests and for grad outputs that depend on the inputs (a loss of squares: the transform then
  records the backward's inputs, which must not make it refuse). Every kernel sees plain tensors:
  a transform's wrappers have no data pointer, so a GPU kernel handed one fails.
* functionalize alone, and calls inside a grad transform on inputs it does not track: the plain
  call's outputs and in-place state updates, bitwise, for every op (gdn_decode's functionalize is
  refused: it updates its states in place).
* vmap, jacrev, jvp, nested grad levels, a grad of a vjp function with respect to its cotangents,
  and functionalize with a grad transform raise NotImplementedError naming the op; those checked
  before the forward run no kernel. Before this, grad / vjp failed with torch's "must override the
  setup_context staticmethod", and a grad of a vjp function (had it run) gets zeros.
* The CP ops (collectives, and the index maps a kernel writes) refuse every transform.
* torch.compile(fullgraph=True) around a transform of a differentiable op raises naming it; without
  fullgraph dynamo falls back to running the transform eagerly, with its gradients.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import func

import registry
import registry.kernels as K
from registry_gpu_helpers import CASES, DEVICES, IDS, _assert_same, _fresh, _leaf_pos, _outs, _step
from tilekernels.cp import bench as cpb


def _without_bias(case):
    """The case with its optional bias left out (every bench case of the two ops passes one)."""
    def make(dims, device):
        args, params = case.make(dims, device)
        names = [t.name for t in registry.get(case.op).spec.inputs]
        return [None if n == "bias" else a for n, a in zip(names, args)], params
    return dataclasses.replace(case, make=make, variant="no-bias")


GRAD = [pytest.param(c, id=i) for c, i in zip(CASES, IDS) if c.grad_inputs]
GRAD += [pytest.param(_without_bias(c), id=f"{c.op}-no-bias") for c in CASES
         if c.op in ("mhc_h_post_bda", "mhc_post_pre") and c.grad_inputs]
ALL = [pytest.param(c, id=i) for c, i in zip(CASES, IDS)]
CP = [pytest.param(c, id=c.op) for c in cpb.cases("cpu")]


def _plain_kernels(monkeypatch, op, args, params, runs: list) -> None:
    """Wrap the fwd / bwd kernels the registry picks for this call: each run counted in ``runs`` and
    checked to get plain tensors only (no transform wrapper)."""
    backend = op.choose(op.bind(*args, **params))
    from torch._C._functorch import is_functorch_wrapped_tensor

    for pass_ in ("fwd", "bwd"):
        key = (op.name, backend, pass_)
        if key not in K._KERNELS:
            continue
        real = K._KERNELS[key]

        def checked(*a, _real=real, _pass=pass_):
            wrapped = [i for i, t in enumerate(a) if isinstance(t, torch.Tensor) and is_functorch_wrapped_tensor(t)]
            assert not wrapped, f"{op.name} {_pass}: arguments {wrapped} reached the kernel wrapped by a transform"
            runs.append(_pass)
            return _real(*a)
        monkeypatch.setitem(K._KERNELS, key, checked)


def _setup(case, device):
    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device(device))
    return op, args, params, _leaf_pos(op, case, args)


def _split(call, args, leaf_pos):
    """f(*leaves) -> (differentiable outputs, (every output, inputs after the call)) for func.vjp."""
    pos = sorted(leaf_pos)

    def f(*leaves):
        a = list(args)
        for i, t in zip(pos, leaves):
            a[i] = t
        out = _outs(call(*a))
        diff = tuple(o for o in out if o.is_floating_point() and o.requires_grad)
        return diff, (out, [t for t in a if isinstance(t, torch.Tensor)])  # (aux: tensors only)
    return f


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_vjp_matches_autograd(case, device, monkeypatch):
    """torch.func.vjp of the call with respect to its grad inputs, the pre-made grad outputs as
    cotangents: outputs, gradients and inputs after the call equal the plain call's, bitwise."""
    op, args, params, leaf_pos = _setup(case, device)
    call = lambda *a: op(*a, **params)  # noqa: E731
    want, gos = _step(call, _fresh(args, leaf_pos), leaf_pos)
    runs: list = []
    _plain_kernels(monkeypatch, op, args, params, runs)
    # func.vjp tracks its primals itself: the leaves go in without requires_grad
    a = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in args]
    diff, vjp_fn, (out, after) = func.vjp(_split(call, a, leaf_pos), *[a[i] for i in sorted(leaf_pos)], has_aux=True)
    assert runs == ["fwd"], f"{case.op}: kernels run under the transform's forward: {runs}"
    cot = [g for o, g in zip(_outs(out), gos) if g is not None]
    assert len(cot) == len(diff), f"{case.op}: {len(diff)} differentiable outputs, {len(cot)} grad outputs"
    grads = vjp_fn(tuple(cot))
    assert runs == ["fwd", "bwd"], f"{case.op}: kernels run by the vjp: {runs}"
    got = ([o.detach() for o in _outs(out)] + [g for g in grads if g is not None]
           + [t.detach() for t in after if isinstance(t, torch.Tensor)])
    _assert_same(got, want, f"{case.op}: torch.func.vjp vs autograd", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_grad_with_input_dependent_grad_outputs(case, device, monkeypatch):
    """torch.func.grad of a sum of squares of the differentiable outputs: the op's backward gets grad
    outputs the transform tracks (they depend on the inputs) and must still run, once; the gradients
    equal autograd's for the same loss, bitwise."""
    op, args, params, leaf_pos = _setup(case, device)
    pos = sorted(leaf_pos)

    def loss(*leaves):
        a = list(args)
        for i, t in zip(pos, leaves):
            a[i] = t
        return sum((o.float() ** 2).sum() for o in _outs(op(*a, **params)) if o.is_floating_point() and o.requires_grad)

    leaves = [args[i].detach().clone().requires_grad_() for i in pos]
    want = torch.autograd.grad(loss(*leaves), leaves, allow_unused=True)
    runs: list = []
    _plain_kernels(monkeypatch, op, args, params, runs)
    got = func.grad(loss, argnums=tuple(range(len(pos))))(*[args[i].detach().clone() for i in pos])
    assert runs == ["fwd", "bwd"], f"{case.op}: kernels run by torch.func.grad: {runs}"
    pairs = [(g, w) for g, w in zip(got, want) if w is not None]
    assert pairs and all(torch.count_nonzero(g) for g, _ in pairs), f"{case.op}: zero gradients"
    _assert_same([g for g, _ in pairs], [w for _, w in pairs], f"{case.op}: torch.func.grad vs autograd", exact=True)


@pytest.fixture
def own_group():
    """A CP case's ``make`` starts a world-size-1 default group if none is up: taken down after the test,
    so later tests find torch.distributed as they would have."""
    import torch.distributed as dist

    was_up = dist.is_initialized()
    yield
    if not was_up and dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("via", ["registry", "entry"])
@pytest.mark.parametrize("case", ALL + CP)
def test_untracked_and_functionalized_calls(case, via, monkeypatch, own_group):
    """Every op, called inside a grad transform on inputs it does not track, and under functionalize:
    the plain call's outputs and in-place updates, bitwise; the transform's wrappers never reach a
    kernel. gdn_decode's functionalize and every transform around a CP op are refused. Through the
    registry and through the op's entry function (which skips the registry's own refusal)."""
    op, args, params, leaf_pos = _setup(case, "cpu")
    if via == "registry":
        call = lambda *a: op(*a, **params)  # noqa: E731
    else:
        backend = op.choose(op.bind(*args, **params))
        call = lambda *a: op.entry(*a, backend=backend, **params)  # noqa: E731

    def fresh():
        return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in args]

    base = fresh()
    want = _outs(call(*base)) + [t for t in base if isinstance(t, torch.Tensor)]
    runs: list = []
    _plain_kernels(monkeypatch, op, args, params, runs)
    ways = {
        "inside grad": lambda a: func.grad_and_value(lambda d: ((d * 2).sum(), _outs(call(*a))),
                                                     has_aux=True)(torch.ones(()))[1][1],
        "functionalize": lambda a: _outs(func.functionalize(call)(*a)),
    }
    collective = case.op.startswith("thd_")
    for how, run in ways.items():
        a = fresh()
        runs.clear()
        if collective or (how == "functionalize" and case.op == "gdn_decode"):
            with pytest.raises(NotImplementedError, match=f"^{case.op}: .*not supported"):
                run(a)
            assert runs == [], f"{case.op}: {how} ran kernels {runs} before refusing"
            continue
        got = list(run(a)) + [t for t in a if isinstance(t, torch.Tensor)]
        assert runs == ["fwd"], f"{case.op}: {how} ran {runs}"
        _assert_same(got, want, f"{case.op}: {how} vs a plain call", exact=True)


def _vjp_fn(op, args, params, pos):
    def f(*leaves):
        a = list(args)
        for i, t in zip(pos, leaves):
            a[i] = t
        return tuple(o for o in _outs(op(*a, **params)) if o.is_floating_point() and o.requires_grad)
    return f


@pytest.mark.parametrize("case", GRAD)
def test_refused_transforms(case, monkeypatch):
    """vmap, jvp, nested grad levels, functionalize with grad or with inputs that require grad (an
    autograd graph) refuse before any kernel runs; jacrev
    (a vmap over the backward) and a grad of a vjp function with respect to its cotangents refuse in
    the backward (their forward runs under a vjp, rightly). Each NotImplementedError names the op."""
    op, args, params, leaf_pos = _setup(case, "cpu")
    pos = sorted(leaf_pos)
    f = _vjp_fn(op, args, params, pos)
    leaves = [args[i].detach().clone() for i in pos]

    def scalar(*l):
        return sum(o.float().sum() for o in f(*l))

    runs: list = []
    _plain_kernels(monkeypatch, op, args, params, runs)
    before_fwd = {
        "vmap": lambda: func.vmap(scalar)(*[t.unsqueeze(0) for t in leaves]),
        "jvp": lambda: func.jvp(f, tuple(leaves), tuple(torch.ones_like(t) for t in leaves)),
        "nested grad": lambda: func.grad(lambda *l: func.grad(scalar)(*l).float().sum())(*leaves),
        "functionalize(grad)": lambda: func.functionalize(func.grad(scalar))(*leaves),
        "grad(functionalize)": lambda: func.grad(func.functionalize(scalar))(*leaves),
        "functionalize recording a graph": lambda: func.functionalize(scalar)(
            *[t.clone().requires_grad_() for t in leaves]),
    }
    for how, run in before_fwd.items():
        with pytest.raises(NotImplementedError, match=f"^{case.op}: .*not supported"):
            run()
        assert runs == [], f"{case.op}: {how} ran kernels {runs} before refusing"

    with pytest.raises(NotImplementedError, match=f"^{case.op}: torch.func.vmap"):
        func.jacrev(scalar)(*leaves)  # the forward runs under its vjp; the vmap over the backward refuses
    assert runs == ["fwd"], f"{case.op}: jacrev ran {runs}"
    runs.clear()
    outs, vjp_fn = func.vjp(f, *leaves)
    assert runs == ["fwd"]
    cot = tuple(torch.randn_like(o) for o in outs)
    with pytest.raises(NotImplementedError, match=f"^{case.op}: higher-order"):
        func.grad(lambda *c: sum(g.float().sum() for g in vjp_fn(c) if g is not None))(*cot)
    # a vjp function called inside another grad transform on cotangents it does not track is first order
    want = vjp_fn(cot)
    got = func.grad_and_value(lambda d: ((d * 2).sum(), vjp_fn(cot)), has_aux=True)(torch.ones(()))[1][1]
    _assert_same([g for g in got if g is not None], [w for w in want if w is not None],
                 f"{case.op}: a vjp function inside another grad transform", exact=True)


@pytest.mark.parametrize("case", [p for p in GRAD if p.values[0].op in ("mhc_sinkhorn", "grouped_linear")])
def test_compile_around_a_transform(case):
    """torch.compile around torch.func.grad of a differentiable op: fullgraph raises, naming the op
    (dynamo would trace the ctx-taking Function, which transforms refuse); without fullgraph dynamo
    runs the transform eagerly, with the eager transform's gradients, bitwise."""
    op, args, params, leaf_pos = _setup(case, "cpu")
    pos = sorted(leaf_pos)

    def loss(*leaves):
        a = list(args)
        for i, t in zip(pos, leaves):
            a[i] = t
        return sum(o.float().sum() for o in _outs(op(*a, **params)) if o.is_floating_point() and o.requires_grad)

    leaves = [args[i].detach().clone() for i in pos]
    want = func.grad(loss, argnums=tuple(range(len(pos))))(*leaves)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=f"{case.op}: torch.compile around a torch.func transform"):
        torch.compile(func.grad(loss, argnums=tuple(range(len(pos)))), fullgraph=True)(*leaves)
    torch._dynamo.reset()
    got = torch.compile(func.grad(loss, argnums=tuple(range(len(pos)))))(*leaves)
    _assert_same(list(got), list(want), f"{case.op}: compiled (graph-broken) grad vs eager", exact=True)


@pytest.mark.parametrize("case", GRAD)
def test_second_order_refused(case):
    """Every way found to differentiate an op's backward raises, naming the op, instead of returning
    zeros (each gave zeros or a wrong value before the review of session 49): autograd.grad with
    create_graph inside torch.func.grad; plain autograd through a torch.func.grad result; torch.func.grad
    over the cotangents of a backward plain autograd recorded. Forward-mode AD through linearize too."""
    op, args, params, leaf_pos = _setup(case, "cpu")
    pos = sorted(leaf_pos)
    f = _vjp_fn(op, args, params, pos)

    def squares(*l):
        return sum((o.float() ** 2).sum() for o in f(*l))

    leaves = [args[i].detach().clone() for i in pos]

    def grad_of_grad(*l):
        gs = torch.autograd.grad(squares(*l), l, create_graph=True, allow_unused=True)
        return sum((g.float() ** 2).sum() for g in gs if g is not None)

    with pytest.raises(NotImplementedError, match=f"^{case.op}: a gradient through the op's backward"):
        func.grad(grad_of_grad, argnums=tuple(range(len(pos))))(*leaves)

    outer = [t.clone().requires_grad_() for t in leaves]
    scale = torch.ones((), dtype=torch.float32)
    gs = func.grad(lambda s: squares(*[t * s for t in outer]))(scale)
    with pytest.raises(NotImplementedError, match=f"^{case.op}: a gradient through the op's backward"):
        torch.autograd.grad(gs, outer, allow_unused=True, materialize_grads=True)

    plain = [t.clone().requires_grad_() for t in leaves]
    outs = f(*plain)
    cot = tuple(torch.randn_like(o) for o in outs)

    def through_cotangents(*c):
        gs = torch.autograd.grad(outs, plain, c, create_graph=True, retain_graph=True, allow_unused=True)
        return sum((g.float() ** 2).sum() for g in gs if g is not None)

    with pytest.raises(NotImplementedError, match=f"^{case.op}: higher-order"):
        func.grad(through_cotangents, argnums=tuple(range(len(cot))))(*cot)

    with pytest.raises(NotImplementedError, match=f"^{case.op}: forward-mode AD"):
        func.linearize(lambda *l: f(*l), *leaves)

    if len(pos) > 1:
        # an input-gradient penalty: func.grad with respect to one input, the others closed over and tracked by
        # the outer autograd only (below the transform's level they do not require grad), with fixed weights on
        # the outputs; the gradient depends on the others through the backward. This cut the outer graph
        # silently: the gradient did not require grad (a CPU audit's find, session 72)
        others = [t.clone().requires_grad_() for t in leaves[1:]]
        w = [torch.randn_like(o, dtype=torch.float32) for o in f(*[t.clone().requires_grad_() for t in leaves])]
        g = func.grad(lambda t: sum((o.float() * wi).sum() for o, wi in zip(f(t, *others), w)))(leaves[0].clone())
        with pytest.raises(NotImplementedError, match=f"^{case.op}: a gradient through the op's backward"):
            torch.autograd.grad((g.float() ** 2).sum(), others, allow_unused=True, materialize_grads=True)
