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
from tilekernels._glue import poisoned
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
    """e4m3 of x / 2^(e-127) (rowwise scales [R, K/32]), after checking no clamp is needed.

    bf16/fp32 x: torch's own e4m3 cast (x / scale is exact in fp32, so one rounding).
    float64 x: the brute-force nearest-grid search, since torch casts float64 to e4m3
    through fp32, a second rounding that can move a value onto an e4m3 midpoint (or
    across one) and so disagree with the single rounding the op contract asks for."""
    R, K = x.shape
    scale = torch.tensor([[2.0 ** (int(v) - 127) for v in row] for row in e.tolist()], dtype=torch.float64)
    v = x.double().reshape(R, K // 32, 32) / scale.reshape(R, K // 32, 1)
    assert v.abs().max() <= 448, "test setup: the scale rule keeps every |x/scale| <= 448"
    if x.dtype == torch.float64:
        flat = v.reshape(-1)
        return torch.copysign(_nearest_even(flat), flat).reshape(R, K).to(torch.float8_e4m3fn)
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
    assert_close(_bits(data), _bits(expected_data(x if dtype == torch.float64 else x.float(), scales)),
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_e4m3_saturates_by_itself(dtype):
    """The e4m3 rounding saturates to +-448 itself (mxfp8.py: the data must not depend on a library's float8
    cast). torch's CPU cast saturates as well, so through the op (the test above) a missing clamp goes unseen:
    this checks the rounding step directly, at the top of e4m3's grid (464 ties to even, down to 448) and past it."""
    from tilekernels.moe import mxfp8 as mx

    v = torch.tensor([448.0, 463.0, 464.0, 480.0, 2.0 ** 13, 1e30], dtype=dtype)
    want = torch.full_like(v, 448.0)
    assert torch.equal(mx.round_e4m3(v), want) and torch.equal(mx.round_e4m3(-v), -want)


@pytest.mark.parametrize("axis", ["rowwise", "both"])
def test_weight_parameter_quantizes_detached(axis):
    """A weight Parameter (requires grad) quantizes as its data does: codes with no gradient (the spec's x), so a
    model's weights can be pre-quantized without a no_grad block. It held before the spec said so: a guard that the
    op keeps taking such an x (gdn_decode, the other forward-only op, refuses one)."""
    w = torch.nn.Parameter(torch.randn(64, 96))
    got, want = QUANT(w, axis=axis), QUANT(w.detach(), axis=axis)
    assert not any(t.requires_grad for t in got)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))


def test_outputs_fully_written_under_poison():
    x = torch.randn(64, 64).to(torch.bfloat16)
    for t in QUANT(x, axis="both"):
        if t.dtype == torch.float8_e4m3fn:
            assert not torch.isnan(t.float()).any()
        else:
            assert (t != 0xFF).all()


# ---------------------------------------------------------------- non-finite blocks
# OPS.md: a block holding NaN or +-Inf gets scale 0xFF (E8M0 NaN) and dequantizes to NaN
# as a whole; our quantize also writes e4m3 NaN (0x7F) into every byte of such a block.

_BAD = {"nan": [math.nan], "inf": [math.inf], "-inf": [-math.inf], "mixed": [math.nan, math.inf, -math.inf]}
_OUT = ["bfloat16", "float32", "float64"]


def _finite(R, K, dtype):
    """Fresh random values, one magnitude per row (never zeros)."""
    return (torch.randn(R, K, dtype=torch.float64) * torch.exp2(torch.randint(-30, 30, (R, 1)).double())).to(dtype)


