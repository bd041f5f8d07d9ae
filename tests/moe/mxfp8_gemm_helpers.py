"""Shared helpers of the MXFP8 grouped-GEMM tests (design (a) and the design (b) probe):
operands with widely varying E8M0 scales, their quantized forms, device-computed offsets."""
from __future__ import annotations

import torch

from tilekernels.moe import mxfp8 as mx

DEV = "cuda"


def _rand_rows(R, C, spread=12):
    """[R, C] fp32 with a per-row power-of-two magnitude in 2^[-spread, spread], a few zero
    32-blocks, so the E8M0 scales vary widely."""
    x = torch.randn(R, C, device=DEV)
    x = x * torch.exp2(torch.randint(-spread, spread + 1, (R, 1), device=DEV).float())
    if C >= 64 and R > 0:
        x[::7, 32:64] = 0.0
    return x


def _q_rows(x):
    """rowwise MXFP8 (blocks along the last dim): (uint8 data, uint8 scales)."""
    d, s = mx.quantize_rowwise(x)
    return d.view(torch.uint8), s


def _q_cols(x):
    """columnwise MXFP8 (blocks along the first dim): (uint8 data, uint8 scales [R/32, C])."""
    d, s = mx.quantize_columnwise(x)
    return d.view(torch.uint8), s


def _dq_rows(d, s):
    return mx.dequantize_rowwise(d.view(torch.float8_e4m3fn), s, torch.float64)


def _dq_cols(d, s):
    return mx.dequantize_columnwise(d.view(torch.float8_e4m3fn), s, torch.float64)


def prequant_weight(w):
    """A grouped weight [G, N, K] pre-quantized as grouped_mlp_mxfp8 takes one, through the
    mxfp8_quantize op (on w's device): (e4m3 data [G, N, K], rowwise scales [G, N, K/32])."""
    import registry

    G, N, K = w.shape
    d, s = registry.get("mxfp8_quantize")(w.detach().reshape(G * N, K).contiguous(), axis="rowwise")
    return d.view(G, N, K), s.view(G, N, K // 32)


def _offsets(splits, dtype=torch.int64):
    """Cumulative [G + 1] offsets computed on the device (torch.cumsum), as the op does."""
    m = torch.tensor(splits, dtype=torch.int64, device=DEV)
    return torch.cat([m.new_zeros(1), torch.cumsum(m, 0)]).to(dtype)
