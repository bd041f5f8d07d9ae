"""A torch model of the CuTe DSL gdn_pre_gated backward's decomposition (cute_pre_gated_bwd.py).

Pure torch, no toolchain: the CPU tests (tests/gdn/test_gdn_cute_pre_gated_bwd.py) run it against
``reference.pre_gated_bwd`` in float64, so the index logic the kernel mirrors is checked without a GPU:
the spans of L tokens, the walk over rows t0-(W-1) .. t0+L+W-2 (W-1 halo rows each side), the sequence
starts as the kernel finds them (the first cu_seqlens entry >= t0-(W-1)+1, then each entry in turn), the
x window zeroed at a start, the uniform counter d = min(rows since the last start, W-1), the dx pending
sums in scatter form and their emission W-1 rows late, the partial rows [P, PS] (tap-major dconv_weight
columns j*C + c, then dA_log and ddt_bias sums) and their fixed-order reduction (group g of RG sums rows
g, g+RG, ..., then the RG sums in turn). One Python step a walked row, vectorized over spans and channels,
as the kernel's threads are. Not a backend: a test oracle of the decomposition only.
"""
from __future__ import annotations

import torch

from tilekernels._glue import acc_dtype
from tilekernels.gdn import reference as ref


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def model_bwd(gq, gk, gv, gz, gg, gbeta, mixed, conv_weight, A_log, dt_bias, cu_seqlens=None, *, Hk: int, dk: int,
              dv: int, repeat_qk: bool, eps: float = 1e-6, L: int = 128, red_groups: int = 8):
    """(dmixed, dconv_weight, dA_log, ddt_bias, part) as the kernel computes them, in the reference's
    accumulation dtype (float64 for float64 inputs); part [P, W*C + 2*Hv] the partial rows."""
    acc = acc_dtype(mixed, conv_weight, A_log, dt_bias)
    Hv, W = A_log.shape[0], conv_weight.shape[1]
    x, cu = ref.packed(mixed, cu_seqlens)
    NT, D = x.shape
    C, R = ref.conv_dim(Hk, Hv, dk, dv), (Hv // Hk if repeat_qk else 1)
    QK = 2 * Hk * dk
    w = conv_weight.to(acc)  # [C, W]
    P = cdiv(NT, L)
    if NT == 0:  # no spans: the kernel's host path writes zero weight grads
        z = torch.zeros(C, W, dtype=acc)
        return mixed.to(acc), z, z.new_zeros(Hv), z.new_zeros(Hv), z.new_zeros(0, W * C + 2 * Hv)
    # every walked row of every span: [P, L + 2(W-1)], rows outside the tokens read as zeros
    t0 = torch.arange(P, dtype=torch.int64)[:, None] * L
    rows = t0 + torch.arange(-(W - 1), L + W - 1)
    ok = (rows >= 0) & (rows < NT)
    rc = rows.clamp(0, max(NT - 1, 0))
    xr = torch.where(ok[..., None], x[rc, :C].to(acc), 0.0)  # selects, as the kernel: a NaN stays where it is
    g = torch.cat([gq.reshape(NT, Hk, R, dk).sum(2).reshape(NT, -1), gk.reshape(NT, Hk, R, dk).sum(2).reshape(NT, -1),
                   gv.reshape(NT, -1)], -1).to(acc)
    gr = torch.where(ok[..., None], g[rc], 0.0)
    # starts as the kernel meets them: cu_seqlens entries past the walk's first row (BSHD: multiples of T)
    st = torch.isin(rows, cu) & (rows > rows[:, :1])
    win = torch.zeros(P, W - 1, C, dtype=acc)
    pend = torch.zeros(P, W - 1, C, dtype=acc)
    dwp = torch.zeros(P, W, C, dtype=acc)
    d = torch.zeros(P, dtype=torch.int64)
    dx = torch.zeros(NT, C, dtype=acc)
    for i in range(rows.shape[1]):
        d = torch.where(st[:, i], 0, (d + 1).clamp(max=W - 1))
        win = torch.where(st[:, i, None, None], 0.0, win)
        xi = xr[:, i]
        if i >= W - 1:  # a span row or one after it: dpre, partial, dx
            pre = (w[:, :W - 1].T * win).sum(1) + w[:, W - 1] * xi
            sg = torch.sigmoid(pre)
            y, dsl = pre * sg, sg * (1 + pre * (1 - sg))
            yh, gh = y[:, :QK].unflatten(1, (2 * Hk, dk)), gr[:, i, :QK].unflatten(1, (2 * Hk, dk))
            s = torch.rsqrt((yh * yh).sum(-1, keepdim=True) + eps)
            dyq = s * (gh - yh * (s * (gh * yh).sum(-1, keepdim=True) * s))  # the kernel's order: no s^3 overflow
            dp = torch.cat([dyq.flatten(1), gr[:, i, QK:]], 1) * dsl
            span = (i - (W - 1) < L)
            if span:
                dwp += dp[:, None] * torch.cat([win, xi[:, None]], 1)
            live = d[:, None] >= (W - 1 - torch.arange(W))  # [P, W]: row t-W+1+k still in t's sequence
            # w[k] * dp to row t-W+1+k, selected (as the kernel): a NaN dp stays out of an earlier sequence
            contrib = torch.where(live[:, :, None], w.T[None] * dp[:, None], 0.0)
            out = (pend[:, 0] if W > 1 else 0) + contrib[:, 0]
            pend = torch.cat([pend[:, 1:] + contrib[:, 1:W - 1], contrib[:, W - 1:]], 1) if W > 1 else pend
            er = rows[:, i] - (W - 1)
            emit = (er >= t0[:, 0]) & (er < t0[:, 0] + L) & (er < NT)
            dx[er[emit]] = out[emit]
        if W > 1:
            win = torch.cat([win[:, 1:], xi[:, None]], 1)
    # gates: per token, and the per-span sums
    _, _, _, _, bs, as_ = x.split(ref.sections(Hk, Hv, dk, dv), -1)
    beta, gt = ref.gates(bs, as_, A_log, dt_bias, acc)
    ggv = gg.to(acc).reshape(NT, Hv)
    db = gbeta.to(acc).reshape(NT, Hv) * beta * (1 - beta)
    da = ggv * -torch.exp(A_log.to(acc)) * torch.sigmoid(as_.to(acc) + dt_bias.to(acc))
    spans = torch.arange(NT) // L
    gsum = torch.zeros(P, 2, Hv, dtype=acc).index_add_(0, spans, torch.stack([ggv * gt, da], 1))
    part = torch.cat([dwp.reshape(P, W * C), gsum.reshape(P, 2 * Hv)], 1)
    tot = torch.stack([part[q::red_groups].sum(0) for q in range(red_groups)]).sum(0)
    dmixed = torch.cat([dx, gz.to(acc).reshape(NT, -1), db, da], -1).reshape(mixed.shape)
    return dmixed, tot[:W * C].reshape(W, C).T, tot[W * C:W * C + Hv], tot[W * C + Hv:], part
