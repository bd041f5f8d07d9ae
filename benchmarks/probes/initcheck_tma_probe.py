#!/usr/bin/env python3
"""Probe (run under ``compute-sanitizer --tool initcheck``): does initcheck see TMA bulk-tensor stores?

Why: initcheck reported "uninitialized" reads of outputs that cute_proj_rms's backward had written (inside
torch.equal, of empty_like outputs; the mHC ledger, sessions 33-34), while NaN-filled outputs came back fully
written. Its dx is stored by TMA (cp.async.bulk.tensor, shared -> global); its dweight by the reduction kernel's
plain stores. Each output here is a fresh allocation (a size no earlier block has: never written before the call);
after the call it is read once (torch.isnan(...).any()) and checked against a second call into NaN-filled outputs.
An initcheck report on the dx read and none on the dweight read says initcheck misses the TMA stores.

    source .gpu-cute/env.sh; compute-sanitizer --tool initcheck python3 benchmarks/probes/initcheck_tma_probe.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from tilekernels.mhc import cute_proj_rms as cpr  # noqa: E402

if __name__ == "__main__":
    torch.manual_seed(0)
    M, N, K = 77, 15, 768
    bf, dev = torch.bfloat16, "cuda"
    x = torch.randn(M, K, dtype=bf, device=dev)
    w = torch.randn(N, K, dtype=bf, device=dev) * 0.05
    dproj = torch.randn(M, N, device=dev)
    dr = torch.randn(M, device=dev)
    r = torch.rand(M, device=dev) + 0.5
    fresh = lambda shape: torch.empty(shape, dtype=bf, device=dev)   # noqa: E731
    dx, dw = fresh((M, K)), fresh((N, K))
    cpr.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6)
    torch.cuda.synchronize()
    print("READ dx (TMA stores)", flush=True)
    nan_dx = bool(torch.isnan(dx).any())
    torch.cuda.synchronize()
    print("READ dweight (plain stores)", flush=True)
    nan_dw = bool(torch.isnan(dw).any())
    torch.cuda.synchronize()
    dx2, dw2 = torch.full_like(dx, float("nan")), torch.full_like(dw, float("nan"))
    cpr.bwd_into(dproj, dr, x, w, r, dx2, dw2, 1e-6)
    print(f"DONE nan in fresh dx {nan_dx}, dweight {nan_dw}; equal to the NaN-filled call: "
          f"{torch.equal(dx, dx2)}, {torch.equal(dw, dw2)}", flush=True)
