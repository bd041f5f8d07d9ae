"""Registry core: binding, validation errors, layouts, backend choice, explain,
fallback logging and strict mode — on synthetic specs so every rule is hit."""
import logging

import pytest
import torch

import registry
from registry import BackendUnavailable, Op, SpecError
from specs.schema import Backend, Constraint, Dim, OpSpec, Param, TensorSpec


def make_spec(**over) -> OpSpec:
    base = dict(
        name="fake_op", family="mhc", doc="test op",
        dims=[Dim(name="T"), Dim(name="n", min=1, max=8), Dim(name="C", multiple_of=2)],
        inputs=[
            TensorSpec(name="x", shape=["T", "n", "C"], dtypes=["float32", "bfloat16"]),
            TensorSpec(name="y", shape=["T", "n*C"], dtypes="like:x", optional=True),
        ],
        outputs=[TensorSpec(name="out", role="out", shape=["T", "n", "C"], dtypes="like:x")],
        params=[
            Param(name="scale", type="float", default=1.0, min=0.0),
            Param(name="mode", type="str", default="a", choices=["a", "b"]),
            Param(name="n_heads", type="int", nullable=True, default=None, min=1),
        ],
        constraints=[Constraint(expr="C % n == 0 or n == 3", message="C must split over n")],
        reference="_tk_fake_backend:reference",
        entry="_tk_fake_backend:entry",
        backends=[
            Backend(name="cutile", module="_tk_fake_backend", sm=(90, 100), toolchain=["cutile"],
                    constraints=[Constraint(expr="n <= 4", message="one tile holds at most 4 streams")],
                    dtypes={"x": ["bfloat16"]}, tiling={"TILE_SIZE": 1}),
            Backend(name="torch", module="_tk_fake_backend"),
        ],
    )
    base.update(over)
    return OpSpec(**base)


@pytest.mark.parametrize("name", registry.names())
def test_ops_and_entries_pickle_by_reference(name):
    """A model that holds an op or its functional entry survives torch.save / pickle / deepcopy (EMA
    copies, multiprocessing spawn): both travel by name and come back as this process's objects."""
    import copy
    import pickle

    op = registry.get(name)
    assert pickle.loads(pickle.dumps(op)) is op and copy.deepcopy(op) is op and copy.copy(op) is op
    entry = op.entry
    assert f"{entry.__module__}:{entry.__qualname__}" == op.spec.entry
    for proto in (2, pickle.HIGHEST_PROTOCOL):  # 2: torch.save's default
        assert pickle.loads(pickle.dumps(entry, protocol=proto)) is entry


def test_an_op_outside_the_registry_refuses_to_pickle(op):
    import copy
    import pickle

    with pytest.raises(pickle.PicklingError, match="not the registry's op"):
        pickle.dumps(op)
    with pytest.raises(pickle.PicklingError, match="not the registry's op"):
        copy.deepcopy(op)


def test_traced_limits_keep_batch_dims_symbolic():
    """A usable backend's limit on a product of batch dims (the GPU kernels' int32 extents, e.g.
    ``T * n * C < 2**31``) is evaluated while torch.compile traces. Its ``*`` and ``**`` must not
    read a SymInt's bit length, or every T compiles its own graph. On the CPU the torch backend
    carries such a limit here (the real ones sit on GPU backends, refused on a CPU before their
    limits are read)."""
    from torch._dynamo.utils import counters

    spec = make_spec(entry="_tk_fake_backend:traced_entry", backends=[Backend(
        name="torch", module="_tk_fake_backend",
        constraints=[Constraint(expr="T * n * C < 2**40 and (T * n) ** 2 >= 0", message="int extents")])])
    fake = Op(spec)
    fake.entry  # noqa: B018 - imported outside the trace, as registry.get does
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda x: fake(x), fullgraph=True)
    for T in (5, 9, 13):
        x = torch.randn(T, 2, 4)
        assert torch.equal(f(x), x)
    assert counters["stats"]["unique_graphs"] == 2  # the first size specialized, then one dynamic graph


