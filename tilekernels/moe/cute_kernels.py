"""The ``cute`` backend of the MoE ops: CuTe DSL kernels (Hopper, sm_90a) behind the registry.

Registers destination-passing kernels with the signatures of ``tilekernels/moe/ops.py``
(inputs, outputs, scratch, params; bwd: grads, saved, input grads, params). The CuTe DSL
building blocks:

* ``cute_quantize``: MXFP8 quantize (rowwise / columnwise / both in one pass) and dequantize;
* ``cute_swiglu``: scaled SwiGLU fwd/bwd, and the MLP's fused SwiGLU + MXFP8 passes;
* ``cute_grouped_gemm``: the MXFP8 grouped GEMM (e4m3 tiles dequantized to bf16 in the
  mainloop, bf16 wgmma, fp32 accumulation) in its three variants fwd / dgrad / wgrad
  (``kernel="dq"``);
* ``gemm_predq``: the same GEMMs as one dequantize pass per operand plus a bf16 grouped GEMM
  (``kernel="predq"``) on sm_90: torch's for bf16 outputs, ``cute_gemm_bf16`` (TMA +
  warp-specialized wgmma) for the fp32 outputs of fwd / dgrad.

GEMM path (``gemm_choice``): ``TILEKERNELS_MOE_GEMM`` / ``set_gemm_kernel`` = "auto" (the
default: predq where ``PREDQ_DEFAULT`` and ``gemm_predq.supported``, for fp32 outputs also
``PREDQ_FP32_DEFAULT``, else dq), "predq" (where supported, else dq) or "dq" (forces the
mainloop-dequant kernel everywhere). The fused MLP's fp32 outputs (h = FC1 fwd, dA = FC2
dgrad, OPS.md) take predq through cute_gemm_bf16; an fp32 wgrad would stay on dq.
On the predq path, ``QDQ`` (default on; $TILEKERNELS_MOE_QDQ=0 turns it off) sends the operands
that are quantized only to be dequantized (the bf16 weights, x; cute_qdq) through one
quantize-dequantize pass, ``QDQ_OUT`` (default on) has the fused MLP's SwiGLU kernels write their
GEMM operands as bf16 (the dequantized MXFP8 values) and dY go through one two-axis qdq pass, and
``gemm_predq.WGRAD_GEMM = "cute"`` (the default; $TILEKERNELS_MOE_WGRAD=torch gives back torch._grouped_mm + copy)
runs the wgrads on cute_gemm_bf16 (no output copy, at any tokens per expert).

grouped_linear's precision "bf16" (no quantization) takes torch._grouped_mm on the operands as given for
all three GEMMs (``gemm_predq.torch_gemm_into``: any group sizes, no host sync): H200, M=16384, K=7168,
N=4096, G=8 (tk-bench, session 13): fwd 1.51 ms, fwd+bwd 4.66, against 19.9 / 61.1 on the torch reference.

The MXFP8 GEMMs follow the recipe of ``reference.py``: every operand quantized along that
GEMM's own reduction dim (weights per call: rowwise for the forward, columnwise along N for
dgrad). ``m_splits`` may live on the CPU or the GPU: the kernels read cumulative offsets on
the device (one ``cumsum`` launch), so with a GPU ``m_splits`` the whole MLP, forward and
backward, runs without a host sync and can be captured in a CUDA graph.

Intermediates of grouped_mlp_mxfp8 (OPS.md): h = the FC1 accumulators in fp32 (the saved
scratch), the SwiGLU output quantized from fp32, and in backward dA (FC2 dgrad) in fp32,
quantized after the dSwiGLU; dprobs in fp32.
"""
from __future__ import annotations


import torch

from tilekernels._glue import aligned16, env_choice, env_flag, kernel, on_device

from . import cute_quantize as cq
from . import cute_swiglu as cs
from . import gemm_predq as pq

_E4M3 = torch.float8_e4m3fn
_GG = []


def _gemm():
    """The grouped GEMM module, imported on first use (the element-wise backends do not need it)."""
    if not _GG:
        from . import cute_grouped_gemm
        _GG.append(cute_grouped_gemm)
    return _GG[0]
_U8 = torch.uint8
BLOCK = 32


