"""mHC (manifold-constrained hyper-connections) op specs. See ../shared/OPS.md.

Backends are listed in preference order and the torch reference is always
usable, so a GPU backend goes before ``_TORCH`` in an op's ``backends`` list
(e.g. ``backends=[Backend(name="cutile", ...), _TORCH]``).

Dtype conventions: production dtypes plus "float64" (reference / gradcheck
mode). A float64 data tensor needs float64 companions (the constraints below),
so float64 calls run entirely in float64.
"""
from __future__ import annotations

from .schema import Backend, Constraint, Dim, OpSpec, Param, TensorSpec, eps_param

_T = Dim(name="T", doc="tokens (seq * batch)")
_n = Dim(name="n", min=1, max=8, doc="residual streams")
_C = Dim(name="C", min=1, doc="hidden size")
_TORCH = Backend(name="torch", module="tilekernels.mhc.ops")

_BF_F32 = ["bfloat16", "float32"]
_INT32_INDEX = "every tensor has < 2**31 elements (the kernels index with int32)"
_SK_SCRATCH = Constraint(expr="2 * iters * n * T < 2**31", message="the Sinkhorn backward's scratch "
                         "[iters, 2n, T] fp32 is indexed with int32")
_BIAS_LIKE_X = Constraint(expr="not present(bias) or dtype(bias) == dtype(x)",
                          message="the kernel reads bias in x's dtype")
_ITERS_CONST = Constraint(expr="iters <= 64", message="iters is a compile-time constant (each value "
                          "compiles its own kernels) and sizes the backward's scratch")


def _cutile(*constraints: Constraint, doc: str = "", **dtypes: list) -> Backend:
    """The cuTile backend (tilekernels.mhc.cutile_kernels): Hopper, run and tested
    on H200 (sm_90); compiled for sm_100 in CI, never run there. No float64
    (the torch backend covers reference mode). n is padded to a power of two in
    registers and C / T tails are masked, so no tile size reaches the user."""
    return Backend(name="cutile", module="tilekernels.mhc.cutile_kernels", sm=(90, 100),
                   toolchain=["cutile"], constraints=list(constraints), dtypes=dtypes, doc=doc)


def _cute(module: str, *constraints: Constraint, doc: str = "", toolchain: tuple = ("cute",),
          **dtypes: list) -> Backend:
    """A CuTe DSL backend (tilekernels.mhc.<module>: cute_post_bda, cute_aggregate, ...): Hopper sm_90a,
    run and tested on the H200; compiled for sm_90a (and sm_100a where the kernel has no wgmma) in CI.
    No float64 (the torch backend covers reference mode). ``toolchain``: ("cutile", "cute") for a backend
    that also runs cuTile kernels (mhc_pre's, mhc_post_pre's)."""
    return Backend(name="cute", module=f"tilekernels.mhc.{module}", sm=(90, 90), toolchain=list(toolchain),
                   constraints=list(constraints), dtypes=dtypes, doc=doc)


_LOW = ["bfloat16", "float32", "float64"]
_F32 = ["float32", "float64"]


def _f64_with(data: str, *others: str) -> Constraint:
    """float64 ``data`` (reference mode) needs every tensor in ``others`` float64 too."""
    cond = " and ".join(f"(not present({o}) or dtype({o}) == 'float64')" for o in others)
    return Constraint(expr=f"dtype({data}) != 'float64' or ({cond})",
                      message=f"float64 {data} (reference/gradcheck mode) needs float64 {', '.join(others)}")


# iters' bound on the op: a runaway value is refused, not run (the torch path takes 2 * iters steps a call; the GPU
# backends' own limits are far lower: cuTile 64, CuTe DSL 41 at n = 4)
ITERS_MAX = 1024


def _iters(default: int = 20) -> Param:
    return Param(name="iters", type="int", default=default, min=1, max=ITERS_MAX,
                 doc="Sinkhorn rounds (row then column)")


