"""CuTe DSL gdn_decode, TMA-ring kernel (tilekernels/gdn/cute_decode_ring.py).

The cases, inputs, float64 oracle and kernel-level GPU tests are the cuTile decode test's (imported:
tests/gdn/test_gdn_cutile_decode.py, as test_gdn_cute_decode.py runs them on the register kernel),
here on the ring kernel; the tolerances the suite's table (tilekernels.testing, by the checked
output's dtype: o bf16 1e-2, ssm_state fp32 1e-5 / bf16 1e-2, conv_state exact).

CPU (CI): the kernel compiles for sm_90a (Launch.export) at Qwen3-Next shapes (fp32 and bf16 state,
with and without state_indices), odd head shapes (dv not a multiple of BV, dk not a multiple of the
row parts, dk = 256, Hv/Hk = 16) and the benchmark's config variants, with no local memory (no
spills); the config is the compile key (B and N are runtime); its validation refuses what TMA or
shared memory cannot hold; the registered cute kernel dispatches to it where the batch is large enough
(cute_decode.RING_FROM) or RING forces it, and its
limits hold. GPU (marked ``gpu``): against the float64 reference (NaN-poisoned o, padded rows zero,
unnamed slots bit-identical), few CTAs walking many items, B = 1, 3, 33, 300, against the register
kernel, through the registry with RING on.
"""
from __future__ import annotations

import dataclasses
import re
import types

import pytest
import torch

pytest.importorskip("cutlass")

import test_gdn_cutile_decode as base  # the cuTile test's cases, oracle and GPU tests
from test_gdn_cute_decode import mk_meta
from test_gdn_cutile_decode import BF, F32, GPU_CASES, QWEN, _indices, _inputs, _ref64

import registry
from tilekernels._cute import cubin_resources, record_compile_keys, unfenced_releases
from tilekernels.gdn import cute_decode as cq
from tilekernels.gdn import cute_decode_ring as rg
from tilekernels.testing import assert_close, probe_module

ODD = {"Hk": 2, "Hv": 4, "dk": 96, "dv": 80, "W": 3}  # two column blocks a head, the second 16 of 64 columns
ROWS = {"Hk": 1, "Hv": 2, "dk": 100, "dv": 48, "W": 2}  # dk % KS != 0 (KS 8): rows past dk clamped, zero weights
WIDE = {"Hk": 1, "Hv": 2, "dk": 256, "dv": 64, "W": 4}  # the largest TMA box: 256 consumer threads, 64 KiB tiles
MANY = {"Hk": 1, "Hv": 16, "dk": 32, "dv": 32, "W": 4}  # Hv/Hk = 16 (beyond the register kernel's cluster of 8)

# (shape, state dtype, state_indices, mixed dtype)
COMPILE_VARIANTS = [(QWEN, F32, True, BF), (QWEN, BF, True, BF), (QWEN, F32, False, BF), (QWEN, BF, False, BF),
                    (QWEN, F32, True, F32), (ODD, F32, True, BF), (ODD, BF, False, BF), (ROWS, F32, True, BF),
                    (WIDE, F32, True, BF), (MANY, BF, True, BF)]
COMPILE_VARIANTS += [(c[2], c[3], c[4] is not None, BF) for c in GPU_CASES
                     if (c[2], c[3], c[4] is not None, BF) not in COMPILE_VARIANTS]

def ring_variant(name, sd):
    """cute_decode_ring.VARIANTS[name] at Qwen3-Next shapes (None: a variant of the other state dtype)."""
    return rg.variant_cfg(name, 16, 32, 128, 128, 4, sd.itemsize)


def _vid(v):
    s, sd, idx, dt = v
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + \
        f"-{str(sd)[6:]}state-{'idx' if idx else 'noidx'}-{str(dt)[6:]}"


def _export(ln):
    art = ln.export("sm_90a")
    res = [r for n, r in cubin_resources(art.cubin).items() if "ring_kernel" in n]
    assert len(res) == 1 and res[0]["frame"] == 0, f"{ln.cfg}: register spills or a local array: {res}"
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx and "mbarrier.try_wait" in art.ptx
    if ln.cfg.FENCE:  # every release of a stage the consumers read is fenced (the WAR race: cute_decode_ring)
        assert not unfenced_releases(art.ptx), f"{ln.cfg}: unfenced stage releases at PTX lines " \
            f"{unfenced_releases(art.ptx)}"
    return art


