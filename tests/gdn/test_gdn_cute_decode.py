"""CuTe DSL gdn_decode (tilekernels/gdn/cute_decode.py).

The cases, inputs and the float64 oracle are the cuTile decode test's (imported, not copied:
tests/gdn/test_gdn_cutile_decode.py); the tolerances the same (tilekernels.testing, by the
checked output's dtype): o bf16 1e-2, ssm_state fp32 1e-5 (the kernel's o = h^T q' + u (k.q')
and k.q' from the raw dot times both norms' rsqrt are fp32 reassociations, ~sqrt(dk) * 2^-24),
ssm_state bf16 1e-2 (one rounding per step), conv_state exact (a copy of inputs).

CPU (CI): every config the heuristic returns for the test shapes compiles for sm_90a from fake
arguments (Launch.export), without register spills; the config is the compile key (B is a
runtime scalar). GPU (marked ``gpu``): against the float64 reference, NaN-poisoned o, fresh
random inputs; unnamed slots bit-identical; k steps continuing a prefill; CUDA-graph replay ==
eager; the registry's ``backend="cute"``.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cutlass")

import registry  # noqa: E402
from tilekernels._cute import cubin_resources  # noqa: E402
from tilekernels.gdn import cute_decode as cq  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

import test_gdn_cutile_decode as base  # noqa: E402  (the cuTile test's cases, oracle and GPU tests)
from test_gdn_cutile_decode import BF, F32, GPU_CASES, QWEN, _indices, _inputs, _ref64  # noqa: E402

# head shapes x state dtype x state_indices x mixed dtype: Qwen3-Next in every state/indices
# variant, and every shape of GPU_CASES (Hv/Hk 1, 2, 4; dk != dv; W 2, 3, 4; odd dk, dv)
COMPILE_VARIANTS = [(QWEN, F32, True, BF), (QWEN, BF, True, BF), (QWEN, F32, False, BF), (QWEN, F32, True, F32)]
COMPILE_VARIANTS += [(c[2], c[3], c[4] is not None, BF) for c in GPU_CASES if c[2] != QWEN]
COMPILE_VARIANTS += [(dict(Hk=1, Hv=8, dk=64, dv=40, W=4), F32, True, BF)]  # R = 8: BV 64, one CTA per head

# GPU cases beyond the cuTile test's, for this kernel's own regimes: dv % 4 == 2 (VEC 2, the last
# column block partial), odd dv (VEC 1), a cluster of 8 with SHARE, and every grid regime past the
# smallest (GRID_REGIMES: 4 CTAs a row here, so fp32 MINB 5 from B = 128, + STREAM from 512 to 2048,
# MINB 5 above; bf16 STREAM from 768) at a shape that is not Qwen3-Next's (B, N, shape, state dtype, indices)
CUTE_GPU_CASES = [
    (5, 7, dict(Hk=1, Hv=4, dk=48, dv=34, W=4), F32, "pad"),
    (4, 6, dict(Hk=2, Hv=2, dk=24, dv=39, W=3), BF, "perm"),
    (3, 5, dict(Hk=1, Hv=8, dk=40, dv=34, W=2), BF, None),
    (300, 310, dict(Hk=2, Hv=4, dk=64, dv=64, W=4), F32, "perm"),
    (300, 300, dict(Hk=2, Hv=4, dk=64, dv=64, W=4), BF, None),
    (700, 703, dict(Hk=2, Hv=4, dk=64, dv=64, W=4), F32, "pad"),
    (2100, 2100, dict(Hk=2, Hv=4, dk=64, dv=64, W=4), F32, None),
    (800, 810, dict(Hk=2, Hv=4, dk=64, dv=64, W=4), BF, "perm"),
]
for _c in CUTE_GPU_CASES:  # each compile key once (several cases share a shape)
    if (_c[2], _c[3], _c[4] is not None, BF) not in COMPILE_VARIANTS:
        COMPILE_VARIANTS.append((_c[2], _c[3], _c[4] is not None, BF))


# A/B configs beside the heuristic's (its Qwen3-Next config with these VEC, BV, KS, STREAM, SHARE;
# both state dtypes): "v1" the session-8 kernel (one column a thread, KS 4), 64-bit accesses, 128-bit
# ones with 32 state values a thread (BV 32) or 128 (BV 64 / 128, KS 4), 64 threads (BV 32, KS 8),
# streaming cache hints (VEC > 1 only), the session-9 default (every CTA its own q|k prologue:
# "v4-b64k8"), the heuristic's small-grid config whatever B ("v4-b64k8-share"), and the shared
# prologue at a cluster of 8 with one column a thread ("v1-share")
AB_CONFIGS = {"v1": (1, 32, 4, False, False), "v2": (2, 32, 8, False, False), "v4": (4, 32, 16, False, False),
              "v4-b32k8": (4, 32, 8, False, False), "v4-b64k4": (4, 64, 4, False, False),
              "v4-b128k4": (4, 128, 4, False, False), "v4-b64k8-stream": (4, 64, 8, True, False),
              "v4-b64k8": (4, 64, 8, False, False), "v1-share": (1, 32, 4, False, True),
              "v4-b64k8-share": (4, 64, 8, False, True)}


def ab_config(name, sd, shape=QWEN, with_idx=True):
    """The heuristic's config at ``shape`` with AB_CONFIGS[name]'s changes."""
    s = shape
    c = cq.DecodeCfg.heuristic(s["Hk"], s["Hv"], s["dk"], s["dv"], s["W"], torch.tensor([], dtype=sd).element_size(),
                               with_idx)
    VEC, BV, KS, st, sh = AB_CONFIGS[name]
    return dataclasses.replace(c, VEC=VEC, BV=BV, KS=KS, STREAM=st, SHARE=sh)


def _vid(v):
    s, sd, idx, dt = v
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + \
        f"-{str(sd)[6:]}state-{'idx' if idx else 'noidx'}-{str(dt)[6:]}"


def _launch(v):
    s, sd, idx, dt = v
    return cq.representative_launch(**s, dtype=dt, state_dtype=sd, with_indices=idx)


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("v", COMPILE_VARIANTS, ids=[_vid(v) for v in COMPILE_VARIANTS])
def test_every_config_compiles_for_sm90a(v):
    art = _launch(v).export("sm_90a")
    res = [r for name, r in cubin_resources(art.cubin).items() if "decode_kernel" in name]
    assert len(res) == 1 and res[0]["frame"] == 0, f"register spills or a local array: {res}"
    cfg = _launch(v).cfg
    assert ("barrier.cluster.arrive" in art.ptx) == (cfg.cluster > 1)


@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("large", [False, True], ids=["small-grid", "large-grid"])
def test_compiles_for_sm100a(sd, large):
    """Issue 12: CI compiles every kernel for sm_90 and sm_100. Not run on Blackwell (the spec's
    cute backend is sm_90 only), but both precompiled Qwen3-Next configs (the cluster barriers and
    SHARE's distributed shared memory included) compile for sm_100a."""
    se = torch.tensor([], dtype=sd).element_size()
    cfg = cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, se, True, True, *cq.grid_regime(4096 if large else 64, se))
    art = cq.representative_launch(**QWEN, state_dtype=sd, cfg=cfg).export("sm_100a")
    assert art.cubin[:4] == b"\x7fELF" and "sm_100a" in art.ptx
    assert "barrier.cluster.arrive" in art.ptx and "st.shared::cluster" in art.ptx
    res = [r for n, r in cubin_resources(art.cubin).items() if "decode_kernel" in n]
    assert len(res) == 1 and res[0]["frame"] <= (8 if cfg.MINB else 0), res


