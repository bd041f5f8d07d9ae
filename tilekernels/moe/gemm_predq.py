"""MXFP8 grouped GEMMs as "dequantize once, then a bf16 grouped GEMM" (``kernel="predq"``).

Hopper has no block-scaled MMA. The mainloop-dequant kernel of ``cute_grouped_gemm.py``
(``kernel="dq"``) spends its CUDA cores on the e4m3 -> bf16 conversion of every tile it
reads (every operand tile is re-read ``cdiv(other dim, tile)`` times) and runs at 56-65% of
torch's bf16 grouped GEMM. This path instead dequantizes each operand once, in a
bandwidth pass (``cute_quantize.dequantize_into``: 1 byte + 1/32 scale byte read, 2 bytes
written per element), and hands the bf16 operands to a bf16 grouped GEMM with fp32
accumulation:

* bf16 output: ``torch._grouped_mm`` (CUTLASS sm_90 grouped GEMM, TMA + warp-specialized
  wgmma, bf16 out), its result copied into ``out``;
* fp32 output (the fused MLP's h = FC1 fwd and dA = FC2 dgrad, OPS.md), fwd / dgrad only
  (and bf16 outputs of fwd / dgrad too with ``BF16_OUT_GEMM = "cute"``):
  ``cute_gemm_bf16`` (our CuTe DSL TMA + warp-specialized wgmma grouped GEMM), which writes
  fp32 straight into ``out`` (no copy). H200, G=8 x 4096 tokens, H=7168, F=2048: FC1 fwd
  693-700 TFLOP/s, FC2 dgrad 638-681, against 418 / 455 for ``kernel="dq"`` with fp32 out
  (benchmarks/results/h200-moe-gemm-bf16.txt). An fp32 wgrad output stays on dq (this module's
  wgrads are wired for bf16 dW only);
* bf16 wgrad: ``cute_gemm_bf16``'s wgrad variant (``WGRAD_GEMM = "cute"``, the default: no
  [G, N, K] output copy) or torch._grouped_mm + copy (``"torch"``).

Exactness: e4m3 x 2^(e-127) is a bf16 value unless it falls below bf16's normal range
(where the dequantize kernel rounds to nearest even, as the mainloop kernel does); a 0xFF
scale makes its whole block NaN. The products of two bf16 values are exact in the tensor
cores' fp32 accumulation, so this path computes the same math as ``kernel="dq"``: the two
differ only in the fp32 summation order and the final bf16 rounding.

Entry points mirror ``cute_grouped_gemm``'s (same arguments, ``offsets`` [G+1] int32/int64
cumulative, on the device; nothing read on the host, so a call can be captured in a CUDA
graph):

=======  ============================  ===========================  ======================
variant  out                           A                            B
=======  ============================  ===========================  ======================
fwd      y [M, N] bf16 / fp32          x [M, K] rowwise             W [G, N, K] rowwise
dgrad    dX [M, K] bf16 / fp32         dY [M, N] rowwise            W [G, N, K] col. (N)
wgrad    dW [G, N, K] bf16             dY [M, N] columnwise         X [M, K] columnwise
=======  ============================  ===========================  ======================

``torch._grouped_mm`` has no ``out=``: its result is copied into ``out`` (one read + one
write of the output, at copy bandwidth). Transient memory per call (bf16): fwd
2 (M K + G N K + M N) bytes, dgrad 2 (M N + G N K + M K), wgrad 2 (M N + M K + G N K); an
fp32 output (cute_gemm_bf16) needs no M N / M K term.
Empty groups: on sm_90 torch writes zeros for a wgrad group with no tokens (checked on the
H200 with the allocator's blocks NaN-filled first: benchmarks/probes/grouped_mm_edges.py and
the GPU tests) and never touches rows of an empty fwd/dgrad group (it has none).

Cost model (H200, moe.md): the dequant passes and the copy move about 3 (M K + G N K) + 4 M N
bytes (fwd) against the mainloop kernel's ~60% of torch's GEMM rate, so predq wins wherever
the output is small beside the work. A wgrad's output [G, N, K] does not shrink with the
tokens: at 1024 tokens per expert (G=32, H=4096, F=1536) the copy eats the gain and predq
was slower, so with ``WGRAD_GEMM = "torch"`` ``cute_kernels.gemm_choice`` keeps wgrad on dq below
``WGRAD_MIN_TOKENS`` tokens per expert (a host-known ratio M / G, no sync). ``cute_gemm_bf16``'s
wgrad (``WGRAD_GEMM = "cute"``, the default) writes dW in place: no copy, predq at any tokens.

Limits (``supported``): a bf16 output, or an fp32 output of fwd / dgrad; a CUDA sm_90 device
(the CUTLASS path of torch and our sm_90a kernel; elsewhere torch may fall back to a per-group
loop that reads the offsets on the host); torch with ``_grouped_mm`` for bf16 outputs. Operand
strides are multiples of 16 bytes (N, K % 32 == 0), A row-major in fwd/dgrad and column-major
in wgrad, so torch's device-side alignment check on the ragged dimension never applies and
fwd / dgrad take groups of any size (zero included). wgrad needs every group a multiple of 32
tokens (zero included): cute_gemm_bf16 sums 32-token k-tiles inside a group, and the MXFP8
columnwise operands it consumes exist only then (the spec's ``m_splits % 32`` constraint on the
ops that reach it; with m_splits on the GPU nothing here can check it without a sync).
"""
from __future__ import annotations


