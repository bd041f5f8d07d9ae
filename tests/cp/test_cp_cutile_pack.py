"""cuTile pack/unpack of the THD cp all_to_all (tilekernels/cp/cutile_pack.py).

CPU (CI): all four kernels (section split, section merge, to rank-major, to natural)
compile to cubins for sm_90 and sm_100 through the launch builder the GPU path uses
(``meta`` tensors, ``export_cubin``), for the Qwen3-Next sections at cp 2 and 8, odd
per-rank widths, cp = 1 and every dtype; the config is the compile key (built from the
sections, cp and element size, never from T or N).

GPU (marked ``gpu``, skipped without CUDA): pure copies, so every check is bitwise
(``kind="exact"``): each kernel against the torch index path of ops.py (maps from
perm.py) over many length mixes (random with zero-length sequences, all equal, one
dominant, a single sequence, empty) at cp 1, 2, 4, 8 with odd per-rank section widths,
outputs NaN-poisoned first; round trips are the identity; through the registry on a
world-1 NCCL group the cutile backend equals the torch backend forward and backward
(each direction's gradient is the other direction), with cu_seqlens on the GPU and
``torch.cuda.set_sync_debug_mode("error")`` (no host sync anywhere on the path). That NCCL
world lives in a child process (this file run as a script) under a timeout, so a hang in
NCCL's setup or teardown fails the test with the child's traceback instead of stalling the
pool (no process group is left in the pytest worker either).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import torch

ct = pytest.importorskip("cuda.tile")

import registry  # noqa: E402
from tilekernels.cp import cutile_pack as ck  # noqa: E402
from tilekernels.cp import perm  # noqa: E402
from tilekernels.testing import assert_cubins, assert_close  # noqa: E402

ARCHS = ("sm_90", "sm_100")
QWEN = (2048, 2048, 4096, 4096, 32, 32)
BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# (sections, cp, dtype): Qwen3-Next at cp 2 and 8, odd per-rank widths, cp = 1, fp32/fp16
COMPILE_VARIANTS = [
    (QWEN, 2, BF), (QWEN, 8, BF), ((9, 15, 3, 21), 3, F32), ((6, 10), 1, F16), ((64, 8), 4, F16),
]


def _vid(v):
    s, cp, dt = v
    return f"{'-'.join(map(str, s))}-cp{cp}-{str(dt)[6:]}"


# ------------------------------------------------------------------ CPU (CI)


def _variant_launches():
    """Every (layout, kernel) plus the non-default code paths at Qwen3-Next cp 8: the
    row-by-row and element-wise (no int32 words) token kernels, tiles (with TMA) for the
    narrow b|a pieces, the merge's persistent / bid-major grids, the b|a group tile, unchecked
    token run tiles, latency hints."""
    out = [(f"{_vid(v)}-{k}", ln[0]) for v in COMPILE_VARIANTS
           for k, ln in ck.representative_launches(v[0], v[1], T=64 * v[1], dtype=v[2]).items()]
    tok, sec = ("to_rank_major", "to_natural"), ("split", "merge")
    for name, flags, kernels in (("rowwise", dict(ROWWISE=True), tok),
                                 ("elements", dict(WORDS=False), tok),
                                 ("gather", dict(RUNS=False), tok),
                                 ("slice", dict(VIEW=False), tok),
                                 ("narrow-tiles", dict(NARROW=False, SMALL_TMA=True), sec),
                                 ("row-blocks", dict(QGRID=False), sec),
                                 ("flat", dict(FLAT=True), sec),
                                 ("element-gather", dict(EGATHER=True), tok),
                                 ("padded-tiles", dict(EXACT=False, TBD=0), tok),
                                 ("merge-bid-rank", dict(DYNQ=False, MBT=4, MBD=0), sec),
                                 ("merge-64-1k", dict(MBT=64, MBD=512), sec),
                                 ("persistent", dict(PERSIST=2), sec), ("bid-major", dict(QFIRST=False), sec),
                                 ("group", dict(GROUP=True), sec),
                                 ("group-persistent", dict(GROUP=True, PERSIST=2), sec),
                                 ("latency", dict(LAT=8), sec + tok),
                                 ("nochk", dict(NOCHK=True), tok)):
        cfg = ck.PackCfg.heuristic(QWEN, 8, 2, **flags)
        out += [(f"{name}-{k}", ck.representative_launches(QWEN, 8, T=512, cfg=cfg)[k][0]) for k in kernels]
    # odd widths without the defaults' EXACT tail tiles and DYNQ rank table
    for name, flags, kernels in (("odd-padded", dict(EXACT=False), tok), ("odd-bid-rank", dict(DYNQ=False), sec)):
        cfg = ck.PackCfg.heuristic((9, 15, 3, 21), 3, 4, **flags)
        out += [(f"{name}-{k}", ck.representative_launches((9, 15, 3, 21), 3, T=96, dtype=F32, cfg=cfg)[k][0])
                for k in kernels]
    return out


def test_every_kernel_compiles_for_sm90_and_sm100():
    jobs = [(name, ln, arch) for name, ln in _variant_launches() for arch in ARCHS]
    assert_cubins(jobs)


def test_launch_config_is_the_compile_key():
    """The config comes from (sections, cp, element size); T and N are dynamic shapes."""
    small = ck.representative_launches(QWEN, 4, T=8, N=1)
    big = ck.representative_launches(QWEN, 4, T=65536, N=300)
    for k in small:
        assert small[k][0].key() == big[k][0].key()
    # section kernels: one block per (rows, rank), the split's grid [row blocks, cp] of 8 rows,
    # the merge's a 1-D grid, rank fastest, of 16 rows (6176-byte rows: sector aligned); token
    # kernels: one per 32 rows; the merge (only) gets DYNQ's [cp] rank table as a third argument
    assert big["split"][0].grid == (65536 // 4 // 8, 4, 1) and big["merge"][0].grid == (65536 // 4 // 16 * 4, 1, 1)
    assert small["merge"][0].grid == (4, 1, 1)  # 2 rows: one row block, 4 ranks
    assert big["to_natural"][0].grid == (65536 // 32, 1, 1)
    assert len(big["split"][0].args) == 2 and len(big["merge"][0].args) == 3
    assert big["merge"][0].args[2].dtype == torch.int32 and tuple(big["merge"][0].args[2].shape) == (4,)
    cfg = ck.PackCfg.heuristic(QWEN, 8, 2)
    assert cfg is ck.PackCfg.heuristic(QWEN, 8, 2)  # cached, hashable
    # q|k|v|z pieces tile at 256 columns, b|a pieces (4 columns per rank at cp 8) at 4
    assert cfg.parts == (256, 256, 512, 512, 4, 4) and cfg.bds == (256, 256, 256, 256, 4, 4)
    assert cfg.dc == 1544 and cfg.width == 12352
    # 3088-byte rows (not 32-byte aligned): 32-row merge tiles of 1 KiB in a rank-first 1-D
    # grid, token occupancy hint 2 and latency hint 8; everywhere the TMA merge and 32-row
    # token tiles of 1 KiB (256 words) with tail tiles
    assert (cfg.BT, cfg.MBT, cfg.MBD, cfg.token_tile, cfg.TOCC, cfg.LAT) == (8, 32, 512, (32, 256), 2, 8)
    assert cfg.DYNQ and cfg.EXACT and cfg.QFIRST and not cfg.PERSIST and cfg.group is None
    assert ck.PackCfg.heuristic(QWEN, 8, 2, GROUP=True).group == (4, 2, 4)  # b|a: 2 sections of 4 columns
    m8 = ck.representative_launches(QWEN, 8, T=65536)["merge"][0]
    assert m8.grid == (65536 // 8 // 32 * 8, 1, 1)
    c2 = ck.PackCfg.heuristic(QWEN, 2, 2)  # 12352-byte rows
    assert (c2.BT, c2.MBT, c2.MBD, c2.token_tile, c2.TOCC, c2.LAT) == (8, 16, 0, (32, 256), 0, 0)
    assert c2.QFIRST and not c2.PERSIST
    assert ck._tails(772 % 256) == (4,) and ck._tails(98) == (64, 32, 2) and ck._tails(0) == ()
    assert ck.PackCfg.heuristic((9, 15), 3, 4).bds == (1, 1)  # odd widths: one column at a time
    keys = {ln[0].key() for v in COMPILE_VARIANTS for ln in ck.representative_launches(v[0], v[1], dtype=v[2],
                                                                                        T=8 * v[1]).values()}
    assert len(keys) == 4 * len(COMPILE_VARIANTS)


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="multiples of cp"):
        ck.PackCfg.heuristic((4, 3), 2)
    cfg = ck.PackCfg.heuristic((4, 4), 2)
    meta = torch.device("meta")
    x = torch.empty(4, 10, device=meta)
    with pytest.raises(ValueError, match="width"):
        ck.section_launch(x, torch.empty(2, 4, 5, device=meta), cfg, True)


def test_spec_declares_the_cutile_backend():
    for name in ("thd_cp_to_hp", "thd_hp_to_cp"):
        spec = registry.get(name).spec
        cut, tor = spec.backend("cutile"), spec.backend("torch")
        assert [b.name for b in spec.backends] == ["cutile", "torch"]
        assert cut.sm == (90, 100) and cut.toolchain == ["cutile"] and cut.host_values == []
        assert cut.dtypes == {"x": ["bfloat16", "float16", "float32"]}  # float64: torch
        assert tor.host_values == ["cu_seqlens"] and spec.host_values == []


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _mixes(cp: int, g: torch.Generator) -> dict:
    """Sequence lengths (multiples of 2*cp) by kind."""
    def r(lo, hi, n):
        return (2 * cp * torch.randint(lo, hi, (n,), generator=g)).tolist()
    return {
        "random+zeros": r(0, 6, 13),
        "all-equal": [2 * cp * 7] * 5,
        "one-dominant": r(0, 2, 6) + [2 * cp * 150] + r(0, 2, 3),
        "single": [2 * cp * 33],
        "zeros-around": [0, 0, 2 * cp * 3, 0, 2 * cp, 0],
        "empty": [0, 0],
    }


def _torch_path(x_cp, x_hp, recv3, cu, cp, sections):
    """What ops.py's torch backend computes around the collective, from perm.py's maps."""
    t = x_hp.shape[0]
    tp, ti = perm.token_perm(cu, cp, total=t)
    fp, fi = perm.feature_perm(sections, cp, x_cp.device)
    tl, dc = t // cp, x_hp.shape[1]
    rows = torch.arange(tl, device=x_cp.device)
    split = x_cp[rows[None, :, None], fp.view(cp, 1, dc)]
    merge = recv3[(fi // dc)[None, :], rows[:, None], (fi % dc)[None, :]]
    return split, x_hp[ti], x_hp[tp], merge


def _rand(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype)


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


# (cp, per-rank section widths, dtype): odd per-rank widths everywhere, Qwen-like ratios once
GPU_LAYOUTS = [
    (1, (3, 5, 1), BF), (2, (3, 5, 1, 7), BF), (4, (3, 5, 1, 7), BF), (8, (3, 5, 1, 7), BF),
    (4, (32, 32, 64, 64, 1, 1), BF), (2, (16, 8, 1), F16), (2, (16, 8, 1), F32), (8, (64, 2), F32),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cp,parts,dtype", GPU_LAYOUTS,
                         ids=[f"cp{c}-{'-'.join(map(str, p))}-{str(d)[6:]}" for c, p, d in GPU_LAYOUTS])
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_kernels_equal_torch_path_bitwise(cp, parts, dtype, cu_dtype):
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    sections = tuple(cp * p for p in parts)
    d, dc = sum(sections), sum(parts)
    for kind, lens in _mixes(cp, g).items():
        cu64 = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
        t = int(cu64[-1])
        cu = cu64.to(cu_dtype).cuda()
        cu32 = cu.to(torch.int32)  # what ops.py hands the kernels
        x_cp, x_hp, recv3 = _rand(t // cp, d, dtype=dtype), _rand(t, dc, dtype=dtype), _rand(cp, t // cp, dc,
                                                                                             dtype=dtype)
        split, natural, rank_major, merge = _torch_path(x_cp, x_hp, recv3, cu, cp, sections)
        got = _nan(cp, t // cp, dc, dtype=dtype)
        ck.split_sections_into(x_cp, got, sections)
        assert_close(got, split, kind="exact", what=f"split {kind}")
        got = _nan(t, dc, dtype=dtype)
        ck.to_natural_into(x_hp, cu32, cp, got, sections)
        assert_close(got, natural, kind="exact", what=f"to_natural {kind}")
        got = _nan(t, dc, dtype=dtype)
        ck.to_rank_major_into(x_hp, cu32, cp, got, sections)
        assert_close(got, rank_major, kind="exact", what=f"to_rank_major {kind}")
        got = _nan(t // cp, d, dtype=dtype)
        ck.merge_sections_into(recv3, got, sections)
        assert_close(got, merge, kind="exact", what=f"merge {kind}")
        # round trips: each kernel is the other's inverse (and so its adjoint)
        s3 = torch.empty(cp, t // cp, dc, device="cuda", dtype=dtype)
        ck.split_sections_into(x_cp, s3, sections)
        back = _nan(t // cp, d, dtype=dtype)
        ck.merge_sections_into(s3, back, sections)
        assert_close(back, x_cp, kind="exact", what=f"merge(split(x)) {kind}")
        rm = torch.empty_like(x_hp)
        ck.to_rank_major_into(x_hp, cu32, cp, rm, sections)
        nat = _nan(t, dc, dtype=dtype)
        ck.to_natural_into(rm, cu32, cp, nat, sections)
        assert_close(nat, x_hp, kind="exact", what=f"to_natural(to_rank_major(x)) {kind}")


def _world1_check(dtype):
    """The registry path on the world-1 NCCL group (run in the child, see below)."""
    to_hp, to_cp = registry.get("thd_cp_to_hp"), registry.get("thd_hp_to_cp")
    sections = [6, 10, 2, 14, 1, 1]
    cu = torch.tensor([0, 6, 6, 40, 42, 142], dtype=torch.int32, device="cuda")
    t, d = 142, sum(sections)
    kw = dict(split_sections=sections)
    assert to_hp.explain(_rand(t, d, dtype=dtype), cu, **kw)[0][1]     # cutile usable
    x = _rand(t, d, dtype=dtype).requires_grad_()
    dy = _rand(t, d, dtype=dtype)
    # the torch backend (it reads cu_seqlens on the host: one sync) as the truth
    xt = x.detach().clone().requires_grad_()
    yt = to_hp(xt, cu, backend="torch", **kw)
    yt.backward(dy)
    zt = to_cp(yt.detach(), cu, backend="torch", **kw)
    # warm-up outside the sync check (compiles, NCCL communicator)
    to_hp(x.detach(), cu, backend="cutile", **kw)
    to_cp(yt.detach(), cu, backend="cutile", **kw)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = to_hp(x, cu, **kw)                                       # auto: cutile
        y.backward(dy)
        z = to_cp(y.detach(), cu, **kw)
        p = registry.get("thd_cp_a2a_perm")(cu, cp=1, split_sections=sections, total_tokens=t)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert_close(y, yt, kind="exact", what="to_hp cutile vs torch")
    assert_close(x.grad, xt.grad, kind="exact", what="to_hp grad cutile vs torch")
    assert_close(z, zt, kind="exact", what="to_cp cutile vs torch")
    assert_close(z, x.detach(), kind="exact", what="round trip")
    assert torch.equal(p.token_perm, torch.arange(t, device="cuda"))
    # float64 falls back to torch, saying why
    why = dict((b, r) for b, _, r in to_hp.explain(x.detach().double(), cu, **kw))["cutile"]
    assert "float64" in why or "dtype" in why, why


def _world1_child(seed: int) -> None:
    """Child process: a world-size-1 NCCL default group, the check for bf16 and fp32, teardown.
    The group's teardown runs in a thread given 30 s (it is not what the test checks): past
    that every stack is printed, "teardown hung" reported and the child exits anyway.
    faulthandler prints every stack and exits if the child is still running after 150 s."""
    import faulthandler
    import threading

    import torch.distributed as dist
    from tilekernels._glue import poisoned

    faulthandler.dump_traceback_later(150, exit=True)
    torch.manual_seed(seed)
    store = os.path.join(tempfile.mkdtemp(prefix="tk-cp-test-"), "store")
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        with poisoned(True):
            for dtype in (BF, F32):
                _world1_check(dtype)
        print("world1 checks passed", flush=True)
    finally:
        torch.cuda.synchronize()
        down = threading.Thread(target=dist.destroy_process_group, daemon=True)
        down.start()
        down.join(30)
        if down.is_alive():
            print("world1 teardown hung (destroy_process_group > 30 s)", flush=True)
            faulthandler.dump_traceback(all_threads=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)
    print("world1 teardown done", flush=True)


WORLD1_TIMEOUT_S = 180


@pytest.mark.gpu
@needs_gpu
def test_registry_world1_cutile_equals_torch_without_host_sync():
    """bf16 and fp32 through the registry on a world-1 NCCL group, in a child process with a
    timeout (see the module doc): a hang kills the child and fails here with its output."""
    seed = int(torch.randint(0, 2**31 - 1, ()))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, os.path.abspath(__file__), "--world1", str(seed)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=WORLD1_TIMEOUT_S, env=env, cwd=root)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-4000:], (e.stderr or b"")[-8000:]
        pytest.fail(f"world-1 NCCL child hung past {WORLD1_TIMEOUT_S} s (seed {seed}):\n{out[0]!s}\n{out[1]!s}")
    if "world1 checks passed" in r.stdout and "world1 teardown hung" in r.stdout:
        pytest.xfail(f"checks passed; NCCL destroy_process_group hung in the child (seed {seed}):\n{r.stderr[-4000:]}")
    assert r.returncode == 0 and "world1 teardown done" in r.stdout, (
        f"world-1 NCCL child failed (rc {r.returncode}, seed {seed}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}")


SMALL8, QWEN8 = (32, 32, 64, 64, 2, 2), tuple(w // 8 for w in QWEN)  # per-rank widths at cp 8
VARIANTS = {  # id: (flags, per-rank widths at cp 8)
    "rowwise": (dict(ROWWISE=True), SMALL8), "elements": (dict(WORDS=False), SMALL8),
    "narrow-tiles": (dict(NARROW=False, SMALL_TMA=True, BT=32), SMALL8), "gather": (dict(RUNS=False), SMALL8),
    "slice-8rows": (dict(VIEW=False, TBT=8), SMALL8), "row-blocks": (dict(QGRID=False), SMALL8),
    "runs-32rows": (dict(TBT=32, TBD=64), SMALL8), "old-design-elements": (dict(QGRID=False, RUNS=False, WORDS=False),
                                                                          SMALL8),
    "flat": (dict(FLAT=True), SMALL8), "flat-8rows-tiles": (dict(FLAT=True, BT=8, NARROW=False), SMALL8),
    "element-gather": (dict(EGATHER=True, TBT=32), SMALL8),
    # the defaults at Qwen3-Next's cp 8 widths (tail tiles: 772 words = 3 x 256 + 4; the TMA
    # merge), the previous defaults there (bid(1) rank, 4-row merge, padded 512-byte token
    # tiles), padded tiles / bid rank on the small widths, and the bench's merge / token sweep
    "default-qwen": (dict(), QWEN8), "prev-default-qwen": (dict(DYNQ=False, MBT=4, MBD=0, EXACT=False, TBD=128),
                                                           QWEN8),
    "padded-tiles": (dict(EXACT=False), SMALL8), "bid-rank": (dict(DYNQ=False), SMALL8),
    "merge-64-qwen": (dict(MBT=64), QWEN8), "merge-32-256-qwen": (dict(MBT=32, MBD=0), QWEN8),
    "merge-16-1k-qwen": (dict(MBT=16, MBD=512), QWEN8), "tokens-2k-16rows-qwen": (dict(TBD=512, TBT=16), QWEN8),
    "tokens-512-64rows-qwen": (dict(TBD=128, TBT=64), QWEN8),
    # session 6: the merge's persistent grids (PERSIST=1 with 4-row blocks: each block loops over
    # several (rows, rank) items), rank-first and bid-major grids, narrow pieces as one permuted
    # tile (SMALL8's b|a: 2 columns a rank, QWEN8's: 4), unchecked token run tiles, latency hints
    "persist": (dict(PERSIST=2), SMALL8), "persist1-4rows": (dict(PERSIST=1, BT=4, MBT=4), SMALL8),
    "persist-qwen": (dict(PERSIST=2), QWEN8), "qfirst": (dict(QFIRST=True), SMALL8),
    "group": (dict(GROUP=True), SMALL8), "group-qwen": (dict(GROUP=True), QWEN8),
    "group-persist1-qwen": (dict(GROUP=True, PERSIST=1, BT=4, MBT=4), QWEN8),
    "group-qfirst-qwen": (dict(GROUP=True, QFIRST=True), QWEN8),
    "group-bid-rank": (dict(GROUP=True, DYNQ=False), SMALL8),
    "nochk-qwen": (dict(NOCHK=True), QWEN8),
    "lat8-qwen": (dict(LAT=8), QWEN8), "merge-bid-major-qwen": (dict(QFIRST=False), QWEN8),
    "merge-bid-major": (dict(QFIRST=False), SMALL8),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_non_default_variants_equal_torch_path_bitwise(variant):
    """The bench sweep's variants (``VARIANTS``), bitwise against the torch path at cp 8."""
    flags, parts = VARIANTS[variant]
    cp, dtype = 8, BF
    sections = tuple(cp * p for p in parts)
    cfg = ck.PackCfg.heuristic(sections, cp, 2, **flags)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    lens = _mixes(cp, g)["random+zeros"] + [2 * cp * 150]  # short chunks (gathers) and long runs
    cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    t, d, dc = int(cu[-1]), sum(sections), sum(parts)
    x_cp, x_hp, recv3 = _rand(t // cp, d, dtype=dtype), _rand(t, dc, dtype=dtype), _rand(cp, t // cp, dc, dtype=dtype)
    split, natural, rank_major, merge = _torch_path(x_cp, x_hp, recv3, cu, cp, sections)
    for what, want, got, fn in (
        ("split", split, _nan(cp, t // cp, dc, dtype=dtype), lambda o: ck.split_sections_into(x_cp, o, sections, cfg)),
        ("to_natural", natural, _nan(t, dc, dtype=dtype), lambda o: ck.to_natural_into(x_hp, cu, cp, o, sections, cfg)),
        ("to_rank_major", rank_major, _nan(t, dc, dtype=dtype),
         lambda o: ck.to_rank_major_into(x_hp, cu, cp, o, sections, cfg)),
        ("merge", merge, _nan(t // cp, d, dtype=dtype), lambda o: ck.merge_sections_into(recv3, o, sections, cfg)),
    ):
        fn(got)
        assert_close(got, want, kind="exact", what=what)


@pytest.mark.gpu
@needs_gpu
def test_merge_rank_table_under_cuda_graph_capture():
    """The default merge reads its rank table (DYNQ) from the device: captured in a CUDA graph
    with no table cached yet (the table is then made inside the capture, not cached), the
    replays equal the torch path, and so does a later eager call (its own cached table)."""
    cp, parts, dtype = 8, QWEN8, BF
    sections = tuple(cp * p for p in parts)
    tl, d, dc = 40, sum(sections), sum(parts)
    recv3 = _rand(cp, tl, dc, dtype=dtype)
    rows = torch.arange(tl, device="cuda")
    _, fi = perm.feature_perm(sections, cp, recv3.device)
    want = recv3[(fi // dc)[None, :], rows[:, None], (fi % dc)[None, :]]
    out = _nan(tl, d, dtype=dtype)
    ck.merge_sections_into(recv3, out, sections)   # compile outside the capture
    torch.cuda.synchronize()
    ck._RANKS.clear()
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ck.merge_sections_into(recv3, out, sections)
    assert not ck._RANKS
    g.replay()
    torch.cuda.synchronize()
    assert_close(out, want, kind="exact", what="merge in a CUDA graph")
    out2 = _nan(tl, d, dtype=dtype)
    ck.merge_sections_into(recv3, out2, sections)
    assert_close(out2, want, kind="exact", what="merge after the capture")


if __name__ == "__main__" and sys.argv[1:2] == ["--world1"]:
    _world1_child(int(sys.argv[2]))