@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("name", ["unaligned", *AB_CONFIGS])
def test_ab_and_unaligned_configs_compile(name, sd):
    """The heuristic's config for a state address not 16-byte aligned (VEC 1) at every compile
    shape, and the A/B configs at Qwen3-Next shapes: compile for sm_90a without spills."""
    if name == "unaligned":
        lns = [cq.representative_launch(**s, dtype=dt, state_dtype=sd, with_indices=idx, aligned=False)
               for s, _, idx, dt in COMPILE_VARIANTS if _ == F32]
        assert all(ln.cfg.VEC == 1 for ln in lns)
    else:
        lns = [cq.representative_launch(**QWEN, state_dtype=sd, cfg=ab_config(name, sd))]
    for ln in lns:
        art = ln.export("sm_90a")
        res = [r for n, r in cubin_resources(art.cubin).items() if "decode_kernel" in n]
        assert len(res) == 1 and res[0]["frame"] == 0, f"{ln.cfg}: register spills or a local array: {res}"
        assert bool(re.search(r"ld\.global\S*\.v[248]", art.ptx)) == (ln.cfg.VEC > 1)
        assert ("st.global.cs" in art.ptx) == ln.cfg.STREAM
        assert ("st.shared::cluster" in art.ptx) == (ln.cfg.SHARE and ln.cfg.cluster > 1)


