"""The one tolerance table, and the comparison every test and tk-bench uses.

Relative error is ``||out - ref|| / ||ref||`` (Frobenius, computed in float64,
NaN/Inf anywhere -> inf, so NaN never passes). The reference is the op's torch
reference run on float64 upcasts of the same inputs (or fp32 where the op is
defined in fp32).
"""
from __future__ import annotations

import math

import torch

# Tolerance by the dtype of the output being checked, with why.
TOLERANCES: dict[str, tuple[float, str]] = {
    "float64": (1e-12, "same math as the float64 reference, only summation order differs"),
    "float32": (1e-5, "fp32 result of fp32-accumulated sums: reassociation error ~ sqrt(K)*2^-24, "
                      "far below 1e-5 for K <= 1e5"),
    "float16": (2e-3, "one fp16 rounding of the output (2^-11 relative per element)"),
    "bfloat16": (1e-2, "one bf16 rounding of the output (8 significant bits: unit roundoff 2^-8 = 3.9e-3 "
                       "per element, norm-wise 1.1e-3 to 2.3e-3 by where mantissas sit) plus bf16-rounded "
                       "intermediates the op is defined with"),
    "exact": (0.0, "integer / permutation / bit-exact outputs compare bitwise"),
}


def tolerance(kind) -> float:
    """Tolerance for an output dtype (torch.dtype or name) or 'exact'."""
    name = kind if isinstance(kind, str) else str(kind).removeprefix("torch.")
    if name not in TOLERANCES:
        raise KeyError(f"no tolerance for {name!r}; known: {sorted(TOLERANCES)}")
    return TOLERANCES[name][0]


def rel_err(out: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 26) -> float:
    """||out - ref|| / ||ref|| in float64; inf if out has NaN/Inf or shapes differ.

    Computed on the tensors' own device (``ref`` is moved to ``out``'s a chunk at
    a time), in chunks of ``chunk`` elements, so headline-size GPU comparisons
    neither copy to the host nor double their memory.
    """
    norms = _norms(out, ref, None, chunk)
    if norms is None:
        return math.inf
    num, den, _ = norms
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _norms(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None,
           chunk: int = 1 << 26) -> tuple[float, float, float] | None:
    """(||out - ref||, ||ref||, ||scale|| or 0) in float64, all over one power-of-two unit (the callers take their
    ratios), or None if out has NaN/Inf or the shapes differ. One pass (unit 1); where the largest finite |value|
    lies outside [1e-150, 1e150] (squares that underflow to 0 / 0, reading a 3x error as exact, or overflow to
    inf / inf) a second pass takes the squares over a power of two near it."""
    if tuple(out.shape) != tuple(ref.shape):
        return None
    if out.numel() == 0:
        return 0.0, 0.0, 0.0
    ts = [out.detach().reshape(-1), ref.detach().reshape(-1)]   # ref, scale moved to out's device a chunk at a time
    if scale is not None:
        ts.append(scale.detach().reshape(-1))
    dev = ts[0].device

    def sums(unit: float, track: bool):
        acc = torch.zeros(4, dtype=torch.float64, device=dev)   # three sums of squares, the largest |value|
        finite = torch.ones((), dtype=torch.bool, device=dev)
        for i in range(0, ts[0].numel(), chunk):
            cs = [t[i:i + chunk].to(dev).to(torch.float64) for t in ts]
            if track:
                finite &= torch.isfinite(cs[0]).all()
                for c in cs:   # (a NaN / inf in ref or scale makes its norm NaN / inf)
                    acc[3] = torch.maximum(acc[3], c.abs().where(torch.isfinite(c), 0.0).max())
            if unit != 1.0:
                cs = [c / unit for c in cs]
            acc[0] += (cs[0] - cs[1]).square().sum()
            acc[1] += cs[1].square().sum()
            if scale is not None:
                acc[2] += cs[2].square().sum()
        return acc.tolist(), bool(finite)

    (num, den, sc, big), finite = sums(1.0, True)
    if not finite:
        return None
    unit = 1.0
    if big > 0.0 and not 1e-150 <= big <= 1e150:
        unit = math.ldexp(1.0, math.frexp(big)[1] - 1)   # |values| / unit < 2
        (num, den, sc, _), _ = sums(unit, False)
    return math.sqrt(num), math.sqrt(den), math.sqrt(sc)   # over unit: its callers take ratios


