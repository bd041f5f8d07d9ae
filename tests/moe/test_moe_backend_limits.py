"""The MoE cute backend's own limits (specs/moe.py) at their exact edges, on meta tensors: explain names the limit
and its message one step past the edge and no cute limit at the edge (test_moe_cute_registry.py checks that the
limits exist). Without a GPU cute is out anyway ("needs a CUDA device"), so these read the reason, not the flag."""
import pytest
import torch

import registry
from tilekernels.testing import assert_limit_edge, limit_reason
from tilekernels.testing import meta as _m

BF, F32, F8, U8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.uint8


def _why(op, *args, **kwargs):
    return limit_reason(registry.get(op).explain(*args, **kwargs), "cute")


def _edge(op, expr, words, inside, outside, **kwargs):
    explain = registry.get(op).explain
    assert_limit_edge(explain(*inside, **kwargs), explain(*outside, **kwargs), "cute", expr, words)


def test_rows_are_int32():
    """M < 2**31 (grouped_linear, scaled_swiglu, grouped_mlp_mxfp8) and R < 2**31 (quantize, dequantize)."""
    _edge("scaled_swiglu", "M < 2**31", "index rows with int32", (_m(2**31 - 1, 64), _m(2**31 - 1, dtype=F32)),
          (_m(2**31, 64), _m(2**31, dtype=F32)))
    for M in (2**31 - 1, 2**31):
        why = _why("grouped_linear", _m(M, 64), _m(1, 64, 64), torch.tensor([M]))
        assert ("'M < 2**31' fails" in why) == (M == 2**31), why
    _edge("mxfp8_quantize", "R < 2**31", "", (_m(2**31 - 1, 32),), (_m(2**31, 32),))
    _edge("mxfp8_dequantize", "R < 2**31", "", (_m(2**31 - 1, 32, dtype=F8), _m(2**31 - 1, 1, dtype=U8)),
          (_m(2**31, 32, dtype=F8), _m(2**31, 1, dtype=U8)))


def test_grouped_linear_bf16_rows_of_sixteen_bytes():
    """bf16 precision: K and N both multiples of 8 (N = 60 with K = 64 is refused as well as K = 60)."""
    m = torch.tensor([32, 32])
    _edge("grouped_linear", "K % 8 == 0 and N % 8 == 0", "16-byte rows", (_m(64, 64), _m(2, 56, 64), m),
          (_m(64, 64), _m(2, 60, 64), m))


def test_grouped_linear_mxfp8_n_in_blocks_of_32():
    """mxfp8: N % 32 == 0, so N = 48 (a multiple of 16 and 8) is refused, 64 is not."""
    m = torch.tensor([32, 32])
    _edge("grouped_linear", "N % 32 == 0", "columnwise weight blocks run along N", (_m(64, 64), _m(2, 64, 64), m),
          (_m(64, 64), _m(2, 48, 64), m), precision="mxfp8")


def _mlp(M, H=256, F=256):
    return (_m(M, H), _m(M, dtype=F32), torch.tensor([M]), _m(1, 2 * F, H), _m(1, H, F))


def test_mlp_cute_is_the_mxfp8_path_and_takes_any_m_forward():
    """quantize=False (the unquantized graph) is the torch reference's; M % 32 binds only a backward: 48 tokens
    forward are cute's."""
    assert "cute limit" not in _why("grouped_mlp_mxfp8", *_mlp(64))
    why = _why("grouped_mlp_mxfp8", *_mlp(64), quantize=False)
    assert "cute limit 'quantize' fails" in why and "the cute kernels are the MXFP8 path" in why, why
    assert "cute limit" not in _why("grouped_mlp_mxfp8", *_mlp(48))


def test_no_experts_refused():
    """G >= 1: an empty expert list is refused by name, not run."""
    with pytest.raises(registry.SpecError, match=r"grouped_linear: .*\bG\b"):
        registry.get("grouped_linear").bind(torch.zeros(0, 64), torch.zeros(0, 64, 64),
                                            torch.zeros(0, dtype=torch.int64))