# ------------------------------------------------------------------ CPU (CI)


@pytest.mark.parametrize("v", COMPILE_VARIANTS, ids=[_vid(v) for v in COMPILE_VARIANTS])
def test_compiles_for_sm90a(v):
    """TMA loads into the ring, VEC-wide smem reads and state stores, the consumers' named barrier,
    no spills."""
    s, sd, idx, dt = v
    ln = rg.representative_launch(**s, dtype=dt, state_dtype=sd, with_indices=idx)
    art = _export(ln)
    cfg = ln.cfg
    if cfg.VEC > 1:  # one VEC-wide smem read and one 8- or 16-byte global store a row
        assert f"ld.shared::cta.v{cfg.VEC}" in art.ptx and re.search(r"st\.global\.v[24]\.b32", art.ptx)
    assert f"bar.sync \t1, {cfg.CONSUMERS}" in art.ptx  # the consumers' own barrier, not the producer's


@pytest.mark.parametrize("stages3", [False, True], ids=["2stages", "3stages"])
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_compiles_for_sm100a(sd, stages3):
    """Issue 12: CI compiles every kernel for sm_90 and sm_100. The ring (TMA, mbarriers, no wgmma) is not run on
    Blackwell (the spec's cute backend is sm_90 only), but the heuristic's Qwen3-Next configs (and the 3-stage one
    ring_config takes from STAGES3_FROM items) compile for sm_100a, with the TMA loads, fenced releases, no spills."""
    cfg = rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize)
    cfg = rg._stages3(cfg) if stages3 else cfg
    art = rg.representative_launch(**QWEN, state_dtype=sd, cfg=cfg).export("sm_100a")
    assert art.cubin[:4] == b"\x7fELF" and "sm_100a" in art.ptx
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx and not unfenced_releases(art.ptx)
    res = [r for n, r in cubin_resources(art.cubin).items() if "ring_kernel" in n]
    assert len(res) == 1 and res[0]["frame"] == 0, res


@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("name", list(rg.VARIANTS))
def test_variants_compile(name, sd):
    cfg = ring_variant(name, sd)
    if cfg is None:
        pytest.skip(f"{name}: not a {sd} variant")
    art = _export(rg.representative_launch(**QWEN, state_dtype=sd, cfg=cfg))
    assert ("st.global.cs" in art.ptx) == cfg.STREAM
    # PDL (session 39): launch_dependents and the wait for the kernel before, both before any global access
    assert ("griddepcontrol.wait" in art.ptx) == ("griddepcontrol.launch_dependents" in art.ptx) == cfg.PDL
    if cfg.PDL:   # before the wait: no memory instruction but on parameters, shared memory or the stack
        head = art.ptx[art.ptx.index("{", art.ptx.index(".entry")):art.ptx.index("griddepcontrol.wait")]
        mem = [ln.strip() for ln in head.splitlines()
               if re.match(r"\s*(@%p\d+\s+)?(ld|st|atom|red|prefetch|cp\.|cvta\.to\.global)\b",
                           ln) and not re.search(r"\.(param|shared|local)\b", ln)]
        assert not mem, f"memory accesses before the kernel waits for the one before it: {mem}"
    assert rg.variant_cfg("STAGES=2,STREAM=True", 16, 32, 128, 128, 4, sd.itemsize) == dataclasses.replace(
        rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize), STAGES=2, STREAM=True)


@pytest.mark.parametrize("level", [1, 2])
def test_skeleton_probe_compiles(level):
    """SKELETON (a probe config of the ring's memory pattern: benchmarks/gdn_decode_check.py --ring-cfg SKELETON=1)
    still compiles, with the state loads and stores and without the delta rule's exchange barriers (level 2: no
    consumer barrier at all)."""
    cfg = dataclasses.replace(rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4), SKELETON=level)
    art = _export(rg.representative_launch(**QWEN, cfg=cfg))
    assert re.search(r"st\.global\.v4\.b32", art.ptx) and "shfl.sync.bfly" not in art.ptx or level == 1
    assert ("bar.sync \t1," in art.ptx) == (level == 1)


