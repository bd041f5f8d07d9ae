"""The cuTile fast launch path (tilekernels/_cutile_fast.py), on mhc_sinkhorn's kernels.

CPU (CI): the parameter block the fast path packs (cuTile's ``cutile_python_v1``: an array
= 8-byte pointer, then shape and strides as int32; an fp32 scalar; constants absent) is the
one the compiler laid out, read from each exported cubin's ``EIATTR_KPARAM_INFO`` records
(sm_90 and sm_100); the packer writes the right values at those offsets; a cubin whose
parameters do not match is refused; Sinkhorn's ``fast_key`` fixes the kernel signature
(the contract that lets one compiled kernel serve every T of a key class).

GPU (marked ``gpu``, skipped without CUDA; the fast path is off by default, so each test
turns it on): the fast path's outputs are bitwise equal to ``ct.launch``'s (same kernel
source and arithmetic; only the launch differs), also at odd and power-of-two T and n in
1..8; every launch checks its signature against the compiled one; the fast path was taken
where it should be (the forward and the entries backward always; the padded-tile backward
where its cubin has plain KPARAM_INFO records, n <= 3); a CUDA-graph capture of the fast
fwd + bwd replays to the eager results, bitwise. (Run on the H200: the CPU tests and the
bitwise cases up to T=1000 passed; the T=32768 cases and the graph test are still to run.)
"""
from __future__ import annotations

import struct

import pytest
import torch

ct = pytest.importorskip("cuda.tile")

from tilekernels import _cutile_fast as fast  # noqa: E402
from tilekernels._cutile import workspace, workspace_reuse  # noqa: E402
from tilekernels.mhc import cutile_sinkhorn as sk  # noqa: E402
from tilekernels.testing import assert_close, assert_cubins  # noqa: E402

ARCHS = ("sm_90", "sm_100")
META = torch.device("meta")


def _sk_launches(T=1000, n=4, iters=20, device=META):
    lg = torch.empty(T, n, n, device=device)
    tile = sk.SinkhornCfg.heuristic(T, n, iters, entries=False)
    return {"fwd": sk.fwd_launch(lg, lg, iters, 1e-6), "bwd_entries": sk.bwd_launch(lg, lg, lg, iters, 1e-6),
            "bwd_tile": sk.bwd_launch(lg, lg, lg, iters, 1e-6, cfg=tile)}


@pytest.fixture(scope="module")
def cubins():
    """{(name, arch): cubin} of Sinkhorn's three kernels (n = 3: a non-power-of-two n)."""
    jobs = [(name, ln, arch) for name, ln in _sk_launches(n=3, iters=3).items() for arch in ARCHS]
    return {(name, arch): (ln, c) for (name, ln, arch), c in zip(jobs, assert_cubins(jobs))}


def test_abi_layout_is_the_cubins(cubins):
    for (name, arch), (ln, cubin) in cubins.items():
        info = fast.cubin_info(cubin)
        params, fmt = fast.abi_layout(ln.args)
        assert list(info.params) == params, f"{name} {arch}: {info.params} != {params}"
        assert info.param_bytes == struct.calcsize(fmt), (name, arch)
        assert info.block is not None and info.block[0] > 0, (name, arch)
        assert info.symbol.startswith(ln.kernel._pyfunc.__name__)
        fast.FastKernel(cubin, ln.args, name)  # accepted: layout, size and block size all match


def test_abi_layout_offsets():
    """Hand-counted: two rank-3 arrays then an fp32 (Sinkhorn's forward): 8 + 6*4 = 32,
    twice, then the scalar at 64; a leading fp32 pads the next pointer to 8."""
    t = torch.empty(2, 3, 3, device=META)
    params, fmt = fast.abi_layout((t, t, 1e-6, 3, 4, True))
    assert params == [(0, 8)] + [(8 + 4 * i, 4) for i in range(6)] + [(32, 8)] + \
        [(40 + 4 * i, 4) for i in range(6)] + [(64, 4)]
    assert struct.calcsize(fmt) == 68
    params, fmt = fast.abi_layout((0.5, torch.empty(4, device=META)))
    assert params == [(0, 4), (8, 8), (16, 4), (20, 4)] and struct.calcsize(fmt) == 24
    with pytest.raises(TypeError):
        fast.abi_layout(("x",))


