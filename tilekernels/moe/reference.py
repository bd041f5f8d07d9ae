"""Torch references for the grouped MoE MLP (MXFP8) ops: fallback backend and test oracle.

Conventions (see ../shared/OPS.md, "Grouped MoE MLP (MXFP8)"):

* tokens are sorted by expert; ``m_splits`` [G] int64 (on any device, read on the
  host) gives each expert's row count, zeros allowed, sum = M.
* every GEMM accumulates in fp32 (float64 when given float64 inputs: reference /
  gradcheck mode) and rounds only its final output to the output dtype.
* MXFP8 GEMMs multiply the exact MXFP8 values of both operands (quantized along
  that GEMM's own reduction dim; products of two e4m3 values times powers of
  two are exact in fp32) and accumulate in fp32. Gradients pass straight
  through the quantization (Transformer Engine's recipe):
    fwd     y   = Q_K(x) . Q_K(W)^T           (x rowwise, W rowwise: blocks along K)
    dgrad   dX  = Q_N(dY) . Q_N(W)            (dY rowwise, W columnwise: blocks along N)
    wgrad   dW_g = Q_tok(dY_g)^T . Q_tok(X_g)  (both columnwise: blocks along the
                                               group's tokens; needs m_g % 32 == 0)
  With every m_g % 32 == 0 the groups start on block boundaries, so quantizing
  the whole [M, *] tensor columnwise gives exactly the per-group blocks.
* A NaN/Inf anywhere in an MXFP8 block makes the whole operand block NaN (scale
  0xFF, mxfp8.py); the GEMMs below are plain matmuls with no clamping, so that NaN
  reaches every output it feeds and nothing turns it finite.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tilekernels._glue import acc_dtype

from . import mxfp8 as mx

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def splits_list(m_splits: Tensor, op: str = "grouped_linear") -> list[int]:
    """m_splits [G] int -> python list (a host read: m_splits is metadata; this backend loops over the groups).

    Refused inside a CUDA-graph capture: a CPU m_splits' values would be fixed in the graph (a replay would not see
    new ones) and a GPU one cannot be read on the host there. The GPU backends read m_splits on the device."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{op} (torch backend): m_splits: expected an eager call (this backend reads m_splits' "
                           f"values on the host), got a CUDA-graph capture with m_splits on {m_splits.device}: "
                           "capture a call a GPU backend takes, or call it outside the capture")
    return [int(v) for v in m_splits.tolist()]


# ---------------------------------------------------------------- mxfp8_quantize / dequantize


def mxfp8_quantize(x: Tensor, axis: str = "rowwise") -> tuple[Tensor, ...]:
    """x [R, K] bf16/fp32/fp64 -> MXFP8.

    axis 'rowwise' -> (data e4m3 [R, K], scales uint8 [R, K/32]);
    'columnwise' -> (data e4m3 [R, K], scales uint8 [R/32, K]);
    'both' -> (row_data, row_scales, col_data, col_scales).
    """
    return mx.quantize(x, axis)


def mxfp8_dequantize(data: Tensor, scales: Tensor, axis: str = "rowwise",
                     out_dtype: str = "bfloat16") -> Tensor:
    """data e4m3 [R, K] with rowwise scales [R, K/32] or columnwise [R/32, K] -> [R, K] in out_dtype.

    data * 2^(e-127), exact in fp32/float64; exact in bf16 unless the value falls
    below bf16's normal range (|v| < 2^-126), where it is rounded; 2^128 overflows to
    Inf in fp32/bf16. A scale of 0xFF (E8M0 NaN) gives NaN for its whole block.
    """
    return mx.dequantize(data, scales, axis, _DTYPES[out_dtype])


# ---------------------------------------------------------------- grouped GEMM building blocks
# All take and return tensors in the accumulation dtype ``acc``.


def _operand(t: Tensor, acc: torch.dtype, quantize: bool, columnwise: bool) -> Tensor:
    """The value a GEMM operand carries: ``t`` itself, or its MXFP8 value (blocks along
    the last dim, or along the first with ``columnwise``)."""
    if not quantize:
        return t.to(acc)
    return mx.fq_columnwise(t, acc) if columnwise else mx.fq_rowwise(t, acc)


def _per_group(splits: list[int]):
    start = 0
    for g, m in enumerate(splits):
        yield g, slice(start, start + m)
        start += m


def grouped_mm_nt(a: Tensor, w: Tensor, splits: list[int]) -> Tensor:
    """out[rows g] = a[rows g] @ w[g]^T.  a [M, K], w [G, N, K] -> [M, N]."""
    out = a.new_zeros(a.shape[0], w.shape[1])
    for g, rows in _per_group(splits):
        if rows.stop > rows.start:
            out[rows] = a[rows] @ w[g].t()
    return out


