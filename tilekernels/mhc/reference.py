"""Torch references for the mHC ops: the fallback backend and the test oracle.

Each reference has its op's signature, accumulates in fp32 (float64 if given
float64 inputs, for gradcheck and as the oracle) and returns the op's output
dtype. Explicit backward formulas sit beside the forwards; each ``*_bwd``
returns the gradients in the dtypes of the inputs they belong to, and a
``_*_bwd_acc`` twin (used by the fused ``mhc_pre``) returns them unrounded in
the accumulation dtype.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from tilekernels._glue import acc_dtype


def _cast(ts, like):
    """Cast each tensor in ``ts`` to the dtype of the matching tensor in ``like`` (None stays None)."""
    return tuple(None if t is None else t.to(ref.dtype) for t, ref in zip(ts, like))


# ---------------------------------------------------------------- h_aggregate


def h_aggregate(x: Tensor, h_pre: Tensor) -> Tensor:
    """out[t,c] = sum_i h_pre[t,i] * x[t,i,c].

    x [T, n, C] bf16/fp32/fp64; h_pre [T, n] bf16/fp32/fp64 -> out [T, C] in x.dtype.
    """
    acc = acc_dtype(x, h_pre)
    return torch.einsum("tn,tnc->tc", h_pre.to(acc), x.to(acc)).to(x.dtype)


def _h_aggregate_bwd_acc(dout: Tensor, x: Tensor, h_pre: Tensor):
    acc = acc_dtype(x, h_pre, dout)
    d = dout.to(acc)
    dx = h_pre.to(acc)[:, :, None] * d[:, None, :]
    dh = torch.einsum("tc,tnc->tn", d, x.to(acc))
    return dx, dh


def h_aggregate_bwd(dout: Tensor, x: Tensor, h_pre: Tensor):
    """dx[t,i,c] = h_pre[t,i] * dout[t,c]; dh_pre[t,i] = sum_c dout[t,c] * x[t,i,c].

    dout [T, C] -> (dx [T, n, C] in x.dtype, dh_pre [T, n] in h_pre.dtype).
    """
    return _cast(_h_aggregate_bwd_acc(dout, x, h_pre), (x, h_pre))


# ---------------------------------------------------------------- sinkhorn


def _sinkhorn_steps(logits: Tensor, iters: int, eps: float):
    """Forward in the accumulation dtype, keeping what the exact backward needs.

    Returns (out, m0, steps) with m0 = exp(logits - rowmax) and steps a list of
    (R_k, M_k, rowsum_k + eps, colsum_k + eps) for k = 1..iters, where
    R_k = M_{k-1} / (rowsum + eps) and M_k = R_k / (colsum(R_k) + eps).
    """
    acc = acc_dtype(logits)
    lg = logits.to(acc)
    m = torch.exp(lg - lg.amax(dim=-1, keepdim=True))
    m0, steps = m, []
    for _ in range(iters):
        r = m.sum(dim=-1, keepdim=True) + eps
        rm = m / r
        c = rm.sum(dim=-2, keepdim=True) + eps
        m = rm / c
        steps.append((rm, m, r, c))
    return m, m0, steps


def sinkhorn(logits: Tensor, iters: int = 20, eps: float = 1e-6) -> Tensor:
    """H_res [T, n, n]: M = exp(logits - rowmax); ``iters`` times: M /= rowsum(M) + eps,
    then M /= colsum(M) + eps.

    logits [T, n, n] fp32 (fp64 in reference mode) -> fp32 (fp64) out.
    """
    return _sinkhorn_steps(logits, iters, eps)[0]


def _sinkhorn_bwd_acc(dout: Tensor, logits: Tensor, iters: int, eps: float) -> Tensor:
    _, m0, steps = _sinkhorn_steps(logits, iters, eps)
    g = dout.to(m0.dtype)
    for rm, m, r, c in reversed(steps):
        # column step M = R / c: dR = (dM - sum_i dM*M) / c   (sum over rows i, per column)
        g = (g - (g * m).sum(dim=-2, keepdim=True)) / c
        # row step R = M' / r: dM' = (dR - sum_j dR*R) / r    (sum over columns j, per row)
        g = (g - (g * rm).sum(dim=-1, keepdim=True)) / r
    # m0 = exp(l - max_j l): dl = dm0*m0, and the row max (the first maximal entry)
    # takes minus the row's sum. This term is O(eps): eps > 0 breaks the row-scale invariance.
    dl = g * m0
    dl.scatter_add_(-1, logits.argmax(dim=-1, keepdim=True), -dl.sum(dim=-1, keepdim=True))
    return dl


def sinkhorn_bwd(dout: Tensor, logits: Tensor, iters: int = 20, eps: float = 1e-6) -> Tensor:
    """Exact gradient of :func:`sinkhorn` by recomputing its steps and walking them back.

    dout [T, n, n] -> dlogits [T, n, n] in logits.dtype. The row max's own
    (sub)gradient goes to the first maximal entry of each row.
    """
    return _sinkhorn_bwd_acc(dout, logits, iters, eps).to(logits.dtype)


# ---------------------------------------------------------------- h_post_bda


def h_post_bda(h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor,
               bias: Optional[Tensor] = None) -> Tensor:
    """out[t,i,c] = sum_j h_res[t,i,j] residual[t,j,c] + h_post[t,i] * (x[t,c] + bias[c]).

    h_res [T, n, n], h_post [T, n] (bf16/fp32/fp64); residual [T, n, C], x [T, C]
    (bf16/fp32/fp64, same dtype); bias [C] (x's dtype or fp32) or None.
    x + bias is formed in the accumulation dtype (not rounded to x's dtype).
    -> out [T, n, C] in residual.dtype.
    """
    acc = acc_dtype(h_res, residual, h_post, x, bias)
    xb = x.to(acc) if bias is None else x.to(acc) + bias.to(acc)
    out = torch.einsum("tij,tjc->tic", h_res.to(acc), residual.to(acc))
    out = out + h_post.to(acc)[:, :, None] * xb[:, None, :]
    return out.to(residual.dtype)


def _h_post_bda_bwd_acc(dout, h_res, residual, h_post, x, bias):
    acc = acc_dtype(h_res, residual, h_post, x, bias, dout)
    d = dout.to(acc)
    xb = x.to(acc) if bias is None else x.to(acc) + bias.to(acc)
    dh_res = torch.einsum("tic,tjc->tij", d, residual.to(acc))
    dresidual = torch.einsum("tij,tic->tjc", h_res.to(acc), d)
    dh_post = torch.einsum("tic,tc->ti", d, xb)
    dx = torch.einsum("ti,tic->tc", h_post.to(acc), d)
    dbias = None if bias is None else dx.sum(dim=0)
    return dh_res, dresidual, dh_post, dx, dbias


def h_post_bda_bwd(dout: Tensor, h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor,
                   bias: Optional[Tensor] = None):
    """dout [T, n, C] -> (dh_res, dresidual, dh_post, dx, dbias or None), each in its input's dtype.

    dh_res[t,i,j] = sum_c dout[t,i,c] residual[t,j,c]; dresidual[t,j,c] = sum_i h_res[t,i,j] dout[t,i,c];
    dh_post[t,i] = sum_c dout[t,i,c] (x[t,c] + bias[c]); dx[t,c] = sum_i h_post[t,i] dout[t,i,c];
    dbias[c] = sum_t dx[t,c], reduced over T in fp32 (fp64) from the unrounded dx, then cast.
    """
    grads = _h_post_bda_bwd_acc(dout, h_res, residual, h_post, x, bias)
    return _cast(grads, (h_res, residual, h_post, x, bias))


# ---------------------------------------------------------------- proj_rms


# The GPU backwards recover a row's RMS norm from the saved r as rms = 1/r - eps (x is read once, its norm is not
# summed again). r = 1 / (rms + eps) in fp32 cannot resolve an rms under eps * 2**-24, so a recovered rms of at most
# eps * ZERO_ROW (a few ulps of eps: the rounding of r and of 1/r, approximate reciprocals) is an all-zero row's, and
# its RMS term is 0 (dr * 0), as here. The kernels' former test, rms <= 0, let a zero row through where 1/r rounded an
# ulp above eps (~7% of fp32 eps values), and -dr r^2 / (K rms) then overflowed for eps below ~1e-12 .. 2e-9 (K from
# 28672 down to 8, |dr| from 1 to 1e6; an fp32 emulation): inf * 0 = NaN in that row's dx.
# The same limit bounds a tiny non-zero row: its recovered rms is off by a few eps * 2**-24, so the GPU's RMS term
# is off by that over rms relative (~1% at rms = eps * 2**-16), and under eps * 2**-20 the row counts as zero, though
# its true RMS term (norm |dr| r^2 / sqrt(K)) is not. This torch reference sums the norm, so it has neither limit.
ZERO_ROW = 2.0 ** -20


def proj_rms(x: Tensor, weight: Tensor, eps: float = 1e-6):
    """proj = x @ weight^T; r = 1 / (||x||_2 / sqrt(K) + eps).

    x [M, K], weight [N, K] (bf16/fp32, same dtype; fp64 in reference mode)
    -> proj [M, N] fp32, r [M] fp32 (both fp64 for fp64 inputs).
    """
    acc = acc_dtype(x, weight)
    xa = x.to(acc)
    proj = xa @ weight.to(acc).t()
    r = 1.0 / (torch.linalg.vector_norm(xa, dim=-1) / math.sqrt(x.shape[-1]) + eps)
    return proj, r


def _proj_rms_bwd_acc(dproj, dr, x, weight, r, eps, row_scale=None):
    """``row_scale`` [M] (mhc_pre: r): proj's gradient is ``dproj * row_scale[:, None]``, applied after the products
    (dx = s (dproj @ W), dweight = dproj^T @ (s x)). At a tiny eps an all-zero row's r = 1/eps times a gradient above
    ~4 is past fp32, and dweight's inf * 0 was NaN; s x is the row over its RMS + eps (RMS at most 1, finite), so that
    row adds 0."""
    acc = acc_dtype(x, weight, dproj)
    xa = x.to(acc)
    dx = dproj.to(acc) @ weight.to(acc)
    s = None if row_scale is None else row_scale.to(acc)[:, None]
    if s is not None:
        dx = s * dx
    if dr is not None:
        # d r / d x = -r^2 / sqrt(K) * x / ||x||: a per-row scale (-dr r) r / sqrt(K) / ||x|| times x (one pass over
        # [M, K]). An all-zero row gets dr * 0 (NaN only for a NaN dr), not scale * 0: its r = 1/eps squares past
        # fp32 for eps below ~5e-20, which the spec allows. A NaN norm stays NaN (`norm == 0`, not `norm > 0`, picks
        # the zero), as autograd's gradients. (-dr r) r keeps r^2 from overflowing alone; a tiny non-zero row at such
        # an eps can still overflow the scale where scale * x would not.
        norm = torch.linalg.vector_norm(xa, dim=-1)
        zero = norm == 0
        ra, dra = r.to(acc), dr.to(acc)
        scale = torch.where(zero, dra * 0, (-dra * ra) * ra / math.sqrt(x.shape[-1]) / torch.where(zero, 1.0, norm))
        dx = dx + scale[:, None] * xa
    dweight = dproj.to(acc).t() @ (xa if s is None else s * xa)
    return dx, dweight


def proj_rms_bwd(dproj: Tensor, dr: Optional[Tensor], x: Tensor, weight: Tensor, r: Tensor,
                 eps: float = 1e-6):
    """dx = dproj @ weight + dr * dr/dx; dweight = dproj^T @ x.

    dproj [M, N], dr [M] (None = zeros), r [M] from the forward -> (dx [M, K] in
    x.dtype, dweight [N, K] in weight.dtype). dr/dx = -r^2/sqrt(K) * x/||x||; an
    all-zero row of x (where ||x|| has no gradient) gets 0. ``eps`` is unused: r
    already holds it.
    """
    return _cast(_proj_rms_bwd_acc(dproj, dr, x, weight, r, eps), (x, weight))


# ---------------------------------------------------------------- mhc_pre (fused)


def pre_alpha(n: int, alpha_pre: float, alpha_post: float, alpha_res: float, dtype, device) -> Tensor:
    """The per-column scale of h: [alpha_pre]*n | [alpha_post]*n | [alpha_res]*n*n.

    Built with fills on the device (no host-to-device copy: the torch path stays capturable
    in a CUDA graph)."""
    a = torch.empty(2 * n + n * n, dtype=dtype, device=device)
    a[:n].fill_(alpha_pre)
    a[n:2 * n].fill_(alpha_post)
    a[2 * n:].fill_(alpha_res)
    return a


def _pre_mix(proj: Tensor, r: Tensor, bias: Tensor, n: int, alphas):
    """h = r * proj * alpha + bias, split into (pre [T,n], post [T,n], res [T,n,n])."""
    alpha = pre_alpha(n, *alphas, dtype=proj.dtype, device=proj.device)
    h = r[:, None] * proj * alpha + bias.to(proj.dtype)
    return h[:, :n], h[:, n:2 * n], h[:, 2 * n:].reshape(-1, n, n), alpha


def pre_from_proj(x: Tensor, proj: Tensor, r: Tensor, bias: Tensor, alpha_pre: float,
                  alpha_post: float, alpha_res: float, iters: int, sinkhorn_eps: float):
    """The epilogue of mhc_pre given proj, r = proj_rms(x.view(T, n*C), weight)."""
    n = x.shape[1]
    pre, post, res, _ = _pre_mix(proj, r, bias, n, (alpha_pre, alpha_post, alpha_res))
    h_pre = torch.sigmoid(pre)
    layer_in = h_aggregate(x, h_pre)
    return layer_in, 2 * torch.sigmoid(post), sinkhorn(res, iters, sinkhorn_eps)


def mhc_pre(x: Tensor, weight: Tensor, bias: Tensor, alpha_pre: float = 1.0, alpha_post: float = 1.0,
            alpha_res: float = 1.0, iters: int = 20, rms_eps: float = 1e-6, sinkhorn_eps: float = 1e-6):
    """The fused mHC pre-step.

    x [T, n, C] bf16/fp32 (fp64), weight [n*n+2n, n*C] (x's dtype), bias [n*n+2n] fp32 (fp64).
    proj, r = proj_rms(x.view(T, n*C), weight, rms_eps); h = r * proj * alpha + bias with
    the n*n+2n axis split in the order pre (n) | post (n) | res (n*n, row-major [n, n]),
    alpha = alpha_pre | alpha_post | alpha_res on those sections;
    h_pre = sigmoid(pre); h_post = 2 sigmoid(post); h_res = sinkhorn(res, iters, sinkhorn_eps);
    layer_in = h_aggregate(x, h_pre) with h_pre unrounded (fp32).
    -> (layer_in [T, C] x.dtype, h_post [T, n] fp32, h_res [T, n, n] fp32); fp64 for fp64 inputs.
    """
    T, n, C = x.shape
    proj, r = proj_rms(x.reshape(T, n * C), weight, rms_eps)
    return pre_from_proj(x, proj, r, bias, alpha_pre, alpha_post, alpha_res, iters, sinkhorn_eps)


def mhc_pre_bwd(dlayer_in: Tensor, dh_post: Tensor, dh_res: Tensor, x: Tensor, weight: Tensor,
                bias: Tensor, proj: Tensor, r: Tensor, alpha_pre: float = 1.0, alpha_post: float = 1.0,
                alpha_res: float = 1.0, iters: int = 20, rms_eps: float = 1e-6,
                sinkhorn_eps: float = 1e-6):
    """Gradients of :func:`mhc_pre` by composing its parts' backward formulas.

    dlayer_in [T, C], dh_post [T, n], dh_res [T, n, n]; proj [T, n*n+2n] and r [T]
    are the forward's proj_rms results -> (dx [T, n, C] x.dtype, dweight weight.dtype,
    dbias bias.dtype). dbias = sum over T of dh (fp32). The alphas get no gradient
    (they are scalar params).
    """
    T, n, C = x.shape
    pre, post, res, alpha = _pre_mix(proj, r, bias, n, (alpha_pre, alpha_post, alpha_res))
    s_pre, s_post = torch.sigmoid(pre), torch.sigmoid(post)
    dx_agg, dh_pre = _h_aggregate_bwd_acc(dlayer_in, x, s_pre)
    d_pre = dh_pre.to(proj.dtype) * s_pre * (1 - s_pre)
    d_post = dh_post.to(proj.dtype) * 2 * s_post * (1 - s_post)
    d_res = _sinkhorn_bwd_acc(dh_res, res, iters, sinkhorn_eps).reshape(T, n * n)
    dh = torch.cat([d_pre, d_post, d_res], dim=1)
    # proj's gradient is dh * alpha * r: r goes in after the products (_proj_rms_bwd_acc's row_scale)
    dha = dh * alpha
    dr = (dha * proj).sum(dim=1)
    dx_proj, dweight = _proj_rms_bwd_acc(dha, dr, x.reshape(T, n * C), weight, r, rms_eps, row_scale=r)
    dx = dx_agg + dx_proj.reshape(T, n, C).to(dx_agg.dtype)
    return _cast((dx, dweight, dh.sum(dim=0)), (x, weight, bias))


# ---------------------------------------------------------------- mhc_post_pre (layer boundary)


def mhc_post_pre(h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor, weight: Tensor, hbias: Tensor,
                 bias: Optional[Tensor] = None, alpha_pre: float = 1.0, alpha_post: float = 1.0,
                 alpha_res: float = 1.0, iters: int = 20, rms_eps: float = 1e-6, sinkhorn_eps: float = 1e-6):
    """The layer boundary: out = h_post_bda(h_res, residual, h_post, x, bias), then
    (layer_in, h_post_next, h_res_next) = mhc_pre(out, weight, hbias, ...).

    h_res [T, n, n], residual [T, n, C], h_post [T, n], x [T, C], bias [C] or None (last: it
    is optional) as :func:`h_post_bda`; weight [n*n+2n, n*C] (residual's dtype), hbias [n*n+2n] fp32 as
    :func:`mhc_pre`'s weight and bias. mhc_pre reads ``out`` as returned (rounded to
    residual's dtype), exactly as the two ops called in turn do.
    -> (out [T, n, C], layer_in [T, C], both residual's dtype; h_post_next [T, n],
    h_res_next [T, n, n], fp32; fp64 throughout in reference mode).
    """
    out = h_post_bda(h_res, residual, h_post, x, bias)
    return (out, *mhc_pre(out, weight, hbias, alpha_pre, alpha_post, alpha_res, iters, rms_eps,
                          sinkhorn_eps))


def mhc_post_pre_bwd(dout: Tensor, dlayer_in: Tensor, dh_post_next: Tensor, dh_res_next: Tensor,
                     h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor, weight: Tensor, hbias: Tensor,
                     bias: Optional[Tensor], out: Tensor, proj: Tensor, r: Tensor, *params):
    """Gradients of :func:`mhc_post_pre` from its parts' backward formulas.

    dout [T, n, C] (the gradient of ``out`` from outside) plus mhc_pre's d(out), summed
    unrounded in the accumulation dtype, is the gradient that enters h_post_bda's backward.
    proj [T, n*n+2n], r [T] are the forward's proj_rms results on ``out``.
    -> (dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias or None), each in its
    input's dtype (spec order: h_res, residual, h_post, x, weight, hbias, bias). ``params``: alpha_pre, alpha_post,
    alpha_res, iters, rms_eps, sinkhorn_eps.
    """
    acc = acc_dtype(out, dout, proj)
    # out upcast: mhc_pre_bwd then returns d(out) unrounded (its math upcasts anyway)
    d_pre, dweight, dhbias = mhc_pre_bwd(dlayer_in, dh_post_next, dh_res_next, out.to(acc), weight, hbias,
                                         proj, r, *params)
    d_total = dout.to(acc) + d_pre
    dh_res, dresidual, dh_post, dx, dbias = h_post_bda_bwd(d_total, h_res, residual, h_post, x, bias)
    return dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias
