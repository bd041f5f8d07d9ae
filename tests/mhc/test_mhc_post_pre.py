"""mhc_post_pre, the mHC layer boundary: h_post_bda, then the next layer's mhc_pre on its output.

The oracle is the float64 reference on upcast inputs, with one definition point made
explicit: mhc_pre reads ``out`` as the op returns it (rounded to residual's dtype), so the
pre step's float64 oracle runs on the op's own ``out`` upcast, and float64 autograd passes
through that rounding unchanged (straight-through: the rounding's value, the identity's
gradient), which is the op's backward. The gradient entering h_post_bda's backward is
dout + mhc_pre's d(out), summed unrounded (fp32).

Tolerances (tilekernels.testing, by the dtype of the checked output):
  bf16 outputs and gradients (out, layer_in, dresidual, dx, dweight, dbias, bf16 dh_*) 1e-2:
    one bf16 rounding of a result of fp32 arithmetic on exactly representable inputs;
  fp32 outputs and gradients (h_post_next, h_res_next, dhbias, fp32 dh_res / dh_post) 1e-5:
    fp32 arithmetic from the same (rounded) out as the oracle; the fp32 d_total keeps
    h_post_bda's fp32 sums over C free of a bf16 rounding (sqrt(C) * 2^-24 reassociation);
    fp32 dh_res / dh_post are judged on max(||dh||, ||the L2 size of their C terms||)
    (``dh_term_scales``), so a single token whose terms cancel is held to what fp32 gives.
  The separate-ops comparison (GPU) uses the bf16 tolerance for every output: there autograd
  sums the two d(out) contributions in bf16, one 2^-9 rounding the fused op does not make.

CPU (CI): spec refusals, the torch backend against the oracle, gradients against float64
autograd, gradcheck at tiny shapes, every new cuTile kernel compiled for sm_90 and sm_100.
GPU (marked ``gpu``, skipped without CUDA): the cuTile backend at n in 1..8, odd T and C,
fp32 and bf16 h, bias or None, the fused, default, split and composed designs, against the
oracle and against h_post_bda + mhc_pre through the registry; deterministic backward.
"""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import registry
from mhc_helpers import BF16, F32, F64, grads_vs_float64, rand
from tilekernels.mhc import reference as ref
from tilekernels.testing import assert_close, rel_err, upcast

OP = registry.get("mhc_post_pre")
IN_NAMES = ["h_res", "residual", "h_post", "x", "weight", "hbias", "bias"]
PARAMS = dict(alpha_pre=0.7, alpha_post=1.3, alpha_res=0.4, iters=20)


def inputs(T, n, C, h=F32, d=BF16, bias=True, device="cpu"):
    """Random inputs in spec order; h_res row-stochastic-ish, weight scaled by 1/sqrt(n*C)."""
    N = n * n + 2 * n
    hb = F64 if d == F64 else F32
    ts = [torch.softmax(rand(T, n, n), -1).to(h), rand(T, n, C, dtype=d), rand(T, n, dtype=h).sigmoid() * 2,
          rand(T, C, dtype=d), rand(N, n * C, dtype=d, scale=(n * C) ** -0.5), rand(N, dtype=hb),
          rand(C, dtype=d) if bias else None]
    return [None if t is None else t.to(device) for t in ts]


def oracle(args, out, **params):
    """float64 expectations: out from h_post_bda on upcasts; the pre step on the op's out."""
    up = [upcast(t) for t in args]
    h_res, residual, h_post, x, weight, hbias, bias = up
    return (ref.h_post_bda(h_res, residual, h_post, x, bias),
            *ref.mhc_pre(upcast(out), weight, hbias, **params))


def straight_through64(seen_out):
    """float64 composition whose out enters the pre step as ``seen_out()`` (value: the op's
    own rounded out, as in the forward oracle) with the identity's gradient: the op's
    definition, differentiable by float64 autograd. Re-rounding the float64 out instead
    would make the oracle disagree with the op wherever the op's fp32 out and the float64
    out straddle a bf16 rounding boundary (about one draw in 1000 at T=2, n=8, C=9: a 2^-8
    step in one element of the pre step's input, seen as ~1e-4 in the fp32 gradients)."""
    def f(h_res, residual, h_post, x, weight, hbias, bias, **params):
        out = ref.h_post_bda(h_res, residual, h_post, x, bias)
        seen = out + (upcast(seen_out()) - out).detach()
        return (out, *ref.mhc_pre(seen, weight, hbias, **params))
    return f