def _with_bad_block(x, axis, bad):
    """Copy of x with 1..3 elements of one random block set to the values of ``bad``; returns
    (copy, block mask [R, K], block index into the scales)."""
    R, K = x.shape
    r, c = int(torch.randint(R, ())), int(torch.randint(K, ()))
    mask = torch.zeros(R, K, dtype=torch.bool)
    if axis == "rowwise":
        idx, sl = (r, c // 32), (r, slice(c // 32 * 32, c // 32 * 32 + 32))
    else:
        idx, sl = (r // 32, c), (slice(r // 32 * 32, r // 32 * 32 + 32), c)
    mask[sl] = True
    y = x.clone()
    pos = torch.randperm(32)[: int(torch.randint(1, 4, ()))]
    vals = torch.tensor([bad[i % len(bad)] for i in range(len(pos))], dtype=x.dtype)
    y[sl][pos] = vals                                             # y[sl] is a view (row or column)
    return y, mask, idx


def _check_nan_block(x, bad_x, mask, idx, axis):
    """quantize(bad_x): scale 0xFF and data 0x7F exactly in the block, everything else bit-equal to
    quantize(x); dequantize: NaN exactly in the block, bit-equal elsewhere, in every out dtype."""
    d, s = QUANT(x, axis=axis)
    bd, bs = QUANT(bad_x, axis=axis)
    assert bs[idx].item() == 0xFF and (bs == 0xFF).sum().item() == 1
    want_s = s.clone()
    want_s[idx] = 0xFF
    assert_close(bs, want_s, kind="exact", what="scales")
    want_d = torch.where(mask, torch.tensor(0x7F, dtype=torch.uint8), _bits(d))
    assert_close(_bits(bd), want_d, kind="exact", what="data")
    for out in _OUT:
        got, clean = DEQUANT(bd, bs, axis=axis, out_dtype=out), DEQUANT(d, s, axis=axis, out_dtype=out)
        assert torch.equal(torch.isnan(got), mask), out
        assert torch.equal(got[~mask], clean[~mask]), out


# A non-finite block's right encoding (scale 0xFF, data 0x7F, NaN out) is the default NaN poison itself: these
# tests also run with the finite poison, where a kernel that skips such a block leaves finite sentinels.
POISONS = pytest.mark.parametrize("poison", ["nan", "finite"])


@POISONS
@pytest.mark.parametrize("bad", list(_BAD))
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_nonfinite_block_is_nan(dtype, axis, bad, poison):
    x = _finite(64, 96, dtype)
    bad_x, mask, idx = _with_bad_block(x, axis, _BAD[bad])
    with poisoned(True, poison):
        _check_nan_block(x, bad_x, mask, idx, axis)


@POISONS
def test_nonfinite_block_both_axes(poison):
    """axis='both': the row block and the column block through the bad element are NaN."""
    with poisoned(True, poison):
        _nonfinite_both()


def _nonfinite_both():
    x = _finite(96, 64, torch.bfloat16)
    r, c = int(torch.randint(96, ())), int(torch.randint(64, ()))
    bad_x = x.clone()
    bad_x[r, c] = math.nan
    rd, rs, cd, cs = QUANT(bad_x, axis="both")
    for got, want in zip((rd, rs, cd, cs), (*QUANT(bad_x, axis="rowwise"), *QUANT(bad_x, axis="columnwise"))):
        assert torch.equal(_bits(got), _bits(want))
    assert rs[r, c // 32].item() == 0xFF and (rs == 0xFF).sum().item() == 1
    assert cs[r // 32, c].item() == 0xFF and (cs == 0xFF).sum().item() == 1
    row_nan = torch.isnan(DEQUANT(rd, rs, axis="rowwise", out_dtype="float32"))
    col_nan = torch.isnan(DEQUANT(cd, cs, axis="columnwise", out_dtype="float32"))
    assert row_nan.sum().item() == 32 and row_nan[r, c // 32 * 32: c // 32 * 32 + 32].all()
    assert col_nan.sum().item() == 32 and col_nan[r // 32 * 32: r // 32 * 32 + 32, c].all()


@POISONS
@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
def test_dequantize_nan_scale_whatever_the_data(axis, poison):
    """A 0xFF scale makes its block NaN even over finite (and zero) data, in every out dtype."""
    with poisoned(True, poison):
        _nan_scale(axis)


def _nan_scale(axis):
    x = _finite(64, 64, torch.float32)
    x[torch.rand(64, 64) < 0.1] = 0.0
    d, s = QUANT(x, axis=axis)
    i, j = int(torch.randint(s.shape[0], ())), int(torch.randint(s.shape[1], ()))
    bs = s.clone()
    bs[i, j] = 0xFF
    mask = torch.zeros(s.shape, dtype=torch.bool)
    mask[i, j] = True
    mask = mask.repeat_interleave(32, dim=1 if axis == "rowwise" else 0)
    for out in _OUT:
        got, clean = DEQUANT(d, bs, axis=axis, out_dtype=out), DEQUANT(d, s, axis=axis, out_dtype=out)
        assert torch.equal(torch.isnan(got), mask), out
        assert torch.equal(got[~mask], clean[~mask]), out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_overflows_only_at_2_128(dtype):
    """amax >= 31/32 * 2^128 (e4m3 data 256 at scale 2^120) dequantizes to +-Inf in fp32/bf16 and
    to 2^128 in float64; the value just below gives data 240 and stays finite; so does the rest."""
    top = torch.tensor(31 / 32 * 2.0 ** 128, dtype=dtype)
    below = torch.nextafter(top, torch.tensor(0.0, dtype=dtype))
    fmax = torch.tensor(torch.finfo(dtype).max, dtype=dtype)
    x = _finite(3, 32, torch.float64).clamp(-1e30, 1e30).to(dtype)
    sign = torch.where(torch.rand(3) < 0.5, -1.0, 1.0).to(dtype)
    pos = torch.randint(32, (3,))
    x[torch.arange(3), pos] = torch.stack([top, below, fmax]) * sign
    d, s = QUANT(x)
    assert s[:, 0].tolist() == [247, 247, 247]
    assert (d.float()[torch.arange(3), pos] * sign.float()).tolist() == [256.0, 240.0, 256.0]
    want = d.double() * 2.0 ** 120
    assert torch.equal(DEQUANT(d, s, out_dtype="float64"), want)
    inf = want.abs() == 2.0 ** 128
    assert inf.sum().item() == 2 and not inf[1].any()
    for out in ("float32", "bfloat16"):
        y = DEQUANT(d, s, out_dtype=out)
        assert torch.equal(torch.isinf(y), inf) and not torch.isnan(y).any()
        assert torch.equal(y[inf].double(), want[inf].sign() * math.inf)
        assert torch.equal(y[~inf].double(), want[~inf])


def test_reference_gemms_propagate_nan():
    """The grouped-GEMM references (fwd, dgrad, wgrad) and the MLP turn a NaN/Inf block into NaN
    exactly where the block feeds in, and leave everything else bit-equal to the clean run."""
    from tilekernels.moe import reference as ref
    M, H, F, splits = 96, 64, 64, torch.tensor([64, 32])
    x, dy = _finite(M, H, torch.bfloat16), _finite(M, H, torch.bfloat16)
    w = _finite(2 * H, H, torch.bfloat16).view(2, H, H)
    r, n = int(torch.randint(M, ())), int(torch.randint(H, ()))
    bx, bdy = x.clone(), dy.clone()
    bx[r, int(torch.randint(H, ()))] = math.inf
    bdy[r, n] = math.nan
    row = torch.zeros(M, H, dtype=torch.bool)
    row[r] = True

    y, by = (ref.grouped_linear(t, w, splits, "mxfp8") for t in (x, bx))
    assert torch.equal(torch.isnan(by), row) and torch.equal(by[~row], y[~row])

    (dx, dw), (bdx, bdw) = (ref.grouped_linear_bwd(t, x, w, splits, "mxfp8") for t in (dy, bdy))
    assert torch.equal(torch.isnan(bdx), row) and torch.equal(bdx[~row], dx[~row])
    dw_nan = torch.zeros(2, H, H, dtype=torch.bool)
    dw_nan[int(r >= 64), n] = True               # dy's column block through (r, n) feeds row n of dW_g
    assert torch.equal(torch.isnan(bdw), dw_nan) and torch.equal(bdw[~dw_nan], dw[~dw_nan])

    w1, w2 = _finite(4 * F, H, torch.bfloat16).view(2, 2 * F, H), _finite(2 * H, F, torch.bfloat16).view(2, H, F)
    probs = torch.rand(M) + 0.1
    ym, bym = (ref.grouped_mlp_mxfp8(t, probs, splits, w1, w2) for t in (x, bx))
    assert torch.equal(torch.isnan(bym), row) and torch.equal(bym[~row], ym[~row])
