"""Defects a new user found in the registry (issue 10), one test each."""
from __future__ import annotations

import math

import pytest
import torch

import registry
import registry.exprs as E  # (where the host reads of tensor values live)
from registry import BackendUnavailable, Op, SpecError
from specs.schema import Backend, Constraint, Dim, OpSpec, Param, TensorSpec


def _spec(torch_backend: Backend) -> OpSpec:
    return OpSpec(
        name="fake_op", family="mhc", doc="test op", dims=[Dim(name="T"), Dim(name="C")],
        inputs=[TensorSpec(name="x", shape=["T", "C"], dtypes=["float32", "float64"])],
        outputs=[TensorSpec(name="out", role="out", shape=["T", "C"], dtypes="like:x")],
        params=[Param(name="scale", type="float", default=1.0)],
        reference="_tk_fake_backend:reference", entry="_tk_fake_backend:entry", backends=[torch_backend])


def test_torch_backend_limits_are_checked():
    """Constraints and dtypes declared on the torch backend count (they were skipped)."""
    op = Op(_spec(Backend(name="torch", module="_tk_fake_backend", dtypes={"x": ["float32"]},
                          constraints=[Constraint(expr="C % 2 == 0", message="pairs")])))
    assert torch.equal(op(torch.ones(2, 4)), torch.ones(2, 4))
    ok, why = {b: (o, w) for b, o, w in op.explain(torch.ones(2, 3))}["torch"]
    assert not ok and "C % 2 == 0" in why and "pairs" in why
    with pytest.raises(BackendUnavailable, match="torch supports x in \\['float32'\\], got float64"):
        op(torch.ones(2, 4, dtype=torch.float64))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_float_params_are_refused(bad):
    with pytest.raises(SpecError, match=r"mhc_sinkhorn: param eps: expected a finite float"):
        registry.get("mhc_sinkhorn")(torch.randn(2, 4, 4), eps=bad)
    with pytest.raises(SpecError, match=r"mhc_pre: param alpha_res: expected a finite float"):
        registry.get("mhc_pre")(torch.randn(2, 2, 4), torch.randn(8, 8), torch.randn(8), alpha_res=bad)
    with pytest.raises(SpecError, match=r"gdn_decode: param scale: expected a finite float"):
        registry.get("gdn_decode")(torch.randn(1, 12), torch.randn(1, 8, 3), torch.randn(8, 4), torch.randn(1),
                                   torch.randn(1), torch.randn(1, 1, 2, 2), Hk=1, scale=bad)


def test_spec_may_allow_non_finite_params():
    op = Op(_spec(Backend(name="torch", module="_tk_fake_backend")).model_copy(
        update={"params": [Param(name="scale", type="float", default=1.0, finite=False)]}))
    assert torch.isinf(op(torch.ones(1, 1), scale=math.inf)).all()


def test_forgotten_head_params_are_named_with_their_defaults():
    """A forgotten Hk/dk/dv: the shape error names the params and says which are defaults."""
    from tilekernels.gdn import bench as gb

    Hk, Hv, dk, dv, W = 2, 4, 8, 16, 4
    w, A, dt = gb.weights(Hk, Hv, dk, dv, W)
    mixed = gb.mixed((2, 5), Hk, Hv, dk, dv)
    op = registry.get("gdn_pre_gated")
    op(mixed, w, A, dt, Hk=Hk, dk=dk, dv=dv)
    with pytest.raises(SpecError) as e:
        op(mixed, w, A, dt, Hk=Hk)
    msg = str(e.value)
    assert "Hk=2, dk=128 (default), dv=128 (default)" in msg, msg
    assert f"got [2, 5, {mixed.shape[-1]}]" in msg


def test_backend_constraints_may_not_read_values():
    with pytest.raises(ValueError, match="reads tensor values"):
        _spec(Backend(name="torch", module="_tk_fake_backend",
                      constraints=[Constraint(expr="max(values(x)) < 3")]))


def test_cp_explain_without_process_group_and_one_bind(monkeypatch, tmp_path):
    """Without torch.distributed, explain says the torch backend cannot run (it said ok);
    with a group, a call binds once and reads cu_seqlens on the host once."""
    import torch.distributed as dist

    op = registry.get("thd_cp_to_hp")
    x, cu = torch.randn(8, 6), torch.tensor([0, 4, 8])
    if dist.is_initialized():  # pragma: no cover - another test left one up
        pytest.skip("a process group is already initialised")
    ok, why = {b: (ok, why) for b, ok, why in op.explain(x, cu)}["torch"]
    assert not ok and "torch.distributed is not initialized" in why
    with pytest.raises(BackendUnavailable, match="torch.distributed is not initialized"):
        op(x, cu)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        registry.clear_caches()
        binds, reads = [], []
        real_bind, real_vals = registry.core.bind, E._host_values
        monkeypatch.setattr(registry.core, "bind", lambda *a: binds.append(1) or real_bind(*a))
        monkeypatch.setattr(E, "_host_values", lambda t: reads.append(1) or real_vals(t))
        assert torch.equal(op(x, cu), x)  # cp = 1: the identity
        assert len(binds) == 1 and len(reads) == 1
        with pytest.raises(SpecError, match="2\\*cp"):  # cp resolved from the group before the rules
            op(torch.randn(3, 6), torch.tensor([0, 3]))
    finally:
        dist.destroy_process_group()
        registry.clear_caches()