def grads_vs_straight_through(args, params=PARAMS):
    """grads_vs_float64 for the op, its oracle's pre step reading the op's own out."""
    got = {}

    def op(*a, **p):
        outs = OP(*a, **p)
        got["out"] = outs[0].detach()
        return outs
    return grads_vs_float64(op, straight_through64(lambda: got["out"]), args, IN_NAMES, **params)


def check_forward(outs, args, **params):
    for name, got, want in zip(("out", "layer_in", "h_post_next", "h_res_next"), outs, oracle(args, outs[0], **params)):
        assert_close(got, want, what=name)


# ------------------------------------------------------------------ CPU: spec refusals


def _refused(args, match, **params):
    with pytest.raises(registry.SpecError, match=match) as e:
        OP(*args, **{**PARAMS, **params})
    assert "mhc_post_pre" in str(e.value)


def test_refuses_mismatched_bias_dtype():
    args = inputs(3, 2, 8)
    args[6] = args[6].to(F64)
    _refused(args, "bias")


def test_refuses_float64_residual_with_low_precision_h():
    args = inputs(3, 2, 8, d=F64)
    _refused(args, "float64 residual")


def test_refuses_float64_hbias_with_bf16_streams():
    args = inputs(3, 2, 8)
    args[5] = args[5].to(F64)
    _refused(args, "hbias")


def test_refuses_float64_h_res_with_bf16_streams():
    args = inputs(3, 2, 8)
    args[0] = args[0].to(F64)
    _refused(args, "h_res")


@pytest.mark.parametrize("eps", ["rms_eps", "sinkhorn_eps"])
def test_refuses_zero_eps(eps):
    _refused(inputs(3, 2, 8), eps, **{eps: 0.0})


@pytest.mark.parametrize("which,shape,what", [(4, (8, 15), "weight"), (5, (7,), "hbias"), (1, (3, 2, 9), "x"), (3, (4, 8), "x")])
def test_refuses_bad_shapes(which, shape, what):
    args = inputs(3, 2, 8)
    args[which] = torch.zeros(shape, dtype=args[which].dtype)
    _refused(args, what)


def test_refuses_weight_in_another_dtype():
    args = inputs(3, 2, 8)
    args[4] = args[4].float()
    _refused(args, "weight")


# ------------------------------------------------------------------ CPU: torch backend


@pytest.mark.parametrize("T,n,C", [(1, 1, 1), (5, 2, 33), (3, 4, 64), (4, 8, 17), (7, 3, 5), (0, 4, 8)])
@pytest.mark.parametrize("h,bias", [(F32, True), (BF16, False), (BF16, True)])
def test_torch_forward_matches_float64(T, n, C, h, bias):
    args = inputs(T, n, C, h=h, bias=bias)
    outs = OP(*args, **PARAMS)
    assert [o.dtype for o in outs] == [BF16, BF16, F32, F32]
    assert [tuple(o.shape) for o in outs] == [(T, n, C), (T, C), (T, n), (T, n, n)]
    check_forward(outs, args, **PARAMS)