def grouped_mm_nn(a: Tensor, w: Tensor, splits: list[int]) -> Tensor:
    """out[rows g] = a[rows g] @ w[g].  a [M, N], w [G, N, K] -> [M, K]."""
    out = a.new_zeros(a.shape[0], w.shape[2])
    for g, rows in _per_group(splits):
        if rows.stop > rows.start:
            out[rows] = a[rows] @ w[g]
    return out


def grouped_mm_tn(a: Tensor, b: Tensor, splits: list[int]) -> Tensor:
    """out[g] = a[rows g]^T @ b[rows g].  a [M, N], b [M, K] -> [G, N, K] (zeros for empty groups)."""
    out = a.new_zeros(len(splits), a.shape[1], b.shape[1])
    for g, rows in _per_group(splits):
        if rows.stop > rows.start:
            out[g] = a[rows].t() @ b[rows]
    return out


def linear_fwd(x: Tensor, w: Tensor, splits: list[int], quantize: bool, acc: torch.dtype) -> Tensor:
    """y = Q_K(x) . Q_K(W_g)^T per group, in ``acc``.  x [M, K], w [G, N, K] -> [M, N]."""
    G, N, K = w.shape
    xq = _operand(x, acc, quantize, columnwise=False)
    wq = _operand(w.reshape(G * N, K), acc, quantize, columnwise=False).reshape(G, N, K)
    return grouped_mm_nt(xq, wq, splits)