def test_pickled_op_loads_in_a_fresh_process():
    import pickle
    import subprocess
    import sys

    blob = pickle.dumps((registry.get("mhc_h_aggregate"), registry.get("mhc_h_aggregate").entry))
    code = ("import pickle, sys, torch; op, fn = pickle.loads(sys.stdin.buffer.read()); "
            "x = torch.randn(3, 2, 8, dtype=torch.bfloat16); h = torch.rand(3, 2); "
            "assert torch.equal(op(x, h, backend='torch'), fn(x, h)); print(op.name)")
    r = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=300)
    assert r.returncode == 0 and r.stdout.decode().strip() == "mhc_h_aggregate", r.stderr.decode()[-3000:]


@pytest.fixture
def op():
    import _tk_fake_backend

    _tk_fake_backend.CALLS.clear()
    return Op(make_spec())


def err(fn, *a, **k) -> str:
    with pytest.raises(SpecError) as e:
        fn(*a, **k)
    msg = str(e.value)
    assert msg.startswith("fake_op: "), msg
    return msg


def test_get_and_names():
    assert "mhc_h_aggregate" in registry.names()
    assert registry.get("mhc_h_aggregate").spec.name == "mhc_h_aggregate"
    with pytest.raises(SpecError, match="registry: op name"):
        registry.get("no_such_op")


def test_valid_call_binds_dims_and_defaults(op):
    x = torch.randn(3, 2, 4)
    b = op.bind(x, torch.randn(3, 8))
    assert b.dims == {"T": 3, "n": 2, "C": 4}
    assert b.params == {"scale": 1.0, "mode": "a", "n_heads": None}
    assert torch.equal(op(x, scale=2), x * 2)


def test_tensor_errors(op):
    x = torch.randn(3, 2, 4)
    assert "tensor x: expected a torch.Tensor, got nothing" in err(op)
    assert "tensor x: expected a torch.Tensor, got list" in err(op, [1.0])
    assert "dtype in ['float32', 'bfloat16'], got float16" in err(op, x.half())
    assert "tensor y: expected dtype in ['float32'], got bfloat16" in err(op, x, torch.randn(3, 8).bfloat16())
    assert "expected 3 dims [T, n, C], got 2 dims" in err(op, torch.randn(3, 4))
    assert ("tensor y: expected shape [T, n*C] with dim 1 (n*C) = 8 for n=2 (x's dim 1), C=4 (x's dim 2), got [3, 7]"
            in err(op, x, torch.randn(3, 7)))
    strided = torch.randn(3, 4, 2).transpose(1, 2).contiguous().transpose(1, 2)[:, :, :].permute(0, 1, 2)
    assert "contiguous" in err(op, strided.as_strided((3, 2, 4), (8, 1, 2)))
    assert "device cpu" in err(op, x, torch.empty(3, 8, device="meta"))
    assert "unknown argument" in err(op, x, bogus=1)
    assert "given both positionally and by keyword" in err(op, x, x=x)


def test_dim_rules(op):
    """The errors name the tensor (and its dim) each size came from."""
    assert "dim n (tensor x's dim 1): expected 1 <= n <= 8, got 9" in err(op, torch.randn(2, 9, 18))
    assert "dim C (tensor x's dim 2): expected a multiple of 2, got 3" in err(op, torch.randn(2, 1, 3))


def test_odd_args_are_spec_errors(op):
    """An unhashable backend, an int past int64 for an int param or past the float range for a float
    one: SpecErrors naming what was wrong (they had escaped as TypeError / OverflowError / the
    expression language's bound error)."""
    x = torch.randn(3, 2, 4)
    assert "backend: expected 'auto' or one of" in err(op, x, backend=["torch"])
    sink = registry.get("mhc_sinkhorn")
    for kw, want in ((dict(iters=10 ** 80), "mhc_sinkhorn: param iters: expected an int64"),
                     (dict(eps=10 ** 400), "mhc_sinkhorn: param eps: expected a finite float")):
        with pytest.raises(SpecError, match=want):
            sink(torch.randn(3, 4, 4), **kw)
        with pytest.raises(SpecError, match=want):
            sink.explain(torch.randn(3, 4, 4), **kw)


