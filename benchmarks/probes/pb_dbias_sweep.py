#!/usr/bin/env python3
"""mhc_post_pre's dbias reduction (cuTile mhc_pb_dbias, cutile_post_pre_bwd.dbias_launch) at other block shapes
(session 55): after h_post_bda's CuTe DSL reduction went from 8 to 32 row groups (18.8-19.4 -> 9.3-9.9 us on the
H200), is the cuTile one, 28 blocks of TB = 256 channels x RB = 16 rows at C = 7168, held back the same way?
Partials [G, C] fp32 (G = 512: mhc_post_pre's row tiles at T = 32768; 264: h_post_bda's grid), each config checked
against the float64 sum, do_bench medians (L2 flushed) of 3 runs, us. Ran on an H100 (session 55): 11.7-13.9 us at
G = 512 and 9.0-10.3 at G = 264 whatever TB / RB: not held back; the default stays.

    source .gpu-cutile/env.sh && python3 benchmarks/probes/pb_dbias_sweep.py
"""
import os, sys
import torch
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), d) for d in ("", "benchmarks")]
from _gpu import bench
from tilekernels._cutile import Launch, cdiv
from tilekernels.mhc.cutile_post_bda import mhc_pb_dbias
C = 7168
for G in (512, 264):
    p = torch.randn(G, C, device="cuda")
    want = p.double().sum(0)
    for TB, RB in ((256, 16), (128, 16), (128, 32), (64, 16), (64, 32), (32, 32), (128, 64), (64, 64)):
        d = torch.full((C,), float("nan"), dtype=torch.bfloat16, device="cuda")
        ln = Launch(mhc_pb_dbias, (cdiv(C, TB),), (p, d, RB, TB, False), None)
        ln.run(); torch.cuda.synchronize()
        err = ((d.double() - want).norm() / want.norm()).item()
        us = [bench(ln.run, 50) * 1e3 for _ in range(3)]
        print(f"G {G} TB {TB:3d} RB {RB:2d}: err {err:.1e}  us {' '.join(f'{u:.1f}' for u in us)}", flush=True)
