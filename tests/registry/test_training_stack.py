"""The ops inside what a training stack wraps around them: activation checkpointing (reentrant and
not), selective activation checkpointing (eager and compiled), activation offloading through
saved-tensor hooks, a backward run twice on a retained graph, deterministic-algorithms mode,
make_fx's symbolic tracing, outputs freed without the cycle collector, and (two GPUs) inputs on a
GPU that is not the current device.

Every op with gradients on tk-bench's small shapes (the CP collectives have none), forward and
backward against the plain registry call with the same pre-made grad outputs: bitwise (the same
kernels run, so a recomputed forward must give the bits the first one did: deterministic kernels),
except torch.compile against eager (the suite's tolerance, as the other compile checks). CPU: the
torch backend; cuda: the GPU backends the registry picks.

What these found: under a selective-checkpointing policy that saves an op's forward (MUST_SAVE),
the replay handed back the destination-passing custom op's result, None, and the recomputed outputs
stayed unwritten: mhc_proj_rms, mhc_pre, mhc_post_pre and grouped_mlp_mxfp8, whose backwards read
saved outputs, got NaN gradients under the suite's poisoning (garbage without it). An eager call under
a dispatch mode now runs the functional ``tilekernels::<op>`` (``Op.forward_ops``; gdn_decode, which updates
its states in place, keeps its destination-passing op).
"""
from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import registry
import registry.kernels as K
from registry_gpu_helpers import CASES, DEVICES, IDS, _assert_same, _leaf_pos, _fresh, _outs, _step, batch_sizes

GRAD = [pytest.param(c, id=i) for c, i in zip(CASES, IDS) if c.grad_inputs]


def _setup(case, device):
    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)
    call = lambda *a: op(*a, **params)  # noqa: E731
    want, gos = _step(call, _fresh(args, leaf_pos), leaf_pos)
    return op, args, params, leaf_pos, call, want, gos


def _count_fwd(monkeypatch, op, args, params) -> list:
    """Counts the runs of the fwd kernel the registry picks for this call (a one-element list)."""
    backend = op.choose(op.bind(*args, **params))
    key = (op.name, backend, "fwd")
    real, runs = K.get_kernel(*key), [0]

    def counted(*a):
        runs[0] += 1
        return real(*a)
    monkeypatch.setitem(K._KERNELS, key, counted)
    return runs