H_AGGREGATE = OpSpec(
    name="mhc_h_aggregate",
    family="mhc",
    doc="out[t,c] = sum_i h_pre[t,i] * x[t,i,c]",
    dims=[_T, _n, _C],
    inputs=[
        TensorSpec(name="x", shape=["T", "n", "C"], dtypes=_LOW,
                   doc="[T, n, C] streams, contiguous"),
        TensorSpec(name="h_pre", shape=["T", "n"], dtypes=_LOW,
                   doc="[T, n] pre-mixing weights"),
    ],
    outputs=[TensorSpec(name="out", role="out", shape=["T", "C"], dtypes="like:x")],
    constraints=[
        Constraint(expr="dtype(x) != 'float64' or dtype(h_pre) == 'float64'",
                   message="float64 x (reference/gradcheck mode) needs float64 h_pre"),
    ],
    differentiable=True,
    reference="tilekernels.mhc.reference:h_aggregate",
    entry="tilekernels.mhc.ops:h_aggregate",
    backends=[_cute("cute_aggregate",
                    Constraint(expr="C % 8 == 0", message="16-byte vector accesses of every row (C % 8 == 0)"),
                    Constraint(expr="T * n < 2**31", message="the streams' rows (T * n) are an int32 extent"),
                    Constraint(expr="T * (C // 256 + 1) < 2**31",
                               message="the forward's 1-D grid (a token's CTAs adjacent: up to C // 256 + 1 of "
                                       "them) is an int32 extent"),
                    x=_BF_F32, h_pre=_BF_F32,
                    doc="tilekernels/mhc/cute_aggregate.py: fwd one 16-byte (n > 4: 8-byte) chunk a thread, a "
                        "token's CTAs adjacent on a 1-D grid; bwd one streaming pass, a persistent CTA a token at a "
                        "time (dh_pre by warp shuffles and one smem exchange); sm_90a only; other GPUs, C % 8 != 0 "
                        "or no CuTe DSL take cutile"),
              _cutile(Constraint(expr="T * n * C < 2**31", message=_INT32_INDEX),
                      x=_BF_F32, h_pre=_BF_F32), _TORCH],
)

SINKHORN = OpSpec(
    name="mhc_sinkhorn",
    family="mhc",
    doc="H_res = Sinkhorn(logits): M = exp(logits - rowmax); iters times: M /= rowsum(M) + eps, "
        "then M /= colsum(M) + eps. Backward: the exact gradient of those steps (rowmax included).",
    dims=[_T, _n],
    inputs=[TensorSpec(name="logits", shape=["T", "n", "n"], dtypes=_F32,
                       doc="[T, n, n] fp32 logits, contiguous (fp64: reference mode)")],
    outputs=[TensorSpec(name="out", role="out", shape=["T", "n", "n"], dtypes="like:logits",
                        doc="[T, n, n] doubly stochastic (columns sum to 1 - O(eps))")],
    params=[_iters(), eps_param("eps", "added to every row and column sum")],
    differentiable=True,
    reference="tilekernels.mhc.reference:sinkhorn",
    entry="tilekernels.mhc.ops:sinkhorn",
    backends=[_cute("cute_sinkhorn",
                    Constraint(expr="n <= 7", message="n <= 7 (at n = 8 the backward's 2 n^2 live values spill)"),
                    Constraint(expr="T < 2**31 - 128", message="T is an int32 launch argument and the CTAs' token "
                                                                "indices (b * 128 + thread) are int32"),
                    Constraint(expr="2 * iters * n + 3 * n * n + 3 <= 384",
                               message="the backward's step sums [iters * 2n, 32 tokens] fp32 and its staged rows "
                                       "fit the CTA's 48 KB of shared memory (n = 4: iters <= 41)"),
                    logits=["float32"],
                    doc="tilekernels/mhc/cute_sinkhorn.py: a thread a token, rows staged through shared memory; "
                        "the backward keeps each step's sums in shared memory (no scratch); launched through "
                        "_cute.Launch's ctypes fast path (eager calls are host bound); sm_90a; larger n or iters, "
                        "other GPUs or no CuTe DSL take cutile"),
              _cutile(Constraint(expr="T * n * n < 2**31", message=_INT32_INDEX),
                      _SK_SCRATCH, _ITERS_CONST,
                      logits=["float32"]), _TORCH],
)