import torch

from tilekernels._glue import env_choice, needs_sm90

from . import cute_quantize as cq

BF, F32 = torch.bfloat16, torch.float32
VARIANTS = ("fwd", "dgrad", "wgrad")
# wgrad takes predq from this many tokens per expert (M / G) up: measured faster at 4096
# (G=8, H=7168, F=2048), slower at 1024 (G=32, H=4096, F=1536)
WGRAD_MIN_TOKENS = 2048
# which bf16 grouped GEMM serves a bf16 output of fwd / dgrad: "torch" (torch._grouped_mm, its
# result copied into out) or "cute" (cute_gemm_bf16, writing out directly);
# $TILEKERNELS_MOE_BF16_OUT sets it at import. fp32 outputs always take cute_gemm_bf16. "cute" is
# correct (the MoE GPU test files pass with it) but not faster, so not the default: H200, G=8
# headline GEMMs, cute vs torch + copy: FC1 fwd 2.851 / 2.789 ms, FC2 fwd 1.674 / 1.588, FC2 dgrad
# 1.397 / 1.433, FC1 dgrad 2.925 / 2.941; fused MLP G=8 fwd 5.42 vs 5.36 ms, bwd a tie
# (benchmarks/results/h200-moe-gemm-bf16.txt). Again in session 9 (h200-moe-mlp-profile.txt, round 2):
# y / dX alone, cute (default config) vs torch + copy: G=8 1.672 / 1.634 and 3.128 / 3.046 ms, G=32
# 0.783 / 0.789 and 1.455 / 1.411 (other configs: tile_n 128, raster 16, 3 stages, no better except
# 3 stages for G=32 dX, 1.380); the fused MLP with it: fwd 0.04-0.08 ms slower at both shapes.
BF16_OUT_GEMM = env_choice("TILEKERNELS_MOE_BF16_OUT", "torch", ("torch", "cute"))
# which bf16 grouped GEMM serves wgrad (dW [G, N, K] bf16, reduction over each group's tokens):
# "torch" (torch._grouped_mm + a copy of the [G, N, K] result into out; below WGRAD_MIN_TOKENS
# tokens per expert the copy costs more than the GEMM saves, so "auto" keeps wgrad on the dq
# kernel there) or "cute" (cute_gemm_bf16's wgrad variant, writing out directly: no copy, so
# "auto" takes it at any tokens per expert). $TILEKERNELS_MOE_WGRAD sets it at import. H200,
# fused MLP bwd with QDQ (benchmarks/results/h200-moe-mlp-profile.txt, run 2): G=32 x 1024 tokens,
# H=4096, F=1536: 5.544 ms against 6.011 with "torch" (there: the dq kernel, 1.91 + 0.97 ms for the
# two wgrads against 1.35 + 0.71 on cute_gemm_bf16); G=8 x 4096, H=7168, F=2048: 9.953 against 10.113.
WGRAD_GEMM = env_choice("TILEKERNELS_MOE_WGRAD", "cute", ("torch", "cute"))


def supported(out_dtype: torch.dtype, device: torch.device, variant: str = "fwd") -> tuple[bool, str]:
    """Whether this path can compute a ``variant`` GEMM with output ``out_dtype`` on ``device``,
    and why (not)."""
    if out_dtype not in (BF, F32):
        return False, f"bf16 or fp32 outputs only, the output is {str(out_dtype).removeprefix('torch.')}"
    if out_dtype == F32 and variant == "wgrad":
        return False, ("an fp32 wgrad output: torch._grouped_mm writes bf16 only and this module "
                       "wires cute_gemm_bf16's wgrad for bf16 dW only")
    if out_dtype == BF and not hasattr(torch, "_grouped_mm"):
        return False, f"torch {torch.__version__} has no _grouped_mm"
    why = needs_sm90(device, "the sm_90 grouped GEMMs (torch's CUTLASS one, cute_gemm_bf16)")
    if why:
        return False, why
    if out_dtype == F32:
        return True, "fp32 output on sm_90: dequantize once + the bf16 TMA grouped GEMM (cute_gemm_bf16)"
    return True, "bf16 output on sm_90: dequantize once + torch._grouped_mm"