def test_config_is_the_compile_key():
    """From the head shape, the state's element size and HAS_IDX only; B is the grid's."""
    keys = {_launch(v).key("sm_90a") for v in COMPILE_VARIANTS}
    assert len(keys) == len(COMPILE_VARIANTS)
    meta = torch.device("meta")
    # B picks one of the grid regimes' precompiled configs (64 CTAs a row here): fp32 MINB 0 below 512
    # CTAs, MINB 5 from 512, MINB 5 + STREAM from 2048 to 8192, MINB 5 above; bf16 STREAM from 3072
    for sd, bs, want in ((F32, (1, 7, 8, 31, 32, 128, 129, 256), "0 0 m m ms ms m m"),
                         (BF, (1, 47, 48, 256), "0 0 s s")):
        lns = []
        for B in bs:
            x, conv, w, A, dt, ssm = mk_meta(B, **QWEN, state_dtype=sd)
            o = torch.empty(B, 32, 128, dtype=BF, device=meta)
            lns.append(cq.decode_launch(x, conv, w, A, dt, ssm, None, o, 16))
        assert [ln.grid for ln in lns] == [(64, B, 1) for B in bs]
        got = ["m" * (ln.cfg.MINB == 5) + "s" * ln.cfg.STREAM or "0" for ln in lns]
        assert got == want.split(), (sd, got)
        assert all(dataclasses.replace(ln.cfg, MINB=0, STREAM=False) == lns[0].cfg for ln in lns)
        keys = {ln.launch.key("sm_90a") for ln in lns}
        assert len(keys) == len(set(got))
    x, conv, w, A, dt, ssm = mk_meta(1, **QWEN)
    cfg = cq.decode_launch(x, conv, w, A, dt, ssm, None, torch.empty(1, 32, 128, dtype=BF, device=meta), 16).cfg
    assert (cfg.BV, cfg.VEC, cfg.KS, cfg.cluster, cfg.threads, cfg.RPT, cfg.SHARE) == (64, 4, 8, 4, 128, 16, True)
    bf = cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, 2)
    assert (bf.BV, bf.VEC, bf.KS, bf.threads, bf.RPT) == (64, 4, 8, 128, 16)
    # the session-8 config where a thread cannot take 4 columns
    old = cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, 4, True, False)
    assert (old.BV, old.VEC, old.KS, old.cluster, old.threads, old.RPT, old.SHARE) == (32, 1, 4, 8, 128, 32, False)
    # an odd dv or a state address not 16-byte aligned: one column a thread
    assert cq.DecodeCfg.heuristic(1, 4, 48, 40, 4, 4).VEC == 4
    assert cq.DecodeCfg.heuristic(1, 4, 48, 39, 4, 4).VEC == 1


REGIMES = [(sd, m, st) for sd in (F32, BF) for _, m, st in cq.GRID_REGIMES[sd.itemsize]]


@pytest.mark.parametrize("sd,minb,stream", REGIMES, ids=[f"{str(r[0])[6:]}-minb{r[1]}-stream{int(r[2])}" for r in REGIMES])
def test_grid_regime_configs_compile(sd, minb, stream):
    """Each grid regime's config (GRID_REGIMES: ptxas asked for MINB CTAs an SM, streaming hints):
    compiles for sm_90a within MINB's register budget; fp32 state spills at most 8 bytes
    (measured, H200: MINB 5 faster than the unbounded 103 registers from 512 CTAs on)."""
    cfg = cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize, True, True, minb, stream)
    assert (cfg.MINB, cfg.STREAM, cfg.SHARE) == (minb, stream, True)
    art = cq.representative_launch(**QWEN, state_dtype=sd, cfg=cfg).export("sm_90a")
    res = [r for n, r in cubin_resources(art.cubin).items() if "decode_kernel" in n]
    assert len(res) == 1 and res[0]["regs"] * 128 * max(cfg.MINB, 1) <= 65536 and res[0]["frame"] <= 8, res
    assert ("st.global.cs" in art.ptx) == stream


