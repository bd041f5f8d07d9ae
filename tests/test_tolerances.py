"""The one tolerance table's comparison (tilekernels.testing.assert_close): NaN never passes,
the norm-wise bound, and the ``scale`` rule for sums with cancellation."""
import math

import pytest
import torch

from tilekernels.testing import (TOLERANCES, _norms, assert_close, assert_limit_edge, assert_one_rounding,
                                 exact_mismatches, limit_reason, meta, misaligned_copy, randn, rel_err, tolerance,
                                 upcast)


def test_nan_and_inf_never_pass():
    ref = torch.ones(4, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        out = ref.float().clone()
        out[2] = bad
        assert rel_err(out, ref) == math.inf
        with pytest.raises(AssertionError):
            assert_close(out, ref)
        with pytest.raises(AssertionError):  # a scale never rescues a non-finite output
            assert_close(out, ref, scale=torch.full_like(ref, 1e9))


def test_norm_wise_bound_by_dtype():
    ref = torch.randn(1000, dtype=torch.float64)
    assert_close((ref * (1 + 5e-6)).float(), ref)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(ref.float() + 1e-4 * ref.norm() / 30, ref)
    assert TOLERANCES["bfloat16"][0] == 1e-2 and TOLERANCES["float32"][0] == 1e-5


def test_scale_rule_for_sums_that_cancel():
    """ref = sum_k a_k with terms of size ~1 that cancel to 1e-3: fp32-size errors on the
    terms' scale pass only with the scale; an error of 1e-3 of the scale (a wrong term) fails
    with it too; a typical (non-cancelling) sum is judged as before."""
    a = torch.randn(64, dtype=torch.float64)
    a[-1] -= a.sum() - 1e-3                      # the terms now sum to 1e-3
    ref, scale = a.sum().reshape(1), a.square().sum().sqrt().reshape(1)
    near = (ref + 1e-7 * scale).float()        # fp32 reassociation size on the terms' scale
    with pytest.raises(AssertionError):
        assert_close(near, ref)
    assert_close(near, ref, scale=scale)
    with pytest.raises(AssertionError):
        assert_close((ref + 1e-3 * scale).float(), ref, scale=scale)
    b = torch.randn(100, 64, dtype=torch.float64)
    r2, s2 = b.sum(1), b.square().sum(1).sqrt()
    out = (r2 * (1 + 2e-5)).float()            # 2e-5 norm-wise: fails with or without the scale
    with pytest.raises(AssertionError):
        assert_close(out, r2, scale=s2)


def test_shape_zero_reference_and_nan_reference():
    """What the relative error cannot hide: a transposed result of the same size, any non-zero output against an
    all-zero reference (0 only for 0), a NaN in the reference."""
    ref = torch.randn(4, 6, dtype=torch.float64)
    assert rel_err(ref.float().reshape(6, 4), ref) == math.inf
    with pytest.raises(AssertionError):
        assert_close(ref.float().reshape(6, 4), ref)
    with pytest.raises(AssertionError):
        assert_close(ref.reshape(6, 4).clone(), ref, "exact")
    zero = torch.zeros(4, 6, dtype=torch.float64)
    assert rel_err(zero.float(), zero) == 0.0
    assert_close(zero.float(), zero)
    tiny = zero.float().clone()
    tiny[1, 2] = 1e-30
    assert rel_err(tiny, zero) == math.inf
    with pytest.raises(AssertionError):
        assert_close(tiny, zero)
    bad_ref = ref.clone()
    bad_ref[0, 0] = float("nan")
    with pytest.raises(AssertionError):
        assert_close(ref.float(), bad_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.float8_e4m3fn, torch.uint8])
