"""tk-bench cases for the Gated DeltaNet family, and the input makers the tests share.

Headline shapes (CUDA): Qwen3-Next, Hk=16, Hv=32, dk=dv=128, W=4 (D = 12352,
conv_dim = 8192). gdn_pre_gated: BSHD B=1, T=32768 and THD with 8 sequences of
4096 tokens; gdn_decode: B=256 rows over N=256 state slots (fp32 states).
"""
from __future__ import annotations

from typing import Optional

import torch

from tilekernels.benchcase import BenchCase, Peer

from .reference import conv_dim, sections


def d_model(Hk: int, Hv: int, dk: int, dv: int) -> int:
    """D = 2*Hk*dk + 2*Hv*dv + 2*Hv."""
    return 2 * Hk * dk + 2 * Hv * dv + 2 * Hv


def weights(Hk: int, Hv: int, dk: int, dv: int, W: int, dtype=torch.bfloat16, device="cpu",
            gate_dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(conv_weight [conv_dim, W], A_log [Hv], dt_bias [Hv]) shaped like a trained layer."""
    C = conv_dim(Hk, Hv, dk, dv)
    w = (torch.randn(C, W, device=device) / W ** 0.5).to(dtype)
    A_log = torch.empty(Hv, device=device).uniform_(1, 16).log().to(gate_dtype)  # Qwen3-Next init range
    dt_bias = (0.5 * torch.randn(Hv, device=device)).to(gate_dtype)
    return w, A_log, dt_bias


def mixed(lead: tuple, Hk: int, Hv: int, dk: int, dv: int, dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    return torch.randn(*lead, d_model(Hk, Hv, dk, dv), device=device).to(dtype)


def cu_seqlens(lengths, device="cpu") -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return torch.tensor(out, dtype=torch.int32, device=device)


def decode_states(N: int, Hk: int, Hv: int, dk: int, dv: int, W: int, dtype=torch.bfloat16,
                  state_dtype=torch.float32, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(conv_state [N, conv_dim, W-1], ssm_state [N, Hv, dk, dv]) filled with random values."""
    conv = torch.randn(N, conv_dim(Hk, Hv, dk, dv), W - 1, device=device).to(dtype)
    ssm = (0.1 * torch.randn(N, Hv, dk, dv, device=device)).to(state_dtype)
    return conv, ssm


# ------------------------------------------------------------------ peers


def fla_prep(mixed, conv_weight, A_log, dt_bias, cu_seqlens=None, *, Hk, dk, dv, repeat_qk=True):
    """Issue 12's peer for gdn_pre_gated: FLA's Triton causal_conv1d (SiLU fused) over q|k|v and
    FLA's l2norm of q and k, torch for the repeat, z, beta and g (what a Megatron / FLA GDN layer
    runs); gdn_pre_gated's arguments and results (q, k, v, z, g, beta), differentiable through
    FLA's and torch's autograd. Needs fla-core (not a project dependency: ImportError without)."""
    import torch.nn.functional as F
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.modules.norm.l2norm import l2norm

    C = conv_weight.shape[0]
    Hv = A_log.shape[0]
    x3 = mixed if cu_seqlens is None else mixed.unsqueeze(0)
    y, _ = causal_conv1d(x3[..., :C], weight=conv_weight, activation="silu",
                         cu_seqlens=None if cu_seqlens is None else cu_seqlens.long())
    lead = mixed.shape[:-1]
    yq, yk, yv = y.reshape(*lead, C).split([Hk * dk, Hk * dk, Hv * dv], -1)
    q = l2norm(yq.reshape(*lead, Hk, dk))
    k = l2norm(yk.reshape(*lead, Hk, dk))
    if repeat_qk:
        q = q.repeat_interleave(Hv // Hk, dim=-2)
        k = k.repeat_interleave(Hv // Hk, dim=-2)
    _, _, _, zs, bs, as_ = mixed.split(sections(Hk, Hv, dk, dv), -1)
    z = zs.reshape(*lead, Hv, dv).contiguous()
    beta = bs.sigmoid()
    g = -A_log.exp() * F.softplus(as_.float() + dt_bias)
    return q, k, yv.reshape(*lead, Hv, dv), z, g, beta


def _fla_prep_peer(args, params):
    return lambda: fla_prep(*args, **params)


def _fla_decode_peer(args, params):
    """FLA's fused_recurrent_gated_delta_rule for one token per row on the case's fp32 state rows
    (issue 12's decode peer): q, k (l2norm in its kernel), v, g, beta precomputed outside the
    timed call, i.e. without the conv step that gdn_decode fuses; its final state goes to a
    buffer of its own (the same bytes as in place)."""
    import torch.nn.functional as F
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state = args[:6]
    Hk, B, (Hv, dk, dv) = params["Hk"], mixed.shape[0], ssm_state.shape[1:]
    dev, bf = mixed.device, torch.bfloat16
    q, k = (torch.randn(B, 1, Hk, dk, device=dev, dtype=bf) for _ in range(2))
    v = torch.randn(B, 1, Hv, dv, device=dev, dtype=bf)
    g = F.logsigmoid(torch.randn(B, 1, Hv, device=dev))
    beta = torch.rand(B, 1, Hv, device=dev)
    h0 = ssm_state[:B].float().clone()
    return lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=dk ** -0.5, initial_state=h0,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)


DECODE_PEERS = (Peer("FLA recurrent", _fla_decode_peer, backward=False,
                     note="fla-core 0.6.0, no conv step (q, k, v, g, beta given); n/a without fla"),)
PRE_GATED_PEERS = (Peer("FLA+torch", _fla_prep_peer,
                        note="fla-core 0.6.0's causal_conv1d + l2norm, torch glue; n/a without fla"),)


# ------------------------------------------------------------------ bench cases

def _heads(d) -> tuple[int, int, int, int]:
    return d["Hk"], d["Hv"], d["dk"], d["dv"]


def _pre_gated_maker(n_seqs: Optional[int]):
    def make(d, device):
        h = _heads(d)
        w, A, dt = weights(*h, d["W"], device=device)
        params = dict(Hk=d["Hk"], dk=d["dk"], dv=d["dv"], repeat_qk=True)
        if n_seqs is None:
            return (mixed((d["B"], d["T"]), *h, device=device), w, A, dt), params
        lens = [d["T"] // n_seqs] * n_seqs
        lens[-1] += d["T"] - sum(lens)  # any T (tk-bench --shape): the last sequence takes the rest
        cu = cu_seqlens(lens, device=device)
        return (mixed((d["T"],), *h, device=device), w, A, dt, cu), params
    return make


def _decode_make(d, device):
    h = _heads(d)
    w, A, dt = weights(*h, d["W"], device=device)
    conv, ssm = decode_states(d["N"], *h, d["W"], device=device,
                              state_dtype=torch.bfloat16 if d.get("S") == 2 else torch.float32)
    idx = torch.randperm(d["N"], device=device)[: d["B"]].to(torch.int32)
    return (mixed((d["B"],), *h, device=device), conv, w, A, dt, ssm, idx), dict(Hk=d["Hk"])


def _tokens(d) -> int:
    return d.get("B", 1) * d["T"]


def _pre_gated_bytes_fwd(d) -> int:
    # read mixed (bf16) + conv_weight (bf16) + A_log, dt_bias (fp32);
    # write q, k (Hq = Hv heads, bf16), v, z (bf16), g (fp32), beta (bf16)
    Hk, Hv, dk, dv = _heads(d)
    per_tok = 2 * d_model(Hk, Hv, dk, dv) + 2 * (2 * Hv * dk) + 2 * (2 * Hv * dv) + 4 * Hv + 2 * Hv
    return _tokens(d) * per_tok + 2 * conv_dim(Hk, Hv, dk, dv) * d["W"] + 2 * 4 * Hv


def _pre_gated_bytes_bwd(d) -> int:
    # read dq, dk, dv, dz, dg, dbeta (same bytes as the fwd outputs) and mixed; write dmixed;
    # read conv_weight, A_log, dt_bias; write their grads (fp32 partials not counted)
    Hk, Hv, dk, dv = _heads(d)
    outs = 2 * (2 * Hv * dk) + 2 * (2 * Hv * dv) + 4 * Hv + 2 * Hv
    weights_ = 2 * conv_dim(Hk, Hv, dk, dv) * d["W"] + 2 * 4 * Hv
    return _tokens(d) * (outs + 2 * 2 * d_model(Hk, Hv, dk, dv)) + 2 * weights_


def _pre_gated_flops(d) -> int:
    # conv 2*W per channel, silu ~4, l2norm ~3 per q/k element; gates negligible
    Hk, Hv, dk, dv = _heads(d)
    return _tokens(d) * (conv_dim(Hk, Hv, dk, dv) * (2 * d["W"] + 4) + 3 * 2 * Hk * dk)


def _decode_bytes(d) -> int:
    # read the mixed row's q|k|v, b and a (bf16; decode never reads z) + indices; read+write conv_state rows
    # (bf16) and ssm_state rows (fp32, or bf16 where dims S = 2); write o (bf16); weights read once
    Hk, Hv, dk, dv = _heads(d)
    C = conv_dim(Hk, Hv, dk, dv)
    sb = d.get("S", 4)
    per_row = 2 * (C + 2 * Hv) + 4 + 2 * 2 * C * (d["W"] - 1) + 2 * sb * Hv * dk * dv + 2 * Hv * dv
    return d["B"] * per_row + 2 * C * d["W"] + 2 * 4 * Hv


def _decode_flops(d) -> int:
    # per value head: decay dk*dv, S^T k 2*dk*dv, rank-1 update 2*dk*dv, S^T q 2*dk*dv
    Hk, Hv, dk, dv = _heads(d)
    return d["B"] * (7 * Hv * dk * dv + conv_dim(Hk, Hv, dk, dv) * 2 * d["W"])


def cases(device_type: str) -> list[BenchCase]:
    big = device_type == "cuda"
    heads = dict(Hk=16, Hv=32, dk=128, dv=128, W=4) if big else dict(Hk=2, Hv=4, dk=32, dv=32, W=4)
    bshd = dict(heads, B=1, T=32768) if big else dict(heads, B=2, T=256)
    thd = dict(heads, T=32768) if big else dict(heads, T=512)
    dec = dict(heads, B=256, N=256) if big else dict(heads, B=8, N=16)
    grads = ("mixed", "conv_weight", "A_log", "dt_bias")
    return [
        BenchCase(op="gdn_pre_gated", dims=bshd, make=_pre_gated_maker(None), variant="bshd",
                  bytes_fwd=_pre_gated_bytes_fwd, bytes_bwd=_pre_gated_bytes_bwd,
                  flops_fwd=_pre_gated_flops, grad_inputs=grads, peers=PRE_GATED_PEERS),
        BenchCase(op="gdn_pre_gated", dims=thd, make=_pre_gated_maker(8), variant="thd-8seq",
                  bytes_fwd=_pre_gated_bytes_fwd, bytes_bwd=_pre_gated_bytes_bwd,
                  flops_fwd=_pre_gated_flops, grad_inputs=grads, peers=PRE_GATED_PEERS),
        BenchCase(op="gdn_decode", dims=dec, make=_decode_make, variant="fp32-state",
                  bytes_fwd=_decode_bytes, flops_fwd=_decode_flops, peers=DECODE_PEERS),
        # bf16 state (S = 2 bytes): issue 12 asks it reported; FLA's recurrent decode (the peer above) keeps an
        # fp32 state, so no peer column here
        BenchCase(op="gdn_decode", dims=dict(dec, S=2), make=_decode_make, variant="bf16-state",
                  bytes_fwd=_decode_bytes, flops_fwd=_decode_flops),
    ]