def _backward_grads(out, leaves, gos) -> list:
    """``.backward`` (not ``torch.autograd.grad``: reentrant checkpointing refuses it) of the outputs
    with ``gos``; the leaves' ``.grad`` (fresh leaves: nothing accumulated)."""
    pairs = [(o, g) for o, g in zip(out, gos) if o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [t.grad for t in leaves if t.grad is not None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_activation_checkpointing(case, device, monkeypatch):
    """``torch.utils.checkpoint`` around the op (non-reentrant, then reentrant): the backward recomputes
    the forward (the fwd kernel runs twice) and gets the plain call's outputs and gradients bitwise."""
    op, args, params, leaf_pos, call, want, gos = _setup(case, device)
    runs = _count_fwd(monkeypatch, op, args, params)
    got, _ = _step(lambda *a: checkpoint(call, *a, use_reentrant=False), _fresh(args, leaf_pos), leaf_pos, gos)
    assert runs[0] == 2, f"{case.op}: non-reentrant checkpoint ran the fwd kernel {runs[0]} times, not 2"
    _assert_same(got, want, f"{case.op}: non-reentrant checkpoint vs plain", exact=True)

    a = _fresh(args, leaf_pos)
    out = _outs(checkpoint(call, *a, use_reentrant=True))
    grads = _backward_grads(out, [a[i] for i in sorted(leaf_pos)], gos)
    n_out = len(out)
    _assert_same([o.detach() for o in out] + grads, want[:n_out + len(grads)],
                 f"{case.op}: reentrant checkpoint vs plain", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_checkpointing_with_create_graph(case, device):
    """Non-reentrant checkpointing with ``create_graph=True`` (a gradient penalty's first step): the same
    first-order gradients as a plain call, bitwise. The backward unpacks each saved tensor once: the
    second-order guard had read them twice, which checkpointing refuses ("already unpacked once")."""
    op, args, params, leaf_pos, call, want, gos = _setup(case, device)
    a = _fresh(args, leaf_pos)
    out = _outs(checkpoint(call, *a, use_reentrant=False))
    pairs = [(o, g) for o, g in zip(out, gos) if o.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], [a[i] for i in sorted(leaf_pos)], [g for _, g in pairs],
                                create_graph=True, allow_unused=True)
    got = [o.detach() for o in out] + [g.detach() for g in grads if g is not None]
    _assert_same(got, want[:len(got)], f"{case.op}: checkpoint + create_graph vs plain", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["save", "recompute"])
@pytest.mark.parametrize("case", GRAD)
def test_selective_checkpointing(case, policy, device, monkeypatch):
    """Selective activation checkpointing (``create_selective_checkpoint_contexts``, eager) whose policy
    names the op by ``Op.forward_ops``: MUST_SAVE keeps the first forward's outputs (the fwd kernel runs
    once), MUST_RECOMPUTE runs it again in the backward; both give the plain call's results bitwise.
    Everything else in the region is PREFER_RECOMPUTE, as a stack's policy that saves only its
    matmuls has it."""
    op, args, params, leaf_pos, call, want, gos = _setup(case, device)
    assert op.forward_ops, f"{case.op}: no forward ops for a policy to name"
    mine = CheckpointPolicy.MUST_SAVE if policy == "save" else CheckpointPolicy.MUST_RECOMPUTE
    seen = []

    def pol(ctx, func, *a, **k):
        if func in op.forward_ops:
            seen.append(func)
            return mine
        return CheckpointPolicy.PREFER_RECOMPUTE

    ctx_fn = functools.partial(create_selective_checkpoint_contexts, pol)
    runs = _count_fwd(monkeypatch, op, args, params)
    got, _ = _step(lambda *a: checkpoint(call, *a, use_reentrant=False, context_fn=ctx_fn),
                   _fresh(args, leaf_pos), leaf_pos, gos)
    assert seen, f"{case.op}: the policy never saw the op's forward"
    assert runs[0] == (1 if policy == "save" else 2), f"{case.op}: fwd kernel ran {runs[0]} times under {policy}"
    _assert_same(got, want, f"{case.op}: selective checkpoint ({policy}) vs plain", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_selective_checkpointing_compiled(case, device, monkeypatch):
    """The same region under ``torch.compile(fullgraph=True)`` with the policy saving the op: the policy
    sees the traced ``tilekernels::<op>_fwd``, AOTAutograd's partitioner keeps its outputs (the fwd
    kernel runs once), and outputs and gradients equal eager at the suite's tolerance."""
    op, args, params, leaf_pos, call, want, gos = _setup(case, device)
    seen = []

    def pol(ctx, func, *a, **k):
        if func in op.forward_ops:
            seen.append(func)
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    ctx_fn = functools.partial(create_selective_checkpoint_contexts, pol)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: checkpoint(call, *a, use_reentrant=False, context_fn=ctx_fn), fullgraph=True)
    runs = _count_fwd(monkeypatch, op, args, params)
    got, _ = _step(compiled, _fresh(args, leaf_pos), leaf_pos, gos)
    assert op.forward_ops[1] in seen, f"{case.op}: the policy never saw the traced forward op"
    assert runs[0] == 1, f"{case.op}: compiled MUST_SAVE ran the fwd kernel {runs[0]} times"
    _assert_same(got, want, f"{case.op}: compiled selective checkpoint vs eager")


@pytest.mark.parametrize("case", [pytest.param(c, id=i) for c, i in zip(CASES, IDS)])
def test_make_fx_symbolic(case):
    """``make_fx(tracing_mode="symbolic")`` (what graph-capture tools built on it use) traces a registry call
    (it failed hashing a SymInt in the validated-call cache): the graph holds the functional op, and run at
    another batch size it gives eager's results and in-place inputs bitwise."""
    from torch.fx.experimental.proxy_tensor import make_fx

    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device("cpu"))
    g = make_fx(lambda *a: op(*a, **params), tracing_mode="symbolic")(*_fresh(args, set()))
    assert any(n.target == op.forward_ops[0] for n in g.graph.nodes), g.graph  # (gdn_decode: its _fwd)
    a1, _ = case.make(batch_sizes(case)[1][0], torch.device("cpu"))
    got, want = _fresh(a1, set()), _fresh(a1, set())
    out_g, out_w = _outs(g(*got)), _outs(op(*want, **params))
    _assert_same([o.detach() for o in out_g] + [a for a in got if isinstance(a, torch.Tensor)],
                 [o.detach() for o in out_w] + [a for a in want if isinstance(a, torch.Tensor)],
                 f"{case.op}: make_fx graph vs eager", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_offloaded_activations(case, device):
    """Saved-tensor hooks that move every saved tensor to the host and back (activation offloading, as
    ``torch.autograd.graph.save_on_cpu`` does), with the originals overwritten by NaN after the forward
    (the memory an offloader frees and reuses): the backward reads only what it saved, so its gradients
    are the plain call's bitwise. A kernel reading a tensor it did not save (kept on ctx, or re-read
    from an input) would see the NaN."""
    op, args, params, leaf_pos, call, want, gos = _setup(case, device)
    originals = []

    def pack(t):
        originals.append(t)
        return t.device, t.detach().to("cpu", copy=True)

    def unpack(packed):
        dev, host = packed
        return host.to(dev)

    a = _fresh(args, leaf_pos)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = _outs(call(*a))
    assert originals, f"{case.op}: nothing was saved for the backward"
    expect = [o.detach().clone() for o in out]
    with torch.no_grad():
        for t in originals:
            if t.is_floating_point() and t.element_size() > 1:
                t.fill_(float("nan"))
    pairs = [(o, g) for o, g in zip(out, gos) if o.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], [a[i] for i in sorted(leaf_pos)], [g for _, g in pairs],
                                allow_unused=True)
    grads = [g for g in grads if g is not None]
    _assert_same(expect + grads, want[:len(out) + len(grads)], f"{case.op}: offloaded activations vs plain", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAD)
def test_backward_twice_on_a_retained_graph(case, device):
    """``retain_graph=True``, then a second backward over the same graph (gradient penalties, some
    pipeline schedules): both equal the plain call's gradients bitwise, so a backward pass does not
    write into what it saved."""
    op, args, params, leaf_pos, call, want, gos = _setup(case, device)
    a = _fresh(args, leaf_pos)
    out = _outs(call(*a))
    pairs = [(o, g) for o, g in zip(out, gos) if o.requires_grad]
    leaves = [a[i] for i in sorted(leaf_pos)]
    rounds = []
    for keep in (True, False):
        g = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], retain_graph=keep,
                                allow_unused=True)
        rounds.append([x for x in g if x is not None])
    n_out = len(out)
    for i, r in enumerate(rounds):
        _assert_same(r, want[n_out:n_out + len(r)], f"{case.op}: backward {i + 1} on a retained graph", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [pytest.param(c, id=i) for c, i in zip(CASES, IDS)])
