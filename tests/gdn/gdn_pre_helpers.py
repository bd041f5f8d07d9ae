"""GPU test helpers shared by the cuTile and CuTe DSL gdn_pre_gated forward tests (no toolchain
import here: each test file runs where only its own toolchain is installed)."""
from __future__ import annotations

import pytest
import torch

from tilekernels.gdn import bench as mk
from tilekernels.gdn import reference as ref

BF, F32 = torch.bfloat16, torch.float32

# the forward tests' matrix, the same for both backends
QWEN = dict(Hk=16, Hv=32, dk=128, dv=128, W=4)
SHAPES = [
    QWEN,
    dict(Hk=2, Hv=4, dk=64, dv=32, W=3),   # R=2, dk != dv
    dict(Hk=4, Hv=4, dk=32, dv=64, W=2),   # R=1
    dict(Hk=1, Hv=4, dk=48, dv=40, W=4),   # R=4, non-power-of-two dk, dv (cute: 6 vectors, 8 lanes a head)
]
SHAPE_IDS = ["Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) for s in SHAPES]
THD_LENGTHS = [0, 1, 3, 4, 7, 0, 130, 2, 5]  # empty, 1, W-1, W, odd, one long (over a token tile / run)
# (layout, id): BSHD (B, T) or THD sequence lengths
LAYOUTS = [((2, 70), "bshd-2x70"), ((1, 1), "bshd-T1"), ((3, 5), "bshd-3x5"), (THD_LENGTHS, "thd-mixed"),
           ([1], "thd-1"), ([0, 2, 0], "thd-empties")]


def nan(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def problem(shape, lengths, dtype=BF):
    """(mixed, conv_weight, A_log, dt_bias, cu_seqlens|None) on the GPU: BSHD when lengths is
    (B, T), THD when it is a list of sequence lengths."""
    h = (shape["Hk"], shape["Hv"], shape["dk"], shape["dv"])
    w, A, dt = mk.weights(*h, shape["W"], dtype=dtype, device="cuda")
    if isinstance(lengths, tuple):
        return mk.mixed(lengths, *h, dtype=dtype, device="cuda"), w, A, dt, None
    cu = mk.cu_seqlens(lengths, device="cuda")
    return mk.mixed((int(sum(lengths)),), *h, dtype=dtype, device="cuda"), w, A, dt, cu


def nan_outputs(x, cu, shape, repeat_qk, state):
    """NaN-filled forward outputs ((q, k, v, z, g, beta), conv_state|None), so an element a kernel
    does not write fails the comparison."""
    Hk, Hv, dk, dv, W = (shape[n] for n in ("Hk", "Hv", "dk", "dv", "W"))
    lead = x.shape[:-1]
    Hq = Hv if repeat_qk else Hk
    N = lead[0] if cu is None else cu.shape[0] - 1
    outs = (nan(*lead, Hq, dk, dtype=x.dtype), nan(*lead, Hq, dk, dtype=x.dtype),
            nan(*lead, Hv, dv, dtype=x.dtype), nan(*lead, Hv, dv, dtype=x.dtype),
            nan(*lead, Hv, dtype=F32), nan(*lead, Hv, dtype=x.dtype))
    return outs, (nan(N, ref.conv_dim(Hk, Hv, dk, dv), W - 1, dtype=x.dtype) if state else None)


def ref64(x, w, A, dt, cu, shape, repeat_qk, state):
    """The float64 reference forward on upcasts of the same inputs."""
    return ref.pre_gated(x.double(), w.double(), A.double(), dt.double(), cu, Hk=shape["Hk"], dk=shape["dk"],
                         dv=shape["dv"], repeat_qk=repeat_qk, return_conv_state=state)


# the NaN-at-sequence-edge cases of both GPU backwards: (shape, repeat_qk) at W = 4, 3, 2; layouts, ids
EDGE_CASES = [(dict(Hk=1, Hv=4, dk=48, dv=40, W=4), True), (dict(Hk=2, Hv=4, dk=64, dv=32, W=3), False),
              (dict(Hk=4, Hv=4, dk=32, dv=64, W=2), True)]
EDGE_CASE_IDS = ["W4-rep", "W3-norep", "W2-rep"]
EDGE_LAYOUTS, EDGE_LAYOUT_IDS = [(3, 5), THD_LENGTHS], ["bshd-3x5", "thd-mixed"]


def edge_cases(test):
    """Parametrizes ``test(shape, repeat_qk, layout)`` over the edge cases."""
    test = pytest.mark.parametrize("layout", EDGE_LAYOUTS, ids=EDGE_LAYOUT_IDS)(test)
    return pytest.mark.parametrize("shape,repeat_qk", EDGE_CASES, ids=EDGE_CASE_IDS)(test)


def edge_tokens(lead_or_lengths, W):
    """Packed token indices of every non-empty sequence's first min(W-1, length) tokens and its last
    one: the rows whose conv taps reach into the zero padding, and the one next to the sequence end."""
    if isinstance(lead_or_lengths, tuple):
        B, T = lead_or_lengths
        spans = [(b * T, T) for b in range(B)]
    else:
        starts = [sum(lead_or_lengths[:i]) for i in range(len(lead_or_lengths))]
        spans = list(zip(starts, lead_or_lengths))
    out = []
    for s, n in spans:
        if n:
            out += [s + k for k in range(min(W - 1, n))] + [s + n - 1]
    return sorted(set(out))


def check_nan_at_sequence_edges(run, grads, x, w, A, dt, cu, layout, shape, repeat_qk):
    """One NaN at each edge token in turn (``edge_tokens``; pinned, not the registry NaN test's random
    element), in the upstream gradient of q or v or in mixed (a q and a v channel), gives the backward
    ``run(grads, mixed) -> (dmixed, dconv_weight, dA_log, ddt_bias)`` the NaN pattern that autograd
    through the float64 reference gives. The reference's conv taps before a sequence start multiply the
    zero padding, so a NaN dpre in a sequence's first W-1 tokens reaches every tap of its channels'
    dconv_weight (a kernel that skips the padding products leaves the earlier taps finite, which a loss
    scaler's overflow check then cannot see); and nothing crosses into a neighbouring sequence (a NaN
    in a sequence's last token times a 0/1 mask would)."""
    names = ("dmixed", "dconv_weight", "dA_log", "ddt_bias")
    vc = 2 * shape["Hk"] * shape["dk"]  # mixed's first v channel
    for where in ("gq", "gv", "mixed q", "mixed v"):
        for p in edge_tokens(layout, shape["W"]):
            bad, xb = [g.clone() for g in grads], x.clone()
            if where == "gq":
                bad[0].view(-1, *bad[0].shape[-2:])[p, 0, 0] = float("nan")
            elif where == "gv":
                bad[2].view(-1, *bad[2].shape[-2:])[p, 0, 0] = float("nan")
            else:
                xb.view(-1, x.shape[-1])[p, 0 if where == "mixed q" else vc] = float("nan")
            got = run(bad, xb)
            leaves = [t.detach().double().requires_grad_() for t in (xb, w, A, dt)]
            out = ref.pre_gated(*leaves, cu, Hk=shape["Hk"], dk=shape["dk"], dv=shape["dv"], repeat_qk=repeat_qk)
            torch.autograd.backward(out, [g.double() for g in bad])
            for name, g, r in zip(names, got, leaves):
                gn, rn = torch.isnan(g), torch.isnan(r.grad)
                assert torch.equal(gn, rn), (f"NaN in {where} at token {p}: {name} has {int(gn.sum())} NaN, "
                                             f"the reference {int(rn.sum())}")
