"""The mHC GPU backends' own limits (specs/mhc.py), each at its exact edge on meta tensors: explain names the
backend, the limit and its message one step past the edge, and names no limit of that backend at the edge itself
(test_mhc_cutile_registry.py checks that each limit exists; these pin where it sits). Without a GPU every GPU
backend is out anyway ("needs a CUDA device"), so these read whether the limit is in the reason, not the ok flag."""
import pytest
import torch

import registry
from tilekernels.testing import assert_limit_edge, limit_reason
from tilekernels.testing import meta as _m

BF, F32 = torch.bfloat16, torch.float32


def _why(op, backend, *args, **kwargs):
    return limit_reason(registry.get(op).explain(*args, **kwargs), backend)


def _edge(op, backend, expr, words, inside, outside, **kwargs):
    """``inside`` (args at the edge) fails no limit of ``backend``; ``outside`` (one step past) names ``expr``."""
    explain = registry.get(op).explain
    assert_limit_edge(explain(*inside, **kwargs), explain(*outside, **kwargs), backend, expr, words)


def _agg(T, n, C):
    return _m(T, n, C), _m(T, n, dtype=F32)


def _pb(T, n, C, bias=False):
    return (_m(T, n, n, dtype=F32), _m(T, n, C), _m(T, n, dtype=F32), _m(T, C), _m(C) if bias else None)


def test_aggregate_cute_stream_rows_are_int32():
    _edge("mhc_h_aggregate", "cute", "T * n < 2**31", "(T * n) are an int32 extent",
          _agg(2**28 - 1, 8, 8), _agg(2**28, 8, 8))


def test_aggregate_cute_forward_grid_is_int32():
    """C = 256 gives a token C // 256 + 1 = 2 CTAs: 2**30 tokens are a grid of 2**31."""
    _edge("mhc_h_aggregate", "cute", "T * (C // 256 + 1) < 2**31", "1-D grid",
          _agg(2**30 - 1, 1, 256), _agg(2**30, 1, 256))


def test_post_bda_cute_stream_rows_are_int32():
    _edge("mhc_h_post_bda", "cute", "T * n < 2**31", "(T * n) are an int32 extent",
          _pb(2**28 - 1, 8, 8), _pb(2**28, 8, 8))


def test_post_bda_cute_dbias_in_shared_memory():
    """With a bias, C <= 32768 (a [C] fp32 smem array); without one any C. (C = 32769 also fails C % 8 == 0;
    the reason names both limits.)"""
    expr = "not present(bias) or C <= 32768"
    _edge("mhc_h_post_bda", "cute", expr, "sums dbias", _pb(2, 4, 32768, bias=True), _pb(2, 4, 32769, bias=True))
    assert f"limit {expr!r}" not in _why("mhc_h_post_bda", "cute", *_pb(2, 4, 32769))


def test_post_bda_cutile_elements_are_int32():
    """n = 8 takes the two-pass backward (no dh partials), so T * n * C is the bound."""
    _edge("mhc_h_post_bda", "cutile", "T * n * C < 2**31", "index with int32",
          _pb(2**25 - 1, 8, 8), _pb(2**25, 8, 8))


def test_sinkhorn_cute_token_indices_are_int32():
    _edge("mhc_sinkhorn", "cute", "T < 2**31 - 128", "int32 launch argument",
          (_m(2**31 - 129, 4, 4, dtype=F32),), (_m(2**31 - 128, 4, 4, dtype=F32),), iters=1)


def test_sinkhorn_cute_streams_and_shared_memory_edges():
    """n = 7 is the cute kernel's (8 is refused: test_mhc_cute_sinkhorn). Its backward's shared memory:
    2 * iters * n + 3 * n * n + 3 <= 384 holds with equality at n = 3, iters = 59; iters = 60 is out."""
    assert "cute limit" not in _why("mhc_sinkhorn", "cute", _m(2, 7, 7, dtype=F32), iters=1)
    logits = _m(2, 3, 3, dtype=F32)
    expr = "2 * iters * n + 3 * n * n + 3 <= 384"
    assert "cute limit" not in _why("mhc_sinkhorn", "cute", logits, iters=59)
    why = _why("mhc_sinkhorn", "cute", logits, iters=60)
    assert "cute limit " in why and f"{expr!r} fails" in why and "48 KB of shared memory" in why, why


def test_sinkhorn_cutile_elements_are_int32():
    """At n = 8 and iters = 1 the scratch (2 * iters * n * T = 16 T) is below T * n * n = 64 T."""
    _edge("mhc_sinkhorn", "cutile", "T * n * n < 2**31", "index with int32",
          (_m(2**25 - 1, 8, 8, dtype=F32),), (_m(2**25, 8, 8, dtype=F32),), iters=1)