def test_unfenced_release_is_flagged_and_refused():
    """The PTX check catches a release that follows the stage's ld.shared without the fence (the memory-pattern
    probe may still build one, to show the race on the GPU: benchmarks/probes/ring_war_check.py); a production
    config cannot turn the fence off."""
    base_ = rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4)
    art = rg.representative_launch(**QWEN, cfg=dataclasses.replace(base_, SKELETON=2, FENCE=False)).export("sm_90a")
    assert len(unfenced_releases(art.ptx)) >= 1
    with pytest.raises(ValueError, match=r"gdn_decode cute ring.*FENCE \(a stage released"):
        dataclasses.replace(base_, FENCE=False)


def test_unfenced_releases_on_written_ptx():
    """The checker's rules on hand-written PTX: a plain arrive after ld.shared / ldmatrix with no shared-memory
    proxy fence is flagged (1-based line numbers); a global-only fence does not count; expect_tx arrives (the
    producer's) and fenced releases are not flagged."""
    ptx = "\n".join([
        "mbarrier.try_wait.parity.shared.b64 P1, [r1], r2;",
        "ld.shared::cta.v4.b32 {a}, [r3];",
        "mbarrier.arrive.shared.b64 rd, [r4], r5;",                 # 3: flagged
        "mbarrier.try_wait.parity.shared.b64 P1, [r1], r2;",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {a}, [r3];",
        "fence.proxy.async.global;",
        "mbarrier.arrive.shared.b64 rd, [r4], r5;",                 # 7: flagged (a global fence only)
        "mbarrier.try_wait.parity.shared.b64 P1, [r1], r2;",
        "ld.volatile.shared.u32 r9, [r3];",
        "fence.proxy.async.shared::cta;",
        "mbarrier.arrive.shared.b64 rd, [r4], r5;",
        "ld.shared.f32 r9, [r3];",
        "mbarrier.arrive.expect_tx.shared.b64 rd, [r4], 100;",
    ])
    assert unfenced_releases(ptx) == [3, 7]


def test_stream_probe_compiles():
    """benchmarks/probes/tma_promo_probe.py (session 20: L2 promotion, row-piece widths, the WAR race): its
    hand-built TMA descriptor kernel compiles; unfenced releases flagged only where FENCE is off."""
    probe = probe_module("tma_promo_probe")
    for fence in (False, True):
        cfg = probe.StreamCfg(COLS=128, BR=128, BC=64, GROUP=4, PROMO=3, FENCE=fence)
        art = probe.launch(cfg).export("sm_90a")
        assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx
        assert bool(unfenced_releases(art.ptx)) != fence
    # session 36's: a tile's halves as IL-row groups (a 4-D box; IL 1 a 3-D one) and SPLIT sibling items
    mhc = dict(COLS=14336, BR=32, BC=64, GROUP=14336 // 64, NS=4, STAGES=4, SPLIT=4, FENCE=True)
    for il, dims in ((16, "4d"), (1, "3d")):
        art = probe.launch(probe.StreamCfg(**mhc, IL=il)).export("sm_90a")
        assert f"cp.async.bulk.tensor.{dims}.shared::cta.global" in art.ptx
        assert not unfenced_releases(art.ptx)
    with pytest.raises(ValueError, match="SPLIT > 1"):
        probe.StreamCfg(COLS=128, BR=128, BC=64, GROUP=4, SPLIT=2)


def test_pdl_probe_config():
    """benchmarks/probes/gdn_ring_pdl.py (session 39) times the heuristic's config with PDL on against it off: the
    "pdl" variant is exactly that, for both state dtypes."""
    probe_module("gdn_ring_pdl")
    for sd in (F32, BF):
        base = rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize)
        assert ring_variant("pdl", sd) == dataclasses.replace(base, PDL=True) and not base.PDL