def test_param_rules(op):
    x = torch.randn(3, 2, 4)
    assert "param scale: expected >= 0.0, got -1.0" in err(op, x, scale=-1.0)
    assert "param scale: expected a float, got str" in err(op, x, scale="big")
    assert "param mode: expected one of ['a', 'b'], got 'c'" in err(op, x, mode="c")
    assert "param n_heads: expected a int, got bool" in err(op, x, n_heads=True)
    assert op.bind(x, n_heads=None).params["n_heads"] is None


def test_constraint_names_values(op):
    msg = err(op, torch.randn(2, 4, 6))
    assert "constraint 'C % n == 0 or n == 3'" in msg and "C=6" in msg and "n=4" in msg
    assert "C must split over n" in msg
    op(torch.randn(2, 3, 4))  # the 'or' branch


def test_explain_lists_every_unmet_requirement(op):
    x = torch.randn(2, 8, 8)
    rows = dict((b, (ok, why)) for b, ok, why in op.explain(x))
    ok, why = rows["cutile"]
    assert not ok
    assert "supports x in ['bfloat16'], got float32" in why
    assert "'n <= 4' fails with n=8" in why and "one tile holds at most 4 streams" in why
    assert "needs a CUDA device" in why
    assert rows["torch"][0]


def test_explain_names_the_passes_the_call_needs():
    """A gradient-requiring input of an op with no backward (mxfp8_quantize: not differentiable, outputs detached)
    needs the forward only: the torch row said "(fwd+bwd)" whenever an input required grad. A differentiable op's
    row says it."""
    x = torch.randn(64, 64, requires_grad=True)
    why = dict((b, w) for b, _, w in registry.get("mxfp8_quantize").explain(x))["torch"]
    assert why == "torch reference: runs on any device", why
    t = torch.randn(2, 4, 8, requires_grad=True)
    h = torch.rand(2, 4)
    why = dict((b, w) for b, _, w in registry.get("mhc_h_aggregate").explain(t, h))["torch"]
    assert why == "torch reference: runs on any device (fwd+bwd)", why


def test_runs_reference_is_the_torch_backends_field():
    # explain and the fallback log call a torch backend "the torch reference" only when its spec says it is one
    # (the CP ops' torch backends gather through index maps); the flag means nothing on a GPU backend
    assert Backend(name="torch", module="m.n", runs_reference=False).runs_reference is False
    with pytest.raises(ValueError, match="runs_reference is the torch backend's field"):
        Backend(name="cutile", module="m.n", runs_reference=False)


def test_fallback_logged_once_and_strict(op, caplog, monkeypatch):
    import _tk_fake_backend

    x = torch.randn(2, 2, 4)
    monkeypatch.setattr(registry.core, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="tilekernels"):
        op(x)
        op(x)
    warnings = [r for r in caplog.records if "falling back to the torch reference" in r.getMessage()]
    assert len(warnings) == 1 and "cutile:" in warnings[0].getMessage()
    assert _tk_fake_backend.CALLS == ["torch", "torch"]
    monkeypatch.setenv("TILEKERNELS_STRICT", "1")
    with pytest.raises(BackendUnavailable, match="TILEKERNELS_STRICT"):
        op(x)
    assert _tk_fake_backend.CALLS == ["torch", "torch"]  # nothing ran


def test_forced_backend(op):
    x = torch.randn(2, 2, 4)
    with pytest.raises(BackendUnavailable, match="fake_op: backend: expected cutile to be usable"):
        op(x, backend="cutile")
    assert "expected 'auto' or one of ['cutile', 'torch']" in err(op, x, backend="cuda")
    assert torch.equal(op(x, backend="torch"), x)


def test_bad_input_runs_nothing(op):
    import _tk_fake_backend

    for bad in (lambda: op(torch.randn(2, 9, 18)), lambda: op(torch.randn(2, 2, 4), mode="z")):
        with pytest.raises(SpecError):
            bad()
    assert _tk_fake_backend.CALLS == []