def test_exact_fails_on_one_changed_element(dtype):
    """"exact" is bitwise: one element one step away fails (its lowest bit flipped), the same tensor passes,
    another dtype fails."""
    base = torch.randn(64).mul(8).to(dtype) if dtype.is_floating_point else torch.randint(0, 100, (64,)).to(dtype)
    assert_close(base.clone(), base, "exact")
    moved = base.clone()
    moved.view(torch.uint8)[17 * moved.element_size()] ^= 1  # the lowest bit (little-endian): one ulp for floats
    assert not torch.equal(moved.view(torch.uint8), base.view(torch.uint8))
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_close(moved, base, "exact")
    other = base.to(torch.float64) if dtype != torch.float8_e4m3fn else base.view(torch.uint8)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(other, base, "exact")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_exact_tells_signed_zeros_and_never_passes_nan(dtype):
    """"exact" compares bits: -0 against +0 fails (a move that loses a zero's sign; their difference is 0, so no
    relative error can see it), and a NaN fails even against a NaN in the same place (NaN never passes)."""
    base = torch.randn(32).mul(4).to(dtype)
    base[5] = 0.0
    neg = base.clone()
    neg[5] = -0.0
    assert neg.view(torch.uint8).ne(base.view(torch.uint8)).any()
    assert rel_err(neg, base) == 0.0
    with pytest.raises(AssertionError, match="1 elements differ"):
        assert_close(neg, base, "exact")
    assert exact_mismatches(neg, base.to(torch.float64)) == 1  # the float64 reference of a move, too
    nan = base.clone()
    nan[9] = float("nan")
    with pytest.raises(AssertionError, match="not bitwise equal"):
        assert_close(nan, nan.clone(), "exact")
    assert exact_mismatches(base, base.clone()) == 0
    assert exact_mismatches(base, base.clone(), chunk=7) == 0  # chunked, a tail chunk included
    assert exact_mismatches(neg, base, chunk=7) == 1


def test_chunked_norms_read_every_chunk():
    """The norms go a chunk (2**26 elements) at a time: a headline GPU comparison (mHC's 939M elements) spans ~14
    chunks, which no CPU-sized test reached, so a loop that read only the first chunk passed the whole suite (a
    helper's mutation). Small chunks here, with the difference, a NaN and the big values in the last, partial one."""
    ref = torch.randn(100, dtype=torch.float64) + 2.0
    out = ref.clone()
    out[95:] = 0.0                                             # wrong in the tail chunk only
    want = ((out - ref).norm() / ref.norm()).item()
    for chunk in (7, 16, 99, 100, 1 << 26):
        assert rel_err(out, ref, chunk=chunk) == pytest.approx(want, rel=1e-12), chunk
        num, den, sc = _norms(out, ref, 3 * ref, chunk)
        assert num / den == pytest.approx(want, rel=1e-12) and sc / den == pytest.approx(3.0, rel=1e-12)
        nan = ref.clone()
        nan[-1] = float("nan")
        assert rel_err(nan, ref, chunk=chunk) == math.inf
        big = ref.clone()
        big[-1] = 1e200                                        # the second (power-of-two) pass, chunked too
        bigo = big.clone()
        bigo[-1] = 1.5e200
        assert rel_err(bigo, big, chunk=chunk) == pytest.approx(0.5, rel=1e-12), chunk  # (the rest: ~1e-197)


def test_one_rounding_sees_an_extra_rounding_and_one_wrong_row():
    """assert_one_rounding: the float64 value rounded once to bf16 passes (with fp32's few straddles); a bf16-rounded
    intermediate fails on the whole-tensor fraction; one row holding another row's values fails on the row fraction
    (0.02% of the elements here; its norm-wise error, ~sqrt(2 / T), is under bf16's 1e-2 from T ~ 20000 on)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 96, dtype=torch.float64, generator=g)
    b = torch.randn(4096, 96, dtype=torch.float64, generator=g)
    ref = a * 0.75 + b
    assert_one_rounding((a.float() * 0.75 + b.float()).bfloat16(), ref)  # fp32 math, one rounding
    with pytest.raises(AssertionError, match="extra rounding"):
        assert_one_rounding(((a * 0.75).bfloat16().double() + b).bfloat16(), ref)  # an intermediate rounded
    wrong = ref.bfloat16().clone()
    wrong[1234] = wrong[17]
    with pytest.raises(AssertionError, match="row 1234 .* wrong or unwritten row"):
        assert_one_rounding(wrong, ref)
    narrow = ref[:, :8].bfloat16().clone()  # rows of < 64 elements: the whole-tensor fraction only
    narrow[5, 0] = narrow[6, 0]
    assert_one_rounding(narrow, ref[:, :8])


def test_one_rounding_never_passes_nan_or_inf():
    """A few NaN / inf elements sat inside the allowed fraction of differing elements (600 NaNs and 5 infs in
    [64, 4, 256] passed: a CPU audit's find, session 72); now any non-finite element where the once-rounded
    reference is finite fails."""
    ref = torch.randn(64, 4, 256, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        out = ref.bfloat16().clone()
        out[3, 1, 7] = bad
        with pytest.raises(AssertionError, match="1 elements are NaN / inf"):
            assert_one_rounding(out, ref)


def test_scale_rule_when_the_reference_cancels_to_zero():
    """A sum whose float64 terms cancel to exactly 0: the error is read on the terms' scale, as documented (it was
    inf, rel_err's 0 / 0 rule applied before the scale); a zero output passes, a wrong term still fails."""
    a = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    ref, scale = a.sum().reshape(1), a.square().sum().sqrt().reshape(1)
    assert ref.item() == 0.0
    assert_close(torch.tensor([1e-8]), ref, scale=scale)
    assert_close(torch.zeros(1), ref, scale=scale)
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([0.5]), ref, scale=scale)


