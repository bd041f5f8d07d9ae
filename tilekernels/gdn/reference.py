"""Torch references for the Gated DeltaNet ops: the fallback backend and the test oracle.

Conventions (see specs/gdn.py and ../shared/OPS.md):

* ``mixed[..., D]``, ``D = 2*Hk*dk + 2*Hv*dv + 2*Hv``, sections ``q | k | v | z | b | a``;
  the conv covers ``q | k | v`` (``C = conv_dim = 2*Hk*dk + Hv*dv`` channels).
* Causal depthwise conv, PyTorch/causal-conv1d convention:
  ``pre[t, c] = sum_{j<W} w[c, j] * x[t - (W-1) + j, c]`` (tap ``W-1`` is the current
  token), inputs before a sequence's start read as zero.
* A conv state ``[N, C, W-1]`` holds a sequence's last ``W-1`` conv inputs, oldest
  first, zero-padded on the old side.
* Everything is computed in fp32 (float64 when any input is float64), outputs
  are rounded once to their dtype.

BSHD is handled as packed THD with ``cu_seqlens = [0, T, 2T, ..., BT]``: one
code path, and the conv never reads across a sequence boundary in either.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from tilekernels._glue import acc_dtype, on_device


# ------------------------------------------------------------------ helpers


def sections(Hk: int, Hv: int, dk: int, dv: int) -> list[int]:
    """Widths of q | k | v | z | b | a in ``mixed``'s last dim."""
    return [Hk * dk, Hk * dk, Hv * dv, Hv * dv, Hv, Hv]


def conv_dim(Hk: int, Hv: int, dk: int, dv: int) -> int:
    return 2 * Hk * dk + Hv * dv


def gate_dtype(mixed: Tensor) -> torch.dtype:
    """g is fp32 (float64 in reference mode)."""
    return torch.float64 if mixed.dtype == torch.float64 else torch.float32


def packed(mixed: Tensor, cu_seqlens: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``mixed`` as ``[T_total, D]`` and its int64 ``cu_seqlens`` (BSHD: equal lengths)."""
    if cu_seqlens is None:
        B, T = mixed.shape[0], mixed.shape[1]
        cu = torch.arange(B + 1, device=mixed.device, dtype=torch.int64) * T
        return mixed.reshape(B * T, mixed.shape[-1]), cu
    return mixed, on_device(cu_seqlens, mixed.device, "gdn_pre_gated (torch backend): cu_seqlens").to(torch.int64)


def positions(cu: Tensor, T: int) -> Tensor:
    """[T] int64: each packed token's position inside its sequence."""
    t = torch.arange(T, device=cu.device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], t, right=True)
    return t - cu[seq]


def _shift(x: Tensor, s: int) -> Tensor:
    """out[t] = x[t - s] (zeros for t < s) along dim 0; s may be negative (reads ahead)."""
    if s == 0:
        return x
    out = torch.zeros_like(x)
    if abs(s) < x.shape[0]:
        if s > 0:
            out[s:] = x[:-s]
        else:
            out[:s] = x[-s:]
    return out


def causal_conv(x: Tensor, w: Tensor, pos: Tensor) -> Tensor:
    """pre [T, C] = sum_s w[:, W-1-s] * x[t-s] over s with pos[t] >= s (same sequence).

    Each sequence's input is zero-padded in front (causal_conv1d's zero initial state): taps before
    the sequence's start read a selected 0 (``where``), never another sequence's row times 0, so a
    NaN or inf in one sequence does not reach its neighbours (NaN * 0 is NaN). The weights do
    multiply the padding, so a NaN weight reaches every token of its channel (as the kernels')."""
    W = w.shape[1]
    pre = torch.zeros_like(x)
    for s in range(W):
        pre += w[:, W - 1 - s] * torch.where((pos >= s)[:, None], _shift(x, s), 0)
    return pre


