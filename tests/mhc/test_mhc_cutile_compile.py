"""Every cuTile mHC kernel compiles to a cubin for sm_90 and sm_100 without a GPU.

The launches are built by the same code the GPU path uses, on ``meta``
tensors at the representative config (n=4, C=7168, T=32768; h fp32 and bf16;
h_post_bda without bias at fp32 h),
and exported ahead of time with ``cuda.tile.compilation.export_kernel``.
Compiles run in a thread pool (tileiras is a subprocess).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tilekernels.testing import assert_cubins

ct = pytest.importorskip("cuda.tile")

from tilekernels.mhc.cutile_kernels import representative_launches  # noqa: E402

ARCHS = ("sm_90", "sm_100")


def _jobs():
    jobs = {}
    for hd in (torch.float32, torch.bfloat16):
        for name, launches in representative_launches(n=4, C=7168, hdtype=hd).items():
            if hd == torch.bfloat16 and name.endswith(".nobias"):
                continue  # bias / no-bias is covered with fp32 h (keeps the test near 60 s on 2 cores)
            for i, ln in enumerate(launches):
                key = ln.key()
                # h-independent kernels (sinkhorn, proj_rms, reductions) are the same for both h dtypes
                jobs.setdefault(key, (f"{name}[{i}]/{str(hd).removeprefix('torch.')}", ln))
    return list(jobs.values())


def test_every_kernel_compiles_for_sm90_and_sm100():
    jobs = [(name, ln, arch) for name, ln in _jobs() for arch in ARCHS]
    names = {n.split("[")[0] for n, _, _ in jobs}
    assert {f"mhc_{op}.{p}" for op in ("h_aggregate", "h_post_bda", "sinkhorn", "proj_rms", "pre")
            for p in ("fwd", "bwd")} <= names
    assert_cubins(jobs)


def test_aggregate_reversed_tiles_compile():
    """AggCfg.REV / REV_B (token tiles last to first; probe fields, timed on the GPU) compile, fwd and bwd, with and
    without dx; the flag is the launches' last argument, False by default (default SASS unchanged: session 43)."""
    from tilekernels.mhc import cutile_aggregate as agg

    meta = torch.device("meta")
    T, n, C = 1001, 4, 7168
    x = torch.empty(T, n, C, dtype=torch.bfloat16, device=meta)
    h = torch.empty(T, n, device=meta)
    out = torch.empty(T, C, dtype=torch.bfloat16, device=meta)
    cfg = dataclasses.replace(agg.AggCfg.heuristic(T, n, C), REV=True, REV_B=True)
    lns = [agg.fwd_launch(x, h, out, cfg), agg.bwd_launch(out, x, h, x, h, cfg),
           agg.bwd_launch(out, x, None, None, h, cfg)]
    assert [ln.args[-1] for ln in lns] == [True, True, True]
    assert agg.fwd_launch(x, h, out).args[-1] is False and agg.bwd_launch(out, x, h, x, h).args[-1] is False
    assert_cubins([(f"agg_rev[{i}]", ln, "sm_90") for i, ln in enumerate(lns)])


def test_launch_config_is_the_compile_key():
    """Configs are frozen and hashable; batch dims are not part of them."""
    from tilekernels.mhc import cutile_aggregate as agg
    from tilekernels.mhc import cutile_post_bda as pb
    from tilekernels.mhc import cutile_proj_rms as pr
    from tilekernels.mhc import cutile_sinkhorn as sk

    assert agg.AggCfg.heuristic(1, 4, 7168) == agg.AggCfg.heuristic(32768, 4, 7168)
    assert pb.PostBdaCfg.heuristic(3, 3, 100) == pb.PostBdaCfg.heuristic(1000, 3, 100)
    assert sk.SinkhornCfg.heuristic(1, 4, 20) == sk.SinkhornCfg.heuristic(32768, 4, 20)
    assert pr.ProjRmsCfg.heuristic(1, 24, 28672).TM == pr.ProjRmsCfg.heuristic(32768, 24, 28672).TM
    from tilekernels.mhc import cutile_pre as pre

    a, b = pre.PreCfg.heuristic(5, 4, 7168, 20), pre.PreCfg.heuristic(32768, 4, 7168, 20)
    assert dataclasses.replace(a, pr=None) == dataclasses.replace(b, pr=None) and a.pr.TM == b.pr.TM
    cfg = pb.PostBdaCfg.heuristic(1000, 3, 100)
    assert cfg.NP == 4 and hash(cfg) == hash(pb.PostBdaCfg.heuristic(1000, 3, 100))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.TT = 1


