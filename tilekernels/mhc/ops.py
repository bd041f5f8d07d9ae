"""mHC ops as destination-passing custom ops + allocating wrappers + autograd.

Pattern for every op here (and in the other families):
  * ``tilekernels::<op>_fwd`` / ``_bwd``: ``torch.library.custom_op`` with
    ``mutates_args`` naming the outputs and a ``backend`` string; the body
    calls the registered kernel of that backend (``_glue.get_kernel``);
  * an allocating wrapper that makes the outputs (``_glue.empty``) and calls it;
  * an ``autograd.Function`` whose forward / backward run the ``_fwd`` / ``_bwd``
    custom op while torch.compile traces (or a dispatch mode is active), and the
    same kernel directly in eager mode (``_glue.run_pass``: no dispatcher cost per
    call); backwards are once-differentiable (a double backward raises);
  * the public functional (the spec's ``entry``), which the registry calls with
    validated inputs and the chosen backend.
The torch backend's kernels (below, ``@kernel(..., "torch", ...)``) write the
reference's results into the given outputs.

Kernel signatures (destination-passing; what every backend registers):

  mhc_h_aggregate fwd (x, h_pre, out)
                  bwd (dout, x, h_pre, dx, dh_pre)
  mhc_sinkhorn    fwd (logits, out, iters, eps)
                  bwd (dout, logits, dlogits, iters, eps)
  mhc_h_post_bda  fwd (h_res, residual, h_post, x, bias|None, out)
                  bwd (dout, h_res, residual, h_post, x, bias|None,
                       dh_res, dresidual, dh_post, dx, dbias|None)
  mhc_proj_rms    fwd (x, weight, proj, r, eps)
                  bwd (dproj, dr, x, weight, r, dx, dweight, eps)
                      dr is always a tensor: autograd passes zeros when r is unused.
  mhc_pre         fwd (x, weight, bias, layer_in, h_post, h_res, proj, r,
                       alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)
                  bwd (dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias,
                       alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)
                      proj [T, n*n+2n] and r [T] (fp32) are proj_rms's results, written by the
                      fwd and saved for the bwd (so the bwd needs no second GEMM over x first).

Gradients come back in their input's dtype; incoming grads are made contiguous.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from tilekernels._glue import acc_dtype, empty, get_kernel, kernel, run_pass

from . import reference as ref

OPS = ("mhc_h_aggregate", "mhc_sinkhorn", "mhc_h_post_bda", "mhc_proj_rms", "mhc_pre")


def _write(dsts, srcs) -> None:
    """Copy each result into its destination (None destinations are skipped)."""
    for d, s in zip(dsts, srcs):
        if d is not None:
            d.copy_(s)


def _like(*ts):
    """Poison-able empties shaped and typed like ``ts`` (None stays None)."""
    return tuple(None if t is None else empty(t.shape, t.dtype, t.device) for t in ts)


def _grads(*gs):
    return tuple(None if g is None else g.contiguous() for g in gs)


# ---------------------------------------------------------------- h_aggregate


@torch.library.custom_op("tilekernels::mhc_h_aggregate_fwd", mutates_args=("out",))
def _h_aggregate_fwd(x: Tensor, h_pre: Tensor, out: Tensor, backend: str) -> None:
    get_kernel("mhc_h_aggregate", backend, "fwd")(x, h_pre, out)


@torch.library.custom_op("tilekernels::mhc_h_aggregate_bwd", mutates_args=("dx", "dh_pre"))
def _h_aggregate_bwd(dout: Tensor, x: Tensor, h_pre: Tensor, dx: Tensor, dh_pre: Tensor,
                     backend: str) -> None:
    get_kernel("mhc_h_aggregate", backend, "bwd")(dout, x, h_pre, dx, dh_pre)


@kernel("mhc_h_aggregate", "torch", "fwd")
def _h_aggregate_fwd_torch(x, h_pre, out):
    out.copy_(ref.h_aggregate(x, h_pre))


@kernel("mhc_h_aggregate", "torch", "bwd")
def _h_aggregate_bwd_torch(dout, x, h_pre, dx, dh_pre):
    _write((dx, dh_pre), ref.h_aggregate_bwd(dout, x, h_pre))


class _HAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h_pre, backend):
        out = empty((x.shape[0], x.shape[2]), x.dtype, x.device)
        run_pass(_h_aggregate_fwd, OPS[0], "fwd", x, h_pre, out, backend=backend)
        ctx.save_for_backward(x, h_pre)
        ctx.backend = backend
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        x, h_pre = ctx.saved_tensors
        dx, dh = _like(x, h_pre)
        run_pass(_h_aggregate_bwd, OPS[0], "bwd", *_grads(dout), x, h_pre, dx, dh, backend=ctx.backend)
        return dx, dh, None


def h_aggregate(x: Tensor, h_pre: Tensor, *, backend: str = "torch") -> Tensor:
    """out [T, C] (x.dtype) = sum_i h_pre[t, i] * x[t, i, :].

    x [T, n, C] contiguous bf16/fp32; h_pre [T, n] bf16/fp32. Differentiable in
    both. Call through ``registry.get("mhc_h_aggregate")`` to validate inputs
    and pick the backend; this function trusts its inputs.
    """
    return _HAggregate.apply(x, h_pre, backend)


# ---------------------------------------------------------------- sinkhorn


@torch.library.custom_op("tilekernels::mhc_sinkhorn_fwd", mutates_args=("out",))
def _sinkhorn_fwd(logits: Tensor, out: Tensor, iters: int, eps: float, backend: str) -> None:
    get_kernel("mhc_sinkhorn", backend, "fwd")(logits, out, iters, eps)


@torch.library.custom_op("tilekernels::mhc_sinkhorn_bwd", mutates_args=("dlogits",))
def _sinkhorn_bwd(dout: Tensor, logits: Tensor, dlogits: Tensor, iters: int, eps: float,
                  backend: str) -> None:
    get_kernel("mhc_sinkhorn", backend, "bwd")(dout, logits, dlogits, iters, eps)


@kernel("mhc_sinkhorn", "torch", "fwd")
def _sinkhorn_fwd_torch(logits, out, iters, eps):
    out.copy_(ref.sinkhorn(logits, iters, eps))


@kernel("mhc_sinkhorn", "torch", "bwd")
def _sinkhorn_bwd_torch(dout, logits, dlogits, iters, eps):
    dlogits.copy_(ref.sinkhorn_bwd(dout, logits, iters, eps))


class _Sinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, iters, eps, backend):
        out = empty(logits.shape, acc_dtype(logits), logits.device)
        run_pass(_sinkhorn_fwd, OPS[1], "fwd", logits, out, iters, eps, backend=backend)
        ctx.save_for_backward(logits)
        ctx.args = (iters, eps, backend)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        (logits,) = ctx.saved_tensors
        (dl,) = _like(logits)
        iters, eps, backend = ctx.args
        run_pass(_sinkhorn_bwd, OPS[1], "bwd", *_grads(dout), logits, dl, iters, eps, backend=backend)
        return dl, None, None, None


def sinkhorn(logits: Tensor, *, iters: int = 20, eps: float = 1e-6, backend: str = "torch") -> Tensor:
    """H_res [T, n, n] fp32 (fp64 for fp64 logits): exp(logits - rowmax), then ``iters``
    rounds of row then column normalization (each sum + eps).

    logits [T, n, n] contiguous fp32. Differentiable (exact gradient of the steps).
    """
    return _Sinkhorn.apply(logits, iters, eps, backend)


# ---------------------------------------------------------------- h_post_bda


@torch.library.custom_op("tilekernels::mhc_h_post_bda_fwd", mutates_args=("out",))
def _h_post_bda_fwd(h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor,
                    bias: Optional[Tensor], out: Tensor, backend: str) -> None:
    get_kernel("mhc_h_post_bda", backend, "fwd")(h_res, residual, h_post, x, bias, out)


@torch.library.custom_op("tilekernels::mhc_h_post_bda_bwd",
                         mutates_args=("dh_res", "dresidual", "dh_post", "dx", "dbias"))
def _h_post_bda_bwd(dout: Tensor, h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor,
                    bias: Optional[Tensor], dh_res: Tensor, dresidual: Tensor, dh_post: Tensor,
                    dx: Tensor, dbias: Optional[Tensor], backend: str) -> None:
    get_kernel("mhc_h_post_bda", backend, "bwd")(dout, h_res, residual, h_post, x, bias,
                                                 dh_res, dresidual, dh_post, dx, dbias)


@kernel("mhc_h_post_bda", "torch", "fwd")
def _h_post_bda_fwd_torch(h_res, residual, h_post, x, bias, out):
    out.copy_(ref.h_post_bda(h_res, residual, h_post, x, bias))


@kernel("mhc_h_post_bda", "torch", "bwd")
def _h_post_bda_bwd_torch(dout, h_res, residual, h_post, x, bias, dh_res, dresidual, dh_post, dx, dbias):
    _write((dh_res, dresidual, dh_post, dx, dbias),
           ref.h_post_bda_bwd(dout, h_res, residual, h_post, x, bias))


class _HPostBda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_res, residual, h_post, x, bias, backend):
        out = empty(residual.shape, residual.dtype, residual.device)
        run_pass(_h_post_bda_fwd, OPS[2], "fwd", h_res, residual, h_post, x, bias, out, backend=backend)
        ctx.save_for_backward(h_res, residual, h_post, x, bias)
        ctx.backend = backend
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        grads = _like(*saved)
        run_pass(_h_post_bda_bwd, OPS[2], "bwd", *_grads(dout), *saved, *grads, backend=ctx.backend)
        return (*grads, None)


def h_post_bda(h_res: Tensor, residual: Tensor, h_post: Tensor, x: Tensor,
               bias: Optional[Tensor] = None, *, backend: str = "torch") -> Tensor:
    """out [T, n, C] (residual.dtype) = h_res @ residual + h_post * (x + bias).

    h_res [T, n, n], h_post [T, n] bf16/fp32; residual [T, n, C] and x [T, C] bf16/fp32
    (same dtype); bias [C] in x's dtype or fp32, or None. All contiguous.
    Differentiable in every tensor; dbias is reduced over T in fp32.
    """
    return _HPostBda.apply(h_res, residual, h_post, x, bias, backend)


# ---------------------------------------------------------------- proj_rms


@torch.library.custom_op("tilekernels::mhc_proj_rms_fwd", mutates_args=("proj", "r"))
def _proj_rms_fwd(x: Tensor, weight: Tensor, proj: Tensor, r: Tensor, eps: float, backend: str) -> None:
    get_kernel("mhc_proj_rms", backend, "fwd")(x, weight, proj, r, eps)


@torch.library.custom_op("tilekernels::mhc_proj_rms_bwd", mutates_args=("dx", "dweight"))
def _proj_rms_bwd(dproj: Tensor, dr: Tensor, x: Tensor, weight: Tensor, r: Tensor, dx: Tensor,
                  dweight: Tensor, eps: float, backend: str) -> None:
    get_kernel("mhc_proj_rms", backend, "bwd")(dproj, dr, x, weight, r, dx, dweight, eps)


@kernel("mhc_proj_rms", "torch", "fwd")
def _proj_rms_fwd_torch(x, weight, proj, r, eps):
    _write((proj, r), ref.proj_rms(x, weight, eps))


@kernel("mhc_proj_rms", "torch", "bwd")
def _proj_rms_bwd_torch(dproj, dr, x, weight, r, dx, dweight, eps):
    _write((dx, dweight), ref.proj_rms_bwd(dproj, dr, x, weight, r, eps))


def _proj_rms_outputs(rows: int, n_out: int, dtype, device):
    return empty((rows, n_out), dtype, device), empty((rows,), dtype, device)


class _ProjRms(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, backend):
        proj, r = _proj_rms_outputs(x.shape[0], weight.shape[0], acc_dtype(x, weight), x.device)
        run_pass(_proj_rms_fwd, OPS[3], "fwd", x, weight, proj, r, eps, backend=backend)
        ctx.save_for_backward(x, weight, r)
        ctx.args = (eps, backend)
        return proj, r

    @staticmethod
    @once_differentiable
    def backward(ctx, dproj, dr):
        # autograd materializes an unused output's grad as zeros, so dr is never None here
        x, weight, r = ctx.saved_tensors
        dx, dw = _like(x, weight)
        eps, backend = ctx.args
        run_pass(_proj_rms_bwd, OPS[3], "bwd", *_grads(dproj, dr), x, weight, r, dx, dw, eps, backend=backend)
        return dx, dw, None, None


def proj_rms(x: Tensor, weight: Tensor, *, eps: float = 1e-6, backend: str = "torch"):
    """(proj [M, N], r [M]), both fp32: proj = x @ weight^T, r = 1 / (||x||_2 / sqrt(K) + eps).

    x [M, K] bf16/fp32, weight [N, K] same dtype, contiguous. Differentiable in x and
    weight through both outputs.
    """
    return _ProjRms.apply(x, weight, eps, backend)


# ---------------------------------------------------------------- mhc_pre (fused)


@torch.library.custom_op("tilekernels::mhc_pre_fwd",
                         mutates_args=("layer_in", "h_post", "h_res", "proj", "r"))
def _pre_fwd(x: Tensor, weight: Tensor, bias: Tensor, layer_in: Tensor, h_post: Tensor,
             h_res: Tensor, proj: Tensor, r: Tensor, alpha_pre: float, alpha_post: float,
             alpha_res: float, iters: int, rms_eps: float, sinkhorn_eps: float, backend: str) -> None:
    get_kernel("mhc_pre", backend, "fwd")(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre,
                                          alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)


@torch.library.custom_op("tilekernels::mhc_pre_bwd", mutates_args=("dx", "dweight", "dbias"))
def _pre_bwd(dlayer_in: Tensor, dh_post: Tensor, dh_res: Tensor, x: Tensor, weight: Tensor,
             bias: Tensor, proj: Tensor, r: Tensor, dx: Tensor, dweight: Tensor, dbias: Tensor,
             alpha_pre: float, alpha_post: float, alpha_res: float, iters: int, rms_eps: float,
             sinkhorn_eps: float, backend: str) -> None:
    get_kernel("mhc_pre", backend, "bwd")(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r,
                                          dx, dweight, dbias, alpha_pre, alpha_post, alpha_res,
                                          iters, rms_eps, sinkhorn_eps)


@kernel("mhc_pre", "torch", "fwd")
def _pre_fwd_torch(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre, alpha_post,
                   alpha_res, iters, rms_eps, sinkhorn_eps):
    T, n, C = x.shape
    pr = ref.proj_rms(x.reshape(T, n * C), weight, rms_eps)
    _write((proj, r), pr)
    _write((layer_in, h_post, h_res),
           ref.pre_from_proj(x, *pr, bias, alpha_pre, alpha_post, alpha_res, iters, sinkhorn_eps))


@kernel("mhc_pre", "torch", "bwd")
def _pre_bwd_torch(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias, *params):
    _write((dx, dweight, dbias),
           ref.mhc_pre_bwd(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, *params))


class _Pre(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, alpha_pre, alpha_post, alpha_res, iters, rms_eps,
                sinkhorn_eps, backend):
        T, n, C = x.shape
        acc = acc_dtype(x, weight, bias)
        layer_in = empty((T, C), x.dtype, x.device)
        h_post = empty((T, n), acc, x.device)
        h_res = empty((T, n, n), acc, x.device)
        proj, r = _proj_rms_outputs(T, weight.shape[0], acc, x.device)
        params = (alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)
        run_pass(_pre_fwd, OPS[4], "fwd", x, weight, bias, layer_in, h_post, h_res, proj, r, *params,
                 backend=backend)
        ctx.save_for_backward(x, weight, bias, proj, r)
        ctx.args = (*params, backend)
        return layer_in, h_post, h_res

    @staticmethod
    @once_differentiable
    def backward(ctx, dlayer_in, dh_post, dh_res):
        x, weight, bias, proj, r = ctx.saved_tensors
        dx, dw, db = _like(x, weight, bias)
        *params, backend = ctx.args
        run_pass(_pre_bwd, OPS[4], "bwd", *_grads(dlayer_in, dh_post, dh_res), x, weight, bias, proj, r,
                 dx, dw, db, *params, backend=backend)
        return dx, dw, db, *([None] * 7)


def mhc_pre(x: Tensor, weight: Tensor, bias: Tensor, *, alpha_pre: float = 1.0, alpha_post: float = 1.0,
            alpha_res: float = 1.0, iters: int = 20, rms_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
            backend: str = "torch"):
    """(layer_in [T, C] x.dtype, h_post [T, n] fp32, h_res [T, n, n] fp32): the fused mHC pre-step.

    x [T, n, C] bf16/fp32; weight [n*n+2n, n*C] x's dtype; bias [n*n+2n] fp32; all contiguous.
    h = r * (x.view(T, n*C) @ weight^T) * alpha + bias, split pre (n) | post (n) | res (n*n);
    h_pre = sigmoid(pre), h_post = 2 sigmoid(post), h_res = sinkhorn(res, iters, sinkhorn_eps),
    layer_in = sum_i h_pre[:, i] * x[:, i]; r = 1/(||x_t||/sqrt(n*C) + rms_eps).
    Differentiable in x, weight and bias (the alphas are scalar params, no gradient).
    """
    return _Pre.apply(x, weight, bias, alpha_pre, alpha_post, alpha_res, iters, rms_eps,
                      sinkhorn_eps, backend)