def test_item_size_probe_shapes():
    """benchmarks/probes/gdn_ring_items.py (session 38: is B=32's miss the item size?) compares head shapes as proxies
    for smaller or larger items: each must move the same state bytes as Qwen3-Next's, and its ring config and the
    memory-pattern config it times (SKELETON 2) must compile."""
    probe = probe_module("gdn_ring_items")
    state = {n: s["Hv"] * s["dk"] * s["dv"] for n, s in probe.SHAPES.items()}
    assert set(state.values()) == {32 * 128 * 128}, state
    assert {n: s["Hk"] for n, s in probe.SHAPES.items()} == {"today": 16, "head": 32, "half": 64, "quad": 8}
    for name, s in probe.SHAPES.items():
        cfg = rg.DecodeRingCfg.heuristic(s["Hk"], s["Hv"], s["dk"], s["dv"], s["W"], 4)
        for c in (cfg, dataclasses.replace(cfg, SKELETON=2, PF=False, AHEAD=False)):
            art = rg.representative_launch(**s, cfg=c).export("sm_90a")
            assert "cp.async.bulk.tensor.2d.shared::cta.global" in art.ptx and not unfenced_releases(art.ptx)
            frames = [r["frame"] for n, r in cubin_resources(art.cubin).items() if "ring_kernel" in n]
            # the full kernel at "half" (R 1, dv 64) and "quad" (R 4) compiles with an 8-byte stack frame under
            # ptxas's register cap for 2 CTAs an SM (noticed in session 38; no .local in the PTX; Qwen3-Next's
            # R 2 has none): held at that, no more
            want = 8 if name in ("half", "quad") and not c.SKELETON else 0
            assert frames == [want], (name, c, frames)


def test_heuristic():
    """From the static dims and the state's element size only; Qwen3-Next as designed (session 17's sweep:
    2 CTAs an SM of 256 consumer threads, 32 state values each, 2 stages each; one CTA: as many as fit;
    session 18's bf16: 128 columns, one CTA of 256 consumers, 2 stages; session 20: one item a CTA where 2 CTAs
    share an SM, persistent CTAs where one CTA has it)."""
    f = rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4)
    assert (f.BV, f.VEC, f.CONSUMERS, f.KS, f.RPT, f.STAGES, f.NCB, f.threads, f.CPS) == \
        (64, 4, 256, 16, 8, 2, 2, 288, 2)
    assert f.tile_bytes == 32768 and f.CPS * (f.smem_bytes + 1024) <= rg.SMEM_SM
    b = rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 2)  # bf16: 256-byte row pieces, 64 values a thread
    assert (b.BV, b.VEC, b.CONSUMERS, b.RPT, b.STAGES, b.CPS) == (128, 4, 256, 16, 2, 1)
    w = rg.DecodeRingCfg.heuristic(**WIDE, state_bytes=4)  # dk 256: 512 consumers, so one CTA an SM
    assert (w.CONSUMERS, w.RPT, w.CPS) == (512, 8, 1)
    assert (f.ITEM_GRID, b.ITEM_GRID, w.ITEM_GRID) == (True, False, False)
    assert rg.DecodeRingCfg.heuristic(1, 2, 64, 16, 2, 4).BV == 16  # narrow heads: narrower tiles
    assert rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4, CPS=1).STAGES == 6
    # the register kernel's column mapping at Qwen3-Next (its KS is half the ring's: 64 values a thread)
    reg = cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, 4)
    assert (reg.BV, reg.VEC, 2 * reg.KS) == (f.BV, f.VEC, f.KS)


def test_config_validation():
    with pytest.raises(ValueError, match="gdn_decode cute ring.*dk <= 256"):
        rg.DecodeRingCfg.heuristic(1, 1, 300, 64, 4)
    with pytest.raises(ValueError, match="gdn_decode cute ring.*TMA row stride"):
        rg.DecodeRingCfg.heuristic(1, 4, 48, 34, 4, 4)  # 136-byte rows
    with pytest.raises(ValueError, match="gdn_decode cute ring.*W >= 2"):
        rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 1)
    with pytest.raises(ValueError, match="gdn_decode cute ring.*multiple of Hk"):
        rg.DecodeRingCfg.heuristic(3, 4, 128, 128, 4)
    base_ = rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4)
    with pytest.raises(ValueError, match="gdn_decode cute ring.*BV <= 256"):
        dataclasses.replace(base_, BV=512, CONSUMERS=512)
    with pytest.raises(ValueError, match="gdn_decode cute ring.*shared memory"):
        dataclasses.replace(base_, STAGES=7)
    with pytest.raises(ValueError, match="gdn_decode cute ring.*shared memory"):
        dataclasses.replace(base_, STAGES=4)  # 2 CTAs an SM of 4 fp32 [128, 64] stages
    with pytest.raises(ValueError, match="gdn_decode cute ring.*whole warps"):
        dataclasses.replace(base_, CONSUMERS=80)


