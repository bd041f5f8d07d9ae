"""mhc_post_pre's resident forward (tilekernels/mhc/cute_post_pre_res.py; ``cute_post_pre.RESIDENT``): a cluster
keeps a 16-token row tile's out in shared memory, exchanges the row's sums through distributed shared memory and
writes layer_in itself.

CPU (CI): the pass compiles for sm_90a (n = 1..4, bias or None, C with a partial last chunk, ranks with fewer
chunks) with no spills, its wgmma m64 n16 (4 k-steps a stream), TMA loads / stores, the exchange's memory
operations (CL - 1 cluster-scope release arrives, an acquire fence, CL ld.shared::cluster)
and the setmaxnreg budget; its config limits (the heuristic's None where the op keeps the two-pass forward) and
the epilogue's thread count for its plane width.
GPU (marked ``gpu``): fwd + bwd with RESIDENT on against the float64 oracle (test_mhc_post_pre.run_cutile, the
suite's tolerance table: bf16 out / layer_in 1e-2, fp32 h / proj 1e-5), outputs poisoned: n = 1..4, T = 1, 37, 65,
300, 1001 and one with ~17 row tiles a cluster (the exchange buffers' reuse by tile parity), C = 512 (8 chunks, one
a rank), 520 (a rank with two, the last chunk 8 channels), 1000, 2560, 7160, 7168, fp32 and bf16 h, bias or None; the
forward's kernels (the pass and the epilogue, no aggregate, no fused pass); two runs bitwise equal; the outputs
within the suite's tolerances of the fused forward's; the pass alone with every token checked (out, planes,
layer_in; first run on the H200 in session 41: passed).
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("cutlass")
pytest.importorskip("cuda.tile")

from tilekernels._cute import cubin_resources, setmaxnreg_budget, unfenced_releases  # noqa: E402
from tilekernels.mhc import cute_post_pre_res as RS  # noqa: E402
from tilekernels.mhc import cute_pp_mix as CM  # noqa: E402
from tilekernels.testing import assert_close, tolerance  # noqa: E402

from mhc_helpers import BF16, F32, case_id, kernel_names, on_gpu, skip_if_unprofiled  # noqa: E402
from test_mhc_post_pre import OP, PARAMS, inputs, run_cutile  # noqa: E402

# (n, C, bias): the headline shape, a partial last chunk at 7168's size, ranks with 1 or 2 chunks, n = 1..3
COMPILE = [(4, 7168, True), (4, 7168, False), (4, 7160, True), (4, 520, False), (3, 1000, True), (2, 520, True),
           (1, 512, False)]


@pytest.mark.parametrize("n,C,bias", COMPILE, ids=[f"n{n}-C{c}-bias{b}" for n, c, b in COMPILE])
def test_resident_pass_compiles_for_sm90a(n, C, bias):
    cfg = RS.PostPreResCuteCfg.heuristic(n, C, n * n + 2 * n, bias)
    assert cfg is not None and cfg.smem_bytes <= RS.SMEM_LIMIT
    art = RS.launch(cfg).export("sm_90a")
    res = [r for k, r in cubin_resources(art.cubin).items() if "kernel" in k and "slowpath" not in k]
    assert len(res) == 1 and res[0]["frame"] == 0, res   # no spills, no local arrays
    ptx = art.ptx
    d = "2d" if n == 1 else "3d"   # [T, 1, C] streams are 2-d tensors
    assert f"cp.async.bulk.tensor.{d}.shared::cta.global" in ptx    # residual tiles, weight boxes
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in ptx      # x (and bias)
    assert f"cp.async.bulk.tensor.{d}.global.shared::cta" in ptx    # out tiles
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx      # layer_in tiles
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx)
    # 4 k-steps a stream: warpgroup wc takes streams wc, wc + 2 (one code path, the larger share traced)
    assert set(mmas) == {"m64n16k16"} and len(mmas) == 4 * ((n + 1) // 2), mmas
    # the exchange: CL - 1 remote arrives with cluster-scope release, the wait, an acquire fence, the remote loads
    assert ptx.count("mbarrier.arrive.release.cluster.shared::cluster") == cfg.CL - 1
    assert ptx.count("fence.acq_rel.cluster") == 1
    assert ptx.count("ld.shared::cluster") == cfg.CL   # one field of one token a thread, all CL ranks
    assert "barrier.cluster.wait" in ptx
    lines = ptx.splitlines()   # the ring's releases fenced (the lock's remote arrives release no stage)
    assert not [i for i in unfenced_releases(ptx) if "shared::cluster" not in lines[i - 1]]
    need, have = setmaxnreg_budget(art)
    assert 0 < need <= have


def test_resident_config_limits():
    h = RS.PostPreResCuteCfg.heuristic
    assert h(4, 7168, 24, True).STAGES == 5 and h(4, 7168, 24, True).NPAD == 24
    big = h(4, 8192, 24, True)   # 16 chunks a rank: 128 KiB of out, fewer stages
    assert big is not None and big.STAGES < 5 and big.smem_bytes <= RS.SMEM_LIMIT
    assert h(4, 448, 24, True) is None      # 7 chunks: fewer than a cluster's CTAs
    assert h(4, 7164, 24, True) is None     # C % 8 != 0
    assert h(5, 7168, 35, True) is None     # n > 4
    assert h(4, 16384, 24, True) is None    # the out buffer alone leaves no room for 3 stages
    assert h(3, 1000, 15, False).NPAD == 16 and h(1, 512, 3, False).NPAD == 4
    with pytest.raises(ValueError, match="shared memory"):
        RS.PostPreResCuteCfg(n=4, C=8192, N=24, STAGES=5)
    with pytest.raises(ValueError, match="at least CL chunks"):
        RS.PostPreResCuteCfg(n=4, C=256, N=24)
    # the epilogue reads its planes (NPAD 24: 6 pieces a row) with a thread count dividing a CTA's pieces
    for n, npad in ((4, 24), (4, 32), (3, 16), (2, 8), (1, 4)):
        cfg = CM.PpMixCuteCfg.heuristic(n, npad, 8, 20)
        assert (cfg.TT * npad // 4) % cfg.NT == 0
    assert CM.PpMixCuteCfg.heuristic(4, 32, 8, 20).NT == 512   # the fused forward's, unchanged


# ------------------------------------------------------------------ GPU

GPU_CASES = [dict(T=1001, n=4, C=2560, h=F32, bias=True), dict(T=65, n=4, C=7168, h=BF16, bias=True),
             dict(T=300, n=4, C=520, h=F32, bias=False), dict(T=37, n=3, C=1000, h=BF16, bias=True),
             dict(T=1, n=1, C=512, h=F32, bias=False), dict(T=130, n=2, C=7168, h=F32, bias=False),
             dict(T=17, n=4, C=7160, h=BF16, bias=True), dict(T=4097, n=4, C=7168, h=F32, bias=True)]


def _forward_kernels(args) -> str:
    names = kernel_names(lambda: OP(*args, **PARAMS, backend="cute"))
    skip_if_unprofiled(names)
    return names


@on_gpu
@pytest.mark.parametrize("c", GPU_CASES, ids=case_id)
def test_resident_matches_float64(c, monkeypatch):
    from tilekernels.mhc import cute_post_pre as cpp

    monkeypatch.setattr(cpp, "RESIDENT", True)
    run_cutile(c, backend="cute")
    names = _forward_kernels(inputs(c["T"], c["n"], c["C"], h=c["h"], bias=c["bias"], device="cuda"))
    assert "PostPreResCuteCfg" in names and "PpMixCuteCfg" in names, names
    assert "PostPreFwdCuteCfg" not in names and "aggregate" not in names.lower(), names


@on_gpu
def test_resident_is_deterministic_and_matches_the_fused_forward(monkeypatch):
    from tilekernels.mhc import cute_post_pre as cpp

    args = inputs(2000, 4, 7168, device="cuda")
    monkeypatch.setattr(cpp, "RESIDENT", True)
    a, b = OP(*args, **PARAMS, backend="cute"), OP(*args, **PARAMS, backend="cute")
    for i, (u, v) in enumerate(zip(a, b)):
        assert torch.equal(u, v), f"output {i} differs between runs"
    monkeypatch.setattr(cpp, "RESIDENT", False)
    f = OP(*args, **PARAMS, backend="cute")
    # the same formulas, the sums split over other CTAs (the suite's tolerances)
    for i in range(len(a)):
        assert_close(a[i], f[i].to(torch.float64), what=f"output {i} vs the fused forward")


# (T, n, C): many row tiles a cluster at the headline C, 4 stages (C = 8192: 16 chunks a rank), ranks with 1 or 2
# chunks and a partial last chunk
DIRECT = [(4097, 4, 7168), (300, 4, 8192), (300, 4, 520), (37, 3, 1000)]


@on_gpu
@pytest.mark.parametrize("T,n,C", DIRECT, ids=[f"T{t}-n{n}-C{c}" for t, n, c in DIRECT])
def test_resident_pass_per_token(T, n, C):
    """The pass alone, every token checked (a fault confined to one row tile's exchange would hide in a global
    norm): out against float64 of its formula, the planes against float64 of the pass's own out, layer_in against
    float64 from the pass's own out and h_pre recomputed from its planes; NaN-poisoned outputs, none left.
    Tolerances: the suite's table (bf16 out / layer_in, fp32 planes), held per token."""
    N = n * n + 2 * n
    dev, bf = "cuda", torch.bfloat16
    res, x, bias = (torch.randn(T, n, C, device=dev).to(bf), torch.randn(T, C, device=dev).to(bf),
                    torch.randn(C, device=dev).to(bf))
    w = (torch.randn(N, n * C, device=dev) * (n * C) ** -0.5).to(bf)
    hres, hpost = torch.softmax(torch.randn(T, n, n, device=dev), -1), torch.rand(T, n, device=dev) * 2
    hb = torch.randn(N, device=dev)
    cfg = RS.PostPreResCuteCfg.heuristic(n, C, N, True)
    out, li = torch.full_like(res, float("nan")), torch.full_like(x, float("nan"))
    pp_ = torch.full((cfg.CL, T, cfg.NPAD), float("nan"), device=dev)
    ps = torch.full((cfg.CL, T), float("nan"), device=dev)
    RS.launch(cfg).run(res, x, bias, w, hres, hpost, hb, out, li, pp_, ps, T, RS.ctas(cfg, T, res.device), 1e-6, 0.7)
    torch.cuda.synchronize()
    for name, t_ in (("out", out), ("layer_in", li), ("p_proj", pp_), ("p_ss", ps)):
        assert not t_.isnan().any(), f"{name}: elements left unwritten (NaN)"
    o64 = out.double()
    want = hpost.double()[:, :, None] * (x.double() + bias.double())[:, None] + \
        torch.einsum("tij,tjc->tic", hres.double(), res.double())

    def tok(d, r):   # the largest per-token relative error
        return (d.reshape(T, -1).norm(dim=1) / r.reshape(T, -1).norm(dim=1).clamp_min(1e-30)).max().item()

    bf_tol, f32_tol = tolerance(torch.bfloat16), tolerance(torch.float32)
    assert tok(o64 - want, want) < bf_tol, "out"
    proj = o64.reshape(T, -1) @ w.double().t()
    assert tok(pp_.double().sum(0)[:, :N] - proj, proj) < f32_tol, "p_proj"
    assert not pp_[:, :, N:].any(), "p_proj's padding columns"
    ss = (o64.reshape(T, -1) ** 2).sum(1)
    assert ((ps.double().sum(0) - ss).abs() / ss).max().item() < f32_tol, "p_ss"
    r = 1.0 / (torch.sqrt(ps.double().sum(0) / (n * C)) + 1e-6)
    h = torch.sigmoid(r[:, None] * pp_.double().sum(0)[:, :n] * 0.7 + hb[:n].double())
    li64 = (h[:, :, None] * o64).sum(1)
    assert tok(li.double() - li64, li64) < bf_tol, "layer_in"
