"""The C-level call guards in front of the validated-call cache (registry/guards.py).

A repeated call is answered by a per-op pattern whose tensor metadata torch's
TensorGuards checks in C++. These tests pin what that shortcut must never change:
a call that differs in any tensor's shape, strides, dtype or requires_grad, in a
param's value or type, in grad mode or in the backend asked for is validated again
(and refused when it is bad); value rules are skipped only for the very same,
unmodified tensors; a float zero param never takes the shortcut (0.0 and -0.0 are
different params); and with the guards unavailable the registry behaves the same.
"""
from __future__ import annotations

import pytest
import torch

import registry
import registry.core as C
import registry.guards as G
from registry import SpecError


def _agg_args(T=5, n=4, c=24):
    return torch.randn(T, n, c), torch.softmax(torch.randn(T, n), -1)


@pytest.fixture
def counted(monkeypatch):
    """Counts full validations (bind calls) made by the registry."""
    registry.clear_caches()
    calls = []
    real = C.bind
    monkeypatch.setattr(C, "bind", lambda *a, **k: calls.append(1) or real(*a, **k))
    yield calls
    registry.clear_caches()


def _pattern_hits(op, args, kwargs=None, backend="auto"):
    mode = (backend, torch.is_grad_enabled(), C.strict())
    return op._guards.lookup(tuple(args), kwargs or {}, mode) is not None


def test_probe_accepts_this_torch():
    """CI's torch has a TensorGuards that refuses every changed property the probe tries."""
    assert G.available()


def test_repeated_call_is_answered_by_the_guard(counted):
    op = registry.get("mhc_h_aggregate")
    x, h = _agg_args()
    ref = op(x, h)
    op(x, h)  # the slow key's second hit installs the pattern
    assert _pattern_hits(op, (x, h))
    n = len(counted)
    out = op(torch.randn_like(x), h.clone())  # new data, same metadata
    assert len(counted) == n and out.shape == ref.shape


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "requires_grad", "ndim"])
def test_changed_metadata_misses_the_guard_and_is_validated(counted, change):
    op = registry.get("mhc_h_aggregate")
    x, h = _agg_args()
    op(x, h)
    op(x, h)
    n = len(counted)
    if change == "shape":  # h's n no longer matches x's: refused
        bad, err = (x, torch.softmax(torch.randn(5, 3), -1)), "h_pre"
    elif change == "stride":  # x not contiguous: refused
        bad, err = (torch.randn(24, 4, 5).permute(2, 1, 0), h), "x"
    elif change == "dtype":
        bad, err = (x.to(torch.int32), h), "x"
    elif change == "ndim":
        bad, err = (x.reshape(5, -1), h), "x"
    else:  # a good call, but another cache entry (the grad path): validated once
        bad, err = (x.clone().requires_grad_(), h), None
    assert not _pattern_hits(op, bad)
    if err is None:
        op(*bad)
        assert len(counted) == n + 1
    else:
        with pytest.raises(SpecError, match=err):
            op(*bad)


def test_param_value_type_grad_mode_and_backend_are_part_of_the_pattern(counted):
    op = registry.get("mhc_sinkhorn")
    logits = torch.randn(6, 4, 4)
    op(logits, iters=5)
    op(logits, iters=5)
    assert _pattern_hits(op, (logits,), {"iters": 5})
    assert not _pattern_hits(op, (logits,), {"iters": 6})
    assert not _pattern_hits(op, (logits,), {"iters": 5.0})  # float 5.0 is not the int param 5
    assert not _pattern_hits(op, (logits,), {"iters": True})
    assert not _pattern_hits(op, (logits,), {"iters": 5}, backend="torch")
    with torch.no_grad():
        assert not _pattern_hits(op, (logits,), {"iters": 5})
    with pytest.raises(SpecError, match="iters"):
        op(logits, iters=0)  # out of range: validated, refused
    with pytest.raises(SpecError, match="iters"):
        op(logits, iters=5.5)


def test_float_zero_params_never_take_the_guard():
    """0.0 == -0.0 in Python, so a pattern holding a float zero could answer the other one."""
    name = "alpha_pre"
    pattern = G.CallGuards()
    x = torch.randn(2, 3)
    mode = ("auto", True, False)
    pattern.add((x,), {name: 0.0}, mode, "hit")
    assert pattern.lookup((x,), {name: 0.0}, mode) is None and pattern.lookup((x,), {name: -0.0}, mode) is None
    pattern.add((x,), {name: 0.5}, mode, "hit")
    assert pattern.lookup((x,), {name: 0.5}, mode)[G.HIT] == "hit"
    assert pattern.lookup((x,), {name: -0.5}, mode) is None
    assert pattern.lookup((x,), {name: float("nan")}, mode) is None


