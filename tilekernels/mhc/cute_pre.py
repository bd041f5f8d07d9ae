"""mhc_pre's ``cute`` backend: cuTile's forward, and a backward whose mix and dx pass are CuTe DSL kernels.

x [T, n, C] bf16, weight [N = n*n + 2n, n*C] bf16, bias [N] fp32, contiguous; n <= 4, C % 8 == 0, sm_90a.

fwd: cutile_pre.fwd_launches as they are (proj_rms's row-tile loop with the mix, both sigmoids and the Sinkhorn
  in the same block, then the aggregate).
bwd, in order (each scratch written before it is read; fixed-order sums, deterministic):
  cute_sk_bwd      the split mix's Sinkhorn backward (a thread a token, the step sums in shared memory) -> the res
                   logits' gradient;
  mhc_agg_bwd      (cuTile) dh_pre = sum_c dlayer_in * x, fp32 [T, n];
  cute_pre_rest    the mix's elementwise rest: dproj [T, N], dr [T], h_pre^T [n, T], the hbias partials;
  cute_proj_rms    (AGG_C) dx = dproj @ weight + coef * x + h_pre * dlayer_in and dweight's partials, one read of
                   x and of dlayer_in (n = 2, 4: AGG_IL, a CTA over every stream's pieces of a channel slice, so
                   dlayer_in's tile serves all n streams from shared memory; n = 1, 3: each stream's slice reads it,
                   mostly from L2), then their fixed-order reduction;
  mhc_pre_dbias    (cuTile) dbias from its partials.
The cuTile backend runs the same head with cuTile's mix kernels and cutile_proj_rms's dx pass (which the CuTe DSL
one replaces: it streams x through a TMA ring and does dx's and dweight's products on wgmma). Measured times: the
mHC ledger (benchmarks/results/nvidia-h200-mhc-cutile.md).

Backend limits (the spec's entry): both toolchains (cuTile for the forward, the dh_pre pass and the dbias
reduction), sm_90a, bf16 x / weight, fp32 bias, n <= 4 (N <= 32: the dx pass's projection columns), C % 8 == 0,
dweight's partials indexable in int32, and the cuTile backend's own limits.
"""
from __future__ import annotations

import functools

from tilekernels._glue import kernel

from . import cute_post_pre as CP
from . import cute_proj_rms as cpr
from . import cutile_post_pre as pp
from . import cutile_pre as pre


def bwd_steps(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias, alpha_pre, alpha_post,
              alpha_res, iters, rms_eps, sinkhorn_eps) -> list:
    """The backward's steps (cuTile Launch records and CuTe DSL calls), run in order by cutile_post_pre.run:
    cutile_pre.bwd_launches' head without its dx pass, its split mix's kernels as CuTe DSL steps
    (cute_post_pre.cute_mix_head: CUTE_SK, CUTE_REST), then cute_proj_rms.bwd_agg_into before the dbias reduction."""
    head = pre.bwd_launches(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, None, dweight, dbias,
                            alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps)
    mix = next(ln for ln in head if ln.kernel in pre.MIX_KERNELS)
    if mix.kernel is not pre.mhc_pre_bwd_rest:
        raise ValueError(f"mhc_pre cute bwd: n = {x.shape[1]} takes the one-kernel mix (the split mix is n <= 4)")
    dproj, dr, hpre_t = mix.args[6:9]
    steps = CP.cute_mix_head(head, mix)
    dxw = functools.partial(cpr.bwd_agg_into, dproj, dr, x, weight, r, dlayer_in, hpre_t, dx, dweight, float(rms_eps))
    return [*steps[:-1], dxw, steps[-1]]   # the last step: the dbias reduction


@kernel("mhc_pre", "cute", "fwd")
def pre_fwd(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre: float, alpha_post: float,
            alpha_res: float, iters: int, rms_eps: float, sinkhorn_eps: float):
    pp.run(pre.fwd_launches(x, weight, bias, layer_in, h_post, h_res, proj, r, alpha_pre, alpha_post, alpha_res,
                            iters, rms_eps, sinkhorn_eps))


@kernel("mhc_pre", "cute", "bwd")
def pre_bwd(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias, alpha_pre: float,
            alpha_post: float, alpha_res: float, iters: int, rms_eps: float, sinkhorn_eps: float):
    pp.run(bwd_steps(dlayer_in, dh_post, dh_res, x, weight, bias, proj, r, dx, dweight, dbias, alpha_pre,
                     alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps))
