"""MXFP8 (OCP MX, as Transformer Engine computes it): exact quantize / dequantize math.

Format: e4m3 data plus one E8M0 scale per block of 32 consecutive elements along
the reduction dim. The scale is a uint8 biased exponent ``e`` with value
``2^(e-127)``.

* ``k = ceil(log2(amax / 448))`` computed exactly (no float log2): with
  ``amax = m * 2^E`` (frexp, ``m`` in [0.5, 1)) and ``448 = 0.875 * 2^9``, the
  smallest ``k`` with ``amax <= 448 * 2^k`` is ``E - 9`` if ``m <= 0.875`` else
  ``E - 8``. So ``amax = 448 * 2^k`` gives scale ``2^k`` exactly, and the next
  float above it gives ``2^(k+1)``.
* ``k`` is clamped to [-127, 127]; ``e = k + 127``; a block with ``amax == 0``
  gets ``e = 0`` (which the clamp gives anyway).
* data = e4m3(x / 2^k), round-to-nearest-even, saturating to +-448. Since
  ``|x| <= amax <= 448 * 2^k`` the saturation only matters when the clamp at
  2^127 binds (float64 inputs above 448 * 2^127).
* A block holding NaN or +-Inf gets ``e = 0xFF`` (E8M0's NaN, OCP MX spec) and every
  data byte 0x7F (e4m3fn's NaN): the spec makes the whole block NaN whatever its
  data, and NaN data also keeps it NaN for a consumer that reads the data without
  the scale, or takes 0xFF as the exponent 2^128 (Inf * finite data would give
  +-Inf, Inf * 0 NaN: a mixed block); one fixed byte also makes the output
  deterministic. Dequantize turns a 0xFF scale into NaN for the whole block.
* Dequantize is exact except that a block whose amax rounds up to 2^128 (data
  256 at k = 120: amax >= 31/32 * 2^128, within a factor 32/31 ~ 1.032 of FLT_MAX)
  overflows to +-Inf in fp32/bf16 (float64 holds 2^128).

Rowwise: blocks along the last dim, scales [R, K/32]. Columnwise: blocks along
the first dim, scales [R/32, K] (the rowwise quantization of the transpose,
transposed back).

Everything is pure torch, exact on any device: powers of two are built from
bits, never through exp2/pow, and the e4m3 rounding is done by hand (the
quantum from the exponent field, ``torch.round`` = half-to-even), in fp32 for
bf16/fp32 inputs and in float64 for float64 inputs (reference mode), so the
result does not depend on a library's float8 cast (the tests check it against
torch's cast and a brute-force grid search).
"""
from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32
E4M3_MAX = 448.0
E8M0_BIAS = 127
E4M3_MIN_NORMAL_EXP = -6   # smallest normal e4m3 is 2^-6
E4M3_MANT_BITS = 3
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F


def compute_dtype(x: Tensor) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 inputs, float64 for float64 (reference mode)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def pow2(n: Tensor, dtype: torch.dtype) -> Tensor:
    """Exact 2^n for an integer tensor ``n``, built from the float's bits.

    fp32: n in [-149, 127] (subnormals included); float64: n in [-1022, 1023].
    """
    n = n.to(torch.int64)
    if dtype == torch.float32:
        normal = ((n + 127).clamp(min=1) << 23).to(torch.int32).view(torch.float32)
        sub = (torch.ones_like(n) << (n + 149).clamp(0, 22)).to(torch.int32).view(torch.float32)
        return torch.where(n >= -126, normal, sub)
    if dtype == torch.float64:
        return ((n + 1023).clamp(min=1) << 52).view(torch.float64)
    raise TypeError(f"pow2: unsupported dtype {dtype}")