@pytest.mark.parametrize("size", [1e-170, 1e-300, 1e160, 1e300])
def test_rel_err_at_the_ends_of_float64(size):
    """The squares are taken on a power-of-two scale: values under ~1e-154 underflowed to 0 / 0 (a 3x output read
    as exact) and over ~1e154 overflowed (inf / inf)."""
    ref = torch.randn(100, dtype=torch.float64) * size
    assert rel_err(ref.clone(), ref) == 0.0
    assert rel_err(ref * (1 + 1e-9), ref) == pytest.approx(1e-9, rel=1e-3)
    assert rel_err(ref * 3, ref) == pytest.approx(2.0)
    with pytest.raises(AssertionError):
        assert_close(ref * 3, ref)


def test_rel_err_near_float64s_largest():
    """Norms past float64's range (values near 1.8e308): the ratio is taken on the common scale, so half the
    reference reads 0.5, not inf / inf or a norm that overflowed to inf (0)."""
    ref = torch.tensor([1.7e308, -1.7e308, 1e308], dtype=torch.float64)
    assert rel_err(ref * 0.5, ref) == pytest.approx(0.5)
    assert rel_err(ref.clone(), ref) == 0.0


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.float16, 2e-3),
                                        (torch.bfloat16, 1e-2)])
def test_each_dtype_is_held_to_its_own_tolerance(dtype, tol):
    """Every row of the table is the bound its dtype gets: half the tolerance off passes, twice off fails. Only the
    bf16 and fp32 values were pinned: a float64 bound of 1e-6, an fp16 one of 1e-2 passed the CPU suite (a mutation
    audit's find). A dtype with no row has no tolerance (no fallback bound)."""
    assert tolerance(dtype) == tolerance(str(dtype).removeprefix("torch.")) == tol
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(4096, dtype=torch.float64, generator=g)
    d = torch.randn(4096, dtype=torch.float64, generator=g)
    d *= ref.norm() / d.norm()                     # ||d|| = ||ref||: ref + e * d is e off, before out's rounding
    assert_close((ref + 0.5 * tol * d).to(dtype), ref)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close((ref + 2 * tol * d).to(dtype), ref)
    for unknown in (torch.float8_e4m3fn, torch.int32, "float8"):
        with pytest.raises(KeyError, match="no tolerance"):
            tolerance(unknown)


def test_bound_is_inclusive_and_scale_only_widens():
    """``rel_err <= tolerance``: an error exactly at the bound passes (1 / 1e5 is float64's 1e-5). A ``scale`` only
    ever widens the denominator to max(||ref||, ||scale||): a zero or small scale judges as without it, and an
    all-zero reference with an all-zero scale passes only an all-zero output."""
    ref = torch.tensor([100000.0], dtype=torch.float64)
    assert rel_err(torch.tensor([100001.0]), ref) == 1e-5 == tolerance(torch.float32)
    assert_close(torch.tensor([100001.0]), ref)
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([100002.0]), ref)
    r = torch.randn(100, dtype=torch.float64)
    out = (r * (1 + 5e-6)).float()
    for scale in (torch.zeros_like(r), 0.1 * r.abs()):
        assert assert_close(out, r, scale=scale) == pytest.approx(rel_err(out, r), rel=1e-12)
    z = torch.zeros(3, dtype=torch.float64)
    assert assert_close(torch.zeros(3), z, scale=z) == 0.0
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([0.0, 1e-30, 0.0]), z, scale=z)


def _one_ulp_off(t: torch.Tensor, where) -> torch.Tensor:
    out = t.clone()
    out.view(torch.int16)[where] ^= 1             # the lowest mantissa bit: one bf16 ulp
    return out


