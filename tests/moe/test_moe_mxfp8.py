"""mxfp8_quantize / mxfp8_dequantize: the OPS.md rule bit for bit, against independent formulations.

Scales are checked against exact rational arithmetic (fractions.Fraction), data
against torch's own float8_e4m3fn cast and against a brute-force nearest-grid
search with ties to even; dequantize against float64 arithmetic.
"""
import math
from fractions import Fraction

import pytest
import torch

import registry
from tilekernels.testing import assert_close

QUANT = registry.get("mxfp8_quantize")
DEQUANT = registry.get("mxfp8_dequantize")


def expected_e8m0(amax: float) -> int:
    """Biased exponent of 2^ceil(log2(amax/448)) clamped to [2^-127, 2^127], by exact search."""
    if amax == 0:
        return 0
    a = Fraction(amax)
    k = math.frexp(amax)[1] - 12          # certainly too small: amax > 448 * 2^k
    while a > 448 * Fraction(2) ** k:
        k += 1
    return min(max(k, -127), 127) + 127


def expected_data(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """torch's e4m3 cast of x / 2^(e-127) (rowwise scales [R, K/32]), after checking no clamp is needed."""
    R, K = x.shape
    scale = torch.tensor([[2.0 ** (int(v) - 127) for v in row] for row in e.tolist()], dtype=torch.float64)
    v = x.double().reshape(R, K // 32, 32) / scale.reshape(R, K // 32, 1)
    assert v.abs().max() <= 448, "test setup: the scale rule keeps every |x/scale| <= 448"
    return v.reshape(R, K).float().to(torch.float8_e4m3fn)


def _bits(t):
    return t.view(torch.uint8)


def _edge_amaxes():
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    out = [0.0, 1e-40, 1e-45, 448 * 2.0 ** -130, 448 * 2.0 ** -127, 3.3895313892515355e38,
           torch.finfo(torch.float32).max, 1.0, 0.5, 224.0]
    for k in (-125, -40, -3, -1, 0, 1, 2, 8, 60, 119):
        exact = f32(448 * 2.0 ** k)
        out += [exact.item(), torch.nextafter(exact, f32(math.inf)).item(),
                torch.nextafter(exact, f32(0.0)).item()]
    return out


def _blocks_with_amax(amaxes, dtype, sign_mode):
    """One 32-element block per amax: smaller random values, the amax at a random position
    with a random (or negative) sign, mixed-sign filler."""
    rows = []
    for a in amaxes:
        a = torch.tensor(a, dtype=dtype).item()
        if not math.isfinite(a):
            continue  # fp32 max is inf in bf16
        fill = (torch.rand(32, dtype=torch.float64) * 2 - 1) * a * 0.99
        blk = fill.to(dtype)
        blk = torch.where(blk.double().abs() >= a, torch.zeros_like(blk), blk)
        sign = -1.0 if sign_mode == "neg" or (sign_mode == "mixed" and torch.rand(()) < 0.5) else 1.0
        blk[torch.randint(32, ())] = sign * a
        rows.append(blk)
    return torch.stack(rows).reshape(-1, 64) if len(rows) % 2 == 0 else torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sign_mode", ["pos", "neg", "mixed"])
def test_scales_and_data_on_edge_values(dtype, sign_mode):
    x = _blocks_with_amax(_edge_amaxes(), dtype, sign_mode)
    data, scales = QUANT(x, axis="rowwise")
    R, K = x.shape
    amax = x.double().abs().reshape(R, K // 32, 32).amax(-1)
    want = torch.tensor([[expected_e8m0(a) for a in row] for row in amax.tolist()], dtype=torch.uint8)
    assert scales.dtype == torch.uint8 and scales.shape == (R, K // 32)
    assert_close(scales, want, kind="exact", what="E8M0 scales")
    assert data.dtype == torch.float8_e4m3fn
    assert_close(_bits(data), _bits(expected_data(x, scales)), kind="exact", what="e4m3 data")


def test_powers_of_two_land_exactly():
    """amax = 448*2^k gives scale 2^k and data +-448; the next float up gives 2^(k+1) and 224."""
    for k in (-100, -7, -1, 0, 1, 9, 100):
        exact = torch.tensor(448 * 2.0 ** k, dtype=torch.float32)
        above = torch.nextafter(exact, torch.tensor(math.inf))
        x = torch.stack([exact.repeat(32), -above.repeat(32)])
        data, scales = QUANT(x)
        assert scales[:, 0].tolist() == [127 + k, 128 + k]
        assert data.float()[:, 0].tolist() == [448.0, -224.0]


def test_tiny_blocks_clamp_to_e0():
    x = torch.full((1, 32), 1e-40)
    x[0, 1] = 0.0
    data, scales = QUANT(x)
    assert scales.item() == 0 and data.float()[0, 1].item() == 0.0
    # 1e-40 / 2^-127 = 0.01701..., on the e4m3 subnormal grid (2^-9 steps) -> 9 * 2^-9
    assert data.float()[0, 0].item() == 9 * 2.0 ** -9


def _e4m3_grid():
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    codes = torch.arange(256)
    keep = ~torch.isnan(vals)
    return vals[keep], codes[keep]


def _nearest_even(v: torch.Tensor) -> torch.Tensor:
    """Brute force: the e4m3 value nearest to each v, ties to the even code (mantissa lsb 0)."""
    grid, codes = _e4m3_grid()
    d = (v.double()[:, None] - grid[None, :]).abs()
    best = d.min(dim=1, keepdim=True).values
    cand = d == best
    # among equally near candidates prefer an even code; -0 and +0 both give 0.0
    score = cand.double() * 2 + ((codes % 2) == 0).double()[None, :] * cand.double()
    return grid[score.argmax(dim=1)]


def test_data_rounding_brute_force_with_ties():
    grid, _ = _e4m3_grid()
    pos = torch.unique(grid[grid >= 0])
    mids = (pos[1:] + pos[:-1]) / 2                           # exact ties
    rnd = torch.rand(4000, dtype=torch.float64) * 448
    sub = torch.rand(500, dtype=torch.float64) * 2.0 ** -6    # e4m3 subnormal range
    v = torch.cat([pos, mids, rnd, sub]).float()
    v = torch.cat([v, -v])
    n = v.numel() - v.numel() % 31
    v = v[:n].reshape(-1, 31)
    x = torch.cat([torch.full((v.shape[0], 1), 448.0), v], dim=1)   # amax 448 -> scale 2^0
    data, scales = QUANT(x)
    assert (scales == 127).all()
    got = data.double()[:, 1:].reshape(-1)
    assert torch.equal(got, _nearest_even(v.reshape(-1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_random_magnitudes_bit_exact(dtype):
    R, K = 64, 256
    mag = torch.exp2(torch.randint(-60, 60, (R, K // 32, 1)).double())
    x = (torch.randn(R, K // 32, 32, dtype=torch.float64) * mag).reshape(R, K).to(dtype)
    data, scales = QUANT(x)
    amax = x.double().abs().reshape(R, K // 32, 32).amax(-1)
    want = torch.tensor([[expected_e8m0(a) for a in row] for row in amax.tolist()], dtype=torch.uint8)
    assert_close(scales, want, kind="exact", what="scales")
    assert_close(_bits(data), _bits(expected_data(x.float() if dtype != torch.float64 else x, scales)),
                 kind="exact", what="data")


@pytest.mark.parametrize("shape", [(32, 32), (96, 64), (64, 160), (0, 64)])
def test_columnwise_is_rowwise_of_transpose(shape):
    x = torch.randn(*shape).to(torch.bfloat16)
    cd, cs = QUANT(x, axis="columnwise")
    rd, rs = QUANT(x.t().contiguous(), axis="rowwise")
    assert cd.shape == shape and cs.shape == (shape[0] // 32, shape[1])
    assert_close(_bits(cd), _bits(rd.t().contiguous()), kind="exact", what="col data")
    assert_close(cs, rs.t().contiguous(), kind="exact", what="col scales")
    both = QUANT(x, axis="both")
    row = QUANT(x, axis="rowwise")
    for got, want in zip(both, (*row, cd, cs)):
        assert_close(_bits(got) if got.dtype == torch.float8_e4m3fn else got,
                     _bits(want) if want.dtype == torch.float8_e4m3fn else want, kind="exact")


@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
def test_dequantize_exact(axis):
    x = torch.randn(64, 96) * torch.exp2(torch.randint(-20, 20, (64, 1)).float())
    data, scales = QUANT(x, axis=axis)
    s = torch.tensor([[2.0 ** (int(v) - 127) for v in row] for row in scales.tolist()], dtype=torch.float64)
    s = s.repeat_interleave(32, dim=1 if axis == "rowwise" else 0)
    want = data.double() * s
    f32 = DEQUANT(data, scales, axis=axis, out_dtype="float32")
    assert f32.dtype == torch.float32
    assert torch.equal(f32.double(), want)                  # exact in fp32
    assert torch.equal(DEQUANT(data, scales, axis=axis, out_dtype="float64"), want)
    bf = DEQUANT(data, scales, axis=axis)                  # default bf16
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf.double(), want)                   # e4m3 (4 significant bits) fits bf16 exactly


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
def test_roundtrip_error_bound(dtype, axis):
    """|dq(q(x)) - x| <= 2^-4 |x| for values in e4m3's normal range (|x/scale| >= 2^-6): e4m3 has 3
    mantissa bits, so neighbours in [2^E, 2^(E+1)) are 2^(E-3) apart and round-to-nearest errs by at
    most half of that, 2^(E-4) <= 2^-4 |x|. Below (subnormals) the error is at most 2^-10 * scale."""
    mag_shape = (96, 1) if axis == "rowwise" else (1, 128)   # one magnitude per block line
    x = (torch.randn(96, 128) * torch.exp2(torch.randint(-10, 10, mag_shape).float())).to(dtype)
    data, scales = QUANT(x, axis=axis)
    y = DEQUANT(data, scales, axis=axis, out_dtype="float32").double()
    s = torch.tensor([[2.0 ** (int(v) - 127) for v in row] for row in scales.tolist()], dtype=torch.float64)
    s = s.repeat_interleave(32, dim=1 if axis == "rowwise" else 0)
    xd = x.double()
    err = (y - xd).abs()
    normal = xd.abs() >= 2.0 ** -6 * s
    assert normal.float().mean() > 0.9
    assert (err[normal] <= 2.0 ** -4 * xd.abs()[normal]).all()
    assert (err[~normal] <= 2.0 ** -10 * s[~normal]).all()
    assert err.max() > 0                                      # it does quantize
    # quantization is idempotent on values
    d2, s2 = QUANT(y.to(dtype), axis=axis)
    assert torch.equal(DEQUANT(d2, s2, axis=axis, out_dtype="float32").double(), y)


def test_float64_input_saturates_above_clamp():
    """float64 amax beyond 448 * 2^127: the scale clamps at 2^127 (e = 254) and data saturates to 448."""
    x = torch.full((1, 32), 2.0 ** 140, dtype=torch.float64)
    x[0, 1] = -(2.0 ** 136)
    x[0, 2] = 2.0 ** 133
    data, scales = QUANT(x)
    assert scales.item() == 254
    assert data.float()[0, :3].tolist() == [448.0, -448.0, 64.0]


def test_outputs_fully_written_under_poison():
    x = torch.randn(64, 64).to(torch.bfloat16)
    for t in QUANT(x, axis="both"):
        if t.dtype == torch.float8_e4m3fn:
            assert not torch.isnan(t.float()).any()
        else:
            assert (t != 0xFF).all()