def test_layouts():
    spec = make_spec(
        name="fake_op",
        layouts={"bshd": "not present(cu)", "thd": "present(cu)"},
        dims=[Dim(name="B"), Dim(name="T"), Dim(name="D"), Dim(name="N1")],
        inputs=[
            TensorSpec(name="x", shape={"bshd": ["B", "T", "D"], "thd": ["T", "D"]}, dtypes=["float32"]),
            TensorSpec(name="cu", shape={"bshd": ["N1"], "thd": ["N1"]}, dtypes=["int32"],
                       optional=True, same_device=False),
        ],
        outputs=[TensorSpec(name="out", role="out", shape={"bshd": ["B", "T", "D"], "thd": ["T", "D"]},
                            dtypes="like:x")],
        constraints=[Constraint(expr="last(values(cu)) == T", when="present(cu)", message="cu_seqlens ends at T")],
        backends=[Backend(name="torch", module="_tk_fake_backend")],
    )
    op = Op(spec)
    assert op.bind(torch.randn(2, 5, 3)).layout == "bshd"
    b = op.bind(torch.randn(5, 3), cu=torch.tensor([0, 2, 5], dtype=torch.int32))
    assert b.layout == "thd" and b.dims["T"] == 5
    msg = err(op, torch.randn(5, 3), cu=torch.tensor([0, 2, 4], dtype=torch.int32))
    assert "cu_seqlens ends at T" in msg and "values(cu)=(0, 2, 4)" in msg
    assert "expected 2 dims [T, D]" in err(op, torch.randn(2, 5, 3), cu=torch.tensor([0, 5], dtype=torch.int32))


def test_device_error_names_the_tensor_the_device_came_from():
    """The expected device is the first same-device tensor's; a leading same_device=False input (a CPU cu_seqlens
    beside GPU tensors is allowed) is not the one to name (the message used to name the first input, here cu)."""
    spec = make_spec(
        inputs=[
            TensorSpec(name="cu", shape=["N"], dtypes=["int32"], same_device=False),
            TensorSpec(name="x", shape=["T", "n", "C"], dtypes=["float32"]),
            TensorSpec(name="y", shape=["T", "n*C"], dtypes="like:x", optional=True),
        ],
        dims=[Dim(name="T"), Dim(name="n", min=1, max=8), Dim(name="C", multiple_of=2), Dim(name="N")],
    )
    op = Op(spec)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    msg = err(op.bind, cu, torch.empty(3, 2, 4, device="meta"), torch.randn(3, 8))
    assert "tensor y: expected device meta (like x), got cpu" in msg, msg
    assert op.bind(cu, torch.empty(3, 2, 4, device="meta")).dims["T"] == 3   # cu may sit on another device


def test_spec_schema_rejects_inconsistency():
    with pytest.raises(ValueError, match="unknown dims"):
        make_spec(inputs=[TensorSpec(name="x", shape=["T", "Q"], dtypes=["float32"])])
    with pytest.raises(ValueError, match="torch backend"):
        make_spec(backends=[Backend(name="cutile", module="m", toolchain=["cutile"])])
    with pytest.raises(ValueError, match="names unknown"):
        make_spec(constraints=[Constraint(expr="Z > 1")])
    with pytest.raises(ValueError, match="names unknown"):
        make_spec(constraints=[Constraint(expr="__import__('os') is None")])
    with pytest.raises(ValueError, match="allowed"):
        Constraint(expr="(lambda: 1)()")
    with pytest.raises(ValueError, match="not allowed"):
        Constraint(expr="x.shape[0] > 1")


@pytest.mark.parametrize("e", ["H % 256 == 0", "n*n + 2*n", "1 < n <= 8", "a if n > 2 else b",
                               "not present(t) or n in (1, 2)", "all_div(xs, 2) and min(xs) >= 0",
                               "n // 3 - n / 4 + n ** 2", "-n", "present(t) and n"])
def test_compiled_and_tree_evaluation_agree(e):
    from specs import expr as ex

    env = {"H": 512, "n": 3, "a": 1, "b": 2, "t": None, "xs": (2, 4), "present": lambda t: t is not None,
           "all_div": lambda xs, k: all(x % k == 0 for x in xs), "min": min}
    assert ex.evaluate(e, env) == ex.evaluate_tree(e, env)


