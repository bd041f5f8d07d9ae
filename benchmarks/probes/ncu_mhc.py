#!/usr/bin/env python3
"""Device host: run the backward launches of the given mHC ops at the headline shape
(T=32768, n=4, C=7168) a few times, for Nsight Compute to profile, e.g.
    ncu --kernel-name regex:'mhc_pr_bwd|mhc_pb_bwd_one' --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats python3 benchmarks/probes/ncu_mhc.py mhc_proj_rms
"""
from __future__ import annotations

import os
import sys

# benchmarks/probes/ -> benchmarks/ (for mhc_cutile_check, which puts the repository root
# and tests/mhc on the path itself)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from mhc_cutile_check import Problem, run  # noqa: E402

if __name__ == "__main__":
    for op in sys.argv[1:] or ["mhc_proj_rms", "mhc_h_post_bda"]:
        P = Problem(op)
        lst = P.bwd()
        for _ in range(4):
            run(lst)
        torch.cuda.synchronize()
        del P