H_POST_BDA = OpSpec(
    name="mhc_h_post_bda",
    family="mhc",
    doc="out[t,i,c] = sum_j h_res[t,i,j] residual[t,j,c] + h_post[t,i] * (x[t,c] + bias[c]); "
        "x + bias formed in fp32; dbias reduced over T in fp32",
    dims=[_T, _n, _C],
    inputs=[
        TensorSpec(name="h_res", shape=["T", "n", "n"], dtypes=_LOW, doc="[T, n, n] stream mixing"),
        TensorSpec(name="residual", shape=["T", "n", "C"], dtypes=_LOW, doc="[T, n, C] streams"),
        TensorSpec(name="h_post", shape=["T", "n"], dtypes=_LOW, doc="[T, n] post weights"),
        TensorSpec(name="x", shape=["T", "C"], dtypes="like:residual",
                   doc="[T, C] layer output, residual's dtype"),
        TensorSpec(name="bias", shape=["C"], dtypes=_LOW, optional=True,
                   doc="[C] layer bias in x's dtype or fp32, or None"),
    ],
    outputs=[TensorSpec(name="out", role="out", shape=["T", "n", "C"], dtypes="like:residual")],
    constraints=[
        Constraint(expr="not present(bias) or dtype(bias) == dtype(x) or dtype(bias) == 'float32'",
                   message="bias must have x's dtype or float32"),
        _f64_with("residual", "h_res", "h_post", "bias"),
    ],
    differentiable=True,
    reference="tilekernels.mhc.reference:h_post_bda",
    entry="tilekernels.mhc.ops:h_post_bda",
    backends=[_cute("cute_post_bda",
                    Constraint(expr="C % 8 == 0", message="16-byte vector accesses of every row (C % 8 == 0)"),
                    Constraint(expr="T * n < 2**31", message="the streams' rows (T * n) are an int32 extent"),
                    Constraint(expr="not present(bias) or C <= 32768",
                               message="with a bias, each CTA sums dbias in a [C] fp32 shared-memory array"),
                    h_res=_BF_F32, residual=_BF_F32, h_post=_BF_F32, x=_BF_F32, bias=_BF_F32,
                    doc="tilekernels/mhc/cute_post_bda.py: fwd one 8-channel chunk a thread, a token's CTAs "
                        "adjacent on a 1-D grid; bwd one streaming pass, a "
                        "persistent CTA a token at a time (dh reduced by warp shuffles and one smem "
                        "exchange, dbias in shared memory, then a fixed-order reduction); sm_90a only. "
                        "First: H200, T=32768, n=4, C=7168, fwd+bwd 2.551 / 2.561 ms (bf16 / fp32 h), TE 2.891 in the "
                        "same run, cutile 2.936 beside TE's 2.904 (benchmarks/results/h200-mhc-cute-post-bda.txt, "
                        "h200-gpu-checks-session10.txt in git history at fccfcb8); other GPUs, "
                        "C % 8 != 0 or no CuTe DSL take cutile"),
              _cutile(Constraint(expr="T * n * C < 2**31", message=_INT32_INDEX), _BIAS_LIKE_X,
                      Constraint(expr="n > 4 or 8 * T * n * n * ((C + 2047) // 2048) < 2**31",
                                 message="n <= 4 takes the one-pass backward, whose dh partials [ceil(C / 2048), T, "
                                         "n, n, 8] fp32 are indexed with int32 (more than T * n * C at C < 8n)"),
                      h_res=_BF_F32, residual=_BF_F32, h_post=_BF_F32, x=_BF_F32, bias=_BF_F32),
              _TORCH],
)