def dequant(data: torch.Tensor, scales: torch.Tensor, axis: str) -> torch.Tensor:
    """bf16 [R, C] of MXFP8 data [R, C] (e4m3 or uint8) with scales [R, C/32] ('rowwise') or
    [R/32, C] ('columnwise'): one bandwidth pass, the cute dequantize kernel's values."""
    out = torch.empty(data.shape, dtype=BF, device=data.device)
    cq.dequantize_into(data, scales, out, axis)
    return out


def ends32(offsets: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm's offsets: the [G] int32 group ends of cumulative [G+1] ``offsets``."""
    return offsets[1:].to(torch.int32)


def _bf16_kernel():
    """cute_gemm_bf16, imported on first use (it builds CuTe DSL kernels)."""
    from . import cute_gemm_bf16

    return cute_gemm_bf16


def bf16_gemm_into(variant: str, a: torch.Tensor, b: torch.Tensor, offsets, out) -> None:
    """The bf16 grouped GEMM of one variant on operands already dequantized (or qdq'd,
    ``cute_qdq``) to bf16: fwd out [M, N] = a [M, K] . b[g]^T (b [G, N, K]); dgrad out [M, K] =
    a [M, N] . b[g] (b [G, N, K]); wgrad out [G, N, K] = a_g^T . b_g (a [M, N], b [M, K], every
    group % 32 == 0; zeros for an empty group). fp32 outputs (fwd / dgrad), with
    ``BF16_OUT_GEMM = "cute"`` bf16 ones, and with ``WGRAD_GEMM = "cute"`` wgrad go to
    cute_gemm_bf16, the rest to torch._grouped_mm + a copy into ``out``."""
    if a.shape[0] == 0:
        if variant == "wgrad":
            out.zero_()
        return
    if (out.dtype == F32 or BF16_OUT_GEMM == "cute") if variant != "wgrad" else WGRAD_GEMM == "cute":
        getattr(_bf16_kernel(), f"gemm_{variant}_into")(a, b, offsets, out)
        return
    torch_gemm_into(variant, a, b, offsets, out)


def torch_gemm_into(variant: str, a: torch.Tensor, b: torch.Tensor, offsets, out) -> None:
    """bf16_gemm_into's variants on torch._grouped_mm (CUTLASS sm_90, fp32 accumulation, the group
    ends read on the device), its result copied into ``out``. Any group sizes (zero and odd ones
    measured on the H200, benchmarks/probes/grouped_mm_edges.py; an empty group's wgrad rows are
    zeros); rows of a and b 16-byte aligned (K, N multiples of 8 in bf16)."""
    if a.shape[0] == 0:
        if variant == "wgrad":
            out.zero_()
        return
    a, b = {"fwd": (a, b.transpose(-2, -1)), "dgrad": (a, b), "wgrad": (a.t(), b)}[variant]
    out.copy_(torch._grouped_mm(a, b, offs=ends32(offsets)))


def gemm_fwd_into(a_data, a_scales, b_data, b_scales, offsets, out) -> None:
    """out [M, N] bf16 / fp32 = per group g MX(a) . MX(b[g])^T; a [M, K] rowwise, b [G, N, K] rowwise."""
    M, K = a_data.shape
    G, N, _ = b_data.shape
    if M == 0:
        return
    a = dequant(a_data, a_scales, "rowwise")
    b = dequant(b_data.view(G * N, K), b_scales.view(G * N, K // 32), "rowwise").view(G, N, K)
    bf16_gemm_into("fwd", a, b, offsets, out)


def gemm_dgrad_into(dy_data, dy_scales, w_data, w_scales, offsets, out) -> None:
    """out [M, K] bf16 / fp32 = per group MX(dy) . MX(w[g]); dy [M, N] rowwise, w [G, N, K]
    columnwise along N (scales [G, N/32, K])."""
    M, N = dy_data.shape
    G, _, K = w_data.shape
    if M == 0:
        return
    a = dequant(dy_data, dy_scales, "rowwise")
    b = dequant(w_data.view(G * N, K), w_scales.view(G * N // 32, K), "columnwise").view(G, N, K)
    bf16_gemm_into("dgrad", a, b, offsets, out)


def gemm_wgrad_into(dy_data, dy_scales, x_data, x_scales, offsets, out) -> None:
    """out [G, N, K] bf16: out[g] = MX(dy_g)^T . MX(x_g) over the group's tokens, zeros for an
    empty group; dy [M, N], x [M, K] columnwise (scales [M/32, .]), every group % 32 == 0."""
    if dy_data.shape[0] == 0:
        out.zero_()
        return
    bf16_gemm_into("wgrad", dequant(dy_data, dy_scales, "columnwise"), dequant(x_data, x_scales, "columnwise"),
                   offsets, out)


INTO = {"fwd": gemm_fwd_into, "dgrad": gemm_dgrad_into, "wgrad": gemm_wgrad_into}
