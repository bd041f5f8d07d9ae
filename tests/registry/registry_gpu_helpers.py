"""Helpers of tests/registry/test_registry_hot_path.py (not a test module): the cases
(every op but the CP collectives, on tk-bench's small shapes) and the CUDA-graph check,
which the test runs in a child process per case (a failed capture leaves CUDA's RNG in
capture state for the whole process)."""
from __future__ import annotations

import pytest
import torch

import registry
from tilekernels._glue import poisoned
from tilekernels.testing import assert_close, misaligned_copy

COLLECTIVES = {"thd_cp_to_hp", "thd_hp_to_cp", "thd_cp_a2a_perm"}  # host cu_seqlens by design

# the drop-in checks' device parameter: the CPU runs go through the torch backend, the cuda runs (marker gpu)
# through the GPU backends
_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[_cuda, pytest.mark.gpu])]


def _cases(device_type="cpu"):
    from tilekernels.gdn import bench as gdnb
    from tilekernels.mhc import bench as mhcb
    from tilekernels.moe import bench as moeb

    out = []
    for mod in (mhcb, moeb, gdnb):
        out += [c for c in mod.cases(device_type) if c.op not in COLLECTIVES]
    return out


CASES = _cases()
IDS = [f"{c.op}-{c.variant}" if c.variant else c.op for c in CASES]


def _leaves(case, args):
    names = [t.name for t in registry.get(case.op).spec.inputs]
    return [a for n, a in zip(names, args) if n in case.grad_inputs and isinstance(a, torch.Tensor)]


def _outs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _refill(args):
    """Fresh random values in place (same metadata); integer inputs keep their values."""
    with torch.no_grad():
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float8_e4m3fn:
                a.copy_(torch.randn_like(a, dtype=torch.float32).to(a.dtype) * 0.5 + a * 0.5)


def graph_check(case):
    """Capture fwd (+bwd) of one case and compare replays with eager calls (run in a child
    process: a failed capture leaves CUDA's RNG in capture state for the whole process)."""
    dev = torch.device("cuda")
    op = registry.get(case.op)
    args, params = case.make(case.dims, dev)
    # value-rule tensors on the GPU where the op's reference reads them on the device
    for name in ("state_indices", "cu_seqlens"):
        names = [t.name for t in op.spec.inputs]
        if name in names and names.index(name) < len(args) and args[names.index(name)] is not None:
            i = names.index(name)
            args = (*args[:i], args[i].to(dev), *args[i + 1:])
    names = [t.name for t in op.spec.inputs]
    if "m_splits" in names and op.choose(op.bind(*args, **params)) == "torch":
        # the torch reference reads the group sizes on the host (a loop over the groups): a capture
        # refuses it by name, before any of its kernels runs (a CPU m_splits' values would be fixed in
        # the graph; tests/test_capture_host_reads.py)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                op(*args, **params)
        except RuntimeError as e:
            assert f"{case.op} (torch backend): m_splits" in str(e), str(e)
            return
        raise AssertionError(f"{case.op}: the torch backend's capture was not refused")
    if "m_splits" in names:
        # the GPU kernels read the group sizes on the device; a capture cannot copy a pageable CPU tensor
        i = names.index("m_splits")
        args = (*args[:i], args[i].to(dev), *args[i + 1:])
    leaves = _leaves(case, args)
    for t in leaves:
        t.requires_grad_(True)

    def step():
        out = _outs(op(*args, **params))
        if leaves:  # the same pre-made grad outputs; autograd.grad (no AccumulateGrad into leaves that
            # were made on the legacy stream, which a capture may not wait on)
            loss = sum((o.float() * gos[i].float()).sum() for i, o in enumerate(out) if o.requires_grad)
            out += list(torch.autograd.grad(loss, leaves))
        return out

    with torch.no_grad():  # shapes of the grad outputs only: a grad-mode call here would create the
        # leaves' AccumulateGrad nodes on the legacy stream, and a later capture of the backward then
        # has to wait on that stream (cudaErrorStreamCaptureImplicit); warm up on a side stream instead
        first = _outs(op(*args, **params))
    gos = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) if o.is_floating_point() else None
           for o in first]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the capture stream (kernel compile, allocator)
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # a capture fails by itself on any host sync
        static = step()
    for _ in range(2):
        _refill(args)
        snap = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        torch.cuda.set_sync_debug_mode("error")  # the replay and the eager hot path: no sync either
        try:
            g.replay()
            got = [o.clone() for o in static]
            after = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # in-place states
            with torch.no_grad():
                for a, b in zip(args, snap):
                    if isinstance(a, torch.Tensor):
                        a.copy_(b)
            want = step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for i, (a, b) in enumerate(zip(got, want)):  # comparing reads the results on the host
            assert_close(a, b, "exact", what=f"{case.op}: output/grad {i}, replay vs eager")
        for a, b in zip(after, args):
            if isinstance(a, torch.Tensor):
                assert_close(a, b, "exact", what=f"{case.op}: in-place input, replay vs eager")