def test_packer_writes_values_at_the_cubins_offsets(cubins):
    ln, cubin = cubins[("bwd_entries", "sm_90")]
    info = fast.cubin_info(cubin)
    T, n, iters = 37, 3, 3
    dout, lg, dl = (torch.empty(T, n, n) for _ in range(3))
    scr = torch.empty(iters, 2 * n, T)
    args = (dout, lg, dl, scr, 0.25) + ln.args[5:]
    params, fmt = fast.abi_layout(args)
    buf = bytearray(struct.calcsize(fmt))
    assert fast._packer(args, fmt)(args, buf)
    want = []
    for t in (dout, lg, dl, scr):
        want += [("Q", t.data_ptr())] + [("i", v) for v in (*t.shape, *t.stride())]
    want += [("f", 0.25)]
    assert len(want) == len(info.params)
    for (code, v), (off, size) in zip(want, info.params):
        assert struct.calcsize("<" + code) == size
        assert struct.unpack_from("<" + code, buf, off)[0] == v
    # an unaligned base: nothing packed, the call goes to ct.launch
    base = torch.empty(T * n * n + 1)
    odd = base[1:].view(T, n, n)
    assert odd.data_ptr() % 16 and not fast._packer(args, fmt)((odd,) + args[1:], buf)


def test_mismatched_cubin_is_refused(cubins):
    (_, fwd), (bl, _) = cubins[("fwd", "sm_90")], cubins[("bwd_entries", "sm_90")]
    with pytest.raises(ValueError, match="not cutile_python_v1"):
        fast.FastKernel(fwd, bl.args, "wrong")
    with pytest.raises(ValueError):
        fast.cubin_info(b"not an elf")


def test_extended_parameter_block_is_refused():
    """The padded-tile backward at n = 4 describes its parameters with EIATTR 0x45 records
    and a parameter block larger than its arguments: refused, so ct.launch runs it."""
    ln = _sk_launches(T=1000, n=4, iters=20)["bwd_tile"]
    with pytest.raises(ValueError, match="0x45"):
        fast.cubin_info(ln.export_cubin("sm_90"))


def test_sinkhorn_fast_key_fixes_the_signature():
    """Every T with the same fast key gives the same kernel signature (what the compiled
    kernel may assume), for n in 1..8 and both iters tested on the GPU."""
    seen: dict = {}
    for n in (1, 2, 3, 4, 8):
        for iters in (3, 20):
            for T in [*range(1, 70), 1000, 4096, 32768, 32769]:
                for name, ln in _sk_launches(T, n, iters).items():
                    sig = ln.signature().parameters
                    assert seen.setdefault(ln.fast_key, sig) == sig, (name, T, n, iters)
    # and the keys are few: gcd(T, 16) has 5 values
    assert len({k for k in seen if k[1].N == 4 and k[1].ITERS == 20 and k[0] == "fwd"}) == 5


def test_scratch_off_cuda_is_a_plain_allocation():
    """Off CUDA nothing is cached: the scratch is a plain allocation."""
    a = workspace("test", (2, 3), torch.float32, META)
    b = workspace("test", (2, 3), torch.float32, META)
    assert a is not b and a.device == META


# ------------------------------------------------------------------ GPU

GPU_CASES = [dict(T=1, n=1, iters=20), dict(T=3, n=3, iters=3), dict(T=37, n=8, iters=3),
             dict(T=1000, n=4, iters=20), dict(T=4096, n=2, iters=20), dict(T=32768, n=4, iters=20)]