def test_non_plain_arguments_never_take_the_guard():
    pattern = G.CallGuards()
    x = torch.randn(2, 3)
    mode = ("auto", True, False)
    pattern.add((x, 3), {}, mode, "hit")  # a positional non-tensor
    pattern.add((x,), {"sections": [1, 2]}, mode, "hit")  # a sequence param
    pattern.add((x,), {"w": x}, mode, "hit")  # a tensor passed by keyword
    pattern.add((x.to_sparse(),), {}, mode, "hit")
    assert pattern._entries == []
    pattern.add((x, None), {}, mode, "hit")  # trailing optional input left None: fine
    assert pattern.lookup((x, None), {}, mode)[G.HIT] == "hit"
    assert pattern.lookup((x, x), {}, mode) is None


def test_value_rules_skipped_only_for_the_same_unmodified_tensors(counted):
    op = registry.get("grouped_linear")
    x, w, m = torch.randn(64, 32), torch.randn(2, 8, 32), torch.tensor([32, 32])
    op(x, w, m)
    op(x, w, m)
    op(x, w, m)
    assert _pattern_hits(op, (x, w, m))
    with pytest.raises(SpecError, match="m_splits must add up"):
        op(x, w, torch.tensor([32, 31]))  # another tensor, same metadata: checked
    m[0] = 10  # the same tensor written in place: version bump, checked
    with pytest.raises(SpecError, match="m_splits must add up"):
        op(x, w, m)
    with pytest.raises(SpecError, match="m_splits must add up"):
        op(x, w, m)  # a refused call is never remembered as checked
    m[0] = 32
    op(x, w, m)


@pytest.mark.parametrize("guards", [True, False], ids=["guards", "slow-key"])
@pytest.mark.parametrize("write", ["numpy", "data"])
def test_cpu_values_written_around_the_version_counter_are_checked(monkeypatch, counted, guards, write):
    """A CPU index tensor refilled through a numpy view or ``.data`` (no version bump; serving loops refill
    their pinned buffers so) is compared by its bytes: the bad values are refused, by both value caches (the
    C-level pattern's memo and the slow key's), and nothing is written."""
    if not guards:
        monkeypatch.setattr(G, "_STATE", [False])
    registry.clear_caches()
    op = registry.get("grouped_linear")
    x, w, m = torch.randn(64, 32), torch.randn(2, 8, 32), torch.tensor([32, 32])
    for _ in range(3):
        op(x, w, m)
    assert bool(_pattern_hits(op, (x, w, m))) == guards
    version = m._version
    (m.numpy() if write == "numpy" else m.data)[0] = 10
    assert m._version == version  # the write went around the counter
    with pytest.raises(SpecError, match="m_splits must add up"):
        op(x, w, m)
    (m.numpy() if write == "numpy" else m.data)[0] = 32
    op(x, w, m)
    registry.clear_caches()


def test_without_guards_the_registry_behaves_the_same(monkeypatch, counted):
    monkeypatch.setattr(G, "_STATE", [False])
    op = registry.get("mhc_h_aggregate")
    x, h = _agg_args()
    a = op(x, h)
    b = op(x, h)
    assert torch.equal(a, b) and op._guards._entries == []
    with pytest.raises(SpecError, match="h_pre"):
        op(x, torch.softmax(torch.randn(5, 3), -1))


def _quick(op, args, kwargs, mode):
    """The prepared call the registry's quick path would run for this call, or None (``CallGuards.lookup`` with
    ``quick``)."""
    e = op._guards.lookup(tuple(args), kwargs, mode, quick=True)
    return None if e is None else e[G.QUICK]