def test_meta_launch_grids_cover_the_problem():
    """Grid arithmetic at odd sizes (no device needed)."""
    from tilekernels.mhc import cutile_aggregate as agg

    meta = torch.device("meta")
    x = torch.empty(1001, 3, 100, dtype=torch.bfloat16, device=meta)
    h = torch.empty(1001, 3, device=meta)
    out = torch.empty(1001, 100, dtype=torch.bfloat16, device=meta)
    ln = agg.fwd_launch(x, h, out)
    cfg = ln.cfg
    assert ln.grid[0] * cfg.TT >= 1001 and (ln.grid[0] - 1) * cfg.TT < 1001
    assert cfg.NP == 4 and cfg.TC >= 100


def test_one_pass_post_bda_refuses_unverified_partial_widths():
    """PW (dh partials per C tile) other than 1 or 8 computed wrong dh_post on the H200
    (cuTile 1.7): the launch builder refuses them before anything is allocated on a GPU."""
    from tilekernels.mhc import cutile_post_bda as pb

    meta = torch.device("meta")

    def e(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device=meta)

    T, n, C = 64, 4, 2048
    args = (e(T, n, C), e(T, n, n, dtype=torch.float32), e(T, n, C), e(T, n, dtype=torch.float32), e(T, C), e(C),
            e(T, n, n, dtype=torch.float32), e(T, n, C), e(T, n, dtype=torch.float32), e(T, C), e(C))
    cfg = pb.PostBdaCfg.heuristic(T, n, C)
    assert cfg.ONE and cfg.PW == 8
    names = [ln.kernel._pyfunc.__name__ for ln in pb.bwd_launches(*args, cfg=cfg)]
    assert names == ["mhc_pb_bwd_one", "mhc_pb_dh_reduce", "mhc_pb_dbias"]
    with pytest.raises(ValueError, match="PW must be 1 or 8"):
        pb.bwd_launches(*args, cfg=dataclasses.replace(cfg, PW=16))
    two = pb.PostBdaCfg.heuristic(T, n, C, one=False)
    assert [ln.kernel._pyfunc.__name__ for ln in pb.bwd_launches(*args, cfg=two)] == \
        ["mhc_pb_bwd_dres", "mhc_pb_bwd_dh", "mhc_pb_dbias"]
    assert not pb.PostBdaCfg.heuristic(T, 8, C).ONE  # n = 8: two passes


def test_dependent_launches_wait_before_they_read():
    """A programmatic dependent launch (``Launch.pdl``) may start while the kernel before it
    still runs: its kernel must get PDL=True, and its first statement (after the docstring)
    must be ``if PDL: ct.grid_dependency_control_wait()``. Every launch list at n = 4 and 8,
    default and alternative designs."""
    import ast
    import inspect
    import textwrap

    def waits_first(fn) -> bool:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # docstring
        first = body[0]
        return (isinstance(first, ast.If) and isinstance(first.test, ast.Name) and first.test.id == "PDL"
                and ast.unparse(first.body[0]) == "ct.grid_dependency_control_wait()")

    seen = 0
    for n, C in ((4, 7168), (8, 4096)):
        for name, launches in representative_launches(n=n, C=C).items():
            for ln in launches:
                if not ln.pdl:
                    continue
                seen += 1
                fn = ln.kernel._pyfunc
                params = list(inspect.signature(fn).parameters)
                assert "PDL" in params and ln.args[params.index("PDL")] is True, f"{name}: {fn.__name__}"
                assert waits_first(fn), f"{name}: {fn.__name__} does not wait first"
    assert seen >= 4  # proj_rms / mhc_pre dweight, mhc_pre dbias, h_post_bda dh and dbias reductions