def test_proj_rms_cute_dproj_coordinate_is_int32():
    """N = 32 (the cute kernel's widest), K = 8: M * N reaches 2**31 at M = 2**26."""
    _edge("mhc_proj_rms", "cute", "M * N < 2**31", "TMA coordinate",
          (_m(2**26 - 1, 8), _m(32, 8)), (_m(2**26, 8), _m(32, 8)))


def test_proj_rms_cutile_elements_are_int32():
    _edge("mhc_proj_rms", "cutile", "M * K < 2**31", "index with int32",
          (_m(2**28 - 1, 8), _m(24, 8)), (_m(2**28, 8), _m(24, 8)))


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_post_pre"])
def test_pre_cutile_per_token_scratch_is_int32(op):
    """The backward's per-token fp32 scratch, 2 * (n*n + 2n) * T = 16 T at n = 2: 2**27 tokens reach 2**31 (at
    C = 1 and iters = 1 the other int32 bounds, T * n * C and 2 * iters * n * T, are far below it)."""
    def args(T):
        w, hb = _m(8, 2), _m(8, dtype=F32)
        if op == "mhc_pre":
            return _m(T, 2, 1), w, hb
        return (_m(T, 2, 2, dtype=F32), _m(T, 2, 1), _m(T, 2, dtype=F32), _m(T, 1), w, hb, None)
    _edge(op, "cutile", "2 * (n*n + 2*n) * T < 2**31", "per-token fp32 scratch", args(2**27 - 1), args(2**27),
          iters=1)


@pytest.mark.parametrize("op", ["mhc_sinkhorn", "mhc_pre"])
def test_iters_bound_of_the_op(op):
    """iters <= ITERS_MAX (1024) on the op itself: 1024 binds, 1025 is refused naming the param."""
    from specs.mhc import ITERS_MAX

    assert ITERS_MAX == 1024
    if op == "mhc_sinkhorn":
        args = (torch.zeros(2, 4, 4),)
    else:
        args = (torch.zeros(2, 4, 8, dtype=BF), torch.zeros(24, 32, dtype=BF), torch.zeros(24))
    registry.get(op).bind(*args, iters=1024)
    with pytest.raises(registry.SpecError, match=rf"{op}: param iters.*1024"):
        registry.get(op).bind(*args, iters=1025)


def _pp(T, n, C, bias=None):
    """mhc_post_pre's inputs: h_res, residual, h_post, x, weight, hbias, bias."""
    N = n * n + 2 * n
    return (_m(T, n, n, dtype=F32), _m(T, n, C), _m(T, n, dtype=F32), _m(T, C), _m(N, n * C), _m(N, dtype=F32),
            None if bias is None else _m(C, dtype=bias))


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_post_pre"])
def test_pre_elements_are_int32(op):
    """T * n * C < 2**31 for the fused mHC backends: n = 2, C = 1024 reach it at 2**20 tokens."""
    def args(T):
        return _pp(T, 2, 1024)[1:2] + _pp(T, 2, 1024)[4:6] if op == "mhc_pre" else _pp(T, 2, 1024)
    for backend in ("cute", "cutile"):
        _edge(op, backend, "T * n * C < 2**31", "index with int32", args(2**20 - 1), args(2**20), iters=1)


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_post_pre"])
def test_cute_pre_dweight_partials_are_int32(op):
    """cute: the dweight partials [7, n*n + 2n, n*C] fp32, 672 C at n = 4 (7 divides no power of two, so the edge
    is the largest C % 8 == 0 below 2**31 / 672 and the next one; at 6 partials that one would fit)."""
    def args(C):
        return _pp(1, 4, C)[1:2] + _pp(1, 4, C)[4:6] if op == "mhc_pre" else _pp(1, 4, C)
    _edge(op, "cute", "7 * (n*n + 2*n) * n * C < 2**31", "dweight partials", args(3195656), args(3195664),
          iters=1)


def test_post_pre_cute_partial_planes_are_int32():
    _edge("mhc_post_pre", "cute", "256 * T < 2**31", "partial planes", _pp(2**23 - 1, 1, 8), _pp(2**23, 1, 8),
          iters=1)


def test_post_pre_gpu_backends_read_bias_in_x_dtype():
    """The op takes an fp32 bias beside bf16 streams (the torch reference); both GPU backends read it in x's
    dtype and say so."""
    for backend in ("cute", "cutile"):
        _edge("mhc_post_pre", backend, "not present(bias) or dtype(bias) == dtype(x)", "reads bias in x's dtype",
              _pp(4, 4, 8, bias=BF), _pp(4, 4, 8, bias=F32))