def mk_meta(B, Hk, Hv, dk, dv, W, N=None, dtype=BF, state_dtype=F32):
    meta = torch.device("meta")
    D, C = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv, 2 * Hk * dk + Hv * dv
    N = N or B
    return (torch.empty(B, D, dtype=dtype, device=meta), torch.empty(N, C, W - 1, dtype=dtype, device=meta),
            torch.empty(C, W, dtype=dtype, device=meta), torch.empty(Hv, device=meta),
            torch.empty(Hv, device=meta), torch.empty(N, Hv, dk, dv, dtype=state_dtype, device=meta))


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="W=1"):
        cq.DecodeCfg.heuristic(16, 32, 128, 128, 1)
    with pytest.raises(ValueError, match="Hv/Hk=16"):
        cq.DecodeCfg.heuristic(1, 16, 128, 128, 4)
    with pytest.raises(ValueError, match="whole warps"):
        cq.DecodeCfg(Hk=1, R=1, dk=8, dv=8, W=4, BV=8, KS=1)
    x, conv, w, A, dt, ssm = mk_meta(2, **QWEN)
    o = torch.empty(2, 32, 128, dtype=BF, device="meta")
    with pytest.raises(ValueError, match="does not fit"):
        cq.decode_launch(x, conv, w, A, dt, ssm, None, o, 16,
                         cfg=cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, has_idx=True))
    # the registry refuses Hv/Hk > 8 for this backend (one cluster of <= 8 CTAs per key head)
    op = registry.get("gdn_decode")
    Hk, Hv, dk, dv, W = 1, 16, 8, 8, 2
    D, C = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv, 2 * Hk * dk + Hv * dv
    args = (torch.zeros(1, D), torch.zeros(1, C, W - 1), torch.zeros(C, W), torch.zeros(Hv), torch.zeros(Hv),
            torch.zeros(1, Hv, dk, dv))
    ok, why = {n: (o, w) for n, o, w in op.explain(*args, Hk=Hk)}["cute"]
    assert not ok and "Hv/Hk <= 8" in why


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _cute_kernel(monkeypatch):
    """The cuTile decode test's GPU tests below, run on this kernel: their module's ``cd`` (the
    kernel module they call ``decode_into`` on) becomes cute_decode for this module's tests."""
    monkeypatch.setattr(base, "cd", cq)


# the cuTile test's kernel-level GPU tests, unchanged (same cases, oracle and checks):
# reference at every GPU_CASES shape, k steps continuing a prefill, CUDA-graph replay == eager
test_decode_matches_float64_reference = base.test_decode_matches_float64_reference
test_steps_continue_a_prefill = base.test_steps_continue_a_prefill
test_cuda_graph_replay_equals_eager = base.test_cuda_graph_replay_equals_eager


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("B,N,shape,sd,mode", CUTE_GPU_CASES, ids=[base.case_id(c) for c in CUTE_GPU_CASES])
def test_cute_regimes_match_float64_reference(B, N, shape, sd, mode):
    """CUTE_GPU_CASES through the cuTile test's reference check (float64 oracle, unnamed slots
    bit-identical, padded rows zero), on this kernel; the config the launch takes is the one the
    case is meant to reach (VEC by dv; test_gpu_cases_reach_every_grid_regime: the grid regimes)."""
    s = shape
    sz = torch.tensor([], dtype=sd).element_size()
    small = cq.DecodeCfg.heuristic(s["Hk"], s["Hv"], s["dk"], s["dv"], s["W"], sz, mode is not None)
    assert small.VEC == (4 if s["dv"] % 4 == 0 else 2 if s["dv"] % 2 == 0 else 1)
    base.test_decode_matches_float64_reference(B, N, shape, sd, mode)