class _Wrapper(torch.Tensor):
    """A wrapper subclass with its own dispatch and no storage of its own (as DTensor and quantized-tensor
    wrappers are): unwraps, runs the op, wraps."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device=inner.device, requires_grad=inner.requires_grad)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, _Wrapper) else t  # noqa: E731
        out = func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {}))
        return torch.utils._pytree.tree_map(lambda t: _Wrapper(t) if isinstance(t, torch.Tensor) else t, out)


class _Plain(torch.Tensor):
    """A subclass that keeps torch.Tensor's dispatch (as nn.Parameter does)."""


def test_tensor_subclasses_with_their_own_dispatch_are_refused():
    """A tensor subclass that handles its own dispatch (DTensor, a quantized wrapper) would hand the kernels
    memory it does not have, or one shard of it: refused before anything runs, naming op, tensor, expected
    and got, also after a plain call with the same metadata was cached. nn.Parameter and subclasses that
    keep torch.Tensor's dispatch pass."""
    op = registry.get("mhc_proj_rms")
    x, w = torch.randn(32, 64).to(torch.bfloat16), torch.randn(8, 64).to(torch.bfloat16)
    want = op(x, w)
    for call in (lambda: op(_Wrapper(x), w), lambda: op(x, weight=_Wrapper(w))):
        with pytest.raises(SpecError, match=r"mhc_proj_rms: tensor (x|weight): expected a plain torch.Tensor .* "
                                            r"got a _Wrapper \(a tensor subclass"):
            call()
    for a, b in ((torch.nn.Parameter(x), w), (x.as_subclass(_Plain), torch.nn.Buffer(w))):
        got = op(a, b)
        for g, e in zip(got, want):
            assert torch.equal(g.as_subclass(torch.Tensor), e)


def test_dtensor_is_refused_with_a_hint():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    if not dist.is_available():
        pytest.skip("torch.distributed is not built")
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        x = distribute_tensor(torch.randn(32, 64).to(torch.bfloat16), mesh, [Replicate()])
        with pytest.raises(SpecError, match=r"tensor x: .*got a DTensor .*\.to_local\(\)"):
            registry.get("mhc_proj_rms")(x, torch.randn(8, 64).to(torch.bfloat16))
    finally:
        if own:
            dist.destroy_process_group()


@pytest.mark.parametrize("bad", [dict(dtypes="like:x"), dict(dtypes=["float32"]), dict(role="out"),
                                 dict(same_device=True)])
