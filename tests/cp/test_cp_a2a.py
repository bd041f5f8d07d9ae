"""thd_cp_to_hp / thd_hp_to_cp on gloo with 2 and 4 spawned CPU processes.

One spawn per world size runs every check (spawning dominates the time):
the fused one-all_to_all path equals the per-sequence, per-section reference
bit for bit and the independently sliced expectation; the round trip is the
identity; exactly one all_to_all per direction and per backward; gradients
equal the other direction and the reference's autograd; gradcheck (float64) in
size-1 groups; a subgroup as ``group``; rules that need the group's size
refused with SpecError naming the op, and a cp unlike the group's size refused by
the entries called directly and by the oracle; no kernel's output is resized by
torch (warnings of it are errors). The worlds are joined under a deadline
(``WORLD_TIMEOUT_S``): a hung rank fails the test instead of stalling the run.
"""
import contextlib
import multiprocessing
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import registry
from registry import SpecError
from tilekernels._glue import poisoned
from tilekernels.cp import ops
from tilekernels.cp import reference as ref
from tilekernels.testing import assert_close

TO_HP = registry.get("thd_cp_to_hp")
TO_CP = registry.get("thd_hp_to_cp")


@contextlib.contextmanager
def count_all_to_all():
    """Count torch.distributed.all_to_all_single / all_to_all calls in the block."""
    calls = []
    orig = {name: getattr(dist, name) for name in ("all_to_all_single", "all_to_all")}

    def wrap(name):
        def f(*a, **k):
            calls.append(name)
            return orig[name](*a, **k)
        return f

    for name in orig:
        setattr(dist, name, wrap(name))
    try:
        yield calls
    finally:
        for name, fn in orig.items():
            setattr(dist, name, fn)


def _cu(lens, dtype=torch.int32):
    return torch.tensor([0] + list(lens), dtype=torch.int64).cumsum(0).to(dtype)


def _cases(cp, g):
    """(cu_seqlens, split_sections, dtype): many short sequences (zero-length ones
    too) plus one long, single sequences, no sections, nothing at all."""
    def ints(lo, hi, n):
        return torch.randint(lo, hi, (n,), generator=g).tolist()

    many = [2 * cp * k for k in ints(0, 4, 17)]
    many.insert(ints(0, 18, 1)[0], 2 * cp * ints(30, 50, 1)[0])
    qkvzba = [cp * k for k in ints(1, 5, 6)]
    return [
        (_cu(many), qkvzba, torch.bfloat16),
        (_cu(many, torch.int64), qkvzba, torch.float32),
        (_cu([2 * cp * ints(1, 9, 1)[0]]), [cp, 3 * cp], torch.float64),
        (_cu([2 * cp, 4 * cp]), None, torch.float16),
        (_cu([0]), [cp, cp], torch.float32),
    ]


def _owned_columns(x, sections, cp, rank):
    """This hp rank's 1/cp of every section, sliced independently of the maps."""
    if sections is None:
        return x.chunk(cp, 1)[rank].contiguous()
    return torch.cat([s.chunk(cp, 1)[rank] for s in x.split(sections, 1)], 1)