def test_config_is_the_compile_key():
    """B and N are runtime: one launch key at every B below STAGES3_FROM items (3 stages from there); the grid
    B * Hk at Qwen3-Next fp32 (ITEM_GRID: one item a CTA), min(B * Hk, SMs * CPS) with persistent CTAs (132 SMs
    for meta tensors, CPS 2); a config that does not fit the call is refused."""
    meta = torch.device("meta")
    keys, grids, stages = set(), [], []
    for B in (1, 8, 33, 127, 128, 256):
        x, conv, w, A, dt, ssm = mk_meta(B, **QWEN, N=B + 5)
        o = torch.empty(B, 32, 128, dtype=BF, device=meta)
        ln = rg.decode_launch(x, conv, w, A, dt, ssm, None, o, 16)
        keys.add(ln.launch.key("sm_90a"))
        grids.append(ln.grid[0])
        stages.append(ln.cfg.STAGES)
        assert ln.values[9] == (B + 5) * 32 * 128  # the TMA tensor's rows
    assert grids == [16, 128, 528, 2032, 2048, 4096]  # one item a CTA
    assert stages == [2, 2, 2, 2, 3, 3] and len(keys) == 2 and rg.STAGES3_FROM == 2048
    x, conv, w, A, dt, ssm = mk_meta(40, **QWEN)
    o = torch.empty(40, 32, 128, dtype=BF, device=meta)
    pers = dataclasses.replace(rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4, False), ITEM_GRID=False)
    assert rg.decode_launch(x, conv, w, A, dt, ssm, None, o, 16, cfg=pers).grid == (264, 1, 1)  # CPS 2
    assert rg.decode_launch(x, conv, w, A, dt, ssm, None, o, 16, ctas=3).grid == (3, 1, 1)
    with pytest.raises(ValueError, match="does not fit"):
        rg.decode_launch(x, conv, w, A, dt, ssm, None, o, 16, cfg=rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 2))
    keys = {rg.representative_launch(**s, dtype=dt, state_dtype=sd, with_indices=idx).key("sm_90a")
            for s, sd, idx, dt in COMPILE_VARIANTS}
    assert len(keys) == len(COMPILE_VARIANTS)


def test_fits_and_dispatch(monkeypatch):
    """The registered cute kernel is cute_decode.decode_fwd: the register kernel unless RING is on
    and the ring's limits hold (16-byte aligned state, 16-byte rows, dk <= 256)."""
    calls = []
    monkeypatch.setattr(cq, "decode_into", lambda *a: calls.append("reg"))
    monkeypatch.setattr(rg, "decode_ring_into", lambda *a: calls.append("ring"))
    assert registry.kernels.get_kernel("gdn_decode", "cute", "fwd") is cq.decode_fwd

    def args(shape, sd=F32):
        x, conv, w, A, dt, ssm = mk_meta(2, **shape, state_dtype=sd)
        return (x, conv, w, A, dt, ssm, None, torch.empty(2, shape["Hv"], shape["dv"], dtype=BF, device="meta"),
                shape["Hk"], 1e-6, None)

    monkeypatch.setattr(cq, "RING", False)
    cq.decode_fwd(*args(QWEN))
    monkeypatch.setattr(cq, "RING", True)
    cq.decode_fwd(*args(QWEN))
    cq.decode_fwd(*args(QWEN, BF))
    cq.decode_fwd(*args({"Hk": 1, "Hv": 4, "dk": 48, "dv": 34, "W": 4}))  # 136-byte rows: no TMA
    cq.decode_fwd(*args({"Hk": 1, "Hv": 1, "dk": 320, "dv": 32, "W": 4}))  # dk > 256
    assert calls == ["reg", "ring", "ring", "reg", "reg"]
    assert not rg.ring_fits(*args({"Hk": 1, "Hv": 1, "dk": 320, "dv": 32, "W": 4}))


@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_dispatch_by_batch(sd, monkeypatch):
    """RING None (the default): the ring from B * Hk >= RING_FROM[state element size] work items, the
    register kernel below (B is a host value: no sync, a captured graph holds its B's kernel)."""
    calls = []
    monkeypatch.setattr(cq, "decode_into", lambda *a: calls.append(("reg", a[0].shape[0])))
    monkeypatch.setattr(rg, "decode_ring_into", lambda *a: calls.append(("ring", a[0].shape[0])))
    monkeypatch.setattr(cq, "RING", None)
    first = cq.RING_FROM[torch.tensor([], dtype=sd).element_size()] // QWEN["Hk"]
    for B in (1, first - 1, first, 4 * first):
        x, conv, w, A, dt, ssm = mk_meta(B, **QWEN, state_dtype=sd)
        cq.decode_fwd(x, conv, w, A, dt, ssm, None, torch.empty(B, 32, 128, dtype=BF, device="meta"), 16, 1e-6, None)
    assert calls == [("reg", 1), ("reg", first - 1), ("ring", first), ("ring", 4 * first)]


