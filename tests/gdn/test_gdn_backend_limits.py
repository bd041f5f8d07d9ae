"""The GDN GPU backends' own limits (specs/gdn.py), each at its exact edge on meta tensors: explain names the
backend, the limit and its message one step past the edge, and names no limit at the edge itself. On a machine
without a GPU every GPU backend is out anyway (its reason also says it needs a CUDA device), so what these tests
read is whether the limit is in the reason, not the ok flag; the torch backend takes every one of these calls."""
import pytest
import torch

import registry
from tilekernels.testing import assert_limit_edge
from tilekernels.testing import limit_reason as _why
from tilekernels.testing import meta as _m

PRE = registry.get("gdn_pre_gated")
DEC = registry.get("gdn_decode")
F32 = torch.float32


def _sizes(Hk, Hv, dk, dv):
    return 2 * Hk * dk + 2 * Hv * dv + 2 * Hv, 2 * Hk * dk + Hv * dv   # D, conv_dim


def _pre(lead, Hk, Hv, dk, dv, W=4, cu=None):
    D, C = _sizes(Hk, Hv, dk, dv)
    kw = dict(Hk=Hk, dk=dk, dv=dv) if cu is None else dict(Hk=Hk, dk=dk, dv=dv, cu_seqlens=cu)
    return PRE.explain(_m(*lead, D), _m(C, W), _m(Hv, dtype=F32), _m(Hv, dtype=F32), **kw)


def _dec(B, N, Hk, Hv, dk, dv, W=4):
    D, C = _sizes(Hk, Hv, dk, dv)
    return DEC.explain(_m(B, D), _m(N, C, W - 1), _m(C, W), _m(Hv, dtype=F32), _m(Hv, dtype=F32),
                       _m(N, Hv, dk, dv, dtype=F32), Hk=Hk)


# ------------------------------------------------------------------ gdn_pre_gated


def test_pre_cute_token_rows_are_int32():
    """cute: BSHD token rows B * T < 2**31 (T alone would let B = 2 double it); THD has no B and no such limit."""
    assert_limit_edge(_pre((2, 2**30 - 1), 1, 1, 1, 1), _pre((2, 2**30), 1, 1, 1, 1), "cute", "B * T < 2**31",
                      "token rows are int32")
    T = 2**31 - 1   # THD (cu_seqlens is int32, so T_total < 2**31 anyway)
    assert "limit" not in _why(_pre((T,), 1, 1, 1, 1, cu=torch.tensor([0, T], dtype=torch.int32)), "cute")


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_pre_cutile_elements_are_int32(layout):
    """cutile: mixed's row (2*Hk*dk + 2*Hv*dv + 2*Hv = 12 here) plus q, k's extra Hv*dk (4) elements a token:
    16 * tokens < 2**31. mixed alone (12 a token) would fit at the refused edge, and so would a 2*Hk*dk read as
    Hk*dk; in BSHD the tokens are B * T."""
    Hk, Hv, dk, dv = 1, 2, 2, 1

    def rows(tokens):
        if layout == "bshd":
            return _pre((2, tokens // 2), Hk, Hv, dk, dv) if tokens % 2 == 0 else _pre((1, tokens), Hk, Hv, dk, dv)
        return _pre((tokens,), Hk, Hv, dk, dv, cu=torch.tensor([0, tokens], dtype=torch.int32))
    expr = "T * (2*Hk*dk + 2*Hv*dv + 2*Hv + Hv*dk) < 2**31"
    assert_limit_edge(rows(2**27 - 1), rows(2**27), "cutile", "B * " + expr if layout == "bshd" else expr,
                      "the kernels index with int32")


# ------------------------------------------------------------------ gdn_decode


def test_decode_conv_window_needs_two_taps():
    """W = 1 leaves no conv window: both GPU backends refuse it by their own limit, W = 2 is theirs."""
    for backend in ("cute", "cutile"):
        assert_limit_edge(_dec(2, 2, 1, 2, 4, 4, W=2), _dec(2, 2, 1, 2, 4, 4, W=1), backend, "W >= 2",
                          "conv window of W-1 >= 1 inputs")


def test_decode_cute_cluster_of_eight_value_heads():
    """cute: Hv/Hk <= 8 (one cluster of at most 8 CTAs a key head): 8 is in, 16 is out; cutile takes both."""
    assert_limit_edge(_dec(2, 2, 1, 8, 4, 4), _dec(2, 2, 1, 16, 4, 4), "cute", "Hv <= 8 * Hk", "Hv/Hk <= 8")
    assert "limit" not in _why(_dec(2, 2, 1, 16, 4, 4), "cutile")


def test_decode_cute_state_slot_offsets_are_int32():
    """cute: one slot's Hv * dk * dv < 2**31 (dk * dv alone is half of it here)."""
    assert_limit_edge(_dec(1, 1, 1, 2, 2**15, 2**15 - 1), _dec(1, 1, 1, 2, 2**15, 2**15), "cute",
                      "Hv * dk * dv < 2**31", "offsets inside one state slot are int32")


def test_decode_cute_rows_are_the_grid_y_extent():
    assert_limit_edge(_dec(65535, 65535, 1, 2, 4, 4), _dec(65536, 65536, 1, 2, 4, 4), "cute", "B < 65536",
                      "grid's y extent")


def test_decode_empty_batch_without_slots_is_not_a_slots_refusal():
    """N = 0 refuses the GPU backends only with rows to run (B > 0; test_gdn_decode covers that side): an empty
    batch with no slots is no reason to refuse them."""
    for backend in ("cute", "cutile"):
        assert "no state slots" not in _why(_dec(0, 0, 1, 2, 4, 4), backend)


@pytest.mark.parametrize("tensor", ["ssm_state", "conv_state", "mixed"])
def test_decode_cutile_elements_are_int32(tensor):
    """cutile indexes every tensor with int32: each of ssm_state (N * Hv * dk * dv), conv_state
    (N * conv_dim * (W - 1)) and mixed (B * D) at 2**31 elements is refused, one element a row fewer is not."""
    for k, over in ((-1, False), (0, True)):
        if tensor == "ssm_state":   # 2 slots of Hv * dk * dv = 2**30 (in the cute backend's limit)
            rows = _dec(1, 2 + k, 1, 2, 2**14, 2**15)
        elif tensor == "conv_state":   # conv_dim 4, W - 1 = 1: 2**29 slots; ssm_state 2**30 elements
            rows = _dec(1, 2**29 + k, 1, 2, 1, 1, W=2)
        else:   # D = 32 (2 of them the b|a gates), conv_dim 16, ssm_state 14 a slot, N = B
            rows = _dec(2**26 + k, 2**26 + k, 1, 1, 1, 14, W=2)
        why = _why(rows, "cutile")
        if over:   # (one limit of three clauses: what fails is read from the edge, not from the text)
            assert "cutile limit " in why and "every tensor < 2**31 elements" in why, why
        else:
            assert "limit" not in why, why