def test_expressions_reach_no_builtins():
    from specs import expr as ex

    with pytest.raises(ex.ExprError, match="unknown name"):
        ex.evaluate("len(x) > 0", {"x": (1,)})
    with pytest.raises(ex.ExprError, match="unknown name"):
        ex.evaluate("__import__('os') is None", {})
    # the registry's compiled forms (host and device): every name is a parameter bound from the env, so
    # their globals (builtins with only __import__, for C code torch runs from the frame) stay out of reach
    from registry import exprs as rx

    for device in (False, True):
        for e in ("__import__('os') is None", "__builtins__ is None", "_tk_mul(1, 2) == 2", "len(x) > 0"):
            with pytest.raises(ex.ExprError, match="unknown name"):
                rx.evaluate(e, {"x": (1,)}, device=device)
        fn, names = rx._fn("a * b ** 2 if a else -b", device)
        assert set(fn.__code__.co_names) <= {"_tk_mul", "_tk_pow", "_tk_if"}, fn.__code__.co_names


def test_validated_calls_are_cached_by_metadata(op, monkeypatch):
    """A call whose inputs have the metadata of an earlier validated call (shape, strides,
    dtype, device, requires_grad), the same params, grad mode and strictness skips
    bind + choose; anything else is validated again, and still refused when bad."""
    import _tk_fake_backend

    binds = []
    real = registry.core.bind
    monkeypatch.setattr(registry.core, "bind", lambda *a: binds.append(1) or real(*a))
    x, x2 = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    op(x, scale=2.0)
    op(x2, scale=2.0)  # new data, same metadata: cached
    assert len(binds) == 1 and _tk_fake_backend.CALLS == ["torch", "torch"]
    op(x, scale=3.0)
    op(x.requires_grad_())
    with torch.no_grad():
        op(x)
    assert "a contiguous tensor" in err(op, torch.randn(2, 4, 2).transpose(1, 2))  # other strides
    assert len(binds) == 5
    assert "dtype in ['float32', 'bfloat16']" in err(op, x.detach().double())
    assert "C must split over n" in err(op, torch.randn(2, 4, 6))
    assert "expected one of ['a', 'b']" in err(op, x, mode="z")
    op(x2, scale=2.0)
    monkeypatch.setenv("TILEKERNELS_STRICT", "1")
    with pytest.raises(BackendUnavailable, match="TILEKERNELS_STRICT"):
        op(x2, scale=2.0)  # strictness is part of the key: validated again, refused


def test_value_rule_specs_are_cached_but_values_checked_every_call(monkeypatch):
    """Specs with rules on tensor values use the metadata cache too (bind runs once),
    but the value rules run on every call: a bad value under cached metadata is refused."""
    op = registry.get("grouped_linear")
    registry.clear_caches()
    binds = []
    real = registry.core.bind
    monkeypatch.setattr(registry.core, "bind", lambda *a: binds.append(1) or real(*a))
    x, w = torch.randn(6, 32), torch.randn(2, 8, 32)
    op(x, w, torch.tensor([4, 2]))
    op(x, w, torch.tensor([1, 5]))
    assert len(binds) == 1
    with pytest.raises(SpecError, match="m_splits must add up to the token count M"):
        op(x, w, torch.tensor([4, 4]))
    with pytest.raises(SpecError, match="m_splits entries must be >= 0"):
        op(x, w, torch.tensor([7, -1]))
    assert len(binds) == 1


def test_cache_hit_uses_this_calls_params_and_relogs_fallback(op, caplog, monkeypatch):
    """A hit gets its own params (normalised like bind: int -> float), and the fallback
    warning logic still runs (a reset of the once-only log shows it again)."""
    x = torch.randn(2, 2, 4)
    op(x, scale=0.0)
    out = op(x, scale=-0.0)  # same key (0.0 == -0.0): its own value is passed
    assert torch.equal(torch.signbit(out), ~torch.signbit(x))
    assert torch.equal(op(x, scale=2), 2 * x)
    monkeypatch.setattr(registry.core, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="tilekernels"):
        op(x, scale=-0.0)
    assert any("falling back to the torch reference" in r.getMessage() for r in caplog.records)


def test_value_reading_rules_are_detected():
    from registry.validate import reads_values as _reads_values

    t = {"x", "cu"}
    assert _reads_values("max(values(cu)) == T", t) and _reads_values("sum(cu) > 0", t)
    assert _reads_values("any(x)", t)
    assert not _reads_values("dtype(x) == 'float32' and ndim(cu) == 1 and present(x)", t)
    assert not _reads_values("max(T, n) < 2**31", t)
    registry.clear_caches()


