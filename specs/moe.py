"""Grouped MoE MLP (MXFP8) op specs. See ../shared/OPS.md, "Grouped MoE MLP (MXFP8)".

G experts, tokens M sorted by expert, ``m_splits`` [G] int64 tokens per expert
(sum M, zeros allowed), on any device (``same_device=False``): the torch reference
reads it on the host (pass it on the CPU there, as Megatron and Transformer Engine do);
the cute kernels read it on the device (keep it on the GPU: no host sync, and the
call can be captured in a CUDA graph). Its value rules run where it lives.

MXFP8: e4m3 data + one E8M0 scale (uint8 biased exponent e, value 2^(e-127)) per
32 consecutive elements along the reduction dim; scale = 2^ceil(log2(amax/448))
computed exactly, clamped to [2^-127, 2^127], amax == 0 -> e = 0; data = e4m3(x /
scale) round-to-nearest-even, saturating. Quantization is exact, so the torch
reference is bit-exact (tilekernels/moe/mxfp8.py).

Precision of the MLP's intermediates (fixed here so that every backend and the
float64 reference agree bit for bit on what gets quantized): the FC1 output h,
the SwiGLU output, and in backward dA (FC2 dgrad) and dh stay in fp32 (the
accumulators) and are quantized from fp32, never rounded to bf16 first.
"""
from __future__ import annotations

from .schema import Backend, Constraint, Dim, OpSpec, Param, TensorSpec

_TORCH = Backend(name="torch", module="tilekernels.moe.ops")
_TORCH_FWD = Backend(name="torch", module="tilekernels.moe.ops", passes=["fwd"])
_FLOAT = ["bfloat16", "float32", "float64"]
_PROBS = ["float32", "float64"]

_INT32 = Constraint(expr="M < 2**31", message="the CuTe DSL kernels index rows with int32")


def _cute(*constraints: Constraint, passes=("fwd", "bwd"), doc: str = "", **dtypes: list) -> Backend:
    """The CuTe DSL backend (tilekernels.moe.cute_kernels): Hopper sm_90a (the grouped GEMM
    issues wgmma), run and tested on the H200. No float64 (the torch backend covers reference
    mode). Tails of M, K and N are masked in every kernel, so no tile size reaches the user."""
    return Backend(name="cute", module="tilekernels.moe.cute_kernels", sm=(90, 90), toolchain=["cute"],
                   passes=list(passes), constraints=list(constraints), dtypes=dtypes, doc=doc)


_M = Dim(name="M", doc="tokens, sorted by expert")
_G = Dim(name="G", min=1, doc="experts (groups)")


def _m_splits() -> TensorSpec:
    return TensorSpec(name="m_splits", shape=["G"], dtypes=["int64"], same_device=False, differentiable=False,
                      from_ints=True,
                      doc="[G] int64 tokens per expert (sum M, zeros allowed); any device (torch reads it on "
                          "the host, the cute kernels on the device); or a list of G ints (made a CPU tensor; under "
                          "torch.compile dynamo makes its ints symbolic after its first recompile)")


def _split_rules(grad_when: str) -> list[Constraint]:
    """sum(m_splits) == M, entries in [0, M], and % 32 when a columnwise (wgrad) quantization needs it. Frozen bf16
    masters (no wgrad) are held to it too: the cute backward quantizes dY (the MLP also dh and a) along the tokens
    for them as well, so dx comes from the same kernels bit for bit, and a value rule cannot depend on the
    backend; only pre-quantized weights (which cannot require grad) lift it in the MLP."""
    return [
        # With entries in [0, M] and G M < 2**63 the sum cannot leave int64: the device form of the sum rule (a
        # tensor sum, where the host adds Python ints) wrapped [2**62] * 4 + [4] to 4 == M and took it. The range
        # comes before the sum, so the host (which stops at the first rule that fails) can refuse an entry > M;
        # its message is short so a device refusal of the three still fits CUDA's 255 characters.
        Constraint(expr="min(values(m_splits)) >= 0", message="m_splits entries must be >= 0"),
        Constraint(expr="max(values(m_splits)) <= M", message="each at most M"),
        Constraint(expr="sum(values(m_splits)) == M", message="m_splits must add up to the token count M"),
        Constraint(expr="G * M < 2**63", message="m_splits' int64 sum must not wrap"),
        Constraint(expr="all_div(values(m_splits), 32)", when=grad_when,
                   message="MXFP8 wgrad quantizes columnwise along each expert's tokens: "
                           "every m_splits entry must be a multiple of 32 when gradients are needed"),
    ]