PROJ_RMS = OpSpec(
    name="mhc_proj_rms",
    family="mhc",
    doc="proj = x @ weight^T (fp32); r = 1 / (||x||_2 / sqrt(K) + eps) (fp32). "
        "In mHC K = n*C and N = n*n + 2n.",
    dims=[Dim(name="M", doc="rows (tokens)"), Dim(name="N", min=1, doc="projection width"),
          Dim(name="K", min=1, doc="reduction (n*C)")],
    inputs=[
        TensorSpec(name="x", shape=["M", "K"], dtypes=_LOW, doc="[M, K] flattened streams"),
        TensorSpec(name="weight", shape=["N", "K"], dtypes="like:x", doc="[N, K], x's dtype"),
    ],
    outputs=[
        TensorSpec(name="proj", role="out", shape=["M", "N"], dtypes=_F32, doc="fp32 (fp64 for fp64 x)"),
        TensorSpec(name="r", role="out", shape=["M"], dtypes=_F32, doc="fp32 (fp64 for fp64 x)"),
    ],
    params=[eps_param("eps", "added to the RMS norm before the reciprocal")],
    differentiable=True,
    reference="tilekernels.mhc.reference:proj_rms",
    entry="tilekernels.mhc.ops:proj_rms",
    backends=[_cute("cute_proj_rms",
                    Constraint(expr="N <= 32", message="hi and lo of dproj's N columns sit in one 2 x 32-wide "
                                                       "wgmma operand (n <= 4)"),
                    Constraint(expr="K % 8 == 0", message="16-byte TMA row strides of x and dx (K % 8 == 0)"),
                    Constraint(expr="M * N < 2**31", message="dproj's TMA coordinate (1-D view) is int32"),
                    Constraint(expr="7 * N * K < 2**31",
                               message="the backward's dweight partials [7, N, K] fp32 are indexed with int32"),
                    x=["bfloat16"], weight=["bfloat16"],
                    doc="tilekernels/mhc/cute_proj_rms.py (bwd: one pass over x, TMA ring + wgmma, dx stored "
                        "by TMA, dweight partials reduced in order) and cute_proj_rms_fwd.py (fwd: TMA ring + "
                        "wgmma, Kahan-summed k-tile partials); sm_90a only; first: H200, M=32768, K=28672, N=24, "
                        "registry fwd / fwd+bwd 0.440 / 1.429 ms against cutile's 0.442 / 1.511 in the same run "
                        "(benchmarks/results/h200-mhc-cute-proj-rms.txt); n > 4 or K % 8 != 0 take cutile"),
              _cutile(Constraint(expr="M * K < 2**31", message=_INT32_INDEX),
                      Constraint(expr="N <= 128", message="the whole projection width sits in one tile"),
                      x=["bfloat16"], weight=["bfloat16"]),
              _TORCH],
)

# the cuTile mhc_pre kernels' limits (also those of mhc_post_pre, which runs them)
# The GPU backwards form proj's gradient dh * alpha * r in fp32 and take dweight = dproj^T x: an all-zero token's
# r = 1/rms_eps times |dh alpha| past 2**128 is inf, and inf * 0 made dweight NaN (both GPU backends at 2**-126 with
# cotangents scaled by 1e3; H100, session 72). Down to 2**-80 that takes |dh alpha| > 2**48. The torch backend
# applies r after the products (reference._proj_rms_bwd_acc) and takes any eps.
_RMS_EPS_BWD = Constraint(expr="rms_eps >= 2.0**-80", when="requires_grad",
                          message="the backward's proj gradient dh * alpha * r (r up to 1/rms_eps) is fp32: below "
                                  "2**-80 an all-zero token's can overflow and make dweight NaN")
# per-token fp32 scratch of the backwards (dproj [T, n*n + 2n], projection rows padded to a power of two, [T, NP, NP]
# Sinkhorn gradients, [T, n, n] dh partials) stays under 2 (n*n + 2n) a token; T * n * C bounds it only for C > 2n + 4
_PROJ_SCRATCH = Constraint(expr="2 * (n*n + 2*n) * T < 2**31",
                           message="the backward's per-token fp32 scratch (up to [T, 2 (n*n + 2n)]) is indexed "
                                   "with int32")
_PRE_LIMITS = (Constraint(expr="T * n * C < 2**31", message=_INT32_INDEX), _PROJ_SCRATCH, _SK_SCRATCH, _ITERS_CONST,
               _RMS_EPS_BWD)
# the CuTe DSL backends of mhc_pre and mhc_post_pre (their passes stream the [T, n*C] rows by TMA; mhc_pre's dweight
# partials are cute_proj_rms's)
_TMA_ROWS = Constraint(expr="C % 8 == 0", message="TMA row strides are multiples of 16 bytes")
_DW_PARTIALS = Constraint(expr="7 * (n*n + 2*n) * n * C < 2**31",
                          message="mhc_pre's dweight partials [7, n*n + 2n, n*C] fp32 are indexed with int32")