# ---------------------------------------------------------------- pinned by a mutation audit of registry/validate.py
# Each test below failed on a small change to the validation code (a dropped or weakened check, a message that lost
# what it must name) that the tests above let pass.


def test_dim_below_its_minimum_is_refused(op):
    """A dim's lower bound is checked, not only its upper one: n = 0 streams (min 1) would hand the kernels an
    empty stream axis to divide by; the error names the dim, the tensor dim it came from and the size."""
    assert "dim n (tensor x's dim 1): expected 1 <= n <= 8, got 0" in err(op, torch.randn(2, 0, 4))
    assert op.bind(torch.randn(2, 1, 4)).dims["n"] == 1   # the bound itself is allowed


def test_literal_sizes_in_a_shape_are_checked():
    """A shape entry given as an int (a fixed size, e.g. a 4-wide gate vector) is checked like a dim expression: a
    tensor whose size there differs is refused, naming tensor, expected shape and the size got."""
    spec = make_spec(inputs=[TensorSpec(name="x", shape=["T", "n", "C"], dtypes=["float32"]),
                             TensorSpec(name="y", shape=["T", 4], dtypes="like:x", optional=True)])
    op = Op(spec)
    x = torch.randn(3, 2, 4)
    assert op.bind(x, torch.randn(3, 4)).dims == {"T": 3, "n": 2, "C": 4}
    msg = err(op, x, torch.randn(3, 5))
    assert "tensor y: expected shape [T, 4] with dim 1 (4) = 4, got [3, 5]" in msg, msg


def test_non_contiguous_error_gives_the_strides_and_shape(op):
    """The contiguity error says what was got: the tensor's strides and shape (a transposed view's), so a user
    sees which dim is out of order, not only that one is."""
    bad = torch.randn(2, 4, 2).transpose(1, 2)
    msg = err(op, bad)
    assert "tensor x: expected a contiguous tensor, got strides (8, 1, 2) for shape (2, 2, 4)" in msg, msg


def test_a_required_param_left_out_is_named_as_required():
    """A required param (cp's ``cp``: no default) left out is refused as missing, "got nothing (it is required)",
    not as a None the caller never passed; passing it binds."""
    op = Op(make_spec(params=[Param(name="parts", type="int", required=True, min=1)]))
    x = torch.randn(3, 2, 4)
    assert "param parts: expected a int, got nothing (it is required)" in err(op, x)
    assert op.bind(x, parts=2).params == {"parts": 2}


def test_a_call_matching_two_layouts_is_refused():
    """Layout conditions must pick exactly one layout: a call that two of them accept (a spec whose conditions
    overlap) is refused naming both, not bound with whichever comes first (its shapes, and the kernels' indexing,
    would then be a guess)."""
    spec = make_spec(
        layouts={"flat": "ndim(x) == 2", "wide": "ndim(x) >= 2"},
        dims=[Dim(name="T"), Dim(name="D")],
        inputs=[TensorSpec(name="x", shape={"flat": ["T", "D"], "wide": ["T", "D"]}, dtypes=["float32"])],
        outputs=[TensorSpec(name="out", role="out", shape={"flat": ["T", "D"], "wide": ["T", "D"]},
                            dtypes="like:x")],
        constraints=[], backends=[Backend(name="torch", module="_tk_fake_backend")])
    msg = err(Op(spec), torch.randn(2, 3))
    assert "layout: expected exactly one of" in msg and "got ['flat', 'wide']" in msg, msg


