"""The cuTile backend of the mHC family: registers every kernel with the glue.

Destination-passing implementations (outputs are given, every element is
written). Shapes, dtypes and the launch configs live in the per-op modules:
cutile_aggregate, cutile_post_bda, cutile_sinkhorn, cutile_proj_rms, cutile_pre.
Importing this module needs ``cuda.tile`` but no GPU; launching needs CUDA.

Backend limits (for the specs): SM 9.0 (run and tested on H200) and 10.x
(compiled for sm_100, never run); no float64 (the torch backend covers it);
contiguous tensors; every tensor below 2**31 elements (int32 indexing);
n in [1, 8] (padded to a power of two in registers), any C >= 1 and any T >= 0
(tails masked; 16-byte vector access when rows are multiples of 8 elements).
  h_aggregate: x bf16 or fp32, h_pre bf16 or fp32.
  h_post_bda:  residual / x bf16 or fp32 (same dtype),
               bias None or x's dtype (an fp32 bias with bf16 x is untested),
               h_res / h_post bf16 or fp32.
  sinkhorn:    logits fp32; iters is a compile-time constant (the bwd unrolls it;
               tested 3 and 20).
  proj_rms:    x and weight bf16; N = n*n + 2n <= 128.
  mhc_pre:     x and weight bf16, bias fp32 (n <= 8, so N <= 80); iters as sinkhorn.
  mhc_post_pre: residual, x, weight (and bias) bf16, hbias fp32, h_res / h_post bf16 or fp32;
               iters as sinkhorn (cutile_post_pre).
No tile-size constraint reaches the user (tile sizes are internal powers of two).
"""
from __future__ import annotations

from tilekernels._cutile import run_all
from tilekernels._glue import kernel

from . import cutile_aggregate as agg
from . import cutile_post_bda as pb
from . import cutile_post_pre as pp
from . import cutile_pre as pre
from . import cutile_proj_rms as pr
from . import cutile_sinkhorn as sk

BACKEND = "cutile"


@kernel("mhc_h_aggregate", BACKEND, "fwd")
def h_aggregate_fwd(x, h_pre, out):
    agg.fwd_launch(x, h_pre, out).run()


@kernel("mhc_h_aggregate", BACKEND, "bwd")
def h_aggregate_bwd(dout, x, h_pre, dx, dh_pre):
    agg.bwd_launch(dout, x, h_pre, dx, dh_pre).run()


@kernel("mhc_h_post_bda", BACKEND, "fwd")
def h_post_bda_fwd(h_res, residual, h_post, x, bias, out):
    run_all(pb.fwd_launches(h_res, residual, h_post, x, bias, out))


@kernel("mhc_h_post_bda", BACKEND, "bwd")
def h_post_bda_bwd(dout, h_res, residual, h_post, x, bias, dh_res, dresidual, dh_post, dx, dbias):
    run_all(pb.bwd_launches(dout, h_res, residual, h_post, x, bias,
                            dh_res, dresidual, dh_post, dx, dbias))


@kernel("mhc_sinkhorn", BACKEND, "fwd")
def sinkhorn_fwd(logits, out, iters: int, eps: float):
    sk.fwd_launch(logits, out, iters, eps).run()


@kernel("mhc_sinkhorn", BACKEND, "bwd")
def sinkhorn_bwd(dout, logits, dlogits, iters: int, eps: float):
    sk.bwd_launch(dout, logits, dlogits, iters, eps).run()


@kernel("mhc_proj_rms", BACKEND, "fwd")
def proj_rms_fwd(x, weight, proj, r, eps: float):
    pr.fwd_launch(x, weight, proj, r, eps).run()


@kernel("mhc_proj_rms", BACKEND, "bwd")
def proj_rms_bwd(dproj, dr, x, weight, r, dx, dweight, eps: float):
    run_all(pr.bwd_launches(dproj, dr, x, weight, r, dx, dweight, eps))


@kernel("mhc_pre", BACKEND, "fwd")
def pre_fwd(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre: float, alpha_post: float,
            alpha_res: float, iters: int, rms_eps: float, sinkhorn_eps: float):
    run_all(pre.fwd_launches(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre, alpha_post,
                             alpha_res, iters, rms_eps, sinkhorn_eps))


@kernel("mhc_pre", BACKEND, "bwd")
def pre_bwd(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias,
            alpha_pre: float, alpha_post: float, alpha_res: float, iters: int, rms_eps: float,
            sinkhorn_eps: float):
    run_all(pre.bwd_launches(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias,
                             alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps))


@kernel("mhc_post_pre", BACKEND, "fwd")
def post_pre_fwd(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next, h_res_next, proj, r,
                 alpha_pre: float, alpha_post: float, alpha_res: float, iters: int, rms_eps: float,
                 sinkhorn_eps: float):
    pp.run(pp.fwd_launches(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next, h_res_next,
                           proj, r, alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps))