def linear_bwd(dy: Tensor, x: Tensor, w: Tensor, splits: list[int], quantize: bool,
               acc: torch.dtype, wgrad: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """(dX, dW) in ``acc`` per the recipe above.  dy [M, N], x [M, K], w [G, N, K].
    ``wgrad`` False: dW is None (a frozen, pre-quantized weight)."""
    G, N, K = w.shape
    dy_row = _operand(dy, acc, quantize, columnwise=False)
    # W_g [N, K] columnwise (blocks along N); N % 32 keeps blocks inside one expert
    w_col = _operand(w.reshape(G * N, K), acc, quantize, columnwise=True).reshape(G, N, K)
    dx = grouped_mm_nn(dy_row, w_col, splits)
    if not wgrad:
        return dx, None
    dy_col = _operand(dy, acc, quantize, columnwise=True)
    x_col = _operand(x, acc, quantize, columnwise=True)
    dw = grouped_mm_tn(dy_col, x_col, splits)
    return dx, dw


# ---------------------------------------------------------------- grouped_linear


def grouped_linear(x: Tensor, weight: Tensor, m_splits: Tensor, precision: str = "bf16") -> Tensor:
    """y [M, N] (x.dtype): y[rows of g] = x[rows] @ weight[g]^T.

    x [M, K] bf16/fp32/fp64; weight [G, N, K] same dtype; m_splits [G] int64.
    precision 'bf16': the operands as given (bf16 inputs, fp32 accumulate);
    'mxfp8': both operands quantized along K, exact products, fp32 accumulate.
    Differentiable: 'bf16' by autograd, 'mxfp8' by :func:`grouped_linear_bwd`
    (the straight-through recipe), so autograd on this reference is the oracle.
    """
    if precision == "mxfp8":
        return _MXFP8Linear.apply(x, weight, m_splits)
    acc = acc_dtype(x, weight)
    return linear_fwd(x, weight, splits_list(m_splits), False, acc).to(x.dtype)


class _MXFP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, m_splits):
        ctx.save_for_backward(x, weight, m_splits)
        return linear_fwd(x, weight, splits_list(m_splits), True, acc_dtype(x, weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, m_splits = ctx.saved_tensors  # a frozen weight: no wgrad (the one GEMM blocked along tokens)
        return (*grouped_linear_bwd(dy, x, weight, m_splits, "mxfp8", wgrad=ctx.needs_input_grad[1]), None)


def grouped_linear_bwd(dy: Tensor, x: Tensor, weight: Tensor, m_splits: Tensor,
                       precision: str = "bf16", wgrad: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """dy [M, N] -> (dx [M, K] in x.dtype, dweight [G, N, K] in weight.dtype; None when not ``wgrad``).

    'bf16': dx = dy_g @ W_g, dW_g = dy_g^T @ x_g. 'mxfp8': the same with each
    operand quantized along that GEMM's reduction dim (module docstring).
    """
    acc = acc_dtype(x, weight, dy)
    dx, dw = linear_bwd(dy, x, weight, splits_list(m_splits), precision == "mxfp8", acc, wgrad=wgrad)
    return dx.to(x.dtype), None if dw is None else dw.to(weight.dtype)


# ---------------------------------------------------------------- scaled_swiglu


def glu_split(h: Tensor, s: Optional[int]) -> tuple[Tensor, Tensor]:
    """h [M, 2F] -> (gate [M, F], linear [M, F]).

    s None: halves [gate | linear]; s: alternating blocks [gate s | linear s]."""
    M, F2 = h.shape
    if s is None:
        return h[:, : F2 // 2], h[:, F2 // 2:]
    hv = h.reshape(M, F2 // (2 * s), 2, s)
    return hv[:, :, 0].reshape(M, F2 // 2), hv[:, :, 1].reshape(M, F2 // 2)


def glu_merge(gate: Tensor, linear: Tensor, s: Optional[int]) -> Tensor:
    """Inverse of :func:`glu_split`: [M, F] x 2 -> [M, 2F]."""
    M, F = gate.shape
    if s is None:
        return torch.cat([gate, linear], dim=1)
    return torch.stack([gate.reshape(M, F // s, s), linear.reshape(M, F // s, s)], dim=2).reshape(M, 2 * F)


def swiglu_fwd(h: Tensor, probs: Tensor, s: Optional[int]) -> Tensor:
    """silu(gate) * linear * probs[:, None], in h.dtype (callers pass the accumulation dtype)."""
    g, lin = glu_split(h, s)
    return g * torch.sigmoid(g) * lin * probs[:, None]


def swiglu_bwd(dout: Tensor, h: Tensor, probs: Tensor, s: Optional[int]) -> tuple[Tensor, Tensor]:
    """(dh [M, 2F], dprobs [M]) of :func:`swiglu_fwd`, all in the callers' dtype.

    d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g))); dprobs = sum_f dout * silu(g) * linear.
    """
    g, lin = glu_split(h, s)
    sig = torch.sigmoid(g)
    silu = g * sig
    dp = dout * probs[:, None]
    dg = dp * lin * sig * (1 + g * (1 - sig))
    dl = dp * silu
    dprobs = (dout * silu * lin).sum(dim=1)
    return glu_merge(dg, dl, s), dprobs


def scaled_swiglu(h: Tensor, probs: Tensor, glu_interleave_size: Optional[int] = None) -> Tensor:
    """out [M, F] (h.dtype) = silu(gate) * linear * probs[:, None]; h [M, 2F], probs [M] fp32."""
    acc = acc_dtype(h, probs)
    return swiglu_fwd(h.to(acc), probs.to(acc), glu_interleave_size).to(h.dtype)


def scaled_swiglu_bwd(dout: Tensor, h: Tensor, probs: Tensor,
                      glu_interleave_size: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """dout [M, F] -> (dh [M, 2F] in h.dtype, dprobs [M] in probs.dtype), fp32 math."""
    acc = acc_dtype(h, probs, dout)
    dh, dprobs = swiglu_bwd(dout.to(acc), h.to(acc), probs.to(acc), glu_interleave_size)
    return dh.to(h.dtype), dprobs.to(probs.dtype)


# ---------------------------------------------------------------- grouped_mlp_mxfp8

MLP_GLU_INTERLEAVE = 32


def weight_value(w: Tensor, scales: Optional[Tensor], acc: torch.dtype) -> Tensor:
    """A grouped weight [G, N, K] as the GEMMs see it before their own quantization: a master
    as given, or a pre-quantized one's exact dequantization in ``acc`` (e4m3 data with rowwise
    scales [G, N, K/32]). Quantizing that value along K again gives the same value (each
    block's new scale is at most its old one and the data only gain powers of two, which
    e4m3 holds exactly below 448), so the forward consumes it unchanged."""
    if scales is None:
        return w
    G, N, K = w.shape
    return mx.dequantize(w.reshape(G * N, K), scales.reshape(G * N, K // 32), "rowwise", acc).reshape(G, N, K)


def grouped_mlp_mxfp8_fwd(x: Tensor, probs: Tensor, m_splits: Tensor, fc1_weight: Tensor,
                          fc2_weight: Tensor, quantize: bool = True, fc1_weight_scales: Optional[Tensor] = None,
                          fc2_weight_scales: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(y [M, H] in x.dtype, h [M, 2F] in the accumulation dtype: the saved FC1 output).

    h = FC1 GEMM (never rounded to bf16: the SwiGLU runs on the fp32 accumulators,
    as in the fused FC1 epilogue); a = silu(gate) * linear * probs with s = 32 (fp32);
    y = FC2 GEMM of MXFP8(a) (rowwise, blocks along F) and MXFP8(fc2_weight). A weight
    with scales is pre-quantized: its value is :func:`weight_value`.
    """
    acc = acc_dtype(x, probs)
    splits = splits_list(m_splits, "grouped_mlp_mxfp8")
    h = linear_fwd(x, weight_value(fc1_weight, fc1_weight_scales, acc), splits, quantize, acc)
    a = swiglu_fwd(h, probs.to(acc), MLP_GLU_INTERLEAVE)
    y = linear_fwd(a, weight_value(fc2_weight, fc2_weight_scales, acc), splits, quantize, acc)
    return y.to(x.dtype), h


def grouped_mlp_mxfp8(x: Tensor, probs: Tensor, m_splits: Tensor, fc1_weight: Tensor, fc2_weight: Tensor,
                      fc1_weight_scales: Optional[Tensor] = None, fc2_weight_scales: Optional[Tensor] = None,
                      quantize: bool = True) -> Tensor:
    """y [M, H] (x.dtype) = FC2(scaled_swiglu(FC1(x), probs, s=32)), every GEMM MXFP8.

    x [M, H] bf16; probs [M] fp32; fc1_weight [G, 2F, H]; fc2_weight [G, H, F], each a
    master in x's dtype or pre-quantized e4m3 with its rowwise scales ``fc*_weight_scales``
    [G, N, K/32] uint8 (no gradient then); m_splits [G] int64. ``quantize=False`` runs the
    same graph with unquantized operands (the float64 gradcheck), differentiable by
    autograd; with quantization the backward is :func:`grouped_mlp_mxfp8_bwd` (the
    straight-through recipe).
    """
    if quantize:
        return _MXFP8MLP.apply(x, probs, m_splits, fc1_weight, fc2_weight, fc1_weight_scales, fc2_weight_scales)
    return grouped_mlp_mxfp8_fwd(x, probs, m_splits, fc1_weight, fc2_weight, False,
                                 fc1_weight_scales, fc2_weight_scales)[0]


class _MXFP8MLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, probs, m_splits, fc1_weight, fc2_weight, s1, s2):
        y, h = grouped_mlp_mxfp8_fwd(x, probs, m_splits, fc1_weight, fc2_weight, True, s1, s2)
        ctx.save_for_backward(x, probs, m_splits, fc1_weight, fc2_weight, s1, s2, h)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, probs, m_splits, w1, w2, s1, s2, h = ctx.saved_tensors
        dx, dprobs, dfc1, dfc2 = grouped_mlp_mxfp8_bwd(dy, x, probs, m_splits, w1, w2, h, True, s1, s2,
                                                       ctx.needs_input_grad[3], ctx.needs_input_grad[4])
        return dx, dprobs, None, dfc1, dfc2, None, None


def grouped_mlp_mxfp8_bwd(dy: Tensor, x: Tensor, probs: Tensor, m_splits: Tensor, fc1_weight: Tensor,
                          fc2_weight: Tensor, h: Tensor, quantize: bool = True,
                          fc1_weight_scales: Optional[Tensor] = None, fc2_weight_scales: Optional[Tensor] = None,
                          wgrad1: bool = True, wgrad2: bool = True):
    """dy [M, H], h [M, 2F] (saved, accumulation dtype) -> (dx, dprobs, dfc1, dfc2).

    dA = FC2 dgrad (accumulators, not rounded); dh, dprobs = dSwiGLU(dA, h, probs)
    in fp32; dfc2 from dY and a (recomputed from h, quantized columnwise);
    dx, dfc1 from dh (quantized rowwise / columnwise). Outputs in the dtypes of
    x, probs, fc1_weight, fc2_weight; a pre-quantized weight's gradient is None (its
    value still feeds the dgrad, quantized columnwise along N as a master is), and so is a
    frozen master's when ``wgrad1`` / ``wgrad2`` is False (its wgrad not computed).
    """
    acc = acc_dtype(x, probs, dy)
    splits = splits_list(m_splits, "grouped_mlp_mxfp8")
    p = probs.to(acc)
    h = h.to(acc)
    w1 = weight_value(fc1_weight, fc1_weight_scales, acc)
    w2 = weight_value(fc2_weight, fc2_weight_scales, acc)
    a = swiglu_fwd(h, p, MLP_GLU_INTERLEAVE)
    da, dfc2 = linear_bwd(dy, a, w2, splits, quantize, acc, wgrad=wgrad2 and fc2_weight_scales is None)
    dh, dprobs = swiglu_bwd(da, h, p, MLP_GLU_INTERLEAVE)
    dx, dfc1 = linear_bwd(dh, x, w1, splits, quantize, acc, wgrad=wgrad1 and fc1_weight_scales is None)
    return (dx.to(x.dtype), dprobs.to(probs.dtype), None if dfc1 is None else dfc1.to(fc1_weight.dtype),
            None if dfc2 is None else dfc2.to(fc2_weight.dtype))