def test_every_entry_of_an_ints_param_is_range_checked():
    """An ``ints`` param's bounds apply to each entry (cp's split_sections: sizes >= 1), the last one too; the
    error names the param, the bounds and the list got. The bounds print as the ints they are: Param stores them
    as floats, and the message said "every entry in [1.0, 64.0]" (an audit's find); one bound alone prints
    alone, not as "[1.0, None]"."""
    op = Op(make_spec(params=[Param(name="sections", type="ints", nullable=True, default=None, min=1, max=64)]))
    x = torch.randn(3, 2, 4)
    assert op.bind(x, sections=[1, 64]).params["sections"] == (1, 64)
    for bad in ([2, 0], (1, 65)):
        msg = err(op, x, sections=bad)
        assert f"param sections: expected every entry in [1, 64], got {tuple(bad)}" in msg, msg
    for bounds, want in [(dict(min=1), "every entry >= 1"), (dict(max=64), "every entry <= 64")]:
        one = Op(make_spec(params=[Param(name="sections", type="ints", nullable=True, default=None, **bounds)]))
        assert f"param sections: expected {want}, got (0, 65)" in err(one, x, sections=[0, 65])


def test_an_int_params_bounds_print_as_ints():
    """An int param's refusal prints its bounds as ints ("expected >= 1, got 0"), not as the floats Param stores
    ("expected >= 1.0"); a float param's keep their float form ("expected >= 0.0")."""
    op = Op(make_spec(params=[Param(name="parts", type="int", default=2, min=1, max=8),
                              Param(name="scale", type="float", default=1.0, min=0, max=2.5)]))
    x = torch.randn(3, 2, 4)
    assert "param parts: expected >= 1, got 0" in err(op, x, parts=0)
    assert "param parts: expected <= 8, got 9" in err(op, x, parts=9)
    assert "param scale: expected >= 0.0, got -1.0" in err(op, x, scale=-1.0)
    assert "param scale: expected <= 2.5, got 3.0" in err(op, x, scale=3.0)


def test_explain_lists_backends_in_preference_order(op):
    """explain's rows come in the spec's preference order (the order ``auto`` tries them), so its first usable
    row is the backend a call runs."""
    assert [name for name, _, _ in op.explain(torch.randn(2, 2, 4))] == ["cutile", "torch"]


def test_a_gpu_backend_refuses_a_device_past_its_sm_range():
    """A GPU backend lists an SM range: a device above it (sm_120 for sm_90..sm_100 kernels) is refused as well as
    one below it, the reason naming both (no GPU needed: the SM is given)."""
    from registry.core import machine_reasons

    b = make_spec().backend("cutile")
    for sm in (80, 120):
        why, got = machine_reasons(b, torch.device("cuda", 0), sm=sm)
        assert got == sm and f"device is sm_{sm}; cutile kernels need sm_90..sm_100" in why, why
    why, _ = machine_reasons(b, torch.device("cuda", 0), sm=100)
    assert not any("device is sm_" in w for w in why), why


def test_surplus_positional_arguments_are_refused(op):
    """More positional arguments than the spec has tensors (a param passed positionally, one tensor too many) is
    refused, naming the count and the tensors taken, not silently cut to the first ones."""
    x = torch.randn(3, 2, 4)
    assert "arguments: expected at most 2 positional tensors ['x', 'y'], got 3" in err(op, x, torch.randn(3, 8), 2.0)


def test_a_backend_without_a_backward_is_refused_when_a_gradient_is_needed():
    """A backend that implements the forward pass only is refused for a call that needs a gradient (its backward
    would fail after the forward ran), the reason saying so; the same call without gradients does not name it."""
    spec = make_spec(differentiable=True, backends=[
        Backend(name="cutile", module="_tk_fake_backend", sm=(90, 100), toolchain=["cutile"], passes=["fwd"]),
        Backend(name="torch", module="_tk_fake_backend")])
    op = Op(spec)
    why = dict((b, w) for b, _, w in op.explain(torch.randn(2, 2, 4, requires_grad=True)))["cutile"]
    assert "cutile has no bwd kernel and a gradient is needed" in why, why
    why = dict((b, w) for b, _, w in op.explain(torch.randn(2, 2, 4)))["cutile"]
    assert "no bwd kernel" not in why, why


def test_a_cached_call_on_another_device_is_validated_again(op):
    """The validated-call cache keys a tensor's device with its metadata: a second call whose second tensor moved
    to another device (same shape, strides, dtype) is validated again and refused, not answered from the first
    call's entry."""
    x = torch.randn(3, 2, 4)
    op(x, torch.randn(3, 8))
    assert "tensor y: expected device cpu (like x), got meta" in err(op, x, torch.empty(3, 8, device="meta"))