def exact_mismatches(out: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 24) -> int:
    """How many elements of ``out`` are not ``ref``'s, bit for bit (the "exact" kind; shapes must match).

    Floating values compare as float64 (exact for every float dtype, fp8 included) with their sign bits, so
    -0 differs from +0 (a move that loses a zero's sign is wrong) and NaN differs from everything, itself
    included (NaN never passes). Other dtypes compare as they are. A different dtype on each side is allowed
    here (a float64 reference of a bf16 move); ``assert_close`` refuses it first. Chunked on ``out``'s device
    (``ref`` moved there a chunk at a time)."""
    assert tuple(out.shape) == tuple(ref.shape), f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o = out.detach().reshape(-1)
    r = ref.detach().reshape(-1)   # moved to o's device a chunk at a time
    floating = o.is_floating_point() or r.is_floating_point()
    bad = torch.zeros((), dtype=torch.int64, device=o.device)
    for i in range(0, o.numel(), chunk):
        oc, rc = o[i:i + chunk], r[i:i + chunk].to(o.device)
        if floating:
            oc, rc = oc.to(torch.float64), rc.to(torch.float64)
            differ = (oc != rc) | (torch.signbit(oc) != torch.signbit(rc))
        else:
            differ = oc != rc
        bad += differ.sum()
    return int(bad.item())


def assert_close(out: torch.Tensor, ref: torch.Tensor, kind=None, what: str = "output",
                 scale: torch.Tensor | None = None) -> float:
    """Assert rel_err(out, ref) <= tolerance(kind or out.dtype); returns the error.

    ``scale`` (same shape as ref, optional) is for outputs that are sums with cancellation:
    per element, the L2 norm of the summed terms, sqrt(sum_k a_k^2) for ref = sum_k a_k.
    The error is then ||out - ref|| / max(||ref||, ||scale||). Rounding errors (and relative
    errors of the terms) add up on that scale, and for random-sign terms it is also the
    expected size of ||ref||; so it changes nothing for a typical output, but a few elements
    that cancel to a small value (a single-token dh of T = 1) no longer demand more than fp32
    can give. A missing or wrong term still errs on the scale of ||scale||. A NaN / inf in ``scale`` fails
    (error inf), as one in ``out`` does."""
    kind = kind if kind is not None else out.dtype
    if kind == "exact":
        assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != {ref.dtype}"
        assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
        bad = exact_mismatches(out, ref)
        assert bad == 0, f"{what}: not bitwise equal ({bad} elements differ)"
        return 0.0
    tol = tolerance(kind)
    if scale is None:
        err = rel_err(out, ref)
    else:   # from the norms: a ref that cancels to exactly 0 has rel_err inf, but not a zero error on its scale
        norms = _norms(out, ref, scale)
        if norms is None or not math.isfinite(norms[2]):   # (an inf scale would excuse any output: error 0)
            err = math.inf
        else:
            num, den = norms[0], max(norms[1], norms[2])
            err = num / den if den > 0.0 else (0.0 if num == 0.0 else math.inf)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e} ({kind})"
    return err


def assert_one_rounding(out: torch.Tensor, ref: torch.Tensor, what: str = "output", max_fraction: float = 0.01,
                        max_row_fraction: float = 0.25) -> float:
    """A bf16 / fp16 output that its op defines as computed in fp32 and rounded once: elementwise, ``out`` equals
    the float64 ``ref`` rounded to out's dtype but where the fp32 value and the float64 one straddle a rounding
    boundary (fp32's error is ~1e-6 of bf16's 2^-8 step: 0-0.006% of the elements in the mHC tests on a CPU).
    The norm-wise bf16 tolerance (1e-2) cannot see an extra rounding of an intermediate (one more 2^-9 relative
    error in a term), which moved 15-38% of the elements off the once-rounded value (h_post_bda's x + bias,
    mhc_pre's h_pre rounded to bf16). Per row too (the last dim, where it holds >= 64 elements): at most
    ``max_row_fraction`` of a row may differ, so one wrong row of a large output (a tile written to the wrong
    place: under 0.01% of the elements at T = 32768) fails where the whole-tensor fraction and the norm-wise
    bound cannot see it. Returns the fraction that differs; NaN never matches."""
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if out.numel() == 0:
        return 0.0
    want = ref.detach().to(out.device).to(out.dtype)
    lost = int((~torch.isfinite(out) & torch.isfinite(want)).sum())
    assert lost == 0, f"{what}: {lost} elements are NaN / inf where the once-rounded reference is finite"
    differ = out != want
    frac = differ.double().mean().item()
    assert frac <= max_fraction, (f"{what}: {frac:.2%} of the elements are not the float64 value rounded once to "
                                  f"{out.dtype} (at most {max_fraction:.0%}: an extra rounding of an intermediate?)")
    if out.dim() >= 2 and out.shape[-1] >= 64:
        rows = differ.reshape(-1, out.shape[-1]).double().mean(1)
        worst, at = rows.max(0)
        assert worst.item() <= max_row_fraction, (
            f"{what}: row {at.item()} (of the last dim's rows) has {worst.item():.1%} of its elements off the "
            f"once-rounded value (at most {max_row_fraction:.0%} a row: a wrong or unwritten row?)")
    return frac