def _offsets(m_splits: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[G+1] int64 cumulative group offsets on ``device`` (no host sync for a GPU m_splits;
    a CPU m_splits is copied without waiting for the GPU)."""
    m = on_device(m_splits, device, "grouped MXFP8 (cute): m_splits")
    off = torch.zeros(m.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(m, 0, out=off[1:])
    return off


def _quant(x: torch.Tensor, row: bool, col: bool) -> tuple:
    """MXFP8 of x [R, K] (one pass): (row_data, row_scales) and/or (col_data, col_scales)."""
    R, K = x.shape
    rd = rs = cd = cs_ = None
    if row:
        rd = torch.empty(R, K, dtype=_E4M3, device=x.device)
        rs = torch.empty(R, K // BLOCK, dtype=_U8, device=x.device)
    if col:
        cd = torch.empty(R, K, dtype=_E4M3, device=x.device)
        cs_ = torch.empty(R // BLOCK, K, dtype=_U8, device=x.device)
    cq.quantize_into(x, rd, rs, cd, cs_)
    return tuple(t for t in (rd, rs, cd, cs_) if t is not None)


def _quant_weight(w: torch.Tensor, columnwise: bool) -> tuple:
    """w [G, N, K] -> (data [G, N, K], scales [G, N, K/32]) rowwise, or scales [G, N/32, K]
    columnwise along N (N % 32 == 0, so no block straddles two experts)."""
    G, N, K = w.shape
    d, s = _quant(w.reshape(G * N, K), not columnwise, columnwise)
    shape = (G, N // BLOCK, K) if columnwise else (G, N, K // BLOCK)
    return d.view(G, N, K), s.view(shape)


# ---------------------------------------------------------------- GEMM path

GEMM_KERNELS = ("auto", "predq", "dq")
# "auto" takes predq on sm_90 (bf16 outputs: torch._grouped_mm; fp32: see PREDQ_FP32_DEFAULT).
# H200, fused MLP through the registry, one run (benchmarks/results/h200-moe-mlp.json (in git history at 892cfc8),
# fwd / bwd ms): G=8 x 4096, H=7168, F=2048 5.17 / 10.49 against every GEMM on dq 7.55 / 13.62; G=32 x 1024,
# H=4096, F=1536 3.21 / 6.30 against 3.80 / 6.57. False gives back the mainloop-dequant kernel
# everywhere.
PREDQ_DEFAULT = True
# "auto" also takes predq for fp32 outputs (fwd / dgrad: cute_gemm_bf16). H200
# (benchmarks/results/h200-moe-gemm-bf16.txt): G=8 x 4096 tokens, H=7168, F=2048, FC1 fwd 693-700
# TFLOP/s, FC2 dgrad 638-681 against the dq kernel's 418 / 455 with fp32 out; fused MLP fwd / bwd
# 5.36 / 10.70 ms against 6.91 / 11.01 with this False (G=32 x 1024, H=4096, F=1536: 3.24 / 6.46
# against 3.71 / 6.57). False keeps fp32 outputs on dq.
PREDQ_FP32_DEFAULT = True
_GEMM_KERNEL = [env_choice("TILEKERNELS_MOE_GEMM", "auto", GEMM_KERNELS)]
# On the predq path, an operand that is quantized only to be dequantized again (the bf16
# weights every call, x) goes through one quantize-dequantize pass (cute_qdq: bf16 in, the
# same bf16 values out, so every GEMM gets bitwise the operands it got before) instead of
# quantize + dequantize: 4 bytes moved per element instead of ~6, one launch instead of two.
# H200, fused MLP fwd / bwd ms (benchmarks/results/h200-moe-mlp-profile.txt, run 2): G=32 x 1024,
# H=4096, F=1536: 2.780 / 6.011 against 3.189 / 6.629 off; G=8 x 4096, H=7168, F=2048: 4.959 /
# 10.113 against 5.161 / 10.319. $TILEKERNELS_MOE_QDQ=0 turns it off at import.
QDQ = env_flag("TILEKERNELS_MOE_QDQ", True)
# With QDQ, the fused MLP's kernels whose MXFP8 outputs feed only bf16 GEMMs (the SwiGLU fwd / bwd
# kernels: a, dh both ways, a columnwise) write those values' bf16 dequantization directly
# (cute_swiglu's bf16 outputs, bitwise the same), and dY goes through cute_qdq (rowwise and
# columnwise from one read) instead of quantize + two dequantize passes. Same GEMM operands, so the
# same results bit for bit. H200, fused MLP fwd+bwd step ms (benchmarks/results/h200-moe-mlp-profile.txt,
# round 2; the non-GEMM kernels of a step in its profile): G=8 x 4096, H=7168, F=2048: 14.755 against
# 15.228 off (2669 against 3090 us); G=32 x 1024, H=4096, F=1536: 8.495 against 8.520 (2431 against
# 2707 us; call 1, dY through two single-axis qdq passes: 8.220 against 8.605). The backward takes it
# only where all four of its GEMMs are predq. $TILEKERNELS_MOE_QDQ_OUT=0 turns it off.
QDQ_OUT = env_flag("TILEKERNELS_MOE_QDQ_OUT", True)


def set_gemm_kernel(name: str) -> str:
    """Select the MXFP8 GEMM path ("auto", "predq" or "dq") for later calls; returns the old one."""
    if name not in GEMM_KERNELS:
        raise ValueError(f"grouped MXFP8 (cute): kernel must be one of {GEMM_KERNELS}, got {name!r}")
    old, _GEMM_KERNEL[0] = _GEMM_KERNEL[0], name
    return old


def gemm_choice(out_dtype: torch.dtype, device: torch.device, variant: str = "fwd",
                tokens_per_group: float = float("inf")) -> tuple[str, str]:
    """(kernel, reason): the GEMM path of one call; ``tokens_per_group`` = M / G (host-known)."""
    want = _GEMM_KERNEL[0]
    if want == "dq":
        return "dq", "kernel='dq' selected"
    if want == "auto" and not PREDQ_DEFAULT:
        return "dq", "auto: the mainloop-dequant kernel is the default"
    ok, why = pq.supported(out_dtype, device, variant)
    if not ok:
        return "dq", f"predq not possible ({why}): the mainloop-dequant kernel"
    if want == "auto" and out_dtype == torch.float32 and not PREDQ_FP32_DEFAULT:
        return "dq", "auto: fp32 outputs take the mainloop-dequant kernel (PREDQ_FP32_DEFAULT off)"
    if want == "auto" and variant == "wgrad" and pq.WGRAD_GEMM == "torch" and tokens_per_group < pq.WGRAD_MIN_TOKENS:
        return "dq", (f"auto: wgrad with {tokens_per_group:.0f} < {pq.WGRAD_MIN_TOKENS} tokens per expert "
                      "(copying the [G, N, K] output costs more than the faster GEMM saves)")
    return "predq", why


def _gemm_into(variant: str, a, a_s, b, b_s, off, out) -> None:
    """One MXFP8 grouped GEMM (``cute_grouped_gemm``'s arguments) through ``gemm_choice``."""
    if gemm_choice(out.dtype, out.device, variant, a.shape[0] / max(off.shape[0] - 1, 1))[0] == "predq":
        pq.INTO[variant](a, a_s, b, b_s, off, out)
    else:
        getattr(_gemm(), f"gemm_{variant}_into")(a, a_s, b, b_s, off, out)


# ---------------------------------------------------------------- mxfp8_quantize / dequantize


@kernel("mxfp8_quantize", "cute", "fwd")
def _quantize_fwd(x, row_data, row_scales, col_data, col_scales, axis):
    cq.quantize_into(x, row_data, row_scales, col_data, col_scales)


@kernel("mxfp8_dequantize", "cute", "fwd")
def _dequantize_fwd(data, scales, out, axis, out_dtype):
    cq.dequantize_into(data, scales, out, axis)


# ---------------------------------------------------------------- scaled_swiglu


@kernel("scaled_swiglu", "cute", "fwd")
def _swiglu_fwd(h, probs, out, s):
    cs.swiglu_fwd_into(h, probs, out, s)


@kernel("scaled_swiglu", "cute", "bwd")
def _swiglu_bwd(dout, h, probs, dh, dprobs, s):
    cs.swiglu_bwd_into(dout, h, probs, dh, dprobs, s)


# ---------------------------------------------------------------- grouped_linear (mxfp8)


def _qdq_path(variant: str, out: torch.Tensor, M: int, G: int) -> bool:
    """Whether a GEMM takes its operands through cute_qdq (``QDQ`` and the predq path)."""
    return QDQ and gemm_choice(out.dtype, out.device, variant, M / max(G, 1))[0] == "predq"


def _qdq(t: torch.Tensor, axis: str) -> torch.Tensor:
    from . import cute_qdq

    return cute_qdq.qdq(t, axis)


def _qdq_both(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from . import cute_qdq

    return cute_qdq.qdq_both(t)


def _weight(weight: torch.Tensor, scales) -> "torch.Tensor | tuple":
    """A grouped weight as this module's GEMM helpers take it: a bf16 master [G, N, K], or a
    pre-quantized one as (data e4m3 [G, N, K], rowwise scales [G, N, K/32])."""
    return weight if scales is None else (weight, scales)


def _weight_value(weight) -> torch.Tensor:
    """A pre-quantized weight's value as bf16 [G, N, K] (one dequantize pass: exact, but for
    blocks with a scale below 2^-124, whose values bf16 rounds as it does a master's)."""
    d, s = weight
    G, N, K = d.shape
    return pq.dequant(d.view(G * N, K), s.view(G * N, K // BLOCK), "rowwise").view(G, N, K)


def _weight_bf16(variant: str, ab: torch.Tensor, weight, off, out) -> None:
    """The bf16 GEMM of ``variant`` on ab [M, .] bf16 (already qdq'd) and the qdq'd weight
    (rowwise for fwd, columnwise along N for dgrad). M = 0: out is empty, so no weight pass.
    A pre-quantized weight (``_weight``) is dequantized: that is its rowwise qdq already (an
    MXFP8 value quantizes to itself along its own blocks); dgrad qdq's it columnwise."""
    if ab.shape[0] == 0:
        return
    if isinstance(weight, tuple):
        wb = _weight_value(weight)
        if variant == "dgrad":
            G, N, K = wb.shape
            wb = _qdq(wb.view(G * N, K), "columnwise").view(G, N, K)
    else:
        G, N, K = weight.shape
        wb = _qdq(weight.reshape(G * N, K), "columnwise" if variant == "dgrad" else "rowwise").view(G, N, K)
    pq.bf16_gemm_into(variant, ab, wb, off, out)


def _weight_gemm(variant: str, a, weight, off, out) -> None:
    """fwd: out [M, N] = MX_K(a) . MX_K(W_g)^T; dgrad: out [M, K] = MX_N(a) . MX_N(W_g), per
    group. ``a``: the raw [M, .] operand (quantized rowwise here) or its MXFP8 (data, scales);
    ``weight``: a master or a pre-quantized (data, scales) pair (``_weight``)."""
    G = (weight[0] if isinstance(weight, tuple) else weight).shape[0]
    raw = isinstance(a, torch.Tensor)
    M = (a if raw else a[0]).shape[0]
    if _qdq_path(variant, out, M, G):
        _weight_bf16(variant, _qdq(a, "rowwise") if raw else pq.dequant(*a, "rowwise"), weight, off, out)
        return
    ad, as_ = _quant(a, True, False) if raw else a
    if isinstance(weight, tuple) and variant == "fwd":
        wd, ws = weight                                       # MXFP8 along K already
    else:
        wv = _weight_value(weight) if isinstance(weight, tuple) else weight
        wd, ws = _quant_weight(wv, columnwise=variant == "dgrad")
    _gemm_into(variant, ad, as_, wd, ws, off, out)


def linear_fwd(x, weight, off, y) -> None:
    """y [M, N] = MX_K(x) . MX_K(W_g)^T per group."""
    _weight_gemm("fwd", x, weight, off, y)


def linear_bwd(dy_row, dy_col, x, weight, off, dx, dweight) -> None:
    """dx = MX_N(dY) . MX_N(W_g); dW_g = MX_tok(dY_g)^T . MX_tok(X_g) (dY quantized: (data,
    scales) pairs; x raw [M, K], quantized columnwise here). dweight None: no wgrad (a
    pre-quantized weight)."""
    _weight_gemm("dgrad", dy_row, weight, off, dx)
    if dweight is None:
        return
    if _qdq_path("wgrad", dweight, x.shape[0], off.shape[0] - 1):
        pq.bf16_gemm_into("wgrad", pq.dequant(*dy_col, "columnwise"), _qdq(x, "columnwise"), off, dweight)
        return
    _gemm_into("wgrad", *dy_col, *_quant(x, False, True), off, dweight)


# precision "bf16": the operands as given (no quantization), every GEMM on torch._grouped_mm with bf16
# operands and fp32 accumulation (gemm_predq.torch_gemm_into: any group sizes, splits read on the device)


@kernel("grouped_linear", "cute", "fwd")
def _grouped_linear_fwd(x, weight, m_splits, y, precision):
    off = _offsets(m_splits, x.device)
    if precision == "bf16":
        pq.torch_gemm_into("fwd", aligned16(x), aligned16(weight), off, y)  # TMA operands
        return
    linear_fwd(x, weight, off, y)


@kernel("grouped_linear", "cute", "bwd", skips=("weight",))
def _grouped_linear_bwd(dy, x, weight, m_splits, dx, dweight, precision):
    """dweight None (a frozen weight autograd needs no gradient of): no wgrad GEMM and no columnwise x
    (only the wgrad reads it); dx takes the route and the dY passes it takes with a dweight (the same
    kernels, so bitwise the same dx)."""
    off = _offsets(m_splits, dy.device)
    if precision == "bf16":
        dy, x, weight = aligned16(dy), aligned16(x), aligned16(weight)  # torch._grouped_mm refuses others
        pq.torch_gemm_into("dgrad", dy, weight, off, dx)
        if dweight is not None:
            pq.torch_gemm_into("wgrad", dy, x, off, dweight)
        return
    M, G = dy.shape[0], weight.shape[0]
    if QDQ_OUT and _qdq_path("dgrad", dx, M, G) and _qdq_path("wgrad", _wgrad_like(dweight, weight), M, G):
        # both GEMMs on bf16 operands: dY qdq'd both ways from one read (as the MLP's backward),
        # not quantized both ways and then dequantized twice; the same operand values
        dy_row, dy_col = _qdq_both(dy)
        _weight_bf16("dgrad", dy_row, weight, off, dx)
        del dy_row
        if dweight is not None:
            pq.bf16_gemm_into("wgrad", dy_col, _qdq(x, "columnwise"), off, dweight)
        return
    q = _quant(dy, True, True)
    linear_bwd(q[:2], q[2:], x, weight, off, dx, dweight)


# ---------------------------------------------------------------- grouped_mlp_mxfp8


@kernel("grouped_mlp_mxfp8", "cute", "fwd")
def _mlp_fwd(x, probs, m_splits, fc1_weight, fc2_weight, s1, s2, y, h, quantize):
    M, G = x.shape[0], fc1_weight.shape[0]
    F = fc2_weight.shape[2]
    off = _offsets(m_splits, x.device)
    fc1_weight, fc2_weight = _weight(fc1_weight, s1), _weight(fc2_weight, s2)
    linear_fwd(x, fc1_weight, off, h)                         # h [M, 2F] fp32: FC1 accumulators
    if QDQ_OUT and _qdq_path("fwd", y, M, G):
        a = torch.empty(M, F, dtype=torch.bfloat16, device=x.device)
        cs.swiglu_quant_fwd_into(h, probs, a, None)           # dequantize(MXFP8(a)) in bf16
        _weight_bf16("fwd", a, fc2_weight, off, y)
        return
    ad = torch.empty(M, F, dtype=_E4M3, device=x.device)
    as_ = torch.empty(M, F // BLOCK, dtype=_U8, device=x.device)
    cs.swiglu_quant_fwd_into(h, probs, ad, as_)               # MXFP8(silu(gate) * linear * probs)
    _weight_gemm("fwd", (ad, as_), fc2_weight, off, y)


def _wgrad_like(d, w):
    """What a wgrad's route is chosen by: its gradient; for a frozen master weight (bf16, no gradient
    asked) the weight itself (the gradient's dtype and device), so the backward takes the route it
    takes with the gradient; None for a pre-quantized weight (no wgrad, none of its passes)."""
    return d if d is not None or w.dtype == _E4M3 else w


@kernel("grouped_mlp_mxfp8", "cute", "bwd", skips=("fc1_weight", "fc2_weight"))
def _mlp_bwd(dy, x, probs, m_splits, fc1_weight, fc2_weight, s1, s2, h, dx, dprobs, dfc1, dfc2, quantize):
    """dfc1 / dfc2 None: no wgrad GEMM for that weight. A pre-quantized weight also drops the passes
    that make its wgrad's operands. A frozen master weight (bf16, its gradient not asked for) keeps
    every pass another result reads (dY both ways, the dSwiGLU kernel with its columnwise a), so
    those results come from the same kernel variants as with its gradient (bitwise the same); it
    drops only its wgrad GEMM and, for fc1, the columnwise x that only that GEMM reads."""
    M, G = x.shape[0], fc1_weight.shape[0]
    F = fc2_weight.shape[2]
    dev = dy.device
    off = _offsets(m_splits, dev)
    w1, w2 = _wgrad_like(dfc1, fc1_weight), _wgrad_like(dfc2, fc2_weight)
    fc1_weight, fc2_weight = _weight(fc1_weight, s1), _weight(fc2_weight, s2)
    da = torch.empty(M, F, dtype=torch.float32, device=dev)
    if QDQ_OUT and all(_qdq_path(v, o, M, G) for v, o in (("dgrad", da), ("wgrad", w2), ("dgrad", dx),
                                                             ("wgrad", w1)) if o is not None):
        _mlp_bwd_bf16(dy, x, probs, fc1_weight, fc2_weight, h, dx, dprobs, dfc1, dfc2, off, da, w2 is not None)
        return
    dyq = _quant(dy, True, w2 is not None)                    # columnwise only for the FC2 wgrad
    _weight_gemm("dgrad", dyq[:2], fc2_weight, off, da)       # dA: FC2 dgrad accumulators, fp32
    e = dict(device=dev)
    dh = (torch.empty(M, 2 * F, dtype=_E4M3, **e), torch.empty(M, 2 * F // BLOCK, dtype=_U8, **e),
          torch.empty(M, 2 * F, dtype=_E4M3, **e), torch.empty(M // BLOCK, 2 * F, dtype=_U8, **e))
    a_col = (None, None) if w2 is None else (torch.empty(M, F, dtype=_E4M3, **e),
                                             torch.empty(M // BLOCK, F, dtype=_U8, **e))
    cs.swiglu_quant_bwd_into(da, h, probs, *dh, dprobs, *a_col)
    if dfc2 is not None:
        _gemm_into("wgrad", *dyq[2:], *a_col, off, dfc2)
    linear_bwd(dh[:2], dh[2:], x, fc1_weight, off, dx, dfc1)


def _mlp_bwd_bf16(dy, x, probs, fc1_weight, fc2_weight, h, dx, dprobs, dfc1, dfc2, off, da, col2) -> None:
    """grouped_mlp_mxfp8's backward with every GEMM on bf16 operands (``QDQ_OUT``): dY qdq'd both
    ways, the dSwiGLU kernel writing dh (both ways) and a (columnwise) as dequantized bf16; the
    same operand values as the MXFP8 path, so the same results bit for bit. A None dfc1 /
    dfc2 skips its wgrad; ``col2`` False (fc2 pre-quantized) also skips the columnwise operands
    of FC2's wgrad."""
    M, F = da.shape
    bf = dict(dtype=torch.bfloat16, device=dy.device)
    if not col2:
        dy_row, dy_col = _qdq(dy, "rowwise"), None
    else:
        dy_row, dy_col = _qdq_both(dy)
    _weight_bf16("dgrad", dy_row, fc2_weight, off, da)                    # dA, fp32
    del dy_row
    dh_row, dh_col = torch.empty(M, 2 * F, **bf), torch.empty(M, 2 * F, **bf)
    a_col = torch.empty(M, F, **bf) if col2 else None
    cs.swiglu_quant_bwd_into(da, h, probs, dh_row, None, dh_col, None, dprobs, a_col, None)
    if dfc2 is not None:
        pq.bf16_gemm_into("wgrad", dy_col, a_col, off, dfc2)
    del dy_col, a_col
    _weight_bf16("dgrad", dh_row, fc1_weight, off, dx)
    if dfc1 is not None:
        pq.bf16_gemm_into("wgrad", dh_col, _qdq(x, "columnwise"), off, dfc1)