@kernel("mhc_post_pre", BACKEND, "bwd")
def post_pre_bwd(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias, bias, out,
                 proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, alpha_pre: float,
                 alpha_post: float, alpha_res: float, iters: int, rms_eps: float, sinkhorn_eps: float):
    pp.run(pp.bwd_launches(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias,
                           bias, out, proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, alpha_pre,
                           alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps))


def _pb_cfg(T, n, C, one=None, **changes):
    import dataclasses

    return dataclasses.replace(pb.PostBdaCfg.heuristic(T, n, C, one=one), **changes)


def representative_launches(n: int = 4, C: int = 7168, T: int = 32768, hdtype=None):
    """Every kernel's launch at one problem size, on ``meta`` tensors: what the
    CI compile test exports to cubins (sm_90, sm_100) without a GPU."""
    import torch

    meta = torch.device("meta")
    bf = torch.bfloat16
    hd = hdtype or torch.float32

    def e(*shape, dtype=bf):
        return torch.empty(*shape, dtype=dtype, device=meta)

    x3, x2, b = e(T, n, C), e(T, C), e(C)
    hn, hnn = e(T, n, dtype=hd), e(T, n, n, dtype=hd)
    lg = e(T, n, n, dtype=torch.float32)
    N, K = n * n + 2 * n, n * C
    xm, w, p, r = e(T, K), e(N, K), e(T, N, dtype=torch.float32), e(T, dtype=torch.float32)
    f32 = torch.float32
    pb_, hp, hr = e(N, dtype=f32), e(T, n, dtype=f32), e(T, n, n, dtype=f32)
    pre_args = (1.0, 1.0, 1.0, 20, 1e-6, 1e-6)
    out = {
        "mhc_h_aggregate.fwd": [agg.fwd_launch(x3, hn, x2)],
        "mhc_h_aggregate.bwd": [agg.bwd_launch(x2, x3, hn, x3, hn)],
        "mhc_h_post_bda.fwd": pb.fwd_launches(hnn, x3, hn, x2, b, x3),
        "mhc_h_post_bda.fwd.nobias": pb.fwd_launches(hnn, x3, hn, x2, None, x3),
        "mhc_h_post_bda.bwd": pb.bwd_launches(x3, hnn, x3, hn, x2, b, hnn, x3, hn, x2, b),
        "mhc_h_post_bda.bwd.nobias": pb.bwd_launches(x3, hnn, x3, hn, x2, None, hnn, x3, hn, x2, None),
        "mhc_sinkhorn.fwd": [sk.fwd_launch(lg, lg, 20, 1e-6)],
        "mhc_sinkhorn.bwd": [sk.bwd_launch(lg, lg, lg, 20, 1e-6)],
        "mhc_proj_rms.fwd": [pr.fwd_launch(xm, w, p, r, 1e-6)],
        "mhc_proj_rms.bwd": pr.bwd_launches(p, r, xm, w, r, xm, w, 1e-6),
        # non-default h_post_bda configs the sweeps measure (the two-pass backward that n = 8
        # uses; transposed h_res load; bf16 h read directly): compiled too, so they cannot rot
        "mhc_h_post_bda.variants": [
            *pb.fwd_launches(hnn, x3, hn, x2, b, x3, cfg=_pb_cfg(T, n, C, H32=False)),
            *pb.bwd_launches(x3, hnn, x3, hn, x2, b, hnn, x3, hn, x2, b, cfg=_pb_cfg(T, n, C, one=False)),
            pb.bwd_launches(x3, hnn, x3, hn, x2, b, hnn, x3, hn, x2, b,
                            cfg=_pb_cfg(T, n, C, one=False, ROWS=False, H32=False))[0]],
        # the padded-tile Sinkhorn backward (an option; mhc_pre's mix kernel uses its tile code)
        "mhc_sinkhorn.variants": [sk.bwd_launch(lg, lg, lg, 20, 1e-6,
                                                cfg=sk.SinkhornCfg.heuristic(T, n, 20, entries=False))],
        "mhc_pre.fwd": pre.fwd_launches(x3, w, pb_, x2, hp, hr, p, r, *pre_args),
        "mhc_pre.bwd": pre.bwd_launches(x2, hp, hr, x3, w, pb_, p, r, x3, w, pb_, *pre_args),
        # the one-kernel bwd mixes: with the entries Sinkhorn backward (what n > 4 uses) and with the padded tile
        "mhc_pre.variants": [pre.bwd_launches(x2, hp, hr, x3, w, pb_, p, r, x3, w, pb_, *pre_args,
                                              cfg=pre.PreCfg.heuristic(T, n, C, 20, mix_entries=e))[1]
                             for e in (True, False)],
    }
    return out
