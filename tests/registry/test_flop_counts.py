"""``torch.utils.flop_counter.FlopCounterMode`` counts the same flops for a registry call as for the
op's torch reference, forward and backward: the flop formulas the ops register (``Decl.flops``) are
checked here against what the counter counts when the reference runs in the op's place (its mm /
bmm; elementwise math counts 0 in both).

Why it matters: MFU readings (Lightning's ``measure_flops``, a FlopCounterMode around a training
step) and flop-driven checkpointing planners see a custom op as a black box. Before the formulas,
every op counted 0 flops, so a MoE layer's three grouped GEMMs vanished from an MFU reading, and a
planner would rate recomputing them as free.

Shapes: each case's own, its batch dim grown (the formula must follow it), and for mHC a second
stream count (n = 3), so a formula with a wrong power of n cannot match at both.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import registry
from registry_gpu_helpers import CASES, DEVICES, IDS, _leaf_pos, _fresh, _outs, batch_sizes



def _counts(call, args, leaf_pos) -> tuple[int, int | None]:
    """(forward flops, backward flops or None) of ``call`` on fresh leaves, each pass in its own counter."""
    a = _fresh(args, leaf_pos)
    with FlopCounterMode(display=False) as fwd:
        out = [o for o in _outs(call(*a)) if o.requires_grad]
    if not out:
        return fwd.get_total_flops(), None
    with FlopCounterMode(display=False) as bwd:
        torch.autograd.backward(out, [torch.ones_like(o) for o in out])
    return fwd.get_total_flops(), bwd.get_total_flops()


def _shapes(case) -> list[dict]:
    dims = [dict(case.dims), batch_sizes(case)[1][0]]
    if "n" in case.dims:
        dims.append({**case.dims, "n": 3})
    return dims


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_flops_counted_as_for_the_reference(case, device):
    op = registry.get(case.op)
    for dims in _shapes(case):
        args, params = case.make(dims, torch.device(device))
        leaf_pos = _leaf_pos(op, case, args)
        want = _counts(lambda *a: op.reference(*a, **params), args, leaf_pos)
        got = _counts(lambda *a: op(*a, **params), args, leaf_pos)
        assert got == want, f"{case.op} {dims}: (fwd, bwd) flops {got}, the reference's {want}"


def test_flop_formulas_cover_every_op_the_reference_counts():
    """An op whose reference does matmul work registers formulas (else it would count 0): every op but
    those whose reference counts 0 at every case shape (asserted by the test above) has them."""
    from torch.utils.flop_counter import flop_registry

    with_flops = {c.op for c in CASES if c.flops_fwd is not None}
    for name in registry.names():
        gen = getattr(registry.get(name).entry, "gen", None)
        if gen is None or not gen.decl.flops:
            continue
        assert gen.fwd_alloc_op is None or getattr(torch.ops.tilekernels, name) in flop_registry
        assert getattr(torch.ops.tilekernels, f"{name}_fwd") in flop_registry
        assert gen.bwd_op is None or getattr(torch.ops.tilekernels, f"{name}_bwd") in flop_registry
    assert {"grouped_linear", "grouped_mlp_mxfp8", "mhc_proj_rms", "mhc_pre", "mhc_post_pre"} <= {
        n for n in with_flops if registry.get(n).entry.gen.decl.flops}


def test_prequantized_weights_count_no_wgrad():
    """grouped_mlp_mxfp8 with both weights pre-quantized (frozen e4m3 + scales): no weight gradient, so the
    backward counts the two dgrads only (6*M*H*F), as the reference's autograd does."""
    case = next(c for c in CASES if c.op == "grouped_mlp_mxfp8")
    op, quant = registry.get(case.op), registry.get("mxfp8_quantize")
    args, params = case.make(case.dims, torch.device("cpu"))
    x, probs, ms, w1, w2 = args[:5]
    q = []
    for w in (w1, w2):
        G, N, K = w.shape
        d, s = quant(w.detach().reshape(G * N, K), axis="rowwise")
        q += [d.view(G, N, K), s.view(G, N, K // 32)]
    pre = (x, probs, ms, q[0], q[2], q[1], q[3])
    leaf_pos = {0, 1}
    want = _counts(lambda *a: op.reference(*a, **params), pre, leaf_pos)
    got = _counts(lambda *a: op(*a, **params), pre, leaf_pos)
    M, H, F = case.dims["M"], case.dims["H"], case.dims["F"]
    assert got == want == (6 * M * H * F, 6 * M * H * F), (got, want)