def causal_conv_bwd(dpre: Tensor, x: Tensor, w: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
    """(dx [T, C], dw [C, W]) of :func:`causal_conv`."""
    W = w.shape[1]
    dx = torch.zeros_like(x)
    dw = torch.zeros_like(w)
    for s in range(W):
        ok = (pos >= s)[:, None]  # (selects, as in causal_conv: dx never crosses a sequence start;
        # dw's products with the zero padding are formed, as autograd of causal_conv forms them)
        dx += w[:, W - 1 - s] * _shift(torch.where(ok, dpre, 0), -s)
        dw[:, W - 1 - s] = (dpre * torch.where(ok, _shift(x, s), 0)).sum(0)
    return dx, dw


def final_conv_state(x: Tensor, cu: Tensor, W: int) -> Tensor:
    """[N, C, W-1]: last W-1 rows of x [T, C] of every sequence, oldest first, zero-padded."""
    N = cu.shape[0] - 1
    idx = cu[1:, None] - (W - 1) + torch.arange(W - 1, device=cu.device)  # [N, W-1]
    valid = idx >= cu[:-1, None]
    rows = x[idx.clamp(min=0).reshape(-1)] if x.shape[0] else x.new_zeros(idx.numel(), x.shape[1])
    rows = torch.where(valid[:, :, None], rows.reshape(N, W - 1, x.shape[1]), 0)  # (a select: see causal_conv)
    return rows.transpose(1, 2).contiguous()


def l2norm(x: Tensor, eps: float) -> Tensor:
    """x * rsqrt(sum(x^2, -1) + eps)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def l2norm_bwd(dn: Tensor, x: Tensor, eps: float) -> Tensor:
    """dx = s * (dn - n * sum(dn * n)), s = rsqrt(sum x^2 + eps), n = x * s."""
    s = torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
    n = x * s
    return s * (dn - n * (dn * n).sum(-1, keepdim=True))


def silu_bwd(dy: Tensor, pre: Tensor) -> Tensor:
    sg = torch.sigmoid(pre)
    return dy * sg * (1 + pre * (1 - sg))


def gates(b: Tensor, a: Tensor, A_log: Tensor, dt_bias: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """(beta, g) in ``acc``: beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)."""
    beta = torch.sigmoid(b.to(acc))
    g = -torch.exp(A_log.to(acc)) * F.softplus(a.to(acc) + dt_bias.to(acc))
    return beta, g


def heads(y: Tensor, Hk: int, Hv: int, dk: int, dv: int, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Split the conv output y [..., C] into l2-normed q, k [..., Hk, dk] and v [..., Hv, dv]."""
    yq, yk, yv = y.split([Hk * dk, Hk * dk, Hv * dv], -1)
    q = l2norm(yq.unflatten(-1, (Hk, dk)), eps)
    k = l2norm(yk.unflatten(-1, (Hk, dk)), eps)
    return q, k, yv.unflatten(-1, (Hv, dv))


# ------------------------------------------------------------------ gdn_pre_gated