def _f64_probs(t: str) -> Constraint:
    return Constraint(expr=f"(dtype({t}) == 'float64') == (dtype(probs) == 'float64')",
                      message=f"probs is float64 exactly when {t} is (reference/gradcheck mode)")


_AXIS_DOC = "rowwise: blocks along the last dim; columnwise: blocks along the first; both"

# grouped_mlp_mxfp8's weights: a master in x's dtype, or MXFP8 data (e4m3) with its rowwise scales
_MLP_WEIGHT = ["bfloat16", "float64", "float8_e4m3fn"]


def _weight_scales(w: str, shape: list) -> TensorSpec:
    return TensorSpec(name=f"{w}_scales", shape=shape, dtypes=["uint8"], optional=True, differentiable=False,
                      doc=f"{shape} uint8 E8M0 scales of a pre-quantized {w} (blocks of 32 along its last "
                          "dim, as mxfp8_quantize's rowwise scales); given exactly when it is e4m3")


def _weight_rules(w: str) -> list[Constraint]:
    fp8 = f"dtype({w}) == 'float8_e4m3fn'"
    return [
        Constraint(expr=f"{fp8} or dtype({w}) == dtype(x)",
                   message=f"{w} is a master in x's dtype or pre-quantized MXFP8 (float8_e4m3fn)"),
        Constraint(expr=f"present({w}_scales) == ({fp8})",
                   message=f"{w}_scales (uint8 rowwise MXFP8 scales) go with an e4m3 {w}, and only with one"),
    ]

QUANTIZE = OpSpec(
    name="mxfp8_quantize",
    family="moe",
    doc="MXFP8 quantization: e4m3 data + E8M0 scale per 32 elements (rowwise along K, columnwise along R). "
        "Returns (data, scales) for one axis, (row_data, row_scales, col_data, col_scales) for 'both'.",
    dims=[Dim(name="R"), Dim(name="K")],
    inputs=[TensorSpec(name="x", shape=["R", "K"], dtypes=_FLOAT, differentiable=False,
                       doc="[R, K] contiguous; a block holding NaN or +-Inf gets scale 0xFF (NaN); x may require "
                           "grad (a weight Parameter): the outputs are codes, detached, with no gradient")],
    outputs=[
        TensorSpec(name="row_data", role="out", optional=True, shape=["R", "K"], dtypes=["float8_e4m3fn"],
                   doc="axis rowwise/both"),
        TensorSpec(name="row_scales", role="out", optional=True, shape=["R", "K // 32"], dtypes=["uint8"],
                   doc="E8M0 biased exponents, axis rowwise/both"),
        TensorSpec(name="col_data", role="out", optional=True, shape=["R", "K"], dtypes=["float8_e4m3fn"],
                   doc="axis columnwise/both"),
        TensorSpec(name="col_scales", role="out", optional=True, shape=["R // 32", "K"], dtypes=["uint8"],
                   doc="E8M0 biased exponents, axis columnwise/both"),
    ],
    params=[Param(name="axis", type="str", default="rowwise", choices=["rowwise", "columnwise", "both"],
                  doc=_AXIS_DOC)],
    constraints=[
        Constraint(expr="K % 32 == 0", when="axis != 'columnwise'", message="rowwise blocks of 32 along K"),
        Constraint(expr="R % 32 == 0", when="axis != 'rowwise'", message="columnwise blocks of 32 along R"),
    ],
    differentiable=False,
    reference="tilekernels.moe.reference:mxfp8_quantize",
    entry="tilekernels.moe.ops:mxfp8_quantize",
    backends=[_cute(Constraint(expr="R < 2**31"), passes=("fwd",), x=["bfloat16", "float32"],
                    doc="one pass over x for 'both'"), _TORCH_FWD],
)

DEQUANTIZE = OpSpec(
    name="mxfp8_dequantize",
    family="moe",
    doc="Inverse of mxfp8_quantize for one axis: out = data * 2^(e-127) (exact in fp32).",
    dims=[Dim(name="R"), Dim(name="K")],
    inputs=[
        TensorSpec(name="data", shape=["R", "K"], dtypes=["float8_e4m3fn"], differentiable=False,
                   doc="[R, K] e4m3, contiguous"),
        TensorSpec(name="scales", shape={"rowwise": ["R", "K // 32"], "columnwise": ["R // 32", "K"]},
                   dtypes=["uint8"], differentiable=False, doc="E8M0 biased exponents"),
    ],
    outputs=[TensorSpec(name="out", role="out", shape=["R", "K"], dtypes=_FLOAT, doc="dtype = out_dtype")],
    params=[
        Param(name="axis", type="str", default="rowwise", choices=["rowwise", "columnwise"], doc=_AXIS_DOC),
        Param(name="out_dtype", type="str", default="bfloat16", choices=_FLOAT,
              doc="bf16 is exact unless a value is below bf16's normal range"),
    ],
    layouts={"rowwise": "axis == 'rowwise'", "columnwise": "axis == 'columnwise'"},
    constraints=[
        Constraint(expr="K % 32 == 0", when="axis == 'rowwise'", message="rowwise blocks of 32 along K"),
        Constraint(expr="R % 32 == 0", when="axis == 'columnwise'", message="columnwise blocks of 32 along R"),
    ],
    differentiable=False,
    reference="tilekernels.moe.reference:mxfp8_dequantize",
    entry="tilekernels.moe.ops:mxfp8_dequantize",
    backends=[_cute(Constraint(expr="R < 2**31"),
                    Constraint(expr="out_dtype in ('bfloat16', 'float32')",
                               message="the kernel writes bf16 or fp32 (float64 out is the torch reference's)"),
                    passes=("fwd",)), _TORCH_FWD],
)

