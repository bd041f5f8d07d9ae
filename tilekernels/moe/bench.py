"""tk-bench cases for the grouped MoE MLP (MXFP8) family.

Headline (CUDA): a DeepSeek-like expert layer as Transformer Engine runs it:
G=8 experts, M=16384 tokens split evenly (2048 each, % 32), H=7168, F=2048
(FC1 is [2F=4096, H], FC2 is [H, F]). mxfp8_quantize / dequantize on [16384, 7168],
scaled_swiglu on the FC1 output [16384, 4096] with s=32. CPU: small shapes.

Bytes count every input read once and every output written once (bf16 = 2,
fp32 = 4, e4m3 / E8M0 = 1 byte; m_splits 8 bytes per expert); flops count the
GEMMs only (2 per multiply-add), fwd 2*M*N*K per grouped GEMM, bwd twice that.
"""
from __future__ import annotations

import torch

from tilekernels.benchcase import BenchCase, Peer

from . import reference as ref


def even_splits(M: int, G: int) -> torch.Tensor:
    """[G] int64 tokens per expert on the host, as even as possible in multiples of 32."""
    base = (M // G) // 32 * 32
    s = [base] * G
    s[-1] += M - base * G
    return torch.tensor(s, dtype=torch.int64)


def _quantize_inputs(d, device):
    return (torch.randn(d["R"], d["K"], device=device).to(torch.bfloat16),), {"axis": "both"}


def _dequantize_inputs(d, device):
    x = torch.randn(d["R"], d["K"], device=device).to(torch.bfloat16)
    from tilekernels.moe.mxfp8 import quantize_rowwise

    return quantize_rowwise(x), {"axis": "rowwise", "out_dtype": "bfloat16"}


def _linear_maker(precision):
    def make(d, device):
        x = torch.randn(d["M"], d["K"], device=device).to(torch.bfloat16)
        w = (torch.randn(d["G"], d["N"], d["K"], device=device) / d["K"] ** 0.5).to(torch.bfloat16)
        return (x, w, even_splits(d["M"], d["G"])), {"precision": precision}
    return make


def _swiglu_inputs(d, device):
    h = torch.randn(d["M"], 2 * d["F"], device=device).to(torch.bfloat16)
    return (h, torch.rand(d["M"], device=device)), {"glu_interleave_size": 32}


def _mlp_inputs(d, device):
    M, H, F, G = d["M"], d["H"], d["F"], d["G"]
    x = torch.randn(M, H, device=device).to(torch.bfloat16)
    probs = torch.rand(M, device=device)
    w1 = (torch.randn(G, 2 * F, H, device=device) / H ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(G, H, F, device=device) / F ** 0.5).to(torch.bfloat16)
    return (x, probs, even_splits(M, G), w1, w2), {}


# ---------------------------------------------------------------- peers (issue 11's reference points)


def _ends32(m_splits: torch.Tensor, device) -> torch.Tensor:
    """torch._grouped_mm's offsets: [G] int32 group ends on the device."""
    return torch.cumsum(m_splits.to(device), 0).to(torch.int32)


def bf16_mlp(x, probs, ends, w1, w2):
    """The torch bf16 MoE MLP: torch._grouped_mm (FC1) + the reference's scaled SwiGLU (s = 32,
    fp32 math, rounded to bf16) + torch._grouped_mm (FC2); differentiable through torch's autograd."""
    h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=ends)
    a = ref.scaled_swiglu(h, probs, ref.MLP_GLU_INTERLEAVE)
    return torch._grouped_mm(a, w2.transpose(-2, -1), offs=ends)