def test_empty_batch_launches_nothing():
    """B = 0 returns before building a launch (CPU tensors: a launch would fail)."""
    x, conv, w, A, dt, ssm = (torch.zeros(t.shape, dtype=t.dtype) for t in mk_meta(0, **QWEN, N=2))
    o = torch.zeros(0, 32, 128, dtype=BF)
    rg.decode_ring_into(x, conv, w, A, dt, ssm, None, o, 16, 1e-6, None)


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _ring_kernel(monkeypatch):
    """The cuTile decode test's GPU tests below, run on the ring kernel: the module they call
    ``decode_into`` on becomes the ring's entry for this module's tests."""
    monkeypatch.setattr(base, "cd", types.SimpleNamespace(decode_into=rg.decode_ring_into))


# the cuTile test's kernel-level GPU tests, unchanged (same cases, oracle and checks): the float64
# reference at every GPU_CASES shape (B = 1, 5, 8, 33; Hv/Hk 1, 2, 4; dk != dv; W 2, 3, 4; fp32 and bf16
# state; padded, permuted and absent state_indices), k steps continuing a prefill, CUDA-graph replay == eager
test_decode_matches_float64_reference = base.test_decode_matches_float64_reference
test_steps_continue_a_prefill = base.test_steps_continue_a_prefill
test_cuda_graph_replay_equals_eager = base.test_cuda_graph_replay_equals_eager

# the ring's own regimes: (B, N, shape, state dtype, indices mode, CTAs (None: the launch's grid))
RING_GPU_CASES = [
    (33, 40, QWEN, F32, "pad", 1),      # one CTA walks all 528 items (the ring wraps across rows)
    (33, 40, QWEN, BF, "pad", 7),       # 7 CTAs: items g, g + 7, ..; padded rows between real ones
    (33, 33, QWEN, F32, None, 5),
    (3, 9, QWEN, F32, "perm", None),
    (300, 310, {"Hk": 2, "Hv": 4, "dk": 64, "dv": 64, "W": 4}, F32, "perm", None),  # 600 items, one a CTA
    (300, 300, {"Hk": 2, "Hv": 4, "dk": 64, "dv": 64, "W": 4}, BF, "pad", None),
    (5, 7, ODD, F32, "pad", 2),
    (5, 7, ODD, BF, None, None),
    (4, 6, ROWS, F32, "perm", 1),
    (3, 4, WIDE, F32, "pad", None),
    (3, 5, MANY, BF, "perm", 2),
    (1, 2, MANY, F32, None, None),
]


def _case_id(c):
    return base.case_id(c[:5]) + f"-ctas{c[5]}"


def _check(monkeypatch, B, N, shape, sd, mode, ctas=None, cfg=None):
    """The cuTile test's reference check (float64 oracle, NaN-poisoned o, padded rows zero, unnamed
    slots bit-identical) on the ring kernel at ``cfg`` (None: the heuristic's) on ``ctas`` CTAs."""
    grids = []

    def into(*args):
        ln = rg.decode_launch(*args, cfg=cfg, ctas=ctas)
        grids.append(ln.grid[0])
        ln.run()

    monkeypatch.setattr(base, "cd", types.SimpleNamespace(decode_into=into))
    base.test_decode_matches_float64_reference(B, N, shape, sd, mode)
    assert len(grids) == 1 and (ctas is None or grids[0] == min(ctas, B * shape["Hk"])), grids


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("B,N,shape,sd,mode,ctas", RING_GPU_CASES, ids=[_case_id(c) for c in RING_GPU_CASES])
def test_ring_matches_float64_reference(B, N, shape, sd, mode, ctas, monkeypatch):
    _check(monkeypatch, B, N, shape, sd, mode, ctas)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("name", list(rg.VARIANTS))