def test_equals_the_two_ops_in_turn_forward():
    """Exactly the composition on the torch backend (same kernels, same rounding of out)."""
    args = inputs(6, 4, 40)
    outs = OP(*args, **PARAMS)
    out = registry.get("mhc_h_post_bda")(*args[:4], args[6])
    pre = registry.get("mhc_pre")(out, args[4], args[5], **PARAMS)
    for a, b in zip(outs, (out, *pre)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("d", [BF16, F64])
def test_reference_is_the_two_reference_ops_in_turn(d):
    """ref.mhc_post_pre (the float64 oracle of tests that call it, e.g. the zero-token dweight check) is
    ref.h_post_bda with the bias, then ref.mhc_pre on its rounded out; the torch backend runs the parts, so a
    reference that dropped the bias passed every other test."""
    args = inputs(6, 4, 40, h=F64 if d == F64 else F32, d=d, bias=True)
    got = ref.mhc_post_pre(*args, **PARAMS)
    out = ref.h_post_bda(*args[:4], args[6])
    assert not torch.equal(out, ref.h_post_bda(*args[:4]))    # the bias matters at this shape
    for a, b in zip(got, (out, *ref.mhc_pre(out, args[4], args[5], **PARAMS))):
        assert torch.equal(a, b)


@pytest.mark.parametrize("T,n,C", [(7, 4, 24), (3, 1, 5), (2, 8, 9), (5, 3, 16), (0, 2, 4)])
@pytest.mark.parametrize("h,bias", [(F32, True), (BF16, True), (F32, False)])
def test_torch_grads_match_float64(T, n, C, h, bias):
    args = inputs(T, n, C, h=h, bias=bias)
    grads_vs_straight_through(args)


def test_non_default_eps():
    """rms_eps and sinkhorn_eps far from the default reach the pre step, forward and backward (only the default had
    been compared; torch kernels that hard-coded 1e-6 passed every CPU test): against the oracle at those eps,
    whose pre step (ref.mhc_pre) test_mhc_pre.py pins to a hand-written composition at the same eps."""
    params = dict(PARAMS, iters=5, rms_eps=0.3, sinkhorn_eps=0.05)
    args = inputs(5, 3, 24)
    outs = OP(*args, **params)
    far = oracle(args, outs[0], **PARAMS)
    want = oracle(args, outs[0], **params)
    assert all(rel_err(f, w) > 1e-3 for f, w in zip(far[1:], want[1:]))
    check_forward(outs, args, **params)
    grads_vs_straight_through(args, params)


def test_fp32_streams_grads():
    args = inputs(6, 3, 20, h=F32, d=F32)
    grads_vs_straight_through(args)


def test_zero_token_at_tiny_rms_eps_keeps_dweight_finite():
    """A token whose new streams are all zero (its residual and x rows zero, no bias) at rms_eps = 2**-126 (the spec's
    least), the h_post_next gradient scaled by 1e3 as a loss scale does: that token's proj gradient dh * alpha * r
    (r = 1/eps ~ 8.5e37) is past fp32, and dweight got inf * 0 = NaN from it (72 NaNs here before the fix). dweight
    and dhbias now match the float64 oracle, to which the token adds 0 and its finite dh. (Its d(out) is itself past
    fp32, ~1e41, so that token's other gradients are not compared.)"""
    params = dict(PARAMS, rms_eps=2.0 ** -126)
    args = inputs(4, 3, 8, h=F32, d=F32, bias=False)
    args[1][1] = 0
    args[3][1] = 0
    leaves = [None if a is None else a.clone().requires_grad_() for a in args]
    outs = OP(*leaves, **params, backend="torch")
    cots = [rand(*o.shape, dtype=o.dtype) for o in outs]
    cots[2] = cots[2] * 1e3
    torch.autograd.backward(outs, cots)
    up = [None if a is None else upcast(a).requires_grad_() for a in args]
    torch.autograd.backward(ref.mhc_post_pre(*up, **params), [upcast(c) for c in cots])
    for i in (4, 5):
        assert_close(leaves[i].grad, up[i].grad, what=f"d{IN_NAMES[i]}")


@pytest.mark.parametrize("with_bias", [False, True])
def test_gradcheck_float64(with_bias):
    args = [None if a is None else a.requires_grad_() for a in inputs(3, 2, 5, h=F64, d=F64, bias=with_bias)]
    p = dict(PARAMS, iters=3)
    assert torch.autograd.gradcheck(lambda *a: OP(*a, **p), tuple(args))


# ------------------------------------------------------------------ CPU: cuTile compile (CI)


def _compile_jobs():
    pytest.importorskip("cuda.tile")
    from tilekernels.mhc import cutile_post_pre as pp

    jobs = {}
    for hd in (F32, BF16):
        for name, launches in pp.representative_launches(n=4, C=7168, hdtype=hd).items():
            if hd == BF16 and name.endswith(".nobias"):
                continue
            for ln in launches:
                jobs.setdefault(ln.key(), (f"{name}/{ln.kernel._pyfunc.__name__}/{str(hd)[6:]}", ln))
    return list(jobs.values())


def test_every_new_kernel_compiles_for_sm90_and_sm100():
    jobs = [(name, ln, arch) for name, ln in _compile_jobs() for arch in ("sm_90", "sm_100")]
    names = {n.split("/")[1] for n, _, _ in jobs}
    assert {"mhc_pp_fwd", "mhc_pp_fwd_part", "mhc_pp_mix", "mhc_pp_bwd_dx", "mhc_pb_bwd_one", "mhc_pp_bwd_one",
            "mhc_pp_bwd_dw", "mhc_pp_bwd_dxh", "mhc_pb_bwd_dres"} <= names
    with ThreadPoolExecutor(max_workers=4) as pool:
        cubins = list(pool.map(lambda j: j[1].export_cubin(j[2]), jobs))
    for (name, _, arch), cubin in zip(jobs, cubins):
        assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000, f"{name} for {arch}: no cubin"


def test_launch_config_ignores_the_batch():
    pytest.importorskip("cuda.tile")
    from tilekernels.mhc import cutile_post_pre as pp

    a, b = pp.PostPreCfg.heuristic(3, 4, 7168, 20), pp.PostPreCfg.heuristic(32768, 4, 7168, 20)
    assert dataclasses.replace(a, pre=b.pre) == b  # every field but mhc_pre's (its GM follows T)
    assert hash(a) == hash(pp.PostPreCfg.heuristic(3, 4, 7168, 20))
    with pytest.raises(ValueError, match="iters"):
        meta = torch.device("meta")
        x3 = torch.empty(8, 4, 64, dtype=BF16, device=meta)
        pp._cfg(x3, 3, a)


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# n 1..8 (5 and 8: the two-pass h_post_bda backward and the entries Sinkhorn backward),
# odd T (1, 3, 37, 1001) and C (1, 33, 100), C = 7168 (the headline width), bf16 / fp32 h, bias or None
GPU_CASES = [dict(T=1001, n=4, C=2560, h=F32, bias=True), dict(T=37, n=3, C=100, h=BF16, bias=True),
             dict(T=1, n=1, C=64, h=F32, bias=False), dict(T=3, n=2, C=7168, h=BF16, bias=True),
             dict(T=200, n=8, C=512, h=F32, bias=True), dict(T=129, n=5, C=33, h=BF16, bias=False),
             dict(T=64, n=6, C=1, h=F32, bias=True), dict(T=300, n=7, C=96, h=F32, bias=True),
             dict(T=0, n=4, C=64, h=F32, bias=True)]


def _id(c):
    return "-".join(f"{k}{str(v).removeprefix('torch.')}" for k, v in c.items())


def run_cutile(c, monkeypatch=None, backend="cutile", **changes):
    """fwd + bwd of the cuTile backend (or ``backend``) on fresh inputs, checked against the float64
    oracle (outputs poisoned by conftest's allocation); returns (args, outs, grads, cotangents)."""
    if changes:
        from tilekernels.mhc import cutile_post_pre as pp

        orig = pp.PostPreCfg.heuristic
        monkeypatch.setattr(pp.PostPreCfg, "heuristic",
                            classmethod(lambda cls, *a: dataclasses.replace(orig(*a), **changes)))
    args = inputs(c["T"], c["n"], c["C"], h=c["h"], bias=c["bias"], device="cuda")
    leaves = [None if t is None else t.clone().requires_grad_() for t in args]
    outs = OP(*leaves, **PARAMS, backend=backend)
    check_forward(outs, args, **PARAMS)
    cots = [rand(*o.shape, dtype=o.dtype).cuda() for o in outs]
    torch.autograd.backward(outs, cots)
    grads = [None if t is None else t.grad for t in leaves]
    # float64 gradients at the op's rounded out: the reference's backward formulas
    up = [upcast(t) for t in args]
    T, n, C = c["T"], c["n"], c["C"]
    o64 = upcast(outs[0])
    proj, r = ref.proj_rms(o64.reshape(T, n * C), up[4], 1e-6)
    prm = (PARAMS["alpha_pre"], PARAMS["alpha_post"], PARAMS["alpha_res"], PARAMS["iters"], 1e-6, 1e-6)
    c64 = [upcast(g) for g in cots]
    want = ref.mhc_post_pre_bwd(*c64, *up, o64, proj, r, *prm)
    scales = dh_term_scales(c64, up, o64, proj, r, prm)
    for name, g, w in zip(IN_NAMES, grads, want):
        if g is not None:
            assert g.dtype == args[IN_NAMES.index(name)].dtype
            assert_close(g, w, what=f"d{name}", scale=scales.get(name))
    return args, outs, grads, cots


def dh_term_scales(c64, up, o64, proj, r, prm):
    """Per element of dh_res / dh_post, the L2 norm of the C terms it sums (float64):
    dh_res[t,i,j] = sum_c d_total[t,i,c] residual[t,j,c], dh_post[t,i] = sum_c d_total[t,i,c]
    (x[t,c] + bias[c]). fp32 dh is held to 1e-5 on max(||dh||, ||scale||): d_total carries fp32
    errors from mhc_pre's backward (sinkhorn's 20 iterations), and at T = 1 a single dh_post
    whose C terms cancel (~1 seed in 200 at n = 1, C = 64) measured 1.8e-5 .. 4.3e-5 against
    its own tiny norm in every design (benchmarks/results/h200-gpu-checks-session10.txt, in git history at fccfcb8)."""
    h_res, residual, h_post, x, weight, hbias, bias = up
    d_total = c64[0] + ref.mhc_pre_bwd(*c64[1:], o64, weight, hbias, proj, r, *prm)[0]
    xb = x if bias is None else x + bias
    return {"h_res": torch.einsum("tic,tjc->tij", d_total.square(), residual.square()).sqrt(),
            "h_post": torch.einsum("tic,tc->ti", d_total.square(), xb.square()).sqrt()}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("c", GPU_CASES, ids=_id)
@pytest.mark.parametrize("design", ["fused", "default", "fused-split", "composed", "d_total-dp2", "dh-dx", "one",
                                    "one-dwin"])
def test_cutile_matches_float64(c, design, monkeypatch):
    """fused: fused forward (one block streams all of C, epilogue in the same kernel), the
    heuristic's backward; default: the heuristic's (the parts' forward, the d_total backward);
    fused-split: the forward with C split over 8 blocks per token tile (partials +
    mhc_pp_mix); composed: the parts' kernels both ways (the backward's sum a torch add);
    d_total-dp2: the default backward (d_total in fp32 by mhc_pp_bwd_dx, then h_post_bda's) with
    dproj as two bf16 terms instead of three (DP3=False, the pre-session-10 arithmetic);
    dh-dx: dh in mhc_pre's dx pass from the fp32 d_total (mhc_pp_bwd_dxh), d_total stored in
    bf16 for h_post_bda's dresidual / dx kernel; one: the one-pass backward (mhc_pp_bwd_one;
    dweight from out, mhc_pp_bwd_dw); one-dwin: the one-pass backward with dweight in the
    same pass. The last three are slower, non-default designs (n <= 4)."""
    one = design.startswith("one") or design == "dh-dx"
    if one and c["n"] > 4:
        pytest.skip("the designs that keep the fp32 d_total out of memory are checked at n <= 4")
    if not one and design != "fused" and c["n"] not in (3, 4, 8):
        pytest.skip("the other designs are checked at n = 3, 4, 8")
    changes = {"fused": dict(FUSE_FWD=True), "default": {}, "fused-split": dict(FUSE_FWD=True, CS=8),
               "composed": dict(FUSE_FWD=False, FUSE_BWD=False, ONE_BWD=False, DH_DX=False),
               "d_total-dp2": dict(ONE_BWD=False, DH_DX=False, DP3=False), "dh-dx": dict(DH_DX=True), "one": dict(ONE_BWD=True),
               "one-dwin": dict(ONE_BWD=True, DW_B=True, TK_B=32, G_B=8)}[design]
    run_cutile(c, monkeypatch, **changes)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("h", [F32, BF16])
def test_cutile_equals_the_two_ops_through_the_registry(h):
    """Same results as h_post_bda then mhc_pre (cuTile both), within the bf16 tolerance
    (the separate path rounds the summed d(out) to bf16; see the module doc)."""
    c = dict(T=1001, n=4, C=2560, h=h, bias=True)
    args, outs, grads, cots = run_cutile(c)
    leaves = [None if t is None else t.clone().requires_grad_() for t in args]
    out = registry.get("mhc_h_post_bda")(*leaves[:4], leaves[6], backend="cutile")
    pre = registry.get("mhc_pre")(out, leaves[4], leaves[5], **PARAMS, backend="cutile")
    torch.autograd.backward((out, *pre), cots)
    for name, a, b in zip(("out", "layer_in", "h_post_next", "h_res_next"), outs, (out, *pre)):
        assert_close(a.float(), b.float(), kind="bfloat16", what=name)
    for name, g, leaf in zip(IN_NAMES, grads, leaves):
        assert_close(g.float(), leaf.grad.float(), kind="bfloat16", what=f"d{name}")


@pytest.mark.gpu
@needs_gpu
def test_cutile_backward_is_deterministic():
    """Fixed-order reductions, no atomics: two backward runs give bitwise-equal gradients."""
    args = inputs(4096, 4, 7168, device="cuda")
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in args]
        outs = OP(*leaves, **PARAMS, backend="cutile")
        torch.manual_seed(1)
        torch.autograd.backward(outs, [rand(*o.shape, dtype=o.dtype).cuda() for o in outs])
        runs.append([o.detach() for o in outs] + [t.grad for t in leaves])
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"output/gradient {i} differs between runs"
