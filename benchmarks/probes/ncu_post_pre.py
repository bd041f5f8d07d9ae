#!/usr/bin/env python3
"""Device host: mhc_post_pre's default backend fwd+bwd at issue 15's shape (T=32768, n=4, C=7168, bf16 streams,
fp32 h), a few steps, for Nsight Compute to profile its two CuTe DSL passes (the fused forward, the backward):

    ncu --clock-control none --kernel-name regex:'PostPre(Fwd|Bwd)CuteCfg' --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/probes/ncu_post_pre.py
(both toolchains in one process: see benchmarks/probes/owed_gpu_checks.sh for the two-call setup)."""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
import torch  # noqa: E402

from mhc_post_pre_check import fused, make  # noqa: E402

if __name__ == "__main__":
    args, cots = make(32768, 4, 7168, "cuda")
    for _ in range(3):
        for a in args:
            a.grad = None
        torch.autograd.backward(fused(args), cots)
    torch.cuda.synchronize()
