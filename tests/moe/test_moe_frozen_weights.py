"""Frozen MoE weights (``requires_grad=False`` bf16 masters: frozen experts, a LoRA's base weights):
the backward skips their wgrad GEMMs (a third of a grouped linear layer's backward work, and of
the MLP's) and gives every other gradient bitwise as the call whose weights require grad.

Before, the bwd kernels computed every weight gradient and autograd dropped the unwanted ones. Now
an op's declaration lists the inputs a kernel may skip (``Decl.skippable``), each backend's bwd
kernel says which it skips (``kernel(..., skips=)``), and the autograd backward hands those kernels
None for an input autograd needs no gradient of.

CPU: the registry's torch backend, and the cute backend's MLP glue with its CuTe DSL building
blocks replaced by torch stand-ins (``test_moe_cute_glue_emulated.py``'s fixture): a frozen weight
drops only its wgrad GEMM (and the x operand that only it reads); every other building block runs
as with the gradient, same arguments (so the same GPU kernel variants, each tested on the GPU by its
own file). cuda: the registry's pick (cute), against the same call with gradients.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import registry
import registry.kernels as K
from test_moe_cute_glue_emulated import ROUTES, _inputs, _nan, emulated  # noqa: F401 (a fixture)
from tilekernels.moe import bench as moeb
from tilekernels.moe import cute_kernels as ck
from tilekernels.testing import assert_close

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[cuda, pytest.mark.gpu])]
CASES = {f"{c.op}-{c.variant}" if c.variant else c.op: c for c in moeb.cases("cpu")
         if c.op in ("grouped_linear", "grouped_mlp_mxfp8")}
FROZEN = {"grouped_linear-bf16": [("weight",)], "grouped_linear-mxfp8": [("weight",)],
          "grouped_mlp_mxfp8": [("fc1_weight",), ("fc2_weight",), ("fc1_weight", "fc2_weight")]}
PARAMS = [pytest.param(k, f, id=f"{k}-{'+'.join(f)}") for k, fs in FROZEN.items() for f in fs]


def _run(op, args, params, names, frozen, gos=None):
    """fwd + bwd with ``frozen`` inputs not requiring grad, every other float input requiring it (x,
    probs, the other weights); returns (outputs, {name: grad}, grad outputs)."""
    leaves = [a.detach().clone().requires_grad_(n not in frozen and a.is_floating_point())
              if isinstance(a, torch.Tensor) else a for n, a in zip(names, args)]
    out = op(*leaves, **params)
    out = list(out) if isinstance(out, tuple) else [out]
    gos = gos or [torch.randn_like(o) for o in out]
    torch.autograd.backward(out, gos)
    grads = {n: a.grad for n, a in zip(names, leaves) if isinstance(a, torch.Tensor) and a.grad is not None}
    return [o.detach() for o in out], grads, gos


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case_id,frozen", PARAMS)
def test_frozen_weights_get_no_wgrad(case_id, frozen, device, monkeypatch):
    """The bwd kernel the registry picks gets None for each frozen weight; every other gradient and the
    outputs are bitwise those of the call whose weights all require grad, on the general path and on the
    Prepared call a seen metadata takes; FlopCounterMode (a dispatch mode around the Prepared call's backward,
    which then takes the general backward) counts the skipped wgrads out (as it does for the reference's
    autograd)."""
    case = CASES[case_id]
    op = registry.get(case.op)
    names = [t.name for t in op.spec.inputs]
    args, params = case.make(case.dims, torch.device(device))
    want_out, want, gos = _run(op, args, params, names, ())

    backend = op.choose(op.bind(*args, **params))
    key = (op.name, backend, "bwd")
    real, seen = K.get_kernel(*key), []
    bwd_names = [n for n, _, _ in op.entry.gen._bwd_sig()]

    def spy(*a):
        seen.append({n: v is None for n, v in zip(bwd_names, a) if n.startswith("d_")})
        return real(*a)
    monkeypatch.setitem(K._KERNELS, key, spy)
    for call in range(3):  # the third call of this metadata takes the registry pattern's Prepared call
        got_out, got, _ = _run(op, args, params, names, frozen, gos)
        assert len(seen) == call + 1 and all(seen[-1][f"d_{n}"] for n in frozen), (backend, seen)
        assert not any(v for n, v in seen[-1].items() if n[2:] not in frozen), (backend, seen)
        assert set(got) == set(want) - set(frozen)
        for i, (g, w) in enumerate(zip(got_out, want_out)):
            assert_close(g, w, "exact", what=f"{case_id} output {i}, {frozen} frozen, call {call}")
        for n in got:
            assert_close(got[n], want[n], "exact", what=f"{case_id} d{n}, {frozen} frozen, call {call}")

    monkeypatch.setitem(K._KERNELS, key, real)
    leaves = [a.detach().clone().requires_grad_(n not in frozen and a.is_floating_point())
              if isinstance(a, torch.Tensor) else a for n, a in zip(names, args)]
    out = op(*leaves, **params)
    with FlopCounterMode(display=False) as fc:
        torch.autograd.backward(list(out) if isinstance(out, tuple) else [out], gos)
    d = case.dims
    per = {"weight": 2 * d.get("M", 0) * d.get("N", 0) * d.get("K", 0),
           "fc1_weight": 4 * d["M"] * d.get("H", 0) * d.get("F", 0),
           "fc2_weight": 2 * d["M"] * d.get("H", 0) * d.get("F", 0)}
    full = case.flops_bwd(d)
    assert fc.get_total_flops() == full - sum(per[n] for n in frozen), (fc.get_total_flops(), full)


@pytest.mark.parametrize("case_id,frozen", PARAMS)
def test_frozen_weights_compiled(case_id, frozen, monkeypatch):
    """torch.compile(fullgraph=True) of the call with frozen weights: the bwd kernel gets None for them
    (the bwd op's optional gradient slots traced as None) and the results equal eager's at the suite's
    tolerance."""
    case = CASES[case_id]
    op = registry.get(case.op)
    names = [t.name for t in op.spec.inputs]
    args, params = case.make(case.dims, torch.device("cpu"))
    want_out, want, gos = _run(op, args, params, names, frozen)
    key = (op.name, "torch", "bwd")
    real, seen = K.get_kernel(*key), []
    bwd_names = [n for n, _, _ in op.entry.gen._bwd_sig()]
    monkeypatch.setitem(K._KERNELS, key, lambda *a: seen.append(
        {n[2:] for n, v in zip(bwd_names, a) if n.startswith("d_") and v is None}) or real(*a))
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a, **params), fullgraph=True)
    got_out, got, _ = _run(lambda *a: compiled(*a), args, {}, names, frozen, gos)
    assert seen == [set(frozen)], seen
    assert set(got) == set(want)
    for g, w in zip(got_out + [got[n] for n in sorted(got)], want_out + [want[n] for n in sorted(want)]):
        assert_close(g, w)


def test_declared_skips_are_skippable():
    """Every backend's skipped gradients are among its op's declared skippable inputs (whose gradient
    slot is optional in the bwd op's schema)."""
    for name in registry.names():
        op = registry.get(name)
        gen = getattr(op.entry, "gen", None)
        for b in op.spec.backends:
            try:
                skips = K.skipped_grads(name, b.name) if gen is not None and gen.bwd_op is not None else frozenset()
            except (ImportError, NotImplementedError):
                continue  # a backend without a bwd kernel, or whose toolchain this machine lacks
            assert skips <= set(gen.decl.skippable if gen else ()), (name, b.name, skips)


class _Log:
    """Every building block the cute MLP glue calls (over the emulated stand-ins), with its str
    arguments and which tensor arguments are None."""

    def __init__(self, monkeypatch):
        self.calls = []
        for mod, fn in ((ck, "_gemm_into"), (ck, "_weight_gemm"), (ck, "_weight_bf16"), (ck, "_qdq"),
                        (ck, "_qdq_both"), (ck, "_quant"), (ck.pq, "bf16_gemm_into"), (ck.cs, "swiglu_quant_bwd_into")):
            monkeypatch.setattr(mod, fn, self._wrap(fn, getattr(mod, fn)))

    def _wrap(self, name, real):
        def logged(*a):
            self.calls.append((name, tuple(v if isinstance(v, (str, bool)) else v is None for v in a)))
            return real(*a)
        return logged


@pytest.mark.parametrize("frozen", ["fc1", "fc2", "both", "fc2+fc1-prequantized"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_cute_glue_frozen_drops_only_the_wgrads(emulated, monkeypatch, route, frozen):  # noqa: F811
    """The cute MLP backward with None for frozen bf16 masters, along every GEMM route: dx, dprobs and the
    other weight's gradient bitwise the call with both gradients; the building blocks called are that
    call's, same arguments, minus the frozen weights' wgrad GEMMs and the columnwise x only fc1's reads.
    Also a frozen fc2 beside a pre-quantized fc1 (which has no gradient in either call)."""
    from mxfp8_gemm_helpers import prequant_weight

    emulated(route)
    m_splits = [64, 0, 96, 32]
    x, probs, ms, w1, w2, dy = _inputs(m_splits)
    M, H, F, G = x.shape[0], x.shape[1], w2.shape[2], len(m_splits)
    pre1 = frozen.endswith("prequantized")
    w1, s1 = prequant_weight(w1) if pre1 else (w1, None)
    h = _nan(M, 2 * F, dtype=torch.float32)
    ck._mlp_fwd(x, probs, ms, w1, w2, s1, None, _nan(M, H, dtype=torch.bfloat16), h, True)
    f1, f2 = frozen in ("fc1", "both"), frozen.startswith("fc2") or frozen == "both"
    runs, log = [], _Log(monkeypatch)
    for skip1, skip2 in ((pre1, False), (f1 or pre1, f2)):
        log.calls = []
        dx, dprobs = _nan(M, H, dtype=torch.bfloat16), _nan(M, dtype=torch.float32)
        d1 = None if skip1 else _nan(G, 2 * F, H, dtype=torch.bfloat16)
        d2 = None if skip2 else _nan(G, H, F, dtype=torch.bfloat16)
        ck._mlp_bwd(dy, x, probs, ms, w1, w2, s1, None, h, dx, dprobs, d1, d2, True)
        runs.append(((dx, dprobs, d1, d2), log.calls))
    (full, calls_full), (part, calls_part) = runs
    for name, g, w in zip(("dx", "dprobs", "dfc1", "dfc2"), part, full):
        if g is not None:
            assert_close(g, w, "exact", what=f"{name} ({frozen} frozen, {route})")
    wgrads = [c for c in calls_full if "wgrad" in c[1]]
    kept = [c for c in calls_part if "wgrad" in c[1]]
    assert len(kept) < len(wgrads) and all(c in wgrads for c in kept)
    dropped = list(calls_full)
    for c in calls_part:
        assert c in dropped, (c, route)
        dropped.remove(c)
    for name, a in dropped:  # only wgrads and what only fc1's wgrad reads (x, columnwise)
        assert "wgrad" in a or (f1 and name in ("_qdq", "_quant")), (name, a, route)


@pytest.mark.parametrize("precision", ["mxfp8", "bf16"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_cute_grouped_linear_frozen(emulated, monkeypatch, route, precision):  # noqa: F811
    """The cute grouped_linear backward with dweight None (a frozen weight), along every GEMM route:
    dx bitwise the call with dweight; no wgrad GEMM runs, every other building block as with it but
    the columnwise x only the wgrad reads. (precision "bf16" runs torch's _grouped_mm: stood in here.)"""
    emulated(route)
    if precision == "bf16":
        monkeypatch.setattr(ck.pq, "torch_gemm_into", ck.pq.bf16_gemm_into)
    x, _, ms, w1, _, _ = _inputs([64, 0, 96, 32])
    M, (G, N, K) = x.shape[0], w1.shape
    dy = torch.randn(M, N).to(torch.bfloat16)
    runs, log = [], _Log(monkeypatch)
    monkeypatch.setattr(ck.pq, "torch_gemm_into", log._wrap("torch_gemm_into", ck.pq.torch_gemm_into))
    for frozen in (False, True):
        log.calls = []
        dx = _nan(M, K, dtype=torch.bfloat16)
        dw = None if frozen else _nan(G, N, K, dtype=torch.bfloat16)
        ck._grouped_linear_bwd(dy, x, w1, ms, dx, dw, precision)
        runs.append((dx, log.calls))
    assert_close(runs[1][0], runs[0][0], "exact", what=f"dx ({route}, {precision})")
    assert not [c for c in runs[1][1] if "wgrad" in c[1]] and [c for c in runs[0][1] if "wgrad" in c[1]]
    dropped = list(runs[0][1])
    for c in runs[1][1]:
        assert c in dropped, (c, route)
        dropped.remove(c)
    for name, a in dropped:
        assert "wgrad" in a or name in ("_qdq", "_quant"), (name, a, route)



ODD_SPLITS = [30, 0, 67, 31, 1]  # no entry a multiple of 32 but 0


@pytest.mark.parametrize("op_name", ["grouped_linear", "grouped_mlp_mxfp8"])
def test_odd_splits_frozen_masters(op_name):
    """m_splits not % 32 with frozen bf16 masters and x (and probs) requiring grad: refused, although no weight
    gradient is asked for, because the cute backward still quantizes dY (and the MLP's dh and a) along the tokens
    for them (the same kernels as with the gradients, so dx is bitwise the same): the rule cannot depend on the
    backend. The reference's own autograd (what the refusal guards nothing of) computes no wgrad for a frozen
    weight: at these splits it gives dx (and dprobs) without tripping over the token blocks."""
    op = registry.get(op_name)
    x, probs, ms, w1, w2, _ = _inputs(ODD_SPLITS)
    if op_name == "grouped_linear":
        args, params, diff = [x, w1, ms], {"precision": "mxfp8"}, (0,)
    else:
        args, params, diff = [x, probs, ms, w1, w2], {}, (0, 1)
    leaves = [a.detach().clone().requires_grad_(i in diff) if a.is_floating_point() else a
              for i, a in enumerate(args)]
    with pytest.raises(registry.SpecError, match="multiple of 32 when gradients are needed"):
        op(*leaves, **params)
    out = op.reference(*leaves, **params)
    out.backward(torch.randn_like(out))
    for i in diff:
        assert leaves[i].grad is not None and torch.isfinite(leaves[i].grad).all()