def test_quick_path_answers_only_what_the_full_path_would(counted, monkeypatch):
    """The registry's quick path (``Op.__call__``'s first lines, ``CallGuards.lookup(quick=True)``) gives a seen call
    the guard pattern's prepared call directly. It must take exactly the calls the full path would send to that
    prepared call, with the same result: the pattern's metadata, params (value and type), backend and grad mode,
    no fallback (which logs, or raises under TILEKERNELS_STRICT), no op whose calls convert or re-check values,
    and never under a torch.func transform (vmap still refused)."""
    from tilekernels._opgen import Prepared

    op = registry.get("mhc_sinkhorn")
    x = torch.randn(6, 4, 4)
    mode = ("torch", True, C.strict())
    want = op(x, iters=5, backend="torch")
    assert _quick(op, (x,), {"iters": 5}, mode) is None   # validated: no pattern yet
    for _ in range(2):
        op(x, iters=5, backend="torch")
    run = _quick(op, (x,), {"iters": 5}, mode)
    assert isinstance(run, Prepared) and run is op._guards.lookup((x,), {"iters": 5}, mode)[G.RUN]
    n = len(counted)
    y = torch.randn_like(x)
    assert torch.equal(op(y, iters=5, backend="torch"), op.reference(y, iters=5))
    assert torch.equal(op(x, iters=5, backend="torch"), want) and len(counted) == n
    real = G.CallGuards.lookup
    with monkeypatch.context() as m:  # Op.__call__ itself answers from the quick path: no full lookup, no validation
        m.setattr(G.CallGuards, "lookup", lambda self, a, k, mode, quick=False: real(self, a, k, mode, quick)
                  if quick else pytest.fail("the full path ran"))
        assert torch.equal(op(x, iters=5, backend="torch"), want)
        with pytest.raises(SpecError, match="backend"):  # (a backend of another type is still refused)
            op(x, iters=5, backend=["torch"])
    for args, kw, m in [((x,), {"iters": 6}, mode), ((x,), {"iters": 5.0}, mode), ((x,), {"iters": True}, mode),
                        ((x,), {}, mode), ((x,), {"iters": 5}, ("auto", True, mode[2])),
                        ((x,), {"iters": 5}, ("torch", False, mode[2])), ((x,), {"iters": 5}, ("torch", True, True)),
                        ((x.double(),), {"iters": 5}, mode), ((x.transpose(1, 2),), {"iters": 5}, mode),
                        ((x.clone().requires_grad_(),), {"iters": 5}, mode), ((x[:5],), {"iters": 5}, mode)]:
        assert _quick(op, args, kw, m) is None, (kw, m)
    with pytest.raises(SpecError, match="iters"):
        op(x, iters=5.5, backend="torch")
    with pytest.raises(NotImplementedError, match="vmap"):
        torch.vmap(lambda t: op(t, iters=5, backend="torch"))(x[None])
    # a fallback ("auto" on the CPU: logged once, raised under strict) keeps the full path
    for _ in range(3):
        op(x, iters=5)
    assert _quick(op, (x,), {"iters": 5}, ("auto", True, C.strict())) is None
    monkeypatch.setenv("TILEKERNELS_STRICT", "1")
    with pytest.raises(registry.BackendUnavailable, match="TILEKERNELS_STRICT"):
        op(x, iters=5)
    monkeypatch.delenv("TILEKERNELS_STRICT")
    # an op whose calls check values (grouped_linear's m_splits) never takes it
    gl = registry.get("grouped_linear")
    a, w, m = torch.randn(64, 32), torch.randn(2, 8, 32), torch.tensor([32, 32])
    for _ in range(3):
        gl(a, w, m, backend="torch")
    assert not gl._quick and all(e[G.QUICK] is None for e in gl._guards._entries)


def test_value_check_memo_is_for_the_very_tensors_it_checked():
    """The value-rule memo (validate's ``_CHECKED_VALUES``) keys a GPU tensor by id and version alone (its values
    cannot be read without a sync): a new tensor that reuses a freed one's id, version 0 again, would match the key.
    The memo then also holds weak references and answers only for the very same objects. Pinned on the helpers
    (CPython's id reuse cannot be forced): the key a tensor left does not count as checked for another tensor."""
    import registry.validate as V

    a, b = torch.tensor([4, 2]), torch.tensor([7, -1])
    key = ("op", "same metadata, id and version")
    V._remember_checked(key, ("m_splits",), {"m_splits": a})
    try:
        assert V._seen_checked(key, ("m_splits",), {"m_splits": a})
        assert not V._seen_checked(key, ("m_splits",), {"m_splits": b})
    finally:
        V._CHECKED_VALUES.pop(key, None)


def test_an_op_with_value_rules_never_takes_the_quick_path(counted):
    """An op whose rules read tensor values (gdn_pre_gated: cu_seqlens nondecreasing, from 0 to T) may not take
    the quick path, which runs a seen pattern's prepared call with no check at all: a later call of the same
    metadata with other values (a new cu_seqlens, or the checked one rewritten without a version bump) must still
    meet its value rules. Pinned on a call the quick path would otherwise take (a named backend, every input
    positional: grouped_linear above is kept off it by its int-list input already), through ``Op.__call__``:
    the bad values are refused after the pattern's Prepared call exists."""
    from tilekernels._opgen import Prepared

    op = registry.get("gdn_pre_gated")
    Hk, Hv, dk, dv, W, T = 1, 1, 2, 2, 2, 6
    p = dict(Hk=Hk, dk=dk, dv=dv, backend="torch")
    ins = [torch.randn(T, 2 * Hk * dk + 2 * Hv * dv + 2 * Hv), torch.randn(2 * Hk * dk + Hv * dv, W),
           torch.randn(Hv), torch.randn(Hv)]
    cu = torch.tensor([0, 3, T], dtype=torch.int32)
    want = op(*ins, cu, **p)
    for _ in range(3):  # the pattern made, its Prepared call built, then called
        got = op(*ins, cu, **p)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert any(isinstance(e[G.RUN], Prepared) for e in op._guards._entries), "no Prepared call: nothing pinned"
    with pytest.raises(SpecError, match="cu_seqlens must"):
        op(*ins, torch.tensor([0, 4, 3], dtype=torch.int32), **p)
    cu.numpy()[1:] = [T, 3]  # the checked tensor itself, rewritten as a serving loop refills it (no version bump)
    with pytest.raises(SpecError, match="cu_seqlens must"):
        op(*ins, cu, **p)
    assert not op._quick and all(e[G.QUICK] is None for e in op._guards._entries)