def pre_gated(mixed: Tensor, conv_weight: Tensor, A_log: Tensor, dt_bias: Tensor,
              cu_seqlens: Optional[Tensor] = None, *, Hk: int = 16, dk: int = 128, dv: int = 128,
              repeat_qk: bool = True, eps: float = 1e-6, return_conv_state: bool = False) -> tuple:
    """(q, k, v, z, g, beta[, conv_state]) of gdn_pre_gated.

    mixed [B, T, D] (BSHD) or [T_total, D] with cu_seqlens [N+1] int32 (THD),
    bf16/fp32/fp64; conv_weight [C, W]; A_log, dt_bias [Hv] fp32. Returns
    q, k [..., Hq, dk], v, z [..., Hv, dv], beta [..., Hv] in mixed.dtype,
    g [..., Hv] fp32 (fp64 for fp64 mixed), and with return_conv_state the
    final conv state [N, C, W-1] in mixed.dtype (N = B for BSHD).
    """
    Hv = A_log.shape[0]
    W = conv_weight.shape[1]
    lead = mixed.shape[:-1]
    acc = acc_dtype(mixed, conv_weight, A_log, dt_bias)
    x, cu = packed(mixed, cu_seqlens)
    C = conv_dim(Hk, Hv, dk, dv)
    _, _, _, zs, bs, as_ = x.split(sections(Hk, Hv, dk, dv), -1)
    xc = x[:, :C].to(acc)
    y = F.silu(causal_conv(xc, conv_weight.to(acc), positions(cu, x.shape[0])))
    q, k, v = heads(y, Hk, Hv, dk, dv, eps)
    if repeat_qk:
        q = q.repeat_interleave(Hv // Hk, dim=-2)
        k = k.repeat_interleave(Hv // Hk, dim=-2)
    beta, g = gates(bs, as_, A_log, dt_bias, acc)
    dt = mixed.dtype
    out = (q.reshape(*lead, q.shape[-2], dk).to(dt), k.reshape(*lead, k.shape[-2], dk).to(dt),
           v.reshape(*lead, Hv, dv).to(dt), zs.reshape(*lead, Hv, dv).to(dt),
           g.reshape(*lead, Hv).to(gate_dtype(mixed)), beta.reshape(*lead, Hv).to(dt))
    if return_conv_state:
        out = out + (final_conv_state(x[:, :C], cu, W),)
    return out


def pre_gated_bwd(gq: Tensor, gk: Tensor, gv: Tensor, gz: Tensor, gg: Tensor, gbeta: Tensor,
                  mixed: Tensor, conv_weight: Tensor, A_log: Tensor, dt_bias: Tensor,
                  cu_seqlens: Optional[Tensor] = None, *, Hk: int = 16, dk: int = 128, dv: int = 128,
                  repeat_qk: bool = True, eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dmixed, dconv_weight, dA_log, ddt_bias) of gdn_pre_gated, each in its input's dtype.

    Gradients of q, k, v, z, g, beta are given in the outputs' shapes (the conv
    state output is not differentiable). Recomputes the forward:
      dq, dk (summed over the Hv/Hk repeats) -> l2norm bwd -> dy = [dyq | dyk | dv];
      dpre = dy * silu'(pre); dx, dw = conv bwd; dz passes through;
      db = dbeta * beta * (1 - beta);
      da = dg * (-exp(A_log)) * sigmoid(a + dt_bias); ddt_bias = sum_tokens da;
      dA_log = sum_tokens dg * g.
    """
    Hv = A_log.shape[0]
    acc = acc_dtype(mixed, conv_weight, A_log, dt_bias)
    x, cu = packed(mixed, cu_seqlens)
    T = x.shape[0]
    C = conv_dim(Hk, Hv, dk, dv)
    _, _, _, _, bs, as_ = x.split(sections(Hk, Hv, dk, dv), -1)
    xc = x[:, :C].to(acc)
    w = conv_weight.to(acc)
    pos = positions(cu, T)
    pre = causal_conv(xc, w, pos)
    y = F.silu(pre)
    yq, yk, _ = y.split([Hk * dk, Hk * dk, Hv * dv], -1)

    def head_grad(gx: Tensor, yx: Tensor) -> Tensor:
        gx = gx.to(acc).reshape(T, gx.shape[-2], dk)  # (not -1: T may be 0)
        if repeat_qk:
            gx = gx.unflatten(1, (Hk, Hv // Hk)).sum(2)
        return l2norm_bwd(gx, yx.unflatten(-1, (Hk, dk)), eps).reshape(T, Hk * dk)

    dy = torch.cat([head_grad(gq, yq), head_grad(gk, yk), gv.to(acc).reshape(T, Hv * dv)], -1)
    dxc, dw = causal_conv_bwd(silu_bwd(dy, pre), xc, w, pos)
    beta, g = gates(bs, as_, A_log, dt_bias, acc)
    gg = gg.to(acc).reshape(T, Hv)
    db = gbeta.to(acc).reshape(T, Hv) * beta * (1 - beta)
    da = gg * -torch.exp(A_log.to(acc)) * torch.sigmoid(as_.to(acc) + dt_bias.to(acc))
    dmixed = torch.cat([dxc, gz.to(acc).reshape(T, Hv * dv), db, da], -1)
    return (dmixed.reshape(mixed.shape).to(mixed.dtype), dw.to(conv_weight.dtype),
            (gg * g).sum(0).to(A_log.dtype), da.sum(0).to(dt_bias.dtype))


# ------------------------------------------------------------------ gdn_decode


def delta_rule_step(S: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                    scale: float) -> tuple[Tensor, Tensor]:
    """One gated delta-rule step per (row, value head); k, q already per value head.

    S [b, Hv, dk, dv]; q, k [b, Hv, dk]; v [b, Hv, dv]; g, beta [b, Hv].
    S = S*exp(g); u = beta*(v - S^T k); S = S + k u^T; o = S^T (scale*q).
    Returns (o [b, Hv, dv], S).
    """
    S = S * torch.exp(g)[..., None, None]
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + k[..., :, None] * u[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q * scale), S


def decode(mixed: Tensor, conv_state: Tensor, conv_weight: Tensor, A_log: Tensor, dt_bias: Tensor,
           ssm_state: Tensor, state_indices: Optional[Tensor] = None, *, Hk: int = 16,
           eps: float = 1e-6, scale: Optional[float] = None) -> Tensor:
    """o [B, Hv, dv] in mixed.dtype; updates conv_state and ssm_state IN PLACE.

    mixed [B, D]; conv_state [N, C, W-1] (mixed.dtype); conv_weight [C, W];
    A_log, dt_bias [Hv] fp32; ssm_state [N, Hv, dk, dv] fp32/bf16/fp64;
    state_indices [B] int32 or None (row b -> slot b). Rows whose slot is -1
    get o = 0 and touch no state. Non-negative slots must be distinct.
    """
    B = mixed.shape[0]
    Hv = A_log.shape[0]
    dk, dv = ssm_state.shape[2], ssm_state.shape[3]
    scale = dk ** -0.5 if scale is None else scale
    acc = acc_dtype(mixed, conv_weight, A_log, dt_bias, ssm_state)
    C = conv_dim(Hk, Hv, dk, dv)
    if ssm_state.shape[0] == 0:  # no slots: the spec admits only padded rows (-1), which read and write nothing
        return torch.zeros(B, Hv, dv, dtype=mixed.dtype, device=mixed.device)
    if state_indices is None:  # row b -> slot b: every row is real
        sl = torch.arange(B, device=mixed.device)
        valid = owner = None
    else:  # no host read of the slots (no nonzero()): every row is computed, padded rows on slot 0
        slots = state_indices.to(device=mixed.device, dtype=torch.int64)
        valid = slots >= 0
        sl = torch.where(valid, slots, 0)
        # owner[s] = the real row that updates slot s (-1: none); padded rows scatter to a spare entry
        N = ssm_state.shape[0]
        owner = torch.full((N + 1,), -1, dtype=torch.int64, device=mixed.device)
        owner.scatter_(0, torch.where(valid, slots, N), torch.arange(B, device=mixed.device))
        owner = owner[sl]
    _, _, _, _, bs, as_ = mixed.split(sections(Hk, Hv, dk, dv), -1)

    def write(state, old, new):
        """state[sl[b]] = new row of the slot's owner (old value if none): rows that share a
        slot (padded rows on slot 0) all write the same value, so the duplicates are benign."""
        if owner is not None:
            new = torch.where((owner >= 0).view(-1, *[1] * (new.dim() - 1)), new[owner.clamp(min=0)], old)
        state.index_copy_(0, sl, new.to(state.dtype))

    old_conv = conv_state[sl]
    window = torch.cat([old_conv, mixed[:, :C, None].to(conv_state.dtype)], -1)  # [B, C, W]
    y = F.silu((window.to(acc) * conv_weight.to(acc)).sum(-1))
    write(conv_state, old_conv, window[:, :, 1:])
    q, k, v = heads(y, Hk, Hv, dk, dv, eps)
    r = Hv // Hk
    beta, g = gates(bs, as_, A_log, dt_bias, acc)
    old_S = ssm_state[sl]
    o, S = delta_rule_step(old_S.to(acc), q.repeat_interleave(r, 1), k.repeat_interleave(r, 1),
                           v, g, beta, scale)
    write(ssm_state, old_S, S)
    o = o.to(mixed.dtype)
    return o if valid is None else torch.where(valid[:, None, None], o, torch.zeros((), dtype=o.dtype, device=o.device))