def test_one_rounding_fractions_are_the_stated_bounds():
    """assert_one_rounding's two bounds sit where they say: at most ``max_fraction`` (1%) of all elements and
    ``max_row_fraction`` (25%) of one row (rows of >= 64 elements) may be off the once-rounded value (bounds that
    doubled passed the suite: its tests moved 15-100% of the elements)."""
    ref = torch.randn(200, 100, dtype=torch.float64)
    want = ref.bfloat16()
    rows = torch.arange(190)
    assert assert_one_rounding(_one_ulp_off(want, (rows, 0)), ref) == pytest.approx(0.0095)
    rows = torch.arange(150).repeat_interleave(2)
    cols = torch.tensor([0, 1]).repeat(150)
    with pytest.raises(AssertionError, match="extra rounding"):   # 1.5% of the elements, 2% of each row
        assert_one_rounding(_one_ulp_off(want, (rows, cols)), ref)
    assert_one_rounding(_one_ulp_off(want, (7, slice(0, 25))), ref)   # a quarter of one row
    with pytest.raises(AssertionError, match="row 7 .* wrong or unwritten row"):
        assert_one_rounding(_one_ulp_off(want, (7, slice(0, 30))), ref)
    ref64 = torch.randn(200, 64, dtype=torch.float64)                # a row of exactly 64 is checked
    with pytest.raises(AssertionError, match="row 3 "):
        assert_one_rounding(_one_ulp_off(ref64.bfloat16(), 3), ref64)


def test_upcast_randn_meta_and_misaligned_copy():
    """upcast: a float64 copy of a floating tensor, detached (no grad); fp8 and non-floating values unchanged.
    randn scales; meta makes data-free tensors of the dtype asked for; misaligned_copy is an equal tensor off the
    16-byte alignment."""
    x = torch.randn(3, 5, dtype=torch.bfloat16, requires_grad=True)
    u = upcast(x)
    assert u.dtype == torch.float64 and not u.requires_grad and torch.equal(u, x.detach().double())
    q = x.detach().float().to(torch.float8_e4m3fn)
    i = torch.arange(4)
    assert upcast(q) is q and upcast(i) is i and upcast(2.5) == 2.5 and upcast(None) is None
    g = torch.Generator().manual_seed(3)
    big = randn(10000, generator=g, scale=5.0, dtype=torch.bfloat16)
    assert big.dtype == torch.bfloat16 and 4.5 < big.float().std().item() < 5.5
    m = meta(2, 3, dtype=torch.float32)
    assert m.device.type == "meta" and m.dtype == torch.float32 and tuple(m.shape) == (2, 3)
    t = torch.randn(37)
    v = misaligned_copy(t)
    assert torch.equal(v, t) and v.is_contiguous() and v.data_ptr() % 16 != 0


def test_limit_helpers_read_explains_reasons():
    """limit_reason / assert_limit_edge on real explain rows (mhc_h_aggregate's cute limit T * n < 2**31): the edge
    passes; the same rows on both sides, another expression, other words, or a torch refusal fail."""
    import registry

    def rows(T):
        return registry.get("mhc_h_aggregate").explain(meta(T, 8, 8), meta(T, 8, dtype=torch.float32))

    inside, outside = rows(2**28 - 1), rows(2**28)
    assert "cute limit" not in limit_reason(inside, "cute") and "cute limit" in limit_reason(outside, "cute")
    assert_limit_edge(inside, outside, "cute", "T * n < 2**31", "int32 extent")
    for args in ((outside, outside, "cute", "T * n < 2**31"), (inside, inside, "cute", "T * n < 2**31"),
                 (inside, outside, "cute", "T * n < 2**30"), (inside, outside, "cute", "T * n < 2**31", "no such")):
        with pytest.raises(AssertionError):
            assert_limit_edge(*args)
    refused = [(b, ok if b != "torch" else False, why) for b, ok, why in outside]
    with pytest.raises(AssertionError):
        limit_reason(refused, "cute")


def test_a_non_finite_scale_never_excuses_an_output():
    """One inf in ``scale`` made max(||ref||, ||scale||) inf and every output's error 0: an output of 1e6 everywhere
    passed (a mutation audit's find). A NaN or inf scale now fails like a NaN / inf output."""
    ref = torch.randn(8, dtype=torch.float64)
    for bad in (float("inf"), float("nan")):
        scale = ref.abs().clone()
        scale[3] = bad
        for out in (torch.full((8,), 1e6), ref.float()):
            with pytest.raises(AssertionError, match="relative error inf"):
                assert_close(out, ref, scale=scale)
    assert_close(ref.float(), ref, scale=ref.abs())
