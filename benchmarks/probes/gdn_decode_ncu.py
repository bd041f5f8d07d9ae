#!/usr/bin/env python3
"""Device host: gdn_decode launches for Nsight Compute (Qwen3-Next shapes, bf16 mixed, random
state_indices), one per argument ``B:state:{DecodeCfg changes}`` (state fp32 or bf16; BV
re-tiles), each run three times in argument order, e.g. the third launch of the first case:
    ncu --clock-control none --kernel-name regex:gdn_decode --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 benchmarks/probes/gdn_decode_ncu.py "256:fp32:{}" "1:fp32:{'TMA': False}"
The CuTe DSL kernel (tilekernels/gdn/cute_decode.py): ``B:state:cute`` (its heuristic's config) or
``B:state:cute=NAME`` (a config of benchmarks/gdn_decode_check.py's CUTE_VARIANTS), kernel-name regex
``decode_kernel``. The TMA-ring kernel (tilekernels/gdn/cute_decode_ring.py): ``B:state:ring`` (its
heuristic's config), kernel-name regex ``ring_kernel``. ``B:state:copy``: the copy floor's kernel (torch.neg over the step's bytes; gdn_decode_check.copy_case).
"""
from __future__ import annotations

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import gdn_decode_check as gc  # noqa: E402

if __name__ == "__main__":
    for arg in sys.argv[1:] or ["256:fp32:{}"]:
        B, sd, changes = arg.split(":", 2)
        sdt = gc.SDT[sd]
        x, conv, w, A, dt, ssm, idx, o = gc.problem(int(B), sdt)
        if changes == "copy":  # the copy floor's kernel at this step's bytes (gdn_decode_check.copy_case's)
            n = gc.decode_bytes(int(B), **gc.SHAPE, selt=sdt.itemsize) // 2 // 16 * 4
            a = torch.randn(n, device="cuda")
            b = torch.empty_like(a)
            for _ in range(3):
                torch.neg(a, out=b)
            torch.cuda.synchronize()
            print("ran", arg, n, flush=True)
            continue
        if changes == "ring":  # the TMA-ring kernel at its heuristic's config
            rg = gc._ring_mod()
            ln = rg.decode_launch(x, conv, w, A, dt, ssm, idx, o, gc.SHAPE["Hk"], 1e-6, None)
        elif changes.startswith("cute"):
            cq = gc._cute_mod()
            cfg = cq.DecodeCfg.heuristic(16, 32, 128, 128, 4, sdt.itemsize)
            cfg = gc.cute_variant(changes[5:], cfg) if changes.startswith("cute=") else cfg
            ln = cq.decode_launch(x, conv, w, A, dt, ssm, idx, o, gc.SHAPE["Hk"], 1e-6, None, cfg=cfg)
        else:
            ln = gc.cd.decode_launch(x, conv, w, A, dt, ssm, idx, o, gc.SHAPE["Hk"], 1e-6, None,
                                     cfg=gc.variant_cfg(sdt, ast.literal_eval(changes)))
        for _ in range(3):
            ln.run()
        torch.cuda.synchronize()
        print("ran", arg, ln.cfg, ln.grid, flush=True)
