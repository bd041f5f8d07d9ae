#!/usr/bin/env python3
"""Probe: mhc_post_pre's fused forward pass (cute_post_pre_fwd, the op's default) launched first in a fresh process
and under load, bitwise against its own first run (H200; issue 15). Why: in session 40 that pass faulted once
("unspecified launch failure") as the first kernel of a probe process, right after the active-cluster query
(cute_post_pre_res.max_clusters); it did not recur. Modes: ``mc`` the query first (that setting), ``nomc`` without
it, ``stress`` 2000 launches while a memory-bound torch kernel runs on a second stream (timing shifted), checked
every 100. Each mode: the first output against the formula in fp32 (within bf16 rounding), the planes poisoned first,
then 30 runs bitwise equal to the first. Run it in a loop of fresh processes, with
CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 so a fault leaves a core dump naming the faulting instruction.

    python benchmarks/probes/post_pre_fwd_stress.py mc|nomc|stress     (cute bundle)
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from post_pre_res_cut import _inputs  # noqa: E402  (also puts the repo root on sys.path)


def main() -> int:
    from tilekernels.mhc import cute_post_pre_fwd as F
    from tilekernels.mhc import cute_post_pre_res as RS

    mode = sys.argv[1] if len(sys.argv) > 1 else "mc"
    T, n, C = 32768, 4, 7168
    N = n * n + 2 * n
    res, x, bias, w, hres, hpost, _ = _inputs(T, n, C)
    if mode == "mc":
        print("max_clusters", RS.max_clusters(0, 8), flush=True)
    cfg = F.PostPreFwdCuteCfg.heuristic(n, C, N, 32, True)
    out = torch.full_like(res, float("nan"))
    pp = torch.full((cfg.SPLIT, T, 32), float("nan"), device="cuda")
    ps = torch.full((cfg.SPLIT, T), float("nan"), device="cuda")
    ln = F.launch(cfg)

    def run():
        ln.run(res, x, bias, w, hres, hpost, out, pp, ps, T)

    run()
    torch.cuda.synchronize()
    ref = hpost[:, :, None] * (x.float() + bias.float())[:, None] + torch.einsum("tij,tjc->tic", hres, res.float())
    err = ((out.float() - ref).norm() / ref.norm()).item()
    del ref
    first = (out.clone(), pp[:, :, :N].clone(), ps.clone())

    def same() -> bool:
        return torch.equal(out, first[0]) and torch.equal(pp[:, :, :N], first[1]) and torch.equal(ps, first[2])

    differ = checks = 0
    if mode == "stress":
        side = torch.cuda.Stream()
        a = torch.randn(64 << 20, device="cuda")
        b = torch.empty_like(a)
        for i in range(2000):
            with torch.cuda.stream(side):
                torch.neg(a, out=b)
            run()
            if i % 100 == 99:
                torch.cuda.synchronize()
                differ, checks = differ + (not same()), checks + 1
    for _ in range(30):
        out.fill_(float("nan"))
        pp.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        differ, checks = differ + (not same()), checks + 1
    nan = torch.isnan(first[1]).any().item() or torch.isnan(first[2]).any().item()
    ok = err < 1e-2 and not nan and differ == 0
    print(f"FRESH mode={mode} out_err={err:.2e} nan_planes={nan} checks_differ={differ}/{checks}",
          "ok" if ok else "WRONG", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
