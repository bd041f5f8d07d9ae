"""mhc_post_pre's ``cute`` backend: a CuTe DSL forward pass (tilekernels/mhc/cute_post_pre_fwd.py) and cuTile's
epilogue and aggregate; mhc_pre's cuTile backward head, then the CuTe DSL one-pass backward
(tilekernels/mhc/cute_post_pre_bwd.py), which keeps the fp32 d_total in registers.

fwd (RESIDENT, off: cute_post_pre_res's one pass that keeps a row tile's out in its cluster's shared memory and
  writes layer_in itself, then the epilogue; correct, measured slower: its module docstring).
fwd (FUSE_FWD, default on): cute_post_pre_fwd's pass writes out and mhc_pre's projection partials in one read of
  the streams, then the epilogue (cute_pp_mix's CuTe DSL kernel, CUTE_MIX; else cuTile's mhc_pp_mix) and cuTile's
  aggregate (3s + 2x bytes instead of 4s + 2x). Off: the
  composition, h_post_bda's CuTe DSL forward (cute_post_bda), then mhc_pre's cuTile forward on its out. H200,
  T=32768, n=4, C=7168 (benchmarks/results/nvidia-h200-mhc-cutile.md): fwd 1.69-1.74 ms (session 22, the passes split
  over SPLIT CTAs a row tile) against the composition's 1.98-2.07.
bwd, in order (every scratch written before it is read; reductions in a fixed order, deterministic):
  mhc_pre's head (cutile_pre.bwd_launches without its dx pass): the dh_pre pass over out and dlayer_in and
      the bwd mix (dproj, dr, h_pre^T; for n <= 4 its Sinkhorn kernel runs before the pass, its rest after: here
      cute_sk_bwd's and cute_pre_rest's CuTe DSL kernels, CUTE_SK and CUTE_REST), the hbias reduction;
  h_res / h_post staged to fp32 when bf16 (cutile_post_bda._h32);
  cute_post_pre_bwd's pass: dresidual, dx, dh_res and dh_post (the two warpgroups' sums added in the kernel; with
      SPLIT CTAs a row tile one plane each, summed after it), dbias partials per row tile;
  the dbias partials' reduction; mhc_pre's dweight from the saved out (cute_proj_rms.dweight_into:
      its backward kernel without dx, then its fixed-order reduction).
  SPLIT_DW (the default where it applies): no dweight pass. The dh_pre pass is cute_post_pre_dhdw's pass over
      64-channel slices of out and dlayer_in (dh_pre partials, summed after it, and dweight's post / res rows from
      dproj0, the mix's rest run before it with dh_pre read as 0); the backward pass (DWPRE) adds dweight's pre rows
      from the out it recomputes (partials a row tile); their sums and the slices pass's planes reduce into dweight.
  FUSE_DHW (off by default, measured slower): the dh_pre pass and the dweight pass replaced by one pass over out
      (cute_post_pre_dhw), the mix's rest run before it with dh_pre read as 0 (dproj's post / res columns) and again
      after it.
Ideal traffic (T=32768, n=4, C=7168, bf16; s = one [T, n, C] stream = 1.879 GB, x = [T, C] = 0.470):
  dh_pre pass s + x, this pass 3s + 3x, dweight pass s: 5s + 4x = 11.3 GB (the separate ops: 18.8); SPLIT_DW
  4s + 4x = 9.4 GB plus its fp32 partials (dh_pre's 59 MB, the pre rows' 235 MB, each written and read once).

Backend limits (the spec's entry): both toolchains (cuTile for the aggregate, the dh_pre pass where SPLIT_DW is off
and the small reductions; CuTe DSL for the passes, the forward epilogue and the mix's kernels), sm_90a, n <= 4,
C % 8 == 0, bf16 residual / x / bias / weight, dweight's partials indexable in int32, and the cuTile backend's own
limits.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from tilekernels._cutile import Launch, cdiv
from tilekernels._glue import aligned16, kernel, sm_count

from . import cute_post_bda as cpb
from . import cute_post_pre_dhdw as DD
from . import cute_post_pre_dhw as D
from . import cute_post_pre_fwd as F
from . import cute_post_pre_bwd as K
from . import cute_pp_mix as CM
from . import cute_post_pre_res as RS
from . import cute_pre_rest as CR
from . import cute_sk_bwd as CS
from . import cute_proj_rms as cpr
from . import cutile_aggregate as agg
from . import cutile_post_bda as pb
from . import cutile_post_pre as pp
from . import cutile_post_pre_bwd as ppb
from . import cutile_pre as pre


def bwd_launches(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias, bias,
                 out, proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, alpha_pre, alpha_post,
                 alpha_res, iters, rms_eps, sinkhorn_eps, cfg: pp.PostPreCfg | None = None,
                 kcfg: K.PostPreBwdCuteCfg | None = None) -> list:
    """The backward's steps (cuTile Launch records and the CuTe DSL pass as a callable), run in order by
    cutile_post_pre.run."""
    T, n, C = residual.shape
    N = weight.shape[0]
    cfg = pp._cfg(residual, iters, cfg)
    has_bias = bias is not None
    kcfg = kcfg or K.PostPreBwdCuteCfg.heuristic(n, C, N, has_bias)
    if kcfg.CUT:
        raise ValueError(f"mhc_post_pre cute bwd: CUT {kcfg.CUT} is a probe's config (wrong results by design)")
    head = pre.bwd_launches(dlayer_in, dh_post_next, dh_res_next, out, weight, hbias, proj, r, None, dweight, dhbias,
                            alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps, cfg=cfg.pre)
    mix = next(ln for ln in head if ln.kernel in pre.MIX_KERNELS)
    dproj, dr, hpre_t = mix.args[6:9]
    dhw = _dhw_head(head, mix, out, dlayer_in, proj, r, hbias, dproj, dweight, alpha_pre, cfg.pre.pr.NPAD)
    sdw = None if dhw is not None else _split_dw(head, mix, out, dlayer_in, dweight, cfg.pre.pr.NPAD, kcfg)
    if dhw is not None:
        head = dhw
    elif sdw is not None:
        head, kcfg, p_pre, finish = sdw
    elif mix.kernel is pre.mhc_pre_bwd_rest:
        head = cute_mix_head(head, mix)
    if sdw is None and kcfg.DWPRE:
        raise ValueError("mhc_post_pre cute bwd: a DWPRE config needs the SPLIT_DW backward (its pre-row partials)")
    stage, h_res, h_post = pb._h32(h_res, h_post, cfg.pb, force=True)
    dev, f32 = residual.device, torch.float32
    ntm = cdiv(T, K.BM)
    p_bias = torch.empty((ntm, C) if has_bias else (1, 1), dtype=f32, device=dev)
    # the pass stores dh itself, fp32 contiguous (else into a scratch copied into dh after it); with SPLIT CTAs a
    # row tile, one plane each, summed by _planes_into after it (one cuTile launch of mhc_pb_dh_reduce instead of its
    # two torch.sum measured the same, 10-11 us at T=32768, n=4: the mHC ledger, session 23)
    sp = kcfg.SPLIT
    p_dhr, p_dhp = (t if sp == 1 and t.dtype == f32 and t.is_contiguous()
                    else torch.empty((sp, *t.shape) if sp > 1 else t.shape, dtype=f32, device=dev)
                    for t in (dh_res, dh_post))
    dres = dresidual if dresidual.data_ptr() % 16 == 0 else torch.empty_like(dresidual)
    dxx = dx if dx.data_ptr() % 16 == 0 else torch.empty_like(dx)
    srcs = [aligned16(t) for t in (dout, residual, x, dlayer_in)]
    b = aligned16(bias) if has_bias else srcs[2]
    wp = K.permuted_weight(weight, kcfg)
    steps = [*head, *stage]
    if T > 0:
        steps.append(functools.partial(K.launch(kcfg).run, *srcs, b, wp, dproj, dr, r, h_res, h_post, hpre_t, dres,
                                       dxx, p_bias, p_dhr, p_dhp, p_pre if sdw is not None else p_bias, T,
                                       float(rms_eps)))
        if dres is not dresidual:
            steps.append(functools.partial(dresidual.copy_, dres))
        if dxx is not dx:
            steps.append(functools.partial(dx.copy_, dxx))
        steps += [functools.partial(_planes_into, p, o) for o, p in ((dh_res, p_dhr), (dh_post, p_dhp)) if p is not o]
        if has_bias:
            steps.append(ppb.dbias_launch(p_bias, dbias, cfg))
    else:
        steps += [dh_res.zero_, dh_post.zero_] + ([dbias.zero_] if has_bias else [])
    if sdw is not None:
        steps += finish
    elif dhw is None:
        steps.append(functools.partial(cpr.dweight_into, dproj, out.view(T, n * C), dweight))
    return steps


# mhc_pre's dweight split between two reads of out that happen anyway (cute_post_pre_dhdw; the default where it
# applies): the dh_pre pass becomes a pass over 64-channel slices that also forms dweight's post / res rows (their
# dproj columns need no dh_pre), and the backward pass adds the pre rows from the out it recomputes (DWPRE); the
# separate dweight pass (a third read of out) is gone. False: the dh_pre pass and the dweight pass. H200, T=32768,
# n=4, C=7168: fwd+bwd 4.44-4.51 ms against 4.61-4.62 (the slices pass ~610 us and the partials' sums ~80 against the
# two passes' 529 + 443; the backward pass +70; the mHC ledger, session 25).
SPLIT_DW = True


def _split_dw(head, mix, out, dlayer_in, dweight, npad, kcfg):
    """(head, kcfg, p_pre, finish) of the SPLIT_DW backward, or None where it does not apply (SPLIT_DW off, T = 0,
    the mix not split, kcfg with CW 16 or no stage count that fits DWPRE, int32 offsets). head, in order: the Sinkhorn
    backward; the mix's rest with dh_pre read as 0 into dproj0 [T, NPAD] (dproj's post / res columns); the slices pass
    (dh_pre partials [S, T, n], dweight partials [GM + 1, N, n C] planes 0 .. GM-1 with zero pre rows); dh_pre = the
    partials' sum (torch.sum over dim 0: deterministic); the mix's rest again with dh_pre; the hbias reduction. The
    backward pass then writes the pre-row partials p_pre [row tiles, n, n C]; finish sums them (torch.sum) into plane
    GM's pre rows (its other rows 0) and reduces the GM + 1 planes in order into dweight (bf16). Scratch (fp32), all
    live from the step list's building to its end: p_dh 4 S T n bytes, p_dw 4 (GM + 1) N n C, p_pre 4 cdiv(T, 64)
    n n C, dproj0 and the zero dh_pre 4 T (NPAD + n): ~320 MB at T=32768, n=4, C=7168 (59 + 22 + 235 + 5; the
    dweight pass's partials it replaces: ~19 MB)."""
    T, n, C = out.shape
    N = dweight.shape[0]
    if not SPLIT_DW or T == 0 or mix.kernel is not pre.mhc_pre_bwd_rest or out.device.type != "cuda":
        return None
    kq = K.with_dwpre(kcfg)
    if kq is None:
        return None
    dcfg = DD.PostPreDhdwCuteCfg.heuristic(n, C, N, npad)
    gm = DD.row_groups(T)
    ntm = cdiv(T, K.BM)
    if max(ntm * n * n * C, dcfg.S * T * n, (gm + 1) * N * n * C) >= 2 ** 31:
        return None
    dev, f32 = out.device, torch.float32
    p_dh = torch.empty((dcfg.S, T, n), dtype=f32, device=dev)
    p_dw = torch.empty((gm + 1, N, n * C), dtype=f32, device=dev)
    p_pre = torch.empty((ntm, n, n * C), dtype=f32, device=dev)
    dproj0 = torch.empty((T, npad), dtype=f32, device=dev)
    zero = None if CUTE_REST else torch.zeros((T, n), dtype=f32, device=dev)
    sk, rest0, rest, dpre, tail = _mix_around(head, mix, zero, dproj0)
    run = functools.partial(DD.launch(dcfg).run, aligned16(out), aligned16(dlayer_in), dproj0, p_dh, p_dw, T, gm)
    steps = [*sk, rest0, run, functools.partial(torch.sum, p_dh, 0, out=dpre), rest, *tail]
    dw = cpr.row_major(dweight)
    rcfg = cpr.ProjRmsBwdCuteCfg.heuristic(N, n * C)
    finish = [functools.partial(torch.sum, p_pre, 0, out=p_dw[gm, :n]), p_dw[gm, n:].zero_,
              functools.partial(cpr.reduce_launch(rcfg).run, p_dw, dw, gm + 1)]
    if dw is not dweight:
        finish.append(functools.partial(dweight.copy_, dw))
    return steps, kq, p_pre, finish


# mhc_pre's dh_pre and dweight in one pass over out from DRAM (cute_post_pre_dhw, its CTAs in step through a
# device-wide exchange) where it applies; False (the default): the dh_pre pass (cutile_aggregate) and the dweight
# pass (cute_proj_rms.dweight_into), each a read of out. Measured slower (H200, T=32768, n=4, C=7168: the pass
# 4.0 ms at its default config, 3.1-8.3 across those tried, against 534 + 447 us; the mHC ledger, session 24): an
# option, correct and tested, not the default.
FUSE_DHW = False


def _dhw_head(head, mix, out, dlayer_in, proj, r, hbias, dproj, dweight, alpha_pre, npad):
    """mhc_pre's backward head with cute_post_pre_dhw's pass in place of the dh_pre pass and the dweight pass, or None
    where it does not apply (FUSE_DHW off, T = 0, the mix not split, more 64-channel slices than SMs: its CTAs must
    all be resident). In order: the Sinkhorn backward; the rest of the mix with dh_pre read as 0 into dproj0 [T, NPAD]
    (dproj's post and res columns, which the pass's dweight products read); the pass (dh_pre, dweight); the mix's
    rest again with dh_pre (dproj, dr, h_pre^T and the hbias partials the later steps read); the hbias reduction."""
    T, n, C = out.shape
    N = dproj.shape[1]
    if not FUSE_DHW or T == 0 or mix.kernel is not pre.mhc_pre_bwd_rest or out.device.type != "cuda":
        return None
    dcfg = D.PostPreDhwCuteCfg.heuristic(n, C, N, npad)
    if dcfg.S > sm_count(out.device):
        return None
    dev = out.device
    wp, wd = D.scratch_words(dcfg, T)
    scr = torch.zeros(wp + wd + -(-T * n // 2), dtype=torch.int64, device=dev)   # tags 0: nothing written yet
    zero = scr[wp + wd:].view(torch.float32)[:T * n].view(T, n)                     # dh_pre = 0 for the first mix
    dproj0 = torch.empty((T, npad), dtype=torch.float32, device=dev)
    dw = cpr.row_major(dweight)
    sk, rest0, rest, dpre, tail = _mix_around(head, mix, zero, dproj0)
    run = functools.partial(D.launch(dcfg).run, aligned16(out), aligned16(dlayer_in), dproj0, proj, r, hbias,
                            dpre, scr[:wp], scr[wp:wp + wd], dw, T, float(alpha_pre))
    steps = [*sk, rest0, run, rest, *tail]
    if dw is not dweight:
        steps.append(functools.partial(dweight.copy_, dw))
    return steps


# mhc_pre's elementwise rest of the split mix (both runs of it in the SPLIT_DW / FUSE_DHW backwards, the one run
# otherwise) as the CuTe DSL kernel (cute_pre_rest, a thread a token); False: cuTile's mhc_pre_bwd_rest (the kernel
# mhc_pre's cutile backward runs). The switch applies to mhc_pre's cute backend too (cute_pre builds on these steps).
CUTE_REST = True


def _rest_step(rest, args=None, dproj_only: bool = False):
    """A step running the mix's rest (the Launch record ``rest``, with ``args`` in place of its own): cute_pre_rest's
    kernel (CUTE_REST) or the record itself. ``dproj_only``: dh_pre taken as 0, dproj alone written (cuTile: dh_pre
    read from args[0], every output written)."""
    args = rest.args if args is None else args
    if CUTE_REST:
        return functools.partial(CR.run_rest, *args, dproj_only=dproj_only)
    return dataclasses.replace(rest, args=args)


# mhc_pre's Sinkhorn backward of the split mix (cutile_pre.mhc_pre_bwd_sk) as the CuTe DSL kernel (cute_sk_bwd, a
# thread a token, the step sums in shared memory); False: the cuTile kernel (mhc_pre's cutile backward runs it). Also
# mhc_pre's cute backend's (cute_pre).
CUTE_SK = True
_SK_N_NP_ITERS = (10, 11, 14)   # n, NP and ITERS among mhc_pre_bwd_sk's launch args (cute_sk_bwd.run_sk's order)


def _sk_step(step):
    """``step`` of mhc_pre's backward head, with its Sinkhorn backward (mhc_pre_bwd_sk) as cute_sk_bwd's kernel when
    CUTE_SK is on and that kernel's config fits (CS.serves: not for many iters, whose step sums outgrow its shared
    memory; the cuTile kernel runs those)."""
    if (CUTE_SK and isinstance(step, Launch) and step.kernel is pre.mhc_pre_bwd_sk
            and CS.serves(*(step.args[i] for i in _SK_N_NP_ITERS))):
        return functools.partial(CS.run_sk, *step.args)
    return step


def cute_mix_head(head: list, mix) -> list:
    """mhc_pre's split-mix backward head (cutile_pre.bwd_launches' steps; ``mix``, its mhc_pre_bwd_rest record) with
    the Sinkhorn backward and the rest as the CuTe DSL steps (_sk_step, _rest_step: as CUTE_SK / CUTE_REST say).
    mhc_post_pre's backward where SPLIT_DW and FUSE_DHW do not apply, and mhc_pre's cute backend (cute_pre)."""
    return [_rest_step(ln) if ln is mix else _sk_step(ln) for ln in head]


def _mix_around(head, mix, zero, dproj0):
    """(Sinkhorn steps, rest0, rest, dpre, tail) of mhc_pre's split-mix backward head around a pass that replaces its
    dh_pre pass (head[index(mix) - 1]): rest0 is the mix's rest with dh_pre read as 0 (cuTile: from ``zero`` [T, n];
    the CuTe DSL kernel reads none) writing dproj into ``dproj0`` [T, NPAD] (its post / res columns need no dh_pre);
    rest (the mix's rest as built, dh_pre from ``dpre``, the [T, n] fp32 the pass's dh_pre goes to) and tail (the
    hbias reduction) run after the pass."""
    i = head.index(mix)
    rest = head[i]
    a = rest.args
    return ([_sk_step(x) for x in head[:i - 1]], _rest_step(rest, (zero, *a[1:6], dproj0, *a[7:]), dproj_only=True),
            _rest_step(rest), a[0], head[i + 1:])


def _planes_into(p: torch.Tensor, out: torch.Tensor) -> None:
    """out = p when p is out's shape, else the sum of p's planes (dim 0; torch's reduction: no atomics, the same
    order every run)."""
    if p.dim() == out.dim():
        out.copy_(p)
    elif out.dtype == p.dtype and out.is_contiguous():
        torch.sum(p, 0, out=out)
    else:
        out.copy_(p.sum(0))


# The fused forward (cute_post_pre_fwd: out and mhc_pre's projection in one read of the streams, then the epilogue,
# CUTE_MIX, and cuTile's aggregate); False: the composition (cute_post_bda's forward, then mhc_pre's).
FUSE_FWD = True
# The fused forward's epilogue (the planes summed, then mhc_pre's r, h and Sinkhorn) as the CuTe DSL kernel
# (cute_pp_mix, a thread a token) for fp32 h_post_next / h_res_next; False: cuTile's mhc_pp_mix.
CUTE_MIX = True


# The resident forward (cute_post_pre_res: a cluster keeps a 16-token row tile's out in shared memory, exchanges the
# row's sums and writes layer_in itself, so the aggregate's read of out goes away; then cute_pp_mix for proj, r,
# h_post and h_res) where its config fits (cute_post_pre_res.PostPreResCuteCfg.heuristic) and the mix's outputs are
# fp32; False: the fused pass, the epilogue and the aggregate.
RESIDENT = False


def _resident_cfg(residual, weight, bias, h_post_next, h_res_next) -> "RS.PostPreResCuteCfg | None":
    """The resident pass's config where RESIDENT is on and it applies (its heuristic fits the shape, the epilogue's
    outputs are fp32, the planes indexable in int32), else None."""
    T, n, C = residual.shape
    f32 = torch.float32
    rcfg = RS.PostPreResCuteCfg.heuristic(n, C, weight.shape[0], bias is not None) if RESIDENT else None
    if (rcfg is None or T == 0 or h_post_next.dtype != f32 or h_res_next.dtype != f32
            or rcfg.CL * T * rcfg.NPAD >= 2 ** 31):
        return None
    if rcfg.CUT:
        raise ValueError(f"mhc_post_pre cute resident fwd: CUT {rcfg.CUT} is a probe's config (wrong results)")
    return rcfg


def fused_fwd_launches(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next, h_res_next, proj,
                       r, alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps) -> list:
    """The fused forward's steps (T > 0): h staged to fp32 when bf16; a CuTe DSL pass writing out and the projection
    and squares partials, one plane a CTA of a row tile (cute_post_pre_fwd's, or with RESIDENT cute_post_pre_res's,
    which writes layer_in too); the epilogue (cute_pp_mix or cuTile's mhc_pp_mix: the planes summed in order, then
    mhc_pre's r, h and Sinkhorn); cuTile's aggregate (not after the resident pass)."""
    T, n, C = residual.shape
    N = weight.shape[0]
    cfg = pp._cfg(residual, iters, None)
    p = cfg.pre
    dev, f32 = residual.device, torch.float32
    rcfg = _resident_cfg(residual, weight, bias, h_post_next, h_res_next)
    stage, h_res, h_post = pb._h32(h_res, h_post, cfg.pb, force=True)
    fcfg = None if rcfg else F.PostPreFwdCuteCfg.heuristic(n, C, N, p.pr.NPAD, bias is not None)
    planes, npad = (rcfg.CL, rcfg.NPAD) if rcfg else (fcfg.SPLIT, p.pr.NPAD)
    p_proj = torch.empty((planes, T, npad), dtype=f32, device=dev)   # one plane a CTA of a row tile
    p_ss = torch.empty((planes, T), dtype=f32, device=dev)
    h_pre = torch.empty((T, n), dtype=f32, device=dev)   # (the resident pass forms its own: the same values)
    dst = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
    xs = aligned16(x)
    srcs = (aligned16(residual), xs, aligned16(bias) if bias is not None else xs, aligned16(weight))
    if rcfg:
        li = layer_in if layer_in.data_ptr() % 16 == 0 and layer_in.is_contiguous() else torch.empty_like(layer_in)
        run = functools.partial(RS.launch(rcfg).run, *srcs, h_res.contiguous(), h_post.contiguous(), hbias.contiguous(),
                                dst, li, p_proj, p_ss, T, RS.ctas(rcfg, T, dev), float(rms_eps), float(alpha_pre))
    else:
        li = layer_in
        run = functools.partial(F.launch(fcfg).run, *srcs, h_res, h_post, dst, p_proj, p_ss, T)
    steps = [*stage, run] + [functools.partial(t.copy_, s) for t, s in ((out, dst), (layer_in, li)) if s is not t]
    scal = (float(rms_eps), float(alpha_pre), float(alpha_post), float(alpha_res), float(sinkhorn_eps))
    if rcfg or (CUTE_MIX and h_post_next.dtype == f32 and h_res_next.dtype == f32):
        steps.append(functools.partial(CM.run_mix, p_proj, p_ss, hbias, proj, r, h_pre, h_post_next, h_res_next,
                                       float(n * C), *scal, p.ITERS, bool(p.APPROX)))
    else:
        steps.append(Launch(pp.mhc_pp_mix, (cdiv(T, cfg.TE),),
                            (p_proj, p_ss, hbias, proj, r, h_pre, h_post_next, h_res_next, float(n * C), *scal, n,
                             p.NP, p.pr.NPAD, cfg.TE, fcfg.SPLIT, p.ITERS, p.APPROX, False), cfg))
    return steps if rcfg else steps + [agg.fwd_launch(out, h_pre, layer_in, p.agg)]


@kernel("mhc_post_pre", "cute", "fwd")
def post_pre_fwd(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next, h_res_next, proj, r,
                 alpha_pre: float, alpha_post: float, alpha_res: float, iters: int, rms_eps: float,
                 sinkhorn_eps: float):
    if FUSE_FWD and residual.shape[0] > 0:
        pp.run(fused_fwd_launches(h_res, residual, h_post, x, weight, hbias, bias, out, layer_in, h_post_next,
                                  h_res_next, proj, r, alpha_pre, alpha_post, alpha_res, iters, rms_eps, sinkhorn_eps))
        return
    cpb.fwd_into(h_res, residual, h_post, x, bias, out)
    cfg = pp._cfg(residual, iters, None)
    pp.run(pre.fwd_launches(out, weight, hbias, layer_in, h_post_next, h_res_next, proj, r, alpha_pre, alpha_post,
                            alpha_res, iters, rms_eps, sinkhorn_eps, cfg=cfg.pre))


@kernel("mhc_post_pre", "cute", "bwd")
def post_pre_bwd(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias, bias, out,
                 proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, alpha_pre: float,
                 alpha_post: float, alpha_res: float, iters: int, rms_eps: float, sinkhorn_eps: float):
    pp.run(bwd_launches(dout, dlayer_in, dh_post_next, dh_res_next, h_res, residual, h_post, x, weight, hbias, bias,
                        out, proj, r, dh_res, dresidual, dh_post, dx, dweight, dhbias, dbias, alpha_pre, alpha_post,
                        alpha_res, iters, rms_eps, sinkhorn_eps))