def e8m0_from_amax(amax: Tensor) -> Tensor:
    """Biased E8M0 exponent (uint8) of the scale 2^ceil(log2(amax/448)), clamped; 0 for amax == 0,
    0xFF (NaN) for a NaN or Inf amax."""
    m, E = torch.frexp(amax)
    k = torch.where(m <= 0.875, E - 9, E - 8).to(torch.int64)
    e = (k.clamp(-E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS)
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    e = torch.where(torch.isfinite(amax), e, E8M0_NAN)
    return e.to(torch.uint8)


def e8m0_to_float(e: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The scale value 2^(e-127), exact (fp32 holds 2^-127 as a subnormal); NaN for e = 0xFF."""
    v = pow2(e.to(torch.int64) - E8M0_BIAS, dtype)
    return torch.where(e == E8M0_NAN, torch.nan, v)


def _pow2_normal(n: Tensor, dtype: torch.dtype) -> Tensor:
    """Exact 2^n for an int32 tensor n inside the normal range of ``dtype`` (no checks)."""
    if dtype == torch.float32:
        return ((n + 127) << 23).view(torch.float32)
    return ((n.to(torch.int64) + 1023) << 52).view(torch.float64)


def _floor_log2(v: Tensor) -> Tensor:
    """floor(log2|v|) as int32 from the exponent field; zero and subnormals give the field's
    minimum (-127 for fp32, -1023 for float64), which callers clamp anyway."""
    if v.dtype == torch.float32:
        return ((v.view(torch.int32) >> 23) & 0xFF) - 127
    return (((v.view(torch.int64) >> 52) & 0x7FF) - 1023).to(torch.int32)


def round_e4m3(v: Tensor) -> Tensor:
    """Round fp32/float64 ``v`` to the nearest e4m3 value (ties to even), saturating at +-448.

    The result is in ``v.dtype`` and lies on the e4m3 grid: for |v| in [2^E, 2^(E+1))
    with E >= -6 the spacing is 2^(E-3); below 2^-6 (subnormals) it is 2^-9. Scaling by
    the power of two 2^-(E-3) is exact, and ``torch.round`` rounds half to even.
    """
    q = _floor_log2(v).clamp(min=E4M3_MIN_NORMAL_EXP) - E4M3_MANT_BITS
    r = torch.round(v * _pow2_normal(-q, v.dtype)) * _pow2_normal(q, v.dtype)
    return r.clamp(-E4M3_MAX, E4M3_MAX)


def _blocks_last(x: Tensor) -> Tensor:
    R, K = x.shape
    return x.reshape(R, K // BLOCK, BLOCK)


def quantize_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [R, K] (K % 32 == 0) -> (data e4m3 [R, K], scales uint8 [R, K/32]); blocks along K."""
    R, K = x.shape
    xc = _blocks_last(x.to(compute_dtype(x)))
    e = e8m0_from_amax(xc.abs().amax(dim=-1))                  # amax propagates NaN
    inv = pow2(E8M0_BIAS - e.to(torch.int64), xc.dtype)        # 1/scale, exact
    data = round_e4m3(xc * inv[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    data = torch.where((e == E8M0_NAN)[..., None], E4M3_NAN, data)  # non-finite block: all NaN
    return data.reshape(R, K).view(torch.float8_e4m3fn), e


def quantize_columnwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [R, K] (R % 32 == 0) -> (data e4m3 [R, K], scales uint8 [R/32, K]); blocks along R."""
    d, s = quantize_rowwise(x.t())
    return d.t().contiguous(), s.t().contiguous()


def dequantize_rowwise(data: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """data e4m3 [R, K], scales uint8 [R, K/32] -> [R, K] in ``dtype`` (exact in fp32/float64
    but for the 2^128 overflow above); a 0xFF scale gives NaN for its whole block."""
    R, K = data.shape
    cd = torch.float64 if dtype == torch.float64 else torch.float32
    v = _blocks_last(data.to(cd)) * e8m0_to_float(scales, cd)[..., None]
    return v.reshape(R, K).to(dtype)


def dequantize_columnwise(data: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """data e4m3 [R, K], scales uint8 [R/32, K] -> [R, K] in ``dtype``."""
    return dequantize_rowwise(data.t(), scales.t(), dtype).t().contiguous()


def quantize(x: Tensor, axis: str) -> tuple[Tensor, ...]:
    """axis 'rowwise' | 'columnwise' -> (data, scales); 'both' -> (row_data, row_scales, col_data, col_scales)."""
    if axis == "rowwise":
        return quantize_rowwise(x)
    if axis == "columnwise":
        return quantize_columnwise(x)
    if axis == "both":
        return (*quantize_rowwise(x), *quantize_columnwise(x))
    raise ValueError(f"mxfp8 axis must be rowwise, columnwise or both, got {axis!r}")


def dequantize(data: Tensor, scales: Tensor, axis: str, dtype: torch.dtype) -> Tensor:
    if axis == "rowwise":
        return dequantize_rowwise(data, scales, dtype)
    if axis == "columnwise":
        return dequantize_columnwise(data, scales, dtype)
    raise ValueError(f"mxfp8 dequantize axis must be rowwise or columnwise, got {axis!r}")


# ---------------------------------------------------------------- fake quantization
# What the GEMM references use: the value an MXFP8 operand carries, in the
# accumulation dtype (fp32, or float64 in reference mode). Quantization is exact,
# so these equal dequantize(quantize(x)) bit for bit.


def fq_rowwise(x: Tensor, acc: torch.dtype) -> Tensor:
    """[R, K] -> MXFP8 value with blocks along the last dim, in ``acc``."""
    return dequantize_rowwise(*quantize_rowwise(x), acc)


def fq_columnwise(x: Tensor, acc: torch.dtype) -> Tensor:
    """[R, K] -> MXFP8 value with blocks along the first dim, in ``acc``."""
    return dequantize_rowwise(*quantize_rowwise(x.t()), acc).t()