def test_ring_variants_match_reference(name, sd, monkeypatch):
    cfg = ring_variant(name, sd)
    if cfg is None:
        pytest.skip(f"{name}: not a {sd} variant")
    _check(monkeypatch, 33, 40, QWEN, sd, "pad", cfg=cfg)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_ring_memory_pattern_writes_back_what_it_read(sd):
    """The WAR race's detector: SKELETON 2 stores every tile back unchanged, so after the launch the state must
    be bitwise what it was. Without the fence a consumer's ld.shared could read the refilled stage and store the
    next tile's rows in place of its own (H200, session 20: fp32 B=32 9-10 of 10 runs changed, B=256 10 of 10; none
    fenced, on persistent CTAs: the grid pinned here as measured). Several runs on fresh state, B = 32 (512 items).
    The bf16 state never showed it (0 of 10 runs unfenced at B=256): a smoke test there."""
    cfg = dataclasses.replace(rg.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize), SKELETON=2,
                              ITEM_GRID=False)
    for _ in range(4):
        x, conv, w, A, dt, ssm = _inputs(32, 32, **QWEN, state_dtype=sd)
        idx = torch.arange(32, dtype=torch.int32, device="cuda")
        o = torch.empty(32, 32, 128, dtype=x.dtype, device=x.device)
        before = ssm.clone()
        rg.decode_launch(x, conv, w, A, dt, ssm, idx, o, 16, cfg=cfg).run()
        torch.cuda.synchronize()
        assert torch.equal(ssm.view(torch.int16 if sd == BF else torch.int32),
                           before.view(torch.int16 if sd == BF else torch.int32)), \
            f"{int((ssm != before).sum())} state values rewritten by the ring's memory pattern"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("B", [1, 33, 256])
def test_ring_matches_register_kernel(sd, B):
    """Same inputs through both kernels. At Qwen3-Next the ring's thread mapping is the register
    kernel's (BV 64, VEC 4, KS 8: test_heuristic) and both run the same helpers (conv step, gates,
    norms, _delta_tile), so every fp32 operation is the same in the same order: o and the state are
    expected bitwise equal. Not asserted bitwise: whether ptxas contracts a*b + c into one fma is
    decided per kernel, and each such choice moves a result by an ulp; so o within bf16's tolerance
    of the register kernel's and the fp32 state within fp32's (1e-5), the bf16 state within bf16's."""
    N = B + 3
    x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
    idx = _indices(B, N, "pad")
    conv2, ssm2 = conv.clone(), ssm.clone()
    o1 = torch.full((B, 32, 128), float("nan"), dtype=x.dtype, device=x.device)
    o2 = o1.clone()
    cq.decode_into(x, conv, w, A, dt, ssm, idx, o1, 16, 1e-6, None)
    rg.decode_ring_into(x, conv2, w, A, dt, ssm2, idx, o2, 16, 1e-6, None)
    assert_close(o2, o1, what="o (ring vs register kernel)")
    assert_close(ssm2, ssm, kind=sd, what="ssm_state (ring vs register kernel)")
    assert_close(conv2, conv, kind="exact", what="conv_state (ring vs register kernel)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_registry_runs_the_ring_when_on(sd, monkeypatch):
    """registry.get("gdn_decode")(..., backend="cute") with cute_decode.RING on runs the ring kernel
    (its compile key is recorded) and matches the reference; with RING off the register kernel; by default
    (RING None) the register kernel at B=5 and the ring at RING_FROM's first B."""
    op = registry.get("gdn_decode")
    B, N = 5, 7
    big = cq.RING_FROM[torch.tensor([], dtype=sd).element_size()] // QWEN["Hk"]  # the default's first ring B
    for ring_on, name, B, N in ((True, "gdn.cute_decode_ring.decode", B, N), (False, "gdn.cute_decode.decode", B, N),
                                (None, "gdn.cute_decode.decode", B, N),
                                (None, "gdn.cute_decode_ring.decode", big, big + 3)):
        monkeypatch.setattr(cq, "RING", ring_on)
        x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
        idx = _indices(B, N, "pad")
        o64, c64, s64 = _ref64(x, conv, w, A, dt, ssm, idx, 16)
        with record_compile_keys() as keys:
            keys.clear()
            o = op(x, conv, w, A, dt, ssm, idx, Hk=16, backend="cute")
            names = {k[0] for k in keys}
        assert name in names, names
        assert_close(o, o64, what="o")
        assert_close(ssm, s64, kind=sd, what="ssm_state")
        assert_close(conv, c64.to(conv.dtype), kind="exact", what="conv_state")