def test_from_ints_needs_an_integer_input_off_device(bad):
    """TensorSpec.from_ints (a list of ints accepted and made a CPU tensor): only on an input with an integer
    dtype first and same_device=False (else the list's CPU tensor would be refused beside GPU tensors, or a
    "like:" dtype would be read as a torch attribute)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="from_ints needs role 'in', an integer dtype"):
        TensorSpec(**{**dict(name="m", shape=["G"], dtypes=["int64"], from_ints=True, same_device=False), **bad})


_ODD_LAYOUTS = {
    "sparse_coo": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.reshape(t.shape[0], -1).to_sparse_csr(),
    "mkldnn": lambda t: t.to_mkldnn(),
    "nested": lambda t: torch.nested.nested_tensor(list(t)),
    "neg_view": lambda t: torch._neg_view(t),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", list(_ODD_LAYOUTS))
@pytest.mark.parametrize("which", ["first", "cached"])
def test_non_dense_or_lazy_tensors_are_a_spec_error(kind, which):
    """A sparse, mkldnn or nested tensor, or a lazy neg view, is refused by a SpecError naming op and tensor, first
    call or after the same pattern was cached with a dense tensor: the kernels read memory by strides (a CSR tensor
    failed in the cache key with a bare RuntimeError, an mkldnn one passed validation and failed in the reference,
    a neg view would reach the kernels un-negated)."""
    registry.clear_caches()
    op = registry.get("mhc_sinkhorn")
    logits = torch.randn(3, 2, 2)
    if which == "cached":
        for _ in range(3):
            op(logits)
            op(logits=logits)
    odd = _ODD_LAYOUTS[kind](torch.randn(3, 2, 2))
    for call in (lambda: op(odd), lambda: op(logits=odd), lambda: op.explain(odd)):
        with pytest.raises(SpecError, match="mhc_sinkhorn: tensor logits: expected a"):
            call()
    registry.clear_caches()


def test_explain_lists_every_failing_backend_limit():
    """backend_status's promise ("every unmet requirement is listed"): both failing limits of a backend, not the first
    only; a limit that holds is not named."""
    op = Op(_spec(Backend(name="torch", module="_tk_fake_backend", constraints=[
        Constraint(expr="C % 2 == 0", message="pairs"), Constraint(expr="T >= 1"),
        Constraint(expr="C <= 4", message="small")])))
    ok, why = {b: (o, w) for b, o, w in op.explain(torch.ones(2, 5))}["torch"]
    assert not ok and "C % 2 == 0" in why and "pairs" in why and "C <= 4" in why and "small" in why
    assert "T >= 1" not in why


def test_shape_error_names_the_dims_bound_from_other_tensors():
    """A_log sized for the key heads: mixed's width is wrong only through Hv, which A_log bound; the message gives
    Hv and where it came from (it named mixed and the params alone, hiding the mistake)."""
    Hk, Hv, dk, dv, W = 2, 4, 4, 3, 3
    conv = 2 * Hk * dk + Hv * dv
    mixed = torch.randn(5, conv + Hv * dv + 2 * Hv)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(SpecError, match=r"gdn_pre_gated: tensor mixed: .* for Hk=2, dk=4, dv=3, Hv=2 \(A_log's dim 0\)"):
        registry.get("gdn_pre_gated")(mixed, torch.randn(conv, W), torch.randn(Hk), torch.randn(Hk), cu,
                                      Hk=Hk, dk=dk, dv=dv)


def test_wrongly_typed_param_is_refused_while_traced():
    """A 0-dim tensor passed as an int param under torch.compile(fullgraph=True): the SpecError naming op and param
    (inside dynamo's error, as for every refused traced call), not dynamo's "repr() on tensor" while the message
    was being built."""
    torch._dynamo.reset()
    sk = registry.get("mhc_sinkhorn")
    f = torch.compile(lambda x: sk(x, iters=torch.tensor(5)), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"SpecError\('mhc_sinkhorn', 'param iters', 'a int', 'a Tensor'\)"):
        f(torch.randn(4, 3, 3))


def test_in_place_inputs_share_memory_with_no_other_argument():
    """gdn_decode writes conv_state and ssm_state in place: a mixed that lies inside conv_state (eager read the
    b / a sections it had just overwritten, compiled a copy: the two disagreed), or states overlapping each other,
    are refused before anything is written; disjoint views of one pool are fine (a model's layers' states). The
    same metadata after an accepted call (the validated-call cache, then its C-level guards from the third call)
    is checked again: the memory is the call's, not the pattern's."""
    from tilekernels.gdn import bench as gb

    registry.clear_caches()
    op = registry.get("gdn_decode")
    c = next(c for c in gb.cases("cpu") if c.op == "gdn_decode")
    args, params = c.make(c.dims, torch.device("cpu"))
    mixed, conv_state, cw, A, dt, ssm, idx = args
    flat = conv_state.clone().reshape(-1)
    inside = flat[:mixed.numel()].view(mixed.shape)
    before = flat.clone()
    with pytest.raises(SpecError, match="gdn_decode: tensor conv_state: expected memory that no other argument "
                                        "shares .* got bytes shared with mixed"):
        op(inside, flat.view(conv_state.shape), cw, A, dt, ssm.clone(), idx, **params)
    assert torch.equal(flat, before)
    n1, n2 = conv_state.nbytes, ssm.nbytes  # one byte pool (the states' dtypes may differ)

    def views(pool, off2):
        cs = pool[:n1].view(conv_state.dtype).view(conv_state.shape)
        ss = pool[off2:off2 + n2].view(ssm.dtype).view(ssm.shape)
        return cs, ss

    pool = torch.zeros(n1 + n2 + 64, dtype=torch.uint8)
    cs, ss = views(pool, n1 + 64 - n1 % 16)
    cs.copy_(conv_state)
    ss.copy_(ssm)
    for _ in range(3):  # disjoint views of one pool: accepted (validated, then cached, then guarded)
        op(mixed, cs, cw, A, dt, ss, idx, **params)
    cs, ss = views(pool, 16)  # ssm_state starts inside conv_state: the cached pattern's metadata, other memory
    kept = pool.clone()
    with pytest.raises(SpecError, match="gdn_decode: tensor conv_state: .* bytes shared with ssm_state"):
        op(mixed, cs, cw, A, dt, ss, idx, **params)
    assert torch.equal(pool, kept)
    flat2 = conv_state.clone().reshape(-1)  # mixed inside conv_state again, now at the cached pattern of its
    for _ in range(3):                      # disjoint call: refused, conv_state untouched
        op(mixed.clone(), flat2.view(conv_state.shape), cw, A, dt, ssm.clone(), idx, **params)
    inside2, before2 = flat2[:mixed.numel()].view(mixed.shape), flat2.clone()
    with pytest.raises(SpecError, match="gdn_decode: tensor conv_state: .* bytes shared with mixed"):
        op(inside2, flat2.view(conv_state.shape), cw, A, dt, ssm.clone(), idx, **params)
    assert torch.equal(flat2, before2)
    # storages over one memory (torch.from_dlpack of a view, as two torch.from_numpy of one array give): the
    # storages differ, the bytes do not. Disjoint: accepted; overlapping: refused on the cached pattern and on a
    # first call
    ext = lambda a, b: torch.from_dlpack(pool[a:b])  # noqa: E731
    aligned = n1 + 64 - n1 % 16
    cs = ext(0, n1).view(conv_state.dtype).view(conv_state.shape)
    ss = ext(aligned, aligned + n2).view(ssm.dtype).view(ssm.shape)
    op(mixed, cs, cw, A, dt, ss, idx, **params)
    ss = ext(16, 16 + n2).view(ssm.dtype).view(ssm.shape)
    assert cs.untyped_storage().data_ptr() != ss.untyped_storage().data_ptr()
    for fresh in (False, True):
        if fresh:
            registry.clear_caches()
        kept = pool.clone()
        with pytest.raises(SpecError, match="gdn_decode: tensor conv_state: .* bytes shared with ssm_state"):
            op(mixed, cs, cw, A, dt, ss, idx, **params)
        assert torch.equal(pool, kept)
    registry.clear_caches()


@pytest.mark.parametrize("dt", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.int64])
def test_device_value_rules_agree_with_host_ones_past_the_index_dtype(dt):
    """A value rule's device form (tensor ops) gives the host form's answer (Python ints) when an int
    in the rule lies outside the tensor's dtype: torch casts such a scalar to the tensor's dtype, so
    an int32 ``5 == 2**32 + 5`` held and ``max(...) < 2**60`` failed until _fit widened the tensor; an int past
    int64 (``2*cp`` for a cp of 2**63 - 1) wrapped for every dtype, or raised OverflowError, until _fit took it
    as +-inf."""
    xs = torch.tensor([0, 4, 5, 5], dtype=dt)
    big = [2**7, 2**8 + 5, 2**15, 2**16 + 5, 2**31, 2**32 + 5, 2**40, 2**60, -(2**40), -1, 2**63 - 1, 2**63,
           2**64 + 4, -(2**63) - 1, -(2**64)]
    exprs = ["max(values(x)) < k", "max(values(x)) == k", "k != min(values(x))", "k > max(values(x)) >= 0",
             "min(values(x)) >= k", "all_div(seqlens(x), k)", "all_div(values(x), 2*k)", "distinct(values(x), k)",
             "max(values(x)) <= k - 2**60", "k * 3 == max(values(x))"]
    for e in exprs:
        for k in big + [1, 5]:
            host = E.evaluate(e, {**E.constraint_env({"x": xs}, {"k": k}, {}, False)})
            dev = E.evaluate(e, {**E._DEVICE_ENV, "x": xs, "k": k}, device=True)
            assert bool(dev) == bool(host), (e, k, dt)
    assert E.evaluate("max(values(x)) == 5", {**E._DEVICE_ENV, "x": xs}, device=True).dtype == torch.bool
    # a reduction against an int its dtype cannot hold: decided without a device op (a Python bool)
    for e, want in (("max(values(x)) < 2**64", True), ("2**64 == max(values(x))", False)):
        assert E.evaluate(e, {**E._DEVICE_ENV, "x": xs}, device=True) is want


def test_grouped_m_splits_whose_int64_sum_wraps_are_refused_on_the_device(monkeypatch):
    """m_splits [2**62] * 4 + [4] adds up to 2**64 + 4, which a tensor sum wraps to 4 == M: the device form
    (a CUDA m_splits, forced here as the hot-path tests force it) took it, and the cute kernels' offsets
    (a device cumsum) would have run past the tensors. Entries above M are refused on both forms now."""
    import registry.validate as V

    ms = torch.tensor([2**62] * 4 + [4])
    assert int(ms.sum()) == 4
    x, w = torch.randn(4, 32), torch.randn(5, 8, 32)
    for on_host in (V._on_host, lambda t: t is None):
        monkeypatch.setattr(V, "_on_host", on_host)
        registry.clear_caches()
        with pytest.raises((SpecError, RuntimeError), match="m_splits"):
            registry.get("grouped_linear")(x, w, ms)
    registry.clear_caches()