def test_gpu_cases_reach_every_grid_regime():
    """GPU_CASES and CUTE_GPU_CASES (the VEC 4 ones) run every grid regime's config of both state dtypes
    (the larger ones at a shape that is not Qwen3-Next's), and the launch takes the regime's MINB / STREAM."""
    seen = set()
    for B, N, s, sd, mode in GPU_CASES + CUTE_GPU_CASES:
        x, conv, w, A, dt, ssm = mk_meta(B, **s, N=N, state_dtype=sd)
        o = torch.empty(B, s["Hv"], s["dv"], dtype=BF, device="meta")
        idx = torch.empty(B, dtype=torch.int32, device="meta") if mode else None
        ln = cq.decode_launch(x, conv, w, A, dt, ssm, idx, o, s["Hk"])
        if ln.cfg.VEC == 4:
            regime = cq.grid_regime(B * s["Hv"] * ln.cfg.NCB, sd.itemsize)
            assert (ln.cfg.MINB, ln.cfg.STREAM) == regime
            seen.add((sd.itemsize, *regime))
    want = {(se, m, st) for se, rs in cq.GRID_REGIMES.items() for _, m, st in rs} | {(4, 0, False), (2, 0, False)}
    assert seen == want, sorted(want - seen)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_registry_backend_cute(sd):
    """registry.get("gdn_decode")(..., backend="cute") runs this kernel (the default stays the
    spec's first backend); B = 0 launches nothing."""
    op = registry.get("gdn_decode")
    B, N = 5, 7
    x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
    idx = _indices(B, N, "pad")
    o64, c64, s64 = _ref64(x, conv, w, A, dt, ssm, idx, 16)
    o = op(x, conv, w, A, dt, ssm, idx, Hk=16, backend="cute")
    assert_close(o, o64, what="o")
    assert_close(ssm, s64, kind=sd, what="ssm_state")
    assert_close(conv, c64.to(conv.dtype), kind="exact", what="conv_state")
    e = op(x[:0], conv, w, A, dt, ssm, idx[:0], Hk=16, backend="cute")
    assert e.shape == (0, 32, 128)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("name", ["unaligned", *AB_CONFIGS])
def test_ab_and_unaligned_configs_match_reference(name, sd):
    """The A/B configs (explicit cfg) and a state whose address is 4 bytes past a 16-byte
    boundary (the heuristic then takes VEC 1; an explicit VEC > 1 config is refused) at
    Qwen3-Next shapes, padded state_indices: same results as the float64 reference, unnamed
    slots bit-identical."""
    B, N = 33, 40
    x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
    idx = _indices(B, N, "pad")
    cfg = None
    if name == "unaligned":
        buf = torch.empty(ssm.numel() + 8, dtype=sd, device=ssm.device)
        k = 4 // ssm.element_size()
        view = buf[k:k + ssm.numel()].view(ssm.shape)
        view.copy_(ssm)
        ssm = view
    else:
        cfg = ab_config(name, sd)
    o64, c64, s64 = _ref64(x, conv, w, A, dt, ssm, idx, 16)
    before = ssm.clone()
    o = torch.full((B, 32, 128), float("nan"), dtype=x.dtype, device=x.device)
    ln = cq.decode_launch(x, conv, w, A, dt, ssm, idx, o, 16, cfg=cfg)
    assert ln.cfg.VEC == 1 if name == "unaligned" else ln.cfg == cfg
    ln.run()
    assert_close(o, o64, what="o")
    assert_close(ssm, s64, kind=sd, what="ssm_state")
    assert_close(conv, c64.to(conv.dtype), kind="exact", what="conv_state")
    named = torch.zeros(N, dtype=torch.bool, device=x.device)
    named[idx[idx >= 0].long()] = True
    assert torch.equal(ssm[~named], before[~named])
    if name == "unaligned":
        with pytest.raises(ValueError, match="address"):
            cq.decode_launch(x, conv, w, A, dt, ssm, idx, o, 16, cfg=cq.DecodeCfg.heuristic(16, 32, 128, 128, 4,
                                                                                             ssm.element_size()))
