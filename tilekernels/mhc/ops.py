"""mHC ops: the torch backend's kernels and the op declarations.

Everything around an op (custom ops ``tilekernels::<op>_fwd`` / ``_bwd``, output
allocation, the once-differentiable autograd.Function, the functional entry)
is generated from its spec by :func:`tilekernels._opgen.define`; this module
adds what the spec does not say (what the backward saves, the scratch it
needs) and the torch backend's destination-passing kernels, which write the
reference's results into the given outputs.

Kernel signatures (every backend registers these; see _opgen):

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
                      fwd as scratch and saved for the bwd (no second GEMM over x first).
  mhc_post_pre    fwd (h_res, residual, h_post, x, weight, hbias, bias|None,
                       out, layer_in, h_post_next, h_res_next, proj, r, *mhc_pre's params)
                  bwd (dout, dlayer_in, dh_post_next, dh_res_next,
                       h_res, residual, h_post, x, weight, hbias, bias|None, out, proj, r,
                       dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias|None, *params)
                      proj, r: proj_rms's results on out (scratch, as mhc_pre's).

Gradients come back in their input's dtype; incoming grads are made contiguous.
"""
from __future__ import annotations

from specs import mhc as S
from tilekernels._glue import kernel
from tilekernels._opgen import Decl, Scratch, define

from . import reference as ref


def _write(dsts, srcs) -> None:
    """Copy each result into its destination (None destinations are skipped)."""
    for d, s in zip(dsts, srcs):
        if d is not None:
            d.copy_(s)


@kernel("mhc_h_aggregate", "torch", "fwd")
def _h_aggregate_fwd_torch(x, h_pre, out):
    out.copy_(ref.h_aggregate(x, h_pre))


@kernel("mhc_h_aggregate", "torch", "bwd")
def _h_aggregate_bwd_torch(dout, x, h_pre, dx, dh_pre):
    _write((dx, dh_pre), ref.h_aggregate_bwd(dout, x, h_pre))


@kernel("mhc_sinkhorn", "torch", "fwd")
def _sinkhorn_fwd_torch(logits, out, iters, eps):
    out.copy_(ref.sinkhorn(logits, iters, eps))


@kernel("mhc_sinkhorn", "torch", "bwd")
def _sinkhorn_bwd_torch(dout, logits, dlogits, iters, eps):
    dlogits.copy_(ref.sinkhorn_bwd(dout, logits, iters, eps))


@kernel("mhc_h_post_bda", "torch", "fwd")
def _h_post_bda_fwd_torch(h_res, residual, h_post, x, bias, out):
    out.copy_(ref.h_post_bda(h_res, residual, h_post, x, bias))


@kernel("mhc_h_post_bda", "torch", "bwd")
def _h_post_bda_bwd_torch(dout, h_res, residual, h_post, x, bias, dh_res, dresidual, dh_post, dx, dbias):
    _write((dh_res, dresidual, dh_post, dx, dbias),
           ref.h_post_bda_bwd(dout, h_res, residual, h_post, x, bias))


@kernel("mhc_proj_rms", "torch", "fwd")
def _proj_rms_fwd_torch(x, weight, proj, r, eps):
    _write((proj, r), ref.proj_rms(x, weight, eps))


@kernel("mhc_proj_rms", "torch", "bwd")
def _proj_rms_bwd_torch(dproj, dr, x, weight, r, dx, dweight, eps):
    _write((dx, dweight), ref.proj_rms_bwd(dproj, dr, x, weight, r, eps))


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


@kernel("mhc_post_pre", "torch", "fwd")
def _post_pre_fwd_torch(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next,
                        h_res_next, proj, r, alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps):
    out.copy_(ref.h_post_bda(h_res, residual, h_post, x, bias))
    _pre_fwd_torch(out, weight, hbias, layer_in, h_post_next, h_res_next, proj, r, alpha_pre, alpha_post,
                   alpha_res, iters, rms_eps, sinkhorn_eps)


@kernel("mhc_post_pre", "torch", "bwd")
def _post_pre_bwd_torch(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias,
                        bias, out, proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, *params):
    _write((dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias),
           ref.mhc_post_pre_bwd(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight,
                                hbias, bias, out, proj, r, *params))


h_aggregate = define(S.H_AGGREGATE, Decl(saves=("x", "h_pre"), flops=("2*T*n*C", "4*T*n*C")))
sinkhorn = define(S.SINKHORN, Decl(saves=("logits",)))
h_post_bda = define(S.H_POST_BDA, Decl(saves=("h_res", "residual", "h_post", "x", "bias"),
                                        flops=("2*T*n*n*C", "4*T*n*n*C")))
proj_rms = define(S.PROJ_RMS, Decl(saves=("x", "weight", "r"), flops=("2*M*N*K", "4*M*N*K")))
mhc_pre = define(S.PRE, Decl(saves=("x", "weight", "bias", "proj", "r"),
                             scratch=(Scratch("proj", ("T", "n*n+2*n")), Scratch("r", ("T",))),
                             flops=("2*T*(n*n+2*n)*n*C + 2*T*n*C", "4*T*(n*n+2*n)*n*C + 4*T*n*C")))
mhc_post_pre = define(S.POST_PRE, Decl(saves=("h_res", "residual", "h_post", "x", "weight", "hbias", "bias",
                                             "out", "proj", "r"),
                                      scratch=(Scratch("proj", ("T", "n*n+2*n")), Scratch("r", ("T",))),
                                      flops=("2*T*n*n*C + 2*T*n*C + 2*T*(n*n+2*n)*n*C",
                                             "4*T*n*n*C + 4*T*n*C + 4*T*(n*n+2*n)*n*C")))