def test_deterministic_algorithms_mode(case, device):
    """Under ``torch.use_deterministic_algorithms(True)`` (reproducible training runs) no op raises (torch
    refuses its nondeterministic CUDA ops there: a glue scatter-add or histogram would), and every
    result, gradient and in-place input is bitwise the call's without it (the kernels' reductions are
    deterministic anyway)."""
    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)
    call = lambda *a: op(*a, **params)  # noqa: E731
    want, gos = _step(call, _fresh(args, leaf_pos), leaf_pos)
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got, _ = _step(call, _fresh(args, leaf_pos), leaf_pos, gos)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
    _assert_same(got, want, f"{case.op}: deterministic mode vs not", exact=True)


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", [pytest.param(c, id=i) for c, i in zip(CASES, IDS)])
def test_tensors_on_another_gpu(case):
    """Inputs on cuda:1 while cuda:0 is the current device (a pipeline stage's layers in one process, a
    serving worker that never called set_device): forward and backward run on cuda:1 (the launch goes
    to that device's current stream, its workspaces live there) and give bitwise the results of the
    same inputs on cuda:0; nothing is allocated on cuda:0 by the call."""
    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device("cuda:0"))
    leaf_pos = _leaf_pos(op, case, args)
    call = lambda *a: op(*a, **params)  # noqa: E731
    want, gos = _step(call, _fresh(args, leaf_pos), leaf_pos)
    on1 = lambda t: t.detach().to("cuda:1")  # noqa: E731
    args1, gos1 = _fresh(args, leaf_pos, on1), [None if g is None else g.to("cuda:1") for g in gos]
    torch.cuda.synchronize(0)
    with torch.cuda.device(0):
        before = torch.cuda.memory_allocated(0)
        torch.cuda.reset_peak_memory_stats(0)
        got, _ = _step(call, args1, leaf_pos, gos1)
        torch.cuda.synchronize(1)
        assert torch.cuda.max_memory_allocated(0) == before, f"{case.op}: the call allocated on cuda:0"
    assert all(g.device == torch.device("cuda:1") for g in got), f"{case.op}: a result left cuda:1"
    _assert_same([g.to("cuda:0") for g in got], want, f"{case.op}: on cuda:1 vs cuda:0", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [pytest.param(c, id=i) for c, i in zip(CASES, IDS)])
def test_outputs_are_freed_without_the_cycle_collector(case, device):
    """With Python's cycle collector off, an op's outputs (and what their graph saved) are freed the moment
    the last reference goes: after a fwd+bwd step, and for a graph dropped without a backward (an eval
    step under grad mode, a discarded microbatch). A reference cycle (an output kept on its own ctx, a
    closure over it) would hold activation memory until the collector happened to run."""
    import gc
    import weakref

    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for backward in (True, False):
            a = _fresh(args, leaf_pos)
            out = _outs(op(*a, **params))
            refs = [weakref.ref(o) for o in out]
            pairs = [(o, torch.ones_like(o)) for o in out if o.requires_grad]
            if backward and pairs:
                torch.autograd.grad([o for o, _ in pairs], [a[i] for i in sorted(leaf_pos)], [g for _, g in pairs],
                                    allow_unused=True)
            del out, pairs
            alive = [i for i, r in enumerate(refs) if r() is not None]
            assert not alive, f"{case.op}: outputs {alive} outlived their last reference (backward={backward})"
    finally:
        if was:
            gc.enable()