def compiled_fwd_bwd_check(case):
    """torch.compile(fullgraph=True) of the registry call, forward and backward (the same pre-made grad
    outputs), against the eager call: outputs and the leaves' grads at the suite's tolerance (the compiled
    graph may fuse the glue around the kernels; e4m3 and integer outputs bitwise). Returns {name: rel err}."""
    from tilekernels.testing import rel_err

    torch._dynamo.reset()
    dev = torch.device("cuda")
    op = registry.get(case.op)
    args, params = case.make(case.dims, dev)
    leaf_ids = {id(a) for a in _leaves(case, args)}

    def run(fn, gos=None):
        a2 = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and id(a) in leaf_ids else a
              for a in args]
        new_leaves = [b for a, b in zip(args, a2) if b is not a]
        out = _outs(fn(*a2))
        if gos is None:
            gos = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) if o.requires_grad else None for o in out]
        pairs = [(o, g) for o, g in zip(out, gos) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return [o.detach() for o in out] + [t.grad for t in new_leaves], gos

    want, gos = run(lambda *a: op(*a, **params))
    got, _ = run(torch.compile(lambda *a: op(*a, **params), fullgraph=True), gos)
    errs = {}
    assert len(got) == len(want), (len(got), len(want))
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape, i
        exact = not a.is_floating_point() or a.element_size() == 1
        errs[i] = 0.0 if exact and torch.equal(a, b) else rel_err(a, b)
        assert_close(a, b, "exact" if exact else None, what=f"{case.op}: compiled vs eager, output/grad {i}")
    return errs


# ---------------------------------------------------------------- compiled calls at several batch sizes

BATCH_DIMS = ("T", "M", "R", "B")  # the first of these in a case's dims is its batch dim


def batch_sizes(case) -> tuple[str, list[dict]]:
    """(batch dim, dims for 3 calls): the batch dim grown by 3 steps from the case's size. MoE
    steps by 32 (m_splits % 32 with gradients, columnwise MXFP8 blocks), the others by 7 (odd
    sizes); the steps keep clear of every other dim's size, so dynamo's duck sizing never ties the
    batch dim to a static one. gdn_decode's slot pool N is fixed at the largest B."""
    key = next(k for k in BATCH_DIMS if k in case.dims)
    step = 32 if registry.get(case.op).spec.family == "moe" else 7
    out = []
    for i in (1, 3, 5):
        d = dict(case.dims)
        d[key] += i * step
        if key == "B" and "N" in d:
            d["N"] += 5 * step  # a fixed slot pool, as a server has
        out.append(d)
    return key, out


# ---------------------------------------------------------------- one fwd+bwd step, shared by the checks below


def _leaf_pos(op, case, args) -> set[int]:
    names = [t.name for t in op.spec.inputs]
    return {i for i, n in enumerate(names[:len(args)]) if n in case.grad_inputs and isinstance(args[i], torch.Tensor)}


def _fresh(args, leaf_pos, make=lambda a: a.detach().clone()) -> list:
    """New leaves (``make`` of each tensor; requires_grad at ``leaf_pos``), other arguments as they are."""
    return [make(a).requires_grad_(i in leaf_pos) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]


def _random_gos(out) -> list:
    return [torch.randn_like(o, dtype=torch.float32).to(o.dtype) if o.requires_grad else None for o in out]


def _step(call, a_list, leaf_pos, gos=_random_gos) -> tuple[list, list]:
    """``call(*a_list)`` and the gradients of its leaves for the grad outputs ``gos`` (a list beside the
    outputs, None where one needs none, or a function making it from them): (outputs, gradients, then
    every input tensor after the call (in-place states), all detached; the grad outputs used)."""
    out = _outs(call(*a_list))
    gos = gos(out) if callable(gos) else gos
    pairs = [(o, g) for o, g in zip(out, gos) if o.requires_grad]
    grads = list(torch.autograd.grad([o for o, _ in pairs], [a_list[i] for i in sorted(leaf_pos)],
                                     [g for _, g in pairs], allow_unused=True)) if pairs else []
    return ([o.detach() for o in out] + [g for g in grads if g is not None]
            + [a.detach() for a in a_list if isinstance(a, torch.Tensor)]), gos


def _assert_same(got: list, want: list, what: str, exact: bool = False) -> None:
    """Pairwise: same dtype and shape, then equal at the suite's tolerance (integers, e4m3 and
    ``exact``: bitwise)."""
    assert len(got) == len(want), (what, len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype, g.shape, w.shape)
        bitwise = exact or not w.is_floating_point() or w.element_size() == 1
        assert_close(g, w, "exact" if bitwise else None, what=f"{what}, output/grad/input {i}")


# ---------------------------------------------------------------- the drop-in checks


def varying_batch_compile_check(case, device: str, dynamic, mode=None) -> int:
    """One ``torch.compile(fullgraph=True, dynamic=dynamic)`` of the registry call, called at the 3
    batch sizes of :func:`batch_sizes` on fresh inputs, forward and (ops with gradients) backward
    with the same pre-made grad outputs as an eager call: outputs and grads at the suite's
    tolerance (integers and e4m3 bitwise), in-place inputs (gdn_decode's states) too; ``mode`` is
    torch.compile's (e.g. "reduce-overhead": Inductor's CUDA graphs around the kernels). Returns the
    number of graphs dynamo made (``dynamic=None``: 2, the first size specialized and one graph
    with a dynamic batch dim for the rest; ``dynamic=True``: 1)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    op = registry.get(case.op)
    compiled = torch.compile(lambda *a, **p: op(*a, **p), fullgraph=True, dynamic=dynamic, mode=mode)
    for dims in batch_sizes(case)[1]:
        args, params = case.make(dims, torch.device(device))
        leaf_pos = _leaf_pos(op, case, args)
        want, gos = _step(lambda *a: op(*a, **params), _fresh(args, leaf_pos), leaf_pos)
        got, _ = _step(lambda *a: compiled(*a, **params), _fresh(args, leaf_pos), leaf_pos, gos)
        _assert_same(got, want, f"{case.op} {dims}: compiled vs eager")
    return counters["stats"]["unique_graphs"]


def export_check(case, device: str) -> None:
    """``torch.export.export`` (non-strict) of a module calling the registry op, with the case's batch
    dim a ``Dim`` on every input that has it (MoE's a multiple of 32, as its blocks need): the
    export must not need a bound on it, and the exported program, run at the other sizes of
    :func:`batch_sizes`, must equal eager calls bitwise (outputs and in-place inputs; the same
    kernels run, no autograd)."""
    from torch.export import Dim, export

    op = registry.get(case.op)
    key, sizes = batch_sizes(case)
    args, params = case.make(sizes[0], torch.device(device))
    layout = op.bind(*args, **params).layout
    dim = 32 * Dim(f"{key}_32") if op.spec.family == "moe" else Dim(key)
    dyn = tuple(None if not isinstance(a, torch.Tensor) else
                ({i: dim for i, d in enumerate(t.shape_for(layout)) if d == key} or None)
                for t, a in zip(op.spec.inputs, args))

    class Call(torch.nn.Module):
        def forward(self, *a):
            return op(*a, **params)

    program = export(Call(), tuple(args), dynamic_shapes={"a": dyn}, strict=False).module()
    for dims in sizes[1:]:
        a1, _ = case.make(dims, torch.device(device))
        got, _ = _step(program, _fresh(a1, set()), set())
        want, _ = _step(lambda *a: op(*a, **params), _fresh(a1, set()), set())
        _assert_same(got, want, f"{case.op} {dims}: exported vs eager", exact=True)


def autocast_check(case, device: str) -> None:
    """The op's results and gradients under ``torch.autocast(device, bfloat16)`` (forward and
    backward inside it, as a mixed-precision training step runs them) equal those of the same
    call without autocast, bitwise, and the caller's autocast state is as it was: an op's precision
    is its spec's, whatever the caller's autocast (the torch reference's fp32 matmuls would
    otherwise run in bf16)."""
    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)
    gos, results = _random_gos, []
    for amp in (False, True):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            res, gos = _step(lambda *a: op(*a, **params), _fresh(args, leaf_pos), leaf_pos, gos)
            assert torch.is_autocast_enabled(device) == amp, "the op left the caller's autocast state changed"
        results.append(res)
    _assert_same(results[1], results[0], f"{case.op}: under autocast vs without", exact=True)


def misaligned_inputs_check(case, device: str) -> list[str]:
    """Each tensor input in turn passed as a contiguous view one element off its allocation's start:
    results, gradients and in-place inputs equal the aligned call's at the suite's tolerance (the
    backend may differ: a kernel may copy the tensor or decline the call). Returns the inputs whose
    misaligned call ran another backend than the aligned one (for the test's report)."""
    op = registry.get(case.op)
    names = [t.name for t in op.spec.inputs]
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)
    call = lambda *a: op(*a, **params)  # noqa: E731
    want, gos = _step(call, _fresh(args, leaf_pos), leaf_pos)
    chosen = op.choose(op.bind(*_fresh(args, leaf_pos), **params))
    moved = []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or a.numel() == 0:
            continue
        a2 = _fresh(args, leaf_pos, lambda t, _i=i, _a=a: misaligned_copy(t) if t is _a else t.detach().clone())
        assert a2[i].data_ptr() % 16 != 0
        if op.choose(op.bind(*a2, **params)) != chosen:
            moved.append(names[i])
        got, _ = _step(call, a2, leaf_pos, gos)
        _assert_same(got, want, f"{case.op}: input {names[i]} misaligned")
    return moved


def fake_mode_check(case, device: str) -> None:
    """The op under ``FakeTensorMode`` (shape propagation, memory estimators, what torch.compile traces
    with): inputs made fake from the case's real ones (value-rule tensors too: their rules run as
    tensor ops, which fake tensors carry without values), forward and backward; every result and
    gradient has the real call's shape, dtype and device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = registry.get(case.op)
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)
    call = lambda *a: op(*a, **params)  # noqa: E731
    ones = lambda out: [torch.ones_like(o) if o.requires_grad else None for o in out]  # noqa: E731
    real, _ = _step(call, _fresh(args, leaf_pos), leaf_pos, ones)
    with FakeTensorMode() as mode:
        fake, _ = _step(call, _fresh(args, leaf_pos, mode.from_tensor), leaf_pos, ones)
    assert len(fake) == len(real)
    for i, (f, r) in enumerate(zip(fake, real)):
        assert (f.shape, f.dtype, f.device) == (r.shape, r.dtype, r.device), (case.op, i, f, r)


def nan_propagation_check(case, device: str, backend: str = "auto") -> None:
    """One NaN in one floating input, and then one in one upstream gradient (each in turn, at a random
    element), reaches exactly the outputs, gradients and in-place inputs that depend on it: the NaN
    pattern of the registry call (``backend``) equals that of the op's torch reference function
    (``op.reference``, differentiated by autograd: not the kernel table's torch kernels, whose backward
    is written out). A kernel whose max, clamp, select or skipped multiply swallows a NaN would hand
    finite values to a loss scaler's overflow check (an overflowed upstream gradient is the NaN-in-a-
    gradient case)."""
    op = registry.get(case.op)
    names = [t.name for t in op.spec.inputs]
    args, params = case.make(case.dims, torch.device(device))
    leaf_pos = _leaf_pos(op, case, args)

    def ones(nan_out):
        def make(out):
            gos = [torch.ones_like(o) if o.requires_grad else None for o in out]
            if nan_out is not None:
                gos[nan_out[0]].view(-1)[nan_out[1]] = float("nan")
            return gos
        return make

    def compare(bad, nan_out, where):
        with poisoned(True, "finite"):  # (a NaN poison would pass where a kernel skips an element that is NaN)
            got, _ = _step(lambda *x: op(*x, backend=backend, **params), _fresh(bad, leaf_pos), leaf_pos,
                           ones(nan_out))
        want, _ = _step(lambda *x: op.reference(*x, **params), _fresh(bad, leaf_pos), leaf_pos, ones(nan_out))
        assert len(got) == len(want), (len(got), len(want))
        for j, (g, w) in enumerate(zip(got, want)):
            if not w.is_floating_point():
                continue
            gn, wn = torch.isnan(g.float()), torch.isnan(w.float())
            assert torch.equal(gn, wn), (f"{case.op}: NaN in {where}: output/grad/input {j} has "
                                         f"{int(gn.sum())} NaN, the reference {int(wn.sum())}")

    for i, a in enumerate(args):  # the run's seed (conftest) picks the elements: fresh each run
        if not isinstance(a, torch.Tensor) or not a.is_floating_point() or a.element_size() == 1 or a.numel() == 0:
            continue
        bad = list(args)
        bad[i] = a.clone()
        k = int(torch.randint(a.numel(), (1,)))
        bad[i].view(-1)[k] = float("nan")
        compare(bad, None, f"{names[i]}[{k}]")
    outs = _outs(op(*_fresh(args, leaf_pos), **params))
    for j, o in enumerate(outs):
        if o.requires_grad and o.numel():
            k = int(torch.randint(o.numel(), (1,)))
            compare(list(args), (j, k), f"the grad of output {j}, element {k}")