def fp8_rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 data and fp32 per-row scales (amax / 448) of t [..., K]: torch's fp8 rowwise recipe
    (not MXFP8: one scale per row instead of one per 32 elements)."""
    s = t.float().abs().amax(dim=-1).clamp(min=1e-12) / 448.0
    return (t.float() / s[..., None]).to(torch.float8_e4m3fn), s


def _bf16_linear_peer(args, params):
    x, w, m = args
    ends = _ends32(m, x.device)
    return lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)


def _fp8row_linear_peer(args, params):
    x, w, m = args
    ends = _ends32(m, x.device)
    (xq, xs), (wq, ws) = fp8_rowwise(x.detach()), fp8_rowwise(w.detach())
    return lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), xs, ws, offs=ends, out_dtype=torch.bfloat16)


def _bf16_mlp_peer(args, params):
    x, probs, m, w1, w2 = args
    ends = _ends32(m, x.device)
    return lambda: bf16_mlp(x, probs, ends, w1, w2)


def fp8row_mlp_peer(args, params):
    """The MLP's two forward GEMMs in torch's fp8 rowwise grouped GEMM, operands pre-quantized
    (FC2's input a random [M, F] stand-in: only the GEMM time is the reference point)."""
    x, probs, m, w1, w2 = args
    ends = _ends32(m, x.device)
    (xq, xs), (w1q, w1s), (w2q, w2s) = fp8_rowwise(x.detach()), fp8_rowwise(w1.detach()), fp8_rowwise(w2.detach())
    aq, as_ = fp8_rowwise(torch.randn(x.shape[0], w2.shape[2], device=x.device))

    def run():
        torch._scaled_grouped_mm(xq, w1q.transpose(-2, -1), xs, w1s, offs=ends, out_dtype=torch.bfloat16)
        return torch._scaled_grouped_mm(aq, w2q.transpose(-2, -1), as_, w2s, offs=ends, out_dtype=torch.bfloat16)
    return run


_FP8_NOTE = "GEMMs only, operands quantized beforehand, per-row scales (not MXFP8)"
LINEAR_PEERS = (Peer("bf16 grouped_mm", _bf16_linear_peer, note="torch._grouped_mm, bf16 operands"),
                Peer("fp8row", _fp8row_linear_peer, backward=False, note=_FP8_NOTE))
MLP_PEERS = (Peer("bf16 path", _bf16_mlp_peer, note="torch._grouped_mm + SwiGLU + torch._grouped_mm, autograd"),
             Peer("fp8row", fp8row_mlp_peer, backward=False, note=_FP8_NOTE))


def _linear_case(dims, precision) -> BenchCase:
    return BenchCase(
        op="grouped_linear", dims=dims, make=_linear_maker(precision), variant=precision,
        # fwd: read x [M,K], weight [G,N,K], m_splits; write y [M,N] (all bf16)
        bytes_fwd=lambda d: 2 * d["M"] * d["K"] + 2 * d["G"] * d["N"] * d["K"] + 8 * d["G"] + 2 * d["M"] * d["N"],
        # bwd: read dy, x, weight; write dx, dweight
        bytes_bwd=lambda d: 2 * d["M"] * d["N"] + 2 * 2 * d["M"] * d["K"] + 2 * 2 * d["G"] * d["N"] * d["K"],
        flops_fwd=lambda d: 2 * d["M"] * d["N"] * d["K"],
        flops_bwd=lambda d: 4 * d["M"] * d["N"] * d["K"],   # dgrad + wgrad
        grad_inputs=("x", "weight"),
        peers=LINEAR_PEERS if precision == "mxfp8" else (),
    )


def cases(device_type: str) -> list[BenchCase]:
    big = device_type == "cuda"
    M, H, F, G = (16384, 7168, 2048, 8) if big else (192, 256, 256, 3)
    quant = {"R": M, "K": H}
    fc1 = {"M": M, "K": H, "N": 2 * F, "G": G}
    mlp = {"M": M, "H": H, "F": F, "G": G}
    return [
        BenchCase(
            op="mxfp8_quantize", dims=quant, make=_quantize_inputs, variant="both",
            # read x (bf16); write rowwise + columnwise data (1 B each) and scales (1 B per 32)
            bytes_fwd=lambda d: 2 * d["R"] * d["K"] + 2 * (d["R"] * d["K"] + d["R"] * d["K"] // 32),
        ),
        BenchCase(
            op="mxfp8_dequantize", dims=quant, make=_dequantize_inputs, variant="rowwise",
            # read data + scales; write bf16
            bytes_fwd=lambda d: d["R"] * d["K"] + d["R"] * d["K"] // 32 + 2 * d["R"] * d["K"],
            dtype="float8_e4m3fn",
        ),
        _linear_case(fc1, "bf16"),
        _linear_case(fc1, "mxfp8"),
        BenchCase(
            op="scaled_swiglu", dims={"M": M, "F": F}, make=_swiglu_inputs, variant="s=32",
            # fwd: read h [M,2F] bf16 + probs fp32; write out [M,F] bf16
            bytes_fwd=lambda d: 2 * d["M"] * 2 * d["F"] + 4 * d["M"] + 2 * d["M"] * d["F"],
            # bwd: read dout [M,F], h, probs; write dh [M,2F], dprobs
            bytes_bwd=lambda d: 2 * d["M"] * d["F"] + 2 * 2 * d["M"] * 2 * d["F"] + 2 * 4 * d["M"],
            grad_inputs=("h", "probs"),
        ),
        BenchCase(
            op="grouped_mlp_mxfp8", dims=mlp, make=_mlp_inputs,
            # fwd: read x, probs, m_splits, fc1 [G,2F,H], fc2 [G,H,F]; write y and the saved
            # fp32 FC1 output h [M,2F]
            bytes_fwd=lambda d: (2 * d["M"] * d["H"] + 4 * d["M"] + 8 * d["G"] + 2 * 3 * d["G"] * d["F"] * d["H"]
                                 + 2 * d["M"] * d["H"] + 4 * d["M"] * 2 * d["F"]),
            # bwd: read dy, x, probs, fc1, fc2, h; write dx, dprobs, dfc1, dfc2
            bytes_bwd=lambda d: (2 * 2 * d["M"] * d["H"] + 2 * 4 * d["M"] + 2 * 2 * 3 * d["G"] * d["F"] * d["H"]
                                 + 2 * d["M"] * d["H"] + 4 * d["M"] * 2 * d["F"]),
            # FC1 2*M*2F*H + FC2 2*M*H*F = 6*M*H*F; backward twice that
            flops_fwd=lambda d: 6 * d["M"] * d["H"] * d["F"],
            flops_bwd=lambda d: 12 * d["M"] * d["H"] * d["F"],
            grad_inputs=("x", "probs", "fc1_weight", "fc2_weight"),
            peers=MLP_PEERS,
        ),
    ]