def randn(*shape, dtype=torch.float32, device="cpu", generator=None, scale: float = 1.0) -> torch.Tensor:
    """Fresh standard-normal data (never zeros) in ``dtype``."""
    t = torch.randn(*shape, dtype=torch.float32, device=device, generator=generator) * scale
    return t.to(dtype)


def meta(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    """An empty tensor of ``shape`` on the meta device: an input too big to make, for validation and explain
    tests (no memory, no data)."""
    return torch.empty(*shape, dtype=dtype, device="meta")


def limit_reason(rows, backend: str) -> str:
    """``backend``'s reason in ``rows`` (``registry.get(op).explain(...)``'s ``(backend, ok, why)`` rows) for a
    call the op's contract takes: the torch backend must accept it, so what refuses a GPU backend is that
    backend's own requirements."""
    rows = {b: (ok, why) for b, ok, why in rows}
    assert rows["torch"][0], rows
    return rows[backend][1]


def assert_limit_edge(inside, outside, backend: str, expr: str, words: str = "") -> None:
    """A backend's own limit (a spec ``Constraint``) sits exactly where it should: explain's rows ``inside`` (a call
    at the edge) name no limit of ``backend``; ``outside`` (one step past it) name ``expr`` failing, with ``words``
    from its message. Reads the reason, not the ok flag: without a GPU every GPU backend is out anyway ("needs a
    CUDA device"), and a limit is listed beside that."""
    why = limit_reason(inside, backend)
    assert f"{backend} limit" not in why, why
    why = limit_reason(outside, backend)
    assert f"{backend} limit " in why and f"{expr!r} fails" in why and words in why, why


def upcast(x):
    """float64 copy of floating tensors (detached, requires_grad preserved off)."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float8_e4m3fn:
        return x.detach().to(torch.float64)
    return x


def misaligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` one element past an allocation's start (its address 1 to 8 bytes off the
    16-byte alignment torch's allocations have): how tests and probes pass a valid input that vector and TMA
    accesses cannot take as it is."""
    v = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    with torch.no_grad():
        v.copy_(t)
    return v


def assert_cubins(jobs, workers: int = 4) -> list:
    """Compile every ``(name, launch, arch)`` job to a cubin (``launch.export_cubin(arch)``, a
    cuTile :class:`tilekernels._cutile.Launch` built from ``meta`` tensors: no GPU needed) in
    a thread pool, and check that each is a non-empty ELF; returns the cubins in job order.
    The CPU compile test every cuTile family runs in CI."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = list(jobs)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        cubins = list(pool.map(lambda j: j[1].export_cubin(j[2]), jobs))
    for (name, _, arch), cubin in zip(jobs, cubins):
        assert cubin[:4] == b"\x7fELF", f"{name} for {arch}: not an ELF cubin"
        assert len(cubin) > 1000, f"{name} for {arch}: empty cubin"
    return cubins


def probe_module(name: str):
    """A module of the checkout's ``benchmarks/probes`` (their CPU compile tests import them), imported with
    ``sys.path`` restored whole afterwards (a probe extends it with the repo and ``benchmarks/`` itself)."""
    import importlib
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    if not (root / "probes").is_dir():
        raise FileNotFoundError(f"probe {name}: no {root / 'probes'} (the probes live in the source checkout)")
    saved = list(sys.path)
    sys.path[:0] = [str(root / "probes"), str(root)]
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved
