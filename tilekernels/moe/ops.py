"""Grouped MoE MLP (MXFP8) ops: the torch backend's kernels and the op declarations.

Custom ops, allocation, autograd and the functional entries are generated from
the specs (``specs/moe.py``) by :func:`tilekernels._opgen.define`. The torch
kernels below are destination-passing and write the reference's results.

Kernel signatures (params positional in spec order; see _opgen):

  mxfp8_quantize    fwd (x, row_data|None, row_scales|None, col_data|None, col_scales|None, axis)
  mxfp8_dequantize  fwd (data, scales, out, axis, out_dtype)
  grouped_linear    fwd (x, weight, m_splits, y, precision)
                    bwd (dy, x, weight, m_splits, dx, dweight, precision)
  scaled_swiglu     fwd (h, probs, out, glu_interleave_size)
                    bwd (dout, h, probs, dh, dprobs, glu_interleave_size)
  grouped_mlp_mxfp8 fwd (x, probs, m_splits, fc1_weight, fc2_weight, fc1_weight_scales|None,
                         fc2_weight_scales|None, y, h, quantize)
                    bwd (dy, x, probs, m_splits, fc1_weight, fc2_weight, fc1_weight_scales|None,
                         fc2_weight_scales|None, h, dx, dprobs, dfc1_weight|None, dfc2_weight|None,
                         quantize)
                        h [M, 2F] fp32 (fp64 in reference mode) is the FC1 output, written by the
                        fwd as scratch and saved for the bwd. A weight given pre-quantized (e4m3
                        with its scales) gets no gradient: its d* is None.

``m_splits`` [G] int64 is metadata; the torch reference reads it on the host (a
GPU m_splits costs it a device sync; pass it on the CPU, as Megatron and
Transformer Engine take it). The cute backend (``cute_kernels.py``) reads it on
the device instead.
"""
from __future__ import annotations

from specs import moe as S
from tilekernels._glue import kernel
from tilekernels._opgen import Decl, Scratch, define

from . import mxfp8 as mx
from . import reference as ref


def _copy_all(outs, results) -> None:
    for o, r in zip(outs, results):
        if o is not None:
            o.copy_(r)


@kernel("mxfp8_quantize", "torch", "fwd")
def _quantize_fwd_torch(x, row_data, row_scales, col_data, col_scales, axis):
    _copy_all([t for t in (row_data, row_scales, col_data, col_scales) if t is not None],
              ref.mxfp8_quantize(x, axis))


@kernel("mxfp8_dequantize", "torch", "fwd")
def _dequantize_fwd_torch(data, scales, out, axis, out_dtype):
    out.copy_(mx.dequantize(data, scales, axis, out.dtype))


@kernel("grouped_linear", "torch", "fwd")
def _grouped_linear_fwd_torch(x, weight, m_splits, y, precision):
    y.copy_(ref.grouped_linear(x, weight, m_splits, precision))


@kernel("grouped_linear", "torch", "bwd", skips=("weight",))
def _grouped_linear_bwd_torch(dy, x, weight, m_splits, dx, dweight, precision):
    _copy_all((dx, dweight), ref.grouped_linear_bwd(dy, x, weight, m_splits, precision, wgrad=dweight is not None))


@kernel("scaled_swiglu", "torch", "fwd")
def _swiglu_fwd_torch(h, probs, out, s):
    out.copy_(ref.scaled_swiglu(h, probs, s))


@kernel("scaled_swiglu", "torch", "bwd")
def _swiglu_bwd_torch(dout, h, probs, dh, dprobs, s):
    _copy_all((dh, dprobs), ref.scaled_swiglu_bwd(dout, h, probs, s))


@kernel("grouped_mlp_mxfp8", "torch", "fwd")
def _mlp_fwd_torch(x, probs, m_splits, fc1_weight, fc2_weight, s1, s2, y, h, quantize):
    _copy_all((y, h), ref.grouped_mlp_mxfp8_fwd(x, probs, m_splits, fc1_weight, fc2_weight, quantize, s1, s2))


@kernel("grouped_mlp_mxfp8", "torch", "bwd", skips=("fc1_weight", "fc2_weight"))
def _mlp_bwd_torch(dy, x, probs, m_splits, fc1_weight, fc2_weight, s1, s2, h, dx, dprobs, dfc1, dfc2, quantize):
    _copy_all((dx, dprobs, dfc1, dfc2),
              ref.grouped_mlp_mxfp8_bwd(dy, x, probs, m_splits, fc1_weight, fc2_weight, h, quantize, s1, s2,
                                        wgrad1=dfc1 is not None, wgrad2=dfc2 is not None))


mxfp8_quantize = define(S.QUANTIZE, Decl(present={
    "row_data": "axis != 'columnwise'", "row_scales": "axis != 'columnwise'",
    "col_data": "axis != 'rowwise'", "col_scales": "axis != 'rowwise'"}))
mxfp8_dequantize = define(S.DEQUANTIZE, Decl(dtype_param={"out": "out_dtype"}))
grouped_linear = define(S.GROUPED_LINEAR, Decl(saves=("x", "weight", "m_splits"), skippable=("weight",),
                                                flops=("2*M*N*K", "2*M*N*K + (2*M*N*K if d_weight else 0)")))
scaled_swiglu = define(S.SCALED_SWIGLU, Decl(saves=("h", "probs")))
grouped_mlp_mxfp8 = define(S.GROUPED_MLP, Decl(
    saves=("x", "probs", "m_splits", "fc1_weight", "fc2_weight", "fc1_weight_scales", "fc2_weight_scales", "h"),
    scratch=(Scratch("h", ("M", "2*F")),),
    skippable=("fc1_weight", "fc2_weight"),  # a frozen weight: no wgrad (the cute kernels' skip awaits a GPU run)
    # fc1 2*M*H*2F, fc2 2*M*F*H; bwd: both dgrads, and a wgrad per weight that gets a gradient
    flops=("6*M*H*F", "6*M*H*F + (4*M*H*F if d_fc1_weight else 0) + (2*M*H*F if d_fc2_weight else 0)")))
