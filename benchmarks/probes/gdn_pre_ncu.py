#!/usr/bin/env python3
"""Device host: the gdn_pre_gated forward launches of given config variants (Qwen3-Next, BSHD
B=4 x T=8192, repeat_qk, bf16), each variant's launches run once in argument order, for Nsight
Compute to profile one of them, e.g. (launch 1 = the first variant's main launch)
    ncu --clock-control none --kernel-name regex:gdn_pre_fwd --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 benchmarks/probes/gdn_pre_ncu.py "{}" "{'MS': True}"
Each variant is a dict of PreGatedCfg fields over the heuristic's; --thd: the benchmark's THD problem
(116 sequences) instead of BSHD.
"""
from __future__ import annotations

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import gdn_pre_check as gc  # noqa: E402

if __name__ == "__main__":
    thd = "--thd" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "--thd"]
    prob = gc.problem(thd)
    outs = None
    for arg in argv or ["{}"]:
        ls, outs = gc.sweep_launches(prob, ast.literal_eval(arg), outs=outs)
        for ln in ls:
            ln.run()
        torch.cuda.synchronize()
    print("ran", "THD" if thd else "BSHD", argv, flush=True)
