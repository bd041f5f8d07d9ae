"""Gated DeltaNet ops: the torch backend's kernels and the op declarations.

Custom ops, allocation, autograd and the functional entries are generated from
the specs (``specs/gdn.py``) by :func:`tilekernels._opgen.define`. The torch
kernels below are destination-passing and write the reference's results.

Kernel signatures (params positional in spec order; see _opgen):

  gdn_pre_gated fwd (mixed, conv_weight, A_log, dt_bias, cu_seqlens|None,
                     q, k, v, z, g, beta, conv_state|None,
                     Hk, dk, dv, repeat_qk, eps, return_conv_state)
                bwd (dq, dk, dv, dz, dg, dbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens|None,
                     dmixed, dconv_weight, dA_log, ddt_bias, Hk, dk, dv, repeat_qk, eps,
                     return_conv_state)
  gdn_decode    fwd (mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices|None,
                     o, Hk, eps, scale|None)   conv_state and ssm_state are updated in place;
                     scale None means dk ** -0.5. Forward only.
"""
from __future__ import annotations

from specs import gdn as S
from tilekernels._glue import kernel
from tilekernels._opgen import Decl, define

from . import reference as ref

_PRE = ("Hk", "dk", "dv", "repeat_qk", "eps")


def pre_gated_fwd_runner(build):
    """The registry's destination-passing gdn_pre_gated fwd over a backend's launch builder
    ``build(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state, Hk, dk,
    dv, repeat_qk, eps) -> launches`` (each with ``.run()``); shared by the cuTile and CuTe DSL
    forwards. It writes q, k [..., Hq, dk], v, z [..., Hv, dv], g (fp32), beta [..., Hv] and, when
    given, the final conv state [N, C, W-1]; no tokens: only the (all-zero) conv state."""
    def pre_gated_fwd_into(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
                           Hk: int, dk: int, dv: int, repeat_qk: bool, eps: float, return_conv_state: bool):
        if mixed.numel() == 0:
            if conv_state is not None:
                conv_state.zero_()
            return
        for ln in build(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
                        Hk, dk, dv, repeat_qk, eps):
            ln.run()
    return pre_gated_fwd_into


@kernel("gdn_pre_gated", "torch", "fwd")
def _pre_gated_fwd_torch(mixed, conv_weight, A_log, dt_bias, cu_seqlens, q, k, v, z, g, beta, conv_state,
                         *params):
    kw = dict(zip(_PRE, params))
    res = ref.pre_gated(mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                        return_conv_state=conv_state is not None, **kw)
    for dst, src in zip((q, k, v, z, g, beta, conv_state), res):
        dst.copy_(src)


@kernel("gdn_pre_gated", "torch", "bwd")
def _pre_gated_bwd_torch(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                         dmixed, dconv_weight, dA_log, ddt_bias, *params):
    res = ref.pre_gated_bwd(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens,
                            **dict(zip(_PRE, params)))
    for dst, src in zip((dmixed, dconv_weight, dA_log, ddt_bias), res):
        dst.copy_(src)


@kernel("gdn_decode", "torch", "fwd")
def _decode_torch(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices, o, Hk, eps, scale):
    o.copy_(ref.decode(mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state, state_indices,
                       Hk=Hk, eps=eps, scale=scale))


pre_gated = define(S.PRE_GATED, Decl(saves=("mixed", "conv_weight", "A_log", "dt_bias", "cu_seqlens"),
                                     present={"conv_state": "return_conv_state"}))
decode = define(S.DECODE, Decl(flops=("4*B*Hv*dk*dv", "0")))  # S^T k and S^T q per value head
