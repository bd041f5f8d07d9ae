"""cute_planes: the fixed-order plane sums of mhc_post_pre's partials (tilekernels/mhc/cute_planes.py).

CPU (CI): the kernel compiles for sm_90a (and sm_100a) at both vector widths with 16-byte (VW 4) / 4-byte (VW 1) global
loads, four loads in flight a warp and no spills; the config limits; bad arguments raise before any launch.
GPU (marked ``gpu``): against the float64 sum of the same planes (fp32 result of fp32 sums: the table's 1e-5), dst
poisoned with NaN first; P = 1, odd P, P < and > the warps a CTA, W with a tail past a CTA's columns and W % 4 != 0
(VW 1), the two sizes mhc_post_pre sums at T = 32768 (P = 112, W = T n; P = 512, W = n * n C); two runs bitwise
equal; a destination that is one plane of a larger buffer; P = 0 writes zeros.
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("cutlass")

from tilekernels._cute import cubin_resources  # noqa: E402
from tilekernels.mhc import cute_planes as CP  # noqa: E402
from tilekernels.testing import assert_close  # noqa: E402

from mhc_helpers import on_gpu  # noqa: E402


@pytest.mark.parametrize("vw", [4, 1])
def test_compiles_for_sm90a(vw):
    art = CP.launch(CP.PlanesCfg(VW=vw)).export("sm_90a")
    res = [v for k, v in cubin_resources(art.cubin).items() if "kernel" in k]
    assert len(res) == 1 and res[0]["frame"] == 0, res
    ld = "ld.global.v4.b32" if vw == 4 else "ld.global.b32"
    assert art.ptx.count(ld) == 4, "four plane loads in flight a warp (unroll=4)"
    assert ("st.global.v4.b32" if vw == 4 else "st.global.b32") in art.ptx
    assert CP.launch(CP.PlanesCfg(VW=vw)).export("sm_100a").cubin[:4] == b"\x7fELF"   # no sm_90-only instruction


def test_config_limits():
    with pytest.raises(ValueError, match="VW in 1, 2, 4"):
        CP.PlanesCfg(VW=3)
    with pytest.raises(ValueError, match="RG <= 32"):
        CP.PlanesCfg(RG=0)


def test_bad_arguments_raise_before_launch():
    src = torch.ones(3, 8)
    with pytest.raises(ValueError, match="mhc plane sums: src \\(3, 8\\) torch.float32 -> dst \\(7,\\)"):
        CP.sum_planes_into(src, torch.empty(7))
    with pytest.raises(ValueError, match="fp32"):
        CP.sum_planes_into(src.double(), torch.empty(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        CP.sum_planes_into(torch.ones(8, 3).t(), torch.empty(8))


SHAPES = [(1, 4), (1, 5), (3, 111), (7, 4096), (8, 4096 + 4), (9, 1028), (33, 256 * 7 + 3), (112, 32768 * 4),
          (512, 4 * 4 * 7168)]


@on_gpu
@pytest.mark.parametrize("P,W", SHAPES, ids=[f"P{p}-W{w}" for p, w in SHAPES])
def test_matches_float64(P, W):
    src = torch.randn(P, W, device="cuda") * torch.rand(P, 1, device="cuda").add(0.5)
    dst = torch.full((W,), float("nan"), device="cuda")
    CP.sum_planes_into(src, dst)
    assert_close(dst, src.double().sum(0), torch.float32, what=f"plane sum P={P} W={W}")
    again = torch.full((W,), float("nan"), device="cuda")
    CP.sum_planes_into(src, again)
    assert torch.equal(dst, again), "two runs differ: the order must be fixed"


@on_gpu
def test_into_one_plane_of_a_buffer_and_empty():
    src = torch.randn(5, 3, 64, device="cuda")
    buf = torch.full((4, 7, 64), float("nan"), device="cuda")
    CP.sum_planes_into(src, buf[2, :3])
    assert_close(buf[2, :3], src.double().sum(0), torch.float32, what="plane of a buffer")
    assert torch.isnan(buf[2, 3:]).all() and torch.isnan(buf[:2]).all() and torch.isnan(buf[3:]).all(), \
        "wrote past its destination"
    z = torch.full((16,), float("nan"), device="cuda")
    CP.sum_planes_into(torch.empty(0, 16, device="cuda"), z)
    assert torch.equal(z, torch.zeros_like(z))