PRE = OpSpec(
    name="mhc_pre",
    family="mhc",
    doc="Fused mHC pre-step: proj, r = proj_rms(x.view(T, n*C), weight, rms_eps); "
        "h = r*proj*alpha + bias split pre (n) | post (n) | res (n*n, row-major) with alpha = "
        "alpha_pre | alpha_post | alpha_res; h_pre = sigmoid(pre), h_post = 2*sigmoid(post), "
        "h_res = sinkhorn(res, iters, sinkhorn_eps), layer_in = h_aggregate(x, h_pre).",
    dims=[_T, _n, _C],
    inputs=[
        TensorSpec(name="x", shape=["T", "n", "C"], dtypes=_LOW, doc="[T, n, C] streams"),
        TensorSpec(name="weight", shape=["n*n+2*n", "n*C"], dtypes="like:x",
                   doc="[n*n+2n, n*C], x's dtype; rows pre | post | res"),
        TensorSpec(name="bias", shape=["n*n+2*n"], dtypes=_F32, doc="[n*n+2n] fp32"),
    ],
    outputs=[
        TensorSpec(name="layer_in", role="out", shape=["T", "C"], dtypes="like:x"),
        TensorSpec(name="h_post", role="out", shape=["T", "n"], dtypes=_F32),
        TensorSpec(name="h_res", role="out", shape=["T", "n", "n"], dtypes=_F32),
    ],
    params=[
        Param(name="alpha_pre", type="float", default=1.0, doc="scale of the pre section; a float: no gradient"),
        Param(name="alpha_post", type="float", default=1.0, doc="scale of the post section; a float: no gradient"),
        Param(name="alpha_res", type="float", default=1.0, doc="scale of the res section; a float: no gradient"),
        _iters(),
        eps_param("rms_eps", "proj_rms's eps"),
        eps_param("sinkhorn_eps", "Sinkhorn's eps"),
    ],
    constraints=[
        Constraint(expr="(dtype(x) == 'float64') == (dtype(bias) == 'float64')",
                   message="bias is float32, or float64 together with float64 x (reference mode)"),
    ],
    differentiable=True,
    reference="tilekernels.mhc.reference:mhc_pre",
    entry="tilekernels.mhc.ops:mhc_pre",
    backends=[_cute("cute_pre", *_PRE_LIMITS,
                    Constraint(expr="n <= 4", message="the dx pass holds n*n + 2n <= 32 projection columns; the "
                               "split mix is n <= 4's"),
                    _TMA_ROWS, _DW_PARTIALS,
                    toolchain=("cutile", "cute"), x=["bfloat16"], weight=["bfloat16"], bias=["float32"],
                    doc="forward: the cuTile backend's; backward: cuTile's dh_pre pass and dbias reduction, the split "
                        "mix's Sinkhorn backward and rest as CuTe DSL kernels (a thread a token), and the dx pass as "
                        "cute_proj_rms's kernel with the aggregate term (dx and dweight in one read of x by a TMA "
                        "ring and wgmma; tilekernels/mhc/cute_pre.py); needs both toolchains"),
              _cutile(*_PRE_LIMITS, x=["bfloat16"], weight=["bfloat16"], bias=["float32"]), _TORCH],
)

