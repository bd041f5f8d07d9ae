"""Stress check: does a TMA ring refill a stage before its consumers' ld.shared have read it (write-after-read)?

Session 20's tma_promo_probe (its consumers ld.shared a stage, release it, then store the values back in place)
found whole rows of tiles rewritten with other data in some runs. In its SASS (and in gdn_decode's ring kernel's)
the release (SYNCS.ARRIVE) waits on no scoreboard of the stage's LDS: ptxas lets the arrive go while the loads
are in flight, and the producer's next TMA load writes the stage through the async proxy, which the arrive's
release does not order against. FENCE (fence.proxy.async.shared::cta before the release) orders them.

Runs, each on fresh random data, counting runs whose result differs from what it must be:
* the probe's gdn pattern (every word must come back unchanged), FENCE off / on;
* gdn_decode's ring kernel at SKELETON 2 (tiles stored back unchanged: the state must be bitwise unchanged),
  FENCE off / on;
* (calls 3-4 also ran the full ring kernel FENCE off against on from the same inputs, 10 runs each at B=256:
  bitwise equal, both within the reference's tolerance; FENCE off is refused outside SKELETON probes since);
* mhc_proj_rms's cute forward, run against its own first run.
Then do_bench medians of each. ``python benchmarks/probes/ring_war_check.py [REPS]`` (cute bundle).
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tma_promo_probe as P  # noqa: E402
import gdn_decode_check as G  # noqa: E402
from tilekernels.gdn import cute_decode_ring as R  # noqa: E402


def _bad(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.int32) != b.view(torch.int32)).sum())


def probe_case(cfg, rows, reps):
    x = torch.empty(rows, cfg.COLS, dtype=torch.int32, device="cuda")
    runs = words = 0
    for _ in range(reps):
        x.random_(-2 ** 31, 2 ** 31 - 1)
        ref = x.clone()
        P.run(cfg, x)
        torch.cuda.synchronize()
        n = _bad(ref, x)
        runs += n > 0
        words += n
    from triton.testing import do_bench
    return runs, words, do_bench(lambda: P.run(cfg, x), warmup=25, rep=200) * 1e3


def ring_skeleton_case(cfg, B, reps):
    runs = words = 0
    for _ in range(reps):
        args = G.problem(B, torch.float32)
        ssm = args[5]
        before = ssm.clone()
        ln = R.decode_launch(*args, G.SHAPE["Hk"], 1e-6, None, cfg=cfg)
        ln.run()
        torch.cuda.synchronize()
        n = _bad(before, ssm)
        runs += n > 0
        words += n
    from triton.testing import do_bench
    return runs, words, do_bench(ln.run, warmup=25, rep=200) * 1e3


def proj_rms_case(reps: int, M: int = 32768, N: int = 24, K: int = 28672):
    """mhc_proj_rms's cute forward (its consumers ld.shared each x stage for the sums of squares beside the
    wgmmas, then release it): runs on the same inputs must be bitwise equal (deterministic kernel). Fenced since
    session 20."""
    from tilekernels.mhc import cute_proj_rms_fwd as F

    cfg = F.ProjRmsFwdCuteCfg.heuristic(N, K)  # fence: measured as a field in session 20 (call 4), now always on
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
    proj = torch.empty(M, N, device="cuda")
    r = torch.empty(M, device="cuda")
    F.fwd_into(x, w, proj, r, 1e-6, cfg)
    p0, r0 = proj.clone(), r.clone()
    runs = words = 0
    for _ in range(reps):
        proj.fill_(float("nan"))
        r.fill_(float("nan"))
        F.fwd_into(x, w, proj, r, 1e-6, cfg)
        torch.cuda.synchronize()
        n = _bad(p0, proj) + _bad(r0, r)
        runs += n > 0
        words += n
    from triton.testing import do_bench
    return runs, words, do_bench(lambda: F.fwd_into(x, w, proj, r, 1e-6, cfg), warmup=25, rep=200) * 1e3


def main(argv):
    reps = int(argv[1]) if len(argv) > 1 else 10
    rows = []
    gcfg = P.StreamCfg(COLS=128, BR=128, BC=64, GROUP=4, PROMO=0)
    # persistent CTAs, as calls 3-4 ran (the fp32 heuristic takes one item a CTA since)
    base = dataclasses.replace(R.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 4, True), ITEM_GRID=False)
    out = os.environ.get("OUT")
    if out:  # the FENCE builds' cubins, for nvdisasm: does the release now wait for the loads?
        with open(os.path.join(out, "probe_fence.cubin"), "wb") as fh:
            fh.write(P.launch(dataclasses.replace(gcfg, FENCE=True)).export("sm_90a").cubin)
        with open(os.path.join(out, "ring_fence.cubin"), "wb") as fh:
            fh.write(R._launch(base, torch.bfloat16, torch.bfloat16,
                               torch.float32).export("sm_90a").cubin)
    for fence in (False, True):
        c = dataclasses.replace(gcfg, FENCE=fence)
        r, w, t = probe_case(c, 256 * 32 * 128, reps)
        rows.append((f"probe gdn [128,64w] FENCE={int(fence)}", r, w, t))
    for B in (256, 32):
        for fence in (False, True):
            c = dataclasses.replace(base, SKELETON=2, FENCE=fence)
            r, w, t = ring_skeleton_case(c, B, reps)
            rows.append((f"ring SKELETON=2 B={B} FENCE={int(fence)}", r, w, t))
    for B in (256,):  # bf16 state: ld.shared of bf16 tiles, converted after the release
        for fence in (False, True):
            bb = R.DecodeRingCfg.heuristic(16, 32, 128, 128, 4, 2, True)
            c = dataclasses.replace(bb, SKELETON=2, FENCE=fence)
            runs = words = 0
            for _ in range(reps):
                args = G.problem(B, torch.bfloat16)
                before = args[5].clone()
                ln = R.decode_launch(*args, G.SHAPE["Hk"], 1e-6, None, cfg=c)
                ln.run()
                torch.cuda.synchronize()
                n = _bad(before, args[5])
                runs += n > 0
                words += n
            rows.append((f"ring SKELETON=2 B={B} bf16 FENCE={int(fence)}", runs, words, float("nan")))
    r, w, t = proj_rms_case(2 * reps)  # session 20 call 4 also ran it unfenced: 0 of 20 runs differed, 441.9 us
    rows.append(("proj_rms fwd (vs its first run)", r, w, t))
    print(f"{'case':<64} {'bad runs':>8} {'words':>9} {'us':>9}   ({reps} runs each)")
    for name, r, w, t in rows:
        print(f"{name:<64} {r:8d} {w:9d} {t:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