def _run(c, on: bool, entries=None):
    torch.manual_seed(c["T"] * 7 + c["n"])
    T, n, iters = c["T"], c["n"], c["iters"]
    lg = torch.randn(T, n, n, device="cuda") * 2
    dout = torch.randn(T, n, n, device="cuda")
    out, dl = torch.full_like(lg, float("nan")), torch.full_like(lg, float("nan"))
    cfg = sk.SinkhornCfg.heuristic(T, n, iters, entries=entries)
    with fast.enabled(on), workspace_reuse(on), fast.check_signatures(True):
        sk.fwd_launch(lg, out, iters, 1e-6, cfg=cfg).run()
        sk.bwd_launch(dout, lg, dl, iters, 1e-6, cfg=cfg).run()
    torch.cuda.synchronize()
    return out, dl


@pytest.mark.parametrize("entries", [None, False], ids=["entries", "tile"])
@pytest.mark.parametrize("c", GPU_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fast_equals_ct_launch_bitwise(c, entries):
    fast.clear_caches()
    want = _run(c, on=False, entries=entries)
    got = _run(c, on=True, entries=entries)
    for name, g, w in zip(("out", "dlogits"), got, want):
        assert_close(g, w, "exact", what=f"{name} fast vs ct.launch")
    taken = {k[0][0] for k, v in fast._KERNELS.items() if v is not None}
    want = {"fwd", "bwd_entries"} if entries is None else {"fwd", "bwd_tile"} if c["n"] <= 3 else {"fwd"}
    assert taken == want, f"fast path taken for {taken}, expected {want}: {fast._KERNELS}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fast_graph_capture_replays_eager():
    T, n, iters = 1000, 4, 20
    lg = torch.randn(T, n, n, device="cuda")
    dout = torch.randn(T, n, n, device="cuda")
    out, dl = torch.empty_like(lg), torch.empty_like(lg)

    def step():
        sk.fwd_launch(lg, out, iters, 1e-6).run()
        sk.bwd_launch(dout, lg, dl, iters, 1e-6).run()

    fast.clear_caches()
    with fast.enabled(True), fast.check_signatures(True):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm up (compiles) outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for _ in range(2):
            lg.copy_(torch.randn_like(lg) * 2)
            dout.copy_(torch.randn_like(dout))
            out.fill_(float("nan"))
            dl.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            got = out.clone(), dl.clone()
            step()
            torch.cuda.synchronize()
            assert_close(got[0], out, "exact", what="out graph vs eager")
            assert_close(got[1], dl, "exact", what="dlogits graph vs eager")
    assert {k[0][0] for k, v in fast._KERNELS.items() if v is not None} == {"fwd", "bwd_entries"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workspace_reused_grown_and_fresh_under_capture():
    """Eager calls on one stream share a tag's buffer (a view of its first elements), a bigger
    request replaces it, a zero workspace starts zeroed, and a capture gets its own tensor."""
    dev = torch.device("cuda")
    a = workspace("t-reuse", (4, 8), torch.float32, dev)
    b = workspace("t-reuse", (2, 8), torch.float32, dev)
    assert b.data_ptr() == a.data_ptr() and b.shape == (2, 8) and b.is_contiguous()
    c = workspace("t-reuse", (8, 8), torch.float32, dev)
    assert c.shape == (8, 8) and workspace("t-reuse", (8, 8), torch.float32, dev).data_ptr() == c.data_ptr()
    z = workspace("t-zero", (5,), torch.int32, dev, zero=True)
    assert int(z.abs().sum()) == 0
    with workspace_reuse(False):
        assert workspace("t-reuse", (8, 8), torch.float32, dev).data_ptr() != c.data_ptr()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        warm = workspace("t-reuse", (8, 8), torch.float32, dev)
    with torch.cuda.graph(g, stream=s):
        inside = workspace("t-reuse", (8, 8), torch.float32, dev)
    assert inside.data_ptr() != warm.data_ptr()