GROUPED_LINEAR = OpSpec(
    name="grouped_linear",
    family="moe",
    doc="y[rows of expert g] = x[rows] @ weight[g]^T; precision bf16 (operands as given) or mxfp8 "
        "(both quantized along K, exact products, fp32 accumulate; backward per TE's MXFP8 recipe: "
        "dgrad quantizes dY rowwise and W columnwise along N, wgrad quantizes dY and x columnwise "
        "along each expert's tokens)",
    dims=[_M, Dim(name="K", min=1), Dim(name="N", min=1), _G],
    inputs=[
        TensorSpec(name="x", shape=["M", "K"], dtypes=_FLOAT, doc="[M, K] bf16 (fp32/fp64 reference mode), contiguous"),
        TensorSpec(name="weight", shape=["G", "N", "K"], dtypes="like:x", doc="[G, N, K] per-expert weights"),
        _m_splits(),
    ],
    outputs=[TensorSpec(name="y", role="out", shape=["M", "N"], dtypes="like:x")],
    params=[Param(name="precision", type="str", default="bf16", choices=["bf16", "mxfp8"],
                  doc="bf16: no quantization (GEMM in the inputs' dtype, fp32 accumulate); mxfp8: MXFP8 GEMMs")],
    constraints=[
        *_split_rules("requires_grad and precision == 'mxfp8'"),
        Constraint(expr="K % 32 == 0", when="precision == 'mxfp8'", message="MXFP8 blocks of 32 along K"),
        Constraint(expr="N % 32 == 0", when="requires_grad and precision == 'mxfp8'",
                   message="MXFP8 dgrad quantizes along N in blocks of 32"),
    ],
    differentiable=True,
    reference="tilekernels.moe.reference:grouped_linear",
    entry="tilekernels.moe.ops:grouped_linear",
    backends=[_cute(Constraint(expr="N % 32 == 0", when="precision == 'mxfp8'",
                               message="the dgrad's columnwise weight blocks run along N, and the forward's "
                                       "selectable GEMM routes (dq, the cute bf16-output GEMM) tile N by 32 / 8 "
                                       "(the default route runs any N: benchmarks/probes/moe_linear_fwd_n.py)"),
                    Constraint(expr="K % 8 == 0 and N % 8 == 0", when="precision == 'bf16'",
                               message="the bf16 GEMMs (torch._grouped_mm) need 16-byte rows: K and N multiples of 8"),
                    _INT32, x=["bfloat16"],
                    doc="mxfp8: the MXFP8 GEMMs (operands quantize-dequantized to bf16 in one pass, then bf16 "
                        "grouped GEMMs; cute_kernels); bf16: torch._grouped_mm on the operands as given (fp32 "
                        "accumulation, group ends read on the device, any group sizes)"), _TORCH],
)

SCALED_SWIGLU = OpSpec(
    name="scaled_swiglu",
    family="moe",
    doc="out = silu(gate) * linear * probs[:, None]; gate/linear = halves of h (glu_interleave_size None) "
        "or alternating blocks [gate s | linear s] along the last dim",
    dims=[_M, Dim(name="F2", min=2, multiple_of=2, doc="2F, the width of h")],
    inputs=[
        TensorSpec(name="h", shape=["M", "F2"], dtypes=_FLOAT, doc="[M, 2F] bf16 (fp32/fp64), contiguous"),
        TensorSpec(name="probs", shape=["M"], dtypes=_PROBS, doc="[M] fp32 router probabilities"),
    ],
    outputs=[TensorSpec(name="out", role="out", shape=["M", "F2 // 2"], dtypes="like:h")],
    params=[Param(name="glu_interleave_size", type="int", default=None, nullable=True, min=1,
                  doc="None: [gate | linear] halves; s (32 in TE's fused MLP): [gate s | linear s] blocks")],
    constraints=[
        _f64_probs("h"),
        Constraint(expr="glu_interleave_size is None or F2 % (2 * glu_interleave_size) == 0",
                   message="the width 2F must hold whole [gate s | linear s] block pairs"),
    ],
    differentiable=True,
    reference="tilekernels.moe.reference:scaled_swiglu",
    entry="tilekernels.moe.ops:scaled_swiglu",
    backends=[_cute(_INT32, h=["bfloat16", "float32"], probs=["float32"]), _TORCH],
)

GROUPED_MLP = OpSpec(
    name="grouped_mlp_mxfp8",
    family="moe",
    doc="y = grouped_linear(scaled_swiglu(grouped_linear(x, fc1), probs, s=32), fc2), every GEMM MXFP8; "
        "h and the SwiGLU output stay fp32 and are quantized from fp32 (the FC1 epilogue); no bias. "
        "Each weight is a bf16 master or pre-quantized MXFP8: e4m3 data [G, N, K] with its rowwise "
        "scales (blocks along K, as mxfp8_quantize writes them) in fc1_weight_scales / "
        "fc2_weight_scales. A pre-quantized weight's value is its dequantization: the forward "
        "consumes it as it is (quantizing an MXFP8 value along its own blocks changes nothing), "
        "the dgrad quantizes that value columnwise along N as it does a master's, and it gets no "
        "gradient (frozen weights: serving, or training the rest of the model; an fp8 tensor cannot "
        "hold a gradient, so one that requires grad is refused). "
        "quantize=False runs the same graph without MXFP8 (float64 gradcheck).",
    dims=[_M, Dim(name="H", min=1, doc="hidden"), Dim(name="F", min=1, doc="expert FFN width"), _G],
    inputs=[
        TensorSpec(name="x", shape=["M", "H"], dtypes=["bfloat16", "float64"],
                   doc="[M, H] bf16 (fp64 reference/gradcheck mode), contiguous"),
        TensorSpec(name="probs", shape=["M"], dtypes=_PROBS, doc="[M] fp32 router probabilities"),
        _m_splits(),
        TensorSpec(name="fc1_weight", shape=["G", "2*F", "H"], dtypes=_MLP_WEIGHT,
                   doc="[G, 2F, H] x's dtype, or e4m3 (pre-quantized, with fc1_weight_scales); rows "
                       "interleaved [gate 32 | linear 32]; contiguous"),
        TensorSpec(name="fc2_weight", shape=["G", "H", "F"], dtypes=_MLP_WEIGHT,
                   doc="[G, H, F] x's dtype, or e4m3 (pre-quantized, with fc2_weight_scales); contiguous"),
        _weight_scales("fc1_weight", ["G", "2*F", "H // 32"]),
        _weight_scales("fc2_weight", ["G", "H", "F // 32"]),
    ],
    outputs=[TensorSpec(name="y", role="out", shape=["M", "H"], dtypes="like:x")],
    params=[Param(name="quantize", type="bool", default=True,
                  doc="False: the same graph with unquantized operands (fp32/fp64 GEMMs), for gradcheck")],
    constraints=[
        # wgrad's columnwise blocks along each expert's tokens: not needed when both weights are
        # pre-quantized (frozen: no wgrad)
        *_split_rules("requires_grad and quantize and not (dtype(fc1_weight) == 'float8_e4m3fn' "
                      "and dtype(fc2_weight) == 'float8_e4m3fn')"),
        _f64_probs("x"),
        Constraint(expr="H % 256 == 0", message="fused grouped MLP needs H % 256 == 0"),
        Constraint(expr="F % 256 == 0", message="fused grouped MLP needs F % 256 == 0 (so 2F % 512 == 0)"),
        *_weight_rules("fc1_weight"),
        *_weight_rules("fc2_weight"),
    ],
    differentiable=True,
    reference="tilekernels.moe.reference:grouped_mlp_mxfp8",
    entry="tilekernels.moe.ops:grouped_mlp_mxfp8",
    backends=[_cute(Constraint(expr="quantize", message="the cute kernels are the MXFP8 path"), _INT32,
                    Constraint(expr="M % 32 == 0", when="requires_grad",
                               message="the backward's dSwiGLU pass quantizes dh columnwise over all M tokens "
                                       "(blocks of 32), wgrad or not"),
                    x=["bfloat16"], probs=["float32"]), _TORCH],
)

SPECS = [QUANTIZE, DEQUANTIZE, GROUPED_LINEAR, SCALED_SWIGLU, GROUPED_MLP]