# The layer boundary: h_post_bda of layer l, then mhc_pre of layer l+1 on its output. Inputs,
# params and constraints are the two ops' own (reused, not restated); only the pre step's
# bias is renamed hbias (h_post_bda already has a bias), its outputs get a _next suffix, and
# h_post_bda's optional bias moves last.
_PB_IN = {t.name: t for t in H_POST_BDA.inputs}
_PRE_IN = {t.name: t for t in PRE.inputs}
POST_PRE = OpSpec(
    name="mhc_post_pre",
    family="mhc",
    doc="The mHC layer boundary in one op: out = mhc_h_post_bda(h_res, residual, h_post, x, bias), then "
        "(layer_in, h_post_next, h_res_next) = mhc_pre(out, weight, hbias, alpha_pre, alpha_post, "
        "alpha_res, iters, rms_eps, sinkhorn_eps). Equal to the two ops called in sequence (outputs "
        "bitwise in the torch reference; gradients to rounding: the backward adds mhc_pre's d(out) to "
        "dout in fp32, where the sequence rounds it to residual's dtype first); the fused backends read "
        "the new streams once for the projection and the RMS norm.",
    dims=[_T, _n, _C],
    inputs=[*H_POST_BDA.inputs[:4],  # h_res, residual, h_post, x
            _PRE_IN["weight"].model_copy(update={"dtypes": "like:residual",
                                                 "doc": "[n*n+2n, n*C] next layer's mhc_pre weight, "
                                                        "residual's dtype; rows pre | post | res"}),
            _PRE_IN["bias"].model_copy(update={"name": "hbias", "doc": "[n*n+2n] fp32 next layer's "
                                               "mhc_pre bias (fp64 with fp64 residual)"}),
            _PB_IN["bias"]],  # optional inputs go last (the generated entry takes them as keywords)
    outputs=[
        H_POST_BDA.outputs[0].model_copy(update={"doc": "[T, n, C] the new streams, residual's dtype"}),
        PRE.outputs[0].model_copy(update={"dtypes": "like:residual", "doc": "[T, C] next layer's input"}),
        PRE.outputs[1].model_copy(update={"name": "h_post_next", "doc": "[T, n] fp32 next layer's h_post"}),
        PRE.outputs[2].model_copy(update={"name": "h_res_next", "doc": "[T, n, n] fp32 next layer's h_res"}),
    ],
    params=list(PRE.params),   # with their ranges (iters, rms_eps, sinkhorn_eps)
    constraints=[
        *H_POST_BDA.constraints,
        Constraint(expr="(dtype(residual) == 'float64') == (dtype(hbias) == 'float64')",
                   message="hbias is float32, or float64 together with float64 residual (reference mode)"),
        Constraint(expr="dtype(h_res) != 'float64' or dtype(residual) == 'float64'",
                   message="float64 h_res (reference mode) needs float64 residual"),
    ],
    differentiable=True,
    reference="tilekernels.mhc.reference:mhc_post_pre",
    entry="tilekernels.mhc.ops:mhc_post_pre",
    backends=[_cute("cute_post_pre", *_PRE_LIMITS,
                    Constraint(expr="n <= 4", message="the one-pass backward holds n*n + 2n <= 24 projection "
                               "columns and every stream of a channel in registers"),
                    _TMA_ROWS, _DW_PARTIALS,
                    Constraint(expr="256 * T < 2**31",
                               message="the split passes' per-token partial planes (forward [8, T, 32] fp32) are "
                                       "indexed with int32"),
                    _BIAS_LIKE_X, toolchain=("cutile", "cute"),
                    h_res=_BF_F32, residual=["bfloat16"], h_post=_BF_F32, x=["bfloat16"],
                    bias=["bfloat16"], weight=["bfloat16"], hbias=["float32"],
                    doc="forward: one CuTe DSL pass writes out and mhc_pre's projection partials from one read of "
                        "the streams, then the mix epilogue (CuTe DSL) and cuTile's aggregate; backward: "
                        "mhc_pre's head (a CuTe DSL pass over channel slices of out for dh_pre and dweight's post / "
                        "res rows, the mix's CuTe DSL kernels), then one CuTe DSL pass that forms "
                        "d_total in registers and runs h_post_bda's backward on it (reads dout, residual, x, "
                        "dlayer_in once; tilekernels/mhc/cute_post_pre.py); needs both toolchains"),
              _cutile(*_PRE_LIMITS, _BIAS_LIKE_X,
                      h_res=_BF_F32, residual=["bfloat16"], h_post=_BF_F32, x=["bfloat16"],
                      bias=["bfloat16"], weight=["bfloat16"], hbias=["float32"],
                      doc="the parts' forward kernels (a fused forward exists, slower on the H200); "
                          "backward: mhc_pre's d(out) and the incoming d(out) summed in fp32 in one "
                          "pass, then h_post_bda's backward (tilekernels/mhc/cutile_post_pre.py)"), _TORCH],
)

SPECS = [H_AGGREGATE, SINKHORN, H_POST_BDA, PROJ_RMS, PRE, POST_PRE]