def _check_forward(cu, sections, dtype, cp, rank, group, g):
    t = int(cu[-1])
    d = sum(sections) if sections is not None else 2 * cp
    x_glob = torch.randn(t, d, generator=g).to(dtype)      # same on every rank
    x_loc = ref.zigzag_local(x_glob, cu, cp, rank)
    want_hp = _owned_columns(x_glob, sections, cp, rank)
    kw = dict(split_sections=sections, group=group)
    with count_all_to_all() as calls:
        hp = TO_HP(x_loc, cu, **kw)
    assert calls == ["all_to_all_single"], calls
    assert hp.dtype == dtype and hp.shape == (t, d // cp)
    assert_close(hp, want_hp, kind="exact", what="to_hp vs sliced")
    assert_close(hp, ref.thd_cp_to_hp(x_loc, cu, **kw), kind="exact", what="to_hp vs reference")
    with count_all_to_all() as calls:
        back = TO_CP(hp, cu, cp=cp, **kw)
    assert calls == ["all_to_all_single"], calls
    assert_close(back, x_loc, kind="exact", what="round trip cp->hp->cp")
    assert_close(back, ref.thd_hp_to_cp(want_hp, cu, **kw), kind="exact", what="to_cp vs reference")
    assert_close(TO_HP(back, cu, **kw), hp, kind="exact", what="round trip hp->cp->hp")


def _check_grads(cu, sections, dtype, cp, rank, group, g):
    t, d = int(cu[-1]), sum(sections)
    kw = dict(split_sections=sections, group=group)
    for fused, other, reference, shape in (
        (TO_HP, TO_CP, ref.thd_cp_to_hp, (t // cp, d)),
        (TO_CP, TO_HP, ref.thd_hp_to_cp, (t, d // cp)),
    ):
        x = torch.randn(*shape, generator=g).to(dtype).requires_grad_()
        y = fused(x, cu, **kw)
        dy = torch.randn(y.shape, generator=g).to(dtype)
        with count_all_to_all() as calls:
            y.backward(dy)
        assert calls == ["all_to_all_single"], calls
        assert_close(x.grad, other(dy, cu, **kw), kind="exact", what=f"{fused.name} grad vs other direction")
        xr = x.detach().clone().requires_grad_()
        reference(xr, cu, **kw).backward(dy)
        assert_close(x.grad, xr.grad, kind="exact", what=f"{fused.name} grad vs reference autograd")


def _check_refusals(cp):
    x = torch.randn(3, 2 * cp)                               # lengths [2cp, cp]: T/cp = 3 local tokens
    bad_len = _cu([2 * cp, cp])
    for op, arg in ((TO_HP, x), (TO_CP, torch.randn(3 * cp, 2))):
        with pytest.raises(SpecError, match=op.name) as e:   # cp derived from the group, then checked
            op(arg, bad_len)
        assert "2*cp" in str(e.value)
    with pytest.raises(SpecError, match="thd_cp_to_hp.*split_sections"):
        TO_HP(torch.randn(2, 3 * cp + 1), _cu([2 * cp]), split_sections=[cp + 1, 2 * cp])
    with pytest.raises(SpecError, match="thd_hp_to_cp.*param cp"):  # empty input passes every shape rule
        TO_CP(torch.randn(0, 1), _cu([0]), cp=cp + 1)
    # a cp given unlike the group's size is named as such before any rule reads it (a rule it broke, D % cp, was)
    with pytest.raises(SpecError, match=rf"thd_cp_to_hp: param cp: expected {cp} \(as resolved"):
        TO_HP(torch.randn(4, 4), _cu([8]), cp=cp + 1)
    # the entries called directly (not through the registry) check cp against the group themselves, and so does
    # the oracle: a cp unlike the group's size is refused before any collective, not silently replaced by it
    cu, x_cp, x_hp = _cu([2 * cp]), torch.randn(2, 2 * cp), torch.randn(2 * cp, 2)
    for entry, oracle, x in ((ops.thd_cp_to_hp, ref.thd_cp_to_hp, x_cp), (ops.thd_hp_to_cp, ref.thd_hp_to_cp, x_hp)):
        with pytest.raises(SpecError, match=rf"{entry.__name__}: param cp: expected the process group's size {cp}"):
            entry(x, cu, cp=cp + 1)
        with pytest.raises(ValueError, match=rf"cp={cp + 1} but the process group has {cp} ranks"):
            oracle(x, cu, cp=cp + 1)


def _worker(rank, world, init_file, seed):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(seed)              # same stream on every rank
        # every a2a kernel writes into an output allocated at its direction's shape: an out that torch had to resize
        # (e.g. a backward's allocated for the other direction: the torch kernels hid it, a cutile one would not) fails
        warnings.filterwarnings("error", message="An output with one or more elements was resized")
        with poisoned(True):
            for cu, sections, dtype in _cases(world, g):
                _check_forward(cu, sections, dtype, world, rank, None, g)
            cu, sections, _ = _cases(world, g)[0]
            for dtype in (torch.float64, torch.bfloat16):
                _check_grads(cu, sections, dtype, world, rank, None, g)
            for lens in ([], [0, 0]):  # no tokens: the reference's result must still depend on x (its backward
                _check_grads(_cu(lens), [world, world], torch.float64, world, rank, None, g)  # raised before)
            _check_refusals(world)
            # a subgroup as the cp group: pairs of ranks
            pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
            mine = pairs[rank // 2]
            for cu, sections, dtype in _cases(2, g)[:3]:
                _check_forward(cu, sections, dtype, 2, dist.get_rank(mine), mine, g)
            # gradcheck through the registry ops in size-1 groups (cp = 1)
            singles = [dist.new_group([r]) for r in range(world)]
            kw = dict(split_sections=[1, 2], group=singles[rank])
            cu = _cu([2, 0, 4])
            x = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
            assert torch.autograd.gradcheck(lambda a: TO_HP(a, cu, **kw), (x,))
            assert torch.autograd.gradcheck(lambda a: TO_CP(a, cu, **kw), (x,))
            for op in (TO_HP, TO_CP):  # not traced: refused by name
                with pytest.raises(Exception, match=f"{op.name}: torch.compile cannot trace the CP ops"):
                    torch.compile(lambda a, op=op: op(a, cu, **kw), fullgraph=True, backend="eager")(x)
            # a gradient through the backward (second order) raises naming the op (it was silently dropped)
            for op in (TO_HP, TO_CP):
                (gx,) = torch.autograd.grad(op(x, cu, **kw).square().sum(), x, create_graph=True)
                with pytest.raises(NotImplementedError, match=f"{op.name}: a gradient through the op's backward"):
                    gx.square().sum().backward()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_cp_hp_all_to_all_gloo(world, tmp_path):
    seed = int(torch.randint(0, 2**31 - 1, ()))
    # torch.multiprocessing with "forkserver" rather than mp.spawn: the server imports
    # torch, this module and what the first backward imports lazily (sympy, via
    # symbolic_shapes: ~5 s) once, and forks every worker from that clean, thread-free
    # process, so starting a world costs well under a second instead of ~10 s of imports.
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["torch", "torch.distributed", "torch.fx.experimental.symbolic_shapes", "pytest", "registry",
         "tilekernels.cp.ops", "tilekernels.testing", __name__])
    ctx = mp.start_processes(_worker, args=(world, str(tmp_path / "store"), seed), nprocs=world,
                             join=False, start_method="forkserver")
    # join under a deadline: a worker that hangs (a collective waiting on a dead peer, a
    # stuck teardown) fails the test with the ranks still running named, never stalls the pool
    deadline = time.monotonic() + WORLD_TIMEOUT_S
    while not ctx.join(timeout=2):  # raises ProcessRaisedException / ProcessExitedException on a failure
        if time.monotonic() > deadline:
            alive = [i for i, p in enumerate(ctx.processes) if p.is_alive()]
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            for p in ctx.processes:
                p.join(5)
            pytest.fail(f"gloo world of {world} still running after {WORLD_TIMEOUT_S} s (ranks {alive} killed; "
                        f"seed {seed})")


WORLD_TIMEOUT_S = 240
